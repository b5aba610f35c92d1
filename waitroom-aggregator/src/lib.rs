//! The aggregator: receives every node's report over QUIC, merges them with
//! the engine's aggregation, and answers each node with its global state.
//!
//! It links no XDP loader and no HTTP proxy: the rules it applies are in
//! `waitroom-common` (the merge and lease ledger in
//! [`waitroom_common::cluster`], the frames in [`waitroom_common::wire`]), and
//! the plumbing it shares with the node (TLS, QUIC frames, the admin loop,
//! signals, systemd) is in `waitroom-runtime`. The binary (`main.rs`) only
//! parses the command line and calls [`Aggregator::start`].
//!
//! # Layout
//! - [`config`]: the TOML file.
//! - [`server`]: the QUIC accept loop, one task per node and per report.
//! - [`snapshot`]: the state on disk, so a restart loses nothing that matters.
//! - [`admin`]: `/status` and `/metrics`; [`exposition`]: the Prometheus
//!   families `/metrics` serves.
//! - [`dashboard`]: the live dashboard's numbers and its last hour.
//! - [`ctl`]: `waitroom-aggregator ctl`, the control API's command line.
//!
//! # One source of truth for a cluster's rooms
//! The room settings start from the `[[rooms]]` tables of the config file
//! and change at run time through the control API
//! ([`waitroom_runtime::control`], on the admin listener). Each change is a
//! new version, written to `settings_path` before it is applied (so it
//! survives a restart), logged to `audit_log`, and carried to every node
//! that reports another version, in the answer to its next report.
//!
//! Its state can always be rebuilt from one round of reports (they carry
//! counts, not decisions); the snapshot keeps what reports cannot bring back:
//! departed nodes' sessions, the admit-rate history and the leases out.
use std::{net::SocketAddr, sync::Arc, time::Duration};

use tokio::task::JoinHandle;
use waitroom_common::{cluster, time::UnixMillis, wire::SettingsPush};
use waitroom_runtime::{
    clock::Clock,
    control::{Control, RoomSettings, SettingsStore, StoreError, TokenError, Tokens},
    shutdown, systemd, tls,
};

pub mod admin;
pub mod committer;
pub mod config;
pub mod ctl;
pub mod dashboard;
pub mod exposition;
pub mod ledger;
pub mod server;
pub mod snapshot;

pub use config::AggregatorConfig;

/// How often silent nodes are looked for, independent of reports arriving.
const EXPIRE_EVERY: Duration = Duration::from_secs(1);

