//! The per-core data plane.
//!
//! One OS thread per core, each running a current-thread tokio runtime with its
//! own `SO_REUSEPORT` listeners (the kernel spreads connections between them),
//! its own origin connection pool, and nothing shared on the request path but
//! the node's atomics. This is pingora's no-steal model: a connection stays on
//! the core that accepted it.
use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::Arc,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use hyper::service::service_fn;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::{conn::auto, graceful::GracefulShutdown},
};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::{net::TcpListener, sync::Semaphore};
use tracing::Instrument as _;

use waitroom_runtime::shutdown::Shutdown;

use crate::node::Node;

pub mod handler;

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
}

impl std::fmt::Debug for ListenerSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerSpec")
            .field("addr", &self.addr)
            .field("tls", &self.tls.is_some())
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
        },
    ))
}

/// Starts `count` worker threads serving `listeners`. Each returns when shutdown is
/// requested and its connections have drained (or the grace period ran out).
pub fn spawn_workers(
    count: usize,
    node: Arc<Node>,
    listeners: Vec<(std::net::TcpListener, ListenerSpec)>,
    shutdown: Shutdown,
) -> std::io::Result<Vec<JoinHandle<()>>> {
    let mut firsts: Vec<Option<std::net::TcpListener>> =
        listeners.iter().map(|(l, _)| l.try_clone().ok()).collect();
    let specs: Vec<ListenerSpec> = listeners.into_iter().map(|(_, s)| s).collect();
    let mut handles = Vec::with_capacity(count);
    for index in 0..count {
        let mut sockets = Vec::with_capacity(specs.len());
        for (i, spec) in specs.iter().enumerate() {
            let socket = match firsts[i].take() {
                Some(first) if index == 0 => first,
                _ => bind_reuseport(spec.addr, 4096)?,
            };
            sockets.push((socket, spec.clone()));
        }
        let node = Arc::clone(&node);
        let shutdown = shutdown.clone();
        let handle = std::thread::Builder::new()
            .name(format!("waitroom-w{index}"))
            .spawn(move || worker_main(index, node, sockets, shutdown))?;
        handles.push(handle);
    }
    Ok(handles)
}

fn worker_main(
    index: usize,
    node: Arc<Node>,
    sockets: Vec<(std::net::TcpListener, ListenerSpec)>,
    shutdown: Shutdown,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            tracing::error!(worker = index, %err, "cannot start the worker runtime");
            return;
        }
    };
    let span = tracing::info_span!("worker", id = index);
    runtime.block_on(
        async move {
            let worker = Arc::new(handler::Worker::new(index, &node));
            let limit = Arc::new(Semaphore::new(node.settings.max_connections_per_worker));
            let graceful = Arc::new(GracefulShutdown::new());
            let mut loops = Vec::new();
            for (socket, spec) in sockets {
                let listener = match TcpListener::from_std(socket) {
                    Ok(l) => l,
                    Err(err) => {
                        tracing::error!(%err, addr = %spec.addr, "cannot register listener");
                        continue;
                    }
                };
                loops.push(tokio::spawn(accept_loop(
                    listener,
                    spec,
                    Arc::clone(&node),
                    Arc::clone(&worker),
                    Arc::clone(&limit),
                    Arc::clone(&graceful),
                    shutdown.clone(),
                )));
            }
            for l in loops {
                let _ = l.await;
            }
            let grace = node.settings.shutdown_grace;
            // The accept loops have returned, so theirs were the only other handles.
            let Ok(graceful) = Arc::try_unwrap(graceful) else {
                tracing::error!("shutdown handle still shared; not draining");
                return;
            };
            let started = Instant::now();
            tokio::select! {
                () = graceful.shutdown() => {
                    tracing::debug!(elapsed_ms = started.elapsed().as_millis() as u64, "connections drained");
                }
                () = tokio::time::sleep(grace) => {
                    tracing::warn!(grace_ms = grace.as_millis() as u64, "grace period over; closing remaining connections");
                }
            }
        }
        .instrument(span),
    );
}

async fn accept_loop(
    listener: TcpListener,
    spec: ListenerSpec,
    node: Arc<Node>,
    worker: Arc<handler::Worker>,
    limit: Arc<Semaphore>,
    graceful: Arc<GracefulShutdown>,
    mut shutdown: Shutdown,
) {
    let scheme: &'static str = if spec.tls.is_some() { "https" } else { "http" };
    let builder = connection_builder(&node.settings);
    loop {
        // Backpressure: at the limit we stop accepting and let the kernel backlog hold
        // new connections until one closes.
        let permit = tokio::select! {
            permit = Arc::clone(&limit).acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => return,
            },
            () = shutdown.requested() => return,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(err) => {
                    // EMFILE and friends: back off a little instead of spinning.
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = shutdown.requested() => return,
        };
        let _ = stream.set_nodelay(true);
        node.metrics.connection_opened();
        let node = Arc::clone(&node);
        let worker = Arc::clone(&worker);
        let builder = builder.clone();
        let tls = spec.tls.clone();
        // A watcher, not the Arc: once the accept loops end, the worker owns the
        // shutdown handle alone and can drain.
        let graceful = graceful.watcher();
        tokio::spawn(async move {
            let _permit = permit;
            let service = {
                let node = Arc::clone(&node);
                service_fn(move |req| {
                    let node = Arc::clone(&node);
                    let worker = Arc::clone(&worker);
                    async move {
                        Ok::<_, Infallible>(
                            handler::handle(&node, &worker, req, peer, scheme).await,
                        )
                    }
                })
            };
            let result = match tls {
                None => {
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    graceful.watch(conn.into_owned()).await
                }
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(
                        node.settings.header_read_timeout,
                        acceptor.accept(stream),
                    )
                    .await;
                    match handshake {
                        Ok(Ok(tls)) => {
                            let conn = builder.serve_connection(TokioIo::new(tls), service);
                            graceful.watch(conn.into_owned()).await
                        }
                        Ok(Err(err)) => {
                            tracing::debug!(%peer, %err, "TLS handshake failed");
                            Ok(())
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            Ok(())
                        }
                    }
                }
            };
            if let Err(err) = result {
                tracing::debug!(%peer, %err, "connection ended with an error");
            }
            node.metrics.connection_closed();
        });
    }
}

/// HTTP/1.1 and HTTP/2 with the limits that keep hostile clients cheap.
fn connection_builder(settings: &crate::node::Settings) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout)
        .max_buf_size(settings.max_header_bytes.max(8192))
        .max_headers(settings.max_headers)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(settings.max_header_bytes as u32)
        .max_concurrent_streams(256)
        .keep_alive_interval(Some(Duration::from_secs(30)));
    builder
}
