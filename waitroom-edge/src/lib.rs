//! The waitroom node: what operators run on every edge server.
//!
//! # Layout
//! - [`config`]: the TOML file and its validation.
//! - [`http`]: per-core workers, listeners, and [`http::handler`], the request
//!   path read top to bottom (match room → open cookie → decide → proxy or queue).
//! - [`proxy`]: the pooled reverse proxy to the origin.
//! - [`upstream`]: origin pools, steering, health checks.
//! - [`metrics`], [`admin`]: what operators read.
//! - [`xdp`]: the embedded XDP program and its loader.
//! - [`demo_origin`]: a small origin for the demo and the tests.
//! - [`shutdown`]: stop accepting, drain, exit.
use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::Context as _;

pub mod admin;
pub mod aggregator;
pub mod clock;
pub mod config;
pub mod cookie;
pub mod counters;
pub mod demo_origin;
pub mod devcerts;
pub mod gossip;
pub mod http;
pub mod metrics;
pub mod proxy;
pub mod queue_page;
pub mod rooms;
pub mod shutdown;
pub mod stats;
pub mod tls;
pub mod upstream;
pub mod wire;
pub mod xdp;
pub mod xdp_signal;

pub use config::ConfigError;

/// Structured logs on stderr, filtered by `RUST_LOG` (default `info`): what
/// both binaries set up first.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// The whole validated configuration of a node.
#[derive(Debug, Clone)]
pub struct EdgeConfig {
    pub node: config::NodeSection,
    pub rooms: Vec<rooms::RoomSpec>,
    /// The `[aggregator]` table; without it the node is the whole world.
    pub aggregator: Option<gossip::GossipConfig>,
    /// The `[xdp]` table; without it the node runs without its XDP program.
    pub xdp: Option<xdp::XdpConfig>,
}

impl EdgeConfig {
    /// Parses and validates a configuration read from `path`.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            node: config::NodeSection,
            #[serde(default)]
            rooms: Vec<toml::Table>,
            #[serde(default)]
            aggregator: Option<gossip::GossipConfig>,
            #[serde(default)]
            xdp: Option<xdp::XdpConfig>,
        }
        let raw: Raw = toml::from_str(text).map_err(|source| ConfigError::Syntax {
            path: path.to_owned(),
            source: Box::new(source),
        })?;
        if raw.rooms.is_empty() {
            return Err(ConfigError::Field {
                path: path.to_owned(),
                field: "rooms".into(),
                problem: "at least one [[rooms]] table is required".into(),
            });
        }
        let mut rooms = Vec::with_capacity(raw.rooms.len());
        for (index, table) in raw.rooms.into_iter().enumerate() {
            let spec = rooms::RoomSpec::from_table(table).map_err(|e| ConfigError::Room {
                path: path.to_owned(),
                index,
                room: e.room,
                field: e.field,
                problem: e.problem,
            })?;
            if let Some(prev) = rooms.iter().position(|r: &rooms::RoomSpec| r.id == spec.id) {
                return Err(ConfigError::Room {
                    path: path.to_owned(),
                    index,
                    room: spec.id.clone(),
                    field: "id".into(),
                    problem: format!("duplicate room id (also rooms[{prev}])"),
                });
            }
            rooms.push(spec);
        }
        if let Some(gossip) = &raw.aggregator {
            gossip.validate().map_err(|e| ConfigError::Field {
                path: path.to_owned(),
                field: format!("aggregator.{}", e.field),
                problem: e.problem,
            })?;
        }
        Ok(Self {
            node: raw.node,
            rooms,
            aggregator: raw.aggregator,
            xdp: raw.xdp,
        })
    }
}

/// Request-path settings derived from the config, read by every worker.
#[derive(Debug, Clone)]
pub struct Settings {
    pub max_connections_per_worker: usize,
    pub header_read_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    pub shutdown_grace: Duration,
}

impl Settings {
    fn from_node(n: &config::NodeSection) -> Self {
        Self {
            max_connections_per_worker: n.max_connections_per_worker.max(1),
            header_read_timeout: Duration::from_millis(n.header_read_timeout_ms.max(1)),
            max_header_bytes: n.max_header_bytes,
            max_headers: n.max_headers,
            shutdown_grace: Duration::from_millis(n.shutdown_grace_ms),
        }
    }
}

