//! What browsers and apps expect of the room's answers: a queue answer says
//! when to come back in `Refresh` and `Retry-After` and varies by `Accept`;
//! an admitted visitor's cookie lives as long as the session (seed 002); a
//! `SameSite=None` cookie always carries `Secure`.
use waitroom_tests::{edge::QUEUE, inproc::InProcNode, raw::request};

#[test]
fn queue_answers_say_when_to_return_and_vary_by_accept() {
    let node = InProcNode::start(
        "expect-queue",
        "total_active_users = 10\nnew_users_per_minute = 10\nqueue_all = true\nrefresh_interval = 30\n",
    )
    .unwrap();
    for accept in ["text/html", "application/json"] {
        let r = request(node.http, "GET", "/", &[("Accept", accept)]);
        assert!(
            r.body.contains(QUEUE) || r.body.contains("waitingRoom"),
            "{}",
            r.body
        );
        let refresh: u64 = r.header("refresh").unwrap().parse().unwrap();
        let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert_eq!(refresh, retry, "{accept}");
        assert!((24..=36).contains(&retry), "30 s ± 20 %: {retry}");
        assert_eq!(r.header("vary"), Some("Accept"));
    }
}

#[test]
fn an_admitted_cookie_expires_with_the_session() {
    let node = InProcNode::start(
        "expect-cookie",
        "total_active_users = 10\nnew_users_per_minute = 10\nsession_duration = 10\n",
    )
    .unwrap();
    let r = request(node.http, "GET", "/", &[]);
    let cookie = r.header("set-cookie").unwrap();
    assert!(
        cookie.contains("Max-Age=631;"),
        "10 minutes to the end of that second, and the 30 s reseal lag: {cookie}"
    );
}

/// The tired operator: `cookie_same_site = "none"` with `cookie_secure =
/// "auto"` on a plain-HTTP request would make a cookie browsers drop in
/// silence; it carries `Secure` anyway (and "never" is refused at start).
#[test]
fn same_site_none_always_carries_secure() {
    let node = InProcNode::start(
        "expect-samesite",
        "total_active_users = 10\nnew_users_per_minute = 10\ncookie_same_site = \"none\"\n",
    )
    .unwrap();
    let r = request(node.http, "GET", "/", &[]);
    let cookie = r.header("set-cookie").unwrap();
    assert!(cookie.contains("SameSite=None; Secure"), "{cookie}");
    let err = InProcNode::start(
        "expect-samesite-never",
        "total_active_users = 10\nnew_users_per_minute = 10\ncookie_same_site = \"none\"\ncookie_secure = \"never\"\n",
    )
    .unwrap_err();
    assert!(format!("{err:#}").contains("cookie_same_site"), "{err:#}");
}

/// An app written for Cloudflare's waiting room reads `cfWaitingRoom`.
#[test]
fn the_json_envelope_can_be_cloudflares() {
    let node = InProcNode::start(
        "expect-envelope",
        "total_active_users = 10\nnew_users_per_minute = 10\nqueue_all = true\njson_envelope = \"cfWaitingRoom\"\n",
    )
    .unwrap();
    let r = request(node.http, "GET", "/", &[("Accept", "application/json")]);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["cfWaitingRoom"]["inWaitingRoom"], true, "{}", r.body);
    assert_eq!(v["cfWaitingRoom"]["queueAll"], true);
    assert!(v.get("waitingRoom").is_none());
}
