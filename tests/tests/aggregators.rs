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
//!   back to it, its preferred home, and the limit still holds;
//! - the home of a node is frozen (SIGSTOP) for longer than the nodes wait
//!   for anything from it, as a stalled VM or a long pause would: the node
//!   moves as for a crash; thawed (SIGCONT), the aggregator answers the
//!   reports it had queued to nodes that gave up on them long ago, the node
//!   goes back to it, and the minute's admits still stay within the limit.
use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use waitroom_tests::{
    cluster::{Aggregator, Certs, aggregator_config, free_udp_port, random_room, start_nodes},
    edge::{
        Edge, admits_new_visitor, check_the_minute, fresh_from, get_text, home_among, metric_sum,
        settled_among,
    },
    eventually,
    minutes::now_secs,
    procs::{TempDir, start_origin},
};

const INTERVAL_MS: u64 = 500;
const NEW_USERS_PER_MINUTE: u64 = 24;
const TOTAL_ACTIVE_USERS: u64 = 60;

fn room_table() -> String {
    random_room(TOTAL_ACTIVE_USERS, NEW_USERS_PER_MINUTE)
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
    aggregators
        .iter()
        .all(|a| a.metric("waitroom_aggregator_active_users{room=\"shop\"}") == Some(own))
}

/// Two aggregators and two nodes, settled: each node with a home of the
/// two and both aggregators answering it.
struct Cluster {
    dir: TempDir,
    _origin: waitroom_tests::procs::Proc,
    addresses: Vec<SocketAddr>,
    aggregators: Vec<Aggregator>,
    edges: Vec<Edge>,
    /// Each node's home, by index into `addresses`.
    homes: Vec<usize>,
}

impl Cluster {
    fn start(tag: &str) -> Self {
        let dir = TempDir::new(tag);
        let certs = Certs::generate(&dir.path().join("certs"), &["ams-1", "sin-1"]).unwrap();
        let (origin_proc, origin) = start_origin(dir.path(), "origin").unwrap();
        let listen = |_| -> SocketAddr {
            format!("127.0.0.1:{}", free_udp_port().unwrap())
                .parse()
                .unwrap()
        };
        let addresses: Vec<SocketAddr> = (0..2).map(listen).collect();
        let aggregators: Vec<Aggregator> = addresses
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
        let metrics = |edge: &Edge| get_text(&edge.admin_url("/metrics"));
        assert!(
            eventually(Duration::from_secs(15), || edges
                .iter()
                .all(|e| settled_among(&metrics(e), &addresses))),
            "every node reports to both aggregators and has one home"
        );
        let home_index = |edge: &Edge| home_among(&metrics(edge), &addresses).expect("a home");
        let homes: Vec<usize> = edges.iter().map(home_index).collect();
        eprintln!("homes: ams-1 → {homes:?}");
        let peer_reports: f64 = aggregators
            .iter()
            .map(|a| {
                a.metric("waitroom_aggregator_peer_reports_total")
                    .unwrap_or(0.0)
            })
            .sum();
        assert!(peer_reports >= 2.0, "peer reports merged: {peer_reports}");
        std::thread::sleep(Duration::from_millis(2 * INTERVAL_MS + 200));
        Self {
            dir,
            _origin: origin_proc,
            addresses,
            aggregators,
            edges,
            homes,
        }
    }

