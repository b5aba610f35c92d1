//! The access log: one line per request, off by default (`[node.access_log]`).
//!
//! Written off the request path, the way nginx's `access_log ... buffer=`
//! is: a worker fills a small [`Record`] (one allocation for the strings it
//! copies out of the request) and `try_send`s it into its own bounded queue;
//! a writer thread drains every worker's queue, formats the lines and writes
//! them in one `write` per batch. A full queue drops the record and counts it
//! (`waitroom_access_log_dropped_total`): a slow disk never slows a visitor.
//!
//! Everything a client sends (path, host, referer, user agent) is escaped
//! and cut to a fixed length before it reaches a line, so no request can
//! break a line or forge another: see docs/OPERATIONS.md, "Access log", for
//! the exact format.
use std::{
    fmt::Write as _,
    fs::File,
    io::Write as _,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
        mpsc::{self, Receiver, SyncSender, TrySendError},
    },
    thread::JoinHandle,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};
use waitroom_common::{
    event::{civil_from_days, format_rfc3339},
    time::{UnixMillis, put_digits},
};

/// The `[node.access_log]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AccessLogConfig {
    /// Off unless set: a launch-day node answers many thousands of requests
    /// a second, and the metrics already count them.
    #[serde(default)]
    pub enabled: bool,
    /// A file (appended to, reopened on SIGHUP for logrotate) or `"stderr"`
    /// (journald under systemd).
    #[serde(default = "default_path")]
    pub path: PathBuf,
    /// `"json"` (one object per line) or `"combined"` (nginx's and Apache's
    /// combined format with waitroom's fields appended).
    #[serde(default)]
    pub format: AccessLogFormat,
    /// Records each worker may hold before the writer takes them; beyond
    /// that they are dropped and counted.
    #[serde(default = "default_queue_per_worker")]
    pub queue_per_worker: usize,
}

fn default_path() -> PathBuf {
    PathBuf::from(STDERR)
}
fn default_queue_per_worker() -> usize {
    8_192
}

/// The `path` that means the process's standard error.
pub const STDERR: &str = "stderr";

impl AccessLogConfig {
    /// Checks what parsing cannot: returns the key (under `access_log`) and why.
    pub fn check(&self) -> Result<(), (String, String)> {
        if self.path.as_os_str().is_empty() {
            return Err((
                "path".into(),
                "must be a file or \"stderr\", not empty".into(),
            ));
        }
        if !(16..=1_048_576).contains(&self.queue_per_worker) {
            return Err((
                "queue_per_worker".into(),
                format!("{} is outside 16 ..= 1048576", self.queue_per_worker),
            ));
        }
        Ok(())
    }

    fn is_stderr(&self) -> bool {
        self.path == Path::new(STDERR)
    }

    /// Opens the file (or stderr) the log goes to: what `--check` and the
    /// start run, so a path that cannot be opened stops the start.
    pub fn open(&self) -> Result<Sink, AccessLogError> {
        if self.is_stderr() {
            return Ok(Sink::Stderr);
        }
        open_file(&self.path).map(Sink::File)
    }
}

fn open_file(path: &Path) -> Result<File, AccessLogError> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| AccessLogError::Open {
            path: path.to_owned(),
            source,
        })
}

/// Why the access log could not start.
#[derive(Debug, thiserror::Error)]
pub enum AccessLogError {
    #[error("node.access_log.path: cannot open {path} for appending: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("node.access_log: cannot start the writer thread: {0}")]
    Thread(std::io::Error),
}

/// The line format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessLogFormat {
    #[default]
    Json,
    Combined,
}

/// Where lines go.
#[derive(Debug)]
pub enum Sink {
    Stderr,
    File(File),
}

impl Sink {
    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            // One locked write per batch: tracing's lines cannot land inside it.
            Self::Stderr => std::io::stderr().lock().write_all(bytes),
            Self::File(f) => f.write_all(bytes),
        }
    }
}

/// What the node did with a request: the `decision` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Outcome {
    /// Proxied to the origin.
    Admitted,
    /// Proxied to the origin without a ticket: the room is `suspended`.
    Suspended,
    /// Proxied to the origin by a bypass rule: no ticket, nothing counted.
    Bypassed,
    /// Answered with the queue page (or its JSON).
    Queued,
    /// The room's queueing method is `reject`: 403.
    Rejected,
    /// Over `new_tickets_per_address_per_minute`: 429, no ticket.
    TooManyNewTickets,
    /// No room covers the host and path: 404.
    #[default]
    NotARoom,
    /// No room covers the host and path; proxied to the default origin
    /// (`[node.unrouted]`): no ticket, nothing counted.
    DefaultOrigin,
    /// The request target could not be normalized: 400.
    BadTarget,
    /// The request already passed this node: 508.
    Loop,
}

impl Outcome {
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Admitted => "admitted",
            Self::Suspended => "suspended",
            Self::Bypassed => "bypassed",
            Self::Queued => "queued",
            Self::Rejected => "rejected",
            Self::TooManyNewTickets => "too_many_new_tickets",
            Self::NotARoom => "not_a_room",
            Self::DefaultOrigin => "default_origin",
            Self::BadTarget => "bad_target",
            Self::Loop => "loop",
        }
    }
}

