//! The slot plan: who may be admitted this minute, as seeds 001 and 002 define it.
//!
//! Slots this minute = min(total − active, new-per-minute − admitted this
//! minute). In FIFO they are reserved for queue buckets, oldest first; a
//! bucket fully covered may be admitted from any node. What the reservation
//! leaves for the partly covered bucket, or for brand-new visitors once every
//! bucket is covered, is split between colos by their share of traffic two
//! minutes back; what no colo has a history for is the Anywhere pool. Random
//! queueing makes the same reservation (so a switch back to FIFO keeps
//! everyone's place) but lets every visitor compete for all the slots.
//!
//! Everything is integer arithmetic rounded down per colo, with the rounding
//! left over going to Anywhere, so the plan never hands out more than exists.

use serde::{Deserialize, Serialize};

use crate::time::Minute;

/// One queue bucket with the slots reserved for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketSlots {
    /// Arrival minute of the visitors in this bucket.
    pub bucket: Minute,
    /// Visitors of this bucket still checking in.
    pub waiting: u64,
    /// Slots reserved for them this minute (≤ `waiting`).
    pub eligible_slots: u64,
}

impl BucketSlots {
    /// Every visitor of the bucket has a slot: admitted from any node.
    #[must_use]
    pub fn fully_covered(&self) -> bool {
        self.eligible_slots >= self.waiting
    }
}

/// What the slots split between colos are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SharedFor {
    /// FIFO: the oldest bucket not fully covered.
    PartialBucket(Minute),
    /// New visitors: every bucket is covered (FIFO), or random queueing, where
    /// everyone counts as new.
    NewVisitors,
    /// Nothing is shared (no slot left after the reservation).
    Nothing,
}

/// A colo's traffic weight (distinct visitors two minutes back).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColoWeight {
    pub colo: String,
    pub weight: u64,
}

/// The slots one colo may hand out from the shared part.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColoSlots {
    pub colo: String,
    pub slots: u64,
}

/// What a plan is computed from.
#[derive(Clone, Copy, Debug)]
pub struct SlotInputs<'a> {
    pub total_active_users: u64,
    pub new_users_per_minute: u64,
    pub active_users: u64,
    pub admitted_this_minute: u64,
    /// Random queueing: every visitor competes for all slots.
    pub random: bool,
    /// Waiting visitors per bucket, oldest first.
    pub waiting: &'a [(Minute, u64)],
    /// Traffic per colo two minutes back.
    pub traffic: &'a [ColoWeight],
    /// Weight of traffic that no colo has a history for (goes to Anywhere).
    pub anywhere_weight: u64,
}

/// The plan for one minute, for the whole room.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotPlan {
    /// min(total − active, new-per-minute − admitted), never negative.
    pub slots_available: u64,
    /// Every bucket with its reservation, oldest first.
    pub buckets: Vec<BucketSlots>,
    /// Slots of fully covered buckets (admitted from any node); 0 in random mode.
    pub fully_eligible: u64,
    /// Oldest bucket not fully covered, if any: FIFO visitors behind it wait.
    pub first_uncovered: Option<Minute>,
    pub shared_for: SharedFor,
    /// Slots split between colos and Anywhere.
    pub shared_slots: u64,
    /// Each colo's part of `shared_slots`, rounded down.
    pub colos: Vec<ColoSlots>,
    /// The rest of `shared_slots`: colos without history and rounding.
    pub anywhere: u64,
}

/// Slots this minute: min(total − active, new-per-minute − admitted), at least 0.
#[must_use]
pub fn slots_available(
    total: u64,
    new_per_minute: u64,
    active: u64,
    admitted_this_minute: u64,
) -> u64 {
    total
        .saturating_sub(active)
        .min(new_per_minute.saturating_sub(admitted_this_minute))
}

/// `slots × weight / total_weight`, rounded down, without overflow.
#[must_use]
pub fn share_of(slots: u64, weight: u64, total_weight: u64) -> u64 {
    if total_weight == 0 {
        return 0;
    }
    // The same quotient; a 64-bit division when the product fits (the
    // usual case), a 128-bit one (several times slower) only when not.
    if let Some(product) = slots.checked_mul(weight) {
        return product / total_weight;
    }
    u64::try_from(u128::from(slots) * u128::from(weight) / u128::from(total_weight))
        .unwrap_or(u64::MAX)
}

