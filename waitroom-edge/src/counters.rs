//! The node counters in a mapped file: the seeds' data-center counter.
//!
//! A file (`edge.counters` in the node's state directory by default) is
//! `mmap`ed shared; after a one-page header it holds [`SLOTS`]
//! [`RoomCounters`], each made only of atomics. Every worker thread updates
//! them without a lock, and because they live in a file, a restarted process
//! (an upgrade, a crash, even `kill -9`) carries on with the same counts:
//! active sessions and this minute's admissions are not forgotten.
//!
//! The file is checked before it is mapped: opened without following a
//! symlink, owned by the node and writable by no one else, exactly the
//! right size, and its header (magic, layout version, slot count and size)
//! carries a checksum. Anything else is set aside as `PATH.old` and a fresh
//! file made: a mapping is never shorter than the slots it is read as.
//!
//! A file truncated *while* mapped would make the next access to a page past
//! its end raise SIGBUS and kill the node. There is no way to stop another
//! process with write access from truncating a named file (seals exist only
//! for memfds; leases only delay it), and checking the size before each use
//! still races. So the node catches it instead: the SIGBUS guard of
//! `crate::mapped` handles a SIGBUS inside the mapping by putting zeroed
//! anonymous memory over the mapping, and the faulting access, retried,
//! succeeds. The node keeps
//! serving; counts start again from zero in memory (the file that held them
//! is gone anyway); the control loop logs it once ([`SharedCounters::truncated`]),
//! and the next start sets the short file aside.
use std::{collections::HashMap, path::Path};

use waitroom_common::{
    counters::{COUNTERS_LAYOUT_VERSION, CountersError, RoomCounters},
    room::RoomId,
};

use crate::{
    mapped::{Expected, MappedFile, sealed},
    state_dir::StateFileError,
};

/// Room slots in a file: far more rooms than a node serves, so reloads that add
/// rooms always find a free one.
pub const SLOTS: usize = 64;
/// The header page: magic, file version, slot count, slot size, checksum.
const HEADER: usize = 4096;
/// `\x02`: the header gained its checksum; older files are set aside.
const MAGIC: &[u8; 8] = b"WRNODE\0\x02";
/// The bytes the checksum covers (magic, version, slot count, slot size).
const CHECKED: usize = 24;
/// The whole file.
const FILE_LEN: usize = HEADER + SLOTS * RoomCounters::SIZE;

/// Why the counters file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SharedCountersError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    File(#[from] StateFileError),
    #[error("{path}: {source}")]
    Layout { path: String, source: CountersError },
    #[error("{path}: no free room slot (all {SLOTS} in use); delete the file to start afresh")]
    Full { path: String },
    #[error("{path}: not a waitroom counters file, or an incompatible version")]
    Foreign { path: String },
}

/// The mapped counters file.
pub struct SharedCounters {
    /// Keeps the mapping (and its SIGBUS guard) alive; never read through a
    /// Rust reference to bytes.
    file: MappedFile,
    /// First of `SLOTS` counters inside the mapping.
    base: *const RoomCounters,
    /// Slot index of each configured room.
    index: HashMap<RoomId, usize>,
}

impl std::fmt::Debug for SharedCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCounters")
            .field("path", &self.file.path())
            .field("rooms", &self.index.len())
            .finish()
    }
}

// SAFETY: the mapping is only accessed through `&RoomCounters`, whose fields are
// all atomics (`Sync`); the raw pointer is into the mapping of `file`, owned
// by this value.
unsafe impl Send for SharedCounters {}
// SAFETY: as above: shared access is only ever atomic.
unsafe impl Sync for SharedCounters {}

impl SharedCounters {
    /// Opens (or creates) the counters file and finds or claims a slot for each room.
    ///
    /// A file of the wrong size, with another layout (an incompatible upgrade)
    /// or a broken header is set aside as `PATH.old` and a fresh one created,
    /// with a warning. A file someone else owns or may write, or a symlink,
    /// is refused.
    pub fn open(path: &Path, rooms: &[RoomId]) -> Result<Self, SharedCountersError> {
        let shown = path.display().to_string();
        let io = |source| SharedCountersError::Io {
            path: shown.clone(),
            source,
        };
        let header = Self::header();
        let mut file = MappedFile::open(path, &Self::expected(path, &header), io)?;
        if file.len() != FILE_LEN {
            return Err(SharedCountersError::Foreign { path: shown });
        }
        let base = Self::base(&mut file)?;
        let mut this = Self {
            file,
            base,
            index: HashMap::new(),
        };
        this.assign(rooms)?;
        Ok(this)
    }

