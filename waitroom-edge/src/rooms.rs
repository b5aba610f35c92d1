//! Rooms on this node and how a request finds its room: host, then the longest
//! path prefix.
use std::time::Duration;

use waitroom_common::room::{Room, RoomConfig};

use crate::upstream::{self, UpstreamSpec};

/// What is wrong with one `[[rooms]]` table.
#[derive(Debug)]
pub struct RoomSpecError {
    pub room: String,
    pub field: String,
    pub problem: String,
}

/// One room as configured: where it applies, where its origin is, and its limits.
#[derive(Debug, Clone)]
pub struct RoomSpec {
    /// Stable name; cookies are bound to it.
    pub id: String,
    /// Host this room covers (`*` for any), lower-case, without port.
    pub host: String,
    /// Path prefix this room covers.
    pub path: String,
    /// Where admitted visitors go: origin pools, steering, health checks.
    pub upstream: UpstreamSpec,
    /// How long the origin may take to send its response head.
    pub origin_timeout: Duration,
    /// The queue page's HTTP status (200, 202 or 429).
    pub queue_status: u16,
    /// Optional Mustache template file for the queue page.
    pub queue_page: Option<std::path::PathBuf>,
    /// The engine's room: limits, method, cookie attributes, validated.
    pub engine: Room,
}

const EDGE_KEYS: [&str; 6] = [
    "id",
    "host",
    "path",
    "origin_timeout_ms",
    "queue_status",
    "queue_page",
];

impl RoomSpec {
    /// Splits a `[[rooms]]` table into the node's keys and the engine's.
    pub fn from_table(mut table: toml::Table) -> Result<Self, RoomSpecError> {
        let id = match table.get("id") {
            Some(toml::Value::String(s)) if !s.is_empty() => s.clone(),
            Some(_) => return Err(err("?", "id", "must be a non-empty string")),
            None => return Err(err("?", "id", "missing")),
        };
        let string = |table: &toml::Table,
                      key: &str,
                      default: Option<&str>|
         -> Result<String, RoomSpecError> {
            match table.get(key) {
                Some(toml::Value::String(s)) => Ok(s.clone()),
                Some(_) => Err(err(&id, key, "must be a string")),
                None => default
                    .map(str::to_owned)
                    .ok_or_else(|| err(&id, key, "missing")),
            }
        };
        let host = string(&table, "host", Some("*"))?.to_ascii_lowercase();
        let path = string(&table, "path", Some("/"))?;
        if !path.starts_with('/') {
            return Err(err(&id, "path", "must start with '/'"));
        }
        let upstream =
            UpstreamSpec::from_room_table(&table).map_err(|e| err(&id, &e.field, &e.problem))?;
        let origin_timeout_ms = match table.get("origin_timeout_ms") {
            Some(toml::Value::Integer(n)) if *n > 0 => *n as u64,
            Some(_) => return Err(err(&id, "origin_timeout_ms", "must be a positive integer")),
            None => 10_000,
        };
        let queue_status = match table.get("queue_status") {
            Some(toml::Value::Integer(n)) if [200, 202, 429].contains(n) => *n as u16,
            Some(_) => return Err(err(&id, "queue_status", "must be 200, 202 or 429")),
            None => 200,
        };
        let queue_page = match table.get("queue_page") {
            Some(toml::Value::String(s)) => Some(std::path::PathBuf::from(s)),
            Some(_) => return Err(err(&id, "queue_page", "must be a file path")),
            None => None,
        };
        for key in EDGE_KEYS.iter().chain(&upstream::config::KEYS) {
            table.remove(*key);
        }
        let limits: RoomConfig = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| err(&id, "limits", e.message()))?;
        let engine = limits
            .validate()
            .map_err(|e| err(&id, "limits", &e.to_string()))?
            .named(&id);
        Ok(Self {
            id,
            host,
            path,
            upstream,
            origin_timeout: Duration::from_millis(origin_timeout_ms),
            queue_status,
            queue_page,
            engine,
        })
    }
}

