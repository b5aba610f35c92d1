//! The aggregator's state on disk: JSON, written to a temporary file, synced
//! and renamed over the old one, so a crash mid-write leaves the previous
//! snapshot intact and a reader never sees half a file.
//!
//! JSON rather than postcard: a snapshot is read by operators during an
//! incident far more often than its size matters.
use std::path::{Path, PathBuf};

use waitroom_common::cluster::Snapshot;

/// Why a snapshot could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a readable snapshot: {source}")]
    Decode {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// Writes `snapshot` to `path` atomically (temp file + fsync + rename).
pub fn write(path: &Path, snapshot: &Snapshot) -> Result<(), SnapshotError> {
    let bytes = serde_json::to_vec(snapshot).map_err(|source| SnapshotError::Decode {
        path: path.to_owned(),
        source,
    })?;
    waitroom_runtime::file::replace(path, &bytes)
        .map_err(|(path, source)| SnapshotError::Io { path, source })
}

/// Reads the snapshot at `path`; `Ok(None)` when there is none yet.
pub fn read(path: &Path) -> Result<Option<Snapshot>, SnapshotError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(SnapshotError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| SnapshotError::Decode {
            path: path.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use waitroom_common::time::UnixMillis;

    use super::*;
    use waitroom_common::cluster::SNAPSHOT_VERSION;

    #[test]
    fn written_snapshots_read_back_and_garbage_is_an_error() {
        let dir = std::env::temp_dir().join(format!("wr-snap-{}", std::process::id()));
        let path = dir.join("sub/agg.json");
        assert!(read(&path).unwrap().is_none());
        let snapshot = Snapshot {
            version: SNAPSHOT_VERSION,
            taken_at: UnixMillis(5),
            nodes: vec![],
            rooms: vec![],
        };
        write(&path, &snapshot).unwrap();
        write(&path, &snapshot).unwrap();
        assert_eq!(read(&path).unwrap(), Some(snapshot));
        assert!(!path.with_extension("json.tmp").exists());
        std::fs::write(&path, b"{ half").unwrap();
        assert!(matches!(read(&path), Err(SnapshotError::Decode { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