/// Who the ticket said the visitor was: the `visitor` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VisitorKind {
    New,
    Waiting,
    Admitted,
}

impl VisitorKind {
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::New => "new",
            Self::Waiting => "waiting",
            Self::Admitted => "admitted",
        }
    }
}

impl From<waitroom_common::engine::Visitor> for VisitorKind {
    fn from(v: waitroom_common::engine::Visitor) -> Self {
        use waitroom_common::engine::Visitor;
        match v {
            Visitor::New => Self::New,
            Visitor::Waiting => Self::Waiting,
            Visitor::Admitted => Self::Admitted,
        }
    }
}

/// What the request path learns on its way, for the line: filled in place
/// (on the stack) by `handler::handle`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Trace {
    /// The client after `trusted_proxies` (see `crate::forwarded`).
    pub client: Option<IpAddr>,
    pub outcome: Outcome,
    pub visitor: Option<VisitorKind>,
    /// Index into the node's rooms.
    pub room: Option<u16>,
    /// The ticket's bucket: the minute its queue place was taken.
    pub bucket: Option<u64>,
    pub upstream_status: Option<u16>,
    pub upstream_micros: Option<u64>,
}

/// The longest each copied field may be, bytes; longer ones are cut and end
/// in `...`.
pub const MAX_PATH: usize = 2_048;
pub const MAX_HOST: usize = 256;
pub const MAX_REFERER: usize = 1_024;
pub const MAX_USER_AGENT: usize = 512;

/// One request, as queued for the writer: numbers, and one buffer for the
/// four strings copied out of the request (cut to their limits).
#[derive(Debug, Clone)]
pub struct Record {
    /// Unix time of the request's arrival, microseconds.
    pub time_micros: u64,
    pub client: IpAddr,
    pub method: http::Method,
    pub version: http::Version,
    pub status: u16,
    pub trace: Trace,
    pub total_micros: u64,
    /// The response body's length when known when the head is sent.
    pub bytes: Option<u64>,
    /// host, path, referer, user agent, back to back; `ends` marks where
    /// each one ends.
    text: Vec<u8>,
    ends: [u16; 4],
    /// Which of the four were cut.
    cut: [bool; 4],
}

impl Record {
    /// What the line needs from the request head, taken before the request
    /// path consumes the request.
    #[must_use]
    pub fn from_request<B>(req: &http::Request<B>, client: IpAddr) -> Self {
        // The first value of each of the three fields, in one pass over the
        // request's fields (three keyed lookups cost more for a head of a
        // dozen fields).
        let (mut host_field, mut referer, mut agent) = (None, None, None);
        for (name, value) in req.headers() {
            let slot = match *name {
                http::header::HOST => &mut host_field,
                http::header::REFERER => &mut referer,
                http::header::USER_AGENT => &mut agent,
                _ => continue,
            };
            slot.get_or_insert(value.as_bytes());
        }
        let host = req
            .uri()
            .authority()
            .map(|a| a.as_str().as_bytes())
            .or(host_field)
            .unwrap_or(b"");
        let path = req
            .uri()
            .path_and_query()
            .map_or(b"" as &[u8], |p| p.as_str().as_bytes());
        let (referer, agent) = (referer.unwrap_or(b""), agent.unwrap_or(b""));
        let fields = [
            (host, MAX_HOST),
            (path, MAX_PATH),
            (referer, MAX_REFERER),
            (agent, MAX_USER_AGENT),
        ];
        let mut text = Vec::with_capacity(fields.iter().map(|(f, max)| f.len().min(*max)).sum());
        let mut ends = [0; 4];
        let mut cut = [false; 4];
        for (i, (field, max)) in fields.into_iter().enumerate() {
            text.extend_from_slice(&field[..field.len().min(max)]);
            ends[i] = text.len() as u16;
            cut[i] = field.len() > max;
        }
        Self {
            time_micros: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
            client,
            method: req.method().clone(),
            version: req.version(),
            status: 0,
            trace: Trace::default(),
            total_micros: 0,
            bytes: None,
            text,
            ends,
            cut,
        }
    }

    fn field(&self, i: usize) -> (&[u8], bool) {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        (&self.text[start..self.ends[i] as usize], self.cut[i])
    }

