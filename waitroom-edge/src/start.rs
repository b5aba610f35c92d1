//! Start-up as named steps, and the running node's lifetime.
//!
//! [`start`] goes: bind the listeners (every worker's, and the admin
//! listener's) → make the state directory private → open the counters → load
//! the cookie keys → build the rooms → attach XDP → drop the capabilities no
//! longer needed (the binary only) → start gossip → make the [`Node`] → start
//! the control tasks (state refresh, health checks, admin, signals) → start
//! the workers. Each step names what failed.
//! [`run`] is what the binary calls: start, say ready, wait for SIGTERM, drain.
//!
//! Everything that needs a capability (binding ports below 1024, loading and
//! attaching XDP) happens before the drop, and the drop happens while the
//! starting thread is the only one: capabilities are per thread, and a thread
//! inherits its creator's.
use std::{net::SocketAddr, path::PathBuf, sync::Arc, thread::JoinHandle, time::Duration};

use anyhow::Context as _;
use waitroom_common::{aggregate::RoomReport, state::AdmitRate, time::UnixMillis};
use waitroom_runtime::{
    clock::Clock,
    shutdown::{self, Shutdown, Trigger},
    signals, systemd, tls,
};

use crate::{
    admin,
    config::EdgeConfig,
    counters::SharedCounters,
    gossip::{self, GossipHandle},
    http::{self, ListenerSpec},
    keys,
    node::{Node, NodeParts, NodeXdp, RoomRuntime},
    state_dir, upstream, xdp, xdp_signal,
};

/// How a node is started besides its configuration.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Where time is read: the system clock in production, a driven clock in
    /// tests of minute boundaries and session expiry.
    pub clock: Clock,
    /// The file SIGHUP re-reads; `None`: no signal handling at all (a node
    /// inside a test process is stopped with [`Running::stop`]).
    pub signals_for: Option<PathBuf>,
    /// Drop every capability not needed after XDP is attached
    /// ([`xdp::privileges`]). Only the binary does: capabilities are per
    /// thread, and a test process dropping them would fail its later
    /// privileged tests.
    pub drop_capabilities: bool,
}

/// Where a started node listens.
#[derive(Debug, Clone, Copy)]
pub struct Addresses {
    pub http: SocketAddr,
    pub https: Option<SocketAddr>,
    pub admin: Option<SocketAddr>,
}

/// A started node: its workers and control thread run until shutdown.
#[derive(Debug)]
pub struct Running {
    pub node: Arc<Node>,
    pub addresses: Addresses,
    pub workers: usize,
    trigger: Trigger,
    /// Wakes the state refresh at once (see [`Running::refresh_states`]).
    refresh: Arc<tokio::sync::Notify>,
    /// Spawns onto the control runtime (run by `control`).
    control_handle: tokio::runtime::Handle,
    control: JoinHandle<()>,
    worker_threads: Vec<JoinHandle<()>>,
}

impl Running {
    /// Asks the node to stop: no new connections, in-flight requests drain.
    pub fn trigger(&self) -> Trigger {
        self.trigger.clone()
    }

    /// Waits until shutdown was requested (by a signal or [`Running::trigger`])
    /// and every worker has drained; then stops the background tasks and
    /// detaches the XDP program.
    pub fn wait(self) {
        for h in self.worker_threads {
            let _ = h.join();
        }
        // The workers are done: what they queued is written before the exit.
        self.node.access_log.finish();
        let _ = self.control.join();
        // The last reference to the node holds the XDP program: dropping it
        // detaches the program from the interface.
        if Arc::into_inner(self.node).is_none() {
            tracing::warn!("node still referenced after shutdown; XDP detaches at exit");
        }
        tracing::info!("stopped");
    }

    /// Asks the control thread to recompute every room's state now instead
    /// of at its next tick: a test that moved a driven clock wants the new
    /// minute's state before its next request. Returns at once; the state
    /// is stored moments later, with `as_of` at the clock's new time.
    pub fn refresh_states(&self) {
        self.refresh.notify_one();
    }

    /// Stops the node and waits for it (tests and embedders).
    pub fn stop(self) {
        self.trigger.fire();
        self.wait();
    }
}

