//! Rooms sharded between aggregator groups (issue 20, docs/adr/0001
//! decision 5), with the real binaries on loopback: two groups of one
//! aggregator each (`[shard]`, `eu` and `us`), two rooms of which each
//! group owns one by the stable hash, two nodes configured with both groups
//! (`[[aggregator.groups]]`) and one node an operator forgot to move to
//! groups (`address` = the `eu` aggregator only).
//!
//! What is asserted:
//! - each group's aggregator sums only the room its group owns: it counts
//!   the nodes of that room and none of the other's, and says which it owns
//!   (`waitroom_aggregator_room_owned`); each node has one home per group
//!   and is fresh in both;
//! - the misconfigured node sends both rooms to `eu`: the room `us` owns
//!   is left out of its reports, counted (`foreign_rooms_total`) and
//!   logged, and that node is never granted anything there (it queues its
//!   visitors, having no share), while the room `eu` owns works for it as
//!   for the others;
//! - both rooms pushed past their limit in one minute: each stays within
//!   its `new_users_per_minute`, with no slack;
//! - the `us` aggregator killed -9: only its room goes local-only at the
//!   nodes (`waitroom_gossip_group_stale`), the other stays global, every
//!   visitor is answered, and the minute's admits still hold; restarted,
//!   its room is fresh again.
use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use waitroom_aggregator::ledger::{EPOCH_KEY, Etcd, EtcdLedger};
use waitroom_common::{cluster::grants::GrantLedger, room::RoomId, shard, time::Minute};
use waitroom_tests::{
    cluster::{
        Aggregator, Certs, aggregator_config, free_udp_port, node_config, node_gossip_table,
        node_gossip_table_groups,
    },
    edge::{Edge, admits_new_visitor_at, get_text, metric, metric_sum},
    etcd::{EtcdCluster, history, require_etcd},
    eventually,
    minutes::{sleep_into_next_minute, unix_secs},
    procs::{TempDir, start_origin},
};

const INTERVAL_MS: u64 = 500;
const NEW_USERS_PER_MINUTE: u64 = 24;
const GROUPS: [&str; 2] = ["eu", "us"];

/// The first room names `room-N` that group 0 and group 1 own.
fn rooms() -> [String; 2] {
    let owned_by = |group: usize| {
        (0..)
            .map(|n| format!("room-{n}"))
            .find(|name| shard::owner(RoomId::from_name(name), &GROUPS) == Some(group))
            .unwrap()
    };
    [owned_by(0), owned_by(1)]
}

/// A random room (every admission from a shared pool) at `/<index>`.
fn room_table(id: &str, index: usize) -> String {
    format!(
        "[[rooms]]\nid = \"{id}\"\npath = \"/{index}\"\ntotal_active_users = 60\n\
         new_users_per_minute = {NEW_USERS_PER_MINUTE}\nqueueing_method = \"random\"\n"
    )
}

/// Both rooms' tables for the aggregators, and for the nodes (in front of
/// `origin`; `node_config` adds it to the last).
fn tables(rooms: &[String; 2], origin: SocketAddr) -> (String, String) {
    let (a, b) = (room_table(&rooms[0], 0), room_table(&rooms[1], 1));
    (
        format!("{a}\n{b}"),
        format!("{a}origin = \"{origin}\"\n\n{b}"),
    )
}

/// `n` free loopback UDP addresses for aggregators.
fn listens(n: usize) -> Vec<SocketAddr> {
    (0..n)
        .map(|_| {
            format!("127.0.0.1:{}", free_udp_port().unwrap())
                .parse()
                .unwrap()
        })
        .collect()
}

/// The nodes `a` counts in `room` (0 when it shows none).
fn reporting(a: &Aggregator, room: &str) -> f64 {
    a.metric(&format!(
        "waitroom_aggregator_nodes_reporting{{room=\"{room}\"}}"
    ))
    .unwrap_or(0.0)
}

