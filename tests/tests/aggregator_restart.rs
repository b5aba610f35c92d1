//! An aggregator killed -9 in the middle of granting, and restarted from a
//! snapshot that predates the minute's grants (issue 20: "kill -9 of an
//! aggregator mid-grant and restart from an old snapshot"), with the real
//! binaries on loopback: one aggregator, two nodes in two colos.
//!
//! The snapshot it restarts from knows nothing of the leases the nodes hold.
//! Granting at once from that ledger would hand one node the slots another
//! still holds. What is asserted:
//! - the minute's admits over both nodes stay within the room's
//!   `new_users_per_minute`, with no slack, across the kill and the restart
//!   (a random room: every admission comes from a shared pool);
//! - the restarted aggregator learns before it grants: it says so in its
//!   log, `waitroom_aggregator_learning` is 1 just after the start and 0
//!   after `learning_ms`, and the nodes' home reports (which name the leases
//!   they hold) are what it merges (`waitroom_aggregator_holding_reports_total`);
//! - every visitor gets an answer throughout (admitted or queued, never an
//!   error);
//! - every node is fresh from the restarted aggregator within 2 s of its
//!   start (measured and printed: 0.17 s; 2.14 s before the aggregator's
//!   QUIC keys survived a restart, when the nodes noticed the dead
//!   connection only after two answer timeouts; `tls::server_endpoint`).
//!
//! The deterministic cases (a lowered cap whose answer was lost; a ledger
//! restored from before a grant, with and without learning) are the unit
//! tests `a_lowered_cap_counts_until_the_node_says_it_got_it` and
//! `a_restarted_ledger_learns_what_the_nodes_hold_before_granting` in
//! `waitroom_common::cluster`.
use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use waitroom_tests::{
    cluster::{Aggregator, Certs, aggregator_config, free_udp_port, random_room, start_nodes},
    edge::{Edge, admits_new_visitor, check_the_minute, fresh_from, get_text},
    eventually,
    minutes::{self, now_secs},
    procs::{TempDir, start_origin},
};

const INTERVAL_MS: u64 = 500;
const NEW_USERS_PER_MINUTE: u64 = 24;
const TOTAL_ACTIVE_USERS: u64 = 60;
/// Admits per node before the kill: the nodes then hold leases on most of
/// what is left of the minute, which the old snapshot does not know.
const BEFORE_KILL: u64 = 6;

#[test]
fn an_aggregator_killed_mid_grant_and_restarted_from_an_old_snapshot_keeps_the_limit() {
    let dir = TempDir::new("agg-restart");
    let certs = Certs::generate(&dir.path().join("certs"), &["ams-1", "sin-1"]).unwrap();
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let listen: SocketAddr = format!("127.0.0.1:{}", free_udp_port().unwrap())
        .parse()
        .unwrap();
    let snapshot = dir.path().join("aggregator.json");
    // Snapshots a minute apart: the one a crash leaves is old.
    let config = aggregator_config(
        listen,
        &certs,
        &snapshot,
        &random_room(TOTAL_ACTIVE_USERS, NEW_USERS_PER_MINUTE),
    )
    .replace("snapshot_interval_ms = 300", "snapshot_interval_ms = 60000");
    let mut first = Aggregator::start(dir.path(), "aggregator-1", &config).unwrap();
    let edges = start_nodes(
        dir.path(),
        &certs,
        &[listen],
        &[("ams-1", "ams"), ("sin-1", "sin")],
        &random_room(TOTAL_ACTIVE_USERS, NEW_USERS_PER_MINUTE),
        origin,
        INTERVAL_MS,
    );
    let fresh_since =
        |edge: &Edge, since: f64| fresh_from(&get_text(&edge.admin_url("/metrics")), listen, since);
    let started = now_secs();
    assert!(
        eventually(Duration::from_secs(15), || edges
            .iter()
            .all(|e| fresh_since(e, started))),
        "every node reports and holds a fresh state"
    );

    // --- The old snapshot: written by a clean stop, before the minute's traffic.
    first.proc.terminate(Duration::from_secs(10));
    let old = std::fs::read(&snapshot).expect("a stop writes a snapshot");
    let config_path = first.config.clone();
    let second = Aggregator::start_with(dir.path(), "aggregator-2", &config_path).unwrap();
    let since = now_secs();
    assert!(
        eventually(Duration::from_secs(15), || edges
            .iter()
            .all(|e| fresh_since(e, since))),
        "every node is fresh from the second aggregator"
    );
    // Past its learning, and the nodes' leases rebalanced.
    std::thread::sleep(Duration::from_millis(3_000 + 2 * INTERVAL_MS + 200));

    // --- A fresh minute: some admits at both nodes, the rest held as leases.
    minutes::early_in_a_minute(40);
    let minute = minutes::unix_secs() / 60;
    let mut admitted = vec![0_u64; edges.len()];
    let until = Instant::now() + Duration::from_secs(10);
    while admitted.iter().any(|&n| n < BEFORE_KILL) && Instant::now() < until {
        for (i, edge) in edges.iter().enumerate() {
            if admitted[i] < BEFORE_KILL {
                admitted[i] += u64::from(admits_new_visitor(edge));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("before the kill: {admitted:?}");

    // --- kill -9 in the middle of granting; its last snapshot is the old one.
    let mut second = second;
    second.proc.kill();
    std::fs::write(&snapshot, &old).unwrap();
    for (i, edge) in edges.iter().enumerate() {
        admitted[i] += u64::from(admits_new_visitor(edge));
    }
    let third = Aggregator::start_with(dir.path(), "aggregator-3", &config_path).unwrap();
    let restart = Instant::now();
    let restart_secs = now_secs();
    let learning_at_start = third.metric("waitroom_aggregator_learning");

    // --- Demand past the limit at both nodes until the minute's end nears.
    let mut fresh_after = None;
    while minutes::unix_secs() / 60 == minute && minutes::unix_secs() % 60 < 55 {
        for (i, edge) in edges.iter().enumerate() {
            for _ in 0..2 {
                admitted[i] += u64::from(admits_new_visitor(edge));
            }
        }
        if fresh_after.is_none() && edges.iter().all(|e| fresh_since(e, restart_secs)) {
            fresh_after = Some(restart.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        minutes::unix_secs() / 60,
        minute,
        "the traffic stayed in one minute"
    );
    eprintln!("fresh {fresh_after:?} after the restart");
    check_the_minute(&edges, &admitted, NEW_USERS_PER_MINUTE);
    let fresh_after = fresh_after.expect("every node fresh from the restarted aggregator");
    assert!(
        fresh_after < Duration::from_secs(2),
        "fresh again {fresh_after:?} after the restart"
    );

    // --- It learned, from home reports, and then stopped learning.
    let log = third.proc.stderr();
    assert!(log.contains("restored snapshot"), "{log}");
    assert!(
        log.contains("learning what the nodes hold before granting more"),
        "{log}"
    );
    assert_eq!(
        learning_at_start,
        Some(1.0),
        "learning just after the start"
    );
    assert_eq!(
        third.metric("waitroom_aggregator_learning"),
        Some(0.0),
        "learning ends after learning_ms"
    );
    assert!(
        third
            .metric("waitroom_aggregator_holding_reports_total")
            .is_some_and(|n| n >= 2.0),
        "the nodes' home reports name what they hold"
    );
}
