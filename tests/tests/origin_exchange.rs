//! The node's HTTP/1.1 exchange with an origin, seen from both ends: a
//! scripted raw-TCP origin on loopback (it reads each request head and body,
//! Content-Length or chunked, records them, and answers with the bytes the
//! test scripts for that connection) and a visitor (ureq, or raw bytes where
//! the test needs them). Framing (chunked with extensions and trailers,
//! close-delimited, interim answers, bodiless statuses, HEAD), smuggling and
//! splitting attempts, large bodies both ways, and when a connection may be
//! used again. One worker, so one pool, so the count of connections the
//! origin accepted says exactly whether a connection was reused.
//!
//! These are behaviour tests of the node, whatever client it speaks to a
//! plain-HTTP origin with (`waitroom_edge::origin_h1` since session 27).
//! Four of them failed on hyper's client, which it replaced: the answer
//! framed by both `Transfer-Encoding` and `Content-Length` (the origin's
//! length reached the visitor with the decoded body, and the connection was
//! reused), reuse after trailers, and an upload the origin refused before
//! reading it (a `502` instead of the origin's `413`).
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering::SeqCst},
    },
    time::{Duration, Instant},
};

use waitroom_tests::{
    edge::{Edge, client},
    procs::TempDir,
};

/// How long any socket of these tests waits for a byte.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a scripted origin connection lives at most.
const CONN_LIFETIME: Duration = Duration::from_secs(30);
/// The most a head, a line or a body may grow to in these tests.
const MAX_BYTES: usize = 16 << 20;
/// The node's `Via` entry (node id `test-node`).
const VIA: &str = "1.1 waitroom-test-node";

const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
/// What a connection answers when it is used again where it must not be.
const REUSED: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nREUSED";

// ---------------------------------------------------------------------------
// The scripted origin.

/// Bytes to write after a pause.
type Part = (Duration, Vec<u8>);

/// What the origin does with one request on a connection.
#[derive(Debug, Clone)]
enum Step {
    /// Write the parts (each after its pause), then wait for the next request.
    Keep(Vec<Part>),
    /// Write the parts, then close the connection.
    Close(Vec<Part>),
    /// Answer the request body's length and checksum (`LEN FNV`), keep.
    Echo,
    /// Answer as soon as the head is read, without reading the body, then
    /// close (an origin refusing an upload it will not take).
    Refuse(Vec<u8>),
}

fn keep(bytes: &[u8]) -> Step {
    Step::Keep(vec![(Duration::ZERO, bytes.to_vec())])
}

/// A request the origin received.
#[derive(Debug, Clone)]
struct Seen {
    /// Which connection (from 0, in accept order).
    conn: usize,
    head: String,
    body: Vec<u8>,
}

impl Seen {
    fn method(&self) -> &str {
        self.head.split(' ').next().unwrap_or("")
    }
}

type Script = Arc<dyn Fn(usize) -> Vec<Step> + Send + Sync>;

/// A scripted origin: connection `n` (from 0) answers its requests with
/// `script(n)` in turn, the last step repeating; it counts connections and
/// records every request.
struct Origin {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Origin {
    fn start(script: impl Fn(usize) -> Vec<Step> + Send + Sync + 'static) -> Self {
        let script: Script = Arc::new(script);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (count, log) = (Arc::clone(&accepted), Arc::clone(&seen));
        std::thread::spawn(move || {
            // Bounded: no test opens more than a handful, nor lasts this long.
            let until = Instant::now() + CONN_LIFETIME;
            while Instant::now() < until && count.load(SeqCst) < 64 {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let n = count.fetch_add(1, SeqCst);
                        let (steps, log) = (script(n), Arc::clone(&log));
                        std::thread::spawn(move || serve(stream, n, &steps, &log));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Self {
            addr,
            accepted,
            seen,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(SeqCst)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// Answers each request on `stream` from `steps`.
fn serve(stream: TcpStream, conn: usize, steps: &[Step], seen: &Mutex<Vec<Seen>>) {
    let Some(mut wire) = Wire::new(stream) else {
        return;
    };
    for i in 0..100 {
        let Some(head) = wire.head() else { return };
        if let Step::Refuse(answer) = &steps[i.min(steps.len() - 1)] {
            seen.lock().unwrap().push(Seen {
                conn,
                head: String::from_utf8_lossy(&head).into_owned(),
                body: Vec::new(),
            });
            wire.write_parts(&[(Duration::ZERO, answer.clone())]);
            // Closed with the body unread: the kernel resets the connection.
            return;
        }
        let Some(body) = wire.body(&head, false) else {
            return;
        };
        seen.lock().unwrap().push(Seen {
            conn,
            head: String::from_utf8_lossy(&head).into_owned(),
            body: body.clone(),
        });
        match &steps[i.min(steps.len() - 1)] {
            Step::Keep(parts) => {
                if !wire.write_parts(parts) {
                    return;
                }
            }
            Step::Close(parts) => {
                wire.write_parts(parts);
                return;
            }
            Step::Refuse(_) => unreachable!("answered before the body"),
            Step::Echo => {
                let text = format!("{} {:016x}", body.len(), fnv(&body));
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{text}",
                    text.len()
                );
                if !wire.write_parts(&[(Duration::ZERO, answer.into_bytes())]) {
                    return;
                }
            }
        }
    }
}

/// One end of a connection, read by HTTP/1.1 framing; every read is under
/// [`IO_TIMEOUT`] and the connection's life under [`CONN_LIFETIME`].
struct Wire {
    stream: TcpStream,
    buf: Vec<u8>,
    until: Instant,
}

impl Wire {
    fn new(stream: TcpStream) -> Option<Self> {
        stream.set_nonblocking(false).ok()?;
        stream.set_read_timeout(Some(IO_TIMEOUT)).ok()?;
        stream.set_write_timeout(Some(IO_TIMEOUT)).ok()?;
        Some(Self {
            stream,
            buf: Vec::new(),
            until: Instant::now() + CONN_LIFETIME,
        })
    }

    /// Reads more into the buffer; false at the end, on an error, a timeout
    /// or over the limits.
    fn fill(&mut self) -> bool {
        if self.buf.len() > MAX_BYTES || Instant::now() > self.until {
            return false;
        }
        let mut chunk = [0u8; 16 * 1024];
        match self.stream.read(&mut chunk) {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// The bytes up to the next `\r\n` (taken, the `\r\n` dropped).
    fn line(&mut self) -> Option<Vec<u8>> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = self.buf[..end].to_vec();
                self.buf.drain(..end + 2);
                return Some(line);
            }
            if !self.fill() {
                return None;
            }
        }
    }

    /// A head up to and including its empty line.
    fn head(&mut self) -> Option<Vec<u8>> {
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                return Some(self.buf.drain(..end + 4).collect());
            }
            if !self.fill() {
                return None;
            }
        }
    }

    fn exact(&mut self, n: usize) -> Option<Vec<u8>> {
        while self.buf.len() < n {
            if !self.fill() {
                return None;
            }
        }
        Some(self.buf.drain(..n).collect())
    }

    /// Everything up to the peer's close.
    fn rest(&mut self) -> Vec<u8> {
        while self.fill() {}
        std::mem::take(&mut self.buf)
    }

    /// The body that follows `head`: chunked (decoded, trailers dropped), by
    /// Content-Length, else empty (a request) or up to the close (an answer
    /// when `to_close`). `None` when the framing is broken or cut short.
    fn body(&mut self, head: &[u8], to_close: bool) -> Option<Vec<u8>> {
        let headers = header_lines(head);
        let value = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| String::from_utf8_lossy(v).to_ascii_lowercase())
        };
        if value("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            let mut body = Vec::new();
            // At most a million chunks.
            for _ in 0..1_000_000 {
                let line = self.line()?;
                let size = String::from_utf8_lossy(&line);
                let size = size.split(';').next().unwrap_or("").trim();
                let size = usize::from_str_radix(size, 16).ok()?;
                if size == 0 {
                    // Trailers, up to the empty line.
                    for _ in 0..100 {
                        if self.line()?.is_empty() {
                            return Some(body);
                        }
                    }
                    return None;
                }
                if body.len() + size > MAX_BYTES {
                    return None;
                }
                body.extend(self.exact(size)?);
                if !self.line()?.is_empty() {
                    return None;
                }
            }
            None
        } else if let Some(len) = value("content-length") {
            self.exact(len.trim().parse().ok()?)
        } else if to_close {
            Some(self.rest())
        } else {
            Some(Vec::new())
        }
    }

