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
//! still races. So the node catches it instead: [`sigbus`] handles a SIGBUS
//! inside a counters mapping by putting zeroed anonymous memory over the
//! mapping, and the faulting access, retried, succeeds. The node keeps
//! serving; counts start again from zero in memory (the file that held them
//! is gone anyway); the control loop logs it once ([`SharedCounters::truncated`]),
//! and the next start sets the short file aside.
use std::{collections::HashMap, fs::File, os::unix::fs::FileExt as _, path::Path};

use memmap2::MmapMut;
use waitroom_common::{
    counters::{COUNTERS_LAYOUT_VERSION, CountersError, RoomCounters},
    room::RoomId,
};

use crate::state_dir::{self, StateFileError};

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
    /// Keeps the mapping alive; never read through a Rust reference to bytes.
    _map: MmapMut,
    /// The open file behind the mapping (`None` for a read-only copy).
    _file: Option<File>,
    /// The SIGBUS guard of the mapping (see the module docs).
    guard: Option<sigbus::Guard>,
    /// First of `SLOTS` counters inside the mapping.
    base: *const RoomCounters,
    /// Slot index of each configured room.
    index: HashMap<RoomId, usize>,
    path: String,
}

impl std::fmt::Debug for SharedCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCounters")
            .field("path", &self.path)
            .field("rooms", &self.index.len())
            .finish()
    }
}

// SAFETY: the mapping is only accessed through `&RoomCounters`, whose fields are
// all atomics (`Sync`); the raw pointer is into a mapping owned by this value.
unsafe impl Send for SharedCounters {}
// SAFETY: as above: shared access is only ever atomic.
unsafe impl Sync for SharedCounters {}