    /// Appends the line (with its newline) to `out`; `rooms` names room indices.
    pub fn format(&self, format: AccessLogFormat, rooms: &[String], out: &mut String) {
        let room = self
            .trace
            .room
            .and_then(|i| rooms.get(usize::from(i)))
            .map(String::as_bytes);
        let (host, path, referer, agent) =
            (self.field(0), self.field(1), self.field(2), self.field(3));
        let client = self.trace.client.unwrap_or(self.client);
        match format {
            AccessLogFormat::Json => {
                out.push_str("{\"time\":\"");
                timestamp(self.time_micros, out);
                out.push_str("\",\"client\":\"");
                push_ip(out, client);
                out.push_str("\",\"method\":");
                json_str(self.method.as_str().as_bytes(), false, out);
                out.push_str(",\"host\":");
                json_str(host.0, host.1, out);
                out.push_str(",\"path\":");
                json_str(path.0, path.1, out);
                out.push_str(",\"protocol\":\"");
                out.push_str(protocol(self.version));
                out.push_str("\",\"status\":");
                push_u64(out, u64::from(self.status));
                out.push_str(",\"decision\":\"");
                out.push_str(self.trace.outcome.label());
                out.push_str("\",\"visitor\":");
                match self.trace.visitor {
                    Some(v) => {
                        out.push('"');
                        out.push_str(v.label());
                        out.push('"');
                    }
                    None => out.push_str("null"),
                }
                out.push_str(",\"room\":");
                match room {
                    Some(r) => json_str(r, false, out),
                    None => out.push_str("null"),
                }
                out.push_str(",\"bucket\":");
                json_opt(self.trace.bucket, out);
                out.push_str(",\"upstream_status\":");
                json_opt(self.trace.upstream_status, out);
                out.push_str(",\"upstream_ms\":");
                match self.trace.upstream_micros {
                    Some(us) => millis(us, out),
                    None => out.push_str("null"),
                }
                out.push_str(",\"total_ms\":");
                millis(self.total_micros, out);
                out.push_str(",\"bytes\":");
                json_opt(self.bytes, out);
                out.push_str(",\"referer\":");
                json_str(referer.0, referer.1, out);
                out.push_str(",\"user_agent\":");
                json_str(agent.0, agent.1, out);
                out.push_str("}\n");
            }
            AccessLogFormat::Combined => {
                push_ip(out, client);
                out.push_str(" - - [");
                clf_time(self.time_micros / 1_000_000, out);
                out.push_str("] \"");
                clf_str(self.method.as_str().as_bytes(), false, out);
                out.push(' ');
                clf_str(path.0, path.1, out);
                out.push(' ');
                out.push_str(protocol(self.version));
                out.push_str("\" ");
                push_u64(out, u64::from(self.status));
                out.push(' ');
                match self.bytes {
                    Some(b) => push_u64(out, b),
                    None => out.push('-'),
                }
                out.push_str(" \"");
                clf_str_or_dash(referer, out);
                out.push_str("\" \"");
                clf_str_or_dash(agent, out);
                out.push_str("\" host=\"");
                clf_str(host.0, host.1, out);
                out.push_str("\" decision=");
                out.push_str(self.trace.outcome.label());
                out.push_str(" visitor=");
                out.push_str(self.trace.visitor.map_or("-", VisitorKind::label));
                out.push_str(" room=\"");
                clf_str(room.unwrap_or(b"-"), false, out);
                out.push_str("\" bucket=");
                clf_opt(self.trace.bucket, out);
                out.push_str(" upstream_status=");
                clf_opt(self.trace.upstream_status, out);
                out.push_str(" upstream_ms=");
                match self.trace.upstream_micros {
                    Some(us) => millis(us, out),
                    None => out.push('-'),
                }
                out.push_str(" total_ms=");
                millis(self.total_micros, out);
                out.push('\n');
            }
        }
    }
}

fn protocol(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_09 => "HTTP/0.9",
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_2 => "HTTP/2.0",
        http::Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/1.1",
    }
}

fn json_opt<T: Into<u64>>(v: Option<T>, out: &mut String) {
    match v {
        Some(v) => push_u64(out, v.into()),
        None => out.push_str("null"),
    }
}

fn clf_opt<T: Into<u64>>(v: Option<T>, out: &mut String) {
    match v {
        Some(v) => push_u64(out, v.into()),
        None => out.push('-'),
    }
}

/// The writer formats a line per request: decimal digits without the
/// `fmt` machinery (`write!` made up most of a line's 7,000 instructions).
fn push_u64(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// `n` as exactly `width` digits, zero-padded (`n` below `10^width`).
fn push_padded(out: &mut String, n: u64, width: usize) {
    let mut digits = [b'0'; 20];
    put_digits(&mut digits[..width], n);
    // SAFETY: ASCII digits keep the string UTF-8 (a `from_utf8` check cost
    // more than the copy, three times a line).
    unsafe { out.as_mut_vec() }.extend_from_slice(&digits[..width]);
}

/// A client address: IPv4 by hand; IPv6 (with its zero-run rules) by
/// `Display`.
fn push_ip(out: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                push_u64(out, u64::from(octet));
            }
        }
        IpAddr::V6(_) => {
            let _ = write!(out, "{ip}");
        }
    }
}

/// Microseconds as milliseconds with three decimals.
fn millis(us: u64, out: &mut String) {
    push_u64(out, us / 1_000);
    out.push('.');
    push_padded(out, us % 1_000, 3);
}