    fn write_parts(&mut self, parts: &[Part]) -> bool {
        for (pause, bytes) in parts {
            std::thread::sleep(*pause);
            if self.stream.write_all(bytes).is_err() || self.stream.flush().is_err() {
                return false;
            }
        }
        true
    }
}

/// A head's header lines, each `(lower-case name, raw value trimmed)`.
fn header_lines(head: &[u8]) -> Vec<(String, Vec<u8>)> {
    head.split(|&b| b == b'\n')
        .skip(1)
        .filter_map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let colon = line.iter().position(|&b| b == b':')?;
            let name = String::from_utf8_lossy(&line[..colon]).to_ascii_lowercase();
            Some((name, line[colon + 1..].trim_ascii().to_vec()))
        })
        .collect()
}

/// FNV-1a, 64 bits: the origin's checksum of a request body.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `len` bytes that repeat nowhere near (xorshift), the same for a seed.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// `body` chunked in pieces of odd sizes (cycling), sizes spelled in upper
/// and lower case, some with leading zeros and extensions.
fn chunked_odd(body: &[u8]) -> Vec<u8> {
    const SIZES: [usize; 12] = [
        1, 3, 7, 13, 255, 256, 257, 4093, 8191, 16385, 65537, 100_003,
    ];
    let mut out = Vec::with_capacity(body.len() + body.len() / 100 + 64);
    let (mut at, mut i) = (0, 0);
    while at < body.len() {
        let n = SIZES[i % SIZES.len()].min(body.len() - at);
        let size = match i % 4 {
            0 => format!("{n:x}"),
            1 => format!("{n:X}"),
            2 => format!("000{n:x}"),
            _ => format!("{n:x};i={i}"),
        };
        out.extend_from_slice(size.as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&body[at..at + n]);
        out.extend_from_slice(b"\r\n");
        at += n;
        i += 1;
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

// ---------------------------------------------------------------------------
// The node and the visitor.

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
new_tickets_per_address_per_minute = 0

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

/// What a visitor got: status, headers and the body as read (an error when
/// reading it failed).
struct Visit {
    status: u16,
    headers: ureq::http::HeaderMap,
    body: Result<Vec<u8>, String>,
}

/// At most 300 bytes of `bytes`, escaped, for a failure's message.
fn shown(bytes: &[u8]) -> String {
    let mut text = bytes[..bytes.len().min(300)].escape_ascii().to_string();
    if bytes.len() > 300 {
        text.push_str(&format!("... ({} bytes)", bytes.len()));
    }
    text
}

impl std::fmt::Debug for Visit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Visit")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("body", &self.body.as_deref().map(shown))
            .finish()
    }
}

impl Visit {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body, which must have been read to its end.
    fn text(&self) -> String {
        let body = self.body.as_ref().expect("the body reads to its end");
        String::from_utf8_lossy(body).into_owned()
    }
}

fn visit(answer: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Visit {
    try_visit(answer).expect("the node answers")
}

/// [`visit`], or the error when no answer head came.
fn try_visit(
    answer: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
) -> Result<Visit, ureq::Error> {
    let mut resp = answer?;
    Ok(Visit {
        status: resp.status().as_u16(),
        headers: resp.headers().clone(),
        body: resp
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_vec()
            .map_err(|e| e.to_string()),
    })
}

fn get(agent: &ureq::Agent, edge: &Edge) -> Visit {
    visit(agent.get(edge.url("/")).call())
}

/// GET `/` must answer 200 `ok`, with the node's `Via`.
fn get_ok(agent: &ureq::Agent, edge: &Edge, what: &str) {
    let v = get(agent, edge);
    assert_eq!(
        (v.status, v.text().as_str()),
        (200, "ok"),
        "{what}: {v:?}\n{}",
        edge.proc.stderr()
    );
    assert_eq!(v.header("via"), Some(VIA), "{what}");
}

/// An answer read from the node byte for byte.
struct RawAnswer {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    /// The body decoded; `None` when its framing broke or it was cut short.
    body: Option<Vec<u8>>,
}

impl std::fmt::Debug for RawAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = |b: &[u8]| shown(b);
        f.debug_struct("RawAnswer")
            .field("status", &self.status)
            .field(
                "headers",
                &self
                    .headers
                    .iter()
                    .map(|(n, v)| format!("{n}: {}", text(v)))
                    .collect::<Vec<_>>(),
            )
            .field("body", &self.body.as_deref().map(text))
            .finish()
    }
}