impl SlotPlan {
    #[must_use]
    pub fn new(inputs: SlotInputs<'_>) -> Self {
        let slots_available = slots_available(
            inputs.total_active_users,
            inputs.new_users_per_minute,
            inputs.active_users,
            inputs.admitted_this_minute,
        );

        // FIFO reservation, oldest bucket first, made in every method.
        let mut left = slots_available;
        let buckets: Vec<BucketSlots> = inputs
            .waiting
            .iter()
            .map(|&(bucket, waiting)| {
                let eligible_slots = waiting.min(left);
                left -= eligible_slots;
                BucketSlots {
                    bucket,
                    waiting,
                    eligible_slots,
                }
            })
            .collect();
        let first_uncovered = buckets.iter().find(|b| !b.fully_covered());

        let (fully_eligible, shared_for, shared_slots) = if inputs.random {
            (0, SharedFor::NewVisitors, slots_available)
        } else {
            let fully: u64 = buckets
                .iter()
                .filter(|b| b.fully_covered())
                .map(|b| b.eligible_slots)
                .sum();
            match first_uncovered {
                Some(partial) if partial.eligible_slots > 0 => (
                    fully,
                    SharedFor::PartialBucket(partial.bucket),
                    partial.eligible_slots,
                ),
                Some(_) => (fully, SharedFor::Nothing, 0),
                None => (fully, SharedFor::NewVisitors, left),
            }
        };
        let shared_for = if shared_slots == 0 {
            SharedFor::Nothing
        } else {
            shared_for
        };

        let total_weight =
            inputs.traffic.iter().map(|c| c.weight).sum::<u64>() + inputs.anywhere_weight;
        let colos: Vec<ColoSlots> = inputs
            .traffic
            .iter()
            .map(|c| ColoSlots {
                colo: c.colo.clone(),
                slots: share_of(shared_slots, c.weight, total_weight),
            })
            .collect();
        let anywhere = shared_slots - colos.iter().map(|c| c.slots).sum::<u64>();

        Self {
            slots_available,
            first_uncovered: first_uncovered.map(|b| b.bucket),
            buckets,
            fully_eligible,
            shared_for,
            shared_slots,
            colos,
            anywhere,
        }
    }

    /// Slots of `colo`'s part (0 for a colo without history).
    #[must_use]
    pub fn colo_slots(&self, colo: &str) -> u64 {
        self.colos
            .iter()
            .find(|c| c.colo == colo)
            .map_or(0, |c| c.slots)
    }

