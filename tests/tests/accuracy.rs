//! Admission accuracy across nodes, end to end: one aggregator and three
//! nodes in two colos, in this process on one driven clock, gossiping over
//! real QUIC and serving visitors over real HTTP (see
//! `waitroom_tests::inproc_cluster`).
//!
//! Seed 000's uneven workers as `cargo xtask simulate` runs them (scenario 4,
//! "7:1 burst over two nodes"): colo `a` has two nodes, A and B, that saw the
//! same light traffic for minutes, so each holds half of the colo's share;
//! then a burst of 90 % of the per-minute limit arrives within two seconds,
//! seven eighths of it at A, in two steps a second apart with two rounds of
//! answers in between.
//!
//! What is asserted: the minute's admits stay within the limit (no slack)
//! and the aggregator counts exactly the visitors admitted; the colo's
//! slots follow the burst within the two rounds of answers between the
//! steps (A admits at least 140 of its 157, far more than the half it
//! held); and whoever was queued while the minute's admits were below 98 %
//! of the limit gets in at their first check-in, a refresh interval later
//! (after 25 s: the 20 s refresh jittered by up to ±20 %). Issue
//! 15's target (nobody queued below 98 % of both limits) is not met by a
//! design that never holds a request: a node cannot admit beyond what it
//! holds before the next answer. The test prints how many were queued
//! early; docs/BENCHMARKS.md has the figures.
use std::time::Duration;

use waitroom_tests::inproc_cluster::{InProcCluster, visit as visit_with, visit_new as visit};

const NEW_USERS_PER_MINUTE: u64 = 200;
const TOTAL_ACTIVE_USERS: u64 = 400;

#[test]
fn a_seven_to_one_burst_over_two_nodes_holds_the_limit_and_the_early_queued_get_in_at_their_first_check_in()
 {
    let room = format!(
        "total_active_users = {TOTAL_ACTIVE_USERS}\nnew_users_per_minute = {NEW_USERS_PER_MINUTE}\n\
         session_duration = 5\nqueueing_method = \"fifo\"\n"
    );
    let cluster = InProcCluster::start(
        "accuracy-burst",
        &room,
        &[("node-a1", "a"), ("node-a2", "a"), ("node-b1", "b")],
        // Reports once a second of real time, longer than a step of the
        // burst takes to send: one round of answers per step, as in production.
        1_000,
    )
    .expect("cluster starts");
    let [a, b, c] = [0, 1, 2].map(|i| cluster.nodes[i].url("/"));
    // A few rounds for every node's first lease to settle (the first node to
    // report is offered the whole pool until the others have reported).
    for _ in 0..3 {
        cluster.advance(Duration::from_secs(1)).expect("fresh");
    }

    // Three minutes of light traffic: A and B alike (one each every 10 s),
    // C in the other colo one every 30 s. Everyone is admitted.
    let mut history = 0;
    for step in 0..18 {
        assert!(visit(&a), "light traffic is admitted at A (step {step})");
        assert!(visit(&b), "light traffic is admitted at B (step {step})");
        history += 2;
        if step % 3 == 0 {
            assert!(visit(&c));
            history += 1;
        }
        cluster.advance(Duration::from_secs(10)).expect("fresh");
    }
    // The burst starts one second into a minute.
    let minute_start = (cluster.now().0 / 60_000 + 1) * 60_000 + 1_000;
    cluster
        .advance(Duration::from_millis(minute_start - cluster.now().0))
        .expect("fresh");

    // 180 visitors (90 % of the per-minute limit) within two seconds, 157 at
    // A and 23 at B, in two steps.
    let (mut admitted, mut queued_early, mut at_a_admitted) = (0_u64, Vec::new(), 0_u64);
    let (at_a, at_b) = (157_u64, 23_u64);
    for step in 0..2_u64 {
        let share = |n: u64| n * (step + 1) / 2 - n * step / 2;
        for (url, n) in [(&a, share(at_a)), (&b, share(at_b))] {
            for _ in 0..n {
                match visit_with(url, None) {
                    (true, _) => {
                        admitted += 1;
                        at_a_admitted += u64::from(url == &a);
                    }
                    (false, cookie) if admitted * 100 < NEW_USERS_PER_MINUTE * 98 => {
                        queued_early.push((url.clone(), admitted, cookie.expect("a queue cookie")));
                    }
                    (false, _) => {}
                }
            }
        }
        // Two rounds of answers: which of A and B reports first within a round
        // is up to real time, and A's larger part waits for B to give back
        // what it holds, at B's own next report.
        cluster.advance(Duration::from_millis(500)).expect("fresh");
        cluster.advance(Duration::from_millis(500)).expect("fresh");
    }
    let status = cluster.status();
    let room = &status.rooms[0];
    eprintln!(
        "burst: {admitted} of {} admitted ({at_a_admitted} at A); queued while below 98 % of the \
         per-minute limit: {} (admits then: {:?}); aggregator: {} admitted this minute, {} active; \
         history {history}",
        at_a + at_b,
        queued_early.len(),
        queued_early.iter().map(|q| q.1).collect::<Vec<_>>(),
        room.admitted_this_minute,
        room.active_users
    );
    assert!(
        room.admitted_this_minute <= NEW_USERS_PER_MINUTE,
        "{room:?}"
    );
    assert_eq!(room.admitted_this_minute, admitted, "{room:?}");
    // A held half of the colo's slots when the burst began (about 90 of the
    // 200 with its Anywhere lease). Split by the traffic two minutes back
    // only (the engine of commit ab0dfe9, this very test), it got half of what
    // was left each round and admitted 132 of its 157 (25 queued at 72 % of
    // the limit); the colo now follows the burst within the rounds between
    // the steps.
    assert!(
        at_a_admitted >= 140,
        "the colo's slots followed the burst to A: only {at_a_admitted} of {at_a} admitted there"
    );

    // Those queued while there was room check in when their page says (the
    // room's 20 s refresh, jittered by up to ±20 % per ticket: at most 24 s)
    // and get in at that first check-in.
    cluster.advance(Duration::from_secs(25)).expect("fresh");
    let late: Vec<u64> = queued_early
        .iter()
        .filter(|(url, _, cookie)| !visit_with(url, Some(cookie)).0)
        .map(|&(_, admits, _)| admits)
        .collect();
    assert!(
        late.is_empty(),
        "{} of {} queued early still waited at their first check-in (admits when queued: {late:?})",
        late.len(),
        queued_early.len()
    );
}
