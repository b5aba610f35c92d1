//! systemd's notify protocol: READY once serving, watchdog keep-alives while
//! the runtime that sends them runs, STOPPING on the way out. Without systemd
//! (`NOTIFY_SOCKET` unset) these do nothing.
use std::time::{Duration, Instant};

/// `EX_CONFIG` from sysexits.h: the exit status of a binary whose
/// configuration is wrong. Both units have `RestartPreventExitStatus=78`, so
/// systemd does not restart a service into the same bad file over and over.
pub const EX_CONFIG: u8 = 78;

/// Says READY=1 and, when the unit has `WatchdogSec`, spawns keep-alives at
/// half the period on `runtime`. The keep-alives stop when that runtime stops
/// making progress, which is what the watchdog is for.
pub fn ready(runtime: &tokio::runtime::Handle) {
    notify_ready();
    if let Some(mut watchdog) = Watchdog::from_env() {
        let every = watchdog.every;
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                watchdog.send();
            }
        });
    }
}

/// Says READY=1 only: for a process whose keep-alives come from its own
/// work loop (see [`Watchdog`]).
pub fn notify_ready() {
    if let Err(err) = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]) {
        tracing::warn!(%err, "could not notify systemd");
    }
}

/// Says STOPPING=1.
pub fn stopping() {
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
}

/// WATCHDOG=1 keep-alives sent from a loop that does real work, so they stop
/// when that work stops (a stuck lock, a starved runtime), not only when the
/// process dies. [`Watchdog::alive`] may be called as often as the loop
/// turns; it sends at most once per half period.
#[derive(Debug)]
pub struct Watchdog {
    every: Duration,
    last: Option<Instant>,
}

impl Watchdog {
    /// `Some` when systemd asked for keep-alives (`WATCHDOG_USEC` set for
    /// this process), `None` otherwise (tests, a unit without `WatchdogSec`).
    #[must_use]
    pub fn from_env() -> Option<Self> {
        let mut usec = 0;
        (sd_notify::watchdog_enabled(false, &mut usec) && usec > 0).then(|| Self {
            every: Duration::from_micros(usec / 2),
            last: None,
        })
    }

    /// Half the unit's `WatchdogSec`: the longest gap between keep-alives.
    #[must_use]
    pub fn every(&self) -> Duration {
        self.every
    }

    /// Sends WATCHDOG=1 unless one went out less than a quarter of the
    /// unit's period ago (so a loop turning every second still sends one
    /// per second at most, and never leaves a gap near the limit).
    pub fn alive(&mut self) {
        if self
            .last
            .is_some_and(|last| last.elapsed() < self.every / 2)
        {
            return;
        }
        self.send();
    }

    fn send(&mut self) {
        self.last = Some(Instant::now());
        let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Watchdog]);
    }
}
