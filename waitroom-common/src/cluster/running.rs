//! Running sums over the nodes' latest reports, so that a merge costs the
//! reporting node's entries and not every node's (issue 15, item 4).
//!
//! Each node's report is *added* when it arrives and *taken away* (the same
//! entries, subtracted) before its next report replaces it; a room's sums are
//! then always the sums of the reports the cluster holds, which is what
//! [`aggregate`](crate::aggregate::aggregate) recomputes from scratch. Sums
//! are exact, not saturating: every reported count is bounded by
//! [`MAX_COUNT`](crate::plausible::MAX_COUNT) = 2³² before it takes part,
//! so no sum of fewer than 2³¹ entries can reach an `i64` bound, and
//! subtracting what was added gives back exactly what was there (which
//! saturation would not).
//!
//! What depends on the minute of the query (admits of this minute, traffic
//! two minutes back, traffic this minute, leases of this minute) is read
//! from keyed sums at query time or kept in a [`Live`] view of one minute,
//! rebuilt when the minute changes; sessions ending from this second on are
//! read from the keyed sums of expiry slots.
//!
//! The rounding of the reference merge is reproduced exactly, not
//! approximated: the Anywhere pool is what the colos' floors leave
//! (`Σ ⌊⌊S·w_c/W⌋·r_i/R_c⌋` over every node, `w_c` the colo's traffic two
//! minutes back, `r_i` a node's recent traffic, `R_c` its colo's) and each node's lease has its
//! own floor plus one more for the heaviest (`⌊A·w_i/W⌋`, the rest to the
//! first in order). [`FloorSums`] keeps such sums of floors as the fraction
//! moves, visiting only the items whose floor changes.
use std::{
    cmp::{Ordering, Reverse},
    collections::BTreeMap,
};

use crate::{
    aggregate::{MinuteAdmits, RoomReport},
    cluster::Lease,
    counters::PoolCounts,
    slots::share_of,
    time::{ExpirySlot, Minute},
};

/// Signed counts summed over nodes by an ordered key: session expiries
/// (by minute today, by a finer slot later: any `Ord` key will do) and
/// queue buckets. A key whose sum comes back to zero is dropped. A sorted
/// list, not a tree: a room holds a few hundred keys at most (one per
/// second of the next five minutes, then per minute), which a binary search
/// over contiguous memory finds faster than a `BTreeMap` walks its nodes,
/// and a key coming or going moves a few kilobytes.
#[derive(Clone, Debug)]
pub(crate) struct KeyedSums<K> {
    sums: Vec<(K, i64)>,
}

impl<K> Default for KeyedSums<K> {
    fn default() -> Self {
        Self { sums: Vec::new() }
    }
}

impl<K: Ord + Copy> KeyedSums<K> {
    /// Adds `n` at `key` (`sign` = 1) or takes it away (`sign` = −1).
    pub(crate) fn add(&mut self, key: K, n: i64, sign: i64) {
        let n = n.wrapping_mul(sign);
        match self.sums.binary_search_by(|(k, _)| k.cmp(&key)) {
            Ok(at) => {
                let sum = self.sums[at].1.wrapping_add(n);
                if sum == 0 {
                    self.sums.remove(at);
                } else {
                    self.sums[at].1 = sum;
                }
            }
            Err(at) => {
                if n != 0 {
                    self.sums.insert(at, (key, n));
                }
            }
        }
    }

    /// Takes away `old` and adds `new`, as [`KeyedSums::add`] over each
    /// entry would (the same sums, the same keys dropped), but when both
    /// lists are in strictly increasing key order (as nodes send them) in
    /// one walk over the sums, applying only what differs per key.
    pub(crate) fn replace(&mut self, old: &[(K, i64)], new: &[(K, i64)]) {
        let increasing = |list: &[(K, i64)]| list.windows(2).all(|w| w[0].0 < w[1].0);
        if !increasing(old) || !increasing(new) {
            for &(k, n) in old {
                self.add(k, n, -1);
            }
            for &(k, n) in new {
                self.add(k, n, 1);
            }
            return;
        }
        let (mut a, mut b, mut at) = (0, 0, 0);
        loop {
            let (key, delta) = match (old.get(a), new.get(b)) {
                (Some(&(ko, no)), Some(&(kn, nn))) => match ko.cmp(&kn) {
                    Ordering::Less => {
                        a += 1;
                        (ko, no.wrapping_neg())
                    }
                    Ordering::Greater => {
                        b += 1;
                        (kn, nn)
                    }
                    Ordering::Equal => {
                        a += 1;
                        b += 1;
                        (ko, nn.wrapping_sub(no))
                    }
                },
                (Some(&(ko, no)), None) => {
                    a += 1;
                    (ko, no.wrapping_neg())
                }
                (None, Some(&(kn, nn))) => {
                    b += 1;
                    (kn, nn)
                }
                (None, None) => break,
            };
            if delta == 0 {
                continue;
            }
            while at < self.sums.len() && self.sums[at].0 < key {
                at += 1;
            }
            if at < self.sums.len() && self.sums[at].0 == key {
                let sum = self.sums[at].1.wrapping_add(delta);
                if sum == 0 {
                    self.sums.remove(at);
                } else {
                    self.sums[at].1 = sum;
                }
            } else {
                self.sums.insert(at, (key, delta));
            }
        }
    }

    /// The sum of every key from `from` on.
    pub(crate) fn sum_from(&self, from: K) -> i64 {
        let at = self.sums.partition_point(|(k, _)| *k < from);
        self.sums[at..]
            .iter()
            .fold(0_i64, |t, &(_, n)| t.wrapping_add(n))
    }

    /// Keys whose sum is positive, in order.
    pub(crate) fn positive(&self) -> impl Iterator<Item = (K, u64)> + '_ {
        self.sums
            .iter()
            .filter_map(|&(k, n)| u64::try_from(n).ok().filter(|&n| n > 0).map(|n| (k, n)))
    }
}

/// Slots the ring of [`ExpirySums`] holds: a little over eight minutes,
/// past the five minutes a node reports second by second (then by minute).
const EXPIRY_RING: u64 = 512;

/// Session expiries summed over nodes by slot: the slots from `base` (the
/// second of the last query) over the next [`EXPIRY_RING`] in a ring indexed
/// by the slot itself, every other slot (one before `base` that a node's
/// report still names until its next report replaces it; a minute's slot
/// past the ring's reach) in [`KeyedSums`]. An entry in the ring costs an
/// addition, where a sorted list costs a search or a walk and moves memory
/// for a key coming or going; what a query asks (every session from a slot
/// on) is the ring's running total plus the few slots outside it. The sums
/// are those [`KeyedSums`] keeps of the same entries, for any order of
/// entries and queries (`expiry_sums_sum_like_keyed_sums`).
#[derive(Clone, Debug, Default)]
pub(crate) struct ExpirySums {
    /// The first slot of the ring (0 until the first query).
    base: u64,
    /// `EXPIRY_RING` sums, slot `s` at `s % EXPIRY_RING` for `base <= s <
    /// base + EXPIRY_RING`; empty until the first query.
    ring: Vec<i64>,
    /// The sum of the ring.
    ring_total: i64,
    /// Every slot outside the ring.
    outside: KeyedSums<ExpirySlot>,
}

