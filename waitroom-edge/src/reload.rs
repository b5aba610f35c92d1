//! SIGHUP: apply what a new configuration file changes while requests flow,
//! and refuse the whole file when it changes something only a restart can.
//!
//! What a reload applies at once: each room's limits, queueing method,
//! session settings, queue page template and status; the cookie keys
//! (rotation); the TLS listener's certificate and key. What needs a restart
//! (new sockets, new routes, new threads): every other `[node]` setting,
//! `[xdp]`, `[aggregator]`, and rooms added, removed or re-routed (id, host,
//! path, origins). A file that changes any of those is refused as a whole,
//! naming each such field and "restart needed"; nothing of it is applied (a
//! restart keeps counters and cookies, so applying the rest is never urgent).
//! Like Prometheus, the outcome is exported: `waitroom_config_reload_success`
//! and the time of the last successful reload.
//!
//! # Room settings from elsewhere
//! Room settings pushed by the aggregator, and changes made through a
//! standalone node's control API, go in force by the same path
//! ([`Node::apply_settings`]): every room's part is built from the file's
//! tables with the settings merged in
//! ([`RoomTable::with_settings`](waitroom_common::room_table::RoomTable::with_settings)),
//! all or nothing, then swapped in room by room. With an aggregator, a
//! reload keeps its settings (the file's room settings wait for the next
//! push or a restart without one); on a standalone node, a file whose
//! tables changed takes over from API changes as a new version.
use std::{
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::Context as _;
use arc_swap::ArcSwap;
use waitroom_common::{time::UnixMillis, wire::SettingsPush};
use waitroom_runtime::{
    control::{RoomSettings, SettingsStore},
    metrics::{Families, ReloadOutcomes},
    tls::CertSwap,
};

use crate::{
    config::{ConfigError, EdgeConfig},
    keys,
    node::{Node, RoomLive},
};

/// Keys of the non-room sections that a reload applies; every other key
/// under `[node]`, `[xdp]` and `[aggregator]` needs a restart.
const RELOADABLE: &[&str] = &["node.cookie_keys", "node.tls.cert", "node.tls.key"];

/// Why a reload was refused (the old configuration stays in force).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(
        "{path}: restart needed: {} changed, and a reload cannot apply that; nothing in the file was applied",
        fields.join(", ")
    )]
    RestartNeeded { path: PathBuf, fields: Vec<String> },
    #[error("{path}: {source:#}")]
    Room {
        path: PathBuf,
        source: anyhow::Error,
    },
    #[error("{path}: node.tls: {source}")]
    Tls {
        path: PathBuf,
        source: Box<waitroom_runtime::tls::TlsError>,
    },
    #[error("room settings version {version}: {source:#}")]
    Settings { version: u64, source: anyhow::Error },
}

/// Room settings in force besides the file's.
#[derive(Debug, Default)]
pub struct RunningSettings {
    /// The aggregator's last push applied (or the standalone control API's
    /// version); `None`: the file's own settings.
    pub current: Option<RoomSettings>,
    /// A pushed version this node refused: not tried again (the log said
    /// why, once); the node reports the version it runs and shows as behind.
    pub refused: Option<u64>,
}

/// The configuration in force and what reloads did, for `/metrics`.
#[derive(Debug)]
pub struct ReloadState {
    /// What a new file is compared against: the file started with, or the
    /// last one applied.
    applied: ArcSwap<EdgeConfig>,
    /// The TLS listener's certificate, swapped by a reload.
    https_cert: Option<Arc<CertSwap>>,
    /// What reloads did, for `/metrics`.
    outcomes: ReloadOutcomes,
    /// Room settings in force besides the file's.
    pub settings: parking_lot::Mutex<RunningSettings>,
    /// Where the last push from the aggregator is kept
    /// (`pushed-settings.json` in the state directory), so a restart
    /// during an aggregator outage runs it rather than the file's.
    pushed_file: PathBuf,
    /// A standalone node's control API store (its own versions), shared
    /// with the admin listener; `None` with an aggregator.
    pub store: Option<Arc<parking_lot::Mutex<SettingsStore>>>,
}

