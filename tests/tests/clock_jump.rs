//! A node's clock steps across a minute boundary (issue 20, item 4): NTP
//! stepping a clock that drifted, a VM resumed after a pause. One
//! aggregator and three nodes in two colos, in this process, each node on
//! its own driven clock, gossiping over real QUIC and serving visitors over
//! real HTTP (`waitroom_tests::inproc_cluster`).
//!
//! Demand is twice the per-minute limit at every node for three minutes;
//! in the first of them one node's clock steps a minute forward (or back)
//! and stays there. Minutes are the aggregator's (the cluster's) clock:
//! what the site sees.
//!
//! What is asserted, for a step either way:
//! - the step is not an outage: right after it, before any new answer, the
//!   stepped node still counts its last answer fresh (ages are measured on
//!   the monotonic clock; on the wall clock a step forward made the last
//!   answer look a minute old, and the node decided alone on its
//!   local-only share until the next answer);
//! - every visitor is answered (the origin or the queue page, never an
//!   error);
//! - the stepped node keeps counting on the cluster's time (its home
//!   aggregator's clock carried forward on the monotonic clock), not on
//!   its own stepped clock;
//! - each minute's admits stay within the limit, with no slack, and use at
//!   least three quarters of it (demand is twice the limit; the queued
//!   check in again at every step).
//!
//! Measured before the node counted on the cluster's time (its own wall
//! clock, ages already on the monotonic clock): admits per minute 66, 70,
//! 63 for a step back and 62, 69, 52 for a step forward; now 60, 59, 60
//! and 60, 60, 60, as without a step.
//!
//! Why it held not before: the stepped node reported its admits under its
//! own minute, which was not the aggregator's. Stepped back, they were never
//! counted in the aggregator's minute; stepped forward, they were dropped as
//! future until the aggregator's minute caught up. Either way the slots
//! they took looked free and were granted again. Counting on the cluster's
//! time, every node's minutes are the aggregator's.
use std::time::Duration;

use waitroom_common::time::MILLIS_PER_MINUTE;
use waitroom_tests::inproc_cluster::{InProcCluster, visit, visit_new};

const NEW_USERS_PER_MINUTE: u64 = 60;
const ROOM: &str = "total_active_users = 5000\nnew_users_per_minute = 60\n\
                    session_duration = 5\nqueueing_method = \"fifo\"\n";
const NODES: &[(&str, &str)] = &[("node-a1", "a"), ("node-a2", "a"), ("node-b1", "b")];
/// The node whose clock steps.
const STEPPED: usize = 1;
/// Seconds between steps of traffic.
const STEP_SECS: u64 = 3;
/// New visitors per node per step: 2 × 3 nodes every 3 s is 120 a minute,
/// twice the limit.
const PER_NODE: usize = 2;

/// What one run measured.
#[derive(Debug)]
struct Outcome {
    /// Admits per minute of the cluster's clock, from the minute of the step.
    admitted: Vec<u64>,
    /// Whether the stepped node counted its last answer fresh right after
    /// the step.
    fresh_after_step: bool,
    /// Admitted per node at each step.
    steps: Vec<String>,
}

/// Whose clock steps, and by how much (ms).
#[derive(Clone, Copy, Debug)]
enum Step {
    Node(i64),
    Aggregator(i64),
}

