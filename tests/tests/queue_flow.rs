//! How the queue moves over real minutes: sessions expire and free slots, FIFO
//! lets the oldest bucket in first, random queueing lets any bucket in, and a
//! real browser waits on the queue page and lands on the site by itself.
//!
//! These tests wait for minute boundaries of the wall clock (buckets are arrival
//! minutes), so each takes one to two minutes; they run in parallel.
use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use waitroom_tests::{
    browser::{Browser, chromium_path},
    edge::{Edge, QUEUE, SITE, client, metric},
    minutes::{early_in_a_minute, sleep_into_next_minute},
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

/// Checks in (respecting the refresh interval) until `pred` holds on the body.
fn check_in_until(
    agent: &ureq::Agent,
    url: &str,
    limit: Duration,
    pred: impl Fn(&str) -> bool,
) -> Option<String> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let body = get(agent, url);
        if pred(&body) {
            return Some(body);
        }
        std::thread::sleep(Duration::from_secs(7)); // above the 5 s ± 20 % interval
    }
    None
}

#[test]
fn fifo_lets_the_oldest_bucket_in_first() {
    let (_dir, _origin, edge) = node(
        "fifo",
        "total_active_users = 50\nnew_users_per_minute = 1\nsession_duration = 5",
    );
    early_in_a_minute(20);
    let v1 = client();
    let older = client();
    assert!(
        get(&v1, &edge.url("/")).contains(SITE),
        "the minute's one slot"
    );
    assert!(
        get(&older, &edge.url("/")).contains(QUEUE),
        "no slot left this minute"
    );

    // Next minute: one new slot, reserved for the older bucket.
    sleep_into_next_minute(8);
    let newer = client();
    let body = get(&newer, &edge.url("/"));
    assert!(
        body.contains(QUEUE),
        "a newer arrival must not take the older bucket's slot: {body}"
    );
    assert!(
        get(&older, &edge.url("/")).contains(SITE),
        "the older bucket gets the slot"
    );
    std::thread::sleep(Duration::from_secs(7));
    assert!(
        get(&newer, &edge.url("/")).contains(QUEUE),
        "the minute's slot is spent"
    );
    let m = get(&client(), &edge.admin_url("/metrics"));
    assert_eq!(
        metric(&m, "waitroom_admitted_total{room=\"shop\",kind=\"new\"}"),
        Some(2.0),
        "{m}"
    );
}

#[test]
fn random_queueing_can_admit_a_newer_bucket_first() {
    let (_dir, _origin, edge) = node(
        "random",
        "total_active_users = 50\nnew_users_per_minute = 1\nsession_duration = 5\nqueueing_method = \"random\"",
    );
    early_in_a_minute(20);
    let v1 = client();
    let older = client();
    assert!(get(&v1, &edge.url("/")).contains(SITE));
    let queued = get(&older, &edge.url("/"));
    assert!(
        queued.contains(QUEUE) && queued.contains("at random"),
        "{queued}"
    );

    // The older visitor keeps its place but does not check in; the newer one does.
    sleep_into_next_minute(2);
    let newer = client();
    let got_in = check_in_until(&newer, &edge.url("/"), Duration::from_secs(70), |b| {
        b.contains(SITE)
    });
    assert!(
        got_in.is_some(),
        "in random queueing a newer bucket competes for every slot"
    );
}

#[test]
fn an_ended_session_frees_its_slot_for_the_queue() {
    let (_dir, _origin, edge) = node(
        "expiry",
        "total_active_users = 1\nnew_users_per_minute = 1\nsession_duration = 1",
    );
    let first = client();
    let waiting = client();
    assert!(get(&first, &edge.url("/")).contains(SITE));
    assert!(get(&waiting, &edge.url("/")).contains(QUEUE));
    let started = Instant::now();
    // The first visitor stops browsing; after its session (1 minute, counted to the
    // end of its expiry minute) the waiting one gets in by checking in.
    let body = check_in_until(&waiting, &edge.url("/"), Duration::from_secs(150), |b| {
        b.contains(SITE)
    });
    assert!(body.is_some(), "the slot was never freed");
    assert!(
        started.elapsed() >= Duration::from_secs(55),
        "freed before the session ended"
    );
    // Now the first visitor's session is over: it is a new visitor and must queue.
    assert!(get(&first, &edge.url("/")).contains(QUEUE));
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
