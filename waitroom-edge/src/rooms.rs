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
    /// `additional_routes`: more (host, path) pairs, host lower-cased.
    pub additional_routes: Vec<(String, String)>,
    /// The cookie's `Path`: the longest whole-segment prefix of every path
    /// the room covers, so a visitor admitted on one route of the room
    /// presents the cookie on another route of it on the same host.
    pub cookie_path: String,
    /// Where admitted visitors go: origin pools, steering, health checks.
    pub upstream: UpstreamSpec,
    /// How long the origin may take to send its response head.
    pub origin_timeout: Duration,
    /// The queue page's HTTP status (200, 202 or 429).
    pub queue_status: u16,
    /// Optional Mustache template file for the queue page.
    pub queue_page: Option<std::path::PathBuf>,
    /// Queue page templates by language tag (`queue_page_languages`).
    pub queue_page_languages: std::collections::BTreeMap<String, std::path::PathBuf>,
    /// The language of `queue_page` and the reject and error pages.
    pub default_template_language: String,
    /// Optional Mustache template files for the reject and error pages.
    pub reject_page: Option<std::path::PathBuf>,
    pub error_page: Option<std::path::PathBuf>,
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
            additional_routes: table
                .additional_routes
                .iter()
                .map(|r| (r.host.to_ascii_lowercase(), r.path.clone()))
                .collect(),
            cookie_path: cookie_path(
                std::iter::once(table.path.as_str())
                    .chain(table.additional_routes.iter().map(|r| r.path.as_str())),
            ),
            upstream: UpstreamSpec::from_table(table)?,
            origin_timeout: Duration::from_millis(table.origin_timeout_ms.get()),
            queue_status: table.queue_status,
            queue_page: table.queue_page.clone(),
            queue_page_languages: table.queue_page_languages.clone(),
            default_template_language: table.default_template_language.clone(),
            reject_page: table.reject_page.clone(),
            error_page: table.error_page.clone(),
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

impl RoomSpec {
    /// Every (host, path) the room covers, each with the key it was
    /// written under: `host` + `path`, then each of `additional_routes`.
    pub fn routes(&self) -> impl Iterator<Item = (String, &str, &str)> {
        std::iter::once(("path".to_owned(), self.host.as_str(), self.path.as_str())).chain(
            self.additional_routes
                .iter()
                .enumerate()
                .map(|(i, (h, p))| (format!("additional_routes[{i}]"), h.as_str(), p.as_str())),
        )
    }
}

/// The longest prefix of whole segments shared by `paths` (`/` at least):
/// `/shop` and `/shop/drop` share `/shop`, `/shop` and `/drop` only `/`.
fn cookie_path<'a>(paths: impl Iterator<Item = &'a str>) -> String {
    let mut common: Option<Vec<&str>> = None;
    for path in paths {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        common = Some(match common {
            None => segments,
            Some(c) => c
                .iter()
                .zip(&segments)
                .take_while(|(a, b)| a == b)
                .map(|(a, _)| *a)
                .collect(),
        });
    }
    let path = format!("/{}", common.unwrap_or_default().join("/"));
    // Written into `Set-Cookie` as it stands: what a cookie's `Path` cannot
    // hold (a control character or `;`, RFC 6265 4.1.1) is percent-encoded,
    // as a browser sends such a path in its requests; the rest as written.
    let mut escaped = String::with_capacity(path.len());
    for c in path.chars() {
        if c.is_ascii_control() || c == ';' {
            escaped.push_str(&format!("%{:02X}", u32::from(c)));
        } else {
            escaped.push(c);
        }
    }
    escaped
}

/// Two routes that claim the same host and path: which room wrote the
/// second, and under which key (`rooms[1].additional_routes[0]`).
#[derive(Debug, PartialEq, Eq)]
pub struct RouteClash {
    /// The key path of the second claim, from the top of the file.
    pub key: String,
    pub problem: String,
}

