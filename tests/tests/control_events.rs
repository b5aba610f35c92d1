//! Scheduled events created, listed and removed through the aggregator's
//! control API (`waitroom-aggregator ctl`) on real processes: an aggregator
//! with a token file, one node gossiping with it, the demo origin behind it.
//!
//! What is asserted:
//! - an event added at the aggregator is in force on the node within two
//!   gossip intervals: a new visitor gets the pre-queue page (HTML and the
//!   JSON with `waitTimeKnown: false` and the event's start), no cookie
//!   opens the site, and the node's status names the phase;
//! - removing it puts the room back within two intervals;
//! - what a tired operator or an attacker sends is refused with the field
//!   named and changes nothing (the version stays): a pre-queue less than
//!   five minutes before the start, an end before the start, a shuffle
//!   without a pre-queue, an unknown key, a second event of the same name,
//!   an event without a name, removing an event that does not exist, and a
//!   write without the token.
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use waitroom_common::{event::format_rfc3339, time::UnixMillis};
use waitroom_tests::{
    cluster::{Aggregator, Certs, controlled_aggregator, ctl, node_gossip_table, write_tokens},
    edge::{Edge, SITE, client},
    eventually,
    procs::{TempDir, start_origin},
};

const INTERVAL_MS: u64 = 1_000;
const TOKEN: &str = "carol-0123456789abcdef0123";
const ROOM: &str = "[[rooms]]\nid = \"shop\"\ntotal_active_users = 40\nnew_users_per_minute = 20\n";

fn get_json(url: &str) -> Value {
    let mut resp = client().get(url).call().expect("GET");
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}

/// The node's settings version and its room's event phase.
fn node_state(edge: &Edge) -> (u64, Value) {
    let status = get_json(&edge.admin_url("/status"));
    (
        status["settings_version"].as_u64().unwrap_or(0),
        status["rooms"][0]["event_phase"].clone(),
    )
}

/// A new visitor asking for HTML: (the site, the page's text).
fn visit_html(edge: &Edge) -> (bool, String) {
    let mut resp = client().get(&edge.url("/")).call().expect("visitor");
    let body = resp.body_mut().read_to_string().unwrap_or_default();
    (body.contains(SITE), body)
}

/// A new visitor asking for JSON: the queue's answer, or `Null` if admitted.
fn visit_json(edge: &Edge) -> Value {
    let mut resp = client()
        .get(&edge.url("/"))
        .header("accept", "application/json")
        .call()
        .expect("visitor");
    let body = resp.body_mut().read_to_string().unwrap_or_default();
    serde_json::from_str(&body).unwrap_or(Value::Null)
}

