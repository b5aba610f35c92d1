//! `cargo xtask simulate`: how close to its limits the real engine queues,
//! and how fair its queues are, in seeded virtual time.
//!
//! The simulator re-implements nothing: every request is the engine's
//! `decide`, every report a node's `RoomCounters::report` merged by the
//! aggregator's own `Cluster` (lease ledger and departed nodes included), and
//! every answer taken in with the node's share and local-only rules (see
//! [`cluster`]). Same seed, same output.
//!
//! # Layout
//! - [`cluster`]: the discrete-event loop (nodes, aggregator, visitors).
//! - [`scenario`]: the four accuracy scenarios and their measurements.
//! - [`targets`]: issue 15's targets, met or missed per scenario.
//! - [`fairness`]: seed 001's experiment, FIFO against random.
//! - [`plot`]: the heatmap PNGs.
//!
//! Output: a Markdown table on stdout, and CSV, JSON and PNG files under
//! `target/simulate/`.
use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{Context as _, Result};
use waitroom_common::cluster::promise::{ask_timeout_ms, ask_within_hold_ms};

use crate::cmd;

pub mod cluster;
pub mod fairness;
pub mod plot;
pub mod scenario;
pub mod targets;

use cluster::{Conditions, Grants, LedgerCheck, Phases, Topology};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Seed for traffic and for the engine's randomness.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Colos (data centers) in the cluster.
    #[arg(long, default_value_t = 4)]
    colos: usize,
    /// Nodes per colo (each with its own node counters).
    #[arg(long, default_value_t = 2)]
    nodes_per_colo: usize,
    /// Age of the reports behind the state a node decides with.
    #[arg(long, default_value_t = 1_000)]
    gossip_delay_ms: u64,
    /// Time between two reports of a node.
    #[arg(long, default_value_t = 1_000)]
    gossip_interval_ms: u64,
    /// When in the interval each node reports.
    #[arg(long, value_enum, default_value_t = Phases::Staggered)]
    phases: Phases,
    /// The nodes' `aggregator.stale_after_ms` (the edge's default).
    #[arg(long, default_value_t = 10_000)]
    stale_after_ms: u64,
    /// The aggregator's `node_timeout_ms` (its default).
    #[arg(long, default_value_t = 15_000)]
    node_timeout_ms: u64,
    /// The Anywhere allowance the nodes get: the ledger's grant, or (an
    /// experiment) the engine's unclamped share.
    #[arg(long, value_enum, default_value_t = Grants::Ledger)]
    grants: Grants,
    /// Percent of gossip answers lost (the node waits for its answer
    /// timeout, then reports again; two in a row and it reconnects).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    lost_answers_pct: u32,
    /// Percent of gossip answers held back by up to two intervals more
    /// (taken late, or ignored once the node stopped waiting for them).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    reordered_answers_pct: u32,
    /// Each node's clock is off by a fixed offset, uniform in ±this.
    #[arg(long, default_value_t = 0)]
    skew_ms: u64,
    /// Nodes count on their own (skewed) wall clocks, not the cluster's
    /// clock their answers carry (the nodes before they followed it; to
    /// show what following buys).
    #[arg(long)]
    no_clock_following: bool,
    /// A node waits for the answer to a lost out-of-cycle ask as long as for
    /// a periodic answer (the gossip client before it asked again after a
    /// few round trips; to show what asking again buys).
    #[arg(long)]
    no_ask_again: bool,
    /// A held visitor's ask whose answer is late is sent again only after
    /// `promise::ask_timeout_ms`, when the hold (`lease_wait_ms`) has
    /// queued the visitor, not in time for its answer to come within the
    /// hold (the gossip client before session 22; to show what asking
    /// within the hold buys).
    #[arg(long)]
    ask_again_late: bool,
    /// A report confirming a lowered cap whose answer is late is waited for
    /// as a periodic report (`answer_timeout_ms`), no ask going meanwhile,
    /// not as an ask (`promise::ask_timeout_ms`, then reported again at
    /// once) (the gossip client before session 22; to show what it buys).
    #[arg(long)]
    confirm_waited_full: bool,
    /// Every report sent again after a lost ask or confirmation is waited
    /// for as a periodic report (2 s, no ask going meanwhile), not the
    /// first as the one it repeats (the gossip client before session 22;
    /// to show what it buys).
    #[arg(long)]
    again_waited_full: bool,
    /// A node's reports do not name the visitors it holds now (the gossip
    /// client before session 23; to show what naming them buys): a report
    /// sent again after a lost ask reads as no need.
    #[arg(long)]
    held_unnamed: bool,
    /// A held visitor decides on the first answer that counted them, even
    /// if it left them short of slots, rather than being held on for one
    /// more answer within the hold (the edge before session 23; to show
    /// what holding on buys).
    #[arg(long)]
    hold_once: bool,
    /// The aggregator paces a promise by the minute's average alone, not
    /// also by the room's recent pace (the aggregator before session 24; to
    /// show what the recent pace buys).
    #[arg(long)]
    average_pace_only: bool,
    /// Each request of a visitor goes to a random node of their colo.
    #[arg(long)]
    roaming: bool,
    /// Percent of visitors who give up once queued for --give-up-after-s.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    give_up_pct: u32,
    /// How long a visitor who gives up waits first (from arrival).
    #[arg(long, default_value_t = 60)]
    give_up_after_s: u64,
    /// The nodes' `aggregator.lease_wait_ms` (the on-demand lease; 0: off,
    /// and the aggregator promises fair parts as before the lease).
    #[arg(long, default_value_t = 50)]
    lease_wait_ms: u64,
    /// Round trip of an out-of-cycle lease ask over the open connection.
    #[arg(long, default_value_t = 20)]
    lease_rtt_ms: u64,
    /// How far ahead the aggregator promises an asking node its recent rate.
    #[arg(long, default_value_t = 2_000)]
    promise_horizon_ms: u64,
    /// Run under a preset of conditions (added to the flags above) instead
    /// of the run as given followed by the hostile run's targets.
    #[arg(long, value_enum)]
    preset: Option<Preset>,
    /// Without --preset: skip the hostile run that follows the normal one.
    #[arg(long)]
    no_hostile: bool,
    /// Skip the shared ledger check after every report (O(nodes) each:
    /// for the scale run).
    #[arg(long)]
    no_ledger_check: bool,
    /// Aggregators (issue 20): node i's home is aggregator i % K, which
    /// grants to it; the others merge its peer reports. Above 1 the ledger
    /// check (made for one aggregator's ledger) is skipped.
    #[arg(long, default_value_t = 1)]
    aggregators: u32,
    /// With --aggregators: peer reports say no held leases (to show what
    /// they buy).
    #[arg(long)]
    no_peer_leases: bool,
    /// With --aggregators: a node whose home's answer raised its lease
    /// sends its peer reports only with its next report, not at once (the
    /// nodes before the at-once peer report; to show what it buys).
    #[arg(long)]
    no_raised_peer_reports: bool,
    /// Every aggregator commits its grants (colo share and Anywhere, one cap per node) to one shared grant
    /// ledger (the etcd ledger's code, without the store's latency) before
    /// it answers.
    #[arg(long)]
    shared_ledger: bool,
    /// Run only this scenario (steady, colo-spike, uniform-spike, burst-7-1).
    #[arg(long)]
    scenario: Option<String>,
    /// Visitors in the fairness experiment.
    #[arg(long, default_value_t = 10_000)]
    fairness_visitors: u64,
    /// Run only the accuracy scenarios, or only the fairness experiment.
    #[arg(long, value_enum)]
    only: Option<Part>,
    /// Where the CSV, JSON and PNG files go (default: target/simulate).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    Scenarios,
    Fairness,
}

/// Named sets of conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Preset {
    /// Issue 15's hostile network: 10 % of answers lost, nodes out of
    /// phase, clocks skewed by up to ±500 ms.
    Hostile,
}

impl Preset {
    /// `topology` with this preset's conditions added.
    #[must_use]
    pub fn apply(self, topology: Topology) -> Topology {
        match self {
            Self::Hostile => Topology {
                phases: Phases::Random,
                conditions: Conditions {
                    lost_answers_pct: topology.conditions.lost_answers_pct.max(10),
                    skew_ms: topology.conditions.skew_ms.max(500),
                    ..topology.conditions
                },
                ..topology
            },
        }
    }
}

