//! The client's address is the real one (issue 13, item 6), with the real
//! binary in front of the real demo origin, whose `/echo` shows what the
//! origin received: a client's own forwarding headers never reach the
//! origin, a trusted proxy's chain is believed, a PROXY protocol header
//! names the client (plain and TLS listeners) and a missing or malformed one
//! closes the connection, `Connection` cannot take away `Host` or the node's
//! `X-Forwarded-For`, and a request that comes back to the node is a 508.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use waitroom_tests::{
    edge::{Edge, client, get, metric},
    procs::{TempDir, free_port, start_origin},
};

/// One passthrough room in front of `origin`; `node` adds keys to `[node]`.
fn config(dir: &Path, origin: SocketAddr, node: &str) -> String {
    format!(
        r#"[node]
id = "edge-1"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
workers = 1
state_dir = "{state}"
header_read_timeout_ms = 1000
{node}

[[rooms]]
id = "shop"
origin = "{origin}"
total_active_users = 1000
new_users_per_minute = 1000
queueing_method = "passthrough"
"#,
        state = dir.join("state").display()
    )
}

fn defended(edge: &Edge, reason: &str) -> f64 {
    let text = get(&client(), &edge.admin_url("/metrics")).1;
    metric(
        &text,
        &format!("waitroom_defended_total{{reason=\"{reason}\"}}"),
    )
    .unwrap_or(-1.0)
}

/// Writes `bytes` on a new connection to `addr` and reads until the node
/// closes it (bounded by a 5 s read timeout): what came back.
fn exchange(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// A raw `GET /echo` with `headers` (each line without CRLF); the response, lower-cased.
fn echo(addr: SocketAddr, prefix: &[u8], headers: &[&str]) -> String {
    let mut req = prefix.to_vec();
    req.extend_from_slice(b"GET /echo HTTP/1.1\r\nHost: shop.example\r\n");
    for h in headers {
        req.extend_from_slice(h.as_bytes());
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"Connection: close\r\n\r\n");
    exchange(addr, &req).to_ascii_lowercase()
}

/// The value of `name` in the origin's echo (lower-cased), if it got one.
fn echoed<'a>(body: &'a str, name: &str) -> Option<&'a str> {
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
}

/// A PROXY v2 header (PROXY command, TCP) from `src` to `dst`, by hand from
/// the spec, so the test does not share the node's parser.
fn proxy_v2(src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.push(0x21);
    let mut addrs = Vec::new();
    match (src, dst) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            h.push(0x11);
            addrs.extend_from_slice(&s.ip().octets());
            addrs.extend_from_slice(&d.ip().octets());
        }
        (SocketAddr::V6(s), SocketAddr::V6(d)) => {
            h.push(0x21);
            addrs.extend_from_slice(&s.ip().octets());
            addrs.extend_from_slice(&d.ip().octets());
        }
        _ => panic!("one family"),
    }
    addrs.extend_from_slice(&src.port().to_be_bytes());
    addrs.extend_from_slice(&dst.port().to_be_bytes());
    h.extend_from_slice(&(addrs.len() as u16).to_be_bytes());
    h.extend_from_slice(&addrs);
    h
}

