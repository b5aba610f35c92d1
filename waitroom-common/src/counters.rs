//! Node counters: the seeds' data-center counter, as atomics in shared memory.
//!
//! One [`RoomCounters`] per room holds everything a node counts for it. It is
//! `#[repr(C)]`, made only of `AtomicU64`s, has no pointers and is valid when
//! all zero, so the edge can place an array of them in an mmap'ed file under
//! `/dev/shm` (they survive a restart of the process) and the simulator can
//! simply [`RoomCounters::new_boxed`] them.
//!
//! Every slot is a *tagged count*: one `AtomicU64` holding the minute (or, in
//! the expiry ring, the second) it counts for (low 32 bits) and a signed
//! 32-bit count. A write for a newer tag replaces an older one, so rings
//! never need a sweeper, and a compare-and-swap loop keeps tag and count
//! consistent.
//!
//! What is counted:
//! - **session expiries** per [`ExpirySlot`] (one second), signed: a
//!   check-in of an admitted visitor moves one count from the old expiry slot
//!   to the new one, on whichever node it lands, so the sum across nodes is
//!   exact even though one node's entry may be negative. Active users at
//!   instant t = sum of the entries for slots ≥ `t.expiry_slot()` (a slot
//!   counts while its end is after t).
//! - **admits per minute per [`Pool`]**: the ticket counter of seed 000.
//!   [`RoomCounters::take_ticket`] is a compare-and-increment against a cap,
//!   exact within the node under any concurrency.
//! - **waiting visitors per (bucket, check-in minute)**: a queued visitor's
//!   check-in moves them to the current minute, so visitors who stop checking
//!   in stop counting after [`WAITING_WINDOW_MINUTES`].
//! - **distinct visitors per minute**, the userspace fallback for the per-colo
//!   traffic signal when XDP is not there.

use core::mem::{align_of, size_of};
use core::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::room::RoomId;
use crate::time::{EXPIRY_SLOTS_PER_MINUTE, ExpirySlot, Minute, UnixMillis};

/// Changes whenever the layout of [`RoomCounters`] changes; a shared-memory
/// file with another version must be recreated, not reused.
///
/// 2: session expiries per second ([`ExpirySlot`]) instead of per minute,
/// and the furthest expiry counted. The edge sets a file of layout 1 aside
/// (`PATH.old`) and starts a fresh one; the tickets of format 2 that pointed
/// into it are then believed counted nowhere (see [`crate::ticket`]).
pub const COUNTERS_LAYOUT_VERSION: u32 = 2;

/// Marks a claimed [`RoomCounters`] ("WRC" + version), so an all-zero slot is
/// recognisably free.
const LAYOUT_MAGIC: u64 = 0x5752_4300_0000_0000 | COUNTERS_LAYOUT_VERSION as u64;

/// Expiry slots (seconds) the ring holds. Expiries lie in
/// `now ..= now + MAX_SESSION_MINUTES` (plus a minute for a ticket of format
/// 2, counted to the end of its minute), so a day and ten minutes never wraps
/// onto a live slot. See [`crate::time::EXPIRY_SLOT_MILLIS`] for the grain.
pub const EXPIRY_RING: usize = (crate::room::MAX_SESSION_MINUTES as usize + 10) * 60;

/// Expiries further than this many slots from now are reported per minute
/// (at the last slot of their minute, so they count no shorter): the
/// aggregator needs the second only for the expiries it will see pass before
/// the node's next report, so a report holds at most 120 entries per slot
/// plus one per further minute (about 125 for 5-minute sessions, 1,560 for
/// day-long ones, instead of 300 and 86,400), and the aggregator's sums over
/// all reports stay short. Two minutes is far beyond a report's age when it
/// is used (interval plus delay, seconds; answers go stale after 10 s). Only
/// a departed node's report is used longer: its far sessions then count to
/// the end of their minute, as every session did before slots.
pub const REPORT_FINE_SLOTS: u64 = 2 * EXPIRY_SLOTS_PER_MINUTE;

/// Buckets the waiting table holds, by arrival minute modulo this.
pub const WAITING_BUCKETS: usize = 2_048;

/// Oldest bucket kept, in minutes before now. Older tickets are moved up to
/// this age (they stay first in line) so two live buckets never share a row.
pub const MAX_BUCKET_AGE_MINUTES: u64 = 2_000;

/// Check-in minutes kept per bucket (a ring: the current, the window, one spare).
const CHECK_IN_SLOTS: usize = 4;

/// Minutes a queued visitor stays counted after their last check-in: the
/// current minute and the two before it. Refresh intervals stay below two
/// minutes (see [`crate::room::MAX_REFRESH_SECS`]) so a visitor who keeps
/// checking in is always inside the window.
pub const WAITING_WINDOW_MINUTES: u64 = 3;

/// Minutes of admit and distinct-visitor counts kept (now and three before).
pub const RECENT_MINUTES: usize = 4;

const POOLS: usize = 4;

/// Where an admission's slot came from. Each pool has its own per-minute
/// ticket counter and its own cap in the global state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pool {
    /// A slot reserved for a bucket fully covered by eligible slots
    /// (admitted from any node, seed 002).
    Eligible,
    /// This node's share of the slots split by traffic two minutes back: the
    /// partly covered bucket in FIFO, new visitors otherwise.
    ColoShare,
    /// The Anywhere pool: slots no colo has a history for, leased to nodes.
    Anywhere,
    /// No cap applied (passthrough); counted for the admit rate only.
    Uncapped,
}

