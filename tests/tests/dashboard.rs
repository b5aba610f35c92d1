//! The live dashboard on the admin listeners, with the real binaries.
//!
//! - Over plain HTTP: `/dashboard` is HTML with a policy that loads nothing
//!   from elsewhere, `/dashboard.json` is JSON whose numbers are `/status`'s
//!   and whose history is bounded (on a node and on the aggregator).
//! - In a real headless Chromium: one aggregator and two nodes in two colos,
//!   a room brought to a known state (some visitors admitted, some queued);
//!   the numbers each dashboard shows equal those of `/status` read right
//!   after, every chart has a text alternative with the current number, and
//!   the page asked nothing of anyone but its own admin listener.
use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use serde_json::Value;
use waitroom_tests::{
    browser::{Browser, chromium_path},
    cluster::{Aggregator, Certs, aggregator_config, free_udp_port, node_gossip_table},
    edge::{Edge, client, get_text},
    eventually,
    procs::{TempDir, start_origin},
};

const SITE: &str = "Demo Shop";
const INTERVAL_MS: u64 = 300;
const NEW_USERS_PER_MINUTE: u64 = 4;
const TOTAL_ACTIVE_USERS: u64 = 40;

fn room_table() -> String {
    // Random queueing: once anyone waits, newcomers join the queue, so the
    // room holds admitted and waiting visitors at once.
    format!(
        "[[rooms]]\nid = \"shop\"\ntotal_active_users = {TOTAL_ACTIVE_USERS}\n\
         new_users_per_minute = {NEW_USERS_PER_MINUTE}\nqueueing_method = \"random\"\n\
         session_duration = 5\nrefresh_interval = 5\n"
    )
}

fn node_config(dir: &TempDir, name: &str, colo: &str, origin: SocketAddr, gossip: &str) -> String {
    waitroom_tests::cluster::node_config(
        dir.path(),
        name,
        colo,
        1,
        true,
        &room_table(),
        origin,
        gossip,
    )
}

fn json(url: &str) -> Value {
    serde_json::from_str(&get_text(url)).unwrap_or(Value::Null)
}

/// A new visitor (no cookie) asks `edge` for the shop; true when admitted.
fn visit(edge: &Edge) -> bool {
    let mut resp = client().get(&edge.url("/")).call().expect("visitor");
    let status = resp.status().as_u16();
    let body = resp.body_mut().read_to_string().unwrap_or_default();
    assert!(status < 500, "{status} {body}");
    body.contains(SITE)
}

/// `GET path`: status, content type and body.
fn fetch(url: &str) -> (u16, String, String) {
    let mut resp = client().get(url).call().expect("admin request");
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (
        resp.status().as_u16(),
        ct,
        resp.body_mut().read_to_string().unwrap_or_default(),
    )
}

