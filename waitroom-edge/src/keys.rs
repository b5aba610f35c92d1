//! The cookie keys a node seals and opens tickets with.
use std::path::Path;

use anyhow::Context as _;

use crate::{config::NodeSection, cookie::CookieKeys};

/// Cookie keys from the config, or else a key kept beside the counters file
/// (created on first start, so cookies survive restarts of a single node).
pub fn load(node: &NodeSection) -> anyhow::Result<CookieKeys> {
    if !node.cookie_keys.is_empty() {
        let pairs: Vec<(u8, &str)> = node
            .cookie_keys
            .iter()
            .map(|k| (k.id, k.secret_hex.as_str()))
            .collect();
        return Ok(CookieKeys::from_hex(&pairs)?);
    }
    let path = node.counters_path.with_extension("cookie-key");
    let secret: [u8; 32] = match std::fs::read(&path) {
        Ok(bytes) if bytes.len() == 32 => bytes.try_into().unwrap_or([0; 32]),
        _ => {
            let secret: [u8; 32] = rand::random();
            write_private(&path, &secret)
                .with_context(|| format!("writing the cookie key {}", path.display()))?;
            tracing::info!(file = %path.display(), "created a cookie key (set node.cookie_keys to share keys between nodes)");
            secret
        }
    };
    Ok(CookieKeys::new(&[(0, secret)])?)
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _};
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(tmp, path)
}
