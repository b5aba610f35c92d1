//! The on-demand lease end to end (issue 15): one aggregator and three nodes
//! in two colos, in this process on one driven clock, over real QUIC and
//! real HTTP (`waitroom_tests::inproc_cluster`).
//!
//! With `lease_wait_ms` (default 50) the aggregator promises each node what
//! its recent traffic needs and keeps the rest in reserve; a node whose
//! promise runs out holds the marginal new visitor while it asks for more
//! over the open connection. Asserted here:
//! - in seed 000's 7:1 burst over two nodes of one colo, nobody is queued
//!   while the minute's admits are below 98 % of the limit (the test of
//!   `accuracy.rs` before the lease queued 4 at the quiet node at 42 %), the
//!   quiet node admits beyond what it was promised before its next report,
//!   and the limit holds exactly;
//! - with the aggregator gone, a visitor is held at most `lease_wait_ms`
//!   once, every visitor is still served, and nobody is held again until
//!   the aggregator answers;
//! - a spike at a colo without history borrows the slots the other colo's
//!   nodes do not hold, in a few asks, and the limit holds exactly.
use std::{
    sync::atomic::Ordering::Relaxed,
    time::{Duration, Instant},
};

use waitroom_tests::inproc_cluster::{InProcCluster, visit_new};

const NEW_USERS_PER_MINUTE: u64 = 200;
const ROOM: &str = "total_active_users = 400\nnew_users_per_minute = 200\n\
                    session_duration = 5\nqueueing_method = \"fifo\"\n";
const NODES: &[(&str, &str)] = &[("node-a1", "a"), ("node-a2", "a"), ("node-b1", "b")];

/// The cluster, started and through three rounds of answers.
fn started(name: &str) -> InProcCluster {
    let cluster = InProcCluster::start(name, ROOM, NODES, 1_000).expect("cluster starts");
    for _ in 0..3 {
        cluster.advance(Duration::from_secs(1)).expect("fresh");
    }
    cluster
}

/// On to one second into the next minute.
fn to_next_minute(cluster: &InProcCluster) {
    let minute_start = (cluster.now().0 / 60_000 + 1) * 60_000 + 1_000;
    cluster
        .advance(Duration::from_millis(minute_start - cluster.now().0))
        .expect("fresh");
}

/// What node `i` holds of the shared pools.
fn promise(cluster: &InProcCluster, i: usize) -> u64 {
    let state = cluster.node_state(i);
    state.allowance.colo_share + state.allowance.anywhere
}

/// New visitors at `url`, `n` of them, the minute's admits so far being
/// `admitted`: the admits after them, and the admits at which each visitor
/// was queued while they were below 98 % of the limit.
fn visit_counting_early(url: &str, n: u64, mut admitted: u64) -> (u64, Vec<u64>) {
    let mut queued_early = Vec::new();
    for _ in 0..n {
        if visit_new(url) {
            admitted += 1;
        } else if admitted * 100 < NEW_USERS_PER_MINUTE * 98 {
            queued_early.push(admitted);
        }
    }
    (admitted, queued_early)
}

fn lease(cluster: &InProcCluster, i: usize) -> &waitroom_edge::gossip::LeaseAsk {
    &cluster.node(i).gossip.as_ref().expect("gossips").lease
}

