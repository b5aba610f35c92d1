//! One `[[rooms]]` table, as the node and the aggregator both read it.
//!
//! The example below is [`EXAMPLE`]; the node's and the aggregator's tests
//! parse it, so the promise that one table serves both files is tested.
//!
#![doc = concat!("```toml\n", include_str!("room_table.example.toml"), "```")]
//!
//! Both programs parse the whole table with this one type and check it with
//! [`validate_rooms`], so a table copied from a node's file into the
//! aggregator's is accepted, or refused with the same message, by both. (The
//! aggregator's own tables may leave out the origin: it has none to reach.)
//! With an aggregator, its tables are the cluster's room settings: it pushes
//! them whole, and each node keeps its own [`NODE_KEYS`] (routes, origins)
//! and takes every other key ([`RoomTable::with_settings`]). The table is
//! `Serialize` for that push and for the control API, which reads a changed
//! table back through the same parser.
//!
//! # One definition of each key
//! The engine's limits are fields of [`RoomTable`] rather than a flattened
//! [`RoomConfig`]: serde's `flatten` cannot be combined with
//! `deny_unknown_fields`, and it buffers values, which loses the key path and
//! position of an error. [`RoomTable::limits`] builds the engine's
//! [`RoomConfig`] with a struct literal, so a field added there and not here
//! breaks the build. `RoomConfig` itself is not `Deserialize`.
//!
//! What needs the node's libraries (parsing `host:port`, DNS names, request
//! paths) is checked where the node turns a table into its upstreams; the
//! aggregator takes those strings as they are.
use std::{
    collections::BTreeMap,
    num::{NonZeroU32, NonZeroU64},
    path::PathBuf,
};

use serde::{Deserialize, Serialize};

use crate::bypass::{self, BypassError, BypassRule};
use crate::event::{EventTable, EventsError, validate_events};
use crate::room::{
    CookieSameSite, CookieSecure, DEFAULT_REFRESH_SECS, DEFAULT_SESSION_MINUTES,
    DEFAULT_TICKET_CONNECTION_BUDGET, DEFAULT_TICKET_CONNECTION_WINDOW_SECS, QueueingMethod, Room,
    RoomConfig, RoomError, TicketBinding,
};

/// A complete `[[rooms]]` table with pools, steering and health checks, as the
/// module docs show it; valid in a node's and in the aggregator's file.
pub const EXAMPLE: &str = include_str!("room_table.example.toml");