/// The page and its JSON answer as a browser needs, and the history stays
/// within its hour.
fn check_endpoints(admin: SocketAddr) -> Value {
    let base = format!("http://{admin}");
    let mut resp = client()
        .get(&format!("{base}/dashboard"))
        .call()
        .expect("dashboard");
    assert_eq!(resp.status().as_u16(), 200);
    let headers = resp.headers().clone();
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"),
        "{csp}"
    );
    let page = resp.body_mut().read_to_string().unwrap();
    assert!(
        page.contains("<h1") && page.contains("dashboard.json"),
        "{page}"
    );

    let (status, ct, body) = fetch(&format!("{base}/dashboard.json"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(ct, "application/json");
    let dash: Value = serde_json::from_str(&body).unwrap();
    let history = &dash["history"];
    let capacity = history["capacity"].as_u64().unwrap();
    let every = history["sample_every_ms"].as_u64().unwrap();
    assert_eq!(history["window_ms"], 3_600_000);
    assert_eq!(capacity * every, 3_600_000, "an hour of samples, no more");
    let at = history["at_ms"].as_array().unwrap();
    assert!(
        !at.is_empty() && at.len() as u64 <= capacity,
        "{} samples",
        at.len()
    );
    for (room, series) in history["rooms"].as_object().unwrap() {
        for (name, values) in series.as_object().unwrap() {
            assert_eq!(
                values.as_array().unwrap().len(),
                at.len(),
                "{room}.{name} is aligned with the sample times"
            );
        }
    }
    dash
}

#[test]
fn dashboard_and_its_json_answer_with_their_types_and_a_bounded_history() {
    let dir = TempDir::new("dash-http");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let edge = Edge::start(
        dir.path(),
        "edge",
        &format!(
            r#"[node]
id = "solo"
colo = "here"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
workers = 1
counters_path = "{}"

{}origin = "{origin}"
"#,
            dir.path().join("solo.shm").display(),
            room_table()
        ),
    )
    .unwrap();
    assert!(visit(&edge), "the first visitor is let in");
    let dash = check_endpoints(edge.admin);
    assert_eq!(dash["view"], "node");
    assert_eq!(dash["name"], "solo");
    let status = json(&edge.admin_url("/status"));
    let (room, shown) = (&status["rooms"][0], &dash["rooms"][0]);
    assert_eq!(shown["id"], "shop");
    assert_eq!(shown["counts"]["active_users"], room["global_active_users"]);
    assert_eq!(
        shown["this_node"]["active_users"],
        room["node_active_users"]
    );
    assert_eq!(shown["this_node"]["active_users"], 1);
    assert_eq!(shown["phase"], room["phase"]);
    assert_eq!(shown["event_phase"], Value::Null);

    let certs = Certs::generate(&dir.path().join("certs"), &[]).unwrap();
    let listen: SocketAddr = format!("127.0.0.1:{}", free_udp_port().unwrap())
        .parse()
        .unwrap();
    let aggregator = Aggregator::start(
        dir.path(),
        "aggregator",
        &aggregator_config(
            listen,
            &certs,
            &dir.path().join("snapshot.json"),
            &room_table(),
        ),
    )
    .unwrap();
    let dash = check_endpoints(aggregator.admin);
    assert_eq!(dash["view"], "aggregator");
    assert_eq!(dash["rooms"][0]["total_active_users"], TOTAL_ACTIVE_USERS);
    assert_eq!(dash["rooms"][0]["phase"], "queueing", "no node, no slot");
}

/// What the page shows: `(room, place, field) → (text, class)` of every
/// element marked with `data-field`.
fn shown(browser: &mut Browser) -> Vec<(String, String, String, String, String)> {
    let v = browser
        .eval(
            "JSON.stringify([...document.querySelectorAll('[data-field]')].map(e => \
             [e.dataset.room || '', e.dataset.place || '', e.dataset.field, e.textContent, e.className]))",
        )
        .unwrap();
    serde_json::from_str(v.as_str().unwrap_or("[]")).unwrap()
}

fn find<'a>(
    fields: &'a [(String, String, String, String, String)],
    place: &str,
    field: &str,
) -> &'a (String, String, String, String, String) {
    fields
        .iter()
        .find(|f| f.0 == "shop" && f.1 == place && f.2 == field)
        .unwrap_or_else(|| panic!("the page shows no {place}/{field}: {fields:?}"))
}

fn text_of(
    fields: &[(String, String, String, String, String)],
    place: &str,
    field: &str,
) -> String {
    find(fields, place, field).3.clone()
}

