//! The control API and the pushed room settings with the real binaries: an
//! aggregator with a token file and two nodes gossiping with it, the demo
//! origin behind them.
//!
//! What is asserted:
//! - a change through the aggregator's API is in force on every node within
//!   two gossip intervals (measured from the API's answer), in their status,
//!   their metrics and what visitors get; the aggregator's status shows no
//!   node behind; the audit log names who changed what;
//! - what attackers and tired operators send changes nothing: no token, a
//!   wrong token, malformed JSON, a limit of 0 or below, an unknown room, a
//!   node's own key, a stale `If-Match`; of two changes racing with the same
//!   `If-Match`, one wins and the other gets 409;
//! - a version the nodes cannot apply (a queue page file they lack) leaves
//!   them on the one they run, and the aggregator's status, metrics and
//!   dashboard show them behind;
//! - the settings survive an aggregator restart, and a node restarted while
//!   the aggregator is down runs the last version it received;
//! - `waitroom-aggregator ctl` against the real aggregator, and against
//!   three at once: a change lands on all or, when they disagree or one is
//!   down, on none, and the error names the one to look at;
//! - a node without an aggregator serves the API for itself (a suspended room
//!   lets visitors through without a ticket, and stays so after a restart),
//!   and without a token file the API says how to turn it on;
//! - a bypass rule's partner key is never shown (GET, a PATCH's answer, the
//!   audit log) by the aggregator or a standalone node, yet pushed and in
//!   force; the masked list sent back keeps it; a mask with nothing behind
//!   it is refused naming the key.
use std::{
    net::SocketAddr,
    path::Path,
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use waitroom_tests::{
    cluster::{
        Aggregator, Certs, controlled_aggregator, ctl, ctl_all, node_gossip_table, write_tokens,
    },
    edge::{Edge, client, metric},
    eventually,
    procs::{TempDir, start_origin},
};

const SITE: &str = "Demo Shop";
const QUEUE: &str = "You are in line";
const INTERVAL_MS: u64 = 1_000;
const ALICE: &str = "alice-0123456789abcdef0123";
const BOB: &str = "bob-fedcba9876543210fedcba";

/// One API request: status and JSON body.
fn api(
    method: &str,
    url: &str,
    token: Option<&str>,
    if_match: Option<&str>,
    body: Option<&str>,
) -> (u16, Value, Option<String>) {
    let mut req = http::Request::builder().method(method).uri(url);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    if let Some(v) = if_match {
        req = req.header("if-match", v);
    }
    let agent = client();
    let mut resp = match body {
        Some(b) => agent.run(req.body(b.to_owned()).unwrap()),
        None => agent.run(req.body(()).unwrap()),
    }
    .expect("API request");
    let status = resp.status().as_u16();
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value, challenge)
}

fn status_of(url: &str) -> Value {
    let (status, value, _) = api("GET", url, None, None, None);
    assert_eq!(status, 200, "{url}: {value}");
    value
}

fn text_of(url: &str) -> String {
    let mut resp = client().get(url).call().expect("request");
    resp.body_mut().read_to_string().unwrap_or_default()
}

/// A node's room `shop` as its own `/status` says, and its settings version.
fn node_room(edge: &Edge) -> (u64, Value) {
    let status = status_of(&edge.admin_url("/status"));
    (
        status["settings_version"].as_u64().unwrap_or(0),
        status["rooms"][0].clone(),
    )
}

/// A new visitor's page from `edge`: (reached the site, got a cookie).
fn visit(edge: &Edge) -> (bool, bool) {
    let mut resp = client().get(&edge.url("/")).call().expect("visitor");
    let cookie = resp.headers().get("set-cookie").is_some();
    let body = resp.body_mut().read_to_string().unwrap_or_default();
    assert!(
        body.contains(SITE) || body.contains(QUEUE),
        "{}: {body}",
        edge.proc.name
    );
    (body.contains(SITE), cookie)
}

fn node_config(dir: &Path, name: &str, origin: SocketAddr, gossip: &str) -> String {
    let own = dir.join(name);
    std::fs::create_dir_all(&own).unwrap();
    waitroom_tests::cluster::node_config(
        &own,
        name,
        "ams",
        1,
        true,
        "[[rooms]]\nid = \"shop\"\ntotal_active_users = 40\nnew_users_per_minute = 20\n",
        origin,
        gossip,
    )
}

