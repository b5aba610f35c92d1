//! systemd's notify protocol: READY once serving, watchdog keep-alives while
//! the runtime that sends them runs, STOPPING on the way out. Without systemd
//! (`NOTIFY_SOCKET` unset) these do nothing.
use std::time::Duration;

/// Says READY=1 and, when the unit has `WatchdogSec`, spawns keep-alives at
/// half the period on `runtime`. The keep-alives stop when that runtime stops
/// making progress, which is what the watchdog is for.
pub fn ready(runtime: &tokio::runtime::Handle) {
    if let Err(err) = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]) {
        tracing::warn!(%err, "could not notify systemd");
    }
    let mut usec = 0;
    if sd_notify::watchdog_enabled(false, &mut usec) && usec > 0 {
        let every = Duration::from_micros(usec / 2);
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Watchdog]);
            }
        });
    }
}

/// Says STOPPING=1.
pub fn stopping() {
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
}
