//! The ticket ledger: where each ticket's count sits now, so that a ticket
//! moves the node counters once, however often its cookie comes back.
//!
//! # Why
//! A ticket carries where it is counted (`counted_expiry`, `counted_waiting`)
//! so the next check-in can move that count in O(1). Trusted alone, that is
//! a hole: a cookie is a bearer token, and replaying one stale cookie forty
//! times would move its count forty times (an expired session uncounted
//! forty times makes room for forty more visitors). The ledger remembers, per
//! ticket id, what the ticket is counted at *now*; the engine
//! ([`crate::engine::decide`]) moves counts from what the ledger says, not
//! from what the cookie says.
//!
//! # The rule
//! - Every ticket gets a random non-zero 64-bit id when it is issued
//!   ([`Ticket::id`](crate::ticket::Ticket::id)).
//! - An entry is one `AtomicU64`: a 31-bit fingerprint of the id and what the
//!   ticket is counted at — nowhere, a session-expiry slot, or waiting in
//!   (bucket, check-in minute) — see [`Counted`].
//! - A count is moved only together with a successful compare-and-swap of
//!   the entry from the state it moves *from* to the state it moves *to*
//!   ([`TicketLedger::replace`]). Two requests with the same ticket, racing
//!   or one after the other, each move from the state the other left: the
//!   counts telescope and every ticket is counted once. A cookie whose claim
//!   is older than the ledger moves nothing that was already moved; a stale
//!   admitted cookie whose session has ended is then served as a new visitor
//!   (a new ticket), as a request without a cookie would be.
//! - A ticket the ledger does not know (issued on another node, issued
//!   before the ledger existed, or its entry was evicted) is **believed once**:
//!   its cookie's claim is taken as where it is counted, the move is made,
//!   and the entry is written. So, per node, a ticket's claim is believed at
//!   most once per lifetime of its entry. Across `n` nodes a replayed cookie
//!   moves counts at most `n` times (once per node), and once more per
//!   eviction of its entry.
//! - Two *first* sightings of one unknown ticket racing on two workers pick
//!   the same victim entry unless the bucket changes between their reads, so
//!   one of the two compare-and-swaps fails and the loser re-reads the entry
//!   the winner wrote; only if the bucket changed in that instant can both
//!   believe the claim (at most once per worker).
//!
//! # Placement and eviction
//! Entries live in buckets of [`WAYS`] (one cache line). The bucket and the
//! fingerprint come from a keyed hash of the id with a secret drawn at random
//! when the ledger file is made ([`TicketLedger::claim`]), so nobody can aim
//! tickets at one bucket to evict a chosen entry. (Ids are random and sealed
//! in the cookie anyway; the key is a second wall.) A new ticket takes an
//! empty way, else the way that stops mattering first: a session's expiry
//! (its minute), a waiting count's last minute in the waiting window, an
//! uncounted ticket's last minute. Evicting an entry never changes a count:
//! the counts it tracked age out of the counters as they always did. A fake
//! fingerprint match (another id in the same bucket with the same 31-bit
//! fingerprint, whose low bit is always set) has odds of about
//! `WAYS / 2^30` (7.5e-9) per lookup of an unknown id; it would move the
//! other ticket's count by one instead of believing this one's claim.
//!
//! Minutes are stored as their low 20 bits and read back as the minute
//! nearest now (±364 days); a bucket as its age at the check-in (11 bits,
//! buckets are never older than [`MAX_BUCKET_AGE_MINUTES`]); a session's
//! expiry slot (a second) in those 31 bits together, read back as the slot
//! nearest now (±34 years).
//!
//! # Connections per ticket
//! A shared cookie lets every holder in. The node checks every presented
//! ticket (admitted or waiting) before deciding. [`TicketLedger::note_connection`]
//! keeps, per ticket, the exact set of connections (by a fingerprint of the
//! node-unique connection id) seen in the last `window` seconds, in a
//! parallel table of rows of [`CONNECTION_SLOTS`] (two rows per set, keyed
//! placement as above, one row per [`ENTRIES_PER_CONNECTION_ROW`] entries:
//! rows are only held by tickets active within the window). A connection
//! beyond the budget is refused; the caller treats its request as a new
//! visitor. The set is exact within one worker thread; workers racing for
//! the last free place may each get it (at most one over per extra worker).
//! A row taken over by another ticket (both rows of the set held by tickets
//! with live connections) starts the evicted ticket's set afresh: it may then
//! let in up to the budget again. There is one row per
//! [`ENTRIES_PER_CONNECTION_ROW`] entries (65,536 rows with the default
//! 2^20 entries): the table holds that many tickets active within one window;
//! beyond it, takeovers weaken the bound as said.
//!
//! # Memory
//! `#[repr(transparent)]` over `[AtomicU64]`: a header of [`HEADER_WORDS`],
//! up to 7 words of padding (so every bucket is one cache line), the
//! entries, the connection rows. All zero is a valid, unclaimed ledger;
//! the edge maps it from a file so entries survive a restart like the counters.
//! [`TicketLedger::words_for`] gives the size: about 24 bytes per entry.

