//! Seed 001's fairness experiment: visitors arriving uniformly over 30
//! minutes, about a minute of browsing each, once with FIFO and once with
//! random queueing, on the same arrivals and the same seed.
//!
//! Limits are set from the arrival rate so that a queue forms and lasts: new
//! users per minute at 60 % of the arrival rate (200 for 10,000 visitors) and
//! total active users at three times that (600), with 1-minute sessions. The
//! per-minute limit is the one that binds.
//!
//! Besides the heatmaps, [`FairnessStats`] sums up what the seed reads off
//! them: how strongly admission order follows arrival order (Spearman), how
//! far a FIFO visitor can be overtaken by a later bucket, and how much wait
//! times spread within one arrival minute.
use std::{fmt::Write as _, fs, path::Path};

use anyhow::{Context as _, Result};
use serde::Serialize;
use waitroom_common::room::{QueueingMethod, RoomConfig};

use super::{
    cluster::{LedgerCheck, Outcome, Run, Sim, Topology, Until},
    plot,
    scenario::{Segment, arrivals, room_config},
};

const MINUTE: u64 = 60_000;

/// The experiment's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Setup {
    pub visitors: u64,
    pub arrival_minutes: u64,
    pub total_active_users: u64,
    pub new_users_per_minute: u64,
    pub session_minutes: u32,
    pub refresh_interval_secs: u16,
}

impl Setup {
    /// Limits for `visitors` over `arrival_minutes` (see the module docs).
    #[must_use]
    pub fn new(visitors: u64, arrival_minutes: u64) -> Self {
        let per_minute = (visitors * 3 / 5 / arrival_minutes).max(1);
        Self {
            visitors,
            arrival_minutes,
            total_active_users: per_minute * 3,
            new_users_per_minute: per_minute,
            session_minutes: 1,
            refresh_interval_secs: 20,
        }
    }

    fn room(&self, method: QueueingMethod) -> RoomConfig {
        RoomConfig {
            queueing_method: method,
            refresh_interval: self.refresh_interval_secs,
            ..room_config(
                self.total_active_users,
                self.new_users_per_minute,
                self.session_minutes,
            )
        }
    }
}

/// What one queueing method did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FairnessStats {
    pub method: String,
    pub visitors: u64,
    pub admitted: u64,
    pub queued: u64,
    /// Rank correlation of arrival time and admission time, every visitor.
    pub spearman_arrival_admission: f64,
    /// The same among visitors who were queued.
    pub spearman_queued: f64,
    /// Rank correlation of arrival minute and wait time.
    pub spearman_bucket_wait: f64,
    /// Longest a visitor was admitted after someone of a later arrival minute.
    pub max_overtaken_by_later_bucket_s: f64,
    /// Mean over arrival minutes of the standard deviation of wait times.
    pub mean_wait_spread_in_minute_s: f64,
    pub wait_p50_s: f64,
    pub wait_p90_s: f64,
    pub wait_max_s: f64,
    /// Virtual minutes until the last visitor was admitted.
    pub drained_after_min: f64,
    /// The aggregator's Anywhere ledger in this run.
    pub ledger: LedgerCheck,
}

/// Runs the experiment for one method.
#[must_use]
pub fn run_method(
    setup: &Setup,
    topology: &Topology,
    seed: u64,
    method: QueueingMethod,
) -> (FairnessStats, Run) {
    let w = topology.warmup_ms();
    let arrivals = arrivals(
        seed,
        &[Segment {
            from_ms: w,
            to_ms: w + setup.arrival_minutes * MINUTE,
            visitors: setup.visitors,
            nodes: (0..topology.nodes()).map(|n| (n, 1)).collect(),
        }],
    );
    let room = setup
        .room(method)
        .validate()
        .expect("the fairness room is valid")
        .named("fairness");
    let run = Sim::new(room, *topology, &arrivals, seed).run(Until::AllAdmitted {
        latest_ms: w + 12 * 60 * MINUTE,
    });
    (stats(QueueingMethod::name(method), &run, w), run)
}

/// Arrival minute counted from the start of the arrivals (0 ..= 29); the
/// arrivals start on a minute boundary, so this is the queue bucket.
#[must_use]
pub fn arrival_minute(outcome: &Outcome, warmup_ms: u64) -> u64 {
    (outcome.arrival_ms - warmup_ms) / MINUTE
}

