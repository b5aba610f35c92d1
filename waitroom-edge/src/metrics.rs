//! Node metrics: atomics on the request path, Prometheus families on the
//! admin port.
//!
//! The recording side is ours on purpose: every update is a relaxed atomic
//! add into fixed buckets, so the request path never takes a lock or
//! allocates. The exposition side (`encode`, `snapshot`) runs when the admin
//! listener is scraped (`crate::exposition`), through `prometheus-client`.
use std::{
    fmt,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::Duration,
};

use waitroom_runtime::metrics::{Families, HistogramSnapshot};
pub use waitroom_runtime::metrics::{Histogram, LATENCY_BOUNDS_US};

/// Why a cookie could not be used (each makes a new visitor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CookieFailure {
    Malformed,
    Tampered,
    UnknownKey,
    OtherRoom,
    Expired,
    TooLarge,
}

impl CookieFailure {
    pub const ALL: [Self; 6] = [
        Self::Malformed,
        Self::Tampered,
        Self::UnknownKey,
        Self::OtherRoom,
        Self::Expired,
        Self::TooLarge,
    ];
    pub fn label(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::Tampered => "tampered",
            Self::UnknownKey => "unknown_key",
            Self::OtherRoom => "other_room",
            Self::Expired => "expired",
            Self::TooLarge => "too_large",
        }
    }
}

/// Why the node closed a visitor connection (or that the visitor's side ended it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The client or the protocol ended it: after a response, an error, EOF.
    Ended,
    /// No complete first request head within `header_read_timeout_ms`.
    HeaderTimeout,
    /// No request in flight for `keepalive_timeout_ms`.
    IdleTimeout,
    /// A response write stuck for `send_timeout_ms`.
    SendTimeout,
    /// Over `max_connections_per_address` at accept.
    AddressLimit,
    /// The oldest idle connection, closed to serve a new one at the worker's limit.
    Evicted,
}

impl CloseReason {
    pub const ALL: [Self; 6] = [
        Self::Ended,
        Self::HeaderTimeout,
        Self::IdleTimeout,
        Self::SendTimeout,
        Self::AddressLimit,
        Self::Evicted,
    ];
    pub fn label(self) -> &'static str {
        match self {
            Self::Ended => "ended",
            Self::HeaderTimeout => "header_timeout",
            Self::IdleTimeout => "idle_timeout",
            Self::SendTimeout => "send_timeout",
            Self::AddressLimit => "address_limit",
            Self::Evicted => "evicted",
        }
    }
}

/// What a hostile or broken client tried that the node caught: each is a
/// counter `waitroom_defended_total{reason}` and a log line at most once per
/// ten seconds per reason (see docs/OPERATIONS.md, "What waitroom defends
/// against"). None of them is answered with a 5xx.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defence {
    /// A ticket whose counts were already moved came again (a replayed or
    /// stale cookie): served as its ledger entry says, counters not moved twice.
    TicketReplayed,
    /// An admitted ticket used by more clients than its budget: the request
    /// is treated as a new visitor.
    TicketShared,
    /// A ticket bound to another client network (`ticket_binding`): a new visitor.
    TicketBinding,
    /// Too many new tickets for one client address: 429 with Retry-After.
    NewTicketRate,
    /// The request already passed this node (its own `Via` token): 508.
    Loop,
    /// A PROXY protocol header missing or malformed on a listener that requires one.
    ProxyProtocol,
    /// Client-supplied `Forwarded`/`X-Forwarded-*`/`X-Real-IP` from a peer
    /// outside `trusted_proxies`: removed before the origin sees them.
    ForwardedUntrusted,
    /// `Connection` nominating an end-to-end header the proxy sets (`Host`,
    /// `Via`, `X-Forwarded-For`, ...): the nomination is ignored.
    HopByHopNomination,
}

impl Defence {
    pub const ALL: [Self; 8] = [
        Self::TicketReplayed,
        Self::TicketShared,
        Self::TicketBinding,
        Self::NewTicketRate,
        Self::Loop,
        Self::ProxyProtocol,
        Self::ForwardedUntrusted,
        Self::HopByHopNomination,
    ];

