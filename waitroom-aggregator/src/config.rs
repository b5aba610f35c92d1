//! The aggregator's configuration: one TOML file.
//!
//! ```toml
//! listen = "0.0.0.0:4433"            # UDP, QUIC
//! admin_listen = "127.0.0.1:9300"    # optional: /status, /metrics
//! ca = "/etc/waitroom/ca.pem"        # the cluster CA: the only issuer of node certificates
//! cert = "/etc/waitroom/aggregator.pem"
//! key = "/etc/waitroom/aggregator.key"
//! snapshot_path = "/var/lib/waitroom/aggregator.json"
//! snapshot_interval_ms = 5000
//! node_timeout_ms = 15000
//!
//! [[rooms]]                           # the same id and limits as on the nodes
//! id = "shop"
//! total_active_users = 200
//! new_users_per_minute = 50
//! ```
//! A `[[rooms]]` table may be copied from a node's config as it is: the keys
//! only a node uses (`host`, `path`, `origin`, ...) are accepted and ignored.
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use serde::Deserialize;
use waitroom_common::room::RoomConfig;

use waitroom_common::cluster::RoomDef;
use waitroom_runtime::tls::TlsFiles;

/// Keys of a node's `[[rooms]]` table that mean nothing to the aggregator.
const NODE_ONLY_KEYS: [&str; 6] = [
    "host",
    "path",
    "origin",
    "origin_timeout_ms",
    "queue_status",
    "queue_page",
];

/// Why the configuration was refused. Each names the file and the field.
#[derive(Debug, thiserror::Error)]
pub enum AggregatorConfigError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Syntax {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("{path}: {field}: {problem}")]
    Field {
        path: PathBuf,
        field: &'static str,
        problem: String,
    },
    #[error("{path}: rooms[{index}] ({room}): {field}: {problem}")]
    Room {
        path: PathBuf,
        index: usize,
        room: String,
        field: String,
        problem: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    listen: SocketAddr,
    #[serde(default)]
    admin_listen: Option<SocketAddr>,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    snapshot_path: PathBuf,
    #[serde(default = "default_snapshot_interval_ms")]
    snapshot_interval_ms: u64,
    #[serde(default = "default_node_timeout_ms")]
    node_timeout_ms: u64,
    #[serde(default)]
    rooms: Vec<toml::Table>,
}

fn default_snapshot_interval_ms() -> u64 {
    5_000
}

