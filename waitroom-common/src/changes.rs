//! A node's report as the changes since an earlier one.
//!
//! A report carries every room's whole state: session expiries per second
//! (up to 120 of them) and per minute beyond, admits, queue buckets and
//! distinct visitors of the last minutes, about a kilobyte per room. From
//! one report to the next, a second later, nearly all of it is the same: a
//! few expiry slots gain a session or pass, this minute's admits and
//! visitors grow. [`changes`] says only that, against a report the
//! aggregator already holds, and [`apply`] turns the changes back into the
//! whole report, exactly (`apply(base, changes(base, new)) == new`, the
//! property test below). The wire carries them as
//! [`Message::Changes`](crate::wire::Message::Changes).
//!
//! # Encoding
//! A room's changes are a [`RoomReport`] of the same room whose lists hold
//! only the entries that differ from the base, each with its new count, and
//! a count of zero for an entry the base has and the new report has not (a
//! report never carries a zero count, so a zero says "gone"). A room with
//! no changed entry is left out. Each list keeps the order the node sends
//! it in: expiries and queue buckets oldest first, admits and visitors
//! newest first.
//!
//! # When there are none
//! [`changes`] gives `None` when the new report cannot be said as changes
//! exactly: other rooms or another order of rooms than the base, a room
//! twice, a list out of its order, or a zero count. The node then sends the
//! whole report, as it does when it has no base. [`apply`] gives `None` for
//! changes that do not fit their base (a room the base lacks, rooms or
//! entries out of order): the aggregator refuses them and the node sends the
//! whole report. Neither panics on any input, and what `apply` builds is
//! never longer than the base and the changes together.
use std::cmp::Ordering;

use crate::{
    aggregate::{MinuteAdmits, RoomReport},
    counters::PoolCounts,
};

/// One entry of a report's list: a key, and a count that is zero when absent.
trait Entry: Clone + PartialEq {
    type Key: Ord + Copy;
    fn key(&self) -> Self::Key;
    fn is_zero(&self) -> bool;
    fn zero(key: Self::Key) -> Self;
}

impl<K: Ord + Copy, V: Copy + Default + PartialEq> Entry for (K, V) {
    type Key = K;
    fn key(&self) -> K {
        self.0
    }
    fn is_zero(&self) -> bool {
        self.1 == V::default()
    }
    fn zero(key: K) -> Self {
        (key, V::default())
    }
}

impl Entry for MinuteAdmits {
    type Key = crate::time::Minute;
    fn key(&self) -> Self::Key {
        self.minute
    }
    fn is_zero(&self) -> bool {
        self.admits == PoolCounts::default()
    }
    fn zero(minute: Self::Key) -> Self {
        Self {
            minute,
            admits: PoolCounts::default(),
        }
    }
}

/// The order a list is sent in.
#[derive(Clone, Copy)]
enum Order {
    Oldest,
    Newest,
}

impl Order {
    fn cmp<K: Ord>(self, a: &K, b: &K) -> Ordering {
        match self {
            Self::Oldest => a.cmp(b),
            Self::Newest => b.cmp(a),
        }
    }

    /// In a walk over two lists in this order, which one's entry comes
    /// next: `Less` the first's, `Greater` the second's, `Equal` both (the
    /// same key); a list at its end comes last.
    fn next_of<E: Entry>(self, a: Option<&E>, b: Option<&E>) -> Ordering {
        match (a, b) {
            (Some(a), Some(b)) => self.cmp(&a.key(), &b.key()),
            (Some(_), None) => Ordering::Less,
            _ => Ordering::Greater,
        }
    }

    fn sorted<E: Entry>(self, list: &[E]) -> bool {
        list.windows(2)
            .all(|w| self.cmp(&w[0].key(), &w[1].key()) == Ordering::Less)
    }
}

/// The entries of `new` that differ from `old`, a zero for each one gone;
/// `None` when either list is out of `order` or `new` holds a zero.
fn list_changes<E: Entry>(old: &[E], new: &[E], order: Order) -> Option<Vec<E>> {
    if !order.sorted(old) || !order.sorted(new) || new.iter().any(Entry::is_zero) {
        return None;
    }
    let mut out = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        match order.next_of(old.get(i), new.get(j)) {
            Ordering::Less => {
                out.push(E::zero(old[i].key()));
                i += 1;
            }
            Ordering::Greater => {
                out.push(new[j].clone());
                j += 1;
            }
            Ordering::Equal => {
                if old[i] != new[j] {
                    out.push(new[j].clone());
                }
                i += 1;
                j += 1;
            }
        }
    }
    Some(out)
}

