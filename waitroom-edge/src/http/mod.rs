//! The per-core data plane.
//!
//! One OS thread per core, each running a current-thread tokio runtime with its
//! own `SO_REUSEPORT` listeners (the kernel spreads connections between them),
//! its own origin connection pool, and nothing shared on the request path but
//! the node's atomics. This is pingora's no-steal model: a connection stays on
//! the core that accepted it.
use std::{
    convert::Infallible,
    net::{IpAddr, SocketAddr},
    sync::Arc,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use hyper::service::service_fn;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::{
    net::TcpListener,
    sync::{Semaphore, TryAcquireError, mpsc},
};
use tracing::Instrument as _;

use waitroom_runtime::shutdown::Shutdown;

use crate::{
    metrics::{CloseReason, Defence},
    node::{Node, Settings},
};

pub mod conn;
pub mod h1;
pub mod handler;
pub mod proxy_protocol;

/// Binds a non-blocking TCP listener with `SO_REUSEPORT`, so every worker can
/// bind the same address.
pub fn bind_reuseport(addr: SocketAddr, backlog: i32) -> std::io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_tcp_nodelay(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(backlog)?;
    Ok(socket.into())
}

/// What a worker needs to accept: the address to bind and, for TLS, the acceptor.
#[derive(Clone)]
pub struct ListenerSpec {
    pub addr: SocketAddr,
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// Every connection starts with a PROXY protocol header (before TLS).
    pub proxy_protocol: bool,
}

impl std::fmt::Debug for ListenerSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerSpec")
            .field("addr", &self.addr)
            .field("tls", &self.tls.is_some())
            .field("proxy_protocol", &self.proxy_protocol)
            .finish()
    }
}

/// Resolves port 0 once so every worker binds the same concrete address; returns
/// the first listener (for worker 0) and the concrete spec.
pub fn resolve(spec: &ListenerSpec) -> std::io::Result<(std::net::TcpListener, ListenerSpec)> {
    let first = bind_reuseport(spec.addr, 4096)?;
    let addr = first.local_addr()?;
    Ok((
        first,
        ListenerSpec {
            addr,
            tls: spec.tls.clone(),
            proxy_protocol: spec.proxy_protocol,
        },
    ))
}

/// Each worker's own sockets, one per listener, in listener order.
pub type WorkerSockets = Vec<(std::net::TcpListener, ListenerSpec)>;

/// Binds every worker's `SO_REUSEPORT` sockets for `listeners` (the first
/// worker takes the already-bound ones). All binding happens here, on the
/// starting thread and before the node drops its capabilities: a port below
/// 1024 needs `CAP_NET_BIND_SERVICE` for each socket, not just the first.
pub fn bind_for_workers(
    count: usize,
    listeners: Vec<(std::net::TcpListener, ListenerSpec)>,
) -> std::io::Result<Vec<WorkerSockets>> {
    let mut all = Vec::with_capacity(count);
    for _ in 1..count {
        all.push(
            listeners
                .iter()
                .map(|(_, spec)| Ok((bind_reuseport(spec.addr, 4096)?, spec.clone())))
                .collect::<std::io::Result<WorkerSockets>>()?,
        );
    }
    all.insert(0, listeners);
    Ok(all)
}

/// Starts one worker thread for each entry of `sockets` (see
/// [`bind_for_workers`]). Each returns when shutdown is requested and its
/// connections have drained (or the grace period ran out).
/// Each worker says once whether it started (its runtime and listeners are
/// up) on `ready`; a node whose workers do not all start must not say it is
/// serving (see `start`).
pub fn spawn_workers(
    node: &Arc<Node>,
    sockets: Vec<WorkerSockets>,
    shutdown: &Shutdown,
    ready: &std::sync::mpsc::Sender<Result<(), String>>,
) -> std::io::Result<Vec<JoinHandle<()>>> {
    let mut handles = Vec::with_capacity(sockets.len());
    for (index, sockets) in sockets.into_iter().enumerate() {
        let node = Arc::clone(node);
        let shutdown = shutdown.clone();
        let ready = ready.clone();
        let handle = std::thread::Builder::new()
            .name(format!("waitroom-w{index}"))
            .spawn(move || worker_main(index, node, sockets, shutdown, &ready))?;
        handles.push(handle);
    }
    Ok(handles)
}

