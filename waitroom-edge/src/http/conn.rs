//! Per-connection bookkeeping: the deadlines nginx and HAProxy put on a
//! client, and the tables that let a worker close its oldest idle connection
//! and a node cap connections per client address.
//!
//! A connection's task sleeps until its next deadline ([`ConnState::next_check`])
//! and asks [`ConnState::overdue`] when it wakes. The request path touches only
//! atomics here: [`InFlight`] when a request head arrives and when its response
//! body is done, [`Watched`] when a write blocks or unblocks. No locks, no
//! allocation per request; the tables below are locked once per connection.
use std::{
    collections::HashMap,
    future::Future,
    hash::{BuildHasher as _, RandomState},
    io,
    net::IpAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{
            AtomicBool, AtomicU32, AtomicU64,
            Ordering::{Relaxed, SeqCst},
        },
    },
    task::{Context, Poll, Wake, Waker},
    time::{Duration, Instant},
};

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use parking_lot::Mutex;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::Notify,
};

use crate::{metrics::CloseReason, node::Settings};

/// What one connection's deadlines are measured from. Times are milliseconds
/// since the worker's epoch plus one, so that 0 can mean "never".
#[derive(Debug)]
pub struct ConnState {
    /// The worker's epoch: every connection of a worker counts from it, so
    /// [`Registry::evict_oldest_idle`] can compare them.
    epoch: Instant,
    /// When the connection was accepted.
    accepted_ms: u64,
    /// Set when the first request head is complete; until then the header
    /// deadline applies.
    first_request: AtomicBool,
    /// Requests whose response body is not yet done.
    in_flight: AtomicU32,
    /// When the last request finished (or the connection was accepted).
    last_active_ms: AtomicU64,
    /// Bytes arrived with no request in flight: the next request's head has
    /// begun, and it has the header deadline on top of the keep-alive one
    /// (nginx: `keepalive_timeout` to the first byte, then
    /// `client_header_timeout`). Cleared when that head is complete.
    head_begun: AtomicBool,
    /// An HTTP/2 connection: its frames between requests (pings, window
    /// updates) are no request head, so no read marks [`Self::head_begun`].
    multiplexed: AtomicBool,
    /// When the current write started to block; 0: not blocked.
    write_blocked_ms: AtomicU64,
    /// Asked to close by [`Registry::evict_oldest_idle`].
    evict: AtomicBool,
    /// Wakes the connection's task: eviction, or a write that just blocked.
    pub wake: Notify,
}