use core::sync::atomic::{AtomicU64, Ordering};

use crate::counters::{MAX_BUCKET_AGE_MINUTES, WAITING_WINDOW_MINUTES};
use crate::time::{ExpirySlot, Minute};
use crate::xdp::fmix64;

/// Changes whenever the layout changes; a file of another version is made anew.
///
/// 2: a session entry holds its expiry slot (a second), not its minute. The
/// edge sets a file of layout 1 aside with the counters file it described.
pub const LEDGER_LAYOUT_VERSION: u32 = 2;

/// Marks a claimed ledger ("WTL" + version).
const LAYOUT_MAGIC: u64 = 0x5754_4C00_0000_0000 | LEDGER_LAYOUT_VERSION as u64;

/// Words before the entries: magic, two key words, entry count, row count,
/// the padding that puts each bucket on a cache line of its own.
pub const HEADER_WORDS: usize = 8;

/// Words of room for that padding (a page-aligned mapping needs none).
const PAD_WORDS: usize = WAYS - 1;

/// Entries per bucket: 64 bytes, one cache line.
pub const WAYS: usize = 8;

/// Connection fingerprints a row holds; the largest budget a room may set.
pub const CONNECTION_SLOTS: usize = 31;

/// Words per connection row: the ticket's tag and the slots.
const ROW_WORDS: usize = CONNECTION_SLOTS + 1;

/// Rows per set of the connection table.
const ROW_WAYS: usize = 2;

/// Entries per connection row: only tickets seen within the window hold a
/// row, far fewer than tickets counted somewhere.
pub const ENTRIES_PER_CONNECTION_ROW: usize = 16;

/// Smallest and largest ledger the edge accepts (`node.ticket_ledger_entries`).
pub const MIN_ENTRIES: usize = 1_024;
pub const MAX_ENTRIES: usize = 1 << 26;

const FINGERPRINT_BITS: u32 = 31;
const MINUTE_BITS: u32 = 20;
const AGE_BITS: u32 = 11;
const MINUTE_MASK: u64 = (1 << MINUTE_BITS) - 1;
const AGE_MASK: u64 = (1 << AGE_BITS) - 1;
const SECOND_BITS: u32 = 24;
const SECOND_MASK: u64 = (1 << SECOND_BITS) - 1;
/// A session's expiry slot takes the minute and the age bits.
const SLOT_BITS: u32 = MINUTE_BITS + AGE_BITS;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

const _: () = assert!(FINGERPRINT_BITS + 2 + MINUTE_BITS + AGE_BITS == 64);
const _: () = assert!(MAX_BUCKET_AGE_MINUTES < AGE_MASK);

/// Where a ticket is counted, as the ledger (or a cookie) says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    /// Nowhere: its session ended, or it was never counted.
    Nowhere,
    /// An admitted session, counted at its expiry slot.
    Session { expiry: ExpirySlot },
    /// Queued, counted in `bucket` at check-in minute `check_in`.
    Waiting { bucket: Minute, check_in: Minute },
}

impl Counted {
    /// The minute after which the entry stops mattering (for eviction).
    fn useful_until(self, touched: Minute) -> Minute {
        match self {
            Self::Nowhere => touched,
            Self::Session { expiry } => expiry.minute(),
            Self::Waiting { check_in, .. } => check_in.plus(WAITING_WINDOW_MINUTES),
        }
    }
}