impl ExpirySums {
    /// The first slot past the ring.
    fn end(&self) -> u64 {
        self.base.saturating_add(EXPIRY_RING)
    }

    /// Adds `n` at `slot` (`sign` = 1) or takes it away (`sign` = −1).
    pub(crate) fn add(&mut self, slot: ExpirySlot, n: i64, sign: i64) {
        // Before the first query there is no ring: nothing is in its reach.
        let reach = if self.ring.is_empty() {
            0..0
        } else {
            self.base..self.end()
        };
        let Self {
            ring,
            ring_total,
            outside,
            ..
        } = self;
        put(ring, ring_total, outside, reach, slot, n.wrapping_mul(sign));
    }

    /// Takes away `old` and adds `new`, as [`ExpirySums::add`] over each
    /// entry would. Each entry within the ring's reach is added in place;
    /// the entries before it and past it (a list's first and last ones, as
    /// nodes send slots in increasing order) are walked once each by the
    /// outside sums. Any order of entries gives the same sums, only slower.
    pub(crate) fn replace(&mut self, old: &[(ExpirySlot, i64)], new: &[(ExpirySlot, i64)]) {
        let (start, end) = (self.base, self.end());
        let split = |list: &[(ExpirySlot, i64)]| {
            let before = list.iter().take_while(|&&(s, _)| s.0 < start).count();
            let past = list[before..]
                .iter()
                .rev()
                .take_while(|&&(s, _)| s.0 >= end)
                .count();
            (before, list.len() - past)
        };
        let ((oa, ob), (na, nb)) = if self.ring.is_empty() {
            ((old.len(), old.len()), (new.len(), new.len()))
        } else {
            (split(old), split(new))
        };
        self.outside.replace(&old[..oa], &new[..na]);
        self.outside.replace(&old[ob..], &new[nb..]);
        let Self {
            ring,
            ring_total,
            outside,
            ..
        } = self;
        // One loop of locals (the ring's bounds, its total), not `add` per
        // entry: a write to the ring would have every field read again.
        let mut total = *ring_total;
        let (old, new) = (&old[oa..ob], &new[na..nb]);
        let increasing = |list: &[(ExpirySlot, i64)]| list.windows(2).all(|w| w[0].0 < w[1].0);
        if increasing(old) && increasing(new) {
            // In one walk by slot, a slot whose count did not change (most
            // of them, a second later) is left alone.
            let (mut a, mut b) = (0, 0);
            loop {
                let (slot, delta) = match (old.get(a), new.get(b)) {
                    (Some(&(so, no)), Some(&(sn, nn))) => match so.cmp(&sn) {
                        Ordering::Less => {
                            a += 1;
                            (so, no.wrapping_neg())
                        }
                        Ordering::Greater => {
                            b += 1;
                            (sn, nn)
                        }
                        Ordering::Equal => {
                            a += 1;
                            b += 1;
                            if no == nn {
                                continue;
                            }
                            (so, nn.wrapping_sub(no))
                        }
                    },
                    (Some(&(so, no)), None) => {
                        a += 1;
                        (so, no.wrapping_neg())
                    }
                    (None, Some(&(sn, nn))) => {
                        b += 1;
                        (sn, nn)
                    }
                    (None, None) => break,
                };
                put(ring, &mut total, outside, start..end, slot, delta);
            }
            *ring_total = total;
            return;
        }
        for (list, sign) in [(old, -1_i64), (new, 1)] {
            for &(slot, n) in list {
                // An entry out of order may fall outside the ring, though
                // between slots within it.
                put(
                    ring,
                    &mut total,
                    outside,
                    start..end,
                    slot,
                    n.wrapping_mul(sign),
                );
            }
        }
        *ring_total = total;
    }

    /// Moves the ring to start at `from`, forwards or back (a clock stepped
    /// back): slots it leaves behind go to the outside sums, slots it comes
    /// to reach come in from them, so the cost is the distance moved (a
    /// second at a time, as a rule), at most the ring's length.
    fn advance(&mut self, from: u64) {
        if self.ring.is_empty() {
            self.ring = vec![0; EXPIRY_RING as usize];
            self.base = from;
            self.pull_in();
            return;
        }
        if from == self.base {
            return;
        }
        let (start, end) = (self.base, self.end());
        let new_end = from.saturating_add(EXPIRY_RING);
        // The old ring's slots outside the new one: before `from`, past `new_end`.
        for leaving in [start..end.min(from), start.max(new_end)..end] {
            for slot in leaving {
                let at = (slot % EXPIRY_RING) as usize;
                let n = std::mem::take(&mut self.ring[at]);
                if n != 0 {
                    self.ring_total = self.ring_total.wrapping_sub(n);
                    self.outside.add(ExpirySlot(slot), n, 1);
                }
            }
        }
        self.base = from;
        self.pull_in();
    }

    /// Moves the outside sums' slots within the ring's reach into it.
    fn pull_in(&mut self) {
        let (start, end) = (self.base, self.end());
        let sums = &mut self.outside.sums;
        let a = sums.partition_point(|&(s, _)| s.0 < start);
        let b = sums.partition_point(|&(s, _)| s.0 < end);
        for (slot, n) in sums.drain(a..b) {
            let at = (slot.0 % EXPIRY_RING) as usize;
            self.ring[at] = self.ring[at].wrapping_add(n);
            self.ring_total = self.ring_total.wrapping_add(n);
        }
    }

    /// The sum of every slot from `from` on; the ring moves to start there.
    pub(crate) fn sum_from(&mut self, from: ExpirySlot) -> i64 {
        self.advance(from.0);
        // Every ring slot is at or after `base`, which is `from`.
        self.ring_total.wrapping_add(self.outside.sum_from(from))
    }
}

/// Adds `delta` at `slot`: in `ring` (and its `total`) when `slot` is
/// within `reach` (the ring's slots; an empty range while there is no
/// ring), else in `outside`.
fn put(
    ring: &mut [i64],
    total: &mut i64,
    outside: &mut KeyedSums<ExpirySlot>,
    reach: std::ops::Range<u64>,
    slot: ExpirySlot,
    delta: i64,
) {
    if reach.contains(&slot.0) {
        let at = (slot.0 % EXPIRY_RING) as usize;
        ring[at] = ring[at].wrapping_add(delta);
        *total = total.wrapping_add(delta);
    } else {
        outside.add(slot, delta, 1);
    }
}

