//! The admin listener: Prometheus metrics and status, for operators only.
//!
//! Bind it to loopback; it is not meant to face visitors.
use std::{convert::Infallible, fmt::Write as _, sync::Arc, sync::atomic::Ordering::Relaxed};

use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::{body::Incoming, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use crate::{
    Node,
    http::{Body, full},
    metrics,
    shutdown::Shutdown,
};

/// Serves the admin endpoints until shutdown.
pub async fn serve(listener: TcpListener, node: Arc<Node>, mut shutdown: Shutdown) {
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(err) => { tracing::warn!(%err, "admin accept failed"); continue; }
            },
            () = shutdown.requested() => return,
        };
        let node = Arc::clone(&node);
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let node = Arc::clone(&node);
                async move { Ok::<_, Infallible>(route(&node, req).await) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

async fn route(node: &Node, req: Request<Incoming>) -> Response<Body> {
    match req.uri().path() {
        "/metrics" => text(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            render_metrics(node),
        ),
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        _ => text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

fn render_metrics(node: &Node) -> String {
    let mut out = String::with_capacity(8192);
    let m = &node.metrics;
    metrics::family(
        &mut out,
        "waitroom_connections_open",
        "gauge",
        "Open visitor connections.",
    );
    let _ = writeln!(
        out,
        "waitroom_connections_open {}",
        m.connections_open.load(Relaxed)
    );
    metrics::family(
        &mut out,
        "waitroom_connections_total",
        "counter",
        "Visitor connections accepted.",
    );
    let _ = writeln!(
        out,
        "waitroom_connections_total {}",
        m.connections_total.load(Relaxed)
    );
    metrics::family(
        &mut out,
        "waitroom_requests_unmatched_total",
        "counter",
        "Requests no room covers.",
    );
    let _ = writeln!(
        out,
        "waitroom_requests_unmatched_total {}",
        m.requests_unmatched.load(Relaxed)
    );
    out
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}
