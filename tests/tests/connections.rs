//! Hostile and broken connections against the real node binary on loopback:
//! deadlines like nginx's, limits that keep visitors served, and body errors
//! blamed on whoever caused them.
use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use socket2::{Domain, Socket, Type};
use waitroom_tests::{
    edge::{Edge, SITE, client, get, metric},
    procs::{self, Proc, TempDir, start_origin},
};

/// A node in front of `origin` with `node_keys` added to `[node]` and
/// `room_keys` to its one room (which admits everyone).
fn config(dir: &TempDir, origin: SocketAddr, node_keys: &str, room_keys: &str) -> String {
    format!(
        r#"[node]
id = "conn-node"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
workers = 2
counters_path = "{counters}"
shutdown_grace_ms = 2000
{node_keys}

[[rooms]]
id = "shop"
host = "*"
path = "/"
origin = "{origin}"
origin_timeout_ms = 3000
total_active_users = 1000000
new_users_per_minute = 1000000
{room_keys}
"#,
        counters = dir.path().join("counters.shm").display()
    )
}

fn node(tag: &str, node_keys: &str, room_keys: &str) -> (TempDir, Proc, Edge) {
    let dir = TempDir::new(tag);
    let (origin_proc, origin) = start_origin(dir.path(), "origin").unwrap();
    let edge = Edge::start(
        dir.path(),
        "edge",
        &config(&dir, origin, node_keys, room_keys),
    )
    .unwrap();
    (dir, origin_proc, edge)
}

fn metrics(edge: &Edge) -> String {
    get(&client(), &edge.admin_url("/metrics")).1
}

fn closed(m: &str, reason: &str) -> f64 {
    metric(
        m,
        &format!("waitroom_connections_closed_total{{reason=\"{reason}\"}}"),
    )
    .unwrap_or_else(|| panic!("no close counter for {reason}:\n{m}"))
}

/// The node's metrics once `n` connections were closed for `reason`, or
/// after 3 s: a client sees a close a moment before the node's connection
/// task counts it, so a test waits for the count (bounded) and never races it.
fn metrics_once_closed(edge: &Edge, reason: &str, n: f64) -> String {
    let until = Instant::now() + Duration::from_secs(3);
    let mut m = metrics(edge);
    while closed(&m, reason) < n && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
        m = metrics(edge);
    }
    m
}

/// A blocking connection to `to` from the loopback address `from`.
fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    socket.bind(&SocketAddr::new(from, 0).into())?;
    socket.connect_timeout(&to.into(), Duration::from_secs(2))?;
    Ok(socket.into())
}

/// One GET on a new connection with `Connection: close`; the status line's code.
fn one_request(to: SocketAddr) -> std::io::Result<u16> {
    let mut s = connect_from(IpAddr::V4(Ipv4Addr::LOCALHOST), to)?;
    s.set_read_timeout(Some(Duration::from_secs(3)))?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n")?;
    let mut buf = Vec::with_capacity(4096);
    s.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    Ok(text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|t| t.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0))
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Hostile {
    Silent,
    PrefaceOnly,
    Slowloris,
}

struct HostileSocket {
    kind: Hostile,
    stream: TcpStream,
    opened: Instant,
    closed: Option<Instant>,
}

/// p-th percentile of sorted `v` (0..=100).
fn percentile(v: &[Duration], p: usize) -> Duration {
    v[(v.len() * p / 100).min(v.len() - 1)]
}

