//! Origin commands end to end, on a driven clock: a checkout page that
//! answers `Waitroom-Command: revoke` ends its visitor's session at once and
//! the next queued visitor gets the slot; the header never reaches a visitor,
//! and a visitor who sends it, or keeps the revoked cookie, gains nothing.
use std::time::Duration;

use waitroom_tests::{
    edge::{QUEUE, SITE, client, get, metric},
    inproc::InProcNode,
    raw::{RawResponse, request},
};

/// One visitor at a time; a step above the 5 s ± 20 % refresh jitter.
const ROOM: &str = "total_active_users = 1\nnew_users_per_minute = 1\nrefresh_interval = 5\n";
const STEP: Duration = Duration::from_secs(7);

fn visit(node: &InProcNode, path: &str, cookie: &Option<String>) -> RawResponse {
    let headers: Vec<(&str, &str)> = cookie.iter().map(|c| ("Cookie", c.as_str())).collect();
    request(node.http, "GET", path, &headers)
}

fn active(node: &InProcNode) -> Option<f64> {
    let m = get(&client(), &node.admin_url("/metrics")).1;
    metric(&m, "waitroom_active_users{room=\"shop\",scope=\"node\"}")
}

#[test]
fn a_checkout_that_revokes_frees_the_slot_for_the_next_in_line() {
    let node = InProcNode::start(
        "cmd-revoke",
        &format!("{ROOM}enabled_origin_commands = [\"revoke\"]\n"),
    )
    .unwrap();
    let first = visit(&node, "/", &None);
    assert!(first.body.contains(SITE), "{}", first.body);
    let a = first.cookie();
    let queued = visit(&node, "/", &None);
    assert!(queued.body.contains(QUEUE));
    let b = queued.cookie();

    // A minute later A's session still holds the one place: B waits.
    node.advance_into_next_minute(1);
    let b_resp = visit(&node, "/", &b);
    assert!(b_resp.body.contains(QUEUE), "B got in while A browses");
    let b = b_resp.cookie().or(b);

    // A finishes the checkout: the header is gone, so is A's cookie and count.
    let done = visit(&node, "/checkout/done", &a);
    assert!(done.body.contains(SITE));
    assert_eq!(
        done.header("waitroom-command"),
        None,
        "the command reached the visitor"
    );
    let cleared = done.header("set-cookie").unwrap_or_default();
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
    node.advance(STEP);
    assert_eq!(active(&node), Some(0.0));

    // B's next check-in takes the freed place.
    let b_resp = visit(&node, "/", &b);
    assert!(
        b_resp.body.contains(SITE),
        "B still queued: {}",
        b_resp.body
    );
    assert_eq!(active(&node), Some(1.0));
    let m = get(&client(), &node.admin_url("/metrics")).1;
    assert_eq!(
        metric(&m, "waitroom_revoked_total{room=\"shop\"}"),
        Some(1.0)
    );

    // A kept the revoked cookie: a new visitor, behind B.
    let replay = visit(&node, "/", &a);
    assert!(replay.body.contains(QUEUE), "a revoked cookie was honoured");
}

/// The attacker and the tired operator: a visitor who sends the header
/// (to end someone's session, or to make the origin echo it) moves nothing
/// and the origin never sees it; a room that did not enable the command
/// ignores it and still strips it.
#[test]
fn the_command_is_the_origins_alone_and_only_where_enabled() {
    let node = InProcNode::start("cmd-off", ROOM).unwrap();
    let first = visit(&node, "/", &None);
    let a = first.cookie();
    assert!(first.body.contains(SITE));
    let done = visit(&node, "/checkout/done", &a);
    assert_eq!(
        done.header("waitroom-command"),
        None,
        "stripped though not enabled"
    );
    assert!(
        done.all("set-cookie").all(|c| !c.contains("Max-Age=0")),
        "not enabled: the session stays"
    );
    node.advance(STEP);
    assert_eq!(active(&node), Some(1.0));

    let on = InProcNode::start(
        "cmd-visitor",
        &format!("{ROOM}enabled_origin_commands = [\"revoke\"]\n"),
    )
    .unwrap();
    let first = visit(&on, "/", &None);
    let a = first.cookie().unwrap();
    let echo = request(
        on.http,
        "GET",
        "/echo",
        &[("Cookie", a.as_str()), ("Waitroom-Command", "revoke")],
    );
    assert!(echo.body.starts_with("GET /echo"), "{}", echo.body);
    assert!(
        !echo.body.to_ascii_lowercase().contains("waitroom-command"),
        "the origin saw the visitor's command: {}",
        echo.body
    );
    on.advance(STEP);
    assert_eq!(active(&on), Some(1.0), "a visitor's header moved a count");
    assert!(visit(&on, "/", &Some(a)).body.contains(SITE));
}
