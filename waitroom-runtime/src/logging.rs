//! The `tracing` subscriber both binaries install first.

/// Structured logs on stderr, filtered by `RUST_LOG` (default `info`).
pub fn init() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
}

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Lets a log line through at most once per `every_secs` (of the caller's
/// clock) and counts what it held back, so a flood of refusals (a scanner, a
/// bot sending thousands of requests a second) costs one line per period, and
/// that line says how many were not logged. Lock-free; shared by all workers.
#[derive(Debug)]
pub struct LogGate {
    every_secs: u64,
    /// Seconds of the last line let through, plus one (0: never).
    last: AtomicU64,
    held_back: AtomicU64,
}

impl Default for LogGate {
    /// One line per ten seconds.
    fn default() -> Self {
        Self::new(10)
    }
}

impl LogGate {
    #[must_use]
    pub const fn new(every_secs: u64) -> Self {
        Self {
            every_secs,
            last: AtomicU64::new(0),
            held_back: AtomicU64::new(0),
        }
    }

    /// [`LogGate::pass`] at the wall clock's second: for logs outside any
    /// decision, where no driven clock is at hand.
    pub fn pass_now(&self) -> Option<u64> {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.pass(secs)
    }

    /// `Some(held back since the last line)` when a line may be logged at
    /// `now_secs`, else `None` (and the event is counted as held back).
    pub fn pass(&self, now_secs: u64) -> Option<u64> {
        let last = self.last.load(Relaxed);
        let stamp = now_secs.saturating_add(1);
        if (last == 0 || stamp >= last.saturating_add(self.every_secs))
            && self
                .last
                .compare_exchange(last, stamp, Relaxed, Relaxed)
                .is_ok()
        {
            Some(self.held_back.swap(0, Relaxed))
        } else {
            self.held_back.fetch_add(1, Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_period_and_it_says_how_many_were_held_back() {
        let gate = LogGate::new(10);
        assert_eq!(gate.pass(100), Some(0));
        for s in 100..110 {
            assert_eq!(gate.pass(s), None, "second {s}");
        }
        assert_eq!(gate.pass(110), Some(10));
        assert_eq!(gate.pass(111), None);
        // A clock at zero (a driven clock) still logs the first line.
        assert_eq!(LogGate::new(10).pass(0), Some(0));
    }
}
