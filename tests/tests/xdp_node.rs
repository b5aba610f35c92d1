//! The node with its XDP program, end to end (privileged): `waitroom-edge`
//! attaches to the host end of a veth pair the test made, visitors connect
//! from inside the namespace, the node's metrics show what the kernel counted,
//! the admin listener's deny list drops a source before it costs a socket
//! (changed only with the admin token, and kept across a restart), and a
//! stopped node leaves no program behind.
//!
//! Skips, saying why, when not run as root.
use std::time::{Duration, Instant};

use waitroom_tests::{
    edge::{Edge, client, get_text, metric},
    require_root,
    xdp_node::XdpNodeFixture,
};

/// The admin bearer token the test's node reads from its token file.
const TOKEN: &str = "a7e3b1c4d5f60718293a4b5c6d7e8f90";

#[test]
fn node_counts_connections_in_the_kernel_and_its_deny_list_drops_sources() {
    if !require_root() {
        return;
    }
    let fixture =
        XdpNodeFixture::new("xdp-node", 1, TOKEN).expect("namespace, veth pair and origin");
    let XdpNodeFixture {
        ns,
        dir,
        port,
        config,
        ..
    } = &fixture;
    let port = *port;
    let mut edge = Edge::start(dir.path(), "edge", config).unwrap();
    let metrics = || get_text(&edge.admin_url("/metrics"));
    assert_eq!(
        metric(&metrics(), "waitroom_xdp_attached"),
        Some(1.0),
        "{}",
        edge.proc.stderr()
    );
    assert!(fixture.link().contains("xdp"));

    const VISITS: usize = 5;
    for _ in 0..VISITS {
        let answer = fixture
            .visit_from_inside()
            .expect("a visit through the veth");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    // The telemetry task reads the maps every second.
    let series = format!("waitroom_xdp_port_syns_total{{port=\"{port}\"}}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut syns = 0.0;
    while Instant::now() < deadline {
        syns = metric(&metrics(), &series).unwrap_or(0.0);
        if syns >= VISITS as f64 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        (VISITS as f64..=2.0 * VISITS as f64).contains(&syns),
        "SYNs counted in the kernel: {syns}"
    );
    assert!(
        metric(
            &metrics(),
            "waitroom_xdp_distinct_sources{minute=\"current\"}"
        )
        .unwrap_or(0.0)
            >= 1.0
    );

    // Deny the namespace's address: its connection attempts die in XDP.
    let admin = client();
    let prefix = format!("{}/32", ns.peer_addr());
    let post = |edge: &Edge, query: &str, token: Option<&str>| {
        let mut req = admin.post(&edge.admin_url(&format!("/deny?{query}")));
        if let Some(t) = token {
            req = req.header("Authorization", &format!("Bearer {t}"));
        }
        req.send_empty().unwrap().status().as_u16()
    };
    let deny_query = format!("prefix={prefix}");
    assert_eq!(post(&edge, &deny_query, None), 401, "no token, no change");
    assert_eq!(post(&edge, &deny_query, Some(TOKEN)), 200);
    assert!(
        fixture.visit_from_inside().is_err(),
        "a denied source got through"
    );
    let list = get_text(&edge.admin_url("/deny"));
    let rows: serde_json::Value = serde_json::from_str(&list).unwrap();
    assert_eq!(rows[0]["prefix"], prefix.as_str(), "{list}");
    assert!(rows[0]["dropped_packets"].as_u64().unwrap() >= 1, "{list}");

    // A restart keeps the entry: it is in the state dir and applied again
    // when the program attaches.
    let status = edge.proc.terminate(Duration::from_secs(10)).expect("exit");
    assert!(status.success(), "{status:?}");
    let persisted = std::fs::read_to_string(dir.path().join("deny.list")).unwrap();
    assert!(persisted.lines().any(|l| l == prefix), "{persisted}");
    edge = Edge::start(dir.path(), "edge-restarted", config).unwrap();
    let list = get_text(&edge.admin_url("/deny"));
    let rows: serde_json::Value = serde_json::from_str(&list).unwrap();
    assert_eq!(rows[0]["prefix"], prefix.as_str(), "after restart: {list}");
    assert!(
        fixture.visit_from_inside().is_err(),
        "a denied source got through after a restart"
    );

    // Too broad without force, or host bits set: refused, nothing changes.
    assert_eq!(post(&edge, "prefix=0.0.0.0/0", Some(TOKEN)), 400);
    assert_eq!(post(&edge, "prefix=10.1.2.3/8", Some(TOKEN)), 400);
    let list = get_text(&edge.admin_url("/deny"));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&list)
            .unwrap()
            .as_array()
            .map(Vec::len),
        Some(1),
        "{list}"
    );

    let resp = admin
        .delete(&edge.admin_url(&format!("/deny?prefix={prefix}")))
        .header("Authorization", &format!("Bearer {TOKEN}"))
        .call()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert!(
        fixture
            .visit_from_inside()
            .unwrap()
            .starts_with("HTTP/1.1 200")
    );
    assert_eq!(post(&edge, "prefix=not-an-ip", Some(TOKEN)), 400);
    let persisted = std::fs::read_to_string(dir.path().join("deny.list")).unwrap();
    assert!(
        !persisted.contains(&prefix),
        "removal persisted: {persisted}"
    );

    // A clean stop detaches the program.
    let status = edge.proc.terminate(Duration::from_secs(10)).expect("exit");
    assert!(status.success(), "{status:?}");
    assert!(
        !fixture.link().contains("xdp"),
        "the program outlived the node"
    );
}