/// Why the aggregator could not start.
#[derive(Debug, thiserror::Error)]
pub enum AggregatorError {
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("binding {what} {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(
        "admin_listen {addr}: not a loopback address; the aggregator's admin listener has no authentication, so bind it to 127.0.0.1 or ::1 (and scrape through a tunnel or a local agent)"
    )]
    AdminNotLoopback { addr: SocketAddr },
    #[error("control_token_file {0}")]
    Tokens(#[from] TokenError),
    #[error("settings_path: {0}")]
    Settings(#[from] StoreError),
    #[error("settings_path: the room settings kept there are refused: {0}")]
    KeptSettings(#[from] waitroom_common::room_table::RoomsError),
}

/// The rule `--check` and start share: the admin listener (status and
/// metrics, no token) stays on loopback, as the node's does without a token.
pub fn check_admin_listen(admin_listen: Option<SocketAddr>) -> Result<(), AggregatorError> {
    match admin_listen {
        Some(addr) if !addr.ip().is_loopback() => Err(AggregatorError::AdminNotLoopback { addr }),
        _ => Ok(()),
    }
}

/// Why a reloaded configuration was refused; the running one stays.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("{field}: changed; a reload applies room limits only, restart for this")]
    NeedsRestart { field: &'static str },
    #[error(transparent)]
    Rooms(#[from] cluster::RoomsChangeError),
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Control(#[from] waitroom_runtime::control::ControlError),
}

/// A running aggregator.
#[derive(Debug)]
pub struct Aggregator {
    /// What it was started with: a reload may change only the room limits.
    config: AggregatorConfig,
    shared: Arc<server::Shared>,
    /// The room settings and the control API over them.
    control: Arc<Control>,
    endpoint: quinn::Endpoint,
    quic_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    snapshot_path: std::path::PathBuf,
    trigger: shutdown::Trigger,
    tasks: Vec<JoinHandle<()>>,
}

impl Aggregator {
    /// Restores the last snapshot, binds the QUIC and admin listeners and
    /// starts serving. Call inside a tokio runtime.
    ///
    /// Every decision reads the time from `clock`: the system clock in
    /// production; a driven one lets a test age reports, depart silent nodes
    /// and cross minutes without waiting for them.
    pub async fn start(config: AggregatorConfig, clock: Clock) -> Result<Self, AggregatorError> {
        check_admin_listen(config.admin_listen)?;
        let server_config = tls::server_config(&config.tls)?;
        let tokens = config
            .control
            .token_file
            .as_deref()
            .map(Tokens::load)
            .transpose()?;
        let store = SettingsStore::open(
            config.rooms.clone(),
            &config.control.settings_path,
            &config.control.audit_log,
            clock.now().0,
        )?;
        let settings = store.current().clone();
        let mut cluster =
            cluster::Cluster::new(config::room_defs(&settings.rooms)?, config.node_timeout_ms);
        if config.ledger.is_some() {
            cluster = cluster.with_shared_ledger();
        }
        // Grants made since the snapshot was taken are known only to the
        // nodes holding them: learn them from their reports first. Without
        // a snapshot this aggregator has not granted before (or its state
        // was deleted, which OPERATIONS warns about), so it grants at once.
        // With a `[ledger]` every grant a node was told is in etcd, which
        // cuts whatever this restored picture under-counts: nothing to
        // learn, and no seconds of nothing new for the nodes.
        if restore(&mut cluster, &config.snapshot_path, clock.now()) && config.learning_ms > 0 {
            if config.ledger.is_some() {
                tracing::info!(
                    "not learning after the restore: the grant ledger in etcd holds every grant"
                );
            } else {
                cluster.learn_until(UnixMillis(clock.now().0.saturating_add(config.learning_ms)));
                tracing::info!(
                    learning_ms = config.learning_ms,
                    "learning what the nodes hold before granting more"
                );
            }
        }
        let shared = Arc::new(server::Shared {
            reloads: waitroom_runtime::metrics::ReloadOutcomes::new(clock.now()),
            clock: clock.clone(),
            cluster: parking_lot::Mutex::new(cluster),
            metrics: server::ServerMetrics::default(),
            pools: parking_lot::Mutex::default(),
            live: parking_lot::Mutex::default(),
            history: waitroom_runtime::dashboard::History::new(),
            settings: parking_lot::Mutex::new(Arc::new(push_of(&settings))),
            node_settings: parking_lot::Mutex::default(),
            clock_seen: std::sync::atomic::AtomicI64::new(clock.wall_over_elapsed()),
            ledger: config.ledger.as_ref().map(|l| {
                tracing::info!(endpoints = ?l.endpoints, epoch = l.epoch, "grants are committed to etcd before nodes hear of them");
                committer::Committer::start(l, config.shard.as_ref())
            }),
            shard: config.shard.clone().inspect(|m| {
                tracing::info!(
                    group = m.name(),
                    groups = %m.canonical(),
                    "rooms sharded between aggregator groups: this aggregator takes part only in its group's rooms"
                );
            }),
        });
        let control = Arc::new(Control {
            tokens,
            disabled_hint: "set control_token_file in the aggregator's config (a file of `NAME TOKEN` lines, mode 0600) and restart",
            store: Arc::new(parking_lot::Mutex::new(store)),
            apply: {
                let shared = Arc::clone(&shared);
                Box::new(move |settings| apply(&shared, settings))
            },
            clock,
        });

        let endpoint =
            tls::server_endpoint(server_config, config.listen, &config.tls).map_err(|source| {
                AggregatorError::Bind {
                    what: "listen",
                    addr: config.listen,
                    source,
                }
            })?;
        let quic_addr = endpoint
            .local_addr()
            .map_err(|source| AggregatorError::Bind {
                what: "listen",
                addr: config.listen,
                source,
            })?;
        let (trigger, shutdown) = shutdown::channel();
        let mut tasks = vec![tokio::spawn(server::accept_loop(
            endpoint.clone(),
            Arc::clone(&shared),
        ))];

        let admin_addr = match config.admin_listen {
            Some(addr) => {
                let bind = |source| AggregatorError::Bind {
                    what: "admin_listen",
                    addr,
                    source,
                };
                let listener = tokio::net::TcpListener::bind(addr).await.map_err(bind)?;
                let bound = listener.local_addr().map_err(bind)?;
                tasks.push(tokio::spawn(admin::serve(
                    listener,
                    Arc::clone(&shared),
                    Arc::clone(&control),
                    shutdown.clone(),
                )));
                // Only the admin listener shows the history: no listener, no samples.
                tasks.push(tokio::spawn(dashboard::sample(
                    Arc::clone(&shared),
                    shutdown.clone(),
                )));
                Some(bound)
            }
            None => None,
        };
        tasks.push(tokio::spawn(housekeeping(
            Arc::clone(&shared),
            config.snapshot_path.clone(),
            Duration::from_millis(config.snapshot_interval_ms),
            shutdown,
        )));
        tracing::info!(quic = %quic_addr, rooms = config.rooms.len(), "aggregator serving");
        Ok(Self {
            config: config.clone(),
            shared,
            control,
            endpoint,
            quic_addr,
            admin_addr,
            snapshot_path: config.snapshot_path,
            trigger,
            tasks,
        })
    }

    /// Reads `path` and applies its room limits (SIGHUP); see [`Self::reload`].
    /// The outcome is counted either way (`waitroom_config_*` in `/metrics`).
    pub fn reload_file(&self, path: &std::path::Path) -> Result<(), ReloadError> {
        match AggregatorConfig::load(path) {
            Ok(new) => self.reload(&new),
            Err(err) => {
                self.shared.reloads.record(false, self.shared.clock.now());
                Err(err.into())
            }
        }
    }

    /// Applies `new`'s room limits (SIGHUP). Anything else changed, or a
    /// room added or removed, is refused naming the field, changing nothing.
    /// The outcome is counted either way.
    pub fn reload(&self, new: &AggregatorConfig) -> Result<(), ReloadError> {
        let result = self.try_reload(new);
        self.shared
            .reloads
            .record(result.is_ok(), self.shared.clock.now());
        result
    }

    fn try_reload(&self, new: &AggregatorConfig) -> Result<(), ReloadError> {
        let old = &self.config;
        for (field, same) in [
            ("listen", old.listen == new.listen),
            ("admin_listen", old.admin_listen == new.admin_listen),
            ("ca/cert/key", old.tls == new.tls),
            ("snapshot_path", old.snapshot_path == new.snapshot_path),
            (
                "snapshot_interval_ms",
                old.snapshot_interval_ms == new.snapshot_interval_ms,
            ),
            (
                "node_timeout_ms",
                old.node_timeout_ms == new.node_timeout_ms,
            ),
            ("ledger", old.ledger == new.ledger),
            ("shard", old.shard == new.shard),
        ] {
            if !same {
                return Err(ReloadError::NeedsRestart { field });
            }
        }
        // The rooms' ids must stay; checked before anything is written.
        let defs = config::room_defs(&new.rooms).map_err(|e| {
            waitroom_runtime::control::ControlError::Invalid {
                field: e.key(),
                problem: e.problem.to_string(),
            }
        })?;
        let ids = |defs: &[cluster::RoomDef]| -> Vec<String> {
            defs.iter().map(|d| d.name.clone()).collect()
        };
        let before = ids(self.shared.cluster().rooms());
        if before != ids(&defs) {
            return Err(cluster::RoomsChangeError::Ids {
                before,
                after: ids(&defs),
            }
            .into());
        }
        let now = self.shared.clock.now().0;
        let version = self
            .control
            .store
            .lock()
            .reseed(new.rooms.clone(), now, |settings| {
                apply(&self.shared, settings)
            })?;
        if let Some(version) = version {
            tracing::info!(version, "the config file's rooms are the new room settings");
        }
        Ok(())
    }

    /// The room settings in force.
    #[must_use]
    pub fn settings(&self) -> RoomSettings {
        self.control.store.lock().current().clone()
    }

    /// The bound QUIC (UDP) address.
    #[must_use]
    pub fn quic_addr(&self) -> SocketAddr {
        self.quic_addr
    }

    /// The cluster's status at `now`: what `/status` serves.
    #[must_use]
    pub fn status(&self, now: UnixMillis) -> cluster::Status {
        self.shared.cluster().status(now)
    }

    /// Nodes marked departed since the start (see
    /// [`cluster::Cluster::departures_total`]).
    #[must_use]
    pub fn departures_total(&self) -> u64 {
        self.shared.cluster().departures_total()
    }

    /// The QUIC server's counters (handshakes, frames refused, ...).
    #[must_use]
    pub fn metrics(&self) -> &server::ServerMetrics {
        &self.shared.metrics
    }

    /// The bound admin address, if configured.
    #[must_use]
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// Closes every node connection (they reconnect to the next aggregator)
    /// and writes a last snapshot.
    pub async fn stop(self) {
        self.trigger.fire();
        self.endpoint.close(
            waitroom_common::wire::close::DONE.into(),
            b"aggregator shutting down",
        );
        for task in &self.tasks {
            task.abort();
        }
        write_snapshot(&self.shared, &self.snapshot_path).await;
        // Give the close frames a moment to leave.
        let _ = tokio::time::timeout(Duration::from_millis(500), self.endpoint.wait_idle()).await;
        tracing::info!("aggregator stopped");
    }
}

/// What a gossip answer carries of `settings`.
fn push_of(settings: &RoomSettings) -> SettingsPush {
    SettingsPush {
        version: settings.version,
        rooms_json: settings.rooms_json(),
    }
}

/// Puts a new version of the room settings in force: the cluster's limits
/// at once, the nodes with their next answers. Refused, changing nothing,
/// if the rooms' ids are not the ones served.
fn apply(shared: &server::Shared, settings: &RoomSettings) -> Result<(), String> {
    let defs = config::room_defs(&settings.rooms).map_err(|e| e.to_string())?;
    shared
        .cluster()
        .set_rooms(defs)
        .map_err(|e| e.to_string())?;
    *shared.settings.lock() = Arc::new(push_of(settings));
    Ok(())
}

/// Takes over the snapshot at `path`, if there is a usable one. One that
/// cannot be read is set aside (`.corrupt`) rather than trusted or deleted:
/// the state rebuilds from the nodes' next reports either way. `true` when
/// a snapshot was there, usable or not: this aggregator granted before, and
/// the nodes may hold grants it does not know of.
fn restore(cluster: &mut cluster::Cluster, path: &std::path::Path, now: UnixMillis) -> bool {
    match snapshot::read(path) {
        Ok(None) => {
            tracing::info!(path = %path.display(), "no snapshot yet; starting empty");
            false
        }
        Ok(Some(snapshot)) => {
            let age_ms = now.0.saturating_sub(snapshot.taken_at.0);
            let nodes = snapshot.nodes.len();
            match cluster.restore(snapshot, now) {
                Ok(dropped) => {
                    for what in &dropped {
                        tracing::warn!(path = %path.display(), "snapshot: {what}");
                    }
                    cluster.expire(now);
                    tracing::info!(path = %path.display(), age_ms, nodes, corrected = dropped.len(), "restored snapshot");
                    true
                }
                Err(err) => {
                    tracing::warn!(path = %path.display(), %err, "snapshot not used; starting empty");
                    // It was there: this aggregator granted before.
                    true
                }
            }
        }
        Err(err) => {
            let aside = path.with_extension("corrupt");
            tracing::warn!(%err, moved_to = %aside.display(), "snapshot unreadable; starting empty");
            let _ = std::fs::rename(path, aside);
            true
        }
    }
}

/// Every second: forget silent nodes, and tell systemd's watchdog (when the
/// unit has `WatchdogSec`) that the cluster state is still reachable: a stuck
/// lock or a starved runtime stops the keep-alives and systemd restarts us.
/// Every `snapshot_every`: write a snapshot.
async fn housekeeping(
    shared: Arc<server::Shared>,
    path: std::path::PathBuf,
    snapshot_every: Duration,
    mut shutdown: shutdown::Shutdown,
) {
    let mut expire = tokio::time::interval(EXPIRE_EVERY);
    let mut snap = tokio::time::interval(snapshot_every);
    expire.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    snap.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    snap.tick().await;
    let mut watchdog = systemd::Watchdog::from_env();
    loop {
        tokio::select! {
            _ = expire.tick() => {
                shared.cluster().expire(shared.clock.now());
                if let Some(w) = &mut watchdog {
                    w.alive();
                }
            }
            _ = snap.tick() => write_snapshot(&shared, &path).await,
            () = shutdown.requested() => return,
        }
    }
}

/// Writes a snapshot off the runtime's threads; failures are counted and
/// logged, never fatal (the previous snapshot stays in place).
async fn write_snapshot(shared: &Arc<server::Shared>, path: &std::path::Path) {
    let taken_at = shared.clock.now();
    let snap = shared.cluster().snapshot(taken_at);
    let path_owned = path.to_owned();
    let written = tokio::task::spawn_blocking(move || snapshot::write(&path_owned, &snap)).await;
    use std::sync::atomic::Ordering::Relaxed;
    match written {
        Ok(Ok(())) => {
            shared.metrics.snapshots_written_total.fetch_add(1, Relaxed);
            shared.metrics.last_snapshot_ms.store(taken_at.0, Relaxed);
            tracing::debug!(path = %path.display(), "snapshot written");
        }
        Ok(Err(err)) => {
            shared.metrics.snapshot_errors_total.fetch_add(1, Relaxed);
            tracing::warn!(%err, "snapshot not written");
        }
        Err(err) => {
            shared.metrics.snapshot_errors_total.fetch_add(1, Relaxed);
            tracing::warn!(%err, "snapshot task failed");
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_admin_listener_stays_on_loopback() {
        assert!(super::check_admin_listen(None).is_ok());
        assert!(super::check_admin_listen(Some("127.0.0.1:9300".parse().unwrap())).is_ok());
        assert!(super::check_admin_listen(Some("[::1]:9300".parse().unwrap())).is_ok());
        let err = super::check_admin_listen(Some("0.0.0.0:9300".parse().unwrap())).unwrap_err();
        assert!(err.to_string().contains("loopback"), "{err}");
    }

    use std::{path::Path, time::Duration};

    use waitroom_common::{
        room::RoomConfig,
        room_table::RoomTable,
        wire::{self, Message, RefusalReason},
    };
    use waitroom_runtime::{clock, devcerts, frames, tls::TlsFiles};

    use super::*;

    fn temp_dir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("wr-agg-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn shop() -> RoomTable {
        RoomTable::from_config("shop", &RoomConfig::with_limits(100, 20))
    }

    fn config(dir: &Path, tls: TlsFiles, listen: SocketAddr) -> AggregatorConfig {
        AggregatorConfig {
            listen,
            admin_listen: None,
            tls,
            snapshot_path: dir.join("snapshot.json"),
            snapshot_interval_ms: 200,
            node_timeout_ms: 5_000,
            learning_ms: 3_000,
            rooms: vec![shop()],
            control: config::ControlConfig::beside(&dir.join("snapshot.json")),
            ledger: None,
            shard: None,
        }
    }

    /// A snapshot with impossible values (sessions that never end, an
    /// overflowing count, an endless lease) does not lock the room: the
    /// aggregator starts, corrects what it must, and the room stays usable.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_poisoned_snapshot_is_corrected_and_the_aggregator_serves() {
        use waitroom_common::{
            aggregate::{MinuteAdmits, NodeReport, RoomReport},
            counters::PoolCounts,
            time::ExpirySlot,
        };
        let dir = temp_dir("poison");
        let certs = devcerts::write(&dir, &["n1".into()]).unwrap();
        let now = clock::now();
        let m = now.minute();
        let shop = config::room_defs(&[shop()]).unwrap().remove(0);
        let mut cluster = cluster::Cluster::new(vec![shop.clone()], 5_000);
        let honest = RoomReport {
            room: shop.room.id(),
            expiries: vec![(ExpirySlot::end_of_minute(m.plus(3)), 4)],
            admits: vec![MinuteAdmits {
                minute: m,
                admits: PoolCounts::default(),
            }],
            ..RoomReport::default()
        };
        let mut poisoned = honest.clone();
        poisoned.expiries = vec![
            (ExpirySlot::end_of_minute(m.plus(50_000)), 1_000),
            (ExpirySlot::end_of_minute(m.plus(2)), i64::MAX),
        ];
        poisoned.admits[0].admits.anywhere = u64::MAX;
        for (node, room) in [("n1", honest), ("n2", poisoned)] {
            cluster.apply(
                NodeReport {
                    node: node.into(),
                    colo: "x".into(),
                    at: now,
                    rooms: vec![room],
                },
                now,
            );
        }
        // The cluster corrects reports on the way in; write the raw poison
        // into the file as a corrupted or hand-edited snapshot would hold it.
        let mut snap = cluster.snapshot(now);
        let bad = &mut snap.nodes[1].0.rooms[0];
        bad.expiries = vec![
            (ExpirySlot::end_of_minute(m.plus(50_000)), 1_000),
            (ExpirySlot::end_of_minute(m.plus(2)), i64::MAX),
        ];
        bad.admits[0].admits.anywhere = u64::MAX;
        std::fs::create_dir_all(&dir).unwrap();
        snapshot::write(&dir.join("snapshot.json"), &snap).unwrap();

        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let aggregator = Aggregator::start(
            config(&dir, certs.aggregator.clone(), loopback),
            Clock::system(),
        )
        .await
        .unwrap();
        let status = aggregator.status(clock::now());
        let room = &status.rooms[0];
        assert_eq!(
            room.active_users,
            4 + 264,
            "n2's endless sessions dropped, its overflow clamped to 2 × 100 + 64"
        );
        assert!(room.admitted_this_minute <= 2 * 20 + 64);
        assert_eq!(status.nodes.len(), 2);
        aggregator.stop().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A reload takes new limits and refuses anything else, naming the field.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reload_takes_room_limits_and_refuses_other_changes() {
        let dir = temp_dir("reload");
        let certs = devcerts::write(&dir, &["n1".into()]).unwrap();
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let started = config(&dir, certs.aggregator.clone(), loopback);
        let aggregator = Aggregator::start(started.clone(), Clock::system())
            .await
            .unwrap();
        let mut moved = started.clone();
        moved.listen = "127.0.0.1:1".parse().unwrap();
        let err = aggregator.reload(&moved).unwrap_err();
        assert!(err.to_string().starts_with("listen:"), "{err}");
        let mut tighter = started.clone();
        let limits = RoomConfig::with_limits(7, 3);
        tighter.rooms[0] = RoomTable::from_config("shop", &limits);
        assert_eq!(aggregator.settings().version, 1);
        aggregator.reload(&tighter).unwrap();
        let status = aggregator.status(clock::now());
        assert_eq!(status.rooms[0].total_active_users, 7);
        assert_eq!(status.rooms[0].new_users_per_minute, 3);
        assert_eq!(
            aggregator.settings().version,
            2,
            "a new version of the settings"
        );
        aggregator.reload(&tighter).unwrap();
        assert_eq!(
            aggregator.settings().version,
            2,
            "the same file changes nothing"
        );
        let mut more = tighter.clone();
        more.rooms.push(RoomTable::from_config("other", &limits));
        let err = aggregator.reload(&more).unwrap_err();
        assert!(err.to_string().contains("needs a restart"), "{err}");
        aggregator.stop().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An aggregator on loopback with [`config`], and a client endpoint with
    /// node `n1`'s certificate; the directory to remove at the end.
    async fn serving_n1(tag: &str) -> (std::path::PathBuf, Aggregator, quinn::Endpoint) {
        let dir = temp_dir(tag);
        let certs = devcerts::write(&dir, &["n1".into()]).unwrap();
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let aggregator = Aggregator::start(
            config(&dir, certs.aggregator.clone(), loopback),
            Clock::system(),
        )
        .await
        .unwrap();
        let mut endpoint = quinn::Endpoint::client(loopback).unwrap();
        endpoint.set_default_client_config(tls::client_config(&certs.nodes[0].1).unwrap());
        (dir, aggregator, endpoint)
    }

    async fn connect(endpoint: &quinn::Endpoint, aggregator: &Aggregator) -> quinn::Connection {
        endpoint
            .connect(aggregator.quic_addr(), "localhost")
            .unwrap()
            .await
            .unwrap()
    }

    /// Raw frames on a real connection: refusals come back as frames, the
    /// aggregator keeps serving, and another version is disconnected.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bad_frames_are_refused_and_the_aggregator_keeps_serving() {
        let (dir, aggregator, endpoint) = serving_n1("frames").await;
        let connect = || connect(&endpoint, &aggregator);
        let send_raw = |connection: quinn::Connection, bytes: Vec<u8>| async move {
            let (mut send, mut recv) = connection.open_bi().await.unwrap();
            send.write_all(&bytes).await.unwrap();
            send.finish().unwrap();
            frames::read(&mut recv).await
        };
        let connection = connect().await;

        let mut garbage = wire::MAGIC.to_vec();
        garbage.extend(wire::VERSION.to_be_bytes());
        garbage.extend(3_u32.to_be_bytes());
        garbage.extend([0xff, 0xff, 0xff]);
        let Message::Refused(refusal) = send_raw(connection.clone(), garbage).await.unwrap() else {
            panic!("expected a refusal");
        };
        assert_eq!(refusal.reason, RefusalReason::Malformed);

        let mut huge = wire::MAGIC.to_vec();
        huge.extend(wire::VERSION.to_be_bytes());
        huge.extend(u32::MAX.to_be_bytes());
        let Message::Refused(refusal) = send_raw(connection.clone(), huge).await.unwrap() else {
            panic!("expected a refusal");
        };
        assert!(matches!(refusal.reason, RefusalReason::TooLarge { .. }));

        let report = Message::Report(wire::ReportFrame {
            seq: 1,
            report: waitroom_common::aggregate::NodeReport {
                node: "n1".into(),
                colo: "x".into(),
                at: clock::now(),
                rooms: vec![],
            },
            pools: vec![],
            settings_version: None,
        });
        let good = wire::encode(&report).unwrap();
        let answer = send_raw(connection.clone(), good.clone()).await.unwrap();
        assert!(
            matches!(answer, Message::Answer(a) if a.seq == 1),
            "still serving after bad frames"
        );

        let mut future = good;
        future[4..6].copy_from_slice(&99_u16.to_be_bytes());
        let Message::Refused(refusal) = send_raw(connection.clone(), future).await.unwrap() else {
            panic!("expected a refusal");
        };
        assert_eq!(
            refusal.reason,
            RefusalReason::UnsupportedVersion {
                supported: wire::VERSION
            }
        );
        let closed = tokio::time::timeout(Duration::from_secs(5), connection.closed())
            .await
            .unwrap();
        assert!(
            matches!(&closed, quinn::ConnectionError::ApplicationClosed(c) if c.error_code == wire::close::UNSUPPORTED_VERSION.into()),
            "{closed:?}"
        );
        let metrics = &aggregator.shared.metrics;
        assert_eq!(
            metrics
                .frames_refused_total
                .load(std::sync::atomic::Ordering::Relaxed),
            3
        );
        aggregator.stop().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Reports as changes on a real connection: the aggregator rebuilds the
    /// report the node sent from the one it kept for the connection and
    /// merges it whole; changes against a report it does not hold (a number
    /// never sent, another connection's, or rooms the base lacks) are
    /// refused as such, never guessed at; a rebuilt report is still checked
    /// against the connection's certificate.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reports_as_changes_are_rebuilt_against_the_connections_own_reports() {
        use waitroom_common::{
            aggregate::{NodeReport, RoomReport},
            room::RoomId,
            wire::{ChangesFrame, ReportFrame},
        };
        let (dir, aggregator, endpoint) = serving_n1("changes").await;
        let connect = || connect(&endpoint, &aggregator);
        let exchange = |connection: quinn::Connection, message: Message| async move {
            let (mut send, mut recv) = connection.open_bi().await.unwrap();
            frames::write(&mut send, &message).await.unwrap();
            frames::read(&mut recv).await.unwrap()
        };
        let now = clock::now();
        let slot = now.expiry_slot();
        let report = |seq: u64, node: &str, expiries: Vec<(_, i64)>| {
            Message::Report(ReportFrame {
                seq,
                report: NodeReport {
                    node: node.into(),
                    colo: "x".into(),
                    at: now,
                    rooms: vec![RoomReport {
                        room: RoomId::from_name("shop"),
                        expiries,
                        ..RoomReport::default()
                    }],
                },
                pools: vec![],
                settings_version: None,
            })
        };
        let first = report(1, "n1", vec![(slot.plus(30), 2), (slot.plus(60), 1)]);
        let second = report(2, "n1", vec![(slot.plus(30), 3), (slot.plus(60), 1)]);
        let rooms = |m: &Message| m.report_frame().unwrap().report.rooms.clone();
        let changes = |base: u64, of: &Message| {
            Message::Changes(ChangesFrame::of(base, &rooms(&first), of.clone()).unwrap())
        };
        let connection = connect().await;
        let answer = exchange(connection.clone(), first.clone()).await;
        assert!(
            matches!(&answer, Message::Answer(a) if a.seq == 1),
            "{answer:?}"
        );
        let Message::Changes(sent) = changes(1, &second) else {
            unreachable!()
        };
        assert_eq!(
            sent.rooms[0].expiries,
            [(slot.plus(30), 3)],
            "one entry sent"
        );
        let answer = exchange(connection.clone(), Message::Changes(sent)).await;
        assert!(
            matches!(&answer, Message::Answer(a) if a.seq == 2),
            "{answer:?}"
        );
        let merged = aggregator.shared.cluster().snapshot(clock::now());
        let (node, _) = merged.nodes.iter().find(|(r, _)| r.node == "n1").unwrap();
        assert_eq!(
            node.rooms,
            rooms(&second),
            "the second report, rebuilt whole"
        );

        let refused = |answer: Message| match answer {
            Message::Refused(refusal) => refusal.reason,
            other => panic!("expected a refusal, got {other:?}"),
        };
        // A number never sent.
        let third = report(3, "n1", vec![(slot.plus(30), 4)]);
        let answer = exchange(connection.clone(), changes(99, &third)).await;
        assert_eq!(refused(answer), RefusalReason::UnknownBase);
        // Changes to a room the base lacks.
        let mut stray = ChangesFrame::of(2, &rooms(&second), third.clone()).unwrap();
        stray.rooms[0].room = RoomId::from_name("elsewhere");
        let answer = exchange(connection.clone(), Message::Changes(stray)).await;
        assert_eq!(refused(answer), RefusalReason::UnknownBase);
        // Another connection holds none of this one's reports.
        let other = connect().await;
        let answer = exchange(other.clone(), changes(1, &third)).await;
        assert_eq!(refused(answer), RefusalReason::UnknownBase);
        // A rebuilt report is held to the certificate like any other.
        let impostor = report(4, "n2", vec![(slot.plus(30), 9)]);
        let answer = exchange(connection.clone(), changes(1, &impostor)).await;
        assert_eq!(refused(answer), RefusalReason::NotCertified);
        // And the base before the last still serves (an answer was lost).
        let answer = exchange(connection.clone(), changes(1, &third)).await;
        assert!(
            matches!(&answer, Message::Answer(a) if a.seq == 3),
            "{answer:?}"
        );

        let metrics = &aggregator.shared.metrics;
        assert_eq!(
            metrics
                .changes_reports_total
                .load(std::sync::atomic::Ordering::Relaxed),
            3
        );
        assert_eq!(
            metrics
                .changes_refused_total
                .load(std::sync::atomic::Ordering::Relaxed),
            3
        );
        aggregator.stop().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The aggregator decides on the clock it was given: answers and
    /// snapshots carry its time, and a node silent for longer than
    /// `node_timeout_ms` stops counting as live when that clock says so. The
    /// driven clock stands years ahead, where the system clock would never
    /// see the node as silent.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_driven_clock_ages_reports_and_departs_silent_nodes() {
        let dir = temp_dir("clock");
        let certs = devcerts::write(&dir, &["n1".into()]).unwrap();
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let start = UnixMillis(4_000_000_000_000);
        let (clock, driver) = Clock::driven(start);
        let aggregator = Aggregator::start(config(&dir, certs.aggregator.clone(), loopback), clock)
            .await
            .unwrap();
        let mut endpoint = quinn::Endpoint::client(loopback).unwrap();
        endpoint.set_default_client_config(tls::client_config(&certs.nodes[0].1).unwrap());
        let connection = endpoint
            .connect(aggregator.quic_addr(), "localhost")
            .unwrap()
            .await
            .unwrap();
        let report = Message::Report(wire::ReportFrame {
            seq: 1,
            report: waitroom_common::aggregate::NodeReport {
                node: "n1".into(),
                colo: "x".into(),
                at: start,
                rooms: vec![],
            },
            pools: vec![],
            settings_version: None,
        });
        let (mut send, mut recv) = connection.open_bi().await.unwrap();
        frames::write(&mut send, &report).await.unwrap();
        let Message::Answer(answer) = frames::read(&mut recv).await.unwrap() else {
            panic!("expected an answer");
        };
        assert_eq!(answer.at, start, "answered at the aggregator's clock");
        assert!(
            frames::read_next(&mut recv).await.unwrap().is_none(),
            "nothing held back without a ledger: one frame, then the stream ends"
        );
        let live = |now| {
            aggregator
                .status(now)
                .nodes
                .iter()
                .any(|n| n.node == "n1" && !n.departed)
        };
        assert!(live(driver.now()));

        // Housekeeping looks for silent nodes every second of real time; the
        // clock says 5 s of silence have passed.
        driver.advance(Duration::from_millis(5_001));
        let mut departed = false;
        for _ in 0..60 {
            if !live(driver.now()) {
                departed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(departed, "the silent node still counts as live");

        aggregator.stop().await;
        let written = snapshot::read(&dir.join("snapshot.json")).unwrap().unwrap();
        assert_eq!(written.taken_at, driver.now(), "the last snapshot's time");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