/// The CPUs this process may run on (`sched_getaffinity`), ascending.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is the empty set; sched_getaffinity writes
    // at most size_of::<cpu_set_t>() bytes into it.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        set
    };
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: cpu is below CPU_SETSIZE, the set's size.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// Whether this process may run on `cpu` (`node.cpu_affinity`).
pub fn cpu_allowed(cpu: usize) -> bool {
    allowed_cpus().contains(&cpu)
}

/// Pins the calling thread to `cpu`.
fn pin_to_cpu(cpu: usize) -> std::io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: a zeroed cpu_set_t is the empty set, cpu is below its size,
    // and pid 0 names the calling thread.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn worker_main(
    index: usize,
    node: Arc<Node>,
    sockets: Vec<(std::net::TcpListener, ListenerSpec)>,
    shutdown: Shutdown,
    ready: &std::sync::mpsc::Sender<Result<(), String>>,
) {
    let affinity = &node.settings.cpu_affinity;
    if !affinity.is_empty() {
        let cpu = affinity[index % affinity.len()];
        if let Err(err) = pin_to_cpu(cpu) {
            let _ = ready.send(Err(format!(
                "worker {index}: cpu_affinity: cannot pin to CPU {cpu}: {err}"
            )));
            return;
        }
        tracing::debug!(worker = index, cpu, "worker pinned");
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            let _ = ready.send(Err(format!(
                "worker {index}: cannot start its runtime: {err}"
            )));
            return;
        }
    };
    let span = tracing::info_span!("worker", id = index);
    runtime.block_on(
        async move {
            crate::metrics::enter_worker(index);
            let worker = Arc::new(handler::Worker::new(index, &node));
            let limit = Arc::new(Semaphore::new(node.settings.max_connections_per_worker));
            let registry = Arc::new(conn::Registry::default());
            // Every connection task holds a sender; `recv` returns `None` once the
            // last one is gone: the worker has drained.
            let (drain_tx, mut drained) = mpsc::channel::<()>(1);
            let mut loops = Vec::new();
            for (socket, spec) in sockets {
                let listener = match TcpListener::from_std(socket) {
                    Ok(l) => l,
                    Err(err) => {
                        let _ = ready.send(Err(format!(
                            "worker {index}: cannot register the listener on {}: {err}",
                            spec.addr
                        )));
                        return;
                    }
                };
                loops.push(tokio::spawn(accept_loop(
                    listener,
                    spec,
                    Arc::clone(&node),
                    Arc::clone(&worker),
                    Arc::clone(&limit),
                    Arc::clone(&registry),
                    drain_tx.clone(),
                    shutdown.clone(),
                )));
            }
            drop(drain_tx);
            let _ = ready.send(Ok(()));
            for l in loops {
                let _ = l.await;
            }
            let grace = node.settings.shutdown_grace;
            let started = Instant::now();
            tokio::select! {
                _ = drained.recv() => {
                    tracing::debug!(elapsed_ms = started.elapsed().as_millis() as u64, "connections drained");
                }
                () = tokio::time::sleep(grace) => {
                    tracing::warn!(grace_ms = grace.as_millis() as u64, open = registry.len(), "grace period over; closing remaining connections");
                }
            }
        }
        .instrument(span),
    );
}