impl ReloadState {
    #[must_use]
    pub fn new(
        config: &EdgeConfig,
        https_cert: Option<Arc<CertSwap>>,
        store: Option<Arc<parking_lot::Mutex<SettingsStore>>>,
        now: UnixMillis,
    ) -> Self {
        Self {
            applied: ArcSwap::from_pointee(config.clone()),
            https_cert,
            outcomes: ReloadOutcomes::new(now),
            settings: parking_lot::Mutex::default(),
            pushed_file: pushed_file(config),
            store,
        }
    }

    /// The `waitroom_config_*` families.
    pub fn encode(&self, f: &mut Families<'_>) -> fmt::Result {
        self.outcomes.encode(f)
    }
}

impl Node {
    /// Applies a new configuration read from `path` to the running node (see
    /// the module docs for what it may change), and records the outcome.
    /// Returns what changed.
    pub fn reload(&self, path: &Path) -> Result<Vec<String>, ReloadError> {
        let result = self.try_reload(path);
        self.reloads
            .outcomes
            .record(result.is_ok(), self.clock.now());
        result
    }

    fn try_reload(&self, path: &Path) -> Result<Vec<String>, ReloadError> {
        let new = EdgeConfig::parse(path, &waitroom_runtime::config_file::read(path)?)?;
        let old = self.reloads.applied.load_full();
        let fields = restart_needed(&old, &new);
        if !fields.is_empty() {
            return Err(ReloadError::RestartNeeded {
                path: path.to_owned(),
                fields,
            });
        }
        // Load everything before applying anything: a bad template, key or
        // certificate refuses the whole file. The room settings merged in:
        // the aggregator's (kept), or on a standalone node its control
        // API's while the file's tables are the ones those started from.
        let merged = match &self.reloads.store {
            Some(store) => {
                let store = store.lock();
                store.is_seed(&new.tables).then(|| store.current().clone())
            }
            None => self.reloads.settings.lock().current.clone(),
        };
        let lives = lives_of(&new, merged.as_ref()).map_err(|source| ReloadError::Room {
            path: path.to_owned(),
            source,
        })?;
        let keys_changed = new.node.cookie_keys.len() != old.node.cookie_keys.len()
            || new
                .node
                .cookie_keys
                .iter()
                .zip(&old.node.cookie_keys)
                .any(|(a, b)| a.id != b.id || a.secret_hex != b.secret_hex);
        let keys = if keys_changed {
            Some(keys::load(&new.node).map_err(|source| ReloadError::Room {
                path: path.to_owned(),
                source,
            })?)
        } else {
            None
        };
        let cert = match (&new.node.tls, &self.reloads.https_cert) {
            (Some(tls), Some(_)) => {
                Some(CertSwap::load_key(&tls.cert, &tls.key).map_err(|source| {
                    ReloadError::Tls {
                        path: path.to_owned(),
                        source: Box::new(source),
                    }
                })?)
            }
            _ => None,
        };

        // Everything is valid: apply.
        let mut changes = self.put_in_force(lives);
        if let (Some(store), None) = (&self.reloads.store, &merged) {
            let now = self.clock.now().0;
            let version = store
                .lock()
                .reseed(new.tables.clone(), now, |_| Ok(()))
                .map_err(|e| ReloadError::Room {
                    path: path.to_owned(),
                    source: anyhow::anyhow!("{e}"),
                })?;
            if let Some(version) = version {
                self.reloads.settings.lock().current = Some(RoomSettings {
                    version,
                    rooms: new.tables.clone(),
                });
                changes.push(format!("room settings: version {version} from the file"));
            }
        }
        if let Some(keys) = keys {
            changes.push(format!("cookie keys: {keys:?}"));
            self.keys.store(Arc::new(keys));
        }
        if let (Some(cert), Some(swap)) = (cert, &self.reloads.https_cert) {
            swap.store(cert);
            changes.push("node.tls: certificate and key re-read".into());
        }
        self.reloads.applied.store(Arc::new(new));
        Ok(changes)
    }
}

impl Node {
    /// Swaps each room's new part in; returns what changed.
    fn put_in_force(&self, lives: Vec<RoomLive>) -> Vec<String> {
        let mut changes = Vec::new();
        for (room, live) in self.rooms.iter().zip(lives) {
            let before = room.live.load();
            if before.engine.config() != live.engine.config()
                || before.suspended != live.suspended
                || before.queue_status != live.queue_status
            {
                changes.push(format!("room {}: settings", room.spec.id));
            }
            live.bypass.carry_over(&before.bypass);
            room.live.store(Arc::new(live));
        }
        changes
    }

