//! A node inside the test process on a driven clock, in front of the demo
//! origin on a runtime of its own. Tests of minute boundaries, session expiry
//! and the queue's flow move the clock themselves instead of sleeping through
//! real minutes; requests still go over loopback HTTP to the node's workers.
//!
//! After the clock moves, a room keeps the state computed at the old time
//! until the control thread refreshes it. [`InProcNode::advance`] asks for
//! that refresh and waits until every room's state was computed at the new
//! time (its `as_of`), so no test guesses with a sleep. The node has no
//! aggregator: with one, a room's state would be the aggregator's.
use std::{net::SocketAddr, time::Duration};

use anyhow::{Context as _, Result};
use waitroom_common::time::UnixMillis;
use waitroom_edge::{
    node::Node,
    start::{self, Options, Running},
};
use waitroom_runtime::clock::{Clock, ClockDriver};

use crate::procs::TempDir;

/// Where the driven clock starts: one second into a minute (a whole minute of
/// slots ahead) of a day in 2027.
pub const START: UnixMillis = UnixMillis(1_800_000_001_000);

/// How long a refresh may take before [`InProcNode::advance`] gives up.
const REFRESH_LIMIT: Duration = Duration::from_secs(10);

/// The demo origin and a node in front of it, both in this process.
#[derive(Debug)]
pub struct InProcNode {
    /// Where visitors connect.
    pub http: SocketAddr,
    /// The admin listener (metrics, status).
    pub admin: SocketAddr,
    /// The node; `None` only while dropping.
    running: Option<Running>,
    driver: ClockDriver,
    /// The clock the node reads (kept for a restart).
    clock: Clock,
    /// The node's config file (kept for a restart).
    config: std::path::PathBuf,
    /// Runs the demo origin; dropping it stops the origin.
    origin: Option<tokio::runtime::Runtime>,
    /// The config file and the counters; removed last.
    _dir: TempDir,
}

impl InProcNode {
    /// Starts the demo origin and a node with one room `shop` in front of it,
    /// the clock standing at [`START`]. `room` adds the room's keys (limits,
    /// session duration, refresh interval, queueing method).
    pub fn start(tag: &str, room: &str) -> Result<Self> {
        Self::start_with(tag, "", room)
    }

    /// As [`InProcNode::start`], with `node` added to the `[node]` table
    /// (limits of the request path, for instance).
    pub fn start_with(tag: &str, node: &str, room: &str) -> Result<Self> {
        let origin = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .context("starting the origin's runtime")?;
        let listener = origin
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .context("binding the demo origin")?;
        let origin_addr = listener.local_addr()?;
        origin.spawn(crate::demo_origin::serve_on(listener, Duration::ZERO));
        Self::start_before(tag, node, room, origin_addr, Some(origin))
    }

    /// As [`InProcNode::start`], in front of an origin the test runs itself.
    pub fn start_in_front_of(tag: &str, origin: SocketAddr, room: &str) -> Result<Self> {
        Self::start_before(tag, "", room, origin, None)
    }

    fn start_before(
        tag: &str,
        node: &str,
        room: &str,
        origin_addr: SocketAddr,
        origin: Option<tokio::runtime::Runtime>,
    ) -> Result<Self> {
        let dir = TempDir::new(tag);

        let path = dir.path().join("edge.toml");
        std::fs::write(
            &path,
            format!(
                r#"[node]
id = "inproc-node"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
workers = 1
counters_path = "{counters}"
{node}

[[rooms]]
id = "shop"
origin = "{origin_addr}"
{room}
"#,
                counters = dir.path().join("counters.shm").display()
            ),
        )?;
        let config = waitroom_edge::config::load(&path)?;
        let (clock, driver) = Clock::driven(START);
        let running = start::start(
            config,
            Options {
                clock: clock.clone(),
                signals_for: None,
                // Never in a test process: see `Options::drop_capabilities`.
                drop_capabilities: false,
            },
        )?;
        Ok(Self {
            http: running.addresses.http,
            admin: running
                .addresses
                .admin
                .context("the node has an admin listener")?,
            running: Some(running),
            driver,
            clock,
            config: path,
            origin,
            _dir: dir,
        })
    }

    /// Stops the node and starts it again on the same files (counters,
    /// ticket ledger, keys) and clock, as a restarted process would: the
    /// listeners are new (see [`InProcNode::http`]).
    pub fn restart(&mut self) -> Result<()> {
        if let Some(running) = self.running.take() {
            running.stop();
        }
        let config = waitroom_edge::config::load(&self.config)?;
        let running = start::start(
            config,
            Options {
                clock: self.clock.clone(),
                signals_for: None,
                drop_capabilities: false,
            },
        )?;
        self.http = running.addresses.http;
        self.admin = running
            .addresses
            .admin
            .context("the node has an admin listener")?;
        self.running = Some(running);
        self.wait_for_state(self.now());
        Ok(())
    }

    /// Rewrites the node's config file with `edit` and restarts the node
    /// on it: an operator's change of the room (as a reload would apply it),
    /// the counters, ledger and keys kept.
    pub fn reconfigure(&mut self, edit: impl FnOnce(&str) -> String) -> Result<()> {
        self.rewrite_config(edit)?;
        self.restart()
    }

    /// Rewrites the node's config file with `edit` and reloads it in the
    /// running node, as `SIGHUP` would: requests in flight go on.
    pub fn reload(&self, edit: impl FnOnce(&str) -> String) -> Result<Vec<String>> {
        self.rewrite_config(edit)?;
        Ok(self.node().reload(&self.config)?)
    }

    /// Rewrites the node's config file with `edit`, which must change it.
    fn rewrite_config(&self, edit: impl FnOnce(&str) -> String) -> Result<()> {
        let before = std::fs::read_to_string(&self.config)?;
        let after = edit(&before);
        anyhow::ensure!(after != before, "the edit changes the config");
        std::fs::write(&self.config, after)?;
        Ok(())
    }

    /// `http://NODE{path}`.
    #[must_use]
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    /// `http://ADMIN{path}`.
    #[must_use]
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    /// The node itself (its rooms' states, counters and metrics).
    #[must_use]
    pub fn node(&self) -> &Node {
        &self.running().node
    }

    /// The node's time.
    #[must_use]
    pub fn now(&self) -> UnixMillis {
        self.driver.now()
    }

    /// Moves the node's clock forward by `by` and returns once every room's
    /// state was computed at the new time.
    pub fn advance(&self, by: Duration) -> UnixMillis {
        let now = self.driver.advance(by);
        self.wait_for_state(now);
        now
    }

    /// Moves the clock to `secs` seconds into the next minute (see
    /// [`InProcNode::advance`]).
    pub fn advance_into_next_minute(&self, secs: u64) -> UnixMillis {
        let now = self.driver.now().0;
        let target = (now / 60_000 + 1) * 60_000 + secs * 1_000;
        self.advance(Duration::from_millis(target - now))
    }

    fn running(&self) -> &Running {
        self.running
            .as_ref()
            .expect("the node runs until the test drops it")
    }

    /// Asks for a refresh and waits until it has run at `now` or later.
    fn wait_for_state(&self, now: UnixMillis) {
        let running = self.running();
        running.refresh_states();
        let deadline = std::time::Instant::now() + REFRESH_LIMIT;
        while !running
            .node
            .rooms
            .iter()
            .all(|room| room.state.load().as_of >= now)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "no state refresh at {now:?} within {REFRESH_LIMIT:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for InProcNode {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            running.stop();
        }
        if let Some(origin) = self.origin.take() {
            origin.shutdown_background();
        }
    }
}
