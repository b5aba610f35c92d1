//! Files the programs keep across restarts (the aggregator's snapshot, the
//! control API's settings): replaced whole, never seen half-written.
use std::{
    io::Write as _,
    path::{Path, PathBuf},
};

/// Replaces `path` with `bytes`: its directory created if missing, the bytes
/// written to `<path>.tmp` and synced, then renamed over `path`, so a reader
/// or a crash sees the old file or the new one. On failure, the path that
/// failed and why.
pub fn replace(path: &Path, bytes: &[u8]) -> Result<(), (PathBuf, std::io::Error)> {
    let at = |path: &Path| {
        let path = path.to_owned();
        move |source| (path, source)
    };
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir).map_err(at(dir))?;
    }
    let mut temp = path.as_os_str().to_owned();
    temp.push(".tmp");
    let temp = PathBuf::from(temp);
    let mut file = std::fs::File::create(&temp).map_err(at(&temp))?;
    file.write_all(bytes).map_err(at(&temp))?;
    file.sync_all().map_err(at(&temp))?;
    drop(file);
    std::fs::rename(&temp, path).map_err(at(path))
}
