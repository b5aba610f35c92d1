//! The one clock of a process. Everything below the request handler and the
//! aggregator's loop gets time passed in (the engine never reads a clock);
//! this is where it is read.
//!
//! A [`Clock`] is either the system clock or a *driven* clock whose time a
//! test sets and advances: a node or an aggregator built with a driven clock
//! crosses minute boundaries, expires sessions and drains its queue when the
//! test says so, without sleeping through real minutes.
use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use waitroom_common::time::UnixMillis;

/// Wall-clock time as the engine counts it.
#[must_use]
pub fn now() -> UnixMillis {
    UnixMillis(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    )
}

/// Where a process reads the time: the system clock, or one a test drives.
/// Cheap to clone; reading it is one branch and, when driven, one atomic load.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    driven: Option<Arc<AtomicU64>>,
}

impl Clock {
    /// The system clock (what production runs on).
    #[must_use]
    pub fn system() -> Self {
        Self { driven: None }
    }

    /// A clock that stands at `start` until its [`ClockDriver`] moves it.
    #[must_use]
    pub fn driven(start: UnixMillis) -> (Self, ClockDriver) {
        let at = Arc::new(AtomicU64::new(start.0));
        (
            Self {
                driven: Some(Arc::clone(&at)),
            },
            ClockDriver { at },
        )
    }

    /// The time now.
    #[inline]
    #[must_use]
    pub fn now(&self) -> UnixMillis {
        match &self.driven {
            None => now(),
            Some(at) => UnixMillis(at.load(Ordering::Acquire)),
        }
    }

    /// True for a driven clock.
    #[must_use]
    pub fn is_driven(&self) -> bool {
        self.driven.is_some()
    }
}

/// The hand that moves a driven [`Clock`] (tests only need it).
#[derive(Debug, Clone)]
pub struct ClockDriver {
    at: Arc<AtomicU64>,
}

impl ClockDriver {
    /// Moves the clock forward by `by` and returns the new time.
    pub fn advance(&self, by: Duration) -> UnixMillis {
        let by = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        UnixMillis(self.at.fetch_add(by, Ordering::AcqRel).saturating_add(by))
    }

    /// Sets the clock to `to` (backwards too: a clock jump).
    pub fn set(&self, to: UnixMillis) {
        self.at.store(to.0, Ordering::Release);
    }

    /// The time the clock shows.
    #[must_use]
    pub fn now(&self) -> UnixMillis {
        UnixMillis(self.at.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_driven_clock_moves_only_when_told() {
        let (clock, driver) = Clock::driven(UnixMillis(1_000));
        assert_eq!(clock.now(), UnixMillis(1_000));
        assert_eq!(driver.advance(Duration::from_secs(60)), UnixMillis(61_000));
        assert_eq!(clock.clone().now(), UnixMillis(61_000));
        driver.set(UnixMillis(5));
        assert_eq!(clock.now(), UnixMillis(5));
        assert!(clock.is_driven());
        let sys = Clock::system();
        assert!(!sys.is_driven());
        assert!(sys.now().0 > 1_600_000_000_000);
    }
}