#[test]
fn hostile_sockets_are_closed_by_their_deadlines_and_visitors_stay_fast() {
    const HEADER_MS: u64 = 1000;
    // The node may be late by scheduling on a loaded machine; the deadline
    // the issue asks for is the header timeout, this is our tolerance.
    const SLACK_MS: u64 = 1000;
    let (_dir, _origin, edge) = node(
        "hostile",
        &format!(
            "header_read_timeout_ms = {HEADER_MS}\nkeepalive_timeout_ms = 2000\n\
             max_connections_per_address = 100"
        ),
        "",
    );
    let to = edge.http;
    assert_eq!(
        one_request(to).unwrap(),
        200,
        "the node serves before the attack"
    );

    // The visitor: one new connection per request, for as long as the attack.
    let stop = Arc::new(AtomicBool::new(false));
    let visitor = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut latencies = Vec::new();
            let mut failures = Vec::new();
            let limit = Instant::now() + Duration::from_secs(60);
            while !stop.load(Relaxed) && Instant::now() < limit {
                let started = Instant::now();
                match one_request(to) {
                    Ok(200) => {
                        let took = started.elapsed();
                        if took > Duration::from_millis(100) {
                            eprintln!("slow visitor request: {took:?}");
                        }
                        latencies.push(took);
                    }
                    other => failures.push(format!("{other:?}")),
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            (latencies, failures)
        })
    };

    // 1,000 silent, 1,000 preface-only and 200 slowloris sockets, from 44
    // loopback addresses (50 each, under the per-address cap of 100).
    let mut hostile: Vec<HostileSocket> = Vec::with_capacity(2200);
    let kinds = (0..2200).map(|i| match i % 11 {
        0 => Hostile::Slowloris,
        1..=5 => Hostile::Silent,
        _ => Hostile::PrefaceOnly,
    });
    let open_started = Instant::now();
    for (i, kind) in kinds.enumerate() {
        let from = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + (i % 44) as u8));
        let mut stream = connect_from(from, to).expect("hostile connect");
        match kind {
            Hostile::Silent => {}
            Hostile::PrefaceOnly => stream
                .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                .unwrap(),
            Hostile::Slowloris => stream
                .write_all(b"GET / HTTP/1.1\r\nHost: shop\r\nX-Slow: ")
                .unwrap(),
        }
        stream.set_nonblocking(true).unwrap();
        hostile.push(HostileSocket {
            kind,
            stream,
            opened: Instant::now(),
            closed: None,
        });
    }
    let opened_in = open_started.elapsed();

    // Watch every socket until each is closed by the node (bounded in time).
    let watch_limit = Instant::now() + Duration::from_millis(HEADER_MS + SLACK_MS + 5000);
    let mut last_trickle = Instant::now();
    let mut buf = [0u8; 4096];
    while hostile.iter().any(|h| h.closed.is_none()) && Instant::now() < watch_limit {
        let mut fds: Vec<libc::pollfd> = hostile
            .iter()
            .filter(|h| h.closed.is_none())
            .map(|h| libc::pollfd {
                fd: h.stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfds.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 50) };
        assert!(ready >= 0, "poll failed");
        let readable: std::collections::HashSet<i32> = fds
            .iter()
            .filter(|p| p.revents != 0)
            .map(|p| p.fd)
            .collect();
        let now = Instant::now();
        let trickle = now.duration_since(last_trickle) >= Duration::from_millis(100);
        if trickle {
            last_trickle = now;
        }
        for h in hostile.iter_mut().filter(|h| h.closed.is_none()) {
            if readable.contains(&h.stream.as_raw_fd()) {
                // Drain what the node said (a 408, an HTTP/2 SETTINGS or GOAWAY)
                // until EOF or an error: both mean closed.
                for _ in 0..16 {
                    match h.stream.read(&mut buf) {
                        Ok(0) => {
                            h.closed = Some(now);
                            break;
                        }
                        Ok(_) => {}
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(_) => {
                            h.closed = Some(now);
                            break;
                        }
                    }
                }
            }
            if h.closed.is_none()
                && trickle
                && h.kind == Hostile::Slowloris
                && h.stream.write(b"a").is_err()
            {
                h.closed = Some(now);
            }
        }
    }
    stop.store(true, Relaxed);
    let (mut latencies, failures) = visitor.join().unwrap();

    let still_open: Vec<Hostile> = hostile
        .iter()
        .filter(|h| h.closed.is_none())
        .map(|h| h.kind)
        .collect();
    assert!(
        still_open.is_empty(),
        "{} hostile sockets still open after {:?}: {:?}",
        still_open.len(),
        watch_limit.elapsed(),
        &still_open[..still_open.len().min(10)]
    );
    let mut held: Vec<(Duration, Hostile)> = hostile
        .iter()
        .map(|h| (h.closed.unwrap().duration_since(h.opened), h.kind))
        .collect();
    held.sort_by_key(|(d, _)| *d);
    let longest = held.last().unwrap();
    let held_times: Vec<Duration> = held.iter().map(|(d, _)| *d).collect();
    eprintln!(
        "held: p50 {:?} p90 {:?} p99 {:?}; over the deadline plus slack: {}",
        percentile(&held_times, 50),
        percentile(&held_times, 90),
        percentile(&held_times, 99),
        held_times
            .iter()
            .filter(|d| **d > Duration::from_millis(HEADER_MS + SLACK_MS))
            .count()
    );
    let m = metrics(&edge);
    eprintln!(
        "opened 2200 hostile sockets in {opened_in:?}; longest held {:?} ({:?}); \
         closed: header_timeout {} evicted {} address_limit {}; visitor: {} requests, \
         p50 {:?} p99 {:?} max {:?}",
        longest.0,
        longest.1,
        closed(&m, "header_timeout"),
        closed(&m, "evicted"),
        closed(&m, "address_limit"),
        latencies.len(),
        {
            latencies.sort();
            percentile(&latencies, 50)
        },
        percentile(&latencies, 99),
        latencies.last().unwrap(),
    );
    assert!(
        longest.0 <= Duration::from_millis(HEADER_MS + SLACK_MS),
        "a {:?} socket was held {:?}, past the {HEADER_MS} ms header deadline",
        longest.1,
        longest.0
    );
    assert!(failures.is_empty(), "visitor requests failed: {failures:?}");
    assert!(
        latencies.len() >= 20,
        "too few visitor samples: {}",
        latencies.len()
    );
    // What this test guards against is a hang: visitors waiting until the
    // hostile sockets' header deadline frees the node. The p99 is printed
    // above as a figure, not held to a speed target (speed is measured by
    // `cargo xtask bench`): an optimized node measured 22-43 ms here, but
    // once 139 ms in CI on the shared 2-core machine (2 of 83 requests
    // while it accepted the 2,200 sockets), and an unoptimized node a few
    // hundred ms (548 ms once, load average 13). So the bound is half the
    // header deadline for an optimized node and the deadline itself for an
    // unoptimized one: a visitor stuck behind the hostile sockets fails
    // either.
    let node_binary = procs::binary("waitroom-edge");
    let optimized_node = node_binary
        .parent()
        .and_then(|d| d.file_name())
        .is_some_and(|d| d == "release");
    let p99_bound = Duration::from_millis(if optimized_node {
        HEADER_MS / 2
    } else {
        HEADER_MS
    });
    assert!(
        percentile(&latencies, 99) < p99_bound,
        "visitor p99 {:?} over {p99_bound:?} (p50 {:?}, {} samples)",
        percentile(&latencies, 99),
        percentile(&latencies, 50),
        latencies.len()
    );
    assert_eq!(
        closed(&m, "address_limit"),
        0.0,
        "50 per address is under the cap"
    );
    assert!(
        closed(&m, "header_timeout") >= 2200.0,
        "every hostile socket closed by its header deadline:\n{m}"
    );
    assert_eq!(
        one_request(to).unwrap(),
        200,
        "the node serves after the attack"
    );
}