impl ConnState {
    fn new(epoch: Instant) -> Self {
        let now = ms_since(epoch, Instant::now());
        Self {
            epoch,
            accepted_ms: now,
            first_request: AtomicBool::new(false),
            in_flight: AtomicU32::new(0),
            last_active_ms: AtomicU64::new(now),
            head_begun: AtomicBool::new(false),
            multiplexed: AtomicBool::new(false),
            write_blocked_ms: AtomicU64::new(0),
            evict: AtomicBool::new(false),
            wake: Notify::new(),
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.epoch + Duration::from_millis(ms.saturating_sub(1))
    }

    /// When the task should look again: the earliest deadline that could be due.
    pub fn next_check(&self, s: &Settings, now: Instant) -> Instant {
        if !self.first_request.load(Relaxed) {
            let accepted = self.at(self.accepted_ms);
            let header = accepted + s.header_read_timeout;
            // A first request may come and go before the header deadline;
            // its keep-alive deadline is no earlier than this.
            let soonest_idle = accepted + s.keepalive_timeout;
            return if soonest_idle > now {
                header.min(soonest_idle)
            } else {
                header
            };
        }
        // Nothing due yet may become due (a request ends, a write blocks and
        // wakes us): look again at least once per keep-alive period.
        let mut next = now + s.keepalive_timeout;
        if self.in_flight.load(Relaxed) == 0 {
            next = next.min(self.idle_deadline(s));
        }
        let blocked = self.write_blocked_ms.load(Relaxed);
        if blocked != 0 {
            next = next.min(self.at(blocked) + s.send_timeout);
        }
        next
    }

    /// The deadline that has passed at `now`, if any.
    pub fn overdue(&self, s: &Settings, now: Instant) -> Option<CloseReason> {
        if !self.first_request.load(Relaxed) {
            return (now >= self.at(self.accepted_ms) + s.header_read_timeout)
                .then_some(CloseReason::HeaderTimeout);
        }
        let blocked = self.write_blocked_ms.load(Relaxed);
        if blocked != 0 && now >= self.at(blocked) + s.send_timeout {
            return Some(CloseReason::SendTimeout);
        }
        if self.in_flight.load(Relaxed) == 0 && now >= self.idle_deadline(s) {
            return Some(if self.head_begun.load(Relaxed) {
                CloseReason::HeaderTimeout
            } else {
                CloseReason::IdleTimeout
            });
        }
        None
    }

    /// With no request in flight: the keep-alive deadline after the last
    /// request, or, once the next head has begun, that plus the header
    /// deadline for the rest of it.
    fn idle_deadline(&self, s: &Settings) -> Instant {
        let idle = self.at(self.last_active_ms.load(Relaxed)) + s.keepalive_timeout;
        if self.head_begun.load(Relaxed) {
            idle + s.header_read_timeout
        } else {
            idle
        }
    }

    /// Bytes were read from the client: with no request in flight they begin
    /// the next request's head (a later request on a kept-alive connection;
    /// the first one is under the header deadline from accept anyway).
    fn note_read(&self) {
        if self.in_flight.load(Relaxed) == 0
            && !self.head_begun.load(Relaxed)
            && !self.multiplexed.load(Relaxed)
        {
            self.head_begun.store(true, Relaxed);
        }
    }

    /// True once a request head was complete on this connection.
    pub fn had_request(&self) -> bool {
        self.first_request.load(Relaxed)
    }

    /// True once [`Registry::evict_oldest_idle`] chose this connection.
    pub fn evicted(&self) -> bool {
        self.evict.load(Relaxed)
    }

    fn note_write(&self, pending: bool) {
        let blocked = self.write_blocked_ms.load(Relaxed);
        if pending {
            if blocked == 0 {
                self.write_blocked_ms
                    .store(ms_since(self.epoch, Instant::now()), Relaxed);
                self.wake.notify_one();
            }
        } else if blocked != 0 {
            self.write_blocked_ms.store(0, Relaxed);
        }
    }
}

/// Which of [`main_or_side`]'s futures finished first.
#[derive(Debug)]
pub enum Either<M, S> {
    Main(M),
    Side(S),
}

/// Runs `main` and `side` until one finishes, like `tokio::select!`, but
/// polls `side` only after one of its own wakers fired (and once at the
/// start), not on every wake-up of the task.
///
/// A connection's task wakes several times a request for its socket and its
/// origin; `select!` polled its deadline timer, eviction `Notify` and the
/// shutdown watch each time, about 2,000 instructions a proxied request
/// (callgrind, issue 17) for futures that fire a few times a connection.
pub fn main_or_side<'a, M: Future, S: Future>(
    main: Pin<&'a mut M>,
    side: Pin<&'a mut S>,
) -> MainOrSide<'a, M, S> {
    let flag = Arc::new(SideWaker {
        woken: AtomicBool::new(true),
        task: Mutex::new(None),
    });
    MainOrSide {
        main,
        side,
        side_waker: Waker::from(Arc::clone(&flag)),
        flag,
    }
}

/// The future of [`main_or_side`].
pub struct MainOrSide<'a, M, S> {
    main: Pin<&'a mut M>,
    side: Pin<&'a mut S>,
    flag: Arc<SideWaker>,
    side_waker: Waker,
}

impl<M, S> std::fmt::Debug for MainOrSide<'_, M, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MainOrSide")
            .field("side_woken", &self.flag.woken.load(Relaxed))
            .finish_non_exhaustive()
    }
}

