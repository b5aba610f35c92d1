//! Reported and restored numbers, checked against what a room allows.
//!
//! A node's report is counts from its own shared memory; an aggregator's
//! snapshot is its own earlier state. Either can be wrong: a buggy or
//! compromised node, a corrupted file, a snapshot from before a limit was
//! lowered. Summed unchecked, one absurd number locks a room (sessions that
//! never end) or opens it (negative sessions), and an overflow panics a debug
//! build or wraps in release. So every number is brought into what one node
//! can plausibly hold before it takes part:
//!
//! - an entry for a minute that cannot exist yet (a session ending after
//!   `now + session + slack`, a queue bucket or admits in the future) is
//!   dropped;
//! - a count larger than one node could hold in a capped room (sessions and
//!   admits beyond twice the room's limits plus a margin, which still covers
//!   a limit lowered while visitors were inside) is clamped to that bound;
//! - every other count is clamped to [`MAX_COUNT`], so that the sums of many
//!   nodes cannot overflow (the sums are saturating as well).
//!
//! Each correction is returned as an [`Implausible`] for the caller's log and
//! metrics. The rules are pure: `now` and the room are passed in.
use crate::{
    aggregate::RoomReport,
    room::{QueueingMethod, Room},
    time::{ExpirySlot, Minute, UnixMillis},
};

/// The largest magnitude any single reported count may have.
pub const MAX_COUNT: u64 = 1 << 32;

/// Minutes past `now + session` a session may still end (clock differences
/// between nodes and the aggregator, and a renewal at a minute boundary).
pub const EXPIRY_SLACK_MINUTES: u64 = 2;

/// Added to the doubled limits: small rooms get room for a reload's worth of
/// honest disagreement too.
const LIMIT_MARGIN: u64 = 64;

/// One correction made to a reported or restored number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Implausible {
    /// Which list of the report: `expiries`, `admits`, `waiting`, `distinct_visitors`.
    pub field: &'static str,
    /// The entry's minute (for an expiry: the minute its slot lies in).
    pub minute: Minute,
    /// What was wrong and what was done.
    pub problem: ImplausibleKind,
}

/// What was wrong with an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImplausibleKind {
    /// A minute that cannot be reported at `now`; the entry was dropped.
    FutureMinute,
    /// A count beyond the bound; it was clamped to the bound.
    Clamped { reported: i128, bound: u64 },
}

impl std::fmt::Display for Implausible {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.problem {
            ImplausibleKind::FutureMinute => write!(
                f,
                "{} for minute {} is in the future: dropped",
                self.field, self.minute.0
            ),
            ImplausibleKind::Clamped { reported, bound } => write!(
                f,
                "{} for minute {}: {reported} is beyond ±{bound}: clamped",
                self.field, self.minute.0
            ),
        }
    }
}

/// The largest count of sessions and of admits per minute one node can
/// plausibly hold in `room`.
#[must_use]
pub fn node_bounds(room: &Room) -> (u64, u64) {
    // The widest of the room's own settings and its events' overrides: a
    // session admitted under an event's higher limit outlives the event.
    // (The room's own settings read in place: this runs for every room of
    // every report, and most rooms have no event.)
    let bounds_of = |config: &crate::room::RoomConfig| {
        let bound = |limit: u64| {
            limit
                .saturating_mul(2)
                .saturating_add(LIMIT_MARGIN)
                .min(MAX_COUNT)
        };
        // Everyone is admitted: the limits do not bound the counts.
        (config.queueing_method != QueueingMethod::Passthrough).then(|| {
            (
                bound(config.total_active_users),
                bound(config.new_users_per_minute),
            )
        })
    };
    let mut bounds = (0, 0);
    let events = room
        .events()
        .iter()
        .map(|e| bounds_of(&e.apply(room.config())));
    for config in std::iter::once(bounds_of(room.config())).chain(events) {
        let Some((sessions, admits)) = config else {
            return (MAX_COUNT, MAX_COUNT);
        };
        bounds = (bounds.0.max(sessions), bounds.1.max(admits));
    }
    bounds
}

/// The longest session `room` or one of its events gives, minutes.
fn longest_session(room: &Room) -> u64 {
    room.events()
        .iter()
        .filter_map(|e| e.session_duration)
        .map(u64::from)
        .fold(room.session_minutes(), u64::max)
}