#[test]
fn at_the_connection_limit_the_oldest_idle_make_room_for_visitors() {
    // 2 workers × 50 connections, 300 silent sockets that would each hold a
    // slot for 10 s: before, visitors waited behind them in the backlog.
    let (_dir, _origin, edge) = node(
        "evict",
        "header_read_timeout_ms = 10000\nmax_connections_per_worker = 50",
        "",
    );
    let from = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
    let mut silent: Vec<TcpStream> = (0..300)
        .map(|_| connect_from(from, edge.http).unwrap())
        .collect();
    let mut slow = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        assert_eq!(one_request(edge.http).unwrap(), 200);
        let took = started.elapsed();
        if took > Duration::from_millis(500) {
            slow.push(took);
        }
    }
    assert!(slow.is_empty(), "visitors waited: {slow:?}");
    // The first sockets were the oldest idle: closed long before their 10 s.
    std::thread::sleep(Duration::from_millis(300));
    let mut closed_early = 0;
    for s in &mut silent[..100] {
        s.set_nonblocking(true).unwrap();
        let mut b = [0u8; 16];
        match s.read(&mut b) {
            Ok(0) => closed_early += 1,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => closed_early += 1,
            _ => {}
        }
    }
    assert_eq!(
        closed_early, 100,
        "the oldest 100 silent sockets were evicted"
    );
    let m = metrics(&edge);
    assert!(closed(&m, "evicted") >= 200.0, "{m}");
    assert_eq!(closed(&m, "header_timeout"), 0.0, "{m}");
}

