//! A worker's HTTP/1.1 connections to origins, driven in the request's own task.
//!
//! Two kinds: plain-HTTP origins get [`H1Conn`]s, the proxy's own exchange
//! ([`crate::origin_h1`]); TLS origins and upgrades (whose `101` hands the
//! socket to a tunnel) get hyper's, described here. Both wait in the same
//! per-worker pool under the same rules (idle timeout, the most recently
//! returned first, checked for a close by the origin before reuse).
//!
//! hyper's pooled client (`hyper_util::client::legacy`) runs every origin
//! connection as a task of its own and hands it each request through a
//! channel: two extra task wake-ups per proxied request that nginx's one
//! event loop does not have (docs/BENCHMARKS.md). Here a connection is a
//! hyper `client::conn::http1` pair whose connection future is polled by
//! whoever uses it: the request while it waits for the response head, then
//! the response body ([`PooledBody`]) while it streams to the visitor. Nothing
//! runs in the background: an idle connection waits in its worker's pool
//! until a request takes it, and that request first polls it once to see
//! whether the origin closed it meanwhile.
//!
//! A connection goes back to the pool only when its response was read to the
//! end, hyper kept it alive (no `Connection: close`, no error) and it is
//! ready for the next request; anything else drops, and so closes, it. One
//! pool per worker, never shared across cores; its lock is only ever taken by
//! that worker's thread (it exists because tokio's tasks must be `Send`).
use std::{
    collections::{HashMap, VecDeque},
    future::{Future, poll_fn},
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    task::{Context, Poll, Waker},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{
    Request, Response, StatusCode, Uri,
    uri::{Authority, Scheme},
};
use hyper::{
    body::{Body as HttpBody, Frame, Incoming, SizeHint},
    client::conn::{TrySendError, http1},
};
use hyper_rustls::MaybeHttpsStream;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower_service::Service as _;
use waitroom_runtime::body::{Body, BoxError};

use crate::{
    origin_h1::{H1Conn, H1Error},
    upstream::tls::{OriginConnector, OriginTls},
};

/// An origin connection's driver: hyper's connection future (with upgrades,
/// whose type cannot be named, hence the box: one per connection, not per
/// request).
type Driver = Pin<Box<dyn Future<Output = hyper::Result<()>> + Send>>;

/// How long an idle connection may wait for its next request.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Idle connections kept per origin (the legacy client's setting here).
const MAX_IDLE_PER_ORIGIN: usize = 256;

/// Where a connection goes: scheme (plain or TLS) and `host:port`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PoolKey {
    scheme: Scheme,
    authority: Authority,
}

/// FNV-1a for [`PoolKey`]s. They come from the configuration, never from
/// a visitor, so a keyed hash buys nothing; and `Authority` hashes byte by
/// byte (case-folded), where SipHash's cost per `write` made the two lookups
/// of each proxied request (take, give back) a visible share of it (issue 17).
#[derive(Debug, Clone, Copy)]
struct PoolKeyHasher(u64);

impl Default for PoolKeyHasher {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for PoolKeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A pool key that can tell, without reading it, that it is the very key
/// (the same bytes of the same configuration) as another.
trait SameKey: std::hash::Hash + Eq + Clone {
    /// `true` only if equal; may be `false` for an equal key elsewhere.
    fn same(&self, other: &Self) -> bool;
}

impl SameKey for Authority {
    fn same(&self, other: &Self) -> bool {
        std::ptr::eq(self.as_str(), other.as_str())
    }
}

impl SameKey for PoolKey {
    fn same(&self, other: &Self) -> bool {
        self.authority.same(&other.authority) && self.scheme == other.scheme
    }
}

/// Idle connections by where they go, the most recently returned last.
///
/// The queue used last is tried first, by the identity of its key: every
/// request of a room passes the same `Authority` (its configuration's), so
/// a worker in front of one origin never hashes one (`Authority` hashes
/// byte by byte, case-folded: with the lookup, 600–700 instructions of each
/// proxied request, twice).
struct Idles<K, C> {
    queues: Vec<(K, VecDeque<Idle<C>>)>,
    index: HashMap<K, usize, std::hash::BuildHasherDefault<PoolKeyHasher>>,
    last: usize,
}

impl<K: SameKey, C> Default for Idles<K, C> {
    fn default() -> Self {
        Self {
            queues: Vec::new(),
            index: HashMap::default(),
            last: 0,
        }
    }
}

impl<K: SameKey, C> Idles<K, C> {
    /// Where the queue of `key` is, if there is one.
    fn find(&mut self, key: &K) -> Option<usize> {
        let last = self.last;
        if !self.queues.get(last).is_some_and(|(k, _)| k.same(key)) {
            self.last = *self.index.get(key)?;
        }
        Some(self.last)
    }

