//! The node counters in shared memory: the seeds' data-center counter.
//!
//! A file (under `/dev/shm` by default) is `mmap`ed shared; after a one-page
//! header it holds [`SLOTS`] [`RoomCounters`], each made only of atomics. Every
//! worker thread updates them without a lock, and because they live in a file,
//! a restarted process (an upgrade, a crash) carries on with the same counts:
//! active sessions and this minute's admissions are not forgotten.
use std::{collections::HashMap, fs::OpenOptions, path::Path};

use memmap2::MmapMut;
use waitroom_common::{
    counters::{COUNTERS_LAYOUT_VERSION, CountersError, RoomCounters},
    room::RoomId,
};

/// Room slots in a file: far more rooms than a node serves, so reloads that add
/// rooms always find a free one.
pub const SLOTS: usize = 64;
/// The header page: magic, file version, slot count, slot size.
const HEADER: usize = 4096;
const MAGIC: &[u8; 8] = b"WRNODE\0\x01";

/// Why the counters file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SharedCountersError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
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

impl SharedCounters {
    /// Opens (or creates) the counters file and finds or claims a slot for each room.
    ///
    /// A file with another layout (an incompatible upgrade) is set aside as
    /// `PATH.old` and a fresh one created, with a warning.
    pub fn open(path: &Path, rooms: &[RoomId]) -> Result<Self, SharedCountersError> {
        let shown = path.display().to_string();
        let io = |source| SharedCountersError::Io {
            path: shown.clone(),
            source,
        };
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let len = HEADER + SLOTS * RoomCounters::SIZE;
        let mut map = Self::map_file(path, len).map_err(io)?;
        if !Self::header_ok(&map) {
            if map[..8].iter().any(|b| *b != 0) {
                let old = path.with_extension("old");
                tracing::warn!(file = %shown, moved_to = %old.display(), "counters file has another layout; starting a new one");
                drop(map);
                std::fs::rename(path, &old).map_err(io)?;
                map = Self::map_file(path, len).map_err(io)?;
            }
            Self::write_header(&mut map);
        }
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
            base,
            index: HashMap::new(),
            path: shown,
        };
        this.assign(rooms)?;
        Ok(this)
    }

    /// Opens an existing counters file to read it (`waitroom-edge stats`): claims
    /// nothing, changes nothing; every claimed slot is visible by its room id.
    pub fn open_existing(path: &Path) -> Result<Self, SharedCountersError> {
        let shown = path.display().to_string();
        let len = HEADER + SLOTS * RoomCounters::SIZE;
        match std::fs::metadata(path) {
            Ok(m) if m.len() == len as u64 => {}
            Ok(_) => return Err(SharedCountersError::Foreign { path: shown }),
            Err(source) => {
                return Err(SharedCountersError::Io {
                    path: shown,
                    source,
                });
            }
        }
        let mut map = Self::map_file(path, len).map_err(|source| SharedCountersError::Io {
            path: shown.clone(),
            source,
        })?;
        if !Self::header_ok(&map) {
            return Err(SharedCountersError::Foreign { path: shown });
        }
        let base = RoomCounters::from_bytes_mut(&mut map[HEADER..])
            .map_err(|source| SharedCountersError::Layout {
                path: shown.clone(),
                source,
            })?
            .as_ptr();
        let mut this = Self {
            _map: map,
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

    fn map_file(path: &Path, len: usize) -> std::io::Result<MmapMut> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        if file.metadata()?.len() != len as u64 {
            file.set_len(len as u64)?;
        }
        // SAFETY: the file is ours (created with the node's permissions); other
        // processes that map it (a restarted node, `waitroom-edge stats`) only touch
        // it through atomics, which is the contract of `RoomCounters`.
        unsafe { MmapMut::map_mut(&file) }
    }

    fn header_ok(map: &MmapMut) -> bool {
        &map[..8] == MAGIC
            && u32::from_le_bytes(map[8..12].try_into().unwrap_or_default())
                == COUNTERS_LAYOUT_VERSION
            && u32::from_le_bytes(map[12..16].try_into().unwrap_or_default()) == SLOTS as u32
            && u64::from_le_bytes(map[16..24].try_into().unwrap_or_default())
                == RoomCounters::SIZE as u64
    }

    fn write_header(map: &mut MmapMut) {
        map[..HEADER].fill(0);
        map[8..12].copy_from_slice(&COUNTERS_LAYOUT_VERSION.to_le_bytes());
        map[12..16].copy_from_slice(&(SLOTS as u32).to_le_bytes());
        map[16..24].copy_from_slice(&(RoomCounters::SIZE as u64).to_le_bytes());
        // The magic last: a file cut short mid-write is recreated next time.
        map[..8].copy_from_slice(MAGIC);
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
}
