//! The ticket ledger in a mapped file, beside the counters file.
//!
//! [`TicketLedger`] (see its module docs for the rule and its bounds) says
//! where each ticket's count sits; it must outlive the process exactly as
//! long as the counts it describes do, so it lives in its own file
//! (`<counters file>.tickets`), mapped shared, made and checked the way the
//! counters file is ([`crate::counters`]; both use `crate::mapped`): opened
//! without following a symlink, owned by the node and writable by no one
//! else, exactly the right size, a header (magic, layout version, entries,
//! size) with a checksum,
//! and the same SIGBUS guard against a truncation underneath. A file of
//! another layout or size (`node.ticket_ledger_entries` changed) is set aside
//! as `PATH.old` and made afresh: the tickets it knew are then believed once
//! more, which is the ledger's bound for any ticket it does not know.
//!
//! A file truncated underneath the mapping leaves zeroed memory in its
//! place (the SIGBUS guard): a zeroed ledger remembers nothing, so every
//! cookie's claim is believed again, as before the ledger, until the next
//! start makes a new file; the control loop logs it once.
//!
//! The placement key is drawn at random when the file is made and kept in
//! it (the file is private to the node), so a restart keeps finding its
//! entries.
use std::path::{Path, PathBuf};

use waitroom_common::ledger::{LEDGER_LAYOUT_VERSION, LedgerError, TicketLedger};

use crate::{
    mapped::{Expected, MappedFile, sealed},
    state_dir::StateFileError,
};

/// The header page: magic, version, entries, bytes, checksum.
const HEADER: usize = 4096;
const MAGIC: &[u8; 8] = b"WRTKTS\0\x01";
/// The bytes the checksum covers (magic, version, entries, bytes).
const CHECKED: usize = 28;

/// Why the ledger file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SharedLedgerError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    File(#[from] StateFileError),
    #[error("{path}: {source}")]
    Layout { path: String, source: LedgerError },
}

/// The mapped ledger file.
pub struct SharedLedger {
    /// Keeps the mapping (and its SIGBUS guard) alive; only read through
    /// `ledger`.
    file: MappedFile,
    /// The ledger's words inside the mapping.
    words: *const std::sync::atomic::AtomicU64,
    len: usize,
}

impl std::fmt::Debug for SharedLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedLedger")
            .field("path", &self.file.path())
            .field("entries", &self.ledger().entries())
            .finish()
    }
}

// SAFETY: the mapping is only accessed through `&TicketLedger`, all atomics;
// the raw pointer is into the mapping of `file`, owned by this value.
unsafe impl Send for SharedLedger {}
// SAFETY: as above: shared access is only ever atomic.
unsafe impl Sync for SharedLedger {}

/// Where the ledger of a node with this counters file lives.
#[must_use]
pub fn ledger_file(counters_file: &Path) -> PathBuf {
    let mut name = counters_file.as_os_str().to_owned();
    name.push(".tickets");
    PathBuf::from(name)
}

impl SharedLedger {
    /// Opens (or creates) the ledger file for `entries` tickets.
    pub fn open(path: &Path, entries: usize) -> Result<Self, SharedLedgerError> {
        let shown = path.display().to_string();
        let io = |source| SharedLedgerError::Io {
            path: shown.clone(),
            source,
        };
        let entries = TicketLedger::round_entries(entries);
        let file_len = HEADER + TicketLedger::bytes_for(entries);
        let header = header(entries, file_len);
        let expected = Expected {
            header: &header,
            len: file_len,
            aside: aside(path),
            damaged: "another layout, size or a damaged header (magic, version, entries or checksum)",
            set_aside: "ticket ledger file set aside; starting a new one (tickets it knew are believed once more)",
        };
        let mut file = MappedFile::open(path, &expected, io)?;
        let layout = |source| SharedLedgerError::Layout {
            path: shown.clone(),
            source,
        };
        let (words, len) = {
            let ledger =
                TicketLedger::from_bytes_mut(&mut file.bytes_mut()[HEADER..]).map_err(layout)?;
            ledger.claim(entries, [rand::random(), rand::random()]);
            ledger.check().map_err(layout)?;
            let words = TicketLedger::words_for(entries);
            (
                std::ptr::from_ref(ledger).cast::<std::sync::atomic::AtomicU64>(),
                words,
            )
        };
        Ok(Self { file, words, len })
    }

    /// The ledger.
    #[must_use]
    pub fn ledger(&self) -> &TicketLedger {
        // SAFETY: `words` points at `len` `AtomicU64`s inside the mapping
        // owned by `self.file` (checked at open); it lives as long as `self`.
        let words = unsafe { std::slice::from_raw_parts(self.words, self.len) };
        TicketLedger::from_words(words).expect("checked at open")
    }

    /// Whether the file was truncated underneath the mapping.
    #[must_use]
    pub fn truncated(&self) -> bool {
        self.file.truncated()
    }

    #[must_use]
    pub fn path(&self) -> &str {
        self.file.path()
    }
}

/// Where a file that cannot be used is set aside: `PATH.old`.
fn aside(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".old");
    PathBuf::from(name)
}

/// The header of a file of this build's layout for `entries` tickets.
fn header(entries: usize, file_len: usize) -> [u8; CHECKED + 8] {
    let mut h = [0u8; CHECKED + 8];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&LEDGER_LAYOUT_VERSION.to_le_bytes());
    h[12..20].copy_from_slice(&(entries as u64).to_le_bytes());
    h[20..28].copy_from_slice(&(file_len as u64).to_le_bytes());
    sealed(h)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt as _;

    use waitroom_common::{
        ledger::Counted,
        time::{ExpirySlot, Minute},
    };

    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("wr-ledger-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn entries_survive_reopening_and_another_size_starts_afresh() {
        let dir = scratch("reopen");
        let path = ledger_file(&dir.join("edge.counters"));
        assert!(path.ends_with("edge.counters.tickets"));
        let to = Counted::Session {
            expiry: ExpirySlot(60_017),
        };
        {
            let shared = SharedLedger::open(&path, 2_048).unwrap();
            let mut seen = shared.ledger().look(77, Minute(990));
            assert!(shared.ledger().replace(&mut seen, to, Minute(990)));
        }
        let shared = SharedLedger::open(&path, 2_048).unwrap();
        assert_eq!(shared.ledger().look(77, Minute(990)).known, Some(to));
        drop(shared);
        let shared = SharedLedger::open(&path, 4_096).unwrap();
        assert_eq!(shared.ledger().entries(), 4_096);
        assert_eq!(shared.ledger().look(77, Minute(990)).known, None);
        assert!(aside(&path).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_damaged_header_is_set_aside() {
        let dir = scratch("sum");
        let path = dir.join("l.tickets");
        drop(SharedLedger::open(&path, 1_024).unwrap());
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0xff], 13).unwrap();
        drop(f);
        let shared = SharedLedger::open(&path, 1_024).unwrap();
        assert_eq!(shared.ledger().entries(), 1_024);
        assert!(aside(&path).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