    /// The most recently returned idle connection to `key` that `usable`
    /// accepts; expired and refused ones met on the way are dropped.
    fn take(&mut self, key: &K, mut usable: impl FnMut(&mut C) -> bool) -> Option<C> {
        let i = self.find(key)?;
        let queue = &mut self.queues[i].1;
        let now = Instant::now();
        while let Some(Idle { mut conn, since }) = queue.pop_back() {
            if now.duration_since(since) >= IDLE_TIMEOUT {
                // Every older one has waited longer still.
                queue.clear();
                break;
            }
            if usable(&mut conn) {
                return Some(conn);
            }
        }
        None
    }

    /// Keeps `conn` for the next request to where it goes (`key_of`):
    /// expired ones go, and the oldest when there are too many.
    fn put(&mut self, conn: C, key_of: impl Fn(&C) -> &K) {
        let key = key_of(&conn);
        let i = match self.find(key) {
            Some(i) => i,
            None => {
                let i = self.queues.len();
                self.index.insert(key.clone(), i);
                self.queues.push((key.clone(), VecDeque::new()));
                self.last = i;
                i
            }
        };
        let queue = &mut self.queues[i].1;
        let now = Instant::now();
        while queue
            .front()
            .is_some_and(|i| now.duration_since(i.since) >= IDLE_TIMEOUT)
        {
            queue.pop_front();
        }
        if queue.len() >= MAX_IDLE_PER_ORIGIN {
            queue.pop_front();
        }
        queue.push_back(Idle { conn, since: now });
    }
}

/// One worker's connections to every origin of every room.
pub struct OriginPool {
    connector: OriginConnector,
    /// hyper's connections: TLS origins.
    idle: parking_lot::Mutex<Idles<PoolKey, OriginConn>>,
    /// [`H1Conn`]s: plain-HTTP origins.
    idle_h1: parking_lot::Mutex<Idles<Authority, H1Conn>>,
    /// Connections opened, for tests and the bench notes (a relaxed counter
    /// this worker alone writes, moved only when a connection opens).
    opened: AtomicU64,
}

impl std::fmt::Debug for OriginPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OriginPool")
            .field("opened", &self.opened.load(Relaxed))
            .finish_non_exhaustive()
    }
}

/// A connection waiting in the pool.
struct Idle<C> {
    conn: C,
    since: Instant,
}

/// One HTTP/1.1 connection to an origin.
pub struct OriginConn {
    key: PoolKey,
    sender: http1::SendRequest<Body>,
    /// `None` once the connection future has finished (closed, failed or
    /// upgraded): the connection can never be used again.
    driver: Option<Driver>,
    /// Taken from the pool (it served an earlier request).
    pub reused: bool,
}

impl std::fmt::Debug for OriginConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OriginConn")
            .field("origin", &self.key.authority)
            .field("reused", &self.reused)
            .finish_non_exhaustive()
    }
}