    /// The `reason` label.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::TicketReplayed => "ticket_replayed",
            Self::TicketShared => "ticket_shared",
            Self::TicketBinding => "ticket_binding",
            Self::NewTicketRate => "new_ticket_rate",
            Self::Loop => "loop",
            Self::ProxyProtocol => "proxy_protocol",
            Self::ForwardedUntrusted => "forwarded_untrusted",
            Self::HopByHopNomination => "hop_by_hop_nomination",
        }
    }
}

/// Counts of [`Defence`]s with one rate-limited log gate per reason.
#[derive(Debug)]
pub struct Defences {
    counts: [AtomicU64; Defence::ALL.len()],
    gates: [waitroom_runtime::logging::LogGate; Defence::ALL.len()],
}

impl Default for Defences {
    fn default() -> Self {
        Self {
            counts: Default::default(),
            gates: [const { waitroom_runtime::logging::LogGate::new(10) }; Defence::ALL.len()],
        }
    }
}

impl Defences {
    /// Counts one `what` at `now_secs`; logs `detail` (with the client address
    /// when known) unless this reason logged in the last ten seconds.
    pub fn record(
        &self,
        what: Defence,
        now_secs: u64,
        client: Option<std::net::IpAddr>,
        detail: &str,
    ) {
        let i = what as usize;
        self.counts[i].fetch_add(1, Relaxed);
        if let Some(suppressed) = self.gates[i].pass(now_secs) {
            tracing::warn!(
                reason = what.label(),
                client = client.map(tracing::field::display),
                suppressed,
                "{detail}"
            );
        }
    }

    /// How many of `what` so far.
    #[must_use]
    pub fn count(&self, what: Defence) -> u64 {
        self.counts[what as usize].load(Relaxed)
    }

    /// `waitroom_defended_total{reason=...}`, every reason, zeros included.
    pub fn encode(&self, f: &mut Families<'_>) -> fmt::Result {
        f.counters(
            "waitroom_defended_total",
            "Hostile or broken client behaviour caught, by reason (see OPERATIONS.md, What waitroom defends against).",
            Defence::ALL.map(|what| ([("reason", what.label())], self.count(what))),
        )
    }
}

/// What a room counts per request (`waitroom_*_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoomCount {
    AdmittedNew,
    AdmittedReturning,
    Queued,
    Rejected,
    ProxyErrors,
    /// Requests whose body the client cut short or malformed: a 400, and no
    /// mark against the origin.
    ClientBodyErrors,
    /// Sessions the origin ended with a `revoke` command.
    Revoked,
}

impl RoomCount {
    pub const ALL: [Self; 7] = [
        Self::AdmittedNew,
        Self::AdmittedReturning,
        Self::Queued,
        Self::Rejected,
        Self::ProxyErrors,
        Self::ClientBodyErrors,
        Self::Revoked,
    ];
}

/// What a room times per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Latency {
    /// Open the cookie, decide, seal the new cookie.
    Decision,
    /// Until the origin's response head.
    Proxy,
}

/// One worker's share of a room's counts: plain relaxed atomics only that
/// worker's thread adds to, on cache lines of their own.
#[derive(Debug, Default)]
struct RoomShard {
    counts: [AtomicU64; RoomCount::ALL.len()],
    cookie_failures: [AtomicU64; CookieFailure::ALL.len()],
    decision: LatencyCounts,
    proxy: LatencyCounts,
}

/// A [`Histogram`]'s counts for [`LATENCY_BOUNDS_US`], inline.
#[derive(Debug, Default)]
struct LatencyCounts {
    counts: [AtomicU64; LATENCY_BOUNDS_US.len() + 1],
    sum_ns: AtomicU64,
}

impl LatencyCounts {
    fn observe(&self, d: Duration) {
        let us = d.as_micros() as u64;
        let i = LATENCY_BOUNDS_US.partition_point(|&b| b < us);
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(d.as_nanos() as u64, Relaxed);
    }
}

thread_local! {
    /// The shard this thread adds to: 0 off the workers (the control
    /// runtime, tests), `1 + worker index` (modulo the shards) on a worker.
    static SHARD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Shards per room: one per core the process may use, plus one for every
/// thread that is not a worker. Fixed at first use.
fn shard_count() -> usize {
    static COUNT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *COUNT.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()) + 1)
}

/// Called once on each worker thread: its counts go to a shard of their own
/// (workers beyond the number of cores share).
pub fn enter_worker(index: usize) {
    SHARD.with(|s| s.set(1 + index % (shard_count() - 1)));
}

