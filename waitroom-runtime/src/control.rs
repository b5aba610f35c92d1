//! The runtime control API: a cluster's room settings, read and changed over
//! the admin listener while visitors flow, every change numbered, written
//! down and logged.
//!
//! The aggregator serves it for the cluster (and pushes each new version to
//! the nodes in its gossip answers); a node without an aggregator serves it
//! for itself. Both hand [`serve`] a [`Control`]: the [`SettingsStore`] (the
//! current [`RoomSettings`], persisted, with the audit log), the
//! [`Tokens`] that may use it, and what applying a new version means for
//! that binary.
//!
//! # Routes
//! ```text
//! GET    /api/rooms                      every room's settings and the version
//! GET    /api/rooms/{id}                 one room's settings (ETag: "version")
//! PATCH  /api/rooms/{id}                 a JSON merge patch of its settings
//! GET    /api/rooms/{id}/events          the room's `events`
//! POST   /api/rooms/{id}/events          add one (an object with a `name`)
//! DELETE /api/rooms/{id}/events/{name}   remove one
//! ```
//! Every request needs `Authorization: Bearer <token>` (401 otherwise);
//! without a token file the API answers 403 saying how to turn it on.
//! A change may carry `If-Match: "<version>"`: if the settings moved on
//! since, it is refused with 409 and nothing changes (two operators
//! editing at once do not overwrite each other unseen).
//!
//! # Validation
//! A changed room is turned back into TOML and read by the very code that
//! reads the config file ([`ConfigText::parse`], then
//! [`RoomTable::validate`]), so the API refuses exactly what the file
//! would, with the same message, naming the key. The keys that belong to
//! the node serving the room ([`NODE_KEYS`]: host, path, origins...) cannot
//! be changed here: no node would follow.
//!
//! # Secrets
//! A bypass rule may match a header or cookie *value*, typically a
//! partner's API key. The API never returns one: every room it answers with
//! has such values replaced by [`MASKED`], and the audit log records a
//! change with them masked too. A patch may send [`MASKED`] back (an
//! operator who edits the `bypass` list they read): it stands for the
//! value the room already has for the rule of that `name` and the same
//! header or cookie, and is refused, naming the key, when there is none.
//! Only the pushed settings (aggregator to node) and the settings file carry
//! the values.
//!
//! # Events
//! A room's scheduled events are the `events` key of its settings: the
//! event routes are a patch of that one list, keyed by each event's `name`,
//! validated as the rest of the table is (so the event rules live beside
//! the room's, in `waitroom-common`).
use std::{
    io::{Read as _, Write as _},
    path::{Path, PathBuf},
    sync::Arc,
};

use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use waitroom_common::room_table::{NODE_KEYS, RoomTable};

use crate::{admin::text, body::Body, clock::Clock, config_file::ConfigText};

/// What the API shows instead of a bypass rule's header or cookie value.
pub const MASKED: &str = "***";

/// `room` as JSON with every bypass rule's header and cookie value
/// replaced by [`MASKED`].
#[must_use]
pub fn masked_room(room: &RoomTable) -> Value {
    let mut value = serde_json::to_value(room).unwrap_or(Value::Null);
    mask_bypass_values(&mut value);
    value
}

/// Replaces the `value` of each `bypass[].header` and `bypass[].cookie` in
/// `table` (a room table or a patch of one, as JSON) by [`MASKED`].
fn mask_bypass_values(table: &mut Value) {
    let Some(Value::Array(rules)) = table.get_mut("bypass") else {
        return;
    };
    for rule in rules {
        for field in ["header", "cookie"] {
            if let Some(Value::Object(m)) = rule.get_mut(field)
                && let Some(value) = m.get_mut("value")
                && value.is_string()
            {
                *value = Value::String(MASKED.into());
            }
        }
    }
}

/// `patch` with each [`MASKED`] bypass value put back to the value `room`
/// has for the rule of that `name` and the same header (any case) or
/// cookie; refused, naming the key, where `room` has none.
fn unmask_patch(room: &RoomTable, patch: &Value) -> Result<Value, ControlError> {
    let mut patch = patch.clone();
    let Some(Value::Array(rules)) = patch.get_mut("bypass") else {
        return Ok(patch);
    };
    for (i, rule) in rules.iter_mut().enumerate() {
        let name = rule.get("name").and_then(Value::as_str).map(str::to_owned);
        for field in ["header", "cookie"] {
            let Some(Value::Object(m)) = rule.get_mut(field) else {
                continue;
            };
            if m.get("value").and_then(Value::as_str) != Some(MASKED) {
                continue;
            }
            let wanted = m.get("name").and_then(Value::as_str).unwrap_or("");
            let kept = room
                .bypass
                .iter()
                .find(|r| Some(&r.name) == name.as_ref())
                .and_then(|r| {
                    if field == "header" {
                        &r.header
                    } else {
                        &r.cookie
                    }
                    .as_ref()
                })
                .filter(|f| {
                    if field == "header" {
                        f.name.eq_ignore_ascii_case(wanted)
                    } else {
                        f.name == wanted
                    }
                })
                .and_then(|f| f.value.clone());
            match kept {
                Some(value) => {
                    m.insert("value".into(), Value::String(value));
                }
                None => {
                    return Err(ControlError::Invalid {
                        field: format!("bypass[{i}].{field}.value"),
                        problem: format!(
                            "{MASKED:?} stands for the value already set for this rule's {field} \
                             (same rule name and {field} name), and there is none: send the value itself"
                        ),
                    });
                }
            }
        }
    }
    Ok(patch)
}

