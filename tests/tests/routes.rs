//! Routing end to end: requests no room covers (`[node.unrouted]`: 404 or a
//! default origin) and rooms reached by more than one route
//! (`additional_routes`), through a real node in front of real HTTP origins.
//!
//! The attacker's side: the default origin must never be a way around a
//! room, whatever the spelling of a covered host and path, and a forged
//! cookie on an uncovered path opens nothing. The tired operator's: 404
//! stays 404, a default origin that is down or hangs gives a clear 502
//! quickly, and a route claimed twice is refused naming the key.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    time::{Duration, Instant},
};

use waitroom_tests::{
    edge::{QUEUE, SITE, client, get, metric},
    inproc::InProcNode,
};

/// A demo origin on a runtime of its own (stops when dropped), and its
/// address, which it names in every answer's `x-demo-origin`.
fn origin() -> (tokio::runtime::Runtime, SocketAddr) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(waitroom_tests::demo_origin::serve_on(
        listener,
        Duration::ZERO,
    ));
    (rt, addr)
}

/// `[node.unrouted]` sending to `addr`, as `InProcNode::start_with` takes it.
fn default_origin(addr: SocketAddr, extra: &str) -> String {
    format!("[node.unrouted]\nsend_to = \"origin\"\norigin = \"{addr}\"\n{extra}")
}

/// An answer: status, lower-cased head, body.
struct Answer {
    status: u16,
    /// Lower-cased, to look for header names.
    head: String,
    /// The first `Set-Cookie`'s `NAME=VALUE`, as sent.
    cookie: Option<String>,
    body: String,
}

impl Answer {
    /// Which origin answered (`x-demo-origin`), if one did.
    fn origin(&self) -> Option<&str> {
        self.head
            .lines()
            .find_map(|l| l.strip_prefix("x-demo-origin: "))
    }
}

/// `GET target` with exactly `host` (or no `Host` at all) and `headers`,
/// written byte for byte; read to the end within 10 s.
fn send(addr: SocketAddr, target: &str, host: Option<&str>, headers: &[(&str, &str)]) -> Answer {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!("GET {target} HTTP/1.1\r\nConnection: close\r\n");
    if let Some(h) = host {
        req.push_str(&format!("Host: {h}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Answer {
        status: head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        head: head.to_ascii_lowercase(),
        cookie: head.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("set-cookie")
                .then(|| value.trim().split(';').next().unwrap_or("").to_owned())
        }),
        body: body.to_owned(),
    }
}

fn metrics(node: &InProcNode) -> String {
    get(&client(), &node.admin_url("/metrics")).1
}

fn unrouted(m: &str, outcome: &str) -> Option<f64> {
    metric(
        m,
        &format!("waitroom_unrouted_requests_total{{outcome=\"{outcome}\"}}"),
    )
}

/// `shop` covers shop.example/shop (case-insensitive, the default) and
/// queues everyone; `drop` covers shop.example/Drop case-sensitively.
const ROOMS: &str = r#"host = "shop.example"
path = "/shop"
total_active_users = 10
new_users_per_minute = 10
queue_all = true
"#;

fn drop_room(origin: SocketAddr) -> String {
    format!(
        "\n[[rooms]]\nid = \"drop\"\nhost = \"shop.example\"\npath = \"/Drop\"\n\
         path_case_sensitive = true\norigin = \"{origin}\"\ntotal_active_users = 10\n\
         new_users_per_minute = 10\nqueue_all = true\n"
    )
}

