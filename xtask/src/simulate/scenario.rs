//! The four accuracy scenarios of issue 7 and what each one reports.
//!
//! Every scenario is a room, a traffic pattern made from the seed, and a run
//! of [`Sim`]. Limits are the same in all of them (1,000 active users, 500
//! new users per minute, 5-minute sessions, 20 s refresh) so their rows can
//! be compared; [`Size::Small`] scales limits and traffic down together (and
//! shortens the quiet periods) for the unit tests.
use rand::RngExt as _;
use serde::Serialize;
use waitroom_common::room::{CookieSameSite, CookieSecure, QueueingMethod, RoomConfig};

use super::{
    cluster::{
        Arrival, GossipCounts, LedgerCheck, Run, SharedAudit, Sim, Topology, Until, traffic_rng,
    },
    targets::Targets,
};

/// How long an admitted visitor browses, on average (uniform over ±50 %).
pub const BROWSE_MEAN_MS: u64 = 60_000;

const MINUTE: u64 = 60_000;

/// Full size for `cargo xtask simulate`, small for unit tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    Full,
    #[cfg_attr(not(test), expect(dead_code, reason = "only the unit tests run small"))]
    Small,
}

impl Size {
    /// Traffic and limits are multiplied by this.
    fn scale(self) -> f64 {
        match self {
            Self::Full => 1.0,
            Self::Small => 0.2,
        }
    }

    /// Quiet periods (before a spike) in minutes: long, or just long enough
    /// for the traffic history two minutes back to settle.
    fn quiet_minutes(self, full: u64) -> u64 {
        match self {
            Self::Full => full,
            Self::Small => full.min(4),
        }
    }
}

/// A stretch of arrivals spread uniformly over `[from_ms, to_ms)`.
#[derive(Clone, Debug)]
pub struct Segment {
    pub from_ms: u64,
    pub to_ms: u64,
    pub visitors: u64,
    /// `(node, weight)`: where these visitors arrive.
    pub nodes: Vec<(usize, u64)>,
}

/// Visitors of all `segments`, sorted by arrival time, with their browse times.
pub fn arrivals(seed: u64, segments: &[Segment]) -> Vec<Arrival> {
    let mut rng = traffic_rng(seed);
    let mut all = Vec::new();
    for segment in segments {
        let total_weight: u64 = segment.nodes.iter().map(|&(_, w)| w).sum();
        assert!(total_weight > 0, "a segment needs a node with weight");
        for _ in 0..segment.visitors {
            let at_ms = rng.random_range(segment.from_ms..segment.to_ms);
            let mut pick = rng.random_range(0..total_weight);
            let node = segment
                .nodes
                .iter()
                .find(|&&(_, w)| {
                    let hit = pick < w;
                    pick = pick.saturating_sub(w);
                    hit
                })
                .map_or(0, |&(n, _)| n);
            let browse_ms = rng.random_range(BROWSE_MEAN_MS / 2..=BROWSE_MEAN_MS * 3 / 2);
            all.push(Arrival {
                at_ms,
                node,
                browse_ms,
            });
        }
    }
    all.sort_by_key(|a| (a.at_ms, a.node, a.browse_ms));
    all
}

/// A room with the given limits and queueing method, everything else default.
#[must_use]
pub fn room_config(total: u64, per_minute: u64, session_minutes: u32) -> RoomConfig {
    RoomConfig {
        total_active_users: total,
        new_users_per_minute: per_minute,
        session_duration: session_minutes,
        disable_session_renewal: false,
        queueing_method: QueueingMethod::Fifo,
        queue_all: false,
        refresh_interval: 20,
        cookie_same_site: CookieSameSite::Auto,
        cookie_secure: CookieSecure::Auto,
        ticket_connection_budget: waitroom_common::room::DEFAULT_TICKET_CONNECTION_BUDGET,
        ticket_connection_window_secs: waitroom_common::room::DEFAULT_TICKET_CONNECTION_WINDOW_SECS,
        ticket_binding: waitroom_common::room::TicketBinding::None,
    }
}

/// One scenario, ready to run.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Short name for file names and tests.
    pub key: &'static str,
    /// What the table calls it.
    pub title: &'static str,
    pub room: RoomConfig,
    pub arrivals: Vec<Arrival>,
    pub duration_ms: u64,
}

/// The four scenarios for `topology`, traffic made from `seed`.
#[must_use]
pub fn all(topology: &Topology, seed: u64, size: Size) -> Vec<Scenario> {
    vec![
        steady(topology, seed, size),
        colo_spike(topology, seed, size),
        uniform_spike(topology, seed, size),
        burst_7_to_1(topology, seed, size),
    ]
}

fn limits(size: Size) -> (u64, u64) {
    let s = size.scale();
    ((1_000.0 * s) as u64, (500.0 * s) as u64)
}

fn every_node(topology: &Topology) -> Vec<(usize, u64)> {
    (0..topology.nodes()).map(|n| (n, 1)).collect()
}