/// Refuses a (host, path) pair claimed twice, by two rooms or twice by one:
/// which room a request would get would then hang on the order of the
/// tables. Hosts compare without case or trailing dot; paths as routing
/// compares them (parameters cut, a trailing `/` ignored, case folded unless
/// both rooms are case-sensitive).
pub fn check_routes(rooms: &[RoomSpec]) -> Result<(), RouteClash> {
    let key = |host: &str, path: &str, fold: bool| {
        let path = crate::target::match_key(path, !fold);
        let path = match path.trim_end_matches('/') {
            "" => "/".to_owned(),
            p => p.to_owned(),
        };
        (host.trim_end_matches('.').to_ascii_lowercase(), path)
    };
    let mut seen: Vec<(usize, String, &str, &str)> = Vec::new();
    for (index, room) in rooms.iter().enumerate() {
        for (field, host, path) in room.routes() {
            for (first, first_field, first_host, first_path) in &seen {
                let fold = !(room.path_case_sensitive && rooms[*first].path_case_sensitive);
                if key(host, path, fold) == key(first_host, first_path, fold) {
                    let first_key = format!("rooms[{first}].{first_field}");
                    return Err(RouteClash {
                        key: format!("rooms[{index}].{field}"),
                        problem: format!(
                            "host {host:?} path {path:?} is already a route of room {:?} ({first_key}); \
                             each host and path may belong to one room only",
                            rooms[*first].id
                        ),
                    });
                }
            }
            seen.push((index, field, host, path));
        }
    }
    Ok(())
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
            .flat_map(|(i, r)| {
                r.routes().map(move |(_, host, path)| Route {
                    host: host.trim_end_matches('.').to_owned(),
                    prefix: crate::target::match_key(path, r.path_case_sensitive).into_owned(),
                    case_sensitive: r.path_case_sensitive,
                    merge_slashes: r.merge_slashes,
                    room: i,
                })
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

    fn with_routes(mut spec: RoomSpec, routes: &[(&str, &str)]) -> RoomSpec {
        spec.additional_routes = routes
            .iter()
            .map(|(h, p)| ((*h).to_owned(), (*p).to_owned()))
            .collect();
        spec
    }

    #[test]
    fn additional_routes_lead_to_their_room_by_the_longest_prefix() {
        let t = RoomTable::new(&[
            spec("site", "shop.example", "/"),
            with_routes(
                spec("drop", "shop.example", "/drop"),
                &[("drop.example", "/"), ("shop.example", "/launch/now")],
            ),
        ]);
        let id = |h, p| t.find(h, p).map(|i| t.rooms[i].id.as_str());
        assert_eq!(id("shop.example", "/drop/x"), Some("drop"));
        assert_eq!(id("drop.example", "/anything"), Some("drop"));
        assert_eq!(id("DROP.example.", "/"), Some("drop"));
        assert_eq!(id("shop.example", "/launch/now/1"), Some("drop"));
        assert_eq!(id("shop.example", "/launch"), Some("site"));
        assert_eq!(id("other.example", "/drop"), None);
    }

    #[test]
    fn a_route_claimed_twice_is_refused_naming_both_claims() {
        let clash = |rooms: &[RoomSpec]| check_routes(rooms).unwrap_err();
        let err = clash(&[
            spec("a", "shop.example", "/drop"),
            with_routes(spec("b", "b.example", "/"), &[("Shop.Example.", "/drop/")]),
        ]);
        assert_eq!(err.key, "rooms[1].additional_routes[0]");
        assert!(
            err.problem.contains("room \"a\" (rooms[0].path)"),
            "{}",
            err.problem
        );
        let err = clash(&[with_routes(
            spec("a", "shop.example", "/drop"),
            &[("x.example", "/"), ("x.example", "/;v=1")],
        )]);
        assert_eq!(err.key, "rooms[0].additional_routes[1]");
        assert!(err.problem.contains("rooms[0].additional_routes[0]"));
        let err = clash(&[
            spec("a", "shop.example", "/drop"),
            spec("b", "shop.example", "/DROP"),
        ]);
        assert_eq!(err.key, "rooms[1].path");
        let mut sensitive = [
            spec("a", "shop.example", "/drop"),
            spec("b", "shop.example", "/DROP"),
        ];
        for s in &mut sensitive {
            s.path_case_sensitive = true;
        }
        assert_eq!(
            check_routes(&sensitive),
            Ok(()),
            "two spellings, both case-sensitive"
        );
        assert_eq!(
            check_routes(&[
                spec("a", "shop.example", "/drop"),
                spec("b", "*", "/drop"),
                spec("c", "shop.example", "/drop/x"),
            ]),
            Ok(())
        );
    }

    #[test]
    fn the_cookie_path_covers_every_route_of_the_room() {
        assert_eq!(cookie_path(["/shop"].into_iter()), "/shop");
        assert_eq!(cookie_path(["/shop/", "/shop/drop"].into_iter()), "/shop");
        assert_eq!(cookie_path(["/shop", "/shopping"].into_iter()), "/");
        assert_eq!(cookie_path(["/shop", "/"].into_iter()), "/");
        // What a `Set-Cookie` line cannot hold is escaped, not written.
        assert_eq!(
            cookie_path(["/a b;c%d\r\n\t\u{7f}x\u{e9}/e"].into_iter()),
            "/a b%3Bc%d%0D%0A%09%7Fx\u{e9}/e"
        );
    }

    #[test]
    fn no_room_when_nothing_covers_the_request() {
        let t = RoomTable::new(&[spec("shop", "shop.example", "/shop")]);
        assert_eq!(t.find("shop.example", "/"), None);
        assert_eq!(t.find("x.example", "/shop"), None);
    }
}