/// Runs a node until SIGTERM or SIGINT; returns after draining. SIGHUP
/// re-reads `config_path` (see [`Node::reload`]).
pub fn run(config: EdgeConfig, config_path: &std::path::Path) -> anyhow::Result<()> {
    let running = start(
        config,
        Options {
            clock: Clock::system(),
            signals_for: Some(config_path.to_owned()),
            drop_capabilities: true,
        },
    )?;
    let a = running.addresses;
    // One machine-readable line that tests and scripts wait for.
    println!(
        "waitroom-edge ready: http={} https={} admin={} workers={}",
        a.http,
        a.https.map_or_else(|| "-".to_owned(), |a| a.to_string()),
        a.admin.map_or_else(|| "-".to_owned(), |a| a.to_string()),
        running.workers,
    );
    tracing::info!(http = %a.http, workers = running.workers, "node serving");
    systemd::ready(&running.control_handle);
    running.wait();
    Ok(())
}

/// Starts a node: see the module docs for the steps.
pub fn start(config: EdgeConfig, options: Options) -> anyhow::Result<Running> {
    // A node that gossips counts on the cluster's time: its home's clock,
    // carried forward on the monotonic clock (see `Clock::following`).
    let clock = if config.aggregator.is_some() {
        options.clock.following()
    } else {
        options.clock
    };
    let (listeners, mut addresses, https_cert) = bind_listeners(&config)?;
    let workers = match config.node.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let worker_sockets =
        http::bind_for_workers(workers, listeners).context("binding the workers' listeners")?;
    let admin_listener = match config.node.admin_listen {
        Some(addr) => {
            let listener =
                bind_admin(addr).with_context(|| format!("binding node.admin_listen {addr}"))?;
            addresses.admin = Some(listener.local_addr()?);
            Some(listener)
        }
        None => None,
    };
    let admin_auth = admin::AdminAuth::load(&config.node)?;
    let state_dir = config.node.state_dir();
    state_dir::prepare(&state_dir).context("node.state_dir")?;
    let counters_file = config.node.counters_file();
    let counters = Arc::new(
        SharedCounters::open(
            &counters_file,
            &config
                .rooms
                .iter()
                .map(|r| r.engine.id())
                .collect::<Vec<_>>(),
        )
        .with_context(|| {
            format!(
                "opening the node counters {} (node.counters_path)",
                counters_file.display()
            )
        })?,
    );
    let ledger_file = config.node.ticket_ledger_file();
    let ledger = Arc::new(
        crate::ledger::SharedLedger::open(&ledger_file, config.node.ticket_ledger_entries)
            .with_context(|| {
                format!(
                    "opening the ticket ledger {} (node.ticket_ledger_entries)",
                    ledger_file.display()
                )
            })?,
    );
    let keys = keys::load(&config.node)?;
    let rooms = RoomRuntime::build_all(&config, &counters, &clock)?;
    let access_log = crate::access_log::AccessLog::start(
        config.node.access_log.as_ref(),
        workers,
        config.rooms.iter().map(|r| r.id.clone()).collect(),
    )?;

    // The control runtime: signals, admin listener, background tasks. Small and
    // separate, so nothing on it can delay a request.
    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the control runtime")?;
    let (trigger, shutdown) = shutdown::channel();
    let xdp = attach_xdp(&config, &control);
    if options.drop_capabilities {
        drop_capabilities(xdp.as_ref());
    }
    let gossip = start_gossip(
        &config, &control, &counters, &rooms, &xdp, &clock, &shutdown,
    )?;
    // Without an aggregator the node is its own source of room settings:
    // its control API keeps versions in the state directory.
    let settings_store = match &config.aggregator {
        Some(_) => None,
        None => Some(Arc::new(parking_lot::Mutex::new(
            waitroom_runtime::control::SettingsStore::open(
                config.tables.clone(),
                &state_dir.join("room-settings.json"),
                &state_dir.join("audit.jsonl"),
                clock.now().0,
            )
            .context("node.state_dir: the room settings")?,
        ))),
    };
    let node = Arc::new(Node::new(
        &config,
        NodeParts {
            counters,
            ledger,
            keys,
            rooms,
            clock,
            gossip,
            xdp,
            https_cert,
            access_log,
            settings_store,
        },
    )?);
    // Before the first request: the room settings of the last run (the
    // aggregator's last push, or this node's own API changes).
    match &node.reloads.store {
        None => node.restore_pushed(),
        Some(store) => {
            let settings = store.lock().current().clone();
            node.apply_settings(&settings)
                .context("the room settings kept in node.state_dir (room-settings.json)")?;
        }
    }

    let refresh = Arc::new(tokio::sync::Notify::new());
    spawn_state_refresh(&control, &node, &refresh, &shutdown);
    upstream::health::spawn(
        control.handle(),
        &node
            .rooms
            .iter()
            .map(|r| Arc::clone(&r.upstream))
            .chain(node.unrouted.origin.clone())
            .collect::<Vec<_>>(),
        node.origin_tls.connector(Duration::from_secs(3)),
        &shutdown,
    );
    if let Some(listener) = admin_listener {
        let listener = {
            let _runtime = control.enter();
            tokio::net::TcpListener::from_std(listener).context("registering the admin listener")?
        };
        let control_api = admin::control_api(&node, &admin_auth);
        control.spawn(admin::serve(
            listener,
            Arc::clone(&node),
            admin_auth,
            control_api,
            shutdown.clone(),
        ));
        // Only the admin listener shows the history: no listener, no samples.
        control.spawn(crate::dashboard::sample(
            Arc::clone(&node),
            shutdown.clone(),
        ));
    }
    if let Some(path) = options.signals_for {
        spawn_signal_handlers(&control, &node, path, &trigger, &shutdown)?;
    }

    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let worker_threads = http::spawn_workers(&node, worker_sockets, &shutdown, &ready_tx)
        .context("starting worker threads")?;
    drop(ready_tx);
    if let Err(err) = wait_for_workers(&worker_threads, &ready_rx) {
        // No ready line and a non-zero exit: a node with a dead worker
        // would look up while dropping a share of its connections.
        trigger.fire();
        for h in worker_threads {
            let _ = h.join();
        }
        return Err(err);
    }

    let control_handle = control.handle().clone();
    let control = {
        let mut shutdown = shutdown.clone();
        std::thread::Builder::new()
            .name("waitroom-control".into())
            .spawn(move || control.block_on(shutdown.requested()))
            .context("starting the control thread")?
    };
    Ok(Running {
        node,
        addresses,
        workers,
        trigger,
        refresh,
        control_handle,
        control,
        worker_threads,
    })
}

