//! Merging node reports into the global state (the aggregator's side).
//!
//! Each node sends a [`NodeReport`] about every second; the aggregator keeps
//! the latest one per node and calls [`aggregate`] per room, which answers
//! every node with its own [`GlobalState`]:
//! - sums the counters: active users (session expiries from now on), queue
//!   buckets, admits this minute;
//! - takes the traffic per colo two minutes back (seed 002) and each node's
//!   part of its colo, and plans the slots ([`SlotPlan`]);
//! - gives each node its part of its colo's slots; the Anywhere pool (colos
//!   without history, [`ANYWHERE_RESERVE_PERCENT`], rounding) is leased to
//!   nodes by their traffic this minute, in batches that shrink as the pool
//!   empties, since each round hands out only what is still free;
//! - folds complete minutes into the admit rate (EWMA).
//!
//! Reports carry counts, never decisions, so the aggregator's state can be
//! rebuilt from a few rounds of reports after a restart.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::counters::{PoolCounts, RECENT_MINUTES, RoomCounters};
use crate::room::{QueueingMethod, Room, RoomId};
use crate::slots::{ColoWeight, SlotInputs, SlotPlan, share_of};
use crate::state::{AdmitRate, GlobalState};
use crate::time::{ExpirySlot, Minute, UnixMillis};

/// Share of the shared slots always kept for the Anywhere pool, so a colo
/// that had no traffic two minutes ago is not shut out during a spike.
pub const ANYWHERE_RESERVE_PERCENT: u64 = 10;

/// Admits of one minute on one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MinuteAdmits {
    pub minute: Minute,
    pub admits: PoolCounts,
}

/// One node's counts for one room.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoomReport {
    pub room: RoomId,
    /// Non-zero session-expiry counts per slot, slot ≥ now, earliest first
    /// (signed: see `counters`; far ones per minute, see
    /// [`RoomCounters::expiries_to_report`]).
    pub expiries: Vec<(ExpirySlot, i64)>,
    /// Admits of the current minute and the ones before it still counted.
    pub admits: Vec<MinuteAdmits>,
    /// Non-zero waiting counts per bucket (signed), oldest first.
    pub waiting: Vec<(Minute, i64)>,
    /// Distinct visitors per recent minute (from XDP when it runs, else the
    /// userspace counter).
    pub distinct_visitors: Vec<(Minute, u64)>,
}

impl RoomReport {
    /// How many entries its lists hold together (session-expiry slots,
    /// admits, queue buckets, visitors).
    #[must_use]
    pub fn entries(&self) -> usize {
        self.expiries.len() + self.admits.len() + self.waiting.len() + self.distinct_visitors.len()
    }
}

/// What a node sends the aggregator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReport {
    /// Unique name of the node.
    pub node: String,
    /// The node's colo (data center), the unit traffic shares are kept for.
    pub colo: String,
    /// When the node built the report.
    pub at: UnixMillis,
    pub rooms: Vec<RoomReport>,
}

impl RoomCounters {
    /// This node's counts for the room at `now`, ready to send.
    #[must_use]
    pub fn report(&self, now: UnixMillis) -> RoomReport {
        let minute = now.minute();
        let recent = (0..RECENT_MINUTES as u64).map(|back| minute.minus(back));
        // Admits, sessions, admits again, as in `admits_and_active`: an
        // admission in flight may show as a session without its admit, never
        // the other way, so the aggregate never hands out a slot too many.
        let mut expiries;
        let mut current = self.admits(minute);
        let mut tries = 0;
        loop {
            expiries = self
                .expiries_to_report(now.expiry_slot())
                .collect::<BTreeMap<_, _>>();
            let after = self.admits(minute);
            tries += 1;
            // Still racing after a few tries: report the earlier admits, which
            // only errs towards fewer slots.
            if after == current || tries >= 8 {
                break;
            }
            current = after;
        }
        RoomReport {
            room: self.room().unwrap_or_default(),
            expiries: expiries.into_iter().collect(),
            admits: recent
                .clone()
                .map(|m| MinuteAdmits {
                    minute: m,
                    admits: if m == minute { current } else { self.admits(m) },
                })
                .filter(|a| a.admits != PoolCounts::default())
                .collect(),
            waiting: self.waiting_buckets(minute).collect(),
            // Visitors held for an on-demand lease are not noted yet, but
            // they are visitors of the minute their hold began in
            // (`hold_visitor`; 0 for every other minute).
            distinct_visitors: recent
                .map(|m| {
                    (
                        m,
                        self.distinct_visitors(m)
                            .saturating_add(self.held_visitors(m)),
                    )
                })
                .filter(|&(_, n)| n > 0)
                .collect(),
        }
    }
}

