//! What the node writes for operators (issue 18, items 4 and 5), with the
//! real binary: the access log (off by default; one well-formed line per
//! request, whatever the client sends; a path it cannot open stops the
//! start with the field named), and logs fit for journald (no colour codes
//! when stderr is not a terminal, JSON lines on request, a flood of one
//! warning kept to a few lines).
use std::{
    collections::BTreeSet,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use waitroom_tests::{
    edge::{Edge, client, get, metric},
    procs::{TempDir, binary, free_port, start_origin},
};

/// Rooms on `shop.example`: `/` admits (origin up), `/line` queues
/// everyone, `/closed` rejects, `/dead` admits to an origin that refuses
/// connections. `node` adds keys to `[node]` (and tables after it).
fn config(dir: &Path, origin: SocketAddr, dead: SocketAddr, node: &str) -> String {
    let room = |id: &str, path: &str, origin: SocketAddr, extra: &str| {
        format!(
            "[[rooms]]\nid = \"{id}\"\nhost = \"shop.example\"\npath = \"{path}\"\norigin = \"{origin}\"\n\
             total_active_users = 100000\nnew_users_per_minute = 100000\n{extra}\n"
        )
    };
    format!(
        "[node]\nid = \"logs\"\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nworkers = 2\n\
         state_dir = \"{state}\"\nnew_tickets_per_address_per_minute = 0\n{node}\n\n{}{}{}{}",
        room("shop", "/", origin, ""),
        room("line", "/line", origin, "queue_all = true"),
        room("closed", "/closed", origin, "queueing_method = \"reject\""),
        room("dead", "/dead", dead, ""),
        state = dir.join("state").display()
    )
}

fn access_log(path: &Path, format: &str) -> String {
    format!(
        "\n[node.access_log]\nenabled = true\npath = \"{}\"\nformat = \"{format}\"\n",
        path.display()
    )
}

/// A loopback address nothing listens on.
fn dead_origin() -> SocketAddr {
    format!("127.0.0.1:{}", free_port().unwrap())
        .parse()
        .unwrap()
}

/// One request on its own connection (`Connection: close`); the status the
/// node answered, or 0 when it closed without one.
fn request(addr: SocketAddr, host: &str, target: &[u8], extra_headers: &[u8]) -> u16 {
    exchange(addr, host, target, extra_headers).0
}

/// [`request`], and whether the answer came from the request path (hyper
/// answers a head it cannot parse itself, with an empty 400).
fn exchange(addr: SocketAddr, host: &str, target: &[u8], extra_headers: &[u8]) -> (u16, bool) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut head = b"GET ".to_vec();
    head.extend_from_slice(target);
    head.extend_from_slice(
        format!(" HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n").as_bytes(),
    );
    head.extend_from_slice(extra_headers);
    head.extend_from_slice(b"\r\n");
    s.write_all(&head).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let empty = text.contains("content-length: 0\r\n") || text.ends_with("\r\n\r\n");
    (status, !(status == 400 && empty))
}