impl RawAnswer {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// Writes `request` (which should say `Connection: close`) to the node and
/// reads one answer; to a `HEAD`, everything after the head up to the close.
fn raw_visit(edge: &Edge, request: &[u8]) -> RawAnswer {
    let stream = TcpStream::connect(edge.http).expect("connect to the node");
    let mut wire = Wire::new(stream).expect("socket options");
    wire.stream.write_all(request).expect("write the request");
    let head = wire.head().expect("an answer head");
    let status = head
        .split(|&b| b == b' ')
        .nth(1)
        .and_then(|s| std::str::from_utf8(s).ok())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    RawAnswer {
        status,
        headers: header_lines(&head),
        body: if request.starts_with(b"HEAD ") {
            Some(wire.rest())
        } else {
            wire.body(&head, true)
        },
    }
}

/// The node still proxies: a fresh visitor's GET answers 200 `ok`.
fn still_serving(edge: &Edge) {
    get_ok(&client(), edge, "the node keeps serving");
}

// ---------------------------------------------------------------------------
// Chunked answers.

/// Chunk extensions (a quoted one with `;` and a space inside), trailers.
const CHUNKED_EXT: &[u8] = b"HTTP/1.1 200 OK\r\n\
    Content-Type: text/plain\r\n\
    Transfer-Encoding: chunked\r\n\
    Trailer: X-Sum, X-Note\r\n\r\n\
    5;name=value\r\nhello\r\n\
    6;quoted=\"a;b c\";flag\r\n world\r\n\
    1;x=y\r\n!\r\n\
    0;last=yes\r\n\
    X-Sum: 12\r\n\
    X-Note: trailers end here\r\n\r\n";

#[test]
fn a_chunked_answer_with_extensions_and_trailers_arrives_whole() {
    let dir = TempDir::new("exchange-chunked-ext");
    // Each connection: the answer, then `REUSED` (whose framing a client
    // that misread the trailers would stumble on).
    let origin = Origin::start(|_| vec![keep(CHUNKED_EXT), keep(REUSED)]);
    let edge = node(&dir, origin.addr);
    let agent = client();
    let v = get(&agent, &edge);
    assert_eq!(v.status, 200, "{v:?}");
    assert_eq!(v.text(), "hello world!");
    assert_eq!(v.header("via"), Some(VIA));
    assert_eq!(v.header("content-type"), Some("text/plain"));
    assert!(
        matches!(v.header("content-length"), None | Some("12")),
        "{v:?}"
    );
    // The next request: the connection reused or not, a clean answer.
    let v = get(&agent, &edge);
    assert_eq!(v.status, 200, "{v:?}");
    let text = v.text();
    assert!(text == "hello world!" || text == "REUSED", "{text:?}");

    // A visitor that accepts trailers gets the body whole too.
    let answer = raw_visit(
        &edge,
        b"GET / HTTP/1.1\r\nHost: shop.example\r\nTE: trailers\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(
        matches!(answer.body.as_deref(), Some(b"hello world!" | b"REUSED")),
        "{answer:?}"
    );
}

#[test]
fn a_connection_is_reused_after_a_chunked_answer_with_trailers() {
    let dir = TempDir::new("exchange-trailers-reuse");
    let origin = Origin::start(|_| vec![keep(CHUNKED_EXT)]);
    let edge = node(&dir, origin.addr);
    let agent = client();
    for i in 0..3 {
        let v = get(&agent, &edge);
        assert_eq!(v.status, 200, "request {i}: {v:?}");
        assert_eq!(v.text(), "hello world!", "request {i}");
    }
    assert_eq!(
        origin.accepted(),
        1,
        "the trailers were read to their end and the connection reused"
    );
}

/// A response-smuggling attempt: chunked and a Content-Length of `len`. By
/// chunked (which wins, RFC 9112 §6.3) the body is 16 bytes; by the length
/// it would be something else.
fn chunked_and_length(len: usize) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nTransfer-Encoding: chunked\r\n\r\n\
         10\r\n0123456789abcdef\r\n0\r\n\r\n"
    )
    .into_bytes()
}

#[test]
fn a_chunked_answer_that_also_carries_a_content_length_reaches_the_visitor_decoded() {
    let dir = TempDir::new("exchange-te-cl-body");
    // Connection 0: a length shorter than the body; connection 1: longer;
    // the others (each of the two is used once) answer plainly.
    let origin = Origin::start(|n| match n {
        0 => vec![keep(&chunked_and_length(3))],
        1 => vec![keep(&chunked_and_length(40))],
        _ => vec![keep(OK)],
    });
    let edge = node(&dir, origin.addr);
    for case in 0..2 {
        let v = get(&client(), &edge);
        assert_eq!(v.status, 200, "case {case}: {v:?}");
        assert!(
            matches!(v.header("content-length"), None | Some("16")),
            "case {case}: the origin's Content-Length must not frame the visitor's answer: {v:?}"
        );
        assert_eq!(v.text(), "0123456789abcdef", "case {case}");
    }
    still_serving(&edge);
}

#[test]
fn a_chunked_answer_that_also_carries_a_content_length_is_not_followed_on_its_connection() {
    let dir = TempDir::new("exchange-te-cl-reuse");
    // The first connection answers the smuggling attempt (a length longer
    // than the body: the visitor's answer breaks off, but the origin's
    // chunked body is read to its end), then (if it is used again)
    // `REUSED`; every later connection answers `ok`.
    let origin = Origin::start(|n| {
        if n == 0 {
            vec![keep(&chunked_and_length(40)), keep(REUSED)]
        } else {
            vec![keep(OK)]
        }
    });
    let edge = node(&dir, origin.addr);
    let agent = client();
    let first = try_visit(agent.get(edge.url("/")).call());
    assert!(
        first.as_ref().map_or(true, |v| v.status == 200),
        "{first:?}"
    );
    get_ok(&agent, &edge, "the request after the smuggling attempt");
    assert_eq!(
        origin.accepted(),
        2,
        "a connection whose framing was ambiguous is closed after its answer (RFC 9112 §6.3)"
    );
}

#[test]
fn conflicting_or_malformed_content_lengths_are_a_502_and_the_node_keeps_serving() {
    const BAD: [&[u8]; 4] = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok!",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\nok!",
        b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nok",
    ];
    let dir = TempDir::new("exchange-two-lengths");
    // Connection n < 4 answers bad case n, then `REUSED` if used again.
    let origin = Origin::start(|n| match BAD.get(n) {
        Some(bad) => vec![keep(bad), keep(REUSED)],
        None => vec![keep(OK)],
    });
    let edge = node(&dir, origin.addr);
    let agent = client();
    for (i, bad) in BAD.iter().enumerate() {
        let v = get(&agent, &edge);
        assert_eq!(
            v.status,
            502,
            "case {i} ({}): {v:?}",
            String::from_utf8_lossy(bad)
        );
        assert!(v.text().contains("not answering"), "case {i}: {v:?}");
    }
    get_ok(&agent, &edge, "after the bad answers");
    assert_eq!(
        origin.accepted(),
        BAD.len() + 1,
        "no connection that answered a bad length is used again"
    );
}