impl RoomReport {
    fn admits_in(&self, minute: Minute) -> PoolCounts {
        self.admits
            .iter()
            .find(|a| a.minute == minute)
            .map(|a| a.admits)
            .unwrap_or_default()
    }

    fn distinct_in(&self, minute: Minute) -> u64 {
        self.distinct_visitors
            .iter()
            .find(|&&(m, _)| m == minute)
            .map_or(0, |&(_, n)| n)
    }
}

/// What the aggregator remembers about a room between rounds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AggregateHistory {
    pub admit_rate: AdmitRate,
}

/// The room-wide sums of a set of reports: what must not depend on how
/// visitors were spread over nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoomTotals {
    pub active_users: u64,
    pub admitted_this_minute: u64,
    /// Waiting per bucket, oldest first, only buckets with someone waiting.
    pub waiting: Vec<(Minute, u64)>,
}

/// Sums the reports of one room at `now`.
#[must_use]
pub fn totals<'a>(
    reports: impl IntoIterator<Item = &'a RoomReport>,
    now: UnixMillis,
) -> RoomTotals {
    let (minute, slot) = (now.minute(), now.expiry_slot());
    let (mut active, mut admitted) = (0_i64, 0_u64);
    let mut waiting: BTreeMap<Minute, i64> = BTreeMap::new();
    for report in reports {
        // Saturating: reports are bounded (`plausible`), but a sum must never
        // panic or wrap whatever it is given.
        active = report
            .expiries
            .iter()
            // A slot counts while its end is after now.
            .filter(|&&(s, _)| s >= slot)
            .fold(active, |sum, &(_, n)| sum.saturating_add(n));
        admitted = admitted.saturating_add(report.admits_in(minute).total());
        for &(bucket, n) in &report.waiting {
            let w = waiting.entry(bucket).or_default();
            *w = w.saturating_add(n);
        }
    }
    RoomTotals {
        active_users: u64::try_from(active).unwrap_or(0),
        admitted_this_minute: admitted,
        waiting: waiting
            .into_iter()
            .filter_map(|(b, n)| u64::try_from(n).ok().filter(|&n| n > 0).map(|n| (b, n)))
            .collect(),
    }
}

