//! The node's own HTTP/1 exchange (`http1_fast_path`, issue 17) against
//! hyper's, on the real node binary over loopback: the same raw requests to
//! two nodes, one with the fast path and one without, get the same answers
//! (the `date` and the cookie's sealed value aside), in the same order, and
//! the connection ends where hyper's ends. The requests are the ones a
//! tired client and a hostile one send: pipelined, `HEAD`, `Connection:
//! close`, a body after a plain request, the smuggler's `Content-Length`
//! with `Transfer-Encoding`, HTTP/1.0, bad targets, too many or too long
//! fields, HTTP/2's preface, garbage. And the queue page over HTTP/2
//! (hyper's on both) carries the fields the fast path writes as lines.
use std::{
    io::{Read as _, Write as _},
    net::{Shutdown, SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use waitroom_tests::{
    edge::{Edge, client, get, metric},
    procs::{Proc, TempDir, start_origin},
};

fn config(dir: &TempDir, origin: SocketAddr, fast: bool) -> String {
    format!(
        r#"[node]
id = "h1-node"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
workers = 1
counters_path = "{counters}"
max_headers = 16
max_header_bytes = 2048
http1_fast_path = {fast}

[[rooms]]
id = "line"
path = "/line"
origin = "{origin}"
total_active_users = 10
new_users_per_minute = 10
queue_all = true

[[rooms]]
id = "shop"
path = "/"
origin = "{origin}"
total_active_users = 1000000
new_users_per_minute = 1000000
"#,
        counters = dir.path().join(format!("counters-{fast}.shm")).display()
    )
}

/// `raw` written on a new connection; what came back until the node closed
/// the connection or fell silent for a while, and whether it closed.
fn exchange(to: SocketAddr, raw: &[u8]) -> (String, bool) {
    let mut s = TcpStream::connect(to).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(400)))
        .unwrap();
    s.write_all(raw).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 16384];
    let until = Instant::now() + Duration::from_secs(5);
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
        if Instant::now() > until {
            break false;
        }
    };
    let _ = s.shutdown(Shutdown::Both);
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

/// `text` with what differs between two nodes and two moments masked: the
/// `date`, a cookie's sealed value, and a queue page's refresh interval
/// (jittered per ticket), with the page's digits and length that follow it.
fn normalized(text: &str) -> String {
    text.split("HTTP/1.")
        .map(|answer| {
            let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((answer, ""));
            let jittered = head.to_ascii_lowercase().contains("\r\nrefresh: ");
            let head = head
                .split("\r\n")
                .filter(|l| !l.to_ascii_lowercase().starts_with("date: "))
                .map(|l| {
                    let lower = l.to_ascii_lowercase();
                    let masked = lower.starts_with("refresh: ")
                        || lower.starts_with("retry-after: ")
                        || (jittered && lower.starts_with("content-length: "));
                    if masked {
                        format!("{}: N", l.split(':').next().unwrap_or(""))
                    } else if lower.starts_with("set-cookie: ")
                        && let Some((name, rest)) = l.split_once('=')
                        && let Some((_, attributes)) = rest.split_once(';')
                    {
                        format!("{name}=SEALED;{attributes}")
                    } else {
                        l.to_owned()
                    }
                })
                .collect::<Vec<_>>()
                .join("\r\n");
            let body: String = if jittered {
                body.chars()
                    .map(|c| if c.is_ascii_digit() { 'N' } else { c })
                    .collect()
            } else {
                body.to_owned()
            };
            format!("{head}\r\n\r\n{body}")
        })
        .collect::<Vec<_>>()
        .join("HTTP/1.")
}

const HOST: &str = "Host: shop.example\r\n";