// ---------------------------------------------------------------------------
// Interim and bodiless answers.

#[test]
fn interim_100_and_103_answers_before_the_final_one_are_passed_over() {
    const INTERIM: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n\
        HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload; as=style\r\n\r\n";
    const FINAL: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Final: 1\r\n\r\nfinal";
    let dir = TempDir::new("exchange-interim");
    let origin = Origin::start(|_| {
        let together = [INTERIM, FINAL].concat();
        vec![
            // All in one write.
            Step::Keep(vec![(Duration::ZERO, together)]),
            // The interim answers, a pause, then the final one.
            Step::Keep(vec![
                (Duration::ZERO, INTERIM.to_vec()),
                (Duration::from_millis(100), FINAL.to_vec()),
            ]),
            // Two 100s, each written on its own.
            Step::Keep(vec![
                (Duration::ZERO, b"HTTP/1.1 100 Continue\r\n\r\n".to_vec()),
                (
                    Duration::from_millis(20),
                    b"HTTP/1.1 100 Continue\r\n\r\n".to_vec(),
                ),
                (Duration::from_millis(20), FINAL.to_vec()),
            ]),
        ]
    });
    let edge = node(&dir, origin.addr);
    let agent = client();
    for i in 0..3 {
        let v = get(&agent, &edge);
        assert_eq!(v.status, 200, "request {i}: {v:?}");
        assert_eq!(v.text(), "final", "request {i}");
        assert_eq!(v.header("x-final"), Some("1"), "request {i}");
        assert_eq!(v.header("content-length"), Some("5"), "request {i}");
        assert_eq!(v.header("via"), Some(VIA));
    }
    assert_eq!(origin.accepted(), 1, "interim answers keep the connection");
}

/// An origin that streams `103 Early Hints` without end (one every 10 ms
/// for 4 s, past the room's 3 s `origin_timeout_ms`) is refused as an invalid
/// answer once it passes the bound of interim answers: a `502` saying the
/// origin could not be reached, where without the bound the node parsed
/// until the timeout (`origin_timeout`). Exactly `MAX_INTERIM` interim
/// answers before the final one pass; one more is refused, and the
/// connection is not used again.
#[test]
fn an_origin_that_sends_interim_answers_without_end_is_refused_before_its_timeout() {
    use waitroom_edge::origin_h1::MAX_INTERIM;
    const EARLY: &[u8] = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n";
    let dir = TempDir::new("exchange-endless-interim");
    let origin = Origin::start(|conn| match conn {
        0 => vec![Step::Close(
            (0..400)
                .map(|_| (Duration::from_millis(10), EARLY.to_vec()))
                .collect(),
        )],
        1 => vec![
            keep(&[EARLY.repeat(MAX_INTERIM), OK.to_vec()].concat()),
            keep(&[EARLY.repeat(MAX_INTERIM + 1), OK.to_vec()].concat()),
            keep(REUSED),
        ],
        _ => vec![keep(OK)],
    });
    let edge = node(&dir, origin.addr);
    let agent = client();
    let v = get(&agent, &edge);
    assert_eq!(v.status, 502, "{v:?}");
    assert!(v.text().contains("origin_unreachable"), "{v:?}");
    assert!(!v.text().contains("origin_timeout"), "{v:?}");
    get_ok(&agent, &edge, "as many interim answers as the bound allows");
    let v = get(&agent, &edge);
    assert_eq!(v.status, 502, "one interim answer over the bound: {v:?}");
    assert!(v.text().contains("origin_unreachable"), "{v:?}");
    get_ok(&agent, &edge, "after the refused answers");
    assert_eq!(
        origin.accepted(),
        3,
        "a refused answer's connection is closed"
    );
}

#[test]
fn no_content_and_not_modified_answers_have_no_body_and_keep_the_connection() {
    // A 304's Content-Length is the length the representation would have:
    // nothing follows it on the wire.
    const NO_CONTENT: &[u8] = b"HTTP/1.1 204 No Content\r\nX-Kind: 204\r\n\r\n";
    const NOT_MODIFIED: &[u8] =
        b"HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nContent-Length: 5\r\nX-Kind: 304\r\n\r\n";
    let dir = TempDir::new("exchange-bodiless");
    let origin = Origin::start(|_| vec![keep(NO_CONTENT), keep(NOT_MODIFIED), keep(OK)]);
    let edge = node(&dir, origin.addr);
    let agent = client();
    let v = get(&agent, &edge);
    assert_eq!(v.status, 204, "{v:?}");
    assert_eq!(v.header("x-kind"), Some("204"));
    assert_eq!(v.header("via"), Some(VIA));
    assert_eq!(v.text(), "");
    let v = get(&agent, &edge);
    assert_eq!(v.status, 304, "{v:?}");
    assert_eq!(v.header("x-kind"), Some("304"));
    assert_eq!(v.header("etag"), Some("\"v1\""));
    assert_eq!(v.text(), "");
    get_ok(&agent, &edge, "after the bodiless answers");
    assert_eq!(
        origin.accepted(),
        1,
        "neither a 204 nor a 304 (whatever its Content-Length) has a body to wait for"
    );
}

#[test]
fn a_head_answer_with_a_content_length_has_no_body_and_keeps_the_connection() {
    const HEAD: &[u8] =
        b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nContent-Type: text/plain\r\n\r\n";
    let dir = TempDir::new("exchange-head");
    let origin = Origin::start(|_| vec![keep(HEAD), keep(OK), keep(HEAD)]);
    let edge = node(&dir, origin.addr);
    let agent = client();
    let started = Instant::now();
    let v = visit(agent.head(edge.url("/")).call());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "a HEAD answer's length is not waited for"
    );
    assert_eq!(v.status, 200, "{v:?}");
    assert_eq!(
        v.header("content-length"),
        Some("1000"),
        "the length a GET would have"
    );
    assert_eq!(v.header("via"), Some(VIA));
    get_ok(&agent, &edge, "the GET after the HEAD");
    let seen = origin.seen();
    assert_eq!(seen[0].method(), "HEAD", "{seen:?}");
    assert_eq!(
        origin.accepted(),
        1,
        "the connection is reused after a HEAD"
    );

    // Raw, to see that nothing follows the head on the visitor's connection.
    let answer = raw_visit(
        &edge,
        b"HEAD / HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.header("content-length"), Some(&b"1000"[..]));
    assert_eq!(
        answer.body.as_deref(),
        Some(&b""[..]),
        "nothing after a HEAD answer's head"
    );
}

