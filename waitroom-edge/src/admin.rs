//! The admin listener: Prometheus metrics and status, for operators only.
//!
//! Bind it to loopback; it is not meant to face visitors.
use std::{fmt::Write as _, sync::Arc, sync::atomic::Ordering::Relaxed};

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use waitroom_runtime::{
    admin::{family, serve_with, text},
    body::Body,
    shutdown::Shutdown,
};

use crate::{metrics, node::Node};

/// Serves the node's admin endpoints until shutdown.
pub async fn serve(listener: TcpListener, node: Arc<Node>, shutdown: Shutdown) {
    serve_with(listener, node, shutdown, |node, req| async move {
        route(&node, req).await
    })
    .await;
}

async fn route(node: &Node, req: Request<Incoming>) -> Response<Body> {
    match req.uri().path() {
        "/metrics" => text(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            render_metrics(node),
        ),
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        "/status" => text(
            StatusCode::OK,
            "application/json",
            serde_json::to_string_pretty(&status(node)).unwrap_or_default(),
        ),
        "/deny" => deny(node, &req),
        _ => text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

/// The XDP deny list: `GET /deny` lists prefixes with their drop counts,
/// `POST /deny?prefix=P` adds one, `DELETE /deny?prefix=P` removes one.
fn deny(node: &Node, req: &Request<Incoming>) -> Response<Body> {
    let guard = node.xdp.as_ref().map(|x| Arc::clone(&x.guard));
    let Some(guard) = guard else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "the XDP program is not attached on this node (see the warning at start)\n".into(),
        );
    };
    if req.method() == http::Method::GET {
        return match guard.deny_list() {
            Ok(list) => {
                let rows: Vec<serde_json::Value> = list
                    .iter()
                    .map(|(p, drops)| serde_json::json!({"prefix": p.to_string(), "dropped_packets": drops}))
                    .collect();
                text(
                    StatusCode::OK,
                    "application/json",
                    serde_json::to_string_pretty(&rows).unwrap_or_default(),
                )
            }
            Err(err) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                format!("{err}\n"),
            ),
        };
    }
    let prefix = req
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .find_map(|kv| kv.strip_prefix("prefix="))
        .unwrap_or_default();
    let prefix: crate::xdp::IpPrefix = match prefix.parse() {
        Ok(p) => p,
        Err(err) => {
            return text(
                StatusCode::BAD_REQUEST,
                "text/plain",
                format!("prefix: {err}\n"),
            );
        }
    };
    let result = match *req.method() {
        http::Method::POST | http::Method::PUT => {
            guard.deny(prefix).map(|()| format!("denied {prefix}\n"))
        }
        http::Method::DELETE => guard.allow(prefix).map(|was| {
            if was {
                format!("allowed {prefix}\n")
            } else {
                format!("{prefix} was not denied\n")
            }
        }),
        _ => {
            return text(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "use GET, POST or DELETE\n".into(),
            );
        }
    };
    match result {
        Ok(msg) => {
            tracing::info!(%prefix, method = %req.method(), "deny list changed");
            text(StatusCode::OK, "text/plain", msg)
        }
        Err(err) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            format!("{err}\n"),
        ),
    }
}

