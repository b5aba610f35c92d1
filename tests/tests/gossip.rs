//! Global coordination with the real binaries on loopback: one aggregator,
//! three nodes in two colos, the demo origin behind them.
//!
//! What is asserted, and the slack allowed:
//! - every node's view of global active users equals the aggregator's (and
//!   the sum of the nodes' own counts) within three report intervals after
//!   traffic stops;
//! - the admits of one minute, summed over all nodes, never pass the room's
//!   `new_users_per_minute`, with **no slack**. The room queues at random, so
//!   every admission comes from a shared pool: in the first minutes there is
//!   no colo history (seed 002's two minutes back), so all of it is the
//!   Anywhere pool, whose leases the aggregator keeps within the pool across
//!   rounds; a node only decides alone (local-only, its share) after its view
//!   goes stale, which traffic here never waits for. (A FIFO room would hand
//!   every node the whole eligible pool of a covered bucket, by design of the
//!   engine, which a test of exact sums cannot use.)
//! - the aggregator is killed (SIGKILL, no goodbye) mid-test: every node keeps
//!   answering visitors, and after a restart from the periodic snapshot every
//!   node is fresh and agrees with the aggregator again;
//! - a node with a certificate from another CA never reports, and the
//!   aggregator says it refused it.
use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use waitroom_tests::{
    cluster::{Aggregator, Certs, aggregator_config, free_udp_port, node_gossip_table},
    edge::{Edge, client, metric},
    eventually,
    procs::{TempDir, start_origin},
};

const SITE: &str = "Demo Shop";
const INTERVAL_MS: u64 = 500;
const NEW_USERS_PER_MINUTE: u64 = 20;
const TOTAL_ACTIVE_USERS: u64 = 40;

fn room_table() -> String {
    waitroom_tests::cluster::random_room(TOTAL_ACTIVE_USERS, NEW_USERS_PER_MINUTE)
}

fn node_config(dir: &TempDir, name: &str, colo: &str, origin: SocketAddr, gossip: &str) -> String {
    waitroom_tests::cluster::node_config(
        dir.path(),
        name,
        colo,
        2,
        true,
        &room_table(),
        origin,
        gossip,
    )
}

fn get_text(url: &str) -> String {
    let mut resp = client().get(url).call().expect("admin request");
    resp.body_mut().read_to_string().unwrap_or_default()
}

fn node_metric(edge: &Edge, series: &str) -> Option<f64> {
    metric(&get_text(&edge.admin_url("/metrics")), series)
}

fn fresh_and_connected(edge: &Edge) -> bool {
    let text = get_text(&edge.admin_url("/metrics"));
    metric(&text, "waitroom_gossip_connected") == Some(1.0)
        && metric(&text, "waitroom_gossip_stale") == Some(0.0)
}

/// Every node's global active users, the sum of their own, and the aggregator's.
fn views(edges: &[Edge], aggregator: &Aggregator) -> (Vec<Option<f64>>, f64, Option<f64>) {
    let global = edges
        .iter()
        .map(|e| node_metric(e, "waitroom_active_users{room=\"shop\",scope=\"global\"}"))
        .collect();
    let own = edges
        .iter()
        .map(|e| {
            node_metric(e, "waitroom_active_users{room=\"shop\",scope=\"node\"}")
                .unwrap_or(f64::NAN)
        })
        .sum();
    let aggregated = metric(
        &get_text(&aggregator.admin_url("/metrics")),
        "waitroom_aggregator_active_users{room=\"shop\"}",
    );
    (global, own, aggregated)
}

fn converged(edges: &[Edge], aggregator: &Aggregator) -> bool {
    let (global, own, aggregated) = views(edges, aggregator);
    aggregated == Some(own)
        && global.iter().all(|g| *g == Some(own))
        && edges.iter().all(fresh_and_connected)
}

/// A new visitor (no cookie) asks `edge` for the shop; true when admitted.
fn visit(edge: &Edge) -> bool {
    waitroom_tests::edge::admits_new_visitor(edge)
}