#[test]
fn in_a_seven_to_one_burst_nobody_is_queued_below_98_percent_while_the_aggregator_has_room() {
    let cluster = started("lease-burst");
    let [a, b, c] = [0, 1, 2].map(|i| cluster.nodes[i].url("/"));
    // A little history: A and B alike, C now and then.
    for step in 0..6 {
        assert!(visit_new(&a) && visit_new(&b));
        if step % 3 == 0 {
            assert!(visit_new(&c));
        }
        cluster.advance(Duration::from_secs(10)).expect("fresh");
    }
    to_next_minute(&cluster);

    // The quiet node first: B holds a small promise (it had one visitor in
    // ten seconds), and its visitors of the burst come before its next report.
    let b_promise = promise(&cluster, 1);
    let b_answers = cluster
        .node(1)
        .gossip
        .as_ref()
        .unwrap()
        .status
        .reports_total
        .load(Relaxed);
    let b_asks = lease(&cluster, 1).asks_total.load(Relaxed);
    let started = Instant::now();
    let at_b = 23_u64;
    let b_admitted = (0..at_b).filter(|_| visit_new(&b)).count() as u64;
    let b_took = started.elapsed();
    let periodic = cluster
        .node(1)
        .gossip
        .as_ref()
        .unwrap()
        .status
        .reports_total
        .load(Relaxed)
        .saturating_sub(b_answers)
        // An ask counted whose answer is not yet: none periodic, not an
        // underflow.
        .saturating_sub(lease(&cluster, 1).asks_total.load(Relaxed) - b_asks);
    eprintln!(
        "B: promised {b_promise}, admitted {b_admitted} of {at_b} in {b_took:?} \
         ({} asks, {periodic} periodic answers meanwhile)",
        lease(&cluster, 1).asks_total.load(Relaxed) - b_asks
    );
    assert_eq!(
        b_admitted, at_b,
        "the quiet node's visitors are all admitted"
    );
    assert!(
        b_promise < at_b,
        "B was promised {b_promise}: it had to ask to admit {at_b}"
    );
    assert!(
        lease(&cluster, 1).asks_total.load(Relaxed) > b_asks,
        "B asked"
    );
    assert_eq!(lease(&cluster, 1).holds_timed_out_total.load(Relaxed), 0);

    // Two rounds of answers (B's reports give back what its ask was
    // promised beyond what it used: an ask on this driven clock measures
    // its rate over the shortest time, 100 ms, and so is promised
    // generously; B's visitors admitted after the ask's answer count in
    // its next report's rate, which then still promises B up to half of
    // what is free for two seconds of traffic that will not come, so only
    // the report after, with no visitor since, gives everything back: one
    // round failed CI run 36 with A queued at 114 of 200), then the
    // bursting node: 157 more, 180 in all (90 % of the limit).
    cluster.advance(Duration::from_millis(500)).expect("fresh");
    cluster.advance(Duration::from_millis(500)).expect("fresh");
    let at_a = 157_u64;
    let (admitted, queued_early) = visit_counting_early(&a, at_a, b_admitted);
    cluster.advance(Duration::from_millis(500)).expect("fresh");
    let room = &cluster.status().rooms[0];
    eprintln!(
        "burst: {admitted} of {} admitted; queued below 98 %: {queued_early:?}; A held {} \
         visitors, {} holds timed out; aggregator: {} admitted this minute",
        at_a + at_b,
        lease(&cluster, 0).holds_total.load(Relaxed),
        lease(&cluster, 0).holds_timed_out_total.load(Relaxed),
        room.admitted_this_minute
    );
    assert!(
        queued_early.is_empty(),
        "queued while the minute's admits were below 98 % of the limit (admits then: {queued_early:?})"
    );
    assert_eq!(admitted, at_a + at_b);
    assert_eq!(room.admitted_this_minute, admitted, "{room:?}");
    assert!(room.admitted_this_minute <= NEW_USERS_PER_MINUTE);
}

