//! How the queue moves over minutes: FIFO lets the oldest bucket in first,
//! random queueing lets any bucket in, a minute boundary renews the
//! new-users-per-minute slots, ended sessions free theirs, and a queue drains
//! over several minutes within both limits.
//!
//! Those run a node in the test process on a driven clock ([`InProcNode`]):
//! each crosses minutes in well under a second of real time. One test keeps
//! real minutes end to end: the real binary, a real browser that waits on the
//! queue page by itself, and sessions that end on the wall clock (one to
//! three minutes).
use std::{net::SocketAddr, time::Duration};

use waitroom_tests::{
    browser::{Browser, chromium_path},
    edge::{Edge, QUEUE, SITE, client, metric},
    inproc::{InProcNode, START},
    procs::{Proc, TempDir, start_origin},
};

fn config(dir: &TempDir, origin: SocketAddr, room: &str) -> String {
    format!(
        r#"[node]
id = "flow-node"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
workers = 2
counters_path = "{counters}"

[[rooms]]
id = "shop"
origin = "{origin}"
refresh_interval = 5
{room}
"#,
        counters = dir.path().join("counters.shm").display()
    )
}

/// A scratch dir, the demo origin and a node in front of it with `room`'s keys.
fn node(tag: &str, room: &str) -> (TempDir, Proc, Edge) {
    let dir = TempDir::new(tag);
    let (origin_proc, origin) = start_origin(dir.path(), "origin").unwrap();
    let edge = Edge::start(dir.path(), "edge", &config(&dir, origin, room)).unwrap();
    (dir, origin_proc, edge)
}

fn get(agent: &ureq::Agent, url: &str) -> String {
    waitroom_tests::edge::get(agent, url).1
}

/// Checks in every `step` of the node's clock until `pred` holds on the body,
/// for at most `limit` of the node's time: the body and the node's time then.
fn check_in_until(
    node: &InProcNode,
    agent: &ureq::Agent,
    step: Duration,
    limit: Duration,
    pred: impl Fn(&str) -> bool,
) -> Option<(String, waitroom_common::time::UnixMillis)> {
    let deadline = node.now().0 + limit.as_millis() as u64;
    while node.now().0 <= deadline {
        let body = get(agent, &node.url("/"));
        if pred(&body) {
            return Some((body, node.now()));
        }
        node.advance(step);
    }
    None
}

/// The refresh interval of the driven tests' rooms, and a step above its
/// 5 s ± 20 % jitter: a check-in a step after the last one is never early.
const ROOM_REFRESH: &str = "refresh_interval = 5";
const STEP: Duration = Duration::from_secs(7);

fn admitted_new(node: &InProcNode) -> Option<f64> {
    let m = get(&client(), &node.admin_url("/metrics"));
    metric(&m, "waitroom_admitted_total{room=\"shop\",kind=\"new\"}")
}

fn active_users(node: &InProcNode) -> Option<f64> {
    let m = get(&client(), &node.admin_url("/metrics"));
    metric(&m, "waitroom_active_users{room=\"shop\",scope=\"node\"}")
}

#[test]
fn fifo_lets_the_oldest_bucket_in_first() {
    let node = InProcNode::start(
        "fifo",
        &format!("total_active_users = 50\nnew_users_per_minute = 1\nsession_duration = 5\n{ROOM_REFRESH}"),
    )
    .unwrap();
    let v1 = client();
    let older = client();
    assert!(
        get(&v1, &node.url("/")).contains(SITE),
        "the minute's one slot"
    );
    assert!(
        get(&older, &node.url("/")).contains(QUEUE),
        "no slot left this minute"
    );

    // Next minute: one new slot, reserved for the older bucket.
    node.advance_into_next_minute(8);
    let newer = client();
    let body = get(&newer, &node.url("/"));
    assert!(
        body.contains(QUEUE),
        "a newer arrival must not take the older bucket's slot: {body}"
    );
    assert!(
        get(&older, &node.url("/")).contains(SITE),
        "the older bucket gets the slot"
    );
    node.advance(STEP);
    assert!(
        get(&newer, &node.url("/")).contains(QUEUE),
        "the minute's slot is spent"
    );
    assert_eq!(admitted_new(&node), Some(2.0));
}

