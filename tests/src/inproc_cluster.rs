//! An aggregator and several nodes inside the test process, on one driven
//! clock, gossiping over real QUIC on loopback, each node in front of the
//! demo origin over real HTTP.
//!
//! Tests of the cluster's accuracy need minutes of history (a colo's share
//! is its traffic two minutes back), which real-time processes would sleep
//! through. Here the test moves one clock for everyone and
//! [`InProcCluster::advance`] returns once every node decides with an answer
//! the aggregator computed at the new time, so a test walks through minutes
//! in seconds without guessing with sleeps.
//!
//! Each node reads its own clock, moved with the aggregator's by
//! [`InProcCluster::advance`] (one clock underneath, so at once);
//! [`InProcCluster::jump`] steps one node's wall clock alone, as NTP or a
//! resumed VM would.
use std::{net::SocketAddr, time::Duration};

use anyhow::{Context as _, Result, bail};
use waitroom_common::time::UnixMillis;
use waitroom_edge::start::{self, Options, Running};
use waitroom_runtime::clock::{Clock, ClockDriver, Stepper};

use crate::{
    cluster::{Certs, aggregator_config, node_config, node_gossip_table},
    inproc::START,
    procs::TempDir,
};

/// How long a round of fresh answers may take before [`InProcCluster::advance`]
/// gives up.
const FRESH_LIMIT: Duration = Duration::from_secs(20);

/// One node of the cluster.
#[derive(Debug)]
pub struct ClusterNode {
    pub name: String,
    pub colo: String,
    /// Where visitors connect.
    pub http: SocketAddr,
    running: Option<Running>,
    /// Steps this node's wall clock alone.
    clock: Stepper,
}

impl ClusterNode {
    /// `http://NODE{path}`.
    #[must_use]
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    fn running(&self) -> &Running {
        self.running
            .as_ref()
            .expect("the node runs until the cluster is dropped")
    }
}

/// The aggregator and its nodes, one clock.
#[derive(Debug)]
pub struct InProcCluster {
    pub nodes: Vec<ClusterNode>,
    driver: ClockDriver,
    /// The aggregator's clock (the cluster's time) and the hand that steps
    /// it alone.
    aggregator_clock: Clock,
    aggregator_stepper: Stepper,
    /// Runs the aggregator and the demo origin; dropped last but one.
    runtime: Option<tokio::runtime::Runtime>,
    aggregator: Option<waitroom_aggregator::Aggregator>,
    _dir: TempDir,
}

impl InProcCluster {
    /// Starts an aggregator serving one room `shop` (`room` adds its keys:
    /// limits, method, session) and one node per `(name, colo)`, each
    /// reporting every `interval_ms` of real time, the clock at [`START`].
    pub fn start(tag: &str, room: &str, nodes: &[(&str, &str)], interval_ms: u64) -> Result<Self> {
        Self::start_with(tag, room, nodes, interval_ms, "")
    }

    /// [`InProcCluster::start`] with `gossip` added to every node's
    /// `[aggregator]` table (e.g. `lease_wait_ms = 0\n`).
    pub fn start_with(
        tag: &str,
        room: &str,
        nodes: &[(&str, &str)],
        interval_ms: u64,
        gossip: &str,
    ) -> Result<Self> {
        let dir = TempDir::new(tag);
        let names: Vec<&str> = nodes.iter().map(|&(n, _)| n).collect();
        let certs = Certs::generate(&dir.path().join("certs"), &names)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("starting the cluster's runtime")?;
        let (_, driver) = Clock::driven(START);
        let (clock, aggregator_stepper) = driver.stepped();

        let origin = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .context("binding the demo origin")?;
        let origin_addr = origin.local_addr()?;
        runtime.spawn(crate::demo_origin::serve_on(origin, Duration::ZERO));

        let table = format!("[[rooms]]\nid = \"shop\"\n{room}\n");
        let agg_path = dir.path().join("aggregator.toml");
        std::fs::write(
            &agg_path,
            aggregator_config(
                "127.0.0.1:0".parse()?,
                &certs,
                &dir.path().join("aggregator.snapshot"),
                &table,
            ),
        )?;
        let agg_config = waitroom_aggregator::config::AggregatorConfig::load(&agg_path)?;
        let aggregator = runtime
            .block_on(waitroom_aggregator::Aggregator::start(
                agg_config,
                clock.clone(),
            ))
            .context("starting the aggregator")?;
        let quic = aggregator.quic_addr();

        let mut started = Vec::new();
        for &(name, colo) in nodes {
            let (node_clock, node_stepper) = driver.stepped();
            let path = dir.path().join(format!("{name}.toml"));
            std::fs::write(
                &path,
                node_config(
                    dir.path(),
                    name,
                    colo,
                    1,
                    false,
                    &table,
                    origin_addr,
                    &(node_gossip_table(quic, &certs, &certs, name, interval_ms) + gossip),
                ),
            )?;
            let config = waitroom_edge::config::load(&path)?;
            let running = start::start(
                config,
                Options {
                    clock: node_clock,
                    signals_for: None,
                    drop_capabilities: false,
                },
            )
            .with_context(|| format!("starting node {name}"))?;
            started.push(ClusterNode {
                name: name.to_owned(),
                colo: colo.to_owned(),
                http: running.addresses.http,
                running: Some(running),
                clock: node_stepper,
            });
        }
        let cluster = Self {
            nodes: started,
            driver,
            aggregator_clock: clock,
            aggregator_stepper,
            runtime: Some(runtime),
            aggregator: Some(aggregator),
            _dir: dir,
        };
        cluster.wait_fresh(cluster.now())?;
        Ok(cluster)
    }

