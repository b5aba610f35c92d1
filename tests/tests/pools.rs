//! Origin pools on loopback: real demo origins behind a real node, health
//! checks every few hundred milliseconds, origins killed, restarted and slowed
//! down while a client keeps asking. Every response says which origin served
//! it (`x-demo-origin`).
use std::{
    net::SocketAddr,
    process::Command,
    time::{Duration, Instant},
};

use waitroom_tests::{
    edge::{Edge, client, metric},
    procs::{Proc, TempDir, binary, free_port, wait_connectable},
};

/// A demo origin on `addr`, each response `delay_ms` late.
fn origin(dir: &TempDir, name: &str, addr: SocketAddr, delay_ms: u64) -> Proc {
    let mut cmd = Command::new(binary("waitroom-demo-origin"));
    cmd.args([
        "--listen",
        &addr.to_string(),
        "--delay-ms",
        &delay_ms.to_string(),
    ]);
    let proc = Proc::spawn(name, cmd, dir.path()).expect("starting a demo origin");
    wait_connectable(addr, Duration::from_secs(10)).expect("origin listening");
    proc
}

fn loopback() -> SocketAddr {
    format!("127.0.0.1:{}", free_port().unwrap())
        .parse()
        .unwrap()
}

/// A node with one room "shop" that admits everyone; `upstream` is the room's
/// origin keys (pools, steering, health).
fn start_edge(dir: &TempDir, upstream: &str) -> Edge {
    let config = format!(
        r#"[node]
id = "test-node"
colo = "test"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
workers = 2
counters_path = "{counters}"

[[rooms]]
id = "shop"
origin_timeout_ms = 3000
total_active_users = 100000
new_users_per_minute = 100000
{upstream}
"#,
        counters = dir.path().join("counters.shm").display()
    );
    Edge::start(dir.path(), "edge", &config).expect("edge starts")
}

/// One GET through the node: status and the origin that answered ("-" for none).
fn visit(agent: &ureq::Agent, edge: &Edge) -> (u16, String) {
    let resp = agent.get(edge.url("/")).call().expect("request");
    let served_by = resp
        .headers()
        .get("x-demo-origin")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    (resp.status().as_u16(), served_by)
}

fn metrics(edge: &Edge) -> String {
    client()
        .get(edge.admin_url("/metrics"))
        .call()
        .expect("metrics")
        .body_mut()
        .read_to_string()
        .unwrap()
}

fn origin_up(edge: &Edge, pool: &str, addr: SocketAddr) -> Option<f64> {
    metric(
        &metrics(edge),
        &format!("waitroom_origin_up{{room=\"shop\",pool=\"{pool}\",origin=\"{addr}\"}}"),
    )
}

/// Polls `check` every 50 ms until it holds or `limit` passes; the time it took.
fn wait_until(limit: Duration, what: &str, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check() {
            return start.elapsed();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what}: not within {limit:?}");
}