/// Waits until every worker said it started; fails on the first that could
/// not, or that died (a panic) before saying so, or after 10 s.
fn wait_for_workers(
    threads: &[JoinHandle<()>],
    ready: &std::sync::mpsc::Receiver<Result<(), String>>,
) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut started = 0;
    while started < threads.len() {
        match ready.recv_timeout(Duration::from_millis(50)) {
            Ok(Ok(())) => started += 1,
            Ok(Err(err)) => anyhow::bail!("{err}"),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let dead = threads.iter().filter(|t| t.is_finished()).count();
                if dead > 0 {
                    anyhow::bail!("{dead} worker thread(s) ended while starting (see the log)");
                }
                if std::time::Instant::now() > deadline {
                    anyhow::bail!(
                        "only {started} of {} workers started within 10 s",
                        threads.len()
                    );
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                anyhow::bail!("workers ended while starting (see the log)")
            }
        }
    }
    Ok(())
}

/// Binds the plain listener and, with `[node.tls]`, the TLS one; port 0 is
/// resolved once so every worker binds the same address.
#[expect(clippy::type_complexity, reason = "one private call site")]
fn bind_listeners(
    config: &EdgeConfig,
) -> anyhow::Result<(
    Vec<(std::net::TcpListener, ListenerSpec)>,
    Addresses,
    Option<Arc<tls::CertSwap>>,
)> {
    let plain = ListenerSpec {
        addr: config.node.listen,
        tls: None,
        proxy_protocol: config.node.proxy_protocol,
    };
    let (first, plain) = http::resolve(&plain)
        .with_context(|| format!("binding node.listen {}", config.node.listen))?;
    let mut addresses = Addresses {
        http: plain.addr,
        https: None,
        admin: None,
    };
    let mut listeners = vec![(first, plain)];
    let mut https_cert = None;
    if let Some(tls) = &config.node.tls {
        let (server, cert) = tls::https_server_config(&tls.cert, &tls.key).with_context(|| {
            format!(
                "node.tls: loading {} and {}",
                tls.cert.display(),
                tls.key.display()
            )
        })?;
        let spec = ListenerSpec {
            addr: tls.listen,
            tls: Some(tokio_rustls::TlsAcceptor::from(Arc::new(server))),
            proxy_protocol: tls.proxy_protocol,
        };
        let (first, spec) = http::resolve(&spec)
            .with_context(|| format!("binding node.tls.listen {}", tls.listen))?;
        addresses.https = Some(spec.addr);
        listeners.push((first, spec));
        https_cert = Some(cert);
    }
    Ok((listeners, addresses, https_cert))
}