/// One `[[rooms]]` table.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RoomTable {
    /// Stable name; the room's id, and so every cookie, is derived from it.
    pub id: String,
    /// Host this room covers (`*` for any), without port.
    #[serde(default = "any_host")]
    pub host: String,
    /// Path prefix this room covers.
    #[serde(default = "root_path")]
    pub path: String,
    /// Compare paths case-sensitively (`/DROP` is then not `/drop`). Off by
    /// default: a room should rather cover a spelling than miss it.
    #[serde(default)]
    pub path_case_sensitive: bool,
    /// Merge runs of `/` before routing and forwarding (`//drop` is `/drop`),
    /// as nginx's `merge_slashes on`. On by default.
    #[serde(default = "yes")]
    pub merge_slashes: bool,
    /// More `{ host, path }` pairs this room covers besides `host` + `path`
    /// (Cloudflare's `additional_routes`): one room, one set of limits and
    /// one cookie, reached by several routes. A node's own key, like `host`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_routes: Vec<RouteTable>,
    /// Shorthand for one pool named `default` with this one origin.
    #[serde(default)]
    pub origin: Option<String>,
    /// Origin pools; `None` when the table gives none. A node needs `origin`
    /// or pools; the aggregator needs neither.
    #[serde(default)]
    pub pools: Option<Vec<PoolTable>>,
    /// How a request picks a pool among the healthy ones.
    #[serde(default)]
    pub steering: Steering,
    /// Active health checks; without them origins are always taken as up.
    #[serde(default)]
    pub health: Option<HealthTable>,
    /// How long the origin may take to send its response head.
    #[serde(default = "default_origin_timeout_ms")]
    pub origin_timeout_ms: NonZeroU64,
    /// The queue page's HTTP status: 200, 202 or 429.
    #[serde(default = "default_queue_status")]
    pub queue_status: u16,
    /// Mustache template file for the queue page; absent: the built-in page.
    #[serde(default)]
    pub queue_page: Option<PathBuf>,
    /// Queue page templates by language tag (`de = "/etc/waitroom/queue.de.mustache"`):
    /// the visitor's `Accept-Language` picks one, else the `queue_page`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub queue_page_languages: BTreeMap<String, PathBuf>,
    /// The language of `queue_page` and of the reject and error pages
    /// (Cloudflare's `default_template_language`): a template variable, and
    /// what a visitor gets whose `Accept-Language` matches no other page.
    #[serde(default = "default_template_language")]
    pub default_template_language: String,
    /// Mustache template file for the page of a `reject` room; absent: built in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reject_page: Option<PathBuf>,
    /// Mustache template file for the error pages (origin down, unreachable,
    /// too slow; too many new visitors); absent: built in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_page: Option<PathBuf>,

    // The engine's limits: what [`RoomConfig`] is built from.
    /// Most visitors allowed on the site at once.
    pub total_active_users: u64,
    /// Most visitors admitted in any one minute.
    pub new_users_per_minute: u64,
    /// Minutes a visitor stays active after their last request.
    #[serde(default = "default_session_duration")]
    pub session_duration: u32,
    /// Count the session from admission instead of from the last request.
    #[serde(default)]
    pub disable_session_renewal: bool,
    #[serde(default)]
    pub queueing_method: QueueingMethod,
    /// Queue every visitor without a session, whatever the limits say.
    #[serde(default)]
    pub queue_all: bool,
    /// Mean seconds between a queued visitor's check-ins.
    #[serde(default = "default_refresh_interval")]
    pub refresh_interval: u16,
    #[serde(default)]
    pub cookie_same_site: CookieSameSite,
    #[serde(default)]
    pub cookie_secure: CookieSecure,
    /// Distinct connections one ticket may use per window; 0 turns it off.
    #[serde(default = "default_ticket_connection_budget")]
    pub ticket_connection_budget: u16,
    /// The connection budget's window, seconds.
    #[serde(default = "default_ticket_connection_window_secs")]
    pub ticket_connection_window_secs: u16,
    /// `"none"` or `"network"`: bind tickets to the client's /24 or /48.
    #[serde(default)]
    pub ticket_binding: TicketBinding,
    /// Take the room out of the way (Cloudflare's `suspended`): requests go
    /// to the origin without a ticket and without being counted, as if no
    /// room covered them. For an incident or a maintenance window.
    #[serde(default)]
    pub suspended: bool,
    /// Scheduled events (`[[rooms.events]]`), see [`crate::event`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<EventTable>,

    /// `[[rooms.bypass]]`: requests that go to the origin without a ticket
    /// and without counting (see [`crate::bypass`]).
    #[serde(default)]
    pub bypass: Vec<BypassRule>,

    /// Commands the origin may give in a response header (Cloudflare's
    /// `enabled_origin_commands`); none by default.
    #[serde(default)]
    pub enabled_origin_commands: Vec<OriginCommand>,
    /// The response header that carries them; always removed before the
    /// response reaches the visitor, allowed or not.
    #[serde(default = "default_origin_command_header")]
    pub origin_command_header: String,
    /// The key the queue's JSON answer is wrapped in: `waitingRoom` by
    /// default; `cfWaitingRoom` for apps written for Cloudflare's.
    #[serde(default = "default_json_envelope")]
    pub json_envelope: String,
}

/// The default of `default_template_language`.
pub const DEFAULT_TEMPLATE_LANGUAGE: &str = "en";

fn default_template_language() -> String {
    DEFAULT_TEMPLATE_LANGUAGE.into()
}

/// Whether `tag` may name a language: ASCII letters, digits and `-`, 1 to
/// 35 characters, not starting or ending with `-` (`de`, `pt-BR`, `zh-Hant-TW`).
#[must_use]
pub fn valid_language_tag(tag: &str) -> bool {
    (1..=35).contains(&tag.len())
        && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !tag.starts_with('-')
        && !tag.ends_with('-')
}

/// The default of `json_envelope`.
pub const DEFAULT_JSON_ENVELOPE: &str = "waitingRoom";

fn default_json_envelope() -> String {
    DEFAULT_JSON_ENVELOPE.into()
}

/// What an origin may tell the room about the visitor of a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OriginCommand {
    /// End the visitor's session now and free its slot (a checkout is done).
    Revoke,
}

impl OriginCommand {
    /// The header value that gives the command.
    #[must_use]
    pub fn token(self) -> &'static str {
        match self {
            Self::Revoke => "revoke",
        }
    }
}

/// The default of `origin_command_header`.
pub const DEFAULT_ORIGIN_COMMAND_HEADER: &str = "waitroom-command";

fn default_origin_command_header() -> String {
    DEFAULT_ORIGIN_COMMAND_HEADER.into()
}

/// The keys of a [`RoomTable`] that belong to the node that serves the room:
/// where the room applies and where its origins are. A node keeps its own
/// for these and takes every other key from the settings the aggregator
/// pushes ([`RoomTable::with_settings`]); the control API refuses to change
/// them, since no node would follow.
pub const NODE_KEYS: &[&str] = &[
    "host",
    "path",
    "path_case_sensitive",
    "merge_slashes",
    "additional_routes",
    "origin",
    "pools",
    "steering",
    "health",
    "origin_timeout_ms",
];