/// One room at run time: its spec, the engine's room, its page and metrics.
#[derive(Debug)]
pub struct RoomRuntime {
    /// Where the room applies and where its origin is, as started (a change of
    /// these needs a restart; see [`Node::reload`]).
    pub spec: rooms::RoomSpec,
    /// What a reload (SIGHUP) may change while requests flow: limits, method,
    /// template, queue status. Loaded once per request.
    pub live: arc_swap::ArcSwap<RoomLive>,
    /// Name of this room's cookie.
    pub cookie_name: String,
    /// This room's slot in the node counters file.
    pub counters_slot: usize,
    pub metrics: metrics::RoomMetrics,
    /// The latest global state; the request path only loads it.
    pub state: arc_swap::ArcSwap<waitroom_common::state::GlobalState>,
    /// The room's origin pools and their health (shared with the checker).
    pub upstream: Arc<upstream::Upstream>,
}

/// The parts of a room a reload replaces.
#[derive(Debug)]
pub struct RoomLive {
    /// The engine's room: limits, queueing method, cookie attributes.
    pub engine: waitroom_common::room::Room,
    pub page: queue_page::QueuePage,
    /// HTTP status of the queue page.
    pub queue_status: u16,
}

impl RoomLive {
    fn from_spec(spec: &rooms::RoomSpec) -> anyhow::Result<Self> {
        let page = match &spec.queue_page {
            Some(path) => {
                let source = std::fs::read_to_string(path).with_context(|| {
                    format!("room {}: reading queue_page {}", spec.id, path.display())
                })?;
                queue_page::QueuePage::from_source(&path.display().to_string(), source)?
            }
            None => queue_page::QueuePage::builtin(),
        };
        Ok(Self {
            engine: spec.engine.clone(),
            page,
            queue_status: spec.queue_status,
        })
    }
}

/// Everything the workers share: settings, rooms, counters, keys, metrics.
#[derive(Debug)]
pub struct Node {
    pub settings: Settings,
    pub routes: rooms::RoomTable,
    pub rooms: Vec<RoomRuntime>,
    pub counters: counters::SharedCounters,
    /// Cookie keys; a reload may rotate them.
    pub keys: arc_swap::ArcSwap<cookie::CookieKeys>,
    pub metrics: metrics::NodeMetrics,
    pub id: String,
    pub colo: String,
    /// The gossip client, once started (`[aggregator]` configured).
    pub gossip: std::sync::OnceLock<gossip::GossipHandle>,
    /// The attached XDP program (admin deny list, detached on shutdown).
    pub xdp: parking_lot::Mutex<Option<Arc<xdp::XdpGuard>>>,
    /// Its telemetry, read every second off the request path.
    pub xdp_telemetry: std::sync::OnceLock<xdp_signal::Telemetry>,
    /// Trust and server names for `tls = true` origin pools.
    pub origin_tls: upstream::tls::OriginTls,
}

impl Node {
    pub fn new(config: &EdgeConfig) -> anyhow::Result<Self> {
        let ids: Vec<_> = config.rooms.iter().map(|r| r.engine.id()).collect();
        let counters = counters::SharedCounters::open(&config.node.counters_path, &ids)?;
        let keys = load_keys(&config.node)?;
        let now = clock::now();
        let mut rooms = Vec::with_capacity(config.rooms.len());
        for spec in &config.rooms {
            rooms.push(RoomRuntime {
                cookie_name: cookie::cookie_name(&spec.id),
                counters_slot: counters
                    .slot_of(spec.engine.id())
                    .expect("SharedCounters::open assigned every configured room"),
                live: arc_swap::ArcSwap::from_pointee(RoomLive::from_spec(spec)?),
                spec: spec.clone(),
                metrics: metrics::RoomMetrics::default(),
                state: arc_swap::ArcSwap::from_pointee(waitroom_common::state::GlobalState::empty(
                    now,
                )),
                upstream: Arc::new(upstream::Upstream::new(&spec.id, &spec.upstream)),
            });
        }
        Ok(Self {
            settings: Settings::from_node(&config.node),
            routes: rooms::RoomTable::new(&config.rooms),
            rooms,
            counters,
            keys: arc_swap::ArcSwap::from_pointee(keys),
            metrics: metrics::NodeMetrics::default(),
            id: config.node.id.clone(),
            colo: config.node.colo.clone(),
            gossip: std::sync::OnceLock::new(),
            xdp: parking_lot::Mutex::new(None),
            xdp_telemetry: std::sync::OnceLock::new(),
            origin_tls: upstream::tls::OriginTls::new(
                config.rooms.iter().map(|r| (r.id.as_str(), &r.upstream)),
            )?,
        })
    }