#[test]
fn with_the_aggregator_gone_a_visitor_is_held_at_most_lease_wait_ms_once_and_everyone_is_served() {
    let mut cluster = started("lease-dead");
    let b = cluster.nodes[1].url("/");
    cluster.stop_aggregator();
    // Past the node's answer timeout, whichever way the node hears of it.
    std::thread::sleep(Duration::from_millis(200));

    // B's promise is small (no traffic yet): the visitors beyond it are the
    // ones a lease would admit. Each is answered within the bound, and only
    // one of them (if any: a connection seen closed holds nobody) is held.
    let mut slowest = Duration::ZERO;
    let mut admitted = 0;
    for _ in 0..8 {
        let started = Instant::now();
        admitted += u32::from(visit_new(&b));
        slowest = slowest.max(started.elapsed());
    }
    let lease = lease(&cluster, 1);
    let (holds, timed_out) = (
        lease.holds_total.load(Relaxed),
        lease.holds_timed_out_total.load(Relaxed),
    );
    eprintln!(
        "aggregator gone: slowest visitor {slowest:?}, {admitted} of 8 admitted, \
         {holds} held, {timed_out} timed out"
    );
    // 50 ms of hold plus a request on a busy test machine, far below the
    // gossip client's 2 s answer timeout that an unbounded wait would show.
    assert!(slowest < Duration::from_millis(600), "{slowest:?}");
    assert!(
        holds <= 1 && timed_out <= 1,
        "held {holds}, timed out {timed_out}"
    );
    assert!(
        !lease.holding(),
        "no holding until the aggregator answers again"
    );
}

/// A spike at a colo that had no traffic two minutes back: its node's colo
/// has no slots of its own and the Anywhere pool is a tenth of what the
/// minute has left, so without loans each ask got a tenth of the rest (19
/// asks for 180 visitors here, each holding a visitor for a round trip; in
/// the simulator, with asks 20 ms away, the 1,200-node worldwide spike
/// queued 1,690 visitors early that way). With loans its asks borrow half
/// of what the other colo's nodes do not hold: a few asks, nobody queued
/// below 98 % of the limit, and the limit holds exactly.
#[test]
fn a_spike_at_a_colo_without_history_borrows_the_slots_the_other_colo_does_not_hold() {
    let cluster = started("lease-loan");
    let [a1, a2, b1] = [0, 1, 2].map(|i| cluster.nodes[i].url("/"));
    // Two minutes of history in colo a only.
    for _ in 0..12 {
        assert!(visit_new(&a1) && visit_new(&a2));
        cluster.advance(Duration::from_secs(10)).expect("fresh");
    }
    to_next_minute(&cluster);
    let b_promise = promise(&cluster, 2);

    // The spike at b1: 180 new visitors, 90 % of the minute's limit.
    let at_b = 180_u64;
    let (admitted, queued_early) = visit_counting_early(&b1, at_b, 0);
    let asks = lease(&cluster, 2).asks_total.load(Relaxed);
    let timed_out = lease(&cluster, 2).holds_timed_out_total.load(Relaxed);
    cluster.advance(Duration::from_millis(500)).expect("fresh");
    let room = &cluster.status().rooms[0];
    eprintln!(
        "colo b: promised {b_promise} at the minute's start, admitted {admitted} of {at_b} \
         after {asks} asks ({timed_out} holds timed out); queued below 98 %: {queued_early:?}; \
         aggregator: {} admitted this minute",
        room.admitted_this_minute
    );
    assert!(
        b_promise < 20,
        "b1 starts with a small promise ({b_promise}): it must ask"
    );
    assert!(
        asks <= 8,
        "{asks} asks: loans give half of the other colo's unheld slots at a time"
    );
    assert_eq!(timed_out, 0);
    assert!(
        queued_early.is_empty(),
        "queued while the minute's admits were below 98 % of the limit (admits then: {queued_early:?})"
    );
    assert_eq!(admitted, at_b);
    assert_eq!(room.admitted_this_minute, admitted, "{room:?}");

    // Colo a's nodes come back: together nobody passes the limit.
    let mut more = 0;
    for _ in 0..40 {
        more += u64::from(visit_new(&a1));
    }
    cluster.advance(Duration::from_millis(500)).expect("fresh");
    let room = &cluster.status().rooms[0];
    eprintln!("then colo a: {more} of 40 admitted; aggregator: {room:?}");
    assert!(
        room.admitted_this_minute <= NEW_USERS_PER_MINUTE,
        "{room:?}"
    );
    assert_eq!(room.admitted_this_minute, at_b + more);
}
