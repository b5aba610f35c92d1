//! Starting an edge node for a test.
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::Result;

use crate::procs::{Proc, binary, ready_field};

/// A running `waitroom-edge`.
#[derive(Debug)]
pub struct Edge {
    pub proc: Proc,
    /// Where visitors connect.
    pub http: SocketAddr,
    /// The admin listener (metrics, status).
    pub admin: SocketAddr,
    /// The TLS listener, when configured.
    pub https: Option<SocketAddr>,
    pub config: PathBuf,
}

impl Edge {
    /// Writes `config` to `dir/NAME.toml` and starts a node with it.
    pub fn start(dir: &Path, name: &str, config: &str) -> Result<Self> {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, config)?;
        Self::start_with(dir, name, &path)
    }

    /// Starts a node with an existing config file.
    pub fn start_with(dir: &Path, name: &str, path: &Path) -> Result<Self> {
        let mut cmd = Command::new(binary("waitroom-edge"));
        cmd.arg("--config")
            .arg(path)
            .env("RUST_LOG", "info,waitroom_edge=debug");
        let mut proc = Proc::spawn(name, cmd, dir)?;
        let line = proc.wait_line("waitroom-edge ready:", Duration::from_secs(20))?;
        Ok(Self {
            http: ready_field(&line, "http")?.parse()?,
            admin: ready_field(&line, "admin")?.parse()?,
            https: ready_field(&line, "https")
                .ok()
                .and_then(|a| a.parse().ok()),
            proc,
            config: path.to_owned(),
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }
}

/// A cookie-keeping HTTP client that never treats a status as an error.
pub fn client() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(15)))
        .http_status_as_error(false)
        .max_redirects(0)
        .build()
        .into()
}

/// A client without cookies kept between requests: every request a new visitor.
pub fn fresh_visitor() -> ureq::Agent {
    client()
}

/// Reads one Prometheus sample (`name{labels}` exactly as written) from a metrics page.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .and_then(|v| v.trim().parse().ok())
}

/// From a node's `/metrics` text: the index in `aggregators` of its home
/// (`waitroom_gossip_home` 1), if one is.
#[must_use]
pub fn home_among(text: &str, aggregators: &[std::net::SocketAddr]) -> Option<usize> {
    aggregators.iter().position(|a| {
        metric(text, &format!("waitroom_gossip_home{{aggregator=\"{a}\"}}")) == Some(1.0)
    })
}

/// From a node's `/metrics` text: every one of `aggregators` answering,
/// exactly one of them its home (the others 0), connected and fresh.
#[must_use]
pub fn settled_among(text: &str, aggregators: &[std::net::SocketAddr]) -> bool {
    let series = |family: &str, a: &std::net::SocketAddr| {
        metric(text, &format!("{family}{{aggregator=\"{a}\"}}"))
    };
    let homes: Vec<Option<f64>> = aggregators
        .iter()
        .map(|a| series("waitroom_gossip_home", a))
        .collect();
    aggregators
        .iter()
        .all(|a| series("waitroom_gossip_aggregator_answering", a) == Some(1.0))
        && homes.iter().filter(|h| **h == Some(1.0)).count() == 1
        && homes
            .iter()
            .all(|h| matches!(h, Some(v) if *v == 0.0 || *v == 1.0))
        && metric(text, "waitroom_gossip_connected") == Some(1.0)
        && metric(text, "waitroom_gossip_stale") == Some(0.0)
}

/// From a node's `/metrics` text: it takes its grants from `aggregator`
/// (its home), is connected, and holds a state that arrived after
/// `since_secs` (Unix seconds).
#[must_use]
pub fn fresh_from(text: &str, aggregator: std::net::SocketAddr, since_secs: f64) -> bool {
    let home = format!("waitroom_gossip_home{{aggregator=\"{aggregator}\"}}");
    metric(text, &home) == Some(1.0)
        && metric(text, "waitroom_gossip_last_state_timestamp_seconds")
            .is_some_and(|at| at > since_secs)
        && metric(text, "waitroom_gossip_connected") == Some(1.0)
}