fn err(room: &str, field: &str, problem: &str) -> RoomSpecError {
    RoomSpecError {
        room: room.to_owned(),
        field: field.to_owned(),
        problem: problem.to_owned(),
    }
}

/// The rooms of a node, ordered for matching.
#[derive(Debug)]
pub struct RoomTable {
    /// Sorted: exact hosts before `*`, then longer paths first.
    routes: Vec<(String, String, usize)>,
    pub rooms: Vec<RoomSpec>,
}

impl RoomTable {
    pub fn new(rooms: &[RoomSpec]) -> Self {
        let mut routes: Vec<(String, String, usize)> = rooms
            .iter()
            .enumerate()
            .map(|(i, r)| (r.host.clone(), r.path.clone(), i))
            .collect();
        routes.sort_by(|a, b| {
            (a.0 == "*")
                .cmp(&(b.0 == "*"))
                .then(b.1.len().cmp(&a.1.len()))
        });
        Self {
            routes,
            rooms: rooms.to_vec(),
        }
    }

    /// The room covering `host` (port ignored) and `path`, if any.
    pub fn find(&self, host: &str, path: &str) -> Option<usize> {
        let host = host.rsplit_once(':').map_or(host, |(h, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                host
            }
        });
        self.routes
            .iter()
            .find(|(h, p, _)| {
                (h == "*" || h.eq_ignore_ascii_case(host)) && path_has_prefix(path, p)
            })
            .map(|(_, _, i)| *i)
    }
}

/// `/shop` covers `/shop` and `/shop/cart` but not `/shopping`.
fn path_has_prefix(path: &str, prefix: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    let prefix = prefix.trim_end_matches('/');
    path == prefix || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: &str = "total_active_users = 100\nnew_users_per_minute = 10";

    fn spec(id: &str, host: &str, path: &str) -> RoomSpec {
        let table: toml::Table = toml::from_str(&format!(
            "id = \"{id}\"\nhost = \"{host}\"\npath = \"{path}\"\norigin = \"127.0.0.1:1\"\n{LIMITS}"
        ))
        .unwrap();
        RoomSpec::from_table(table).unwrap()
    }

    #[test]
    fn longest_prefix_on_the_matching_host_wins() {
        let t = RoomTable::new(&[
            spec("all", "*", "/"),
            spec("shop", "shop.example", "/"),
            spec("drop", "shop.example", "/drop"),
        ]);
        let id = |h, p| t.find(h, p).map(|i| t.rooms[i].id.as_str());
        assert_eq!(id("shop.example", "/drop/now"), Some("drop"));
        assert_eq!(id("shop.example:8080", "/drop"), Some("drop"));
        assert_eq!(id("SHOP.example", "/dropped"), Some("shop"));
        assert_eq!(id("other.example", "/drop"), Some("all"));
    }

    #[test]
    fn no_room_when_nothing_covers_the_request() {
        let t = RoomTable::new(&[spec("shop", "shop.example", "/shop")]);
        assert_eq!(t.find("shop.example", "/"), None);
        assert_eq!(t.find("x.example", "/shop"), None);
    }

    #[test]
    fn bad_fields_are_named() {
        let table: toml::Table =
            toml::from_str(&format!("id = \"r\"\norigin = \"no-port\"\n{LIMITS}")).unwrap();
        let e = RoomSpec::from_table(table).unwrap_err();
        assert_eq!(e.field, "origin");
        let table: toml::Table = toml::from_str(&format!(
            "id = \"r\"\n{LIMITS}\n[[pools]]\nname = \"a\"\norigins = [\"127.0.0.1:1\"]\ntls = 1"
        ))
        .unwrap();
        let e = RoomSpec::from_table(table).unwrap_err();
        assert_eq!((e.room.as_str(), e.field.as_str()), ("r", "pools[0].tls"));
        let table: toml::Table =
            toml::from_str("id = \"r\"\norigin = \"127.0.0.1:1\"\nqueue_status = 500").unwrap();
        assert_eq!(
            RoomSpec::from_table(table).unwrap_err().field,
            "queue_status"
        );
    }
}
