//! A node state file mapped shared: what the counters file
//! ([`crate::counters`]) and the ticket ledger file ([`crate::ledger`]) have
//! in common, so both are made and checked the same way.
//!
//! The file is checked before it is mapped: opened without following a
//! symlink, owned by the node and writable by no one else, exactly the
//! expected size, and starting with the expected header (the caller's magic,
//! layout version and sizes, then an FNV-1a checksum of them, see
//! [`sealed`]). A file that fails the size or header check is set aside
//! (where the caller says) and a fresh one made: a mapping is never shorter
//! than what it is read as. A truncation *while* mapped is caught by the
//! [`sigbus`] guard that [`MappedFile`] registers for its mapping and
//! releases before unmapping it.
use std::{
    fs::File,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
};

use memmap2::MmapMut;

use crate::state_dir::{self, StateFileError};

/// What a file of this build must look like, and what to say when it does not.
#[derive(Debug)]
pub(crate) struct Expected<'a> {
    /// The file's header as this build writes it (checksum included, see
    /// [`sealed`]); an existing file must start with exactly these bytes.
    pub header: &'a [u8],
    /// The whole file, in bytes.
    pub len: usize,
    /// Where a file that fails the checks is moved.
    pub aside: PathBuf,
    /// The problem reported when the header differs.
    pub damaged: &'static str,
    /// The warning logged when a file is set aside.
    pub set_aside: &'static str,
}

impl Expected<'_> {
    /// What is wrong with an existing file, read with `pread` (never mapped
    /// before it passed).
    pub fn problem(&self, file: &File) -> Option<String> {
        let len = match file.metadata() {
            Ok(m) => m.len(),
            Err(e) => return Some(e.to_string()),
        };
        if len != self.len as u64 {
            return Some(format!("{len} bytes, not {}", self.len));
        }
        let mut found = vec![0u8; self.header.len()];
        if let Err(e) = file.read_exact_at(&mut found, 0) {
            return Some(e.to_string());
        }
        (found != self.header).then(|| self.damaged.to_owned())
    }

    /// A new file (`O_EXCL`, no symlink followed, mode 0600) of the right
    /// size, zeroed (sparse), with its header written last by `pwrite`: a
    /// file cut short mid-creation fails the checks next time and is made
    /// again.
    fn create(&self, path: &Path) -> std::io::Result<File> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        file.set_len(self.len as u64)?;
        file.write_all_at(self.header, 0)?;
        Ok(file)
    }
}

/// `fields` with the FNV-1a checksum of all but its last 8 bytes written
/// into those 8 bytes (little-endian).
pub(crate) fn sealed<const N: usize>(mut fields: [u8; N]) -> [u8; N] {
    let checked = N - 8;
    let sum = fnv1a(&fields[..checked]);
    fields[checked..].copy_from_slice(&sum.to_le_bytes());
    fields
}

/// A mapping of a node state file (or a private copy of one), with the
/// SIGBUS guard of a shared mapping.
pub(crate) struct MappedFile {
    /// The SIGBUS guard of the mapping (see the module docs); released in
    /// `Drop` before `map` unmaps the range.
    guard: Option<sigbus::Guard>,
    /// The mapping; the owner reads it only through atomics.
    map: MmapMut,
    /// The open file behind the mapping (`None` for a copy in memory).
    _file: Option<File>,
    path: String,
}

impl std::fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedFile")
            .field("path", &self.path)
            .field("len", &self.map.len())
            .finish_non_exhaustive()
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        // Unguard before `map` unmaps the range (fields drop after this).
        if let Some(guard) = self.guard.take() {
            guard.release();
        }
    }
}

impl MappedFile {
    /// Opens (or creates) the file at `path` and maps it shared, guarded.
    ///
    /// A file of the wrong size or header is set aside (`expected.aside`)
    /// and a fresh one created, with a warning. A file someone else owns or
    /// may write, or a symlink, is refused. The mapping is as long as the
    /// file when it is mapped: a caller that reads it as `expected.len`
    /// bytes checks [`Self::len`] (or lets its layout check do it).
    pub fn open<E: From<StateFileError>>(
        path: &Path,
        expected: &Expected<'_>,
        io: impl Fn(std::io::Error) -> E,
    ) -> Result<Self, E> {
        let shown = path.display().to_string();
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
            && !dir.exists()
        {
            state_dir::prepare(dir)?;
        }
        let file = match state_dir::open_existing(path, true)? {
            Some(file) => {
                state_dir::check_owned_unwritable(&file, path)?;
                match expected.problem(&file) {
                    None => file,
                    Some(problem) => {
                        let old = &expected.aside;
                        tracing::warn!(file = %shown, %problem, moved_to = %old.display(), "{}", expected.set_aside);
                        drop(file);
                        std::fs::rename(path, old).map_err(&io)?;
                        expected.create(path).map_err(&io)?
                    }
                }
            }
            None => expected.create(path).map_err(&io)?,
        };
        // SAFETY: the file is ours, writable by no one else, and was
        // `expected.len` long with the expected header (checked or just
        // made); every process that maps it (a restarted node) touches it
        // only through atomics, which is the contract of the owner's layout
        // types. A truncation underneath is caught by the SIGBUS guard set up
        // below, before the owner reads anything through the mapping.
        let mut map = unsafe { MmapMut::map_mut(&file) }.map_err(&io)?;
        let guard = sigbus::Guard::new(map.as_mut_ptr() as usize, map.len());
        Ok(Self {
            guard,
            map,
            _file: Some(file),
            path: shown,
        })
    }

    /// A private copy in memory of an existing file that passed
    /// `expected`'s checks (`None` if it did not): nothing in the file is
    /// changed, and a file cut short while it is read cannot hurt the reader.
    pub fn copy<E: From<StateFileError>>(
        path: &Path,
        expected: &Expected<'_>,
        io: impl Fn(std::io::Error) -> E,
    ) -> Result<Option<Self>, E> {
        let file = state_dir::open_existing(path, false)?
            .ok_or_else(|| io(std::io::Error::from(std::io::ErrorKind::NotFound)))?;
        if expected.problem(&file).is_some() {
            return Ok(None);
        }
        let mut map = MmapMut::map_anon(expected.len).map_err(&io)?;
        file.read_exact_at(&mut map[..], 0).map_err(&io)?;
        Ok(Some(Self {
            guard: None,
            map,
            _file: None,
            path: path.display().to_string(),
        }))
    }

    /// The mapped bytes, for the owner's layout check; the owner keeps a
    /// pointer into them only as long as it keeps `self`.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.map[..]
    }

    /// The length of the mapping.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the file was truncated underneath this mapping (the contents
    /// now live in memory only; see the module docs).
    pub fn truncated(&self) -> bool {
        self.guard.as_ref().is_some_and(sigbus::Guard::hit)
    }

    /// The file's path, for messages.
    pub fn path(&self) -> &str {
        &self.path
    }
}

/// FNV-1a, 64 bits: catches a damaged header; not a defence against anyone
/// who can write the file (the file's owner and mode checks are).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Surviving a mapped file truncated under its mapping (see [`crate::counters`]).
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
                "no SIGBUS guard slot free; a truncated counters or ticket-ledger file would stop the node"
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