/// Longer than a node's default `stale_after_ms` (10 s), so a node cut off
/// from the aggregator has fallen back to its local limit before its lease
/// and live counts are given to others.
fn default_node_timeout_ms() -> u64 {
    15_000
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct AggregatorConfig {
    /// UDP address for QUIC (port 0: any free port, printed when ready).
    pub listen: SocketAddr,
    /// Loopback address for `/status` and `/metrics`.
    pub admin_listen: Option<SocketAddr>,
    pub tls: TlsFiles,
    /// Where the state is written (temp file + rename), and read at start.
    pub snapshot_path: PathBuf,
    pub snapshot_interval_ms: u64,
    /// Silence after which a node's live counts are forgotten.
    pub node_timeout_ms: u64,
    pub rooms: Vec<RoomDef>,
}

impl AggregatorConfig {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Self, AggregatorConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| AggregatorConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parses and validates the text of the file at `path`.
    pub fn parse(path: &Path, text: &str) -> Result<Self, AggregatorConfigError> {
        let raw: Raw = toml::from_str(text).map_err(|source| AggregatorConfigError::Syntax {
            path: path.to_owned(),
            source: Box::new(source),
        })?;
        let field = |field, problem: &str| AggregatorConfigError::Field {
            path: path.to_owned(),
            field,
            problem: problem.to_owned(),
        };
        if raw.snapshot_interval_ms < 100 {
            return Err(field("snapshot_interval_ms", "must be at least 100"));
        }
        if raw.node_timeout_ms < 1_000 {
            return Err(field(
                "node_timeout_ms",
                "must be at least 1000 (several report intervals)",
            ));
        }
        if raw.rooms.is_empty() {
            return Err(field("rooms", "at least one [[rooms]] table is required"));
        }
        let mut rooms: Vec<RoomDef> = Vec::with_capacity(raw.rooms.len());
        for (index, mut table) in raw.rooms.into_iter().enumerate() {
            let room_err = |room: &str, field: &str, problem: String| AggregatorConfigError::Room {
                path: path.to_owned(),
                index,
                room: room.to_owned(),
                field: field.to_owned(),
                problem,
            };
            let name = match table.remove("id") {
                Some(toml::Value::String(s)) if !s.is_empty() => s,
                Some(_) => return Err(room_err("?", "id", "must be a non-empty string".into())),
                None => return Err(room_err("?", "id", "missing".into())),
            };
            if let Some(prev) = rooms.iter().position(|r| r.name == name) {
                return Err(room_err(
                    &name,
                    "id",
                    format!("duplicate room id (also rooms[{prev}])"),
                ));
            }
            for key in NODE_ONLY_KEYS {
                table.remove(key);
            }
            let limits: RoomConfig = toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| room_err(&name, "limits", e.message().to_owned()))?;
            let room = limits
                .validate()
                .map_err(|e| room_err(&name, "limits", e.to_string()))?
                .named(&name);
            rooms.push(RoomDef { name, room });
        }
        Ok(Self {
            listen: raw.listen,
            admin_listen: raw.admin_listen,
            tls: TlsFiles {
                ca: raw.ca,
                cert: raw.cert,
                key: raw.key,
            },
            snapshot_path: raw.snapshot_path,
            snapshot_interval_ms: raw.snapshot_interval_ms,
            node_timeout_ms: raw.node_timeout_ms,
            rooms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
listen = "127.0.0.1:0"
ca = "ca.pem"
cert = "a.pem"
key = "a.key"
snapshot_path = "snap.json"
"#;

    fn parse(extra: &str) -> Result<AggregatorConfig, AggregatorConfigError> {
        AggregatorConfig::parse(Path::new("agg.toml"), &format!("{BASE}{extra}"))
    }

    #[test]
    fn a_node_room_table_is_accepted_as_it_is() {
        let config = parse(
            r#"
[[rooms]]
id = "shop"
host = "*"
path = "/"
origin = "127.0.0.1:8081"
total_active_users = 200
new_users_per_minute = 50
"#,
        )
        .unwrap();
        assert_eq!(config.rooms[0].room.total_active_users(), 200);
        assert_eq!(
            config.rooms[0].room.id(),
            waitroom_common::room::RoomId::from_name("shop")
        );
        assert_eq!(config.node_timeout_ms, 15_000);
    }

    #[test]
    fn errors_name_the_field() {
        let err = parse("").unwrap_err().to_string();
        assert!(err.starts_with("agg.toml: rooms:"), "{err}");

        let err =
            parse("[[rooms]]\nid = \"shop\"\ntotal_active_users = 10\nnew_users_per_minute = 20\n")
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("rooms[0] (shop): limits: new_users_per_minute (20)"),
            "{err}"
        );

        let err = parse("[[rooms]]\nid = \"shop\"\ntotal_active_users = 10\nnew_users_per_minute = 5\nnew_users_per_hour = 1\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("new_users_per_hour"), "{err}");

        let err = AggregatorConfig::parse(Path::new("agg.toml"), "listen = \"127.0.0.1:0\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("ca"), "{err}");

        let err = parse("node_timeout_ms = 10\n[[rooms]]\nid = \"a\"\ntotal_active_users = 1\nnew_users_per_minute = 1\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("agg.toml: node_timeout_ms:"), "{err}");

        let two = "[[rooms]]\nid = \"a\"\ntotal_active_users = 1\nnew_users_per_minute = 1\n";
        let err = parse(&format!("{two}{two}")).unwrap_err().to_string();
        assert!(err.contains("rooms[1] (a): id: duplicate"), "{err}");
    }
}
