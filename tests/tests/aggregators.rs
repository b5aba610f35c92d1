//! Several aggregators (issue 20, docs/adr/0001), with the real binaries on
//! loopback: two aggregators, two nodes in two colos, each node configured
//! with both (`addresses`).
//!
//! What is asserted:
//! - every node reports to both aggregators and takes its grants from one,
//!   its home (`waitroom_gossip_home`); the other merges its peer reports,
//!   so both aggregators hold the whole picture (the same active users as
//!   the nodes' own counts);
//! - the admits of one minute, summed over the nodes, never pass the room's
//!   `new_users_per_minute`, with no slack, through everything below (a
//!   random room: every admission comes from a shared pool, as in
//!   `gossip.rs`);
//! - the home of a node is killed (SIGKILL) mid-minute: visitors are served
//!   throughout, and the node takes a fresh state from the other aggregator
//!   within 4 s (measured and printed; target 2 s: one interval and a half to notice,
//!   up to one interval to report);
//! - the killed aggregator is restarted from its snapshot: the node goes
//!   back to it, its preferred home, and the limit still holds.
use std::{
    net::SocketAddr,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use waitroom_tests::{
    cluster::{Aggregator, Certs, aggregator_config, free_udp_port, random_room, start_nodes},
    edge::{Edge, admits_new_visitor, get_text, metric, metric_sum},
    eventually,
    procs::{TempDir, start_origin},
};

const INTERVAL_MS: u64 = 500;
const NEW_USERS_PER_MINUTE: u64 = 24;
const TOTAL_ACTIVE_USERS: u64 = 60;

fn room_table() -> String {
    random_room(TOTAL_ACTIVE_USERS, NEW_USERS_PER_MINUTE)
}

fn node_metric(edge: &Edge, series: &str) -> Option<f64> {
    metric(&get_text(&edge.admin_url("/metrics")), series)
}

fn home_of(edge: &Edge, aggregator: SocketAddr) -> Option<f64> {
    node_metric(
        edge,
        &format!("waitroom_gossip_home{{aggregator=\"{aggregator}\"}}"),
    )
}

fn aggregator_metric(aggregator: &Aggregator, series: &str) -> Option<f64> {
    metric(&get_text(&aggregator.admin_url("/metrics")), series)
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `rounds` rounds of three new visitors at each node; admitted per node.
fn traffic(edges: &[Edge], rounds: usize) -> Vec<u64> {
    let mut admitted = vec![0; edges.len()];
    for _ in 0..rounds {
        for (i, edge) in edges.iter().enumerate() {
            for _ in 0..3 {
                admitted[i] += u64::from(admits_new_visitor(edge));
            }
        }
        std::thread::sleep(Duration::from_millis(150));
    }
    admitted
}

/// Both aggregators' active users equal the sum of the nodes' own.
fn both_hold_the_picture(edges: &[Edge], aggregators: &[&Aggregator]) -> bool {
    let own = metric_sum(edges, "waitroom_active_users{room=\"shop\",scope=\"node\"}");
    aggregators.iter().all(|a| {
        aggregator_metric(a, "waitroom_aggregator_active_users{room=\"shop\"}") == Some(own)
    })
}

#[test]
fn nodes_report_to_every_aggregator_take_grants_from_one_and_fail_over() {
    let dir = TempDir::new("aggregators");
    let certs = Certs::generate(&dir.path().join("certs"), &["ams-1", "sin-1"]).unwrap();
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let listen = |_| -> SocketAddr {
        format!("127.0.0.1:{}", free_udp_port().unwrap())
            .parse()
            .unwrap()
    };
    let addresses: Vec<SocketAddr> = (0..2).map(listen).collect();
    let mut aggregators: Vec<Aggregator> = addresses
        .iter()
        .enumerate()
        .map(|(i, &at)| {
            let snapshot = dir.path().join(format!("aggregator-{i}.json"));
            let config = aggregator_config(at, &certs, &snapshot, &room_table());
            Aggregator::start(dir.path(), &format!("aggregator-{i}"), &config).unwrap()
        })
        .collect();

    let edges = start_nodes(
        dir.path(),
        &certs,
        &addresses,
        &[("ams-1", "ams"), ("sin-1", "sin")],
        &room_table(),
        origin,
        INTERVAL_MS,
    );

    // --- Each node: one home of the two, and both aggregators answering.
    let settled = |edge: &Edge| {
        let text = get_text(&edge.admin_url("/metrics"));
        let homes: Vec<Option<f64>> = addresses
            .iter()
            .map(|a| {
                metric(
                    &text,
                    &format!("waitroom_gossip_home{{aggregator=\"{a}\"}}"),
                )
            })
            .collect();
        let answering = addresses.iter().all(|a| {
            metric(
                &text,
                &format!("waitroom_gossip_aggregator_answering{{aggregator=\"{a}\"}}"),
            ) == Some(1.0)
        });
        let mut sorted = homes.clone();
        sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
        answering
            && sorted == [Some(0.0), Some(1.0)]
            && metric(&text, "waitroom_gossip_connected") == Some(1.0)
            && metric(&text, "waitroom_gossip_stale") == Some(0.0)
    };
    assert!(
        eventually(Duration::from_secs(15), || edges.iter().all(settled)),
        "every node reports to both aggregators and has one home"
    );
    let home_index = |edge: &Edge| {
        addresses
            .iter()
            .position(|&a| home_of(edge, a) == Some(1.0))
            .expect("a home")
    };
    let homes: Vec<usize> = edges.iter().map(home_index).collect();
    eprintln!("homes: ams-1 → {homes:?}");
    let peer_reports: f64 = aggregators
        .iter()
        .map(|a| aggregator_metric(a, "waitroom_aggregator_peer_reports_total").unwrap_or(0.0))
        .sum();
    assert!(peer_reports >= 2.0, "peer reports merged: {peer_reports}");
    std::thread::sleep(Duration::from_millis(2 * INTERVAL_MS + 200));

    // --- One minute: traffic, the home of ams-1 killed, traffic, restart, traffic.
    waitroom_tests::minutes::early_in_a_minute(50);
    let mut admitted = traffic(&edges, 3);
    eprintln!("before the kill: {admitted:?}");
    let victim = homes[0];
    let survivor = 1 - victim;
    let moving: Vec<usize> = (0..edges.len()).filter(|&i| homes[i] == victim).collect();
    let killed_at = now_secs();
    let killed = Instant::now();
    aggregators[victim].proc.kill();
    // Fresh again: the home moved to the survivor and a state newer than the kill came.
    let fresh_again = |i: usize| {
        let text = get_text(&edges[i].admin_url("/metrics"));
        let home = format!(
            "waitroom_gossip_home{{aggregator=\"{}\"}}",
            addresses[survivor]
        );
        metric(&text, &home) == Some(1.0)
            && metric(&text, "waitroom_gossip_last_state_timestamp_seconds")
                .is_some_and(|at| at > killed_at)
            && metric(&text, "waitroom_gossip_connected") == Some(1.0)
    };
    let mut during = vec![0; edges.len()];
    while !moving.iter().all(|&i| fresh_again(i)) {
        assert!(
            killed.elapsed() < Duration::from_secs(4),
            "not fresh again within 4 s of the crash (target 2 s; the bound leaves room for a loaded CI machine)"
        );
        // Visitors are served while the node moves.
        for (i, edge) in edges.iter().enumerate() {
            during[i] += u64::from(admits_new_visitor(edge));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "fresh again {:?} after the crash (interval {INTERVAL_MS} ms); admitted meanwhile {during:?}",
        killed.elapsed()
    );
    let after = traffic(&edges, 3);
    for i in 0..edges.len() {
        admitted[i] += during[i] + after[i];
    }

    let config = aggregators[victim].config.clone();
    let restarted = Aggregator::start_with(dir.path(), "aggregator-restarted", &config).unwrap();
    assert!(
        restarted.proc.stderr().contains("restored snapshot"),
        "{}",
        restarted.proc.stderr()
    );
    assert!(
        eventually(Duration::from_secs(5), || moving.iter().all(|&i| home_of(
            &edges[i],
            addresses[victim]
        ) == Some(
            1.0
        ))),
        "the node goes back to its preferred home once it answers"
    );
    let last = traffic(&edges, 3);
    for i in 0..edges.len() {
        admitted[i] += last[i];
    }
    let total: u64 = admitted.iter().sum();
    let counted = metric_sum(&edges, "waitroom_admitted_this_minute{room=\"shop\"}");
    eprintln!("admitted per node {admitted:?}, {total} in all; the nodes count {counted}");
    assert!(
        total <= NEW_USERS_PER_MINUTE,
        "{total} admitted > {NEW_USERS_PER_MINUTE} per minute: {admitted:?}"
    );
    assert_eq!(
        counted, total as f64,
        "the counters agree with the visitors"
    );
    assert!(
        total >= NEW_USERS_PER_MINUTE / 2,
        "most of the minute's slots are used: {admitted:?}"
    );
    assert!(
        admitted.iter().all(|&n| n > 0),
        "both nodes admit: {admitted:?}"
    );

    // --- Both aggregators hold the whole picture again.
    aggregators[victim] = restarted;
    let all: Vec<&Aggregator> = aggregators.iter().collect();
    assert!(
        eventually(Duration::from_secs(5), || both_hold_the_picture(
            &edges, &all
        )),
        "both aggregators count every node's sessions"
    );
}