impl Pool {
    pub const ALL: [Pool; POOLS] = [
        Pool::Eligible,
        Pool::ColoShare,
        Pool::Anywhere,
        Pool::Uncapped,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// A number per [`Pool`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolCounts {
    pub eligible: u64,
    pub colo_share: u64,
    pub anywhere: u64,
    pub uncapped: u64,
}

impl PoolCounts {
    #[must_use]
    pub fn get(&self, pool: Pool) -> u64 {
        match pool {
            Pool::Eligible => self.eligible,
            Pool::ColoShare => self.colo_share,
            Pool::Anywhere => self.anywhere,
            Pool::Uncapped => self.uncapped,
        }
    }

    pub fn set(&mut self, pool: Pool, value: u64) {
        match pool {
            Pool::Eligible => self.eligible = value,
            Pool::ColoShare => self.colo_share = value,
            Pool::Anywhere => self.anywhere = value,
            Pool::Uncapped => self.uncapped = value,
        }
    }

    /// Sum over all pools.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.eligible
            .saturating_add(self.colo_share)
            .saturating_add(self.anywhere)
            .saturating_add(self.uncapped)
    }

    /// Pool-wise sum.
    #[must_use]
    pub fn plus(&self, other: &Self) -> Self {
        Self {
            eligible: self.eligible.saturating_add(other.eligible),
            colo_share: self.colo_share.saturating_add(other.colo_share),
            anywhere: self.anywhere.saturating_add(other.anywhere),
            uncapped: self.uncapped.saturating_add(other.uncapped),
        }
    }
}

/// Why a byte region cannot be used as counters.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CountersError {
    #[error("counters region at {address:#x} is not aligned to {align} bytes")]
    Misaligned { address: usize, align: usize },
    #[error("counters region of {len} bytes is not a multiple of {size} bytes (one RoomCounters)")]
    BadLength { len: usize, size: usize },
    #[error("counters slot holds layout {found:#x}, expected {expected:#x} (recreate the file)")]
    LayoutMismatch { found: u64, expected: u64 },
    #[error("counters slot belongs to room {found:?}, not {expected:?}")]
    RoomMismatch { found: RoomId, expected: RoomId },
}

/// Low 32 bits of a minute: the tag of a slot. Compared with wrapping
/// arithmetic, which is right for any two minutes less than 4,000 years apart.
fn tag_of(minute: Minute) -> u32 {
    minute.0 as u32
}

/// Low 32 bits of an expiry slot (a unix second): right for any two slots
/// less than 68 years apart.
fn slot_tag(slot: ExpirySlot) -> u32 {
    slot.0 as u32
}

/// One `AtomicU64` holding `(tag: u32, count: i32)`.
#[repr(transparent)]
#[derive(Debug)]
struct TaggedCount(AtomicU64);

impl TaggedCount {
    const fn zero() -> Self {
        Self(AtomicU64::new(0))
    }

    fn pack(tag: u32, count: i32) -> u64 {
        (u64::from(tag) << 32) | u64::from(count as u32)
    }

    fn unpack(raw: u64) -> (u32, i32) {
        ((raw >> 32) as u32, raw as u32 as i32)
    }

    /// The count for `tag`, or 0 when the slot holds another minute.
    fn get(&self, tag: u32) -> i32 {
        let (stored, count) = Self::unpack(self.0.load(Ordering::Relaxed));
        if stored == tag { count } else { 0 }
    }

    /// Adds `delta` to the count for `tag`. A slot holding an older minute is
    /// taken over (its count has aged out); a slot already holding a newer
    /// minute is left alone (the minute being corrected has aged out).
    fn add(&self, tag: u32, delta: i32) {
        // Relaxed is enough: these are counts, nothing else is published through them,
        // and the CAS makes every update exact.
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |raw| {
                let (stored, count) = Self::unpack(raw);
                match stored.wrapping_sub(tag) as i32 {
                    0 => Some(Self::pack(tag, count.wrapping_add(delta))),
                    newer if newer > 0 => None,
                    _ => Some(Self::pack(tag, delta)),
                }
            });
    }

    /// The ticket counter: takes one if the count for `tag` is below `cap`.
    fn take_below(&self, tag: u32, cap: u64) -> bool {
        let cap = i64::try_from(cap).unwrap_or(i64::MAX);
        self.0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |raw| {
                let (stored, count) = Self::unpack(raw);
                let current = match stored.wrapping_sub(tag) as i32 {
                    0 => count,
                    // A worker whose clock is a minute behind another's: no ticket.
                    newer if newer > 0 => return None,
                    _ => 0,
                };
                (i64::from(current) < cap && current < i32::MAX)
                    .then(|| Self::pack(tag, current + 1))
            })
            .is_ok()
    }

    fn clear(&self) {
        self.0.store(0, Ordering::Relaxed);
    }
}

