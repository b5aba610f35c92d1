//! The aggregator's admin listener: `/status` (JSON per room and per node),
//! `/metrics` (Prometheus text) and `/healthz`. Bind it to loopback.
use std::{fmt::Write as _, sync::Arc, sync::atomic::Ordering::Relaxed};

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::net::TcpListener;

use waitroom_runtime::{
    admin::{family, text},
    body::Body,
    shutdown::Shutdown,
};

use crate::server::Shared;

/// Serves the admin endpoints until shutdown.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, shutdown: Shutdown) {
    waitroom_runtime::admin::serve_with(
        listener,
        shared,
        shutdown,
        |shared, req: Request<Incoming>| async move { route(&shared, req.uri().path()) },
    )
    .await;
}

fn route(shared: &Shared, path: &str) -> Response<Body> {
    match path {
        "/status" => {
            let now = shared.clock.now();
            let status = shared.cluster().status(now);
            let mut status = serde_json::to_value(&status).unwrap_or_default();
            if let Some(object) = status.as_object_mut() {
                object.insert("pools".into(), pool_opinions(shared, now));
            }
            let body = serde_json::to_string_pretty(&status).unwrap_or_else(|_| "{}".into());
            text(StatusCode::OK, "application/json", body)
        }
        "/metrics" => text(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            render_metrics(shared),
        ),
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        "/dashboard" => waitroom_runtime::dashboard::page(),
        "/dashboard.json" => crate::dashboard::json(shared),
        _ => text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
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

/// Prometheus text for the server counters and every room.
pub fn render_metrics(shared: &Shared) -> String {
    let now = shared.clock.now();
    let status = shared.cluster().status(now);
    let m = &shared.metrics;
    let mut out = String::with_capacity(4096);
    for (name, kind, help, value) in [
        (
            "waitroom_aggregator_connections_open",
            "gauge",
            "Node connections open.",
            m.connections_open.load(Relaxed),
        ),
        (
            "waitroom_aggregator_connections_total",
            "counter",
            "Node connections accepted.",
            m.connections_total.load(Relaxed),
        ),
        (
            "waitroom_aggregator_handshakes_refused_total",
            "counter",
            "Connections refused in the handshake (no certificate from the cluster CA).",
            m.handshakes_refused_total.load(Relaxed),
        ),
        (
            "waitroom_aggregator_reports_total",
            "counter",
            "Reports merged.",
            m.reports_total.load(Relaxed),
        ),
        (
            "waitroom_aggregator_frames_refused_total",
            "counter",
            "Frames refused: unknown version, malformed or too large.",
            m.frames_refused_total.load(Relaxed),
        ),
        (
            "waitroom_aggregator_identity_refused_total",
            "counter",
            "Reports refused: the node id is not certified by the connection's certificate.",
            m.identity_refused_total.load(Relaxed),
        ),
        (
            "waitroom_aggregator_connections_replaced_total",
            "counter",
            "Older connections closed because the same node connected again.",
            m.connections_replaced_total.load(Relaxed),
        ),
        (
            "waitroom_aggregator_snapshots_total",
            "counter",
            "Snapshots written.",
            m.snapshots_written_total.load(Relaxed),
        ),
        (
            "waitroom_aggregator_snapshot_errors_total",
            "counter",
            "Snapshots that could not be written.",
            m.snapshot_errors_total.load(Relaxed),
        ),
    ] {
        family(&mut out, name, kind, help);
        let _ = writeln!(out, "{name} {value}");
    }
    family(
        &mut out,
        "waitroom_aggregator_implausible_numbers_total",
        "counter",
        "Reported numbers corrected before merging, by reason: future_minute (dropped), clamped (beyond what the room allows).",
    );
    for (reason, n) in shared.cluster().implausible_by_reason() {
        let _ = writeln!(
            out,
            "waitroom_aggregator_implausible_numbers_total{{reason=\"{reason}\"}} {n}"
        );
    }
    let last = m.last_snapshot_ms.load(Relaxed);
    family(
        &mut out,
        "waitroom_aggregator_snapshot_age_seconds",
        "gauge",
        "Seconds since the last snapshot was written (-1: none yet).",
    );
    let age = if last == 0 {
        -1.0
    } else {
        now.0.saturating_sub(last) as f64 / 1e3
    };
    let _ = writeln!(out, "waitroom_aggregator_snapshot_age_seconds {age}");

    family(
        &mut out,
        "waitroom_aggregator_nodes",
        "gauge",
        "Nodes known, by state.",
    );
    let departed = status.nodes.iter().filter(|n| n.departed).count();
    let _ = writeln!(
        out,
        "waitroom_aggregator_nodes{{state=\"live\"}} {}",
        status.nodes.len() - departed
    );
    let _ = writeln!(
        out,
        "waitroom_aggregator_nodes{{state=\"departed\"}} {departed}"
    );

    type Field = fn(&waitroom_common::cluster::RoomStatus) -> f64;
    let per_room: [(&str, &str, Field); 5] = [
        (
            "waitroom_aggregator_active_users",
            "Active users in the room, all nodes.",
            |r| r.active_users as f64,
        ),
        (
            "waitroom_aggregator_admitted_this_minute",
            "Admits this minute, all nodes.",
            |r| r.admitted_this_minute as f64,
        ),
        (
            "waitroom_aggregator_slots_available",
            "Slots left this minute.",
            |r| r.slots_available as f64,
        ),
        (
            "waitroom_aggregator_waiting",
            "Visitors waiting, all buckets.",
            |r| r.total_waiting as f64,
        ),
        (
            "waitroom_aggregator_anywhere_leased",
            "Anywhere slots leased to nodes and not used yet.",
            |r| r.anywhere_leased as f64,
        ),
    ];
    for (name, help, field) in per_room {
        family(&mut out, name, "gauge", help);
        for room in &status.rooms {
            let _ = writeln!(out, "{name}{{room=\"{}\"}} {}", room.id, field(room));
        }
    }
    family(
        &mut out,
        "waitroom_aggregator_node_report_age_seconds",
        "gauge",
        "Seconds since each node's last report.",
    );
    for node in &status.nodes {
        let _ = writeln!(
            out,
            "waitroom_aggregator_node_report_age_seconds{{node=\"{}\",colo=\"{}\"}} {}",
            node.node,
            node.colo,
            node.last_report_age_ms as f64 / 1e3
        );
    }
    out
}
