//! The cost of one aggregation round (issue 15, item 4): every node of the
//! cluster sends one report carrying 10 rooms and the aggregator merges them
//! one after another with [`Cluster::apply`], as its server does. N = 100,
//! 1,000 and 10,000 nodes in N/4 colos; the cluster is warmed with the round
//! before (restored from its snapshot, so setting up is not measured), and
//! each report of the measured round differs from the node's previous one
//! (more admits this minute, more visitors, a session moved), so every merge
//! sees the room's sums change as the real aggregator does. Next to each, a
//! peer measured in the same run: the same round only read (every entry
//! added into one total per room) and dropped, which any merge of whole
//! reports costs at least.
//! `cargo bench -p waitroom-common --features std --bench aggregation`
//! (also listed by `cargo xtask bench --list-criterion`).

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use waitroom_common::aggregate::{MinuteAdmits, NodeReport, RoomReport};
use waitroom_common::cluster::{Cluster, RoomDef, Snapshot};
use waitroom_common::counters::PoolCounts;
use waitroom_common::room::{RoomConfig, RoomId};
use waitroom_common::time::UnixMillis;
use waitroom_common::wire::{self, ChangesFrame, Message, ReportFrame};

/// 20 s into a minute: neither the warm-up round nor the measured one
/// crosses a minute boundary.
const NOW: UnixMillis = UnixMillis(1_700_000_060_000);
const ROOMS: usize = 10;
const NODE_TIMEOUT_MS: u64 = 5_000;

/// Rooms sized for the cluster, as an operator would: about 600 sessions
/// and 25 admits a minute per node, limits of 1,000 sessions and 40 new
/// visitors a minute per node, so slots stay available and the Anywhere
/// pool is not empty: every part of the merge does its work.
fn rooms(nodes: usize) -> Vec<RoomDef> {
    let nodes = nodes as u64;
    (0..ROOMS)
        .map(|r| {
            let name = format!("room-{r}");
            let room = RoomConfig::with_limits(1_000 * nodes, 40 * nodes)
                .validate()
                .expect("valid room")
                .named(&name);
            RoomDef { name, room }
        })
        .collect()
}