/// Per-room counters and latency histograms, sharded per worker: each worker
/// adds to its own cache lines (crossbeam's `CachePadded`), the scrape sums
/// the shards. Shared atomics on the request path cost a cache-line transfer
/// between cores whenever two workers count the same room
/// (docs/BENCHMARKS.md); a shard per room is about 500 bytes.
#[derive(Debug)]
pub struct RoomMetrics {
    shards: Box<[crossbeam_utils::CachePadded<RoomShard>]>,
}

impl Default for RoomMetrics {
    fn default() -> Self {
        Self {
            shards: (0..shard_count()).map(|_| Default::default()).collect(),
        }
    }
}

impl RoomMetrics {
    /// This thread's shard.
    fn mine(&self) -> &RoomShard {
        let i = SHARD.with(std::cell::Cell::get);
        &self.shards[i.min(self.shards.len() - 1)]
    }

    /// Counts one `what`.
    pub fn count(&self, what: RoomCount) {
        self.mine().counts[what as usize].fetch_add(1, Relaxed);
    }

    /// Records one `what` lasting `d`.
    pub fn observe(&self, what: Latency, d: Duration) {
        let shard = self.mine();
        match what {
            Latency::Decision => shard.decision.observe(d),
            Latency::Proxy => shard.proxy.observe(d),
        }
    }

    pub fn cookie_failure(&self, why: CookieFailure) {
        let i = CookieFailure::ALL
            .iter()
            .position(|c| *c == why)
            .unwrap_or(0);
        self.mine().cookie_failures[i].fetch_add(1, Relaxed);
    }

    /// How many of `what` so far, every worker's.
    pub fn total(&self, what: RoomCount) -> u64 {
        self.shards
            .iter()
            .map(|s| s.counts[what as usize].load(Relaxed))
            .sum()
    }

    /// Cookie failures of the reason at `i` of [`CookieFailure::ALL`].
    fn cookie_failures(&self, i: usize) -> u64 {
        self.shards
            .iter()
            .map(|s| s.cookie_failures[i].load(Relaxed))
            .sum()
    }

    /// The histogram of `what`, every worker's.
    pub fn snapshot(&self, what: Latency) -> HistogramSnapshot {
        let mut counts = vec![0; LATENCY_BOUNDS_US.len() + 1];
        let mut sum_ns = 0u64;
        for shard in &self.shards {
            let l = match what {
                Latency::Decision => &shard.decision,
                Latency::Proxy => &shard.proxy,
            };
            for (total, c) in counts.iter_mut().zip(&l.counts) {
                *total += c.load(Relaxed);
            }
            sum_ns = sum_ns.wrapping_add(l.sum_ns.load(Relaxed));
        }
        HistogramSnapshot {
            bounds: LATENCY_BOUNDS_US
                .iter()
                .map(|&us| us as f64 / 1e6)
                .collect(),
            counts,
            sum: sum_ns as f64 / 1e9,
        }
    }
}

/// Node-wide counters.
#[derive(Debug, Default)]
pub struct NodeMetrics {
    pub connections_open: AtomicU64,
    pub connections_total: AtomicU64,
    pub requests_unmatched: AtomicU64,
    /// Connections the node's HTTP/1 exchange handed to hyper
    /// (`crate::http::h1`).
    pub connections_to_hyper: AtomicU64,
    /// Closed connections by [`CloseReason`], in the order of `CloseReason::ALL`.
    pub connections_closed: [AtomicU64; 6],
}

impl NodeMetrics {
    pub fn connection_opened(&self) {
        self.connections_open.fetch_add(1, Relaxed);
        self.connections_total.fetch_add(1, Relaxed);
    }
    pub fn connection_closed(&self, why: CloseReason) {
        self.connections_open.fetch_sub(1, Relaxed);
        self.count_close(why);
    }
    /// Counts a close of a connection that was never counted open (refused at accept).
    pub fn count_close(&self, why: CloseReason) {
        self.connections_closed[why as usize].fetch_add(1, Relaxed);
    }
    /// The connection families and the unmatched requests.
    pub fn encode(&self, f: &mut Families<'_>) -> fmt::Result {
        f.gauge(
            "waitroom_connections_open",
            "Open visitor connections.",
            self.connections_open.load(Relaxed),
        )?;
        f.counter(
            "waitroom_connections_total",
            "Visitor connections accepted.",
            self.connections_total.load(Relaxed),
        )?;
        f.counters(
            "waitroom_connections_closed_total",
            "Visitor connections closed, by reason (timeouts, limits, or ended).",
            CloseReason::ALL.map(|why| {
                (
                    [("reason", why.label())],
                    self.connections_closed[why as usize].load(Relaxed),
                )
            }),
        )?;
        f.counter(
            "waitroom_connections_to_hyper_total",
            "Visitor connections handed from the node's own HTTP/1 exchange to hyper's at a request it does not serve itself (a body, an upgrade, HTTP/2, HTTP/1.0, a head it does not find plain).",
            self.connections_to_hyper.load(Relaxed),
        )?;
        f.counter(
            "waitroom_requests_unmatched_total",
            "Requests no room covers.",
            self.requests_unmatched.load(Relaxed),
        )
    }
}

