//! The local-only share: what a node may use on its own when the aggregator
//! is out of reach.
//!
//! Each answer tells a node how much of a room it is using
//! ([`observed_share`]); the node smooths that over answers
//! ([`smooth_share`]) and, once its view of the world goes stale, decides
//! with that part of the room's limits ([`local_only_state`]): the seeds'
//! "data center limit" without fresh news. Pure: the caller passes the
//! counters, the state and `now`.
use crate::{
    aggregate::RoomReport,
    counters::RoomCounters,
    room::{Room, RoomConfig},
    state::{AdmitRate, GlobalState},
    time::UnixMillis,
};

/// Weight of the newest observation in a room's share of the cluster.
const SHARE_ALPHA: f64 = 0.3;

/// Below this many users (active + admitted this minute) in the whole room a
/// share says little; the previous one is kept.
const SHARE_MIN_SAMPLE: u64 = 10;

/// This node's part of the room at the moment of `state`, given its own
/// active users and admits this minute; `None` when the room is too empty for
/// the ratio to mean anything.
#[must_use]
pub fn observed_share(state: &GlobalState, own_active: i64, own_admitted: u64) -> Option<f64> {
    let total = state.active_users + state.admitted_this_minute;
    if total < SHARE_MIN_SAMPLE {
        return None;
    }
    let own = u64::try_from(own_active).unwrap_or(0) + own_admitted;
    Some((own as f64 / total as f64).clamp(0.0, 1.0))
}

/// This node's active users and admits in `at`'s minute, from its own
/// report: the numerator of [`observed_share`] for an answer computed at `at`.
#[must_use]
pub fn own_counts(report: &RoomReport, at: UnixMillis) -> (i64, u64) {
    let minute = at.minute();
    let active = report
        .expiries
        .iter()
        .filter(|&&(s, _)| s >= at.expiry_slot())
        .map(|&(_, n)| n)
        .sum();
    let admitted = report
        .admits
        .iter()
        .filter(|a| a.minute == minute)
        .map(|a| a.admits.total())
        .sum();
    (active, admitted)
}

/// Folds an observation into the smoothed share.
#[must_use]
pub fn smooth_share(previous: Option<f64>, observed: Option<f64>) -> Option<f64> {
    match (previous, observed) {
        (Some(p), Some(o)) => Some(SHARE_ALPHA * o + (1.0 - SHARE_ALPHA) * p),
        (p, o) => o.or(p),
    }
}

/// The local-only state: the node decides alone with its last known share of
/// the room's limits (the seeds' "data center limit" without fresh news).
///
/// With no share known (the node never heard from the aggregator) it takes the
/// whole room, as a single node would; an operator who must never exceed the
/// limits before the first answer sets the room to `queue_all` at start.
#[must_use]
pub fn local_only_state(
    room: &Room,
    counters: &RoomCounters,
    rate: &mut AdmitRate,
    share: Option<f64>,
    now: UnixMillis,
) -> GlobalState {
    let scaled;
    let room = match share {
        Some(share) => {
            let scale = |limit: u64| ((limit as f64 * share).floor() as u64).max(1);
            let config = room.config();
            let total = scale(config.total_active_users);
            let config = RoomConfig {
                total_active_users: total,
                new_users_per_minute: scale(config.new_users_per_minute).min(total),
                ..config.clone()
            };
            scaled = config
                .validate()
                .map(|r| r.with_id(room.id()))
                .unwrap_or_else(|_| room.clone());
            &scaled
        }
        None => room,
    };
    GlobalState::standalone(room, counters, rate, now)
}

