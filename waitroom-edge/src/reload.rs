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
use std::{
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
};

use arc_swap::ArcSwap;
use waitroom_common::time::UnixMillis;
use waitroom_runtime::{
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
}

impl ReloadState {
    #[must_use]
    pub fn new(config: &EdgeConfig, https_cert: Option<Arc<CertSwap>>, now: UnixMillis) -> Self {
        Self {
            applied: ArcSwap::from_pointee(config.clone()),
            https_cert,
            outcomes: ReloadOutcomes::new(now),
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
        // certificate refuses the whole file.
        let mut lives = Vec::with_capacity(new.rooms.len());
        for spec in &new.rooms {
            lives.push(
                RoomLive::from_spec(spec).map_err(|source| ReloadError::Room {
                    path: path.to_owned(),
                    source,
                })?,
            );
        }
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
        let mut changes = Vec::new();
        for (room, live) in self.rooms.iter().zip(lives) {
            let before = room.live.load();
            if before.engine.config() != live.engine.config() {
                changes.push(format!("room {}: limits or method", room.spec.id));
            }
            live.bypass.carry_over(&before.bypass);
            room.live.store(Arc::new(live));
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