/// A JSON string of arbitrary bytes: printable ASCII as is (`"` and `\`
/// escaped), every other byte as `\u00XX` (so invalid UTF-8 and control
/// characters survive as their byte values and never end a line).
fn json_str(bytes: &[u8], cut: bool, out: &mut String) {
    out.push('"');
    escaped(bytes, out, |b, out| {
        out.push_str("\\u00");
        push_hex(out, b, b"0123456789abcdef");
    });
    if cut {
        out.push_str("...");
    }
    out.push('"');
}

/// A field of the combined format: printable ASCII as is, `"` and `\`
/// backslash-escaped, every other byte as `\xXX` (nginx's escaping).
fn clf_str(bytes: &[u8], cut: bool, out: &mut String) {
    escaped(bytes, out, |b, out| {
        out.push_str("\\x");
        push_hex(out, b, b"0123456789ABCDEF");
    });
    if cut {
        out.push_str("...");
    }
}

/// `bytes` with `"` and `\` backslash-escaped and every byte outside
/// printable ASCII written by `other`; each run of bytes that need nothing
/// is copied whole (a push per byte was about ten instructions a byte, and
/// a browser's line carries hundreds: user agent, referer, path).
fn escaped(mut bytes: &[u8], out: &mut String, other: impl Fn(u8, &mut String)) {
    while !bytes.is_empty() {
        let run = clean_run(bytes);
        // SAFETY: the run is printable ASCII (checked just above), so the
        // string stays UTF-8; `from_utf8` over every run cost more than the
        // copy for a line's short fields.
        unsafe { out.as_mut_vec() }.extend_from_slice(&bytes[..run]);
        let Some(&b) = bytes.get(run) else { break };
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            _ => other(b, out),
        }
        bytes = &bytes[run + 1..];
    }
}

/// Whether the line writes `b` otherwise than as itself.
fn needs_escape(b: u8) -> bool {
    !(0x20..=0x7e).contains(&b) || b == b'"' || b == b'\\'
}