/// Waits (at most 10 s) until `path` holds `n` lines; returns them.
fn lines(path: &Path, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        if lines.len() >= n || Instant::now() > deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The keys of a JSON line, exactly as docs/OPERATIONS.md lists them.
const KEYS: [&str; 17] = [
    "time",
    "client",
    "method",
    "host",
    "path",
    "protocol",
    "status",
    "decision",
    "visitor",
    "room",
    "bucket",
    "upstream_status",
    "upstream_ms",
    "total_ms",
    "bytes",
    "referer",
    "user_agent",
];

fn parse(line: &str) -> serde_json::Map<String, serde_json::Value> {
    let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    let serde_json::Value::Object(map) = v else {
        panic!("not an object: {line}")
    };
    let keys: BTreeSet<&str> = map.keys().map(String::as_str).collect();
    assert_eq!(keys, KEYS.into_iter().collect(), "{line}");
    map
}

#[test]
fn every_request_is_one_json_line_with_its_decision_room_and_status() {
    let dir = TempDir::new("access-json");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let log = dir.path().join("access.log");
    let edge = Edge::start(
        dir.path(),
        "edge",
        &config(dir.path(), origin, dead_origin(), &access_log(&log, "json")),
    )
    .unwrap();

    let mut expected = Vec::new();
    for i in 0..10 {
        let target = format!("/item?i={i}");
        assert_eq!(
            request(edge.http, "shop.example", target.as_bytes(), b""),
            200
        );
        expected.push((target, 200, "admitted", Some("shop")));
    }
    for (target, status, decision, room) in [
        ("/line/a", 200, "queued", Some("line")),
        ("/line/b", 200, "queued", Some("line")),
        ("/closed", 403, "rejected", Some("closed")),
        ("/dead/x", 502, "admitted", Some("dead")),
    ] {
        assert_eq!(
            request(edge.http, "shop.example", target.as_bytes(), b""),
            status,
            "{target}"
        );
        expected.push((target.to_owned(), status, decision, room));
    }
    assert_eq!(request(edge.http, "other.example", b"/", b""), 404);
    expected.push(("/".into(), 404, "not_a_room", None));

    let lines = lines(&log, expected.len());
    assert_eq!(lines.len(), expected.len(), "{lines:#?}");
    // Two workers write in batches: match lines to requests by path.
    for (target, status, decision, room) in &expected {
        let line = lines
            .iter()
            .map(|l| parse(l))
            .find(|l| l["path"] == target.as_str())
            .unwrap_or_else(|| panic!("no line for {target}: {lines:#?}"));
        assert_eq!(line["status"], *status, "{line:?}");
        assert_eq!(line["decision"], *decision, "{line:?}");
        assert_eq!(line["room"].as_str(), *room, "{line:?}");
        assert_eq!(line["client"], "127.0.0.1");
        assert_eq!(line["method"], "GET");
        assert_eq!(line["protocol"], "HTTP/1.1");
        assert!(line["total_ms"].as_f64().is_some(), "{line:?}");
        match *decision {
            "admitted" | "queued" | "rejected" => {
                assert_eq!(line["visitor"], "new", "{line:?}");
                assert!(line["bucket"].as_u64().is_some(), "{line:?}");
            }
            _ => assert!(line["visitor"].is_null() && line["bucket"].is_null()),
        }
        // The origin answered only the admitted requests to a live origin.
        if *decision == "admitted" && *status == 200 {
            assert_eq!(line["upstream_status"], 200, "{line:?}");
            assert!(line["upstream_ms"].as_f64().is_some(), "{line:?}");
        } else {
            assert!(line["upstream_status"].is_null(), "{line:?}");
        }
    }
    let metrics = get(&client(), &edge.admin_url("/metrics")).1;
    assert_eq!(
        metric(&metrics, "waitroom_access_log_dropped_total"),
        Some(0.0)
    );
}

#[test]
fn with_the_log_off_nothing_is_written() {
    let dir = TempDir::new("access-off");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let log = dir.path().join("access.log");
    let node = access_log(&log, "json").replace("enabled = true", "enabled = false");
    let mut edge = Edge::start(
        dir.path(),
        "edge",
        &config(dir.path(), origin, dead_origin(), &node),
    )
    .unwrap();
    for _ in 0..5 {
        assert_eq!(request(edge.http, "shop.example", b"/", b""), 200);
    }
    assert!(edge.proc.terminate(Duration::from_secs(10)).is_some());
    assert!(!log.exists(), "the file was created");
    assert!(
        !edge.proc.stderr().contains("\"decision\""),
        "{}",
        edge.proc.stderr()
    );
}

#[test]
fn a_hostile_request_cannot_break_a_line_or_forge_another() {
    let dir = TempDir::new("access-hostile");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let log = dir.path().join("access.log");
    let edge = Edge::start(
        dir.path(),
        "edge",
        &config(dir.path(), origin, dead_origin(), &access_log(&log, "json")),
    )
    .unwrap();
    let forged = b"\", \"decision\": \"admitted_forged\", \"x\": \"";
    let mut agent = b"User-Agent: ".to_vec();
    agent.extend_from_slice(b"evil\" \\ \xff\xfe\xc3\x28 obs-text");
    agent.extend_from_slice(b"\r\nReferer: ");
    agent.extend_from_slice(forged);
    agent.extend_from_slice(b"\r\n");
    let long = format!("/long/{}", "a".repeat(10_240));
    let targets: Vec<Vec<u8>> = vec![
        b"/q/%22%0A%0D?x=%22}".to_vec(),
        long.into_bytes(),
        b"/bytes/\xff\xfe\"quote".to_vec(),
    ];
    let mut answered = 0;
    for target in &targets {
        // A target the node refuses (400) is still one line; one hyper
        // refuses before the request path (a raw byte it does not take in a
        // target) is none.
        let (status, by_node) = exchange(edge.http, "shop.example", target, &agent);
        assert_ne!(status, 0, "{}", String::from_utf8_lossy(target));
        answered += usize::from(by_node);
    }
    assert!(answered >= 2);
    let lines = lines(&log, answered);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.is_ascii(), "{text}");
    assert_eq!(lines.len(), answered, "{lines:#?}");
    for line in &lines {
        let l = parse(line);
        assert_ne!(l["decision"], "admitted_forged");
        assert_eq!(l["user_agent"], "evil\" \\ \u{ff}\u{fe}\u{c3}( obs-text");
        assert!(
            l["referer"]
                .as_str()
                .unwrap()
                .starts_with("\", \"decision\"")
        );
        let path = l["path"].as_str().unwrap();
        assert!(path.len() <= 2_048 + 3, "{}", path.len());
        if path.starts_with("/long/") {
            assert!(path.ends_with("aaa..."), "{path}");
        }
    }
    assert!(
        lines.iter().any(|l| l.contains("\"path\":\"/long/")),
        "the 10 KB URL has its line: {lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("\"path\":\"/q/%22%0A%0D?x=%22}\"")),
        "{lines:#?}"
    );
}