/// What the demo origin's pages say (the visitor reached the site).
pub const SITE: &str = "Demo Shop";
/// What the queue page says.
pub const QUEUE: &str = "You are in line";

/// GET with `agent`: the status and the body.
pub fn get(agent: &ureq::Agent, url: &str) -> (u16, String) {
    let mut resp = agent.get(url).call().expect("request");
    let status = resp.status().as_u16();
    (status, resp.body_mut().read_to_string().unwrap_or_default())
}

/// GET with a fresh client: the body, or empty on any failure.
pub fn get_text(url: &str) -> String {
    client()
        .get(url)
        .call()
        .ok()
        .and_then(|mut r| r.body_mut().read_to_string().ok())
        .unwrap_or_default()
}

/// A new visitor (no cookie) asks `edge` for `/`; true when admitted to the
/// site. Panics on a server error: no fault a test makes may cost a visitor
/// a 5xx.
pub fn admits_new_visitor(edge: &Edge) -> bool {
    admits_new_visitor_at(edge, "/")
}

/// [`admits_new_visitor`] at `path`.
pub fn admits_new_visitor_at(edge: &Edge, path: &str) -> bool {
    let mut resp = client()
        .get(&edge.url(path))
        .call()
        .expect("visitor request");
    let status = resp.status().as_u16();
    let body = resp.body_mut().read_to_string().unwrap_or_default();
    assert!(status < 500, "{}: {status} {body}", edge.proc.name);
    body.contains(SITE)
}

/// `series` read from every node's `/metrics` and summed (absent: 0).
pub fn metric_sum(edges: &[Edge], series: &str) -> f64 {
    edges
        .iter()
        .map(|e| metric(&get_text(&e.admin_url("/metrics")), series).unwrap_or(0.0))
        .sum()
}

/// Waits (at most 2 s) until every node's clock, which follows the
/// cluster's (`waitroom_clock_offset_seconds` from its wall clock), reads
/// at least 100 ms into the minute this process's clock reads: a node
/// counts minutes on the time of its last answer carried forward, which
/// can trail the wall clock by an answer's delay, and a visitor it admits
/// in that gap counts in the minute before. Returns how far the node
/// furthest behind trailed this process's clock, in seconds.
pub fn wait_until_the_nodes_are_in_this_minute(edges: &[Edge]) -> f64 {
    let minute_start = (crate::minutes::now_secs() / 60.0).floor() * 60.0;
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let offset = |e: &Edge| {
        metric(
            &get_text(&e.admin_url("/metrics")),
            "waitroom_clock_offset_seconds",
        )
        .unwrap_or(0.0)
    };
    let trail = edges.iter().map(|e| -offset(e)).fold(0.0, f64::max);
    loop {
        let behind = edges
            .iter()
            .map(|e| minute_start + 0.1 - (crate::minutes::now_secs() + offset(e)))
            .fold(f64::NEG_INFINITY, f64::max);
        if behind <= 0.0 || std::time::Instant::now() >= deadline {
            return trail;
        }
        std::thread::sleep(Duration::from_secs_f64(behind.min(0.5)));
    }
}

/// The minute's admits of room `shop`, `admitted` per node as the visitors
/// saw them, stay within `limit` with no slack, are what the nodes count,
/// and use at least half of it.
pub fn check_the_minute(edges: &[Edge], admitted: &[u64], limit: u64) {
    let total: u64 = admitted.iter().sum();
    let counted = metric_sum(edges, "waitroom_admitted_this_minute{room=\"shop\"}");
    eprintln!("admitted per node {admitted:?}, {total} in all; the nodes count {counted}");
    assert!(
        total <= limit,
        "{total} admitted > {limit} per minute: {admitted:?}"
    );
    assert_eq!(
        counted, total as f64,
        "the counters agree with the visitors"
    );
    assert!(
        total >= limit / 2,
        "most of the minute's slots are used: {admitted:?}"
    );
}