/// The local-only `state`, kept within the leases of the node's last answer
/// (`lease`, that answer's state) while it is still that answer's minute.
///
/// The aggregators go on counting those leases as this node's (until it
/// departs) and hand every other slot of the minute to the other nodes, so
/// a share must not add to them. A share is only an estimate, taken from
/// reports that had not all arrived, and can read far above the node's real
/// part (the likeliest cause of one node admitting 20 of a limit of 24 in a
/// CI run of `aggregator_faults.rs` under loss, where a half was its due).
/// From the next minute on (nobody counts the old lease by then) the share
/// alone decides.
#[must_use]
pub fn within_lease(mut state: GlobalState, lease: &GlobalState, now: UnixMillis) -> GlobalState {
    use crate::counters::Pool;
    if lease.minute() != now.minute() || state.minute() != now.minute() {
        return state;
    }
    // In the lease's own minute: its used plus its allowance.
    let cap = |pool| lease.cap(pool, now, false);
    // The local-only state hands out shared slots from its colo-share pool
    // only; what the node took from either shared pool counts against both
    // leases together.
    let shared_left = cap(Pool::ColoShare)
        .saturating_add(cap(Pool::Anywhere))
        .saturating_sub(state.used.colo_share.saturating_add(state.used.anywhere));
    state.allowance.colo_share = state.allowance.colo_share.min(shared_left);
    state.allowance.anywhere = 0;
    let eligible_left = cap(Pool::Eligible).saturating_sub(state.used.eligible);
    state.allowance.eligible = state.allowance.eligible.min(eligible_left);
    state.allowance.uncapped = state
        .allowance
        .uncapped
        .min(cap(Pool::Uncapped).saturating_sub(state.used.uncapped));
    state
}

/// What a node does while it has no share to go by: it never heard from the
/// aggregator since it started and kept none from an earlier run (or the
/// room was too empty for one). Taking the whole room, as a single node
/// would, lets N nodes started during an aggregator outage admit N times
/// the limits, so that is not an option.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ColdStart {
    /// Queue every new visitor until a share is known (the default: the
    /// limits hold whatever the cluster's size; sessions already running
    /// go on).
    #[default]
    QueueAll,
    /// Take `1 / n` of the room's limits, for an operator who knows the
    /// cluster has about `n` nodes (`[aggregator] expected_nodes`).
    ExpectedNodes(core::num::NonZeroU32),
}

/// The state of a node without a share (see [`ColdStart`]).
#[must_use]
pub fn cold_start_state(
    room: &Room,
    counters: &RoomCounters,
    rate: &mut AdmitRate,
    cold: ColdStart,
    now: UnixMillis,
) -> GlobalState {
    match cold {
        ColdStart::ExpectedNodes(n) => {
            local_only_state(room, counters, rate, Some(1.0 / f64::from(n.get())), now)
        }
        ColdStart::QueueAll => {
            // The node's own numbers (for honest wait estimates), and no
            // allowance: new visitors queue, sessions go on.
            let mut state = GlobalState::standalone(room, counters, rate, now);
            state.slots_available = 0;
            state.allowance = crate::counters::PoolCounts::default();
            state
        }
    }
}

#[cfg(test)]
mod tests {
    /// Whether `decide` admits one new visitor with `state`.
    fn admits_a_new_visitor(
        room: &Room,
        state: &GlobalState,
        counters: &RoomCounters,
        now: UnixMillis,
    ) -> bool {
        let ledger = crate::ledger::TicketLedger::forgetful();
        crate::engine::decide(room, state, counters, &ledger, None, now, 7).is_admitted()
    }

    use super::*;

    #[test]
    fn share_needs_a_sample_and_is_smoothed() {
        let mut state = GlobalState::empty(UnixMillis(0));
        state.active_users = 5;
        assert_eq!(observed_share(&state, 5, 0), None);
        state.active_users = 90;
        state.admitted_this_minute = 10;
        assert_eq!(observed_share(&state, 20, 5), Some(0.25));
        assert_eq!(observed_share(&state, -3, 0), Some(0.0));
        assert_eq!(smooth_share(None, Some(0.5)), Some(0.5));
        assert_eq!(smooth_share(Some(0.5), None), Some(0.5));
        let s = smooth_share(Some(0.5), Some(1.0)).unwrap();
        assert!((s - 0.65).abs() < 1e-9);
    }

    #[test]
    fn own_counts_take_live_sessions_and_this_minutes_admits() {
        use crate::{aggregate::MinuteAdmits, counters::PoolCounts, time::Minute};
        let at = UnixMillis(1_622_073_600_000);
        let m = at.minute();
        let admits = |minute: Minute, n: u64| MinuteAdmits {
            minute,
            admits: PoolCounts {
                colo_share: n,
                anywhere: 1,
                ..PoolCounts::default()
            },
        };
        let report = RoomReport {
            room: crate::room::RoomId::from_name("shop"),
            // Ended a second ago, ends this second, ends in two minutes.
            expiries: vec![
                (at.expiry_slot().minus(1), 7),
                (at.expiry_slot(), 3),
                (at.plus_minutes(2).expiry_slot(), 4),
            ],
            admits: vec![admits(m.minus(1), 9), admits(m, 5)],
            waiting: vec![],
            distinct_visitors: vec![],
        };
        assert_eq!(
            own_counts(&report, at),
            (7, 6),
            "expired sessions and last minute's admits left out"
        );
    }

