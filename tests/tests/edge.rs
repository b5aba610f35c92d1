//! The edge node as operators run it: the real binary in front of the real demo
//! origin on loopback, driven by a cookie-keeping HTTP client.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    process::Command,
    time::{Duration, Instant},
};

use waitroom_tests::{
    edge::{Edge, QUEUE, SITE, client, get, metric},
    minutes::early_in_a_minute,
    procs::{Proc, TempDir, binary, free_port, start_origin},
};

/// A node config with one room in front of `origin`; `room` adds or overrides keys.
fn config(dir: &TempDir, origin: SocketAddr, room: &str) -> String {
    format!(
        r#"[node]
id = "test-node"
colo = "test"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
workers = 2
counters_path = "{counters}"
header_read_timeout_ms = 500
shutdown_grace_ms = 5000

[[rooms]]
id = "shop"
host = "*"
path = "/"
origin = "{origin}"
origin_timeout_ms = 2000
{room}
"#,
        counters = dir.path().join("counters.shm").display()
    )
}

/// A scratch dir, the demo origin and a node in front of it with `room`'s keys.
fn node(tag: &str, room: &str) -> (TempDir, Proc, Edge) {
    let dir = TempDir::new(tag);
    let (origin_proc, origin) = start_origin(dir.path(), "origin").unwrap();
    let edge = Edge::start(dir.path(), "edge", &config(&dir, origin, room)).unwrap();
    (dir, origin_proc, edge)
}

fn metrics(edge: &Edge) -> String {
    get(&client(), &edge.admin_url("/metrics")).1
}

#[test]
fn admits_up_to_the_limit_then_queues_and_keeps_sessions() {
    let (_dir, _origin, edge) = node(
        "limits",
        "total_active_users = 3\nnew_users_per_minute = 3\nsession_duration = 5",
    );
    early_in_a_minute(20);
    let visitors: Vec<ureq::Agent> = (0..5).map(|_| client()).collect();
    let mut admitted = 0;
    let mut queued = 0;
    for v in &visitors {
        let (status, body) = get(v, &edge.url("/"));
        assert_eq!(status, 200);
        if body.contains(SITE) {
            admitted += 1;
        } else {
            assert!(body.contains(QUEUE), "neither site nor queue page: {body}");
            queued += 1;
        }
    }
    assert_eq!(
        (admitted, queued),
        (3, 2),
        "3 slots → 3 admitted, 2 queued; status: {}",
        get(&client(), &edge.admin_url("/status")).1
    );
    // The first three keep their sessions: they go straight to the site.
    for v in &visitors[..3] {
        let (_, body) = get(v, &edge.url("/product/1"));
        assert!(
            body.contains(SITE),
            "an admitted visitor was queued: {body}"
        );
    }
    // A queued visitor reloading early stays queued and takes nothing.
    let (_, body) = get(&visitors[3], &edge.url("/"));
    assert!(body.contains(QUEUE));
    let m = metrics(&edge);
    assert_eq!(
        metric(&m, "waitroom_admitted_total{room=\"shop\",kind=\"new\"}"),
        Some(3.0),
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            "waitroom_admitted_total{room=\"shop\",kind=\"returning\"}"
        ),
        Some(3.0)
    );
    assert_eq!(
        metric(&m, "waitroom_active_users{room=\"shop\",scope=\"node\"}"),
        Some(3.0)
    );
    assert_eq!(
        metric(&m, "waitroom_waiting{room=\"shop\",scope=\"node\"}"),
        Some(2.0)
    );
}