    /// Serves visitors at every node until each node in `moving` has
    /// aggregator `to` as its home and a state newer than `since_secs`,
    /// failing after `limit`; admitted per node meanwhile.
    fn serve_until_fresh_from(
        &self,
        moving: &[usize],
        to: usize,
        since_secs: f64,
        limit: Duration,
    ) -> Vec<u64> {
        let started = Instant::now();
        let fresh_again = |i: usize| {
            fresh_from(
                &get_text(&self.edges[i].admin_url("/metrics")),
                self.addresses[to],
                since_secs,
            )
        };
        let mut during = vec![0; self.edges.len()];
        while !moving.iter().all(|&i| fresh_again(i)) {
            assert!(
                started.elapsed() < limit,
                "not fresh from aggregator {to} within {limit:?}"
            );
            // Visitors are served while the node moves.
            for (i, edge) in self.edges.iter().enumerate() {
                during[i] += u64::from(admits_new_visitor(edge));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        during
    }

    /// The minute's admits, `admitted` per node, stay within the limit, are
    /// what the nodes count, and use most of it at both nodes.
    fn check_the_minute(&self, admitted: &[u64]) {
        check_the_minute(&self.edges, admitted, NEW_USERS_PER_MINUTE);
        assert!(
            admitted.iter().all(|&n| n > 0),
            "both nodes admit: {admitted:?}"
        );
    }
}

fn add(total: &mut [u64], more: &[u64]) {
    for (t, m) in total.iter_mut().zip(more) {
        *t += m;
    }
}

#[test]
fn nodes_report_to_every_aggregator_take_grants_from_one_and_fail_over() {
    let mut cluster = Cluster::start("aggregators");
    let Cluster {
        ref dir,
        ref addresses,
        ref edges,
        ref homes,
        ..
    } = cluster;

    // --- One minute: traffic, the home of ams-1 killed, traffic, restart, traffic.
    waitroom_tests::minutes::early_in_a_minute(50);
    let mut admitted = traffic(edges, 3);
    eprintln!("before the kill: {admitted:?}");
    let victim = homes[0];
    let survivor = 1 - victim;
    let moving: Vec<usize> = (0..edges.len()).filter(|&i| homes[i] == victim).collect();
    let killed_at = now_secs();
    let killed = Instant::now();
    cluster.aggregators[victim].proc.kill();
    // Fresh again: the home moved to the survivor and a state newer than the kill came.
    // (Within 4 s: target 2 s, the bound leaves room for a loaded CI machine.)
    let during =
        cluster.serve_until_fresh_from(&moving, survivor, killed_at, Duration::from_secs(4));
    eprintln!(
        "fresh again {:?} after the crash (interval {INTERVAL_MS} ms); admitted meanwhile {during:?}",
        killed.elapsed()
    );
    add(&mut admitted, &during);
    add(&mut admitted, &traffic(edges, 3));

    let config = cluster.aggregators[victim].config.clone();
    let restarted = Aggregator::start_with(dir.path(), "aggregator-restarted", &config).unwrap();
    assert!(
        restarted.proc.stderr().contains("restored snapshot"),
        "{}",
        restarted.proc.stderr()
    );
    assert!(
        eventually(Duration::from_secs(5), || moving.iter().all(
            |&i| home_among(&get_text(&edges[i].admin_url("/metrics")), addresses) == Some(victim)
        )),
        "the node goes back to its preferred home once it answers"
    );
    add(&mut admitted, &traffic(edges, 3));
    cluster.check_the_minute(&admitted);

    // --- Both aggregators hold the whole picture again.
    cluster.aggregators[victim] = restarted;
    let all: Vec<&Aggregator> = cluster.aggregators.iter().collect();
    assert!(
        eventually(Duration::from_secs(5), || both_hold_the_picture(
            edges, &all
        )),
        "both aggregators count every node's sessions"
    );
}

#[test]
fn a_frozen_home_is_left_like_a_dead_one_and_taken_back_when_it_thaws() {
    let mut cluster = Cluster::start("aggregators-frozen");
    waitroom_tests::minutes::early_in_a_minute(50);
    let mut admitted = traffic(&cluster.edges, 3);
    let victim = cluster.homes[0];
    let survivor = 1 - victim;
    let moving: Vec<usize> = (0..cluster.edges.len())
        .filter(|&i| cluster.homes[i] == victim)
        .collect();
    let frozen_at = now_secs();
    let frozen = Instant::now();
    cluster.aggregators[victim].proc.freeze(true);
    let during =
        cluster.serve_until_fresh_from(&moving, survivor, frozen_at, Duration::from_secs(4));
    eprintln!(
        "fresh again {:?} after the freeze (interval {INTERVAL_MS} ms); admitted meanwhile {during:?}",
        frozen.elapsed()
    );
    add(&mut admitted, &during);
    // Frozen for 8 intervals in all, past the six after which a node counts
    // an aggregator's answers stale: whatever it owed is long given up on.
    while frozen.elapsed() < Duration::from_millis(8 * INTERVAL_MS) {
        add(&mut admitted, &traffic(&cluster.edges, 1));
    }
    let thawed_at = now_secs();
    cluster.aggregators[victim].proc.freeze(false);
    let during = cluster.serve_until_fresh_from(&moving, victim, thawed_at, Duration::from_secs(5));
    eprintln!("back home after the thaw; admitted meanwhile {during:?}");
    add(&mut admitted, &during);
    add(&mut admitted, &traffic(&cluster.edges, 3));
    cluster.check_the_minute(&admitted);
    let all: Vec<&Aggregator> = cluster.aggregators.iter().collect();
    assert!(
        eventually(Duration::from_secs(5), || both_hold_the_picture(
            &cluster.edges,
            &all
        )),
        "both aggregators count every node's sessions after the thaw"
    );
}