/// Admits per minute, pool by pool, summed over nodes.
#[derive(Clone, Debug, Default)]
pub(crate) struct AdmitSums {
    sums: BTreeMap<Minute, [u64; 4]>,
}

impl AdmitSums {
    fn add(&mut self, minute: Minute, admits: PoolCounts, sign: i64) {
        let pools = [
            admits.eligible,
            admits.colo_share,
            admits.anywhere,
            admits.uncapped,
        ];
        let entry = self.sums.entry(minute).or_default();
        for (sum, n) in entry.iter_mut().zip(pools) {
            *sum = if sign > 0 {
                sum.wrapping_add(n)
            } else {
                sum.wrapping_sub(n)
            };
        }
        if *entry == [0; 4] {
            self.sums.remove(&minute);
        }
    }

    /// Takes away a node's `old` admits and adds its `new` ones, as `add`
    /// of each (the first entry of a minute) would; a minute whose admits
    /// did not change (every minute but this one, as a rule) is left alone.
    fn replace(&mut self, old: &[MinuteAdmits], new: &[MinuteAdmits]) {
        for (list, other, sign) in [(old, new, -1), (new, old, 1)] {
            for a in counted(list) {
                let same = other
                    .iter()
                    .find(|b| b.minute == a.minute)
                    .is_some_and(|b| b.admits == a.admits);
                if !same {
                    self.add(a.minute, a.admits, sign);
                }
            }
        }
    }

    /// Shared-pool (colo share and Anywhere) admits of `minute` over every node.
    pub(crate) fn shared_in(&self, minute: Minute) -> u64 {
        self.sums
            .get(&minute)
            .map_or(0, |p| p[1].wrapping_add(p[2]))
    }

    /// All pools' admits in `minute`, over every node.
    pub(crate) fn total_in(&self, minute: Minute) -> u64 {
        self.sums
            .get(&minute)
            .map_or(0, |p| p.iter().fold(0_u64, |t, &n| t.wrapping_add(n)))
    }
}

/// The entries of a report's admits that count: the first of each minute,
/// as [`admits_in`] reads them.
fn counted(admits: &[MinuteAdmits]) -> impl Iterator<Item = &MinuteAdmits> {
    admits
        .iter()
        .enumerate()
        .filter(|&(i, a)| admits[..i].iter().all(|b| b.minute != a.minute))
        .map(|(_, a)| a)
}

/// The first entry for `minute`, as the reference merge reads a report.
fn first_in<T: Copy>(entries: &[(Minute, T)], minute: Minute) -> Option<T> {
    entries.iter().find(|&&(m, _)| m == minute).map(|&(_, n)| n)
}

pub(crate) fn admits_in(report: &RoomReport, minute: Minute) -> PoolCounts {
    report
        .admits
        .iter()
        .find(|a| a.minute == minute)
        .map(|a| a.admits)
        .unwrap_or_default()
}

/// The fraction `num / den` (`den` > 0), unreduced: floors of it are
/// computed with [`share_of`], exactly as the reference merge computes them.
#[derive(Clone, Copy, Debug)]
struct Ratio {
    num: u64,
    den: u64,
}

/// How far a threshold's `f64` key may sit from the fraction it stands for,
/// relative, with room to spare: a `u64` to `f64` rounds by at most 2⁻⁵³,
/// and so does a division, so a key and `x` are each within 3·2⁻⁵³ of the
/// fractions they round. A heap is walked this much past `x`, and what it
/// finds is judged exactly.
const KEY_MARGIN: f64 = 1.0 / (1_u64 << 40) as f64;

/// `a / b` (`b` > 0) as an `f64`'s bits, which order as the fractions do
/// up to rounding (a positive `f64`'s bits grow with it).
fn key_of(a: u64, b: u64) -> u64 {
    (a as f64 / b as f64).to_bits()
}

/// Where an item's floor changes, in a [`QuadHeap`]: `key` the fraction
/// ((floor + 1) / weight upwards; floor / weight downwards, its bits
/// inverted so that the highest comes first), rounded to an `f64` (16 bytes
/// an entry: four children to a cache line). `version` tells whether the
/// item is still the one the entry was made for (entries are not taken out
/// of their heap when their item changes, only skipped when they come to
/// the top).
#[derive(Clone, Copy, Debug)]
struct Entry {
    key: u64,
    id: u32,
    version: u32,
}

/// A min-heap by key with four children to a node: half the levels of a
/// binary heap, so a push or a pop touches half as many cache lines of a
/// heap of every node's thresholds (10,000 nodes: 20,000 entries or more
/// in each of a room's two heaps), and a level costs a few `u64`
/// comparisons.
#[derive(Clone, Debug, Default)]
struct QuadHeap {
    entries: Vec<Entry>,
}

impl QuadHeap {
    fn len(&self) -> usize {
        self.entries.len()
    }

    fn peek(&self) -> Option<Entry> {
        self.entries.first().copied()
    }

    fn push(&mut self, entry: Entry) {
        let mut at = self.entries.len();
        self.entries.push(entry);
        while at > 0 {
            let parent = (at - 1) / 4;
            if self.entries[parent].key <= entry.key {
                break;
            }
            self.entries[at] = self.entries[parent];
            at = parent;
        }
        self.entries[at] = entry;
    }

    fn pop(&mut self) -> Option<Entry> {
        let last = self.entries.pop()?;
        let Some(&top) = self.entries.first() else {
            return Some(last);
        };
        self.sift_down(0, last);
        Some(top)
    }

    /// Puts `entry` at `at` or below, moving the lesser children up.
    fn sift_down(&mut self, mut at: usize, entry: Entry) {
        let entries = &mut self.entries[..];
        loop {
            let first = 4 * at + 1;
            // A full set of children (all but the last parent's) is a
            // slice of known length: no bounds checks in the search.
            let least = match entries.get(first..first + 4) {
                Some(children) => first + least_of(children),
                None => match entries.get(first..) {
                    Some(children) if !children.is_empty() => first + least_of(children),
                    _ => break,
                },
            };
            if entries[least].key >= entry.key {
                break;
            }
            entries[at] = entries[least];
            at = least;
        }
        entries[at] = entry;
    }

    /// A heap of `entries`, in any order.
    fn from_entries(entries: Vec<Entry>) -> Self {
        let mut heap = Self { entries };
        for at in (0..heap.entries.len().div_ceil(4)).rev() {
            let entry = heap.entries[at];
            heap.sift_down(at, entry);
        }
        heap
    }
}

/// Where the least key of `entries` (not empty) is.
fn least_of(entries: &[Entry]) -> usize {
    let mut least = 0;
    for (i, entry) in entries.iter().enumerate().skip(1) {
        if entry.key < entries[least].key {
            least = i;
        }
    }
    least
}

#[derive(Clone, Copy, Debug)]
struct FloorItem {
    weight: u64,
    floor: u64,
    value: u64,
}