/// The global state for every node that reported on `room`, by node name.
#[must_use]
pub fn aggregate(
    room: &Room,
    reports: &[NodeReport],
    history: &mut AggregateHistory,
    now: UnixMillis,
) -> Vec<(String, GlobalState)> {
    // The limits in force now (a scheduled event's overrides).
    let room = &room.at(now);
    let minute = now.minute();
    let nodes: Vec<(&NodeReport, &RoomReport)> = reports
        .iter()
        .filter_map(|node| {
            node.rooms
                .iter()
                .find(|r| r.room == room.id())
                .map(|r| (node, r))
        })
        .collect();

    let sums = totals(nodes.iter().map(|&(_, r)| r), now);
    history.admit_rate.fold_until(minute, |m| {
        nodes.iter().fold(0_u64, |sum, (_, r)| {
            sum.saturating_add(r.admits_in(m).total())
        })
    });

    // Traffic two minutes back: history that cannot change any more.
    let back = minute.minus(2);
    let mut colos: BTreeMap<&str, u64> = BTreeMap::new();
    for (node, report) in &nodes {
        let c = colos.entry(node.colo.as_str()).or_default();
        *c = c.saturating_add(report.distinct_in(back));
    }
    // Weights scaled so that Anywhere's reserve is exactly its percentage.
    let traffic: Vec<ColoWeight> = colos
        .iter()
        .filter(|&(_, &w)| w > 0)
        .map(|(&colo, &visitors)| ColoWeight {
            colo: colo.to_owned(),
            weight: visitors.saturating_mul(100 - ANYWHERE_RESERVE_PERCENT),
        })
        .collect();
    let traffic_total: u64 = colos.values().fold(0, |sum, &v| sum.saturating_add(v));
    let plan = SlotPlan::new(SlotInputs {
        total_active_users: room.total_active_users(),
        new_users_per_minute: room.new_users_per_minute(),
        active_users: sums.active_users,
        admitted_this_minute: sums.admitted_this_minute,
        random: room.queueing_method() == QueueingMethod::Random,
        waiting: &sums.waiting,
        traffic: &traffic,
        anywhere_weight: traffic_total.saturating_mul(ANYWHERE_RESERVE_PERCENT),
    });

    // Each node's part of its colo, by the traffic it saw two minutes back
    // plus what it has seen so far this minute, so a burst at one node of a
    // colo moves the colo's slots towards it within a round (seed 000's
    // uneven workers) while the complete minute keeps the split steady.
    // Between colos the weights stay two minutes back only (complete
    // history, the same in every answer of the minute); within a colo two
    // answers a round apart may split it differently, which the aggregator's
    // ledger of colo-share leases keeps within the colo's slots
    // (`cluster::clamp_colo_share`).
    let mut colo_recent: BTreeMap<&str, u64> = BTreeMap::new();
    for (node, report) in &nodes {
        let c = colo_recent.entry(node.colo.as_str()).or_default();
        *c = c.saturating_add(recent_traffic(report, minute));
    }
    let colo_share: Vec<u64> = nodes
        .iter()
        .map(|(node, report)| {
            let colo = node.colo.as_str();
            let slots = plan.colo_slots(colo);
            share_of(slots, recent_traffic(report, minute), colo_recent[colo])
        })
        .collect();
    let anywhere = plan.shared_slots - colo_share.iter().sum::<u64>();
    let anywhere_lease = lease(
        anywhere,
        nodes.iter().map(|(_, r)| r.distinct_in(minute) + 1),
    );

    nodes
        .iter()
        .zip(colo_share.into_iter().zip(anywhere_lease))
        .map(|((node, report), (colo_share, anywhere))| {
            let allowance = PoolCounts {
                eligible: plan.fully_eligible,
                colo_share,
                anywhere,
                uncapped: 0,
            };
            let state = GlobalState::from_plan(
                now,
                sums.active_users,
                sums.admitted_this_minute,
                &plan,
                history.admit_rate.per_minute,
                report.admits_in(minute),
                allowance,
            );
            (node.node.clone(), state)
        })
        .collect()
}

/// Distinct visitors a node saw two minutes before `minute` and so far in
/// `minute`. (The minute before, incomplete when the minute begins and noisy,
/// measured worse in `cargo xtask simulate`: a 7:1 burst queued 195 early
/// against 136.)
fn recent_traffic(report: &RoomReport, minute: Minute) -> u64 {
    report
        .distinct_in(minute)
        .saturating_add(report.distinct_in(minute.minus(2)))
}

