//! Bypass rules end to end: a room that queues everyone (`queue_all`) still
//! lets its static assets, health check, partner API and office through to
//! the origin, with no cookie and no count moved; the spellings an attacker
//! would try on a protected path land in the queue.
use std::net::SocketAddr;

use waitroom_tests::{
    edge::{QUEUE, SITE, client, get, metric},
    inproc::InProcNode,
};

const LIMITS: &str = "total_active_users = 10\nnew_users_per_minute = 10\n";

const RULES: &str = r#"total_active_users = 10
new_users_per_minute = 10
queue_all = true

[[rooms.bypass]]
name = "static"
path_prefix = "/static/"
methods = ["GET", "HEAD"]

[[rooms.bypass]]
name = "health"
path_prefix = "/healthz"

[[rooms.bypass]]
name = "partner"
path_prefix = "/api/"
header = { name = "x-partner-key", value = "k-7f3a9c2e" }

[[rooms.bypass]]
name = "office"
client_cidrs = ["10.20.0.0/16"]
"#;

/// The status, the head (lower-cased, to look for header names) and the body.
fn raw(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
) -> (u16, String, String) {
    let r = waitroom_tests::raw::request(addr, method, target, headers);
    let head: String = r
        .headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\n").to_ascii_lowercase())
        .collect();
    (r.status, head, r.body)
}

fn metrics(node: &InProcNode) -> String {
    get(&client(), &node.admin_url("/metrics")).1
}

#[test]
fn matched_requests_reach_the_origin_without_a_ticket_or_a_count() {
    let node =
        InProcNode::start_with("bypass-ok", "trusted_proxies = [\"127.0.0.1\"]", RULES).unwrap();
    let addr = node.http;
    let (status, head, body) = raw(addr, "GET", "/static/app.js", &[]);
    assert_eq!(status, 200);
    assert!(body.contains(SITE), "{body}");
    assert!(
        !head.contains("set-cookie"),
        "no ticket for a bypassed request: {head}"
    );
    let (_, _, body) = raw(addr, "GET", "/healthz", &[]);
    assert_eq!(body, "ok\n");
    let (_, _, body) = raw(
        addr,
        "GET",
        "/api/orders",
        &[("X-Partner-Key", "k-7f3a9c2e")],
    );
    assert!(body.contains(SITE), "{body}");
    // The office, as the trusted load balancer in front says (XFF).
    let (_, head, body) = raw(
        addr,
        "GET",
        "/checkout",
        &[("X-Forwarded-For", "10.20.3.4")],
    );
    assert!(
        body.contains(SITE) && !head.contains("set-cookie"),
        "{body}"
    );

    let m = metrics(&node);
    for (rule, n) in [
        ("static", 1.0),
        ("health", 1.0),
        ("partner", 1.0),
        ("office", 1.0),
    ] {
        let series = format!("waitroom_bypassed_total{{room=\"shop\",rule=\"{rule}\"}}");
        assert_eq!(metric(&m, &series), Some(n), "{series}");
    }
    // Nothing was counted: no admission, nobody waiting, nothing queued.
    for series in [
        "waitroom_admitted_total{room=\"shop\",kind=\"new\"}",
        "waitroom_queued_total{room=\"shop\"}",
        "waitroom_waiting{room=\"shop\",scope=\"node\"}",
        "waitroom_active_users{room=\"shop\",scope=\"node\"}",
    ] {
        assert_eq!(metric(&m, series), Some(0.0), "{series}");
    }
    // And the room still queues the rest.
    let (_, _, body) = raw(addr, "GET", "/checkout", &[]);
    assert!(body.contains(QUEUE), "{body}");
}

/// The attacker: every spelling of the protected `/checkout` that starts
/// like a bypassed path, a wrong or absent partner key, a method the rule
/// does not name, and a forged client address from an untrusted hop, all
/// get the queue (never the origin).
#[test]
fn a_bypass_rule_opens_no_protected_path_whatever_the_spelling() {
    let node = InProcNode::start("bypass-attack", RULES).unwrap();
    let addr = node.http;
    for target in [
        "/static/../checkout",
        "/static/%2e%2e/checkout",
        "/static/%2E%2E/checkout",
        "/static/./../checkout",
        "//static/..//checkout",
        "/static//../../checkout",
        "/STATIC/app.js",
        "/static;x/app.js",
        "/healthz/../checkout",
        "/healthzcheckout",
        "http://shop.example/static/../checkout",
    ] {
        let (status, _, body) = raw(addr, "GET", target, &[]);
        assert!(
            body.contains(QUEUE) || status == 400,
            "{target}: {status} {body}"
        );
        assert!(!body.contains(SITE), "{target} reached the origin");
    }
    for headers in [
        vec![],
        vec![("X-Partner-Key", "k-7f3a9c2")],
        vec![("X-Partner-Key", "K-7F3A9C2E")],
        vec![("X-Partner-Keys", "k-7f3a9c2e")],
    ] {
        let (_, _, body) = raw(addr, "GET", "/api/orders", &headers);
        assert!(body.contains(QUEUE), "{headers:?}: {body}");
    }
    let (_, _, body) = raw(addr, "POST", "/static/app.js", &[("Content-Length", "0")]);
    assert!(
        body.contains(QUEUE),
        "POST is not a method of the rule: {body}"
    );
    // No trusted proxy: a client's X-Forwarded-For says nothing.
    let (_, _, body) = raw(
        addr,
        "GET",
        "/checkout",
        &[("X-Forwarded-For", "10.20.3.4")],
    );
    assert!(body.contains(QUEUE), "{body}");
    let m = metrics(&node);
    assert_eq!(
        metric(&m, "waitroom_bypassed_total{room=\"shop\",rule=\"static\"}"),
        Some(0.0)
    );
}