/// The admin listener, bound as `tokio::net::TcpListener::bind` would
/// (`SO_REUSEADDR`: a restarted node gets its port back while the old
/// connections sit in TIME_WAIT) but now, before capabilities are dropped.
fn bind_admin(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// The XDP program sees every packet first; without it (no BPF, no
/// capability, an interface that is not there) the node serves on with
/// userspace telemetry, saying so once.
fn attach_xdp(config: &EdgeConfig, control: &tokio::runtime::Runtime) -> Option<NodeXdp> {
    let xdp_config = config.xdp.as_ref()?;
    // A capability the unit grants but the system dropped (an old systemd,
    // a container) is said at start, by name, before anything fails.
    if let Some(missing) = xdp::missing_capabilities() {
        tracing::warn!(%missing, "XDP is configured but this process lacks capabilities it needs");
    }
    match xdp::XdpGuard::attach(xdp_config) {
        Ok(guard) => {
            let guard = Arc::new(guard);
            tracing::info!(interface = %xdp_config.interface, mode = ?guard.attach_mode(), "XDP program attached");
            // What the admin listener denied before the restart, back again.
            let deny_file = config.node.state_dir().join(xdp::deny_file::DENY_FILE);
            for prefix in xdp::deny_file::load(&deny_file) {
                match guard.deny(prefix) {
                    Ok(()) => tracing::info!(%prefix, "persisted deny entry applied"),
                    Err(err) => tracing::warn!(%prefix, %err, "persisted deny entry not applied"),
                }
            }
            let rx = control.block_on(async {
                xdp::spawn_telemetry(Arc::clone(&guard), Duration::from_secs(1))
            });
            Some(NodeXdp {
                guard,
                telemetry: Arc::new(xdp_signal::Telemetry::new(rx)),
                deny_file,
            })
        }
        Err(err) => {
            tracing::warn!(
                %err,
                interface = %xdp_config.interface,
                "XDP program not attached; serving on with userspace telemetry (distinct visitors counted from tickets)"
            );
            None
        }
    }
}

/// Drops the capabilities the running node does not need (see
/// [`xdp::privileges`]), saying in one line what it kept and dropped. A
/// failure keeps the node serving with what it had, and says so.
fn drop_capabilities(xdp: Option<&NodeXdp>) {
    match xdp::privileges::drop_unneeded(xdp.map(|x| &*x.guard)) {
        Ok(outcome) => outcome.log(),
        Err(err) => tracing::warn!(%err, "capabilities not dropped; serving on with them"),
    }
}

/// This node's counts for the aggregator, read from the shared counters on
/// the control runtime (never on the request path).
#[derive(Debug)]
struct CountersReporter {
    counters: Arc<SharedCounters>,
    /// Each room's slot in `counters`, in room order.
    slots: Vec<usize>,
    /// The XDP program's distinct-source sketch. It sees the node, not the
    /// room, so it only stands for a room's traffic on a single-room node.
    traffic: Option<Arc<xdp_signal::Telemetry>>,
}

impl gossip::Reporter for CountersReporter {
    fn report(&self, now: UnixMillis) -> Vec<RoomReport> {
        let traffic = self
            .traffic
            .as_deref()
            .filter(|_| self.slots.len() == 1)
            .map(|t| t as &dyn gossip::TrafficSignal);
        self.slots
            .iter()
            .map(|&slot| gossip::room_report(self.counters.slot(slot), now, traffic))
            .collect()
    }

    fn held_visitors(&self, now: UnixMillis) -> Vec<waitroom_common::wire::HeldVisitors> {
        self.slots
            .iter()
            .filter_map(|&slot| {
                let counters = self.counters.slot(slot);
                let visitors = gossip::held_now(counters, now);
                (visitors > 0).then(|| waitroom_common::wire::HeldVisitors {
                    room: counters.room().unwrap_or_default(),
                    visitors,
                })
            })
            .collect()
    }
}

/// Gossip with the aggregator, when `[aggregator]` is configured: reports
/// every interval, answers land in a `WorldView` that the refresh loop reads.
fn start_gossip(
    config: &EdgeConfig,
    control: &tokio::runtime::Runtime,
    counters: &Arc<SharedCounters>,
    rooms: &[RoomRuntime],
    xdp: &Option<NodeXdp>,
    clock: &Clock,
    shutdown: &Shutdown,
) -> anyhow::Result<Option<GossipHandle>> {
    let Some(gossip_config) = &config.aggregator else {
        return Ok(None);
    };
    let reporter = CountersReporter {
        counters: Arc::clone(counters),
        slots: rooms.iter().map(|r| r.counters_slot).collect(),
        traffic: xdp.as_ref().map(|x| Arc::clone(&x.telemetry)),
    };
    let identity = gossip::NodeIdentity {
        node: config.node.id.clone(),
        colo: config.node.colo.clone(),
    };
    let handle = gossip::spawn(
        control.handle(),
        gossip_config.clone(),
        identity,
        Arc::new(upstream::status::WithPools {
            rooms: reporter,
            upstreams: rooms.iter().map(|r| Arc::clone(&r.upstream)).collect(),
        }),
        clock.clone(),
        shutdown.clone(),
    )
    .context("starting gossip with the aggregator")?;
    Ok(Some(handle))
}

/// The rooms' states, refreshed often: from the gossiped world, or with no
/// aggregator the node's own counters as the whole world. `now` asks for a
/// refresh out of turn.
fn spawn_state_refresh(
    control: &tokio::runtime::Runtime,
    node: &Arc<Node>,
    now: &Arc<tokio::sync::Notify>,
    shutdown: &Shutdown,
) {
    let node = Arc::clone(node);
    let now = Arc::clone(now);
    let mut shutdown = shutdown.clone();
    let mut rates = vec![AdmitRate::default(); node.rooms.len()];
    let mut prefetch = vec![None; node.rooms.len()];
    node.refresh_states(&mut rates);
    control.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        // Shares are kept across restarts, written while the world is fresh.
        let mut keep_shares = tokio::time::interval(Duration::from_secs(5));
        keep_shares.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let world = node.gossip.as_ref().map(|g| Arc::clone(&g.world));
        let changed = async || match &world {
            Some(world) => world.changed().await,
            None => std::future::pending().await,
        };
        let mut truncation_told = false;
        let mut ledger_truncation_told = false;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    node.refresh_states(&mut rates);
                    node.prefetch_lease(&mut prefetch);
                    if !truncation_told && node.counters.truncated() {
                        truncation_told = true;
                        tracing::error!(
                            file = node.counters.path(),
                            "the counters file was truncated underneath the node; serving on with counts in memory from zero (restart to keep them in a file again)"
                        );
                    }
                    if !ledger_truncation_told && node.ledger.truncated() {
                        ledger_truncation_told = true;
                        tracing::error!(
                            file = node.ledger.path(),
                            "the ticket ledger file was truncated underneath the node; serving on believing every ticket's cookie once more (restart to keep a ledger again)"
                        );
                    }
                }
                () = changed() => {
                    if let Some(push) = world.as_ref().and_then(|w| w.load().settings.clone()) {
                        node.take_push(&push);
                    }
                    node.refresh_states(&mut rates);
                    // Held visitors decide again with the new promise.
                    if let Some(gossip) = &node.gossip {
                        gossip.lease.answered();
                    }
                }
                () = now.notified() => node.refresh_states(&mut rates),
                _ = keep_shares.tick(), if world
                    .as_ref()
                    .is_some_and(|w| w.freshness(node.clock.elapsed()).is_fresh()) =>
                {
                    let node = Arc::clone(&node);
                    // A few bytes, but still file I/O: off the runtime.
                    tokio::task::spawn_blocking(move || node.persist_shares());
                }
                () = shutdown.requested() => return,
            }
        }
    });
}