fn render_metrics(node: &Node) -> String {
    let mut out = String::with_capacity(8192);
    let m = &node.metrics;
    family(
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
    family(
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
    family(
        &mut out,
        "waitroom_connections_closed_total",
        "counter",
        "Visitor connections closed, by reason (timeouts, limits, or ended).",
    );
    m.render_closed(&mut out);
    family(
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
    render_rooms(&mut out, node);
    if let Some(t) = node.xdp.as_ref().map(|x| &x.telemetry) {
        t.render(&mut out);
    }
    family(
        &mut out,
        "waitroom_xdp_attached",
        "gauge",
        "1 when the XDP program is attached.",
    );
    let _ = writeln!(
        out,
        "waitroom_xdp_attached {}",
        u8::from(node.xdp.is_some())
    );
    node.reloads.render(&mut out);
    node.refused_targets.render(&mut out);
    crate::upstream::status::render_metrics(&mut out, node.rooms.iter().map(|r| &*r.upstream));
    if let Some(gossip) = node.gossip.as_ref() {
        gossip
            .status
            .render(&mut out, &gossip.world, node.clock.now());
    }
    out
}

fn render_rooms(out: &mut String, node: &Node) {
    let now = node.clock.now();
    let minute = now.minute();
    family(
        out,
        "waitroom_active_users",
        "gauge",
        "Visitors with a live session: this node's count and the global view.",
    );
    family(
        out,
        "waitroom_waiting",
        "gauge",
        "Visitors waiting in the queue: this node's count and the global view.",
    );
    family(
        out,
        "waitroom_admitted_this_minute",
        "gauge",
        "Admissions in the current minute, this node.",
    );
    family(
        out,
        "waitroom_admits_per_minute",
        "gauge",
        "Admit rate (EWMA over complete minutes) in the global view.",
    );
    for (i, room) in node.rooms.iter().enumerate() {
        let c = node.room_counters(i);
        let state = room.state.load();
        let id = &room.spec.id;
        let local_waiting = c.total_waiting(minute);
        let _ = writeln!(
            out,
            "waitroom_active_users{{room=\"{id}\",scope=\"node\"}} {}",
            c.active_users(minute)
        );
        let _ = writeln!(
            out,
            "waitroom_active_users{{room=\"{id}\",scope=\"global\"}} {}",
            state.active_users
        );
        let _ = writeln!(
            out,
            "waitroom_waiting{{room=\"{id}\",scope=\"node\"}} {local_waiting}"
        );
        let _ = writeln!(
            out,
            "waitroom_waiting{{room=\"{id}\",scope=\"global\"}} {}",
            state.total_waiting
        );
        let _ = writeln!(
            out,
            "waitroom_admitted_this_minute{{room=\"{id}\"}} {}",
            c.admits(minute).total()
        );
        let _ = writeln!(
            out,
            "waitroom_admits_per_minute{{room=\"{id}\"}} {}",
            state.admits_per_minute
        );
    }
    family(
        out,
        "waitroom_admitted_total",
        "counter",
        "Visitors sent to the origin.",
    );
    family(
        out,
        "waitroom_queued_total",
        "counter",
        "Queue pages and JSON answers served.",
    );
    family(
        out,
        "waitroom_rejected_total",
        "counter",
        "Visitors refused (queueing method reject).",
    );
    family(
        out,
        "waitroom_proxy_errors_total",
        "counter",
        "Origin requests that failed (502).",
    );
    family(
        out,
        "waitroom_client_body_errors_total",
        "counter",
        "Requests whose body the client cut short or malformed (400; not the origin's fault).",
    );
    family(
        out,
        "waitroom_cookie_failures_total",
        "counter",
        "Cookies that could not be used; each made a new visitor.",
    );
    family(
        out,
        "waitroom_decision_seconds",
        "histogram",
        "Time to open the cookie, decide and seal the new cookie.",
    );
    family(
        out,
        "waitroom_proxy_seconds",
        "histogram",
        "Time until the origin's response head.",
    );
    for room in &node.rooms {
        metrics::render_room(out, &room.spec.id, &room.metrics);
    }
}

/// Per-room status for operators and tests.
fn status(node: &Node) -> serde_json::Value {
    let now = node.clock.now();
    let minute = now.minute();
    let rooms: Vec<serde_json::Value> = node
        .rooms
        .iter()
        .enumerate()
        .map(|(i, room)| {
            let c = node.room_counters(i);
            let state = room.state.load();
            let live = room.live.load();
            let cfg = live.engine.config();
            serde_json::json!({
                "id": room.spec.id,
                "host": room.spec.host,
                "path": room.spec.path,
                "upstream": crate::upstream::status::json(&room.upstream),
                "queueing_method": cfg.queueing_method,
                "total_active_users": cfg.total_active_users,
                "new_users_per_minute": cfg.new_users_per_minute,
                "node_active_users": c.active_users(minute),
                "node_admitted_this_minute": c.admits(minute).total(),
                "node_waiting": c.total_waiting(minute),
                "global_active_users": state.active_users,
                "global_waiting": state.total_waiting,
                "global_admitted_this_minute": state.admitted_this_minute,
                "admits_per_minute": state.admits_per_minute,
                "state_age_ms": now.0.saturating_sub(state.as_of.0),
                "buckets": state.buckets,
            })
        })
        .collect();
    let gossip = node.gossip.as_ref().map(|g| {
        let freshness = g.world.freshness(now);
        serde_json::json!({
            "connected": g.status.connected.load(Relaxed),
            "fresh": freshness.is_fresh(),
            "state_age_ms": freshness.age_ms(),
            "reports_total": g.status.reports_total.load(Relaxed),
            "errors_total": g.status.errors_total.load(Relaxed),
        })
    });
    serde_json::json!({ "node": node.id, "colo": node.colo, "rooms": rooms, "gossip": gossip })
}