impl<M: Future, S: Future> Future for MainOrSide<'_, M, S> {
    type Output = Either<M::Output, S::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let Poll::Ready(out) = this.main.as_mut().poll(cx) {
            return Poll::Ready(Either::Main(out));
        }
        // The task's waker first, then the flag: a side wake-up in between
        // finds the waker, one before sets the flag seen just below.
        {
            let mut task = this.flag.task.lock();
            if !task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        if this.flag.woken.swap(false, SeqCst)
            && let Poll::Ready(out) = this
                .side
                .as_mut()
                .poll(&mut Context::from_waker(&this.side_waker))
        {
            return Poll::Ready(Either::Side(out));
        }
        Poll::Pending
    }
}

/// The waker [`main_or_side`] gives its side future: marks it due and wakes
/// the task.
struct SideWaker {
    woken: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for SideWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, SeqCst);
        if let Some(task) = self.task.lock().as_ref() {
            task.wake_by_ref();
        }
    }
}

fn ms_since(epoch: Instant, t: Instant) -> u64 {
    t.saturating_duration_since(epoch).as_millis() as u64 + 1
}

/// A worker's open connections, so that at its limit the oldest idle one can
/// be closed for a new visitor.
#[derive(Debug)]
pub struct Registry {
    epoch: Instant,
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, Arc<ConnState>>>,
}

impl Default for Registry {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            next_id: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
        }
    }
}

impl Registry {
    /// Registers a new connection; it leaves the registry when the guard drops.
    pub fn register(self: &Arc<Self>) -> Registered {
        let id = self.next_id.fetch_add(1, Relaxed);
        let state = Arc::new(ConnState::new(self.epoch));
        self.conns.lock().insert(id, Arc::clone(&state));
        Registered {
            registry: Arc::clone(self),
            id,
            state,
        }
    }

    /// Asks the connection idle the longest (no request in flight, oldest
    /// last activity) to close. False when every connection is busy.
    pub fn evict_oldest_idle(&self) -> bool {
        let conns = self.conns.lock();
        let oldest = conns
            .values()
            .filter(|c| c.in_flight.load(Relaxed) == 0 && !c.evict.load(Relaxed))
            .min_by_key(|c| c.last_active_ms.load(Relaxed));
        match oldest {
            Some(c) => {
                c.evict.store(true, Relaxed);
                c.wake.notify_one();
                true
            }
            None => false,
        }
    }

    pub fn len(&self) -> usize {
        self.conns.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A connection's place in its worker's [`Registry`].
#[derive(Debug)]
pub struct Registered {
    registry: Arc<Registry>,
    id: u64,
    pub state: Arc<ConnState>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.conns.lock().remove(&self.id);
    }
}

/// Open connections per client address, across the node's workers (the
/// kernel spreads one client's connections over all of them).
#[derive(Debug)]
pub struct AddressCounts {
    hasher: RandomState,
    shards: Box<[Mutex<HashMap<IpAddr, u32>>]>,
}

const ADDRESS_SHARDS: usize = 16;

impl Default for AddressCounts {
    fn default() -> Self {
        Self {
            hasher: RandomState::new(),
            shards: (0..ADDRESS_SHARDS)
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
        }
    }
}

impl AddressCounts {
    /// Counts one more connection from `ip`, or `None` when it already has
    /// `cap` (0: no cap, always counted).
    pub fn try_open(self: &Arc<Self>, ip: IpAddr, cap: usize) -> Option<AddressSlot> {
        let shard = self.hasher.hash_one(ip) as usize % ADDRESS_SHARDS;
        let mut counts = self.shards[shard].lock();
        let n = counts.entry(ip).or_insert(0);
        if cap != 0 && *n as usize >= cap {
            if *n == 0 {
                counts.remove(&ip);
            }
            return None;
        }
        *n += 1;
        Some(AddressSlot {
            counts: Arc::clone(self),
            shard,
            ip,
        })
    }