#[expect(
    clippy::too_many_arguments,
    reason = "one call site; each argument is a different shared part of the worker"
)]
async fn accept_loop(
    listener: TcpListener,
    spec: ListenerSpec,
    node: Arc<Node>,
    worker: Arc<handler::Worker>,
    limit: Arc<Semaphore>,
    registry: Arc<conn::Registry>,
    drain: mpsc::Sender<()>,
    mut shutdown: Shutdown,
) {
    let scheme: &'static str = if spec.tls.is_some() { "https" } else { "http" };
    // Shared by the listener's connections: each task holds a pointer, not
    // hyper's 240-byte builder (memory per open connection).
    let builder = Arc::new(connection_builder(
        node.settings.max_header_bytes,
        node.settings.max_headers,
    ));
    loop {
        // At the limit, the oldest idle connection makes room for the next
        // visitor (nginx reuses keep-alive connections the same way); with
        // every connection busy, the kernel backlog holds new ones until one
        // closes.
        let permit = match Arc::clone(&limit).try_acquire_owned() {
            Ok(p) => p,
            Err(TryAcquireError::Closed) => return,
            Err(TryAcquireError::NoPermits) => {
                let mut evicting = registry.evict_oldest_idle();
                loop {
                    tokio::select! {
                        permit = Arc::clone(&limit).acquire_owned() => match permit {
                            Ok(p) => break p,
                            Err(_) => return,
                        },
                        // An idle HTTP/2 connection may take its goodbye: while it
                        // does, the next oldest makes room.
                        () = tokio::time::sleep(EVICT_AGAIN), if evicting => {
                            evicting = registry.evict_oldest_idle();
                        }
                        () = shutdown.requested() => return,
                    }
                }
            }
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(err) => {
                    // EMFILE and friends: back off a little instead of spinning.
                    static LOG: waitroom_runtime::logging::LogGate =
                        waitroom_runtime::logging::LogGate::new(10);
                    if let Some(suppressed) = LOG.pass_now() {
                        tracing::warn!(%err, suppressed, "accept failed");
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = shutdown.requested() => return,
        };
        let trusted_peer = node.settings.trusted_proxies.contains(peer.ip());
        if spec.proxy_protocol && !trusted_peer {
            node.defences.record(
                Defence::ProxyProtocol,
                node.clock.now().0 / 1_000,
                Some(peer.ip()),
                "a connection to a PROXY protocol listener from outside trusted_proxies: closed",
            );
            node.metrics.count_close(CloseReason::Ended);
            drop(stream);
            continue;
        }
        // A trusted proxy carries many clients: it is not capped itself; on a
        // PROXY listener the cap applies to the client its header names.
        let address_slot = if trusted_peer {
            None
        } else {
            let Some(slot) = node
                .connections_per_address
                .try_open(peer.ip(), node.settings.max_connections_per_address)
            else {
                // HAProxy's `tcp-request connection reject` on `src_conn_cur`: the
                // cheapest answer is none.
                node.metrics.count_close(CloseReason::AddressLimit);
                drop(stream);
                continue;
            };
            Some(slot)
        };
        let _ = stream.set_nodelay(true);
        let mut conn_info = ConnInfo {
            peer,
            client: peer.ip(),
            id: worker.next_connection_id(),
        };
        let proxy_protocol = spec.proxy_protocol;
        node.metrics.connection_opened();
        let registered = registry.register();
        let node = Arc::clone(&node);
        let worker = Arc::clone(&worker);
        let builder = Arc::clone(&builder);
        let tls = spec.tls.clone();
        let drain = drain.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut _address_slot = address_slot;
            let _drain = drain;
            let state = Arc::clone(&registered.state);
            let mut stream = stream;
            let mut rest = bytes::Bytes::new();
            if proxy_protocol {
                match proxy_header(&node, &mut stream, &state, peer).await {
                    Ok((client, after, slot)) => {
                        conn_info.client = client;
                        rest = after;
                        _address_slot = slot;
                    }
                    Err(why) => {
                        drop(registered);
                        node.metrics.connection_closed(why);
                        return;
                    }
                }
            }
            let answer = {
                let node = Arc::clone(&node);
                let state = Arc::clone(&state);
                move |req: http::Request<h1::ReqBody>| {
                    let in_flight = conn::InFlight::start(&state, req.version());
                    let node = Arc::clone(&node);
                    let worker = Arc::clone(&worker);
                    async move {
                        let (resp, lines) =
                            handler::handle(&node, &worker, req, conn_info, scheme).await;
                        (resp.map(|b| conn::TrackedBody::new(b, in_flight)), lines)
                    }
                }
            };
            // What followed a PROXY header in its read is read first.
            let io = conn::Prefixed::new(conn::Watched::new(stream, Arc::clone(&state)), rest);
            let why = match tls {
                None => serve(io, &builder, answer, &state, &node, shutdown, peer).await,
                Some(acceptor) => {
                    // The TLS handshake is part of the way to the first request
                    // head, under the same deadline.
                    let deadline = state.next_check(&node.settings, Instant::now());
                    match tokio::time::timeout_at(deadline.into(), acceptor.accept(io)).await {
                        // Boxed: a TLS connection's serving future is twice
                        // a plain one's (8.8 KB against 4.1 KB here), and
                        // every connection's task is as large as its largest
                        // state. One allocation per TLS connection, beside
                        // its handshake's cost.
                        Ok(Ok(tls)) => {
                            Box::pin(serve(tls, &builder, answer, &state, &node, shutdown, peer))
                                .await
                        }
                        Ok(Err(err)) => {
                            tracing::debug!(%peer, %err, "TLS handshake failed");
                            CloseReason::Ended
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            CloseReason::HeaderTimeout
                        }
                    }
                }
            };
            drop(registered);
            node.metrics.connection_closed(why);
        });
    }
}

