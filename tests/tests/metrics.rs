//! The Prometheus exposition of a real node and a real aggregator, read by a
//! strict OpenMetrics parser, and the deploy files that use it.
//!
//! What is asserted:
//! - both scrapes parse (`openmetrics-parser`: one block per family, `# EOF`,
//!   counter samples with `_total`, label values unescaped), every family has
//!   exactly one `# HELP` and one `# TYPE`, counters end in `_total`, and no
//!   name carries a unit other than seconds or bytes;
//! - a room id with `"` and `\`, and a colo with `"`, `\` and a newline, come
//!   back from the parser exactly as configured (the hand-written text of
//!   before wrote them raw, which broke the scrape);
//! - the families and labels the dashboards and docs use are there, the room
//!   limits equal the configuration on both sides, the settings versions
//!   agree, `waitroom_build_info` names this release;
//! - every metric name in `deploy/grafana/waitroom.json` and
//!   `deploy/prometheus/waitroom-alerts.yml` is one of the scrapes' (the XDP
//!   ones in the privileged test, which has a node with its program), and
//!   `promtool check rules` accepts the alert rules and `promtool test rules`
//!   passes their unit tests (`deploy/prometheus/waitroom-alerts.test.yml`).
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use openmetrics_parser::{MetricsExposition, OpenMetricsType, OpenMetricsValue};
use waitroom_tests::{
    cluster::{Aggregator, Certs, aggregator_config, free_udp_port, node_gossip_table},
    edge::{Edge, client, get, get_text, metric},
    eventually,
    procs::{TempDir, start_origin},
    require_root,
    xdp_node::XdpNodeFixture,
};

/// A room id no hand-written exposition survives.
const ROOM: &str = "sh\"op\\1";
/// The same in a TOML basic string.
const ROOM_TOML: &str = r#""sh\"op\\1""#;
/// A colo with a quote, a backslash and a newline.
const COLO: &str = "eu \"west\"\\1\nb";
const COLO_TOML: &str = r#""eu \"west\"\\1\nb""#;
const NODE: &str = "node-1";
const TOTAL_ACTIVE_USERS: f64 = 40.0;
const NEW_USERS_PER_MINUTE: f64 = 20.0;
const SESSION_MINUTES: f64 = 7.0;
/// What OpenMetrics serves as.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Families every node serves (an `[aggregator]` and health checks
/// configured), with the labels of their samples.
const NODE_FAMILIES: &[(&str, &[&str])] = &[
    ("waitroom_build_info", &["version"]),
    ("waitroom_connections_open", &[]),
    ("waitroom_connections", &[]),
    ("waitroom_connections_closed", &["reason"]),
    ("waitroom_requests_unmatched", &[]),
    ("waitroom_unrouted_requests", &["outcome"]),
    ("waitroom_active_users", &["room", "scope"]),
    ("waitroom_waiting", &["room", "scope"]),
    ("waitroom_admitted_this_minute", &["room"]),
    ("waitroom_admits_per_minute", &["room"]),
    ("waitroom_admitted", &["kind", "room"]),
    ("waitroom_queued", &["room"]),
    ("waitroom_rejected", &["room"]),
    ("waitroom_proxy_errors", &["room"]),
    ("waitroom_client_body_errors", &["room"]),
    ("waitroom_cookie_failures", &["reason", "room"]),
    ("waitroom_decision_seconds", &["room"]),
    ("waitroom_proxy_seconds", &["room"]),
    ("waitroom_active_users_limit", &["room"]),
    ("waitroom_new_users_per_minute_limit", &["room"]),
    ("waitroom_session_duration_seconds", &["room"]),
    ("waitroom_settings_version", &["room"]),
    ("waitroom_xdp_attached", &[]),
    ("waitroom_config_reload_success", &[]),
    ("waitroom_config_last_reload_success_timestamp_seconds", &[]),
    ("waitroom_config_reloads", &["result"]),
    ("waitroom_requests_refused", &["reason"]),
    ("waitroom_defended", &["reason"]),
    ("waitroom_pool_up", &["pool", "room"]),
    ("waitroom_pool_rtt_ewma_seconds", &["pool", "room"]),
    ("waitroom_origin_up", &["origin", "pool", "room"]),
    ("waitroom_origin_requests", &["origin", "pool", "room"]),
    (
        "waitroom_origin_connection_failures",
        &["origin", "pool", "room"],
    ),
    (
        "waitroom_origin_probe_failures",
        &["origin", "pool", "room"],
    ),
    (
        "waitroom_origin_probe_rtt_seconds",
        &["origin", "pool", "room"],
    ),
    ("waitroom_gossip_connected", &[]),
    ("waitroom_gossip_last_state_timestamp_seconds", &[]),
    ("waitroom_gossip_stale", &[]),
    ("waitroom_gossip_reports", &[]),
    ("waitroom_gossip_errors", &[]),
    ("waitroom_gossip_connects", &[]),
];

