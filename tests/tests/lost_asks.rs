//! A lost answer to an on-demand lease ask, with the real binaries on
//! loopback: one aggregator, one node that reaches it through a proxy
//! (`answer_proxy`) that can lose the answers to chosen reports (the stream
//! left open, nothing sent: as a packet lost for good, or an aggregator that
//! took the report and never answered).
//!
//! The gossip client sends one report at a time: while it waits for an
//! answer that was lost, no ask can go. Asserted here:
//! - a held visitor's lost ask is asked again while their hold (50 ms) can
//!   still take the answer (`ask_within_hold_ms`, ~44 ms on loopback, where
//!   `ask_timeout_ms` waits 100): the visitor is admitted, not queued;
//! - a visitor held while the answer to a periodic report is lost cuts
//!   that report's wait (2 s) short the same way;
//! - a report confirming a lowered cap whose answer is lost is waited for
//!   as an ask (100 ms), not as a periodic report (2 s);
//! - the report sent again after a lost ask is waited for as the ask, so
//!   two answers lost in a row stop the holding for ~90 ms, not 2 s;
//! - in groups of visitors on a path that loses one answer in five, none
//!   is queued;
//! - the ask, and the report sent again after it, name the visitor held
//!   (`Message::HeldReport`), so the aggregator promises a slot for them
//!   even where an idle node is promised nothing; an aggregator from before
//!   held reports refuses them, and the node goes on with home reports and
//!   still holds its visitors;
//! - an aggregator that answers nothing gets no storm of reports for it:
//!   at most two reports more per answer, the second waited for as a
//!   periodic one; the node serves every visitor meanwhile and is fresh
//!   again once answers come back;
//! - reports go as changes after a connection's first answer; changes
//!   refused for want of their base are followed at once by the report
//!   whole, and an aggregator from before changes gets whole reports.
use std::time::{Duration, Instant};