/// An item's place, by id: the item if it is there, and how many times an
/// item was placed there (so older heap entries for the id are told apart).
#[derive(Clone, Copy, Debug, Default)]
struct Place {
    item: Option<FloorItem>,
    version: u32,
}

/// `Σ value_i(⌊x · weight_i⌋)` over items, kept while the fraction `x`
/// moves: each item's next floor change up and down sits in a heap (lowest
/// up, highest down on top), so moving `x` visits only the items whose
/// floor changes (a handful per merge: `x` moves with one node's report),
/// never all of them. The heaps order thresholds by `f64` keys; a move of
/// `x` takes out every entry whose key is within [`KEY_MARGIN`] of it and
/// computes the item's floor exactly, so a key's rounding can only make an
/// item be looked at for nothing (then its entry goes back), never missed.
/// Items are found by id in a flat list (ids are small and dense: colos and
/// nodes as the cluster numbers them); an item taken away or refloored
/// leaves its old heap entries behind, to be skipped when they reach the
/// top, and the heaps are rebuilt from the items once they hold more than
/// twice as many entries as needed.
#[derive(Clone, Debug)]
pub(crate) struct FloorSums {
    x: Ratio,
    places: Vec<Place>,
    /// Items present.
    len: usize,
    up: QuadHeap,
    down: QuadHeap,
    total: u64,
    /// Entries taken out of a heap for an item whose floor had not changed
    /// after all, put back when the move is done (kept to reuse its memory).
    unmoved: Vec<Entry>,
}

impl Default for FloorSums {
    fn default() -> Self {
        Self {
            x: Ratio { num: 0, den: 1 },
            places: Vec::new(),
            len: 0,
            up: QuadHeap::default(),
            down: QuadHeap::default(),
            total: 0,
            unmoved: Vec::new(),
        }
    }
}

impl FloorSums {
    /// The sum of the items' values at the current `x`.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    fn entries(id: u32, version: u32, item: FloorItem) -> (Option<Entry>, Option<Entry>) {
        let up = (item.floor < u64::MAX).then(|| Entry {
            key: key_of(item.floor + 1, item.weight),
            id,
            version,
        });
        let down = (item.floor > 0).then(|| Entry {
            key: !key_of(item.floor, item.weight),
            id,
            version,
        });
        (up, down)
    }

    /// Whether a heap entry is for the item now at its id.
    fn current(&self, entry: &Entry) -> bool {
        self.places
            .get(entry.id as usize)
            .is_some_and(|p| p.item.is_some() && p.version == entry.version)
    }

    fn link(&mut self, id: u32, item: FloorItem) {
        let at = id as usize;
        if self.places.len() <= at {
            self.places.resize(at + 1, Place::default());
        }
        let place = &mut self.places[at];
        debug_assert!(place.item.is_none(), "an id holds one item");
        place.version = place.version.wrapping_add(1);
        place.item = Some(item);
        let (up, down) = Self::entries(id, place.version, item);
        if let Some(entry) = up {
            self.up.push(entry);
        }
        if let Some(entry) = down {
            self.down.push(entry);
        }
        self.total = self.total.wrapping_add(item.value);
        self.len += 1;
        if self.up.len().max(self.down.len()) > 2 * self.len + 32 {
            self.rebuild_heaps();
        }
    }

    fn unlink(&mut self, id: u32) -> Option<FloorItem> {
        let item = self.places.get_mut(id as usize)?.item.take()?;
        self.total = self.total.wrapping_sub(item.value);
        self.len -= 1;
        Some(item)
    }

    /// The heaps with only the current items' entries.
    fn rebuild_heaps(&mut self) {
        let mut up = std::mem::take(&mut self.up.entries);
        let mut down = std::mem::take(&mut self.down.entries);
        up.clear();
        down.clear();
        for (id, place) in self.places.iter().enumerate() {
            if let Some(item) = place.item {
                let (u, d) = Self::entries(id as u32, place.version, item);
                up.extend(u);
                down.extend(d);
            }
        }
        self.up = QuadHeap::from_entries(up);
        self.down = QuadHeap::from_entries(down);
    }

    /// Adds an item of `weight` > 0, valued `value(floor)` at the current `x`.
    pub(crate) fn insert(&mut self, id: u32, weight: u64, value: impl FnOnce(u64) -> u64) {
        debug_assert!(weight > 0, "an item of weight 0 never changes");
        let floor = share_of(self.x.num, weight, self.x.den);
        self.link(
            id,
            FloorItem {
                weight,
                floor,
                value: value(floor),
            },
        );
    }

    /// Makes item `id` one of `weight` > 0 valued `value(floor)`, as
    /// [`FloorSums::remove`] then [`FloorSums::insert`] would; when its
    /// weight stays, only its value is replaced (its floor and thresholds
    /// stay where they are).
    pub(crate) fn set(&mut self, id: u32, weight: u64, value: impl FnOnce(u64) -> u64) {
        if let Some(item) = self
            .places
            .get_mut(id as usize)
            .and_then(|p| p.item.as_mut())
            .filter(|item| item.weight == weight)
        {
            let v = value(item.floor);
            self.total = self.total.wrapping_sub(item.value).wrapping_add(v);
            item.value = v;
            return;
        }
        self.unlink(id);
        self.insert(id, weight, value);
    }

    /// Takes an item away; its weight, if it was there.
    pub(crate) fn remove(&mut self, id: u32) -> Option<u64> {
        self.unlink(id).map(|item| item.weight)
    }

    /// Moves `x` to `num / den` (`den` > 0), revaluing the items whose
    /// floor changes with `value(id, floor)`.
    pub(crate) fn set_x(&mut self, num: u64, den: u64, mut value: impl FnMut(u32, u64) -> u64) {
        self.x = Ratio { num, den };
        let x = num as f64 / den as f64;
        // Upwards: every threshold at or below `x` (and any a rounding away).
        let last_up = (x * (1.0 + KEY_MARGIN)).to_bits();
        // Downwards: every threshold above `x` (keys inverted).
        let last_down = !(x * (1.0 - KEY_MARGIN)).to_bits();
        let mut unmoved = std::mem::take(&mut self.unmoved);
        while let Some(entry) = self.up.peek().filter(|e| e.key <= last_up) {
            self.up.pop();
            if self.current(&entry) && !self.refloor(entry.id, &mut value) {
                unmoved.push(entry);
            }
        }
        for entry in unmoved.drain(..) {
            self.up.push(entry);
        }
        while let Some(entry) = self.down.peek().filter(|e| e.key <= last_down) {
            self.down.pop();
            if self.current(&entry) && !self.refloor(entry.id, &mut value) {
                unmoved.push(entry);
            }
        }
        for entry in unmoved.drain(..) {
            self.down.push(entry);
        }
        self.unmoved = unmoved;
    }

    /// Item `id`'s floor at the current `x`: whether it changed (then its
    /// value and heap entries are new).
    fn refloor(&mut self, id: u32, value: &mut impl FnMut(u32, u64) -> u64) -> bool {
        let Some(item) = self.places.get(id as usize).and_then(|p| p.item) else {
            return false;
        };
        let floor = share_of(self.x.num, item.weight, self.x.den);
        if floor == item.floor {
            return false;
        }
        self.unlink(id);
        self.link(
            id,
            FloorItem {
                weight: item.weight,
                floor,
                value: value(id, floor),
            },
        );
        true
    }
}