pub fn run(args: &Args) -> Result<()> {
    anyhow::ensure!(
        args.colos >= 1 && args.nodes_per_colo >= 1 && args.colos * args.nodes_per_colo >= 2,
        "need at least two nodes (the 7:1 burst splits between two)"
    );
    anyhow::ensure!(
        args.gossip_interval_ms >= 1,
        "--gossip-interval-ms must be at least 1"
    );
    anyhow::ensure!(
        !(args.no_ledger_check && args.grants == Grants::EngineShare),
        "--grants engine-share needs the ledger check (it swaps the grant there)"
    );
    anyhow::ensure!(
        (1..=16).contains(&args.aggregators),
        "--aggregators must be 1 to 16"
    );
    anyhow::ensure!(
        args.aggregators == 1 || args.grants == Grants::Ledger,
        "--grants engine-share needs one aggregator"
    );
    let started = Instant::now();
    let given = Topology {
        colos: args.colos,
        nodes_per_colo: args.nodes_per_colo,
        gossip_delay_ms: args.gossip_delay_ms,
        gossip_interval_ms: args.gossip_interval_ms,
        phases: args.phases,
        stale_after_ms: args.stale_after_ms,
        node_timeout_ms: args.node_timeout_ms,
        grants: args.grants,
        conditions: Conditions {
            lost_answers_pct: args.lost_answers_pct,
            reordered_answers_pct: args.reordered_answers_pct,
            skew_ms: args.skew_ms,
            follow_clock: !args.no_clock_following,
            ask_again_when_lost: !args.no_ask_again,
            ask_within_hold: !args.ask_again_late,
            confirm_like_ask: !args.confirm_waited_full,
            again_like_ask: !args.again_waited_full,
            name_held_visitors: !args.held_unnamed,
            hold_again: !args.hold_once,
            recent_pace: !args.average_pace_only,
            roaming: args.roaming,
            give_up_pct: args.give_up_pct,
            give_up_after_ms: args.give_up_after_s * 1_000,
            check_ledger: !args.no_ledger_check && args.aggregators == 1,
            aggregators: args.aggregators,
            peer_leases: !args.no_peer_leases,
            raised_peer_reports: !args.no_raised_peer_reports,
            shared_ledger: args.shared_ledger,
            lease_wait_ms: args.lease_wait_ms,
            lease_rtt_ms: args.lease_rtt_ms,
            promise_horizon_ms: args.promise_horizon_ms,
        },
    };
    let topology = args.preset.map_or(given, |p| p.apply(given));
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| cmd::workspace_root().join("target").join("simulate"));
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    println!("simulate: seed {}, {}", args.seed, describe(&topology));
    if let Some(preset) = args.preset {
        println!("preset {preset:?}");
    }
    if args.only != Some(Part::Fairness) {
        run_scenarios(&topology, args.seed, args.scenario.as_deref(), &out, true)?;
    }
    if args.only != Some(Part::Scenarios) {
        fairness::run_and_write(&topology, args.seed, args.fairness_visitors, &out)?;
    }
    let normal_s = started.elapsed().as_secs_f64();
    if args.preset.is_none() && !args.no_hostile && args.only != Some(Part::Fairness) {
        let hostile = Preset::Hostile.apply(topology);
        let hostile_out = out.join("hostile");
        fs::create_dir_all(&hostile_out)
            .with_context(|| format!("creating {}", hostile_out.display()))?;
        println!();
        println!(
            "Under the hostile preset (`--preset hostile`): {}",
            describe(&hostile)
        );
        run_scenarios(
            &hostile,
            args.seed,
            args.scenario.as_deref(),
            &hostile_out,
            false,
        )?;
        println!(
            "wall time: {:.0} s ({normal_s:.0} s the run as given, {:.0} s the hostile run)",
            started.elapsed().as_secs_f64(),
            started.elapsed().as_secs_f64() - normal_s
        );
    } else {
        println!("wall time: {normal_s:.0} s");
    }
    println!("files in {}", out.display());
    Ok(())
}

/// The run's shape and conditions, in one line.
fn describe(t: &Topology) -> String {
    let c = &t.conditions;
    let mut line = format!(
        "{} colos × {} nodes reporting every {} ms ({:?}), answers {} ms old, stale after {} ms, departed after {} ms; aggregator: waitroom_common::cluster::Cluster (Anywhere lease ledger simulated), nodes get the {:?} Anywhere grant",
        t.colos,
        t.nodes_per_colo,
        t.gossip_interval_ms,
        t.phases,
        t.gossip_delay_ms,
        t.stale_after_ms,
        t.node_timeout_ms,
        t.grants
    );
    let mut add = |on: bool, what: String| {
        if on {
            line.push_str("; ");
            line.push_str(&what);
        }
    };
    add(
        c.lost_answers_pct > 0,
        format!("{} % of answers lost", c.lost_answers_pct),
    );
    add(
        c.reordered_answers_pct > 0,
        format!("{} % of answers held back", c.reordered_answers_pct),
    );
    add(
        c.skew_ms > 0,
        format!(
            "clocks skewed by up to ±{} ms{}",
            c.skew_ms,
            if c.follow_clock {
                " (the nodes follow the cluster's clock once answered)"
            } else {
                ", the nodes counting on their own"
            }
        ),
    );
    add(
        c.roaming,
        "visitors roam over the nodes of their colo".to_owned(),
    );
    add(
        c.lease_wait_ms > 0,
        format!(
            "on-demand lease: new visitors short of slots held up to {} ms, asks answered in {} ms{}",
            c.lease_wait_ms,
            c.lease_rtt_ms,
            asked_again(t)
        ),
    );
    add(
        c.give_up_pct > 0,
        format!(
            "{} % of visitors give up after {} s",
            c.give_up_pct,
            c.give_up_after_ms / 1_000
        ),
    );
    add(
        c.aggregators > 1,
        format!(
            "{} aggregators, node i's home i % {0}, peer reports {}, {}",
            c.aggregators,
            if c.peer_leases {
                "with the leases held"
            } else {
                "WITHOUT the leases held"
            },
            if c.raised_peer_reports {
                "sent at once when the home raises a lease"
            } else {
                "NOT sent at once when the home raises a lease"
            }
        ),
    );
    add(
        c.shared_ledger,
        "grants (colo share and Anywhere) committed to one shared grant ledger per minute"
            .to_owned(),
    );
    add(!c.check_ledger, "ledger check skipped".to_owned());
    line
}

/// When a node whose answer is late reports again, for [`describe`].
fn asked_again(t: &Topology) -> String {
    let c = &t.conditions;
    if !c.ask_again_when_lost {
        return ", a lost ask or confirmation waited for as a periodic answer".to_owned();
    }
    let full = t.answer_timeout_ms();
    let late = ask_timeout_ms(c.lease_wait_ms, c.lease_rtt_ms, full);
    let hold = if c.ask_within_hold {
        format!(
            "within the hold (after {} ms)",
            ask_within_hold_ms(c.lease_wait_ms, c.lease_rtt_ms, full)
        )
    } else {
        format!("after {late} ms")
    };
    let confirm = if c.confirm_like_ask {
        format!("sent again after {late} ms")
    } else {
        format!("waited for as a periodic answer ({full} ms)")
    };
    format!(
        ", a held visitor's late ask sent again {hold}, a late confirmation of a lowered cap {confirm}{}{}{}{}",
        if c.again_like_ask {
            ", the first report sent again waited for as the one it repeats"
        } else {
            ""
        },
        if c.name_held_visitors {
            ", held visitors named in every report"
        } else {
            ""
        },
        if c.hold_again {
            ""
        } else {
            ", a held visitor decides on the first answer that counts them"
        },
        if c.recent_pace {
            ""
        } else {
            ", promises paced by the minute's average alone"
        }
    )
}

