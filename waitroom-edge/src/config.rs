//! The node's configuration: one TOML file.
//!
//! Every error names the file, the line and column, and the key path
//! (`node.toml:14:19: rooms[0].queueing_method: unknown variant ...`), because
//! the person reading it is an operator at a terminal on launch day (see
//! [`waitroom_runtime::config_file`]). A `[[rooms]]` table is the
//! [`RoomTable`] the aggregator reads too.
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use waitroom_common::room_table::{self, RoomTable};
use waitroom_runtime::config_file::{self, ConfigText};

pub use waitroom_runtime::config_file::ConfigError;

/// The `[node]` table: who this node is and where it listens.
#[derive(Debug, Clone, Deserialize, Serialize)]
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
    /// A file holding the admin bearer token (or `NAME TOKEN` lines, one per
    /// operator, whose names the control API's audit log records). Changing
    /// the deny list or, without an aggregator, the room settings always
    /// needs one; an `admin_listen` off loopback needs it for every request.
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
    /// CPUs the workers are pinned to: worker `i` runs only on
    /// `cpu_affinity[i % len]` (CPU numbers as `taskset -c` counts them).
    /// Empty, the default: not pinned, the scheduler moves workers as it
    /// likes. Pinned, a worker keeps its caches and, since each worker has
    /// its own `SO_REUSEPORT` listener, a connection stays on one core from
    /// accept to response (nginx `worker_cpu_affinity`). For a machine the
    /// node has to itself: two pinned workers on one CPU share it.
    #[serde(default)]
    pub cpu_affinity: Vec<usize>,
    /// The file holding the node counters (survives restarts); default
    /// `edge.counters` in the state directory. See [`Self::counters_file`].
    #[serde(default)]
    pub counters_path: Option<PathBuf>,
    /// Tickets the ticket ledger (`<counters file>.tickets`) remembers: where
    /// each one's count sits, so a replayed cookie moves nothing twice. A
    /// ticket needs its entry while its count can sit anywhere (its session,
    /// or three minutes of waiting); the default, 1,048,576 (about 24 MiB),
    /// holds e.g. 100,000 new tickets a minute for ten minutes. A ticket whose
    /// entry was evicted is believed once more. Changing it starts the ledger
    /// afresh at the next start.
    #[serde(default = "default_ticket_ledger_entries")]
    pub ticket_ledger_entries: usize,
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
    /// New tickets one client address (an IPv6 client: its /64) may be
    /// issued per minute in rooms that queue, sustained; over it the request
    /// gets 429 with `Retry-After` and no ticket (see
    /// [`crate::new_tickets`]). 0 turns the limit off. A browser keeps its
    /// cookie and is issued a new ticket only on arrival and after its
    /// session ends, so one person makes a handful an hour; a script that
    /// drops its cookie at 20 requests a second makes 1,200 a minute. The
    /// default, 120 (two a second), leaves room for the many people behind
    /// one carrier-grade NAT address or one office gateway who keep arriving
    /// during a launch, while cutting such a script to a tenth.
    #[serde(default = "default_new_tickets_per_address_per_minute")]
    pub new_tickets_per_address_per_minute: u32,
    /// New tickets an address that has been quiet may be issued at once, on
    /// top of the sustained rate. The default, 600, lets an office or a NAT
    /// address full of people all arrive in the same second when a sale
    /// opens.
    #[serde(default = "default_new_tickets_burst_per_address")]
    pub new_tickets_burst_per_address: u32,
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
    /// Serve HTTP/1.1's plain requests (`GET`/`HEAD`, no body, no upgrade)
    /// with the node's own HTTP/1 exchange, and everything else with hyper
    /// (`crate::http::h1`; about a fifth of a queue page's CPU). `false`:
    /// hyper serves every request, as before it existed.
    #[serde(default = "default_true")]
    pub http1_fast_path: bool,
    /// Grace period for in-flight requests on SIGTERM, milliseconds.
    #[serde(default = "default_grace_ms")]
    pub shutdown_grace_ms: u64,
    /// Cookie keys; the first seals, all open (rotation). Absent: a key derived
    /// at first start and kept beside the counters file.
    #[serde(default)]
    pub cookie_keys: Vec<CookieKey>,
    /// Load balancers and proxies in front of the node (addresses or CIDR
    /// blocks): only their `X-Forwarded-For` / `Forwarded` are believed, and
    /// only they may send a PROXY protocol header (nginx `set_real_ip_from`).
    /// Empty (the default): every client is its connection's address, and
    /// what clients say about themselves is removed before the origin sees
    /// it. See [`crate::forwarded`].
    #[serde(default)]
    pub trusted_proxies: Vec<crate::forwarded::ProxyNet>,
    /// Every connection to `listen` starts with a PROXY protocol header (v1
    /// or v2) from an address in `trusted_proxies`, naming the client
    /// (HAProxy `accept-proxy`, nginx `listen ... proxy_protocol`). A
    /// connection without one is closed.
    #[serde(default)]
    pub proxy_protocol: bool,
    /// `[node.access_log]`: one line per request (off unless `enabled`).
    #[serde(default)]
    pub access_log: Option<crate::access_log::AccessLogConfig>,
    /// `[node.unrouted]`: what requests no room covers get, 404 (the
    /// default) or a default origin (see [`crate::unrouted`]).
    #[serde(default)]
    pub unrouted: Option<crate::unrouted::UnroutedConfig>,
}