/// A sorted multiset with ranks: sorted blocks of at most `2 × BLOCK`, so an
/// insertion moves a block, not the whole list, and a rank adds up block
/// lengths (a few dozen for 10,000 nodes).
#[derive(Clone, Debug)]
pub(crate) struct RankList<T> {
    blocks: Vec<Vec<T>>,
}

impl<T> Default for RankList<T> {
    fn default() -> Self {
        Self { blocks: Vec::new() }
    }
}

const BLOCK: usize = 128;

impl<T: Ord + Copy> RankList<T> {
    fn block_for(&self, t: &T) -> usize {
        self.blocks
            .partition_point(|b| b.last().is_some_and(|l| l < t))
            .min(self.blocks.len().saturating_sub(1))
    }

    pub(crate) fn insert(&mut self, t: T) {
        if self.blocks.is_empty() {
            self.blocks.push(vec![t]);
            return;
        }
        let i = self.block_for(&t);
        let block = &mut self.blocks[i];
        let at = block.partition_point(|e| e < &t);
        block.insert(at, t);
        if block.len() > 2 * BLOCK {
            let rest = block.split_off(BLOCK);
            self.blocks.insert(i + 1, rest);
        }
    }

    pub(crate) fn remove(&mut self, t: &T) {
        if self.blocks.is_empty() {
            return;
        }
        let i = self.block_for(t);
        let block = &mut self.blocks[i];
        if let Ok(at) = block.binary_search(t) {
            block.remove(at);
            if block.is_empty() {
                self.blocks.remove(i);
            }
        }
    }

    /// Takes `old` out and puts `new` in, as [`RankList::remove`] then
    /// [`RankList::insert`] would (the same ranks after); when `new` belongs
    /// in `old`'s block, only the elements between the two move, by one
    /// place (a node's new lease weight moves it a few places in the order),
    /// not the rest of the block twice.
    pub(crate) fn replace(&mut self, old: &T, new: T) {
        if !self.blocks.is_empty() {
            let b = self.block_for(old);
            if self.block_for(&new) == b {
                let block = &mut self.blocks[b];
                if let Ok(i) = block.binary_search(old) {
                    let j = block.partition_point(|e| e < &new);
                    if j > i {
                        block[i..j].rotate_left(1);
                        block[j - 1] = new;
                    } else {
                        block[j..=i].rotate_right(1);
                        block[j] = new;
                    }
                    return;
                }
            }
        }
        self.remove(old);
        self.insert(new);
    }

    /// How many elements are smaller than `t`.
    pub(crate) fn rank(&self, t: &T) -> usize {
        if self.blocks.is_empty() {
            return 0;
        }
        let i = self.block_for(t);
        self.blocks[..i].iter().map(Vec::len).sum::<usize>()
            + self.blocks[i].partition_point(|e| e < t)
    }
}

/// One colo's traffic: two minutes back (its weight between colos), and
/// recent (two minutes back plus this minute so far, `recent_traffic` of
/// the reference) by which its nodes split its slots.
#[derive(Clone, Debug, Default)]
struct ColoTraffic {
    back: u64,
    recent: u64,
    /// Nodes' recent traffic → how many nodes of the colo had that much.
    /// (sorted by traffic; a colo has a few nodes, so a short list).
    parts: Vec<(u64, u64)>,
    /// Colo-share slots leased to the colo's nodes and not yet used.
    held: u64,
}

impl ColoTraffic {
    /// What the colo's nodes get of `slots` together: each its floor.
    fn handed_out(&self, slots: u64) -> u64 {
        self.parts.iter().fold(0_u64, |t, &(d, count)| {
            t.wrapping_add(share_of(slots, d, self.recent).wrapping_mul(count))
        })
    }
}

/// A node's place in the lease order: heaviest first, then the order in
/// which the cluster holds the reports (the reference's stable sort).
type LeaseRank = (Reverse<u64>, usize);

/// Everything that depends on the minute of the query, for one minute.
#[derive(Clone, Debug)]
pub(crate) struct Live {
    pub(crate) minute: Minute,
    /// Traffic per colo (interned id); colos without any traffic or
    /// colo-share lease held are absent.
    /// Indexed by the colo's number (dense); an absent colo's entry is
    /// all zero, which reads as no traffic, as absence did.
    colos: Vec<ColoTraffic>,
    /// Σ of all colos' traffic two minutes back.
    traffic_total: u64,
    /// Colo → what its nodes get of their colo's part, at `x` = shared
    /// slots / (100 × traffic), each colo weighing 90 × its traffic.
    colo_floors: FloorSums,
    /// Σ of the nodes' lease weights (traffic this minute + 1).
    lease_weight: u64,
    /// Node → ⌊Anywhere × weight / Σ weights⌋.
    lease_floors: FloorSums,
    lease_order: RankList<LeaseRank>,
    /// Anywhere slots leased and not yet used, over every node with a lease.
    held: u64,
    /// Colo-share slots leased and not yet used, over every node.
    colo_held: u64,
}

/// One node as the running sums see it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NodeKey {
    /// Stable while the node is known (items of the floor sums).
    pub(crate) id: u32,
    pub(crate) colo: u32,
    /// Its place in the cluster's list of reports.
    pub(crate) position: usize,
}

/// One room's running sums.
#[derive(Clone, Debug, Default)]
pub(crate) struct RoomSums {
    /// Nodes reporting on the room.
    pub(crate) nodes: u64,
    pub(crate) expiries: ExpirySums,
    pub(crate) waiting: KeyedSums<Minute>,
    pub(crate) admits: AdmitSums,
    /// `None` when the minute changed and it is not rebuilt yet.
    pub(crate) live: Option<Live>,
}

/// What [`RoomSums::lease`] tells about the reporting node.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NodeShares {
    pub(crate) colo_share: u64,
    /// The node's part of the Anywhere pool, before the ledger's clamp.
    pub(crate) anywhere: u64,
    /// The whole Anywhere pool of the round.
    pub(crate) pool: u64,
    /// Anywhere slots leased to the other nodes and not yet used.
    pub(crate) held_by_others: u64,
    /// What the engine hands the node's colo this round (its nodes' colo
    /// shares together).
    pub(crate) colo_pool: u64,
    /// Colo-share slots leased to the other nodes of the node's colo and
    /// not yet used.
    pub(crate) colo_held_in_colo: u64,
    /// Colo-share slots leased to the other nodes of every colo and not yet
    /// used.
    pub(crate) colo_held_by_others: u64,
}