/// How many bytes `bytes` begins with that need no escape: eight at a time
/// (a byte at a time was about ten instructions a byte of a user agent).
fn clean_run(bytes: &[u8]) -> usize {
    let mut words = bytes.chunks_exact(8);
    let mut at = 0;
    for word in words.by_ref() {
        let mask = escape_mask(u64::from_le_bytes(word.try_into().unwrap_or_default()));
        if mask != 0 {
            return at + (mask.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    at + words
        .remainder()
        .iter()
        .position(|&b| needs_escape(b))
        .unwrap_or(words.remainder().len())
}

/// The high bit of each byte of `w` (little-endian) that needs an escape,
/// exact up to the first one: each test below (a byte under 0x20, a byte
/// over 0x7e, `"`, `\`) can also flag a byte after one it flags rightly,
/// through a borrow or a carry, never one before, so the lowest flag is
/// always a byte that needs one.
fn escape_mask(w: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero_byte = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    let below_space = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
    let above_tilde = (w.wrapping_add(ONES) | w) & HIGH;
    below_space
        | above_tilde
        | zero_byte(w ^ (ONES * u64::from(b'"')))
        | zero_byte(w ^ (ONES * u64::from(b'\\')))
}

/// `b` as two hex digits from `digits`.
fn push_hex(out: &mut String, b: u8, digits: &[u8; 16]) {
    out.push(char::from(digits[usize::from(b >> 4)]));
    out.push(char::from(digits[usize::from(b & 0xf)]));
}

fn clf_str_or_dash((bytes, cut): (&[u8], bool), out: &mut String) {
    if bytes.is_empty() {
        out.push('-');
    } else {
        clf_str(bytes, cut, out);
    }
}

/// `2026-11-23T16:45:00.123456Z`.
fn timestamp(micros: u64, out: &mut String) {
    let secs = micros / 1_000_000;
    SECOND.with_borrow_mut(|second| {
        out.push_str(&second.at(secs).iso);
    });
    out.push('.');
    push_padded(out, micros % 1_000_000, 6);
    out.push('Z');
}

/// `23/Nov/2026:16:45:00 +0000`.
fn clf_time(secs: u64, out: &mut String) {
    SECOND.with_borrow_mut(|second| {
        out.push_str(&second.at(secs).clf);
    });
}

thread_local! {
    /// The writer's last second, formatted both ways: a line per request,
    /// and the date and time change once a second.
    static SECOND: std::cell::RefCell<Second> = const {
        std::cell::RefCell::new(Second {
            secs: u64::MAX,
            iso: String::new(),
            clf: String::new(),
        })
    };
}

/// One second's date and time: `2026-11-23T16:45:00` and
/// `23/Nov/2026:16:45:00 +0000`.
#[derive(Debug)]
struct Second {
    secs: u64,
    iso: String,
    clf: String,
}

impl Second {
    fn at(&mut self, secs: u64) -> &Self {
        const MONTHS: [&str; 12] = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        if self.secs != secs {
            let (y, m, d) = civil_from_days((secs / 86_400) as i64);
            let rem = secs % 86_400;
            let (h, min, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
            self.secs = secs;
            // RFC 3339 as the queue page writes it, its `Z` after the
            // fraction instead.
            self.iso = format_rfc3339(UnixMillis(secs.saturating_mul(1_000)));
            self.iso.pop();
            self.clf.clear();
            let _ = write!(
                self.clf,
                "{d:02}/{}/{y:04}:{h:02}:{min:02}:{s:02} +0000",
                MONTHS[(m - 1) as usize]
            );
        }
        self
    }
}

/// A worker's end of the log: where its request path puts records.
#[derive(Debug, Clone)]
pub struct WorkerLog {
    queue: SyncSender<Record>,
    shared: Arc<Shared>,
}

impl WorkerLog {
    /// Queues `record` for the writer, or drops and counts it when the
    /// queue is full (never waits).
    pub fn push(&self, record: Record) {
        match self.queue.try_send(record) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.shared.dropped.fetch_add(1, Relaxed);
            }
        }
    }
}

/// What the workers, the writer and the signal handler share.
#[derive(Debug, Default)]
struct Shared {
    /// `waitroom_access_log_dropped_total`.
    dropped: AtomicU64,
    /// Lines written.
    written: AtomicU64,
    /// SIGHUP: the writer reopens the file before its next batch.
    reopen: AtomicBool,
    stop: AtomicBool,
}

/// The node's access log: off, or each worker's queue and the writer thread.
#[derive(Debug, Default)]
pub struct AccessLog {
    workers: Vec<WorkerLog>,
    shared: Arc<Shared>,
    writer: parking_lot::Mutex<Option<JoinHandle<()>>>,
}

/// How long the writer sleeps between batches when the queues are quiet.
const BATCH_EVERY: Duration = Duration::from_millis(50);

impl AccessLog {
    /// Off: nothing is recorded, no thread runs.
    #[must_use]
    pub fn off() -> Self {
        Self::default()
    }

    /// Opens the sink and starts the writer for `workers` queues; `rooms`
    /// names the rooms by index. Off (no thread) unless `config.enabled`.
    pub fn start(
        config: Option<&AccessLogConfig>,
        workers: usize,
        rooms: Vec<String>,
    ) -> Result<Self, AccessLogError> {
        let Some(config) = config.filter(|c| c.enabled) else {
            return Ok(Self::off());
        };
        let sink = config.open()?;
        let shared = Arc::new(Shared::default());
        let mut receivers = Vec::with_capacity(workers);
        let mut senders = Vec::with_capacity(workers);
        for _ in 0..workers {
            let (tx, rx) = mpsc::sync_channel(config.queue_per_worker);
            senders.push(WorkerLog {
                queue: tx,
                shared: Arc::clone(&shared),
            });
            receivers.push(rx);
        }
        let writer = Writer {
            receivers,
            sink,
            path: (!config.is_stderr()).then(|| config.path.clone()),
            format: config.format,
            rooms,
            shared: Arc::clone(&shared),
        };
        let handle = std::thread::Builder::new()
            .name("waitroom-access-log".into())
            .spawn(move || writer.run())
            .map_err(AccessLogError::Thread)?;
        Ok(Self {
            workers: senders,
            shared,
            writer: parking_lot::Mutex::new(Some(handle)),
        })
    }

    /// Worker `index`'s queue, or `None` when the log is off.
    #[must_use]
    pub fn for_worker(&self, index: usize) -> Option<WorkerLog> {
        self.workers.get(index).cloned()
    }

    /// Records dropped because a worker's queue was full.
    #[must_use]
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Relaxed)
    }

    /// Lines written so far.
    #[must_use]
    pub fn written(&self) -> u64 {
        self.shared.written.load(Relaxed)
    }

    /// Asks the writer to reopen its file (SIGHUP, after logrotate moved it).
    pub fn reopen(&self) {
        self.shared.reopen.store(true, Relaxed);
        if let Some(h) = self.writer.lock().as_ref() {
            h.thread().unpark();
        }
    }

    /// Writes what is queued and stops the writer: after the workers ended.
    pub fn finish(&self) {
        self.shared.stop.store(true, Relaxed);
        if let Some(h) = self.writer.lock().take() {
            h.thread().unpark();
            let _ = h.join();
        }
    }

    /// `waitroom_access_log_dropped_total`, read at scrape time.
    pub fn encode(&self, f: &mut waitroom_runtime::metrics::Families<'_>) -> std::fmt::Result {
        f.counter(
            "waitroom_access_log_dropped_total",
            "Access log records dropped because a worker's queue was full (the writer fell behind).",
            self.dropped(),
        )
    }
}

/// Writes `lines` in one go and empties it.
fn flush(sink: &mut Sink, lines: &mut String) {
    if lines.is_empty() {
        return;
    }
    if let Err(err) = sink.write_all(lines.as_bytes()) {
        static LOG: waitroom_runtime::logging::LogGate =
            waitroom_runtime::logging::LogGate::new(10);
        if let Some(suppressed) = LOG.pass_now() {
            tracing::warn!(%err, suppressed, "access log write failed; lines lost");
        }
    }
    lines.clear();
}