impl Drop for SharedCounters {
    fn drop(&mut self) {
        // Unguard before `_map` unmaps the range (fields drop after this).
        if let Some(guard) = self.guard.take() {
            guard.release();
        }
    }
}

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
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
            && !dir.exists()
        {
            state_dir::prepare(dir)?;
        }
        let file = match state_dir::open_existing(path, true)? {
            Some(file) => {
                state_dir::check_owned_unwritable(&file, path)?;
                match Self::problem(&file) {
                    None => file,
                    Some(problem) => {
                        let old = path.with_extension("old");
                        tracing::warn!(file = %shown, %problem, moved_to = %old.display(), "counters file set aside; starting a new one");
                        drop(file);
                        std::fs::rename(path, &old).map_err(io)?;
                        Self::create(path).map_err(io)?
                    }
                }
            }
            None => Self::create(path).map_err(io)?,
        };
        // SAFETY: the file is ours, exactly `FILE_LEN` long (checked or just
        // made); other processes that map it (a restarted node) only touch it
        // through atomics, which is the contract of `RoomCounters`. A
        // truncation underneath is caught by the SIGBUS guard set up below,
        // before any slot is read.
        let mut map = unsafe { MmapMut::map_mut(&file) }.map_err(io)?;
        if map.len() != FILE_LEN {
            return Err(SharedCountersError::Foreign { path: shown });
        }
        let guard = sigbus::Guard::new(map.as_mut_ptr() as usize, map.len());
        let base = {
            let slots = RoomCounters::from_bytes_mut(&mut map[HEADER..]).map_err(|source| {
                SharedCountersError::Layout {
                    path: shown.clone(),
                    source,
                }
            })?;
            slots.as_ptr()
        };
        let mut this = Self {
            _map: map,
            _file: Some(file),
            guard,
            base,
            index: HashMap::new(),
            path: shown,
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
        let file = state_dir::open_existing(path, false)?
            .ok_or_else(|| io(std::io::Error::from(std::io::ErrorKind::NotFound)))?;
        if Self::problem(&file).is_some() {
            return Err(SharedCountersError::Foreign { path: shown });
        }
        let mut map = MmapMut::map_anon(FILE_LEN).map_err(io)?;
        file.read_exact_at(&mut map[..], 0).map_err(io)?;
        let base = RoomCounters::from_bytes_mut(&mut map[HEADER..])
            .map_err(|source| SharedCountersError::Layout {
                path: shown.clone(),
                source,
            })?
            .as_ptr();
        let mut this = Self {
            _map: map,
            _file: None,
            guard: None,
            base,
            index: HashMap::new(),
            path: shown,
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
        self.guard.as_ref().is_some_and(sigbus::Guard::hit)
    }

    /// The file's path, for messages.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What is wrong with an existing file, read with `pread` (never mapped
    /// before it passed).
    fn problem(file: &File) -> Option<String> {
        let len = match file.metadata() {
            Ok(m) => m.len(),
            Err(e) => return Some(e.to_string()),
        };
        if len != FILE_LEN as u64 {
            return Some(format!("{len} bytes, not {FILE_LEN}"));
        }
        let mut header = [0u8; CHECKED + 8];
        if let Err(e) = file.read_exact_at(&mut header, 0) {
            return Some(e.to_string());
        }
        (header != Self::header()).then(|| {
            "another layout or a damaged header (magic, version, slots or checksum)".to_owned()
        })
    }

    /// The header of a file of this build's layout.
    fn header() -> [u8; CHECKED + 8] {
        let mut h = [0u8; CHECKED + 8];
        h[..8].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&COUNTERS_LAYOUT_VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&(SLOTS as u32).to_le_bytes());
        h[16..24].copy_from_slice(&(RoomCounters::SIZE as u64).to_le_bytes());
        let sum = fnv1a(&h[..CHECKED]);
        h[CHECKED..].copy_from_slice(&sum.to_le_bytes());
        h
    }

    /// A new file (`O_EXCL`, no symlink followed, mode 0600) of the right
    /// size, zeroed, with its header written last by `pwrite`: a file cut
    /// short mid-creation fails the checks next time and is made again.
    fn create(path: &Path) -> std::io::Result<File> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        file.set_len(FILE_LEN as u64)?;
        file.write_all_at(&Self::header(), 0)?;
        Ok(file)
    }

    fn slots(&self) -> &[RoomCounters] {
        // SAFETY: `base` points at `SLOTS` `RoomCounters` inside the mapping owned by
        // `self._map` (checked by `from_bytes_mut` at open); it lives as long as `self`.
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
                                path: self.path.clone(),
                            })?,
                    };
                    slots[i].reset();
                    slots[i]
                        .claim(*room)
                        .map_err(|source| SharedCountersError::Layout {
                            path: self.path.clone(),
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

/// FNV-1a, 64 bits: catches a damaged header; not a defence against anyone
/// who can write the file (the file's owner and mode checks are).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Surviving a counters file truncated under its mapping (module docs).
///
/// A process-wide SIGBUS handler knows the address ranges of the live
/// mappings. A fault inside one replaces that whole range with zeroed
/// anonymous shared memory (`MAP_FIXED`) and returns, so the faulting
/// load or store runs again and succeeds; a fault anywhere else goes to the
/// handler that was there before (Rust's own, which reports stack overflow)
/// or, if that was the default, kills the process as SIGBUS always did.
pub(crate) mod sigbus {
    use std::sync::{
        Once, OnceLock,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    };

    /// Ranges guarded at once (a node has one; tests open a few).
    const RANGES: usize = 32;

    static STARTS: [AtomicUsize; RANGES] = [const { AtomicUsize::new(0) }; RANGES];
    static LENS: [AtomicUsize; RANGES] = [const { AtomicUsize::new(0) }; RANGES];
    static HITS: [AtomicBool; RANGES] = [const { AtomicBool::new(false) }; RANGES];
    static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
    static INSTALL: Once = Once::new();

    /// One guarded range; [`Guard::release`] before unmapping it.
    #[derive(Debug)]
    pub struct Guard {
        slot: usize,
    }

    impl Guard {
        /// Guards `len` bytes at `start`; `None` (unguarded, as before) if
        /// every slot is taken or the handler could not be installed.
        pub fn new(start: usize, len: usize) -> Option<Self> {
            INSTALL.call_once(install);
            PREVIOUS.get()?;
            for slot in 0..RANGES {
                if LENS[slot].load(Ordering::Acquire) == 0
                    && STARTS[slot]
                        .compare_exchange(0, start, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                {
                    HITS[slot].store(false, Ordering::Release);
                    LENS[slot].store(len, Ordering::Release);
                    return Some(Self { slot });
                }
            }
            tracing::warn!(
                "no SIGBUS guard slot free; a truncated counters file would stop the node"
            );
            None
        }

        /// Whether a fault replaced the range with anonymous memory.
        pub fn hit(&self) -> bool {
            HITS[self.slot].load(Ordering::Acquire)
        }

        pub fn release(self) {
            LENS[self.slot].store(0, Ordering::Release);
            STARTS[self.slot].store(0, Ordering::Release);
        }
    }

    fn install() {
        // SAFETY: a zeroed `sigaction` is a valid "no handler, empty mask"
        // value; `sigaction` only reads `new` and writes `old`.
        unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = handler as *const () as usize;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut new.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, &new, &mut old) == 0 {
                let _ = PREVIOUS.set(old);
            }
        }
    }

    /// Async-signal-safe: atomics, `mmap`, `sigaction` and a call through.
    extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
        let addr = unsafe { (*info).si_addr() } as usize;
        for slot in 0..RANGES {
            let start = STARTS[slot].load(Ordering::Acquire);
            let len = LENS[slot].load(Ordering::Acquire);
            if len != 0 && addr >= start && addr < start + len {
                if !HITS[slot].swap(true, Ordering::AcqRel) {
                    // SAFETY: the range is a live mapping this process owns
                    // (a guard is released before its mapping is unmapped);
                    // MAP_FIXED replaces it in place with zeroed memory that
                    // every holder of the address keeps using atomically.
                    unsafe {
                        libc::mmap(
                            start as *mut libc::c_void,
                            len,
                            libc::PROT_READ | libc::PROT_WRITE,
                            libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                            -1,
                            0,
                        );
                    }
                }
                // Another thread may still be replacing it: returning
                // retries the access, which faults again until it is done.
                return;
            }
        }
        let Some(previous) = PREVIOUS.get() else {
            return;
        };
        match previous.sa_sigaction {
            libc::SIG_DFL | libc::SIG_IGN => {
                // SAFETY: restoring the default action; the access faults
                // again on return and the process dies of SIGBUS as before.
                unsafe {
                    let mut dfl: libc::sigaction = std::mem::zeroed();
                    dfl.sa_sigaction = libc::SIG_DFL;
                    libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
                }
            }
            f if previous.sa_flags & libc::SA_SIGINFO != 0 => {
                // SAFETY: with SA_SIGINFO the previous handler has this type.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(f) };
                f(sig, info, ctx);
            }
            f => {
                // SAFETY: without SA_SIGINFO the previous handler has this type.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(f) };
                f(sig);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt as _;

    use waitroom_common::{counters::Pool, time::Minute};

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
            c.room(b).unwrap().start_session(Minute(110));
        }
        let c = SharedCounters::open(&path, &[b, a]).unwrap();
        assert_eq!(c.room(a).unwrap().admits(Minute(100)).total(), 1);
        assert_eq!(c.room(b).unwrap().active_users(Minute(105)), 1);
        assert_eq!(c.room(a).unwrap().active_users(Minute(105)), 0);
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
        assert_eq!(c.room(a).unwrap().active_users(Minute(1)), 0);
        assert!(path.with_extension("old").exists());
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
        assert_eq!(c.room(a).unwrap().active_users(Minute(1)), 0);
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
            c.room(a).unwrap().start_session(Minute(10));
        }
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0xff], 30).unwrap();
        drop(f);
        let c = SharedCounters::open(&path, &[a]).unwrap();
        assert_eq!(c.room(a).unwrap().active_users(Minute(10)), 0);
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
        room.start_session(Minute(10));
        assert_eq!(room.active_users(Minute(10)), 1);
        assert!(!c.truncated());
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        // Without the guard, this read dies of SIGBUS.
        assert_eq!(
            room.active_users(Minute(10)),
            0,
            "counts start over in memory"
        );
        assert!(c.truncated());
        room.start_session(Minute(10));
        assert_eq!(room.active_users(Minute(10)), 1, "and go on counting");
        drop(c);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