impl RoomSums {
    /// Adds (`sign` = 1) or takes away (−1) the minute-free counts of `report`.
    pub(crate) fn account_counts(&mut self, report: &RoomReport, sign: i64) {
        self.nodes = if sign > 0 {
            self.nodes + 1
        } else {
            self.nodes - 1
        };
        for &(m, n) in &report.expiries {
            self.expiries.add(m, n, sign);
        }
        for &(m, n) in &report.waiting {
            self.waiting.add(m, n, sign);
        }
        for a in counted(&report.admits) {
            self.admits.add(a.minute, a.admits, sign);
        }
    }

    /// Takes away the minute-free counts of `old` and adds those of `new`
    /// (the same node's reports), as `account_counts` of each would.
    pub(crate) fn replace_counts(&mut self, old: &RoomReport, new: &RoomReport) {
        self.expiries.replace(&old.expiries, &new.expiries);
        self.waiting.replace(&old.waiting, &new.waiting);
        self.admits.replace(&old.admits, &new.admits);
    }

    /// Adds or takes away the minute-dependent part of a node's report,
    /// with the node's lease for this room.
    pub(crate) fn account_live(
        &mut self,
        report: &RoomReport,
        node: NodeKey,
        (colo_lease, lease): (Option<&Lease>, Option<&Lease>),
        sign: i64,
    ) {
        let Some(live) = &mut self.live else {
            return;
        };
        let minute = live.minute;
        let (back, recent, weight) = traffic(report, minute);
        let colo_held = outstanding_colo(colo_lease, report, minute);
        let add = |sum: u64, n: u64| {
            if sign > 0 {
                sum.wrapping_add(n)
            } else {
                sum.wrapping_sub(n)
            }
        };
        if recent > 0 || colo_held > 0 {
            let colo = colo_mut(&mut live.colos, node.colo);
            colo.back = add(colo.back, back);
            colo.recent = add(colo.recent, recent);
            colo.held = add(colo.held, colo_held);
            if recent > 0 {
                count_part(&mut colo.parts, recent, sign);
            }
            live.traffic_total = add(live.traffic_total, back);
            live.colo_held = add(live.colo_held, colo_held);
            revalue_colo(&mut live.colo_floors, colo, node.colo);
        }
        live.lease_weight = add(live.lease_weight, weight);
        let rank = (Reverse(weight), node.position);
        if sign > 0 {
            live.lease_floors.insert(node.id, weight, |floor| floor);
            live.lease_order.insert(rank);
        } else {
            live.lease_floors.remove(node.id);
            live.lease_order.remove(&rank);
        }
        let held = outstanding(lease, report, minute);
        live.held = add(live.held, held);
    }

    /// Takes `before` (a node's previous report) out of the minute view and
    /// puts `after` (its new one, under the same key) in, as
    /// `account_live(before, -1)` then `account_live(after, 1)` would, but
    /// moving the colo's floor item and the node's lease item only where
    /// they change. Between two reports a colo's traffic two minutes back
    /// stays the same, so taking a report out and putting it back moved the
    /// colo's item (its weight down, then up again: two heap entries each
    /// way) for nothing; a node whose visitors did not change keeps its
    /// lease item and its place in the lease order.
    pub(crate) fn replace_live(
        &mut self,
        before: &RoomReport,
        after: &RoomReport,
        node: NodeKey,
        leases: (Option<&Lease>, Option<&Lease>),
    ) {
        let Some(live) = &mut self.live else {
            return;
        };
        let minute = live.minute;
        let (colo_lease, lease) = leases;
        let (back0, recent0, weight0) = traffic(before, minute);
        let (back1, recent1, weight1) = traffic(after, minute);
        let held0 = outstanding_colo(colo_lease, before, minute);
        let held1 = outstanding_colo(colo_lease, after, minute);
        let moved = |sum: u64, old: u64, new: u64| sum.wrapping_sub(old).wrapping_add(new);
        // A report with no recent traffic and nothing held leaves the colo
        // alone (then its traffic two minutes back is 0 too).
        if recent0 > 0 || held0 > 0 || recent1 > 0 || held1 > 0 {
            let colo = colo_mut(&mut live.colos, node.colo);
            colo.back = moved(colo.back, back0, back1);
            colo.recent = moved(colo.recent, recent0, recent1);
            colo.held = moved(colo.held, held0, held1);
            if recent0 != recent1 {
                if recent0 > 0 {
                    count_part(&mut colo.parts, recent0, -1);
                }
                if recent1 > 0 {
                    count_part(&mut colo.parts, recent1, 1);
                }
            }
            live.traffic_total = moved(live.traffic_total, back0, back1);
            live.colo_held = moved(live.colo_held, held0, held1);
            revalue_colo(&mut live.colo_floors, colo, node.colo);
        }
        if weight0 != weight1 {
            live.lease_weight = moved(live.lease_weight, weight0, weight1);
            live.lease_floors.remove(node.id);
            live.lease_floors.insert(node.id, weight1, |floor| floor);
            live.lease_order.replace(
                &(Reverse(weight0), node.position),
                (Reverse(weight1), node.position),
            );
        }
        live.held = moved(
            live.held,
            outstanding(lease, before, minute),
            outstanding(lease, after, minute),
        );
    }

    /// Replaces a node's lease in the ledger's sum of what is held.
    pub(crate) fn swap_lease(
        &mut self,
        report: &RoomReport,
        old: Option<&Lease>,
        new: Option<&Lease>,
    ) {
        if let Some(live) = &mut self.live {
            live.held = live
                .held
                .wrapping_sub(outstanding(old, report, live.minute))
                .wrapping_add(outstanding(new, report, live.minute));
        }
    }

    /// Replaces a node's colo-share lease in the ledger's sums of what is
    /// held (its colo's and every colo's).
    pub(crate) fn swap_colo_lease(
        &mut self,
        report: &RoomReport,
        node: NodeKey,
        old: Option<&Lease>,
        new: Option<&Lease>,
    ) {
        let Some(live) = &mut self.live else {
            return;
        };
        let old = outstanding_colo(old, report, live.minute);
        let new = outstanding_colo(new, report, live.minute);
        if old == new {
            return;
        }
        live.colo_held = live.colo_held.wrapping_sub(old).wrapping_add(new);
        let colo = colo_mut(&mut live.colos, node.colo);
        colo.held = colo.held.wrapping_sub(old).wrapping_add(new);
        revalue_colo(&mut live.colo_floors, colo, node.colo);
    }