/// Families the aggregator serves once a node reported and a snapshot was written.
const AGGREGATOR_FAMILIES: &[(&str, &[&str])] = &[
    ("waitroom_build_info", &["version"]),
    ("waitroom_aggregator_connections_open", &[]),
    ("waitroom_aggregator_connections", &[]),
    ("waitroom_aggregator_handshakes_refused", &[]),
    ("waitroom_aggregator_reports", &[]),
    ("waitroom_aggregator_frames_refused", &[]),
    ("waitroom_aggregator_identity_refused", &[]),
    ("waitroom_aggregator_connections_replaced", &[]),
    ("waitroom_aggregator_snapshots", &[]),
    ("waitroom_aggregator_snapshot_errors", &[]),
    ("waitroom_aggregator_implausible_numbers", &["reason"]),
    ("waitroom_aggregator_last_snapshot_timestamp_seconds", &[]),
    ("waitroom_config_reload_success", &[]),
    ("waitroom_config_last_reload_success_timestamp_seconds", &[]),
    ("waitroom_config_reloads", &["result"]),
    ("waitroom_aggregator_nodes", &["state"]),
    ("waitroom_aggregator_active_users", &["room"]),
    ("waitroom_aggregator_admitted_this_minute", &["room"]),
    ("waitroom_aggregator_slots_available", &["room"]),
    ("waitroom_aggregator_waiting", &["room"]),
    ("waitroom_aggregator_anywhere_leased", &["room"]),
    ("waitroom_aggregator_admits_per_minute", &["room"]),
    ("waitroom_aggregator_recent_admits_per_second", &["room"]),
    ("waitroom_aggregator_nodes_reporting", &["room"]),
    ("waitroom_aggregator_active_users_limit", &["room"]),
    ("waitroom_aggregator_new_users_per_minute_limit", &["room"]),
    ("waitroom_aggregator_session_duration_seconds", &["room"]),
    ("waitroom_aggregator_settings_version", &["room"]),
    (
        "waitroom_aggregator_node_report_age_seconds",
        &["colo", "node"],
    ),
    ("waitroom_aggregator_node_departed", &["colo", "node"]),
    ("waitroom_aggregator_node_active_users", &["colo", "node"]),
];

/// Names the deploy files use that a scrape of seconds cannot show, and why.
/// The XDP ones are checked by [`xdp_families_the_deploy_files_use_exist`].
const NOT_IN_A_SHORT_SCRAPE: &[(&str, &str)] = &[(
    "waitroom_aggregator_wait_estimate_seconds",
    "absent until the room has an admit rate, an EWMA over complete minutes",
)];

type Exposition = MetricsExposition<OpenMetricsType, OpenMetricsValue>;

/// One scrape: its text and what the strict parser made of it.
struct Scrape {
    text: String,
    parsed: Exposition,
}