/// Visitors arriving at `per_minute` for `minutes`.
fn count(per_minute: f64, minutes: u64) -> u64 {
    (per_minute * minutes as f64).round() as u64
}

/// Steady traffic below the limits: new users at 24 % of the per-minute
/// limit, which keeps about 75 % of the total active once sessions pile up.
/// Nobody should ever be queued.
#[must_use]
pub fn steady(topology: &Topology, seed: u64, size: Size) -> Scenario {
    let (total, per_minute) = limits(size);
    let w = topology.warmup_ms();
    let minutes = size.quiet_minutes(20).max(8);
    let rate = 0.24 * per_minute as f64;
    Scenario {
        key: "steady",
        title: "1. steady, below the limits",
        room: room_config(total, per_minute, 5),
        arrivals: arrivals(
            seed,
            &[Segment {
                from_ms: w,
                to_ms: w + minutes * MINUTE,
                visitors: count(rate, minutes),
                nodes: every_node(topology),
            }],
        ),
        duration_ms: w + (minutes + 2) * MINUTE,
    }
}

/// A spike at one colo: a quiet baseline everywhere (12 % of the per-minute
/// limit), then colo 0 alone receives three minutes' worth of the per-minute
/// limit within two minutes.
#[must_use]
pub fn colo_spike(topology: &Topology, seed: u64, size: Size) -> Scenario {
    let (total, per_minute) = limits(size);
    let w = topology.warmup_ms();
    let quiet = size.quiet_minutes(10);
    let after = 12;
    let baseline = 0.12 * per_minute as f64;
    let colo0: Vec<(usize, u64)> = (0..topology.nodes_per_colo)
        .map(|n| (topology.node(0, n), 1))
        .collect();
    Scenario {
        key: "colo-spike",
        title: "2. spike at one colo",
        room: room_config(total, per_minute, 5),
        arrivals: arrivals(
            seed,
            &[
                Segment {
                    from_ms: w,
                    to_ms: w + (quiet + after) * MINUTE,
                    visitors: count(baseline, quiet + after),
                    nodes: every_node(topology),
                },
                Segment {
                    from_ms: w + quiet * MINUTE,
                    to_ms: w + (quiet + 2) * MINUTE,
                    visitors: 3 * per_minute,
                    nodes: colo0,
                },
            ],
        ),
        duration_ms: w + (quiet + after) * MINUTE,
    }
}

/// A uniform worldwide spike after a long period at low utilisation: 30
/// minutes at about 5 % of the total active users, then twice the total
/// arrives within one minute, spread evenly over every node. The case that
/// made the seed's utilisation-multiplier design overshoot.
#[must_use]
pub fn uniform_spike(topology: &Topology, seed: u64, size: Size) -> Scenario {
    let (total, per_minute) = limits(size);
    let w = topology.warmup_ms();
    let quiet = size.quiet_minutes(30);
    let after = 20;
    // About 6.5 minutes active per visitor (1 browsing + 5 of session + rounding).
    let low = 0.05 * total as f64 / 6.5;
    Scenario {
        key: "uniform-spike",
        title: "3. worldwide spike after low utilisation",
        room: room_config(total, per_minute, 5),
        arrivals: arrivals(
            seed,
            &[
                Segment {
                    from_ms: w,
                    to_ms: w + (quiet + after) * MINUTE,
                    visitors: count(low, quiet + after),
                    nodes: every_node(topology),
                },
                Segment {
                    from_ms: w + quiet * MINUTE,
                    to_ms: w + (quiet + 1) * MINUTE,
                    visitors: 2 * total,
                    nodes: every_node(topology),
                },
            ],
        ),
        duration_ms: w + (quiet + after) * MINUTE,
    }
}

/// The two nodes of the 7:1 burst: the first two of colo 0, or (with one
/// node per colo) the first node of colos 0 and 1.
#[must_use]
pub fn burst_nodes(topology: &Topology) -> (usize, usize) {
    if topology.nodes_per_colo >= 2 {
        (topology.node(0, 0), topology.node(0, 1))
    } else {
        assert!(topology.colos >= 2, "the 7:1 burst needs two nodes");
        (topology.node(0, 0), topology.node(1, 0))
    }
}

/// A 7:1 burst split between two nodes (seed 000's uneven workers): a quiet
/// baseline split 1:1 between them, then 90 % of the per-minute limit arrives
/// within two seconds, seven eighths at one node and one eighth at the other.
/// The burst fits the limits, so ideally nobody waits.
#[must_use]
pub fn burst_7_to_1(topology: &Topology, seed: u64, size: Size) -> Scenario {
    let (total, per_minute) = limits(size);
    let w = topology.warmup_ms();
    let quiet = size.quiet_minutes(5);
    let after = 8;
    let (a, b) = burst_nodes(topology);
    let burst_at = w + quiet * MINUTE + 20_000;
    Scenario {
        key: "burst-7-1",
        title: "4. 7:1 burst over two nodes",
        room: room_config(total, per_minute, 5),
        arrivals: arrivals(
            seed,
            &[
                Segment {
                    from_ms: w,
                    to_ms: w + (quiet + after) * MINUTE,
                    visitors: count(0.04 * per_minute as f64, quiet + after),
                    nodes: vec![(a, 1), (b, 1)],
                },
                Segment {
                    from_ms: burst_at,
                    to_ms: burst_at + 2_000,
                    visitors: per_minute * 9 / 10,
                    nodes: vec![(a, 7), (b, 1)],
                },
            ],
        ),
        duration_ms: w + (quiet + after) * MINUTE,
    }
}