#[test]
fn queued_apps_get_json_with_the_template_fields_and_a_refresh() {
    let (_dir, _origin, edge) = node(
        "json",
        "total_active_users = 1\nnew_users_per_minute = 1\nqueue_status = 429\nrefresh_interval = 30",
    );
    early_in_a_minute(10);
    let first = client();
    assert!(get(&first, &edge.url("/")).1.contains(SITE));
    let app = client();
    let mut resp = app
        .get(&edge.url("/api/cart"))
        .header("Accept", "application/json")
        .call()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 429, "configured queue status");
    let refresh: u64 = resp.headers()["refresh"].to_str().unwrap().parse().unwrap();
    assert!(
        (24..=36).contains(&refresh),
        "jittered around 30 s: {refresh}"
    );
    assert_eq!(resp.headers()["content-type"], "application/json");
    let v: serde_json::Value =
        serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap();
    let w = &v["waitingRoom"];
    assert_eq!(w["inWaitingRoom"], true);
    assert_eq!(w["queueingMethod"], "fifo");
    assert_eq!(w["isFIFOQueue"], true);
    assert_eq!(w["refreshIntervalSeconds"], refresh);
    for field in [
        "waitTime",
        "waitTime25Percentile",
        "waitTime50Percentile",
        "waitTime75Percentile",
        "waitTimeFormatted",
        "queueIsFull",
        "queueAll",
        "lastUpdated",
        "visitorsAhead",
        "waitTimeKnown",
        "isRandomQueue",
    ] {
        assert!(w.get(field).is_some(), "missing {field}: {w}");
    }
}

