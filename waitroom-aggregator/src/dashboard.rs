//! The aggregator's dashboard: every room as all nodes together see it, by
//! colo and by node, read from the same [`Cluster::status`] `/status` shows.
//!
//! [`Cluster::status`]: waitroom_common::cluster::Cluster::status
use std::sync::Arc;

use waitroom_common::cluster::Status;
use waitroom_runtime::{
    dashboard::{Counts, Dashboard, NodeView, PlaceCounts, RoomView},
    shutdown::Shutdown,
};

use crate::server::Shared;

/// The dashboard's numbers, from one `/status` reading.
#[must_use]
pub fn view(status: &Status) -> Dashboard {
    let rooms = status
        .rooms
        .iter()
        .map(|room| {
            let by_node: Vec<PlaceCounts> = room
                .per_node
                .iter()
                .map(|n| PlaceCounts {
                    name: n.node.clone(),
                    colo: Some(n.colo.clone()),
                    departed: n.departed,
                    counts: Counts {
                        active_users: n.active_users,
                        admitted_this_minute: n.admitted_this_minute,
                        total_waiting: n.total_waiting,
                    },
                })
                .collect();
            RoomView {
                id: room.id.clone(),
                phase: room.phase,
                event_phase: None,
                total_active_users: room.total_active_users,
                new_users_per_minute: room.new_users_per_minute,
                counts: Counts {
                    active_users: room.active_users,
                    admitted_this_minute: room.admitted_this_minute,
                    total_waiting: room.total_waiting,
                },
                admits_per_minute: room.admits_per_minute,
                wait_estimate: room.wait_estimate,
                state_age_ms: None,
                this_node: None,
                by_colo: PlaceCounts::by_colo(&by_node),
                by_node,
            }
        })
        .collect();
    Dashboard {
        view: "aggregator",
        name: "aggregator".into(),
        colo: None,
        at_ms: status.at.0,
        rooms,
        nodes: status
            .nodes
            .iter()
            .map(|n| NodeView {
                node: n.node.clone(),
                colo: n.colo.clone(),
                last_report_age_ms: n.last_report_age_ms,
                departed: n.departed,
            })
            .collect(),
        gossip: None,
    }
}

/// The dashboard's view now.
fn current(shared: &Shared) -> Dashboard {
    let now = shared.clock.now();
    let status = shared.cluster().status(now);
    view(&status)
}

/// `GET /dashboard.json`.
pub fn json(shared: &Shared) -> http::Response<waitroom_runtime::body::Body> {
    waitroom_runtime::dashboard::json(&current(shared), &shared.history)
}

/// Samples every room into the history until shutdown.
pub async fn sample(shared: Arc<Shared>, shutdown: Shutdown) {
    waitroom_runtime::dashboard::sample_until_shutdown(shutdown, || {
        shared.history.record(&current(&shared));
    })
    .await;
}
