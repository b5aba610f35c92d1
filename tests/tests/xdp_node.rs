//! The node with its XDP program, end to end (privileged): `waitroom-edge`
//! attaches to the host end of a veth pair the test made, visitors connect
//! from inside the namespace, the node's metrics show what the kernel counted,
//! the admin listener's deny list drops a source before it costs a socket,
//! and a stopped node leaves no program behind.
//!
//! Skips, saying why, when not run as root.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, SocketAddrV4, TcpStream},
    process::Command,
    time::{Duration, Instant},
};

use waitroom_tests::{
    edge::{Edge, client, get_text, metric},
    netns::NetNs,
    procs::{TempDir, free_port, start_origin},
    require_root,
};

/// One HTTP request over a fresh connection from inside the namespace.
fn visit_from_inside(ns: &NetNs, to: SocketAddr) -> std::io::Result<String> {
    ns.run_inside(|| {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET / HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        Ok(text)
    })?
}

fn xdp_attached_on(interface: &str) -> bool {
    let out = Command::new("ip")
        .args(["link", "show", "dev", interface])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).contains("xdp")
}

#[test]
fn node_counts_connections_in_the_kernel_and_its_deny_list_drops_sources() {
    if !require_root() {
        return;
    }
    let ns = NetNs::new().expect("namespace and veth pair");
    let dir = TempDir::new("xdp-node");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let port = free_port().unwrap();
    let listen = SocketAddr::V4(SocketAddrV4::new(ns.host_addr(), port));
    let config = format!(
        r#"[node]
id = "xdp-node"
listen = "{listen}"
admin_listen = "127.0.0.1:0"
workers = 1
counters_path = "{counters}"

[xdp]
interface = "{interface}"
ports = [{port}]

[[rooms]]
id = "shop"
origin = "{origin}"
total_active_users = 100
new_users_per_minute = 100
"#,
        counters = dir.path().join("counters.shm").display(),
        interface = ns.host_if(),
    );
    let mut edge = Edge::start(dir.path(), "edge", &config).unwrap();
    let metrics = || get_text(&edge.admin_url("/metrics"));
    assert_eq!(
        metric(&metrics(), "waitroom_xdp_attached"),
        Some(1.0),
        "{}",
        edge.proc.stderr()
    );
    assert!(xdp_attached_on(ns.host_if()));

    const VISITS: usize = 5;
    for _ in 0..VISITS {
        let answer = visit_from_inside(&ns, listen).expect("a visit through the veth");
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
    let resp = admin
        .post(&edge.admin_url(&format!("/deny?prefix={prefix}")))
        .send_empty()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert!(
        visit_from_inside(&ns, listen).is_err(),
        "a denied source got through"
    );
    let list = get_text(&edge.admin_url("/deny"));
    let rows: serde_json::Value = serde_json::from_str(&list).unwrap();
    assert_eq!(rows[0]["prefix"], prefix.as_str(), "{list}");
    assert!(rows[0]["dropped_packets"].as_u64().unwrap() >= 1, "{list}");
    let resp = admin
        .delete(&edge.admin_url(&format!("/deny?prefix={prefix}")))
        .call()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert!(
        visit_from_inside(&ns, listen)
            .unwrap()
            .starts_with("HTTP/1.1 200")
    );
    let bad = admin
        .post(&edge.admin_url("/deny?prefix=not-an-ip"))
        .send_empty()
        .unwrap();
    assert_eq!(bad.status().as_u16(), 400);

    // A clean stop detaches the program.
    let status = edge.proc.terminate(Duration::from_secs(10)).expect("exit");
    assert!(status.success(), "{status:?}");
    assert!(
        !xdp_attached_on(ns.host_if()),
        "the program outlived the node"
    );
}