/// What [`TicketLedger::look`] found for one id: the entry it has or would
/// take, the word read there, and what that says if it is this ticket's.
#[derive(Clone, Copy, Debug)]
pub struct Seen {
    index: usize,
    fingerprint: u64,
    raw: u64,
    /// `None`: the ledger does not know the ticket (believe its cookie once).
    pub known: Option<Counted>,
}

/// Why a word region cannot be used as a ledger.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger region of {words} words is too short for its header")]
    TooShort { words: usize },
    #[error("ledger region holds layout {found:#x}, expected {expected:#x} (recreate the file)")]
    LayoutMismatch { found: u64, expected: u64 },
    #[error("ledger region of {words} words does not hold {entries} entries ({expected} words)")]
    SizeMismatch {
        words: usize,
        entries: usize,
        expected: usize,
    },
}

/// The ledger: see the module docs.
#[repr(transparent)]
#[derive(Debug)]
pub struct TicketLedger([AtomicU64]);

impl TicketLedger {
    /// Entries rounded to whole buckets (at least one).
    #[must_use]
    pub fn round_entries(entries: usize) -> usize {
        entries.max(WAYS).div_ceil(WAYS) * WAYS
    }

    fn rows_for(entries: usize) -> usize {
        (entries / ENTRIES_PER_CONNECTION_ROW)
            .max(ROW_WAYS)
            .div_ceil(ROW_WAYS)
            * ROW_WAYS
    }

    /// Words a ledger of `entries` (rounded, see [`Self::round_entries`]) takes.
    #[must_use]
    pub fn words_for(entries: usize) -> usize {
        let entries = Self::round_entries(entries);
        HEADER_WORDS + PAD_WORDS + entries + Self::rows_for(entries) * ROW_WORDS
    }

    /// Bytes a ledger of `entries` takes.
    #[must_use]
    pub fn bytes_for(entries: usize) -> usize {
        Self::words_for(entries) * 8
    }

    /// A claimed ledger on the heap (for the simulator, benches and tests).
    #[must_use]
    pub fn new_boxed(entries: usize, key: [u64; 2]) -> Box<Self> {
        let words: Box<[AtomicU64]> = (0..Self::words_for(entries))
            .map(|_| AtomicU64::new(0))
            .collect();
        // SAFETY: `TicketLedger` is `repr(transparent)` over `[AtomicU64]`, so
        // the fat pointer's layout and metadata (the length) are the same.
        let ledger = unsafe { Box::from_raw(Box::into_raw(words) as *mut Self) };
        ledger.claim(entries, key);
        ledger
    }

    /// A ledger that remembers nothing: every ticket is unknown, so every
    /// cookie's claim is believed, as before the ledger existed. For
    /// measuring what the ledger costs, and for tests written before it.
    #[must_use]
    pub fn forgetful() -> Box<Self> {
        let ledger = Self::new_boxed(0, [0, 0]);
        ledger.0[3].store(0, Ordering::Relaxed);
        ledger
    }

    /// Views words (e.g. a shared-memory mapping) as a ledger, claimed or not.
    pub fn from_words(words: &[AtomicU64]) -> Result<&Self, LedgerError> {
        if words.len() < HEADER_WORDS {
            return Err(LedgerError::TooShort { words: words.len() });
        }
        // SAFETY: as in `new_boxed`: same layout, same metadata.
        Ok(unsafe { &*(core::ptr::from_ref(words) as *const Self) })
    }

    /// Views bytes as words, then as a ledger (see [`Self::from_words`]).
    /// The region must be 8-aligned and a multiple of 8 bytes long.
    pub fn from_bytes_mut(bytes: &mut [u8]) -> Result<&Self, LedgerError> {
        if !(bytes.as_ptr() as usize).is_multiple_of(8) || !bytes.len().is_multiple_of(8) {
            return Err(LedgerError::TooShort { words: 0 });
        }
        // SAFETY: aligned and sized for `len / 8` `AtomicU64`s (checked above);
        // every bit pattern is a valid `AtomicU64`; the exclusive borrow of
        // `bytes` is held for the returned lifetime, so nothing reads the
        // memory non-atomically meanwhile.
        let words = unsafe {
            core::slice::from_raw_parts(bytes.as_mut_ptr().cast::<AtomicU64>(), bytes.len() / 8)
        };
        Self::from_words(words)
    }

