//! A scheduled event on a real node on the driven clock: the pre-queue
//! queues everyone with a page that says the event has not started, the
//! start shuffles the pre-queued visitors (admitted in the order their
//! tickets drew, not in the order they came), the event's limits hold only
//! while it runs, and a visitor who re-arrives or copies their cookie in the
//! pre-queue gets no better place.
use std::time::Duration;

use serde_json::Value;
use waitroom_common::{ticket::Ticket, time::Minute};
use waitroom_tests::{
    edge::{SITE, client, get},
    inproc::{InProcNode, START},
};

/// Room of 100 / 50 a minute; the event: pre-queue from 08:02, start 08:08
/// (shuffled), end 08:16, one new visitor a minute while it runs. The clock
/// starts at 08:00:01 on 2027-01-15 ([`START`]).
const ROOM: &str = r#"total_active_users = 100
new_users_per_minute = 50
session_duration = 30
refresh_interval = 5

[[rooms.events]]
name = "sale"
prequeue_start_time = "2027-01-15T08:02:00Z"
event_start_time = "2027-01-15T09:08:00+01:00"
event_end_time = "2027-01-15T08:16:00Z"
total_active_users = 100
new_users_per_minute = 1
shuffle_at_event_start = true
"#;

const COOKIE: &str = "__wr_shop";

/// One visitor: their cookie (`name=value`) and what it opens to.
#[derive(Debug, Default)]
struct Visitor {
    cookie: Option<String>,
    admitted: bool,
}

/// What one request got: admitted (the site), and the queue JSON if queued.
struct Answer {
    site: bool,
    json: Option<Value>,
    cookie: Option<String>,
}

fn request(node: &InProcNode, cookie: Option<&str>, accept_json: bool) -> Answer {
    let agent = client();
    let mut req = agent.get(&node.url("/"));
    if let Some(c) = cookie {
        req = req.header("Cookie", c);
    }
    if accept_json {
        req = req.header("Accept", "application/json");
    }
    let mut resp = req.call().expect("request");
    let cookie = resp
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with(COOKIE))
        .and_then(|v| v.split(';').next())
        .map(str::to_owned);
    let body = resp.body_mut().read_to_string().unwrap_or_default();
    Answer {
        site: body.contains(SITE),
        json: serde_json::from_str(&body).ok(),
        cookie,
    }
}

/// The ticket a `name=value` cookie holds, opened with the node's keys.
fn ticket(node: &InProcNode, cookie: &str) -> Ticket {
    let value = cookie.strip_prefix(&format!("{COOKIE}=")).unwrap();
    let bytes = node.node().keys.load().open("shop", value).unwrap();
    postcard::from_bytes(&bytes).unwrap()
}

/// Where the event's shuffle places a ticket (what every node computes).
fn drawn_bucket(node: &InProcNode, t: &Ticket) -> Minute {
    let room = node.node().rooms[0].live.load().engine.at(node.now());
    let shuffle = room.shuffle().expect("the event has started");
    shuffle.bucket(t.bucket, t.id).unwrap_or(t.bucket)
}

fn event_phase(node: &InProcNode) -> Value {
    let (_, body) = get(&client(), &node.admin_url("/status"));
    let status: Value = serde_json::from_str(&body).unwrap();
    status["rooms"][0]["event_phase"].clone()
}