/// What one node's report may say in a room at an instant.
struct Limits {
    /// Entries of a later minute are dropped.
    next: Minute,
    /// Far expiries are reported at the last slot of their minute.
    last_expiry: ExpirySlot,
    sessions: u64,
    admits: u64,
}

impl Limits {
    fn of(room: &Room, now: UnixMillis) -> Self {
        let (sessions, admits) = node_bounds(room);
        Self {
            next: now.minute().plus(1),
            last_expiry: ExpirySlot::end_of_minute(
                now.plus_minutes(longest_session(room) + EXPIRY_SLACK_MINUTES)
                    .minute(),
            ),
            sessions,
            admits,
        }
    }
}

/// `n` within `[-bound, bound]` (as [`clamp_signed`] bounds it).
fn signed_within(n: i64, bound: u64) -> bool {
    n.unsigned_abs() <= bound.min(i64::MAX.unsigned_abs())
}

impl RoomReport {
    /// Brings every number of this report into what one node can hold in
    /// `room` at `now` (see the module docs) and returns what was corrected.
    pub fn make_plausible(&mut self, room: &Room, now: UnixMillis) -> Vec<Implausible> {
        let limits = Limits::of(room, now);
        if self.within(&limits) {
            return Vec::new();
        }
        self.correct(&limits)
    }

    /// Whether nothing needs correcting: one pass that writes nothing,
    /// which is all an honest report costs (most reports, every second).
    fn within(&self, limits: &Limits) -> bool {
        let &Limits {
            next, last_expiry, ..
        } = limits;
        let (sessions, admits) = (limits.sessions, limits.admits);
        self.expiries
            .iter()
            .all(|&(slot, n)| slot <= last_expiry && signed_within(n, sessions))
            && self.admits.iter().all(|a| {
                let c = a.admits;
                a.minute <= next
                    && [c.eligible, c.colo_share, c.anywhere, c.uncapped]
                        .into_iter()
                        .all(|n| n <= admits)
            })
            && self
                .waiting
                .iter()
                .all(|&(m, n)| m <= next && signed_within(n, MAX_COUNT))
            && self
                .distinct_visitors
                .iter()
                .all(|&(m, n)| m <= next && n <= MAX_COUNT)
    }

    /// The corrections, made in place.
    fn correct(&mut self, limits: &Limits) -> Vec<Implausible> {
        let Limits {
            next,
            last_expiry,
            sessions,
            admits,
        } = *limits;
        let mut found = Vec::new();
        let mut drop_future = |field: &'static str, m: Minute, keep: bool| {
            if !keep {
                found.push(Implausible {
                    field,
                    minute: m,
                    problem: ImplausibleKind::FutureMinute,
                });
            }
            keep
        };
        self.expiries
            .retain(|&(slot, _)| drop_future("expiries", slot.minute(), slot <= last_expiry));
        self.admits
            .retain(|a| drop_future("admits", a.minute, a.minute <= next));
        self.waiting
            .retain(|&(m, _)| drop_future("waiting", m, m <= next));
        self.distinct_visitors
            .retain(|&(m, _)| drop_future("distinct_visitors", m, m <= next));

        for (slot, n) in &mut self.expiries {
            clamp_signed(n, sessions, "expiries", slot.minute(), &mut found);
        }
        for a in &mut self.admits {
            let counts = &mut a.admits;
            for n in [
                &mut counts.eligible,
                &mut counts.colo_share,
                &mut counts.anywhere,
                &mut counts.uncapped,
            ] {
                clamp_unsigned(n, admits, "admits", a.minute, &mut found);
            }
        }
        for (m, n) in &mut self.waiting {
            clamp_signed(n, MAX_COUNT, "waiting", *m, &mut found);
        }
        for (m, n) in &mut self.distinct_visitors {
            clamp_unsigned(n, MAX_COUNT, "distinct_visitors", *m, &mut found);
        }
        found
    }
}

fn clamp_signed(
    n: &mut i64,
    bound: u64,
    field: &'static str,
    minute: Minute,
    found: &mut Vec<Implausible>,
) {
    let b = i64::try_from(bound).unwrap_or(i64::MAX);
    let clamped = (*n).clamp(-b, b);
    if clamped != *n {
        found.push(Implausible {
            field,
            minute,
            problem: ImplausibleKind::Clamped {
                reported: i128::from(*n),
                bound,
            },
        });
        *n = clamped;
    }
}