    /// The counters of room `index` (claimed at start, so always there).
    pub fn room_counters(&self, index: usize) -> &waitroom_common::counters::RoomCounters {
        self.counters.slot(self.rooms[index].counters_slot)
    }

    /// Recomputes every room's state: from the gossiped world when an
    /// aggregator is configured, else from this node's own counters.
    pub fn refresh_states(&self, rates: &mut [waitroom_common::state::AdmitRate]) {
        match self.gossip.get() {
            Some(gossip) => self.refresh_from_world(&gossip.world, rates),
            None => self.refresh_standalone(rates),
        }
    }

    /// Recomputes every room's state from the gossiped world: the aggregator's
    /// answer while it is fresh, else the local-only state (this node's last
    /// known share of the limits; the whole room if no answer ever came).
    pub fn refresh_from_world(
        &self,
        world: &gossip::WorldView,
        rates: &mut [waitroom_common::state::AdmitRate],
    ) {
        let now = clock::now();
        let fresh = world.freshness(now).is_fresh();
        let current = world.load();
        for (i, room) in self.rooms.iter().enumerate() {
            let view = current.room(room.spec.engine.id());
            match view {
                Some(view) if fresh => room.state.store(Arc::clone(&view.state)),
                _ => room.state.store(Arc::new(gossip::world::local_only_state(
                    &room.live.load().engine,
                    self.room_counters(i),
                    &mut rates[i],
                    view.and_then(|v| v.share),
                    now,
                ))),
            }
        }
    }

    /// Recomputes every room's state from this node's own counters: the node as
    /// the whole world (no aggregator).
    pub fn refresh_standalone(&self, rates: &mut [waitroom_common::state::AdmitRate]) {
        let now = clock::now();
        for (i, room) in self.rooms.iter().enumerate() {
            let state = waitroom_common::state::GlobalState::standalone(
                &room.live.load().engine,
                self.room_counters(i),
                &mut rates[i],
                now,
            );
            room.state.store(Arc::new(state));
        }
    }
}

/// Why a reload was refused (the old configuration stays in force).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{path}: rooms changed ({what}); adding, removing or re-routing rooms needs a restart")]
    Rooms { path: PathBuf, what: String },
    #[error("{path}: {source:#}")]
    Room {
        path: PathBuf,
        source: anyhow::Error,
    },
}

impl Node {
    /// Applies a new configuration read from `path` to the running node: room
    /// limits, queueing methods, templates, queue status and cookie keys change
    /// at once; connections, counters and visitors' tickets are untouched.
    ///
    /// Anything invalid refuses the whole reload, naming the file and field, and
    /// the old configuration stays. Changes that need new sockets or routes
    /// (listeners, rooms added, removed or re-routed, origins) are refused too:
    /// those need a restart, which keeps counters and cookies as well.
    pub fn reload(&self, path: &Path) -> Result<Vec<String>, ReloadError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let new = EdgeConfig::parse(path, &text)?;
        if new.rooms.len() != self.rooms.len() {
            return Err(ReloadError::Rooms {
                path: path.to_owned(),
                what: format!("{} rooms instead of {}", new.rooms.len(), self.rooms.len()),
            });
        }
        let mut lives = Vec::with_capacity(new.rooms.len());
        for (old, spec) in self.rooms.iter().zip(&new.rooms) {
            let o = &old.spec;
            if o.id != spec.id
                || o.host != spec.host
                || o.path != spec.path
                || o.upstream != spec.upstream
            {
                return Err(ReloadError::Rooms {
                    path: path.to_owned(),
                    what: format!("room {} (id, host, path or origins)", spec.id),
                });
            }
            lives.push(
                RoomLive::from_spec(spec).map_err(|source| ReloadError::Room {
                    path: path.to_owned(),
                    source,
                })?,
            );
        }
        let keys = if new.node.cookie_keys.is_empty() {
            None
        } else {
            Some(load_keys(&new.node).map_err(|source| ReloadError::Room {
                path: path.to_owned(),
                source,
            })?)
        };
        // Everything is valid: apply.
        let mut changes = Vec::new();
        for (room, live) in self.rooms.iter().zip(lives) {
            let before = room.live.load();
            if before.engine.config() != live.engine.config() {
                changes.push(format!("room {}: limits or method", room.spec.id));
            }
            room.live.store(Arc::new(live));
        }
        if let Some(keys) = keys {
            changes.push(format!("cookie keys: {keys:?}"));
            self.keys.store(Arc::new(keys));
        }
        Ok(changes)
    }
}