    /// A FIFO room "shop" of 100 users, `per_minute` new ones a minute.
    fn shop(per_minute: u64) -> Room {
        crate::room::tests::config(100, per_minute)
            .validate()
            .unwrap()
            .named("shop")
    }

    /// A node gone stale mid-minute with a share that reads far too high
    /// (0.8 of a limit of 40: 32) admits no more than its lease had left it
    /// (a cap of 12 shared slots, of which it used 10 by then) until the
    /// minute ends; the next minute its share decides alone.
    #[test]
    fn a_stale_node_keeps_within_its_lease_until_the_minute_ends() {
        use crate::counters::{Pool, PoolCounts};
        let room = shop(40);
        let counters = RoomCounters::new_boxed(room.id());
        let answered = UnixMillis(1_622_073_600_000 + 5_000);
        let now = answered.plus_millis(8_000);
        let mut lease = GlobalState::empty(answered);
        lease.used = PoolCounts {
            colo_share: 4,
            anywhere: 4,
            ..PoolCounts::default()
        };
        lease.allowance = PoolCounts {
            colo_share: 2,
            anywhere: 2,
            ..PoolCounts::default()
        };
        for _ in 0..10 {
            assert!(counters.take_ticket(Pool::ColoShare, now.minute(), u64::MAX));
        }
        let mut rate = AdmitRate::default();
        let count = |state: &GlobalState, at: UnixMillis| {
            (0..40)
                .take_while(|_| admits_a_new_visitor(&room, state, &counters, at))
                .count()
        };
        let share = local_only_state(&room, &counters, &mut rate, Some(0.8), now);
        assert_eq!(share.allowance.colo_share, 22, "the share alone: 32 − 10");
        let kept = within_lease(share, &lease, now);
        assert_eq!(count(&kept, now), 2, "12 − 10: what the lease had left");

        let next = UnixMillis(answered.minute().plus(1).start().0 + 1_000);
        let share = local_only_state(&room, &counters, &mut rate, Some(0.8), next);
        let after = within_lease(share.clone(), &lease, next);
        assert_eq!(
            after.allowance, share.allowance,
            "the next minute: the share"
        );
        assert!(count(&after, next) > 12);
    }

    #[test]
    fn local_only_uses_the_share_of_the_limits() {
        let room = shop(40);
        let counters = RoomCounters::new_boxed(room.id());
        let now = UnixMillis(1_622_073_600_000);
        let mut rate = AdmitRate::default();
        let state = local_only_state(&room, &counters, &mut rate, Some(0.25), now);
        assert_eq!(
            state.slots_available, 10,
            "a quarter of 40 new users per minute"
        );
        let alone = local_only_state(&room, &counters, &mut rate, None, now);
        assert_eq!(alone.slots_available, 40);
        let third = cold_start_state(
            &room,
            &counters,
            &mut rate,
            ColdStart::ExpectedNodes(core::num::NonZeroU32::new(4).unwrap()),
            now,
        );
        assert_eq!(
            third.slots_available, 10,
            "a quarter for one of 4 expected nodes"
        );
        let queued = cold_start_state(&room, &counters, &mut rate, ColdStart::QueueAll, now);
        assert_eq!(
            (queued.slots_available, queued.allowance.total()),
            (0, 0),
            "no share, no guess: everyone new waits"
        );
        let tiny = local_only_state(&room, &counters, &mut rate, Some(0.0), now);
        assert_eq!(
            tiny.slots_available, 1,
            "never a limit of zero (the config would be invalid)"
        );
        // Last, since deciding takes tickets from the counters.
        assert!(
            !admits_a_new_visitor(&room, &queued, &counters, now),
            "a new visitor is queued"
        );
        assert!(admits_a_new_visitor(&room, &third, &counters, now));
    }
}