/// Reads a connection's PROXY header under its header deadline: the client
/// it names (the peer for a load balancer's own connection), the bytes read
/// past it, and the client's slot under `max_connections_per_address`. A
/// missing or malformed header closes the connection and counts
/// [`Defence::ProxyProtocol`].
async fn proxy_header(
    node: &Node,
    stream: &mut tokio::net::TcpStream,
    state: &conn::ConnState,
    peer: SocketAddr,
) -> Result<(IpAddr, bytes::Bytes, Option<conn::AddressSlot>), CloseReason> {
    let deadline = state.next_check(&node.settings, Instant::now());
    match proxy_protocol::read_header(stream, deadline).await {
        Ok(header) => {
            let Some(source) = header.source else {
                return Ok((peer.ip(), header.rest, None));
            };
            let client = source.ip().to_canonical();
            let slot = node
                .connections_per_address
                .try_open(client, node.settings.max_connections_per_address)
                .ok_or(CloseReason::AddressLimit)?;
            Ok((client, header.rest, Some(slot)))
        }
        Err(err) => {
            node.defences.record(
                Defence::ProxyProtocol,
                node.clock.now().0 / 1_000,
                Some(peer.ip()),
                &format!("{err}: connection closed"),
            );
            Err(match err {
                proxy_protocol::ProxyHeaderError::Timeout => CloseReason::HeaderTimeout,
                _ => CloseReason::Ended,
            })
        }
    }
}

/// Who is on the other end of a connection, as the request path needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnInfo {
    /// The socket's peer.
    pub peer: SocketAddr,
    /// The client's address: the peer, or what a trusted load balancer in
    /// front said (PROXY protocol) at accept; in the request path, resolved
    /// further from a trusted proxy's `X-Forwarded-For` (see
    /// [`crate::forwarded`]). Per-client budgets and the ticket binding use it.
    pub client: IpAddr,
    /// Unique among this node's connections since it started (worker index in
    /// the top 16 bits): what tells one client's connections from another's
    /// when they share a ticket.
    pub id: u64,
}

/// How long a connection closed for idleness may take to say goodbye (GOAWAY).
const GOODBYE: Duration = Duration::from_millis(500);

/// At the connection limit, how long to wait for an evicted connection to go
/// before evicting the next oldest idle one.
const EVICT_AGAIN: Duration = Duration::from_millis(20);

/// What the connection's task waits for besides the connection itself.
enum Side {
    Deadline,
    Woken,
    Shutdown,
}

/// The first of: the connection's next deadline, a wake-up (eviction), and
/// shutdown (when `watch_shutdown`: not once draining).
async fn side(
    state: &conn::ConnState,
    settings: &Settings,
    shutdown: &mut Shutdown,
    watch_shutdown: bool,
) -> Side {
    let next = state.next_check(settings, Instant::now());
    tokio::select! {
        () = tokio::time::sleep_until(next.into()) => Side::Deadline,
        () = state.wake.notified() => Side::Woken,
        () = shutdown.requested(), if watch_shutdown => Side::Shutdown,
    }
}