/// Largest request body accepted, bytes: a room's settings are a few KiB.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Shortest token accepted: 16 bytes (`openssl rand -hex 16` gives 32).
pub const MIN_TOKEN_BYTES: usize = 16;

/// A numbered version of a cluster's room settings: what the aggregator
/// pushes and a node runs. The tables are whole [`RoomTable`]s; a node
/// keeps its own [`NODE_KEYS`] and takes the rest
/// ([`RoomTable::with_settings`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoomSettings {
    /// Increases by one with every change.
    pub version: u64,
    pub rooms: Vec<RoomTable>,
}

impl RoomSettings {
    /// The tables as the JSON text that travels in a gossip answer.
    #[must_use]
    pub fn rooms_json(&self) -> String {
        serde_json::to_string(&self.rooms).unwrap_or_else(|_| "[]".into())
    }

    /// Reads pushed tables back (a node); the error names the key a node of
    /// this build does not know or cannot read.
    pub fn from_push(version: u64, rooms_json: &str) -> Result<Self, serde_json::Error> {
        let rooms =
            serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(rooms_json))
                .map_err(serde_path_to_error::Error::into_inner)?;
        Ok(Self { version, rooms })
    }

    /// The table of room `id`.
    #[must_use]
    pub fn room(&self, id: &str) -> Option<&RoomTable> {
        self.rooms.iter().find(|r| r.id == id)
    }
}

/// Why the control API refused a request. Each maps to one status code.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("this needs a control token: Authorization: Bearer <token>")]
    Unauthorized,
    #[error("the control API is disabled: {hint}")]
    Disabled { hint: &'static str },
    #[error("no room {id:?} (rooms are added in the config file; the API changes their settings)")]
    UnknownRoom { id: String },
    #[error("room {room:?} has no event {name:?}")]
    UnknownEvent { room: String, name: String },
    #[error("no such route: {method} {path} (see docs/OPERATIONS.md, \"Control API\")")]
    NoRoute { method: Method, path: String },
    #[error("the body is not JSON: {problem}")]
    Malformed { problem: String },
    #[error("{field}: {problem}")]
    Invalid { field: String, problem: String },
    #[error(
        "{field}: belongs to each node's own config (routes and origins stay with the node that serves them); it cannot be changed here"
    )]
    NodeKey { field: String },
    #[error(
        "the settings are at version {current}, the request's If-Match says {expected}: someone changed them since; read them again and retry"
    )]
    VersionConflict { current: u64, expected: String },
    #[error("room {room:?} already has an event named {name:?}")]
    DuplicateEvent { room: String, name: String },
    #[error("not applied: {problem}")]
    Apply { problem: String },
    #[error("not saved, nothing changed: {source}")]
    Persist { source: StoreError },
}

impl ControlError {
    #[must_use]
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Disabled { .. } => StatusCode::FORBIDDEN,
            Self::UnknownRoom { .. } | Self::UnknownEvent { .. } | Self::NoRoute { .. } => {
                StatusCode::NOT_FOUND
            }
            Self::Malformed { .. } | Self::Invalid { .. } | Self::NodeKey { .. } => {
                StatusCode::BAD_REQUEST
            }
            Self::VersionConflict { .. } | Self::DuplicateEvent { .. } => StatusCode::CONFLICT,
            Self::Apply { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Persist { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The key the error is about, when there is one.
    #[must_use]
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Invalid { field, .. } | Self::NodeKey { field } => Some(field),
            _ => None,
        }
    }
}

/// Why the settings file or the audit log could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Why a token file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: mode {mode:04o} lets every user read the tokens (chmod 0600 or 0640 it)")]
    Readable { path: PathBuf, mode: u32 },
    #[error(
        "{path}:{line}: the token is {len} bytes; use at least {MIN_TOKEN_BYTES} (`openssl rand -hex 32`)"
    )]
    Short {
        path: PathBuf,
        line: usize,
        len: usize,
    },
    #[error("{path}:{line}: write `NAME TOKEN` (the name goes into the audit log)")]
    Format { path: PathBuf, line: usize },
    #[error("{path}: no token in the file")]
    Empty { path: PathBuf },
}

/// The bearer tokens that may use the API, each with a name for the audit
/// log. Only SHA-256 digests are kept: comparing digests in constant time
/// hides a token's length as well as its bytes.
#[derive(Clone)]
pub struct Tokens {
    named: Vec<(String, [u8; 32])>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.named.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Tokens").field("names", &names).finish()
    }
}