#[test]
fn the_combined_format_is_nginx_combined_with_waitrooms_fields() {
    let dir = TempDir::new("access-combined");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let log = dir.path().join("access.log");
    let edge = Edge::start(
        dir.path(),
        "edge",
        &config(
            dir.path(),
            origin,
            dead_origin(),
            &access_log(&log, "combined"),
        ),
    )
    .unwrap();
    for i in 0..5 {
        let ua = format!("User-Agent: t\"{i}\r\n");
        assert_eq!(
            request(edge.http, "shop.example", b"/c", ua.as_bytes()),
            200
        );
    }
    let lines = lines(&log, 5);
    assert_eq!(lines.len(), 5, "{lines:#?}");
    for line in &lines {
        assert!(line.starts_with("127.0.0.1 - - ["), "{line}");
        assert!(line.contains(" +0000] \"GET /c HTTP/1.1\" 200 "), "{line}");
        assert!(line.contains(" \"-\" \"t\\\""), "{line}");
        assert!(
            line.contains(
                " host=\"shop.example\" decision=admitted visitor=new room=\"shop\" bucket="
            ),
            "{line}"
        );
        assert!(line.contains(" upstream_status=200 upstream_ms="), "{line}");
        assert!(line.contains(" total_ms="), "{line}");
    }

    // logrotate: move the file away, SIGHUP; new lines go to a new file.
    let rotated = dir.path().join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(edge.proc.pid().unwrap() as libc::pid_t, libc::SIGHUP) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    for _ in 0..2 {
        assert_eq!(request(edge.http, "shop.example", b"/c", b""), 200);
    }
    assert_eq!(self::lines(&log, 2).len(), 2);
    assert_eq!(
        std::fs::read_to_string(&rotated).unwrap().lines().count(),
        5
    );
}