    /// Everything the plan hands out: never more than `slots_available`.
    #[must_use]
    pub fn handed_out(&self) -> u64 {
        self.fully_eligible + self.colos.iter().map(|c| c.slots).sum::<u64>() + self.anywhere
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::time::tests::at;

    pub(crate) fn weights(pairs: &[(&str, u64)]) -> Vec<ColoWeight> {
        pairs
            .iter()
            .map(|&(colo, weight)| ColoWeight {
                colo: colo.to_owned(),
                weight,
            })
            .collect()
    }

    fn fifo<'a>(
        total: u64,
        per_minute: u64,
        active: u64,
        waiting: &'a [(Minute, u64)],
        traffic: &'a [ColoWeight],
    ) -> SlotInputs<'a> {
        SlotInputs {
            total_active_users: total,
            new_users_per_minute: per_minute,
            active_users: active,
            admitted_this_minute: 0,
            random: false,
            waiting,
            traffic,
            anywhere_weight: 0,
        }
    }

    fn minute(hh: u64, mm: u64) -> Minute {
        at(hh, mm, 0).minute()
    }

    /// Seed 002: 201 active of 200 → −1 slots: nobody goes in.
    #[test]
    fn seed_201_active_of_200_no_slots() {
        let waiting = [
            (minute(15, 54), 2),
            (minute(15, 55), 50),
            (minute(15, 56), 60),
        ];
        let plan = SlotPlan::new(fifo(200, 200, 201, &waiting, &[]));
        assert_eq!(plan.slots_available, 0);
        assert!(plan.buckets.iter().all(|b| b.eligible_slots == 0));
        assert_eq!(plan.first_uncovered, Some(minute(15, 54)));
        assert_eq!(plan.shared_for, SharedFor::Nothing);
    }

    /// Seed 002: 200 − 148 = 52 slots → 2 + 50 eligible, 0 for 15:56.
    #[test]
    fn seed_200_minus_148_gives_52_slots_2_plus_50_eligible() {
        let waiting = [
            (minute(15, 54), 2),
            (minute(15, 55), 50),
            (minute(15, 56), 60),
        ];
        let plan = SlotPlan::new(fifo(200, 200, 148, &waiting, &[]));
        assert_eq!(plan.slots_available, 52);
        let eligible: Vec<u64> = plan.buckets.iter().map(|b| b.eligible_slots).collect();
        assert_eq!(eligible, [2, 50, 0]);
        assert_eq!(plan.fully_eligible, 52);
        assert_eq!(plan.first_uncovered, Some(minute(15, 56)));
        assert_eq!(plan.shared_for, SharedFor::Nothing);
    }

    /// Seed 002: 20 eligible slots of a partly covered bucket split 0.25 / 0.75 → 5 / 15.
    #[test]
    fn seed_partial_bucket_20_slots_split_25_75_gives_5_and_15() {
        let waiting = [(minute(15, 56), 60)];
        let traffic = weights(&[("Nairobi", 25), ("Dublin", 75)]);
        let plan = SlotPlan::new(fifo(200, 20, 0, &waiting, &traffic));
        assert_eq!(plan.buckets[0].eligible_slots, 20);
        assert_eq!(plan.shared_for, SharedFor::PartialBucket(minute(15, 56)));
        assert_eq!(
            (
                plan.colo_slots("Nairobi"),
                plan.colo_slots("Dublin"),
                plan.anywhere
            ),
            (5, 15, 0)
        );
    }

    /// Seed 001: 10,000 − 7,000 = 3,000 capped at 2,000; reservations
    /// 500 / 1,000 / 500; the partial 15:56 bucket split 0.6 / 0.4 → 300 / 200.
    #[test]
    fn seed_10000_minus_7000_capped_2000_reserves_500_1000_500() {
        let waiting = [
            (minute(15, 54), 500),
            (minute(15, 55), 1_000),
            (minute(15, 56), 1_000),
        ];
        let traffic = weights(&[("Nairobi", 60), ("Dublin", 40)]);
        let plan = SlotPlan::new(fifo(10_000, 2_000, 7_000, &waiting, &traffic));
        assert_eq!(plan.slots_available, 2_000);
        let eligible: Vec<u64> = plan.buckets.iter().map(|b| b.eligible_slots).collect();
        assert_eq!(eligible, [500, 1_000, 500]);
        assert_eq!(
            plan.fully_eligible, 1_500,
            "15:54 and 15:55 are admitted from any data center"
        );
        assert_eq!(plan.shared_for, SharedFor::PartialBucket(minute(15, 56)));
        assert_eq!(
            (plan.colo_slots("Nairobi"), plan.colo_slots("Dublin")),
            (300, 200)
        );
    }

    /// Seed 001: 200 queued in 15:54, 2,000 slots → 1,800 for new visitors,
    /// 1,080 Nairobi / 720 Dublin.
    #[test]
    fn seed_200_queued_leaves_1800_new_split_1080_720() {
        let waiting = [(minute(15, 54), 200)];
        let traffic = weights(&[("Nairobi", 60), ("Dublin", 40)]);
        let plan = SlotPlan::new(fifo(10_000, 2_000, 7_000, &waiting, &traffic));
        assert_eq!(plan.fully_eligible, 200);
        assert_eq!(plan.first_uncovered, None);
        assert_eq!(
            (plan.shared_for, plan.shared_slots),
            (SharedFor::NewVisitors, 1_800)
        );
        assert_eq!(
            (plan.colo_slots("Nairobi"), plan.colo_slots("Dublin")),
            (1_080, 720)
        );
    }

    /// Seed 001: random queueing gives all 2,000 to "new" visitors: 1,200 / 800.
    #[test]
    fn seed_random_mode_splits_all_2000_as_1200_800() {
        let waiting = [(minute(15, 54), 200)];
        let traffic = weights(&[("Nairobi", 60), ("Dublin", 40)]);
        let plan = SlotPlan::new(SlotInputs {
            random: true,
            ..fifo(10_000, 2_000, 7_000, &waiting, &traffic)
        });
        assert_eq!(plan.fully_eligible, 0);
        assert_eq!(
            plan.buckets[0].eligible_slots, 200,
            "the FIFO reservation is still made, just not used"
        );
        assert_eq!(
            (plan.colo_slots("Nairobi"), plan.colo_slots("Dublin")),
            (1_200, 800)
        );
    }

    /// Seed 000: 150 slots, San Jose 20/200, London 30/200, Anywhere 150/200:
    /// San Jose may send 15, Anywhere holds 113 (112.5 and the rounding).
    #[test]
    fn seed_10_percent_of_150_is_15_and_anywhere_75_percent_is_113() {
        let traffic = weights(&[("San Jose", 20), ("London", 30)]);
        let plan = SlotPlan::new(SlotInputs {
            anywhere_weight: 150,
            ..fifo(200, 200, 50, &[], &traffic)
        });
        assert_eq!(plan.slots_available, 150);
        assert_eq!(plan.colo_slots("San Jose"), 15);
        assert_eq!(plan.colo_slots("London"), 22);
        assert_eq!(plan.anywhere, 113);
        assert_eq!(plan.handed_out(), 150);
        assert_eq!(
            plan.colo_slots("Delhi"),
            0,
            "no history: Delhi uses Anywhere slots"
        );
    }

    /// Seed 002: 1,000 slots split by the traffic two minutes back, 0.5/0.5 then 0.45/0.55.
    #[test]
    fn seed_1000_slots_split_500_500_then_450_550() {
        let half = weights(&[("Nairobi", 50), ("Dublin", 50)]);
        let plan = SlotPlan::new(fifo(10_000, 1_000, 0, &[], &half));
        assert_eq!(
            (plan.colo_slots("Nairobi"), plan.colo_slots("Dublin")),
            (500, 500)
        );
        let later = weights(&[("Nairobi", 45), ("Dublin", 55)]);
        let plan = SlotPlan::new(fifo(10_000, 1_000, 0, &[], &later));
        assert_eq!(
            (plan.colo_slots("Nairobi"), plan.colo_slots("Dublin")),
            (450, 550)
        );
    }

    #[test]
    fn no_traffic_history_puts_everything_in_anywhere() {
        let plan = SlotPlan::new(fifo(100, 10, 0, &[], &[]));
        assert_eq!((plan.shared_slots, plan.anywhere), (10, 10));
    }

    #[test]
    fn admitted_this_minute_counts_against_new_users_per_minute() {
        assert_eq!(slots_available(10_000, 2_000, 7_000, 1_500), 500);
        assert_eq!(slots_available(10_000, 2_000, 9_900, 0), 100);
        assert_eq!(slots_available(10, 10, 11, 0), 0);
        assert_eq!(slots_available(10, 10, 0, 12), 0);
    }

    fn arb_inputs() -> impl Strategy<Value = (u64, u64, u64, u64, bool, Vec<u64>, Vec<u64>, u64)> {
        (
            1..100_000_u64,
            1..100_000_u64,
            0..120_000_u64,
            0..100_000_u64,
            any::<bool>(),
            prop::collection::vec(0..5_000_u64, 0..30),
            prop::collection::vec(0..10_000_u64, 0..12),
            0..10_000_u64,
        )
    }

    proptest! {
        #[test]
        fn slots_handed_out_never_exceed_slots_available(
            (total, per_minute, active, admitted, random, waiting, traffic, anywhere_weight) in arb_inputs()
        ) {
            let waiting: Vec<(Minute, u64)> = waiting.iter().enumerate().map(|(i, &w)| (Minute(i as u64), w)).collect();
            let traffic: Vec<ColoWeight> =
                traffic.iter().enumerate().map(|(i, &w)| ColoWeight { colo: format!("c{i}"), weight: w }).collect();
            let plan = SlotPlan::new(SlotInputs {
                total_active_users: total,
                new_users_per_minute: per_minute,
                active_users: active,
                admitted_this_minute: admitted,
                random,
                waiting: &waiting,
                traffic: &traffic,
                anywhere_weight,
            });
            // In total ...
            prop_assert!(plan.handed_out() <= plan.slots_available);
            prop_assert!(plan.buckets.iter().map(|b| b.eligible_slots).sum::<u64>() <= plan.slots_available);
            // ... and per colo: no colo gets more than its share of the shared slots.
            let total_weight: u64 = traffic.iter().map(|c| c.weight).sum::<u64>() + anywhere_weight;
            for (colo, weight) in plan.colos.iter().zip(&traffic) {
                prop_assert!(colo.slots <= plan.shared_slots);
                prop_assert!(u128::from(colo.slots) * u128::from(total_weight.max(1))
                    <= u128::from(plan.shared_slots) * u128::from(weight.weight));
            }
            if !random {
                prop_assert_eq!(plan.handed_out(), plan.slots_available);
            }
        }

        #[test]
        fn an_older_bucket_is_never_less_eligible_than_a_newer_one(
            available in 0..20_000_u64,
            waiting in prop::collection::vec(0..5_000_u64, 1..30),
        ) {
            let waiting: Vec<(Minute, u64)> = waiting.iter().enumerate().map(|(i, &w)| (Minute(i as u64), w)).collect();
            let plan = SlotPlan::new(fifo(available, available, 0, &waiting, &[]));
            for pair in plan.buckets.windows(2) {
                let (older, newer) = (&pair[0], &pair[1]);
                // Eligibility as a fraction of the bucket: covered buckets come first.
                prop_assert!(u128::from(older.eligible_slots) * u128::from(newer.waiting.max(1))
                    >= u128::from(newer.eligible_slots) * u128::from(older.waiting.max(1))
                    || older.waiting == 0);
                if newer.eligible_slots > 0 {
                    prop_assert!(older.fully_covered(), "a newer bucket only gets slots once older ones are covered");
                }
            }
        }
    }
}
