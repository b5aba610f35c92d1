//! The node's configuration: one TOML file.
//!
//! Every error names the file, the field and what is wrong, because the person
//! reading it is an operator at a terminal on launch day.
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use serde::Deserialize;

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
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
    #[error("{path}: rooms[{index}] ({room}): {field}: {problem}")]
    Room {
        path: PathBuf,
        index: usize,
        room: String,
        field: String,
        problem: String,
    },
    #[error("{path}: {field}: {problem}")]
    Field {
        path: PathBuf,
        field: String,
        problem: String,
    },
}

/// The `[node]` table: who this node is and where it listens.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSection {
    /// Unique per node; the aggregator keys reports by it.
    pub id: String,
    /// The colo (data center) this node serves; slots are split between colos.
    #[serde(default = "default_colo")]
    pub colo: String,
    /// Plain HTTP listener for visitors (HTTP/1.1 and h2c).
    pub listen: SocketAddr,
    /// Optional TLS listener (HTTP/1.1 and HTTP/2 via ALPN).
    #[serde(default)]
    pub tls: Option<TlsSection>,
    /// Loopback-only admin listener: metrics, status, deny list.
    #[serde(default)]
    pub admin_listen: Option<SocketAddr>,
    /// Worker threads; 0 means one per core.
    #[serde(default)]
    pub workers: usize,
    /// Shared-memory file holding the node counters (survives restarts).
    #[serde(default = "default_counters_path")]
    pub counters_path: PathBuf,
    /// Open connections per worker (nginx `worker_connections`, HAProxy
    /// `maxconn`). At the limit the oldest idle connection is closed for each
    /// new one (nginx does the same with keep-alive connections); with none
    /// idle, new connections wait in the kernel backlog.
    #[serde(default = "default_max_connections")]
    pub max_connections_per_worker: usize,
    /// Open connections from one client address across the node (nginx
    /// `limit_conn`, HAProxy `src_conn_cur`); more are closed at accept.
    /// 0 turns the cap off. Generous by default: carrier-grade NAT puts many
    /// visitors behind one address.
    #[serde(default = "default_max_connections_per_address")]
    pub max_connections_per_address: usize,
    /// From accept to the first complete request head, milliseconds (nginx
    /// `client_header_timeout`, HAProxy `timeout http-request`): covers the TLS
    /// handshake, HTTP version detection, the HTTP/2 preface and SETTINGS.
    #[serde(default = "default_header_timeout_ms")]
    pub header_read_timeout_ms: u64,
    /// A connection with no request in flight is closed after this many
    /// milliseconds (nginx `keepalive_timeout`, HAProxy `timeout
    /// http-keep-alive`); HTTP/2 clients get a GOAWAY.
    #[serde(default = "default_keepalive_timeout_ms")]
    pub keepalive_timeout_ms: u64,
    /// A response write that makes no progress for this many milliseconds
    /// closes the connection (nginx `send_timeout`, HAProxy `timeout client`):
    /// a client that never reads is not held for ever.
    #[serde(default = "default_send_timeout_ms")]
    pub send_timeout_ms: u64,
    /// Largest request head accepted, bytes.
    #[serde(default = "default_max_header_bytes")]
    pub max_header_bytes: usize,
    /// Most request headers accepted.
    #[serde(default = "default_max_headers")]
    pub max_headers: usize,
    /// Grace period for in-flight requests on SIGTERM, milliseconds.
    #[serde(default = "default_grace_ms")]
    pub shutdown_grace_ms: u64,
    /// Cookie keys; the first seals, all open (rotation). Absent: a key derived
    /// at first start and kept beside the counters file.
    #[serde(default)]
    pub cookie_keys: Vec<CookieKey>,
}

/// TLS listener settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    pub listen: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// One cookie key: an id carried in every cookie, and 32 bytes as hex.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CookieKey {
    pub id: u8,
    pub secret_hex: String,
}

impl std::fmt::Debug for CookieKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CookieKey")
            .field("id", &self.id)
            .field("secret_hex", &"<redacted>")
            .finish()
    }
}

fn default_colo() -> String {
    "local".into()
}
fn default_counters_path() -> PathBuf {
    "/dev/shm/waitroom-edge.counters".into()
}
fn default_max_connections() -> usize {
    10_000
}
fn default_max_connections_per_address() -> usize {
    512
}
fn default_header_timeout_ms() -> u64 {
    5_000
}
fn default_keepalive_timeout_ms() -> u64 {
    30_000
}
fn default_send_timeout_ms() -> u64 {
    60_000
}
fn default_max_header_bytes() -> usize {
    16 * 1024
}
fn default_max_headers() -> usize {
    64
}
fn default_grace_ms() -> u64 {
    10_000
}

/// Reads and validates `path`.
pub fn load(path: &Path) -> Result<EdgeConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    EdgeConfig::parse(path, &text)
}

/// The whole validated configuration of a node.
#[derive(Debug, Clone)]
pub struct EdgeConfig {
    pub node: NodeSection,
    pub rooms: Vec<crate::rooms::RoomSpec>,
    /// The `[aggregator]` table; without it the node is the whole world.
    pub aggregator: Option<crate::gossip::GossipConfig>,
    /// The `[xdp]` table; without it the node runs without its XDP program.
    pub xdp: Option<crate::xdp::XdpConfig>,
}

impl EdgeConfig {
    /// Parses and validates a configuration read from `path`.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            node: NodeSection,
            #[serde(default)]
            rooms: Vec<toml::Table>,
            #[serde(default)]
            aggregator: Option<crate::gossip::GossipConfig>,
            #[serde(default)]
            xdp: Option<crate::xdp::XdpConfig>,
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
            let spec =
                crate::rooms::RoomSpec::from_table(table).map_err(|e| ConfigError::Room {
                    path: path.to_owned(),
                    index,
                    room: e.room,
                    field: e.field,
                    problem: e.problem,
                })?;
            if let Some(prev) = rooms
                .iter()
                .position(|r: &crate::rooms::RoomSpec| r.id == spec.id)
            {
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