    /// Connections open from `ip` now.
    pub fn open_from(&self, ip: IpAddr) -> u32 {
        let shard = self.hasher.hash_one(ip) as usize % ADDRESS_SHARDS;
        self.shards[shard].lock().get(&ip).copied().unwrap_or(0)
    }
}

/// One connection counted against its address; uncounted on drop.
#[derive(Debug)]
pub struct AddressSlot {
    counts: Arc<AddressCounts>,
    shard: usize,
    ip: IpAddr,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.shards[self.shard].lock();
        if let Some(n) = counts.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

/// A request between its complete head and the end of its response body.
#[derive(Debug)]
pub struct InFlight(Arc<ConnState>);

impl InFlight {
    /// Called when hyper hands over a request: its head is complete.
    pub fn start(state: &Arc<ConnState>, version: http::Version) -> Self {
        state.first_request.store(true, Relaxed);
        if version == http::Version::HTTP_2 {
            state.multiplexed.store(true, Relaxed);
        }
        state.head_begun.store(false, Relaxed);
        state.in_flight.fetch_add(1, Relaxed);
        Self(Arc::clone(state))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let s = &self.0;
        s.last_active_ms
            .store(ms_since(s.epoch, Instant::now()), Relaxed);
        s.in_flight.fetch_sub(1, Relaxed);
    }
}

/// A response body that keeps its request [`InFlight`] until hyper is done
/// with it (sent, or dropped with the connection). A plain struct around the
/// already boxed body: no allocation.
#[derive(Debug)]
pub struct TrackedBody<B> {
    inner: B,
    _in_flight: InFlight,
}

impl<B> TrackedBody<B> {
    pub fn new(inner: B, in_flight: InFlight) -> Self {
        Self {
            inner,
            _in_flight: in_flight,
        }
    }
}

impl<B: HttpBody<Data = Bytes> + Unpin> HttpBody for TrackedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The client's socket, telling its [`ConnState`] when a write blocks (the
/// send timeout) and when it moves again.
#[derive(Debug)]
pub struct Watched<T> {
    io: T,
    state: Arc<ConnState>,
}

impl<T> Watched<T> {
    pub fn new(io: T, state: Arc<ConnState>) -> Self {
        Self { io, state }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.state.note_read();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        this.state.note_write(r.is_pending());
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.state.note_write(r.is_pending());
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A future that counts its polls and finishes when `ready` is set.
    struct Counted<'a> {
        polls: &'a AtomicU32,
        ready: &'a AtomicBool,
        name: &'static str,
    }

    impl Future for Counted<'_> {
        type Output = &'static str;
        fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<&'static str> {
            self.polls.fetch_add(1, Relaxed);
            if self.ready.load(Relaxed) {
                Poll::Ready(self.name)
            } else {
                Poll::Pending
            }
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_side_future_is_polled_only_when_it_was_woken() {
        let (main_polls, side_polls) = (AtomicU32::new(0), AtomicU32::new(0));
        let (main_ready, side_ready) = (AtomicBool::new(false), AtomicBool::new(false));
        let notify = Notify::new();
        let main = Counted {
            polls: &main_polls,
            ready: &main_ready,
            name: "main",
        };
        let side = async {
            notify.notified().await;
            side_polls.fetch_add(1, Relaxed);
            "side"
        };
        let mut main = std::pin::pin!(main);
        let mut side = std::pin::pin!(side);
        let mut both = main_or_side(main.as_mut(), side.as_mut());
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        // First poll: both (the side registers with the Notify).
        assert!(Pin::new(&mut both).poll(&mut cx).is_pending());
        // Wake-ups meant for the main future (its socket): the side is left alone.
        for _ in 0..10 {
            assert!(Pin::new(&mut both).poll(&mut cx).is_pending());
        }
        assert_eq!(main_polls.load(Relaxed), 11);
        assert_eq!(side_polls.load(Relaxed), 0);
        // The side's own wake-up: it is polled and wins.
        notify.notify_one();
        match Pin::new(&mut both).poll(&mut cx) {
            Poll::Ready(Either::Side("side")) => {}
            other => panic!("expected the side, got {other:?}"),
        }
        assert_eq!(side_polls.load(Relaxed), 1);
        let _ = side_ready;

        // The main future finishing is seen at once.
        main_ready.store(true, Relaxed);
        let mut never = std::pin::pin!(std::future::pending::<&str>());
        assert!(matches!(
            main_or_side(main.as_mut(), never.as_mut()).await,
            Either::Main("main")
        ));
    }

