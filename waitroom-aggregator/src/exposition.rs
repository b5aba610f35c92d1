//! The aggregator's `/metrics`: one `prometheus-client` collector that reads
//! the server's atomics and the cluster's status when scraped (see
//! `waitroom_runtime::metrics`). The QUIC tasks only add to atomics.
use std::{fmt, sync::Arc, sync::atomic::Ordering::Relaxed};

use waitroom_common::cluster::RoomStatus;
use waitroom_runtime::metrics::{self as exposition, Families, Registry};

use crate::server::Shared;

/// The registry the admin listener serves: one collector over `shared`.
pub fn registry(shared: Arc<Shared>) -> Arc<Registry> {
    exposition::registry(move |f| scrape(&shared, f))
}

/// Every family of the aggregator, in a stable order.
fn scrape(shared: &Shared, f: &mut Families<'_>) -> fmt::Result {
    exposition::build_info(f, env!("CARGO_PKG_VERSION"))?;
    let now = shared.clock.now();
    // One short hold of the cluster lock: the status, the corrections and
    // the rooms' limits, then everything is written without it.
    let (status, implausible, departures, limits, learning) = {
        let cluster = shared.cluster();
        let limits: Vec<(String, waitroom_common::room::RoomConfig)> = cluster
            .rooms()
            .iter()
            .map(|r| (r.name.clone(), r.room.config().clone()))
            .collect();
        (
            cluster.status(now),
            cluster.implausible_by_reason(),
            cluster.departures_total(),
            limits,
            cluster.learning(now),
        )
    };
    let m = &shared.metrics;
    f.gauge(
        "waitroom_aggregator_connections_open",
        "Node connections open.",
        m.connections_open.load(Relaxed),
    )?;
    for (name, help, value) in [
        (
            "waitroom_aggregator_connections_total",
            "Node connections accepted.",
            &m.connections_total,
        ),
        (
            "waitroom_aggregator_handshakes_refused_total",
            "Connections refused in the handshake (no certificate from the cluster CA).",
            &m.handshakes_refused_total,
        ),
        (
            "waitroom_aggregator_reports_total",
            "Reports merged.",
            &m.reports_total,
        ),
        (
            "waitroom_aggregator_peer_reports_total",
            "Of the reports merged, those of nodes whose home is another aggregator (no grant).",
            &m.peer_reports_total,
        ),
        (
            "waitroom_aggregator_holding_reports_total",
            "Of the reports merged, home reports that said which leases the node holds.",
            &m.holding_reports_total,
        ),
        (
            "waitroom_aggregator_held_visitor_reports_total",
            "Of the home reports, those that named visitors the node held for the answer.",
            &m.held_visitor_reports_total,
        ),
        (
            "waitroom_aggregator_frame_bytes_total",
            "Bytes of the gossip frames received from nodes (frame header and payload; QUIC's own overhead not counted).",
            &m.frame_bytes_total,
        ),
        (
            "waitroom_aggregator_changes_bytes_total",
            "Of them, the bytes of reports sent as changes.",
            &m.changes_bytes_total,
        ),
        (
            "waitroom_aggregator_changes_reports_total",
            "Reports received as the changes since an earlier report of the connection, rebuilt whole.",
            &m.changes_reports_total,
        ),
        (
            "waitroom_aggregator_changes_refused_total",
            "Reports as changes refused: against a report not held for the connection, or not fitting it (the node sends the report whole).",
            &m.changes_refused_total,
        ),
        (
            "waitroom_aggregator_frames_refused_total",
            "Frames refused: unknown version, malformed or too large.",
            &m.frames_refused_total,
        ),
        (
            "waitroom_aggregator_identity_refused_total",
            "Reports refused: the node id is not certified by the connection's certificate.",
            &m.identity_refused_total,
        ),
        (
            "waitroom_aggregator_foreign_rooms_total",
            "Rooms left out of reports because another aggregator group owns them ([shard]; a node whose groups differ from this aggregator's).",
            &m.foreign_rooms_total,
        ),
        (
            "waitroom_aggregator_connections_replaced_total",
            "Older connections closed because the same node connected again.",
            &m.connections_replaced_total,
        ),
        (
            "waitroom_aggregator_snapshots_total",
            "Snapshots written.",
            &m.snapshots_written_total,
        ),
        (
            "waitroom_aggregator_snapshot_errors_total",
            "Snapshots that could not be written.",
            &m.snapshot_errors_total,
        ),
        (
            "waitroom_aggregator_clock_steps_total",
            "Steps of the wall clock of a second or more seen between merges (the nodes count on this clock; check NTP).",
            &m.clock_steps_total,
        ),
    ] {
        f.counter(name, help, value.load(Relaxed))?;
    }
    f.histogram(
        "waitroom_aggregator_merge_seconds",
        "Time each node report held the cluster lock: merged into the global view and its answer computed.",
        &m.merge.snapshot(),
    )?;
    f.counters(
        "waitroom_aggregator_implausible_numbers_total",
        "Reported numbers corrected before merging, by reason: future_minute (dropped), clamped (beyond what the room allows).",
        implausible.map(|(reason, n)| ([("reason", reason)], n)),
    )?;
    let last = m.last_snapshot_ms.load(Relaxed);
    if last != 0 {
        f.gauge(
            "waitroom_aggregator_last_snapshot_timestamp_seconds",
            "When the last snapshot was written (absent before the first).",
            last as f64 / 1e3,
        )?;
    }
    shared.reloads.encode(f)?;
    {
        // Zero without a `[ledger]`, so dashboards and alerts need no case.
        let none = crate::committer::LedgerMetrics::default();
        let l = shared.ledger.as_ref().map_or(&none, |c| &*c.metrics);
        for (name, help, value) in [
            (
                "waitroom_aggregator_ledger_commits_total",
                "Compare-and-swap commits of grants to etcd (one per room and minute per batch) that succeeded.",
                &l.commits_total,
            ),
            (
                "waitroom_aggregator_ledger_commit_failures_total",
                "Commits to etcd that failed (no quorum, deadline, contention, junk at the key); their nodes kept what they held and got nothing new.",
                &l.commit_failures_total,
            ),
            (
                "waitroom_aggregator_ledger_grants_cut_total",
                "Grants etcd cut because other aggregators' grants left less room.",
                &l.grants_cut_total,
            ),
            (
                "waitroom_aggregator_ledger_grants_held_back_total",
                "Grants answered with only what the node held, because no commit covered them.",
                &l.grants_held_back_total,
            ),
            (
                "waitroom_aggregator_ledger_queue_full_total",
                "Reports answered at once with what their nodes held, because 4096 reports were already waiting for a commit.",
                &l.queue_full_total,
            ),
            (
                "waitroom_aggregator_ledger_batches_total",
                "Batches of grants committed (every report waiting when the last batch ended).",
                &l.batches_total,
            ),
            (
                "waitroom_aggregator_ledger_batched_grants_total",
                "Grants carried by those batches.",
                &l.batched_grants_total,
            ),
        ] {
            f.counter(name, help, value.load(Relaxed))?;
        }
        f.gauge(
            "waitroom_aggregator_ledger_last_batch_seconds",
            "Wall time of the last batch of commits.",
            l.last_batch_us.load(Relaxed) as f64 / 1e6,
        )?;
        f.gauge(
            "waitroom_aggregator_ledger_failing",
            "1 while grants cannot be committed (the last batch failed, or the fence read at start holds another epoch): answers grant nothing new and say so, and nodes with another aggregator take their grants there.",
            u64::from(shared.ledger.as_ref().is_some_and(|c| c.failing())),
        )?;
    }
    f.gauge(
        "waitroom_aggregator_learning",
        "1 while the aggregator, just started, learns what the nodes hold and grants nobody more (learning_ms).",
        u64::from(learning),
    )?;

    f.counter(
        "waitroom_aggregator_departures_total",
        "Nodes taken for gone: silent for longer than node_timeout_ms (their leases are dropped, their sessions still count).",
        departures,
    )?;
    let departed = status.nodes.iter().filter(|n| n.departed).count();
    f.gauges(
        "waitroom_aggregator_nodes",
        "Nodes known, by state.",
        [
            ([("state", "live")], status.nodes.len() - departed),
            ([("state", "departed")], departed),
        ],
    )?;
    type Field = fn(&RoomStatus) -> f64;
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
        f.gauges(
            name,
            help,
            status
                .rooms
                .iter()
                .map(|r| ([("room", r.id.as_str())], field(r))),
        )?;
    }
    f.gauges(
        "waitroom_aggregator_recent_admits_per_second",
        "Admits a second over the last half second to second, all nodes: the pace near a minute's last slots that promises are held to (absent until measured this minute).",
        status.rooms.iter().filter_map(|r| {
            r.recent_admits_per_second
                .map(|rate| ([("room", r.id.as_str())], rate))
        }),
    )?;
    f.gauges(
        "waitroom_aggregator_admits_per_minute",
        "Admit rate (EWMA over complete minutes), all nodes.",
        status
            .rooms
            .iter()
            .map(|r| ([("room", r.id.as_str())], r.admits_per_minute)),
    )?;
    f.gauges(
        "waitroom_aggregator_nodes_reporting",
        "Nodes whose reports count for the room.",
        status
            .rooms
            .iter()
            .map(|r| ([("room", r.id.as_str())], r.nodes_reporting)),
    )?;

    let rooms = || limits.iter().map(|(id, c)| (id.as_str(), c));
    f.gauges(
        "waitroom_aggregator_active_users_limit",
        "The room's total_active_users as the aggregator's configuration in force says.",
        rooms().map(|(id, c)| ([("room", id)], c.total_active_users)),
    )?;
    f.gauges(
        "waitroom_aggregator_new_users_per_minute_limit",
        "The room's new_users_per_minute as the aggregator's configuration in force says.",
        rooms().map(|(id, c)| ([("room", id)], c.new_users_per_minute)),
    )?;
    f.gauges(
        "waitroom_aggregator_session_duration_seconds",
        "The room's session_duration as the aggregator's configuration in force says.",
        rooms().map(|(id, c)| ([("room", id)], u64::from(c.session_duration) * 60)),
    )?;
    if let Some(shard) = &shared.shard {
        use waitroom_common::room::RoomId;
        f.gauges(
            "waitroom_aggregator_room_owned",
            "Rooms sharded ([shard]): 1 for a room this aggregator's group owns (sums and grants), 0 for another group's.",
            rooms().map(|(id, _)| {
                ([("room", id)], u64::from(shard.owns(RoomId::from_name(id))))
            }),
        )?;
    }
    let version = shared.settings.lock().version;
    f.gauges(
        "waitroom_aggregator_settings_version",
        exposition::SETTINGS_VERSION_HELP,
        rooms().map(|(id, _)| ([("room", id)], version)),
    )?;
    let behind = {
        let running = shared.node_settings.lock();
        status
            .nodes
            .iter()
            .filter(|n| !n.departed && running.get(&n.node).copied().flatten() != Some(version))
            .count()
    };
    f.gauge(
        "waitroom_aggregator_nodes_behind_settings",
        "Live nodes that do not run the settings version in force (not applied yet, or refused: see the node's log).",
        behind,
    )?;

    f.gauges(
        "waitroom_aggregator_wait_estimate_seconds",
        exposition::WAIT_ESTIMATE_HELP,
        status.rooms.iter().filter_map(|r| {
            let wait = r.wait_estimate.known_seconds()?;
            Some(([("room", r.id.as_str())], wait))
        }),
    )?;

    let nodes = || {
        status
            .nodes
            .iter()
            .map(|n| (n, [("node", n.node.as_str()), ("colo", n.colo.as_str())]))
    };
    f.gauges(
        "waitroom_aggregator_node_report_age_seconds",
        "Seconds since each node's last report.",
        nodes().map(|(n, l)| (l, n.last_report_age_ms as f64 / 1e3)),
    )?;
    f.gauges(
        "waitroom_aggregator_node_departed",
        "1 once the node has been silent for longer than node_timeout_ms: its queue and traffic no longer count, its sessions do until they end.",
        nodes().map(|(n, l)| (l, i64::from(n.departed))),
    )?;
    f.gauges(
        "waitroom_aggregator_node_active_users",
        "Active users counted on each node (its signed share of the rooms' sum).",
        nodes().map(|(n, l)| (l, n.active_users)),
    )
}