fn stats(method: &str, run: &Run, warmup_ms: u64) -> FairnessStats {
    let admitted: Vec<&Outcome> = run
        .outcomes
        .iter()
        .filter(|o| o.admitted_ms.is_some())
        .collect();
    let queued: Vec<&Outcome> = admitted.iter().copied().filter(|o| o.queued).collect();
    let order = |set: &[&Outcome]| {
        let arrival: Vec<f64> = set.iter().map(|o| o.arrival_ms as f64).collect();
        let admission: Vec<f64> = set
            .iter()
            .map(|o| o.admitted_ms.unwrap_or_default() as f64)
            .collect();
        spearman(&arrival, &admission)
    };
    let waits: Vec<f64> = admitted.iter().filter_map(|o| o.wait_secs()).collect();
    let buckets: Vec<f64> = admitted
        .iter()
        .map(|o| arrival_minute(o, warmup_ms) as f64)
        .collect();
    let mut sorted = waits.clone();
    sorted.sort_by(f64::total_cmp);
    FairnessStats {
        method: method.to_owned(),
        visitors: run.outcomes.len() as u64,
        admitted: admitted.len() as u64,
        queued: queued.len() as u64,
        spearman_arrival_admission: order(&admitted),
        spearman_queued: order(&queued),
        spearman_bucket_wait: spearman(&buckets, &waits),
        max_overtaken_by_later_bucket_s: max_overtaken_s(&admitted),
        mean_wait_spread_in_minute_s: mean_spread_per_minute(&admitted, warmup_ms),
        wait_p50_s: quantile(&sorted, 0.5),
        wait_p90_s: quantile(&sorted, 0.9),
        wait_max_s: sorted.last().copied().unwrap_or(0.0),
        drained_after_min: admitted
            .iter()
            .filter_map(|o| o.admitted_ms)
            .max()
            .map_or(0.0, |t| t.saturating_sub(warmup_ms) as f64 / MINUTE as f64),
        ledger: run.ledger,
    }
}

/// max over arrival minutes b of (last admission of anyone who arrived in or
/// before b) − (first admission of anyone who arrived after b), in seconds;
/// 0 when no later bucket ever went first.
#[must_use]
pub fn max_overtaken_s(admitted: &[&Outcome]) -> f64 {
    let mut by_bucket: std::collections::BTreeMap<u64, (u64, u64)> = Default::default();
    for o in admitted {
        let t = o.admitted_ms.expect("admitted");
        let entry = by_bucket.entry(o.bucket).or_insert((t, t));
        entry.0 = entry.0.min(t);
        entry.1 = entry.1.max(t);
    }
    let spans: Vec<(u64, u64)> = by_bucket.into_values().collect();
    let mut suffix_min = vec![u64::MAX; spans.len() + 1];
    for i in (0..spans.len()).rev() {
        suffix_min[i] = suffix_min[i + 1].min(spans[i].0);
    }
    let mut prefix_max = 0;
    let mut worst = 0;
    for (i, &(_, last)) in spans.iter().enumerate() {
        prefix_max = prefix_max.max(last);
        worst = worst.max(prefix_max.saturating_sub(suffix_min[i + 1]));
    }
    worst as f64 / 1_000.0
}