#[test]
fn an_untrusted_clients_forwarding_headers_never_reach_the_origin() {
    let dir = TempDir::new("untrusted-forwarding");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let edge = Edge::start(dir.path(), "edge", &config(dir.path(), origin, "")).unwrap();

    let body = echo(
        edge.http,
        b"",
        &[
            "X-Forwarded-For: 6.6.6.6",
            "Forwarded: for=6.6.6.6;proto=https",
            "X-Real-IP: 6.6.6.6",
            "X-Forwarded-Host: evil.example",
            "X-Forwarded-Proto: https",
        ],
    );
    assert!(body.starts_with("http/1.1 200"), "{body}");
    assert!(
        !body.contains("6.6.6.6") && !body.contains("evil.example"),
        "{body}"
    );
    assert_eq!(
        echoed(&body, "x-forwarded-for"),
        Some("127.0.0.1"),
        "{body}"
    );
    assert_eq!(echoed(&body, "x-real-ip"), Some("127.0.0.1"), "{body}");
    assert_eq!(echoed(&body, "x-forwarded-proto"), Some("http"), "{body}");
    assert_eq!(
        echoed(&body, "forwarded"),
        Some("for=127.0.0.1;proto=http"),
        "{body}"
    );
    assert_eq!(echoed(&body, "x-forwarded-host"), None, "{body}");
    assert_eq!(echoed(&body, "via"), Some("1.1 waitroom-edge-1"), "{body}");
    assert_eq!(defended(&edge, "forwarded_untrusted"), 1.0);

    // Another node's Via is no loop: it is kept, and this node's follows.
    let body = echo(edge.http, b"", &["Via: 1.1 waitroom-edge-2"]);
    assert!(body.starts_with("http/1.1 200"), "{body}");
    assert!(
        body.contains("via: 1.1 waitroom-edge-2\nvia: 1.1 waitroom-edge-1\n"),
        "{body}"
    );
    assert_eq!(defended(&edge, "loop"), 0.0);

    // A clean request is not counted.
    let body = echo(edge.http, b"", &[]);
    assert_eq!(
        echoed(&body, "x-forwarded-for"),
        Some("127.0.0.1"),
        "{body}"
    );
    assert_eq!(defended(&edge, "forwarded_untrusted"), 1.0);

    // `Connection` cannot take away Host or the node's X-Forwarded-For; an
    // ordinary nomination is still removed.
    let body = echo(
        edge.http,
        b"",
        &["X-Secret: 1", "Connection: Host, X-Forwarded-For, X-Secret"],
    );
    assert!(body.starts_with("http/1.1 200"), "{body}");
    assert_eq!(echoed(&body, "host"), Some("shop.example"), "{body}");
    assert_eq!(
        echoed(&body, "x-forwarded-for"),
        Some("127.0.0.1"),
        "{body}"
    );
    assert_eq!(echoed(&body, "x-secret"), None, "{body}");
    assert_eq!(defended(&edge, "hop_by_hop_nomination"), 1.0);
}

#[test]
fn a_trusted_proxys_chain_is_believed_to_its_first_untrusted_address() {
    let dir = TempDir::new("trusted-forwarding");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let node = "trusted_proxies = [\"127.0.0.1/32\", \"10.0.0.0/8\"]";
    let edge = Edge::start(dir.path(), "edge", &config(dir.path(), origin, node)).unwrap();

    let body = echo(
        edge.http,
        b"",
        &[
            "X-Forwarded-For: 6.6.6.6, 203.0.113.9, 10.1.2.3",
            "X-Forwarded-Proto: https",
            "X-Forwarded-Host: shop.example",
        ],
    );
    assert!(body.starts_with("http/1.1 200"), "{body}");
    // The left-most entry is the client's own claim: not believed.
    assert_eq!(echoed(&body, "x-real-ip"), Some("203.0.113.9"), "{body}");
    assert_eq!(
        echoed(&body, "x-forwarded-for"),
        Some("6.6.6.6, 203.0.113.9, 10.1.2.3, 127.0.0.1"),
        "{body}"
    );
    assert_eq!(echoed(&body, "x-forwarded-proto"), Some("https"), "{body}");
    assert_eq!(
        echoed(&body, "x-forwarded-host"),
        Some("shop.example"),
        "{body}"
    );
    // Forwarded, when the proxy used it instead.
    let body = echo(edge.http, b"", &["Forwarded: for=\"[2001:db8::9]:4711\""]);
    assert_eq!(echoed(&body, "x-real-ip"), Some("2001:db8::9"), "{body}");
    assert_eq!(defended(&edge, "forwarded_untrusted"), 0.0);
}