/// Opens `url`, waits until the page has drawn from its JSON, and checks
/// what every view must have: headings, charts with text alternatives, and
/// no request beyond its own admin listener.
fn open_and_check(browser: &mut Browser, admin: SocketAddr, path: &str) {
    let url = format!("http://{admin}{path}");
    // Whatever the page tried and its policy refused is recorded too, so an
    // attempt to load from elsewhere fails the test even though it never left.
    browser.call("Page.enable", serde_json::json!({})).unwrap();
    browser
        .call(
            "Page.addScriptToEvaluateOnNewDocument",
            serde_json::json!({ "source": "window.__refused = []; \
                document.addEventListener('securitypolicyviolation', \
                e => window.__refused.push(e.blockedURI + ' ' + e.violatedDirective));" }),
        )
        .unwrap();
    browser
        .call("Page.navigate", serde_json::json!({ "url": url }))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let rendered = browser
            .eval("String(document.location.href) + ' ' + (document.body && document.body.dataset.rendered || '')")
            .unwrap_or_default();
        let r = rendered.as_str().unwrap_or_default();
        if r.starts_with(&url) && !r.ends_with(' ') {
            break;
        }
        assert!(Instant::now() < deadline, "{url} never rendered: {r}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let text = browser.text();
    assert!(text.contains("Room shop"), "{text}");
    assert!(text.contains("Last 60 minutes"), "{text}");

    // Semantic headings: one h1, an h2 per room.
    let headings = browser
        .eval("[...document.querySelectorAll('h1,h2')].map(h => h.tagName + ':' + h.textContent).join('|')")
        .unwrap();
    let headings = headings.as_str().unwrap();
    assert!(
        headings.starts_with("H1:") && headings.contains("H2:Room shop"),
        "{headings}"
    );

    // Every chart is an image named by a caption that says its numbers.
    let charts = browser
        .eval(
            "JSON.stringify([...document.querySelectorAll('svg')].map(s => [s.getAttribute('role'), \
             (document.getElementById(s.getAttribute('aria-labelledby')) || {}).textContent || '']))",
        )
        .unwrap();
    let charts: Vec<(Option<String>, String)> =
        serde_json::from_str(charts.as_str().unwrap()).unwrap();
    assert_eq!(charts.len(), 4, "four charts for one room: {charts:?}");
    for (role, caption) in &charts {
        assert_eq!(role.as_deref(), Some("img"));
        assert!(
            caption.contains("last 60 minutes: now ") && caption.contains("samples"),
            "{caption}"
        );
    }
    let active = text_of(&shown(browser), "", "active_users");
    assert!(
        charts[0]
            .1
            .contains(&format!("now {active} (limit {TOTAL_ACTIVE_USERS})")),
        "{charts:?}"
    );

    // Nothing but the admin listener was asked for anything.
    let requests = browser
        .eval(
            "JSON.stringify([location.href, ...performance.getEntriesByType('resource').map(e => e.name)])",
        )
        .unwrap();
    let requests: Vec<String> = serde_json::from_str(requests.as_str().unwrap()).unwrap();
    assert!(
        requests.len() >= 2,
        "the page fetched its JSON: {requests:?}"
    );
    let own = format!("http://{admin}/");
    for r in &requests {
        assert!(r.starts_with(&own), "the page asked {r} (not {own})");
    }
    let refused = browser
        .eval("JSON.stringify(window.__refused || null)")
        .unwrap();
    assert_eq!(
        refused.as_str(),
        Some("[]"),
        "the policy refused something the page tried"
    );
    // And the policy holds: a fetch from elsewhere is refused before it leaves.
    browser
        .eval("fetch('http://192.0.2.1/probe').catch(() => null); 0")
        .unwrap();
    let refused = (0..20)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            browser
                .eval("(window.__refused || []).join('|')")
                .unwrap_or_default()
        })
        .find(|v| v.as_str().is_some_and(|s| !s.is_empty()))
        .unwrap_or_default();
    assert!(
        refused
            .as_str()
            .is_some_and(|s| s.contains("192.0.2.1") && s.contains("connect-src")),
        "{refused}"
    );
}