impl Scrape {
    /// GETs `url`, checks the content type and parses the text strictly.
    fn get(url: &str) -> Self {
        let mut resp = client().get(url).call().expect("scrape");
        assert_eq!(resp.status().as_u16(), 200);
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert_eq!(content_type, OPENMETRICS, "{url}");
        let text = resp.body_mut().read_to_string().expect("body");
        let parsed = openmetrics_parser::openmetrics::parse_openmetrics(&text)
            .unwrap_or_else(|e| panic!("{url} does not parse as OpenMetrics: {e:?}\n{text}"));
        Self { text, parsed }
    }

    /// The labels of `family`'s samples, each as `name -> value`.
    fn label_sets(&self, family: &str) -> Vec<BTreeMap<String, String>> {
        let Some(f) = self.parsed.families.get(family) else {
            return Vec::new();
        };
        f.iter_samples()
            .map(|s| {
                let labels = s.get_labelset().expect("a sample's labels");
                labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
            })
            .collect()
    }

    /// The value of `family`'s sample whose labels include `labels`.
    fn value(&self, family: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let f = self.parsed.families.get(family)?;
        f.iter_samples()
            .find(|s| {
                let set = s.get_labelset().expect("a sample's labels");
                labels
                    .iter()
                    .all(|(k, v)| set.get_label_value(k) == Some(*v))
            })
            .and_then(|s| match &s.value {
                OpenMetricsValue::Gauge(n) | OpenMetricsValue::Unknown(n) => Some(n.as_f64()),
                OpenMetricsValue::Counter(c) => Some(c.value.as_f64()),
                _ => None,
            })
    }

    /// Every name a query can use: families, and sample names (`_total`,
    /// `_bucket`, `_sum`, `_count`).
    fn names(&self) -> BTreeSet<String> {
        let mut names: BTreeSet<String> = self.parsed.families.keys().cloned().collect();
        for line in self.text.lines().filter(|l| !l.starts_with('#')) {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_owned());
        }
        names
    }

    /// The conventions, checked on the text as served.
    fn check_conventions(&self, who: &str) {
        let mut helps: BTreeMap<&str, usize> = BTreeMap::new();
        let mut types: BTreeMap<&str, &str> = BTreeMap::new();
        for line in self.text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                *helps.entry(rest.split(' ').next().unwrap()).or_default() += 1;
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(
                    types.insert(name, kind).is_none(),
                    "{who}: two TYPE lines for {name}"
                );
            }
        }
        assert_eq!(
            helps.keys().collect::<Vec<_>>(),
            types.keys().collect::<Vec<_>>(),
            "{who}: every family has a HELP and a TYPE"
        );
        assert!(
            helps.values().all(|n| *n == 1),
            "{who}: one HELP each: {helps:?}"
        );
        assert_eq!(
            types.keys().copied().collect::<BTreeSet<_>>(),
            self.parsed.families.keys().map(String::as_str).collect(),
            "{who}: the parser saw the same families"
        );
        for (name, family) in &self.parsed.families {
            assert!(!family.help.is_empty(), "{who}: {name} has an empty HELP");
            assert!(name.starts_with("waitroom_"), "{who}: {name}");
            for unit in ["_ms", "_millis", "_micros", "_us", "_minutes", "_kb"] {
                assert!(
                    !name.contains(&format!("{unit}_")) && !name.ends_with(unit),
                    "{who}: {name}: units are seconds and bytes"
                );
            }
            assert!(
                family.iter_samples().next().is_some(),
                "{who}: {name} has a header but no sample"
            );
        }
        for line in self.text.lines().filter(|l| !l.starts_with('#')) {
            let end = line.find(['{', ' ']).unwrap();
            let sample = &line[..end];
            let family = types
                .keys()
                .filter(|f| sample.starts_with(**f))
                .max_by_key(|f| f.len())
                .unwrap_or_else(|| panic!("{who}: sample {sample} outside every family"));
            match types[family] {
                "counter" => assert_eq!(sample, format!("{family}_total"), "{who}"),
                "gauge" => assert_eq!(sample, *family, "{who}"),
                "histogram" => assert!(
                    ["_bucket", "_sum", "_count"]
                        .map(|s| format!("{family}{s}"))
                        .contains(&sample.to_owned()),
                    "{who}: {sample}"
                ),
                other => panic!("{who}: {family} is a {other}"),
            }
            let value = line.rsplit(' ').next().unwrap();
            assert_ne!(value, "-1", "{who}: {line}: no -1 for none yet");
        }
    }

    /// Each family of `expected` is there with exactly those label names.
    fn check_families(&self, who: &str, expected: &[(&str, &[&str])]) {
        for (name, labels) in expected {
            let family = self
                .parsed
                .families
                .get(*name)
                .unwrap_or_else(|| panic!("{who}: no family {name} in\n{}", self.text));
            let mut names: Vec<&str> = family
                .get_label_names()
                .iter()
                .map(String::as_str)
                .collect();
            names.sort_unstable();
            assert_eq!(names, *labels, "{who}: labels of {name}");
        }
    }
}

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// Every `waitroom_*` name in the deploy files: the dashboard's queries, the
/// alert rules and their tests (read whole, so a name in a description counts).
fn deploy_names() -> BTreeSet<String> {
    let dashboard = std::fs::read_to_string(repo_file("deploy/grafana/waitroom.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    let panels = json["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "a dashboard with its panels");
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        let targets = panel["targets"].as_array().expect("targets");
        assert!(
            !targets.is_empty() && targets.iter().all(|t| t["expr"].is_string()),
            "{panel}"
        );
    }
    let rules =
        std::fs::read_to_string(repo_file("deploy/prometheus/waitroom-alerts.yml")).unwrap();
    let mut names = BTreeSet::new();
    let rule_tests =
        std::fs::read_to_string(repo_file("deploy/prometheus/waitroom-alerts.test.yml")).unwrap();
    for text in [&dashboard, &rules, &rule_tests] {
        let mut rest = text.as_str();
        while let Some(at) = rest.find("waitroom_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.insert(tail[..end].to_owned());
            rest = &tail[end..];
        }
    }
    names
}