    /// The version of room settings in force: the aggregator's (or the
    /// standalone control API's); 0 while the node runs its file's.
    #[must_use]
    pub fn settings_version(&self) -> u64 {
        self.reloads
            .settings
            .lock()
            .current
            .as_ref()
            .map_or(0, |s| s.version)
    }

    /// Puts `settings` in force as a reload would: every room built from
    /// the file's tables with these settings merged in, all or nothing.
    /// Rooms the settings do not name keep the file's.
    pub fn apply_settings(&self, settings: &RoomSettings) -> Result<Vec<String>, ReloadError> {
        let config = self.reloads.applied.load_full();
        let lives = lives_of(&config, Some(settings)).map_err(|source| ReloadError::Settings {
            version: settings.version,
            source,
        })?;
        let changes = self.put_in_force(lives);
        let mut running = self.reloads.settings.lock();
        running.current = Some(settings.clone());
        if let Some(gossip) = &self.gossip {
            gossip
                .status
                .settings_version
                .store(settings.version, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(changes)
    }

    /// Room settings the aggregator pushed (the refresh loop calls this on
    /// every new answer): applied and kept in the state directory, unless
    /// this version is the one in force or one already refused.
    pub fn take_push(&self, push: &SettingsPush) {
        {
            let running = self.reloads.settings.lock();
            let version = running.current.as_ref().map(|s| s.version);
            if version == Some(push.version) || running.refused == Some(push.version) {
                return;
            }
        }
        let applied = RoomSettings::from_push(push.version, &push.rooms_json)
            .map_err(|e| ReloadError::Settings {
                version: push.version,
                source: anyhow::anyhow!("not readable by this node: {e}"),
            })
            .and_then(|settings| Ok((self.apply_settings(&settings)?, settings)));
        match applied {
            Ok((changes, settings)) => {
                tracing::info!(
                    version = push.version,
                    ?changes,
                    "room settings from the aggregator in force"
                );
                if let Err(err) = write_settings(&self.reloads.pushed_file, &settings) {
                    tracing::warn!(%err, path = %self.reloads.pushed_file.display(), "could not keep the room settings; a restart without the aggregator runs the file's");
                }
            }
            Err(err) => {
                self.reloads.settings.lock().refused = Some(push.version);
                tracing::error!(
                    version = push.version,
                    running = self.settings_version(),
                    "room settings from the aggregator refused, the ones in force stay: {err}"
                );
            }
        }
    }

    /// At start with an aggregator: the last push kept by an earlier run,
    /// if any (until the aggregator answers, it is the newest word).
    pub fn restore_pushed(&self) {
        let path = &self.reloads.pushed_file;
        let settings: RoomSettings = match std::fs::read(path) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(s) => s,
                Err(err) => {
                    tracing::warn!(%err, path = %path.display(), "kept room settings unreadable; running the file's until the aggregator answers");
                    return;
                }
            },
            Err(_) => return,
        };
        match self.apply_settings(&settings) {
            Ok(_) => tracing::info!(
                version = settings.version,
                "room settings kept from the aggregator in force"
            ),
            Err(err) => tracing::warn!(
                "kept room settings not used, running the file's until the aggregator answers: {err}"
            ),
        }
    }
}

/// Where a node keeps the aggregator's last push.
fn pushed_file(config: &EdgeConfig) -> PathBuf {
    config.node.state_dir().join("pushed-settings.json")
}

/// Writes `settings` to `path` the way every state file is replaced
/// (`state_dir::replace`: private, synced, renamed into place).
fn write_settings(path: &Path, settings: &RoomSettings) -> anyhow::Result<()> {
    crate::state_dir::replace(path, &serde_json::to_vec_pretty(settings)?)?;
    Ok(())
}