    /// The reporting node's colo share and Anywhere lease when `shared`
    /// slots are split between colos and Anywhere (its report and lease
    /// are in the sums). `None` when the live view is not for `minute`.
    pub(crate) fn shares(
        &mut self,
        minute: Minute,
        shared: u64,
        report: &RoomReport,
        node: NodeKey,
        (colo_lease, lease): (Option<&Lease>, Option<&Lease>),
    ) -> Option<NodeShares> {
        let live = self.live.as_mut().filter(|l| l.minute == minute)?;
        let (_, recent, weight) = traffic(report, minute);
        // Colos: each gets ⌊S·90·D_c / 100·T⌋, its nodes each their floor of
        // that; what the floors leave is the Anywhere pool.
        let total_weight = live.traffic_total.saturating_mul(100);
        let handed_out = if total_weight > 0 {
            let colos = &live.colos;
            live.colo_floors.set_x(shared, total_weight, |colo, slots| {
                colos.get(colo as usize).map_or(0, |c| c.handed_out(slots))
            });
            live.colo_floors.total()
        } else {
            0
        };
        let colo = live.colos.get(node.colo as usize);
        let colo_slots = share_of(
            shared,
            colo.map_or(0, |c| c.back).saturating_mul(90),
            total_weight,
        );
        let colo_share = share_of(colo_slots, recent, colo.map_or(0, |c| c.recent));
        let colo_pool = colo.map_or(0, |c| c.handed_out(colo_slots));
        let mine_colo = outstanding_colo(colo_lease, report, minute);
        let colo_held_in_colo = colo.map_or(0, |c| c.held).wrapping_sub(mine_colo);
        let colo_held_by_others = live.colo_held.wrapping_sub(mine_colo);
        let pool = shared.wrapping_sub(handed_out);
        // Anywhere: each node its floor, one more to the heaviest (ties in
        // report order) until the pool is spent.
        live.lease_floors
            .set_x(pool, live.lease_weight, |_, floor| floor);
        let left = pool.wrapping_sub(live.lease_floors.total());
        let before = live.lease_order.rank(&(Reverse(weight), node.position)) as u64;
        let anywhere = share_of(pool, weight, live.lease_weight) + u64::from(before < left);
        let held_by_others = live.held.wrapping_sub(outstanding(lease, report, minute));
        Some(NodeShares {
            colo_share,
            anywhere,
            pool,
            held_by_others,
            colo_pool,
            colo_held_in_colo,
            colo_held_by_others,
        })
    }
}

impl Live {
    pub(crate) fn new(minute: Minute) -> Self {
        Self {
            minute,
            colos: Vec::new(),
            traffic_total: 0,
            colo_floors: FloorSums::default(),
            lease_weight: 0,
            lease_floors: FloorSums::default(),
            lease_order: RankList::default(),
            held: 0,
            colo_held: 0,
        }
    }
}

/// A node's traffic in `report` as the minute view weighs it: `(traffic two
/// minutes back, recent traffic (that plus this minute's), lease weight
/// (this minute's traffic + 1))`.
fn traffic(report: &RoomReport, minute: Minute) -> (u64, u64, u64) {
    let back = first_in(&report.distinct_visitors, minute.minus(2)).unwrap_or(0);
    let current = first_in(&report.distinct_visitors, minute).unwrap_or(0);
    (
        back,
        back.saturating_add(current),
        current.saturating_add(1),
    )
}

/// Colo `id`'s floor item after its traffic, parts or held slots changed:
/// only its value changes while its traffic two minutes back stays (`set`
/// then moves no threshold). A colo left with nothing keeps an all-zero
/// entry, which reads as absent.
fn revalue_colo(colo_floors: &mut FloorSums, colo: &ColoTraffic, id: u32) {
    if colo.back > 0 {
        colo_floors.set(id, colo.back.saturating_mul(90), |slots| {
            colo.handed_out(slots)
        });
    } else {
        colo_floors.remove(id);
    }
}

/// One more (`sign` = 1) or one fewer (−1) node of `recent` traffic in a
/// colo's parts; a count back at zero drops its entry.
fn count_part(parts: &mut Vec<(u64, u64)>, recent: u64, sign: i64) {
    let add = |count: u64| {
        if sign > 0 {
            count.wrapping_add(1)
        } else {
            count.wrapping_sub(1)
        }
    };
    match parts.binary_search_by_key(&recent, |&(d, _)| d) {
        Ok(at) => {
            let count = add(parts[at].1);
            if count == 0 {
                parts.remove(at);
            } else {
                parts[at].1 = count;
            }
        }
        Err(at) => {
            let count = add(0);
            if count != 0 {
                parts.insert(at, (recent, count));
            }
        }
    }
}

/// Colo `id`'s entry, made (all zero) when the list does not reach it yet.
fn colo_mut(colos: &mut Vec<ColoTraffic>, id: u32) -> &mut ColoTraffic {
    let at = id as usize;
    if colos.len() <= at {
        colos.resize_with(at + 1, ColoTraffic::default);
    }
    &mut colos[at]
}

/// Slots of the Anywhere `lease` its holder has not used by `minute`, as
/// the ledger counts them (0 without a lease).
pub(crate) fn outstanding(lease: Option<&Lease>, report: &RoomReport, minute: Minute) -> u64 {
    lease.map_or(0, |l| {
        l.outstanding(minute, admits_in(report, minute).anywhere)
    })
}