impl NodeSection {
    /// Every number within what the node can run with: a value that would
    /// only fail later (a worker that cannot start, a timeout of zero, a
    /// connection limit the semaphore cannot hold) is refused here, so that
    /// `--check` passing means the node starts. Returns the key and why.
    pub fn check_ranges(&self) -> Result<(), (String, String)> {
        fn within<T: PartialOrd + std::fmt::Display>(
            key: &str,
            value: T,
            low: T,
            high: T,
        ) -> Result<(), (String, String)> {
            if value < low || value > high {
                return Err((
                    key.to_owned(),
                    format!("{value} is outside {low} ..= {high}"),
                ));
            }
            Ok(())
        }
        within("workers", self.workers, 0, 1024)?;
        if let Some(cpu) = self
            .cpu_affinity
            .iter()
            .find(|&&cpu| !crate::http::cpu_allowed(cpu))
        {
            return Err((
                "cpu_affinity".into(),
                format!(
                    "CPU {cpu} is not one this process may run on (allowed: {:?})",
                    crate::http::allowed_cpus()
                ),
            ));
        }
        within(
            "max_connections_per_worker",
            self.max_connections_per_worker,
            1,
            1_000_000,
        )?;
        within(
            "max_connections_per_address",
            self.max_connections_per_address,
            0,
            1_000_000,
        )?;
        // At most one a millisecond: the limiter counts in milliseconds.
        within(
            "new_tickets_per_address_per_minute",
            self.new_tickets_per_address_per_minute,
            0,
            60_000,
        )?;
        within(
            "new_tickets_burst_per_address",
            self.new_tickets_burst_per_address,
            1,
            1_000_000,
        )?;
        within(
            "header_read_timeout_ms",
            self.header_read_timeout_ms,
            1,
            600_000,
        )?;
        within(
            "keepalive_timeout_ms",
            self.keepalive_timeout_ms,
            1,
            3_600_000,
        )?;
        within("send_timeout_ms", self.send_timeout_ms, 1, 3_600_000)?;
        within("max_header_bytes", self.max_header_bytes, 1_024, 1_048_576)?;
        within("max_headers", self.max_headers, 1, 1_024)?;
        within("shutdown_grace_ms", self.shutdown_grace_ms, 0, 600_000)?;
        within(
            "ticket_ledger_entries",
            self.ticket_ledger_entries,
            waitroom_common::ledger::MIN_ENTRIES,
            waitroom_common::ledger::MAX_ENTRIES,
        )?;
        let proxy_protocol_without_trust = self.trusted_proxies.is_empty()
            && (self.proxy_protocol || self.tls.as_ref().is_some_and(|t| t.proxy_protocol));
        if proxy_protocol_without_trust {
            let key = if self.proxy_protocol {
                "proxy_protocol"
            } else {
                "tls.proxy_protocol"
            };
            return Err((
                key.into(),
                "needs trusted_proxies: a PROXY header is accepted only from a listed proxy, so every connection would be closed".into(),
            ));
        }
        if let Some(log) = &self.access_log {
            log.check()
                .map_err(|(key, problem)| (format!("access_log.{key}"), problem))?;
        }
        if self.id.is_empty() || self.id.len() > 253 {
            return Err(("id".into(), "must be 1 to 253 characters".into()));
        }
        let mut ids = std::collections::BTreeSet::new();
        for (i, key) in self.cookie_keys.iter().enumerate() {
            if !ids.insert(key.id) {
                return Err((
                    format!("cookie_keys[{i}].id"),
                    format!("key id {} is used twice", key.id),
                ));
            }
            let hex_ok =
                key.secret_hex.len() == 64 && key.secret_hex.bytes().all(|b| b.is_ascii_hexdigit());
            if !hex_ok {
                return Err((
                    format!("cookie_keys[{i}].secret_hex"),
                    "must be 64 hex digits (32 bytes)".into(),
                ));
            }
        }
        Ok(())
    }

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