// ---------------------------------------------------------------------------
// Close-delimited answers.

/// A close-delimited body, written in two parts.
fn close_delimited(status_line: &str, n: usize) -> Step {
    let head = format!("{status_line}\r\nContent-Type: text/plain\r\n\r\n").into_bytes();
    let body = close_body(n);
    let (a, b) = body.split_at(body.len() / 3);
    Step::Close(vec![
        (Duration::ZERO, [head.as_slice(), a].concat()),
        (Duration::from_millis(50), b.to_vec()),
    ])
}

fn close_body(n: usize) -> Vec<u8> {
    let mut body = format!("connection {n}\n").into_bytes();
    body.extend(noise(20_000, n as u64 + 7));
    body
}

#[test]
fn an_http_1_0_answer_delimited_by_its_close_arrives_whole_on_a_connection_used_once() {
    let dir = TempDir::new("exchange-http10");
    let origin = Origin::start(|n| vec![close_delimited("HTTP/1.0 200 OK", n)]);
    let edge = node(&dir, origin.addr);
    let agent = client();
    for i in 0..2 {
        let v = get(&agent, &edge);
        assert_eq!(v.status, 200, "request {i}: {v:?}");
        assert_eq!(v.header("via"), Some(VIA));
        assert!(
            v.body.as_ref().is_ok_and(|b| *b == close_body(i)),
            "request {i}: the whole body up to the origin's close: {:?}",
            v.body.as_ref().map(Vec::len)
        );
    }
    assert_eq!(origin.accepted(), 2, "one connection per answer");
}

#[test]
fn an_http_1_1_answer_without_length_arrives_whole_on_a_connection_used_once() {
    let dir = TempDir::new("exchange-close-delimited");
    let origin = Origin::start(|n| vec![close_delimited("HTTP/1.1 200 OK", n)]);
    let edge = node(&dir, origin.addr);
    let agent = client();
    for i in 0..2 {
        let v = get(&agent, &edge);
        assert_eq!(v.status, 200, "request {i}: {v:?}");
        assert!(
            v.body.as_ref().is_ok_and(|b| *b == close_body(i)),
            "request {i}: the whole body up to the origin's close: {:?}",
            v.body.as_ref().map(Vec::len)
        );
    }
    assert_eq!(origin.accepted(), 2, "one connection per answer");
}

#[test]
fn an_answer_with_connection_close_is_not_followed_on_its_connection() {
    // The origin says close but leaves the socket open: the node must not
    // send another request on it.
    const CLOSING: &[u8] = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok";
    let dir = TempDir::new("exchange-connection-close");
    let origin = Origin::start(|n| {
        if n == 0 {
            vec![keep(CLOSING), keep(REUSED)]
        } else {
            vec![keep(OK)]
        }
    });
    let edge = node(&dir, origin.addr);
    let agent = client();
    for i in 0..2 {
        get_ok(&agent, &edge, &format!("request {i}"));
    }
    assert_eq!(origin.accepted(), 2);
}

// ---------------------------------------------------------------------------
// Bytes where none belong.

#[test]
fn bytes_after_a_complete_answer_never_reach_a_visitor_as_an_answer() {
    // A response-splitting attempt: a second, unasked answer after the first.
    const SPLIT: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSMUGGLED";
    let dir = TempDir::new("exchange-extra-bytes");
    let origin = Origin::start(|n| {
        if n == 0 {
            // In the same write as the answer.
            vec![keep(&[OK, SPLIT].concat())]
        } else {
            // 50 ms after it, while the connection is idle.
            vec![Step::Keep(vec![
                (Duration::ZERO, OK.to_vec()),
                (Duration::from_millis(50), SPLIT.to_vec()),
            ])]
        }
    });
    let edge = node(&dir, origin.addr);
    let agent = client();
    let mut bodies = Vec::new();
    // Each request 400 ms after the last answer: whatever a connection had
    // to say unasked has arrived before the node could send it another
    // request (after that, unasked bytes cannot be told from an answer).
    for i in 0..3 {
        let mut got_ok = false;
        // At worst one failure, then `ok`.
        for _ in 0..2 {
            std::thread::sleep(Duration::from_millis(400));
            let v = get(&agent, &edge);
            let text = String::from_utf8_lossy(v.body.as_deref().unwrap_or_default());
            bodies.push((v.status, text.clone().into_owned()));
            assert!(
                !text.contains("SMUGGLED"),
                "request {i}: the unasked answer reached a visitor: {bodies:?}"
            );
            if v.status == 200 && text == "ok" {
                got_ok = true;
                break;
            }
            assert_eq!(v.status, 502, "request {i}: {v:?}");
        }
        assert!(got_ok, "request {i}: {bodies:?}");
    }
    // A connection that spoke unasked is not sent another request, or at
    // worst one that fails (a 502).
    let seen = origin.seen();
    let reused = (0..origin.accepted())
        .filter(|n| seen.iter().filter(|s| s.conn == *n).count() > 1)
        .count();
    let failed = bodies.iter().filter(|(status, _)| *status == 502).count();
    eprintln!("answers {bodies:?}; connections used again: {reused}");
    assert!(reused <= failed, "{bodies:?}, {seen:?}");
}

#[test]
fn an_invalid_chunk_size_never_gives_the_visitor_a_complete_body() {
    const BROKEN: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
        5\r\nhello\r\nzz\r\n world\r\n0\r\n\r\n";
    const BROKEN_FIRST: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
        zz\r\nhello world\r\n0\r\n\r\n";
    let dir = TempDir::new("exchange-bad-chunk");
    let origin = Origin::start(|n| match n {
        0 => vec![keep(BROKEN), keep(REUSED)],
        1 => vec![keep(BROKEN_FIRST), keep(REUSED)],
        _ => vec![keep(OK)],
    });
    let edge = node(&dir, origin.addr);
    let agent = client();
    for case in 0..2 {
        // No head at all (the node closed the visitor's connection) is an
        // error the visitor sees too.
        let v = match try_visit(agent.get(edge.url("/")).call()) {
            Ok(v) => v,
            Err(err) => {
                eprintln!("case {case}: no answer head: {err}");
                continue;
            }
        };
        eprintln!("case {case}: {v:?}");
        match v.status {
            // The head went out before the bad line came: the body must
            // break off, not end as if complete.
            200 => assert!(
                v.body.is_err(),
                "case {case}: a broken chunked body ended cleanly: {v:?}"
            ),
            502 => {}
            other => panic!("case {case}: status {other}: {v:?}"),
        }
    }
    for i in 0..2 {
        get_ok(&client(), &edge, &format!("after the broken bodies, {i}"));
    }
    assert_eq!(
        origin.accepted(),
        3,
        "no connection with broken framing is used again"
    );
}

