//! The node's origin connections (`waitroom_edge::origin_pool`) against a
//! scripted origin on loopback: a raw TCP server that answers each request
//! with whatever the test scripts for that connection and counts the
//! connections it accepted. One worker, so one pool, so reuse is exact.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering::SeqCst},
    },
    time::Duration,
};

use waitroom_tests::{
    edge::{Edge, client, get},
    procs::TempDir,
};

/// What the origin does with one request on a connection.
#[derive(Debug, Clone, Copy)]
enum Answer {
    /// The bytes, then wait for the next request on the connection.
    Keep(&'static [u8]),
    /// The bytes, then close the connection.
    Close(&'static [u8]),
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
const OK_CHUNKED: &[u8] =
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n";
/// A head that promises ten bytes of body, and three of them.
const HALF: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc";
const GARBAGE: &[u8] = b"this is not HTTP at all\r\n\r\n";

/// A scripted origin: connection `n` (from 0) answers its requests with
/// `script(n)` in turn, the last answer repeating; it counts connections.
struct Origin {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
}

impl Origin {
    fn start(script: fn(usize) -> Vec<Answer>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        std::thread::spawn(move || {
            // Bounded: no test opens more than a handful.
            for stream in listener.incoming().take(64) {
                let Ok(stream) = stream else { continue };
                let n = count.fetch_add(1, SeqCst);
                std::thread::spawn(move || serve(stream, &script(n)));
            }
        });
        Self { addr, accepted }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(SeqCst)
    }
}

/// Answers each request head (GETs: no body) on `stream` from `answers`.
fn serve(mut stream: TcpStream, answers: &[Answer]) {
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut buf = Vec::new();
    for i in 0..100 {
        // Read up to the end of one head.
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                buf.drain(..end + 4);
                break;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        match answers[i.min(answers.len() - 1)] {
            Answer::Keep(bytes) => {
                if stream.write_all(bytes).is_err() {
                    return;
                }
            }
            Answer::Close(bytes) => {
                let _ = stream.write_all(bytes);
                return;
            }
        }
    }
}

/// A node with one worker and one room in front of `origin`.
fn node(dir: &TempDir, origin: SocketAddr) -> Edge {
    let config = format!(
        r#"[node]
id = "test-node"
colo = "test"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
workers = 1
counters_path = "{counters}"

[[rooms]]
id = "shop"
origin = "{origin}"
origin_timeout_ms = 3000
total_active_users = 100000
new_users_per_minute = 100000
"#,
        counters = dir.path().join("counters.shm").display()
    );
    Edge::start(dir.path(), "edge", &config).expect("edge starts")
}

#[test]
fn a_connection_is_reused_after_each_clean_response() {
    let dir = TempDir::new("pool-reuse");
    let origin = Origin::start(|_| vec![Answer::Keep(OK), Answer::Keep(OK_CHUNKED)]);
    let edge = node(&dir, origin.addr);
    let agent = client();
    for i in 0..6 {
        assert_eq!(
            get(&agent, &edge.url("/")),
            (200, "ok".into()),
            "request {i}"
        );
    }
    assert_eq!(
        origin.accepted(),
        1,
        "six requests, one after the other: one connection, length-delimited and chunked answers alike"
    );
}

#[test]
fn a_connection_the_origin_closes_is_not_reused() {
    let dir = TempDir::new("pool-close");
    // Every connection answers once, then closes (after a full answer).
    let origin = Origin::start(|_| vec![Answer::Close(OK)]);
    let edge = node(&dir, origin.addr);
    let agent = client();
    for i in 0..4 {
        assert_eq!(
            get(&agent, &edge.url("/")),
            (200, "ok".into()),
            "request {i}"
        );
    }
    assert_eq!(origin.accepted(), 4, "one connection per request");
}

#[test]
fn a_half_response_fails_that_request_only_and_its_connection_is_dropped() {
    let dir = TempDir::new("pool-half");
    // The first connection sends half an answer and closes; the rest answer well.
    let origin = Origin::start(|n| {
        if n == 0 {
            vec![Answer::Close(HALF)]
        } else {
            vec![Answer::Keep(OK)]
        }
    });
    let edge = node(&dir, origin.addr);
    let agent = client();
    // The head went out before the origin failed: the visitor sees the body
    // break off (an error reading it), never "ok".
    let first = agent
        .get(edge.url("/"))
        .call()
        .map(|mut r| r.body_mut().read_to_string());
    assert!(
        !matches!(first, Ok(Ok(ref body)) if body.len() == 10),
        "a cut-off body must not arrive whole: {first:?}"
    );
    for i in 0..3 {
        assert_eq!(
            get(&client(), &edge.url("/")),
            (200, "ok".into()),
            "request {i}"
        );
    }
    assert_eq!(
        origin.accepted(),
        2,
        "the broken connection is dropped, the next one reused"
    );
}

#[test]
fn garbage_or_an_oversized_head_from_the_origin_is_a_502() {
    let dir = TempDir::new("pool-garbage");
    let garbage = Origin::start(|_| vec![Answer::Keep(GARBAGE)]);
    let edge = node(&dir, garbage.addr);
    for _ in 0..2 {
        let (status, body) = get(&client(), &edge.url("/"));
        assert_eq!(status, 502);
        assert!(body.contains("not answering"), "{body}");
    }
    assert_eq!(
        garbage.accepted(),
        2,
        "a connection that answered garbage is not reused"
    );
    drop(edge);

    // A head far over hyper's buffer limit (about 400 KiB), never ending.
    let huge: &'static [u8] = {
        let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..40_000 {
            head.extend_from_slice(format!("x-filler-{i}: {}\r\n", "y".repeat(20)).as_bytes());
        }
        head.leak()
    };
    static HUGE: std::sync::OnceLock<&'static [u8]> = std::sync::OnceLock::new();
    HUGE.set(huge).unwrap();
    let oversized = Origin::start(|_| vec![Answer::Keep(HUGE.get().unwrap())]);
    let edge = node(&dir, oversized.addr);
    let (status, body) = get(&client(), &edge.url("/"));
    assert_eq!(status, 502);
    assert!(body.contains("not answering"), "{body}");
    // The node is still serving.
    let (status, _) = get(&client(), &edge.admin_url("/metrics"));
    assert_eq!(status, 200);
}
