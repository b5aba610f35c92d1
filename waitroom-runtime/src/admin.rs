//! The operators' HTTP listener loop, shared by the node and the aggregator:
//! each serves its own routes through [`serve_with`]. Bind it to loopback; it
//! is not meant to face visitors.
use std::{convert::Infallible, fmt::Write as _, sync::Arc};

use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::{body::Incoming, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use crate::{
    body::{Body, full},
    shutdown::Shutdown,
};

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
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(err) => { tracing::warn!(%err, "admin accept failed"); continue; }
            },
            () = shutdown.requested() => return,
        };
        let state = Arc::clone(&state);
        let route = route.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let fut = route(Arc::clone(&state), req);
                async move { Ok::<_, Infallible>(fut.await) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
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

/// Appends one Prometheus metric family header.
pub fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}
