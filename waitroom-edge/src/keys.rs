//! The cookie keys a node seals and opens tickets with.
use std::{io::Read as _, path::Path};

use anyhow::Context as _;

use crate::{config::NodeSection, cookie::CookieKeys, state_dir};

/// The key file's name in the state directory.
pub const KEY_FILE: &str = "cookie.key";

/// Cookie keys from the config, or else a key kept in the node's state
/// directory (created on first start, so cookies survive restarts of a
/// single node). The key file must be the node's own, mode 0600, and not a
/// symlink: anyone who can plant or read it can forge tickets.
pub fn load(node: &NodeSection) -> anyhow::Result<CookieKeys> {
    if !node.cookie_keys.is_empty() {
        let pairs: Vec<(u8, &str)> = node
            .cookie_keys
            .iter()
            .map(|k| (k.id, k.secret_hex.as_str()))
            .collect();
        return Ok(CookieKeys::from_hex(&pairs)?);
    }
    let dir = node.state_dir();
    state_dir::prepare(&dir).context("node.state_dir (holds the cookie key)")?;
    let path = dir.join(KEY_FILE);
    let secret = match read_key(&path)? {
        Some(secret) => secret,
        None => {
            let secret: [u8; 32] = rand::random();
            if state_dir::create_new(&path, &secret)? {
                tracing::info!(file = %path.display(), "created a cookie key (set node.cookie_keys to share keys between nodes)");
                secret
            } else {
                // Another node sharing the directory made it first: use theirs.
                read_key(&path)?
                    .with_context(|| format!("{}: vanished while starting", path.display()))?
            }
        }
    };
    Ok(CookieKeys::new(&[(0, secret)])?)
}

/// The key in `path`, `None` if there is no file; a file that is not ours,
/// is open to others, is a symlink or is not 32 bytes is an error naming it.
fn read_key(path: &Path) -> anyhow::Result<Option<[u8; 32]>> {
    let Some(mut file) = state_dir::open_existing(path, false)? else {
        return Ok(None);
    };
    state_dir::check_private(&file, path)?;
    let mut bytes = Vec::with_capacity(33);
    file.by_ref()
        .take(33)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading the cookie key {}", path.display()))?;
    let secret: [u8; 32] = bytes.try_into().map_err(|b: Vec<u8>| {
        anyhow::anyhow!(
            "{}: a cookie key is 32 bytes, this file has {}{} (remove it and a new key is made; visitors' cookies made with the old one stop working)",
            path.display(),
            b.len(),
            if b.len() > 32 { " or more" } else { "" }
        )
    })?;
    Ok(Some(secret))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn node(dir: &Path) -> NodeSection {
        let text = format!(
            "id = \"t\"\nlisten = \"127.0.0.1:0\"\nstate_dir = \"{}\"",
            dir.display()
        );
        toml::from_str(&text).unwrap()
    }

    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("wr-keys-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_key_is_made_once_private_and_kept() {
        let dir = scratch("made");
        let a = load(&node(&dir)).unwrap();
        let path = dir.join(KEY_FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let b = load(&node(&dir)).unwrap();
        let sealed = a.seal("shop", b"ticket");
        assert_eq!(b.open("shop", &sealed).unwrap(), b"ticket");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_planted_key_others_can_read_is_refused() {
        let dir = scratch("planted");
        state_dir::prepare(&dir).unwrap();
        let path = dir.join(KEY_FILE);
        std::fs::write(&path, [7u8; 32]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = format!("{:#}", load(&node(&dir)).unwrap_err());
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("0644"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_symlinked_key_is_refused() {
        let dir = scratch("link");
        state_dir::prepare(&dir).unwrap();
        let elsewhere = dir.join("elsewhere");
        std::fs::write(&elsewhere, [7u8; 32]).unwrap();
        std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.join(KEY_FILE)).unwrap();
        let err = format!("{:#}", load(&node(&dir)).unwrap_err());
        assert!(err.contains("symbolic link"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_key_of_the_wrong_length_is_refused() {
        let dir = scratch("short");
        state_dir::prepare(&dir).unwrap();
        let path = dir.join(KEY_FILE);
        assert!(state_dir::create_new(&path, &[1; 16]).unwrap());
        let err = format!("{:#}", load(&node(&dir)).unwrap_err());
        assert!(err.contains("32 bytes"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