#[test]
fn obs_text_in_an_answer_header_passes_through_or_is_refused_cleanly() {
    const OBS: &[u8] =
        b"HTTP/1.1 200 OK\r\nX-Obs: caf\xe9 \x80\xff end\r\nContent-Length: 2\r\n\r\nok";
    let dir = TempDir::new("exchange-obs-text");
    let origin = Origin::start(|_| vec![keep(OBS)]);
    let edge = node(&dir, origin.addr);
    let answer = raw_visit(
        &edge,
        b"GET / HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n",
    );
    eprintln!("{answer:?}");
    match answer.status {
        200 => {
            assert_eq!(answer.body.as_deref(), Some(&b"ok"[..]), "{answer:?}");
            // Forwarded, it is forwarded as it came: not re-encoded.
            if let Some(value) = answer.header("x-obs") {
                assert_eq!(value, b"caf\xe9 \x80\xff end", "{answer:?}");
            }
        }
        502 => {}
        other => panic!("status {other}: {answer:?}"),
    }
    still_serving(&edge);
}

#[test]
fn folded_header_lines_are_refused_or_unfolded() {
    const FOLDED: &[u8] =
        b"HTTP/1.1 200 OK\r\nX-Folded: first\r\n second\r\nContent-Length: 2\r\n\r\nok";
    let dir = TempDir::new("exchange-obs-fold");
    let origin = Origin::start(|n| {
        if n == 0 {
            vec![keep(FOLDED), keep(REUSED)]
        } else {
            vec![keep(OK)]
        }
    });
    let edge = node(&dir, origin.addr);
    let answer = raw_visit(
        &edge,
        b"GET / HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n",
    );
    eprintln!("{answer:?}");
    // RFC 9112 §5.2: a proxy answers 502 or replaces the fold with spaces.
    match answer.status {
        502 => {}
        200 => {
            let value = answer.header("x-folded").expect("the folded header");
            assert!(
                !value.contains(&b'\n') && value.ends_with(b"second"),
                "{answer:?}"
            );
            assert!(
                answer.headers.iter().all(|(n, _)| !n.starts_with(' ')),
                "a fold reached the visitor: {answer:?}"
            );
        }
        other => panic!("status {other}: {answer:?}"),
    }
    still_serving(&edge);
}

#[test]
fn status_codes_and_reason_phrases_pass_through() {
    const ANSWERS: [(&[u8], u16, &str); 4] = [
        (
            b"HTTP/1.1 404 Not Here\r\nContent-Length: 4\r\n\r\nnope",
            404,
            "nope",
        ),
        (
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 7\r\nContent-Length: 4\r\n\r\nbusy",
            503,
            "busy",
        ),
        // An empty reason phrase, and none at all.
        (
            b"HTTP/1.1 200 \r\nContent-Length: 5\r\n\r\nempty",
            200,
            "empty",
        ),
        (
            b"HTTP/1.1 201\r\nContent-Length: 4\r\n\r\nnone",
            201,
            "none",
        ),
    ];
    let dir = TempDir::new("exchange-statuses");
    let origin = Origin::start(|_| ANSWERS.iter().map(|(a, _, _)| keep(a)).collect());
    let edge = node(&dir, origin.addr);
    let agent = client();
    for (raw, status, body) in ANSWERS {
        let v = get(&agent, &edge);
        let what = String::from_utf8_lossy(raw);
        assert_eq!(v.status, status, "{what}: {v:?}");
        assert_eq!(v.text(), body, "{what}");
        assert_eq!(v.header("via"), Some(VIA), "{what}");
    }
    assert_eq!(origin.accepted(), 1);
}

#[test]
fn what_an_answer_says_of_its_own_hop_stays_with_the_node() {
    // Hop-by-hop fields (RFC 9110 §7.6.1): `Connection`, `Keep-Alive` and
    // what a `Connection` names describe the origin's connection to the
    // node. The visitor gets none of them (in either spelling, on either
    // line), every other field passes, and the node keeps or closes its
    // connection as they say.
    const ANSWERS: [&[u8]; 3] = [
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nX-Kept: 1\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nconnection: X-Private\r\nX-Private: secret\r\nCONNECTION: Keep-Alive\r\nkeep-alive: max=9\r\nX-Kept: 2\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nX-Kept: 3\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
    ];
    let dir = TempDir::new("exchange-hop-fields");
    let origin = Origin::start(|n| {
        if n == 0 {
            ANSWERS.iter().map(|a| keep(a)).collect()
        } else {
            vec![keep(OK)]
        }
    });
    let edge = node(&dir, origin.addr);
    let agent = client();
    for (i, raw) in ANSWERS.iter().enumerate() {
        let v = get(&agent, &edge);
        let what = String::from_utf8_lossy(raw);
        assert_eq!(v.status, 200, "{what}: {v:?}");
        assert_eq!(v.text(), "ok", "{what}");
        assert_eq!(
            v.header("x-kept"),
            Some(&*(i + 1).to_string()),
            "{what}: {v:?}"
        );
        for gone in ["connection", "keep-alive", "x-private"] {
            assert!(v.header(gone).is_none(), "{gone} passed: {what}: {v:?}");
        }
    }
    // The first two kept the connection, the third closed it.
    get_ok(&agent, &edge, "the request after the close");
    assert_eq!(origin.accepted(), 2);
}

#[test]
fn an_http_1_0_answer_with_transfer_encoding_is_not_trusted_for_its_connection() {
    // RFC 9112 §6.1: faulty framing; the connection closes after it.
    const ODD: &[u8] = b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n\
        2\r\nok\r\n0\r\n\r\n";
    let dir = TempDir::new("exchange-http10-te");
    let origin = Origin::start(|n| {
        if n == 0 {
            vec![keep(ODD), keep(REUSED)]
        } else {
            vec![keep(OK)]
        }
    });
    let edge = node(&dir, origin.addr);
    let agent = client();
    let v = get(&agent, &edge);
    eprintln!("{v:?}");
    assert!(matches!(v.status, 200 | 502), "{v:?}");
    get_ok(&agent, &edge, "the request after it");
    assert_eq!(origin.accepted(), 2);
}

