//! `cargo xtask simulate`: how close to its limits the real engine queues,
//! and how fair its queues are, in seeded virtual time.
//!
//! The simulator re-implements nothing: every request is the engine's
//! `decide`, every gossip round the engine's `aggregate` over the nodes'
//! `RoomCounters::report`s (see [`cluster`]). Same seed, same output.
//!
//! # Layout
//! - [`cluster`]: the discrete-event loop (nodes, aggregator, visitors).
//! - [`scenario`]: the four accuracy scenarios and their measurements.
//! - [`fairness`]: seed 001's experiment, FIFO against random.
//! - [`plot`]: the heatmap PNGs.
//!
//! Output: a Markdown table on stdout, and CSV, JSON and PNG files under
//! `target/simulate/`.
use std::{fmt::Write as _, fs, path::PathBuf, time::Instant};

use anyhow::{Context as _, Result};

use crate::cmd;

pub mod cluster;
pub mod fairness;
pub mod plot;
pub mod scenario;

use cluster::Topology;

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
    /// Time between gossip rounds.
    #[arg(long, default_value_t = 1_000)]
    gossip_interval_ms: u64,
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

pub fn run(args: &Args) -> Result<()> {
    anyhow::ensure!(
        args.colos >= 1 && args.nodes_per_colo >= 1 && args.colos * args.nodes_per_colo >= 2,
        "need at least two nodes (the 7:1 burst splits between two)"
    );
    anyhow::ensure!(
        args.gossip_interval_ms >= 1,
        "--gossip-interval-ms must be at least 1"
    );
    let topology = Topology {
        colos: args.colos,
        nodes_per_colo: args.nodes_per_colo,
        gossip_delay_ms: args.gossip_delay_ms,
        gossip_interval_ms: args.gossip_interval_ms,
    };
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| cmd::workspace_root().join("target").join("simulate"));
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    println!(
        "simulate: seed {}, {} colos × {} nodes, gossip every {} ms, answers {} ms old",
        args.seed,
        topology.colos,
        topology.nodes_per_colo,
        topology.gossip_interval_ms,
        topology.gossip_delay_ms
    );
    if args.only != Some(Part::Fairness) {
        run_scenarios(&topology, args.seed, &out)?;
    }
    if args.only != Some(Part::Scenarios) {
        fairness::run_and_write(&topology, args.seed, args.fairness_visitors, &out)?;
    }
    println!("files in {}", out.display());
    Ok(())
}

fn run_scenarios(topology: &Topology, seed: u64, out: &std::path::Path) -> Result<()> {
    let mut results = Vec::new();
    println!();
    println!("{}", table_header());
    for scenario in scenario::all(topology, seed, scenario::Size::Full) {
        let started = Instant::now();
        let (result, run) = scenario::run(&scenario, topology, seed);
        println!("{}", table_row(&result));
        tracing_line(&result, started.elapsed().as_secs_f64());
        write_timeline(out, &result.key, &run.timeline)?;
        results.push(result);
    }
    println!();
    write_results(out, &results)
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

fn write_results(out: &std::path::Path, results: &[scenario::ScenarioResult]) -> Result<()> {
    let json = out.join("scenarios.json");
    fs::write(&json, serde_json::to_string_pretty(results)?)
        .with_context(|| format!("writing {}", json.display()))?;
    let mut csv = String::from(
        "scenario,total_active_users,new_users_per_minute,visitors,admitted,queued,queued_early,peak_active,peak_active_ratio,peak_active_counted_ratio,peak_admits_per_minute,peak_admits_ratio,first_queue_at_s,first_queue_active_ratio,first_queue_admits_ratio,max_wait_s,decisions\n",
    );
    let opt = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.4}"));
    for r in results {
        writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{:.4},{:.4},{},{:.4},{},{},{},{:.1},{}",
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
            r.decisions
        )?;
    }
    let path = out.join("scenarios.csv");
    fs::write(&path, csv).with_context(|| format!("writing {}", path.display()))
}

fn write_timeline(out: &std::path::Path, key: &str, timeline: &[cluster::Sample]) -> Result<()> {
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
        cluster::Topology,
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

    /// The seed's overshoot case. Slack: 2 % on each limit, what one gossip
    /// delay of admits made under the previous round's caps can add (see
    /// docs/BENCHMARKS.md); before the engine kept new visitors off the
    /// eligible reservation this scenario admitted 7 % over the per-minute limit.
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