    /// Claims an all-zero ledger for `entries` with a secret placement `key`
    /// (random, drawn by the caller), or checks one claimed before (a
    /// restart): then its own key stays.
    pub fn claim(&self, entries: usize, key: [u64; 2]) {
        let entries = Self::round_entries(entries);
        if self.0[0].load(Ordering::Acquire) == LAYOUT_MAGIC {
            return;
        }
        self.0[1].store(key[0], Ordering::Relaxed);
        self.0[2].store(key[1], Ordering::Relaxed);
        self.0[3].store(entries as u64, Ordering::Relaxed);
        self.0[4].store(Self::rows_for(entries) as u64, Ordering::Relaxed);
        // Buckets start on a cache line: one miss per lookup, not two.
        let first = core::ptr::from_ref(&self.0[HEADER_WORDS]) as usize;
        let pad = (64 - first % 64) % 64 / 8;
        self.0[5].store(pad as u64, Ordering::Relaxed);
        self.0[0].store(LAYOUT_MAGIC, Ordering::Release);
    }

    /// Checks a claimed ledger's layout and size against its region.
    pub fn check(&self) -> Result<(), LedgerError> {
        let found = self.0[0].load(Ordering::Acquire);
        if found != LAYOUT_MAGIC {
            return Err(LedgerError::LayoutMismatch {
                found,
                expected: LAYOUT_MAGIC,
            });
        }
        let entries = self.entries();
        let expected = Self::words_for(entries);
        if expected != self.0.len() || self.rows() != Self::rows_for(entries) {
            return Err(LedgerError::SizeMismatch {
                words: self.0.len(),
                entries,
                expected,
            });
        }
        Ok(())
    }

    /// Entries (whole buckets).
    #[must_use]
    pub fn entries(&self) -> usize {
        self.0[3].load(Ordering::Relaxed) as usize
    }

    fn rows(&self) -> usize {
        self.0[4].load(Ordering::Relaxed) as usize
    }

    fn key(&self) -> (u64, u64) {
        (
            self.0[1].load(Ordering::Relaxed),
            self.0[2].load(Ordering::Relaxed),
        )
    }

    /// Keyed hash of `x`: two rounds of a 64-bit finaliser around the secret.
    /// Not a cryptographic PRF; enough that placement cannot be chosen by a
    /// client who sees neither the key nor the ids (module docs).
    fn keyed(&self, x: u64, round: u64) -> u64 {
        let (k0, k1) = self.key();
        fmix64(fmix64(x ^ k0 ^ round.wrapping_mul(0x9e37_79b9_7f4a_7c15)) ^ k1)
    }

    /// Where the entries start (after the header and the padding).
    fn base(&self) -> usize {
        HEADER_WORDS + (self.0[5].load(Ordering::Relaxed) as usize).min(PAD_WORDS)
    }

    fn entry(&self, index: usize) -> &AtomicU64 {
        &self.0[self.base() + index]
    }

    fn row_word(&self, row: usize, word: usize) -> &AtomicU64 {
        &self.0[self.base() + self.entries() + row * ROW_WORDS + word]
    }

    // ---- entries ----

    /// Finds `id`'s entry, or the entry it would take: an empty way, else the
    /// way that stops mattering first (module docs).
    #[must_use]
    pub fn look(&self, id: u64, now: Minute) -> Seen {
        let buckets = self.entries() / WAYS;
        let hash = self.keyed(id, 0);
        let fingerprint = (hash & ((1 << FINGERPRINT_BITS) - 1)) | 1;
        if buckets == 0 {
            return Seen {
                index: usize::MAX,
                fingerprint,
                raw: 0,
                known: None,
            };
        }
        let first = fast_range(hash, buckets) * WAYS;
        let mut victim: Option<(usize, u64, Minute)> = None;
        for index in first..first + WAYS {
            let raw = self.entry(index).load(Ordering::Acquire);
            if raw == 0 {
                if victim.is_none_or(|(_, old, _)| old != 0) {
                    victim = Some((index, 0, Minute(0)));
                }
                continue;
            }
            if raw >> (64 - FINGERPRINT_BITS) == fingerprint {
                return Seen {
                    index,
                    fingerprint,
                    raw,
                    known: Some(decode(raw, now).0),
                };
            }
            let (counted, touched) = decode(raw, now);
            let until = counted.useful_until(touched);
            match victim {
                Some((_, 0, _)) => {}
                Some((_, _, best)) if best <= until => {}
                _ => victim = Some((index, raw, until)),
            }
        }
        let (index, raw, _) = victim.unwrap_or((first, 0, Minute(0)));
        Seen {
            index,
            fingerprint,
            raw,
            known: None,
        }
    }