/// `base` with `changes` made; `None` when the changes are out of `order`.
fn list_apply<E: Entry>(base: &[E], changes: &[E], order: Order) -> Option<Vec<E>> {
    if !order.sorted(changes) {
        return None;
    }
    let mut out = Vec::with_capacity(base.len() + changes.len());
    let (mut i, mut j) = (0, 0);
    while i < base.len() || j < changes.len() {
        let side = order.next_of(base.get(i), changes.get(j));
        match side {
            Ordering::Less => {
                out.push(base[i].clone());
                i += 1;
            }
            Ordering::Greater | Ordering::Equal => {
                if !changes[j].is_zero() {
                    out.push(changes[j].clone());
                }
                if side == Ordering::Equal {
                    i += 1;
                }
                j += 1;
            }
        }
    }
    Some(out)
}

/// Room `new`'s changes since `old` (the same room): `Some(None)` when
/// nothing changed.
fn room_changes(old: &RoomReport, new: &RoomReport) -> Option<Option<RoomReport>> {
    let changes = RoomReport {
        room: new.room,
        expiries: list_changes(&old.expiries, &new.expiries, Order::Oldest)?,
        admits: list_changes(&old.admits, &new.admits, Order::Newest)?,
        waiting: list_changes(&old.waiting, &new.waiting, Order::Oldest)?,
        distinct_visitors: list_changes(
            &old.distinct_visitors,
            &new.distinct_visitors,
            Order::Newest,
        )?,
    };
    let unchanged = changes.expiries.is_empty()
        && changes.admits.is_empty()
        && changes.waiting.is_empty()
        && changes.distinct_visitors.is_empty();
    Some((!unchanged).then_some(changes))
}

fn distinct_rooms(rooms: &[RoomReport]) -> bool {
    rooms
        .iter()
        .enumerate()
        .all(|(j, r)| rooms[..j].iter().all(|o| o.room != r.room))
}

/// The changes that turn the rooms of report `base` into those of `new`,
/// for [`apply`]; `None` when they cannot be said exactly (see the module).
#[must_use]
pub fn changes(base: &[RoomReport], new: &[RoomReport]) -> Option<Vec<RoomReport>> {
    if base.len() != new.len()
        || base.iter().zip(new).any(|(a, b)| a.room != b.room)
        || !distinct_rooms(new)
    {
        return None;
    }
    let mut out = Vec::new();
    for (old, new) in base.iter().zip(new) {
        if let Some(room) = room_changes(old, new)? {
            out.push(room);
        }
    }
    Some(out)
}