#[test]
fn a_change_reaches_every_node_within_two_intervals_and_survives_restarts() {
    let dir = TempDir::new("control");
    let certs = Certs::generate(&dir.path().join("certs"), &["n1", "n2"]).unwrap();
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let tokens = dir.path().join("control.tokens");
    write_tokens(&tokens, &format!("alice {ALICE}\nbob {BOB}\n"));
    let (mut aggregator, listen) = controlled_aggregator(
        dir.path(),
        &certs,
        &tokens,
        "[[rooms]]\nid = \"shop\"\ntotal_active_users = 40\nnew_users_per_minute = 20\n",
    )
    .unwrap();
    let edges: Vec<Edge> = ["n1", "n2"]
        .into_iter()
        .map(|name| {
            let gossip = node_gossip_table(listen, &certs, &certs, name, INTERVAL_MS);
            Edge::start(
                dir.path(),
                name,
                &node_config(dir.path(), name, origin, &gossip),
            )
            .unwrap()
        })
        .collect();
    let room_url = |a: &Aggregator| a.admin_url("/api/rooms/shop");

    // Every node runs version 1, the aggregator says no one is behind.
    assert!(
        eventually(Duration::from_secs(15), || {
            let s = status_of(&aggregator.admin_url("/status"));
            s["settings"]["version"] == 1
                && s["settings"]["nodes"].as_array().map(Vec::len) == Some(2)
                && s["settings"]["nodes_behind"] == 0
        }),
        "{}",
        status_of(&aggregator.admin_url("/status"))["settings"]
    );
    for edge in &edges {
        assert_eq!(node_room(edge).0, 1);
        assert_eq!(visit(edge), (true, true), "admitted before the change");
    }

    // --- One change, and the clock runs from the API's answer.
    let (status, body, _) = api(
        "PATCH",
        &room_url(&aggregator),
        Some(ALICE),
        Some("\"1\""),
        Some(r#"{"total_active_users": 300, "new_users_per_minute": 100, "queue_all": true}"#),
    );
    let answered = Instant::now();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["version"], 2);
    assert_eq!(body["room"]["total_active_users"], 300);
    let limit = Duration::from_millis(2 * INTERVAL_MS);
    let mut reached = vec![None; edges.len()];
    while answered.elapsed() < limit && reached.iter().any(Option::is_none) {
        for (i, edge) in edges.iter().enumerate() {
            if reached[i].is_none() {
                let (version, room) = node_room(edge);
                if version == 2 && room["total_active_users"] == 300 {
                    reached[i] = Some(answered.elapsed());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("version 2 in force on the nodes after {reached:?} (limit {limit:?})");
    assert!(
        reached.iter().all(Option::is_some),
        "not every node runs version 2 within two intervals: {reached:?}"
    );
    for edge in &edges {
        assert_eq!(visit(edge), (false, true), "queue_all is in force");
        let metrics = text_of(&edge.admin_url("/metrics"));
        assert_eq!(
            metric(&metrics, "waitroom_settings_version{room=\"shop\"}"),
            Some(2.0)
        );
        assert_eq!(
            metric(&metrics, "waitroom_active_users_limit{room=\"shop\"}"),
            Some(300.0)
        );
    }
    assert!(
        eventually(Duration::from_secs(5), || status_of(
            &aggregator.admin_url("/status")
        )["settings"]["nodes_behind"]
            == 0),
        "the aggregator sees every node caught up"
    );
    let metrics = text_of(&aggregator.admin_url("/metrics"));
    assert_eq!(
        metric(
            &metrics,
            "waitroom_aggregator_settings_version{room=\"shop\"}"
        ),
        Some(2.0)
    );
    let audit = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
    let last: Value = serde_json::from_str(audit.lines().last().unwrap()).unwrap();
    assert_eq!(
        (
            &last["who"],
            &last["action"],
            &last["room"],
            &last["version"]
        ),
        (
            &json!("alice"),
            &json!("patch_room"),
            &json!("shop"),
            &json!(2)
        )
    );
    assert_eq!(last["change"]["queue_all"], true);

    // --- Attackers and tired operators: each refused, nothing changes.
    let url = room_url(&aggregator);
    let (status, body, challenge) = api("PATCH", &url, None, None, Some("{}"));
    assert_eq!(status, 401, "{body}");
    assert!(challenge.unwrap().starts_with("Bearer"));
    let (status, _, _) = api("GET", &url, Some("alice-not-the-token-at-all"), None, None);
    assert_eq!(status, 401, "a wrong token reads nothing either");
    for (body, want, field) in [
        ("{\"total_active_users\": 3", 400, None),
        (
            "{\"total_active_users\": 0}",
            400,
            Some("total_active_users"),
        ),
        (
            "{\"total_active_users\": -1}",
            400,
            Some("total_active_users"),
        ),
        (
            "{\"new_users_per_minute\": 301}",
            400,
            Some("new_users_per_minute"),
        ),
        (
            "{\"queueing_method\": \"lottery\"}",
            400,
            Some("queueing_method"),
        ),
        ("{\"origin\": \"10.0.0.1:80\"}", 400, Some("origin")),
        ("{\"total_active_users\": 5}", 409, None), // If-Match "1" is stale
    ] {
        let if_match = (want == 409).then_some("\"1\"");
        let (status, answer, _) = api("PATCH", &url, Some(BOB), if_match, Some(body));
        assert_eq!(status, want, "{body}: {answer}");
        assert!(answer["error"].is_string(), "{answer}");
        if let Some(field) = field {
            assert_eq!(answer["field"], field, "{body}: {answer}");
        }
    }
    let (status, answer, _) = api(
        "PATCH",
        &aggregator.admin_url("/api/rooms/nope"),
        Some(BOB),
        None,
        Some("{}"),
    );
    assert_eq!(status, 404, "{answer}");
    let (_, now, _) = api("GET", &url, Some(BOB), None, None);
    assert_eq!(now["version"], 2, "nothing refused changed the version");
    assert_eq!(now["room"]["total_active_users"], 300);

    // Two operators at once with the same If-Match: one wins, one gets 409.
    let racers: Vec<_> = [(ALICE, 250), (BOB, 260)]
        .into_iter()
        .map(|(token, limit)| {
            let url = url.clone();
            std::thread::spawn(move || {
                api(
                    "PATCH",
                    &url,
                    Some(token),
                    Some("\"2\""),
                    Some(&format!("{{\"total_active_users\": {limit}}}")),
                )
                .0
            })
        })
        .collect();
    let mut outcomes: Vec<u16> = racers.into_iter().map(|t| t.join().unwrap()).collect();
    outcomes.sort_unstable();
    assert_eq!(outcomes, [200, 409]);
    let (_, now, _) = api("GET", &url, Some(BOB), None, None);
    assert_eq!(now["version"], 3);

    // --- The CLI against the real aggregator.
    let (ok, out, err) = ctl(
        &aggregator,
        &tokens,
        &["set", "shop", "total_active_users=500", "queue_all=false"],
    );
    assert!(ok, "{out}{err}");
    let answer: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&answer["version"], &answer["room"]["total_active_users"]),
        (&json!(4), &json!(500))
    );
    let (ok, out, err) = ctl(
        &aggregator,
        &tokens,
        &["--as", "bob", "set", "shop", "session_duration=0"],
    );
    assert!(!ok, "{out}");
    assert!(err.contains("session_duration"), "{err}");
    let (ok, out, err) = ctl(
        &aggregator,
        &tokens,
        &["--if-match", "1", "set", "shop", "queue_all=true"],
    );
    assert!(!ok && err.contains("version 4"), "{out}{err}");
    let (ok, out, _) = ctl(&aggregator, &tokens, &["get", "shop"]);
    assert!(ok);
    let got: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&got["version"], &got["room"]["queue_all"]),
        (&json!(4), &json!(false))
    );
    let audit = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
    assert!(
        audit.lines().last().unwrap().contains("\"who\":\"alice\""),
        "the CLI sends the first token of the file: {audit}"
    );
    assert!(eventually(Duration::from_secs(5), || edges
        .iter()
        .all(|e| node_room(e).0 == 4)));
    // The nodes say so in their next reports.
    assert!(eventually(Duration::from_secs(5), || status_of(
        &aggregator.admin_url("/status")
    )["settings"]["nodes_behind"]
        == 0));

    // --- A version the nodes cannot apply (a queue page file they do not
    // have): they keep version 4, and the aggregator shows them behind.
    let (status, body, _) = api(
        "PATCH",
        &url,
        Some(ALICE),
        None,
        Some(r#"{"queue_page": "/nonexistent/page.mustache"}"#),
    );
    assert_eq!((status, &body["version"]), (200, &json!(5)), "{body}");
    assert!(
        eventually(Duration::from_secs(5), || {
            let s = status_of(&aggregator.admin_url("/status"));
            s["settings"]["nodes_behind"] == 2
                && s["settings"]["nodes"]
                    .as_array()
                    .is_some_and(|n| n.iter().all(|n| n["version"] == 4))
        }),
        "{}",
        status_of(&aggregator.admin_url("/status"))["settings"]
    );
    assert!(edges.iter().all(|e| node_room(e).0 == 4), "still version 4");
    let metrics = text_of(&aggregator.admin_url("/metrics"));
    assert_eq!(
        metric(&metrics, "waitroom_aggregator_nodes_behind_settings"),
        Some(2.0)
    );
    let dashboard = status_of(&aggregator.admin_url("/dashboard.json"));
    assert!(
        dashboard["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["settings_behind"] == true && n["settings_version"] == 4),
        "{}",
        dashboard["nodes"]
    );
    let (status, body, _) = api(
        "PATCH",
        &url,
        Some(ALICE),
        None,
        Some(r#"{"queue_page": null}"#),
    );
    assert_eq!((status, &body["version"]), (200, &json!(6)), "{body}");
    assert!(eventually(Duration::from_secs(5), || edges
        .iter()
        .all(|e| node_room(e).0 == 6)));

    // --- The aggregator goes away; a node restarted meanwhile runs version 4.
    aggregator.proc.terminate(Duration::from_secs(10));
    let mut edges = edges;
    let n1 = edges.remove(0);
    let n1_config = n1.config.clone();
    drop(n1);
    let n1 = Edge::start_with(dir.path(), "n1-again", &n1_config).unwrap();
    let (version, room) = node_room(&n1);
    assert_eq!(version, 6, "the kept push, before any aggregator");
    assert_eq!(room["total_active_users"], 500);

    // --- The aggregator comes back with what it had.
    let aggregator =
        Aggregator::start_with(dir.path(), "aggregator-again", &aggregator.config).unwrap();
    let (status, now, _) = api("GET", &room_url(&aggregator), Some(ALICE), None, None);
    assert_eq!(status, 200, "{now}");
    assert_eq!(
        (&now["version"], &now["room"]["total_active_users"]),
        (&json!(6), &json!(500)),
        "API changes survive the restart"
    );
    assert!(eventually(Duration::from_secs(15), || {
        let s = status_of(&aggregator.admin_url("/status"));
        s["settings"]["version"] == 6
            && s["settings"]["nodes"].as_array().map(Vec::len) == Some(2)
            && s["settings"]["nodes_behind"] == 0
    }));
}

/// Version and `total_active_users` of room `shop` at `aggregator`.
fn shop_at(aggregator: &Aggregator) -> (Value, Value) {
    let (status, got, _) = api(
        "GET",
        &aggregator.admin_url("/api/rooms/shop"),
        Some(ALICE),
        None,
        None,
    );
    assert_eq!(status, 200, "{got}");
    (
        got["version"].clone(),
        got["room"]["total_active_users"].clone(),
    )
}

#[test]
fn ctl_changes_every_aggregator_of_a_cluster_or_none() {
    let dir = TempDir::new("control-three");
    let certs = Certs::generate(&dir.path().join("certs"), &["n1"]).unwrap();
    let tokens = dir.path().join("control.tokens");
    write_tokens(&tokens, &format!("alice {ALICE}\n"));
    let mut aggregators: Vec<Aggregator> = ["a", "b", "c"]
        .into_iter()
        .map(|name| {
            let own = dir.path().join(name);
            std::fs::create_dir_all(&own).unwrap();
            controlled_aggregator(
                &own,
                &certs,
                &tokens,
                "[[rooms]]\nid = \"shop\"\ntotal_active_users = 40\nnew_users_per_minute = 20\n",
            )
            .unwrap()
            .0
        })
        .collect();
    let url = |a: &Aggregator| a.admin_url("");
    let all = |list: &[Aggregator]| list.iter().map(url).collect::<Vec<_>>();

    // All three take the change, each answer keyed by its aggregator.
    let (ok, out, err) = ctl_all(
        &all(&aggregators),
        &tokens,
        &["set", "shop", "total_active_users=500"],
    );
    assert!(ok, "{out}{err}");
    let answers: Value = serde_json::from_str(&out).unwrap();
    for aggregator in &aggregators {
        assert_eq!(answers[url(aggregator)]["version"], 2, "{out}");
        assert_eq!(shop_at(aggregator), (json!(2), json!(500)));
    }
    // Reading several: one answer each.
    let (ok, out, _) = ctl_all(&all(&aggregators), &tokens, &["get", "shop"]);
    assert!(ok);
    let got: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(got.as_object().map(serde_json::Map::len), Some(3), "{out}");

    // A tired operator changes one aggregator alone: the next change for all
    // is refused before anything is written, naming the one that differs.
    let (ok, out, err) = ctl(&aggregators[2], &tokens, &["set", "shop", "queue_all=true"]);
    assert!(ok, "{out}{err}");
    let (ok, _, err) = ctl_all(
        &all(&aggregators),
        &tokens,
        &["set", "shop", "total_active_users=600"],
    );
    assert!(!ok);
    assert!(
        err.contains("disagree") && err.contains(&url(&aggregators[2])),
        "{err}"
    );
    assert_eq!(shop_at(&aggregators[0]), (json!(2), json!(500)));
    assert_eq!(shop_at(&aggregators[1]), (json!(2), json!(500)));
    assert_eq!(shop_at(&aggregators[2]), (json!(3), json!(500)));
    // Several aggregators have no one version to match.
    let (ok, _, err) = ctl_all(
        &all(&aggregators),
        &tokens,
        &["--if-match", "3", "set", "shop", "total_active_users=600"],
    );
    assert!(!ok && err.contains("--if-match"), "{err}");

    // Made equal, they take changes together again.
    let (ok, out, err) = ctl_all(
        &all(&aggregators[..2]),
        &tokens,
        &["set", "shop", "queue_all=true"],
    );
    assert!(ok, "{out}{err}");
    let (ok, out, err) = ctl_all(
        &all(&aggregators),
        &tokens,
        &["set", "shop", "total_active_users=600"],
    );
    assert!(ok, "{out}{err}");
    for aggregator in &aggregators {
        assert_eq!(shop_at(aggregator), (json!(4), json!(600)));
    }

    // One aggregator down: nothing changes on the others.
    let down = url(&aggregators[2]);
    drop(aggregators.pop());
    let mut listed = all(&aggregators);
    listed.push(down.clone());
    let (ok, _, err) = ctl_all(&listed, &tokens, &["set", "shop", "total_active_users=700"]);
    assert!(!ok);
    assert!(err.contains(&down), "{err}");
    for aggregator in &aggregators {
        assert_eq!(shop_at(aggregator), (json!(4), json!(600)));
    }

    // A wrong address in the list: an HTTP server that is no aggregator
    // (the demo origin answers every path with a page, not JSON). Refused
    // before anything is written, naming it; reading shows its text as is.
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let stranger = format!("http://{origin}");
    let mut listed = all(&aggregators);
    listed.push(stranger.clone());
    let (ok, _, err) = ctl_all(&listed, &tokens, &["set", "shop", "total_active_users=700"]);
    assert!(!ok);
    assert!(
        err.contains(&stranger) && err.contains("nothing was changed"),
        "{err}"
    );
    for aggregator in &aggregators {
        assert_eq!(shop_at(aggregator), (json!(4), json!(600)));
    }
    let (_, out, err) = ctl_all(&listed, &tokens, &["get", "shop"]);
    let got: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    assert!(got[&stranger].is_string(), "{out}");
    assert_eq!(
        got[&url(&aggregators[0])]["room"]["total_active_users"],
        600,
        "{out}"
    );
}

#[test]
fn a_node_without_an_aggregator_serves_the_api_for_itself() {
    let dir = TempDir::new("control-node");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let tokens = dir.path().join("admin.token");
    write_tokens(&tokens, &format!("{ALICE}\n"));
    let config = |name: &str, token: bool| {
        let state = dir.path().join(name);
        std::fs::create_dir_all(&state).unwrap();
        format!(
            "[node]\nid = \"{name}\"\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
             workers = 1\nstate_dir = \"{state}\"\n{token}\n\
             [[rooms]]\nid = \"shop\"\norigin = \"{origin}\"\ntotal_active_users = 40\n\
             new_users_per_minute = 20\nqueue_all = true\n",
            state = state.display(),
            token = if token {
                format!("admin_token_file = \"{}\"", tokens.display())
            } else {
                String::new()
            },
        )
    };
    let node = Edge::start(dir.path(), "solo", &config("solo", true)).unwrap();
    assert_eq!(visit(&node), (false, true), "queue_all: queued");
    let url = node.admin_url("/api/rooms/shop");
    let (status, body, _) = api(
        "PATCH",
        &url,
        Some(ALICE),
        None,
        Some("{\"suspended\": true}"),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["version"], 2);
    assert_eq!(
        visit(&node),
        (true, false),
        "a suspended room: to the site, no ticket"
    );
    let (status, _, _) = api(
        "PATCH",
        &url,
        Some(BOB),
        None,
        Some("{\"suspended\": false}"),
    );
    assert_eq!(status, 401);

    // The change is kept across a restart; the file's tables did not change.
    let path = node.config.clone();
    drop(node);
    let node = Edge::start_with(dir.path(), "solo-again", &path).unwrap();
    assert_eq!(node_room(&node).0, 2);
    assert_eq!(node_room(&node).1["suspended"], true);
    assert_eq!(visit(&node), (true, false));
    let audit = std::fs::read_to_string(dir.path().join("solo/audit.jsonl")).unwrap();
    assert!(audit.contains("\"who\":\"admin\""), "{audit}");

    // Without a token file the API is off, and says how to turn it on.
    let plain = Edge::start(dir.path(), "plain", &config("plain", false)).unwrap();
    let (status, body, _) = api(
        "GET",
        &plain.admin_url("/api/rooms"),
        Some(ALICE),
        None,
        None,
    );
    assert_eq!(status, 403);
    assert!(
        body["error"].as_str().unwrap().contains("admin_token_file"),
        "{body}"
    );
}

/// The partner key of a bypass rule (in `room`'s settings as the file gave
/// them, `api_url` the room's control URL): never shown by a GET or a
/// PATCH's answer, kept when the list read is sent back with the mask, and
/// still in force where visitors arrive (`visit_api(with_key)`: the site
/// was reached). A mask with nothing behind it is refused naming the key;
/// the audit log never holds a key.
fn check_the_partner_key_is_masked(
    api_url: &str,
    rooms_url: &str,
    audit: &Path,
    visit_api: &dyn Fn(&str, bool) -> bool,
) {
    const KEY: &str = "k-partner-6c1e0b9d";
    assert!(
        eventually(Duration::from_secs(10), || visit_api("/api/orders", true)),
        "the key bypasses the queue"
    );
    assert!(!visit_api("/api/orders", false), "without it: the queue");
    for url in [api_url, rooms_url] {
        let (status, body, _) = api("GET", url, Some(ALICE), None, None);
        assert_eq!(status, 200, "{body}");
        assert!(!body.to_string().contains(KEY), "{url}: {body}");
        assert!(body.to_string().contains("\"***\""), "{url}: {body}");
    }
    let (_, read, _) = api("GET", api_url, Some(ALICE), None, None);
    let mut rules = read["room"]["bypass"].clone();
    assert_eq!(rules[0]["header"]["value"], "***");
    rules[0]["path_prefix"] = json!("/partner/");
    let (status, body, _) = api(
        "PATCH",
        api_url,
        Some(ALICE),
        None,
        Some(&json!({ "bypass": rules }).to_string()),
    );
    assert_eq!(status, 200, "{body}");
    assert!(!body.to_string().contains(KEY), "{body}");
    assert!(
        eventually(Duration::from_secs(10), || visit_api("/partner/x", true)),
        "the kept key bypasses on the new path"
    );
    assert!(!visit_api("/partner/x", false));
    assert!(!visit_api("/api/orders", true), "the old path is gone");

    // A mask on a rule that has no value behind it: refused, named.
    let (status, body, _) = api(
        "PATCH",
        api_url,
        Some(ALICE),
        None,
        Some(
            r#"{"bypass": [{"name": "other", "path_prefix": "/x/", "header": {"name": "x-partner-key", "value": "***"}}]}"#,
        ),
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["field"], "bypass[0].header.value", "{body}");
    // A new key through the API: in force, never in the audit log.
    let (status, body, _) = api(
        "PATCH",
        api_url,
        Some(ALICE),
        None,
        Some(
            r#"{"bypass": [{"name": "partner", "path_prefix": "/partner/", "header": {"name": "x-partner-key", "value": "k-rotated-3f8a"}}]}"#,
        ),
    );
    assert_eq!(status, 200, "{body}");
    let log = std::fs::read_to_string(audit).unwrap();
    assert!(
        !log.contains(KEY) && !log.contains("k-rotated-3f8a"),
        "{log}"
    );
    assert!(log.contains("\"***\""), "{log}");
}

const PARTNER_RULE: &str = "queue_all = true\n[[rooms.bypass]]\nname = \"partner\"\n\
    path_prefix = \"/api/\"\nheader = { name = \"x-partner-key\", value = \"k-partner-6c1e0b9d\" }\n";

/// Reached the site at `path` on `http` (with the partner key or not)?
fn partner_visit(http: &str, path: &str, with_key: bool) -> bool {
    let mut req = client().get(format!("{http}{path}"));
    if with_key {
        req = req.header("x-partner-key", "k-partner-6c1e0b9d");
    }
    let mut resp = req.call().expect("visitor");
    resp.body_mut()
        .read_to_string()
        .unwrap_or_default()
        .contains(SITE)
}

#[test]
fn the_aggregator_never_shows_a_partner_key_but_pushes_it() {
    let dir = TempDir::new("control-mask");
    let certs = Certs::generate(&dir.path().join("certs"), &["n1"]).unwrap();
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let tokens = dir.path().join("control.tokens");
    write_tokens(&tokens, &format!("alice {ALICE}\n"));
    let (aggregator, listen) =
        controlled_aggregator(dir.path(), &certs, &tokens, &format!(
                "[[rooms]]\nid = \"shop\"\ntotal_active_users = 40\nnew_users_per_minute = 20\n{PARTNER_RULE}"
            )).unwrap();
    let gossip = node_gossip_table(listen, &certs, &certs, "n1", INTERVAL_MS);
    let edge = Edge::start(
        dir.path(),
        "n1",
        &node_config(dir.path(), "n1", origin, &gossip),
    )
    .unwrap();
    let http = edge.url("");
    check_the_partner_key_is_masked(
        &aggregator.admin_url("/api/rooms/shop"),
        &aggregator.admin_url("/api/rooms"),
        &dir.path().join("audit.jsonl"),
        &|path, key| partner_visit(&http, path, key),
    );
}

#[test]
fn a_node_without_an_aggregator_never_shows_a_partner_key() {
    let dir = TempDir::new("control-node-mask");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let tokens = dir.path().join("admin.token");
    write_tokens(&tokens, &format!("{ALICE}\n"));
    let state = dir.path().join("solo");
    std::fs::create_dir_all(&state).unwrap();
    let config = format!(
        "[node]\nid = \"solo\"\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         workers = 1\nstate_dir = \"{state}\"\nadmin_token_file = \"{tokens}\"\n\
         [[rooms]]\nid = \"shop\"\norigin = \"{origin}\"\ntotal_active_users = 40\n\
         new_users_per_minute = 20\n{PARTNER_RULE}",
        state = state.display(),
        tokens = tokens.display(),
    );
    let node = Edge::start(dir.path(), "solo", &config).unwrap();
    let http = node.url("");
    check_the_partner_key_is_masked(
        &node.admin_url("/api/rooms/shop"),
        &node.admin_url("/api/rooms"),
        &state.join("audit.jsonl"),
        &|path, key| partner_visit(&http, path, key),
    );
}