    /// Writes `to` for the ticket `seen` is about, if the entry still holds
    /// what `seen` read. On success the caller moves the counts from
    /// `seen.known` (or its cookie's claim, if unknown) to `to`; on failure
    /// `seen` is refreshed with what the entry holds now and nothing may move.
    pub fn replace(&self, seen: &mut Seen, to: Counted, now: Minute) -> bool {
        if seen.index == usize::MAX {
            // A forgetful ledger: the move is made, nothing remembered.
            return true;
        }
        let new = encode(seen.fingerprint, to, now);
        match self.entry(seen.index).compare_exchange(
            seen.raw,
            new,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                seen.raw = new;
                seen.known = Some(to);
                true
            }
            Err(current) => {
                if current >> (64 - FINGERPRINT_BITS) == seen.fingerprint {
                    seen.raw = current;
                    seen.known = Some(decode(current, now).0);
                } else {
                    // Another ticket took the way; look again (it may have
                    // been this ticket's first sighting on another worker).
                    let id_seen = self.look_fingerprint(seen, now);
                    *seen = id_seen;
                }
                false
            }
        }
    }

    /// `look` again for the ticket behind `seen` (its bucket is `seen.index`'s).
    fn look_fingerprint(&self, seen: &Seen, now: Minute) -> Seen {
        let first = seen.index - seen.index % WAYS;
        let mut victim = None;
        for index in first..first + WAYS {
            let raw = self.entry(index).load(Ordering::Acquire);
            if raw != 0 && raw >> (64 - FINGERPRINT_BITS) == seen.fingerprint {
                return Seen {
                    index,
                    fingerprint: seen.fingerprint,
                    raw,
                    known: Some(decode(raw, now).0),
                };
            }
            if raw == 0 && victim.is_none() {
                victim = Some((index, raw));
            }
        }
        let (index, raw) =
            victim.unwrap_or_else(|| (seen.index, self.entry(seen.index).load(Ordering::Acquire)));
        Seen {
            index,
            fingerprint: seen.fingerprint,
            raw,
            known: None,
        }
    }

    // ---- connections per ticket ----

    /// Notes that ticket `id` came on `connection` at `now_secs`, and says
    /// whether that connection is within the ticket's budget: one of at most
    /// `budget` distinct connections seen in the last `window_secs`. A budget
    /// of 0 turns the check off. See the module docs for the bounds.
    pub fn note_connection(
        &self,
        id: u64,
        connection: u64,
        now_secs: u64,
        budget: u16,
        window_secs: u16,
    ) -> bool {
        let rows = self.rows();
        if budget == 0 || rows < ROW_WAYS || self.entries() == 0 {
            return true;
        }
        let budget = usize::from(budget).min(CONNECTION_SLOTS);
        let tag = ((self.keyed(id, 1) >> SECOND_BITS) | 1) << SECOND_BITS;
        let fingerprint = (self.keyed(connection, 2) & ((1 << (64 - SECOND_BITS)) - 1)) | 1;
        let now = now_secs & SECOND_MASK;
        let stamp = (fingerprint << SECOND_BITS) | now;
        let live = |word: u64| {
            word != 0
                && (now.wrapping_sub(word & SECOND_MASK) & SECOND_MASK) < u64::from(window_secs)
        };
        let set = fast_range(self.keyed(id, 3), rows / ROW_WAYS) * ROW_WAYS;
        let Some((row, taken)) = self.connection_row(set, tag, now, &live) else {
            return true;
        };
        if taken {
            // A row just taken holds nothing live: the first slot is ours.
            let word = self.row_word(row, 1).load(Ordering::Acquire);
            if !live(word)
                && self
                    .row_word(row, 1)
                    .compare_exchange(word, stamp, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                return true;
            }
        }
        for _ in 0..16 {
            let mut others = 0;
            let mut mine = None;
            let mut free = None;
            for slot in 1..ROW_WORDS {
                let word = self.row_word(row, slot).load(Ordering::Acquire);
                if word >> SECOND_BITS == fingerprint {
                    if live(word) {
                        // The common case, and early: a browser's own connection.
                        self.row_word(row, slot).store(stamp, Ordering::Release);
                        self.stamp_row(row, tag, now);
                        return true;
                    }
                    mine = Some((slot, word));
                } else if live(word) {
                    others += 1;
                } else if free.is_none() {
                    free = Some((slot, word));
                }
            }
            let target = match mine {
                // Seen before, but not within the window: it competes anew.
                Some(found) => found,
                None => match free {
                    Some(found) => found,
                    None => return false,
                },
            };
            if others >= budget {
                return false;
            }
            let (slot, word) = target;
            if self
                .row_word(row, slot)
                .compare_exchange(word, stamp, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.stamp_row(row, tag, now);
                return true;
            }
        }
        // Contention on one ticket's row that long: let this one through.
        true
    }

    /// The row of the set holding `tag`, or one taken over for it (then
    /// `true`): a row never used, else one with no live connection, else
    /// the one whose newest connection is oldest. `None` only under heavy
    /// contention.
    ///
    /// A row's first word holds its ticket's tag over the second of its
    /// newest connection ([`Self::stamp_row`]), so choosing a row reads one
    /// word per row, and only a row taken from a ticket with live
    /// connections is cleared: the slots of a row without any are all out
    /// of the window already, free to the new ticket as they are.
    fn connection_row(
        &self,
        set: usize,
        tag: u64,
        now: u64,
        live: &dyn Fn(u64) -> bool,
    ) -> Option<(usize, bool)> {
        for _ in 0..4 {
            let mut victim: Option<(usize, u64, u64)> = None;
            for row in set..set + ROW_WAYS {
                let held = self.row_word(row, 0).load(Ordering::Acquire);
                if held & !SECOND_MASK == tag {
                    return Some((row, false));
                }
                let newest = if live(held) {
                    1 + (held & SECOND_MASK)
                } else {
                    0
                };
                if victim.is_none_or(|(_, _, best)| newest < best) {
                    victim = Some((row, held, newest));
                }
            }
            let (row, held, newest) = victim?;
            if self
                .row_word(row, 0)
                .compare_exchange(held, tag | now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                if newest != 0 {
                    for slot in 1..ROW_WORDS {
                        self.row_word(row, slot).store(0, Ordering::Release);
                    }
                }
                return Some((row, true));
            }
        }
        None
    }

    /// Moves the second of `row`'s newest connection on to `now`, if the row
    /// is still `tag`'s and its second is older. Lost to a racing update
    /// (another connection of the ticket, or a takeover), it is left: a
    /// second too old at worst, which only makes the row look a second
    /// quieter when one of its set needs a row.
    fn stamp_row(&self, row: usize, tag: u64, now: u64) {
        let word = self.row_word(row, 0);
        let held = word.load(Ordering::Acquire);
        let ahead = now.wrapping_sub(held & SECOND_MASK) & SECOND_MASK;
        if held & !SECOND_MASK == tag && ahead != 0 && ahead < 1 << (SECOND_BITS - 1) {
            let _ = word.compare_exchange(held, tag | now, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
}

/// Maps a hash uniformly onto `0..n` without a division (Lemire).
fn fast_range(hash: u64, n: usize) -> usize {
    ((u128::from(hash) * n as u128) >> 64) as usize
}

/// A fresh ticket id from a random `u64`: never 0 (0 means "no id").
#[must_use]
pub fn ticket_id(rng: u64) -> u64 {
    // A bijection, so the id is as random as `rng`, but not equal to it (the
    // caller may use `rng` for other things too).
    match fmix64(rng ^ 0x5851_f42d_4c95_7f2d) {
        0 => 1,
        id => id,
    }
}

fn encode(fingerprint: u64, counted: Counted, now: Minute) -> u64 {
    let (kind, low) = match counted {
        Counted::Nowhere => (1, (now.0 & MINUTE_MASK) << AGE_BITS),
        Counted::Session { expiry } => (2, expiry.0 & SLOT_MASK),
        Counted::Waiting { bucket, check_in } => (
            3,
            ((check_in.0 & MINUTE_MASK) << AGE_BITS)
                | check_in.0.saturating_sub(bucket.0).min(AGE_MASK),
        ),
    };
    (fingerprint << (64 - FINGERPRINT_BITS)) | (kind << SLOT_BITS) | low
}

/// The value with the low `bits` of `low` nearest to `now`.
fn nearest(low: u64, now: u64, bits: u32) -> u64 {
    let mask = (1 << bits) - 1;
    let delta = low.wrapping_sub(now & mask) & mask;
    if delta < 1 << (bits - 1) {
        now.wrapping_add(delta)
    } else {
        now.wrapping_sub((1 << bits) - delta)
    }
}

/// What an entry says, and the minute it was written for.
fn decode(raw: u64, now: Minute) -> (Counted, Minute) {
    let kind = (raw >> SLOT_BITS) & 0b11;
    if kind == 2 {
        let now_slot = now.start().expiry_slot();
        let expiry = ExpirySlot(nearest(raw & SLOT_MASK, now_slot.0, SLOT_BITS));
        return (Counted::Session { expiry }, expiry.minute());
    }
    let minute = Minute(nearest((raw >> AGE_BITS) & MINUTE_MASK, now.0, MINUTE_BITS));
    let counted = match kind {
        3 => Counted::Waiting {
            bucket: minute.minus(raw & AGE_MASK),
            check_in: minute,
        },
        _ => Counted::Nowhere,
    };
    (counted, minute)
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: Minute = Minute(29_000_123);

    /// The expiry slot `secs` seconds into minute `M`.
    fn slot(minutes: u64, secs: u64) -> ExpirySlot {
        M.plus(minutes).start().plus_secs(secs).expiry_slot()
    }
    const KEY: [u64; 2] = [0x1234, 0x5678];

    #[test]
    fn entries_round_trip_and_minutes_read_back_near_now() {
        for counted in [
            Counted::Nowhere,
            Counted::Session {
                expiry: slot(1_440, 59),
            },
            Counted::Waiting {
                bucket: M.minus(MAX_BUCKET_AGE_MINUTES),
                check_in: M,
            },
            Counted::Session {
                expiry: slot(0, 0).minus(3 * 60 + 7),
            },
            Counted::Session {
                expiry: slot(0, 17),
            },
        ] {
            let raw = encode(0x7fff_ffff, counted, M);
            assert_eq!(decode(raw, M).0, counted);
            assert_eq!(decode(raw, M.plus(2)).0, counted, "read a little later");
        }
    }

    #[test]
    fn a_ticket_is_unknown_until_written_then_known() {
        let ledger = TicketLedger::new_boxed(1_024, KEY);
        ledger.check().unwrap();
        let mut seen = ledger.look(42, M);
        assert_eq!(seen.known, None);
        let to = Counted::Session {
            expiry: slot(5, 17),
        };
        assert!(ledger.replace(&mut seen, to, M));
        assert_eq!(ledger.look(42, M).known, Some(to));
        assert_eq!(ledger.look(43, M).known, None);
        // A stale `Seen` fails and is refreshed with the entry's state.
        let mut stale = Seen {
            raw: 1,
            ..ledger.look(42, M)
        };
        assert!(!ledger.replace(&mut stale, Counted::Nowhere, M));
        assert_eq!(stale.known, Some(to));
    }

    #[test]
    fn a_full_bucket_evicts_what_stops_mattering_first() {
        let ledger = TicketLedger::new_boxed(WAYS, KEY);
        // One bucket: the first eight ids fill it.
        for id in 1..=WAYS as u64 {
            let mut seen = ledger.look(id, M);
            let to = if id == 5 {
                Counted::Nowhere
            } else {
                Counted::Session {
                    expiry: slot(id + 10, id),
                }
            };
            assert!(ledger.replace(&mut seen, to, M));
        }
        let mut seen = ledger.look(100, M.plus(1));
        assert_eq!(seen.known, None);
        assert!(ledger.replace(&mut seen, Counted::Nowhere, M.plus(1)));
        assert_eq!(ledger.look(5, M.plus(1)).known, None, "the ended one went");
        assert!(ledger.look(6, M.plus(1)).known.is_some());
    }

    #[test]
    fn a_zeroed_region_is_unclaimed_and_a_claim_keeps_its_key() {
        let words: Vec<AtomicU64> = (0..TicketLedger::words_for(1_024))
            .map(|_| AtomicU64::new(0))
            .collect();
        let ledger = TicketLedger::from_words(&words).unwrap();
        assert!(matches!(
            ledger.check(),
            Err(LedgerError::LayoutMismatch { found: 0, .. })
        ));
        ledger.claim(1_024, KEY);
        ledger.check().unwrap();
        ledger.claim(1_024, [9, 9]);
        assert_eq!(
            ledger.key(),
            (KEY[0], KEY[1]),
            "a second claim keeps the key"
        );
        let short = TicketLedger::from_words(&words[..words.len() - 8]).unwrap();
        assert!(matches!(
            short.check(),
            Err(LedgerError::SizeMismatch { .. })
        ));
    }

    #[test]
    fn a_ticket_takes_at_most_its_budget_of_connections_per_window() {
        let ledger = TicketLedger::new_boxed(1_024, KEY);
        let t = 1_000_000;
        let admitted = (0..300)
            .filter(|&c| ledger.note_connection(7, c, t, 16, 10))
            .count();
        assert_eq!(admitted, 16);
        assert!(
            ledger.note_connection(7, 3, t + 1, 16, 10),
            "a known one stays in"
        );
        assert!(!ledger.note_connection(7, 200, t + 1, 16, 10));
        assert!(
            ledger.note_connection(8, 200, t + 1, 16, 10),
            "another ticket has its own budget"
        );
        // Once the window has passed, new connections get their turn.
        assert!(ledger.note_connection(7, 200, t + 12, 16, 10));
        assert!(ledger.note_connection(7, 201, t + 12, 0, 10), "0: off");
    }

    /// Tickets of one set of rows: a quiet row is taken as it is (its
    /// slots are out of the window, none counts against the new ticket),
    /// a row with live connections only when both are, the one whose
    /// newest connection is oldest, and cleared.
    #[test]
    fn connection_rows_go_to_the_ticket_whose_newest_connection_is_oldest() {
        let ledger = TicketLedger::new_boxed(1_024, KEY);
        let sets = ledger.rows() / ROW_WAYS;
        let set_of = |id: u64| fast_range(ledger.keyed(id, 3), sets);
        let ids: Vec<u64> = (1..100_000_u64)
            .filter(|&id| set_of(id) == set_of(1))
            .take(5)
            .collect();
        let [a, b, c, d, e] = ids[..] else {
            panic!("{ids:?}")
        };
        let t = 5_000_000;
        let fill = |id: u64, conns: std::ops::Range<u64>, at: u64| {
            conns
                .filter(|&conn| ledger.note_connection(id, conn, at, 16, 10))
                .count()
        };
        assert_eq!(fill(a, 0..20, t), 16);
        assert_eq!(fill(b, 100..120, t), 16);
        // B's own connection again later: its row is the newer one.
        assert!(ledger.note_connection(b, 100, t + 5, 16, 10));
        // C needs a row while both are live: A's goes (newest at t), cleared.
        assert_eq!(fill(c, 200..220, t + 6), 16, "a full budget of its own");
        assert_eq!(fill(b, 300..301, t + 6), 0, "B's row untouched: still full");
        assert!(ledger.note_connection(b, 101, t + 6, 16, 10));
        // A lost its row: it starts afresh (the documented weakness).
        assert_eq!(fill(a, 400..420, t + 7), 16);
        // Long after, everything is quiet: D takes a row as it is, and the
        // old, dead slots do not count against it.
        assert_eq!(fill(d, 500..520, t + 30), 16);
        assert_eq!(fill(e, 600..620, t + 30), 16);
        assert!(
            ledger.note_connection(d, 500, t + 31, 16, 10),
            "D kept its row"
        );
        assert!(!ledger.note_connection(d, 700, t + 31, 16, 10));
    }

    #[test]
    fn ticket_ids_are_never_zero_and_differ() {
        assert_ne!(ticket_id(0), 0);
        assert_ne!(ticket_id(1), ticket_id(2));
    }
}