/// Every room's counters and histograms, one family at a time.
pub fn encode_rooms<'a>(
    f: &mut Families<'_>,
    rooms: impl Iterator<Item = (&'a str, &'a RoomMetrics)> + Clone,
) -> fmt::Result {
    let per_room = |what: RoomCount| {
        rooms
            .clone()
            .map(move |(id, m)| ([("room", id)], m.total(what)))
    };
    f.counters(
        "waitroom_admitted_total",
        "Visitors sent to the origin, new (admitted by this request) or returning (with a session).",
        rooms.clone().flat_map(|(id, m)| {
            [
                (
                    [("room", id), ("kind", "new")],
                    m.total(RoomCount::AdmittedNew),
                ),
                (
                    [("room", id), ("kind", "returning")],
                    m.total(RoomCount::AdmittedReturning),
                ),
            ]
        }),
    )?;
    f.counters(
        "waitroom_revoked_total",
        "Sessions the origin ended with a revoke command (their slots freed at once).",
        per_room(RoomCount::Revoked),
    )?;
    f.counters(
        "waitroom_queued_total",
        "Queue pages and JSON answers served.",
        per_room(RoomCount::Queued),
    )?;
    f.counters(
        "waitroom_rejected_total",
        "Visitors refused (queueing method reject).",
        per_room(RoomCount::Rejected),
    )?;
    f.counters(
        "waitroom_proxy_errors_total",
        "Origin requests that failed (502).",
        per_room(RoomCount::ProxyErrors),
    )?;
    f.counters(
        "waitroom_client_body_errors_total",
        "Requests whose body the client cut short or malformed (400; not the origin's fault).",
        per_room(RoomCount::ClientBodyErrors),
    )?;
    f.counters(
        "waitroom_cookie_failures_total",
        "Cookies that could not be used, by reason; each made a new visitor.",
        rooms.clone().flat_map(|(id, m)| {
            CookieFailure::ALL.iter().enumerate().map(move |(i, why)| {
                (
                    [("room", id), ("reason", why.label())],
                    m.cookie_failures(i),
                )
            })
        }),
    )?;
    f.histograms(
        "waitroom_decision_seconds",
        "Time to open the cookie, decide and seal the new cookie.",
        rooms
            .clone()
            .map(|(id, m)| ([("room", id)], m.snapshot(Latency::Decision))),
    )?;
    f.histograms(
        "waitroom_proxy_seconds",
        "Time until the origin's response head.",
        rooms.map(|(id, m)| ([("room", id)], m.snapshot(Latency::Proxy))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(f: impl Fn(&mut Families<'_>) -> fmt::Result + Send + Sync + 'static) -> String {
        waitroom_runtime::metrics::encode(&waitroom_runtime::metrics::registry(f))
    }

    #[test]
    fn histogram_buckets_count_everything() {
        let h = Histogram::new(LATENCY_BOUNDS_US);
        h.observe(Duration::from_nanos(500));
        h.observe(Duration::from_micros(150));
        h.observe(Duration::from_secs(60));
        let s = h.snapshot();
        assert_eq!(s.bounds.len() + 1, s.counts.len());
        assert_eq!(s.bounds[0], 0.000_001);
        assert_eq!(s.counts[0], 1, "500 ns is under 1 µs");
        let le_200us = s.bounds.iter().position(|b| *b == 0.0002).unwrap();
        assert_eq!(s.counts[..=le_200us].iter().sum::<u64>(), 2);
        assert_eq!(s.counts.last(), Some(&1), "60 s is above every bound");
        assert!((s.sum - 60.000_150_5).abs() < 1e-9, "{}", s.sum);
    }

    #[test]
    fn room_counts_from_every_worker_are_summed_at_scrape() {
        for (i, what) in RoomCount::ALL.iter().enumerate() {
            assert_eq!(*what as usize, i);
        }
        let m = std::sync::Arc::new(RoomMetrics::default());
        m.count(RoomCount::Queued);
        m.observe(Latency::Proxy, Duration::from_micros(150));
        std::thread::scope(|s| {
            for worker in 0..3 {
                let m = &m;
                s.spawn(move || {
                    enter_worker(worker);
                    for _ in 0..1_000 {
                        m.count(RoomCount::Queued);
                    }
                    m.observe(Latency::Proxy, Duration::from_secs(60));
                    m.cookie_failure(CookieFailure::Tampered);
                });
            }
        });
        assert_eq!(m.total(RoomCount::Queued), 3_001);
        assert_eq!(m.total(RoomCount::Rejected), 0);
        let s = m.snapshot(Latency::Proxy);
        assert_eq!(s.counts.iter().sum::<u64>(), 4);
        assert_eq!(s.counts.last(), Some(&3), "60 s is above every bound");
        assert!((s.sum - 180.000_150).abs() < 1e-9, "{}", s.sum);
        let out = scrape(move |f| encode_rooms(f, [("shop", &*m)].into_iter()));
        assert!(
            out.contains("waitroom_queued_total{room=\"shop\"} 3001"),
            "{out}"
        );
        assert!(
            out.contains("waitroom_cookie_failures_total{room=\"shop\",reason=\"tampered\"} 3"),
            "{out}"
        );
    }

    #[test]
    fn defences_index_their_own_counter_and_render_every_reason() {
        for (i, what) in Defence::ALL.iter().enumerate() {
            assert_eq!(*what as usize, i);
        }
        let d = std::sync::Arc::new(Defences::default());
        d.record(Defence::Loop, 5, None, "loop");
        d.record(Defence::Loop, 6, None, "loop");
        d.record(Defence::TicketShared, 6, None, "shared");
        assert_eq!(d.count(Defence::Loop), 2);
        let out = scrape(move |f| d.encode(f));
        assert!(out.contains("{reason=\"loop\"} 2"), "{out}");
        assert!(out.contains("{reason=\"ticket_shared\"} 1"), "{out}");
        assert!(out.contains("{reason=\"proxy_protocol\"} 0"), "{out}");
    }

    /// Log lines written while `f` runs (text format, no colour).
    fn logged(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Lines(std::sync::Arc<parking_lot::Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        String::from_utf8(lines.0.lock().clone()).unwrap()
    }

    #[test]
    fn a_warning_repeated_a_thousand_times_is_one_line_then_one_that_counts_the_rest() {
        let d = Defences::default();
        let text = logged(|| {
            for i in 0..1_000 {
                // A flood within one ten-second period (a driven clock).
                d.record(Defence::Loop, 100 + i / 100, None, "loop");
            }
        });
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains("suppressed=0"), "{text}");
        let text = logged(|| d.record(Defence::Loop, 110, None, "loop"));
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains("suppressed=999"), "{text}");
        assert!(text.contains("reason=\"loop\""), "{text}");
        assert_eq!(d.count(Defence::Loop), 1_001);
        // Each reason has its own gate: another one is not held back.
        let text = logged(|| d.record(Defence::TicketShared, 110, None, "shared"));
        assert!(text.contains("suppressed=0"), "{text}");
    }

    #[test]
    fn close_reasons_index_their_own_counter() {
        let m = std::sync::Arc::new(NodeMetrics::default());
        for (i, why) in CloseReason::ALL.iter().enumerate() {
            assert_eq!(*why as usize, i);
        }
        m.connection_opened();
        m.connection_closed(CloseReason::SendTimeout);
        m.count_close(CloseReason::AddressLimit);
        assert_eq!(m.connections_open.load(Relaxed), 0);
        let out = scrape(move |f| m.encode(f));
        assert!(out.contains("{reason=\"send_timeout\"} 1"), "{out}");
        assert!(out.contains("{reason=\"address_limit\"} 1"), "{out}");
        assert!(out.contains("{reason=\"ended\"} 0"), "{out}");
        assert!(out.contains("\nwaitroom_connections_total 1\n"), "{out}");
    }
}