#[test]
fn connections_over_the_per_address_cap_are_closed_at_accept() {
    let (_dir, _origin, edge) = node(
        "addrcap",
        "header_read_timeout_ms = 3000\nmax_connections_per_address = 5",
        "",
    );
    let from = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9));
    let mut held: Vec<TcpStream> = (0..8)
        .map(|_| connect_from(from, edge.http).unwrap())
        .collect();
    // The three over the cap see EOF at once; the five under it wait for
    // their header deadline (3 s).
    std::thread::sleep(Duration::from_millis(700));
    let mut refused = 0;
    for s in &mut held {
        s.set_nonblocking(true).unwrap();
        let mut b = [0u8; 64];
        match s.read(&mut b) {
            Ok(0) => refused += 1,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => refused += 1,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(refused, 3, "8 connections, cap 5");
    let m = metrics(&edge);
    assert_eq!(closed(&m, "address_limit"), 3.0, "{m}");
    // Another address is served meanwhile.
    assert_eq!(one_request(edge.http).unwrap(), 200);
}

#[test]
fn idle_connections_close_after_the_keepalive_timeout_http1_and_http2() {
    const KEEPALIVE_MS: u64 = 600;
    let (_dir, _origin, edge) = node(
        "keepalive",
        &format!("keepalive_timeout_ms = {KEEPALIVE_MS}\nheader_read_timeout_ms = 2000"),
        "",
    );
    // HTTP/1.1: one request, then nothing.
    let mut s = TcpStream::connect(edge.http).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: shop\r\n\r\n")
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    let started = Instant::now();
    let ended = loop {
        match s.read(&mut buf) {
            Ok(0) => break started.elapsed(),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("HTTP/1 connection not closed: {e}"),
        }
    };
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        ended >= Duration::from_millis(KEEPALIVE_MS - 100)
            && ended < Duration::from_millis(KEEPALIVE_MS + 900),
        "HTTP/1 idle connection closed after {ended:?}"
    );

    // HTTP/2 (prior knowledge): one request, then the node says GOAWAY and
    // the connection ends cleanly.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let http = edge.http;
    let (status, h2_ended) = rt.block_on(async move {
        let stream = tokio::net::TcpStream::connect(http).await.unwrap();
        let (mut send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await
        .unwrap();
        let conn = tokio::spawn(conn);
        let req = http::Request::get(format!("http://{http}/healthz"))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        let status = resp.status().as_u16();
        drop(resp);
        let started = Instant::now();
        let result = tokio::time::timeout(Duration::from_secs(5), conn)
            .await
            .expect("HTTP/2 connection not closed by the node");
        assert!(
            matches!(result, Ok(Ok(()))),
            "HTTP/2 connection ended with an error (no GOAWAY?): {result:?}"
        );
        (status, started.elapsed())
    });
    assert_eq!(status, 200);
    assert!(
        h2_ended < Duration::from_millis(KEEPALIVE_MS + 1500),
        "HTTP/2 idle connection closed after {h2_ended:?}"
    );
    let m = metrics_once_closed(&edge, "idle_timeout", 2.0);
    assert_eq!(closed(&m, "idle_timeout"), 2.0, "{m}");
}

/// Reads one whole answer (head and `Content-Length` body) off `s`.
fn read_answer(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = s.read(&mut buf).expect("an answer");
        assert!(n > 0, "closed before a whole answer: {got:?}");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let len: usize = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .expect("a Content-Length");
            if got.len() >= end + 4 + len {
                return text;
            }
        }
    }
}

