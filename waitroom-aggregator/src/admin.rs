//! The aggregator's admin listener: `/status` (JSON per room and per node),
//! `/metrics` (OpenMetrics text), the live dashboard (`/dashboard`, polling
//! `/dashboard.json`), `/healthz`, and the control API under `/api/`
//! (bearer tokens; see [`waitroom_runtime::control`]). Bind it to loopback.
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::net::TcpListener;

use waitroom_runtime::{
    admin::text, body::Body, control::Control, metrics::Registry, shutdown::Shutdown,
};

use crate::server::Shared;

/// Serves the admin endpoints until shutdown.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    control: Arc<Control>,
    shutdown: Shutdown,
) {
    let metrics = crate::exposition::registry(Arc::clone(&shared));
    waitroom_runtime::admin::serve_with(
        listener,
        shared,
        shutdown,
        move |shared, req: Request<Incoming>| {
            let metrics = Arc::clone(&metrics);
            let control = Arc::clone(&control);
            async move {
                if req.uri().path().starts_with("/api/") {
                    return waitroom_runtime::control::serve(control, req).await;
                }
                route(&shared, &metrics, req.uri().path())
            }
        },
    )
    .await;
}

fn route(shared: &Shared, metrics: &Registry, path: &str) -> Response<Body> {
    match path {
        "/status" => {
            let now = shared.clock.now();
            let cluster = shared.cluster().status(now);
            let mut status = serde_json::to_value(&cluster).unwrap_or_default();
            if let Some(object) = status.as_object_mut() {
                object.insert("pools".into(), pool_opinions(shared, now));
                object.insert("settings".into(), settings_status(shared, &cluster));
            }
            let body = serde_json::to_string_pretty(&status).unwrap_or_else(|_| "{}".into());
            text(StatusCode::OK, "application/json", body)
        }
        "/metrics" => waitroom_runtime::metrics::response(metrics),
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        "/dashboard" => waitroom_runtime::dashboard::page(),
        "/dashboard.json" => crate::dashboard::json(shared),
        _ => text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

/// The settings version in force and the one each live node runs: a node
/// that runs another is `behind` (it has not applied the last push yet, or
/// refused it; its log says why).
fn settings_status(
    shared: &Shared,
    status: &waitroom_common::cluster::Status,
) -> serde_json::Value {
    let version = shared.settings.lock().version;
    let running = shared.node_settings.lock();
    let nodes: Vec<serde_json::Value> = status
        .nodes
        .iter()
        .filter(|n| !n.departed)
        .map(|n| {
            let runs = running.get(&n.node).copied().flatten();
            serde_json::json!({
                "node": n.node,
                "version": runs,
                "behind": runs != Some(version),
            })
        })
        .collect();
    let behind: Vec<&serde_json::Value> = nodes.iter().filter(|n| n["behind"] == true).collect();
    serde_json::json!({ "version": version, "nodes_behind": behind.len(), "nodes": nodes })
}

/// Every node's opinion of every origin pool, as last reported.
fn pool_opinions(shared: &Shared, now: waitroom_common::time::UnixMillis) -> serde_json::Value {
    let nodes = shared.pools.lock();
    let mut rows = Vec::new();
    for (node, view) in nodes.iter() {
        for p in &view.pools {
            rows.push(serde_json::json!({
                "node": node,
                "colo": view.colo,
                "reported_ms_ago": now.0.saturating_sub(view.at.0),
                "room": p.room,
                "pool": p.pool,
                "up": p.up,
                "rtt_ewma_ms": p.rtt_ewma_micros.map(|us| us as f64 / 1000.0),
            }));
        }
    }
    serde_json::Value::Array(rows)
}