/// Serves one connection until it ends or one of its deadlines passes; says why
/// it closed. HTTP/1.1's plain requests are served by [`h1`] while they come
/// (unless `http1_fast_path` is off); hyper takes the connection at the first
/// other one, and serves HTTP/2 and upgrades.
async fn serve<I, F, Fut>(
    io: I,
    builder: &auto::Builder<TokioExecutor>,
    answer: F,
    state: &conn::ConnState,
    node: &Node,
    mut shutdown: Shutdown,
    peer: SocketAddr,
) -> CloseReason
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    F: Fn(http::Request<h1::ReqBody>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = h1::Answer<conn::TrackedBody<waitroom_runtime::body::Body>>>
        + Send
        + 'static,
{
    let settings = &node.settings;
    let (io, prefix, draining) = if settings.http1_fast_path {
        match serve_plain(io, &answer, state, settings, &mut shutdown, peer).await {
            Plain::Done(why) => return why,
            Plain::HandOff(io, prefix, draining) => {
                node.metrics
                    .connections_to_hyper
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                (io, prefix, draining)
            }
        }
    } else {
        (io, bytes::Bytes::new(), false)
    };
    // Boxed: hyper's connection (HTTP/2, upgrades, what the fast path hands
    // off) lay beside the plain path's state in this future, about 2 KB
    // more in every connection's task, most of which never leave the plain
    // path. One allocation per connection handed off (every connection
    // without the fast path).
    Box::pin(serve_hyper(
        io, prefix, draining, builder, answer, state, settings, shutdown, peer,
    ))
    .await
}

/// [`serve`]'s connection from where the fast path handed it off (or from
/// its start, without the fast path): hyper serves it, under the same
/// deadlines.
#[expect(clippy::too_many_arguments, reason = "serve's own, passed on")]
async fn serve_hyper<I, F, Fut>(
    io: I,
    prefix: bytes::Bytes,
    mut draining: bool,
    builder: &auto::Builder<TokioExecutor>,
    answer: F,
    state: &conn::ConnState,
    settings: &Settings,
    mut shutdown: Shutdown,
    peer: SocketAddr,
) -> CloseReason
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    F: Fn(http::Request<h1::ReqBody>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = h1::Answer<conn::TrackedBody<waitroom_runtime::body::Body>>>
        + Send
        + 'static,
{
    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let answered = answer(req.map(h1::ReqBody::Hyper));
        async move {
            let (mut resp, lines) = answered.await;
            if let Some(lines) = lines {
                lines.into_map(&mut resp);
            }
            Ok::<_, Infallible>(resp)
        }
    });
    // With upgrades: an admitted WebSocket becomes a tunnel (`crate::upgrade`).
    let io = conn::Prefixed::new(io, prefix);
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(conn);
    if draining {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        // Polled only when one of these fired, not on every wake-up of the
        // connection (`conn::main_or_side`).
        let side = std::pin::pin!(side(state, settings, &mut shutdown, !draining));
        let side = match conn::main_or_side(conn.as_mut(), side).await {
            conn::Either::Main(result) => {
                if let Err(err) = result {
                    tracing::debug!(%peer, %err, "connection ended with an error");
                }
                return CloseReason::Ended;
            }
            conn::Either::Side(side) => side,
        };
        match side {
            Side::Deadline => {
                match state.overdue(settings, Instant::now()) {
                    None => {}
                    // Nothing worth a goodbye: a client that never finished a
                    // request head, or one that does not read.
                    Some(why @ (CloseReason::HeaderTimeout | CloseReason::SendTimeout)) => {
                        return why;
                    }
                    Some(why) => {
                        conn.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(GOODBYE, conn.as_mut()).await;
                        return why;
                    }
                }
            }
            Side::Woken => {
                if state.evicted() {
                    // A connection that never finished a request gets no
                    // goodbye (an unfinished HTTP/2 handshake would wait for it).
                    if state.had_request() {
                        conn.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(GOODBYE, conn.as_mut()).await;
                    }
                    return CloseReason::Evicted;
                }
            }
            Side::Shutdown => {
                // HTTP/1: close once the response in flight is sent; HTTP/2: GOAWAY.
                conn.as_mut().graceful_shutdown();
                draining = true;
            }
        }
    }
}

/// How the plain HTTP/1.1 phase of a connection ended.
enum Plain<I> {
    Done(CloseReason),
    /// hyper's from here: the connection, the bytes read of its next
    /// request, and whether it was draining.
    HandOff(I, bytes::Bytes, bool),
}