/// A kept-alive HTTP/1 connection to the node that has had one `200` answer.
fn after_one_answer(edge: &Edge) -> TcpStream {
    let mut s = TcpStream::connect(edge.http).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: shop\r\n\r\n")
        .unwrap();
    let first = read_answer(&mut s);
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    s
}

/// Later request heads on a kept-alive HTTP/1 connection, as nginx times
/// them: the keep-alive deadline runs from the end of the previous answer
/// to the next head's first byte, the header deadline then to its end.
/// A head that begins late and arrives slowly but within both is served
/// (an honest visitor on a poor network); one that trickles without end
/// (slowloris after an honest first request) is cut at keep-alive plus the
/// header deadline, counted as a header timeout, and never answered.
#[test]
fn a_kept_alive_connections_next_head_has_the_keepalive_then_the_header_deadline() {
    const KEEPALIVE_MS: u64 = 600;
    const HEADER_MS: u64 = 1500;
    let (_dir, _origin, edge) = node(
        "next-head",
        &format!("keepalive_timeout_ms = {KEEPALIVE_MS}\nheader_read_timeout_ms = {HEADER_MS}"),
        "",
    );
    // Begun 400 ms after the first answer, finished 1 s after that.
    let mut s = after_one_answer(&edge);
    std::thread::sleep(Duration::from_millis(400));
    let head = b"GET /healthz HTTP/1.1\r\nHost: shop\r\n\r\n";
    for part in head.chunks(head.len() / 10 + 1) {
        s.write_all(part).unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    let second = read_answer(&mut s);
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");

    // Begun at once, then a byte every 50 ms without end (at most 5 s).
    let mut s = after_one_answer(&edge);
    let answered = Instant::now();
    s.write_all(b"GET / HTTP/1.1\r\nHost: shop\r\nX-Slow: ")
        .unwrap();
    s.set_nonblocking(true).unwrap();
    let mut rest = Vec::new();
    let mut buf = [0u8; 4096];
    let closed_after = 'trickle: {
        for _ in 0..100 {
            std::thread::sleep(Duration::from_millis(50));
            loop {
                match s.read(&mut buf) {
                    Ok(0) => break 'trickle Some(answered.elapsed()),
                    Ok(n) => rest.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(_) => break 'trickle Some(answered.elapsed()),
                }
            }
            if s.write_all(b"a").is_err() {
                break 'trickle Some(answered.elapsed());
            }
        }
        None
    };
    let closed_after = closed_after.expect("the trickling connection was never closed");
    assert!(
        rest.is_empty(),
        "the trickled head got an answer: {}",
        String::from_utf8_lossy(&rest)
    );
    let deadline = Duration::from_millis(KEEPALIVE_MS + HEADER_MS);
    assert!(
        closed_after >= deadline - Duration::from_millis(100)
            && closed_after < deadline + Duration::from_millis(1000),
        "closed {closed_after:?} after the first answer (deadline {deadline:?})"
    );
    let m = metrics_once_closed(&edge, "header_timeout", 1.0);
    assert_eq!(closed(&m, "header_timeout"), 1.0, "{m}");
    // The first connection, left open after its second answer, went idle.
    assert_eq!(closed(&m, "idle_timeout"), 1.0, "{m}");
}