/// One row of the results table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScenarioResult {
    pub key: String,
    pub title: String,
    pub total_active_users: u64,
    pub new_users_per_minute: u64,
    pub visitors: u64,
    pub admitted: u64,
    /// Visitors queued at least once.
    pub queued: u64,
    /// Visitors first queued while both limits were less than 90 % used.
    pub queued_early: u64,
    /// Most visitors with a live session at once (ground truth).
    pub peak_active: u64,
    pub peak_active_ratio: f64,
    /// Peak of the active users the counters count (to the end of the expiry slot).
    pub peak_active_counted_ratio: f64,
    pub peak_admits_per_minute: u64,
    pub peak_admits_ratio: f64,
    /// Seconds into the run when the engine first queued someone for lack of a slot.
    pub first_queue_at_s: Option<f64>,
    /// active ÷ total at that moment.
    pub first_queue_active_ratio: Option<f64>,
    /// admits this minute ÷ new-users-per-minute at that moment.
    pub first_queue_admits_ratio: Option<f64>,
    pub max_wait_s: f64,
    pub decisions: u64,
    /// Decisions made with the local-only state (stale answer).
    pub local_only_decisions: u64,
    /// The aggregator's Anywhere ledger in this run.
    pub ledger: LedgerCheck,
    /// Visitors who gave up waiting (`--give-up-pct`).
    pub given_up: u64,
    /// Visitors whose requests reached more than one node (`--roaming`).
    pub roamed: u64,
    /// What the network did to the gossip.
    pub gossip: GossipCounts,
    /// With `--shared-ledger`: what the checker found.
    pub shared: SharedAudit,
    /// Issue 15's targets.
    pub targets: Targets,
}

/// Runs `scenario` on `topology` and measures it.
#[must_use]
pub fn run(scenario: &Scenario, topology: &Topology, seed: u64) -> (ScenarioResult, Run) {
    let room = scenario
        .room
        .clone()
        .validate()
        .expect("scenario rooms are valid")
        .named(scenario.key);
    let run =
        Sim::new(room, *topology, &scenario.arrivals, seed).run(Until::Time(scenario.duration_ms));
    (measure(scenario, &run, topology.gossip_delay_ms), run)
}

fn measure(scenario: &Scenario, run: &Run, gossip_delay_ms: u64) -> ScenarioResult {
    let total = scenario.room.total_active_users;
    let per_minute = scenario.room.new_users_per_minute;
    let peak_admits = run.admits_per_minute.values().copied().max().unwrap_or(0);
    let ratio = |n: f64, of: u64| n / of as f64;
    ScenarioResult {
        key: scenario.key.to_owned(),
        title: scenario.title.to_owned(),
        total_active_users: total,
        new_users_per_minute: per_minute,
        visitors: run.outcomes.len() as u64,
        admitted: run
            .outcomes
            .iter()
            .filter(|o| o.admitted_ms.is_some())
            .count() as u64,
        queued: run.outcomes.iter().filter(|o| o.queued).count() as u64,
        queued_early: run.queued_early,
        peak_active: run.peak_active,
        peak_active_ratio: ratio(run.peak_active as f64, total),
        peak_active_counted_ratio: ratio(run.peak_active_counted as f64, total),
        peak_admits_per_minute: peak_admits,
        peak_admits_ratio: ratio(peak_admits as f64, per_minute),
        first_queue_at_s: run.first_queue.map(|q| q.at_ms as f64 / 1_000.0),
        first_queue_active_ratio: run.first_queue.map(|q| ratio(q.active as f64, total)),
        first_queue_admits_ratio: run
            .first_queue
            .map(|q| ratio(q.admits_this_minute as f64, per_minute)),
        max_wait_s: run
            .outcomes
            .iter()
            .filter_map(|o| o.wait_secs())
            .fold(0.0, f64::max),
        decisions: run.decisions,
        local_only_decisions: run.local_only_decisions,
        ledger: run.ledger,
        given_up: run.outcomes.iter().filter(|o| o.gave_up).count() as u64,
        roamed: run.outcomes.iter().filter(|o| o.roamed).count() as u64,
        gossip: run.gossip,
        shared: run.shared,
        targets: Targets::judge(
            run.queued_below_target,
            run.queued_below_target_behind_queue,
            run.queued_below_target_line_fits,
            ratio(peak_admits as f64, per_minute),
            ratio(run.peak_active as f64, total),
            run.counted_error,
            gossip_delay_ms,
        ),
    }
}