#[test]
fn node_and_aggregator_expositions_parse_and_carry_the_limits() {
    let dir = TempDir::new("metrics");
    let certs = Certs::generate(dir.path(), &[NODE]).unwrap();
    let rooms = format!(
        "[[rooms]]\nid = {ROOM_TOML}\ntotal_active_users = {TOTAL_ACTIVE_USERS}\n\
         new_users_per_minute = {NEW_USERS_PER_MINUTE}\nsession_duration = {SESSION_MINUTES}\n"
    );
    let listen = format!("127.0.0.1:{}", free_udp_port().unwrap())
        .parse()
        .unwrap();
    let aggregator = Aggregator::start(
        dir.path(),
        "aggregator",
        &aggregator_config(listen, &certs, &dir.path().join("snapshot.bin"), &rooms),
    )
    .unwrap();
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let node_config = format!(
        r#"[node]
id = "{NODE}"
colo = {COLO_TOML}
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
workers = 1
counters_path = "{counters}"

{rooms}[[rooms.pools]]
name = "main"
origins = ["{origin}"]
[rooms.health]
path = "/healthz"
interval_ms = 200
timeout_ms = 200

{gossip}"#,
        counters = dir.path().join("node.shm").display(),
        gossip = node_gossip_table(aggregator.quic, &certs, &certs, NODE, 200),
    );
    let edge = Edge::start(dir.path(), "edge", &node_config).unwrap();
    let (status, _) = get(&client(), &edge.url("/"));
    assert_eq!(status, 200, "the first visitor is admitted or queued");

    // Connected, probed, reported and snapshotted: every family has a sample.
    assert!(
        eventually(Duration::from_secs(15), || {
            let node = get_text(&edge.admin_url("/metrics"));
            let agg = get_text(&aggregator.admin_url("/metrics"));
            metric(&node, "waitroom_gossip_connected") == Some(1.0)
                && node.contains("waitroom_pool_rtt_ewma_seconds{")
                && node.contains("waitroom_origin_probe_rtt_seconds{")
                && node.contains("\nwaitroom_gossip_last_state_timestamp_seconds ")
                && agg.contains("\nwaitroom_aggregator_last_snapshot_timestamp_seconds ")
                && agg.contains("waitroom_aggregator_node_report_age_seconds{")
                // Measured half a second into each minute.
                && agg.contains("waitroom_aggregator_recent_admits_per_second{")
        }),
        "node:\n{}\naggregator:\n{}\n{}",
        get_text(&edge.admin_url("/metrics")),
        get_text(&aggregator.admin_url("/metrics")),
        edge.proc.stderr()
    );

    let node = Scrape::get(&edge.admin_url("/metrics"));
    let agg = Scrape::get(&aggregator.admin_url("/metrics"));
    node.check_conventions("node");
    agg.check_conventions("aggregator");
    node.check_families("node", NODE_FAMILIES);
    agg.check_families("aggregator", AGGREGATOR_FAMILIES);

    // Escaped on the way out, the same string on the way in.
    assert!(node.text.contains(r#"room="sh\"op\\1""#), "{}", node.text);
    for family in ["waitroom_active_users_limit", "waitroom_admitted"] {
        assert!(
            node.label_sets(family).iter().all(|l| l["room"] == ROOM),
            "{family}: {:?}",
            node.label_sets(family)
        );
    }
    assert_eq!(
        agg.label_sets("waitroom_aggregator_node_report_age_seconds"),
        vec![BTreeMap::from([
            ("colo".to_owned(), COLO.to_owned()),
            ("node".to_owned(), NODE.to_owned())
        ])]
    );

    // The limits are the configuration's, on both sides.
    let room = [("room", ROOM)];
    for (scrape, prefix) in [(&node, "waitroom_"), (&agg, "waitroom_aggregator_")] {
        for (name, want) in [
            ("active_users_limit", TOTAL_ACTIVE_USERS),
            ("new_users_per_minute_limit", NEW_USERS_PER_MINUTE),
            ("session_duration_seconds", SESSION_MINUTES * 60.0),
        ] {
            assert_eq!(
                scrape.value(&format!("{prefix}{name}"), &room),
                Some(want),
                "{prefix}{name}"
            );
        }
    }
    let version = node.value("waitroom_settings_version", &room).unwrap();
    assert!(version > 0.0);
    assert_eq!(
        agg.value("waitroom_aggregator_settings_version", &room),
        Some(version),
        "node and aggregator run the same limits"
    );
    for scrape in [&node, &agg] {
        assert_eq!(
            scrape.value(
                "waitroom_build_info",
                &[("version", env!("CARGO_PKG_VERSION"))]
            ),
            Some(1.0)
        );
    }
    // The one visit was admitted or queued (a node without a share yet may
    // queue it), and counted under the escaped room.
    assert_eq!(
        node.value("waitroom_admitted", &[("room", ROOM), ("kind", "new")])
            .zip(node.value("waitroom_queued", &room))
            .map(|(a, q)| a + q),
        Some(1.0)
    );
    assert_eq!(
        node.value("waitroom_pool_up", &[("pool", "main")]),
        Some(1.0)
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    for (scrape, name) in [
        (&node, "waitroom_gossip_last_state_timestamp_seconds"),
        (
            &node,
            "waitroom_config_last_reload_success_timestamp_seconds",
        ),
        (&agg, "waitroom_aggregator_last_snapshot_timestamp_seconds"),
    ] {
        let at = scrape.value(name, &[]).unwrap();
        assert!(
            (now - 60.0..=now + 1.0).contains(&at),
            "{name} = {at}, now {now}"
        );
    }

    // The deploy files use only what the scrapes serve.
    let seen: BTreeSet<String> = node.names().union(&agg.names()).cloned().collect();
    let missing: Vec<String> = deploy_names()
        .into_iter()
        .filter(|n| !seen.contains(n) && !n.starts_with("waitroom_xdp_"))
        .filter(|n| !NOT_IN_A_SHORT_SCRAPE.iter().any(|(late, _)| late == n))
        .collect();
    assert!(
        missing.is_empty(),
        "the deploy files use {missing:?}, which no scrape served"
    );
}

/// The parser this file relies on refuses what the hand-written exposition
/// of before served: a raw quote in a label value, a family's samples split
/// around another family's, and text without `# EOF`.
#[test]
fn the_parser_refuses_the_old_hand_written_text() {
    let parse = openmetrics_parser::openmetrics::parse_openmetrics;
    let good = "# HELP a_total A.\n# TYPE a_total gauge\na_total{room=\"x\\\"y\"} 1\n# EOF\n";
    assert!(parse(good).is_ok(), "{good}");
    for bad in [
        // A room id with a quote, written raw.
        "# HELP a A.\n# TYPE a gauge\na{room=\"x\"y\"} 1\n# EOF\n",
        // Two headers, then the families' samples interleaved.
        "# HELP a A.\n# TYPE a gauge\n# HELP b B.\n# TYPE b gauge\na 1\nb 1\n# EOF\n",
        // The Prometheus 0.0.4 text it served ends without `# EOF`.
        "# HELP a A.\n# TYPE a gauge\na 1\n",
    ] {
        assert!(parse(bad).is_err(), "accepted:\n{bad}");
    }
}

#[test]
fn xdp_families_the_deploy_files_use_exist() {
    if !require_root() {
        return;
    }
    const TOKEN: &str = "f0e1d2c3b4a5968778695a4b3c2d1e0f";
    let fixture = XdpNodeFixture::new("metrics-xdp", 1, TOKEN).expect("namespace and origin");
    let edge = Edge::start(fixture.dir.path(), "edge", &fixture.config).unwrap();
    fixture
        .visit_from_inside()
        .expect("a visit through the veth");
    // The telemetry task publishes a snapshot every second.
    assert!(
        eventually(Duration::from_secs(5), || {
            get_text(&edge.admin_url("/metrics")).contains("waitroom_xdp_packets_total ")
        }),
        "{}",
        edge.proc.stderr()
    );
    let scrape = Scrape::get(&edge.admin_url("/metrics"));
    scrape.check_conventions("xdp node");
    let seen = scrape.names();
    let missing: Vec<String> = deploy_names()
        .into_iter()
        .filter(|n| n.starts_with("waitroom_xdp_") && !seen.contains(n))
        .collect();
    assert!(
        missing.is_empty(),
        "{missing:?} not served by a node with XDP"
    );
}

/// Runs `promtool ARGS`; `None` (after saying why) when promtool is not
/// installed outside CI. In CI a missing promtool fails the test.
fn promtool(args: &[&Path]) -> Option<String> {
    let out = match Command::new("promtool").args(args).output() {
        Ok(out) => out,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var_os("CI").is_none(),
                "promtool is missing in CI: `cargo xtask setup` installs Debian's prometheus package"
            );
            eprintln!(
                "skipping: promtool not found (Debian package prometheus; `cargo xtask setup` installs it)"
            );
            return None;
        }
        Err(err) => panic!("running promtool: {err}"),
    };
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{said}");
    Some(said)
}

#[test]
fn promtool_accepts_the_alert_rules_and_their_tests_pass() {
    let rules = repo_file("deploy/prometheus/waitroom-alerts.yml");
    let Some(said) = promtool(&[Path::new("check"), Path::new("rules"), &rules]) else {
        return;
    };
    assert!(said.contains("SUCCESS"), "{said}");
    // Each alert fires on made-up series where it should, and only there.
    let tests = repo_file("deploy/prometheus/waitroom-alerts.test.yml");
    let said = promtool(&[Path::new("test"), Path::new("rules"), &tests]).unwrap();
    assert!(said.contains("SUCCESS"), "{said}");
}
