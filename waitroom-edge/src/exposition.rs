//! The node's `/metrics`: one `prometheus-client` collector that reads the
//! node's atomics and states when scraped (see `waitroom_runtime::metrics`).
//!
//! Nothing here runs on the request path: the workers keep adding to their
//! relaxed atomics, and this module turns them into families, each family
//! once, with every room's sample under the one header.
use std::{fmt, sync::Arc};

use waitroom_common::phase::arrival_estimate;
use waitroom_runtime::metrics::{self as exposition, Families, Registry};

use crate::node::Node;

/// The registry the admin listener serves: one collector over `node`.
pub fn registry(node: Arc<Node>) -> Arc<Registry> {
    exposition::registry(move |f| scrape(&node, f))
}

/// Every family of the node, in a stable order.
fn scrape(node: &Node, f: &mut Families<'_>) -> fmt::Result {
    exposition::build_info(f, env!("CARGO_PKG_VERSION"))?;
    node.metrics.encode(f)?;
    rooms(node, f)?;
    limits(node, f)?;
    f.gauge(
        "waitroom_xdp_attached",
        "1 when the XDP program is attached.",
        i64::from(node.xdp.is_some()),
    )?;
    if let Some(x) = node.xdp.as_ref() {
        x.telemetry.encode(f)?;
    }
    node.reloads.encode(f)?;
    node.refused_targets.encode(f)?;
    node.defences.encode(f)?;
    node.access_log.encode(f)?;
    node.unrouted.encode(f)?;
    crate::upstream::status::encode(
        f,
        node.rooms
            .iter()
            .map(|r| &*r.upstream)
            .chain(node.unrouted.origin.as_deref()),
    )?;
    if let Some(gossip) = node.gossip.as_ref() {
        gossip
            .status
            .encode(f, &gossip.world, node.clock.elapsed())?;
        gossip.lease.encode(f)?;
    }
    Ok(())
}

/// Each room's counts, this node's and the global view's.
fn rooms(node: &Node, f: &mut Families<'_>) -> fmt::Result {
    let now = node.clock.now();
    let minute = now.minute();
    let ids = || {
        node.rooms
            .iter()
            .enumerate()
            .map(|(i, r)| (i, r.spec.id.as_str()))
    };
    f.gauges(
        "waitroom_active_users",
        "Visitors with a live session: this node's count and the global view.",
        ids().flat_map(|(i, id)| {
            [
                (
                    [("room", id), ("scope", "node")],
                    node.room_counters(i).active_users(now.expiry_slot()),
                ),
                (
                    [("room", id), ("scope", "global")],
                    gauge_i64(node.rooms[i].state.load().active_users),
                ),
            ]
        }),
    )?;
    f.gauges(
        "waitroom_waiting",
        "Visitors waiting in the queue: this node's count and the global view.",
        ids().flat_map(|(i, id)| {
            [
                (
                    [("room", id), ("scope", "node")],
                    node.room_counters(i).total_waiting(minute),
                ),
                (
                    [("room", id), ("scope", "global")],
                    gauge_i64(node.rooms[i].state.load().total_waiting),
                ),
            ]
        }),
    )?;
    f.gauges(
        "waitroom_admitted_this_minute",
        "Admissions in the current minute, this node.",
        ids().map(|(i, id)| ([("room", id)], node.room_counters(i).admits(minute).total())),
    )?;
    f.gauges(
        "waitroom_admits_per_minute",
        "Admit rate (EWMA over complete minutes) in the global view.",
        ids().map(|(i, id)| ([("room", id)], node.rooms[i].state.load().admits_per_minute)),
    )?;
    crate::metrics::encode_rooms(
        f,
        node.rooms.iter().map(|r| (r.spec.id.as_str(), &r.metrics)),
    )?;
    let lives: Vec<_> = node.rooms.iter().map(|r| r.live.load_full()).collect();
    crate::bypass::encode(
        f,
        node.rooms
            .iter()
            .zip(&lives)
            .map(|(r, live)| (r.spec.id.as_str(), &live.bypass)),
    )
}

/// Each room's limits as the configuration in force says (start or last
/// applied reload), so a graph can draw usage against its limit.
fn limits(node: &Node, f: &mut Families<'_>) -> fmt::Result {
    let lives: Vec<_> = node.rooms.iter().map(|r| r.live.load_full()).collect();
    let rooms = || {
        node.rooms
            .iter()
            .zip(&lives)
            .map(|(r, live)| (r.spec.id.as_str(), live.engine.config()))
    };
    f.gauges(
        "waitroom_active_users_limit",
        "The room's total_active_users: most visitors with a live session at once, all nodes.",
        rooms().map(|(id, c)| ([("room", id)], c.total_active_users)),
    )?;
    f.gauges(
        "waitroom_new_users_per_minute_limit",
        "The room's new_users_per_minute: most admissions in one minute, all nodes.",
        rooms().map(|(id, c)| ([("room", id)], c.new_users_per_minute)),
    )?;
    f.gauges(
        "waitroom_session_duration_seconds",
        "The room's session_duration: how long a visitor stays active after their last request (or admission).",
        rooms().map(|(id, c)| ([("room", id)], u64::from(c.session_duration) * 60)),
    )?;
    f.gauges(
        "waitroom_wait_estimate_seconds",
        exposition::WAIT_ESTIMATE_HELP,
        node.rooms.iter().zip(&lives).filter_map(|(r, live)| {
            let wait = arrival_estimate(&live.engine, &r.state.load(), node.clock.now().minute())
                .known_seconds()?;
            Some(([("room", r.spec.id.as_str())], wait))
        }),
    )?;
    let version = node.settings_version();
    f.gauges(
        "waitroom_settings_version",
        exposition::SETTINGS_VERSION_HELP,
        rooms().map(|(id, _)| ([("room", id)], version)),
    )
}

/// A count for a family whose node-side samples are signed (the node's
/// counters may dip below zero for a moment while a count moves minutes).
fn gauge_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