// ---------------------------------------------------------------------------
// Bodies both ways.

#[test]
fn a_300_kb_request_body_with_a_content_length_reaches_the_origin_byte_exact() {
    let dir = TempDir::new("exchange-post-length");
    let origin = Origin::start(|_| vec![Step::Echo]);
    let edge = node(&dir, origin.addr);
    let body = noise(300 * 1024, 42);
    let v = visit(client().post(edge.url("/upload")).send(&body[..]));
    assert_eq!(v.status, 200, "{v:?}");
    assert_eq!(v.text(), format!("{} {:016x}", body.len(), fnv(&body)));
    let seen = origin.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].method(), "POST");
    assert!(
        seen[0]
            .head
            .to_ascii_lowercase()
            .contains(&format!("content-length: {}\r\n", body.len())),
        "{}",
        seen[0].head
    );
}

#[test]
fn an_answer_the_origin_gives_before_reading_an_upload_reaches_the_visitor() {
    let dir = TempDir::new("exchange-early-answer");
    // Connection 0 refuses the upload after its head and closes with the
    // body unread; the others answer plainly.
    let origin = Origin::start(|n| {
        if n == 0 {
            vec![Step::Refuse(
                b"HTTP/1.1 413 Content Too Large\r\nContent-Length: 8\r\nConnection: close\r\n\r\ntoo big\n"
                    .to_vec(),
            )]
        } else {
            vec![keep(OK)]
        }
    });
    let edge = node(&dir, origin.addr);
    // Far more than the socket buffers between node and origin hold, so
    // the node's write fails before the body is out. The visitor writes it
    // from a thread of its own and reads the answer meanwhile (a node may
    // answer, and close, before the upload is done).
    let body = noise(12 << 20, 44);
    let stream = TcpStream::connect(edge.http).expect("connect to the node");
    let mut writer = stream.try_clone().expect("clone the socket");
    writer
        .set_write_timeout(Some(IO_TIMEOUT))
        .expect("socket options");
    let upload = std::thread::spawn(move || {
        let head = format!(
            "POST /upload HTTP/1.1\r\nHost: shop.example\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n",
            body.len()
        );
        // Fails once the node stops reading: expected.
        let _ = writer
            .write_all(head.as_bytes())
            .and_then(|()| writer.write_all(&body));
    });
    let mut wire = Wire::new(stream).expect("socket options");
    let head = wire.head().expect("an answer head");
    let head = String::from_utf8_lossy(&head).into_owned();
    assert!(
        head.starts_with("HTTP/1.1 413 "),
        "the origin's refusal, not a 502: {head}"
    );
    drop(wire);
    upload.join().expect("the upload thread ends");
    // The origin answered: it is not marked as failing, and serves on.
    for i in 0..3 {
        get_ok(&client(), &edge, &format!("after the refusal, request {i}"));
    }
}

#[test]
fn a_chunked_request_body_reaches_the_origin_byte_exact() {
    let dir = TempDir::new("exchange-post-chunked");
    let origin = Origin::start(|_| vec![Step::Echo]);
    let edge = node(&dir, origin.addr);
    let body = noise(300 * 1024 + 17, 43);
    let mut request = b"POST /upload HTTP/1.1\r\nHost: shop.example\r\n\
        Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        .to_vec();
    let chunked = chunked_odd(&body);
    // With a trailer field after the last chunk.
    request.extend_from_slice(&chunked[..chunked.len() - 2]);
    request.extend_from_slice(b"X-Checksum: 1\r\n\r\n");
    let answer = raw_visit(&edge, &request);
    assert_eq!(answer.status, 200, "{answer:?}");
    let expected = format!("{} {:016x}", body.len(), fnv(&body));
    assert_eq!(
        answer.body.as_deref(),
        Some(expected.as_bytes()),
        "{answer:?}"
    );
    let seen = origin.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body.len(), body.len());
}

#[test]
fn a_2_mb_answer_with_a_content_length_streams_through_byte_exact() {
    const LEN: usize = 2 << 20;
    let dir = TempDir::new("exchange-big-length");
    let origin = Origin::start(|_| {
        let mut answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {LEN}\r\n\r\n").into_bytes();
        answer.extend(noise(LEN, 5));
        vec![keep(&answer), keep(OK)]
    });
    let edge = node(&dir, origin.addr);
    let agent = client();
    let v = get(&agent, &edge);
    assert_eq!(v.status, 200, "{:?}", v.headers);
    assert_eq!(v.header("content-length"), Some("2097152"));
    let body = v.body.expect("the body reads to its end");
    assert!(
        body == noise(LEN, 5),
        "{} bytes, not the origin's",
        body.len()
    );
    get_ok(&agent, &edge, "after the large answer");
    assert_eq!(origin.accepted(), 1);
}

#[test]
fn a_2_mb_chunked_answer_in_odd_sized_chunks_streams_through_byte_exact() {
    const LEN: usize = (2 << 20) + 11;
    let dir = TempDir::new("exchange-big-chunked");
    let origin = Origin::start(|_| {
        let mut answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        answer.extend(chunked_odd(&noise(LEN, 6)));
        vec![keep(&answer), keep(OK)]
    });
    let edge = node(&dir, origin.addr);
    let agent = client();
    let v = get(&agent, &edge);
    assert_eq!(v.status, 200, "{:?}", v.headers);
    let body = v.body.expect("the body reads to its end");
    assert!(
        body == noise(LEN, 6),
        "{} bytes, not the origin's",
        body.len()
    );
    get_ok(&agent, &edge, "after the large answer");
    assert_eq!(origin.accepted(), 1);
}

#[test]
fn an_answer_trickled_a_few_bytes_at_a_time_arrives_whole() {
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nX-Slow: yes\r\nTransfer-Encoding: chunked\r\n\r\n\
        3\r\nabc\r\n1a;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\n\r\n";
    let dir = TempDir::new("exchange-trickle");
    let origin = Origin::start(|_| {
        // Pieces of 1 to 4 bytes, 2 ms apart: every boundary falls somewhere odd.
        let mut parts = Vec::new();
        let mut rest = ANSWER;
        let mut i = 0;
        while !rest.is_empty() {
            let n = (i % 4 + 1).min(rest.len());
            parts.push((Duration::from_millis(2), rest[..n].to_vec()));
            rest = &rest[n..];
            i += 1;
        }
        vec![Step::Keep(parts)]
    });
    let edge = node(&dir, origin.addr);
    let agent = client();
    for i in 0..2 {
        let v = get(&agent, &edge);
        assert_eq!(v.status, 200, "{v:?}");
        assert_eq!(v.header("x-slow"), Some("yes"));
        assert_eq!(v.text(), "abcabcdefghijklmnopqrstuvwxyz", "request {i}");
    }
    assert_eq!(origin.accepted(), 1);
}