/// The rooms of `base` with `changes` made: the report the node built;
/// `None` when the changes do not fit the base.
#[must_use]
pub fn apply(base: &[RoomReport], changes: &[RoomReport]) -> Option<Vec<RoomReport>> {
    let mut out = Vec::with_capacity(base.len());
    let mut pending = changes.iter().peekable();
    for room in base {
        match pending.peek() {
            Some(change) if change.room == room.room => {
                out.push(RoomReport {
                    room: room.room,
                    expiries: list_apply(&room.expiries, &change.expiries, Order::Oldest)?,
                    admits: list_apply(&room.admits, &change.admits, Order::Newest)?,
                    waiting: list_apply(&room.waiting, &change.waiting, Order::Oldest)?,
                    distinct_visitors: list_apply(
                        &room.distinct_visitors,
                        &change.distinct_visitors,
                        Order::Newest,
                    )?,
                });
                pending.next();
            }
            _ => out.push(room.clone()),
        }
    }
    // Every change must have found its room, in the base's order.
    pending.next().is_none().then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        room::RoomId,
        time::{ExpirySlot, Minute},
    };
    use proptest::prelude::*;

    /// A list of distinct keys drawn from a small range (so two reports share
    /// keys), in `order`, with non-zero counts.
    fn keyed<V: std::fmt::Debug + Clone + 'static>(
        counts: impl Strategy<Value = V> + Clone + 'static,
        newest_first: bool,
    ) -> impl Strategy<Value = Vec<(u64, V)>> {
        proptest::collection::btree_map(0_u64..40, counts, 0..12).prop_map(move |map| {
            let mut list: Vec<_> = map.into_iter().collect();
            if newest_first {
                list.reverse();
            }
            list
        })
    }

    fn room_report(room: u64) -> impl Strategy<Value = RoomReport> {
        let signed = prop_oneof![-50_i64..-1, 1_i64..50];
        let admits = (0_u64..4, 0_u64..4, 0_u64..4)
            .prop_filter("non-zero", |&(a, b, c)| a + b + c > 0)
            .prop_map(|(eligible, colo_share, anywhere)| PoolCounts {
                eligible,
                colo_share,
                anywhere,
                uncapped: 0,
            });
        (
            keyed(signed.clone(), false),
            keyed(admits, true),
            keyed(signed, false),
            keyed(1_u64..500, true),
        )
            .prop_map(move |(expiries, admits, waiting, visitors)| RoomReport {
                room: RoomId(room),
                expiries: expiries
                    .into_iter()
                    .map(|(k, v)| (ExpirySlot(1_000 + k), v))
                    .collect(),
                admits: admits
                    .into_iter()
                    .map(|(k, admits)| MinuteAdmits {
                        minute: Minute(k),
                        admits,
                    })
                    .collect(),
                waiting: waiting.into_iter().map(|(k, v)| (Minute(k), v)).collect(),
                distinct_visitors: visitors.into_iter().map(|(k, v)| (Minute(k), v)).collect(),
            })
    }

    fn rooms(n: u64) -> impl Strategy<Value = Vec<RoomReport>> {
        (0..n).map(room_report).collect::<Vec<_>>()
    }

    proptest! {
        /// Whatever two reports of the same rooms hold, the changes rebuild
        /// the second from the first exactly, and say nothing of a room
        /// that did not change.
        #[test]
        fn changes_rebuild_the_new_report_exactly(
            base in rooms(3),
            new in rooms(3),
            keep in proptest::collection::vec(any::<bool>(), 3),
        ) {
            // Some rooms unchanged, as most are from one second to the next.
            let new: Vec<_> = new
                .into_iter()
                .zip(&base)
                .zip(keep)
                .map(|((n, b), keep)| if keep { b.clone() } else { n })
                .collect();
            let changes = changes(&base, &new).expect("same rooms, sorted, no zeros");
            prop_assert_eq!(apply(&base, &changes), Some(new.clone()));
            for change in &changes {
                let at = new.iter().position(|r| r.room == change.room).unwrap();
                prop_assert_ne!(&base[at], &new[at], "an unchanged room is not sent");
            }
        }

        /// Changes that do not fit the base, or bytes that are not changes
        /// at all, are refused or rebuilt into something no longer than
        /// both together; never a panic.
        #[test]
        fn any_changes_on_any_base_are_bounded(
            base in rooms(3),
            changes in rooms(4),
            keep in proptest::collection::vec(any::<bool>(), 4),
        ) {
            // Some rooms named, sometimes one the base lacks.
            let changes: Vec<_> = changes.into_iter().zip(keep).filter(|(_, k)| *k).map(|(c, _)| c).collect();
            let fits = changes.iter().all(|c| c.room.0 < 3);
            let rebuilt = apply(&base, &changes);
            prop_assert_eq!(rebuilt.is_some(), fits);
            if let Some(rebuilt) = rebuilt {
                let len = |rooms: &[RoomReport]| -> usize { rooms.iter().map(RoomReport::entries).sum() };
                prop_assert!(len(&rebuilt) <= len(&base) + len(&changes));
                prop_assert_eq!(rebuilt.len(), base.len());
            }
        }
    }

    fn sample() -> Vec<RoomReport> {
        vec![RoomReport {
            room: RoomId(7),
            expiries: vec![(ExpirySlot(10), 3), (ExpirySlot(11), 1)],
            admits: vec![MinuteAdmits {
                minute: Minute(5),
                admits: PoolCounts {
                    eligible: 1,
                    ..PoolCounts::default()
                },
            }],
            waiting: vec![(Minute(4), 2)],
            distinct_visitors: vec![(Minute(5), 9), (Minute(4), 3)],
        }]
    }

    /// A slot passed, one gained a session, a new one came: three entries,
    /// the passed one as a zero; the rest of the room is not sent.
    #[test]
    fn a_second_later_only_what_moved_is_sent() {
        let base = sample();
        let mut new = base.clone();
        new[0].expiries = vec![(ExpirySlot(11), 2), (ExpirySlot(300), 1)];
        let changes = changes(&base, &new).unwrap();
        assert_eq!(
            changes,
            vec![RoomReport {
                room: RoomId(7),
                expiries: vec![
                    (ExpirySlot(10), 0),
                    (ExpirySlot(11), 2),
                    (ExpirySlot(300), 1)
                ],
                ..RoomReport::default()
            }]
        );
        assert_eq!(apply(&base, &changes).unwrap(), new);
        assert_eq!(
            super::changes(&base, &base).unwrap(),
            vec![],
            "nothing moved"
        );
    }

    /// What cannot be said as changes is sent whole; changes that do not
    /// fit are refused, not guessed at.
    #[test]
    fn what_does_not_fit_is_not_guessed() {
        let base = sample();
        let mut other_room = base.clone();
        other_room[0].room = RoomId(8);
        assert_eq!(changes(&base, &other_room), None, "another room");
        let mut zero = base.clone();
        zero[0].waiting = vec![(Minute(4), 0)];
        assert_eq!(changes(&base, &zero), None, "a zero count cannot be said");
        let mut unsorted = base.clone();
        unsorted[0].expiries.reverse();
        assert_eq!(changes(&base, &unsorted), None, "out of order");
        let twice = [base.clone(), base.clone()].concat();
        assert_eq!(changes(&twice, &twice), None, "a room twice");

        assert_eq!(apply(&base, &other_room), None, "a room the base lacks");
        let mut out_of_order = sample();
        out_of_order[0].expiries = vec![(ExpirySlot(11), 1), (ExpirySlot(10), 1)];
        assert_eq!(apply(&base, &out_of_order), None, "entries out of order");
    }
}