#[test]
fn a_real_browser_shows_what_status_says_on_the_aggregator_and_on_a_node() {
    if chromium_path().is_none() {
        eprintln!("skipping: chromium is not installed (cargo xtask setup installs it)");
        return;
    }
    let dir = TempDir::new("dash-browser");
    let certs = Certs::generate(&dir.path().join("certs"), &["ams-1", "sin-1"]).unwrap();
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let listen: SocketAddr = format!("127.0.0.1:{}", free_udp_port().unwrap())
        .parse()
        .unwrap();
    let aggregator = Aggregator::start(
        dir.path(),
        "aggregator",
        &aggregator_config(
            listen,
            &certs,
            &dir.path().join("snapshot.json"),
            &room_table(),
        ),
    )
    .unwrap();
    let edges: Vec<Edge> = [("ams-1", "ams"), ("sin-1", "sin")]
        .into_iter()
        .map(|(name, colo)| {
            let gossip = node_gossip_table(listen, &certs, &certs, name, INTERVAL_MS);
            Edge::start(
                dir.path(),
                name,
                &node_config(&dir, name, colo, origin, &gossip),
            )
            .unwrap()
        })
        .collect();
    let fresh = |e: &Edge| json(&e.admin_url("/status"))["gossip"]["fresh"] == true;
    assert!(
        eventually(Duration::from_secs(15), || edges.iter().all(fresh)),
        "both nodes hold a fresh state"
    );
    std::thread::sleep(Duration::from_millis(3 * INTERVAL_MS));

    // The known state, all within one minute (admits per minute reset at
    // its end): more new visitors than the minute allows, through both colos.
    waitroom_tests::minutes::early_in_a_minute(50);
    let mut admitted = 0;
    for _ in 0..4 {
        for edge in &edges {
            admitted += u64::from(visit(edge));
        }
    }
    assert!(
        (1..=NEW_USERS_PER_MINUTE).contains(&admitted),
        "{admitted} admitted"
    );
    // Settled: the aggregator counts every node's visitors and each node holds that.
    let settled = || {
        let room = &json(&aggregator.admin_url("/status"))["rooms"][0];
        room["active_users"] == admitted
            && room["total_waiting"] == 8 - admitted
            && edges.iter().all(|e| {
                let node = &json(&e.admin_url("/status"))["rooms"][0];
                node["global_active_users"] == admitted && node["global_waiting"] == 8 - admitted
            })
    };
    assert!(
        eventually(Duration::from_secs(10), settled),
        "aggregator {} nodes {:?}",
        get_text(&aggregator.admin_url("/status")),
        edges
            .iter()
            .map(|e| get_text(&e.admin_url("/status")))
            .collect::<Vec<_>>()
    );

    let mut browser = Browser::open(dir.path(), "about:blank").unwrap();
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));

    // --- The aggregator: the room, by colo and by node.
    open_and_check(&mut browser, aggregator.admin, "/dashboard");
    let fields = shown(&mut browser);
    let status = json(&aggregator.admin_url("/status"));
    let _ = browser.screenshot(&shots.join("dashboard-aggregator.png"));
    let room = &status["rooms"][0];
    for field in ["active_users", "admitted_this_minute", "total_waiting"] {
        assert_eq!(
            text_of(&fields, "", field),
            room[field].to_string(),
            "{field}: page {fields:?} status {room}"
        );
    }
    assert_eq!(
        text_of(&fields, "", "active_users_limit"),
        TOTAL_ACTIVE_USERS.to_string()
    );
    assert_eq!(
        text_of(&fields, "", "admitted_this_minute_limit"),
        NEW_USERS_PER_MINUTE.to_string()
    );
    assert_eq!(room["phase"], "queueing", "{room}");
    assert!(find(&fields, "", "phase").4.contains("queueing"));
    let wait = &room["wait_estimate"];
    let expected_wait = if wait["wait_time_known"] == true {
        (wait["minutes"].as_f64().unwrap().ceil() as u64).to_string()
    } else {
        "unknown".to_owned()
    };
    assert_eq!(text_of(&fields, "", "wait_minutes"), expected_wait);
    let per_node = room["per_node"].as_array().unwrap();
    assert_eq!(per_node.len(), 2, "{room}");
    for node in per_node {
        let name = node["node"].as_str().unwrap();
        let colo = node["colo"].as_str().unwrap();
        for field in ["active_users", "admitted_this_minute", "total_waiting"] {
            // One node per colo here: the colo's sum is the node's count.
            assert_eq!(
                text_of(&fields, &format!("node:{name}"), field),
                node[field].to_string()
            );
            assert_eq!(
                text_of(&fields, &format!("colo:{colo}"), field),
                node[field].to_string()
            );
        }
    }
    let page = browser.text();
    assert!(page.contains("Nodes known to the aggregator"), "{page}");

    // --- A node: the global state it holds beside its own counters.
    let edge = &edges[0];
    open_and_check(&mut browser, edge.admin, "/dashboard");
    let fields = shown(&mut browser);
    let status = json(&edge.admin_url("/status"));
    let _ = browser.screenshot(&shots.join("dashboard-node.png"));
    let room = &status["rooms"][0];
    for (field, key) in [
        ("active_users", "global_active_users"),
        ("admitted_this_minute", "global_admitted_this_minute"),
        ("total_waiting", "global_waiting"),
    ] {
        assert_eq!(
            text_of(&fields, "", field),
            room[key].to_string(),
            "{field}"
        );
    }
    for (field, key) in [
        ("active_users", "node_active_users"),
        ("admitted_this_minute", "node_admitted_this_minute"),
        ("total_waiting", "node_waiting"),
    ] {
        assert_eq!(
            text_of(&fields, "node:ams-1", field),
            room[key].to_string(),
            "this node's {field}"
        );
    }
    assert!(
        find(&fields, "", "phase")
            .4
            .contains(room["phase"].as_str().unwrap())
    );
    let page = browser.text();
    assert!(page.contains("Node ams-1 in colo ams"), "{page}");
}