fn digest(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

impl Tokens {
    /// Reads a token file: one token per line, `NAME TOKEN`; a line of a
    /// single word is a token named `admin` (the node's one-token file).
    /// `#` starts a comment. The file must not be readable by every user.
    pub fn load(path: &Path) -> Result<Self, TokenError> {
        use std::os::unix::fs::MetadataExt as _;
        let read = |source| TokenError::Read {
            path: path.to_owned(),
            source,
        };
        let mut file = std::fs::File::open(path).map_err(read)?;
        let mode = file.metadata().map_err(read)?.mode() & 0o7777;
        if mode & 0o004 != 0 {
            return Err(TokenError::Readable {
                path: path.to_owned(),
                mode,
            });
        }
        let mut text = String::new();
        (&mut file)
            .take(64 * 1024)
            .read_to_string(&mut text)
            .map_err(read)?;
        let mut named = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or_default().trim();
            let words: Vec<&str> = line.split_whitespace().collect();
            let (name, token) = match words[..] {
                [] => continue,
                [token] => ("admin", token),
                [name, token] => (name, token),
                _ => {
                    return Err(TokenError::Format {
                        path: path.to_owned(),
                        line: i + 1,
                    });
                }
            };
            if token.len() < MIN_TOKEN_BYTES {
                return Err(TokenError::Short {
                    path: path.to_owned(),
                    line: i + 1,
                    len: token.len(),
                });
            }
            named.push((name.to_owned(), digest(token)));
        }
        if named.is_empty() {
            return Err(TokenError::Empty {
                path: path.to_owned(),
            });
        }
        Ok(Self { named })
    }

    /// The name of the token `req` carries, if it carries one of these.
    /// Every token is compared, each in constant time, whichever matches.
    pub fn who<B>(&self, req: &Request<B>) -> Option<&str> {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))?;
        let given = digest(given.trim());
        let mut found = None;
        for (name, expected) in &self.named {
            let same = given
                .iter()
                .zip(expected)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
            if same && found.is_none() {
                found = Some(name.as_str());
            }
        }
        found
    }
}

/// What the persisted file holds besides the settings: which config-file
/// tables they started from, so an edited file takes over at the next start.
#[derive(Debug, Serialize, Deserialize)]
struct Persisted {
    version: u64,
    /// FNV-1a of the config file's tables (as JSON) the settings came from.
    basis: String,
    rooms: Vec<RoomTable>,
}

/// The current settings, their file and the audit log.
///
/// The config file's `[[rooms]]` are where settings start; API changes
/// are kept in `path` and survive a restart. When the file's tables change
/// (edited, then a restart or a reload), the file takes over as a new
/// version, and the audit log says so: the last word wins, whoever said it.
#[derive(Debug)]
pub struct SettingsStore {
    current: RoomSettings,
    basis: String,
    path: PathBuf,
    audit: PathBuf,
}

/// One line of the audit log.
#[derive(Debug, Serialize)]
struct AuditLine<'a> {
    at_ms: u64,
    /// The token's name, or `config-file` for the file taking over.
    who: &'a str,
    action: &'a str,
    room: Option<&'a str>,
    version: u64,
    previous_version: u64,
    /// The request body, or what the file changed.
    change: &'a Value,
}