    /// The cluster's time.
    #[must_use]
    pub fn now(&self) -> UnixMillis {
        self.aggregator_clock.now()
    }

    /// Moves the clock forward by `by` and returns once every node decides
    /// with an aggregator answer computed at the new time or later.
    pub fn advance(&self, by: Duration) -> Result<UnixMillis> {
        self.driver.advance(by);
        let now = self.now();
        self.wait_fresh(now)?;
        Ok(now)
    }

    /// Steps node `i`'s clock alone by `by_ms` (negative: back), as a
    /// clock stepped by NTP or a resumed VM would; it stays that far from
    /// the cluster's from then on. Returns the node's time.
    pub fn jump(&self, i: usize, by_ms: i64) -> UnixMillis {
        self.nodes[i].clock.step(by_ms);
        self.node(i).clock.wall()
    }

    /// Steps the aggregator's wall clock alone by `by_ms` (negative: back):
    /// the cluster's time, which the nodes follow. Returns the new time.
    pub fn jump_aggregator(&self, by_ms: i64) -> UnixMillis {
        self.aggregator_stepper.step(by_ms);
        self.now()
    }

    /// Waits until every room of every node holds a state computed at `now`
    /// or later (an answer of the aggregator to a report made at `now`).
    pub fn wait_fresh(&self, now: UnixMillis) -> Result<()> {
        let deadline = std::time::Instant::now() + FRESH_LIMIT;
        loop {
            let mut fresh = true;
            for node in &self.nodes {
                let running = node.running();
                let world = running
                    .node
                    .gossip
                    .as_ref()
                    .context("every node of the cluster gossips")?
                    .world
                    .load();
                // The aggregator's answer is at `now`, and the node decides with it
                // (not with a cold-start or local-only state of its own).
                let answered = running.node.rooms.iter().all(|r| {
                    let state = r.state.load();
                    state.as_of >= now
                        && world
                            .room(r.spec.engine.id())
                            .is_some_and(|view| std::sync::Arc::ptr_eq(&view.state, &state))
                });
                if !answered {
                    running.refresh_states();
                    fresh = false;
                }
            }
            if fresh {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                bail!("no fresh answer for every node at {now:?} within {FRESH_LIMIT:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Node `i` itself (its rooms, counters and metrics).
    #[must_use]
    pub fn node(&self, i: usize) -> &waitroom_edge::node::Node {
        &self.nodes[i].running().node
    }

    /// The state node `i` decides its first room with now.
    #[must_use]
    pub fn node_state(&self, i: usize) -> waitroom_common::state::GlobalState {
        self.nodes[i].running().node.rooms[0]
            .state
            .load()
            .as_ref()
            .clone()
    }

    /// Stops the aggregator (the nodes go on with what they last heard).
    pub fn stop_aggregator(&mut self) {
        if let (Some(runtime), Some(aggregator)) = (self.runtime.as_ref(), self.aggregator.take()) {
            runtime.block_on(aggregator.stop());
        }
    }

    /// The aggregator itself (its counters).
    #[must_use]
    pub fn aggregator(&self) -> &waitroom_aggregator::Aggregator {
        self.aggregator
            .as_ref()
            .expect("the aggregator runs until the cluster is dropped")
    }

    /// The aggregator's view at the cluster's time.
    #[must_use]
    pub fn status(&self) -> waitroom_common::cluster::Status {
        self.aggregator
            .as_ref()
            .expect("the aggregator runs until the cluster is dropped")
            .status(self.now())
    }
}

/// A visitor at `url` with `cookie` (none: a new visitor): whether the
/// origin's page was served (admitted) or the queue page, and the cookie to
/// come back with. Anything else (an error, a 5xx) fails the test.
#[must_use]
pub fn visit(url: &str, cookie: Option<&str>) -> (bool, Option<String>) {
    let mut request = crate::edge::client().get(url);
    if let Some(cookie) = cookie {
        request = request.header("Cookie", cookie);
    }
    let mut response = request.call().expect("the node answers");
    let status = response.status().as_u16();
    let fresh = response
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_owned());
    let body = response.body_mut().read_to_string().expect("a text body");
    assert_eq!(status, 200, "{body}");
    let admitted = body.contains(crate::edge::SITE);
    assert!(
        admitted || body.contains("queue") || body.contains("wait"),
        "neither the origin nor the queue: {body}"
    );
    // No new cookie: the one sent still holds.
    (admitted, fresh.or_else(|| cookie.map(str::to_owned)))
}

/// A new visitor at `url`: admitted or queued (see [`visit`]).
#[must_use]
pub fn visit_new(url: &str) -> bool {
    visit(url, None).0
}

impl Drop for InProcCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(running) = node.running.take() {
                running.stop();
            }
        }
        if let (Some(runtime), Some(aggregator)) = (self.runtime.as_ref(), self.aggregator.take()) {
            runtime.block_on(aggregator.stop());
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
