//! The global state a node decides with: the world as of the last
//! aggregation, plus this node's caps for the minute.
//!
//! The aggregator sends a fresh `GlobalState` to each node about every second
//! ([`crate::aggregate::aggregate`]); without an aggregator the node builds
//! its own with [`GlobalState::standalone`], being the whole world.
//!
//! Caps are absolute numbers of admits for *this node in the state's minute*:
//! `used` (this node's admits when the state was computed) plus `allowance`
//! (its share of the slots still free then). Each round hands every node a
//! share of what is left, so the sum over nodes converges on the room's slots
//! without ever passing them. When the minute rolls before a new state
//! arrives, only the allowance applies to the fresh per-minute counters.

use serde::{Deserialize, Serialize};

use crate::counters::{Pool, PoolCounts, RoomCounters};
use crate::room::Room;
use crate::slots::{ColoWeight, SharedFor, SlotInputs, SlotPlan};
use crate::time::{MILLIS_PER_MINUTE, Minute, UnixMillis};

/// Weight of the admit count of the last complete minute in the admit rate.
pub const ADMIT_RATE_ALPHA: f64 = 0.3;

/// A queue bucket as seen by a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueBucket {
    pub bucket: Minute,
    pub waiting: u64,
    pub eligible_slots: u64,
    /// Visitors without a slot in this bucket and every older one: the
    /// "visitors ahead" of someone in this bucket (seed 002: 60 for 15:56).
    pub ahead_through: u64,
}

/// Admits per minute as an exponentially weighted moving average over
/// complete minutes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AdmitRate {
    pub per_minute: f64,
    /// Last minute folded into the average.
    pub through: Option<Minute>,
}

impl AdmitRate {
    /// Folds every complete minute up to `now − 1` that is not folded yet,
    /// with `admits_in(minute)` giving its total.
    pub fn fold_until(&mut self, now: Minute, mut admits_in: impl FnMut(Minute) -> u64) {
        let last_complete = now.minus(1);
        if now.0 == 0 || self.through.is_some_and(|t| t >= last_complete) {
            return;
        }
        // After a long silence only the last few minutes are worth folding.
        let first = self
            .through
            .map_or(last_complete, |t| t.plus(1).max(last_complete.minus(8)));
        for minute in first.0..=last_complete.0 {
            let admits = admits_in(Minute(minute)) as f64;
            self.per_minute = match self.through {
                None => admits,
                Some(_) => ADMIT_RATE_ALPHA * admits + (1.0 - ADMIT_RATE_ALPHA) * self.per_minute,
            };
            self.through = Some(Minute(minute));
        }
    }
}

/// What a node knows about the room, as of one aggregation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GlobalState {
    /// When this state was computed (its minute is the caps' minute).
    pub as_of: UnixMillis,
    pub active_users: u64,
    /// Admits in the whole room so far this minute.
    pub admitted_this_minute: u64,
    /// min(total − active, new-per-minute − admitted) when computed.
    pub slots_available: u64,
    /// Queue buckets, oldest first.
    pub buckets: Vec<QueueBucket>,
    pub total_waiting: u64,
    /// FIFO: oldest bucket not fully covered; visitors of newer buckets wait.
    pub first_uncovered: Option<Minute>,
    /// What the colo-share and Anywhere pools are for.
    pub shared_for: SharedFor,
    pub admits_per_minute: f64,
    /// This node's admits per pool in `as_of`'s minute when computed.
    pub used: PoolCounts,
    /// Further admits per pool this node may make in that minute.
    pub allowance: PoolCounts,
}

impl GlobalState {
    /// The state of a room nobody has seen: no slot is known, so nobody is
    /// admitted until the first real state arrives.
    #[must_use]
    pub fn empty(now: UnixMillis) -> Self {
        Self {
            as_of: now,
            active_users: 0,
            admitted_this_minute: 0,
            slots_available: 0,
            buckets: Vec::new(),
            total_waiting: 0,
            first_uncovered: None,
            shared_for: SharedFor::Nothing,
            admits_per_minute: 0.0,
            used: PoolCounts::default(),
            allowance: PoolCounts::default(),
        }
    }