use waitroom_tests::{
    answer_proxy::{Arrival, ProxiedNode, Tail},
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

/// [`start`], then idle for a few rounds: the node is promised two slots
/// and holds visitors.
fn idle_and_holding(name: &str) -> ProxiedNode {
    let setup = start(name);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(setup.metric("waitroom_lease_holding"), 1.0);
    setup
}

/// New visitors one after another, `n` of them: how many were queued and
/// the longest any took.
fn visitors(setup: &ProxiedNode, n: usize) -> (usize, Duration) {
    let mut queued = 0;
    let mut slowest = Duration::ZERO;
    for _ in 0..n {
        let asked = Instant::now();
        if !admits_new_visitor(&setup.edge) {
            queued += 1;
        }
        slowest = slowest.max(asked.elapsed());
    }
    (queued, slowest)
}

/// The report that arrived after the first one whose answer was lost, and
/// how long after it.
fn next_after_lost(setup: &ProxiedNode) -> Option<(Arrival, Duration)> {
    let arrivals = setup.proxy.arrivals();
    let lost = arrivals.iter().position(|a| a.lost)?;
    let next = arrivals.get(lost + 1)?;
    Some((*next, next.at.duration_since(arrivals[lost].at)))
}

/// Waits (at most `within`) until a report after the lost one arrived.
fn until_reported_again(setup: &ProxiedNode, within: Duration) -> Option<(Arrival, Duration)> {
    let until = Instant::now() + within;
    loop {
        if let Some(next) = next_after_lost(setup) {
            return Some(next);
        }
        if Instant::now() > until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_lost_answer_to_a_held_visitors_ask_is_asked_again_within_the_hold() {
    let setup = idle_and_holding("lost-ask");
    let asks_before = setup.metric("waitroom_lease_asks_total");

    setup.just_after_an_answer();
    setup.proxy.lose_next(1);
    // New visitors one after another: the promise runs out, a visitor is
    // held and the node asks; that answer is lost.
    let (queued, slowest) = visitors(&setup, 20);
    assert_eq!(setup.proxy.lost(), 1, "an answer was lost");
    assert!(setup.metric("waitroom_lease_asks_total") > asks_before);
    let (_, gap) =
        until_reported_again(&setup, Duration::from_secs(5)).expect("the node reported again");
    println!(
        "{queued} of 20 queued, the slowest {slowest:?}; asked again {gap:?} after the lost ask"
    );
    // Asked again while the hold (50 ms) could still take the answer: at
    // about 44 ms on loopback, where `ask_timeout_ms` waits 100 ms and the
    // hold has ended.
    assert!(
        gap >= Duration::from_millis(20) && gap < Duration::from_millis(90),
        "asked again {gap:?} after the lost ask; within the hold is ~44 ms"
    );
    // The held visitor is admitted on the answer to the ask sent again, and
    // nobody after them is queued. Asked again only after the hold, the
    // held visitor and every visitor until the answer came were queued
    // (the node holds nobody after a hold timed out). One is allowed for a
    // machine too busy to answer within the hold's last milliseconds.
    assert!(
        queued <= 1,
        "{queued} of 20 visitors queued with room to spare"
    );
    assert!(slowest < Duration::from_secs(1), "{slowest:?}");
    assert!(
        eventually(Duration::from_millis(500), || setup
            .metric("waitroom_lease_holding")
            == 1.0),
        "the node holds visitors again once answered"
    );
    assert_eq!(setup.metric("waitroom_lease_asks_unanswered_total"), 1.0);
    // Not taken for a dead connection: no reconnect.
    assert_eq!(setup.metric("waitroom_gossip_connected"), 1.0);
    // The ask and the report sent again each named the held visitor: by
    // its counts, the report sent again has nobody new since the lost ask,
    // and at scale (where an idle node is promised nothing) it would be
    // promised nothing for them.
    let arrivals = setup.proxy.arrivals();
    let lost = arrivals.iter().position(|a| a.lost).expect("one lost");
    let named = |a: &Arrival| a.held_visitors.unwrap_or(0);
    assert!(
        named(&arrivals[lost]) >= 1 && named(&arrivals[lost + 1]) >= 1,
        "the lost ask named {:?} held visitors, the report sent again {:?}",
        arrivals[lost].held_visitors,
        arrivals[lost + 1].held_visitors
    );
    assert!(
        setup.aggregator_metric("waitroom_aggregator_held_visitor_reports_total") >= 2.0,
        "the aggregator took both in as reports naming held visitors"
    );
}

/// An aggregator from before held reports refuses them as malformed (the
/// proxy answers for it so): the node steps back to home reports on that
/// connection at once, not to plain ones, keeps asking and holding, and
/// queues nobody. Stepping back to plain reports would lose the leases a
/// home report names, which the aggregator counts while an answer may be
/// lost.
#[test]
fn an_aggregator_from_before_held_reports_gets_home_reports_and_visitors_are_still_held() {
    let setup = idle_and_holding("held-refused");
    assert!(
        setup
            .proxy
            .arrivals()
            .iter()
            .any(|a| a.held_visitors.is_some()),
        "the node sends held reports to an aggregator that takes them"
    );
    setup.proxy.refuse_held_reports(true);
    let holds_before = setup.metric("waitroom_lease_holds_total");
    let since = setup.proxy.arrivals().len();
    assert!(
        eventually(Duration::from_secs(3), || setup
            .proxy
            .arrivals()
            .iter()
            .skip(since)
            .any(|a| a.refused)),
        "a held report refused"
    );
    let (queued, slowest) = visitors(&setup, 20);
    // Two intervals more: periodic reports, and whatever asks there were.
    std::thread::sleep(Duration::from_millis(2 * INTERVAL_MS));
    let arrivals = setup.proxy.arrivals();
    let refused: Vec<_> = arrivals.iter().filter(|a| a.refused).collect();
    let after = &arrivals[arrivals.iter().rposition(|a| a.refused).expect("refused") + 1..];
    println!(
        "{} held reports refused; then {} reports, {} of them home reports;          {queued} of 20 queued, the slowest {slowest:?}",
        refused.len(),
        after.len(),
        after.iter().filter(|a| a.home).count()
    );
    // A held report sent as changes is refused first: the node cannot tell
    // which of the two the aggregator predates, and sends it whole (an
    // aggregator from before held reports predates changes too).
    let whole: Vec<_> = refused.iter().filter(|a| !a.changes).collect();
    assert_eq!(whole.len(), 1, "refused whole once, then not sent again");
    assert!(
        refused.len() == 1 || (refused.len() == 2 && refused[0].changes),
        "at most one refusal as changes before it: {refused:?}"
    );
    assert!(
        after.len() >= 2,
        "{} reports after the refusal",
        after.len()
    );
    assert!(
        after.iter().all(|a| a.home && a.held_visitors.is_none()),
        "home reports after the refusal: {after:?}"
    );
    assert!(
        setup.metric("waitroom_lease_holds_total") > holds_before,
        "visitors still held on the lease"
    );
    assert_eq!(setup.metric("waitroom_lease_holding"), 1.0);
    assert_eq!(queued, 0, "far from the limits");
    assert_eq!(setup.metric("waitroom_gossip_connected"), 1.0);
}

#[test]
fn two_answers_lost_in_a_row_stop_the_holding_for_an_asks_wait_not_two_seconds() {
    let setup = idle_and_holding("lost-twice");
    setup.just_after_an_answer();
    // The held visitor's ask is lost, and so is the report sent again.
    setup.proxy.lose_next(2);
    // A visitor every 20 ms for a second.
    let window = Instant::now();
    let (mut served, mut queued) = (0_u32, 0_u32);
    while window.elapsed() < Duration::from_secs(1) {
        if !admits_new_visitor(&setup.edge) {
            queued += 1;
        }
        served += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    let arrivals = setup.proxy.arrivals();
    let first_lost = arrivals
        .iter()
        .position(|a| a.lost)
        .expect("an answer lost");
    assert_eq!(setup.proxy.lost(), 2, "two answers lost");
    let third = arrivals
        .get(first_lost + 2)
        .map(|a| a.at.duration_since(arrivals[first_lost].at));
    println!("{queued} of {served} queued; the third report {third:?} after the first lost");
    // The first report sent again is waited for as the ask it repeats
    // (within the hold: ~44 ms), the second goes then. Waited for as a
    // periodic report, the first sent again kept the node from holding
    // and from asking for 2 s: every visitor short of slots meanwhile was
    // queued.
    let third = third.expect("a third report within the second");
    assert!(
        third < Duration::from_millis(400),
        "the second report sent again {third:?} after the lost ask"
    );
    assert!(
        queued <= 6,
        "{queued} of {served} visitors queued with room to spare"
    );
    assert_eq!(setup.metric("waitroom_lease_asks_unanswered_total"), 2.0);
    assert_eq!(setup.metric("waitroom_gossip_connected"), 1.0);
}

#[test]
fn a_held_visitor_does_not_wait_behind_a_periodic_report_whose_answer_was_lost() {
    let setup = idle_and_holding("lost-periodic");
    setup.just_after_an_answer();
    // Nobody comes for the interval: the next report is the periodic one,
    // and its answer is lost. Waited for as a periodic answer is, two
    // intervals (2 s), it would keep any ask from going meanwhile.
    setup.proxy.lose_next(1);
    assert!(
        eventually(Duration::from_secs(3), || setup.proxy.lost() == 1),
        "the periodic report's answer lost"
    );
    let burst = Instant::now();
    let (queued, slowest) = visitors(&setup, 20);
    let (_, gap) =
        until_reported_again(&setup, Duration::from_secs(5)).expect("the node reported again");
    let cut_short = setup.metric("waitroom_lease_reports_cut_short_total");
    println!(
        "{queued} of 20 queued, the slowest {slowest:?}; reported again {gap:?} after the lost \
         report, {:?} into the burst; {cut_short} cut short",
        burst.elapsed()
    );
    // The held visitor cut the wait short: a report went at once and its
    // answer ended the hold. Waiting out the lost answer, the held visitor
    // and everyone after them were queued until 2 s after the lost report.
    assert!(
        queued <= 1,
        "{queued} of 20 visitors queued with room to spare"
    );
    assert!(
        gap < Duration::from_millis(1_000),
        "reported again {gap:?} after the lost report; a held visitor should cut the 2 s wait short"
    );
    assert!(cut_short >= 1.0, "the lost report's wait cut short");
    assert_eq!(setup.metric("waitroom_gossip_connected"), 1.0);
}

#[test]
fn a_lost_confirmation_of_a_lowered_cap_is_waited_for_as_an_ask() {
    let setup = start("lost-confirmation");
    std::thread::sleep(Duration::from_secs(2));
    // A burst raises the node's promise (it asks, and its rate is high);
    // idle after it, the next answers lower the promise again, and the
    // node confirms each lowered cap at once. The first confirmation's
    // answer is lost. On a busy machine the burst can take longer than a
    // report interval and its lowered caps be confirmed before the loss is
    // armed: then another burst, with the loss still armed.
    let mut lost = None;
    for _ in 0..3 {
        let (queued, _) = visitors(&setup, 40);
        assert_eq!(queued, 0, "far from the limits");
        setup.proxy.lose_next_confirmation();
        lost = until_reported_again(&setup, Duration::from_secs(4));
        if lost.is_some() {
            break;
        }
    }
    let (next, gap) = lost.expect("a confirmation lost, then another report");
    let confirms = setup.metric("waitroom_lease_confirms_total");
    let cut_short = setup.metric("waitroom_lease_reports_cut_short_total");
    println!(
        "reported again {gap:?} after the lost confirmation ({next:?}); {confirms} confirmations, {cut_short} cut short"
    );
    assert!(
        setup.proxy.arrivals().iter().any(|a| a.lost && a.confirms),
        "the lost answer was a confirmation's"
    );
    assert!(confirms >= 1.0);
    // Waited as an ask (here 100 ms), then reported again at once; waited
    // as a periodic report, the next report would go 2 s later.
    assert!(
        gap >= Duration::from_millis(80) && gap < Duration::from_millis(600),
        "reported again {gap:?} after the lost confirmation; an ask's wait is 100 ms"
    );
    // Counted with the reports cut short, not as an ask.
    assert!(cut_short >= 1.0);
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
    // as long and one that waits 2 s, and once a hold timed out nobody is
    // held, so nobody asks. Every
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

/// Traffic far below the limits, in groups, on a path that loses one
/// answer in five (twice the simulator's hostile preset): between groups
/// the node holds the idle minimum of slots, so a visitor is often short
/// and held, and a lost answer to whatever report was on its way would
/// queue them (and, the holding stopped, everyone until the next answer).
/// The node before this change (96fffca) queued 26 and 48 of the 160 here
/// (two runs); this one none.
#[test]
fn visitors_in_groups_are_not_queued_when_one_answer_in_five_is_lost() {
    let setup = start("lossy-steady");
    std::thread::sleep(Duration::from_secs(2));
    setup.just_after_an_answer();
    setup.proxy.lose_every(5);
    // Groups of eight visitors, 1.2 s apart: between two groups a periodic
    // answer lowers the node's promise to the idle minimum (two slots),
    // which the node confirms at once, so the third of each group is held
    // and asks.
    let window = Instant::now();
    let (mut served, mut queued) = (0_u32, 0_u32);
    for _ in 0..20 {
        for _ in 0..8 {
            if !admits_new_visitor(&setup.edge) {
                queued += 1;
            }
            served += 1;
        }
        std::thread::sleep(Duration::from_millis(1_200));
        assert!(window.elapsed() < Duration::from_secs(60), "bounded");
    }
    setup.proxy.lose_every(0);
    let lost = setup.proxy.lost();
    let reports = setup.proxy.reports();
    println!(
        "{queued} of {served} visitors queued; {lost} answers lost of {reports} reports; \
         holds {}, timed out {}, asks {}, asks unanswered {}, cut short {}, confirmations {}",
        setup.metric("waitroom_lease_holds_total"),
        setup.metric("waitroom_lease_holds_timed_out_total"),
        setup.metric("waitroom_lease_asks_total"),
        setup.metric("waitroom_lease_asks_unanswered_total"),
        setup.metric("waitroom_lease_reports_cut_short_total"),
        setup.metric("waitroom_lease_confirms_total"),
    );
    assert!(lost >= 3, "{lost} answers lost: the path was not lossy");
    assert!(
        setup.metric("waitroom_lease_holds_total") >= 2.0,
        "visitors were held (the promise is the idle minimum)"
    );
    // Far below the limits: every visitor queued was queued with room.
    assert!(
        queued * 50 <= served,
        "{queued} of {served} visitors queued with room to spare"
    );
}

/// The reports after the last refused one, and that one.
fn after_refused_changes(setup: &ProxiedNode) -> Option<(Arrival, Vec<Arrival>)> {
    let arrivals = setup.proxy.arrivals();
    let at = arrivals.iter().rposition(|a| a.changes_refused)?;
    Some((arrivals[at], arrivals[at + 1..].to_vec()))
}

/// After a connection's first answer the node sends its reports as the
/// changes since the last one answered. Changes the aggregator refuses for
/// want of their base (answers lost several times in a row, or a forged
/// number) are followed at once by the report whole, not an interval
/// later, and changes go on after it: nothing is lost, no reconnect.
#[test]
fn changes_whose_base_the_aggregator_lost_are_followed_at_once_by_the_report_whole() {
    let setup = idle_and_holding("changes-base");
    let arrivals = setup.proxy.arrivals();
    assert!(!arrivals[0].changes, "a connection's first report is whole");
    let as_changes = arrivals.iter().filter(|a| a.changes).count();
    assert!(
        as_changes + 2 >= arrivals.len(),
        "{as_changes} of {} reports as changes",
        arrivals.len()
    );
    setup.proxy.refuse_changes(1, false);
    assert!(
        eventually(Duration::from_secs(5), || after_refused_changes(&setup)
            .is_some_and(|(_, after)| after.len() >= 2)),
        "changes refused, and two reports after them"
    );
    let (refused, after) = after_refused_changes(&setup).unwrap();
    let gap = after[0].at.duration_since(refused.at);
    println!(
        "the report whole {gap:?} after the refused changes; then {} reports, {} as changes",
        after.len(),
        after.iter().filter(|a| a.changes).count()
    );
    assert!(!after[0].changes, "the next report is whole: {after:?}");
    // The interval is 1 s; at once is a round trip.
    assert!(gap < Duration::from_millis(300), "{gap:?}");
    assert!(after[1].changes, "then changes again: {after:?}");
    assert_eq!(setup.metric("waitroom_gossip_connected"), 1.0);
    assert!(
        setup.aggregator_metric("waitroom_aggregator_changes_reports_total") >= 1.0,
        "the aggregator took changes in"
    );
}

/// An aggregator from before changes refuses them as malformed: the node
/// sends whole reports on that connection from then on, at once, and its
/// visitors are admitted as before. The same counts whole take more bytes
/// than they took as changes.
#[test]
fn an_aggregator_from_before_changes_gets_whole_reports_and_nobody_is_queued() {
    let setup = idle_and_holding("changes-old");
    // Sessions, admits and visitors to report, then two reports of them
    // as changes (the first carries them, the next only what moved).
    let (queued_before, _) = visitors(&setup, 20);
    std::thread::sleep(Duration::from_millis(2 * INTERVAL_MS + 200));
    let before = setup.proxy.arrivals();
    setup.proxy.refuse_changes(u64::MAX, true);
    assert!(
        eventually(Duration::from_secs(5), || after_refused_changes(&setup)
            .is_some()),
        "changes refused"
    );
    let (queued, slowest) = visitors(&setup, 20);
    std::thread::sleep(Duration::from_millis(2 * INTERVAL_MS));
    let (refused, after) = after_refused_changes(&setup).unwrap();
    let refusals = setup
        .proxy
        .arrivals()
        .iter()
        .filter(|a| a.changes_refused)
        .count();
    println!(
        "{refusals} refused as changes; then {} reports, {} as changes; {queued} of 20 queued, the slowest {slowest:?}",
        after.len(),
        after.iter().filter(|a| a.changes).count()
    );
    assert_eq!(refusals, 1, "refused once, then not sent as changes again");
    assert!(
        after.len() >= 2,
        "{} reports after the refusal",
        after.len()
    );
    assert!(after.iter().all(|a| !a.changes), "whole reports: {after:?}");
    assert!(
        after[0].at.duration_since(refused.at) < Duration::from_millis(300),
        "the report whole at once"
    );
    assert_eq!(queued + queued_before, 0, "far from the limits");
    assert_eq!(setup.metric("waitroom_gossip_connected"), 1.0);
    // The last report as changes before the refusal, against the whole
    // reports after it (the same sessions and more).
    let last_changes = before.iter().rev().find(|a| a.changes).expect("changes");
    let whole_min = after.iter().map(|a| a.bytes).min().unwrap();
    println!(
        "the last report as changes {} bytes; whole reports after it {whole_min} bytes and more",
        last_changes.bytes
    );
    // One room of a few slots here: most of either is the report's own
    // fields (docs/BENCHMARKS.md has 10 rooms of 60 slots at 0.086).
    assert!(
        last_changes.bytes < whole_min,
        "{} bytes as changes, {whole_min} whole",
        last_changes.bytes
    );
}
