//! What a node makes of what follows an aggregator's answer (issue 20's
//! `Message::Note`), right and wrong, with the real binaries on loopback:
//! two aggregators, one node whose first choice of home is the first; the
//! node reaches that one through a proxy (`answer_proxy`) that relays the
//! real answers and sets what comes after them.
//!
//! What is asserted, each for a few intervals while visitors keep coming:
//! - a note for another answer, a note that names no room, bytes that are
//!   no frame after the answer, and a stream left open after the answer
//!   cost nothing: the node stays at its home, fresh from it, counts no
//!   answer held back, and takes its answers at the interval's pace (it
//!   waits for a note at most 100 ms, not for a stream's end);
//! - a note that names the answer's rooms moves the node's grants to the
//!   other aggregator, counted per aggregator, and the first answer without
//!   one brings it back;
//! - a note in place of the answer is no answer: the node takes its state
//!   from the other aggregator, and comes back when answers do;
//! - every visitor is answered, none with a server error.
use std::time::Duration;

use waitroom_tests::{
    answer_proxy::{ProxiedNode, Tail},
    cluster::random_room,
    edge::admits_new_visitor,
    eventually,
    minutes::now_secs,
};

const INTERVAL_MS: u64 = 500;

/// Visitors for `secs` seconds, two every 100 ms; each must be admitted
/// (the room has room for all), none may see a server error.
fn visitors_for(setup: &ProxiedNode, secs: f64) {
    let until = now_secs() + secs;
    while now_secs() < until {
        for _ in 0..2 {
            assert!(admits_new_visitor(&setup.edge), "a visitor admitted");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn what_follows_an_answer_moves_the_node_only_when_it_is_a_note_for_that_answer() {
    // Two aggregators, the first behind the proxy; a room no visitor of
    // this test fills: every one is admitted.
    let setup = ProxiedNode::start("answer-notes", 2, &random_room(10_000, 10_000), INTERVAL_MS);

    // --- Wrong notes and broken ends: nothing changes.
    for tail in [
        Tail::NoteOfAnotherAnswer,
        Tail::EmptyNote,
        Tail::Garbage,
        Tail::LeftOpen,
    ] {
        setup.proxy.set(tail);
        let since = now_secs();
        let relayed = setup.proxy.answers();
        let answers = setup.of_the_proxy("waitroom_gossip_aggregator_answers_total");
        visitors_for(&setup, 3.0);
        let answers = setup.of_the_proxy("waitroom_gossip_aggregator_answers_total") - answers;
        let relayed = setup.proxy.answers() - relayed;
        eprintln!("{tail:?}: {answers} answers taken in 3 s, {relayed} relayed");
        assert_eq!(setup.home(), Some(0), "{tail:?}: the node stays at home");
        assert!(
            setup.fresh_at(0, since + 1.0),
            "{tail:?}: fresh from its home"
        );
        assert_eq!(
            setup.of_the_proxy("waitroom_gossip_aggregator_held_back_total"),
            0.0,
            "{tail:?}: no answer counted as held back"
        );
        // Six intervals in the window; a node that waited for each
        // stream's end (two seconds when left open) would take two.
        assert!(
            answers >= 4.0,
            "{tail:?}: answers at the interval's pace, {answers} in 3 s"
        );
    }

    // --- A note for the answer: the grants come from the other aggregator.
    setup.proxy.set(Tail::Note);
    assert!(
        eventually(Duration::from_secs(3), || setup.home() == Some(1)),
        "a note for the answer moves the node's grants to the other aggregator"
    );
    let since = now_secs();
    visitors_for(&setup, 2.0);
    assert!(setup.fresh_at(1, since), "fresh from the other");
    assert_eq!(setup.home(), Some(1), "and stays there while notes come");
    assert!(setup.of_the_proxy("waitroom_gossip_aggregator_held_back_total") >= 2.0);
    assert!(
        setup
            .edge
            .proc
            .stderr()
            .contains("cannot make grants durable"),
        "the node says why: {}",
        setup.edge.proc.stderr()
    );
    setup.set_until_fresh_at(
        Tail::Faithful,
        0,
        "the first answer without a note brings it back",
    );

    // --- A note instead of the answer: no answer at all.
    setup.set_until_fresh_at(
        Tail::NoteFirst,
        1,
        "a note in place of the answer is no answer: the other aggregator takes over",
    );
    visitors_for(&setup, 2.0);
    assert_eq!(
        setup.of_the_proxy("waitroom_gossip_aggregator_answering"),
        0.0,
        "the proxy is not answering"
    );
    setup.set_until_fresh_at(Tail::Faithful, 0, "answers again: the node is back");
    visitors_for(&setup, 1.0);
}
