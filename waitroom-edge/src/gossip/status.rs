//! The gossip client's health, as atomics the admin listener encodes.
use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed},
    },
};

use waitroom_runtime::clock::Elapsed;

use super::{home::Homes, world::WorldView};
use waitroom_runtime::metrics::Families;

/// Updated by the gossip task, read by `/metrics` and `/status`.
#[derive(Debug)]
pub struct GossipStatus {
    /// The connection to the home aggregator is up and has answered.
    pub connected: AtomicBool,
    /// The aggregators and which is the home.
    pub homes: Arc<Homes>,
    /// Per aggregator: reports it answered (as home or as a peer).
    pub answered_by: Vec<AtomicU64>,
    /// Reports answered by the aggregator.
    pub reports_total: AtomicU64,
    /// Failed connects, failed or refused exchanges, timeouts.
    pub errors_total: AtomicU64,
    /// Connections established (the first and every reconnect).
    pub connects_total: AtomicU64,
    /// The version of the aggregator's room settings the node runs, as each
    /// report says; 0 while it runs its own file's.
    pub settings_version: AtomicU64,
    /// How far the cluster's time (the home aggregator's) is ahead of this
    /// machine's own wall clock, in ms, as of the last answer that moved
    /// the node's time.
    pub clock_offset_ms: AtomicI64,
}

impl GossipStatus {
    #[must_use]
    pub fn new(homes: Arc<Homes>) -> Self {
        Self {
            connected: AtomicBool::new(false),
            answered_by: homes
                .addresses()
                .iter()
                .map(|_| AtomicU64::new(0))
                .collect(),
            homes,
            reports_total: AtomicU64::new(0),
            errors_total: AtomicU64::new(0),
            clock_offset_ms: AtomicI64::new(0),
            connects_total: AtomicU64::new(0),
            settings_version: AtomicU64::new(0),
        }
    }

    /// The `waitroom_gossip_*` families.
    pub fn encode(&self, f: &mut Families<'_>, world: &WorldView, now: Elapsed) -> fmt::Result {
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
            "waitroom_clock_offset_seconds",
            "How far the cluster's time (the home aggregator's clock, which the node counts minutes and sessions on) is ahead of this machine's own clock.",
            self.clock_offset_ms.load(Relaxed) as f64 / 1e3,
        )?;
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
        )?;
        let homes = &self.homes;
        let names: Vec<String> = homes.addresses().iter().map(ToString::to_string).collect();
        let labels = |i: usize| [("aggregator", names[i].as_str())];
        f.gauges(
            "waitroom_gossip_home",
            "1 for the aggregator this node takes its grants from (its home), 0 for the others it reports to.",
            (0..names.len()).map(|i| (labels(i), i64::from(homes.current() == i))),
        )?;
        f.gauges(
            "waitroom_gossip_aggregator_answering",
            "1 while the aggregator answered within an interval and a half.",
            (0..names.len()).map(|i| (labels(i), i64::from(homes.answering(i, now)))),
        )?;
        f.counters(
            "waitroom_gossip_aggregator_answers_total",
            "Reports answered, per aggregator (as the home or as a peer).",
            (0..names.len()).map(|i| (labels(i), self.answered_by[i].load(Relaxed))),
        )
    }
}