/// The tired operator: a rule that would let everything past the queue
/// is refused at start, naming the key.
#[test]
fn a_rule_without_a_condition_is_refused_at_start() {
    let err = InProcNode::start(
        "bypass-empty",
        &format!("{LIMITS}[[rooms.bypass]]\nname = \"oops\"\n"),
    )
    .unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains("rooms[0].bypass[0]") && text.contains("no condition"),
        "{text}"
    );
    let err = InProcNode::start(
        "bypass-ua",
        &format!("{LIMITS}[[rooms.bypass]]\nname = \"bots\"\nuser_agent = \"Googlebot\"\n"),
    )
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("rooms[0].bypass[0].user_agent"),
        "{err:#}"
    );
}

/// The tired operator on launch day reloads again and again while visitors
/// keep coming: rules come and go, the room is suspended and back, the
/// limits and the command field change. No request fails for it: every one
/// is answered (no 5xx, no connection dropped) with the site, the queue or
/// a bypass; and when the reloads stop the node goes by the last file.
#[test]
fn reloads_under_traffic_fail_no_request() {
    let configs = [
        RULES.to_owned(),
        format!("{LIMITS}origin_command_header = \"x-shop-command\"\n"),
        format!("{LIMITS}suspended = true\n"),
    ];
    let node = InProcNode::start("bypass-reloads", &configs[0]).unwrap();
    let addr = node.http;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let visitors: Vec<_> = (0..4)
        .map(|v| {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut cookie: Option<String> = None;
                let mut failures = Vec::new();
                let mut answered = 0;
                for i in 0..400 {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) && i >= 50 {
                        break;
                    }
                    let target = ["/", "/static/app.js", "/checkout/done", "/healthz"][(i + v) % 4];
                    let method = if i % 5 == 0 { "HEAD" } else { "GET" };
                    let headers: Vec<(&str, &str)> =
                        cookie.iter().map(|c| ("Cookie", c.as_str())).collect();
                    let r = waitroom_tests::raw::request(addr, method, target, &headers);
                    answered += 1;
                    let known = method == "HEAD"
                        || r.body.contains(SITE)
                        || r.body.contains(QUEUE)
                        || r.body.starts_with("GET ")
                        || r.body == "ok\n";
                    if r.status == 0 || r.status >= 500 || !known {
                        failures.push(format!("{method} {target}: {} {}", r.status, r.body));
                    }
                    if let Some(c) = r.cookie().filter(|c| !c.ends_with('=')) {
                        cookie = Some(c);
                    }
                }
                (answered, failures)
            })
        })
        .collect();
    for round in 1..=30 {
        let (from, to) = (&configs[(round - 1) % 3], &configs[round % 3]);
        let changes = node
            .reload(|c| c.replace(from.as_str(), to))
            .unwrap_or_else(|e| panic!("reload {round}: {e:#}"));
        assert!(
            !changes.is_empty() || from == to,
            "reload {round}: {changes:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut answered = 0;
    for v in visitors {
        let (n, failures) = v.join().unwrap();
        answered += n;
        assert!(
            failures.is_empty(),
            "{} failed: {failures:#?}",
            failures.len()
        );
    }
    assert!(
        answered >= 200,
        "only {answered} requests ran beside the reloads"
    );

    // 30 reloads from RULES end on RULES: everyone queued but the rules.
    let (_, _, body) = raw(addr, "GET", "/checkout", &[]);
    assert!(body.contains(QUEUE), "{body}");
    let (status, _, body) = raw(addr, "GET", "/static/app.js", &[]);
    assert_eq!(status, 200);
    assert!(!body.contains(QUEUE), "{body}");
}