/// A small deterministic mix, so nodes differ.
fn mix(node: usize, room: usize, salt: u64) -> u64 {
    let x = (node as u64)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add((room as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9))
        .wrapping_add(salt.wrapping_mul(0x94d0_49bb_1331_11eb));
    (x ^ (x >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9) >> 40
}

/// Node `node`'s report in round `round` (0 = the warm-up round, 1 = measured).
fn report(node: usize, round: u64, at: UnixMillis) -> NodeReport {
    let m = at.minute();
    let rooms = (0..ROOMS)
        .map(|r| {
            let v = |salt| mix(node, r, salt);
            // A past minute's count is the same in every report: history.
            let past = |minute: waitroom_common::time::Minute, salt: u64| {
                mix(node, r, salt.wrapping_mul(1_000_003).wrapping_add(minute.0))
            };
            let admits = |minute, base: u64| MinuteAdmits {
                minute,
                admits: PoolCounts {
                    eligible: base % 7,
                    colo_share: base % 40,
                    anywhere: base % 5,
                    uncapped: 0,
                },
            };
            RoomReport {
                room: RoomId::from_name(&format!("room-{r}")),
                // Sessions ending over the next five minutes, in 60 slots
                // (one every 5 s); one gains sessions each round. A
                // session's end is a fixed second, so a second later the
                // other slots are the same.
                expiries: (1..=60)
                    .map(|k| {
                        let moved = i64::from(k == 60) * round as i64;
                        (
                            NOW.expiry_slot().plus(5 * k),
                            1 + (v(k) % 17) as i64 + moved,
                        )
                    })
                    .collect(),
                // Newest first, with no minute of no admits, as a node
                // sends them.
                admits: [
                    admits(m, v(12) + round * 3),
                    admits(m.minus(1), past(m.minus(1), 10)),
                    admits(m.minus(2), past(m.minus(2), 10)),
                ]
                .into_iter()
                .filter(|a| a.admits != PoolCounts::default())
                .collect(),
                waiting: (0..4)
                    .rev()
                    .map(|back| (m.minus(back), (v(20 + back) % 30) as i64))
                    .filter(|&(_, n)| n > 0)
                    .collect(),
                distinct_visitors: (0..4)
                    .map(|back| {
                        let n = if back == 0 {
                            v(30) % 500 + round * 5
                        } else {
                            past(m.minus(back), 30) % 500
                        };
                        (m.minus(back), 50 + n)
                    })
                    .collect(),
            }
        })
        .collect();
    NodeReport {
        node: format!("node-{node:05}"),
        colo: format!("colo-{:04}", node / 4),
        at,
        rooms,
    }
}

/// The cluster after a whole round of warm-up reports, as a snapshot.
fn warmed(nodes: usize) -> Snapshot {
    let mut cluster = Cluster::new(rooms(nodes), NODE_TIMEOUT_MS);
    let spread = 1_000 / nodes.max(1) as u64;
    let start = NOW.minus_secs(1);
    let snapshot = Snapshot {
        version: waitroom_common::cluster::SNAPSHOT_VERSION,
        taken_at: start,
        nodes: (0..nodes)
            .map(|i| {
                let at = start.plus_millis(i as u64 * spread);
                (
                    report(i, 0, at),
                    waitroom_common::cluster::NodeMeta {
                        last_seen: at,
                        reports: 1,
                        departed: false,
                    },
                )
            })
            .collect(),
        rooms: Vec::new(),
    };
    cluster
        .restore(snapshot, NOW)
        .expect("a fresh snapshot restores");
    cluster.snapshot(NOW)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("aggregation_round");
    group.sample_size(10);
    for nodes in [100_usize, 1_000, 10_000] {
        let snapshot = warmed(nodes);
        let spread = 1_000 / nodes as u64;
        let round: Vec<(NodeReport, UnixMillis)> = (0..nodes)
            .map(|i| {
                let at = NOW.plus_millis(i as u64 * spread);
                (report(i, 1, at), at)
            })
            .collect();
        // The peer: only reading the round, every entry of every report
        // added into one total per room, and the reports dropped, as a
        // merge of whole reports must at least do (issue 15, item 4: what
        // the target leaves for the merge itself).
        group.bench_function(format!("{nodes}_nodes_10_rooms_read_only"), |b| {
            b.iter_batched(
                || round.clone(),
                |round| {
                    let mut totals = [0_i64; ROOMS];
                    for (report, _) in round {
                        for (total, room) in totals.iter_mut().zip(&report.rooms) {
                            let counts = room
                                .expiries
                                .iter()
                                .map(|&(_, n)| n)
                                .chain(room.waiting.iter().map(|&(_, n)| n))
                                .chain(room.admits.iter().map(|a| {
                                    (a.admits.eligible + a.admits.colo_share + a.admits.anywhere)
                                        as i64
                                }))
                                .chain(room.distinct_visitors.iter().map(|&(_, n)| n as i64));
                            *total = counts.fold(*total, i64::wrapping_add);
                        }
                    }
                    totals
                },
                BatchSize::PerIteration,
            )
        });
        // What the aggregator reads off the wire for the round: each
        // report as a whole frame, or as the changes since the node's
        // report of the round before (which the server keeps per
        // connection). Both decode and keep a copy of the rooms, as the
        // server does for the next changes; changes are rebuilt whole.
        // The reports of the round before, as the nodes sent them.
        let warm: Vec<NodeReport> = (0..nodes)
            .map(|i| report(i, 0, NOW.minus_secs(1).plus_millis(i as u64 * spread)))
            .collect();
        let frames = |as_changes: bool| -> Vec<Vec<u8>> {
            (0..nodes)
                .map(|i| {
                    let (report, _) = &round[i];
                    let whole = Message::Report(ReportFrame {
                        seq: 2,
                        report: report.clone(),
                        pools: Vec::new(),
                        settings_version: Some(1),
                    });
                    let message = if as_changes {
                        let base = &warm[i].rooms;
                        Message::Changes(ChangesFrame::of(1, base, whole).expect("same rooms"))
                    } else {
                        whole
                    };
                    wire::encode(&message).expect("encodes")
                })
                .collect()
        };
        let whole = frames(false);
        let changes = frames(true);
        let bytes = |frames: &[Vec<u8>]| frames.iter().map(Vec::len).sum::<usize>();
        eprintln!(
            "{nodes} reports: {} bytes whole, {} bytes as changes ({:.3})",
            bytes(&whole),
            bytes(&changes),
            bytes(&changes) as f64 / bytes(&whole) as f64
        );
        group.bench_function(format!("{nodes}_nodes_10_rooms_frames_whole"), |b| {
            b.iter(|| {
                for frame in &whole {
                    let message = wire::decode(frame).expect("decodes");
                    let rooms = &message.report_frame().expect("a report").report.rooms;
                    black_box(rooms.to_vec());
                    black_box(message);
                }
            })
        });
        group.bench_function(format!("{nodes}_nodes_10_rooms_frames_as_changes"), |b| {
            b.iter(|| {
                for (frame, base) in changes.iter().zip(&warm) {
                    let Message::Changes(changes) = wire::decode(frame).expect("decodes") else {
                        unreachable!("changes")
                    };
                    let message = changes.rebuild(&base.rooms).expect("fits its base");
                    let rooms = &message.report_frame().expect("a report").report.rooms;
                    black_box(rooms.to_vec());
                    black_box(message);
                }
            })
        });
        group.bench_function(format!("{nodes}_nodes_10_rooms"), |b| {
            b.iter_batched(
                || {
                    let mut cluster = Cluster::new(rooms(nodes), NODE_TIMEOUT_MS);
                    cluster
                        .restore(snapshot.clone(), NOW)
                        .expect("the warmed snapshot restores");
                    (cluster, round.clone())
                },
                |(mut cluster, round)| {
                    for (report, at) in round {
                        black_box(cluster.apply(report, at));
                    }
                    cluster
                },
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
