//! The aggregator and the node's gossip client in one process, over real
//! QUIC with the development certificates: convergence, a restart from the
//! snapshot, staleness without the aggregator, and a node from a foreign CA.
use std::{
    net::SocketAddr,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use waitroom_aggregator::{Aggregator, AggregatorConfig};
use waitroom_common::{
    counters::RoomCounters,
    room::{RoomConfig, RoomId},
    room_table::RoomTable,
};
use waitroom_edge::gossip::{self, GossipConfig, GossipHandle, NodeIdentity};
use waitroom_runtime::{clock, devcerts, shutdown, tls::TlsFiles};

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("wr-agg-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn shop() -> RoomTable {
    RoomTable::from_config("shop", &RoomConfig::with_limits(100, 20))
}

fn config(dir: &Path, tls: TlsFiles, listen: SocketAddr) -> AggregatorConfig {
    AggregatorConfig {
        listen,
        admin_listen: None,
        tls,
        snapshot_path: dir.join("snapshot.json"),
        snapshot_interval_ms: 200,
        node_timeout_ms: 5_000,
        learning_ms: 3_000,
        rooms: vec![shop()],
        control: waitroom_aggregator::config::ControlConfig::beside(&dir.join("snapshot.json")),
        ledger: None,
        shard: None,
    }
}

/// A gossip client whose counters hold `sessions` active users.
fn node(
    name: &str,
    colo: &str,
    files: &TlsFiles,
    aggregator: SocketAddr,
    sessions: usize,
    shutdown: &shutdown::Shutdown,
) -> GossipHandle {
    let counters = RoomCounters::new_boxed(RoomId::from_name("shop"));
    let expiry = clock::now().plus_minutes(5).expiry_slot();
    for _ in 0..sessions {
        counters.start_session(expiry);
    }
    let reporter = move |now| vec![gossip::room_report(&counters, now, None)];
    let config = GossipConfig {
        address: Some(aggregator),
        addresses: Vec::new(),
        groups: Vec::new(),
        server_name: "localhost".into(),
        ca: files.ca.clone(),
        cert: files.cert.clone(),
        key: files.key.clone(),
        interval_ms: 100,
        stale_after_ms: 1_000,
        expected_nodes: None,
        // These tests hold the limits with fair parts, as before the lease.
        lease_wait_ms: 0,
    };
    let identity = NodeIdentity {
        node: name.into(),
        colo: colo.into(),
    };
    gossip::spawn(
        &tokio::runtime::Handle::current(),
        config,
        identity,
        Arc::new(reporter),
        clock::Clock::system(),
        shutdown.clone(),
    )
    .unwrap()
}

/// Polls `check` every 50 ms for at most `limit`.
async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check()
}