/// Everything one node counts for one room. See the module docs.
///
/// Size: [`RoomCounters::SIZE`] bytes (761,728), aligned to 64. Place
/// `n` of them in a file of `n * SIZE` bytes and view it with
/// [`RoomCounters::from_bytes_mut`]; an all-zero region is a valid, free set.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct RoomCounters {
    /// `LAYOUT_MAGIC` once claimed for a room, 0 while free.
    layout: AtomicU64,
    /// The [`RoomId`] this slot counts for.
    room: AtomicU64,
    /// Admits per minute per pool: `[minute % RECENT_MINUTES][pool]`.
    admits: [TaggedCount; RECENT_MINUTES * POOLS],
    /// Distinct visitors per minute: `[minute % RECENT_MINUTES]`.
    distinct: [TaggedCount; RECENT_MINUTES],
    /// The furthest expiry slot ever counted (raw [`ExpirySlot`]): reads scan
    /// the ring from now to here only, so their cost follows the session
    /// length, not the ring's.
    furthest_expiry: AtomicU64,
    /// New visitors held right now for an on-demand lease, tagged with the
    /// minute their hold began (see [`RoomCounters::hold_visitor`]). Was
    /// padding, so a counters file of an older node reads as none held.
    held: TaggedCount,
    /// Signed session-expiry counts: `[expiry slot % EXPIRY_RING]`.
    expiries: [TaggedCount; EXPIRY_RING],
    /// Waiting visitors: `[bucket % WAITING_BUCKETS][check-in minute % CHECK_IN_SLOTS]`,
    /// tagged with the check-in minute.
    waiting: [TaggedCount; WAITING_BUCKETS * CHECK_IN_SLOTS],
}

const _: () = assert!(size_of::<RoomCounters>() == RoomCounters::SIZE);
const _: () = assert!(
    EXPIRY_RING as u64 > (crate::room::MAX_SESSION_MINUTES as u64 + 2) * EXPIRY_SLOTS_PER_MINUTE
);
const _: () = assert!((MAX_BUCKET_AGE_MINUTES as usize) < WAITING_BUCKETS);
const _: () = assert!(CHECK_IN_SLOTS as u64 > WAITING_WINDOW_MINUTES);

/// A visitor counted as held ([`RoomCounters::hold_visitor`]) until dropped,
/// also when the request's future is (the visitor left mid-hold). A hold
/// that crosses a minute ends nothing of the new minute's count: the minute
/// it began in has aged out.
#[derive(Debug)]
pub struct HeldVisitor<'a> {
    counters: &'a RoomCounters,
    minute: Minute,
}

impl Drop for HeldVisitor<'_> {
    fn drop(&mut self) {
        self.counters.end_held(self.minute);
    }
}

impl Default for RoomCounters {
    fn default() -> Self {
        Self::new()
    }
}

impl RoomCounters {
    /// Bytes of one `RoomCounters`; a shared-memory file holds a multiple of it.
    pub const SIZE: usize = 8
        * (2 + RECENT_MINUTES * POOLS
            + RECENT_MINUTES
            + 2
            + EXPIRY_RING
            + WAITING_BUCKETS * CHECK_IN_SLOTS);

    /// Alignment required of each `RoomCounters` in shared memory.
    pub const ALIGN: usize = align_of::<Self>();