/// SIGTERM/SIGINT: stop accepting and drain. SIGHUP: re-read the config; a
/// bad one is refused and the old one stays.
fn spawn_signal_handlers(
    control: &tokio::runtime::Runtime,
    node: &Arc<Node>,
    path: PathBuf,
    trigger: &Trigger,
    shutdown: &Shutdown,
) -> anyhow::Result<()> {
    let mut terminate = control
        .block_on(async { signals::Terminate::listen() })
        .context("listening for SIGTERM and SIGINT")?;
    let trigger = trigger.clone();
    control.spawn(async move {
        terminate.recv().await;
        tracing::info!("stopping: no new connections, draining in-flight requests");
        systemd::stopping();
        trigger.fire();
    });
    let hangups = control.block_on(async { signals::hangups() });
    if let Some(mut hup) = hangups {
        let node = Arc::clone(node);
        let mut shutdown = shutdown.clone();
        control.spawn(async move {
            loop {
                tokio::select! {
                    _ = hup.recv() => {
                        // logrotate moved the file: new lines go to a new one.
                        node.access_log.reopen();
                        match node.reload(&path) {
                            Ok(changes) => tracing::info!(file = %path.display(), ?changes, "configuration reloaded"),
                            Err(err) => tracing::error!(
                                "reload refused, the old configuration stays in force: {err}"
                            ),
                        }
                    }
                    () = shutdown.requested() => return,
                }
            }
        });
    }
    Ok(())
}
