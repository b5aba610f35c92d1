//! The one clock of a process. Everything below the request handler and the
//! aggregator's loop gets time passed in (the engine never reads a clock);
//! this is where it is read.
//!
//! A [`Clock`] is either the system clock or a *driven* clock whose time a
//! test sets and advances: a node or an aggregator built with a driven clock
//! crosses minute boundaries, expires sessions and drains its queue when the
//! test says so, without sleeping through real minutes.
//!
//! Two readings: [`Clock::now`], the wall clock every decision counts
//! minutes and sessions by, and [`Clock::elapsed`], a monotonic one for
//! ages (how old the aggregator's last answer is). A wall clock steps
//! (NTP, a resumed VM): measured on it, a step forward would make a fresh
//! answer look a minute old and a step back an old one look fresh. A
//! driven clock moves both with [`ClockDriver::advance`] and only the wall
//! clock with [`ClockDriver::set`], as a step does.
//!
//! A node that gossips counts on the *cluster's* time ([`Clock::following`]):
//! once an answer came, `now` is the aggregator's time of its last answer
//! carried forward on the monotonic clock, so every node counts minutes and
//! sessions on one clock, and a step or a skew of its own wall clock changes
//! nothing (`tests/tests/clock_jump.rs`: a node stepped a minute back made
//! the cluster admit 66, 70 and 63 in three minutes against a limit of 60
//! while it counted on its own wall clock).
use std::{
    sync::{
        Arc, OnceLock,
        atomic::{AtomicI64, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
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

/// Milliseconds of a monotonic clock since an arbitrary start: only
/// differences mean anything, and they never jump.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Elapsed(pub u64);

impl Elapsed {
    /// Milliseconds from `earlier` to `self` (0 if `earlier` is later).
    #[must_use]
    pub fn since(self, earlier: Self) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// Where a process reads the time: the system clock, or one a test drives.
/// Cheap to clone; reading it is one branch and, when driven, one atomic load.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    driven: Option<Arc<Driven>>,
    /// A driven clock's own step of the wall clock, in ms (see
    /// [`ClockDriver::stepped`]).
    step: Option<Arc<AtomicI64>>,
    /// Set for a clock that follows a reference (see [`Clock::following`]).
    follow: Option<Arc<AtomicI64>>,
}

/// The offset of a following clock before its first reference.
const UNSET: i64 = i64::MIN;

/// A driven clock's two readings.
#[derive(Debug)]
struct Driven {
    wall: AtomicU64,
    elapsed: AtomicU64,
}

impl Clock {
    /// The system clock (what production runs on).
    #[must_use]
    pub fn system() -> Self {
        Self {
            driven: None,
            step: None,
            follow: None,
        }
    }

    /// This clock, following a reference clock once [`Clock::follow`] has
    /// told it one reading: `now` is then that reading carried forward on
    /// the monotonic clock. Clones share what they were told.
    #[must_use]
    pub fn following(&self) -> Self {
        Self {
            driven: self.driven.clone(),
            step: self.step.clone(),
            follow: Some(Arc::new(AtomicI64::new(UNSET))),
        }
    }

    /// The reference clock read `reference` some time between `sent` and
    /// `received` (this clock's monotonic readings when the question left
    /// and the answer came): so the reference is at least `reference` at
    /// `received` and at most `reference` at `sent`, as NTP bounds it. The
    /// clock keeps what it follows while that lies within these bounds (a
    /// late answer, however late, moves nothing) and otherwise moves to the
    /// nearer bound: forward to the earliest the reference can be, back to
    /// the latest (the reference went back). Returns the step taken, in ms
    /// (positive: forward), if any. Does nothing on a clock that does not
    /// follow.
    pub fn follow(&self, reference: UnixMillis, sent: Elapsed, received: Elapsed) -> Option<i64> {
        let cell = self.follow.as_ref()?;
        let at = |e: Elapsed| {
            i64::try_from(reference.0)
                .unwrap_or(i64::MAX)
                .saturating_sub(i64::try_from(e.0).unwrap_or(i64::MAX))
        };
        // Offsets (reference − monotonic) the reading allows.
        let (lowest, highest) = (at(received), at(sent.min(received)));
        let current = cell.load(Ordering::Acquire);
        let (from, to) = if current == UNSET {
            (self.wall_offset(received), lowest)
        } else if current < lowest {
            (current, lowest)
        } else if current > highest {
            (current, highest)
        } else {
            return None;
        };
        cell.store(to, Ordering::Release);
        Some(to.saturating_sub(from))
    }

    /// What `now` is ahead of this process's own wall clock, in ms: the
    /// skew of this machine's clock against the reference (0 before one).
    #[must_use]
    pub fn offset_from_wall(&self) -> i64 {
        let now = i64::try_from(self.now().0).unwrap_or(i64::MAX);
        now.saturating_sub(i64::try_from(self.wall().0).unwrap_or(i64::MAX))
    }

    /// How far the wall clock is ahead of the monotonic reading, in ms:
    /// steady while time passes, moved by a step of the wall clock (by the
    /// step), so two readings tell whether and how far it stepped.
    #[must_use]
    pub fn wall_over_elapsed(&self) -> i64 {
        self.wall_offset(self.elapsed())
    }

    /// The wall clock's offset from the monotonic one at `at`.
    fn wall_offset(&self, at: Elapsed) -> i64 {
        i64::try_from(self.wall().0)
            .unwrap_or(i64::MAX)
            .saturating_sub(i64::try_from(at.0).unwrap_or(i64::MAX))
    }

    /// A clock that stands at `start` until its [`ClockDriver`] moves it.
    #[must_use]
    pub fn driven(start: UnixMillis) -> (Self, ClockDriver) {
        let at = Arc::new(Driven {
            wall: AtomicU64::new(start.0),
            elapsed: AtomicU64::new(0),
        });
        (
            Self {
                driven: Some(Arc::clone(&at)),
                step: None,
                follow: None,
            },
            ClockDriver { at },
        )
    }

    /// The time now: the reference's carried forward for a clock that
    /// follows one and was told, else the wall clock.
    #[inline]
    #[must_use]
    pub fn now(&self) -> UnixMillis {
        if let Some(cell) = &self.follow {
            let offset = cell.load(Ordering::Acquire);
            if offset != UNSET {
                let elapsed = i64::try_from(self.elapsed().0).unwrap_or(i64::MAX);
                return UnixMillis(u64::try_from(elapsed.saturating_add(offset)).unwrap_or(0));
            }
        }
        self.wall()
    }

    /// This process's own wall clock, whatever it follows.
    #[inline]
    #[must_use]
    pub fn wall(&self) -> UnixMillis {
        match &self.driven {
            None => now(),
            Some(at) => {
                let wall = at.wall.load(Ordering::Acquire);
                match &self.step {
                    None => UnixMillis(wall),
                    Some(step) => {
                        UnixMillis(wall.saturating_add_signed(step.load(Ordering::Acquire)))
                    }
                }
            }
        }
    }

    /// The monotonic reading: for ages, never for minutes.
    #[inline]
    #[must_use]
    pub fn elapsed(&self) -> Elapsed {
        static START: OnceLock<Instant> = OnceLock::new();
        match &self.driven {
            None => Elapsed(
                u64::try_from(START.get_or_init(Instant::now).elapsed().as_millis())
                    .unwrap_or(u64::MAX),
            ),
            Some(at) => Elapsed(at.elapsed.load(Ordering::Acquire)),
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
    at: Arc<Driven>,
}

impl ClockDriver {
    /// Moves the clock forward by `by` (both readings: time passes) and
    /// returns the new time.
    pub fn advance(&self, by: Duration) -> UnixMillis {
        let by = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.at.elapsed.fetch_add(by, Ordering::AcqRel);
        UnixMillis(
            self.at
                .wall
                .fetch_add(by, Ordering::AcqRel)
                .saturating_add(by),
        )
    }

    /// Sets the wall clock to `to` (backwards too): a clock step, which the
    /// monotonic reading does not see.
    pub fn set(&self, to: UnixMillis) {
        self.at.wall.store(to.0, Ordering::Release);
    }

    /// The time the clock shows.
    #[must_use]
    pub fn now(&self) -> UnixMillis {
        UnixMillis(self.at.wall.load(Ordering::Acquire))
    }

    /// A clock that moves with this one ([`ClockDriver::advance`] moves
    /// both at once) but whose wall clock can be stepped alone, by the
    /// [`Stepper`]: one machine's clock in a cluster that shares the time.
    #[must_use]
    pub fn stepped(&self) -> (Clock, Stepper) {
        let step = Arc::new(AtomicI64::new(0));
        (
            Clock {
                driven: Some(Arc::clone(&self.at)),
                step: Some(Arc::clone(&step)),
                follow: None,
            },
            Stepper { step },
        )
    }
}

/// Steps the wall clock of a [`ClockDriver::stepped`] clock.
#[derive(Debug, Clone)]
pub struct Stepper {
    step: Arc<AtomicI64>,
}

impl Stepper {
    /// Steps the wall clock by `by_ms` (negative: back); the monotonic
    /// reading does not move.
    pub fn step(&self, by_ms: i64) {
        self.step.fetch_add(by_ms, Ordering::AcqRel);
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
        assert_eq!(clock.elapsed(), Elapsed(60_000));
        assert_eq!(clock.wall_over_elapsed(), 1_000);
        driver.set(UnixMillis(5));
        assert_eq!(clock.wall_over_elapsed(), -59_995, "moved by the step");
        assert_eq!(clock.now(), UnixMillis(5));
        assert_eq!(
            clock.elapsed(),
            Elapsed(60_000),
            "a step is not time passing"
        );
        assert!(clock.is_driven());
        let sys = Clock::system();
        assert!(!sys.is_driven());
        assert!(sys.now().0 > 1_600_000_000_000);
        let before = sys.elapsed();
        std::thread::sleep(Duration::from_millis(2));
        assert!(sys.elapsed().since(before) >= 2);
    }

    #[test]
    fn a_following_clock_counts_on_the_reference_and_ignores_its_own_steps() {
        let (own, driver) = Clock::driven(UnixMillis(100_000));
        let clock = own.following();
        assert_eq!(clock.now(), UnixMillis(100_000), "its own until told");
        let e = Elapsed;
        assert_eq!(Clock::system().follow(UnixMillis(1), e(0), e(0)), None);
        // The reference is 5 s ahead; asked at 0, answered at 10 ms.
        driver.advance(Duration::from_millis(10));
        assert_eq!(clock.follow(UnixMillis(104_995), e(0), e(10)), Some(4_985));
        assert_eq!(clock.now(), UnixMillis(104_995), "the earliest it can be");
        assert_eq!(clock.offset_from_wall(), 4_985);
        // Time passes: carried forward. Its own clock steps: nothing.
        driver.advance(Duration::from_secs(1));
        assert_eq!(clock.now(), UnixMillis(105_995));
        driver.set(UnixMillis(42));
        assert_eq!(clock.now(), UnixMillis(105_995));
        assert_eq!(clock.wall(), UnixMillis(42));
        // An answer 900 ms late (sent at 110 ms, read at 1,010): it allows
        // what the clock says, so nothing moves.
        assert_eq!(clock.follow(UnixMillis(105_100), e(110), e(1_010)), None);
        // One that proves the reference later than thought moves it on.
        assert_eq!(
            clock.follow(UnixMillis(106_000), e(1_000), e(1_010)),
            Some(5)
        );
        assert_eq!(clock.now(), UnixMillis(106_000));
        // The reference went back a minute: followed, to the latest it can be.
        assert_eq!(
            clock.follow(UnixMillis(46_000), e(1_000), e(1_010)),
            Some(-59_990)
        );
        assert_eq!(clock.now(), UnixMillis(46_010));
        // Clones share it; the clock it was made from does not follow.
        assert_eq!(clock.clone().now(), UnixMillis(46_010));
        assert_eq!(own.now(), UnixMillis(42));
    }

    #[test]
    fn a_stepped_clock_moves_with_its_driver_and_steps_alone() {
        let (base, driver) = Clock::driven(UnixMillis(60_000));
        let (own, stepper) = driver.stepped();
        driver.advance(Duration::from_secs(1));
        assert_eq!(own.now(), UnixMillis(61_000));
        stepper.step(-60_000);
        assert_eq!(
            (own.now(), base.now()),
            (UnixMillis(1_000), UnixMillis(61_000))
        );
        driver.advance(Duration::from_secs(1));
        assert_eq!(own.now(), UnixMillis(2_000));
        assert_eq!(own.elapsed(), base.elapsed());
    }
}