/// The thread that turns records into lines.
#[derive(Debug)]
struct Writer {
    receivers: Vec<Receiver<Record>>,
    sink: Sink,
    /// The file to reopen on SIGHUP; `None` for stderr.
    path: Option<PathBuf>,
    format: AccessLogFormat,
    rooms: Vec<String>,
    shared: Arc<Shared>,
}

impl Writer {
    fn run(mut self) {
        let mut lines = String::with_capacity(64 * 1024);
        loop {
            let stopping = self.shared.stop.load(Relaxed);
            if self.shared.reopen.swap(false, Relaxed) {
                self.reopen();
            }
            let mut n = 0;
            for rx in &self.receivers {
                while let Ok(record) = rx.try_recv() {
                    record.format(self.format, &self.rooms, &mut lines);
                    n += 1;
                    if lines.len() >= 60 * 1024 {
                        flush(&mut self.sink, &mut lines);
                    }
                }
            }
            flush(&mut self.sink, &mut lines);
            self.shared.written.fetch_add(n, Relaxed);
            if stopping {
                return;
            }
            if n == 0 {
                std::thread::park_timeout(BATCH_EVERY);
            }
        }
    }

    fn reopen(&mut self) {
        let Some(path) = &self.path else { return };
        match open_file(path) {
            Ok(f) => self.sink = Sink::File(f),
            Err(err) => {
                tracing::warn!(%err, "access log not reopened; still writing to the old file")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(path: &str, agent: &[u8]) -> Record {
        let mut req = http::Request::get(path).body(()).unwrap();
        req.headers_mut()
            .insert(http::header::HOST, "shop.example".parse().unwrap());
        req.headers_mut().insert(
            http::header::USER_AGENT,
            http::HeaderValue::from_bytes(agent).unwrap(),
        );
        let mut r = Record::from_request(&req, "192.0.2.1".parse().unwrap());
        r.time_micros = 1_709_210_096_123_456;
        r.status = 200;
        r.total_micros = 2_345;
        r.bytes = Some(12);
        r.trace = Trace {
            client: Some("203.0.113.9".parse().unwrap()),
            outcome: Outcome::Admitted,
            visitor: Some(VisitorKind::New),
            room: Some(0),
            bucket: Some(29_000_000),
            upstream_status: Some(200),
            upstream_micros: Some(1_234),
        };
        r
    }

    fn line(r: &Record, format: AccessLogFormat) -> String {
        let mut out = String::new();
        r.format(format, &["shop".into()], &mut out);
        out
    }

    #[test]
    fn a_json_line_holds_every_field() {
        let l = line(&record("/drop?id=7", b"curl/8"), AccessLogFormat::Json);
        assert_eq!(
            l,
            "{\"time\":\"2024-02-29T12:34:56.123456Z\",\"client\":\"203.0.113.9\",\"method\":\"GET\",\
             \"host\":\"shop.example\",\"path\":\"/drop?id=7\",\"protocol\":\"HTTP/1.1\",\"status\":200,\
             \"decision\":\"admitted\",\"visitor\":\"new\",\"room\":\"shop\",\"bucket\":29000000,\
             \"upstream_status\":200,\"upstream_ms\":1.234,\"total_ms\":2.345,\"bytes\":12,\
             \"referer\":\"\",\"user_agent\":\"curl/8\"}\n"
        );
    }

    #[test]
    fn a_combined_line_is_nginx_combined_then_waitrooms_fields() {
        let l = line(&record("/drop?id=7", b"curl/8"), AccessLogFormat::Combined);
        assert_eq!(
            l,
            "203.0.113.9 - - [29/Feb/2024:12:34:56 +0000] \"GET /drop?id=7 HTTP/1.1\" 200 12 \"-\" \"curl/8\" \
             host=\"shop.example\" decision=admitted visitor=new room=\"shop\" bucket=29000000 \
             upstream_status=200 upstream_ms=1.234 total_ms=2.345\n"
        );
    }

    /// The digits written by hand and the second kept from line to line:
    /// lines of several seconds in turn, back and forth, each with its own
    /// time; fractions zero-padded; an IPv6 client as `Display` writes it;
    /// fields absent.
    #[test]
    fn times_numbers_and_addresses_in_turn() {
        let mut r = record("/", b"a");
        let at = |micros: u64, r: &mut Record| {
            r.time_micros = micros;
            line(r, AccessLogFormat::Json)
        };
        let t = 1_709_210_096_000_000; // 2024-02-29T12:34:56Z
        for (micros, time) in [
            (t + 7, "2024-02-29T12:34:56.000007Z"),
            (t + 1_000_000, "2024-02-29T12:34:57.000000Z"),
            (t + 999_999, "2024-02-29T12:34:56.999999Z"),
            (t + 41_104_000_000, "2024-03-01T00:00:00.000000Z"),
            (0, "1970-01-01T00:00:00.000000Z"),
        ] {
            let l = at(micros, &mut r);
            assert!(l.starts_with(&format!("{{\"time\":\"{time}\",")), "{l}");
        }
        r.time_micros = t + 41_104_000_000;
        assert!(line(&r, AccessLogFormat::Combined).contains("[01/Mar/2024:00:00:00 +0000]"));
        r.time_micros = t;
        assert!(line(&r, AccessLogFormat::Combined).contains("[29/Feb/2024:12:34:56 +0000]"));

        r.trace.client = Some("2001:db8::1:0:0:1".parse().unwrap());
        r.total_micros = 1_005;
        r.trace.upstream_micros = Some(5);
        r.trace.bucket = None;
        r.bytes = Some(u64::MAX);
        r.status = 503;
        let l = line(&r, AccessLogFormat::Json);
        for part in [
            "\"client\":\"2001:db8::1:0:0:1\"",
            "\"status\":503,",
            "\"upstream_ms\":0.005,",
            "\"total_ms\":1.005,",
            "\"bucket\":null,",
            "\"bytes\":18446744073709551615,",
        ] {
            assert!(l.contains(part), "{part} in {l}");
        }
        let l = line(&r, AccessLogFormat::Combined);
        assert!(
            l.starts_with("2001:db8::1:0:0:1 - - [")
                && l.contains("\" 503 18446744073709551615 \""),
            "{l}"
        );
        assert!(l.contains(" bucket=- ") && l.ends_with("upstream_ms=0.005 total_ms=1.005\n"));
    }

    /// The line's host, referer and user agent are each the first value the
    /// request carries (a second one, sent to confuse, is not the one
    /// logged); an absolute-form target's authority wins over `Host`.
    #[test]
    fn the_first_of_repeated_fields_is_logged() {
        let mut req = http::Request::get("/a").body(()).unwrap();
        let h = req.headers_mut();
        for (name, value) in [
            (http::header::USER_AGENT, "first-agent"),
            (http::header::HOST, "shop.example"),
            (http::header::REFERER, "https://shop.example/"),
            (http::header::HOST, "evil.example"),
            (http::header::USER_AGENT, "second-agent"),
            (http::header::REFERER, "https://evil.example/"),
        ] {
            h.append(name, value.parse().unwrap());
        }
        let r = Record::from_request(&req, "192.0.2.1".parse().unwrap());
        let v: serde_json::Value = serde_json::from_str(&line(&r, AccessLogFormat::Json)).unwrap();
        assert_eq!(
            (&v["host"], &v["referer"], &v["user_agent"]),
            (
                &serde_json::json!("shop.example"),
                &serde_json::json!("https://shop.example/"),
                &serde_json::json!("first-agent")
            )
        );
        let mut req = http::Request::get("http://absolute.example/a")
            .body(())
            .unwrap();
        req.headers_mut()
            .insert(http::header::HOST, "shop.example".parse().unwrap());
        let r = Record::from_request(&req, "192.0.2.1".parse().unwrap());
        assert!(line(&r, AccessLogFormat::Json).contains(r#""host":"absolute.example""#));
        let r = Record::from_request(
            &http::Request::get("/a").body(()).unwrap(),
            "192.0.2.1".parse().unwrap(),
        );
        assert!(line(&r, AccessLogFormat::Json).contains(r#""host":"","#));
    }

    /// The escapers that copy runs whole write what a byte at a time wrote:
    /// every byte value alone, between and beside printable runs, and
    /// pseudo-random strings of every kind of byte.
    #[test]
    fn runs_copied_whole_escape_as_byte_by_byte() {
        fn reference(bytes: &[u8], json: bool) -> String {
            let mut out = String::new();
            for &b in bytes {
                match b {
                    b'"' => out.push_str("\\\""),
                    b'\\' => out.push_str("\\\\"),
                    0x20..=0x7e => out.push(b as char),
                    _ if json => out.push_str(&format!("\\u{b:04x}")),
                    _ => out.push_str(&format!("\\x{b:02X}")),
                }
            }
            out
        }
        let mut cases: Vec<Vec<u8>> = (0..=255u8)
            .flat_map(|b| [vec![b], vec![b'a', b, b'z', b'z'], vec![b, b, b'/', b]])
            .collect();
        // Every byte at every place of two words and a tail, alone and
        // after each kind of byte that needs an escape.
        for b in 0..=255u8 {
            for at in 0..19 {
                for before in [None, Some(0x1f), Some(0x7f), Some(0xff), Some(b'"')] {
                    let mut bytes = vec![b'~'; 19];
                    bytes[at] = b;
                    if let Some(x) = before.filter(|_| at > 0) {
                        bytes[at - 1] = x;
                    }
                    cases.push(bytes);
                }
            }
        }
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        for len in 0..300 {
            let bytes = (0..len % 97)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Mostly printable, as lines are, with every other kind.
                    match x % 8 {
                        0 => (x >> 8) as u8,
                        1 => b"\"\\"[(x >> 8) as usize % 2],
                        _ => 0x20 + (x >> 8) as u8 % 95,
                    }
                })
                .collect();
            cases.push(bytes);
        }
        for bytes in &cases {
            let mut out = String::new();
            json_str(bytes, false, &mut out);
            assert_eq!(out, format!("\"{}\"", reference(bytes, true)), "{bytes:?}");
            out.clear();
            clf_str(bytes, false, &mut out);
            assert_eq!(out, reference(bytes, false), "{bytes:?}");
        }
    }

    #[test]
    fn hostile_bytes_cannot_end_a_line_or_forge_fields() {
        // What a header value may carry: quotes, backslashes, tabs, obs-text.
        let agent = b"x\" \"forged\t{\"decision\":\"admitted\"}\\\xff\xfe";
        for format in [AccessLogFormat::Json, AccessLogFormat::Combined] {
            let l = line(&record("/a%22b", agent), format);
            assert_eq!(l.matches('\n').count(), 1, "{l}");
            assert!(l.ends_with('\n'));
            assert!(l.is_ascii() && !l.contains('\t'), "{l}");
            // Every quote the client sent is escaped.
            assert!(!l.contains("x\" "), "{l}");
        }
        let l = line(&record("/a", agent), AccessLogFormat::Json);
        let v: serde_json::Value = serde_json::from_str(&l).unwrap();
        assert_eq!(v["decision"], "admitted");
        assert_eq!(
            v["user_agent"],
            "x\" \"forged\t{\"decision\":\"admitted\"}\\\u{ff}\u{fe}"
        );
        let l = line(&record("/a", agent), AccessLogFormat::Combined);
        assert!(
            l.contains(r#""x\" \"forged\x09{\"decision\":\"admitted\"}\\\xFF\xFE""#),
            "{l}"
        );
        // Bytes no header may hold still cannot end a line.
        let mut out = String::new();
        json_str(b"a\r\n\0\x7f", false, &mut out);
        assert_eq!(out, r#""a\u000d\u000a\u0000\u007f""#);
        out.clear();
        clf_str(b"a\r\n\0\x7f", false, &mut out);
        assert_eq!(out, r"a\x0D\x0A\x00\x7F");
    }

    #[test]
    fn long_fields_are_cut_and_marked() {
        let long = format!("/{}", "a".repeat(10_000));
        let r = record(&long, &[b'u'; 5_000]);
        let v: serde_json::Value = serde_json::from_str(&line(&r, AccessLogFormat::Json)).unwrap();
        let path = v["path"].as_str().unwrap();
        assert_eq!(path.len(), MAX_PATH + 3);
        assert!(path.ends_with("aaa..."));
        assert_eq!(v["user_agent"].as_str().unwrap().len(), MAX_USER_AGENT + 3);
        assert!(line(&r, AccessLogFormat::Combined).len() < MAX_PATH + MAX_USER_AGENT + 400);
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::sync_channel(16);
        let worker = WorkerLog {
            queue: tx,
            shared: Arc::clone(&shared),
        };
        for _ in 0..100 {
            worker.push(record("/", b"t"));
        }
        assert_eq!(rx.try_iter().count(), 16);
        assert_eq!(shared.dropped.load(Relaxed), 84);
        let log = Arc::new(AccessLog {
            shared,
            ..AccessLog::off()
        });
        let scraped = Arc::clone(&log);
        let registry = waitroom_runtime::metrics::registry(move |f| scraped.encode(f));
        let out = waitroom_runtime::metrics::encode(&registry);
        assert!(
            out.contains("waitroom_access_log_dropped_total 84\n"),
            "{out}"
        );
    }

    #[test]
    fn the_writer_writes_every_queued_record_and_reopens_its_file() {
        let dir = std::env::temp_dir().join(format!("wr-access-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("access.log");
        let config = AccessLogConfig {
            enabled: true,
            path: path.clone(),
            format: AccessLogFormat::Json,
            queue_per_worker: 64,
        };
        let log = AccessLog::start(Some(&config), 2, vec!["shop".into()]).unwrap();
        assert!(log.for_worker(2).is_none());
        for i in 0..20 {
            log.for_worker(i % 2).unwrap().push(record("/", b"t"));
        }
        // logrotate: the file is moved away, SIGHUP, new lines go to a new file.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while log.written() < 20 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let rotated = dir.join("access.log.1");
        std::fs::rename(&path, &rotated).unwrap();
        log.reopen();
        while path.metadata().is_err() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        for _ in 0..5 {
            log.for_worker(0).unwrap().push(record("/", b"t"));
        }
        log.finish();
        assert_eq!(
            std::fs::read_to_string(&rotated).unwrap().lines().count(),
            20
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 5);
        assert_eq!((log.written(), log.dropped()), (25, 0));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_path_that_cannot_be_opened_is_an_error_naming_the_field() {
        let config = AccessLogConfig {
            enabled: true,
            path: "/nonexistent-dir/access.log".into(),
            format: AccessLogFormat::Json,
            queue_per_worker: 16,
        };
        let err = AccessLog::start(Some(&config), 1, vec![]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("node.access_log.path: cannot open /nonexistent-dir/access.log"),
            "{err}"
        );
        assert!(
            AccessLog::start(None, 1, vec![])
                .unwrap()
                .for_worker(0)
                .is_none()
        );
    }
}