/// Each room's admits over the minute, `total[node][room]` as the visitors
/// saw them: what the nodes count, within the limit with no slack, and
/// most of it used.
fn check_the_minute(edges: &[Edge], rooms: &[String; 2], total: &[[u64; 2]]) {
    eprintln!("admitted [node][room] over the minute: {total:?}");
    for (r, room) in rooms.iter().enumerate() {
        let sum: u64 = total.iter().map(|t| t[r]).sum();
        let counted = metric_sum(
            edges,
            &format!("waitroom_admitted_this_minute{{room=\"{room}\"}}"),
        );
        assert_eq!(counted, sum as f64, "{room}: the counters agree");
        assert!(
            sum <= NEW_USERS_PER_MINUTE,
            "{room}: {sum} admitted > {NEW_USERS_PER_MINUTE}: {total:?}"
        );
        assert!(
            sum >= NEW_USERS_PER_MINUTE / 2,
            "{room}: most slots used: {total:?}"
        );
    }
}

/// `rounds` rounds of two new visitors per room at each node: admitted
/// `[node][room]`, added to `total`.
fn traffic(edges: &[Edge], rounds: usize, total: &mut [[u64; 2]]) {
    for _ in 0..rounds {
        for (edge, counts) in edges.iter().zip(total.iter_mut()) {
            for (room, count) in counts.iter_mut().enumerate() {
                for _ in 0..2 {
                    *count += u64::from(admits_new_visitor_at(edge, &format!("/{room}")));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(150));
    }
}

fn group_stale(edge: &Edge, group: &str) -> Option<f64> {
    metric(
        &get_text(&edge.admin_url("/metrics")),
        &format!("waitroom_gossip_group_stale{{group=\"{group}\"}}"),
    )
}

#[test]
fn each_group_sums_and_grants_only_its_rooms_and_its_outage_stays_in_them() {
    let dir = TempDir::new("sharded");
    let names = ["ams-1", "sin-1", "lon-1"];
    let certs = Certs::generate(&dir.path().join("certs"), &names).unwrap();
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let rooms = rooms();
    eprintln!("{} is owned by eu, {} by us", rooms[0], rooms[1]);
    let (tables, node_rooms) = tables(&rooms, origin);
    let addresses = listens(2);
    let aggregator_text = |g: usize| {
        let snapshot = dir.path().join(format!("aggregator-{}.json", GROUPS[g]));
        let shard = format!(
            "\n[shard]\ngroup = \"{}\"\ngroups = [\"eu\", \"us\"]\n",
            GROUPS[g]
        );
        aggregator_config(addresses[g], &certs, &snapshot, &format!("{tables}{shard}"))
    };
    let mut aggregators: Vec<Aggregator> = (0..2)
        .map(|g| {
            Aggregator::start(
                dir.path(),
                &format!("aggregator-{}", GROUPS[g]),
                &aggregator_text(g),
            )
            .unwrap()
        })
        .collect();

    let groups: [(&str, &[SocketAddr]); 2] = [("eu", &addresses[..1]), ("us", &addresses[1..])];
    let edges: Vec<Edge> = [("ams-1", "ams"), ("sin-1", "sin"), ("lon-1", "lon")]
        .iter()
        .map(|&(name, colo)| {
            let gossip = if name == "lon-1" {
                // The node an operator forgot: every room to `eu`.
                node_gossip_table(addresses[0], &certs, &certs, name, INTERVAL_MS)
            } else {
                node_gossip_table_groups(&groups, &certs, &certs, name, INTERVAL_MS)
            };
            let config = node_config(
                dir.path(),
                name,
                colo,
                2,
                true,
                &node_rooms,
                origin,
                &gossip,
            );
            Edge::start(dir.path(), name, &config).unwrap()
        })
        .collect();
    let grouped = &edges[..2];

    // --- Each grouped node: a home in each group, both groups fresh.
    let settled = |edge: &Edge| {
        let text = get_text(&edge.admin_url("/metrics"));
        GROUPS.iter().all(|g| {
            metric(
                &text,
                &format!("waitroom_gossip_group_stale{{group=\"{g}\"}}"),
            ) == Some(0.0)
        }) && addresses.iter().all(|a| {
            metric(
                &text,
                &format!("waitroom_gossip_home{{aggregator=\"{a}\"}}"),
            ) == Some(1.0)
        }) && metric(&text, "waitroom_gossip_connected") == Some(1.0)
    };
    assert!(
        eventually(Duration::from_secs(20), || grouped.iter().all(settled)),
        "each node has a home in each group and both are fresh"
    );

    // --- Each aggregator sums only its own room.
    assert!(
        eventually(Duration::from_secs(10), || {
            reporting(&aggregators[0], &rooms[0]) == 3.0
                && reporting(&aggregators[1], &rooms[1]) == 2.0
        }),
        "eu counts three nodes in its room, us two in its: {} / {}",
        reporting(&aggregators[0], &rooms[0]),
        reporting(&aggregators[1], &rooms[1])
    );
    for (g, a) in aggregators.iter().enumerate() {
        let other = &rooms[1 - g];
        assert_eq!(reporting(a, other), 0.0, "{} sums {other}", GROUPS[g]);
        let owned = |room: &str| {
            a.metric(&format!(
                "waitroom_aggregator_room_owned{{room=\"{room}\"}}"
            ))
        };
        assert_eq!((owned(&rooms[g]), owned(other)), (Some(1.0), Some(0.0)));
    }
    // The forgotten node's reports of the other group's room are left out.
    let foreign = aggregators[0]
        .metric("waitroom_aggregator_foreign_rooms_total")
        .unwrap_or(0.0);
    assert!(foreign >= 1.0, "foreign rooms counted: {foreign}");
    assert_eq!(
        aggregators[1].metric("waitroom_aggregator_foreign_rooms_total"),
        Some(0.0)
    );
    let log = aggregators[0].proc.stderr();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("another aggregator group owns"))
        .collect();
    assert!(
        !lines.is_empty() && lines[0].contains("lon-1") && lines[0].contains(&rooms[1]),
        "{log}"
    );

    // --- One minute: both rooms pushed past their limit, then the `us`
    // aggregator killed mid-minute, more traffic, and it comes back.
    // A minute that starts after every node is known: in the minute the
    // cluster starts, its first grants go to whichever node reported
    // first, and in a random room a visitor queued anywhere sends every
    // later one to the draw (these visitors never come back for it).
    sleep_into_next_minute(1);
    let mut total = vec![[0_u64; 2]; edges.len()];
    traffic(&edges, 4, &mut total);
    eprintln!("before the kill, admitted [node][room]: {total:?}");
    aggregators[1].proc.kill();
    let killed = Instant::now();
    // Only `us`'s room goes local-only; visitors are served meanwhile.
    while !grouped.iter().all(|e| group_stale(e, "us") == Some(1.0)) {
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "us's room never went stale"
        );
        traffic(&edges, 1, &mut total);
    }
    eprintln!("us's room local-only after {:?}", killed.elapsed());
    for edge in grouped {
        assert_eq!(group_stale(edge, "eu"), Some(0.0), "eu's room stays global");
        let status: serde_json::Value =
            serde_json::from_str(&get_text(&edge.admin_url("/status"))).unwrap();
        let fresh: Vec<(String, bool)> = status["gossip"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                (
                    g["name"].as_str().unwrap().to_owned(),
                    g["fresh"].as_bool().unwrap(),
                )
            })
            .collect();
        assert_eq!(fresh, [("eu".to_owned(), true), ("us".to_owned(), false)]);
    }
    // eu's room is still decided on the whole picture: each node's global
    // view of it is every node's sessions, not its own (local-only) part.
    let active = |room: &str, scope: &str| {
        format!("waitroom_active_users{{room=\"{room}\",scope=\"{scope}\"}}")
    };
    let everyone = metric_sum(&edges, &active(&rooms[0], "node"));
    assert!(
        eventually(Duration::from_secs(3), || grouped.iter().all(|e| metric(
            &get_text(&e.admin_url("/metrics")),
            &active(&rooms[0], "global")
        ) == Some(
            everyone
        ))),
        "eu's room keeps the global view ({everyone} sessions) while us is down"
    );
    traffic(&edges, 3, &mut total);
    let restarted =
        Aggregator::start(dir.path(), "aggregator-us-restarted", &aggregator_text(1)).unwrap();
    let back = Instant::now();
    assert!(
        eventually(Duration::from_secs(5), || grouped
            .iter()
            .all(|e| group_stale(e, "us") == Some(0.0))),
        "us's room is fresh again once its aggregator is back"
    );
    eprintln!(
        "us's room fresh again {:?} after the restart",
        back.elapsed()
    );
    aggregators[1] = restarted;
    traffic(&edges, 2, &mut total);

    check_the_minute(&edges, &rooms, &total);
    assert_eq!(
        total[2][1], 0,
        "the forgotten node is never granted in the room its group does not own"
    );
    assert!(total[2][0] > 0, "it admits in the room its aggregator owns");
}