/// Why an origin exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum OriginError {
    /// No connection: refused, unreachable, TLS failed, connect timeout.
    #[error("connect: {0}")]
    Connect(#[source] BoxError),
    /// The exchange on an open connection failed (closed, reset, a malformed
    /// or oversized answer, or the visitor's request body failing).
    #[error(transparent)]
    Exchange(#[from] hyper::Error),
    /// The same, on a plain-HTTP origin's [`H1Conn`].
    #[error(transparent)]
    H1(#[from] H1Error),
}

impl OriginPool {
    /// A pool whose new connections time out after `connect_timeout`.
    pub fn new(connect_timeout: Duration, tls: &OriginTls) -> Self {
        Self {
            connector: tls.connector(connect_timeout),
            idle: parking_lot::Mutex::new(Idles::default()),
            idle_h1: parking_lot::Mutex::new(Idles::default()),
            opened: AtomicU64::new(0),
        }
    }

    /// Connections this pool has opened so far.
    pub fn opened(&self) -> u64 {
        self.opened.load(Relaxed)
    }

    /// An idle connection to `scheme://authority` still open, else a new one.
    pub async fn checkout(
        &self,
        scheme: &Scheme,
        authority: &Authority,
    ) -> Result<OriginConn, OriginError> {
        if let Some(conn) = self.take_idle(scheme, authority) {
            return Ok(conn);
        }
        self.connect(scheme, authority).await
    }

    /// A new connection to `scheme://authority`. Boxed: its future (TCP,
    /// TLS, the handshake) is large and rare, and inline in its callers'
    /// it would be copied with every request's future (the request's was
    /// 14.5 KB with it, 12.3 KB without).
    pub fn connect<'a>(
        &'a self,
        scheme: &'a Scheme,
        authority: &'a Authority,
    ) -> Pin<Box<dyn Future<Output = Result<OriginConn, OriginError>> + Send + 'a>> {
        Box::pin(self.open(scheme, authority))
    }

    /// A new [`H1Conn`] to `http://authority` (boxed, as [`Self::connect`]).
    pub fn connect_h1<'a>(
        &'a self,
        authority: &'a Authority,
    ) -> Pin<Box<dyn Future<Output = Result<H1Conn, OriginError>> + Send + 'a>> {
        Box::pin(async move {
            match self.dial(&Scheme::HTTP, authority).await? {
                MaybeHttpsStream::Http(tcp) => {
                    self.opened.fetch_add(1, Relaxed);
                    Ok(H1Conn::new(tcp.into_inner(), authority.clone()))
                }
                MaybeHttpsStream::Https(_) => Err(OriginError::Connect(
                    "a TLS stream for a plain-HTTP origin".into(),
                )),
            }
        })
    }

    /// An idle [`H1Conn`] to `http://authority` still open, else a new one.
    /// `sure`: each idle connection's socket is asked whether the origin
    /// closed it, not only the reactor ([`H1Conn::is_idle_and_open`]).
    pub async fn checkout_h1(
        &self,
        authority: &Authority,
        sure: bool,
    ) -> Result<H1Conn, OriginError> {
        let idle = self
            .idle_h1
            .lock()
            .take(authority, |conn| conn.is_idle_and_open(sure));
        if let Some(mut conn) = idle {
            conn.reused = true;
            return Ok(conn);
        }
        self.connect_h1(authority).await
    }

    /// Keeps an [`H1Conn`] whose answer was read to its end.
    pub(crate) fn check_in_h1(&self, mut conn: H1Conn) {
        conn.trim_buffers();
        self.idle_h1.lock().put(conn, H1Conn::authority);
    }

    /// A TCP (and for `https`, TLS) connection to `scheme://authority`.
    async fn dial(
        &self,
        scheme: &Scheme,
        authority: &Authority,
    ) -> Result<MaybeHttpsStream<TokioIo<TcpStream>>, OriginError> {
        let uri = Uri::builder()
            .scheme(scheme.clone())
            .authority(authority.clone())
            .path_and_query("/")
            .build()
            .map_err(|e| OriginError::Connect(e.into()))?;
        let mut connector = self.connector.clone();
        poll_fn(|cx| connector.poll_ready(cx))
            .await
            .map_err(OriginError::Connect)?;
        connector.call(uri).await.map_err(OriginError::Connect)
    }

    async fn open(
        &self,
        scheme: &Scheme,
        authority: &Authority,
    ) -> Result<OriginConn, OriginError> {
        let io = self.dial(scheme, authority).await?;
        let (sender, conn) = http1::handshake(io).await?;
        self.opened.fetch_add(1, Relaxed);
        Ok(OriginConn {
            key: PoolKey {
                scheme: scheme.clone(),
                authority: authority.clone(),
            },
            sender,
            driver: Some(Box::pin(conn.with_upgrades())),
            reused: false,
        })
    }

    /// The most recently returned idle connection that is still open;
    /// expired and closed ones met on the way are dropped.
    fn take_idle(&self, scheme: &Scheme, authority: &Authority) -> Option<OriginConn> {
        // Borrowed lookup would need a second key type; the clones are two
        // reference-count increments.
        let key = PoolKey {
            scheme: scheme.clone(),
            authority: authority.clone(),
        };
        let mut conn = self.idle.lock().take(&key, |conn| {
            // One poll without a waker: a connection the origin closed (or
            // wrote to unasked) finishes here instead of failing a request.
            conn.poll_driver(&mut Context::from_waker(Waker::noop())) && conn.sender.is_ready()
        })?;
        conn.reused = true;
        Some(conn)
    }

    /// Returns a connection whose exchange completed; kept only if hyper
    /// holds it open and ready for another request.
    fn check_in(&self, mut conn: OriginConn, cx: &mut Context<'_>) {
        // Let hyper finish the message and ask for the next one.
        if !conn.poll_driver(cx) || !conn.sender.is_ready() {
            return;
        }
        self.idle.lock().put(conn, |c| &c.key);
    }
}

impl OriginConn {
    /// Polls the connection future once; whether the connection is still
    /// open (a finished one is never used again).
    fn poll_driver(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(driver) = self.driver.as_mut() else {
            return false;
        };
        match driver.as_mut().poll(cx) {
            Poll::Pending => true,
            Poll::Ready(result) => {
                if let Err(err) = result {
                    tracing::debug!(origin = %self.key.authority, %err, "origin connection failed");
                }
                self.driver = None;
                false
            }
        }
    }

    /// Sends `req` and waits for the response head, driving the connection
    /// meanwhile (it writes the request and its body, then reads the head).
    /// The request comes back with the error when hyper never began to send
    /// it, so it can go on a new connection.
    pub async fn send(
        &mut self,
        req: Request<Body>,
    ) -> Result<Response<Incoming>, TrySendError<Request<Body>>> {
        let mut response = std::pin::pin!(self.sender.try_send_request(req));
        poll_fn(|cx| {
            // The connection first: what it reads completes the response.
            let _open = self.poll_driver(cx);
            response.as_mut().poll(cx)
        })
        .await
    }

