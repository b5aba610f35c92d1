//! The gossip client's health, as atomics the admin listener renders.
use std::{
    fmt::Write as _,
    sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
};

use waitroom_common::time::UnixMillis;

use super::world::WorldView;
use waitroom_runtime::admin::family;

/// Updated by the gossip task, read by `/metrics` and `/status`.
#[derive(Debug, Default)]
pub struct GossipStatus {
    /// A connection is up and has answered at least one report.
    pub connected: AtomicBool,
    /// Reports answered by the aggregator.
    pub reports_total: AtomicU64,
    /// Failed connects, failed or refused exchanges, timeouts.
    pub errors_total: AtomicU64,
    /// Connections established (the first and every reconnect).
    pub connects_total: AtomicU64,
}

impl GossipStatus {
    /// Appends the `waitroom_gossip_*` families in Prometheus text.
    pub fn render(&self, out: &mut String, world: &WorldView, now: UnixMillis) {
        let freshness = world.freshness(now);
        family(
            out,
            "waitroom_gossip_connected",
            "gauge",
            "1 while a connection to the aggregator is up and answering.",
        );
        let _ = writeln!(
            out,
            "waitroom_gossip_connected {}",
            u8::from(self.connected.load(Relaxed))
        );
        family(
            out,
            "waitroom_gossip_state_age_seconds",
            "gauge",
            "Age of the last global state received (-1: none yet).",
        );
        let age = freshness.age_ms().map_or(-1.0, |ms| ms as f64 / 1e3);
        let _ = writeln!(out, "waitroom_gossip_state_age_seconds {age}");
        family(
            out,
            "waitroom_gossip_stale",
            "gauge",
            "1 when the global state is older than stale_after_ms (or never came): local-only limits apply.",
        );
        let _ = writeln!(
            out,
            "waitroom_gossip_stale {}",
            u8::from(!freshness.is_fresh())
        );
        for (name, help, value) in [
            (
                "waitroom_gossip_reports_total",
                "Reports answered by the aggregator.",
                &self.reports_total,
            ),
            (
                "waitroom_gossip_errors_total",
                "Gossip failures: connects, exchanges, timeouts, refusals.",
                &self.errors_total,
            ),
            (
                "waitroom_gossip_connects_total",
                "Connections established to the aggregator.",
                &self.connects_total,
            ),
        ] {
            family(out, name, "counter", help);
            let _ = writeln!(out, "{name} {}", value.load(Relaxed));
        }
    }
}