fn active(handle: &GossipHandle) -> Option<u64> {
    let world = handle.world.load();
    let fresh = handle
        .world
        .freshness(clock::Clock::system().elapsed())
        .is_fresh();
    fresh
        .then(|| {
            world
                .room(RoomId::from_name("shop"))
                .map(|r| r.state.active_users)
        })
        .flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_converge_survive_an_aggregator_restart_and_go_stale_without_it() {
    let dir = temp_dir("converge");
    let certs = devcerts::write(&dir, &["n1".into(), "n2".into()]).unwrap();
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let aggregator = Aggregator::start(
        config(&dir, certs.aggregator.clone(), loopback),
        clock::Clock::system(),
    )
    .await
    .unwrap();
    let addr = aggregator.quic_addr();
    let (trigger, shutdown) = shutdown::channel();
    let a = node("n1", "x", &certs.nodes[0].1, addr, 3, &shutdown);
    let b = node("n2", "y", &certs.nodes[1].1, addr, 4, &shutdown);
    assert!(
        eventually(Duration::from_secs(5), || active(&a) == Some(7)
            && active(&b) == Some(7))
        .await,
        "both nodes see 3 + 4 active users: {:?} {:?}",
        active(&a),
        active(&b)
    );
    assert!(a.status.connected());

    aggregator.stop().await;
    assert!(
        eventually(Duration::from_secs(5), || {
            !a.world
                .freshness(clock::Clock::system().elapsed())
                .is_fresh()
        })
        .await,
        "without the aggregator the view goes stale"
    );
    assert_eq!(
        a.world
            .load()
            .room(RoomId::from_name("shop"))
            .unwrap()
            .state
            .active_users,
        7,
        "the last state is kept"
    );

    // Same address: the nodes come back by themselves.
    let mut restarted = None;
    for _ in 0..20 {
        match Aggregator::start(
            config(&dir, certs.aggregator.clone(), addr),
            clock::Clock::system(),
        )
        .await
        {
            Ok(agg) => {
                restarted = Some(agg);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let restarted = restarted.expect("the aggregator rebinds its port");
    assert_eq!(
        restarted.status(clock::now()).rooms[0].active_users,
        7,
        "the snapshot written at stop brings the global state back at once"
    );
    assert!(
        eventually(Duration::from_secs(10), || active(&a) == Some(7)
            && active(&b) == Some(7))
        .await,
        "nodes reconnect and are fresh again"
    );
    trigger.fire();
    restarted.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_certificate_from_another_ca_is_refused() {
    let dir = temp_dir("rogue");
    let certs = devcerts::write(&dir.join("cluster"), &["n1".into()]).unwrap();
    let rogue = devcerts::write(&dir.join("rogue"), &["n1".into()]).unwrap();
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let aggregator = Aggregator::start(
        config(&dir, certs.aggregator.clone(), loopback),
        clock::Clock::system(),
    )
    .await
    .unwrap();
    // The rogue node trusts the real CA (it knows whom to call) but its own
    // certificate comes from another CA.
    let files = TlsFiles {
        ca: certs.ca.clone(),
        ..rogue.nodes[0].1.clone()
    };
    let (trigger, shutdown) = shutdown::channel();
    let handle = node("n1", "x", &files, aggregator.quic_addr(), 1, &shutdown);
    let refused = || {
        aggregator
            .metrics()
            .handshakes_refused_total
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    assert!(eventually(Duration::from_secs(5), || refused() >= 1).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(handle.status.reports_total.load(Relaxed), 0);
    assert!(!handle.status.connected());
    assert!(handle.status.errors_total.load(Relaxed) >= 1);
    assert_eq!(
        handle.world.freshness(clock::Clock::system().elapsed()),
        gossip::Freshness::Never
    );
    assert!(aggregator.status(clock::now()).nodes.is_empty());
    trigger.fire();
    aggregator.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A node holding certificate `n2` that reports as `n1` is refused and
/// counted; the real `n1`'s sessions stay in the global count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reporting_under_another_nodes_name_is_refused() {
    use std::sync::atomic::Ordering::Relaxed;
    let dir = temp_dir("impostor");
    let certs = devcerts::write(&dir, &["n1".into(), "n2".into()]).unwrap();
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let aggregator = Aggregator::start(
        config(&dir, certs.aggregator.clone(), loopback),
        clock::Clock::system(),
    )
    .await
    .unwrap();
    let addr = aggregator.quic_addr();
    let (trigger, shutdown) = shutdown::channel();
    let honest = node("n1", "x", &certs.nodes[0].1, addr, 3, &shutdown);
    assert!(
        eventually(Duration::from_secs(5), || active(&honest) == Some(3)).await,
        "the honest node is heard"
    );
    // The impostor claims n1's name with n2's certificate and no sessions:
    // accepted, it would replace n1's report and its 3 sessions would vanish.
    let impostor = node("n1", "x", &certs.nodes[1].1, addr, 0, &shutdown);
    assert!(
        eventually(Duration::from_secs(5), || {
            aggregator.metrics().identity_refused_total.load(Relaxed) >= 3
        })
        .await,
        "the impostor's reports are refused"
    );
    assert_eq!(impostor.status.reports_total.load(Relaxed), 0);
    assert_eq!(
        impostor.world.freshness(clock::Clock::system().elapsed()),
        gossip::Freshness::Never,
        "the impostor never gets a state"
    );
    let status = aggregator.status(clock::now());
    assert_eq!(status.rooms[0].active_users, 3, "n1's sessions still count");
    assert_eq!(status.nodes.len(), 1);
    assert_eq!(active(&honest), Some(3));
    assert_eq!(
        aggregator
            .metrics()
            .connections_replaced_total
            .load(Relaxed),
        0,
        "a refused impostor does not take over the honest node's connection"
    );
    trigger.fire();
    aggregator.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// One live connection per node: the same node connecting again replaces
/// its older connection (a restart whose old connection is not yet timed out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_connecting_again_replaces_its_older_connection() {
    use std::sync::atomic::Ordering::Relaxed;
    let dir = temp_dir("replaced");
    let certs = devcerts::write(&dir, &["n1".into()]).unwrap();
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let aggregator = Aggregator::start(
        config(&dir, certs.aggregator.clone(), loopback),
        clock::Clock::system(),
    )
    .await
    .unwrap();
    let addr = aggregator.quic_addr();
    let (old_trigger, old_shutdown) = shutdown::channel();
    let first = node("n1", "x", &certs.nodes[0].1, addr, 2, &old_shutdown);
    assert!(eventually(Duration::from_secs(5), || active(&first) == Some(2)).await);
    let (trigger, shutdown) = shutdown::channel();
    let second = node("n1", "x", &certs.nodes[0].1, addr, 2, &shutdown);
    assert!(
        eventually(Duration::from_secs(5), || {
            aggregator
                .metrics()
                .connections_replaced_total
                .load(Relaxed)
                >= 1
        })
        .await,
        "the older connection is closed"
    );
    // The old process goes away; the new one keeps being served.
    old_trigger.fire();
    assert!(eventually(Duration::from_secs(5), || active(&second) == Some(2)).await);
    assert_eq!(aggregator.status(clock::now()).nodes.len(), 1);
    trigger.fire();
    aggregator.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
