//! Time as the engine sees it: values passed in, never read from a clock.
//!
//! The engine is deterministic so that the edge, the aggregator and the
//! simulator can drive the same code; the caller owns the clock and hands
//! [`UnixMillis`] in. Everything the algorithm counts is counted per unix
//! minute ([`Minute`]): queue buckets, session expiries, admits, traffic.

use core::fmt;

use serde::{Deserialize, Serialize};

/// Milliseconds since the unix epoch, as read by the caller's clock.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct UnixMillis(pub u64);

/// A unix minute: milliseconds since the epoch divided by 60,000.
///
/// Queue buckets are arrival minutes, so comparing two `Minute`s compares
/// queue positions.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Minute(pub u64);

/// Milliseconds in one minute.
pub const MILLIS_PER_MINUTE: u64 = 60_000;

impl UnixMillis {
    /// The minute this instant falls in (rounded down, as bucket ids are).
    #[must_use]
    pub const fn minute(self) -> Minute {
        Minute(self.0 / MILLIS_PER_MINUTE)
    }

    /// Milliseconds elapsed since the start of this instant's minute.
    #[must_use]
    pub const fn millis_into_minute(self) -> u64 {
        self.0 % MILLIS_PER_MINUTE
    }

    /// This instant moved later by `millis`, saturating at the end of time.
    #[must_use]
    pub const fn plus_millis(self, millis: u64) -> Self {
        Self(self.0.saturating_add(millis))
    }

    /// This instant moved later by whole `minutes`.
    #[must_use]
    pub const fn plus_minutes(self, minutes: u64) -> Self {
        self.plus_millis(minutes.saturating_mul(MILLIS_PER_MINUTE))
    }

    /// This instant moved earlier by whole `seconds`, stopping at the epoch.
    #[must_use]
    pub const fn minus_secs(self, seconds: u64) -> Self {
        Self(self.0.saturating_sub(seconds.saturating_mul(1_000)))
    }

    /// This instant moved later by whole `seconds`.
    #[must_use]
    pub const fn plus_secs(self, seconds: u64) -> Self {
        self.plus_millis(seconds.saturating_mul(1_000))
    }
}

impl Minute {
    /// The first millisecond of this minute.
    #[must_use]
    pub const fn start(self) -> UnixMillis {
        UnixMillis(self.0.saturating_mul(MILLIS_PER_MINUTE))
    }

    /// `n` minutes later.
    #[must_use]
    pub const fn plus(self, n: u64) -> Self {
        Self(self.0.saturating_add(n))
    }

    /// `n` minutes earlier, stopping at the epoch.
    #[must_use]
    pub const fn minus(self, n: u64) -> Self {
        Self(self.0.saturating_sub(n))
    }
}

impl fmt::Display for Minute {
    /// Shows the minute of the day in UTC (`HH:MM`) followed by the raw value,
    /// which is what an operator reading a log line needs to match buckets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let of_day = self.0 % (24 * 60);
        write!(
            f,
            "{:02}:{:02} (minute {})",
            of_day / 60,
            of_day % 60,
            self.0
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Thu, 27 May 2021 00:00:00 GMT, the day of seed 002's examples.
    pub(crate) const MAY_27_2021: u64 = 1_622_073_600_000;

    /// The instant `hh:mm:ss` on 27 May 2021 (UTC).
    pub(crate) fn at(hh: u64, mm: u64, ss: u64) -> UnixMillis {
        UnixMillis(MAY_27_2021 + ((hh * 60 + mm) * 60 + ss) * 1_000)
    }

    #[test]
    fn bucket_is_the_arrival_minute_rounded_down() {
        // Seed 001: "If you arrive at 10:23:45, you will be grouped into a bucket for 10:23:00."
        assert_eq!(at(10, 23, 45).minute(), at(10, 23, 0).minute());
        assert_eq!(at(10, 23, 45).minute().start(), at(10, 23, 0));
        assert_eq!(at(10, 23, 45).millis_into_minute(), 45_000);
        assert_eq!(
            at(10, 23, 0).minute().to_string(),
            format!("10:23 (minute {})", at(10, 23, 0).minute().0)
        );
    }
}
