//! What the aggregator writes for operators about a node's connection, with
//! the real binaries on loopback: one aggregator, one node reporting every
//! 100 ms. Also what merging its reports cost (a histogram of the time each
//! held the cluster's lock).
//!
//! Every line logged on a node's connection carries the connection's span:
//! its remote address and the node's name. The name was recorded again on
//! every report, and the log formatter appends a field recorded again, so
//! each connection's span grew by the name with every report (memory held
//! as long as the connection lived, and lines that grew without bound): 30
//! reports in, the line for a lost connection named the node 30 times.
//! And the reports after the connection's first come as changes.
use std::{net::SocketAddr, time::Duration};

use waitroom_tests::{
    cluster::{Aggregator, Certs, aggregator_config, free_udp_port, random_room, start_nodes},
    edge::{fresh_from, get_text},
    eventually,
    minutes::now_secs,
    procs::{TempDir, start_origin},
};

const INTERVAL_MS: u64 = 100;

#[test]
fn a_connection_names_its_node_once_however_many_reports_it_carried() {
    let dir = TempDir::new("agg-logs");
    let certs = Certs::generate(&dir.path().join("certs"), &["ams-1"]).unwrap();
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let listen: SocketAddr = format!("127.0.0.1:{}", free_udp_port().unwrap())
        .parse()
        .unwrap();
    let room = random_room(60, 24);
    let config = aggregator_config(listen, &certs, &dir.path().join("aggregator.json"), &room);
    let aggregator = Aggregator::start(dir.path(), "aggregator", &config).unwrap();
    let mut edges = start_nodes(
        dir.path(),
        &certs,
        &[listen],
        &[("ams-1", "ams")],
        &room,
        origin,
        INTERVAL_MS,
    );
    let started = now_secs();
    assert!(
        eventually(Duration::from_secs(20), || fresh_from(
            &get_text(&edges[0].admin_url("/metrics")),
            listen,
            started
        )),
        "the node is fresh from the aggregator"
    );
    // Many reports on one connection.
    let reports = || {
        aggregator
            .metric("waitroom_aggregator_reports_total")
            .unwrap_or(0.0)
    };
    assert!(
        eventually(Duration::from_secs(20), || reports() >= 30.0),
        "30 reports: {}",
        reports()
    );
    // What merging them cost is a histogram of one observation per report
    // (the merge is timed before the report is counted: at least as many).
    let reported = reports();
    let merges = aggregator
        .metric("waitroom_aggregator_merge_seconds_count")
        .expect("the merge histogram is exposed");
    assert!(
        merges >= reported,
        "{merges} merges timed for {reported} reports"
    );
    let every = aggregator
        .metric("waitroom_aggregator_merge_seconds_bucket{le=\"+Inf\"}")
        .expect("its +Inf bucket");
    let sum = aggregator
        .metric("waitroom_aggregator_merge_seconds_sum")
        .expect("its sum");
    assert!(
        every >= merges && sum > 0.0,
        "+Inf bucket {every}, sum {sum} s"
    );
    eprintln!(
        "{merges} merges, {:.1} µs each on average",
        sum / merges * 1e6
    );
    // The node dies; the aggregator notices at its idle timeout (6 s) and
    // says so on the connection's span.
    edges[0].proc.kill();
    let lost = || {
        aggregator
            .proc
            .stderr()
            .lines()
            .find(|l| l.contains("connection lost"))
            .map(str::to_owned)
    };
    assert!(
        eventually(Duration::from_secs(15), || lost().is_some()),
        "the aggregator logs the lost connection: {}",
        aggregator.proc.stderr()
    );
    let line = lost().unwrap();
    eprintln!("{line}");
    assert_eq!(
        line.matches("node=\"ams-1\"").count(),
        1,
        "the line names the node once, after {} reports: {line}",
        reports()
    );
    assert!(
        line.contains("remote=127.0.0.1:"),
        "and says where it came from: {line}"
    );
    // After the connection's first report, the node sends each as the
    // changes since the last one answered, and the aggregator rebuilds them
    // all (none refused: it keeps the reports they are made against). Read
    // with the node dead and its connection closed: while it reports (every
    // 100 ms), each counter read is a separate scrape, and a frame between
    // two of them made the changes' bytes read above all bytes read just
    // before (CI: "2100 of 2092 bytes").
    let metric = |name| aggregator.metric(name).unwrap_or(-1.0);
    let changes = metric("waitroom_aggregator_changes_reports_total");
    let reported = reports();
    assert!(
        reported >= 30.0 && changes >= reported - 3.0 && changes <= reported,
        "{changes} of {reported} reports as changes"
    );
    assert_eq!(metric("waitroom_aggregator_changes_refused_total"), 0.0);
    // Their bytes are counted apart from the rest (how much smaller they
    // are, on the same counts: `lost_asks.rs`).
    let all = metric("waitroom_aggregator_frame_bytes_total");
    let as_changes = metric("waitroom_aggregator_changes_bytes_total");
    assert!(
        0.0 < as_changes && as_changes < all,
        "{as_changes} of {all} bytes"
    );
}
