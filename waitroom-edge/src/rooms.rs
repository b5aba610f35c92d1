//! Rooms on this node and how a request finds its room: host, then the longest
//! path prefix. (A `[[rooms]]` table of the config file is a
//! [`waitroom_common::room_table::RoomTable`]; [`RoomTable`] here is the
//! node's routing table.)
use std::time::Duration;

use waitroom_common::{room::Room, room_table};

use crate::upstream::{FieldError, UpstreamSpec};

/// One room as configured: where it applies, where its origin is, and its limits.
#[derive(Debug, Clone)]
pub struct RoomSpec {
    /// Stable name; cookies are bound to it.
    pub id: String,
    /// Host this room covers (`*` for any), lower-case, without port.
    pub host: String,
    /// Path prefix this room covers.
    pub path: String,
    /// Paths compare case-sensitively (see [`crate::target`]).
    pub path_case_sensitive: bool,
    /// Runs of `/` are merged before routing and forwarding.
    pub merge_slashes: bool,
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
    /// Requests go to the origin without a ticket or a count (`suspended`).
    pub suspended: bool,
    /// `[[rooms.bypass]]`, validated (compiled into [`crate::bypass`]).
    pub bypass: Vec<waitroom_common::bypass::BypassRule>,
    /// The origin's command header and the commands it may give.
    pub origin_commands: crate::origin_command::OriginCommands,
    /// The key the queue's JSON answer is wrapped in.
    pub json_envelope: String,
}

impl RoomSpec {
    /// The node's room from a `[[rooms]]` table and the engine's room that
    /// [`validate`](room_table::RoomTable::validate) made of it. A field error is relative to the
    /// table.
    pub fn from_table(table: &room_table::RoomTable, engine: Room) -> Result<Self, FieldError> {
        Ok(Self {
            id: table.id.clone(),
            host: table.host.to_ascii_lowercase(),
            path: table.path.clone(),
            path_case_sensitive: table.path_case_sensitive,
            merge_slashes: table.merge_slashes,
            upstream: UpstreamSpec::from_table(table)?,
            origin_timeout: Duration::from_millis(table.origin_timeout_ms.get()),
            queue_status: table.queue_status,
            queue_page: table.queue_page.clone(),
            engine,
            suspended: table.suspended,
            bypass: table.bypass.clone(),
            origin_commands: crate::origin_command::OriginCommands::new(
                &table.origin_command_header,
                &table.enabled_origin_commands,
            ),
            json_envelope: table.json_envelope.clone(),
        })
    }
}

/// The rooms of a node, ordered for matching.
#[derive(Debug)]
pub struct RoomTable {
    /// Sorted: exact hosts before `*`, then longer paths first.
    routes: Vec<Route>,
    pub rooms: Vec<RoomSpec>,
}

impl RoomTable {
    pub fn new(rooms: &[RoomSpec]) -> Self {
        let mut routes: Vec<Route> = rooms
            .iter()
            .enumerate()
            .map(|(i, r)| Route {
                host: r.host.trim_end_matches('.').to_owned(),
                prefix: crate::target::match_key(&r.path, r.path_case_sensitive).into_owned(),
                case_sensitive: r.path_case_sensitive,
                merge_slashes: r.merge_slashes,
                room: i,
            })
            .collect();
        routes.sort_by(|a, b| {
            (a.host == "*")
                .cmp(&(b.host == "*"))
                .then(b.prefix.len().cmp(&a.prefix.len()))
        });
        Self {
            routes,
            rooms: rooms.to_vec(),
        }
    }

    /// The room covering `host` (port ignored) and `path`, if any; the
    /// spelling is normalized first (see [`crate::target`]), and a spelling
    /// that is refused there is covered by no room.
    pub fn find(&self, host: &str, path: &str) -> Option<usize> {
        crate::target::from_parts(host, path)
            .ok()
            .and_then(|t| self.route(&t))
    }

    /// The room covering a normalized target, if any.
    pub fn route(&self, target: &crate::target::Target<'_>) -> Option<usize> {
        self.routes
            .iter()
            .find(|r| {
                (r.host == "*" || r.host == target.host)
                    && path_has_prefix(
                        &crate::target::match_key(target.path(r.merge_slashes), r.case_sensitive),
                        &r.prefix,
                    )
            })
            .map(|r| r.room)
    }
}

/// One entry of the routing table.
#[derive(Debug, Clone)]
struct Route {
    /// Lower-case, without trailing dot; `*` for any.
    host: String,
    /// The room's path as a match key (parameters cut, case folded unless
    /// the room is case-sensitive).
    prefix: String,
    case_sensitive: bool,
    merge_slashes: bool,
    room: usize,
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

    fn spec(id: &str, host: &str, path: &str) -> RoomSpec {
        let table: room_table::RoomTable = toml::from_str(&format!(
            "id = \"{id}\"\nhost = \"{host}\"\npath = \"{path}\"\norigin = \"127.0.0.1:1\"\n\
             total_active_users = 100\nnew_users_per_minute = 10"
        ))
        .unwrap();
        RoomSpec::from_table(&table, table.validate().unwrap()).unwrap()
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
}
