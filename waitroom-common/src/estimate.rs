//! Wait estimates shown to queued visitors.
//!
//! FIFO (seed 002): visitors ahead ÷ admits per minute. Random (seed 001):
//! with P = admits per minute ÷ waiting, the chance to be let in within n
//! minutes is p = 1 − (1 − P)ⁿ, so n = log(1 − p) / log(1 − P); the 25th, 50th
//! and 75th percentiles are given. Formatting ("6 minutes 35 s") is the
//! edge's job; this module gives minutes as `f64` and rounded up.

use serde::{Deserialize, Serialize};

/// Beyond this estimate the queue is reported as full (24 hours).
pub const QUEUE_FULL_MINUTES: f64 = 24.0 * 60.0;

/// What a queued visitor is told about their wait.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WaitEstimate {
    /// False while there is no admit rate to divide by (or under `queue_all`).
    pub wait_time_known: bool,
    /// Visitors not yet given a slot at or before this visitor's bucket.
    pub visitors_ahead: u64,
    /// The wait to show: FIFO estimate, or the median in random queueing.
    pub minutes: f64,
    /// Random queueing: 25 % of visitors get in within this many minutes.
    pub p25_minutes: f64,
    /// Random queueing: the median.
    pub p50_minutes: f64,
    /// Random queueing: 75 % get in within this many minutes.
    pub p75_minutes: f64,
    /// The estimate passes 24 hours.
    pub queue_is_full: bool,
}

/// Minutes rounded up, so a visitor is never promised less than the estimate.
#[must_use]
pub fn whole_minutes(minutes: f64) -> u32 {
    if minutes.is_finite() && minutes > 0.0 {
        minutes.ceil().min(f64::from(u32::MAX)) as u32
    } else {
        0
    }
}

/// n = log(1 − p) / log(1 − P): minutes for a `p` chance of having been let
/// in when each minute lets in a fraction `per_minute` of the queue.
#[must_use]
pub fn minutes_for_chance(p: f64, per_minute: f64) -> f64 {
    if per_minute >= 1.0 {
        return 0.0;
    }
    if per_minute <= 0.0 {
        return f64::INFINITY;
    }
    (1.0 - p).ln() / (1.0 - per_minute).ln()
}

impl WaitEstimate {
    /// The wait to show in seconds, when known (what the queue page says).
    #[must_use]
    pub fn known_seconds(&self) -> Option<f64> {
        self.wait_time_known.then_some(self.minutes * 60.0)
    }

    /// Nothing known (no admit rate, or `queue_all`).
    #[must_use]
    pub fn unknown(visitors_ahead: u64) -> Self {
        Self {
            visitors_ahead,
            ..Self::default()
        }
    }

    /// FIFO: visitors ahead ÷ admits per minute.
    #[must_use]
    pub fn fifo(visitors_ahead: u64, admits_per_minute: f64) -> Self {
        if admits_per_minute <= 0.0 {
            return Self::unknown(visitors_ahead);
        }
        let minutes = visitors_ahead as f64 / admits_per_minute;
        Self {
            wait_time_known: true,
            visitors_ahead,
            minutes,
            p25_minutes: minutes,
            p50_minutes: minutes,
            p75_minutes: minutes,
            queue_is_full: minutes > QUEUE_FULL_MINUTES,
        }
    }

    /// Random: quantiles from P = admits per minute ÷ waiting.
    #[must_use]
    pub fn random(waiting: u64, admits_per_minute: f64) -> Self {
        if admits_per_minute <= 0.0 {
            return Self::unknown(waiting);
        }
        let per_minute = admits_per_minute / waiting.max(1) as f64;
        let [p25, p50, p75] = [0.25, 0.5, 0.75].map(|p| minutes_for_chance(p, per_minute));
        Self {
            wait_time_known: true,
            visitors_ahead: waiting,
            minutes: p50,
            p25_minutes: p25,
            p50_minutes: p50,
            p75_minutes: p75,
            queue_is_full: p50 > QUEUE_FULL_MINUTES,
        }
    }

    /// [`Self::minutes`] rounded up.
    #[must_use]
    pub fn whole_minutes(&self) -> u32 {
        whole_minutes(self.minutes)
    }

    /// The three percentiles rounded up.
    #[must_use]
    pub fn whole_percentiles(&self) -> [u32; 3] {
        [self.p25_minutes, self.p50_minutes, self.p75_minutes].map(whole_minutes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seed 002: 60 visitors ahead, 30 let in per minute → 2 minutes.
    #[test]
    fn seed_60_ahead_at_30_per_minute_is_2_minutes() {
        let estimate = WaitEstimate::fifo(60, 30.0);
        assert!(estimate.wait_time_known);
        assert_eq!(estimate.minutes, 2.0);
        assert_eq!(estimate.whole_minutes(), 2);
        assert_eq!(estimate.visitors_ahead, 60);
        assert!(!estimate.queue_is_full);
    }

    /// Seed 001: 10 per minute of 100 waiting → P = 0.1; p = 0.5 → 6.58 minutes.
    #[test]
    fn seed_p_0_1_gives_6_58_minutes_at_p_0_5() {
        let estimate = WaitEstimate::random(100, 10.0);
        assert!(
            (estimate.p50_minutes - 6.579).abs() < 0.001,
            "{}",
            estimate.p50_minutes
        );
        // 6.58 minutes = 6 minutes 35 s.
        let seconds = (estimate.p50_minutes * 60.0).round() as u32;
        assert_eq!((seconds / 60, seconds % 60), (6, 35));
        assert!((estimate.p25_minutes - 2.730).abs() < 0.001);
        assert!((estimate.p75_minutes - 13.158).abs() < 0.001);
        assert_eq!(estimate.whole_percentiles(), [3, 7, 14]);
        assert_eq!(estimate.minutes, estimate.p50_minutes);
    }

    #[test]
    fn no_admit_rate_means_wait_time_unknown() {
        assert!(!WaitEstimate::fifo(60, 0.0).wait_time_known);
        assert!(!WaitEstimate::random(60, 0.0).wait_time_known);
        assert_eq!(WaitEstimate::fifo(60, 0.0).visitors_ahead, 60);
    }

    #[test]
    fn queue_is_full_past_24_hours() {
        assert!(!WaitEstimate::fifo(1_440, 1.0).queue_is_full);
        assert!(WaitEstimate::fifo(1_441, 1.0).queue_is_full);
        assert!(WaitEstimate::random(1_000_000, 1.0).queue_is_full);
    }

    #[test]
    fn everyone_fits_in_a_minute_is_zero_wait() {
        let estimate = WaitEstimate::random(5, 10.0);
        assert_eq!(estimate.whole_percentiles(), [0, 0, 0]);
        assert_eq!(whole_minutes(f64::NAN), 0);
        assert_eq!(whole_minutes(0.2), 1);
    }
}