    /// Free, all-zero counters.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            layout: AtomicU64::new(0),
            room: AtomicU64::new(0),
            admits: [const { TaggedCount::zero() }; RECENT_MINUTES * POOLS],
            distinct: [const { TaggedCount::zero() }; RECENT_MINUTES],
            furthest_expiry: AtomicU64::new(0),
            held: TaggedCount::zero(),
            expiries: [const { TaggedCount::zero() }; EXPIRY_RING],
            waiting: [const { TaggedCount::zero() }; WAITING_BUCKETS * CHECK_IN_SLOTS],
        }
    }

    /// Counters on the heap, claimed for `room` (for the simulator and tests;
    /// 744 KiB is too much for threads' stacks).
    #[must_use]
    pub fn new_boxed(room: RoomId) -> Box<Self> {
        let zeroed = Box::<Self>::new_zeroed();
        // SAFETY: `RoomCounters` is `#[repr(C)]` and made only of `AtomicU64`s,
        // for which the all-zero bit pattern is a valid value (it is `new()`).
        let counters = unsafe { zeroed.assume_init() };
        counters.layout.store(LAYOUT_MAGIC, Ordering::Relaxed);
        counters.room.store(room.0, Ordering::Relaxed);
        counters
    }

    /// Views a shared-memory region (e.g. an `MmapMut` of a file under
    /// `/dev/shm`) as an array of counters.
    ///
    /// The region must be aligned to [`Self::ALIGN`] (a page-aligned mapping
    /// is) and a multiple of [`Self::SIZE`] long. Other processes may share the
    /// same file: all access goes through atomics.
    pub fn from_bytes_mut(bytes: &mut [u8]) -> Result<&[Self], CountersError> {
        let address = bytes.as_ptr() as usize;
        if !address.is_multiple_of(Self::ALIGN) {
            return Err(CountersError::Misaligned {
                address,
                align: Self::ALIGN,
            });
        }
        if !bytes.len().is_multiple_of(Self::SIZE) {
            return Err(CountersError::BadLength {
                len: bytes.len(),
                size: Self::SIZE,
            });
        }
        let len = bytes.len() / Self::SIZE;
        // SAFETY: the pointer is aligned for `RoomCounters` and the region holds
        // exactly `len` of them (checked above). Every bit pattern is a valid
        // `RoomCounters` (only `AtomicU64`s, no padding, no pointers). The
        // exclusive borrow of `bytes` is held for the returned lifetime, so no
        // other Rust reference reads the memory non-atomically meanwhile.
        Ok(unsafe { core::slice::from_raw_parts(bytes.as_mut_ptr().cast::<Self>(), len) })
    }

    /// Claims a free slot for `room`, or checks that a slot which survived a
    /// restart is the right layout and room.
    pub fn claim(&self, room: RoomId) -> Result<(), CountersError> {
        match self
            .layout
            .compare_exchange(0, LAYOUT_MAGIC, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                self.room.store(room.0, Ordering::Release);
                Ok(())
            }
            Err(LAYOUT_MAGIC) => {
                let found = RoomId(self.room.load(Ordering::Acquire));
                if found == room {
                    Ok(())
                } else {
                    Err(CountersError::RoomMismatch {
                        found,
                        expected: room,
                    })
                }
            }
            Err(found) => Err(CountersError::LayoutMismatch {
                found,
                expected: LAYOUT_MAGIC,
            }),
        }
    }

    /// The room this slot was claimed for, if any.
    #[must_use]
    pub fn room(&self) -> Option<RoomId> {
        (self.layout.load(Ordering::Acquire) == LAYOUT_MAGIC)
            .then(|| RoomId(self.room.load(Ordering::Acquire)))
    }

    /// Zeroes every count and frees the slot (not safe against concurrent
    /// deciders: call it only for a room no worker serves).
    pub fn reset(&self) {
        for slot in self
            .admits
            .iter()
            .chain(&self.distinct)
            .chain(&self.expiries)
            .chain(&self.waiting)
        {
            slot.clear();
        }
        self.furthest_expiry.store(0, Ordering::Relaxed);
        self.room.store(0, Ordering::Relaxed);
        self.layout.store(0, Ordering::Release);
    }

    // ---- admits: the ticket counter ----

    fn admit_slot(&self, pool: Pool, minute: Minute) -> &TaggedCount {
        &self.admits[(minute.0 as usize % RECENT_MINUTES) * POOLS + pool.index()]
    }

    /// Hands out one slot of `pool` for `minute` if fewer than `cap` were
    /// handed out on this node this minute. Exact under concurrency: the
    /// check and the increment are one compare-and-swap.
    pub fn take_ticket(&self, pool: Pool, minute: Minute, cap: u64) -> bool {
        self.admit_slot(pool, minute)
            .take_below(tag_of(minute), cap)
    }

    /// Counts an admission that no cap limits (passthrough).
    pub fn count_admit(&self, pool: Pool, minute: Minute) {
        self.admit_slot(pool, minute).add(tag_of(minute), 1);
    }

    /// Admits handed out on this node in `minute`, per pool (zero once the
    /// minute has left the ring).
    #[must_use]
    pub fn admits(&self, minute: Minute) -> PoolCounts {
        let mut counts = PoolCounts::default();
        for pool in Pool::ALL {
            let n = self.admit_slot(pool, minute).get(tag_of(minute));
            counts.set(pool, u64::try_from(n).unwrap_or(0));
        }
        counts
    }

    // ---- distinct visitors ----

    /// Counts a visitor seen for the first time in `minute`.
    pub fn note_visitor(&self, minute: Minute) {
        self.distinct[minute.0 as usize % RECENT_MINUTES].add(tag_of(minute), 1);
    }

    /// Counts a new visitor held, before the engine decides (and notes) it,
    /// while the node asks the aggregator for a slot on demand; the count
    /// ends when the guard drops. A report adds the visitors held to the
    /// current minute's distinct visitors ([`Self::report`]): the
    /// aggregator promises an asking node what its visitors since its last
    /// report call for, and a node idle for minutes (at 1,200 nodes, most
    /// of them) asks *because* of a visitor it has not noted yet; without
    /// it that ask reads as no need and is promised nothing.
    #[must_use = "the visitor counts as held until the guard drops"]
    pub fn hold_visitor(&self, minute: Minute) -> HeldVisitor<'_> {
        self.note_held(minute);
        HeldVisitor {
            counters: self,
            minute,
        }
    }

    /// [`Self::hold_visitor`] without the guard, for a caller that keeps its
    /// held visitors itself (the simulator): pair every call with
    /// [`Self::end_held`] for the same minute.
    pub fn note_held(&self, minute: Minute) {
        self.held.add(tag_of(minute), 1);
    }

    /// Ends the hold of a visitor counted by [`Self::note_held`] in `minute`.
    pub fn end_held(&self, minute: Minute) {
        self.held.add(tag_of(minute), -1);
    }

    /// New visitors held in `minute` for an on-demand lease, now.
    #[must_use]
    pub fn held_visitors(&self, minute: Minute) -> u64 {
        u64::try_from(self.held.get(tag_of(minute))).unwrap_or(0)
    }

    /// Distinct visitors counted in `minute` (zero once it left the ring).
    #[must_use]
    pub fn distinct_visitors(&self, minute: Minute) -> u64 {
        u64::try_from(self.distinct[minute.0 as usize % RECENT_MINUTES].get(tag_of(minute)))
            .unwrap_or(0)
    }

    // ---- sessions ----

    fn expiry_slot(&self, slot: ExpirySlot) -> &TaggedCount {
        &self.expiries[slot.0 as usize % EXPIRY_RING]
    }

    /// Adds `delta` sessions at `slot`, after noting it as the furthest
    /// expiry if it is (so a read that sees the count scans that far).
    fn add_expiry(&self, slot: ExpirySlot, delta: i32) {
        self.furthest_expiry.fetch_max(slot.0, Ordering::Release);
        self.expiry_slot(slot).add(slot_tag(slot), delta);
    }

    /// Counts a new session ending in slot `expiry`.
    pub fn start_session(&self, expiry: ExpirySlot) {
        self.add_expiry(expiry, 1);
    }

    /// Moves a renewed session from its old expiry slot to its new one.
    pub fn move_session(&self, from: ExpirySlot, to: ExpirySlot) {
        if from != to {
            self.add_expiry(from, -1);
            self.add_expiry(to, 1);
        }
    }

    /// Uncounts a session that ended early (its slot has not passed yet).
    pub fn end_session(&self, expiry: ExpirySlot) {
        self.add_expiry(expiry, -1);
    }

    /// Non-zero session-expiry counts for slots `now` and later, earliest
    /// first: the slots between now and the furthest expiry counted.
    pub fn expiries(&self, now: ExpirySlot) -> impl Iterator<Item = (ExpirySlot, i64)> + '_ {
        let furthest = self.furthest_expiry.load(Ordering::Acquire);
        let span = if furthest < now.0 {
            0
        } else {
            (furthest - now.0).saturating_add(1).min(EXPIRY_RING as u64)
        };
        (0..span).filter_map(move |ahead| {
            let slot = now.plus(ahead);
            let count = self.expiry_slot(slot).get(slot_tag(slot));
            (count != 0).then_some((slot, i64::from(count)))
        })
    }

    /// [`Self::expiries`] as reported: per slot up to [`REPORT_FINE_SLOTS`]
    /// ahead, beyond that summed per minute at the minute's last slot.
    /// Earliest first; the sum is the same.
    pub fn expiries_to_report(
        &self,
        now: ExpirySlot,
    ) -> impl Iterator<Item = (ExpirySlot, i64)> + '_ {
        let fine_until = now.plus(REPORT_FINE_SLOTS);
        let mut pending: Option<(ExpirySlot, i64)> = None;
        let mut source = self.expiries(now).map(move |(slot, n)| {
            if slot < fine_until {
                (slot, n)
            } else {
                (ExpirySlot::end_of_minute(slot.minute()), n)
            }
        });
        core::iter::from_fn(move || {
            loop {
                match (source.next(), pending) {
                    (None, _) => return pending.take(),
                    (Some(next), None) => pending = Some(next),
                    (Some((slot, n)), Some((at, sum))) if slot == at => {
                        pending = Some((at, sum.saturating_add(n)));
                    }
                    (Some(next), Some(done)) => {
                        pending = Some(next);
                        if done.1 != 0 {
                            return Some(done);
                        }
                    }
                }
            }
        })
        .filter(|&(_, n)| n != 0)
    }

    /// This minute's admits and the active sessions, as one consistent pair.
    ///
    /// The engine counts a session before it takes the admit ticket, so reading
    /// the admits, then the sessions, then the admits again — and retrying while
    /// the two admit readings differ — can count an admission in flight as
    /// active without its admit, never its admit without the session. The slots
    /// computed from the pair may then be one too few for a moment, never one
    /// too many.
    #[must_use]
    pub fn admits_and_active(&self, now: UnixMillis) -> (PoolCounts, i64) {
        let (minute, slot) = (now.minute(), now.expiry_slot());
        let mut before = self.admits(minute);
        for _ in 0..8 {
            let active = self.active_users(slot);
            let after = self.admits(minute);
            if after == before {
                return (after, active);
            }
            before = after;
        }
        // Admissions kept racing the reads: count the latest admits as active too.
        let active = self.active_users(slot);
        let after = self.admits(minute);
        let raced = after.total().saturating_sub(before.total());
        (
            after,
            active.saturating_add(i64::try_from(raced).unwrap_or(i64::MAX)),
        )
    }

    /// Sessions this node counts as active in slot `now` (may be negative
    /// on one node; the sum over nodes is not).
    #[must_use]
    pub fn active_users(&self, now: ExpirySlot) -> i64 {
        self.expiries(now).map(|(_, count)| count).sum()
    }

    // ---- waiting ----

    fn waiting_slot(&self, bucket: Minute, check_in: Minute) -> &TaggedCount {
        let row = bucket.0 as usize % WAITING_BUCKETS;
        &self.waiting[row * CHECK_IN_SLOTS + check_in.0 as usize % CHECK_IN_SLOTS]
    }

    /// Moves a queued visitor of `bucket` from check-in minute `from` to `to`
    /// (either may be `None`: joining or leaving the queue). A `from` that has
    /// already left the window is not touched: it no longer counts.
    pub fn move_waiting(
        &self,
        bucket: Minute,
        from: Option<Minute>,
        to: Option<Minute>,
        now: Minute,
    ) {
        if from == to {
            return;
        }
        if let Some(from) = from
            && from.plus(WAITING_WINDOW_MINUTES) > now
        {
            self.waiting_slot(bucket, from).add(tag_of(from), -1);
        }
        if let Some(to) = to {
            self.waiting_slot(bucket, to).add(tag_of(to), 1);
        }
    }

    /// Visitors of `bucket` who checked in during the window ending at `now`.
    #[must_use]
    pub fn waiting(&self, bucket: Minute, now: Minute) -> i64 {
        (0..WAITING_WINDOW_MINUTES)
            .map(|back| {
                let check_in = now.minus(back);
                i64::from(self.waiting_slot(bucket, check_in).get(tag_of(check_in)))
            })
            .sum()
    }

    /// Visitors this node counts as waiting at minute `now`, all buckets
    /// (negative rows — visitors who moved here from another node — count 0).
    #[must_use]
    pub fn total_waiting(&self, now: Minute) -> i64 {
        self.waiting_buckets(now).map(|(_, n)| n.max(0)).sum()
    }

    /// Non-zero waiting counts per bucket at minute `now`, oldest bucket first.
    pub fn waiting_buckets(&self, now: Minute) -> impl Iterator<Item = (Minute, i64)> + '_ {
        // Row r holds the one bucket b ≡ r (mod WAITING_BUCKETS) in (now - WAITING_BUCKETS, now];
        // start at the row after now's, which is the oldest.
        let oldest = now.minus(WAITING_BUCKETS as u64 - 1);
        (0..WAITING_BUCKETS as u64).filter_map(move |offset| {
            let bucket = oldest.plus(offset);
            let waiting = self.waiting(bucket, now);
            (waiting != 0).then_some((bucket, waiting))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64 as StdAtomicU64;

    use super::*;

    const M: Minute = Minute(27_000_000);

    #[test]
    fn layout_is_fixed_and_zero_is_free() {
        assert_eq!(RoomCounters::SIZE, 761_728);
        assert_eq!(RoomCounters::ALIGN, 64);
        // Boxed: 744 KiB would not fit a test thread's stack.
        let counters = RoomCounters::new_boxed(RoomId(0));
        counters.reset();
        assert_eq!(counters.room(), None);
        counters.claim(RoomId(5)).unwrap();
        assert_eq!(counters.room(), Some(RoomId(5)));
        counters.claim(RoomId(5)).unwrap();
        assert_eq!(
            counters.claim(RoomId(6)),
            Err(CountersError::RoomMismatch {
                found: RoomId(5),
                expected: RoomId(6)
            })
        );
        counters.reset();
        assert_eq!(counters.room(), None);
    }

    #[test]
    fn from_bytes_checks_alignment_and_length() {
        // A Vec<u64> is only 8-aligned; over-allocate and find a 64-aligned start.
        let mut backing = vec![0u64; (RoomCounters::SIZE * 2 + 64) / 8];
        let bytes: &mut [u8] = bytemuck_free_bytes(&mut backing);
        let skip = bytes.as_ptr().align_offset(64);
        let region = &mut bytes[skip..skip + RoomCounters::SIZE * 2];
        let counters = RoomCounters::from_bytes_mut(region).unwrap();
        assert_eq!(counters.len(), 2);
        counters[1].claim(RoomId(1)).unwrap();
        assert!(counters[1].take_ticket(Pool::ColoShare, M, 1));
        assert_eq!(counters[1].admits(M).colo_share, 1);

        let short = &mut bytes[skip..skip + 100];
        assert!(matches!(
            RoomCounters::from_bytes_mut(short),
            Err(CountersError::BadLength { .. })
        ));
        let odd = &mut bytes[skip + 8..skip + 8 + RoomCounters::SIZE];
        assert!(matches!(
            RoomCounters::from_bytes_mut(odd),
            Err(CountersError::Misaligned { .. })
        ));
    }

    fn bytemuck_free_bytes(words: &mut [u64]) -> &mut [u8] {
        let len = size_of_val(words);
        // SAFETY: u8 has no alignment requirement and every byte of a u64 is initialised;
        // the returned borrow takes over the exclusive borrow of `words`.
        unsafe { core::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), len) }
    }

    #[test]
    fn ticket_counter_resets_with_the_minute() {
        let counters = RoomCounters::new_boxed(RoomId(1));
        assert!(counters.take_ticket(Pool::ColoShare, M, 2));
        assert!(counters.take_ticket(Pool::ColoShare, M, 2));
        assert!(!counters.take_ticket(Pool::ColoShare, M, 2));
        assert!(
            counters.take_ticket(Pool::Anywhere, M, 1),
            "pools are separate"
        );
        assert!(
            counters.take_ticket(Pool::ColoShare, M.plus(1), 2),
            "a new minute starts at zero"
        );
        assert_eq!(counters.admits(M.plus(1)).colo_share, 1);
        assert_eq!(
            counters.admits(M).colo_share,
            2,
            "the previous minute stays readable"
        );
        assert!(
            counters.take_ticket(Pool::ColoShare, M.plus(RECENT_MINUTES as u64), 5),
            "M's slot taken over"
        );
        assert!(
            !counters.take_ticket(Pool::ColoShare, M, 5),
            "a minute taken over is never reopened"
        );
        assert_eq!(counters.admits(M).colo_share, 0);
        assert_eq!(
            counters.admits(M.plus(RECENT_MINUTES as u64 + 1)),
            PoolCounts::default()
        );
    }

    /// Seed 000: worker1 gets seven new users and worker2 one; with 10 slots
    /// for the data center all eight are admitted (no per-worker split).
    #[test]
    fn seed_uneven_workers_all_eight_admitted_with_ten_slots() {
        let counters = Arc::new(RoomCounters::new_boxed(RoomId(1)));
        let admitted = Arc::new(StdAtomicU64::new(0));
        let workers: Vec<_> = [7, 1]
            .into_iter()
            .map(|users| {
                let (counters, admitted) = (Arc::clone(&counters), Arc::clone(&admitted));
                std::thread::spawn(move || {
                    for _ in 0..users {
                        if counters.take_ticket(Pool::ColoShare, M, 10) {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        workers.into_iter().for_each(|w| w.join().unwrap());
        assert_eq!(admitted.load(Ordering::Relaxed), 8);
    }

    /// Seed 000: fifteen users over two workers, ten slots: ten admitted, five queued.
    #[test]
    fn seed_fifteen_users_ten_slots_ten_admitted() {
        let counters = RoomCounters::new_boxed(RoomId(1));
        let admitted = std::thread::scope(|scope| {
            let workers: Vec<_> = [8, 7]
                .into_iter()
                .map(|users| {
                    let counters = &counters;
                    scope.spawn(move || {
                        (0..users)
                            .filter(|_| counters.take_ticket(Pool::ColoShare, M, 10))
                            .count()
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().unwrap())
                .sum::<usize>()
        });
        assert_eq!(admitted, 10);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

        /// Threads racing for tickets take exactly min(cap, attempts), never more.
        #[test]
        fn concurrent_ticket_taking_never_exceeds_the_cap(
            cap in 0..3_000_u64,
            threads in 2..6_usize,
            attempts in 1..800_usize,
        ) {
            let counters = RoomCounters::new_boxed(RoomId(1));
            let taken = std::thread::scope(|scope| {
                let workers: Vec<_> = (0..threads)
                    .map(|_| {
                        let counters = &counters;
                        scope.spawn(move || {
                            (0..attempts)
                                .filter(|_| counters.take_ticket(Pool::Eligible, M, cap))
                                .count() as u64
                        })
                    })
                    .collect();
                workers.into_iter().map(|w| w.join().unwrap()).sum::<u64>()
            });
            let expected = cap.min((threads * attempts) as u64);
            proptest::prop_assert_eq!(taken, expected);
            proptest::prop_assert_eq!(counters.admits(M).eligible, expected);
        }
    }

    /// An expiry slot in minute `M`.
    const S: ExpirySlot = ExpirySlot(M.0 * EXPIRY_SLOTS_PER_MINUTE);

    #[test]
    fn sessions_move_between_expiry_slots() {
        let counters = RoomCounters::new_boxed(RoomId(1));
        counters.start_session(S.plus(5));
        counters.start_session(S.plus(5));
        counters.start_session(S.plus(1));
        assert_eq!(counters.active_users(S), 3);
        counters.move_session(S.plus(5), S.plus(7));
        assert_eq!(
            counters.expiries(S).collect::<Vec<_>>(),
            vec![(S.plus(1), 1), (S.plus(5), 1), (S.plus(7), 1)]
        );
        assert_eq!(
            counters.active_users(S.plus(1)),
            3,
            "counted through the end of the expiry slot"
        );
        assert_eq!(counters.active_users(S.plus(2)), 2);
        assert_eq!(counters.active_users(S.plus(8)), 0);
    }

    /// The minute grain counted a session to the end of its expiry minute: up
    /// to 59 s after it ended. A slot stops counting the second after.
    #[test]
    fn a_session_that_ended_seconds_ago_no_longer_counts() {
        let counters = RoomCounters::new_boxed(RoomId(1));
        let end = M.start().plus_secs(12).plus_millis(400);
        counters.start_session(end.expiry_slot());
        assert_eq!(counters.active_users(end.minus_secs(1).expiry_slot()), 1);
        assert_eq!(
            counters.active_users(end.expiry_slot()),
            1,
            "until its slot ends"
        );
        let (_, active) = counters.admits_and_active(end.plus_secs(3));
        assert_eq!(active, 0, "3 s after the end, same minute");
        assert_eq!(counters.expiries(end.plus_secs(1).expiry_slot()).count(), 0);
    }

    #[test]
    fn reads_scan_only_up_to_the_furthest_expiry() {
        let counters = RoomCounters::new_boxed(RoomId(1));
        assert_eq!(
            counters.active_users(S),
            0,
            "nothing counted: nothing scanned"
        );
        let day = crate::room::MAX_SESSION_MINUTES as u64 * EXPIRY_SLOTS_PER_MINUTE;
        counters.start_session(S.plus(day));
        counters.start_session(S.plus(3));
        assert_eq!(
            counters.expiries(S).collect::<Vec<_>>(),
            vec![(S.plus(3), 1), (S.plus(day), 1)]
        );
        // A renewal counted on another node first (-1 at a slot this node never
        // counted at) is seen too.
        let other = RoomCounters::new_boxed(RoomId(1));
        other.move_session(S.plus(50), S.plus(40));
        assert_eq!(
            other.expiries(S).collect::<Vec<_>>(),
            vec![(S.plus(40), 1), (S.plus(50), -1)]
        );
        counters.reset();
        counters.claim(RoomId(1)).unwrap();
        assert_eq!(counters.expiries(S).count(), 0);
    }

    #[test]
    fn far_expiries_are_reported_per_minute_with_the_same_sum() {
        let counters = RoomCounters::new_boxed(RoomId(1));
        let far = S.plus(REPORT_FINE_SLOTS + 120);
        for slot in [
            S.plus(2),
            S.plus(2),
            S.plus(REPORT_FINE_SLOTS - 1),
            far,
            far.plus(7),
            far.plus(80),
        ] {
            counters.start_session(slot);
        }
        counters.end_session(far.plus(30));
        let reported: Vec<_> = counters.expiries_to_report(S).collect();
        let minute_end = |slot: ExpirySlot| ExpirySlot::end_of_minute(slot.minute());
        let mut expected = vec![(S.plus(2), 2), (S.plus(REPORT_FINE_SLOTS - 1), 1)];
        // far and far + 7 share a minute; far + 30 may too (its -1 then cancels one).
        let mut tail: std::collections::BTreeMap<ExpirySlot, i64> = Default::default();
        for (slot, n) in [
            (far, 1),
            (far.plus(7), 1),
            (far.plus(30), -1),
            (far.plus(80), 1),
        ] {
            *tail.entry(minute_end(slot)).or_default() += n;
        }
        expected.extend(tail.into_iter().filter(|&(_, n)| n != 0));
        assert_eq!(reported, expected);
        assert!(
            reported.windows(2).all(|w| w[0].0 < w[1].0),
            "earliest first"
        );
        assert_eq!(
            reported.iter().map(|(_, n)| n).sum::<i64>(),
            counters.active_users(S)
        );
        assert!(reported.iter().all(|&(slot, _)| slot >= S));
    }

    #[test]
    fn a_session_renewed_on_another_node_sums_correctly() {
        let (a, b) = (
            RoomCounters::new_boxed(RoomId(1)),
            RoomCounters::new_boxed(RoomId(1)),
        );
        a.start_session(S.plus(5));
        b.move_session(S.plus(5), S.plus(6));
        assert_eq!(b.active_users(S), 0, "-1 at slot 5, +1 at slot 6");
        assert_eq!(a.active_users(S) + b.active_users(S), 1);
        assert_eq!(a.active_users(S.plus(6)) + b.active_users(S.plus(6)), 1);
    }

    #[test]
    fn abandoned_waiters_stop_counting_after_the_window() {
        let counters = RoomCounters::new_boxed(RoomId(1));
        let bucket = M;
        counters.move_waiting(bucket, None, Some(M), M);
        counters.move_waiting(bucket, None, Some(M), M);
        // One keeps checking in every minute, the other walks away.
        for minute in 1..6 {
            let now = M.plus(minute);
            counters.move_waiting(bucket, Some(now.minus(1)), Some(now), now);
            let expected = if minute < WAITING_WINDOW_MINUTES {
                2
            } else {
                1
            };
            assert_eq!(counters.waiting(bucket, now), expected, "minute {minute}");
        }
        assert_eq!(
            counters.waiting_buckets(M.plus(5)).collect::<Vec<_>>(),
            vec![(bucket, 1)]
        );
        // Leaving the queue (admitted) uncounts at once.
        counters.move_waiting(bucket, Some(M.plus(5)), None, M.plus(5));
        assert_eq!(counters.waiting(bucket, M.plus(5)), 0);
    }

    #[test]
    fn waiting_buckets_come_out_oldest_first() {
        let counters = RoomCounters::new_boxed(RoomId(1));
        let now = M.plus(10_000);
        for (age, n) in [(0, 3), (MAX_BUCKET_AGE_MINUTES, 1), (7, 2)] {
            for _ in 0..n {
                counters.move_waiting(now.minus(age), None, Some(now), now);
            }
        }
        let buckets: Vec<_> = counters.waiting_buckets(now).collect();
        assert_eq!(
            buckets,
            vec![
                (now.minus(MAX_BUCKET_AGE_MINUTES), 1),
                (now.minus(7), 2),
                (now, 3)
            ]
        );
    }

    #[test]
    fn distinct_visitors_per_minute() {
        let counters = RoomCounters::new_boxed(RoomId(1));
        counters.note_visitor(M);
        counters.note_visitor(M);
        counters.note_visitor(M.plus(1));
        assert_eq!(counters.distinct_visitors(M), 2);
        assert_eq!(counters.distinct_visitors(M.plus(1)), 1);
        assert_eq!(counters.distinct_visitors(M.plus(2)), 0);
    }

    #[test]
    fn a_held_visitor_is_reported_as_this_minutes_visitor_until_its_hold_ends() {
        let counters = RoomCounters::new_boxed(RoomId(1));
        let now = M.start().plus_millis(10_000);
        let distinct = |c: &RoomCounters, at: UnixMillis| {
            c.report(at)
                .distinct_visitors
                .iter()
                .find(|&&(m, _)| m == at.minute())
                .map_or(0, |&(_, n)| n)
        };
        counters.note_visitor(M);
        {
            let _a = counters.hold_visitor(M);
            let _b = counters.hold_visitor(M);
            assert_eq!(counters.held_visitors(M), 2);
            assert_eq!(distinct(&counters, now), 3, "one noted, two held");
        }
        // Both holds ended (the guards dropped, as when a visitor leaves
        // mid-hold); the engine notes whoever it decides.
        assert_eq!(counters.held_visitors(M), 0);
        assert_eq!(distinct(&counters, now), 1);

        // A hold across a minute boundary: it counts in the minute it began
        // in only, and its end leaves the next minute's holds alone.
        let old = counters.hold_visitor(M);
        let _new = counters.hold_visitor(M.plus(1));
        assert_eq!(counters.held_visitors(M), 0, "the older minute aged out");
        drop(old);
        assert_eq!(counters.held_visitors(M.plus(1)), 1);
        assert_eq!(distinct(&counters, now.plus_millis(60_000)), 1);
    }
}