/// Every version etcd kept of `key` (each is one commit), as ledgers.
fn versions(endpoints: &[String], key: &str) -> Vec<GrantLedger> {
    endpoints
        .iter()
        .find_map(|e| history(e, key).ok())
        .expect("an etcd member answers")
        .into_iter()
        .map(|(_, bytes)| serde_json::from_slice(&bytes).unwrap())
        .collect()
}

/// A group added in the middle of a minute, the way OPERATIONS says: one
/// group `eu` (epoch 1) owns both rooms; then `us` is started, the fence
/// in etcd is moved to `2 groups=eu,us`, `eu`'s aggregator is restarted
/// with the new list and epoch, and the nodes are restarted with both
/// groups, so the room `us` now owns moves to it mid-minute. Each room's
/// admits over the minute stay within its limit, every commit of either
/// epoch does, and the new epoch's first commit of each room starts from
/// the caps the old epoch held (nothing granted twice across the change).
#[test]
fn a_group_added_mid_minute_grants_no_slot_twice() {
    if !require_etcd() {
        return;
    }
    let etcd = EtcdCluster::start("sharded-epoch-etcd", 3).unwrap();
    let endpoints = etcd.endpoints();
    let dir = TempDir::new("sharded-epoch");
    let nodes = [("ams-1", "ams"), ("sin-1", "sin")];
    let certs = Certs::generate(&dir.path().join("certs"), &["ams-1", "sin-1"]).unwrap();
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let rooms = rooms();
    let (tables, node_rooms) = tables(&rooms, origin);
    let addresses = listens(2);
    let list: Vec<String> = endpoints.iter().map(|e| format!("\"{e}\"")).collect();
    let aggregator_text = |g: usize, groups: &str, epoch: u64| {
        let snapshot = dir.path().join(format!("aggregator-{}.json", GROUPS[g]));
        let extra = format!(
            "\n[shard]\ngroup = \"{}\"\ngroups = [{groups}]\n\n[ledger]\nendpoints = [{}]\nepoch = {epoch}\n",
            GROUPS[g],
            list.join(", ")
        );
        aggregator_config(addresses[g], &certs, &snapshot, &format!("{tables}{extra}"))
    };
    let start_nodes = |groups: &[(&str, &[SocketAddr])], run: &str| -> Vec<Edge> {
        nodes
            .iter()
            .map(|&(name, colo)| {
                let gossip = node_gossip_table_groups(groups, &certs, &certs, name, INTERVAL_MS);
                let config = node_config(
                    dir.path(),
                    name,
                    colo,
                    2,
                    true,
                    &node_rooms,
                    origin,
                    &gossip,
                );
                Edge::start(dir.path(), &format!("{name}-{run}"), &config).unwrap()
            })
            .collect()
    };

    // --- Epoch 1: one group, `eu`, owns both rooms.
    let mut eu = Aggregator::start(
        dir.path(),
        "aggregator-eu-1",
        &aggregator_text(0, "\"eu\"", 1),
    )
    .unwrap();
    let mut edges = start_nodes(&[("eu", &addresses[..1])], "1");
    let fresh_at = |edge: &Edge, home: SocketAddr| {
        let text = get_text(&edge.admin_url("/metrics"));
        metric(
            &text,
            &format!("waitroom_gossip_home{{aggregator=\"{home}\"}}"),
        ) == Some(1.0)
            && metric(&text, "waitroom_gossip_stale") == Some(0.0)
    };
    assert!(
        eventually(Duration::from_secs(20), || edges
            .iter()
            .all(|e| fresh_at(e, addresses[0]))),
        "both nodes fresh at eu"
    );
    // A minute that starts after both nodes are known (see above).
    sleep_into_next_minute(1);
    let minute = unix_secs() / 60;
    let mut total = vec![[0_u64; 2]; edges.len()];
    traffic(&edges, 3, &mut total);
    eprintln!("epoch 1, admitted [node][room]: {total:?}");

    // --- The change, in the order OPERATIONS gives.
    let us = Aggregator::start(
        dir.path(),
        "aggregator-us-2",
        &aggregator_text(1, "\"eu\", \"us\"", 2),
    )
    .unwrap();
    let kv = Etcd::new(endpoints.clone(), Duration::from_secs(2));
    let fence = kv.get(EPOCH_KEY).unwrap();
    assert_eq!(
        fence.value.as_deref(),
        Some(&b"1 groups=eu"[..]),
        "epoch 1's fence"
    );
    assert!(
        kv.swap(EPOCH_KEY, fence.mod_revision, b"2 groups=eu,us")
            .unwrap()
    );
    eu.proc.kill();
    eu = Aggregator::start(
        dir.path(),
        "aggregator-eu-2",
        &aggregator_text(0, "\"eu\", \"us\"", 2),
    )
    .unwrap();
    for edge in &mut edges {
        edge.proc.kill();
    }
    let groups: [(&str, &[SocketAddr]); 2] = [("eu", &addresses[..1]), ("us", &addresses[1..])];
    let edges = start_nodes(&groups, "2");
    assert!(
        eventually(Duration::from_secs(10), || edges
            .iter()
            .all(|e| { GROUPS.iter().all(|g| group_stale(e, g) == Some(0.0)) })),
        "both nodes fresh in both groups after the change"
    );
    traffic(&edges, 6, &mut total);
    assert_eq!(unix_secs() / 60, minute, "the test ran within one minute");

    // --- Each room within its limit over the whole minute (the counters
    // were kept over the nodes' restart).
    check_the_minute(&edges, &rooms, &total);

    // --- The ledger: every commit of either epoch within the limit, and
    // each room's first commit under epoch 2 holds every cap epoch 1 left.
    for room in &rooms {
        let old = versions(&endpoints, &EtcdLedger::key(1, room, Minute(minute)));
        let new = versions(&endpoints, &EtcdLedger::key(2, room, Minute(minute)));
        eprintln!(
            "{room}: {} commits under epoch 1, {} under epoch 2",
            old.len(),
            new.len()
        );
        assert!(
            !old.is_empty() && !new.is_empty(),
            "{room} committed under both epochs"
        );
        for ledger in old.iter().chain(&new) {
            assert!(
                ledger.total() <= NEW_USERS_PER_MINUTE,
                "{room}: a commit left {:?}",
                ledger.caps
            );
        }
        let (last_old, first_new) = (old.last().unwrap(), &new[0]);
        for (node, cap) in &last_old.caps {
            let kept = first_new.caps.get(node).copied().unwrap_or(0);
            // A cap may be lowered only to what the node admitted; a
            // node absent from the new epoch's first commit lost nothing
            // it held unless the old cap was fully unused.
            assert!(
                kept > 0 || *cap == 0,
                "{room}: epoch 2 started without {node}'s cap {cap}: {:?} then {:?}",
                last_old.caps,
                first_new.caps
            );
        }
    }
    // Each group now sums only its own room; `eu` hears of `us`'s room no more.
    assert_eq!(reporting(&us, &rooms[1]), 2.0);
    assert_eq!(reporting(&us, &rooms[0]), 0.0);
    assert_eq!(
        eu.metric("waitroom_aggregator_foreign_rooms_total"),
        Some(0.0)
    );
}