/// The attacker: every spelling of a covered host and path lands in its
/// room (the queue) or is refused as ambiguous (400); none reaches the
/// default origin.
#[test]
fn the_default_origin_is_no_way_around_a_room() {
    let (_rt, other) = origin();
    let (_rt2, room_origin) = origin();
    let node = InProcNode::start_with(
        "routes-spellings",
        &default_origin(other, ""),
        &format!("{ROOMS}{}", drop_room(room_origin)),
    )
    .unwrap();
    let addr = node.http;
    let other = other.to_string();

    // What is not covered goes to the default origin: no ticket, no count.
    for (target, host) in [
        ("/", "shop.example"),
        ("/shopping", "shop.example"),
        ("/shop", "other.example"),
        ("/drop", "shop.example"),
        ("/DROP", "shop.example"),
    ] {
        let a = send(addr, target, Some(host), &[]);
        assert_eq!(a.status, 200, "{host}{target}: {}", a.head);
        assert_eq!(a.origin(), Some(other.as_str()), "{host}{target}");
        assert!(a.body.contains(SITE), "{host}{target}");
        assert!(!a.head.contains("set-cookie"), "{host}{target}: {}", a.head);
    }

    let spellings = [
        ("/shop", "shop.example"),
        ("//shop", "shop.example"),
        ("/./shop", "shop.example"),
        ("/x/../shop", "shop.example"),
        ("/x/%2e%2e/shop", "shop.example"),
        ("/%73hop", "shop.example"),
        ("/%73%68%6F%70/cart", "shop.example"),
        ("/SHOP", "shop.example"),
        ("/ShOp/", "shop.example"),
        ("/shop;jsessionid=1", "shop.example"),
        ("/shop?x=/other", "shop.example"),
        ("/%2Fshop", "shop.example"),
        ("/%2fshop", "shop.example"),
        ("/x%2F..%2Fshop", "shop.example"),
        ("/shop", "shop.example:8080"),
        ("/shop", "SHOP.EXAMPLE"),
        ("/shop", "shop.example."),
        ("/shop", "Shop.Example.:80"),
        ("http://shop.example/shop", "other.example"),
        ("http://SHOP.example./x/../shop", "other.example"),
        ("/Drop", "shop.example"),
        ("/%44rop/now", "shop.example"),
        ("//Drop", "shop.example"),
    ];
    for (target, host) in spellings {
        let a = send(addr, target, Some(host), &[]);
        assert_ne!(
            a.origin(),
            Some(other.as_str()),
            "{host} {target} reached the default origin"
        );
        assert!(
            a.body.contains(QUEUE) || a.status == 400,
            "{host} {target}: {} {}",
            a.status,
            a.body
        );
    }
    // The absolute-form authority wins over Host, as routing says.
    let a = send(addr, "http://other.example/shop", Some("shop.example"), &[]);
    assert_eq!(a.origin(), Some(other.as_str()));

    let m = metrics(&node);
    assert_eq!(unrouted(&m, "proxied"), Some(6.0));
    assert_eq!(unrouted(&m, "not_found"), Some(0.0));
    let queued = metric(&m, "waitroom_queued_total{room=\"shop\"}").unwrap()
        + metric(&m, "waitroom_queued_total{room=\"drop\"}").unwrap();
    let refused = spellings
        .iter()
        .filter(|(t, _)| t.to_ascii_lowercase().contains("%2f"))
        .count();
    assert_eq!(queued as usize, spellings.len() - refused);
}

