//! A lost answer to an on-demand lease ask, with the real binaries on
//! loopback: one aggregator, one node that reaches it through a proxy
//! (`answer_proxy`) that can lose the answers to chosen reports (the stream
//! left open, nothing sent: as a packet lost for good, or an aggregator that
//! took the report and never answered).
//!
//! The gossip client sends one report at a time. Before, the answer to an
//! ask was waited for as long as a periodic one (two intervals, here 2 s):
//! one lost ask kept the node from reporting, and from holding any visitor,
//! for that long. Asserted here:
//! - a lost ask is asked again after a few round trips (`ask_timeout_ms`,
//!   here its floor of 100 ms): the node takes an answer and may hold
//!   visitors again well within a second, and counts the ask unanswered;
//! - an aggregator that answers nothing gets no storm of reports for it:
//!   at most one report more per lost ask, each answer of which is waited
//!   for as a periodic one; the node serves every visitor meanwhile and is
//!   fresh again once answers come back.
use std::time::{Duration, Instant};

use waitroom_tests::{
    answer_proxy::{ProxiedNode, Tail},
    edge::admits_new_visitor,
    eventually,
    minutes::now_secs,
};

/// A periodic answer is waited for two intervals: 2 s.
const INTERVAL_MS: u64 = 1_000;

/// A first-come room (an asking node is promised its recent need, two slots
/// when idle) far from its limits.
const ROOM: &str = "[[rooms]]\nid = \"shop\"\ntotal_active_users = 10000\n\
                    new_users_per_minute = 6000\nqueueing_method = \"fifo\"\n";

/// One aggregator behind the proxy, one node.
fn start(name: &str) -> ProxiedNode {
    ProxiedNode::start(name, 1, ROOM, INTERVAL_MS)
}

#[test]
fn a_lost_answer_to_an_ask_is_asked_again_after_a_few_round_trips() {
    let setup = start("lost-ask");
    // Idle for a few rounds: the node is promised two slots.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(setup.metric("waitroom_lease_holding"), 1.0);
    let asks_before = setup.metric("waitroom_lease_asks_total");

    setup.just_after_an_answer();
    setup.proxy.lose_next(1);
    let answers_before = setup.proxy.answers();
    let burst = Instant::now();
    // New visitors one after another until one is held and queued: the
    // promise ran out, the node asked, the answer was lost.
    let mut queued_after = None;
    for _ in 0..20 {
        let asked = Instant::now();
        if !admits_new_visitor(&setup.edge) {
            queued_after = Some(asked.elapsed());
            break;
        }
    }
    let held = queued_after.expect("a visitor short of slots, queued once its hold ended");
    assert!(
        held >= Duration::from_millis(40) && held < Duration::from_secs(1),
        "the visitor was held (lease_wait_ms 50) before being queued: {held:?}"
    );
    assert_eq!(setup.proxy.lost(), 1, "the ask's answer was the one lost");
    assert!(setup.metric("waitroom_lease_asks_total") > asks_before);

    // The node reports again at once: an answer comes a few round trips
    // after the lost one, not after the periodic wait (2 s) and the next
    // tick.
    let until = Instant::now() + Duration::from_secs(5);
    while setup.proxy.answers() == answers_before && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    let next_answer = burst.elapsed();
    println!("held {held:?}, then queued; the next answer {next_answer:?} after the burst began");
    assert!(
        next_answer < Duration::from_millis(800),
        "the next answer {next_answer:?} after the burst; a lost ask should cost ~100 ms"
    );
    assert!(
        eventually(Duration::from_millis(500), || setup
            .metric("waitroom_lease_holding")
            == 1.0),
        "the node holds visitors again once answered"
    );
    assert_eq!(setup.metric("waitroom_lease_asks_unanswered_total"), 1.0);
    // Not taken for a dead connection: no reconnect.
    assert_eq!(setup.metric("waitroom_gossip_connected"), 1.0);
}

#[test]
fn an_aggregator_that_never_answers_gets_no_storm_of_reports() {
    let setup = start("silent-aggregator");
    std::thread::sleep(Duration::from_secs(2));
    setup.just_after_an_answer();
    let reports_before = setup.proxy.reports();
    setup.proxy.set(Tail::Withheld);
    // Five seconds of new visitors, ten a second: each may be short of
    // slots and ask (until the node stops holding).
    let window = Instant::now();
    let mut served = 0;
    while window.elapsed() < Duration::from_secs(5) {
        admits_new_visitor(&setup.edge);
        served += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let reports = setup.proxy.reports() - reports_before;
    let unanswered = setup.metric("waitroom_lease_asks_unanswered_total");
    println!(
        "{reports} reports in 5 s to a silent aggregator, {served} visitors served, \
         {unanswered} asks unanswered"
    );
    // Periodic reports wait 2 s each (and the connection is dropped after
    // two); an ask waits 100 ms and is followed by one report that waits
    // 2 s, and once a hold timed out nobody is held, so nobody asks. Every
    // report waiting 100 ms would be about 50 here. (The proxy sees fewer
    // reports than the node makes when many are withheld at once: its
    // server, like the aggregator's, bounds the streams a node keeps open.)
    assert!(
        unanswered <= 3.0,
        "{unanswered} asks unanswered in 5 s: asking again and again"
    );
    assert!(
        reports <= 8,
        "{reports} reports in 5 s to an aggregator that answers none"
    );
    assert!(setup.proxy.lost() >= 2, "the answers were withheld");

    // Answers again: the node is fresh and holds again.
    setup.proxy.set(Tail::Faithful);
    let since = now_secs();
    assert!(
        eventually(Duration::from_secs(15), || setup.fresh_at(0, since)),
        "fresh again once the aggregator answers"
    );
    assert!(
        eventually(Duration::from_secs(3), || setup
            .metric("waitroom_lease_holding")
            == 1.0),
        "holding again"
    );
}