    /// The response's body, streaming with this connection behind it; the
    /// connection goes back to `pool` once the body was read to the end.
    pub fn into_body(
        self,
        pool: &Arc<OriginPool>,
        status: StatusCode,
        body: Incoming,
    ) -> PooledBody {
        let mut conn = Some(self);
        if status == StatusCode::SWITCHING_PROTOCOLS {
            // The connection now belongs to whoever took the upgrade; its
            // future hands the socket over once polled.
            if let Some(driver) = conn.take().and_then(|c| c.driver) {
                tokio::spawn(driver);
            }
        }
        PooledBody {
            inner: body,
            conn,
            pool: Arc::clone(pool),
        }
    }
}

/// An origin's response body with the connection that delivers it: polling
/// the body polls the connection, and the end of the body returns the
/// connection to its pool. Dropped early (the visitor left), it drops the
/// connection, whose response was not read to the end.
pub struct PooledBody {
    inner: Incoming,
    conn: Option<OriginConn>,
    pool: Arc<OriginPool>,
}

impl std::fmt::Debug for PooledBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledBody")
            .field("conn", &self.conn)
            .finish_non_exhaustive()
    }
}

impl PooledBody {
    /// The body is complete: give the connection back (if it may be reused).
    fn finish(&mut self, cx: &mut Context<'_>) {
        if let Some(conn) = self.conn.take() {
            self.pool.check_in(conn, cx);
        }
    }

    /// For a response that has no body at all: returns the connection now,
    /// since nobody will poll the body.
    pub async fn finish_if_empty(&mut self) {
        if self.inner.is_end_stream() {
            poll_fn(|cx| {
                self.finish(cx);
                Poll::Ready(())
            })
            .await;
        }
    }
}

impl HttpBody for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        if let Some(conn) = this.conn.as_mut()
            && !conn.poll_driver(cx)
        {
            // Closed: the body still yields what hyper read, then its end or
            // its error; the connection is not reused.
            this.conn = None;
        }
        let frame = Pin::new(&mut this.inner).poll_frame(cx);
        match &frame {
            Poll::Ready(None) => this.finish(cx),
            Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => this.finish(cx),
            Poll::Ready(Some(Err(_))) => this.conn = None,
            _ => {}
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn authority(s: &str) -> Authority {
        // Parsed each time: equal keys that are not the same bytes.
        Authority::from_maybe_shared(Bytes::copy_from_slice(s.as_bytes())).unwrap()
    }

    #[test]
    fn idle_queues_are_found_by_equal_keys_not_only_by_the_same_key() {
        let mut idles: Idles<Authority, (Authority, u32)> = Idles::default();
        let a = authority("origin-a:80");
        let b = authority("origin-b:80");
        idles.put((a.clone(), 1), |c| &c.0);
        idles.put((b.clone(), 2), |c| &c.0);
        idles.put((a.clone(), 3), |c| &c.0);
        // The last queue used is b's... then a's: each lookup switches it.
        assert_eq!(idles.take(&b, |_| true).map(|c| c.1), Some(2));
        // An equal key spelled in other bytes (and other case) finds a's queue,
        // the most recently returned first.
        let a_again = authority("ORIGIN-A:80");
        assert!(!a_again.same(&a) && a_again == a);
        assert_eq!(idles.take(&a_again, |_| true).map(|c| c.1), Some(3));
        assert_eq!(idles.take(&a, |_| true).map(|c| c.1), Some(1));
        assert_eq!(idles.take(&a, |_| true).map(|c| c.1), None);
        assert_eq!(idles.take(&b, |_| true).map(|c| c.1), None);
        assert_eq!(
            idles.take(&authority("origin-c:80"), |_| true).map(|c| c.1),
            None
        );
        assert_eq!(
            idles.queues.len(),
            2,
            "one queue per origin, however spelled"
        );
    }

    #[test]
    fn an_unusable_idle_connection_is_dropped_and_the_next_one_tried() {
        let mut idles: Idles<Authority, (Authority, u32)> = Idles::default();
        let a = authority("origin-a:80");
        for n in 1..=3 {
            idles.put((a.clone(), n), |c| &c.0);
        }
        // 3 (the newest) refused: dropped; 2 taken; 1 stays.
        assert_eq!(idles.take(&a, |c| c.1 != 3).map(|c| c.1), Some(2));
        assert_eq!(idles.take(&a, |_| true).map(|c| c.1), Some(1));
        assert_eq!(idles.take(&a, |_| true).map(|c| c.1), None);
    }
}
