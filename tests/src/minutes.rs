//! Waiting for the wall clock's minutes: buckets and per-minute limits are
//! wall-clock minutes, so tests that count within one minute line up with them.
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds since the epoch.
pub fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Seconds since the epoch, with their fraction (to compare with the
/// nodes' `waitroom_gossip_last_state_timestamp_seconds`).
pub fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Sleeps until `secs` seconds into the next minute.
pub fn sleep_into_next_minute(secs: u64) {
    let now = unix_secs();
    let target = (now / 60 + 1) * 60 + secs;
    std::thread::sleep(Duration::from_secs(target - now));
}

/// Makes sure at least `needed` seconds are left in the current minute, so a
/// minute boundary (which resets new-users-per-minute) cannot fall inside a
/// test's counting.
pub fn early_in_a_minute(needed: u64) {
    if 60 - unix_secs() % 60 < needed {
        sleep_into_next_minute(1);
    }
}

/// Sleeps until the next time the clock reads `secs` seconds into a minute
/// (`secs` < 60): at most a minute.
pub fn sleep_until_second(secs: u64) {
    let now = unix_secs();
    let this = now / 60 * 60 + secs;
    let target = if this > now { this } else { this + 60 };
    std::thread::sleep(Duration::from_secs(target - now));
}