// ---------------------------------------------------------------------------
// Connections the origin closes.

#[test]
fn a_kept_alive_connection_the_origin_closed_while_idle_is_replaced() {
    let dir = TempDir::new("exchange-idle-close");
    // Every connection answers, then closes 100 ms later.
    let origin = Origin::start(|_| {
        vec![Step::Close(vec![
            (Duration::ZERO, OK.to_vec()),
            (Duration::from_millis(100), Vec::new()),
        ])]
    });
    let edge = node(&dir, origin.addr);
    let agent = client();
    get_ok(&agent, &edge, "the first request");
    std::thread::sleep(Duration::from_millis(500));
    get_ok(&agent, &edge, "after the origin closed the idle connection");
    assert_eq!(origin.accepted(), 2);
    assert_eq!(
        origin.seen().len(),
        2,
        "the closed connection got no request"
    );
}

/// An origin whose first connection answers once, then reads the next
/// request and closes without a word (its idle timeout racing the node's
/// request); every later connection answers `ok`.
fn drops_the_second_request() -> Origin {
    Origin::start(|n| {
        if n == 0 {
            vec![keep(OK), Step::Close(Vec::new())]
        } else {
            vec![keep(OK)]
        }
    })
}

#[test]
fn a_get_the_origin_drops_unanswered_on_a_reused_connection_goes_again_on_a_new_one() {
    let dir = TempDir::new("exchange-reused-drop");
    let origin = drops_the_second_request();
    let edge = node(&dir, origin.addr);
    let agent = client();
    get_ok(&agent, &edge, "the first request");
    get_ok(&agent, &edge, "the request the origin dropped");
    let seen = origin.seen();
    let conns: Vec<usize> = seen.iter().map(|s| s.conn).collect();
    assert_eq!(
        conns,
        [0, 0, 1],
        "the dropped GET was sent once more, on a new connection"
    );
    assert_eq!(origin.accepted(), 2);
}

#[test]
fn a_post_the_origin_drops_unanswered_on_a_reused_connection_is_not_sent_twice() {
    let dir = TempDir::new("exchange-post-drop");
    let origin = drops_the_second_request();
    let edge = node(&dir, origin.addr);
    let agent = client();
    get_ok(&agent, &edge, "the first request");
    let v = try_visit(agent.post(edge.url("/order")).send(&b"buy=1"[..]));
    eprintln!("{v:?}");
    assert!(
        v.as_ref().map_or(true, |v| v.status == 502),
        "a POST without an answer is an error: {v:?}"
    );
    let posts: Vec<Seen> = origin
        .seen()
        .into_iter()
        .filter(|s| s.method() == "POST")
        .collect();
    assert_eq!(posts.len(), 1, "a POST is never sent twice: {posts:?}");
    assert_eq!(posts[0].body, b"buy=1");
    still_serving(&edge);
}

#[test]
fn an_answers_fields_reach_the_visitor_as_the_origin_wrote_them_less_its_hop() {
    // The fields of an answer go to the visitor copied from the origin's
    // head (a `GET`: `origin_h1` writes them as lines) or through a map
    // (a `HEAD`, whose length the node cannot state itself): either way
    // every end-to-end field arrives once, repeated ones in the origin's
    // order, the origin's `Date` is the only one, the length is the
    // body's, the node's `Via` is added, and no field of the origin's hop
    // (RFC 9110 §7.6.1, any spelling) passes.
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nServer: scripted\r\nDate: Sun, 29 Nov 2026 12:00:00 GMT\r\n\
        Set-Cookie: a=1\r\nX-Mixed: 1\r\nSET-COOKIE: b=2\r\nTE: trailers\r\nTrailer: X-T\r\nupgrade: h2c\r\n\
        Proxy-Connection: keep-alive\r\nProxy-Authenticate: Basic\r\nPROXY-AUTHORIZATION: x\r\n\
        Keep-Alive: timeout=5\r\nConnection: keep-alive\r\nX-Obs: caf\xe9\r\nContent-Length: 2\r\n\r\nok";
    let dir = TempDir::new("exchange-answer-fields");
    let origin = Origin::start(|_| vec![keep(ANSWER)]);
    let edge = node(&dir, origin.addr);
    for method in ["GET", "HEAD"] {
        let request =
            format!("{method} / HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n");
        let v = raw_visit(&edge, request.as_bytes());
        assert_eq!(v.status, 200, "{method}: {v:?}");
        let all = |name: &str| -> Vec<&[u8]> {
            v.headers
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, value)| value.as_slice())
                .collect()
        };
        assert_eq!(all("server"), [b"scripted"], "{method}: {v:?}");
        assert_eq!(
            all("date"),
            [b"Sun, 29 Nov 2026 12:00:00 GMT"],
            "{method}: {v:?}"
        );
        assert_eq!(all("content-length"), [b"2"], "{method}: {v:?}");
        assert_eq!(all("x-mixed"), [b"1"], "{method}: {v:?}");
        assert_eq!(all("x-obs"), [b"caf\xe9"], "{method}: {v:?}");
        // The origin's two cookies, in its order; the ticket's is not
        // renewed on this visit (a new visitor's own comes first or not at
        // all, and carries the room's name).
        let cookies: Vec<&[u8]> = all("set-cookie")
            .into_iter()
            .filter(|c| c.starts_with(b"a=") || c.starts_with(b"b="))
            .collect();
        assert_eq!(cookies, [b"a=1", b"b=2"], "{method}: {v:?}");
        assert_eq!(all("via"), [VIA.as_bytes()], "{method}: {v:?}");
        for gone in [
            "te",
            "trailer",
            "upgrade",
            "proxy-connection",
            "proxy-authenticate",
            "proxy-authorization",
            "keep-alive",
            "transfer-encoding",
        ] {
            assert!(all(gone).is_empty(), "{method}: {gone} passed: {v:?}");
        }
        // `Connection: close` is the node's own, for the visitor's close.
        assert!(
            all("connection")
                .iter()
                .all(|c| c.eq_ignore_ascii_case(b"close")),
            "{method}: {v:?}"
        );
        let body: &[u8] = if method == "HEAD" { b"" } else { b"ok" };
        assert_eq!(v.body.as_deref(), Some(body), "{method}: {v:?}");
    }
    // One origin connection served both.
    assert_eq!(origin.accepted(), 1);
}