fn clamp_unsigned(
    n: &mut u64,
    bound: u64,
    field: &'static str,
    minute: Minute,
    found: &mut Vec<Implausible>,
) {
    if *n > bound {
        found.push(Implausible {
            field,
            minute,
            problem: ImplausibleKind::Clamped {
                reported: i128::from(*n),
                bound,
            },
        });
        *n = bound;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{aggregate::MinuteAdmits, counters::PoolCounts, room::RoomConfig};

    fn room(method: QueueingMethod) -> Room {
        RoomConfig {
            total_active_users: 100,
            new_users_per_minute: 20,
            session_duration: 5,
            queueing_method: method,
            ..RoomConfig::with_limits(1, 1)
        }
        .validate()
        .unwrap()
        .named("shop")
    }

    const NOW: UnixMillis = UnixMillis(1_622_073_600_000);

    proptest::proptest! {
        /// The first pass that only reads lets through exactly the reports
        /// the corrections would leave alone: whatever a report says, near
        /// every bound and past it (one entry wrong of one kind, or
        /// several), `make_plausible` does what the corrections alone do.
        #[test]
        fn the_read_only_pass_lets_through_only_what_needs_no_correction(
            method in proptest::sample::select(vec![QueueingMethod::Fifo, QueueingMethod::Passthrough]),
            expiries in proptest::collection::vec((-3..12_i64, -3..3_i64, 0..4_u8), 0..5),
            admits in proptest::collection::vec((-2..3_i64, 0..4_usize, -2..3_i64), 0..3),
            waiting in proptest::collection::vec((-2..3_i64, -2..3_i64, proptest::bool::ANY), 0..3),
            visitors in proptest::collection::vec((-2..3_i64, -2..3_i64), 0..3),
        ) {
            use proptest::prelude::*;
            let room = room(method);
            let limits = Limits::of(&room, NOW);
            let m = NOW.minute();
            // Counts at a bound plus a step (−2 ..= 2), minutes about the
            // next one, slots about the last allowed.
            let near = |bound: u64, step: i64| bound.saturating_add_signed(step);
            let minute = |step: i64| {
                if step < 0 {
                    m.plus(1).minus(step.unsigned_abs())
                } else {
                    m.plus(1).plus(step.unsigned_abs())
                }
            };
            let report = RoomReport {
                room: room.id(),
                expiries: expiries
                    .iter()
                    .map(|&(slot, step, kind)| {
                        let at = ExpirySlot(limits.last_expiry.0.saturating_add_signed(slot - 8));
                        let n = i64::try_from(near(limits.sessions, step)).unwrap_or(i64::MAX);
                        (at, match kind { 0 => n, 1 => -n, 2 => i64::MIN, _ => 1 })
                    })
                    .collect(),
                admits: admits
                    .iter()
                    .map(|&(at, pool, step)| {
                        let mut counts = [0_u64; 4];
                        counts[pool] = near(limits.admits, step);
                        MinuteAdmits {
                            minute: minute(at),
                            admits: PoolCounts {
                                eligible: counts[0],
                                colo_share: counts[1],
                                anywhere: counts[2],
                                uncapped: counts[3],
                            },
                        }
                    })
                    .collect(),
                waiting: waiting
                    .iter()
                    .map(|&(at, step, negative)| {
                        let n = i64::try_from(near(MAX_COUNT, step)).unwrap_or(i64::MAX);
                        (minute(at), if negative { -n } else { n })
                    })
                    .collect(),
                distinct_visitors: visitors
                    .iter()
                    .map(|&(at, step)| (minute(at), near(MAX_COUNT, step)))
                    .collect(),
            };
            let mut checked = report.clone();
            let mut corrected = report.clone();
            let found = checked.make_plausible(&room, NOW);
            let expected = corrected.correct(&limits);
            prop_assert_eq!(found.is_empty(), report.within(&limits));
            prop_assert_eq!(found, expected);
            prop_assert_eq!(checked, corrected);
        }
    }

    #[test]
    fn an_honest_report_is_untouched() {
        let m = NOW.minute();
        let s = NOW.expiry_slot();
        let mut report = RoomReport {
            room: room(QueueingMethod::Fifo).id(),
            expiries: vec![
                (s, 3),
                (s.plus(5 * 60 + 59), 40),
                // A far expiry reported at the end of its minute, session + 2 min on.
                (
                    ExpirySlot::end_of_minute(m.plus(5 + EXPIRY_SLACK_MINUTES)),
                    -2,
                ),
            ],
            admits: vec![MinuteAdmits {
                minute: m,
                admits: PoolCounts {
                    eligible: 20,
                    ..PoolCounts::default()
                },
            }],
            waiting: vec![(m.minus(3), 5_000), (m, 12)],
            distinct_visitors: vec![(m, 9_000)],
        };
        let before = report.clone();
        assert!(
            report
                .make_plausible(&room(QueueingMethod::Fifo), NOW)
                .is_empty()
        );
        assert_eq!(report, before);
    }

    #[test]
    fn sessions_that_never_end_and_overflowing_counts_are_refused() {
        let m = NOW.minute();
        let s = NOW.expiry_slot();
        let mut report = RoomReport {
            room: room(QueueingMethod::Fifo).id(),
            expiries: vec![
                (s.plus(10_000 * 60), 1),
                (s.plus(60), i64::MAX),
                (s.plus(120), i64::MIN),
            ],
            admits: vec![
                MinuteAdmits {
                    minute: m,
                    admits: PoolCounts {
                        anywhere: u64::MAX,
                        ..PoolCounts::default()
                    },
                },
                MinuteAdmits {
                    minute: m.plus(30),
                    admits: PoolCounts::default(),
                },
            ],
            waiting: vec![(m.plus(9), 1), (m, i64::MAX)],
            distinct_visitors: vec![(m, u64::MAX)],
        };
        let found = report.make_plausible(&room(QueueingMethod::Fifo), NOW);
        assert_eq!(found.len(), 8, "{found:#?}");
        assert_eq!(
            report.expiries,
            vec![(s.plus(60), 264), (s.plus(120), -264)]
        );
        assert_eq!(report.admits.len(), 1);
        assert_eq!(report.admits[0].admits.anywhere, 104);
        assert_eq!(report.waiting, vec![(m, MAX_COUNT as i64)]);
        assert_eq!(report.distinct_visitors, vec![(m, MAX_COUNT)]);
        assert!(found[0].to_string().contains("in the future: dropped"));
    }

    #[test]
    fn passthrough_rooms_are_bounded_only_by_max_count() {
        let mut report = RoomReport {
            room: room(QueueingMethod::Passthrough).id(),
            expiries: vec![(NOW.expiry_slot().plus(60), 1_000_000)],
            ..RoomReport::default()
        };
        assert!(
            report
                .make_plausible(&room(QueueingMethod::Passthrough), NOW)
                .is_empty()
        );
    }

    /// Attacker's expiry slots: one second past the last slot a session may
    /// end in, the end of time, and a flood of tiny entries in one slot each.
    /// The far ones are dropped and counted; those in range are clamped one
    /// by one (their sum stays what `node_bounds` allows per entry).
    #[test]
    fn absurd_expiry_slots_are_dropped_or_clamped() {
        let room = room(QueueingMethod::Fifo);
        let last = ExpirySlot::end_of_minute(NOW.plus_minutes(5 + EXPIRY_SLACK_MINUTES).minute());
        let mut report = RoomReport {
            room: room.id(),
            expiries: vec![
                (last, 1),
                (last.plus(1), 1),
                (ExpirySlot(u64::MAX), i64::MAX),
                (NOW.expiry_slot(), -i64::MAX),
            ],
            ..RoomReport::default()
        };
        let found = report.make_plausible(&room, NOW);
        assert_eq!(report.expiries, vec![(last, 1), (NOW.expiry_slot(), -264)]);
        let kinds: Vec<_> = found.iter().map(|f| f.problem).collect();
        assert_eq!(
            kinds,
            vec![
                ImplausibleKind::FutureMinute,
                ImplausibleKind::FutureMinute,
                ImplausibleKind::Clamped {
                    reported: -i128::from(i64::MAX),
                    bound: 264
                }
            ]
        );
        assert_eq!(found[0].minute, last.plus(1).minute());
        // A slot in the past is harmless: totals never count it.
        let past = RoomReport {
            room: room.id(),
            expiries: vec![(NOW.expiry_slot().minus(1), 264)],
            ..RoomReport::default()
        };
        assert_eq!(crate::aggregate::totals([&past], NOW).active_users, 0);
    }
}