/// How long after `from` the node ran settings `version`, if within two
/// gossip intervals of it.
fn reached(edge: &Edge, version: u64, from: Instant) -> Option<Duration> {
    let limit = Duration::from_millis(2 * INTERVAL_MS);
    while from.elapsed() < limit {
        if node_state(edge).0 >= version {
            return Some(from.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn at(now: UnixMillis, offset_minutes: i64) -> String {
    let millis = i64::try_from(now.0).unwrap() + offset_minutes * 60_000;
    // Whole seconds: what an operator would type.
    format_rfc3339(UnixMillis(u64::try_from(millis).unwrap() / 1_000 * 1_000))
}

#[test]
fn events_added_and_removed_at_the_aggregator_reach_the_node() {
    let dir = TempDir::new("control-events");
    let certs = Certs::generate(&dir.path().join("certs"), &["n1"]).unwrap();
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let tokens = dir.path().join("control.tokens");
    write_tokens(&tokens, &format!("carol {TOKEN}\n"));
    let (aggregator, listen) = controlled_aggregator(dir.path(), &certs, &tokens, ROOM).unwrap();
    let own = dir.path().join("n1");
    std::fs::create_dir_all(&own).unwrap();
    let gossip = node_gossip_table(listen, &certs, &certs, "n1", INTERVAL_MS);
    let edge = Edge::start(
        dir.path(),
        "n1",
        &waitroom_tests::cluster::node_config(&own, "n1", "ams", 1, true, ROOM, origin, &gossip),
    )
    .unwrap();
    assert!(
        eventually(Duration::from_secs(15), || node_state(&edge).0 == 1),
        "the node runs the aggregator's version 1"
    );
    assert!(visit_html(&edge).0, "no event yet: admitted");
    assert_eq!(node_state(&edge).1, Value::Null, "no event phase");

    let now = UnixMillis(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
            .try_into()
            .unwrap(),
    );
    let version = |a: &Aggregator| {
        let (ok, out, err) = ctl(a, &tokens, &["get", "shop"]);
        assert!(ok, "{out}{err}");
        serde_json::from_str::<Value>(&out).unwrap()["version"].clone()
    };

    // --- What a tired operator or an attacker sends: refused, field named.
    let refused = [
        (
            json!({"name": "late", "prequeue_start_time": at(now, 1),
                   "event_start_time": at(now, 4), "event_end_time": at(now, 30)}),
            "prequeue_start_time",
        ),
        (
            json!({"name": "backwards", "event_start_time": at(now, 30),
                   "event_end_time": at(now, 10)}),
            "event_end_time",
        ),
        (
            json!({"name": "noprequeue", "event_start_time": at(now, 30),
                   "event_end_time": at(now, 60), "shuffle_at_event_start": true}),
            "shuffle_at_event_start",
        ),
        (
            json!({"name": "typo", "event_start_time": at(now, 30),
                   "event_end_time": at(now, 60), "total_active_user": 5}),
            "total_active_user",
        ),
        (
            json!({"event_start_time": at(now, 30), "event_end_time": at(now, 60)}),
            "name",
        ),
        (
            json!({"name": "baddate", "event_start_time": "tomorrow at nine",
                   "event_end_time": at(now, 60)}),
            "event_start_time",
        ),
    ];
    for (event, field) in &refused {
        let (ok, out, err) = ctl(
            &aggregator,
            &tokens,
            &["add-event", "shop", &event.to_string()],
        );
        assert!(!ok, "accepted {event}: {out}");
        assert!(
            err.contains(field),
            "{event}: the error names {field}: {err}"
        );
    }
    assert_eq!(version(&aggregator), 1, "nothing refused made a version");

    // --- The event: pre-queue from a minute ago, start in ten minutes.
    let sale = json!({
        "name": "sale",
        "prequeue_start_time": at(now, -1),
        "event_start_time": at(now, 10),
        "event_end_time": at(now, 40),
        "total_active_users": 40,
        "new_users_per_minute": 5,
        "shuffle_at_event_start": true,
    });
    let (ok, out, err) = ctl(
        &aggregator,
        &tokens,
        &["add-event", "shop", &sale.to_string()],
    );
    assert!(ok, "{out}{err}");
    let added = Instant::now();
    let took = reached(&edge, 2, added);
    assert!(
        took.is_some(),
        "version 2 not in force on the node within two intervals"
    );
    eprintln!("the event reached the node after {took:?}");
    assert_eq!(version(&aggregator), 2);

    // The same name again, and a write without the token: refused.
    let (ok, _, err) = ctl(
        &aggregator,
        &tokens,
        &["add-event", "shop", &sale.to_string()],
    );
    assert!(!ok && err.contains("sale"), "a second \"sale\": {err}");
    let no_token = client()
        .post(&aggregator.admin_url("/api/rooms/shop/events"))
        .send(
            json!({"name": "sneaky", "event_start_time": at(now, 30),
                     "event_end_time": at(now, 60)})
            .to_string(),
        );
    let status = match no_token {
        Ok(resp) => resp.status().as_u16(),
        Err(ureq::Error::StatusCode(code)) => code,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(status, 401, "no token, no event");
    assert_eq!(version(&aggregator), 2);

    let (ok, out, _) = ctl(&aggregator, &tokens, &["events", "shop"]);
    assert!(ok);
    let listed: Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = listed["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(names, ["sale"], "{listed}");

    // In force on the node: the pre-queue.
    let phase = node_state(&edge).1;
    assert!(
        phase
            .as_str()
            .is_some_and(|p| p.starts_with("prequeueing: sale")),
        "{phase}"
    );
    let (site, page) = visit_html(&edge);
    assert!(
        !site,
        "a pre-queued visitor does not reach the site: {page}"
    );
    let queue = visit_json(&edge);
    let inner = queue
        .as_object()
        .and_then(|o| o.values().next())
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(inner["waitTimeKnown"], false, "{queue}");
    assert_eq!(inner["eventStartTime"], sale["event_start_time"], "{queue}");

    // --- Removing an unknown event is refused; removing "sale" ends it.
    let (ok, _, err) = ctl(&aggregator, &tokens, &["delete-event", "shop", "nosuch"]);
    assert!(!ok && err.contains("nosuch"), "{err}");
    assert_eq!(version(&aggregator), 2);
    let (ok, out, err) = ctl(&aggregator, &tokens, &["delete-event", "shop", "sale"]);
    assert!(ok, "{out}{err}");
    let took = reached(&edge, 3, Instant::now());
    assert!(
        took.is_some(),
        "version 3 not in force on the node within two intervals"
    );
    assert_eq!(node_state(&edge).1, Value::Null);
    assert!(
        visit_html(&edge).0,
        "the room's own settings again: admitted"
    );
}