/// One of a room's `additional_routes`: a host and a path prefix.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteTable {
    /// Host this route covers (`*` for any), without port.
    pub host: String,
    /// Path prefix this route covers.
    #[serde(default = "root_path")]
    pub path: String,
}

/// How a request picks a pool among the healthy ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Steering {
    /// The first healthy pool in listed order (failover).
    #[default]
    Ordered,
    /// A healthy pool at random, in proportion to `weight`.
    Random,
    /// The healthy pool with the lowest EWMA of health-check round-trip time.
    Dynamic,
}

/// One `[[rooms.pools]]` table.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PoolTable {
    pub name: String,
    /// Share of traffic under `random` steering.
    #[serde(default = "one")]
    pub weight: u32,
    /// `host:port` of each origin.
    pub origins: Vec<String>,
    /// Reach the origins over TLS.
    #[serde(default)]
    pub tls: bool,
    /// Server name sent and verified; absent: the origin's host.
    #[serde(default)]
    pub sni: Option<String>,
    /// PEM file of CA certificates to trust; absent: the webpki roots.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

/// The `[rooms.health]` table: active checks of every origin, from each node.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HealthTable {
    /// Path (and query) probed with GET.
    #[serde(default = "root_path")]
    pub path: String,
    #[serde(default = "default_interval_ms")]
    pub interval_ms: NonZeroU64,
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: NonZeroU64,
    #[serde(default = "default_expected_status")]
    pub expected_status: u16,
    /// Consecutive failures that mark an up origin down.
    #[serde(default = "default_fall")]
    pub fall: NonZeroU32,
    /// Consecutive successes that mark a down origin up.
    #[serde(default = "default_rise")]
    pub rise: NonZeroU32,
    /// τ of the time-based EWMA: a sample Δt after the last weighs 1 − e^(−Δt/τ).
    #[serde(default = "default_ewma_time_bias_ms")]
    pub ewma_time_bias_ms: NonZeroU64,
}

fn any_host() -> String {
    "*".into()
}
fn root_path() -> String {
    "/".into()
}
fn yes() -> bool {
    true
}
fn one() -> u32 {
    1
}
fn default_origin_timeout_ms() -> NonZeroU64 {
    NonZeroU64::new(10_000).expect("not zero")
}
fn default_queue_status() -> u16 {
    200
}
fn default_session_duration() -> u32 {
    DEFAULT_SESSION_MINUTES
}
fn default_ticket_connection_budget() -> u16 {
    DEFAULT_TICKET_CONNECTION_BUDGET
}
fn default_ticket_connection_window_secs() -> u16 {
    DEFAULT_TICKET_CONNECTION_WINDOW_SECS
}
fn default_refresh_interval() -> u16 {
    DEFAULT_REFRESH_SECS
}
fn default_interval_ms() -> NonZeroU64 {
    NonZeroU64::new(5_000).expect("not zero")
}
fn default_timeout_ms() -> NonZeroU64 {
    NonZeroU64::new(2_000).expect("not zero")
}
fn default_expected_status() -> u16 {
    200
}
fn default_fall() -> NonZeroU32 {
    NonZeroU32::new(3).expect("not zero")
}
fn default_rise() -> NonZeroU32 {
    NonZeroU32::new(2).expect("not zero")
}
fn default_ewma_time_bias_ms() -> NonZeroU64 {
    NonZeroU64::new(60_000).expect("not zero")
}

/// The queue page statuses a room may choose: "OK", "Accepted" (still
/// waiting) and "Too Many Requests" (for clients that back off on it).
const QUEUE_STATUSES: [u16; 3] = [200, 202, 429];