#[test]
fn random_queueing_can_admit_a_newer_bucket_first() {
    let node = InProcNode::start(
        "random",
        &format!("total_active_users = 50\nnew_users_per_minute = 1\nsession_duration = 5\nqueueing_method = \"random\"\n{ROOM_REFRESH}"),
    )
    .unwrap();
    let v1 = client();
    let older = client();
    assert!(get(&v1, &node.url("/")).contains(SITE));
    let queued = get(&older, &node.url("/"));
    assert!(
        queued.contains(QUEUE) && queued.contains("at random"),
        "{queued}"
    );

    // The older visitor keeps its place but does not check in; the newer one does.
    node.advance_into_next_minute(2);
    let newer = client();
    let got_in = check_in_until(&node, &newer, STEP, Duration::from_secs(70), |b| {
        b.contains(SITE)
    });
    assert!(
        got_in.is_some(),
        "in random queueing a newer bucket competes for every slot"
    );
}

#[test]
fn a_minute_boundary_renews_the_new_users_per_minute() {
    let node = InProcNode::start(
        "per-minute",
        &format!("total_active_users = 100\nnew_users_per_minute = 3\nsession_duration = 10\n{ROOM_REFRESH}"),
    )
    .unwrap();
    let first: Vec<ureq::Agent> = (0..3).map(|_| client()).collect();
    for v in &first {
        assert!(get(v, &node.url("/")).contains(SITE));
    }
    let waiting = client();
    assert!(
        get(&waiting, &node.url("/")).contains(QUEUE),
        "three slots a minute, all taken"
    );
    // Late in the same minute nothing has changed.
    node.advance(Duration::from_secs(57));
    assert!(get(&waiting, &node.url("/")).contains(QUEUE), "same minute");

    // The next minute brings three new slots: the waiting visitor's first,
    // then two for new arrivals, and no more.
    node.advance_into_next_minute(8);
    assert!(
        get(&waiting, &node.url("/")).contains(SITE),
        "the queued visitor gets one of the new minute's slots"
    );
    let later: Vec<String> = (0..3).map(|_| get(&client(), &node.url("/"))).collect();
    assert!(later[0].contains(SITE) && later[1].contains(SITE));
    assert!(later[2].contains(QUEUE), "three a minute, not four");
    // Sessions were untouched by the boundary.
    for v in &first {
        assert!(get(v, &node.url("/product/1")).contains(SITE));
    }
    assert_eq!(admitted_new(&node), Some(6.0));
}

#[test]
fn an_ended_session_frees_its_slot_for_the_queue() {
    let node = InProcNode::start(
        "expiry",
        &format!(
            "total_active_users = 1\nnew_users_per_minute = 1\nsession_duration = 1\n{ROOM_REFRESH}"
        ),
    )
    .unwrap();
    let first = client();
    let waiting = client();
    assert!(get(&first, &node.url("/")).contains(SITE));
    assert!(get(&waiting, &node.url("/")).contains(QUEUE));
    // The first visitor stops browsing; after its session (1 minute, counted to the
    // end of its expiry slot) the waiting one gets in by checking in.
    let (_, admitted_at) = check_in_until(&node, &waiting, STEP, Duration::from_secs(150), |b| {
        b.contains(SITE)
    })
    .expect("the slot was never freed");
    assert!(
        admitted_at.0 >= START.0 + 60_000,
        "freed before the session ended: {} s after it began",
        (admitted_at.0 - START.0) / 1_000
    );
    // Now the first visitor's session is over: it is a new visitor and must queue.
    assert!(get(&first, &node.url("/")).contains(QUEUE));
}