fn run(tag: &str, step: Step) -> Outcome {
    let cluster = InProcCluster::start(tag, ROOM, NODES, 150).expect("cluster starts");
    let urls: Vec<String> = cluster.nodes.iter().map(|n| n.url("/")).collect();
    for _ in 0..3 {
        cluster.advance(Duration::from_secs(1)).expect("fresh");
    }
    // A minute of light traffic (a third of the limit).
    for _ in 0..6 {
        for url in &urls {
            assert!(visit_new(url), "light traffic is admitted");
        }
        cluster.advance(Duration::from_secs(10)).expect("fresh");
    }
    let node = cluster.node(STEPPED);
    let gossip = node.gossip.as_ref().expect("gossips");

    // Three minutes at twice the limit, from one second into a minute; the
    // clock steps 22 s into the first.
    let first = cluster.now().0 / MILLIS_PER_MINUTE + 1;
    cluster
        .advance(Duration::from_millis(
            first * MILLIS_PER_MINUTE + 1_000 - cluster.now().0,
        ))
        .expect("fresh");
    let mut admitted = vec![0_u64; 3];
    let mut fresh_after_step = None;
    let mut departures_before = None;
    // Queued visitors: their node and cookie.
    let mut waiting: Vec<(usize, String)> = Vec::new();
    // What each step admitted per node, for a failure's message.
    let mut steps = Vec::new();
    while cluster.now().0 < (first + 3) * MILLIS_PER_MINUTE {
        let minute = (cluster.now().0 / MILLIS_PER_MINUTE - first) as usize;
        // No node is taken for gone after the step (its leases would be
        // dropped and granted again), whoever's clock stepped. (Advancing
        // the driven clock to the first minute was a real silence.)
        if let Some(before) = departures_before {
            assert_eq!(
                cluster.aggregator().departures_total(),
                before,
                "a node was marked departed after the step"
            );
        }
        let into = cluster.now().0 % MILLIS_PER_MINUTE;
        if fresh_after_step.is_none() && minute == 0 && into >= 22_000 {
            let received = gossip.world.load().received();
            departures_before = Some(cluster.aggregator().departures_total());
            match step {
                Step::Node(by) => {
                    let node_now = cluster.jump(STEPPED, by);
                    assert_ne!(
                        node_now.0 / MILLIS_PER_MINUTE,
                        first,
                        "the step crosses the minute"
                    );
                    // It counts on the cluster's time, not on its own clock.
                    let skew = node.clock.now().0.abs_diff(cluster.now().0);
                    assert!(
                        skew < 1_000,
                        "the node's time moved with its clock: {skew} ms off"
                    );
                }
                Step::Aggregator(by) => {
                    cluster.jump_aggregator(by);
                }
            }
            fresh_after_step = Some(gossip.world.freshness(node.clock.elapsed()).is_fresh());
            // Visitors at the stepped node at once: most likely before any
            // answer since the step.
            for _ in 0..PER_NODE {
                admitted[minute] += u64::from(visit_new(&urls[STEPPED]));
            }
            println!(
                "a new answer came before the first visitor after the step: {}",
                gossip.world.load().received() != received
            );
        }
        // The queued check in again (as the queue page's refresh would),
        // then the step's new visitors.
        let mut per_node = vec![0_u64; urls.len()];
        let mut still = Vec::with_capacity(waiting.len());
        for (i, cookie) in waiting.drain(..) {
            match visit(&urls[i], Some(&cookie)) {
                (true, _) => per_node[i] += 1,
                (false, cookie) => still.push((i, cookie.expect("a queue cookie"))),
            }
        }
        waiting = still;
        for (i, url) in urls.iter().enumerate() {
            for _ in 0..PER_NODE {
                match visit(url, None) {
                    (true, _) => per_node[i] += 1,
                    (false, cookie) => waiting.push((i, cookie.expect("a queue cookie"))),
                }
            }
        }
        admitted[minute] += per_node.iter().sum::<u64>();
        steps.push(format!("minute {minute} +{}s: {per_node:?}", into / 1000));
        cluster
            .advance(Duration::from_secs(STEP_SECS))
            .expect("fresh");
    }
    if let Step::Aggregator(_) = step {
        assert_eq!(
            cluster
                .aggregator()
                .metrics()
                .clock_steps_total
                .load(std::sync::atomic::Ordering::Relaxed),
            1,
            "the aggregator saw its clock step once"
        );
    }
    Outcome {
        admitted,
        fresh_after_step: fresh_after_step.expect("the clock stepped"),
        steps,
    }
}

fn check(outcome: &Outcome, what: &str) {
    println!(
        "{what}: admits per minute {:?} against a limit of {NEW_USERS_PER_MINUTE}; \
         the last answer still fresh right after the step: {}",
        outcome.admitted, outcome.fresh_after_step
    );
    assert!(
        outcome.fresh_after_step,
        "{what}: the step made the last answer look stale"
    );
    for (i, &n) in outcome.admitted.iter().enumerate() {
        assert!(
            n <= NEW_USERS_PER_MINUTE,
            "{what}: minute {i} admitted {n}, over the limit {NEW_USERS_PER_MINUTE}: {:?}\n{}",
            outcome.admitted,
            outcome.steps.join("\n")
        );
        assert!(
            i == 0 && what.starts_with("the aggregator") || n * 4 >= NEW_USERS_PER_MINUTE * 3,
            "{what}: minute {i} admitted only {n} of {NEW_USERS_PER_MINUTE}: {:?}\n{}",
            outcome.admitted,
            outcome.steps.join("\n")
        );
    }
}

#[test]
fn a_node_clock_stepped_a_minute_forward_keeps_the_limit() {
    let outcome = run("clock-forward", Step::Node(60_000));
    check(&outcome, "a minute forward");
}

#[test]
fn a_node_clock_stepped_a_minute_back_keeps_the_limit() {
    let outcome = run("clock-back", Step::Node(-60_000));
    check(&outcome, "a minute back");
}

/// The cluster's own clock (the aggregator's) steps 40 s forward, past the
/// 15 s after which a silent node is taken for gone: the nodes follow it,
/// none is marked departed (its leases would be dropped and granted again),
/// and every minute stays within the limit.
#[test]
fn the_aggregator_clock_stepped_past_the_node_timeout_keeps_every_node_and_the_limit() {
    let outcome = run("clock-aggregator", Step::Aggregator(40_000));
    check(&outcome, "the aggregator 40 s forward");
}
