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
    /// Per aggregator group (one, unnamed, unless rooms are sharded).
    pub groups: Vec<GroupStatus>,
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

/// One aggregator group's part of [`GossipStatus`].
#[derive(Debug)]
pub struct GroupStatus {
    /// The group's name; empty when rooms are not sharded.
    pub name: String,
    /// The connection to the group's home aggregator is up and has answered.
    pub connected: AtomicBool,
    /// The group's aggregators and which is the home.
    pub homes: Arc<Homes>,
    /// Per aggregator: reports it answered (as home or as a peer).
    pub answered_by: Vec<AtomicU64>,
    /// Per aggregator: answers that said it cannot grant (its ledger
    /// failing or fenced; `Message::Note`).
    pub held_back_by: Vec<AtomicU64>,
}

impl GroupStatus {
    #[must_use]
    pub fn new(name: String, homes: Arc<Homes>) -> Self {
        Self {
            name,
            connected: AtomicBool::new(false),
            answered_by: homes
                .addresses()
                .iter()
                .map(|_| AtomicU64::new(0))
                .collect(),
            held_back_by: homes
                .addresses()
                .iter()
                .map(|_| AtomicU64::new(0))
                .collect(),
            homes,
        }
    }
}

impl GossipStatus {
    #[must_use]
    pub fn new(groups: Vec<GroupStatus>) -> Self {
        Self {
            groups,
            reports_total: AtomicU64::new(0),
            errors_total: AtomicU64::new(0),
            clock_offset_ms: AtomicI64::new(0),
            connects_total: AtomicU64::new(0),
            settings_version: AtomicU64::new(0),
        }
    }

    /// The home of every group is connected and answering.
    #[must_use]
    pub fn connected(&self) -> bool {
        self.groups.iter().all(|g| g.connected.load(Relaxed))
    }

    /// The `waitroom_gossip_*` families.
    pub fn encode(&self, f: &mut Families<'_>, world: &WorldView, now: Elapsed) -> fmt::Result {
        f.gauge(
            "waitroom_gossip_connected",
            "1 while a connection to the aggregator (to each group's home, rooms sharded) is up and answering.",
            i64::from(self.connected()),
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
            "1 when the global state is older than stale_after_ms (or never came): local-only limits apply (rooms sharded: in some group's rooms).",
            i64::from(!world.freshness(now).is_fresh()),
        )?;
        if self.groups.len() > 1 {
            let current = world.load();
            f.gauges(
                "waitroom_gossip_group_stale",
                "1 when the global state of the group's rooms is older than stale_after_ms (or never came): local-only limits apply to them.",
                self.groups.iter().enumerate().map(|(i, g)| {
                    let fresh = world.group_freshness(&current, i, now).is_fresh();
                    ([("group", g.name.as_str())], i64::from(!fresh))
                }),
            )?;
        }
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
        // Every aggregator of every group, each once: (group, index, name).
        let all: Vec<(&GroupStatus, usize, String)> = self
            .groups
            .iter()
            .flat_map(|g| {
                let names = g.homes.addresses().iter().map(ToString::to_string);
                names.enumerate().map(move |(i, name)| (g, i, name))
            })
            .collect();
        let labels = |name: &str| [("aggregator", name.to_owned())];
        f.gauges(
            "waitroom_gossip_home",
            "1 for the aggregator this node takes its grants from (its home; one per group, rooms sharded), 0 for the others it reports to.",
            all.iter()
                .map(|(g, i, name)| (labels(name), i64::from(g.homes.current() == *i))),
        )?;
        f.gauges(
            "waitroom_gossip_aggregator_answering",
            "1 while the aggregator answered within an interval and a half.",
            all.iter()
                .map(|(g, i, name)| (labels(name), i64::from(g.homes.answering(*i, now)))),
        )?;
        f.counters(
            "waitroom_gossip_aggregator_answers_total",
            "Reports answered, per aggregator (as the home or as a peer).",
            all.iter()
                .map(|(g, i, name)| (labels(name), g.answered_by[*i].load(Relaxed))),
        )?;
        f.counters(
            "waitroom_gossip_aggregator_held_back_total",
            "Answers in which the aggregator said it cannot make grants durable (its [ledger] failing or fenced): nothing new granted; the node takes its grants from another aggregator while it says so, if one that can answers.",
            all.iter()
                .map(|(g, i, name)| (labels(name), g.held_back_by[*i].load(Relaxed))),
        )
    }
}
