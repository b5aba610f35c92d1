//! Time as the engine sees it: values passed in, never read from a clock.
//!
//! The engine is deterministic so that the edge, the aggregator and the
//! simulator can drive the same code; the caller owns the clock and hands
//! [`UnixMillis`] in. What the algorithm counts is counted per unix minute
//! ([`Minute`]): queue buckets, admits, traffic; except session expiries,
//! counted per second ([`ExpirySlot`]) so that room a session frees is
//! seen as free within a second of its end, not at the end of its minute.

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

/// The grain session expiries are counted at: one second.
///
/// A session counts until the end of the slot its end falls in, and lasts
/// exactly as long (`Ticket::session_end` rounds up to the slot's end): the
/// counters count the sessions the node honours, no more. The grain is what
/// a session may outlast `session_duration` by, and how late room a session
/// frees is seen: under the minute grain before, a session could outlast
/// its nominal end by 59 s and hold its room that long; with seconds, one.
/// (Before the session's end was rounded up, sessions ended at the exact
/// millisecond and the counters counted them to the slot's end: in a burst
/// whose sessions end in one second, up to 6 % too many in that second.) The price is the
/// ring of expiry counts, which must cover the longest session
/// ([`crate::room::MAX_SESSION_MINUTES`], a day, plus ten minutes): 87,000
/// slots of 8 bytes, 680 KiB per room of shared memory (docs/BENCHMARKS.md weighs it). Reads
/// scan only the slots between now and the furthest expiry counted, so the
/// cost of a report follows the session length, not the ring.
pub const EXPIRY_SLOT_MILLIS: u64 = 1_000;

/// Expiry slots in one minute.
pub const EXPIRY_SLOTS_PER_MINUTE: u64 = MILLIS_PER_MINUTE / EXPIRY_SLOT_MILLIS;

/// A session-expiry slot: milliseconds since the epoch divided by
/// [`EXPIRY_SLOT_MILLIS`] (unix seconds). A session ending at `t` is counted
/// in `t.expiry_slot()` and counts while the slot's [`end`](Self::end) is
/// after now, that is while `slot >= now.expiry_slot()`.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct ExpirySlot(pub u64);

impl UnixMillis {
    /// The minute this instant falls in (rounded down, as bucket ids are).
    #[must_use]
    pub const fn minute(self) -> Minute {
        Minute(self.0 / MILLIS_PER_MINUTE)
    }

    /// The expiry slot this instant falls in (rounded down).
    #[must_use]
    pub const fn expiry_slot(self) -> ExpirySlot {
        ExpirySlot(self.0 / EXPIRY_SLOT_MILLIS)
    }

    /// The slot a session of `session_minutes` from this instant (the last
    /// check-in, or admission without renewal) is counted in. The session
    /// lasts to that slot's [`end`](ExpirySlot::end) (`Ticket::session_end`):
    /// one rule for both, so the sessions a node counts and honours agree.
    #[must_use]
    pub const fn session_slot(self, session_minutes: u64) -> ExpirySlot {
        self.plus_minutes(session_minutes).expiry_slot()
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

impl ExpirySlot {
    /// The last slot of `minute`: a session counted there counts until the
    /// end of the minute, as a minute-grain expiry did (tickets of format 2).
    #[must_use]
    pub const fn end_of_minute(minute: Minute) -> Self {
        Self(
            minute
                .0
                .saturating_add(1)
                .saturating_mul(EXPIRY_SLOTS_PER_MINUTE)
                .saturating_sub(1),
        )
    }

    /// The first millisecond after this slot: the session counted here has
    /// ended by then.
    #[must_use]
    pub const fn end(self) -> UnixMillis {
        UnixMillis(self.0.saturating_add(1).saturating_mul(EXPIRY_SLOT_MILLIS))
    }

    /// The minute this slot lies in.
    #[must_use]
    pub const fn minute(self) -> Minute {
        Minute(self.0 / EXPIRY_SLOTS_PER_MINUTE)
    }

    /// `n` slots later.
    #[must_use]
    pub const fn plus(self, n: u64) -> Self {
        Self(self.0.saturating_add(n))
    }

    /// `n` slots earlier, stopping at the epoch.
    #[must_use]
    pub const fn minus(self, n: u64) -> Self {
        Self(self.0.saturating_sub(n))
    }
}

/// Writes `n` into the whole of `out` as zero-padded decimal digits (the
/// lowest ones, should `n` have more): times written on every queue page
/// and access-log line, without `fmt`'s padded fields.
pub fn put_digits(out: &mut [u8], mut n: u64) {
    for d in out.iter_mut().rev() {
        *d = b'0' + (n % 10) as u8;
        n /= 10;
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

    #[test]
    fn digits_are_zero_padded_to_the_width() {
        let mut out = [b'x'; 6];
        put_digits(&mut out, 42);
        assert_eq!(&out, b"000042");
        put_digits(&mut out[..2], 7);
        assert_eq!(&out, b"070042");
        put_digits(&mut out, 999_999);
        assert_eq!(&out, b"999999");
        put_digits(&mut out[..0], 5);
        assert_eq!(&out, b"999999");
    }

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

    #[test]
    fn a_session_counts_until_the_end_of_its_slot() {
        let end = at(10, 23, 45).plus_millis(300);
        let slot = end.expiry_slot();
        assert_eq!(slot.end(), at(10, 23, 46));
        assert_eq!(slot.minute(), at(10, 23, 0).minute());
        // Counted while `slot >= now.expiry_slot()`, i.e. while its end is after now.
        assert!(slot >= at(10, 23, 45).plus_millis(999).expiry_slot());
        assert!(slot < at(10, 23, 46).expiry_slot());
        let minute_end = ExpirySlot::end_of_minute(at(10, 23, 0).minute());
        assert_eq!(minute_end.end(), at(10, 24, 0));
        assert_eq!(minute_end.minute(), at(10, 23, 0).minute());
    }
}