    fn settings() -> Settings {
        Settings {
            max_connections_per_worker: 10,
            cpu_affinity: Vec::new(),
            max_connections_per_address: 2,
            header_read_timeout: Duration::from_millis(1000),
            keepalive_timeout: Duration::from_millis(5000),
            send_timeout: Duration::from_millis(3000),
            max_header_bytes: 8192,
            max_headers: 64,
            http1_fast_path: true,
            shutdown_grace: Duration::from_secs(1),
            trusted_proxies: crate::forwarded::TrustedProxies::default(),
            via: crate::forwarded::Via::new("test"),
        }
    }

    #[test]
    fn the_header_deadline_runs_from_accept_until_a_first_request() {
        let s = settings();
        let registry = Arc::new(Registry::default());
        let conn = registry.register();
        let accepted = conn.state.at(conn.state.accepted_ms);
        assert_eq!(
            conn.state.next_check(&s, accepted),
            accepted + s.header_read_timeout
        );
        assert_eq!(
            conn.state
                .overdue(&s, accepted + Duration::from_millis(999)),
            None
        );
        assert_eq!(
            conn.state.overdue(&s, accepted + s.header_read_timeout),
            Some(CloseReason::HeaderTimeout)
        );
        // Once a request came, only the keep-alive and send deadlines apply.
        let req = InFlight::start(&conn.state, http::Version::HTTP_11);
        assert_eq!(
            conn.state.overdue(&s, accepted + Duration::from_secs(60)),
            None
        );
        drop(req);
        let idle = conn.state.at(conn.state.last_active_ms.load(Relaxed));
        assert_eq!(conn.state.next_check(&s, idle), idle + s.keepalive_timeout);
        assert_eq!(
            conn.state.overdue(&s, idle + s.keepalive_timeout),
            Some(CloseReason::IdleTimeout)
        );
    }

    #[test]
    fn a_later_head_has_the_keepalive_deadline_to_its_first_byte_then_the_header_deadline() {
        let s = settings();
        let registry = Arc::new(Registry::default());
        let conn = registry.register();
        let state = &conn.state;
        // Bytes of the first head, then the request: nothing begun after it.
        state.note_read();
        drop(InFlight::start(state, http::Version::HTTP_11));
        let idle = state.at(state.last_active_ms.load(Relaxed));
        assert_eq!(state.next_check(&s, idle), idle + s.keepalive_timeout);
        // The next head's first byte: the header deadline is added.
        state.note_read();
        let both = idle + s.keepalive_timeout + s.header_read_timeout;
        // (Looked at again within a keep-alive period in any case.)
        assert_eq!(state.next_check(&s, idle), idle + s.keepalive_timeout);
        assert_eq!(state.overdue(&s, idle + s.keepalive_timeout), None);
        assert_eq!(state.next_check(&s, idle + s.keepalive_timeout), both);
        assert_eq!(state.overdue(&s, both), Some(CloseReason::HeaderTimeout));
        // Complete: it is a request, and the next idle wait starts plain.
        drop(InFlight::start(state, http::Version::HTTP_11));
        let idle = state.at(state.last_active_ms.load(Relaxed));
        assert_eq!(
            state.overdue(&s, idle + s.keepalive_timeout),
            Some(CloseReason::IdleTimeout)
        );
        // Bytes read while a request is in flight (its body, a pipelined
        // head) begin nothing.
        let req = InFlight::start(state, http::Version::HTTP_11);
        state.note_read();
        drop(req);
        let idle = state.at(state.last_active_ms.load(Relaxed));
        assert_eq!(state.next_check(&s, idle), idle + s.keepalive_timeout);
    }

    #[test]
    fn http2_frames_between_requests_begin_no_head() {
        let s = settings();
        let registry = Arc::new(Registry::default());
        let conn = registry.register();
        let state = &conn.state;
        drop(InFlight::start(state, http::Version::HTTP_2));
        state.note_read();
        let idle = state.at(state.last_active_ms.load(Relaxed));
        assert_eq!(state.next_check(&s, idle), idle + s.keepalive_timeout);
        assert_eq!(
            state.overdue(&s, idle + s.keepalive_timeout),
            Some(CloseReason::IdleTimeout)
        );
    }