/// A forged or stolen-looking waitroom cookie on an uncovered path goes to
/// the default origin like any request, opens nothing (no cookie failure,
/// no ticket, no count), and the origin gets the forwarding headers of any
/// proxied request without the hop-by-hop ones.
#[test]
fn a_forged_cookie_on_an_uncovered_path_opens_nothing() {
    let (_rt, other) = origin();
    let node = InProcNode::start_with("routes-cookie", &default_origin(other, ""), ROOMS).unwrap();
    let addr = node.http;
    // A real ticket of the room, and garbage.
    let queued = send(addr, "/shop", Some("shop.example"), &[]);
    let real = queued.cookie.unwrap();
    let before = metrics(&node);
    for cookie in [
        real.clone(),
        "__wr_shop=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".to_owned(),
        "__wr_shop=%00%ff; __wr_shop=../../etc".to_owned(),
    ] {
        let a = send(
            addr,
            "/echo",
            Some("shop.example"),
            &[
                ("Cookie", &cookie),
                ("Connection", "close, X-Hop"),
                ("X-Hop", "secret-hop"),
                ("Keep-Alive", "timeout=5"),
                ("Proxy-Authorization", "Basic Zm9vOmJhcg=="),
                ("X-Forwarded-For", "6.6.6.6"),
            ],
        );
        assert_eq!(a.status, 200, "{cookie}: {}", a.body);
        assert_eq!(a.origin(), Some(other.to_string().as_str()));
        assert!(!a.head.contains("set-cookie"), "{}", a.head);
        let seen = a.body.to_ascii_lowercase();
        assert!(seen.starts_with("get /echo\n"), "{seen}");
        assert!(seen.contains("x-forwarded-for: 127.0.0.1\n"), "{seen}");
        assert!(seen.contains("x-forwarded-proto: http"), "{seen}");
        assert!(seen.contains("via: "), "{seen}");
        for gone in ["x-hop", "keep-alive", "proxy-authorization", "6.6.6.6"] {
            assert!(!seen.contains(gone), "{gone} reached the origin: {seen}");
        }
    }
    let after = metrics(&node);
    for series in [
        "waitroom_queued_total{room=\"shop\"}",
        "waitroom_admitted_total{room=\"shop\",kind=\"new\"}",
        "waitroom_admitted_total{room=\"shop\",kind=\"returning\"}",
    ] {
        assert_eq!(metric(&before, series), metric(&after, series), "{series}");
    }
    let failures = |m: &str| -> f64 {
        m.lines()
            .filter(|l| l.starts_with("waitroom_cookie_failures_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(failures(&after), 0.0, "no cookie was opened");
    assert_eq!(unrouted(&after, "proxied"), Some(3.0));
}

/// Without `[node.unrouted]`, or with `send_to = "not_found"`, an uncovered
/// request is 404 and counted so.
#[test]
fn without_a_default_origin_uncovered_requests_get_404() {
    for (tag, node_keys) in [
        ("routes-404", ""),
        (
            "routes-404-said",
            "[node.unrouted]\nsend_to = \"not_found\"\n",
        ),
    ] {
        let node = InProcNode::start_with(tag, node_keys, ROOMS).unwrap();
        let a = send(node.http, "/other", Some("shop.example"), &[]);
        assert_eq!(a.status, 404, "{tag}");
        assert!(a.body.contains("no waiting room covers"), "{}", a.body);
        let a = send(node.http, "/shop", Some("shop.example"), &[]);
        assert!(a.body.contains(QUEUE), "{tag}");
        let m = metrics(&node);
        assert_eq!(unrouted(&m, "not_found"), Some(1.0), "{tag}");
        assert_eq!(unrouted(&m, "proxied"), Some(0.0), "{tag}");
    }
}

/// A default origin that refuses connections, or accepts and never answers,
/// gives a 502 in about the origin timeout: never a hang, never a 500. With
/// health checks that mark it down, a 503 without trying.
#[test]
fn a_default_origin_that_is_down_gives_a_clear_answer_quickly() {
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    // Accepts (the kernel's backlog) and never reads or answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    for (tag, addr, extra, want) in [
        ("routes-refused", closed, "", 502),
        (
            "routes-silent",
            silent.local_addr().unwrap(),
            "origin_timeout_ms = 500\n",
            502,
        ),
    ] {
        let node = InProcNode::start_with(tag, &default_origin(addr, extra), ROOMS).unwrap();
        let started = Instant::now();
        let a = send(node.http, "/other", Some("shop.example"), &[]);
        assert_eq!(a.status, want, "{tag}: {}", a.body);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{tag}: {:?}",
            started.elapsed()
        );
        let m = metrics(&node);
        assert_eq!(unrouted(&m, "origin_error"), Some(1.0), "{tag}");
        // The rooms are not affected.
        let a = send(node.http, "/shop", Some("shop.example"), &[]);
        assert!(a.body.contains(QUEUE), "{tag}");
    }
    let node = InProcNode::start_with(
        "routes-down",
        &default_origin(
            closed,
            "[node.unrouted.health]\npath = \"/healthz\"\ninterval_ms = 100\ntimeout_ms = 100\nfall = 1\n",
        ),
        ROOMS,
    )
    .unwrap();
    let mut last = 0;
    let down = waitroom_tests::eventually(Duration::from_secs(5), || {
        last = send(node.http, "/other", Some("shop.example"), &[]).status;
        last == 503
    });
    assert!(down, "a default origin marked down: 503, got {last}");
}

/// One room on two routes (another host, another path): a visitor admitted
/// on one is admitted on the other with the same cookie, counted once; the
/// room's one slot is then taken whichever route the next visitor comes by.
#[test]
fn additional_routes_share_the_room_and_its_limits() {
    let (_rt, other) = origin();
    let node = InProcNode::start_with(
        "routes-more",
        &default_origin(other, ""),
        r#"host = "shop.example"
path = "/shop"
total_active_users = 1
new_users_per_minute = 1
additional_routes = [
  { host = "drop.example", path = "/drop" },
  { host = "shop.example", path = "/launch" },
]
"#,
    )
    .unwrap();
    let addr = node.http;
    let first = send(addr, "/shop/item", Some("shop.example"), &[]);
    assert!(first.body.contains(SITE), "{}", first.body);
    let set_cookie = first
        .head
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .unwrap()
        .to_owned();
    assert!(
        set_cookie.contains("path=/;"),
        "the cookie covers /shop and /launch: {set_cookie}"
    );
    let cookie = first.cookie.clone().unwrap();
    // The other path on the same host, and (a client that sends it there)
    // the other host: the same room, the same visitor.
    for (target, host) in [("/launch/now", "shop.example"), ("/drop", "DROP.example.")] {
        let a = send(addr, target, Some(host), &[("Cookie", &cookie)]);
        assert!(a.body.contains(SITE), "{host}{target}: {}", a.body);
        assert_ne!(a.origin(), Some(other.to_string().as_str()));
    }
    // Another visitor, by any route: the one slot is taken.
    for (target, host) in [("/drop/x", "drop.example"), ("/launch", "shop.example")] {
        let a = send(addr, target, Some(host), &[]);
        assert!(a.body.contains(QUEUE), "{host}{target}: {}", a.body);
    }
    // drop.example outside /drop is not the room's.
    let a = send(addr, "/", Some("drop.example"), &[]);
    assert_eq!(a.origin(), Some(other.to_string().as_str()));

    let m = metrics(&node);
    assert_eq!(
        metric(&m, "waitroom_admitted_total{room=\"shop\",kind=\"new\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &m,
            "waitroom_admitted_total{room=\"shop\",kind=\"returning\"}"
        ),
        Some(2.0)
    );
    assert_eq!(
        metric(&m, "waitroom_active_users{room=\"shop\",scope=\"node\"}"),
        Some(1.0),
        "counted once"
    );
}

/// The tired operator: a host and path claimed twice, or a default origin
/// without an origin, is refused at start naming the key.
#[test]
fn a_route_claimed_twice_or_an_empty_default_origin_is_refused_naming_the_key() {
    let err = InProcNode::start(
        "routes-dup",
        "host = \"shop.example\"\npath = \"/shop\"\ntotal_active_users = 1\nnew_users_per_minute = 1\n\
         \n[[rooms]]\nid = \"drop\"\norigin = \"127.0.0.1:9\"\ntotal_active_users = 1\n\
         new_users_per_minute = 1\nhost = \"drop.example\"\n\
         additional_routes = [{ host = \"Shop.Example\", path = \"/shop/\" }]\n",
    )
    .unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains("rooms[1].additional_routes[0]")
            && text.contains("room \"shop\" (rooms[0].path)"),
        "{text}"
    );
    let err = InProcNode::start(
        "routes-dup-one",
        "total_active_users = 1\nnew_users_per_minute = 1\n\
         additional_routes = [{ host = \"a.example\" }, { host = \"A.example\", path = \"/\" }]\n",
    )
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("rooms[0].additional_routes[1]"),
        "{err:#}"
    );
    let err = InProcNode::start(
        "routes-rel",
        "total_active_users = 1\nnew_users_per_minute = 1\n\
         additional_routes = [{ host = \"a.example\", path = \"shop\" }]\n",
    )
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("rooms[0].additional_routes[0].path"),
        "{err:#}"
    );
    let err = InProcNode::start_with(
        "routes-empty",
        "[node.unrouted]\nsend_to = \"origin\"\n",
        "total_active_users = 1\nnew_users_per_minute = 1\n",
    )
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("node.unrouted.origin"),
        "{err:#}"
    );
    let err = InProcNode::start_with(
        "routes-typo",
        "[node.unrouted]\nsend_to = \"default\"\n",
        "total_active_users = 1\nnew_users_per_minute = 1\n",
    )
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("node.unrouted.send_to"),
        "{err:#}"
    );
}