fn basis_of(tables: &[RoomTable]) -> String {
    let text = serde_json::to_string(tables).unwrap_or_default();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

impl SettingsStore {
    /// Opens the settings kept in `path`, or starts them from `seed` (the
    /// config file's tables): at version 1 the first time, as a new version
    /// when the file's tables are not the ones the kept settings came from.
    /// A kept file that cannot be read is set aside (`.corrupt`) and the
    /// seed taken, with a warning.
    pub fn open(
        seed: Vec<RoomTable>,
        path: &Path,
        audit: &Path,
        now_ms: u64,
    ) -> Result<Self, StoreError> {
        let basis = basis_of(&seed);
        let kept: Option<Persisted> = match std::fs::read(path) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(p) => Some(p),
                Err(err) => {
                    let aside = path.with_extension("corrupt");
                    tracing::warn!(path = %path.display(), %err, moved_to = %aside.display(), "room settings unreadable; starting from the config file");
                    let _ = std::fs::rename(path, &aside);
                    None
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => {
                return Err(StoreError::Io {
                    path: path.to_owned(),
                    source,
                });
            }
        };
        let mut store = Self {
            current: RoomSettings {
                version: 1,
                rooms: seed.clone(),
            },
            basis: basis.clone(),
            path: path.to_owned(),
            audit: audit.to_owned(),
        };
        match kept {
            Some(p) if p.basis == basis => {
                tracing::info!(version = p.version, path = %path.display(), "room settings kept from the last run");
                store.current = RoomSettings {
                    version: p.version,
                    rooms: p.rooms,
                };
            }
            Some(p) => {
                store.current.version = p.version + 1;
                tracing::info!(
                    version = store.current.version,
                    "the config file's rooms changed since the last run; they take over"
                );
                store.persist(&store.current)?;
                store.audit(
                    "config-file",
                    "file",
                    None,
                    p.version,
                    &json!("rooms from the config file"),
                    now_ms,
                )?;
            }
            None => {
                store.persist(&store.current)?;
                store.audit(
                    "config-file",
                    "file",
                    None,
                    0,
                    &json!("rooms from the config file"),
                    now_ms,
                )?;
            }
        }
        Ok(store)
    }

    /// The settings in force.
    #[must_use]
    pub fn current(&self) -> &RoomSettings {
        &self.current
    }

    /// Refuses a change whose `If-Match` names another version than the
    /// one in force (`*` or none: any).
    pub fn check_if_match(&self, if_match: Option<&str>) -> Result<(), ControlError> {
        if let Some(expected) = if_match {
            let bare = expected.trim().trim_start_matches("W/").trim_matches('"');
            if bare != "*" && bare != self.current.version.to_string() {
                return Err(ControlError::VersionConflict {
                    current: self.current.version,
                    expected: expected.to_owned(),
                });
            }
        }
        Ok(())
    }

    /// Whether `tables` are the config-file tables the settings in force
    /// started from (a reload of an unchanged file keeps API changes).
    #[must_use]
    pub fn is_seed(&self, tables: &[RoomTable]) -> bool {
        basis_of(tables) == self.basis
    }

    /// A reload: when the file's tables are not the ones in force came
    /// from, they become the next version (`commit` applies it first).
    /// Returns the new version, or `None` when the file changed nothing.
    pub fn reseed(
        &mut self,
        seed: Vec<RoomTable>,
        now_ms: u64,
        commit: impl FnOnce(&RoomSettings) -> Result<(), String>,
    ) -> Result<Option<u64>, ControlError> {
        let basis = basis_of(&seed);
        if basis == self.basis {
            return Ok(None);
        }
        let next = RoomSettings {
            version: self.current.version + 1,
            rooms: seed,
        };
        self.commit(
            next,
            basis,
            "config-file",
            "reload",
            None,
            &json!("rooms from the config file"),
            now_ms,
            commit,
        )
        .map(|s| Some(s.version))
    }

    /// Applies `change` to the tables in force as the next version, on
    /// behalf of `who`: refused if `if_match` names another version; then
    /// `commit` (the binary applies it, or refuses), then the file and the
    /// audit log. Nothing changes unless every step succeeds.
    #[expect(
        clippy::too_many_arguments,
        reason = "who, what and when of one change, named at the call"
    )]
    pub fn change(
        &mut self,
        who: &str,
        action: &str,
        room: Option<&str>,
        body: &Value,
        if_match: Option<&str>,
        now_ms: u64,
        change: impl FnOnce(&[RoomTable]) -> Result<Vec<RoomTable>, ControlError>,
        commit: impl FnOnce(&RoomSettings) -> Result<(), String>,
    ) -> Result<RoomSettings, ControlError> {
        self.check_if_match(if_match)?;
        let rooms = change(&self.current.rooms)?;
        let next = RoomSettings {
            version: self.current.version + 1,
            rooms,
        };
        let basis = self.basis.clone();
        self.commit(next, basis, who, action, room, body, now_ms, commit)
    }

    #[expect(clippy::too_many_arguments, reason = "the parts of one audit line")]
    fn commit(
        &mut self,
        next: RoomSettings,
        basis: String,
        who: &str,
        action: &str,
        room: Option<&str>,
        body: &Value,
        now_ms: u64,
        commit: impl FnOnce(&RoomSettings) -> Result<(), String>,
    ) -> Result<RoomSettings, ControlError> {
        let previous = self.current.version;
        let old_basis = std::mem::replace(&mut self.basis, basis);
        // Written before it is applied: a version in force is always one
        // a restart comes back to.
        if let Err(source) = self.persist(&next) {
            self.basis = old_basis;
            return Err(ControlError::Persist { source });
        }
        if let Err(problem) = commit(&next) {
            self.basis = old_basis;
            let _ = self.persist(&self.current.clone());
            return Err(ControlError::Apply { problem });
        }
        self.current = next;
        if let Err(err) = self.audit(who, action, room, previous, body, now_ms) {
            tracing::error!(%err, "settings changed but the audit log was not written");
        }
        tracing::info!(%who, action, room, version = self.current.version, "room settings changed");
        Ok(self.current.clone())
    }

    fn persist(&self, settings: &RoomSettings) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec_pretty(&Persisted {
            version: settings.version,
            basis: self.basis.clone(),
            rooms: settings.rooms.clone(),
        })
        .unwrap_or_default();
        crate::file::replace(&self.path, &bytes)
            .map_err(|(path, source)| StoreError::Io { path, source })
    }

    fn audit(
        &self,
        who: &str,
        action: &str,
        room: Option<&str>,
        previous_version: u64,
        change: &Value,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        // The log says that a partner's key changed, never what it is.
        let mut change = change.clone();
        mask_bypass_values(&mut change);
        let line = AuditLine {
            at_ms: now_ms,
            who,
            action,
            room,
            version: self.current.version,
            previous_version,
            change: &change,
        };
        let mut text = serde_json::to_string(&line).unwrap_or_default();
        text.push('\n');
        let io = |source| StoreError::Io {
            path: self.audit.clone(),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.audit)
            .map_err(io)?;
        file.write_all(text.as_bytes()).map_err(io)?;
        file.sync_data().map_err(io)
    }
}

/// Reads `value` (a room table as JSON) as the config file would read it:
/// through TOML and the file's own parser, then the table's rules. An
/// error names the key (`new_users_per_minute`, `pools[0].name`).
pub fn read_table(value: &Value) -> Result<RoomTable, ControlError> {
    let toml_value = to_toml(value, "")?;
    let text = toml::to_string(&toml_value).map_err(|e| ControlError::Malformed {
        problem: e.to_string(),
    })?;
    let table: RoomTable = ConfigText::new(Path::new("request"), &text)
        .parse()
        .map_err(|e| match e {
            crate::config_file::ConfigError::Invalid { key, problem, .. } => {
                ControlError::Invalid {
                    field: key,
                    problem,
                }
            }
            other => ControlError::Malformed {
                problem: other.to_string(),
            },
        })?;
    table.validate().map_err(|e| ControlError::Invalid {
        field: e.field(),
        problem: e.to_string(),
    })?;
    Ok(table)
}