#[test]
fn a_client_that_never_reads_is_cut_off_by_the_send_timeout() {
    const SEND_MS: u64 = 500;
    let (_dir, _origin, edge) = node("sendtimeout", &format!("send_timeout_ms = {SEND_MS}"), "");
    let mut s = TcpStream::connect(edge.http).unwrap();
    s.write_all(b"GET /big?mb=64 HTTP/1.1\r\nHost: shop\r\n\r\n")
        .unwrap();
    // Read nothing while the node's and the kernel's buffers fill.
    std::thread::sleep(Duration::from_millis(SEND_MS * 4));
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut total = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    let limit = Instant::now() + Duration::from_secs(20);
    while Instant::now() < limit {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => total += n,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("after {total} bytes: {e}"),
        }
    }
    assert!(
        total < 64 << 20,
        "the whole 64 MiB arrived ({total} bytes): the slow reader was not cut off"
    );
    let m = metrics(&edge);
    assert_eq!(closed(&m, "send_timeout"), 1.0, "{m}");
    assert_eq!(one_request(edge.http).unwrap(), 200);
}

/// Sends `head` and `body` raw, half-closes, and returns the node's answer.
fn raw_exchange(to: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(to).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(request).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    String::from_utf8_lossy(&got).into_owned()
}

fn origin_series<'a>(m: &'a str, name: &str) -> Vec<&'a str> {
    m.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .collect()
}

#[test]
fn a_broken_client_body_is_a_400_and_never_marks_the_origin_down() {
    let (_dir, _origin, edge) = node(
        "clientbody",
        "",
        "[rooms.health]\npath = \"/healthz\"\ninterval_ms = 200\ntimeout_ms = 150\nfall = 2\nrise = 1",
    );
    let truncated = b"POST /echo HTTP/1.1\r\nHost: shop\r\nContent-Length: 1000\r\n\r\nonly ten b";
    let bad_chunks =
        b"POST /echo HTTP/1.1\r\nHost: shop\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nnot hex\r\n";
    for (i, request) in [&truncated[..], truncated, truncated, bad_chunks, bad_chunks]
        .into_iter()
        .enumerate()
    {
        let answer = raw_exchange(edge.http, request);
        assert!(
            answer.starts_with("HTTP/1.1 400"),
            "request {i}: expected 400, got {answer:?}"
        );
    }
    let m = metrics(&edge);
    for line in origin_series(&m, "waitroom_origin_connection_failures_total") {
        assert!(
            line.ends_with(" 0"),
            "the visitor's fault counted against the origin: {line}"
        );
    }
    for line in origin_series(&m, "waitroom_origin_up") {
        assert!(line.ends_with(" 1"), "{line}");
    }
    assert_eq!(
        metric(&m, "waitroom_client_body_errors_total{room=\"shop\"}"),
        Some(5.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "waitroom_proxy_errors_total{room=\"shop\"}"),
        Some(0.0)
    );
    // Visitors are still served by the origin.
    let (status, body) = get(&client(), &edge.url("/"));
    assert_eq!(status, 200);
    assert!(body.contains(SITE));
}

#[test]
fn an_origin_that_resets_mid_response_counts_against_it() {
    // A raw origin: a head promising 100 kB, 1 kB of it, then a reset.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let origin = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let origin_thread = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let limit = Instant::now() + Duration::from_secs(30);
            let mut served = 0;
            while !stop.load(Relaxed) && Instant::now() < limit && served < 10 {
                let Ok((s, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                served += 1;
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                let mut s = s;
                let mut head = Vec::new();
                let mut b = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
                    match s.read(&mut b) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&b[..n]),
                    }
                }
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n");
                let _ = s.write_all(&[b'x'; 1000]);
                std::thread::sleep(Duration::from_millis(50));
                // SO_LINGER 0: close with a reset.
                let _ = Socket::from(s).set_linger(Some(Duration::ZERO));
            }
        })
    };
    let dir = TempDir::new("originreset");
    let edge = Edge::start(dir.path(), "edge", &config(&dir, origin, "", "")).unwrap();
    let mut s = TcpStream::connect(edge.http).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(got.len() < 100_000, "the whole body arrived: {}", got.len());
    stop.store(true, Relaxed);
    let _ = origin_thread.join();
    let m = metrics(&edge);
    let failures = origin_series(&m, "waitroom_origin_connection_failures_total");
    assert_eq!(failures.len(), 1, "{m}");
    assert!(failures[0].ends_with(" 1"), "{}", failures[0]);
}