/// Slots of the colo-share `lease` its holder has not used by `minute`.
fn outstanding_colo(lease: Option<&Lease>, report: &RoomReport, minute: Minute) -> u64 {
    lease.map_or(0, |l| {
        l.outstanding(minute, admits_in(report, minute).colo_share)
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn floor_sums_match_a_recount_wherever_x_moves(
            weights in prop::collection::vec(1..1_000_u64, 1..40),
            moves in prop::collection::vec((0..5_000_u64, 1..3_000_u64), 1..30),
        ) {
            let mut sums = FloorSums::default();
            for (id, &w) in weights.iter().enumerate() {
                sums.insert(id as u32, w, |f| f * 3);
            }
            for &(num, den) in &moves {
                sums.set_x(num, den, |_, f| f * 3);
                let recount: u64 = weights.iter().map(|&w| share_of(num, w, den) * 3).sum();
                prop_assert_eq!(sums.total(), recount);
            }
            sums.remove(0);
            let &(num, den) = moves.last().unwrap();
            let recount: u64 = weights[1..].iter().map(|&w| share_of(num, w, den) * 3).sum();
            prop_assert_eq!(sums.total(), recount);
        }

        /// The heaps' `f64` keys cannot tell apart thresholds closer than
        /// a rounding: huge weights, equal and near-equal ones, and `x`
        /// put exactly on an item's threshold and one either side of it.
        #[test]
        fn floor_sums_match_a_recount_at_thresholds_too_close_for_an_f64(
            weights in prop::collection::vec(
                prop_oneof![
                    prop::sample::select(vec![
                        (1_u64 << 62) + 1,
                        (1_u64 << 62) + 3,
                        (1_u64 << 62) - 1,
                        3 << 60,
                        (3 << 60) + 1,
                        (1 << 53) + 1,
                        1 << 53,
                        (1 << 57) + 5,
                        (1 << 57) + 7,
                        (5 << 55) + 1,
                        7,
                    ]),
                    1..u64::MAX / 2,
                    (1_u64 << 53)..(1 << 60),
                ],
                1..24,
            ),
            moves in prop::collection::vec(
                (0..24_usize, 0..5_u64, prop::sample::select(vec![1_u64, 3, 7, 1_000_003])),
                1..60,
            ),
            start in 0..1_000_000_u64,
        ) {
            let value = |f: u64| f.wrapping_mul(3);
            let mut sums = FloorSums::default();
            for (id, &w) in weights.iter().enumerate() {
                sums.insert(id as u32, w, value);
            }
            let mut k = start;
            for &(j, step, m) in &moves {
                // x = k / w_j, one of item j's thresholds, k walking by at
                // most two (so x comes to rest on the very threshold an
                // item's entry holds), written as (k·m) / (w_j·m): the same
                // fraction, rounded otherwise.
                k = (k + step).saturating_sub(2);
                let w = weights[j % weights.len()];
                let (num, den) = match (k.checked_mul(m), w.checked_mul(m)) {
                    (Some(num), Some(den)) => (num, den),
                    _ => (k, w),
                };
                sums.set_x(num, den, |_, f| value(f));
                let recount = weights
                    .iter()
                    .fold(0_u64, |t, &w| t.wrapping_add(value(share_of(num, w, den))));
                prop_assert_eq!(sums.total(), recount);
            }
        }

        #[test]
        fn keyed_sums_replace_like_adding_each_entry(
            start in prop::collection::vec((0..40_u64, -5..5_i64), 0..30),
            old in prop::collection::vec((0..40_u64, -5..5_i64), 0..30),
            new in prop::collection::vec((0..40_u64, -5..5_i64), 0..30),
            sort in any::<bool>(),
        ) {
            let key = |list: &[(u64, i64)]| -> Vec<(Minute, i64)> {
                let mut list: Vec<(Minute, i64)> = list.iter().map(|&(k, n)| (Minute(k), n)).collect();
                if sort {
                    list.sort_by_key(|&(k, _)| k);
                    list.dedup_by_key(|&mut (k, _)| k);
                }
                list
            };
            let (start, old, new) = (key(&start), key(&old), key(&new));
            let mut walked = KeyedSums::default();
            let mut added = KeyedSums::default();
            for &(k, n) in start.iter().chain(&old) {
                walked.add(k, n, 1);
                added.add(k, n, 1);
            }
            walked.replace(&old, &new);
            for &(k, n) in &old {
                added.add(k, n, -1);
            }
            for &(k, n) in &new {
                added.add(k, n, 1);
            }
            prop_assert_eq!(&walked.sums, &added.sums);
        }

        #[test]
        fn expiry_sums_sum_like_keyed_sums(
            steps in prop::collection::vec(
                (
                    0..3_u8,
                    prop::collection::vec((0..1_600_u64, -5..6_i64), 0..12),
                    prop::collection::vec((0..1_600_u64, -5..6_i64), 0..12),
                    0..1_700_u64,
                    any::<bool>(),
                    0..4_u8,
                ),
                1..40,
            ),
        ) {
            let mut ring = ExpirySums::default();
            let mut keyed = KeyedSums::default();
            for (op, old, new, from, sort, like) in steps {
                let slots = |list: &[(u64, i64)]| -> Vec<(ExpirySlot, i64)> {
                    let mut list: Vec<_> = list.iter().map(|&(k, n)| (ExpirySlot(k), n)).collect();
                    if sort {
                        list.sort_by_key(|&(k, _)| k);
                        list.dedup_by_key(|&mut (k, _)| k);
                    }
                    list
                };
                let (old, mut new) = (slots(&old), slots(&new));
                if like > 0 {
                    // A second later, as a node reports: most slots the
                    // same, one in `like` moved, a slot gone at the front.
                    new = old
                        .iter()
                        .enumerate()
                        .skip(usize::from(like == 1))
                        .map(|(i, &(k, n))| (k, if i % usize::from(like) == 0 { n + 1 } else { n }))
                        .collect();
                }
                match op {
                    0 => {
                        for &(k, n) in &new {
                            ring.add(k, n, 1);
                            keyed.add(k, n, 1);
                        }
                    }
                    1 => {
                        for &(k, n) in &old {
                            ring.add(k, n, 1);
                            keyed.add(k, n, 1);
                        }
                        ring.replace(&old, &new);
                        keyed.replace(&old, &new);
                    }
                    _ => {}
                }
                // Every step asks from some slot (back and forth): the ring
                // moves, and what it holds moves in and out of it.
                let from = ExpirySlot(from);
                prop_assert_eq!(ring.sum_from(from), keyed.sum_from(from));
                prop_assert_eq!(ring.sum_from(ExpirySlot(0)), keyed.sum_from(ExpirySlot(0)));
            }
        }

        #[test]
        fn rank_list_ranks_like_a_sorted_vec(
            ops in prop::collection::vec((0..3_u8, 0..600_u32, 0..600_u32), 0..2_000),
        ) {
            let mut list = RankList::default();
            let mut reference: Vec<u32> = Vec::new();
            for &(op, v, by) in &ops {
                if op == 2 {
                    // Replace one present element (one near `v`) by `by`.
                    if let Some(&old) = reference.get(reference.partition_point(|&e| e < v)) {
                        list.replace(&old, by);
                        let at = reference.binary_search(&old).unwrap();
                        reference.remove(at);
                        let at = reference.partition_point(|&e| e < by);
                        reference.insert(at, by);
                    }
                    for probe in [v, by] {
                        prop_assert_eq!(list.rank(&probe), reference.partition_point(|&e| e < probe));
                    }
                    continue;
                }
                let insert = op == 0;
                if insert {
                    list.insert(v);
                    let at = reference.partition_point(|&e| e < v);
                    reference.insert(at, v);
                } else if let Ok(at) = reference.binary_search(&v) {
                    list.remove(&v);
                    reference.remove(at);
                }
                prop_assert_eq!(list.rank(&v), reference.partition_point(|&e| e < v));
            }
        }
    }

    #[test]
    fn keyed_sums_drop_keys_back_at_zero_and_sum_from_a_key() {
        let mut sums = KeyedSums::default();
        sums.add(Minute(3), 5, 1);
        sums.add(Minute(4), 2, 1);
        sums.add(Minute(3), 5, -1);
        assert_eq!(sums.sum_from(Minute(0)), 2);
        assert_eq!(sums.positive().collect::<Vec<_>>(), [(Minute(4), 2)]);
        assert_eq!(sums.sum_from(Minute(5)), 0);
    }
}