/// Ten minutes of a queue draining: five visitors behind one, two sessions
/// at most, one new visitor a minute, three-minute sessions nobody renews.
/// Every minute the admits stay within new-users-per-minute and the active
/// sessions within total-active-users; ended sessions make the room for
/// everyone to get in.
///
/// The sessions were two minutes long while they counted to the end of their
/// expiry minute (about three minutes in effect); counted to the second, two
/// two-minute sessions at one admit a minute never fill two places, so the
/// total limit would hold nobody back and the test would prove nothing about
/// it. Three minutes at one a minute asks for three places of two.
#[test]
fn a_queue_drains_over_several_minutes_within_both_limits() {
    let node = InProcNode::start(
        "drain",
        &format!(
            "total_active_users = 2\nnew_users_per_minute = 1\nsession_duration = 3\n{ROOM_REFRESH}"
        ),
    )
    .unwrap();
    let holder = client();
    assert!(get(&holder, &node.url("/")).contains(SITE));
    let queue: Vec<ureq::Agent> = (0..5).map(|_| client()).collect();
    for v in &queue {
        assert!(get(v, &node.url("/")).contains(QUEUE));
    }
    let minute = |t: waitroom_common::time::UnixMillis| (t.0 - START.0 + 1_000) / 60_000;
    let mut admitted_in: Vec<Option<u64>> = vec![None; queue.len()];
    let mut admits_per_minute = std::collections::BTreeMap::<u64, usize>::new();
    // Nine check-ins a minute (one every STEP), for at most fifteen minutes.
    for _ in 0..15 * 9 {
        node.advance(STEP);
        for (v, at) in queue.iter().zip(&mut admitted_in) {
            if at.is_none() && get(v, &node.url("/")).contains(SITE) {
                *at = Some(minute(node.now()));
                *admits_per_minute.entry(minute(node.now())).or_default() += 1;
            }
        }
        let active = active_users(&node).unwrap();
        assert!(active <= 2.0, "{active} active at {:?}", node.now());
        if admitted_in.iter().all(Option::is_some) {
            break;
        }
    }
    assert!(
        admitted_in.iter().all(Option::is_some),
        "everyone gets in: {admitted_in:?}"
    );
    assert!(
        admits_per_minute.values().all(|&n| n == 1),
        "one new visitor a minute: {admits_per_minute:?}"
    );
    // At one a minute alone they would be in by minute 5; the two-session
    // limit held some back until earlier sessions ended.
    let last = admits_per_minute.keys().max().copied().unwrap_or(0);
    assert!(
        last > 5 && (1..last).any(|m| !admits_per_minute.contains_key(&m)),
        "full minutes while visitors waited: {admitted_in:?}"
    );
}

#[test]
fn a_real_browser_waits_on_the_queue_page_and_lands_on_the_site() {
    if chromium_path().is_none() {
        eprintln!("skipping: chromium is not installed (cargo xtask setup installs it)");
        return;
    }
    let (dir, _origin, edge) = node(
        "browser",
        "total_active_users = 1\nnew_users_per_minute = 1\nsession_duration = 1",
    );
    let holder = client();
    assert!(
        get(&holder, &edge.url("/")).contains(SITE),
        "someone holds the only slot"
    );

    let mut browser = Browser::open(dir.path(), &edge.url("/")).unwrap();
    let queue_text = browser
        .wait_for_text(Duration::from_secs(20), |t| t.contains(QUEUE))
        .unwrap();
    assert!(queue_text.contains("Estimated wait"), "{queue_text}");
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let _ = browser.screenshot(&shots.join("queue-page.png"));

    // No clicks, no reloads by the test: the page's own refresh and the browser's
    // own cookie must bring it to the site once the holder's session ends.
    let site_text = browser
        .wait_for_text(Duration::from_secs(170), |t| t.contains(SITE))
        .unwrap();
    assert!(site_text.contains("The waiting room let you in"));
    let _ = browser.screenshot(&shots.join("site-after-queue.png"));

    let m = get(&client(), &edge.admin_url("/metrics"));
    // Exactly two visitors were ever admitted: the browser kept one ticket
    // through all its refreshes instead of arriving anew each time.
    assert_eq!(
        metric(&m, "waitroom_admitted_total{room=\"shop\",kind=\"new\"}"),
        Some(2.0),
        "{m}"
    );
    let queued = metric(&m, "waitroom_queued_total{room=\"shop\"}").unwrap_or(0.0);
    assert!(
        queued >= 2.0,
        "the browser refreshed the queue page itself: {queued}"
    );
}