/// The connection's plain HTTP/1.1 requests ([`h1::serve`]) under the same
/// deadlines, eviction and shutdown as hyper's connections below.
async fn serve_plain<I, F, Fut>(
    io: I,
    answer: &F,
    state: &conn::ConnState,
    settings: &Settings,
    shutdown: &mut Shutdown,
    peer: SocketAddr,
) -> Plain<I>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    F: Fn(http::Request<h1::ReqBody>) -> Fut,
    Fut: Future<Output = h1::Answer<conn::TrackedBody<waitroom_runtime::body::Body>>>,
{
    let ctl = h1::Control::default();
    let limits = h1::Limits {
        max_header_bytes: settings.max_header_bytes,
        max_headers: settings.max_headers,
    };
    let served = h1::serve(io, answer, limits, &ctl);
    tokio::pin!(served);
    loop {
        let side = std::pin::pin!(side(state, settings, shutdown, !ctl.draining()));
        let side = match conn::main_or_side(served.as_mut(), side).await {
            conn::Either::Main(Ok(h1::End::Closed)) => return Plain::Done(CloseReason::Ended),
            conn::Either::Main(Ok(h1::End::HandOff(io, prefix))) => {
                return Plain::HandOff(io, prefix, ctl.draining());
            }
            conn::Either::Main(Err(err)) => {
                tracing::debug!(%peer, %err, "connection ended with an error");
                return Plain::Done(CloseReason::Ended);
            }
            conn::Either::Side(side) => side,
        };
        // Closing between requests needs no goodbye on HTTP/1; a request
        // under way is answered first (within `GOODBYE`), with
        // `connection: close`.
        let why = match side {
            Side::Deadline => match state.overdue(settings, Instant::now()) {
                None => continue,
                Some(why @ (CloseReason::HeaderTimeout | CloseReason::SendTimeout)) => {
                    return Plain::Done(why);
                }
                Some(why) => why,
            },
            Side::Woken if state.evicted() => CloseReason::Evicted,
            Side::Woken => continue,
            Side::Shutdown => {
                if ctl.idle() {
                    return Plain::Done(CloseReason::Ended);
                }
                ctl.drain();
                continue;
            }
        };
        if !ctl.idle() {
            ctl.drain();
            // However it ends; a request for hyper that comes meanwhile is
            // not served.
            let _ = tokio::time::timeout(GOODBYE, served.as_mut()).await;
        }
        return Plain::Done(why);
    }
}

/// HTTP/1.1 and HTTP/2 with the limits that keep hostile clients cheap.
fn connection_builder(max_header_bytes: usize, max_headers: usize) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        // No timer of hyper's per request head: `ConnState` keeps every
        // deadline of a connection, the first head's from accept and a later
        // head's from the end of the previous answer (keep-alive, plus the
        // header deadline once its first byte came, as nginx). hyper's timer
        // boxed a sleep, registered and cancelled it for every request
        // (~660 instructions of a queue-page request's 21,000).
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .max_buf_size(max_header_bytes.max(8192))
        .max_headers(max_headers)
        // An answer's head and body copied into one buffer and sent with
        // one write, not as `writev` slices: the kernel takes one slice
        // about 0.4 µs sooner (docs/BENCHMARKS.md, "The system calls of a
        // request"); a visitor's `POST`, `+2 %` requests a second.
        .writev(false)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(max_header_bytes as u32)
        .max_concurrent_streams(256)
        .keep_alive_interval(Some(Duration::from_secs(30)));
    builder
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use bytes::Bytes;
    use http_body_util::Full;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// What hyper serves (a request with a body: a checkout's `POST`)
    /// goes out as one write of head and body, not as `writev` slices
    /// (`writev(false)`; it fails with hyper's default, which writes
    /// slices to a transport that takes them).
    #[tokio::test]
    async fn hyper_answers_in_one_write() {
        let builder = connection_builder(16 * 1024, 100);
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let writes = Arc::new(Mutex::new(Vec::new()));
        let io = h1::tests::Recorded {
            io: server,
            writes: Arc::clone(&writes),
        };
        let service = service_fn(|_req| async {
            Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(
                b"ordered\n",
            ))))
        });
        client
            .write_all(b"POST /checkout HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\nconnection: close\r\n\r\nbuy=1")
            .await
            .unwrap();
        let served = builder.serve_connection(TokioIo::new(io), service);
        let (served, read) = tokio::join!(served, async {
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.map(|_| got)
        });
        served.unwrap();
        let got = read.unwrap();
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\nordered\n"), "{text}");
        assert_eq!(*writes.lock().unwrap(), [(false, got.len())], "{text}");
    }
}