/// Cookie keys from the config, or else a key kept beside the counters file
/// (created on first start, so cookies survive restarts of a single node).
fn load_keys(node: &config::NodeSection) -> anyhow::Result<cookie::CookieKeys> {
    if !node.cookie_keys.is_empty() {
        let pairs: Vec<(u8, &str)> = node
            .cookie_keys
            .iter()
            .map(|k| (k.id, k.secret_hex.as_str()))
            .collect();
        return Ok(cookie::CookieKeys::from_hex(&pairs)?);
    }
    let path = node.counters_path.with_extension("cookie-key");
    let secret: [u8; 32] = match std::fs::read(&path) {
        Ok(bytes) if bytes.len() == 32 => bytes.try_into().unwrap_or([0; 32]),
        _ => {
            let secret: [u8; 32] = rand::random();
            write_private(&path, &secret)
                .with_context(|| format!("writing the cookie key {}", path.display()))?;
            tracing::info!(file = %path.display(), "created a cookie key (set node.cookie_keys to share keys between nodes)");
            secret
        }
    };
    Ok(cookie::CookieKeys::new(&[(0, secret)])?)
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _};
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(tmp, path)
}

/// Runs a node until SIGTERM or SIGINT; returns after draining. SIGHUP re-reads
/// `config_path` (see [`Node::reload`]).
pub fn run(config: EdgeConfig, config_path: &Path) -> anyhow::Result<()> {
    let node = Arc::new(Node::new(&config)?);
    let (trigger, shutdown) = shutdown::channel();

    let plain = http::ListenerSpec {
        addr: config.node.listen,
        tls: None,
    };
    let (first, plain) = http::resolve(&plain)
        .with_context(|| format!("binding node.listen {}", config.node.listen))?;
    let workers = if config.node.workers == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        config.node.workers
    };
    let mut listeners = vec![(first, plain.clone())];
    let mut https_addr = None;
    if let Some(tls) = &config.node.tls {
        let server = tls::https_server_config(&tls.cert, &tls.key).with_context(|| {
            format!(
                "node.tls: loading {} and {}",
                tls.cert.display(),
                tls.key.display()
            )
        })?;
        let spec = http::ListenerSpec {
            addr: tls.listen,
            tls: Some(tokio_rustls::TlsAcceptor::from(Arc::new(server))),
        };
        let (first, spec) = http::resolve(&spec)
            .with_context(|| format!("binding node.tls.listen {}", tls.listen))?;
        https_addr = Some(spec.addr);
        listeners.push((first, spec));
    }

    // The control runtime: signals, admin listener, background tasks. Small and
    // separate, so nothing on it can delay a request.
    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the control runtime")?;
    // The XDP program sees every packet first; without it (not root, no BPF)
    // the node serves on with userspace telemetry, saying so once.
    if let Some(xdp_config) = &config.xdp {
        match xdp::XdpGuard::attach(xdp_config) {
            Ok(guard) => {
                let guard = Arc::new(guard);
                tracing::info!(interface = %xdp_config.interface, mode = ?guard.attach_mode(), "XDP program attached");
                let rx = control.block_on(async {
                    xdp::spawn_telemetry(Arc::clone(&guard), Duration::from_secs(1))
                });
                let _ = node.xdp_telemetry.set(xdp_signal::Telemetry::new(rx));
                *node.xdp.lock() = Some(guard);
            }
            Err(err) => tracing::warn!(
                %err,
                interface = %xdp_config.interface,
                "XDP program not attached; serving on with userspace telemetry (distinct visitors counted from tickets)"
            ),
        }
    }
    // Gossip with the aggregator, when configured: reports every interval,
    // answers land in a WorldView that the refresh loop below reads.
    if let Some(gossip_config) = &config.aggregator {
        let reporter_node = Arc::clone(&node);
        let reporter = move |now| {
            let traffic = reporter_node
                .xdp_telemetry
                .get()
                .filter(|_| reporter_node.rooms.len() == 1)
                .map(|t| t as &dyn gossip::TrafficSignal);
            (0..reporter_node.rooms.len())
                .map(|i| gossip::room_report(reporter_node.room_counters(i), now, traffic))
                .collect::<Vec<_>>()
        };
        let identity = gossip::NodeIdentity {
            node: node.id.clone(),
            colo: node.colo.clone(),
        };
        let handle = gossip::spawn(
            control.handle(),
            gossip_config.clone(),
            identity,
            Arc::new(upstream::status::WithPools {
                rooms: reporter,
                upstreams: node.rooms.iter().map(|r| Arc::clone(&r.upstream)).collect(),
            }),
            shutdown.clone(),
        )
        .context("starting gossip with the aggregator")?;
        let _ = node.gossip.set(handle);
    }
    // The rooms' states, refreshed often: from the gossiped world, or with no
    // aggregator the node's own counters as the whole world.
    {
        let node = Arc::clone(&node);
        let mut shutdown = shutdown.clone();
        let mut rates = vec![waitroom_common::state::AdmitRate::default(); node.rooms.len()];
        node.refresh_states(&mut rates);
        control.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            let world = node.gossip.get().map(|g| Arc::clone(&g.world));
            let changed = async || match &world {
                Some(world) => world.changed().await,
                None => std::future::pending().await,
            };
            loop {
                tokio::select! {
                    _ = tick.tick() => node.refresh_states(&mut rates),
                    () = changed() => node.refresh_states(&mut rates),
                    () = shutdown.requested() => return,
                }
            }
        });
    }
    // Health checks of the rooms' origins, into the pool state workers read.
    upstream::health::spawn(
        control.handle(),
        &node
            .rooms
            .iter()
            .map(|r| Arc::clone(&r.upstream))
            .collect::<Vec<_>>(),
        node.origin_tls.connector(Duration::from_secs(3)),
        &shutdown,
    );
    let admin_addr = match config.node.admin_listen {
        Some(addr) => {
            let listener = control
                .block_on(tokio::net::TcpListener::bind(addr))
                .with_context(|| format!("binding node.admin_listen {addr}"))?;
            let bound = listener.local_addr()?;
            control.spawn(admin::serve(listener, Arc::clone(&node), shutdown.clone()));
            Some(bound)
        }
        None => None,
    };

    let handles = http::spawn_workers(workers, Arc::clone(&node), listeners, shutdown.clone())
        .context("starting worker threads")?;
    // One machine-readable line that tests and scripts wait for.
    println!(
        "waitroom-edge ready: http={} https={} admin={} workers={workers}",
        plain.addr,
        https_addr.map_or_else(|| "-".to_owned(), |a| a.to_string()),
        admin_addr.map_or_else(|| "-".to_owned(), |a| a.to_string()),
    );
    tracing::info!(http = %plain.addr, workers, "node serving");
    systemd::ready(&control);

    // SIGHUP: re-read the config; a bad one is refused and the old one stays.
    {
        let node = Arc::clone(&node);
        let path = config_path.to_owned();
        let mut shutdown = shutdown.clone();
        control.spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let Ok(mut hup) = signal(SignalKind::hangup()) else {
                tracing::error!("cannot listen for SIGHUP; reloads will not work");
                return;
            };
            loop {
                tokio::select! {
                    _ = hup.recv() => match node.reload(&path) {
                        Ok(changes) => tracing::info!(file = %path.display(), ?changes, "configuration reloaded"),
                        Err(err) => tracing::error!(
                            "reload refused, the old configuration stays in force: {err}"
                        ),
                    },
                    () = shutdown.requested() => return,
                }
            }
        });
    }

    control.block_on(async {
        wait_for_signal().await;
        tracing::info!("stopping: no new connections, draining in-flight requests");
        systemd::stopping();
        trigger.fire();
    });
    for h in handles {
        let _ = h.join();
    }
    // Background tasks end with their runtime; then the XDP program is detached.
    drop(control);
    drop(node.xdp.lock().take());
    tracing::info!("stopped");
    Ok(())
}

/// systemd's notify protocol: READY once serving, watchdog keep-alives while
/// the control runtime runs, STOPPING on the way out. Without systemd
/// (`NOTIFY_SOCKET` unset) these do nothing.
mod systemd {
    use std::time::Duration;

    pub fn ready(control: &tokio::runtime::Runtime) {
        if let Err(err) = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]) {
            tracing::warn!(%err, "could not notify systemd");
        }
        let mut usec = 0;
        if sd_notify::watchdog_enabled(false, &mut usec) && usec > 0 {
            let every = Duration::from_micros(usec / 2);
            control.spawn(async move {
                let mut tick = tokio::time::interval(every);
                loop {
                    tick.tick().await;
                    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Watchdog]);
                }
            });
        }
    }

    pub fn stopping() {
        let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(err) => {
            tracing::error!(%err, "cannot listen for SIGTERM");
            return std::future::pending().await;
        }
    };
    let mut int = match signal(SignalKind::interrupt()) {
        Ok(s) => s,
        Err(err) => {
            tracing::error!(%err, "cannot listen for SIGINT");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
