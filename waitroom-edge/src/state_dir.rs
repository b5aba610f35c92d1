//! The node's state directory and the private files in it.
//!
//! Cookie keys, the counters file and the persisted deny list live in one
//! directory the node owns (`node.state_dir`, `/var/lib/waitroom` under the
//! systemd unit's `StateDirectory=`). Before this, keys were kept beside a
//! counters file in `/dev/shm`, which anyone may write: a key planted there
//! forges tickets. So every file here is opened with `O_NOFOLLOW` (a symlink
//! planted in the directory is refused, not followed), new secrets are
//! created with `O_EXCL` and mode 0600, and an existing secret that someone
//! else owns or others may read is refused, naming the file.
use std::{
    fs::{File, OpenOptions},
    io::Write as _,
    os::unix::fs::{
        DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
    },
    path::{Path, PathBuf},
};

/// Why a state directory or a file in it was refused.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path}: is a symbolic link; the node does not follow links in its state directory (replace it with the file itself)"
    )]
    Symlink { path: PathBuf },
    #[error("{path}: not a regular file")]
    NotAFile { path: PathBuf },
    #[error("{path}: not a directory")]
    NotADirectory { path: PathBuf },
    #[error(
        "{path}: owned by uid {owner}, but the node runs as uid {us}; it only trusts its own files (chown it, or remove it to start afresh)"
    )]
    Owner { path: PathBuf, owner: u32, us: u32 },
    #[error(
        "{path}: mode {mode:04o} lets other users {what}; the node refuses it (chmod 0{want:o} it, or remove it to start afresh)"
    )]
    Mode {
        path: PathBuf,
        mode: u32,
        what: &'static str,
        want: u32,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StateFileError + '_ {
    move |source| {
        if source.raw_os_error() == Some(libc::ELOOP) {
            StateFileError::Symlink {
                path: path.to_owned(),
            }
        } else {
            StateFileError::Io {
                path: path.to_owned(),
                source,
            }
        }
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Creates `dir` (mode 0700) if it is missing and checks that the node owns
/// it and no one else may write it. Read or search access for others on a
/// directory the node owns is taken away (a test's scratch directory, a
/// `StateDirectory=` made without `StateDirectoryMode=`); write access for
/// others (`/dev/shm`, `/tmp`) is refused: anyone could plant files there.
pub fn prepare(dir: &Path) -> Result<(), StateFileError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io(dir))?;
    let meta = std::fs::symlink_metadata(dir).map_err(io(dir))?;
    if meta.file_type().is_symlink() {
        // A link the operator made on purpose (state on another disk) is
        // fine when its target passes the same checks.
        let target = std::fs::metadata(dir).map_err(io(dir))?;
        return check_dir(dir, &target);
    }
    check_dir(dir, &meta)
}

/// What `--check` can say without changing anything: an existing `dir`
/// that the node would refuse at start (not its own, or others may write
/// it), and an existing cookie key in it that would be refused. A missing
/// directory is fine (start makes it).
pub fn check(dir: &Path) -> Result<(), StateFileError> {
    let meta = match std::fs::metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(dir)(e)),
    };
    refuse_unsafe_dir(dir, &meta)?;
    let key = dir.join(crate::keys::KEY_FILE);
    if let Some(file) = open_existing(&key, false)? {
        check_private(&file, &key)?;
    }
    Ok(())
}

/// Refuses a directory that is not a directory, not the node's, or that
/// others may write; returns its mode bits. Changes nothing.
fn refuse_unsafe_dir(dir: &Path, meta: &std::fs::Metadata) -> Result<u32, StateFileError> {
    if !meta.is_dir() {
        return Err(StateFileError::NotADirectory {
            path: dir.to_owned(),
        });
    }
    let us = euid();
    if meta.uid() != us {
        return Err(StateFileError::Owner {
            path: dir.to_owned(),
            owner: meta.uid(),
            us,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(StateFileError::Mode {
            path: dir.to_owned(),
            mode,
            what: "create and replace files in it",
            want: 0o700,
        });
    }
    Ok(mode)
}

/// [`refuse_unsafe_dir`], then takes read and search access away from
/// others on a directory the node owns.
fn check_dir(dir: &Path, meta: &std::fs::Metadata) -> Result<(), StateFileError> {
    let mode = refuse_unsafe_dir(dir, meta)?;
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io(dir))?;
        tracing::info!(dir = %dir.display(), old_mode = format!("{mode:04o}"), "state directory made private (0700)");
    }
    Ok(())
}