    /// Where the ticket ledger lives: beside the counters file, `.tickets` added.
    #[must_use]
    pub fn ticket_ledger_file(&self) -> PathBuf {
        crate::ledger::ledger_file(&self.counters_file())
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
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    pub listen: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Every connection to this listener starts with a PROXY protocol
    /// header, before the TLS handshake (see `node.proxy_protocol`).
    #[serde(default)]
    pub proxy_protocol: bool,
}

/// One cookie key: an id carried in every cookie, and 32 bytes as hex.
#[derive(Clone, Deserialize, Serialize)]
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
fn default_max_connections_per_address() -> usize {
    512
}
fn default_new_tickets_per_address_per_minute() -> u32 {
    120
}
fn default_new_tickets_burst_per_address() -> u32 {
    600
}
fn default_ticket_ledger_entries() -> usize {
    1 << 20
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
fn default_true() -> bool {
    true
}
fn default_grace_ms() -> u64 {
    10_000
}

/// Reads and validates `path`.
pub fn load(path: &Path) -> Result<EdgeConfig, ConfigError> {
    EdgeConfig::parse(path, &config_file::read(path)?)
}

/// The whole validated configuration of a node.
#[derive(Debug, Clone)]
pub struct EdgeConfig {
    pub node: NodeSection,
    /// `[node.unrouted]` validated: the default origin, or `None` for 404.
    pub default_origin: Option<crate::unrouted::DefaultOrigin>,
    pub rooms: Vec<crate::rooms::RoomSpec>,
    /// The `[[rooms]]` tables as written, in the same order as `rooms`:
    /// what pushed room settings are merged into
    /// ([`RoomTable::with_settings`]).
    pub tables: Vec<RoomTable>,
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
            rooms: Vec<RoomTable>,
            #[serde(default)]
            aggregator: Option<crate::gossip::GossipConfig>,
            #[serde(default)]
            xdp: Option<crate::xdp::XdpConfig>,
        }
        let file = ConfigText::new(path, text);
        let raw: Raw = file.parse()?;
        if let Err((key, problem)) = raw.node.check_ranges() {
            return Err(file.invalid(format!("node.{key}"), problem));
        }
        if raw.rooms.is_empty() {
            return Err(file.invalid("rooms", "at least one [[rooms]] table is required"));
        }
        if raw.rooms.len() > crate::counters::SLOTS {
            return Err(file.invalid(
                "rooms",
                format!(
                    "{} rooms; a node serves at most {} (the slots of its counters file)",
                    raw.rooms.len(),
                    crate::counters::SLOTS
                ),
            ));
        }
        let engines =
            room_table::validate_rooms(&raw.rooms).map_err(|e| file.invalid(e.key(), e.problem))?;
        let rooms = raw
            .rooms
            .iter()
            .zip(engines)
            .enumerate()
            .map(|(index, (table, engine))| {
                crate::rooms::RoomSpec::from_table(table, engine)
                    .map_err(|e| file.invalid(format!("rooms[{index}].{}", e.field), e.problem))
            })
            .collect::<Result<Vec<_>, _>>()?;
        crate::rooms::check_routes(&rooms).map_err(|e| file.invalid(e.key, e.problem))?;
        let default_origin = match &raw.node.unrouted {
            Some(unrouted) => unrouted
                .validate()
                .map_err(|e| file.invalid(format!("node.unrouted.{}", e.field), e.problem))?,
            None => None,
        };
        crate::admin::check_listen(&raw.node)
            .map_err(|problem| file.invalid("node.admin_listen", problem))?;
        if let Some(gossip) = &raw.aggregator {
            gossip
                .validate()
                .map_err(|e| file.invalid(format!("aggregator.{}", e.field), e.problem))?;
        }
        if let Some(xdp) = &raw.xdp {
            xdp.validate()
                .map_err(|e| file.invalid(format!("xdp.{}", e.field), e.problem))?;
        }
        Ok(Self {
            node: raw.node,
            default_origin,
            rooms,
            tables: raw.rooms,
            aggregator: raw.aggregator,
            xdp: raw.xdp,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[node]` takes lines 1-3; the room's first key is on line 5.
    const NODE: &str = "[node]\nid = \"n\"\nlisten = \"127.0.0.1:0\"\n";
    const ROOM: &str = "[[rooms]]\nid = \"shop\"\norigin = \"127.0.0.1:9\"\ntotal_active_users = 100\nnew_users_per_minute = 50\n";

    fn parse(text: &str) -> Result<EdgeConfig, ConfigError> {
        EdgeConfig::parse(Path::new("node.toml"), &format!("{NODE}{text}"))
    }

    fn refused(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn the_example_room_table_with_pools_health_and_steering_is_accepted() {
        let config = parse(room_table::EXAMPLE).unwrap();
        let room = &config.rooms[0];
        assert_eq!(
            (room.id.as_str(), room.host.as_str()),
            ("shop", "shop.example")
        );
        assert_eq!(room.upstream.steering, crate::upstream::Steering::Dynamic);
        assert_eq!(room.upstream.pools.len(), 2);
        assert!(room.upstream.pools[1].tls.is_some());
        assert_eq!(room.upstream.health.as_ref().unwrap().path, "/healthz");
        assert_eq!(room.engine.total_active_users(), 200);
    }

    #[test]
    fn cpu_affinity_names_a_cpu_the_process_cannot_use() {
        let allowed = crate::http::allowed_cpus();
        let node =
            |list: &str| NODE.replace("[node]\n", &format!("[node]\ncpu_affinity = {list}\n"));
        let ok = EdgeConfig::parse(
            Path::new("node.toml"),
            &format!("{}{ROOM}", node(&format!("{allowed:?}"))),
        )
        .unwrap();
        assert_eq!(ok.node.cpu_affinity, allowed);
        let err = EdgeConfig::parse(Path::new("node.toml"), &format!("{}{ROOM}", node("[4096]")))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("node.cpu_affinity: CPU 4096 is not one this process may run on"),
            "{err}"
        );
    }

    #[test]
    fn an_unknown_key_is_named_with_its_line() {
        let err = refused(&format!("{ROOM}new_users_per_hour = 1\n"));
        assert!(
            err.starts_with(
                "node.toml:9:1: rooms[0].new_users_per_hour: unknown field `new_users_per_hour`"
            ),
            "{err}"
        );
    }

    #[test]
    fn an_unknown_queueing_method_is_named_with_its_line() {
        let err = refused(&format!("{ROOM}queueing_method = \"lottery\"\n"));
        assert!(
            err.starts_with(
                "node.toml:9:19: rooms[0].queueing_method: unknown variant `lottery`, expected one of"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_bad_limit_is_named_with_its_line() {
        let err = refused(&ROOM.replace("new_users_per_minute = 50", "new_users_per_minute = 500"));
        assert_eq!(
            err,
            "node.toml:8:24: rooms[0].new_users_per_minute: new_users_per_minute (500) is above total_active_users (100)"
        );
    }

    #[test]
    fn a_duplicate_room_id_is_named_with_its_line() {
        let err = refused(&format!("{ROOM}{ROOM}"));
        assert_eq!(
            err,
            "node.toml:10:6: rooms[1].id: duplicate room id \"shop\" (also rooms[0])"
        );
    }

    /// Each problem names the key path from the top of the file, whether
    /// serde, the shared room table or the node's upstream check found it.
    #[test]
    fn every_room_problem_names_its_key_path() {
        let no_origin = ROOM.replace("origin = \"127.0.0.1:9\"\n", "");
        let pool = "[[rooms.pools]]\nname = \"p\"\norigins = [\"127.0.0.1:1\"]\n";
        let cases = [
            (no_origin.clone(), "rooms[0].origin"),
            (ROOM.replace("127.0.0.1:9", "no-port"), "rooms[0].origin"),
            (format!("{ROOM}{pool}"), "rooms[0].pools"),
            (
                format!("{no_origin}{pool}tls = 1\n"),
                "rooms[0].pools[0].tls",
            ),
            (
                format!("{no_origin}[[rooms.pools]]\norigins = [\"a:1\"]\n"),
                "rooms[0].pools[0].name",
            ),
            (format!("{no_origin}{pool}{pool}"), "rooms[0].pools[1].name"),
            (
                format!(
                    "{no_origin}{pool}{}",
                    pool.replace("\"p\"", "\"q\"").replace("127.0.0.1:1", "x")
                ),
                "rooms[0].pools[1].origins",
            ),
            (
                format!("{no_origin}{pool}sni = \"x\"\n"),
                "rooms[0].pools[0].tls",
            ),
            (
                format!("{ROOM}steering = \"fastest\"\n"),
                "rooms[0].steering",
            ),
            (
                format!("{ROOM}steering = \"dynamic\"\n"),
                "rooms[0].steering",
            ),
            (
                format!("{ROOM}[rooms.health]\nfall = 0\n"),
                "rooms[0].health.fall",
            ),
            (
                format!("{ROOM}[rooms.health]\ninterval_ms = 100\ntimeout_ms = 200\n"),
                "rooms[0].health.timeout_ms",
            ),
            (
                format!("{ROOM}[rooms.health]\npath = \"x\"\n"),
                "rooms[0].health.path",
            ),
            (
                format!("{ROOM}[rooms.health]\nintervall_ms = 5\n"),
                "rooms[0].health.intervall_ms",
            ),
            (
                format!("{ROOM}queue_status = 500\n"),
                "rooms[0].queue_status",
            ),
            (
                format!("{ROOM}origin_timeout_ms = 0\n"),
                "rooms[0].origin_timeout_ms",
            ),
            (ROOM.replace("id = \"shop\"\n", ""), "rooms[0].id"),
            (
                format!(
                    "{ROOM}[[rooms.events]]\nname = \"sale\"\nevent_start_time = \"2026-12-01T10:00:00Z\"\nevent_end_time = \"2026-12-01T09:00:00Z\"\n"
                ),
                "rooms[0].events[0].event_end_time",
            ),
            (
                format!(
                    "{ROOM}[[rooms.events]]\nname = \"sale\"\nprequeue_start_time = \"2026-12-01T09:30:00\"\nevent_start_time = \"2026-12-01T10:00:00Z\"\nevent_end_time = \"2026-12-01T11:00:00Z\"\n"
                ),
                "rooms[0].events[0].prequeue_start_time",
            ),
        ];
        for (text, key) in cases {
            let err = parse(&text).unwrap_err();
            assert_eq!(err.key(), key, "{err}");
            let ConfigError::Invalid { at, .. } = &err else {
                panic!("{err}");
            };
            assert!(at.is_some(), "{err}: no position");
        }
    }

    #[test]
    fn other_tables_are_named_too() {
        assert_eq!(parse("").unwrap_err().key(), "rooms");
        let err = refused(&format!(
            "{ROOM}[aggregator]\naddress = \"127.0.0.1:1\"\nca = \"c\"\ncert = \"c\"\nkey = \"k\"\ninterval_ms = 5\n"
        ));
        assert!(
            err.starts_with("node.toml:14:15: aggregator.interval_ms: 5 is outside"),
            "{err}"
        );
        let err = refused(&format!("{ROOM}[node.tls]\n"));
        assert_eq!(err, "node.toml:9:1: node.tls.listen: missing");
    }

    #[test]
    fn the_access_log_table_is_checked_by_field() {
        let config = parse(&format!("[node.access_log]\nenabled = true\n{ROOM}")).unwrap();
        let log = config.node.access_log.unwrap();
        assert_eq!(
            (log.path.to_str(), log.format),
            (
                Some(crate::access_log::STDERR),
                crate::access_log::AccessLogFormat::Json
            )
        );
        assert!(
            parse(ROOM).unwrap().node.access_log.is_none(),
            "off by default"
        );
        let err = refused(&format!("[node.access_log]\nformat = \"apache\"\n{ROOM}"));
        assert!(
            err.starts_with("node.toml:5:10: node.access_log.format: unknown variant `apache`"),
            "{err}"
        );
        let err = refused(&format!("[node.access_log]\npath = \"\"\n{ROOM}"));
        assert!(
            err.contains("node.access_log.path: must be a file"),
            "{err}"
        );
        let err = refused(&format!("[node.access_log]\nqueue_per_worker = 1\n{ROOM}"));
        assert!(
            err.contains("node.access_log.queue_per_worker: 1 is outside"),
            "{err}"
        );
        let err = refused(&format!("[node.access_log]\nenable = true\n{ROOM}"));
        assert!(
            err.contains("node.access_log.enable: unknown field"),
            "{err}"
        );
    }

    #[test]
    fn the_deploy_example_is_valid() {
        let text = include_str!("../../deploy/edge.example.toml");
        let config = EdgeConfig::parse(Path::new("edge.example.toml"), text).unwrap();
        assert_eq!(config.rooms[0].id, "shop");
    }
}