#[test]
fn dynamic_steering_moves_traffic_off_a_pool_that_slows_down() {
    let dir = TempDir::new("pools-dynamic");
    let (near, far) = (loopback(), loopback());
    let _near = origin(&dir, "near", near, 0);
    let _far = origin(&dir, "far", far, FAR_MS);
    let edge = start_edge(
        &dir,
        &format!(
            r#"steering = "dynamic"
[[rooms.pools]]
name = "near"
origins = ["{near}"]
[[rooms.pools]]
name = "far"
origins = ["{far}"]
[rooms.health]
path = "/healthz"
interval_ms = {INTERVAL_MS}
timeout_ms = {INTERVAL_MS}
fall = 2
rise = 2
ewma_time_bias_ms = {TAU_MS}
"#
        ),
    );
    // Both pools probed: the EWMAs are there and "near" is the faster one.
    let ewma = |pool: &str| {
        metric(
            &metrics(&edge),
            &format!("waitroom_pool_rtt_ewma_seconds{{room=\"shop\",pool=\"{pool}\"}}"),
        )
    };
    wait_until(Duration::from_secs(5), "first probes", || {
        ewma("near").is_some() && ewma("far").is_some()
    });
    let far_ewma = ewma("far").unwrap();
    assert!(
        (FAR_MS as f64 / 1000.0..0.5).contains(&far_ewma),
        "far pool EWMA {far_ewma}"
    );
    let agent = client();
    for _ in 0..10 {
        assert_eq!(visit(&agent, &edge), (200, near.to_string()));
    }

    // "near" now answers in SLOW_MS. Each probe moves its EWMA by
    // 1 − e^(−interval/τ) of the gap, so it passes "far" after `expected` probes.
    let started = Instant::now();
    let set = ureq::post(format!("http://{near}/_demo/delay?ms={SLOW_MS}"))
        .send_empty()
        .expect("slowing the origin down");
    assert_eq!(set.status().as_u16(), 200);
    let step = 1.0 - (-(INTERVAL_MS as f64) / TAU_MS as f64).exp();
    let gap = (FAR_MS as f64) / (SLOW_MS as f64);
    let expected = ((1.0 - gap).ln() / (1.0 - step).ln()).ceil() as u64;
    assert_eq!(expected, 2, "the numbers below assume two probes");

    let mut served = Vec::new();
    let mut moved_after = None;
    while started.elapsed() < Duration::from_secs(10) {
        let (status, by) = visit(&agent, &edge);
        assert_eq!(status, 200);
        served.push(by.clone());
        if by == far.to_string() && moved_after.is_none() {
            moved_after = Some(started.elapsed());
        }
        if served.len() >= 10 && served.iter().rev().take(10).all(|b| *b == far.to_string()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let moved_after = moved_after.unwrap_or_else(|| panic!("never moved: {served:?}"));
    // Not on the first slow probe (the average smooths it), and no later than
    // the expected probes plus one interval of phase and one slow probe.
    let earliest = Duration::from_millis(SLOW_MS + INTERVAL_MS * (expected - 1));
    let latest = Duration::from_millis(INTERVAL_MS * (expected + 1) + SLOW_MS + 1000);
    assert!(
        moved_after >= earliest.saturating_sub(Duration::from_millis(100)),
        "moved after {moved_after:?}, before {expected} slow probes could have happened"
    );
    assert!(
        moved_after <= latest,
        "moved after {moved_after:?}, expected within {latest:?}"
    );
    let tail: Vec<_> = served.iter().rev().take(10).collect();
    assert!(tail.iter().all(|b| **b == far.to_string()), "{served:?}");
    assert!(ewma("near").unwrap() > ewma("far").unwrap());
}

const INTERVAL_MS: u64 = 400;
const TAU_MS: u64 = 2000;
const FAR_MS: u64 = 80;
const SLOW_MS: u64 = 300;

#[test]
fn a_killed_origin_is_marked_down_traffic_moves_without_errors_and_comes_back() {
    let dir = TempDir::new("pools-failover");
    let (a1, a2, b) = (loopback(), loopback(), loopback());
    let mut p_a1 = origin(&dir, "a1", a1, 0);
    let mut p_a2 = origin(&dir, "a2", a2, 0);
    let mut p_b = origin(&dir, "b", b, 0);
    let edge = start_edge(
        &dir,
        &format!(
            r#"steering = "ordered"
[[rooms.pools]]
name = "primary"
origins = ["{a1}", "{a2}"]
[[rooms.pools]]
name = "backup"
origins = ["{b}"]
[rooms.health]
path = "/healthz"
interval_ms = 200
timeout_ms = 200
fall = 2
rise = 2
"#
        ),
    );
    let agent = client();
    let (a1s, a2s, bs) = (a1.to_string(), a2.to_string(), b.to_string());

    // Round-robin within the first pool; the backup idles.
    let served: Vec<_> = (0..10).map(|_| visit(&agent, &edge)).collect();
    assert!(
        served.iter().all(|(s, by)| *s == 200 && *by != bs),
        "{served:?}"
    );
    assert!(served.iter().any(|(_, by)| *by == a1s) && served.iter().any(|(_, by)| *by == a2s));

    // a1 dies: every request still succeeds (a connection to a1 fails over to
    // a2 at once), and a1 is marked down within fall × interval.
    p_a1.kill();
    let killed = Instant::now();
    let mut after_kill = Vec::new();
    let down_after = wait_until(Duration::from_secs(3), "a1 marked down", || {
        after_kill.push(visit(&agent, &edge));
        origin_up(&edge, "primary", a1) == Some(0.0)
    });
    assert!(
        down_after <= Duration::from_millis(2 * 200 + 600),
        "{down_after:?}"
    );
    for _ in 0..10 {
        after_kill.push(visit(&agent, &edge));
    }
    assert!(
        after_kill.iter().all(|(s, by)| *s == 200 && *by == a2s),
        "after killing a1: {after_kill:?}"
    );

    // a2 dies too: the backup pool takes over, again without an error.
    p_a2.kill();
    let mut to_backup = Vec::new();
    wait_until(Duration::from_secs(3), "a2 marked down", || {
        to_backup.push(visit(&agent, &edge));
        origin_up(&edge, "primary", a2) == Some(0.0)
    });
    for _ in 0..5 {
        to_backup.push(visit(&agent, &edge));
    }
    assert!(
        to_backup.iter().all(|(s, _)| *s == 200),
        "failing over to the backup: {to_backup:?}"
    );
    assert!(to_backup.iter().rev().take(5).all(|(_, by)| *by == bs));
    let m = metrics(&edge);
    assert_eq!(
        metric(&m, "waitroom_pool_up{room=\"shop\",pool=\"primary\"}"),
        Some(0.0)
    );

    // a1 comes back on its port: up after `rise` good probes, and the first
    // pool has the traffic again.
    let _p_a1 = origin(&dir, "a1-again", a1, 0);
    let up_after = wait_until(Duration::from_secs(3), "a1 marked up", || {
        origin_up(&edge, "primary", a1) == Some(1.0)
    });
    assert!(
        up_after <= Duration::from_millis(2 * 200 + 800),
        "{up_after:?}"
    );
    let back: Vec<_> = (0..5).map(|_| visit(&agent, &edge)).collect();
    assert!(
        back.iter().all(|(s, by)| *s == 200 && *by == a1s),
        "{back:?}"
    );

    // Everything down: a clear 503 at once, not a 502 and not a hang.
    drop(_p_a1);
    p_b.kill();
    wait_until(Duration::from_secs(5), "every pool down", || {
        let m = metrics(&edge);
        metric(&m, "waitroom_pool_up{room=\"shop\",pool=\"primary\"}") == Some(0.0)
            && metric(&m, "waitroom_pool_up{room=\"shop\",pool=\"backup\"}") == Some(0.0)
    });
    let asked = Instant::now();
    let mut resp = agent.get(edge.url("/")).call().expect("request");
    assert_eq!(resp.status().as_u16(), 503);
    assert!(asked.elapsed() < Duration::from_secs(1));
    let body = resp.body_mut().read_to_string().unwrap();
    assert!(body.contains("down for the moment"), "{body}");
    assert!(killed.elapsed() < Duration::from_secs(30));
}

#[test]
fn a_failed_connection_is_retried_once_for_idempotent_requests_only() {
    let dir = TempDir::new("pools-retry");
    let live = loopback();
    // A port nobody listens on: every connection is refused.
    let dead = loopback();
    let _live = origin(&dir, "live", live, 0);
    // No health checks: nothing marks the dead origin down, so round-robin
    // keeps sending every other request there.
    let edge = start_edge(
        &dir,
        &format!(
            r#"[[rooms.pools]]
name = "only"
origins = ["{dead}", "{live}"]
"#
        ),
    );
    let agent = client();
    for _ in 0..10 {
        assert_eq!(visit(&agent, &edge), (200, live.to_string()));
    }
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let resp = agent
            .post(edge.url("/echo"))
            .send("order=1")
            .expect("request");
        statuses.push(resp.status().as_u16());
    }
    assert!(
        statuses.iter().all(|s| [200, 502].contains(s)),
        "{statuses:?}"
    );
    let refused = statuses.iter().filter(|s| **s == 502).count();
    assert!(
        (4..=6).contains(&refused),
        "a POST is not retried: about half should fail, {statuses:?}"
    );
    let m = metrics(&edge);
    let failures = metric(
        &m,
        &format!(
            "waitroom_origin_connection_failures_total{{room=\"shop\",pool=\"only\",origin=\"{dead}\"}}"
        ),
    );
    assert!(failures >= Some(14.0), "{failures:?}");
    assert_eq!(
        metric(
            &m,
            &format!("waitroom_origin_up{{room=\"shop\",pool=\"only\",origin=\"{dead}\"}}")
        ),
        Some(1.0),
        "without health checks nothing would mark it up again, so nothing marks it down"
    );
}

#[test]
fn the_aggregator_shows_every_nodes_opinion_of_every_pool() {
    use waitroom_tests::cluster::{
        Aggregator, Certs, aggregator_config, free_udp_port, node_gossip_table,
    };
    let dir = TempDir::new("pools-aggregator");
    let certs = Certs::generate(&dir.path().join("certs"), &["n1", "n2"]).unwrap();
    let live = loopback();
    let _live = origin(&dir, "live", live, 0);
    let dead = loopback();
    let listen: SocketAddr = format!("127.0.0.1:{}", free_udp_port().unwrap())
        .parse()
        .unwrap();
    let aggregator = Aggregator::start(
        dir.path(),
        "aggregator",
        &aggregator_config(
            listen,
            &certs,
            &dir.path().join("aggregator.json"),
            "[[rooms]]\nid = \"shop\"\ntotal_active_users = 1000\nnew_users_per_minute = 1000\n",
        ),
    )
    .unwrap();
    // Two nodes, same room and pool names; n2's "main" pool points at a port
    // nobody listens on, so the nodes disagree about it.
    let node = |name: &str, main: SocketAddr| {
        let config = format!(
            r#"[node]
id = "{name}"
colo = "test"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
workers = 1
counters_path = "{counters}"

[[rooms]]
id = "shop"
total_active_users = 1000
new_users_per_minute = 1000
[[rooms.pools]]
name = "main"
origins = ["{main}"]
[[rooms.pools]]
name = "spare"
origins = ["{live}"]
[rooms.health]
path = "/healthz"
interval_ms = 200
timeout_ms = 200
fall = 2
rise = 2

{gossip}"#,
            counters = dir.path().join(format!("{name}.shm")).display(),
            gossip = node_gossip_table(listen, &certs, &certs, name, 200),
        );
        Edge::start(dir.path(), name, &config).unwrap()
    };
    let _n1 = node("n1", live);
    let _n2 = node("n2", dead);

    let opinion = |status: &serde_json::Value, node: &str, pool: &str| {
        status["pools"].as_array().and_then(|rows| {
            rows.iter()
                .find(|r| r["node"] == node && r["room"] == "shop" && r["pool"] == pool)
                .map(|r| (r["up"].as_bool(), r["rtt_ewma_ms"].as_f64()))
        })
    };
    let mut status = serde_json::Value::Null;
    wait_until(Duration::from_secs(10), "every opinion reported", || {
        let text = client()
            .get(aggregator.admin_url("/status"))
            .call()
            .expect("aggregator status")
            .body_mut()
            .read_to_string()
            .unwrap();
        status = serde_json::from_str(&text).unwrap();
        matches!(opinion(&status, "n1", "main"), Some((Some(true), Some(_))))
            && matches!(opinion(&status, "n2", "main"), Some((Some(false), None)))
            && matches!(opinion(&status, "n1", "spare"), Some((Some(true), Some(_))))
            && matches!(opinion(&status, "n2", "spare"), Some((Some(true), Some(_))))
    });
    let rows = status["pools"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert!(rows.iter().all(|r| r["colo"] == "test"));
}