/// Splits `pool` by `weights`: rounded down, then one more to the heaviest
/// until nothing is left. The parts always add up to `pool` (when there is
/// at least one weight).
fn lease(pool: u64, weights: impl Iterator<Item = u64>) -> Vec<u64> {
    let weights: Vec<u64> = weights.collect();
    let total: u64 = weights.iter().sum();
    let mut parts: Vec<u64> = weights.iter().map(|&w| share_of(pool, w, total)).collect();
    let mut left = pool - parts.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by_key(|&i| core::cmp::Reverse(weights[i]));
    for &i in order.iter().cycle().take(order.len()) {
        if left == 0 {
            break;
        }
        parts[i] += 1;
        left -= 1;
    }
    parts
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::counters::Pool;
    use crate::room::tests::config;
    use crate::time::tests::at;

    fn report(node: &str, colo: &str, at: UnixMillis, room: RoomReport) -> NodeReport {
        NodeReport {
            node: node.to_owned(),
            colo: colo.to_owned(),
            at,
            rooms: vec![room],
        }
    }

    fn room200() -> Room {
        config(200, 200).validate().unwrap().with_id(RoomId(1))
    }

    /// Seed 002: Dublin (50 active; 20 at 15:55, 40 at 15:56) and Nairobi
    /// (151 active; 2, 30, 20) sum to 201 active and buckets 2 / 50 / 60.
    #[test]
    fn seed_dublin_and_nairobi_sum_to_201_active_and_2_50_60_waiting() {
        let now = at(16, 0, 0);
        let m = now.minute();
        let b = |mm| at(15, mm, 0).minute();
        let dublin = RoomReport {
            room: RoomId(1),
            expiries: vec![(ExpirySlot::end_of_minute(m.plus(3)), 50)],
            waiting: vec![(b(55), 20), (b(56), 40)],
            ..RoomReport::default()
        };
        let nairobi = RoomReport {
            room: RoomId(1),
            expiries: vec![
                (ExpirySlot::end_of_minute(m.plus(1)), 100),
                (ExpirySlot::end_of_minute(m.plus(4)), 51),
            ],
            waiting: vec![(b(54), 2), (b(55), 30), (b(56), 20)],
            ..RoomReport::default()
        };
        let reports = [
            report("dub-1", "Dublin", now, dublin),
            report("nbo-1", "Nairobi", now, nairobi),
        ];
        let states = aggregate(&room200(), &reports, &mut AggregateHistory::default(), now);
        let state = &states[0].1;
        assert_eq!(state.active_users, 201);
        let waiting: Vec<u64> = state.buckets.iter().map(|b| b.waiting).collect();
        assert_eq!(waiting, [2, 50, 60]);
        assert_eq!(state.slots_available, 0, "200 − 201 = −1: users get queued");
    }

    /// A session whose end passed seconds ago is no longer summed, though
    /// its minute has not ended; one ending this second still is.
    #[test]
    fn totals_count_a_slot_while_its_end_is_after_now() {
        let now = at(16, 0, 30);
        let counters = RoomCounters::new_boxed(RoomId(1));
        counters.start_session(now.minus_secs(3).expiry_slot());
        counters.start_session(now.expiry_slot());
        counters.start_session(now.plus_secs(4).expiry_slot());
        let reported = counters.report(now.minus_secs(5));
        assert_eq!(reported.expiries.len(), 3);
        assert_eq!(totals([&reported], now).active_users, 2);
        assert_eq!(totals([&reported], now.plus_secs(1)).active_users, 1);
        assert_eq!(totals([&reported], now.plus_secs(5)).active_users, 0);
        assert_eq!(
            counters.report(now).expiries,
            vec![(now.expiry_slot(), 1), (now.plus_secs(4).expiry_slot(), 1)]
        );
    }

    /// Seed 002: at 16:33:20 slots split by 16:31's traffic (50/50), at 16:34 by 16:32's (45/55).
    #[test]
    fn seed_traffic_share_two_minutes_back_500_500_then_450_550() {
        let room = config(10_000, 1_000).validate().unwrap().with_id(RoomId(1));
        let traffic = |nairobi, dublin, minute: Minute| {
            [("Nairobi", nairobi), ("Dublin", dublin)].map(|(colo, n)| {
                report(
                    colo,
                    colo,
                    minute.start(),
                    RoomReport {
                        room: RoomId(1),
                        distinct_visitors: vec![(minute, n)],
                        ..RoomReport::default()
                    },
                )
            })
        };
        let mut reports = Vec::new();
        let [n31, d31] = traffic(50, 50, at(16, 31, 0).minute());
        let [n32, d32] = traffic(45, 55, at(16, 32, 0).minute());
        for (a, b) in [(n31, n32), (d31, d32)] {
            let mut merged = a;
            merged.rooms[0]
                .distinct_visitors
                .extend(b.rooms[0].distinct_visitors.clone());
            reports.push(merged);
        }
        let plan_at = |now| {
            let states = aggregate(&room, &reports, &mut AggregateHistory::default(), now);
            states
                .iter()
                .map(|(_, s)| s.allowance.colo_share)
                .collect::<Vec<_>>()
        };
        // 1,000 slots, 10 % of them kept for Anywhere: 900 split 50/50 and 45/55.
        assert_eq!(plan_at(at(16, 33, 20)), [450, 450]);
        assert_eq!(plan_at(at(16, 34, 10)), [405, 495]);
        // The seed's exact numbers, without the Anywhere reserve, are `SlotPlan`'s
        // `seed_1000_slots_split_500_500_then_450_550`.
    }

    #[test]
    fn nodes_of_one_colo_split_it_by_their_traffic_and_anywhere_is_leased() {
        let now = at(12, 0, 30);
        let m = now.minute();
        let node = |name: &str, colo: &str, back: u64, current: u64, used: u64| {
            let admits = vec![MinuteAdmits {
                minute: m,
                admits: PoolCounts {
                    colo_share: used,
                    ..PoolCounts::default()
                },
            }];
            let room = RoomReport {
                room: RoomId(1),
                admits,
                distinct_visitors: vec![(m.minus(2), back), (m, current)],
                ..RoomReport::default()
            };
            report(name, colo, now, room)
        };
        let reports = [
            node("sjc-1", "SJC", 30, 0, 0),
            node("sjc-2", "SJC", 10, 0, 10),
            node("del-1", "DEL", 0, 99, 0),
        ];
        let room = config(1_000, 110).validate().unwrap().with_id(RoomId(1));
        let states = aggregate(&room, &reports, &mut AggregateHistory::default(), now);
        // 110 − 10 admitted = 100 slots; SJC (the only colo with history) gets
        // 90 % of them, split 30:10 between its nodes → 67 / 22.
        let [(_, a), (_, b), (_, c)] = &states[..] else {
            panic!()
        };
        assert_eq!(a.slots_available, 100);
        assert_eq!(
            (
                a.allowance.colo_share,
                b.allowance.colo_share,
                c.allowance.colo_share
            ),
            (67, 22, 0)
        );
        assert_eq!(b.cap(Pool::ColoShare, now, false), 32, "used 10 + 22 more");
        // Anywhere = 100 − 89 = 11, leased by traffic this minute: Delhi (99 visitors now) has it all.
        assert_eq!(
            (
                a.allowance.anywhere,
                b.allowance.anywhere,
                c.allowance.anywhere
            ),
            (0, 0, 11)
        );
    }

    #[test]
    fn lease_parts_add_up() {
        assert_eq!(lease(10, [1, 1, 1].into_iter()), [4, 3, 3]);
        assert_eq!(lease(0, [5].into_iter()), [0]);
        assert!(lease(10, core::iter::empty()).is_empty());
    }

    /// One counting event of a visitor, applied on whichever node the visitor reached.
    #[derive(Clone, Debug)]
    enum Event {
        StartSession { expiry: u64 },
        MoveSession { from: u64, to: u64 },
        JoinQueue { bucket: u64 },
        CheckIn { bucket: u64 },
        LeaveQueue { bucket: u64 },
        Admit,
    }

    fn arb_event() -> impl Strategy<Value = (Event, usize)> {
        let event = prop_oneof![
            (0..20_u64).prop_map(|expiry| Event::StartSession { expiry }),
            (0..20_u64, 0..20_u64).prop_map(|(from, to)| Event::MoveSession { from, to }),
            (0..5_u64).prop_map(|bucket| Event::JoinQueue { bucket }),
            (0..5_u64).prop_map(|bucket| Event::CheckIn { bucket }),
            (0..5_u64).prop_map(|bucket| Event::LeaveQueue { bucket }),
            Just(Event::Admit),
        ];
        (event, 0..4_usize)
    }

    proptest! {
        #[test]
        fn accounting_sums_do_not_depend_on_how_visitors_spread_over_nodes(
            events in prop::collection::vec(arb_event(), 0..200),
        ) {
            let now = at(12, 0, 0).plus_secs(30);
            let m = now.minute();
            // Slots from 5 s in the past to past the fine part of a report (600 s).
            let slot = |k: u64| now.expiry_slot().minus(5).plus(k * 37);
            let apply = |counters: &RoomCounters, event: &Event| match *event {
                Event::StartSession { expiry } => counters.start_session(slot(expiry)),
                Event::MoveSession { from, to } => counters.move_session(slot(from), slot(to)),
                Event::JoinQueue { bucket } => counters.move_waiting(m.minus(bucket), None, Some(m.minus(1)), m),
                Event::CheckIn { bucket } => counters.move_waiting(m.minus(bucket), Some(m.minus(1)), Some(m), m),
                Event::LeaveQueue { bucket } => counters.move_waiting(m.minus(bucket), Some(m), None, m),
                Event::Admit => counters.count_admit(Pool::Uncapped, m),
            };
            let one = RoomCounters::new_boxed(RoomId(1));
            let many: Vec<_> = (0..4).map(|_| RoomCounters::new_boxed(RoomId(1))).collect();
            for (event, node) in &events {
                apply(&one, event);
                apply(&many[*node], event);
            }
            let alone = totals([&one.report(now)], now);
            let reports: Vec<RoomReport> = many.iter().map(|c| c.report(now)).collect();
            let spread = totals(&reports, now);
            prop_assert_eq!(&alone, &spread);
            // And what the aggregator hands out from them is the same too.
            let room = room200();
            let as_nodes = |reports: Vec<RoomReport>| -> Vec<NodeReport> {
                reports.into_iter().enumerate().map(|(i, r)| report(&format!("n{i}"), "X", now, r)).collect()
            };
            let a = aggregate(&room, &as_nodes(vec![one.report(now)]), &mut AggregateHistory::default(), now);
            let b = aggregate(&room, &as_nodes(reports), &mut AggregateHistory::default(), now);
            prop_assert_eq!(&a[0].1.buckets, &b[0].1.buckets);
            prop_assert_eq!(a[0].1.slots_available, b[0].1.slots_available);
        }

        #[test]
        fn node_allowances_never_exceed_slots_available(
            nodes in prop::collection::vec((0..4_usize, 0..500_u64, 0..500_u64, 0..50_u64), 1..10),
            active in 0..2_000_u64,
            waiting in prop::collection::vec(0..300_u64, 0..6),
            random in any::<bool>(),
        ) {
            let now = at(9, 0, 20);
            let m = now.minute();
            let method = if random { QueueingMethod::Random } else { QueueingMethod::Fifo };
            let room = crate::room::RoomConfig { queueing_method: method, ..config(2_000, 500) }
                .validate().unwrap().with_id(RoomId(1));
            let reports: Vec<NodeReport> = nodes.iter().enumerate().map(|(i, &(colo, back, current, used))| {
                let mut room_report = RoomReport {
                    room: RoomId(1),
                    admits: vec![MinuteAdmits { minute: m, admits: PoolCounts { colo_share: used, ..PoolCounts::default() } }],
                    distinct_visitors: vec![(m.minus(2), back), (m, current)],
                    ..RoomReport::default()
                };
                if i == 0 {
                    room_report.expiries = vec![(ExpirySlot::end_of_minute(m.plus(1)), active as i64)];
                    room_report.waiting = waiting.iter().enumerate().map(|(b, &n)| (m.minus(5 - b as u64), n as i64)).collect();
                }
                report(&format!("n{i}"), &format!("c{colo}"), now, room_report)
            }).collect();
            let states = aggregate(&room, &reports, &mut AggregateHistory::default(), now);
            let available = states[0].1.slots_available;
            let shared: u64 = states.iter().map(|(_, s)| s.allowance.colo_share + s.allowance.anywhere).sum();
            let eligible = states[0].1.allowance.eligible;
            prop_assert!(eligible + shared <= available, "{eligible} + {shared} > {available}");
            // Per colo: its nodes' colo shares never pass the colo's part of the shared slots.
            let traffic_total: u64 = nodes.iter().map(|n| n.1).sum();
            let total_weight = traffic_total * 100;
            for colo in 0..4 {
                let in_colo = || states.iter().zip(&nodes).filter(move |(_, n)| n.0 == colo);
                let colo_total: u64 = in_colo().map(|((_, s), _)| s.allowance.colo_share).sum();
                let colo_weight: u64 = in_colo().map(|(_, n)| n.1 * (100 - ANYWHERE_RESERVE_PERCENT)).sum();
                prop_assert!(colo_total <= share_of(shared, colo_weight, total_weight));
            }
        }
    }
}