    #[test]
    fn before_a_first_request_the_task_also_wakes_when_one_could_have_gone_idle() {
        // Keep-alive shorter than the header deadline: a first request that
        // comes and goes at once is idle-overdue at accept + keep-alive, and
        // the task must not sleep to the header deadline.
        let mut s = settings();
        s.keepalive_timeout = Duration::from_millis(600);
        s.header_read_timeout = Duration::from_millis(2000);
        let registry = Arc::new(Registry::default());
        let conn = registry.register();
        let accepted = conn.state.at(conn.state.accepted_ms);
        assert_eq!(
            conn.state.next_check(&s, accepted),
            accepted + s.keepalive_timeout
        );
        // Past that point with still no request: the header deadline, no spin.
        let later = accepted + Duration::from_millis(700);
        assert_eq!(
            conn.state.next_check(&s, later),
            accepted + s.header_read_timeout
        );
    }

    #[test]
    fn a_blocked_write_is_a_send_timeout_even_mid_request() {
        let s = settings();
        let registry = Arc::new(Registry::default());
        let conn = registry.register();
        let _req = InFlight::start(&conn.state, http::Version::HTTP_11);
        conn.state.note_write(true);
        let blocked = conn.state.at(conn.state.write_blocked_ms.load(Relaxed));
        assert_eq!(conn.state.next_check(&s, blocked), blocked + s.send_timeout);
        assert_eq!(
            conn.state.overdue(&s, blocked + s.send_timeout),
            Some(CloseReason::SendTimeout)
        );
        // A write that goes through again clears it.
        conn.state.note_write(false);
        assert_eq!(conn.state.overdue(&s, blocked + s.send_timeout), None);
    }

    #[test]
    fn eviction_picks_the_oldest_idle_connection_and_never_a_busy_one() {
        let registry = Arc::new(Registry::default());
        let oldest = registry.register();
        let busy = registry.register();
        let newer = registry.register();
        oldest.state.last_active_ms.store(5, Relaxed);
        busy.state.last_active_ms.store(1, Relaxed);
        newer.state.last_active_ms.store(9, Relaxed);
        let _req = InFlight::start(&busy.state, http::Version::HTTP_11);
        busy.state.last_active_ms.store(1, Relaxed);
        assert!(registry.evict_oldest_idle());
        assert!(oldest.state.evicted());
        assert!(!busy.state.evicted() && !newer.state.evicted());
        assert!(registry.evict_oldest_idle());
        assert!(newer.state.evicted());
        assert!(!registry.evict_oldest_idle(), "only a busy one is left");
        drop(oldest);
        assert_eq!(registry.len(), 2);
    }

    #[test]
    fn an_address_gets_at_most_its_cap_and_slots_come_back() {
        let counts = Arc::new(AddressCounts::default());
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        let other: IpAddr = "192.0.2.8".parse().unwrap();
        let a = counts.try_open(ip, 2).unwrap();
        let _b = counts.try_open(ip, 2).unwrap();
        assert!(counts.try_open(ip, 2).is_none());
        assert!(counts.try_open(other, 2).is_some());
        drop(a);
        assert_eq!(counts.open_from(ip), 1);
        assert!(counts.try_open(ip, 2).is_some());
        assert!(counts.try_open(ip, 0).is_some(), "0: no cap");
    }
}

/// A connection with bytes already read off it read first: what followed a
/// PROXY header in its read, or, handed to hyper, what [`super::h1`] read
/// of the next request. Reads of the prefix are not the socket's: they mark
/// nothing in [`ConnState`].
#[derive(Debug)]
pub struct Prefixed<T> {
    io: T,
    prefix: Bytes,
}

impl<T> Prefixed<T> {
    pub fn new(io: T, prefix: Bytes) -> Self {
        Self { io, prefix }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Prefixed<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Prefixed<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
