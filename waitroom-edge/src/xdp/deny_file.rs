//! The deny list kept across restarts: `deny.list` in the node's state
//! directory, one prefix a line, rewritten (atomically, mode 0600) after
//! every change the admin listener makes, and applied again when the XDP
//! program attaches at the next start. Prefixes from `[xdp] deny` are
//! applied too; removing one of those through the admin listener lasts until
//! the next start (take it out of the config to drop it for good).
use std::{io::Read as _, path::Path};

use super::IpPrefix;
use crate::state_dir::{self, StateFileError};

/// The file's name in the state directory.
pub const DENY_FILE: &str = "deny.list";

/// The prefixes in `path`; a missing file is an empty list. A line that is
/// not a prefix is skipped with a warning, and so is a file the node does
/// not own or that others may change: starting without a persisted entry is
/// better than not starting, and the warning says which.
#[must_use]
pub fn load(path: &Path) -> Vec<IpPrefix> {
    let text = match read(path) {
        Ok(Some(text)) => text,
        Ok(None) => return Vec::new(),
        Err(err) => {
            tracing::warn!(%err, "persisted deny list not applied");
            return Vec::new();
        }
    };
    parse(path, &text)
}

fn read(path: &Path) -> Result<Option<String>, StateFileError> {
    let Some(mut file) = state_dir::open_existing(path, false)? else {
        return Ok(None);
    };
    state_dir::check_owned_unwritable(&file, path)?;
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(|source| StateFileError::Io {
            path: path.to_owned(),
            source,
        })?;
    Ok(Some(text))
}

fn parse(path: &Path, text: &str) -> Vec<IpPrefix> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|(i, l)| match l.parse() {
            Ok(p) => Some(p),
            Err(err) => {
                tracing::warn!(file = %path.display(), line = i + 1, %err, "deny list line skipped");
                None
            }
        })
        .collect()
}

/// Writes `prefixes` as the whole persisted list.
pub fn save(path: &Path, prefixes: &[IpPrefix]) -> Result<(), StateFileError> {
    let mut text = String::from(
        "# The XDP deny list, written by waitroom-edge after each admin change\n# and applied when the program attaches. One prefix a line.\n",
    );
    for p in prefixes {
        text.push_str(&p.to_string());
        text.push('\n');
    }
    state_dir::replace(path, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bad_lines_skipped() {
        let dir = std::env::temp_dir().join(format!("wr-deny-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        state_dir::prepare(&dir).unwrap();
        let path = dir.join(DENY_FILE);
        assert!(load(&path).is_empty());
        let list: Vec<IpPrefix> = ["192.0.2.0/24", "2001:db8::/32", "0.0.0.0/0"]
            .iter()
            .map(|p| p.parse().unwrap())
            .collect();
        save(&path, &list).unwrap();
        assert_eq!(load(&path), list);
        std::fs::write(&path, "192.0.2.0/24\nnot a prefix\n10.1.2.3/8\n\n# note\n").unwrap();
        assert_eq!(load(&path), list[..1]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