#[test]
fn the_fast_path_answers_every_request_as_hyper_does() {
    let dir = TempDir::new("http1-differential");
    let (_origin, origin): (Proc, SocketAddr) = start_origin(dir.path(), "origin").unwrap();
    let fast = Edge::start(dir.path(), "fast", &config(&dir, origin, true)).unwrap();
    let hyper = Edge::start(dir.path(), "hyper", &config(&dir, origin, false)).unwrap();
    let many_fields: String = (0..20).map(|i| format!("X-F{i}: {i}\r\n")).collect();
    let long_field = format!("X-Long: {}\r\n", "a".repeat(3000));
    let cases: Vec<(&str, bool, String)> = vec![
        ("plain GET", false, format!("GET / HTTP/1.1\r\n{HOST}\r\n")),
        ("HEAD", false, format!("HEAD / HTTP/1.1\r\n{HOST}\r\n")),
        (
            "queue page",
            false,
            format!("GET /line HTTP/1.1\r\n{HOST}\r\n"),
        ),
        (
            "queue JSON",
            false,
            format!("GET /line HTTP/1.1\r\n{HOST}Accept: application/json\r\n\r\n"),
        ),
        (
            "pipelined, a body in the middle",
            true,
            format!(
                "GET /a HTTP/1.1\r\n{HOST}\r\nPOST /b HTTP/1.1\r\n{HOST}Content-Length: 5\r\n\r\nhelloGET /c HTTP/1.1\r\n{HOST}\r\n"
            ),
        ),
        (
            "Connection: close, then a request never answered",
            false,
            format!(
                "GET / HTTP/1.1\r\n{HOST}Connection: close\r\n\r\nGET /never HTTP/1.1\r\n{HOST}\r\n"
            ),
        ),
        (
            "the smuggler's pair after a plain request",
            true,
            format!(
                "GET / HTTP/1.1\r\n{HOST}\r\nPOST / HTTP/1.1\r\n{HOST}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n{HOST}\r\n"
            ),
        ),
        (
            "a GET that claims a body, then another request",
            true,
            format!(
                "GET / HTTP/1.1\r\n{HOST}Content-Length: 3\r\n\r\nx\r\nGET /next HTTP/1.1\r\n{HOST}\r\n"
            ),
        ),
        ("HTTP/1.0", true, format!("GET / HTTP/1.0\r\n{HOST}\r\n")),
        (
            "a target http refuses",
            false,
            format!("GET /a<b HTTP/1.1\r\n{HOST}\r\n"),
        ),
        (
            "too many fields",
            true,
            format!("GET / HTTP/1.1\r\n{HOST}{many_fields}\r\n"),
        ),
        (
            "a field too long",
            true,
            format!("GET / HTTP/1.1\r\n{HOST}{long_field}\r\n"),
        ),
        (
            "a folded field",
            true,
            format!("GET / HTTP/1.1\r\n{HOST}X-A: 1\r\n folded\r\n\r\n"),
        ),
        ("garbage", true, "\u{1}\u{2}hello there\r\n\r\n".to_owned()),
        (
            "an absolute target",
            true,
            format!("GET http://shop.example/ HTTP/1.1\r\n{HOST}\r\n"),
        ),
    ];
    let to_hyper = |edge: &Edge| {
        let text = get(&client(), &edge.admin_url("/metrics")).1;
        metric(&text, "waitroom_connections_to_hyper_total").unwrap_or(-1.0)
    };
    let mut handed = 0.0;
    for (what, hands_off, raw) in &cases {
        let (a, a_closed) = exchange(fast.http, raw.as_bytes());
        let (b, b_closed) = exchange(hyper.http, raw.as_bytes());
        assert!(!b.is_empty() || b_closed, "{what}: hyper said nothing");
        assert_eq!(
            normalized(&a),
            normalized(&b),
            "{what}: the fast path (left) and hyper (right) answer differently"
        );
        assert_eq!(a_closed, b_closed, "{what}: one closed, the other did not");
        // The fast node served what it finds plain itself, and handed the
        // rest to hyper; the other node never has the choice.
        handed += f64::from(u8::from(*hands_off));
        assert_eq!(
            to_hyper(&fast),
            handed,
            "{what}: connections handed to hyper"
        );
    }
    assert_eq!(to_hyper(&hyper), 0.0);

    // HTTP/2 is hyper's on both nodes: the queue page's fields, which the
    // node writes as lines for its own HTTP/1 writer, reach the map there.
    for edge in [&fast, &hyper] {
        let out = std::process::Command::new("curl")
            .args(["-sS", "-i", "--http2-prior-knowledge"])
            .arg(format!("http://{}/line", edge.http))
            .output()
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
        assert!(text.starts_with("http/2 200"), "{text}");
        for field in [
            "content-type: text/html; charset=utf-8\r\n",
            "cache-control: no-store\r\n",
            "refresh: ",
            "retry-after: ",
            "vary: accept\r\n",
            "set-cookie: __wr_line=",
        ] {
            assert!(
                text.contains(field),
                "{field:?} missing over HTTP/2: {text}"
            );
        }
    }
}