#[test]
fn tampered_and_foreign_cookies_make_new_visitors_never_errors() {
    let (_dir, _origin, edge) = node(
        "tamper",
        "total_active_users = 100\nnew_users_per_minute = 100",
    );
    let agent = client();
    let resp = agent.get(&edge.url("/")).call().unwrap();
    let set_cookie = resp.headers()["set-cookie"].to_str().unwrap().to_owned();
    let value = set_cookie
        .split(';')
        .next()
        .unwrap()
        .split_once('=')
        .unwrap()
        .1
        .to_owned();
    let mut flipped = value.clone().into_bytes();
    let mid = flipped.len() / 2;
    flipped[mid] = if flipped[mid] == b'A' { b'B' } else { b'A' };
    let cases = [
        String::from_utf8(flipped).unwrap(),
        value[..value.len() / 2].to_owned(),
        "%%%not-base64%%%".to_owned(),
        "A".repeat(5000),
    ];
    for bad in &cases {
        // A fresh agent each time: its cookie jar must not replace the header we send.
        let mut resp = client()
            .get(&edge.url("/"))
            .header("Cookie", &format!("__wr_shop={bad}"))
            .call()
            .unwrap();
        assert_eq!(
            resp.status().as_u16(),
            200,
            "bad cookie {bad:.20}… must not fail"
        );
        assert!(
            resp.headers().contains_key("set-cookie"),
            "a new ticket is issued"
        );
        assert!(resp.body_mut().read_to_string().unwrap().contains(SITE));
    }
    let m = metrics(&edge);
    let failures = |reason: &str| {
        metric(
            &m,
            &format!("waitroom_cookie_failures_total{{room=\"shop\",reason=\"{reason}\"}}"),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(failures("tampered") + failures("malformed"), 3.0, "{m}");
    assert_eq!(failures("too_large"), 1.0);
}

#[test]
fn an_unreachable_origin_answers_a_clear_502_quickly() {
    let dir = TempDir::new("origin-down");
    let dead: SocketAddr = format!("127.0.0.1:{}", free_port().unwrap())
        .parse()
        .unwrap();
    let edge = Edge::start(
        dir.path(),
        "edge",
        &config(
            &dir,
            dead,
            "total_active_users = 10\nnew_users_per_minute = 10",
        ),
    )
    .unwrap();
    let started = Instant::now();
    let (status, body) = get(&client(), &edge.url("/"));
    assert_eq!(status, 502);
    assert!(body.contains("not answering"), "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    let m = metrics(&edge);
    assert_eq!(
        metric(&m, "waitroom_proxy_errors_total{room=\"shop\"}"),
        Some(1.0)
    );
}

#[test]
fn a_slow_headers_client_is_cut_off_and_others_are_served() {
    let (_dir, _origin, edge) = node(
        "slowloris",
        "total_active_users = 100\nnew_users_per_minute = 100",
    );
    let mut slow: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut s = TcpStream::connect(edge.http).unwrap();
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .unwrap();
            s
        })
        .collect();
    // Others are served while the slow ones hang.
    let (status, body) = get(&client(), &edge.url("/"));
    assert_eq!(status, 200);
    assert!(body.contains(SITE));
    std::thread::sleep(Duration::from_millis(1500));
    for s in &mut slow {
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut buf = Vec::new();
        // The node closes the connection (possibly after a 408): read reaches EOF.
        let n = s.read_to_end(&mut buf);
        assert!(n.is_ok(), "connection was not closed by the node: {n:?}");
        let text = String::from_utf8_lossy(&buf);
        assert!(
            text.is_empty() || text.starts_with("HTTP/1.1 408"),
            "{text}"
        );
    }
    let (status, _) = get(&client(), &edge.url("/"));
    assert_eq!(status, 200);
}

#[test]
fn counters_and_cookies_survive_a_restart() {
    let dir = TempDir::new("restart");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let cfg = config(
        &dir,
        origin,
        "total_active_users = 2\nnew_users_per_minute = 2\nsession_duration = 10",
    );
    early_in_a_minute(25);
    let mut edge = Edge::start(dir.path(), "edge", &cfg).unwrap();
    let a = client();
    let b = client();
    assert!(get(&a, &edge.url("/")).1.contains(SITE));
    assert!(get(&b, &edge.url("/")).1.contains(SITE));
    // A crash, not a clean stop: nothing gets a chance to save anything.
    edge.proc.kill();
    // The operator's view while the node is down: straight from shared memory.
    let out = Command::new(binary("waitroom-edge"))
        .arg("stats")
        .arg("--config")
        .arg(&edge.config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let shop: Vec<&str> = text
        .lines()
        .find(|l| l.starts_with("shop "))
        .unwrap_or_else(|| {
            panic!(
                "no shop row in stats:\n{text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .split_whitespace()
        .collect();
    assert_eq!(
        &shop[1..5],
        ["2", "2", "2", "2"],
        "active, limit, admitted, per-minute:\n{text}"
    );
    let edge = Edge::start(dir.path(), "edge-restarted", &cfg).unwrap();
    let status: serde_json::Value =
        serde_json::from_str(&get(&client(), &edge.admin_url("/status")).1).unwrap();
    let room = &status["rooms"][0];
    assert_eq!(room["node_active_users"], 2, "{room}");
    assert_eq!(room["node_admitted_this_minute"], 2, "{room}");
    // The room is still full: a third visitor waits...
    assert!(get(&client(), &edge.url("/")).1.contains(QUEUE));
    // ...while the admitted visitors' cookies still open after the restart.
    assert!(get(&a, &edge.url("/")).1.contains(SITE));
    assert!(get(&b, &edge.url("/")).1.contains(SITE));
}

#[test]
fn check_names_the_file_and_the_field() {
    let dir = TempDir::new("check");
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[node]\nid = \"n\"\nlisten = \"127.0.0.1:0\"\n\n[[rooms]]\nid = \"shop\"\norigin = \"127.0.0.1:9\"\ntotal_active_users = 100\nnew_users_per_minute = 500\n",
    )
    .unwrap();
    let out = Command::new(binary("waitroom-edge"))
        .arg("--check")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml"), "{err}");
    assert!(err.contains("new_users_per_minute"), "{err}");
    std::fs::write(
        &path,
        config(
            &dir,
            "127.0.0.1:9".parse().unwrap(),
            "total_active_users = 100\nnew_users_per_minute = 50",
        ),
    )
    .unwrap();
    let out = Command::new(binary("waitroom-edge"))
        .args(["--check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn sigterm_drains_in_flight_requests() {
    let (_dir, _origin, mut edge) = node(
        "drain",
        "total_active_users = 100\nnew_users_per_minute = 100",
    );
    let url = edge.url("/slow?ms=1500");
    let inflight = std::thread::spawn(move || get(&client(), &url));
    std::thread::sleep(Duration::from_millis(300));
    let status = edge
        .proc
        .terminate(Duration::from_secs(10))
        .expect("exit status");
    let (code, body) = inflight.join().unwrap();
    assert_eq!(code, 200, "in-flight request was cut: {body}");
    assert!(body.contains("slept 1500 ms"));
    assert!(status.success(), "{status:?}");
}

#[test]
fn sighup_applies_new_limits_and_refuses_a_bad_config() {
    let dir = TempDir::new("reload");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let room = |total: u32, per_minute: u32| {
        config(
            &dir,
            origin,
            &format!("total_active_users = {total}\nnew_users_per_minute = {per_minute}\nsession_duration = 10\nrefresh_interval = 5"),
        )
        // An idle keep-alive connection must outlive the test's pauses.
        .replace("header_read_timeout_ms = 500", "header_read_timeout_ms = 60000")
    };
    early_in_a_minute(30);
    let edge = Edge::start(dir.path(), "edge", &room(1, 1)).unwrap();
    let first = client();
    let second = client();
    assert!(get(&first, &edge.url("/")).1.contains(SITE));
    assert!(get(&second, &edge.url("/")).1.contains(QUEUE));
    // A keep-alive connection opened before the reload must survive it.
    let mut kept = TcpStream::connect(edge.http).unwrap();
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    let read_answer = |s: &mut TcpStream| {
        let mut buf = [0u8; 4096];
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = s.read(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    kept.write_all(request).unwrap();
    assert!(read_answer(&mut kept).starts_with("HTTP/1.1 200"));

    let pid = edge.proc.pid().unwrap() as libc::pid_t;
    let hup = || {
        // SAFETY: kill(2) on our own child process.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    };
    let limit_in_status = || -> serde_json::Value {
        let v: serde_json::Value =
            serde_json::from_str(&get(&client(), &edge.admin_url("/status")).1).unwrap();
        v["rooms"][0]["total_active_users"].clone()
    };
    let wait_stderr = |needle: &str| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if edge.proc.stderr().contains(needle) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("no {needle:?} in the node's log:\n{}", edge.proc.stderr());
    };

    // A valid new config: more room. The waiting visitor gets in on its next check-in.
    std::fs::write(&edge.config, room(5, 5)).unwrap();
    hup();
    wait_stderr("configuration reloaded");
    assert_eq!(limit_in_status(), 5);
    std::thread::sleep(Duration::from_secs(7));
    assert!(
        get(&second, &edge.url("/")).1.contains(SITE),
        "new limits apply"
    );
    assert!(
        get(&first, &edge.url("/")).1.contains(SITE),
        "sessions survive a reload"
    );

    // An invalid one: refused, naming the field; the old limits stay.
    std::fs::write(&edge.config, room(5, 50)).unwrap();
    hup();
    wait_stderr("reload refused");
    let log = edge.proc.stderr();
    assert!(log.contains("new_users_per_minute"), "{log}");
    assert_eq!(limit_in_status(), 5);
    // Counters were never reset, and the old connection still works.
    let status: serde_json::Value =
        serde_json::from_str(&get(&client(), &edge.admin_url("/status")).1).unwrap();
    assert_eq!(status["rooms"][0]["node_active_users"], 2);
    kept.write_all(request).unwrap();
    assert!(read_answer(&mut kept).starts_with("HTTP/1.1 200"));
}

#[test]
fn tls_listener_speaks_http2_and_http1_with_its_certificate() {
    let dir = TempDir::new("tls");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let certs = dir.path().join("certs");
    waitroom_runtime::devcerts::write(&certs, &[]).unwrap();
    let text = config(
        &dir,
        origin,
        "total_active_users = 10\nnew_users_per_minute = 10",
    )
    .replace(
        "[[rooms]]",
        &format!(
            "[node.tls]\nlisten = \"127.0.0.1:0\"\ncert = \"{}\"\nkey = \"{}\"\n\n[[rooms]]",
            certs.join("aggregator.pem").display(),
            certs.join("aggregator.key").display()
        ),
    );
    let edge = Edge::start(dir.path(), "edge", &text).unwrap();
    let https = edge.https.expect("the node printed its https address");
    for (flag, version) in [("--http2", "HTTP/2"), ("--http1.1", "HTTP/1.1")] {
        let out = Command::new("curl")
            .args(["-sS", "-i", flag, "--cacert"])
            .arg(certs.join("ca.pem"))
            .arg("--resolve")
            .arg(format!("localhost:{}:127.0.0.1", https.port()))
            .arg(format!("https://localhost:{}/", https.port()))
            .output()
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.starts_with(&format!("{version} 200")),
            "{flag}: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains("SameSite=None; Secure"),
            "auto cookie attributes over HTTPS: {text}"
        );
        assert!(text.contains(SITE));
    }
}

#[test]
fn without_xdp_the_node_serves_on_and_says_so_once() {
    let dir = TempDir::new("no-xdp");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let text = format!(
        "{}\n[xdp]\ninterface = \"wr-missing0\"\nports = [80]\n",
        config(
            &dir,
            origin,
            "total_active_users = 10\nnew_users_per_minute = 10"
        )
    );
    let edge = Edge::start(dir.path(), "edge", &text).unwrap();
    assert!(get(&client(), &edge.url("/")).1.contains(SITE));
    let m = metrics(&edge);
    assert_eq!(metric(&m, "waitroom_xdp_attached"), Some(0.0));
    let log = edge.proc.stderr();
    assert_eq!(log.matches("XDP program not attached").count(), 1, "{log}");
    let (status, _) = get(&client(), &edge.admin_url("/deny"));
    assert_eq!(status, 503);
}

#[test]
fn oversized_request_heads_are_refused_and_the_node_serves_on() {
    let dir = TempDir::new("big-heads");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let text = config(
        &dir,
        origin,
        "total_active_users = 100\nnew_users_per_minute = 100",
    )
    .replace(
        "[[rooms]]",
        "max_headers = 32\nmax_header_bytes = 8192\n\n[[rooms]]",
    );
    let edge = Edge::start(dir.path(), "edge", &text).unwrap();
    let send = |head: String| {
        let mut s = TcpStream::connect(edge.http).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(head.as_bytes()).unwrap();
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    };
    let many: String = (0..100).map(|i| format!("X-H{i}: v\r\n")).collect();
    let answer = send(format!("GET / HTTP/1.1\r\nHost: x\r\n{many}\r\n"));
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "too many headers: {answer:.80}"
    );
    let huge = "a".repeat(20_000);
    let answer = send(format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {huge}\r\n\r\n"
    ));
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "too large a head: {answer:.80}"
    );
    let ok = send("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".into());
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok:.80}");
}

/// Sends SIGHUP to the node and waits for its log to say `needle`.
fn reload_and_wait(edge: &Edge, needle: &str, nth: usize) {
    let pid = edge.proc.pid().unwrap() as libc::pid_t;
    // SAFETY: kill(2) on our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if edge.proc.stderr().matches(needle).count() >= nth {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no {needle:?} in the node's log:\n{}", edge.proc.stderr());
}

#[test]
fn sighup_refuses_what_needs_a_restart_naming_each_field() {
    let dir = TempDir::new("reload-restart");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let good = config(
        &dir,
        origin,
        "total_active_users = 10\nnew_users_per_minute = 10",
    );
    let edge = Edge::start(dir.path(), "edge", &good).unwrap();
    assert_eq!(
        metric(&metrics(&edge), "waitroom_config_reload_success"),
        Some(1.0)
    );

    // A tired operator changes the worker count and a room's limit in one
    // edit: the worker count needs a restart, so nothing is applied.
    let both = good
        .replace("workers = 2", "workers = 3")
        .replace("total_active_users = 10", "total_active_users = 99");
    std::fs::write(&edge.config, both).unwrap();
    reload_and_wait(&edge, "reload refused", 1);
    let log = edge.proc.stderr();
    assert!(
        log.contains("restart needed: node.workers changed"),
        "{log}"
    );
    let m = metrics(&edge);
    assert_eq!(metric(&m, "waitroom_config_reload_success"), Some(0.0));
    assert_eq!(
        metric(&m, "waitroom_config_reloads_total{result=\"refused\"}"),
        Some(1.0)
    );
    let status: serde_json::Value =
        serde_json::from_str(&get(&client(), &edge.admin_url("/status")).1).unwrap();
    assert_eq!(
        status["rooms"][0]["total_active_users"], 10,
        "the limit in the refused file was not applied either"
    );

    // The same file without the restart-only change is applied.
    let before = metric(&m, "waitroom_config_last_reload_success_timestamp_seconds").unwrap();
    std::fs::write(
        &edge.config,
        good.replace("total_active_users = 10", "total_active_users = 99"),
    )
    .unwrap();
    reload_and_wait(&edge, "configuration reloaded", 1);
    let m = metrics(&edge);
    assert_eq!(metric(&m, "waitroom_config_reload_success"), Some(1.0));
    assert!(metric(&m, "waitroom_config_last_reload_success_timestamp_seconds").unwrap() >= before);
    let status: serde_json::Value =
        serde_json::from_str(&get(&client(), &edge.admin_url("/status")).1).unwrap();
    assert_eq!(status["rooms"][0]["total_active_users"], 99);

    // [xdp] and [aggregator] are named too.
    std::fs::write(
        &edge.config,
        good.replace(
            "[[rooms]]",
            "[xdp]\ninterface = \"wr-nonexistent0\"\nports = [80]\n\n[[rooms]]",
        ),
    )
    .unwrap();
    reload_and_wait(&edge, "reload refused", 2);
    assert!(edge.proc.stderr().contains("restart needed: xdp changed"));
}

#[test]
fn sighup_reloads_the_tls_certificate() {
    let dir = TempDir::new("tls-reload");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let old = dir.path().join("old");
    let new = dir.path().join("new");
    waitroom_runtime::devcerts::write(&old, &[]).unwrap();
    waitroom_runtime::devcerts::write(&new, &[]).unwrap();
    let live = dir.path().join("live");
    std::fs::create_dir_all(&live).unwrap();
    let install = |from: &std::path::Path| {
        for f in ["aggregator.pem", "aggregator.key"] {
            std::fs::copy(from.join(f), live.join(f)).unwrap();
        }
    };
    install(&old);
    let text = config(
        &dir,
        origin,
        "total_active_users = 10\nnew_users_per_minute = 10",
    )
    .replace(
        "[[rooms]]",
        &format!(
            "[node.tls]\nlisten = \"127.0.0.1:0\"\ncert = \"{}\"\nkey = \"{}\"\n\n[[rooms]]",
            live.join("aggregator.pem").display(),
            live.join("aggregator.key").display()
        ),
    );
    let edge = Edge::start(dir.path(), "edge", &text).unwrap();
    let https = edge.https.expect("the node printed its https address");
    let trusts = |ca: &std::path::Path| {
        Command::new("curl")
            .args(["-sS", "-o", "/dev/null", "--cacert"])
            .arg(ca.join("ca.pem"))
            .arg("--resolve")
            .arg(format!("localhost:{}:127.0.0.1", https.port()))
            .arg(format!("https://localhost:{}/", https.port()))
            .status()
            .expect("curl")
            .success()
    };
    assert!(trusts(&old) && !trusts(&new));

    // A key that does not belong to the certificate is refused; the old pair stays.
    std::fs::copy(new.join("aggregator.key"), live.join("aggregator.key")).unwrap();
    reload_and_wait(&edge, "reload refused", 1);
    assert!(trusts(&old), "the old certificate is still served");

    install(&new);
    reload_and_wait(&edge, "configuration reloaded", 1);
    assert!(
        trusts(&new) && !trusts(&old),
        "the new certificate is served"
    );
}

/// Sends one raw HTTP/1.1 request and returns the status line and body.
fn raw_request(addr: SocketAddr, target: &str, host: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let status = text.lines().next().unwrap_or_default().to_owned();
    (status, text)
}

/// A room on `/drop` behind a catch-all room that lets everyone through to
/// the origin: any spelling of `/drop` that escaped its room would reach the
/// origin. None does: each is queued by the `/drop` room or refused with 400.
#[test]
fn every_spelling_of_a_rooms_path_meets_the_room() {
    let dir = TempDir::new("spellings");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let text = config(
        &dir,
        origin,
        "total_active_users = 1000\nnew_users_per_minute = 1000\nqueueing_method = \"passthrough\"",
    )
    .replace("id = \"shop\"", "id = \"site\"")
        + &format!(
            r#"
[[rooms]]
id = "drop"
host = "shop.example"
path = "/drop"
origin = "{origin}"
total_active_users = 10
new_users_per_minute = 10
queue_all = true
"#
        );
    let edge = Edge::start(dir.path(), "edge", &text).unwrap();
    // The catch-all room does reach the origin: the test can see an escape.
    let (status, body) = raw_request(edge.http, "/elsewhere", "shop.example");
    assert!(status.contains("200") && body.contains(SITE), "{status}");

    let queued = [
        ("/drop", "shop.example"),
        ("/DROP", "shop.example"),
        ("/Drop", "shop.example"),
        ("/%64rop", "shop.example"),
        ("/%64%72%6f%70", "shop.example"),
        ("/%44ROP", "shop.example"),
        ("/./drop", "shop.example"),
        ("/./././drop", "shop.example"),
        ("/x/../drop", "shop.example"),
        ("/a/b/../../drop", "shop.example"),
        ("/../drop", "shop.example"),
        ("//drop", "shop.example"),
        ("///drop", "shop.example"),
        ("/drop;x", "shop.example"),
        ("/drop;jsessionid=1/item", "shop.example"),
        ("/%2e/drop", "shop.example"),
        ("/%2E%2E/drop", "shop.example"),
        ("/x/%2e%2e/drop", "shop.example"),
        ("/drop/", "shop.example"),
        ("/drop/item", "shop.example"),
        ("/drop//item", "shop.example"),
        ("/DROP/%69tem?x=1", "shop.example"),
        ("/drop", "shop.example."),
        ("/drop", "SHOP.EXAMPLE"),
        ("/drop", "shop.example:80"),
        ("/drop", "Shop.Example.:8080"),
        ("http://shop.example/drop", "other.example"),
        ("http://SHOP.example./DROP", "other.example"),
    ];
    for (target, host) in queued {
        let (status, body) = raw_request(edge.http, target, host);
        assert!(
            body.contains(QUEUE) && !body.contains(SITE),
            "{target} (Host: {host}) escaped the room: {status}"
        );
    }
    let refused = [
        "/drop%2fx",
        "/%2fdrop",
        "/x/..%2fdrop",
        "/x%5c..%5cdrop",
        "/x/..;/drop",
        "/drop%00",
        "/dr%6",
    ];
    for target in refused {
        let (status, body) = raw_request(edge.http, target, "shop.example");
        assert!(
            status.contains(" 400 ") && !body.contains(SITE),
            "{target}: {status}"
        );
    }
    let m = metrics(&edge);
    assert_eq!(
        metric(
            &m,
            "waitroom_requests_refused_total{reason=\"encoded_separator\"}"
        ),
        Some(4.0)
    );
    assert!(
        metric(
            &m,
            "waitroom_requests_refused_total{reason=\"dot_segment_parameters\"}"
        ) == Some(1.0)
    );
}

/// The origin receives the target that was routed, not the client's spelling.
#[test]
fn the_origin_receives_the_normalized_target() {
    let (_dir, _origin, edge) = node(
        "normalized",
        "total_active_users = 1000\nnew_users_per_minute = 1000\nqueueing_method = \"passthrough\"",
    );
    let (status, body) = raw_request(edge.http, "/x/..//%65cho?q=1", "Shop.Example.");
    assert!(status.contains("200"), "{status}\n{body}");
    assert!(body.contains("GET /echo?q=1\n"), "{body}");
    let lower = body.to_ascii_lowercase();
    assert!(lower.contains("host: shop.example"), "{body}");
    assert!(!lower.contains("host: shop.example."), "{body}");
}