/// JSON to TOML: `null` leaves a key out (its default), as a merge patch
/// means; a number TOML cannot hold is refused naming its key.
fn to_toml(value: &Value, at: &str) -> Result<toml::Value, ControlError> {
    let join = |k: &str| {
        if at.is_empty() {
            k.to_owned()
        } else {
            format!("{at}.{k}")
        }
    };
    Ok(match value {
        Value::Null => toml::Value::String(String::new()),
        Value::Bool(b) => toml::Value::Boolean(*b),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => toml::Value::Integer(i),
            (None, Some(_)) if n.is_u64() => {
                return Err(ControlError::Invalid {
                    field: at.to_owned(),
                    problem: format!("{n} is out of range"),
                });
            }
            (None, Some(f)) => toml::Value::Float(f),
            (None, None) => toml::Value::String(n.to_string()),
        },
        Value::String(s) => toml::Value::String(s.clone()),
        Value::Array(items) => toml::Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, v)| to_toml(v, &format!("{at}[{i}]")))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => {
            let mut table = toml::map::Map::new();
            for (k, v) in map {
                if v.is_null() {
                    continue;
                }
                table.insert(k.clone(), to_toml(v, &join(k))?);
            }
            toml::Value::Table(table)
        }
    })
}

/// RFC 7396 JSON merge patch: objects merge key by key, `null` removes a
/// key, anything else replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(target), Value::Object(patch)) => {
            for (k, v) in patch {
                if v.is_null() {
                    target.remove(k);
                } else {
                    merge_patch(target.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (target, patch) => *target = patch.clone(),
    }
}

/// `room` with `patch` applied, read as the config file would be.
pub fn patch_room(room: &RoomTable, patch: &Value) -> Result<RoomTable, ControlError> {
    let patch = &unmask_patch(room, patch)?;
    let Value::Object(keys) = patch else {
        return Err(ControlError::Malformed {
            problem: "a patch is a JSON object of the keys to change".into(),
        });
    };
    for key in keys.keys() {
        if NODE_KEYS.contains(&key.as_str()) {
            return Err(ControlError::NodeKey { field: key.clone() });
        }
        if key == "id" && keys[key] != Value::String(room.id.clone()) {
            return Err(ControlError::Invalid {
                field: "id".into(),
                problem: "a room keeps its id (cookies are bound to it)".into(),
            });
        }
    }
    let mut value = serde_json::to_value(room).unwrap_or(Value::Null);
    merge_patch(&mut value, patch);
    read_table(&value)
}

/// How a binary puts a new version in force (or refuses it, changing
/// nothing, with the reason).
pub type Apply = Box<dyn Fn(&RoomSettings) -> Result<(), String> + Send + Sync>;

/// What the control API serves: the store, who may change it, and how the
/// binary applies a new version.
pub struct Control {
    /// `None`: no token file configured; the API says how to turn it on.
    pub tokens: Option<Tokens>,
    /// What the operator sets to turn the API on (for the 403 message).
    pub disabled_hint: &'static str,
    /// Shared with the binary, whose reloads go through it too.
    pub store: Arc<parking_lot::Mutex<SettingsStore>>,
    /// Applies a version (or refuses it, changing nothing).
    pub apply: Apply,
    pub clock: Clock,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("tokens", &self.tokens)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// Answers a request under `/api/`.
pub async fn serve(control: Arc<Control>, req: Request<Incoming>) -> Response<Body> {
    match answer(&control, req).await {
        Ok((status, version, body)) => {
            let mut resp = text(
                status,
                "application/json",
                serde_json::to_string_pretty(&body).unwrap_or_default() + "\n",
            );
            if let Ok(etag) = HeaderValue::from_str(&format!("\"{version}\"")) {
                resp.headers_mut().insert(header::ETAG, etag);
            }
            resp
        }
        Err(err) => {
            let mut body = json!({ "error": err.to_string() });
            if let Some(field) = err.field() {
                body["field"] = json!(field);
            }
            let mut resp = text(
                err.status(),
                "application/json",
                serde_json::to_string_pretty(&body).unwrap_or_default() + "\n",
            );
            if matches!(err, ControlError::Unauthorized) {
                resp.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"waitroom-control\""),
                );
            }
            resp
        }
    }
}