#[test]
fn prequeue_then_a_shuffled_start_then_the_rooms_own_limits() {
    let node = InProcNode::start("events", ROOM).unwrap();
    assert_eq!(node.now(), START);

    // Before the pre-queue: the room's own limits, 50 a minute.
    for _ in 0..3 {
        assert!(request(&node, None, false).site, "an open room admits");
    }
    assert_eq!(event_phase(&node), Value::Null);

    // The pre-queue: two arrivals a minute for six minutes, all queued.
    node.advance(Duration::from_secs(120));
    let mut visitors: Vec<Visitor> = Vec::new();
    for minute in 0..6 {
        // Those waiting check in, as their pages do (a visitor who stops
        // checking in for three minutes no longer counts as waiting).
        for v in &mut visitors {
            let a = request(&node, v.cookie.as_deref(), true);
            assert!(!a.site, "nobody is admitted in the pre-queue");
            v.cookie = a.cookie.or(v.cookie.take());
        }
        for _ in 0..2 {
            let a = request(&node, None, true);
            assert!(!a.site, "nobody is admitted in the pre-queue");
            let w = &a.json.expect("the queue's JSON")["waitingRoom"];
            assert_eq!(w["waitTimeKnown"], false, "{w}");
            assert_eq!(w["isEventPrequeueing"], true, "{w}");
            assert_eq!(w["isEventActive"], false, "{w}");
            assert_eq!(w["eventStartTime"], "2027-01-15T08:08:00Z", "{w}");
            assert_eq!(w["timeUntilEventStart"], 6 - minute, "{w}");
            assert_eq!(w["shuffleAtEventStart"], true, "{w}");
            visitors.push(Visitor {
                cookie: a.cookie,
                admitted: false,
            });
        }
        if minute == 0 {
            let phase = event_phase(&node);
            assert!(
                phase.as_str().unwrap().starts_with("prequeueing: sale"),
                "{phase}"
            );
            let html = request(&node, visitors[0].cookie.as_deref(), false);
            assert!(!html.site);
        }
        if minute < 5 {
            node.advance(Duration::from_secs(60));
        }
    }
    let (first_cookie, first) = {
        let c = visitors[0].cookie.clone().unwrap();
        let t = ticket(&node, &c);
        (c, t)
    };

    // The first arrival re-arrives many times with their cookie: same
    // ticket, same arrival bucket, still queued.
    for _ in 0..10 {
        node.advance(Duration::from_secs(5));
        let a = request(&node, visitors[0].cookie.as_deref(), true);
        assert!(!a.site);
        if let Some(c) = a.cookie {
            let t = ticket(&node, &c);
            assert_eq!((t.id, t.bucket), (first.id, first.bucket));
            visitors[0].cookie = Some(c);
        }
    }
    assert!(
        node.now().0 < START.0 + 8 * 60_000 - 1_000,
        "still the pre-queue"
    );

    // The start: held until every pre-queued visitor checked in once (the
    // shuffle moves a ticket when it checks in), then one a minute, in the
    // order the tickets drew.
    node.advance_into_next_minute(1);
    let phase = event_phase(&node);
    assert!(
        phase.as_str().unwrap().starts_with("active: sale"),
        "{phase}"
    );
    let draws: Vec<Minute> = visitors
        .iter()
        .map(|v| drawn_bucket(&node, &ticket(&node, v.cookie.as_ref().unwrap())))
        .collect();
    let arrivals: Vec<Minute> = visitors
        .iter()
        .map(|v| ticket(&node, v.cookie.as_ref().unwrap()).bucket)
        .collect();
    assert_ne!(draws, arrivals, "the start reorders the pre-queue");
    let mut admitted_order = Vec::new();
    for round in 0..8 {
        let mut this_round = Vec::new();
        // Everyone checks in in arrival order: if arrival decided, the
        // earliest would always win.
        for (i, v) in visitors.iter_mut().enumerate().filter(|(_, v)| !v.admitted) {
            let a = request(&node, v.cookie.as_deref(), true);
            if let Some(c) = a.cookie {
                let t = ticket(&node, &c);
                assert_eq!(t.bucket, draws[i], "the ticket holds its drawn bucket");
                v.cookie = Some(c);
            }
            if a.site {
                v.admitted = true;
                this_round.push(i);
            }
        }
        if round == 0 {
            // One second after the start: those who checked in first would
            // go ahead of those who drew earlier but had not checked in yet.
            assert_eq!(
                this_round,
                Vec::<usize>::new(),
                "round 0: nobody is admitted until the shuffle has settled"
            );
        }
        assert!(
            this_round.len() <= 1,
            "round {round}: the event's 1 a minute: {this_round:?}"
        );
        let lowest_waiting = visitors
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.admitted)
            .map(|(i, _)| draws[i])
            .min();
        for &i in &this_round {
            assert!(
                lowest_waiting.is_none_or(|w| draws[i] <= w),
                "round {round}: visitor {i} (drawn {:?}) admitted before one drawn {lowest_waiting:?}",
                draws[i]
            );
        }
        admitted_order.extend(this_round);
        if round == 0 {
            // A copy of the first arrival's pre-queue cookie, replayed
            // after the start: the same drawn place, no better.
            let copy = request(&node, Some(&first_cookie), true);
            if let Some(c) = copy.cookie {
                assert_eq!(ticket(&node, &c).bucket, draws[0]);
            }
        }
        node.advance_into_next_minute(1);
    }
    assert!(admitted_order.len() >= 6, "{admitted_order:?}");

    // After the end: the room's 50 a minute again, for the rest at once.
    assert!(node.now().0 >= START.0 + 16 * 60_000 - 1_000);
    assert_eq!(event_phase(&node), Value::Null);
    for (i, v) in visitors.iter_mut().enumerate().filter(|(_, v)| !v.admitted) {
        let a = request(&node, v.cookie.as_deref(), true);
        assert!(a.site, "visitor {i}: the room's own limit after the end");
        v.admitted = true;
    }
    assert!(
        request(&node, None, false).site,
        "a newcomer goes straight in"
    );
}

/// An event's own queue page is shown in its pre-queue; after the end the
/// room's page is back.
#[test]
fn an_event_shows_its_own_queue_page_only_while_in_force() {
    let dir = waitroom_tests::procs::TempDir::new("event-page");
    let page = dir.path().join("sale.mustache");
    std::fs::write(
        &page,
        "SALE PAGE opens {{eventStartTime}}{{#waitTimeKnown}} known{{/waitTimeKnown}}",
    )
    .unwrap();
    let room = format!(
        r#"total_active_users = 10
new_users_per_minute = 1
refresh_interval = 5

[[rooms.events]]
name = "sale"
prequeue_start_time = "2027-01-15T08:01:00Z"
event_start_time = "2027-01-15T08:06:00Z"
event_end_time = "2027-01-15T08:07:00Z"
queue_page = "{}"
"#,
        page.display()
    );
    let node = InProcNode::start("event-page", &room).unwrap();
    node.advance(Duration::from_secs(60));
    let (_, body) = get(&client(), &node.url("/"));
    assert_eq!(body, "SALE PAGE opens 2027-01-15T08:06:00Z");

    node.advance(Duration::from_secs(6 * 60));
    assert!(request(&node, None, false).site, "the minute's one slot");
    let (_, body) = get(&client(), &node.url("/"));
    assert!(body.contains(waitroom_tests::edge::QUEUE), "{body}");
    assert!(!body.contains("SALE PAGE"));
}