fn mean_spread_per_minute(admitted: &[&Outcome], warmup_ms: u64) -> f64 {
    let mut by_minute: std::collections::BTreeMap<u64, Vec<f64>> = Default::default();
    for o in admitted {
        by_minute
            .entry(arrival_minute(o, warmup_ms))
            .or_default()
            .extend(o.wait_secs());
    }
    let spreads: Vec<f64> = by_minute
        .values()
        .filter(|w| w.len() > 1)
        .map(|w| {
            let mean = w.iter().sum::<f64>() / w.len() as f64;
            (w.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / w.len() as f64).sqrt()
        })
        .collect();
    if spreads.is_empty() {
        0.0
    } else {
        spreads.iter().sum::<f64>() / spreads.len() as f64
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

/// Ranks from 1, ties given their average rank.
fn ranks(values: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    let mut ranks = vec![0.0; values.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && values[order[j + 1]] == values[order[i]] {
            j += 1;
        }
        let rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            ranks[k] = rank;
        }
        i = j + 1;
    }
    ranks
}

/// Spearman's rank correlation (Pearson's on the ranks); 0 for fewer than
/// two points or a constant series.
#[must_use]
pub fn spearman(x: &[f64], y: &[f64]) -> f64 {
    assert_eq!(x.len(), y.len(), "paired samples");
    if x.len() < 2 {
        return 0.0;
    }
    let (rx, ry) = (ranks(x), ranks(y));
    let n = x.len() as f64;
    let (mx, my) = (rx.iter().sum::<f64>() / n, ry.iter().sum::<f64>() / n);
    let (mut cov, mut vx, mut vy) = (0.0, 0.0, 0.0);
    for (a, b) in rx.iter().zip(&ry) {
        cov += (a - mx) * (b - my);
        vx += (a - mx).powi(2);
        vy += (b - my).powi(2);
    }
    if vx == 0.0 || vy == 0.0 {
        0.0
    } else {
        cov / (vx * vy).sqrt()
    }
}

/// Runs both methods, prints the summary table and writes CSV, JSON and PNGs.
pub fn run_and_write(topology: &Topology, seed: u64, visitors: u64, out: &Path) -> Result<()> {
    let setup = Setup::new(visitors, 30);
    let w = topology.warmup_ms();
    println!(
        "fairness (seed 001): {} visitors uniformly over {} minutes, browsing 30–90 s; limits {} active / {} new per minute, {}-minute sessions, {} s refresh",
        setup.visitors,
        setup.arrival_minutes,
        setup.total_active_users,
        setup.new_users_per_minute,
        setup.session_minutes,
        setup.refresh_interval_secs
    );
    println!();
    println!(
        "| method | queued | Spearman arrival↔admission (all / queued) | Spearman arrival minute↔wait | max overtaken by a later minute | wait spread within a minute (σ) | wait p50 / p90 / max | drained after |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let runs: Vec<(FairnessStats, Run)> = [QueueingMethod::Fifo, QueueingMethod::Random]
        .into_iter()
        .map(|method| run_method(&setup, topology, seed, method))
        .collect();
    let wait_max = runs.iter().map(|(s, _)| s.wait_max_s).fold(0.0, f64::max);
    // The same axes for both heatmaps, so they can be compared side by side.
    let y_max = (wait_max / 60.0).ceil().max(1.0) * 60.0;
    for (stats, run) in &runs {
        println!(
            "| {} | {} of {} | {:.3} / {:.3} | {:.3} | {:.0} s | {:.0} s | {:.0} / {:.0} / {:.0} s | {:.1} min |",
            stats.method,
            stats.queued,
            stats.visitors,
            stats.spearman_arrival_admission,
            stats.spearman_queued,
            stats.spearman_bucket_wait,
            stats.max_overtaken_by_later_bucket_s,
            stats.mean_wait_spread_in_minute_s,
            stats.wait_p50_s,
            stats.wait_p90_s,
            stats.wait_max_s,
            stats.drained_after_min
        );
        let points: Vec<(f64, f64)> = run
            .outcomes
            .iter()
            .filter_map(|o| o.wait_secs().map(|w_s| (arrival_minute(o, w) as f64, w_s)))
            .collect();
        write_csv(out, &stats.method, run, w)?;
        let png = out.join(format!("fairness-{}.png", stats.method));
        let title = format!(
            "{}: wait against arrival minute ({} visitors, seed {seed})",
            stats.method.to_uppercase(),
            stats.visitors
        );
        plot::heatmap(
            &png,
            &title,
            &points,
            setup.arrival_minutes as f64,
            y_max,
            30,
        )?;
    }
    println!();
    for (stats, _) in &runs {
        println!("{}: {}", stats.method, super::ledger_line(&stats.ledger));
    }
    println!();
    let json = serde_json::json!({
        "seed": seed,
        "setup": setup,
        "results": runs.iter().map(|(s, _)| s).collect::<Vec<_>>(),
    });
    let path = out.join("fairness.json");
    fs::write(&path, serde_json::to_string_pretty(&json)?)
        .with_context(|| format!("writing {}", path.display()))
}

fn write_csv(out: &Path, method: &str, run: &Run, warmup_ms: u64) -> Result<()> {
    let mut csv = String::from("visitor,node,arrival_minute,arrival_s,wait_s,queued\n");
    for (i, o) in run.outcomes.iter().enumerate() {
        let Some(wait) = o.wait_secs() else { continue };
        writeln!(
            csv,
            "{i},{},{},{:.3},{wait:.3},{}",
            o.node,
            arrival_minute(o, warmup_ms),
            (o.arrival_ms - warmup_ms) as f64 / 1_000.0,
            o.queued
        )?;
    }
    let path = out.join(format!("fairness-{method}.csv"));
    fs::write(&path, csv).with_context(|| format!("writing {}", path.display()))
}