/// Runs `waitroom-edge` with `args` to its end; its exit code and stderr.
fn run_edge(args: &[&std::ffi::OsStr], dir: &Path) -> (Option<i32>, String) {
    let out = Command::new(binary("waitroom-edge"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_log_path_that_cannot_be_opened_stops_the_start_naming_the_field() {
    let dir = TempDir::new("access-unopenable");
    let bad = dir.path().join("no-such-dir").join("access.log");
    let path = dir.path().join("edge.toml");
    std::fs::write(
        &path,
        config(
            dir.path(),
            dead_origin(),
            dead_origin(),
            &access_log(&bad, "json"),
        ),
    )
    .unwrap();
    let want = format!("node.access_log.path: cannot open {}", bad.display());
    let (code, stderr) = run_edge(
        &["--check".as_ref(), "--config".as_ref(), path.as_os_str()],
        dir.path(),
    );
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains(&want), "{stderr}");
    let (code, stderr) = run_edge(&["--config".as_ref(), path.as_os_str()], dir.path());
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains(&want), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Starts a node with stderr on a pipe (as under systemd, not a terminal);
/// returns the node, its admin port and a reader thread collecting stderr.
fn edge_on_a_pipe(
    dir: &Path,
    config: &str,
    env: &[(&str, &str)],
) -> (
    std::process::Child,
    SocketAddr,
    std::thread::JoinHandle<Vec<u8>>,
) {
    let path = dir.join("edge.toml");
    std::fs::write(&path, config).unwrap();
    let mut cmd = Command::new(binary("waitroom-edge"));
    cmd.arg("--config")
        .arg(&path)
        .env("RUST_LOG", "debug")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = stderr.read_to_end(&mut all);
        all
    });
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut ready = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut ready).unwrap();
    assert!(ready.starts_with("waitroom-edge ready:"), "{ready}");
    let http = ready
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http="))
        .unwrap()
        .parse()
        .unwrap();
    (child, http, reader)
}

/// SIGTERM, then the node's whole stderr.
fn stop(mut child: std::process::Child, reader: std::thread::JoinHandle<Vec<u8>>) -> Vec<u8> {
    // SAFETY: kill(2) on our own unreaped child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(15);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    reader.join().unwrap()
}

#[test]
fn stderr_on_a_pipe_has_no_colour_codes() {
    let dir = TempDir::new("logs-plain");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let (child, http, reader) = edge_on_a_pipe(
        dir.path(),
        &config(dir.path(), origin, dead_origin(), ""),
        &[],
    );
    assert_eq!(request(http, "shop.example", b"/", b""), 200);
    let stderr = stop(child, reader);
    let text = String::from_utf8_lossy(&stderr);
    assert!(text.contains("node serving"), "{text}");
    assert!(!stderr.contains(&0x1b), "escape bytes on a pipe:\n{text}");
}

#[test]
fn json_logs_are_one_object_per_line_and_a_flood_of_one_warning_is_a_few_lines() {
    let dir = TempDir::new("logs-json");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let (child, http, reader) = edge_on_a_pipe(
        dir.path(),
        &config(dir.path(), origin, dead_origin(), ""),
        &[("WAITROOM_LOG_FORMAT", "json"), ("RUST_LOG", "info")],
    );
    // 1,000 requests to a room whose origin refuses every connection: one
    // "origin request failed" warning each, at most one a ten seconds.
    for _ in 0..1_000 {
        assert_eq!(request(http, "shop.example", b"/dead/", b""), 502);
    }
    let stderr = stop(child, reader);
    let text = String::from_utf8(stderr).expect("JSON lines are UTF-8");
    let mut failed = Vec::new();
    let mut count = 0;
    for line in text.lines().filter(|l| !l.is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        assert!(
            v["timestamp"].is_string() && v["level"].is_string(),
            "{line}"
        );
        if v["message"] == "origin request failed" {
            assert!(v["suppressed"].is_u64(), "{line}");
            failed.push(v);
        }
        count += 1;
    }
    assert!(count > 3, "{text}");
    // The requests take well under the period: one line, two if a period
    // boundary fell inside them.
    assert!(
        (1..=2).contains(&failed.len()),
        "{} lines for 1000 failures:\n{text}",
        failed.len()
    );
}
