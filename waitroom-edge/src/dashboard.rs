//! The node's dashboard: each room as this node sees it (the global state it
//! decides with) beside its own counters, read from the node's `/status`
//! document itself, so the page and `/status` cannot disagree.
use std::sync::Arc;

use serde::Deserialize;
use waitroom_common::{estimate::WaitEstimate, phase::RoomPhase};
use waitroom_runtime::{
    dashboard::{Counts, Dashboard, GossipView, RoomView},
    shutdown::Shutdown,
};

use crate::node::Node;

/// The fields of the node's `/status` the dashboard shows. Typed, so a
/// renamed key fails here (and in the tests) rather than showing nothing.
#[derive(Debug, Deserialize)]
struct Status {
    node: String,
    colo: String,
    rooms: Vec<RoomStatus>,
    gossip: Option<GossipStatus>,
}

#[derive(Debug, Deserialize)]
struct RoomStatus {
    id: String,
    phase: RoomPhase,
    /// The scheduled event in force (`phase::event_phase`); absent: none.
    #[serde(default)]
    event_phase: Option<String>,
    wait_estimate: WaitEstimate,
    total_active_users: u64,
    new_users_per_minute: u64,
    node_active_users: u64,
    node_admitted_this_minute: u64,
    node_waiting: u64,
    global_active_users: u64,
    global_waiting: u64,
    global_admitted_this_minute: u64,
    admits_per_minute: f64,
    state_age_ms: u64,
}

#[derive(Debug, Deserialize)]
struct GossipStatus {
    connected: bool,
    fresh: bool,
    state_age_ms: Option<u64>,
}

/// The dashboard's numbers from the node's `/status` document read at `at_ms`.
pub fn view(status: serde_json::Value, at_ms: u64) -> Result<Dashboard, serde_json::Error> {
    let status: Status = serde_json::from_value(status)?;
    Ok(Dashboard {
        view: "node",
        name: status.node,
        colo: Some(status.colo),
        at_ms,
        rooms: status
            .rooms
            .into_iter()
            .map(|r| RoomView {
                id: r.id,
                phase: r.phase,
                event_phase: r.event_phase,
                total_active_users: r.total_active_users,
                new_users_per_minute: r.new_users_per_minute,
                counts: Counts {
                    active_users: r.global_active_users,
                    admitted_this_minute: r.global_admitted_this_minute,
                    total_waiting: r.global_waiting,
                },
                admits_per_minute: r.admits_per_minute,
                wait_estimate: r.wait_estimate,
                state_age_ms: Some(r.state_age_ms),
                this_node: Some(Counts {
                    active_users: r.node_active_users,
                    admitted_this_minute: r.node_admitted_this_minute,
                    total_waiting: r.node_waiting,
                }),
                by_colo: Vec::new(),
                by_node: Vec::new(),
            })
            .collect(),
        nodes: Vec::new(),
        gossip: status.gossip.map(|g| GossipView {
            connected: g.connected,
            fresh: g.fresh,
            state_age_ms: g.state_age_ms,
        }),
    })
}

/// The dashboard's view now.
fn current(node: &Node) -> Result<Dashboard, serde_json::Error> {
    let at = node.clock.now();
    view(crate::admin::status(node), at.0)
}

/// `GET /dashboard.json`.
pub fn json(node: &Node) -> http::Response<waitroom_runtime::body::Body> {
    match current(node) {
        Ok(view) => waitroom_runtime::dashboard::json(&view, &node.history),
        Err(err) => waitroom_runtime::admin::text(
            http::StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            format!("the node's /status does not read as the dashboard expects: {err}\n"),
        ),
    }
}

/// Samples every room into the history until shutdown.
pub async fn sample(node: Arc<Node>, shutdown: Shutdown) {
    waitroom_runtime::dashboard::sample_until_shutdown(shutdown, || match current(&node) {
        Ok(view) => node.history.record(&view),
        Err(err) => tracing::warn!(%err, "dashboard sample skipped"),
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room() -> serde_json::Value {
        serde_json::json!({
            "id": "shop",
            "host": "*",
            "phase": "queueing",
            "wait_estimate": WaitEstimate::fifo(6, 3.0),
            "total_active_users": 10,
            "new_users_per_minute": 5,
            "node_active_users": 2,
            "node_admitted_this_minute": 1,
            "node_waiting": 4,
            "global_active_users": 7,
            "global_waiting": 6,
            "global_admitted_this_minute": 5,
            "admits_per_minute": 3.0,
            "state_age_ms": 120,
        })
    }

    #[test]
    fn the_global_state_is_the_rooms_and_the_counters_are_this_nodes() {
        let status = serde_json::json!({
            "node": "ams-1", "colo": "ams", "rooms": [room()], "gossip": null,
        });
        let view = view(status, 42).unwrap();
        assert_eq!(
            (view.view, view.name.as_str(), view.at_ms),
            ("node", "ams-1", 42)
        );
        let r = &view.rooms[0];
        assert_eq!(r.phase, RoomPhase::Queueing);
        assert_eq!(
            r.counts,
            Counts {
                active_users: 7,
                admitted_this_minute: 5,
                total_waiting: 6
            }
        );
        assert_eq!(
            r.this_node,
            Some(Counts {
                active_users: 2,
                admitted_this_minute: 1,
                total_waiting: 4
            })
        );
        assert_eq!(r.wait_estimate.minutes, 2.0);
        assert_eq!(r.event_phase, None);
        assert!(view.gossip.is_none());
    }

    #[test]
    fn a_renamed_status_key_is_an_error_not_a_blank() {
        let mut renamed = room();
        let object = renamed.as_object_mut().unwrap();
        let value = object.remove("global_waiting").unwrap();
        object.insert("waiting_global".into(), value);
        let status = serde_json::json!({
            "node": "ams-1", "colo": "ams", "rooms": [renamed], "gossip": null,
        });
        let err = view(status, 0).unwrap_err();
        assert!(err.to_string().contains("global_waiting"), "{err}");
    }
}