async fn answer(
    control: &Control,
    req: Request<Incoming>,
) -> Result<(StatusCode, u64, Value), ControlError> {
    let Some(tokens) = &control.tokens else {
        return Err(ControlError::Disabled {
            hint: control.disabled_hint,
        });
    };
    let who = tokens
        .who(&req)
        .ok_or(ControlError::Unauthorized)?
        .to_owned();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let if_match = req
        .headers()
        .get(header::IF_MATCH)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let segments: Vec<&str> = path
        .trim_start_matches("/api/")
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let no_route = || ControlError::NoRoute {
        method: method.clone(),
        path: path.clone(),
    };
    let body = if matches!(method, Method::PATCH | Method::POST | Method::PUT) {
        read_body(req).await?
    } else {
        Value::Null
    };
    let now_ms = control.clock.now().0;
    let mut store = control.store.lock();
    if method != Method::GET {
        // A stale version is the answer, whatever else is wrong.
        store.check_if_match(if_match.as_deref())?;
    }
    let current = store.current().clone();
    let find = |id: &str| {
        current
            .room(id)
            .cloned()
            .ok_or_else(|| ControlError::UnknownRoom { id: id.to_owned() })
    };
    let replace = |rooms: &[RoomTable], table: RoomTable| -> Vec<RoomTable> {
        rooms
            .iter()
            .map(|r| {
                if r.id == table.id {
                    table.clone()
                } else {
                    r.clone()
                }
            })
            .collect()
    };
    match (&method, segments.as_slice()) {
        (&Method::GET, ["rooms"]) => Ok((
            StatusCode::OK,
            current.version,
            json!({
                "version": current.version,
                "rooms": current.rooms.iter().map(masked_room).collect::<Vec<_>>(),
            }),
        )),
        (&Method::GET, ["rooms", id]) => {
            let room = find(id)?;
            Ok((
                StatusCode::OK,
                current.version,
                json!({ "version": current.version, "room": masked_room(&room) }),
            ))
        }
        (&Method::PATCH, ["rooms", id]) => {
            let room = find(id)?;
            let table = patch_room(&room, &body)?;
            let done = store.change(
                &who,
                "patch_room",
                Some(id),
                &body,
                if_match.as_deref(),
                now_ms,
                |rooms| Ok(replace(rooms, table)),
                &control.apply,
            )?;
            let room = done.room(id).map(masked_room);
            Ok((
                StatusCode::OK,
                done.version,
                json!({ "version": done.version, "room": room }),
            ))
        }
        (&Method::GET, ["rooms", id, "events"]) => {
            let room = find(id)?;
            let events = events_of(&room);
            Ok((
                StatusCode::OK,
                current.version,
                json!({ "version": current.version, "events": events }),
            ))
        }
        (&Method::POST, ["rooms", id, "events"]) => {
            let table = add_event(&find(id)?, &body)?;
            let done = store.change(
                &who,
                "create_event",
                Some(id),
                &body,
                if_match.as_deref(),
                now_ms,
                |rooms| Ok(replace(rooms, table)),
                &control.apply,
            )?;
            Ok((
                StatusCode::CREATED,
                done.version,
                json!({ "version": done.version, "event": body }),
            ))
        }
        (&Method::DELETE, ["rooms", id, "events", name]) => {
            let table = remove_event(&find(id)?, name)?;
            let done = store.change(
                &who,
                "delete_event",
                Some(id),
                &json!({ "name": name }),
                if_match.as_deref(),
                now_ms,
                |rooms| Ok(replace(rooms, table)),
                &control.apply,
            )?;
            Ok((
                StatusCode::OK,
                done.version,
                json!({ "version": done.version, "deleted": name }),
            ))
        }
        _ => Err(no_route()),
    }
}

/// `room` with `event` added to its `events`, checked as the file's
/// `[[rooms.events]]` would be: a `name` no other event of the room has.
pub fn add_event(room: &RoomTable, event: &Value) -> Result<RoomTable, ControlError> {
    let name = match event.get("name") {
        Some(Value::String(n)) if !n.is_empty() => n.clone(),
        _ => {
            return Err(ControlError::Invalid {
                field: "events[].name".into(),
                problem: "an event needs a non-empty \"name\"".into(),
            });
        }
    };
    let mut events = events_of(room);
    if events
        .iter()
        .any(|e| e.get("name") == Some(&Value::String(name.clone())))
    {
        return Err(ControlError::DuplicateEvent {
            room: room.id.clone(),
            name,
        });
    }
    events.push(event.clone());
    patch_room(room, &json!({ "events": events }))
}

/// `room` without its event `name`.
pub fn remove_event(room: &RoomTable, name: &str) -> Result<RoomTable, ControlError> {
    let mut events = events_of(room);
    let before = events.len();
    events.retain(|e| e.get("name") != Some(&Value::String(name.to_owned())));
    if events.len() == before {
        return Err(ControlError::UnknownEvent {
            room: room.id.clone(),
            name: name.to_owned(),
        });
    }
    let events = if events.is_empty() {
        Value::Null
    } else {
        Value::Array(events)
    };
    patch_room(room, &json!({ "events": events }))
}