/// Opens an existing file without following a symlink; `Ok(None)` when there
/// is none.
pub fn open_existing(path: &Path, write: bool) -> Result<Option<File>, StateFileError> {
    match OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(path)(e)),
    }
}

/// Checks an open file: a regular file the node owns, with no access at all
/// for group or others (it holds a secret).
pub fn check_private(file: &File, path: &Path) -> Result<(), StateFileError> {
    let meta = file.metadata().map_err(io(path))?;
    check_owned(&meta, path)?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(StateFileError::Mode {
            path: path.to_owned(),
            mode,
            what: "read or change it (it holds a secret)",
            want: 0o600,
        });
    }
    Ok(())
}

/// Checks an open file: a regular file the node owns that no one else may
/// change (others may read it: the counters are not secret).
pub fn check_owned_unwritable(file: &File, path: &Path) -> Result<(), StateFileError> {
    let meta = file.metadata().map_err(io(path))?;
    check_owned(&meta, path)?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(StateFileError::Mode {
            path: path.to_owned(),
            mode,
            what: "change it",
            want: 0o600,
        });
    }
    Ok(())
}

fn check_owned(meta: &std::fs::Metadata, path: &Path) -> Result<(), StateFileError> {
    if !meta.file_type().is_file() {
        return Err(StateFileError::NotAFile {
            path: path.to_owned(),
        });
    }
    let us = euid();
    if meta.uid() != us {
        return Err(StateFileError::Owner {
            path: path.to_owned(),
            owner: meta.uid(),
            us,
        });
    }
    Ok(())
}

/// Creates `path` holding `bytes` (mode 0600) only if it does not exist:
/// written to a fresh temporary (`O_EXCL`), synced, then hard-linked into
/// place, which fails rather than replaces. So a reader never sees half a
/// file, and two nodes starting at once agree on one key. `Ok(false)`: the
/// file was already there (read it instead).
pub fn create_new(path: &Path, bytes: &[u8]) -> Result<bool, StateFileError> {
    let tmp = write_temp(path, bytes)?;
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(io(path)(e)),
    }
}

/// Replaces `path` with `bytes` (mode 0600), atomically: a temporary
/// (`O_EXCL`) renamed over it. `rename` replaces a symlink itself, never
/// what it points to.
pub fn replace(path: &Path, bytes: &[u8]) -> Result<(), StateFileError> {
    let tmp = write_temp(path, bytes)?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(path)(e)
    })
}

fn write_temp(path: &Path, bytes: &[u8]) -> Result<PathBuf, StateFileError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(
        ".{name}.{}.{:08x}.tmp",
        std::process::id(),
        rand::random::<u32>()
    ));
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(io(&tmp))?;
    let written = f.write_all(bytes).and_then(|()| f.sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(&tmp)(e));
    }
    Ok(tmp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("wr-state-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_new_directory_is_private_and_an_open_one_is_tightened() {
        let dir = scratch("dir");
        prepare(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        prepare(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_directory_others_may_write_is_refused() {
        let dir = scratch("shm");
        check(&dir).unwrap();
        prepare(&dir).unwrap();
        check(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(matches!(check(&dir), Err(StateFileError::Mode { .. })));
        let err = prepare(&dir).unwrap_err();
        assert!(matches!(err, StateFileError::Mode { .. }), "{err}");
        assert!(err.to_string().contains(&dir.display().to_string()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn create_new_never_replaces_and_symlinks_are_not_followed() {
        let dir = scratch("files");
        prepare(&dir).unwrap();
        let key = dir.join("k");
        assert!(create_new(&key, b"first").unwrap());
        assert!(!create_new(&key, b"second").unwrap());
        assert_eq!(std::fs::read(&key).unwrap(), b"first");
        let f = open_existing(&key, false).unwrap().unwrap();
        check_private(&f, &key).unwrap();
        assert_eq!(f.metadata().unwrap().mode() & 0o777, 0o600);

        let link = dir.join("link");
        std::os::unix::fs::symlink(&key, &link).unwrap();
        let err = open_existing(&link, false).unwrap_err();
        assert!(matches!(err, StateFileError::Symlink { .. }), "{err}");

        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let f = open_existing(&key, false).unwrap().unwrap();
        let err = check_private(&f, &key).unwrap_err();
        assert!(err.to_string().contains("0644"), "{err}");
        check_owned_unwritable(&f, &key).unwrap();

        replace(&key, b"third").unwrap();
        assert_eq!(std::fs::read(&key).unwrap(), b"third");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            2,
            "no temporaries left"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
