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
    /// Admin listener: metrics, status, deny list. Loopback unless
    /// `admin_token_file` is set (see `crate::admin`).
    #[serde(default)]
    pub admin_listen: Option<SocketAddr>,
    /// A file holding the admin bearer token. Changing the deny list always
    /// needs it; an `admin_listen` off loopback needs it for every request.
    #[serde(default)]
    pub admin_token_file: Option<PathBuf>,
    /// The directory the node owns for its private files: the cookie key it
    /// makes without `cookie_keys`, the counters, the persisted deny list.
    /// Default: `counters_path`'s directory when that is set (older
    /// configs), else `/var/lib/waitroom` (the unit's `StateDirectory=`).
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// Worker threads; 0 means one per core.
    #[serde(default)]
    pub workers: usize,
    /// The file holding the node counters (survives restarts); default
    /// `edge.counters` in the state directory. See [`Self::counters_file`].
    #[serde(default)]
    pub counters_path: Option<PathBuf>,
    /// Open connections per worker before new ones wait (backpressure).
    #[serde(default = "default_max_connections")]
    pub max_connections_per_worker: usize,
    /// A client must send its full request head within this many milliseconds.
    #[serde(default = "default_header_timeout_ms")]
    pub header_read_timeout_ms: u64,
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

impl NodeSection {
    /// The state directory: see the field's docs.
    #[must_use]
    pub fn state_dir(&self) -> PathBuf {
        if let Some(dir) = &self.state_dir {
            return dir.clone();
        }
        match self.counters_path.as_deref().and_then(Path::parent) {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
            _ => PathBuf::from("/var/lib/waitroom"),
        }
    }

    /// Where the counters live: `counters_path`, or `edge.counters` in the
    /// state directory.
    #[must_use]
    pub fn counters_file(&self) -> PathBuf {
        self.counters_path
            .clone()
            .unwrap_or_else(|| self.state_dir().join("edge.counters"))
    }
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
fn default_max_connections() -> usize {
    10_000
}
fn default_header_timeout_ms() -> u64 {
    5_000
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
        crate::admin::check_listen(&raw.node).map_err(|problem| ConfigError::Field {
            path: path.to_owned(),
            field: "node.admin_listen".into(),
            problem,
        })?;
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