/// Each room's reloadable part from `config`'s tables, with `settings`
/// merged in where they name the room. Nothing is applied.
fn lives_of(config: &EdgeConfig, settings: Option<&RoomSettings>) -> anyhow::Result<Vec<RoomLive>> {
    config
        .tables
        .iter()
        .map(|table| {
            let merged = match settings.and_then(|s| s.room(&table.id)) {
                Some(pushed) => table.with_settings(pushed),
                None => table.clone(),
            };
            let engine = merged
                .validate()
                .map_err(|e| anyhow::anyhow!("room {}: {}: {e}", table.id, e.field()))?;
            let spec = crate::rooms::RoomSpec::from_table(&merged, engine)
                .map_err(|e| anyhow::anyhow!("room {}: {}: {}", table.id, e.field, e.problem))?;
            RoomLive::from_spec(&spec).with_context(|| format!("room {}", table.id))
        })
        .collect()
}

/// The fields of `new` that differ from `old` and that a reload cannot
/// apply, as `table.key` paths.
fn restart_needed(old: &EdgeConfig, new: &EdgeConfig) -> Vec<String> {
    let mut fields = Vec::new();
    let sections = |c: &EdgeConfig| {
        serde_json::json!({
            "node": c.node,
            "xdp": c.xdp,
            "aggregator": c.aggregator,
        })
    };
    diff("", &sections(old), &sections(new), &mut fields);
    fields.retain(|f| {
        !RELOADABLE
            .iter()
            .any(|r| f == r || f.starts_with(&format!("{r}.")))
    });
    if old.rooms.len() != new.rooms.len() {
        fields.push(format!(
            "rooms ({} instead of {})",
            new.rooms.len(),
            old.rooms.len()
        ));
    }
    for (i, (o, n)) in old.rooms.iter().zip(&new.rooms).enumerate() {
        for (name, changed) in [
            ("id", o.id != n.id),
            ("host", o.host != n.host),
            ("path", o.path != n.path),
            (
                "additional_routes",
                o.additional_routes != n.additional_routes,
            ),
            ("origins", o.upstream != n.upstream),
        ] {
            if changed {
                fields.push(format!("rooms[{i}].{name}"));
            }
        }
    }
    fields
}

/// Appends the paths where `a` and `b` differ (a whole table when it appears
/// or disappears).
fn diff(at: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value;
    let join = |k: &str| {
        if at.is_empty() {
            k.to_owned()
        } else {
            format!("{at}.{k}")
        }
    };
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let null = Value::Null;
                diff(
                    &join(k),
                    a.get(k).unwrap_or(&null),
                    b.get(k).unwrap_or(&null),
                    out,
                );
            }
        }
        (a, b) if a != b => out.push(at.to_owned()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra_node: &str, rest: &str) -> EdgeConfig {
        let text = format!(
            "[node]\nid = \"n1\"\nlisten = \"127.0.0.1:0\"\n{extra_node}\n\
             [[rooms]]\nid = \"shop\"\nhost = \"shop.example\"\npath = \"/\"\norigin = \"127.0.0.1:9\"\n\
             total_active_users = 10\nnew_users_per_minute = 5\n{rest}"
        );
        EdgeConfig::parse(Path::new("edge.toml"), &text).unwrap()
    }

    #[test]
    fn limits_and_cookie_keys_reload_listeners_and_routes_do_not() {
        let base = parse("", "");
        assert!(restart_needed(&base, &parse("", "")).is_empty());
        // Limits are reloadable.
        let mut limits = parse("", "");
        limits.rooms[0].engine = waitroom_common::room::RoomConfig {
            total_active_users: 500,
            ..limits.rooms[0].engine.config().clone()
        }
        .validate()
        .unwrap()
        .named("shop");
        assert!(restart_needed(&base, &limits).is_empty());
        let keys = parse(
            "cookie_keys = [{ id = 1, secret_hex = \"0000000000000000000000000000000000000000000000000000000000000000\" }]",
            "",
        );
        assert!(
            restart_needed(&base, &keys).is_empty(),
            "keys rotate on reload"
        );
        let listen = parse("workers = 3", "");
        assert_eq!(restart_needed(&base, &listen), vec!["node.workers"]);
        let xdp = parse("", "[xdp]\ninterface = \"veth0\"\nports = [80]\n");
        assert_eq!(restart_needed(&base, &xdp), vec!["xdp"]);
    }

    #[test]
    fn a_rerouted_room_names_its_field() {
        let base = parse("", "");
        let mut moved = base.clone();
        moved.rooms[0].path = "/drop".into();
        assert_eq!(restart_needed(&base, &moved), vec!["rooms[0].path"]);
    }
}