/// Runs the scenarios (or the one named) and prints their tables: all of
/// them, or only the targets.
fn run_scenarios(
    topology: &Topology,
    seed: u64,
    only: Option<&str>,
    out: &Path,
    all_tables: bool,
) -> Result<()> {
    let scenarios: Vec<_> = scenario::all(topology, seed, scenario::Size::Full)
        .into_iter()
        .filter(|s| only.is_none_or(|key| s.key == key))
        .collect();
    anyhow::ensure!(!scenarios.is_empty(), "no scenario named {only:?}");
    let mut results = Vec::new();
    let mut wall = Vec::new();
    if all_tables {
        println!();
        println!("{}", table_header());
    }
    for scenario in scenarios {
        let started = Instant::now();
        let (result, run) = scenario::run(&scenario, topology, seed);
        let secs = started.elapsed().as_secs_f64();
        if all_tables {
            println!("{}", table_row(&result));
        }
        tracing_line(&result, secs);
        write_timeline(out, &result.key, &run.timeline)?;
        results.push(result);
        wall.push(secs);
    }
    if all_tables && topology.conditions.check_ledger {
        println!();
        println!("{}", ledger_header());
        for result in &results {
            println!("{}", ledger_row(result));
        }
    }
    if all_tables {
        println!();
        println!("{}", conditions_header());
        for result in &results {
            println!("{}", conditions_row(result));
        }
    }
    println!();
    println!("Targets (issue 15):");
    println!();
    println!("{}", targets::header(topology.gossip_delay_ms));
    for result in &results {
        println!("{}", targets::row(&result.title, &result.targets));
    }
    if topology.conditions.lease_wait_ms > 0 {
        println!();
        println!(
            "On-demand lease (held up to {} ms, asks answered in {} ms):",
            topology.conditions.lease_wait_ms, topology.conditions.lease_rtt_ms
        );
        println!();
        println!(
            "| scenario | out-of-cycle asks | of them again, an ask's answer lost | reports confirming a lowered cap | of them again, a confirmation's answer lost | visitors held | holds that ended without an answer | waits for a lost answer cut short by a hold |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|");
        for r in &results {
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                r.title,
                r.gossip.lease_asks,
                r.gossip.asks_again,
                r.gossip.confirms,
                r.gossip.confirms_again,
                r.gossip.lease_holds,
                r.gossip.lease_holds_timed_out,
                r.gossip.cut_short
            );
        }
    }
    if topology.conditions.aggregators > 1 && topology.conditions.raised_peer_reports {
        println!();
        println!(
            "Peer reports sent at once because the home's answer raised a lease (one per other aggregator): {}",
            results
                .iter()
                .map(|r| format!("{} {}", r.key, r.gossip.raised_peer_reports))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if topology.conditions.shared_ledger {
        println!();
        println!("Shared ledger, checked (issue 20, item 3):");
        println!();
        println!(
            "| scenario | grants cut | reports checked against the cap held | admits past the cap held | commits leaving the caps past the limit |"
        );
        println!("|---|---:|---:|---:|---:|");
        for r in &results {
            println!(
                "| {} | {} | {} | {} | {} |",
                r.title, r.shared.cuts, r.shared.checked, r.shared.overspent, r.shared.over_limit
            );
        }
    }
    println!();
    let walls: Vec<String> = results
        .iter()
        .zip(&wall)
        .map(|(r, s)| format!("{} {s:.0} s", r.key))
        .collect();
    println!("scenario wall times: {}", walls.join(", "));
    write_results(out, &results)
}

/// What the network and the visitors did, per scenario.
#[must_use]
pub fn conditions_header() -> String {
    [
        "| scenario | reports | answers taken (late) | lost | late and ignored | timeouts | reconnects | largest report skew | report entries the aggregator dropped (future minute) / clamped | visitors who roamed | gave up |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    .join("\n")
}

#[must_use]
pub fn conditions_row(r: &scenario::ScenarioResult) -> String {
    let g = &r.gossip;
    format!(
        "| {} | {} | {} ({}) | {} | {} | {} | {} | {} ms | {} / {} | {} | {} |",
        r.title,
        g.reports,
        g.answers_taken,
        g.late_taken,
        g.lost,
        g.late_ignored,
        g.timeouts,
        g.reconnects,
        g.max_report_skew_ms,
        g.aggregator_future_minute,
        g.aggregator_clamped,
        r.roamed,
        r.given_up
    )
}

/// The shared leases check of every scenario, as a second table.
#[must_use]
pub fn ledger_header() -> String {
    [
        "| scenario | reports applied (= checks) | shared leases over the round's shared slots: checks (with a lease carried over a minute) | worst excess, slots: this minute's leases / with a carried one | the engine's unclamped shares over them: checks | worst excess | answers clamped | local-only decisions |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    .join("\n")
}

#[must_use]
pub fn ledger_row(r: &scenario::ScenarioResult) -> String {
    let l = &r.ledger;
    format!(
        "| {} | {} | {} ({}) | {} / {} | {} | {} | {} | {} |",
        r.title,
        l.checks,
        l.over_pool,
        l.over_pool_carried,
        l.worst_excess,
        l.worst_excess_carried,
        l.over_pool_without_ledger,
        l.worst_excess_without_ledger,
        l.clamped,
        r.local_only_decisions
    )
}

/// One line about the ledger, for the fairness runs.
#[must_use]
pub fn ledger_line(l: &LedgerCheck) -> String {
    format!(
        "shared leases (colo shares and Anywhere) over the round's shared slots in {} of {} checks (by up to {} slots; {} with a lease carried over a minute, by up to {}); the engine's unclamped shares would have been in {}, by up to {} slots; {} answers clamped",
        l.over_pool,
        l.checks,
        l.worst_excess,
        l.over_pool_carried,
        l.worst_excess_carried,
        l.over_pool_without_ledger,
        l.worst_excess_without_ledger,
        l.clamped
    )
}

/// Progress goes to stderr so stdout stays one Markdown table.
fn tracing_line(result: &scenario::ScenarioResult, secs: f64) {
    eprintln!(
        "    {}: {} visitors, {} decisions in {secs:.1} s",
        result.key, result.visitors, result.decisions
    );
}

#[must_use]
pub fn table_header() -> String {
    [
        "| scenario | limits (total / per min) | visitors | queued | queued below 90 % of both limits | peak active ÷ total | peak admits/min ÷ new/min | queueing began at active ÷ total | (admits this min ÷ new/min then) | max wait |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    .join("\n")
}

#[must_use]
pub fn table_row(r: &scenario::ScenarioResult) -> String {
    let opt = |v: Option<f64>| v.map_or_else(|| "never queued".to_owned(), |v| format!("{v:.2}"));
    let admits_then = r
        .first_queue_admits_ratio
        .map_or_else(|| "—".to_owned(), |v| format!("{v:.2}"));
    format!(
        "| {} | {} / {} | {} | {} | {} | {:.3} | {:.3} | {} | {} | {:.0} s |",
        r.title,
        r.total_active_users,
        r.new_users_per_minute,
        r.visitors,
        r.queued,
        r.queued_early,
        r.peak_active_ratio,
        r.peak_admits_ratio,
        opt(r.first_queue_active_ratio),
        admits_then,
        r.max_wait_s
    )
}

fn write_results(out: &Path, results: &[scenario::ScenarioResult]) -> Result<()> {
    let json = out.join("scenarios.json");
    fs::write(&json, serde_json::to_string_pretty(results)?)
        .with_context(|| format!("writing {}", json.display()))?;
    let mut csv = String::from(
        "scenario,total_active_users,new_users_per_minute,visitors,admitted,queued,queued_early,peak_active,peak_active_ratio,peak_active_counted_ratio,peak_admits_per_minute,peak_admits_ratio,first_queue_at_s,first_queue_active_ratio,first_queue_admits_ratio,max_wait_s,decisions,local_only_decisions,ledger_checks,ledger_over_pool,over_pool_carried,worst_excess,worst_excess_carried,over_pool_without_ledger,worst_excess_without_ledger,answers_clamped,given_up,roamed,reports,answers_taken,answers_late_taken,answers_lost,answers_late_ignored,timeouts,reconnects,max_report_skew_ms,queued_below_98,queued_below_98_behind_queue,queued_below_98_line_fits,queued_below_98_met,peak_admits_target,peak_admits_met,peak_active_met,counted_worst_relative,counted_worst_relative_at_s,counted_worst_of_total,counted_worst_relative_any,counted_met,targets_met\n",
    );
    let opt = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.4}"));
    for r in results {
        writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{:.4},{:.4},{},{:.4},{},{},{},{:.1},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.4},{},{:.4},{:.4},{},{}",
            r.key,
            r.total_active_users,
            r.new_users_per_minute,
            r.visitors,
            r.admitted,
            r.queued,
            r.queued_early,
            r.peak_active,
            r.peak_active_ratio,
            r.peak_active_counted_ratio,
            r.peak_admits_per_minute,
            r.peak_admits_ratio,
            opt(r.first_queue_at_s),
            opt(r.first_queue_active_ratio),
            opt(r.first_queue_admits_ratio),
            r.max_wait_s,
            r.decisions,
            r.local_only_decisions,
            r.ledger.checks,
            r.ledger.over_pool,
            r.ledger.over_pool_carried,
            r.ledger.worst_excess,
            r.ledger.worst_excess_carried,
            r.ledger.over_pool_without_ledger,
            r.ledger.worst_excess_without_ledger,
            r.ledger.clamped,
            r.given_up,
            r.roamed,
            r.gossip.reports,
            r.gossip.answers_taken,
            r.gossip.late_taken,
            r.gossip.lost,
            r.gossip.late_ignored,
            r.gossip.timeouts,
            r.gossip.reconnects,
            r.gossip.max_report_skew_ms,
            r.targets.queued_below_98,
            r.targets.queued_below_98_behind_queue,
            r.targets.queued_below_98_line_fits,
            r.targets.queued_met,
            r.targets.peak_admits_target,
            r.targets.peak_admits_met,
            r.targets.peak_active_met,
            r.targets.counted.worst_relative,
            r.targets
                .counted
                .worst_relative_at_s
                .map_or_else(String::new, |s| s.to_string()),
            r.targets.counted.worst_of_total,
            r.targets.counted.worst_relative_any,
            r.targets.counted_met,
            r.targets.met()
        )?;
    }
    let path = out.join("scenarios.csv");
    fs::write(&path, csv).with_context(|| format!("writing {}", path.display()))
}

fn write_timeline(out: &Path, key: &str, timeline: &[cluster::Sample]) -> Result<()> {
    let mut csv = String::from("t_s,active,active_counted,admits_this_minute,queued\n");
    for s in timeline {
        writeln!(
            csv,
            "{},{},{},{},{}",
            s.at_s, s.active, s.active_counted, s.admits_this_minute, s.queued
        )?;
    }
    let path = out.join(format!("timeline-{key}.csv"));
    fs::write(&path, csv).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use waitroom_common::room::QueueingMethod;

    use super::{
        Preset,
        cluster::{self, Conditions, Grants, Phases, Topology},
        fairness::{self, Setup},
        plot, scenario,
        scenario::Size,
    };

    /// Small enough for debug builds; two colos so colo shares and Anywhere both matter.
    const TOPOLOGY: Topology = Topology {
        colos: 2,
        nodes_per_colo: 2,
        gossip_delay_ms: 1_000,
        gossip_interval_ms: 1_000,
        phases: Phases::Staggered,
        stale_after_ms: 10_000,
        node_timeout_ms: 15_000,
        grants: Grants::Ledger,
        conditions: Conditions::NONE,
    };

    fn scenario_result(key: &str, seed: u64) -> scenario::ScenarioResult {
        let scenario = scenario::all(&TOPOLOGY, seed, Size::Small)
            .into_iter()
            .find(|s| s.key == key)
            .expect("known scenario");
        scenario::run(&scenario, &TOPOLOGY, seed).0
    }

    #[test]
    fn steady_traffic_below_the_limits_is_never_queued() {
        let r = scenario_result("steady", 3);
        assert!(r.visitors > 150, "{r:?}");
        assert_eq!(r.admitted, r.visitors, "{r:?}");
        assert_eq!(r.queued, 0, "{r:?}");
        assert!(
            r.peak_active_ratio > 0.5 && r.peak_active_ratio < 0.9,
            "{r:?}"
        );
    }

    /// The seed's overshoot case. Slack: 2 % on the total and on the
    /// per-minute limit (this run: 102 against 100), what one gossip delay of
    /// admits made under the previous answer's caps can add. The per-minute
    /// slack was 5 % while only the Anywhere pool had a ledger: the real
    /// aggregator merges each report on its own, against the others' older
    /// reports, so the colo-share caps of different answers added up to more
    /// than the limit; the ledger of colo-share leases (`cluster::
    /// clamp_shared`) counts what other nodes still hold as spent. Before the
    /// engine kept new visitors off the eligible reservation this scenario
    /// admitted 7 % over the per-minute limit.
    #[test]
    fn uniform_spike_after_low_utilisation_stays_within_the_limits() {
        let r = scenario_result("uniform-spike", 3);
        assert!(r.queued > 100, "the spike must queue: {r:?}");
        assert!(r.peak_active_ratio <= 1.02, "{r:?}");
        assert!(r.peak_admits_ratio <= 1.02, "{r:?}");
        assert!(
            r.peak_admits_ratio >= 0.9,
            "the per-minute limit is reached: {r:?}"
        );
    }

    #[test]
    fn same_seed_same_results_and_another_seed_other_traffic() {
        let a = scenario_result("burst-7-1", 5);
        assert_eq!(a, scenario_result("burst-7-1", 5));
        assert_ne!(a, scenario_result("burst-7-1", 6));
    }

    fn small_fairness(seed: u64, method: QueueingMethod) -> fairness::FairnessStats {
        fairness::run_method(&Setup::new(1_200, 10), &TOPOLOGY, seed, method).0
    }

    /// FIFO admits by arrival minute: the wait grows with the minute, and
    /// nobody is admitted long after someone of a later minute. Random does
    /// neither.
    #[test]
    fn fifo_admits_in_bucket_order_and_random_does_not() {
        let fifo = small_fairness(1, QueueingMethod::Fifo);
        let random = small_fairness(1, QueueingMethod::Random);
        for stats in [&fifo, &random] {
            assert_eq!(stats.admitted, stats.visitors, "{stats:?}");
            assert!(
                stats.queued > stats.visitors / 2,
                "a queue forms: {stats:?}"
            );
        }
        assert!(fifo.spearman_queued > 0.97, "{fifo:?}");
        assert!(fifo.spearman_bucket_wait > 0.9, "{fifo:?}");
        assert!(fifo.max_overtaken_by_later_bucket_s < 150.0, "{fifo:?}");
        assert!(random.spearman_bucket_wait < 0.7, "{random:?}");
        assert!(random.max_overtaken_by_later_bucket_s > 300.0, "{random:?}");
        assert!(
            random.mean_wait_spread_in_minute_s > 3.0 * fifo.mean_wait_spread_in_minute_s,
            "{fifo:?} {random:?}"
        );
    }

    #[test]
    fn random_admission_order_depends_on_the_seed_only() {
        let order = |seed| {
            let (_, run) =
                fairness::run_method(&Setup::new(600, 5), &TOPOLOGY, seed, QueueingMethod::Random);
            let mut admitted: Vec<(u64, usize)> = run
                .outcomes
                .iter()
                .enumerate()
                .filter_map(|(i, o)| o.admitted_ms.map(|t| (t, i)))
                .collect();
            admitted.sort_unstable();
            admitted.into_iter().map(|(_, i)| i).collect::<Vec<_>>()
        };
        assert_eq!(order(9), order(9));
        assert_ne!(order(9), order(10));
    }

    /// The steady scenario's first 100 s of traffic on `topology`: before
    /// any colo has history, so every shared slot is in the Anywhere pool and
    /// every node leases from it.
    fn anywhere_only_start(topology: &Topology, seed: u64) -> cluster::Run {
        let scenario = scenario::steady(topology, seed, Size::Small);
        let room = scenario.room.validate().unwrap().named(scenario.key);
        let until = cluster::Until::Time(topology.warmup_ms() + 100_000);
        cluster::Sim::new(room, *topology, &scenario.arrivals, seed).run(until)
    }

    /// The aggregator in the loop is the real `Cluster`: its ledger clamps
    /// the Anywhere grants, and the leases handed out stay within the pool,
    /// where the engine's own shares, handed out as they are, overlap.
    #[test]
    fn the_ledger_keeps_the_anywhere_leases_within_the_pool() {
        let with = anywhere_only_start(&TOPOLOGY, 3).ledger;
        assert!(with.checks > 300, "{with:?}");
        assert!(with.clamped > 0, "the ledger cut some grants: {with:?}");
        assert_eq!(with.over_pool, 0, "{with:?}");
        assert!(
            with.over_pool_without_ledger > 0,
            "the engine's shares alone overlap: {with:?}"
        );

        let unclamped = Topology {
            grants: Grants::EngineShare,
            ..TOPOLOGY
        };
        let without = anywhere_only_start(&unclamped, 3).ledger;
        assert!(
            without.over_pool > 0 && without.worst_excess > 0,
            "handed out unclamped, the leases overlap: {without:?}"
        );
    }

    /// Answers stop for a minute: past `stale_after_ms` the nodes decide
    /// local-only with their share, the aggregator counts them departed, and
    /// both sides pick up again when the answers come back.
    #[test]
    fn nodes_decide_local_only_while_the_aggregator_is_out_of_reach() {
        let scenario = scenario::steady(&TOPOLOGY, 4, Size::Small);
        let room = scenario.room.validate().unwrap().named(scenario.key);
        let w = TOPOLOGY.warmup_ms();
        let until = cluster::Until::Time(scenario.duration_ms);
        let run = |outage: Option<(u64, u64)>| {
            let sim = cluster::Sim::new(room.clone(), TOPOLOGY, &scenario.arrivals, 4);
            match outage {
                Some((from, to)) => sim.with_outage(from, to),
                None => sim,
            }
            .run(until)
        };
        let normal = run(None);
        let out = run(Some((w + 60_000, w + 120_000)));
        assert_eq!(normal.local_only_decisions, 0);
        assert!(
            out.local_only_decisions > 20,
            "{}",
            out.local_only_decisions
        );
        assert!(
            out.local_only_decisions < out.decisions / 4,
            "only while the answers are stale"
        );
        assert!(
            out.ledger.checks < normal.ledger.checks,
            "lost reports are not applied"
        );
        assert_eq!(normal.applied_with_departed, 0);
        assert!(
            out.applied_with_departed > 0,
            "silent past node_timeout_ms, the nodes departed"
        );
        assert_eq!(normal.outcomes.iter().filter(|o| o.queued).count(), 0);
        // Each node keeps to its own share of the limits meanwhile: a node
        // whose traffic runs above its share queues a few, and the room as a
        // whole stays within its limit.
        let queued = out.outcomes.iter().filter(|o| o.queued).count();
        assert!(queued < 10, "{queued}");
        for r in [&normal, &out] {
            let peak = r.admits_per_minute.values().max().copied().unwrap_or(0);
            assert!(peak <= room.new_users_per_minute(), "{peak}");
            assert_eq!(
                r.outcomes
                    .iter()
                    .filter(|o| o.admitted_ms.is_some())
                    .count(),
                r.outcomes.len(),
                "everyone gets in"
            );
        }
    }

    /// The targets are measured: the 7:1 burst queues visitors at 60 % of
    /// the per-minute limit (below 98 % as below 90 %). A session lasts to
    /// the end of the expiry second it is counted in, so the counters count
    /// exactly the live sessions after the uniform spike; with roaming
    /// visitors a session renewed at a second node is counted at both, and
    /// the counted number runs ahead of the true one.
    #[test]
    fn the_targets_see_early_queueing_and_the_counted_excess() {
        let burst = scenario_result("burst-7-1", 3);
        let t = &burst.targets;
        assert!(burst.queued_early > 0, "{burst:?}");
        assert!(
            t.queued_below_98 >= burst.queued_early && !t.queued_met,
            "{t:?}"
        );
        assert!(t.queued_below_98_behind_queue <= t.queued_below_98, "{t:?}");
        // The first visitor queued had nobody ahead: early by any reading.
        assert!(
            t.queued_below_98_line_fits > 0 && t.queued_below_98_line_fits <= t.queued_below_98,
            "{t:?}"
        );
        let spike = scenario_result("uniform-spike", 3);
        let c = spike.targets.counted;
        assert!(
            c.worst_relative_any == 0.0 && spike.targets.counted_met,
            "{c:?}"
        );
        let topology = harsh(Conditions {
            roaming: true,
            ..Conditions::NONE
        });
        let (roaming, _) = run_on("uniform-spike", &topology, 3);
        let c = roaming.targets.counted;
        assert!(
            c.worst_relative > 0.02 && !roaming.targets.counted_met,
            "{c:?}"
        );
        assert!(c.worst_relative_any >= c.worst_relative, "{c:?}");
        assert!(c.worst_of_total > 0.0 && c.worst_of_total < 1.0, "{c:?}");
        let steady = scenario_result("steady", 3);
        assert!(
            steady.targets.queued_met && steady.targets.peak_admits_met,
            "{steady:?}"
        );
    }

    /// `TOPOLOGY` with `conditions`.
    fn harsh(conditions: Conditions) -> Topology {
        Topology {
            conditions,
            ..TOPOLOGY
        }
    }

    fn run_on(
        key: &str,
        topology: &Topology,
        seed: u64,
    ) -> (scenario::ScenarioResult, cluster::Run) {
        run_sized(key, topology, seed, Size::Small)
    }

    fn run_sized(
        key: &str,
        topology: &Topology,
        seed: u64,
        size: Size,
    ) -> (scenario::ScenarioResult, cluster::Run) {
        let scenario = scenario::all(topology, seed, size)
            .into_iter()
            .find(|s| s.key == key)
            .expect("known scenario");
        scenario::run(&scenario, topology, seed)
    }

    /// Two aggregators, each the home of half the nodes (issue 20): with
    /// the held leases in the peer reports, the worldwide spike stays
    /// within 3 % of both limits; without them each home promises what the
    /// other's nodes hold, and the spike goes further over than with them.
    /// Over eight seeds: since idle promises keep out of half of each pool
    /// there is less for the homes to promise twice, and one seed alone
    /// (a small room: a step of 0.005) can go either way.
    /// How far the worldwide spike went over the limits (admits per minute
    /// or active, whichever further) in seeds 1-8, on the harsh network
    /// with the on-demand lease and `conditions`' aggregators.
    fn worldwide_peaks(conditions: Conditions) -> Vec<f64> {
        let topology = harsh(Conditions {
            check_ledger: false,
            lease_wait_ms: 50,
            lease_rtt_ms: 20,
            ..conditions
        });
        (1..=8)
            .map(|seed| {
                let (r, _) = run_on("uniform-spike", &topology, seed);
                r.peak_admits_ratio.max(r.peak_active_ratio)
            })
            .collect()
    }

    fn mean(v: &[f64]) -> f64 {
        v.iter().sum::<f64>() / v.len() as f64
    }

    #[test]
    fn peer_leases_keep_two_aggregators_close_to_one() {
        let over = |aggregators, peer_leases| {
            worldwide_peaks(Conditions {
                aggregators,
                peer_leases,
                ..Conditions::NONE
            })
        };
        let one = over(1, true);
        let told = over(2, true);
        let untold = over(2, false);
        eprintln!(
            "peak over the limits, seeds 1-8: one {one:.3?}, two {told:.3?}, two untold {untold:.3?}"
        );
        assert!(
            told.iter().all(|&t| t <= 1.03),
            "two aggregators, told: {told:?}"
        );
        assert!(
            mean(&untold) > mean(&told),
            "the held leases matter: {untold:?} against {told:?}"
        );
    }

    /// Nodes whose home raised their lease send their peer reports at once
    /// (as the edge does, `Homes::raised`): the other homes count the raised
    /// lease within a round trip, not from the node's next report, so they
    /// promise fewer slots twice. With two aggregators every seed of the
    /// worldwide spike stays within 2 % of the limits, and the mean at least
    /// half a point lower than with the peer reports on the tick alone
    /// (4640873: 1.006 against 1.019, one aggregator 1.004; with loans and
    /// rates on the node's clock, 1.008 against 1.018, one 1.001); with
    /// three the mean is lower too (1.011 against 1.026, then 1.011 against
    /// 1.029). Since asks go to the home only, as the edge sends them (not
    /// to every aggregator), one seed of eight is higher at once than on
    /// the tick (1.015 against 1.005); means 1.009 against 1.019 (two) and
    /// 1.009 against 1.023 (three).
    #[test]
    fn raised_leases_told_at_once_keep_several_aggregators_closer_to_one() {
        let over = |aggregators, raised_peer_reports| {
            worldwide_peaks(Conditions {
                aggregators,
                raised_peer_reports,
                ..Conditions::NONE
            })
        };
        let (at_once, on_tick) = (over(2, true), over(2, false));
        let (three_at_once, three_on_tick) = (over(3, true), over(3, false));
        eprintln!(
            "peak over the limits, seeds 1-8: two at once {at_once:.3?}, on the tick {on_tick:.3?}; three at once {three_at_once:.3?}, on the tick {three_on_tick:.3?}"
        );
        assert!(
            at_once.iter().all(|&a| a <= 1.02),
            "two aggregators, every seed within 2 %: {at_once:?} against {on_tick:?}"
        );
        assert!(
            mean(&at_once) + 0.005 < mean(&on_tick),
            "two aggregators: {at_once:?} against {on_tick:?}"
        );
        assert!(
            mean(&three_at_once) < mean(&three_on_tick),
            "three aggregators: {three_at_once:?} against {three_on_tick:?}"
        );
    }

    /// The shared grant ledger (the etcd ledger's code) and its checker.
    /// With one aggregator it may cut grants too — it counts, per pool, the
    /// larger of what a node holds and what it is granted, which the
    /// aggregator's own ledger does per pool only — but it never admits
    /// more; with two it cuts what the other home granted first. Either
    /// way the checker finds no commit that leaves the minute's caps past
    /// the limit.
    #[test]
    fn a_shared_ledger_never_admits_more_and_cuts_what_two_homes_race_for() {
        let topology = |aggregators, shared_ledger| {
            harsh(Conditions {
                aggregators,
                shared_ledger,
                check_ledger: false,
                lease_wait_ms: 50,
                lease_rtt_ms: 20,
                ..Conditions::NONE
            })
        };
        let (alone, _) = run_on("uniform-spike", &topology(1, false), 3);
        let (shared, shared_run) = run_on("uniform-spike", &topology(1, true), 3);
        assert!(shared_run.shared.checked > 0, "the checker ran");
        assert_eq!(shared_run.shared.over_limit, 0);
        assert!(
            shared.peak_admits_ratio <= alone.peak_admits_ratio,
            "{} > {}",
            shared.peak_admits_ratio,
            alone.peak_admits_ratio
        );
        let (_, two) = run_on("uniform-spike", &topology(2, true), 3);
        assert_eq!(two.shared.over_limit, 0);
        assert!(two.shared.cuts > 0, "two homes race for the same slots");
    }

    /// Every answer lost: the aggregator still gets every report, but no
    /// node ever hears back, so every decision is local-only; the nodes
    /// time out, reconnect after two misses in a row, and report again.
    #[test]
    fn with_every_answer_lost_the_nodes_decide_local_only() {
        let topology = harsh(Conditions {
            lost_answers_pct: 100,
            ..Conditions::NONE
        });
        let (r, run) = run_on("steady", &topology, 3);
        let g = r.gossip;
        assert_eq!(g.answers_taken, 0, "{g:?}");
        assert_eq!(g.lost, g.reports, "{g:?}");
        assert!(r.ledger.checks > 100, "the reports still arrive: {r:?}");
        assert_eq!(run.local_only_decisions, run.decisions);
        assert!(run.decisions > 100);
        // Two timeouts (2 s each), then the backoff (which only an answer
        // resets, so it grows to its 2.5–5 s cap) and a 1 s handshake: two
        // reports per 8–10 s, not one per second.
        assert!(
            g.reconnects >= g.timeouts / 2 - topology.nodes() as u64,
            "{g:?}"
        );
        let per_node_s = run.end_ms as f64 / 1_000.0 / g.reports as f64 * topology.nodes() as f64;
        assert!(
            (3.5..5.0).contains(&per_node_s),
            "{per_node_s} s between reports"
        );
    }

    /// Some answers lost: each loss is a timeout and the next report goes
    /// out at once; the answers are never stale long enough for local-only.
    #[test]
    fn lost_answers_time_out_and_the_node_reports_again() {
        let topology = harsh(Conditions {
            lost_answers_pct: 20,
            ..Conditions::NONE
        });
        let (r, run) = run_on("steady", &topology, 3);
        let g = r.gossip;
        let lost = g.lost as f64 / g.reports as f64;
        assert!((0.15..0.25).contains(&lost), "{g:?}");
        assert!(g.timeouts >= g.lost - topology.nodes() as u64, "{g:?}");
        assert!(g.reconnects > 0, "two losses in a row happen: {g:?}");
        // Confirmations of a lowered cap go beside the reports, on the
        // open connection like asks, and are answered or lost as they are.
        let sent = g.reports + g.confirms;
        let settled = g.answers_taken + g.lost + g.confirms_lost;
        assert!(
            settled <= sent && sent - settled <= 2 * topology.nodes() as u64,
            "every report but the last in flight is answered or lost: {g:?}"
        );
        // Stale (10 s) only after four or five losses in a row.
        assert!(
            run.local_only_decisions < run.decisions / 50,
            "{}",
            run.local_only_decisions
        );
        assert!(r.queued < r.visitors / 50, "{r:?}");
    }

    /// Held-back answers: some arrive late but in time and are taken, the
    /// others after the node stopped waiting and are ignored; the node never
    /// takes an answer older than the one it holds.
    #[test]
    fn reordered_answers_are_taken_late_or_ignored_never_going_back() {
        let topology = harsh(Conditions {
            reordered_answers_pct: 50,
            ..Conditions::NONE
        });
        let (r, _) = run_on("uniform-spike", &topology, 3);
        let g = r.gossip;
        assert!(g.late_taken > g.reports / 10, "{g:?}");
        assert!(g.late_ignored > g.reports / 10, "{g:?}");
        assert_eq!(g.late_ignored, g.timeouts - g.lost, "{g:?}");
        assert_eq!(g.went_back, 0, "{g:?}");
        assert!(
            r.peak_active_ratio <= 1.02 && r.peak_admits_ratio <= 1.05,
            "{r:?}"
        );
    }

    /// Skewed clocks, the nodes following the cluster's clock (the edge's
    /// `Clock::following`): answered, every node's clock is within half a
    /// round trip of the aggregator's, whatever its wall clock says; counting
    /// on their own wall clocks, they stay up to the skew apart, and the
    /// worldwide spike goes further over the per-minute limit (seeds 1-8:
    /// a node ahead starts its new minute while the others still spend the
    /// old one).
    #[test]
    fn nodes_that_follow_the_cluster_clock_undo_their_skew() {
        let follow = harsh(Conditions {
            skew_ms: 500,
            ..LEASED
        });
        let own = harsh(Conditions {
            follow_clock: false,
            ..follow.conditions
        });
        let (mut followed, mut not) = (0.0, 0.0);
        for seed in 1..=8 {
            let (r, run) = run_on("uniform-spike", &follow, seed);
            assert!(
                run.clock_offsets_ms.iter().all(|o| (-10..=10).contains(o)),
                "{:?}",
                run.clock_offsets_ms
            );
            followed += r.peak_admits_ratio;
            let (r, run) = run_on("uniform-spike", &own, seed);
            assert!(
                run.clock_offsets_ms.iter().any(|o| o.abs() > 100),
                "{:?}",
                run.clock_offsets_ms
            );
            not += r.peak_admits_ratio;
        }
        assert!(followed < not, "{followed} < {not}");
    }

    /// A lost answer to an ask: the node asks again after a few round
    /// trips (`promise::ask_timeout_ms`), as the edge's client does, rather
    /// than hold nobody until its periodic answer. With 10 % of answers
    /// lost, over seeds 1-16 and the three spikes, fewer visitors are queued
    /// with room for the whole line ahead of them than when a lost ask is
    /// waited for as a periodic answer, and the limits hold as well.
    #[test]
    fn a_lost_ask_is_asked_again_and_fewer_visitors_queue_behind_it() {
        let again = harsh(Conditions {
            lost_answers_pct: 10,
            ..LEASED
        });
        let wait = harsh(Conditions {
            ask_again_when_lost: false,
            ..again.conditions
        });
        let (mut queued_again, mut queued_wait, mut asked_again) = (0, 0, 0);
        for seed in 1..=16 {
            for key in ["colo-spike", "uniform-spike", "burst-7-1"] {
                let (r, _) = run_on(key, &again, seed);
                queued_again += r.targets.queued_below_98_line_fits;
                asked_again += r.gossip.asks_again;
                assert!(
                    r.peak_admits_ratio <= 1.02 && r.peak_active_ratio <= 1.02,
                    "{key} {seed}: {r:?}"
                );
                let (r, _) = run_on(key, &wait, seed);
                queued_wait += r.targets.queued_below_98_line_fits;
                assert_eq!(r.gossip.asks_again, 0, "never asked again");
            }
        }
        println!(
            "queued with room for the line: {queued_again} asking again, {queued_wait} waiting; {asked_again} asked again"
        );
        assert!(asked_again > 0, "lost asks were asked again");
        assert!(queued_again < queued_wait, "{queued_again} < {queued_wait}");
    }

    /// Scenario `key` over seeds 1..=`seeds` under `after` and `before`:
    /// the visitors queued with room for the whole line under each. Every
    /// run under `after` holds both limits within `peak`; `each` sees the
    /// two results of every seed.
    fn queued_after_and_before(
        key: &str,
        seeds: u64,
        topologies: (&Topology, &Topology),
        peak: f64,
        each: impl FnMut(&scenario::ScenarioResult, &scenario::ScenarioResult),
    ) -> (u64, u64) {
        queued_after_and_before_at(Size::Small, key, seeds, topologies, peak, each)
    }

    /// [`queued_after_and_before`] at `size`.
    fn queued_after_and_before_at(
        size: Size,
        key: &str,
        seeds: u64,
        (after, before): (&Topology, &Topology),
        peak: f64,
        mut each: impl FnMut(&scenario::ScenarioResult, &scenario::ScenarioResult),
    ) -> (u64, u64) {
        let (mut queued_after, mut queued_before) = (0, 0);
        for seed in 1..=seeds {
            let (a, _) = run_sized(key, after, seed, size);
            assert!(
                a.peak_admits_ratio <= peak && a.peak_active_ratio <= peak,
                "{seed}: {a:?}"
            );
            let (b, _) = run_sized(key, before, seed, size);
            queued_after += a.targets.queued_below_98_line_fits;
            queued_before += b.targets.queued_below_98_line_fits;
            each(&a, &b);
        }
        (queued_after, queued_before)
    }

    /// The on-demand lease as the command runs it (a 50 ms hold, asks
    /// answered in 20 ms), without the ledger check.
    const LEASED: Conditions = Conditions {
        lease_wait_ms: 50,
        lease_rtt_ms: 20,
        check_ledger: false,
        ..Conditions::NONE
    };

    /// The command's topology (four colos of two nodes) with the lease as
    /// it runs it.
    fn command_topology() -> Topology {
        Topology {
            colos: 4,
            ..harsh(LEASED)
        }
    }

    /// `after` with the condition `flag` picks turned off; it must be on
    /// (the default the comparison is about).
    fn without(after: &Topology, flag: impl FnOnce(&mut Conditions) -> &mut bool) -> Topology {
        let mut before = *after;
        let on = flag(&mut before.conditions);
        assert!(*on, "the condition compared is on by default");
        *on = false;
        before
    }

    /// Steady traffic under the hostile preset: a held visitor's ask whose
    /// answer is lost is sent again within the hold
    /// (`promise::ask_within_hold_ms`, 25 ms at a 50 ms hold and 20 ms round
    /// trips; the default), so a quarter as many visitors or fewer are
    /// queued with room for the whole line than when the ask goes again
    /// after `promise::ask_timeout_ms` (`--ask-again-late`: 100 ms, after
    /// the hold has queued the visitor), and the limits hold. Both wait for
    /// a lost confirmation as for an ask (the default).
    #[test]
    fn a_late_ask_sent_again_within_the_hold_queues_fewer_in_steady_traffic() {
        // The hostile preset: 10 % of answers lost, random phases, skew.
        let after = Preset::Hostile.apply(harsh(LEASED));
        assert!(after.conditions.confirm_like_ask);
        let before = without(&after, |c| &mut c.ask_within_hold);
        let (queued_after, queued_before) =
            queued_after_and_before("steady", 64, (&after, &before), 1.01, |_, _| {});
        println!(
            "queued with room for the line: {queued_after} within the hold, {queued_before} after it"
        );
        assert!(
            queued_after * 4 < queued_before,
            "{queued_after} × 4 < {queued_before}"
        );
    }

    /// The worldwide spike under the hostile preset: a report confirming a
    /// lowered cap whose answer is lost is waited for as an ask
    /// (`promise::ask_timeout_ms`, 100 ms) and sent again at once (the
    /// default), so fewer visitors are queued with room for the whole line
    /// than when it is waited for as a periodic report
    /// (`--confirm-waited-full`: 2 s, in which no held visitor's ask can
    /// go), and the limits hold.
    #[test]
    fn a_lost_confirmation_waited_for_as_an_ask_queues_fewer_in_a_spike() {
        const KEY: &str = "uniform-spike";
        const SEEDS: u64 = 16;
        let after = Preset::Hostile.apply(harsh(LEASED));
        let before = without(&after, |c| &mut c.confirm_like_ask);
        let mut sent_again = 0;
        let (queued_after, queued_before) =
            queued_after_and_before(KEY, SEEDS, (&after, &before), 1.02, |a, b| {
                sent_again += a.gossip.confirms_again;
                assert_eq!(b.gossip.confirms_again, 0, "never sent again");
            });
        println!(
            "queued with room for the line: {queued_after} waited for as an ask, {queued_before} as a report; {sent_again} sent again"
        );
        assert!(sent_again > 0, "lost confirmations were sent again");
        assert!(
            queued_after * 2 < queued_before,
            "{queued_after} × 2 < {queued_before}"
        );
    }

    /// The hostile preset with 30 % of answers lost: a report sent again
    /// after a lost ask is itself lost about one time in three. Waited for
    /// as the ask it repeats (the default, as the edge's client does), the
    /// 7:1 burst queues fewer visitors with room for the line than when it
    /// is waited for as a periodic report (`--again-waited-full`: 2 s
    /// without a hold, in which a line forms at the burst's start; 86
    /// against 216 when written), and the limits hold. (At 10 % the
    /// small-sized runs here differ too little to tell: 32 against 45.)
    #[test]
    fn a_report_sent_again_waited_for_as_the_ask_queues_fewer_in_a_burst() {
        const KEY: &str = "burst-7-1";
        const SEEDS: u64 = 16;
        let mut after = Preset::Hostile.apply(harsh(Conditions {
            aggregators: 2,
            ..LEASED
        }));
        after.conditions.lost_answers_pct = 30;
        let before = without(&after, |c| &mut c.again_like_ask);
        let (queued_after, queued_before) =
            queued_after_and_before(KEY, SEEDS, (&after, &before), 1.02, |_, _| {});
        println!(
            "queued with room for the line: {queued_after} sent again like the ask, {queued_before} waited for as a report"
        );
        assert!(
            queued_after * 2 < queued_before,
            "{queued_after} × 2 < {queued_before}"
        );
    }

    /// Steady traffic over 120 nodes under the hostile preset: a node's
    /// idle promise is under a slot, so a report sent again after a lost
    /// ask, which counts nobody new since the ask, is promised nothing for
    /// the visitor it holds unless it names them (`Message::HeldReport`,
    /// the default). Naming them queues far fewer with room for the whole
    /// line than `--held-unnamed` (seeds 1-4 here: 8 against 54 when
    /// written; seed 1 at full size: 5 against 42; at 1,200 nodes 18
    /// against 173), and the limits hold.
    #[test]
    fn held_visitors_named_in_the_report_queue_fewer_at_scale() {
        let after = Preset::Hostile.apply(Topology {
            colos: 30,
            nodes_per_colo: 4,
            ..harsh(LEASED)
        });
        let before = without(&after, |c| &mut c.name_held_visitors);
        let (queued_after, queued_before) =
            queued_after_and_before("steady", 4, (&after, &before), 1.01, |_, _| {});
        println!(
            "queued with room for the line: {queued_after} with held visitors named, {queued_before} without"
        );
        assert!(
            queued_after * 3 < queued_before,
            "{queued_after} × 3 < {queued_before}"
        );
    }

    /// The 7:1 burst, no answer lost: the bursting node's held visitors
    /// outnumber what an ask is promised near the minute's last slots (half
    /// of what is free). Held on once for the next ask's answer (the
    /// default), fewer are queued with room for the whole line than when
    /// they decide on the first answer (`--hold-once`), and the limits
    /// hold. Four colos of two nodes, 32 seeds at the small size.
    #[test]
    fn held_visitors_held_on_once_queue_fewer_in_a_burst() {
        let after = command_topology();
        let before = without(&after, |c| &mut c.hold_again);
        let (queued_after, queued_before) =
            queued_after_and_before("burst-7-1", 32, (&after, &before), 1.01, |_, _| {});
        println!("queued with room for the line: {queued_after} held on once, {queued_before} not");
        // 32 against 39 when written (the small size; at full size, seeds
        // 1-24, 17 against 41).
        assert!(
            queued_after * 10 <= queued_before * 9,
            "{queued_after} at least a tenth below {queued_before}"
        );
    }

    /// The 7:1 burst, no answer lost: a burst late in a minute spends its
    /// last slots far faster than the minute's average says, and the slow
    /// node's promise (two seconds of its rate) held slots the bursting
    /// node's visitors were queued without. Paced by the room's recent
    /// pace as well (the default), fewer are queued with room for the
    /// whole line than with the minute's average alone
    /// (`--average-pace-only`), and the limits hold. Four colos of two
    /// nodes, 12 seeds at full size (at the small size, a fifth of the
    /// traffic and limits, the burst's last slots go too fast for either
    /// to matter much: 28 against 32 over 32 seeds).
    #[test]
    fn promises_paced_by_the_recent_pace_queue_fewer_in_a_burst() {
        let after = command_topology();
        let before = without(&after, |c| &mut c.recent_pace);
        let (queued_after, queued_before) = queued_after_and_before_at(
            Size::Full,
            "burst-7-1",
            12,
            (&after, &before),
            1.01,
            |_, _| {},
        );
        println!(
            "queued with room for the line: {queued_after} paced by the recent pace too, {queued_before} by the average alone"
        );
        // 0 against 13 when written.
        assert!(
            queued_before >= 5,
            "the burst shows the lag: {queued_before}"
        );
        assert!(
            queued_after * 2 <= queued_before,
            "{queued_after} at most half of {queued_before}"
        );
    }

    /// Skewed clocks: the nodes report with their own time, off by up to
    /// the skew, until their first answer; the limits hold.
    #[test]
    fn skewed_nodes_report_their_own_time() {
        let none = run_on("uniform-spike", &TOPOLOGY, 3).0;
        assert_eq!(none.gossip.max_report_skew_ms, 0);
        let topology = harsh(Conditions {
            skew_ms: 500,
            ..Conditions::NONE
        });
        let (r, _) = run_on("uniform-spike", &topology, 3);
        let skew = r.gossip.max_report_skew_ms;
        assert!((200..=500).contains(&skew), "{skew}");
        assert_ne!(r, none, "the skew changes what happens");
        assert!(
            r.peak_active_ratio <= 1.02 && r.peak_admits_ratio <= 1.05,
            "{r:?}"
        );
    }

    /// Roaming visitors' requests land on several nodes of their colo, with
    /// the ticket they carry; without roaming none does.
    #[test]
    fn roaming_visitors_reach_more_than_one_node() {
        let (stay, _) = run_on("colo-spike", &TOPOLOGY, 3);
        assert_eq!(stay.roamed, 0);
        let topology = harsh(Conditions {
            roaming: true,
            ..Conditions::NONE
        });
        let (r, run) = run_on("colo-spike", &topology, 3);
        assert!(r.roamed > r.visitors / 3, "{r:?}");
        assert!(
            run.outcomes
                .iter()
                .any(|o| o.roamed && o.queued && o.admitted_ms.is_some())
        );
        assert!(
            r.peak_active_ratio <= 1.02 && r.peak_admits_ratio <= 1.05,
            "{r:?}"
        );
    }

    /// Visitors who give up stop checking in: they are queued, never
    /// admitted, and counted as given up; the others still get in.
    #[test]
    fn queued_visitors_give_up_and_are_never_admitted() {
        let topology = harsh(Conditions {
            give_up_pct: 50,
            give_up_after_ms: 30_000,
            ..Conditions::NONE
        });
        let (r, run) = run_on("uniform-spike", &topology, 3);
        assert!(r.given_up > 20, "{r:?}");
        for o in run.outcomes.iter().filter(|o| o.gave_up) {
            assert!(o.queued && o.admitted_ms.is_none(), "{o:?}");
        }
        assert_eq!(r.admitted + r.given_up, r.visitors, "{r:?}");
        // The patient ones: nobody waits past the give-up time and then
        // gives up, so those who did give up were all queued at least 30 s.
        let (all_wait, _) = run_on("uniform-spike", &TOPOLOGY, 3);
        assert_eq!(all_wait.given_up, 0);
        assert!(
            r.max_wait_s <= all_wait.max_wait_s,
            "fewer ahead of them: {r:?}"
        );
        // The fairness run ends once everyone is admitted or gone.
        let (stats, _) =
            fairness::run_method(&Setup::new(600, 5), &topology, 1, QueueingMethod::Fifo);
        assert!(stats.admitted < stats.visitors, "{stats:?}");
    }

    /// Random phases spread the nodes' first reports over the interval.
    #[test]
    fn random_phases_spread_the_reports_and_change_the_run() {
        let topology = Topology {
            phases: Phases::Random,
            ..TOPOLOGY
        };
        assert_eq!(topology.phase_ms(3, 0.5), 500);
        assert_eq!(TOPOLOGY.phase_ms(3, 0.5), 750);
        let (r, _) = run_on("uniform-spike", &topology, 3);
        assert_ne!(r, run_on("uniform-spike", &TOPOLOGY, 3).0);
        assert!(
            r.peak_active_ratio <= 1.02 && r.peak_admits_ratio <= 1.05,
            "{r:?}"
        );
    }

    /// Skipping the ledger check (for the scale run) changes nothing but the check.
    #[test]
    fn the_ledger_check_only_watches() {
        let topology = harsh(Conditions {
            check_ledger: false,
            ..Conditions::NONE
        });
        let (without, _) = run_on("colo-spike", &topology, 3);
        let (with, _) = run_on("colo-spike", &TOPOLOGY, 3);
        assert_eq!(without.ledger, cluster::LedgerCheck::default());
        assert!(with.ledger.checks > 0);
        assert_eq!(
            scenario::ScenarioResult {
                ledger: with.ledger,
                ..without
            },
            with
        );
    }

    /// Issue 15's hostile network (10 % lost answers, random phases, ±500 ms
    /// skew): every scenario stays within the slack of
    /// `uniform_spike_after_low_utilisation_stays_within_the_limits` (2 % on
    /// the total, 5 % on the per-minute limit), and the conditions happened.
    #[test]
    fn the_hostile_preset_keeps_the_limits_within_the_slack() {
        let hostile = Preset::Hostile.apply(TOPOLOGY);
        assert_eq!(hostile.phases, Phases::Random);
        assert_eq!(hostile.conditions.lost_answers_pct, 10);
        assert_eq!(hostile.conditions.skew_ms, 500);
        for scenario in scenario::all(&hostile, 3, Size::Small) {
            let (r, _) = scenario::run(&scenario, &hostile, 3);
            assert!(r.peak_active_ratio <= 1.02, "{r:?}");
            assert!(r.peak_admits_ratio <= 1.05, "{r:?}");
            assert!(r.gossip.lost > r.gossip.reports / 20, "{r:?}");
            assert!(r.gossip.max_report_skew_ms > 100, "{r:?}");
        }
    }

    #[test]
    fn spearman_of_ordered_reversed_and_tied_series() {
        let x = [1.0, 2.0, 3.0, 4.0];
        assert!((fairness::spearman(&x, &[10.0, 20.0, 30.0, 40.0]) - 1.0).abs() < 1e-12);
        assert!((fairness::spearman(&x, &[4.0, 3.0, 2.0, 1.0]) + 1.0).abs() < 1e-12);
        assert_eq!(fairness::spearman(&x, &[5.0; 4]), 0.0, "constant series");
        // Ties get their average rank: y ranks 1.5, 1.5, 3, 4.
        let tied = fairness::spearman(&x, &[1.0, 1.0, 2.0, 3.0]);
        assert!((tied - 0.948_683).abs() < 1e-6, "{tied}");
    }

    #[test]
    fn histogram_bins_and_png_heatmap() {
        let points = [(0.0, 0.0), (29.9, 100.0), (30.0, 200.0), (15.0, 50.0)];
        let grid = plot::histogram2d(&points, 30.0, 100.0, 30);
        assert_eq!(grid[0][0], 1);
        assert_eq!(grid[29][29], 2, "edges and beyond land in the last bin");
        assert_eq!(grid[15][15], 1);
        assert_eq!(grid.iter().flatten().sum::<u64>(), 4);
        let path =
            std::env::temp_dir().join(format!("waitroom-heatmap-{}.png", std::process::id()));
        plot::heatmap(&path, "test", &points, 30.0, 100.0, 30).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert!(bytes.len() > 5_000, "a drawn picture, not an empty one");
    }
}