/// Why a room table was refused. [`field`](Self::field) names the key to fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RoomTableError {
    #[error("must not be empty")]
    EmptyId,
    #[error("duplicate room id {id:?} (also rooms[{first}])")]
    DuplicateId { id: String, first: usize },
    #[error("{path:?} must start with '/'")]
    PathNotAbsolute { path: String },
    #[error("{path:?} must start with '/'")]
    RoutePathNotAbsolute { route: usize, path: String },
    #[error("give either `origin` or `[[rooms.pools]]`, not both")]
    OriginAndPools,
    #[error("at least one pool is required")]
    NoPools,
    #[error("must not be empty")]
    EmptyPoolName { pool: usize },
    #[error("duplicate pool name {name:?} (also pools[{first}])")]
    DuplicatePoolName {
        pool: usize,
        name: String,
        first: usize,
    },
    #[error("at least one \"host:port\" is required")]
    NoOrigins { pool: usize },
    #[error("`sni` and `ca_file` need `tls = true`")]
    TlsOptionsWithoutTls { pool: usize },
    #[error("\"dynamic\" steers by health-check round-trip times: add [rooms.health]")]
    DynamicWithoutHealth,
    #[error("{path:?} must start with '/'")]
    HealthPathNotAbsolute { path: String },
    #[error("{timeout_ms} ms is longer than interval_ms ({interval_ms} ms)")]
    HealthTimeoutAboveInterval { timeout_ms: u64, interval_ms: u64 },
    #[error("{status} is not an HTTP status (100-599)")]
    ExpectedStatus { status: u16 },
    #[error("{status} is not 200, 202 or 429")]
    QueueStatus { status: u16 },
    #[error(transparent)]
    Limits(#[from] RoomError),
    #[error(transparent)]
    Events(#[from] EventsError),
    #[error("{name:?} is not a header name")]
    OriginCommandHeader { name: String },
    #[error("{name:?} must be 1 to 64 letters, digits or '_' (as \"cfWaitingRoom\")")]
    JsonEnvelope { name: String },
    #[error("{tag:?} is not a language tag (letters, digits and '-', as \"de\" or \"pt-BR\")")]
    LanguageTag { field: &'static str, tag: String },
    #[error("{tag:?} is given twice (tags compare without case)")]
    DuplicateLanguage { tag: String },
    /// A `[[rooms.bypass]]` rule (`rule`: its index; `None`: the list).
    #[error("{problem}")]
    Bypass {
        rule: Option<usize>,
        problem: BypassError,
    },
}

impl RoomTableError {
    /// The key to fix, relative to the room table (`pools[1].name`).
    #[must_use]
    pub fn field(&self) -> String {
        let pool = |pool: &usize, key: &str| format!("pools[{pool}].{key}");
        match self {
            Self::EmptyId | Self::DuplicateId { .. } => "id".into(),
            Self::PathNotAbsolute { .. } => "path".into(),
            Self::RoutePathNotAbsolute { route, .. } => format!("additional_routes[{route}].path"),
            Self::OriginAndPools | Self::NoPools => "pools".into(),
            Self::EmptyPoolName { pool: p } | Self::DuplicatePoolName { pool: p, .. } => {
                pool(p, "name")
            }
            Self::NoOrigins { pool: p } => pool(p, "origins"),
            Self::TlsOptionsWithoutTls { pool: p } => pool(p, "tls"),
            Self::DynamicWithoutHealth => "steering".into(),
            Self::HealthPathNotAbsolute { .. } => "health.path".into(),
            Self::HealthTimeoutAboveInterval { .. } => "health.timeout_ms".into(),
            Self::ExpectedStatus { .. } => "health.expected_status".into(),
            Self::QueueStatus { .. } => "queue_status".into(),
            Self::Limits(e) => e.field().into(),
            Self::Events(e) => e.key(),
            Self::OriginCommandHeader { .. } => "origin_command_header".into(),
            Self::JsonEnvelope { .. } => "json_envelope".into(),
            Self::LanguageTag { field, tag } if *field == "queue_page_languages" => {
                format!("queue_page_languages.{tag}")
            }
            Self::LanguageTag { field, .. } => (*field).into(),
            Self::DuplicateLanguage { tag } => format!("queue_page_languages.{tag}"),
            Self::Bypass { rule: None, .. } => "bypass".into(),
            Self::Bypass {
                rule: Some(i),
                problem,
            } => match problem.field() {
                "" => format!("bypass[{i}]"),
                key => format!("bypass[{i}].{key}"),
            },
        }
    }
}

/// A refused table among a file's `[[rooms]]`: which one and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {problem}", self.key())]
pub struct RoomsError {
    /// Position of the table in the file's `[[rooms]]` array.
    pub index: usize,
    /// Named `problem`, not `source`: the message already says it.
    pub problem: RoomTableError,
}

impl RoomsError {
    /// The key path from the top of the file: `rooms[2].new_users_per_minute`.
    #[must_use]
    pub fn key(&self) -> String {
        format!("rooms[{}].{}", self.index, self.problem.field())
    }
}

/// Checks every table and that no two share an id; returns the engine's
/// rooms in file order.
pub fn validate_rooms(tables: &[RoomTable]) -> Result<Vec<Room>, RoomsError> {
    let mut rooms = Vec::with_capacity(tables.len());
    for (index, table) in tables.iter().enumerate() {
        let refused = |problem| RoomsError { index, problem };
        if let Some(first) = tables[..index].iter().position(|t| t.id == table.id) {
            return Err(refused(RoomTableError::DuplicateId {
                id: table.id.clone(),
                first,
            }));
        }
        rooms.push(table.validate().map_err(refused)?);
    }
    Ok(rooms)
}

impl RoomTable {
    /// This node's table with the room settings of `pushed` (the
    /// aggregator's table of the same room): the node's own keys
    /// ([`NODE_KEYS`]) from `self`, every other key from `pushed`. Written
    /// with `..`, so a key added to the table later (events, bypass rules)
    /// is a room setting, pushed, without a change here.
    #[must_use]
    pub fn with_settings(&self, pushed: &Self) -> Self {
        Self {
            id: self.id.clone(),
            host: self.host.clone(),
            path: self.path.clone(),
            path_case_sensitive: self.path_case_sensitive,
            merge_slashes: self.merge_slashes,
            additional_routes: self.additional_routes.clone(),
            origin: self.origin.clone(),
            pools: self.pools.clone(),
            steering: self.steering,
            health: self.health.clone(),
            origin_timeout_ms: self.origin_timeout_ms,
            ..pushed.clone()
        }
    }

    /// A table named `id` with `config`'s limits and every other key at its
    /// default, as a table that gives only those keys would read.
    #[must_use]
    pub fn from_config(id: &str, config: &RoomConfig) -> Self {
        Self {
            id: id.to_owned(),
            host: any_host(),
            path: root_path(),
            path_case_sensitive: false,
            merge_slashes: true,
            additional_routes: Vec::new(),
            origin: None,
            pools: None,
            steering: Steering::default(),
            health: None,
            origin_timeout_ms: default_origin_timeout_ms(),
            queue_status: default_queue_status(),
            queue_page: None,
            queue_page_languages: BTreeMap::new(),
            default_template_language: default_template_language(),
            reject_page: None,
            error_page: None,
            total_active_users: config.total_active_users,
            new_users_per_minute: config.new_users_per_minute,
            session_duration: config.session_duration,
            disable_session_renewal: config.disable_session_renewal,
            queueing_method: config.queueing_method,
            queue_all: config.queue_all,
            refresh_interval: config.refresh_interval,
            cookie_same_site: config.cookie_same_site,
            cookie_secure: config.cookie_secure,
            ticket_connection_budget: config.ticket_connection_budget,
            ticket_connection_window_secs: config.ticket_connection_window_secs,
            ticket_binding: config.ticket_binding,
            suspended: false,
            events: Vec::new(),
            bypass: Vec::new(),
            enabled_origin_commands: Vec::new(),
            origin_command_header: default_origin_command_header(),
            json_envelope: default_json_envelope(),
        }
    }

    /// The engine's part of this table.
    #[must_use]
    pub fn limits(&self) -> RoomConfig {
        RoomConfig {
            total_active_users: self.total_active_users,
            new_users_per_minute: self.new_users_per_minute,
            session_duration: self.session_duration,
            disable_session_renewal: self.disable_session_renewal,
            queueing_method: self.queueing_method,
            queue_all: self.queue_all,
            refresh_interval: self.refresh_interval,
            cookie_same_site: self.cookie_same_site,
            cookie_secure: self.cookie_secure,
            ticket_connection_budget: self.ticket_connection_budget,
            ticket_connection_window_secs: self.ticket_connection_window_secs,
            ticket_binding: self.ticket_binding,
        }
    }

    /// The origin pools: the `[[rooms.pools]]` as written, or the one pool
    /// named `default` that `origin = "host:port"` stands for; none when the
    /// table gives neither (as an aggregator's may).
    #[must_use]
    pub fn origin_pools(&self) -> Vec<PoolTable> {
        match (&self.pools, &self.origin) {
            (Some(pools), _) => pools.clone(),
            (None, Some(origin)) => vec![PoolTable {
                name: "default".into(),
                weight: 1,
                origins: vec![origin.clone()],
                tls: false,
                sni: None,
                ca_file: None,
            }],
            (None, None) => Vec::new(),
        }
    }

    /// Checks what serde's types cannot say, and returns the engine's room
    /// named by `id`.
    pub fn validate(&self) -> Result<Room, RoomTableError> {
        if self.id.is_empty() {
            return Err(RoomTableError::EmptyId);
        }
        if !self.path.starts_with('/') {
            return Err(RoomTableError::PathNotAbsolute {
                path: self.path.clone(),
            });
        }
        if let Some((route, r)) =
            (self.additional_routes.iter().enumerate()).find(|(_, r)| !r.path.starts_with('/'))
        {
            return Err(RoomTableError::RoutePathNotAbsolute {
                route,
                path: r.path.clone(),
            });
        }
        match (&self.origin, &self.pools) {
            (Some(_), Some(_)) => return Err(RoomTableError::OriginAndPools),
            (None, Some(pools)) if pools.is_empty() => return Err(RoomTableError::NoPools),
            _ => {}
        }
        for (pool, table) in self.pools.iter().flatten().enumerate() {
            if table.name.is_empty() {
                return Err(RoomTableError::EmptyPoolName { pool });
            }
            if let Some(first) = self
                .pools
                .iter()
                .flatten()
                .position(|p| p.name == table.name)
                && first < pool
            {
                return Err(RoomTableError::DuplicatePoolName {
                    pool,
                    name: table.name.clone(),
                    first,
                });
            }
            if table.origins.is_empty() {
                return Err(RoomTableError::NoOrigins { pool });
            }
            if !table.tls && (table.sni.is_some() || table.ca_file.is_some()) {
                return Err(RoomTableError::TlsOptionsWithoutTls { pool });
            }
        }
        if let Some(health) = &self.health {
            if !health.path.starts_with('/') {
                return Err(RoomTableError::HealthPathNotAbsolute {
                    path: health.path.clone(),
                });
            }
            if health.timeout_ms > health.interval_ms {
                return Err(RoomTableError::HealthTimeoutAboveInterval {
                    timeout_ms: health.timeout_ms.get(),
                    interval_ms: health.interval_ms.get(),
                });
            }
            if !(100..=599).contains(&health.expected_status) {
                return Err(RoomTableError::ExpectedStatus {
                    status: health.expected_status,
                });
            }
        } else if self.steering == Steering::Dynamic {
            return Err(RoomTableError::DynamicWithoutHealth);
        }
        if !QUEUE_STATUSES.contains(&self.queue_status) {
            return Err(RoomTableError::QueueStatus {
                status: self.queue_status,
            });
        }
        let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if self.origin_command_header.is_empty() || !self.origin_command_header.bytes().all(token) {
            return Err(RoomTableError::OriginCommandHeader {
                name: self.origin_command_header.clone(),
            });
        }
        let envelope = &self.json_envelope;
        if envelope.is_empty()
            || envelope.len() > 64
            || !envelope
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(RoomTableError::JsonEnvelope {
                name: envelope.clone(),
            });
        }
        if !valid_language_tag(&self.default_template_language) {
            return Err(RoomTableError::LanguageTag {
                field: "default_template_language",
                tag: self.default_template_language.clone(),
            });
        }
        let mut seen: Vec<String> = Vec::new();
        for tag in self.queue_page_languages.keys() {
            if !valid_language_tag(tag) {
                return Err(RoomTableError::LanguageTag {
                    field: "queue_page_languages",
                    tag: tag.clone(),
                });
            }
            let lower = tag.to_ascii_lowercase();
            if seen.contains(&lower) {
                return Err(RoomTableError::DuplicateLanguage { tag: tag.clone() });
            }
            seen.push(lower);
        }
        bypass::validate_rules(&self.bypass)
            .map_err(|(rule, problem)| RoomTableError::Bypass { rule, problem })?;
        let limits = self.limits();
        let room = limits.clone().validate()?.named(&self.id);
        Ok(room.with_events(validate_events(&self.events, &limits)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::room::RoomId;

    /// The engine's keys only matter to the aggregator; this table has all
    /// the node's too.
    const FULL: &str = r#"
id = "shop"
host = "shop.example"
path = "/drop"
origin_timeout_ms = 3000
queue_status = 429
queue_page = "/etc/waitroom/shop.mustache"
total_active_users = 10
new_users_per_minute = 5
session_duration = 10
disable_session_renewal = true
queueing_method = "random"
queue_all = true
refresh_interval = 30
cookie_same_site = "strict"
cookie_secure = "always"
ticket_connection_budget = 8
ticket_connection_window_secs = 30
ticket_binding = "network"
steering = "dynamic"
enabled_origin_commands = ["revoke"]
origin_command_header = "X-Shop-Command"

[[pools]]
name = "eu"
weight = 3
origins = ["127.0.0.1:1", "127.0.0.1:2"]

[[pools]]
name = "us"
origins = ["us.example:443"]
tls = true
sni = "shop.example"

[health]
path = "/healthz"
interval_ms = 500
timeout_ms = 200
fall = 2
rise = 1
"#;

    const MINIMAL: &str = "id = \"shop\"\norigin = \"127.0.0.1:1\"\ntotal_active_users = 200\nnew_users_per_minute = 200\n";

    fn table(text: &str) -> RoomTable {
        toml::from_str(text).unwrap()
    }

    fn refused(text: &str) -> RoomTableError {
        table(text).validate().unwrap_err()
    }

    #[test]
    fn every_key_is_read() {
        let t = table(FULL);
        let room = t.validate().unwrap();
        assert_eq!(room.id(), RoomId::from_name("shop"));
        assert_eq!(
            t.limits(),
            RoomConfig {
                total_active_users: 10,
                new_users_per_minute: 5,
                session_duration: 10,
                disable_session_renewal: true,
                queueing_method: QueueingMethod::Random,
                queue_all: true,
                refresh_interval: 30,
                cookie_same_site: CookieSameSite::Strict,
                cookie_secure: CookieSecure::Always,
                ticket_connection_budget: 8,
                ticket_connection_window_secs: 30,
                ticket_binding: TicketBinding::Network,
            }
        );
        assert_eq!(
            (t.host.as_str(), t.path.as_str()),
            ("shop.example", "/drop")
        );
        assert_eq!((t.origin_timeout_ms.get(), t.queue_status), (3_000, 429));
        assert_eq!(t.steering, Steering::Dynamic);
        assert_eq!(t.enabled_origin_commands, [OriginCommand::Revoke]);
        assert_eq!(t.origin_command_header, "X-Shop-Command");
        let pools = t.origin_pools();
        assert_eq!(pools.len(), 2);
        assert_eq!((pools[0].weight, pools[1].weight), (3, 1));
        assert!(pools[1].tls && !pools[0].tls);
        let health = t.health.unwrap();
        assert_eq!(health.path, "/healthz");
        assert_eq!((health.fall.get(), health.rise.get()), (2, 1));
        assert_eq!(health.expected_status, 200);
        assert_eq!(health.ewma_time_bias_ms.get(), 60_000);
    }

    #[test]
    fn the_example_is_valid() {
        #[derive(Deserialize)]
        struct File {
            rooms: Vec<RoomTable>,
        }
        let file: File = toml::from_str(EXAMPLE).unwrap();
        let rooms = validate_rooms(&file.rooms).unwrap();
        assert_eq!(rooms[0].id(), RoomId::from_name("shop"));
        assert_eq!(file.rooms[0].origin_pools().len(), 2);
        assert!(file.rooms[0].health.is_some());
    }

    #[test]
    fn defaults_of_a_minimal_table() {
        let t = table(MINIMAL);
        assert_eq!(t.limits(), RoomConfig::with_limits(200, 200));
        assert_eq!((t.host.as_str(), t.path.as_str()), ("*", "/"));
        assert_eq!((t.origin_timeout_ms.get(), t.queue_status), (10_000, 200));
        assert_eq!(t.steering, Steering::Ordered);
        assert_eq!(t.health, None);
        assert!(
            t.enabled_origin_commands.is_empty(),
            "no command unless enabled"
        );
        assert_eq!(t.origin_command_header, "waitroom-command");
        assert_eq!(t.json_envelope, "waitingRoom");
        let pools = t.origin_pools();
        assert_eq!(pools.len(), 1);
        assert_eq!(pools[0].name, "default");
        assert_eq!(pools[0].origins, ["127.0.0.1:1"]);
    }

    #[test]
    fn unknown_keys_are_refused_at_every_level() {
        for (text, key) in [
            (
                format!("{MINIMAL}new_users_per_hour = 1"),
                "new_users_per_hour",
            ),
            (
                format!("{FULL}intervall_ms = 5"),
                "intervall_ms", // in [health]
            ),
            (
                FULL.replace("weight = 3", "wieght = 3"),
                "wieght", // in [[pools]]
            ),
        ] {
            let err = toml::from_str::<RoomTable>(&text).unwrap_err();
            assert!(
                err.message().contains(&format!("unknown field `{key}`")),
                "{err}"
            );
        }
    }

    #[test]
    fn semantic_errors_name_the_key() {
        let pools = "[[pools]]\nname = \"p\"\norigins = [\"a:1\"]\n";
        let cases = [
            (MINIMAL.replace("\"shop\"", "\"\""), "id"),
            (format!("{MINIMAL}path = \"shop\""), "path"),
            (format!("{MINIMAL}{pools}"), "pools"),
            (
                format!(
                    "{}pools = []",
                    MINIMAL.replace("origin = \"127.0.0.1:1\"\n", "")
                ),
                "pools",
            ),
            (
                MINIMAL.replace("origin = \"127.0.0.1:1\"\n", "")
                    + "[[pools]]\nname = \"\"\norigins = [\"a:1\"]",
                "pools[0].name",
            ),
            (
                MINIMAL.replace("origin = \"127.0.0.1:1\"\n", "") + pools + pools,
                "pools[1].name",
            ),
            (
                MINIMAL.replace("origin = \"127.0.0.1:1\"\n", "")
                    + "[[pools]]\nname = \"p\"\norigins = []",
                "pools[0].origins",
            ),
            (
                MINIMAL.replace("origin = \"127.0.0.1:1\"\n", "") + pools + "sni = \"x\"",
                "pools[0].tls",
            ),
            (format!("{MINIMAL}steering = \"dynamic\""), "steering"),
            (format!("{MINIMAL}[health]\npath = \"x\""), "health.path"),
            (
                format!("{MINIMAL}[health]\ninterval_ms = 100\ntimeout_ms = 200"),
                "health.timeout_ms",
            ),
            (
                format!("{MINIMAL}[health]\nexpected_status = 9"),
                "health.expected_status",
            ),
            (format!("{MINIMAL}queue_status = 500"), "queue_status"),
            (
                MINIMAL.replace("new_users_per_minute = 200", "new_users_per_minute = 300"),
                "new_users_per_minute",
            ),
            (format!("{MINIMAL}session_duration = 0"), "session_duration"),
            (
                format!("{MINIMAL}origin_command_header = \"Waitroom Command\""),
                "origin_command_header",
            ),
            (format!("{MINIMAL}json_envelope = \"\""), "json_envelope"),
            (
                format!("{MINIMAL}json_envelope = \"cf.waitingRoom\""),
                "json_envelope",
            ),
        ];
        for (text, field) in cases {
            assert_eq!(refused(&text).field(), field, "{text}");
        }
    }

    #[test]
    fn pushed_settings_keep_the_nodes_routes_and_take_everything_else() {
        let node = table(FULL);
        let mut pushed = table(&MINIMAL.replace("origin = \"127.0.0.1:1\"\n", ""));
        pushed.queue_all = true;
        pushed.suspended = true;
        pushed.host = "elsewhere.example".into();
        pushed.additional_routes = vec![RouteTable {
            host: "elsewhere.example".into(),
            path: "/".into(),
        }];
        let merged = node.with_settings(&pushed);
        assert_eq!(merged.host, "shop.example", "the node's route");
        assert!(merged.additional_routes.is_empty(), "the node's routes");
        assert_eq!(merged.path, "/drop");
        assert_eq!(merged.origin_pools(), node.origin_pools());
        assert_eq!(merged.health, node.health);
        assert_eq!(merged.steering, Steering::Dynamic);
        assert_eq!(merged.total_active_users, 200, "the pushed limits");
        assert!(merged.queue_all && merged.suspended);
        assert_eq!(merged.queue_page, None, "the pushed page choice");
        assert!(merged.validate().is_ok());
    }

    #[test]
    fn an_additional_route_needs_a_host_and_an_absolute_path() {
        let t = table(&format!(
            "{MINIMAL}additional_routes = [{{ host = \"m.example\" }}, {{ host = \"x\", path = \"drop\" }}]"
        ));
        assert_eq!(t.additional_routes[0].path, "/", "the default path");
        let err = t.validate().unwrap_err();
        assert_eq!(err.field(), "additional_routes[1].path");
        let err = toml::from_str::<RoomTable>(&format!(
            "{MINIMAL}additional_routes = [{{ path = \"/x\" }}]"
        ))
        .unwrap_err();
        assert!(err.to_string().contains("missing field `host`"), "{err}");
    }

    #[test]
    fn a_table_from_a_config_reads_back_as_the_same_limits() {
        let config = RoomConfig {
            queue_all: true,
            ..RoomConfig::with_limits(30, 10)
        };
        let t = RoomTable::from_config("shop", &config);
        assert_eq!(t.limits(), config);
        let written = toml::to_string(&t).unwrap();
        let read: RoomTable = toml::from_str(&written).unwrap();
        assert_eq!(read, t, "{written}");
    }

    #[test]
    fn a_table_without_origins_is_an_aggregators() {
        let t = table(&MINIMAL.replace("origin = \"127.0.0.1:1\"\n", ""));
        assert!(t.validate().is_ok());
        assert!(t.origin_pools().is_empty());
    }

    #[test]
    fn zero_where_zero_means_nothing_is_refused_by_type() {
        for key in [
            "fall",
            "rise",
            "interval_ms",
            "timeout_ms",
            "ewma_time_bias_ms",
        ] {
            let text = format!("{MINIMAL}[health]\n{key} = 0");
            let err = toml::from_str::<RoomTable>(&text).unwrap_err();
            assert!(err.message().contains("nonzero"), "{key}: {err}");
        }
    }

    #[test]
    fn duplicate_ids_name_both_tables() {
        let t = table(MINIMAL);
        let other = RoomTable {
            id: "other".into(),
            ..t.clone()
        };
        let err = validate_rooms(&[t.clone(), other, t]).unwrap_err();
        assert_eq!(err.key(), "rooms[2].id");
        assert_eq!(
            err.to_string(),
            "rooms[2].id: duplicate room id \"shop\" (also rooms[0])"
        );
    }

    #[test]
    fn a_bad_limit_is_named_from_the_top_of_the_file() {
        let second = MINIMAL.replace("\"shop\"", "\"drop\"") + "refresh_interval = 1";
        let tables = [table(MINIMAL), table(&second)];
        let err = validate_rooms(&tables).unwrap_err();
        assert_eq!(err.key(), "rooms[1].refresh_interval");
        assert!(
            err.to_string()
                .starts_with("rooms[1].refresh_interval: refresh_interval (1 s)"),
            "{err}"
        );
    }
}