#[test]
fn a_proxy_protocol_header_names_the_client_and_its_absence_closes() {
    let dir = TempDir::new("proxy-protocol");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let certs = dir.path().join("certs");
    waitroom_runtime::devcerts::write(&certs, &[]).unwrap();
    let node = format!(
        "trusted_proxies = [\"127.0.0.1\"]\nproxy_protocol = true\n\n[node.tls]\nlisten = \"127.0.0.1:0\"\ncert = \"{}\"\nkey = \"{}\"\nproxy_protocol = true",
        certs.join("aggregator.pem").display(),
        certs.join("aggregator.key").display()
    );
    let edge = Edge::start(dir.path(), "edge", &config(dir.path(), origin, &node)).unwrap();

    // v1 and v2 (IPv4 and IPv6): the origin hears of the named client.
    let body = echo(
        edge.http,
        b"PROXY TCP4 203.0.113.9 127.0.0.1 4711 80\r\n",
        &["X-Forwarded-For: 6.6.6.6"],
    );
    assert!(body.starts_with("http/1.1 200"), "{body}");
    assert_eq!(
        echoed(&body, "x-forwarded-for"),
        Some("203.0.113.9"),
        "{body}"
    );
    let v2 = proxy_v2("198.51.100.20:5000".parse().unwrap(), edge.http);
    let body = echo(edge.http, &v2, &[]);
    assert_eq!(
        echoed(&body, "x-forwarded-for"),
        Some("198.51.100.20"),
        "{body}"
    );
    let v2_6 = proxy_v2(
        "[2001:db8::20]:5000".parse().unwrap(),
        "[2001:db8::1]:80".parse().unwrap(),
    );
    let body = echo(edge.http, &v2_6, &[]);
    assert_eq!(
        echoed(&body, "x-forwarded-for"),
        Some("2001:db8::20"),
        "{body}"
    );
    assert_eq!(defended(&edge, "proxy_protocol"), 0.0);

    // Garbage and a plain request: closed without an answer, counted.
    let answer = exchange(edge.http, b"PROXY TCP4 999.1.1.1 127.0.0.1 1 2\r\n");
    assert_eq!(answer, "", "a malformed header got an answer");
    let answer = exchange(
        edge.http,
        b"GET / HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(answer, "", "a request without a header got an answer");
    assert_eq!(defended(&edge, "proxy_protocol"), 2.0);
    // Silence: closed at the header deadline (1 s), counted.
    let started = Instant::now();
    let answer = exchange(edge.http, b"");
    assert_eq!(answer, "");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(4),
        "{waited:?}"
    );
    assert_eq!(defended(&edge, "proxy_protocol"), 3.0);

    // TLS: the header first, then the handshake (through a relay that
    // writes the header, as a load balancer does).
    let https = edge.https.expect("the https listener");
    let relay = header_relay(
        https,
        b"PROXY TCP4 203.0.113.77 127.0.0.1 4711 443\r\n".to_vec(),
    );
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--http1.1", "--cacert"])
        .arg(certs.join("ca.pem"))
        .arg("--resolve")
        .arg(format!("localhost:{}:127.0.0.1", relay.port()))
        .arg(format!("https://localhost:{}/echo", relay.port()))
        .output()
        .expect("curl");
    let body = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert_eq!(
        echoed(&body, "x-forwarded-for"),
        Some("203.0.113.77"),
        "{body}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(echoed(&body, "x-forwarded-proto"), Some("https"), "{body}");
    assert_eq!(defended(&edge, "proxy_protocol"), 3.0);
}

/// A PROXY listener accepts a header only from a trusted proxy.
#[test]
fn a_proxy_protocol_header_from_an_untrusted_peer_is_refused() {
    let dir = TempDir::new("proxy-protocol-untrusted");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let node = "trusted_proxies = [\"192.0.2.1\"]\nproxy_protocol = true";
    let edge = Edge::start(dir.path(), "edge", &config(dir.path(), origin, node)).unwrap();
    let body = echo(
        edge.http,
        b"PROXY TCP4 203.0.113.9 127.0.0.1 4711 80\r\n",
        &[],
    );
    assert_eq!(body, "", "an untrusted peer's PROXY header was served");
    assert_eq!(defended(&edge, "proxy_protocol"), 1.0);
}

/// Relays connections on a new loopback port to `to`, writing `header`
/// first on each (at most four connections).
fn header_relay(to: SocketAddr, header: Vec<u8>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(4) {
            let Ok(mut down) = conn else { return };
            let Ok(mut up) = TcpStream::connect(to) else {
                return;
            };
            if up.write_all(&header).is_err() {
                return;
            }
            let (Ok(mut down_r), Ok(mut up_w)) = (down.try_clone(), up.try_clone()) else {
                return;
            };
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut down_r, &mut up_w);
                let _ = up_w.shutdown(std::net::Shutdown::Write);
            });
            let _ = std::io::copy(&mut up, &mut down);
        }
    });
    addr
}

/// A room whose origin is the node itself: the forwarded request carries
/// the node's own `Via` and is answered 508 at once, after one hop.
#[test]
fn a_request_that_comes_back_is_a_loop_not_a_storm() {
    let dir = TempDir::new("via-loop");
    let port = free_port().unwrap();
    let me: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let text = config(dir.path(), me, "").replace(
        "listen = \"127.0.0.1:0\"\nadmin",
        &format!("listen = \"{me}\"\nadmin"),
    );
    let edge = Edge::start(dir.path(), "edge", &text).unwrap();
    assert_eq!(edge.http, me);
    let started = Instant::now();
    let (status, body) = get(&client(), &edge.url("/"));
    assert_eq!(status, 508, "{body}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(defended(&edge, "loop"), 1.0, "one hop, one refusal");
}