    /// Builds the node's state from a plan and this node's allowances.
    #[must_use]
    pub fn from_plan(
        as_of: UnixMillis,
        active_users: u64,
        admitted_this_minute: u64,
        plan: &SlotPlan,
        admits_per_minute: f64,
        used: PoolCounts,
        allowance: PoolCounts,
    ) -> Self {
        let mut ahead = 0;
        let buckets = plan
            .buckets
            .iter()
            .map(|b| {
                ahead += b.waiting - b.eligible_slots;
                QueueBucket {
                    bucket: b.bucket,
                    waiting: b.waiting,
                    eligible_slots: b.eligible_slots,
                    ahead_through: ahead,
                }
            })
            .collect::<Vec<_>>();
        Self {
            as_of,
            active_users,
            admitted_this_minute,
            slots_available: plan.slots_available,
            total_waiting: plan.buckets.iter().map(|b| b.waiting).sum(),
            buckets,
            first_uncovered: plan.first_uncovered,
            shared_for: plan.shared_for,
            admits_per_minute,
            used,
            allowance,
        }
    }

    /// The node as the whole world (no aggregator): its own counters give
    /// active users, admits and the queue; every shared slot is its colo share.
    #[must_use]
    pub fn standalone(
        room: &Room,
        counters: &RoomCounters,
        rate: &mut AdmitRate,
        now: UnixMillis,
    ) -> Self {
        // The limits in force now (a scheduled event's overrides).
        let room = &room.at(now);
        let minute = now.minute();
        rate.fold_until(minute, |m| counters.admits(m).total());
        let (used, active) = counters.admits_and_active(now);
        let active = u64::try_from(active).unwrap_or(0);
        let waiting: Vec<(Minute, u64)> = counters
            .waiting_buckets(minute)
            .filter_map(|(bucket, n)| {
                u64::try_from(n)
                    .ok()
                    .filter(|&n| n > 0)
                    .map(|n| (bucket, n))
            })
            .collect();
        let me = [ColoWeight {
            colo: String::new(),
            weight: 1,
        }];
        let plan = SlotPlan::new(SlotInputs {
            total_active_users: room.total_active_users(),
            new_users_per_minute: room.new_users_per_minute(),
            active_users: active,
            admitted_this_minute: used.total(),
            random: room.queueing_method() == crate::room::QueueingMethod::Random,
            waiting: &waiting,
            traffic: &me,
            anywhere_weight: 0,
        });
        let allowance = PoolCounts {
            eligible: plan.fully_eligible,
            colo_share: plan.shared_slots,
            anywhere: 0,
            uncapped: 0,
        };
        Self::from_plan(
            now,
            active,
            used.total(),
            &plan,
            rate.per_minute,
            used,
            allowance,
        )
    }

    /// The minute the caps are for.
    #[must_use]
    pub fn minute(&self) -> Minute {
        self.as_of.minute()
    }

    /// Most admits this node may have made from `pool` by `now`.
    ///
    /// With `spread` (random queueing with a queue), the allowance is released
    /// evenly over the rest of the minute rather than all at once, so the
    /// visitors who happen to check in first in a minute do not take every
    /// slot (seed 001: "slots are released randomly").
    #[must_use]
    pub fn cap(&self, pool: Pool, now: UnixMillis, spread: bool) -> u64 {
        let allowance = self.allowance.get(pool);
        let current = now.minute() == self.minute();
        let released = if spread && allowance > 0 {
            let (from, to) = if current {
                (self.as_of.0, self.minute().plus(1).start().0)
            } else {
                (
                    now.minute().start().0,
                    now.minute().start().0 + MILLIS_PER_MINUTE,
                )
            };
            let elapsed = u128::from(now.0.saturating_sub(from));
            let span = u128::from((to - from).max(1));
            let released = (u128::from(allowance) * elapsed).div_ceil(span).max(1);
            u64::try_from(released).unwrap_or(u64::MAX).min(allowance)
        } else {
            allowance
        };
        if current {
            self.used.get(pool) + released
        } else {
            released
        }
    }

    /// Visitors without a slot at or before `bucket` (seed 002's "ahead").
    #[must_use]
    pub fn visitors_ahead(&self, bucket: Minute) -> u64 {
        let through = self.buckets.partition_point(|b| b.bucket <= bucket);
        through
            .checked_sub(1)
            .map_or(0, |i| self.buckets[i].ahead_through)
    }