#[test]
fn three_nodes_in_two_colos_converge_stay_within_limits_and_survive_the_aggregator() {
    let dir = TempDir::new("gossip");
    let certs = Certs::generate(&dir.path().join("certs"), &["ams-1", "ams-2", "sin-1"]).unwrap();
    let rogue = Certs::generate(&dir.path().join("rogue"), &["intruder"]).unwrap();
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();

    let listen: SocketAddr = format!("127.0.0.1:{}", free_udp_port().unwrap())
        .parse()
        .unwrap();
    let snapshot = dir.path().join("aggregator.json");
    let config = aggregator_config(listen, &certs, &snapshot, &room_table());
    let mut aggregator = Aggregator::start(dir.path(), "aggregator", &config).unwrap();
    assert_eq!(aggregator.quic, listen);

    let edges: Vec<Edge> = [("ams-1", "ams"), ("ams-2", "ams"), ("sin-1", "sin")]
        .into_iter()
        .map(|(name, colo)| {
            let gossip = node_gossip_table(listen, &certs, &certs, name, INTERVAL_MS);
            Edge::start(
                dir.path(),
                name,
                &node_config(&dir, name, colo, origin, &gossip),
            )
            .unwrap()
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(15), || edges
            .iter()
            .all(fresh_and_connected)),
        "every node connects and holds a fresh state"
    );
    // The first node to connect was alone and leased the whole Anywhere pool;
    // each node's next report rebalances the leases (no slots are lost or
    // doubled meanwhile, but the split would depend on start order).
    std::thread::sleep(Duration::from_millis(2 * INTERVAL_MS + 200));

    // --- Traffic through both colos, within one minute: the limit holds across nodes.
    waitroom_tests::minutes::early_in_a_minute(35);
    let mut admitted = [0_u64; 3];
    for _round in 0..8 {
        for (i, edge) in edges.iter().enumerate() {
            for _ in 0..4 {
                admitted[i] += u64::from(visit(edge));
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let total: u64 = admitted.iter().sum();
    let counted: f64 = edges
        .iter()
        .map(|e| node_metric(e, "waitroom_admitted_this_minute{room=\"shop\"}").unwrap())
        .sum();
    eprintln!("admitted per node {admitted:?}, {total} in all; nodes count {counted}");
    assert!(
        total <= NEW_USERS_PER_MINUTE,
        "{total} admitted > {NEW_USERS_PER_MINUTE} per minute: {admitted:?}"
    );
    assert_eq!(
        counted, total as f64,
        "the nodes' counters agree with what visitors saw"
    );
    assert!(
        total >= NEW_USERS_PER_MINUTE / 2,
        "leases let most of the minute's slots be used: {admitted:?}"
    );
    assert!(
        admitted[2] > 0 && admitted[0] + admitted[1] > 0,
        "both colos admit: {admitted:?}"
    );

    // --- Convergence: within three intervals every node sees the same global count.
    let stopped = Instant::now();
    let limit = Duration::from_millis(3 * INTERVAL_MS + 500);
    assert!(
        eventually(limit, || converged(&edges, &aggregator)),
        "views did not converge within three intervals: {:?}",
        views(&edges, &aggregator)
    );
    eprintln!("converged {:?} after traffic stopped", stopped.elapsed());
    let (_, own, _) = views(&edges, &aggregator);
    assert_eq!(
        own, total as f64,
        "every admitted visitor is an active user"
    );

    // --- The aggregator is killed: visitors are still served, views go stale, then recover.
    std::thread::sleep(Duration::from_millis(2 * 300 + 100)); // a snapshot after the traffic
    aggregator.proc.kill();
    for edge in &edges {
        let _ = visit(edge);
    }
    assert!(
        eventually(Duration::from_secs(10), || edges
            .iter()
            .all(|e| node_metric(e, "waitroom_gossip_stale") == Some(1.0))),
        "without the aggregator every node's view goes stale (local-only limits)"
    );
    for edge in &edges {
        let _ = visit(edge);
        assert_eq!(node_metric(edge, "waitroom_gossip_connected"), Some(0.0));
    }
    let restarted = Aggregator::start_with(dir.path(), "aggregator-2", &aggregator.config).unwrap();
    let restart = Instant::now();
    assert!(
        eventually(Duration::from_secs(15), || converged(&edges, &restarted)),
        "after a restart every node is fresh and agrees again: {:?}",
        views(&edges, &restarted)
    );
    eprintln!("reconverged {:?} after the restart", restart.elapsed());
    assert!(
        restarted.proc.stderr().contains("restored snapshot"),
        "{}",
        restarted.proc.stderr()
    );

    // --- A node whose certificate comes from another CA is refused.
    let gossip = node_gossip_table(listen, &certs, &rogue, "intruder", INTERVAL_MS);
    let intruder = Edge::start(
        dir.path(),
        "intruder",
        &node_config(&dir, "intruder", "ams", origin, &gossip),
    )
    .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || {
            metric(
                &get_text(&restarted.admin_url("/metrics")),
                "waitroom_aggregator_handshakes_refused_total",
            )
            .is_some_and(|n| n >= 1.0)
        }),
        "the aggregator refuses the handshake"
    );
    std::thread::sleep(Duration::from_millis(3 * INTERVAL_MS));
    assert_eq!(
        node_metric(&intruder, "waitroom_gossip_reports_total"),
        Some(0.0)
    );
    assert_eq!(
        node_metric(&intruder, "waitroom_gossip_connected"),
        Some(0.0)
    );
    assert!(node_metric(&intruder, "waitroom_gossip_errors_total").is_some_and(|n| n >= 1.0));
    assert!(
        restarted.proc.stderr().contains("refused connection"),
        "{}",
        restarted.proc.stderr()
    );
    let status = get_text(&restarted.admin_url("/status"));
    assert!(!status.contains("intruder"), "{status}");
    assert!(status.contains("sin-1"), "{status}");
}

#[test]
fn aggregator_check_validates_and_names_the_field() {
    let dir = TempDir::new("aggcheck");
    let certs = Certs::generate(&dir.path().join("certs"), &["n1"]).unwrap();
    let check = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let out = std::process::Command::new(waitroom_tests::procs::binary("waitroom-aggregator"))
            .arg("--config")
            .arg(&path)
            .arg("--check")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let good = aggregator_config(listen, &certs, &dir.path().join("s.json"), &room_table());
    let (ok, out) = check("good.toml", &good);
    assert!(ok, "{out}");
    assert!(out.contains("ok (1 room)"), "{out}");

    let (ok, out) = check(
        "limits.toml",
        &good.replace("new_users_per_minute = 20", "new_users_per_minute = 99"),
    );
    assert!(!ok);
    assert!(
        out.contains("limits.toml:")
            && out.contains(": rooms[0].new_users_per_minute: new_users_per_minute (99)"),
        "{out}"
    );

    let (ok, out) = check(
        "timeout.toml",
        &good.replace("node_timeout_ms = 15000", "node_timeout_ms = 5"),
    );
    assert!(!ok);
    assert!(out.contains("node_timeout_ms"), "{out}");

    let (ok, out) = check("ca.toml", &good.replace("ca.pem", "missing-ca.pem"));
    assert!(!ok);
    assert!(out.contains("missing-ca.pem"), "{out}");
}

/// Three nodes started while the aggregator is unreachable, 200 visitors
/// split 70/20/10: without `expected_nodes` nobody new is admitted until a
/// share is known; with `expected_nodes = 3` each takes a third of the
/// limit, so the minute's admits stay within it (never 3 × the room).
#[test]
fn nodes_started_without_the_aggregator_never_take_the_whole_room() {
    let dir = TempDir::new("cold-start");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let certs = Certs::generate(&dir.path().join("certs"), &["c1", "c2", "c3"]).unwrap();
    // Nobody listens there: the nodes never get an answer.
    let nowhere: SocketAddr = format!("127.0.0.1:{}", free_udp_port().unwrap())
        .parse()
        .unwrap();
    let per_minute = 30_u64;
    let run = |tag: &str, extra: &str| -> u64 {
        waitroom_tests::minutes::early_in_a_minute(20);
        let nodes: Vec<Edge> = ["c1", "c2", "c3"]
            .iter()
            .map(|name| {
                let gossip = node_gossip_table(nowhere, &certs, &certs, name, INTERVAL_MS) + extra;
                let config = node_config(&dir, &format!("{tag}-{name}"), "x", origin, &gossip)
                    .replace(
                        &format!("new_users_per_minute = {NEW_USERS_PER_MINUTE}"),
                        &format!("new_users_per_minute = {per_minute}"),
                    )
                    .replace(
                        &format!("total_active_users = {TOTAL_ACTIVE_USERS}"),
                        "total_active_users = 1000",
                    )
                    .replace("queueing_method = \"random\"", "queueing_method = \"fifo\"");
                Edge::start(dir.path(), &format!("{tag}-{name}"), &config).unwrap()
            })
            .collect();
        let mut admitted = 0;
        for (edge, visitors) in nodes.iter().zip([70, 20, 10]) {
            for _ in 0..visitors {
                let mut resp = client().get(&edge.url("/")).call().unwrap();
                if resp.body_mut().read_to_string().unwrap().contains(SITE) {
                    admitted += 1;
                }
            }
        }
        admitted
    };
    let queued_all = run("default", "");
    assert_eq!(
        queued_all, 0,
        "no share and no expected_nodes: everyone new waits"
    );
    let with_expected = run("expected", "expected_nodes = 3\n");
    assert!(
        with_expected <= per_minute + per_minute / 100,
        "{with_expected} admitted against {per_minute} per minute"
    );
    assert!(
        with_expected >= 20,
        "each node takes its third: 10 + 10 + 10 (the third node has 10 visitors): {with_expected}"
    );
}