/// The room's `events` as JSON (none when the key is absent).
fn events_of(room: &RoomTable) -> Vec<Value> {
    match serde_json::to_value(room) {
        Ok(Value::Object(mut map)) => match map.remove("events") {
            Some(Value::Array(events)) => events,
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

async fn read_body(req: Request<Incoming>) -> Result<Value, ControlError> {
    let limited = http_body_util::Limited::new(req.into_body(), MAX_BODY_BYTES);
    let bytes = limited
        .collect()
        .await
        .map_err(|e| ControlError::Malformed {
            problem: format!("reading the body (at most {MAX_BODY_BYTES} bytes): {e}"),
        })?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| ControlError::Malformed {
        problem: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shop() -> RoomTable {
        toml::from_str("id = \"shop\"\ntotal_active_users = 100\nnew_users_per_minute = 50\n")
            .unwrap()
    }

    fn dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("wr-control-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn bypass_values_are_masked_and_a_masked_value_sent_back_keeps_the_secret() {
        let room = patch_room(
            &shop(),
            &json!({"bypass": [
                {"name": "partner", "path_prefix": "/api/",
                 "header": {"name": "X-Partner-Key", "value": "s3cret-partner-key"}},
                {"name": "app", "cookie": {"name": "app_session"}},
            ]}),
        )
        .unwrap();
        let shown = masked_room(&room);
        assert!(!shown.to_string().contains("s3cret"), "{shown}");
        assert_eq!(shown["bypass"][0]["header"]["value"], MASKED);
        assert_eq!(shown["bypass"][1]["cookie"], json!({"name": "app_session"}));

        // The list as read, one rule changed, sent back: the key is kept.
        let mut rules = shown["bypass"].clone();
        rules[0]["path_prefix"] = json!("/partner/");
        rules[0]["header"]["name"] = json!("x-partner-key");
        let kept = patch_room(&room, &json!({ "bypass": rules })).unwrap();
        let header = kept.bypass[0].header.as_ref().unwrap();
        assert_eq!(header.value.as_deref(), Some("s3cret-partner-key"));
        assert_eq!(kept.bypass[0].path_prefix.as_deref(), Some("/partner/"));

        // A mask with nothing behind it (a new rule, another header, a
        // renamed rule) is refused, naming the key; nothing is guessed.
        for (i, rule) in [
            json!({"name": "new", "header": {"name": "X-Partner-Key", "value": MASKED}}),
            json!({"name": "partner", "header": {"name": "X-Other", "value": MASKED}}),
            json!({"name": "partner", "cookie": {"name": "X-Partner-Key", "value": MASKED}}),
        ]
        .into_iter()
        .enumerate()
        {
            let err = patch_room(&room, &json!({ "bypass": [rule] })).unwrap_err();
            assert!(
                matches!(&err, ControlError::Invalid { field, .. } if field.starts_with("bypass[0].")),
                "case {i}: {err}"
            );
        }
        // A new value replaces it.
        let changed = patch_room(
            &room,
            &json!({"bypass": [{"name": "partner", "header": {"name": "X-Partner-Key", "value": "new-key"}}]}),
        )
        .unwrap();
        assert_eq!(
            changed.bypass[0].header.as_ref().unwrap().value.as_deref(),
            Some("new-key")
        );
    }

    #[test]
    fn a_patch_is_read_as_the_config_file_would_be() {
        let room = shop();
        let patched = patch_room(
            &room,
            &json!({"total_active_users": 300, "queue_all": true}),
        )
        .unwrap();
        assert_eq!((patched.total_active_users, patched.queue_all), (300, true));
        assert_eq!(patched.new_users_per_minute, 50, "untouched keys stay");
        for (patch, field, says) in [
            (
                json!({"total_active_users": 0}),
                "total_active_users",
                "total_active_users must be at least 1",
            ),
            (
                json!({"total_active_users": -5}),
                "total_active_users",
                "invalid value: integer `-5`, expected u64",
            ),
            (
                json!({"new_users_per_minute": 500}),
                "new_users_per_minute",
                "new_users_per_minute (500) is above total_active_users (100)",
            ),
            (
                json!({"queueing_method": "lottery"}),
                "queueing_method",
                "unknown variant `lottery`",
            ),
            (
                json!({"session_duration": 1.5}),
                "session_duration",
                "invalid type: floating point",
            ),
            (
                json!({"new_users_per_hour": 1}),
                "new_users_per_hour",
                "unknown field `new_users_per_hour`",
            ),
            (
                json!({"origin": "10.0.0.1:80"}),
                "origin",
                "belongs to each node's own config",
            ),
            (json!({"id": "other"}), "id", "keeps its id"),
            (
                json!({"additional_routes": [{"host": "m.shop.example"}]}),
                "additional_routes",
                "belongs to each node's own config",
            ),
            (
                json!({"total_active_users": 18_446_744_073_709_551_615_u64}),
                "total_active_users",
                "out of range",
            ),
        ] {
            let err = patch_room(&room, &patch).unwrap_err();
            assert_eq!(err.field(), Some(field), "{patch}: {err}");
            assert!(err.to_string().contains(says), "{patch}: {err}");
            assert_eq!(err.status(), StatusCode::BAD_REQUEST);
        }
        let err = patch_room(&room, &json!([1])).unwrap_err();
        assert!(matches!(err, ControlError::Malformed { .. }), "{err}");
    }

    /// Events are the room's `events` key: the routes check the name, then
    /// the table's own rules decide (until the room table has `events`, a
    /// new event is refused naming that key, as the file would refuse it).
    #[test]
    fn events_are_a_patch_of_the_rooms_events_key() {
        let room = shop();
        let err = add_event(&room, &json!({"prequeue_start_time": "x"})).unwrap_err();
        assert_eq!(err.field(), Some("events[].name"), "{err}");
        let err = add_event(&room, &json!({"name": ""})).unwrap_err();
        assert_eq!(err.status(), StatusCode::BAD_REQUEST, "{err}");
        let err = remove_event(&room, "launch").unwrap_err();
        assert!(matches!(err, ControlError::UnknownEvent { .. }), "{err}");
        assert_eq!(err.status(), StatusCode::NOT_FOUND);
        match add_event(&room, &json!({"name": "launch"})) {
            Ok(with) => {
                assert_eq!(events_of(&with).len(), 1);
                let err = add_event(&with, &json!({"name": "launch"})).unwrap_err();
                assert_eq!(err.status(), StatusCode::CONFLICT, "{err}");
                assert!(events_of(&remove_event(&with, "launch").unwrap()).is_empty());
            }
            Err(err) => assert!(
                err.field().is_some_and(|f| f.starts_with("events")),
                "{err}"
            ),
        }
    }

    #[test]
    fn null_in_a_patch_puts_a_key_back_to_its_default() {
        let mut room = shop();
        room.session_duration = 30;
        let patched = patch_room(&room, &json!({"session_duration": null})).unwrap();
        assert_eq!(patched.session_duration, 5);
    }

    #[test]
    fn tokens_have_names_and_are_compared_whole() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = dir("tokens");
        let path = dir.join("tokens");
        std::fs::write(
            &path,
            "# who may\nalice 0123456789abcdef0123\nbob   fedcba9876543210fedc # on call\n",
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let tokens = Tokens::load(&path).unwrap();
        let with = |v: &str| {
            Request::builder()
                .header(header::AUTHORIZATION, v)
                .body(())
                .unwrap()
        };
        assert_eq!(
            tokens.who(&with("Bearer 0123456789abcdef0123")),
            Some("alice")
        );
        assert_eq!(
            tokens.who(&with("Bearer fedcba9876543210fedc")),
            Some("bob")
        );
        assert_eq!(tokens.who(&with("Bearer 0123456789abcdef012")), None);
        assert_eq!(tokens.who(&with("Basic 0123456789abcdef0123")), None);
        assert_eq!(tokens.who(&Request::new(())), None);

        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        let one = Tokens::load(&path).unwrap();
        assert_eq!(one.who(&with("Bearer 0123456789abcdef0123")), Some("admin"));
        for (text, kind) in [
            ("a short\n", "Short"),
            ("a b c\n", "Format"),
            ("# none\n", "Empty"),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = Tokens::load(&path).unwrap_err();
            assert!(format!("{err:?}").starts_with(kind), "{text}: {err:?}");
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            Tokens::load(&path),
            Err(TokenError::Readable { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn changes_are_numbered_kept_audited_and_survive_a_reopen() {
        let dir = dir("store");
        let (path, audit) = (dir.join("settings.json"), dir.join("audit.jsonl"));
        let mut store = SettingsStore::open(vec![shop()], &path, &audit, 1).unwrap();
        assert_eq!(store.current().version, 1);
        let patch = json!({"queue_all": true});
        let table = patch_room(&shop(), &patch).unwrap();
        let changed = store
            .change(
                "alice",
                "patch_room",
                Some("shop"),
                &patch,
                Some("\"1\""),
                2,
                |_| Ok(vec![table.clone()]),
                |_| Ok(()),
            )
            .unwrap();
        assert_eq!(changed.version, 2);
        let err = store
            .change(
                "bob",
                "patch_room",
                Some("shop"),
                &patch,
                Some("\"1\""),
                3,
                |_| Ok(vec![table.clone()]),
                |_| Ok(()),
            )
            .unwrap_err();
        assert!(
            matches!(err, ControlError::VersionConflict { current: 2, .. }),
            "{err}"
        );
        assert_eq!(err.status(), StatusCode::CONFLICT);
        let err = store
            .change(
                "bob",
                "patch_room",
                Some("shop"),
                &patch,
                None,
                3,
                |_| Ok(vec![shop()]),
                |_| Err("no".into()),
            )
            .unwrap_err();
        assert!(matches!(err, ControlError::Apply { .. }), "{err}");
        assert_eq!(
            store.current().version,
            2,
            "a refused apply changes nothing"
        );

        let reopened = SettingsStore::open(vec![shop()], &path, &audit, 4).unwrap();
        assert_eq!(
            reopened.current(),
            &changed,
            "API changes survive a restart"
        );
        let mut edited = shop();
        edited.total_active_users = 7;
        edited.new_users_per_minute = 7;
        let mut from_file = SettingsStore::open(vec![edited.clone()], &path, &audit, 5).unwrap();
        assert_eq!(
            from_file.current().version,
            3,
            "an edited file takes over as a new version"
        );
        assert_eq!(from_file.current().rooms, vec![edited.clone()]);
        assert_eq!(
            from_file.reseed(vec![edited], 6, |_| Ok(())).unwrap(),
            None,
            "the same file changes nothing"
        );

        let lines: Vec<Value> = std::fs::read_to_string(&audit)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert_eq!(lines[1]["who"], "alice");
        assert_eq!(lines[1]["action"], "patch_room");
        assert_eq!(lines[1]["room"], "shop");
        assert_eq!(
            (
                lines[1]["version"].as_u64(),
                lines[1]["previous_version"].as_u64()
            ),
            (Some(2), Some(1))
        );
        assert_eq!(lines[1]["change"], patch);
        assert_eq!(lines[2]["who"], "config-file");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn pushed_settings_read_back_and_name_an_unknown_key() {
        let settings = RoomSettings {
            version: 9,
            rooms: vec![shop()],
        };
        let back = RoomSettings::from_push(9, &settings.rooms_json()).unwrap();
        assert_eq!(back, settings);
        let newer = settings
            .rooms_json()
            .replace("\"suspended\"", "\"a_later_key\":[],\"suspended\"");
        let err = RoomSettings::from_push(10, &newer).unwrap_err();
        assert!(
            err.to_string().contains("unknown field `a_later_key`"),
            "{err}"
        );
    }
}