    /// Reads an existing counters file (`waitroom-edge stats`): a copy in
    /// memory, so nothing is claimed or changed, and a file cut short while
    /// it is read cannot hurt the reader. Every claimed slot is visible by
    /// its room id.
    pub fn open_existing(path: &Path) -> Result<Self, SharedCountersError> {
        let shown = path.display().to_string();
        let io = |source| SharedCountersError::Io {
            path: shown.clone(),
            source,
        };
        let header = Self::header();
        let Some(mut file) = MappedFile::copy(path, &Self::expected(path, &header), io)? else {
            return Err(SharedCountersError::Foreign { path: shown });
        };
        let base = Self::base(&mut file)?;
        let mut this = Self {
            file,
            base,
            index: HashMap::new(),
        };
        this.index = this
            .slots()
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.room().map(|r| (r, i)))
            .collect();
        Ok(this)
    }

    /// Whether the file was truncated underneath this mapping (the counts
    /// now live in memory only; see the module docs).
    pub fn truncated(&self) -> bool {
        self.file.truncated()
    }

    /// The file's path, for messages.
    pub fn path(&self) -> &str {
        self.file.path()
    }

    /// What the file must look like; one that does not is set aside as
    /// `path` with its extension replaced by `old`.
    fn expected<'a>(path: &Path, header: &'a [u8]) -> Expected<'a> {
        Expected {
            header,
            len: FILE_LEN,
            aside: path.with_extension("old"),
            damaged: "another layout or a damaged header (magic, version, slots or checksum)",
            set_aside: "counters file set aside; starting a new one",
        }
    }

    /// The first slot inside a mapping of `FILE_LEN` bytes.
    fn base(file: &mut MappedFile) -> Result<*const RoomCounters, SharedCountersError> {
        let path = file.path().to_owned();
        let slots = RoomCounters::from_bytes_mut(&mut file.bytes_mut()[HEADER..])
            .map_err(|source| SharedCountersError::Layout { path, source })?;
        Ok(slots.as_ptr())
    }

    /// The header of a file of this build's layout.
    fn header() -> [u8; CHECKED + 8] {
        let mut h = [0u8; CHECKED + 8];
        h[..8].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&COUNTERS_LAYOUT_VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&(SLOTS as u32).to_le_bytes());
        h[16..24].copy_from_slice(&(RoomCounters::SIZE as u64).to_le_bytes());
        sealed(h)
    }

    fn slots(&self) -> &[RoomCounters] {
        // SAFETY: `base` points at `SLOTS` `RoomCounters` inside the mapping owned by
        // `self.file` (checked by `from_bytes_mut` at open); it lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.base, SLOTS) }
    }

    /// Finds each room's slot (kept from a previous run) or claims a free one.
    /// Slots of rooms no longer configured are reused only when none is free.
    pub fn assign(&mut self, rooms: &[RoomId]) -> Result<(), SharedCountersError> {
        let mut index = HashMap::with_capacity(rooms.len());
        for room in rooms {
            let slots = self.slots();
            let found = slots.iter().position(|s| s.room() == Some(*room));
            let slot = match found {
                Some(i) => i,
                None => {
                    let free = slots.iter().position(|s| s.room().is_none());
                    let i = match free {
                        Some(i) => i,
                        None => slots
                            .iter()
                            .position(|s| s.room().is_some_and(|r| !rooms.contains(&r)))
                            .ok_or_else(|| SharedCountersError::Full {
                                path: self.file.path().to_owned(),
                            })?,
                    };
                    slots[i].reset();
                    slots[i]
                        .claim(*room)
                        .map_err(|source| SharedCountersError::Layout {
                            path: self.file.path().to_owned(),
                            source,
                        })?;
                    i
                }
            };
            index.insert(*room, slot);
        }
        self.index = index;
        Ok(())
    }

    /// The counters of `room`, if it is configured.
    pub fn room(&self, room: RoomId) -> Option<&RoomCounters> {
        self.slot_of(room).map(|i| self.slot(i))
    }

    /// Where `room`'s counters are: resolve once, then use [`Self::slot`]
    /// on the request path (no lookup per request).
    /// The rooms that have claimed a slot (by this process, or in the file
    /// when read with [`Self::open_existing`]).
    #[must_use]
    pub fn claimed_rooms(&self) -> std::collections::HashSet<RoomId> {
        self.index.keys().copied().collect()
    }

    pub fn slot_of(&self, room: RoomId) -> Option<usize> {
        self.index.get(&room).copied()
    }

    /// The counters in slot `i` (from [`Self::slot_of`]).
    pub fn slot(&self, i: usize) -> &RoomCounters {
        &self.slots()[i]
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt as _;

    use waitroom_common::{
        counters::Pool,
        time::{ExpirySlot, Minute},
    };

    use super::*;

    #[test]
    fn counts_survive_reopening_the_file() {
        let dir = std::env::temp_dir().join(format!("wr-counters-{}", std::process::id()));
        let path = dir.join("c.shm");
        let _ = std::fs::remove_file(&path);
        let a = RoomId::from_name("a");
        let b = RoomId::from_name("b");
        {
            let c = SharedCounters::open(&path, &[a, b]).unwrap();
            assert!(
                c.room(a)
                    .unwrap()
                    .take_ticket(Pool::ColoShare, Minute(100), 5)
            );
            c.room(b).unwrap().start_session(ExpirySlot(110));
        }
        let c = SharedCounters::open(&path, &[b, a]).unwrap();
        assert_eq!(c.room(a).unwrap().admits(Minute(100)).total(), 1);
        assert_eq!(c.room(b).unwrap().active_users(ExpirySlot(105)), 1);
        assert_eq!(c.room(a).unwrap().active_users(ExpirySlot(105)), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_foreign_file_is_set_aside_not_trusted() {
        let dir = std::env::temp_dir().join(format!("wr-counters-f-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.shm");
        std::fs::write(&path, b"not a counters file").unwrap();
        let a = RoomId::from_name("a");
        let c = SharedCounters::open(&path, &[a]).unwrap();
        assert_eq!(c.room(a).unwrap().active_users(ExpirySlot(1)), 0);
        assert!(path.with_extension("old").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
    /// An upgrade from expiry minutes (layout 1) to slots: the old file
    /// (its header intact, its size that of layout 1) is set aside as
    /// `PATH.old`, the node starts with fresh counters, nothing crashes.
    #[test]
    fn a_counters_file_of_layout_1_is_set_aside_on_upgrade() {
        const LAYOUT_1_SIZE: usize = 82_112;
        let dir = scratch("layout1");
        let path = dir.join("c.shm");
        let mut h = [0u8; CHECKED + 8];
        h[..8].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&1u32.to_le_bytes());
        h[12..16].copy_from_slice(&(SLOTS as u32).to_le_bytes());
        h[16..24].copy_from_slice(&(LAYOUT_1_SIZE as u64).to_le_bytes());
        let old = sealed(h);
        let f = std::fs::File::create(&path).unwrap();
        f.set_len((HEADER + SLOTS * LAYOUT_1_SIZE) as u64).unwrap();
        f.write_all_at(&old, 0).unwrap();
        drop(f);
        let a = RoomId::from_name("a");
        let c = SharedCounters::open(&path, &[a]).unwrap();
        assert_eq!(c.room(a).unwrap().active_users(ExpirySlot(1)), 0);
        c.room(a).unwrap().start_session(ExpirySlot(10));
        assert_eq!(c.room(a).unwrap().active_users(ExpirySlot(10)), 1);
        let aside = std::fs::metadata(path.with_extension("old")).unwrap();
        assert_eq!(aside.len(), (HEADER + SLOTS * LAYOUT_1_SIZE) as u64);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), FILE_LEN as u64);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("wr-counters-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_file_of_the_wrong_size_is_set_aside_never_mapped() {
        let dir = scratch("size");
        let path = dir.join("c.shm");
        let a = RoomId::from_name("a");
        drop(SharedCounters::open(&path, &[a]).unwrap());
        // A good header on a file cut short: mapping it would fault later.
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(HEADER as u64 + 100).unwrap();
        drop(f);
        let c = SharedCounters::open(&path, &[a]).unwrap();
        assert_eq!(c.room(a).unwrap().active_users(ExpirySlot(1)), 0);
        let old = std::fs::metadata(path.with_extension("old")).unwrap();
        assert_eq!(old.len(), HEADER as u64 + 100);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), FILE_LEN as u64);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_damaged_header_fails_its_checksum() {
        let dir = scratch("sum");
        let path = dir.join("c.shm");
        let a = RoomId::from_name("a");
        {
            let c = SharedCounters::open(&path, &[a]).unwrap();
            c.room(a).unwrap().start_session(ExpirySlot(10));
        }
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0xff], 30).unwrap();
        drop(f);
        let c = SharedCounters::open(&path, &[a]).unwrap();
        assert_eq!(c.room(a).unwrap().active_users(ExpirySlot(10)), 0);
        assert!(path.with_extension("old").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_symlink_or_a_file_others_may_write_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = scratch("perm");
        let path = dir.join("c.shm");
        let a = RoomId::from_name("a");
        drop(SharedCounters::open(&path, &[a]).unwrap());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let err = SharedCounters::open(&path, &[a]).unwrap_err().to_string();
        assert!(err.contains("0666"), "{err}");
        let link = dir.join("link.shm");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let err = SharedCounters::open(&link, &[a]).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_truncated_under_the_mapping_does_not_kill_the_process() {
        let dir = scratch("trunc");
        let path = dir.join("c.shm");
        let a = RoomId::from_name("a");
        let c = SharedCounters::open(&path, &[a]).unwrap();
        let room = c.room(a).unwrap();
        room.start_session(ExpirySlot(10));
        assert_eq!(room.active_users(ExpirySlot(10)), 1);
        assert!(!c.truncated());
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        // Without the guard, this read dies of SIGBUS.
        assert_eq!(
            room.active_users(ExpirySlot(10)),
            0,
            "counts start over in memory"
        );
        assert!(c.truncated());
        room.start_session(ExpirySlot(10));
        assert_eq!(room.active_users(ExpirySlot(10)), 1, "and go on counting");
        drop(c);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