    /// The bucket after which a FIFO visitor is not yet eligible: the first
    /// uncovered bucket, or one past the newest bucket when all are covered.
    #[must_use]
    pub fn eligible_before(&self) -> Option<Minute> {
        self.first_uncovered
            .or_else(|| self.buckets.last().map(|b| b.bucket.plus(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::room::RoomId;
    use crate::room::tests::config;
    use crate::time::tests::at;

    #[test]
    fn admit_rate_is_an_ewma_of_complete_minutes() {
        let mut rate = AdmitRate::default();
        let m = Minute(1_000);
        rate.fold_until(m, |_| 30);
        assert_eq!((rate.per_minute, rate.through), (30.0, Some(m.minus(1))));
        rate.fold_until(m, |_| 1_000);
        assert_eq!(rate.per_minute, 30.0, "a minute is folded once");
        rate.fold_until(m.plus(1), |_| 130);
        assert!((rate.per_minute - 60.0).abs() < 1e-9);
    }

    #[test]
    fn visitors_ahead_counts_through_the_own_bucket() {
        let plan = SlotPlan::new(SlotInputs {
            total_active_users: 200,
            new_users_per_minute: 200,
            active_users: 148,
            admitted_this_minute: 0,
            random: false,
            waiting: &[(Minute(54), 2), (Minute(55), 50), (Minute(56), 60)],
            traffic: &[],
            anywhere_weight: 0,
        });
        let state = GlobalState::from_plan(
            at(16, 0, 0),
            148,
            0,
            &plan,
            30.0,
            PoolCounts::default(),
            PoolCounts::default(),
        );
        assert_eq!(
            state.visitors_ahead(Minute(56)),
            60,
            "seed 002: 60 ahead of a 15:56 visitor"
        );
        assert_eq!(state.visitors_ahead(Minute(55)), 0);
        assert_eq!(state.visitors_ahead(Minute(53)), 0);
        assert_eq!(state.visitors_ahead(Minute(99)), 60);
        assert_eq!(state.total_waiting, 112);
        assert_eq!(state.eligible_before(), Some(Minute(56)));
    }

    #[test]
    fn caps_add_used_in_the_same_minute_only() {
        let mut state = GlobalState::empty(at(10, 0, 30));
        state.used.colo_share = 7;
        state.allowance.colo_share = 5;
        assert_eq!(state.cap(Pool::ColoShare, at(10, 0, 40), false), 12);
        assert_eq!(
            state.cap(Pool::ColoShare, at(10, 1, 1), false),
            5,
            "new minute: fresh counters"
        );
    }

    #[test]
    fn spread_release_is_even_over_the_rest_of_the_minute() {
        let mut state = GlobalState::empty(at(10, 0, 0));
        state.allowance.colo_share = 60;
        assert_eq!(state.cap(Pool::ColoShare, at(10, 0, 0), true), 1);
        assert_eq!(state.cap(Pool::ColoShare, at(10, 0, 30), true), 30);
        assert_eq!(state.cap(Pool::ColoShare, at(10, 0, 59), true), 59);
        state.as_of = at(10, 0, 30);
        assert_eq!(
            state.cap(Pool::ColoShare, at(10, 0, 45), true),
            30,
            "half of the remaining half minute"
        );
    }

    #[test]
    fn standalone_is_the_node_as_the_whole_world() {
        let room = config(200, 200).validate().unwrap().with_id(RoomId(1));
        let counters = RoomCounters::new_boxed(RoomId(1));
        let now = at(15, 57, 10);
        let m = now.minute();
        for _ in 0..148 {
            counters.start_session(m.plus(3).start().expiry_slot());
        }
        for (bucket, n) in [(at(15, 54, 0), 2), (at(15, 55, 0), 50), (at(15, 56, 0), 60)] {
            for _ in 0..n {
                counters.move_waiting(bucket.minute(), None, Some(m), m);
            }
        }
        let mut rate = AdmitRate::default();
        let state = GlobalState::standalone(&room, &counters, &mut rate, now);
        assert_eq!(state.active_users, 148);
        assert_eq!(state.slots_available, 52);
        assert_eq!(state.allowance.eligible, 52);
        assert_eq!(state.allowance.colo_share, 0);
        assert_eq!(state.first_uncovered, Some(at(15, 56, 0).minute()));
        assert_eq!(state.total_waiting, 112);
    }
}
