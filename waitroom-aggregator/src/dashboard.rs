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
                event_phase: room.event_phase.clone(),
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
                settings_version: None,
                settings_behind: false,
            })
            .collect(),
        gossip: None,
    }
}

/// The dashboard's view now.
fn current(shared: &Shared) -> Dashboard {
    let now = shared.clock.now();
    let status = shared.cluster().status(now);
    let mut dashboard = view(&status);
    let version = shared.settings.lock().version;
    let running = shared.node_settings.lock();
    for node in &mut dashboard.nodes {
        node.settings_version = running.get(&node.node).copied().flatten();
        node.settings_behind = !node.departed && node.settings_version != Some(version);
    }
    dashboard
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

#[cfg(test)]
mod tests {
    use waitroom_common::{
        aggregate::{MinuteAdmits, NodeReport, RoomReport},
        cluster::{Cluster, RoomDef},
        counters::PoolCounts,
        room::{RoomConfig, RoomId},
        time::UnixMillis,
    };

    use super::*;

    const T0: UnixMillis = UnixMillis(1_700_000_000_000);

    fn report(node: &str, colo: &str, active: i64, waiting: i64) -> NodeReport {
        let m = T0.minute();
        NodeReport {
            node: node.into(),
            colo: colo.into(),
            at: T0,
            rooms: vec![RoomReport {
                room: RoomId::from_name("shop"),
                expiries: vec![(
                    waitroom_common::time::ExpirySlot::end_of_minute(m.plus(3)),
                    active,
                )],
                admits: vec![MinuteAdmits {
                    minute: m,
                    admits: PoolCounts::default(),
                }],
                waiting: vec![(m, waiting)],
                distinct_visitors: vec![],
            }],
        }
    }

    #[test]
    fn the_room_by_colo_and_by_node_adds_up_to_the_status() {
        let room = RoomDef {
            name: "shop".into(),
            room: RoomConfig::with_limits(100, 10)
                .validate()
                .unwrap()
                .named("shop"),
        };
        let mut cluster = Cluster::new(vec![room], 5_000);
        cluster.apply(report("ams-1", "ams", 3, 1), T0);
        cluster.apply(report("ams-2", "ams", 4, 0), T0);
        cluster.apply(report("sin-1", "sin", 5, 2), T0);
        let status = cluster.status(T0);
        let view = view(&status);
        let r = &view.rooms[0];
        assert_eq!(r.counts.active_users, status.rooms[0].active_users);
        assert_eq!(r.counts.active_users, 12);
        assert_eq!(r.counts.total_waiting, 3);
        let colos: Vec<(&str, u64, u64)> = r
            .by_colo
            .iter()
            .map(|c| {
                (
                    c.name.as_str(),
                    c.counts.active_users,
                    c.counts.total_waiting,
                )
            })
            .collect();
        assert_eq!(colos, [("ams", 7, 1), ("sin", 5, 2)]);
        assert_eq!(r.by_node.len(), 3);
        assert_eq!(view.nodes.len(), 3);
        assert_eq!(r.phase, status.rooms[0].phase);
    }
}
