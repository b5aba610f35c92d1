//! The operators' HTTP listener loop, shared by the node and the aggregator:
//! each serves its own routes through [`serve_with`]. Bind it to loopback; it
//! is not meant to face visitors.
//!
//! Bounded like nginx's and HAProxy's own status listeners: at most
//! [`MAX_CONNECTIONS`] at once (further clients wait in the kernel's accept
//! queue, as with nginx's `worker_connections`), and each connection lives
//! at most [`CONNECTION_DEADLINE`], request heads included: an idle or
//! slow client cannot hold the operators' door open.
use std::{convert::Infallible, sync::Arc, time::Duration};

use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::{body::Incoming, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use crate::{
    body::{Body, full},
    shutdown::Shutdown,
};

/// Admin connections served at once.
pub const MAX_CONNECTIONS: usize = 32;
/// The longest an admin connection lives: a scrape or a deny-list change
/// takes milliseconds.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);
/// A request head must arrive within this.
const HEADER_DEADLINE: Duration = Duration::from_secs(3);

/// Serves every connection with `route` and the shared `state`, until shutdown.
pub async fn serve_with<S, F, Fut>(
    listener: TcpListener,
    state: Arc<S>,
    mut shutdown: Shutdown,
    route: F,
) where
    S: Send + Sync + 'static,
    F: Fn(Arc<S>, Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Body>> + Send + 'static,
{
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            p = Arc::clone(&permits).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            () = shutdown.requested() => return,
        };
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(err) => {
                    tracing::warn!(%err, "admin accept failed");
                    // EMFILE and friends: do not spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.requested() => return,
        };
        let state = Arc::clone(&state);
        let route = route.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let svc = service_fn(move |req| {
                let fut = route(Arc::clone(&state), req);
                async move { Ok::<_, Infallible>(fut.await) }
            });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_DEADLINE);
            let conn = builder.serve_connection(TokioIo::new(stream), svc);
            if tokio::time::timeout(CONNECTION_DEADLINE, conn)
                .await
                .is_err()
            {
                tracing::debug!("admin connection closed at its deadline");
            }
        });
    }
}

/// A small text response with its content type.
pub fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}
