//! The gossip client's health, as atomics the admin listener encodes.
use std::{
    fmt,
    sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
};

use waitroom_common::time::UnixMillis;

use super::world::WorldView;
use waitroom_runtime::metrics::Families;

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
    /// The version of the aggregator's room settings the node runs, as each
    /// report says; 0 while it runs its own file's.
    pub settings_version: AtomicU64,
}

impl GossipStatus {
    /// The `waitroom_gossip_*` families.
    pub fn encode(&self, f: &mut Families<'_>, world: &WorldView, now: UnixMillis) -> fmt::Result {
        f.gauge(
            "waitroom_gossip_connected",
            "1 while a connection to the aggregator is up and answering.",
            i64::from(self.connected.load(Relaxed)),
        )?;
        if let Some(at) = world.load().received_at {
            f.gauge(
                "waitroom_gossip_last_state_timestamp_seconds",
                "When the last global state from the aggregator arrived (absent before the first).",
                at.0 as f64 / 1e3,
            )?;
        }
        f.gauge(
            "waitroom_gossip_stale",
            "1 when the global state is older than stale_after_ms (or never came): local-only limits apply.",
            i64::from(!world.freshness(now).is_fresh()),
        )?;
        f.counter(
            "waitroom_gossip_reports_total",
            "Reports answered by the aggregator.",
            self.reports_total.load(Relaxed),
        )?;
        f.counter(
            "waitroom_gossip_errors_total",
            "Gossip failures: connects, exchanges, timeouts, refusals.",
            self.errors_total.load(Relaxed),
        )?;
        f.counter(
            "waitroom_gossip_connects_total",
            "Connections established to the aggregator.",
            self.connects_total.load(Relaxed),
        )
    }
}
