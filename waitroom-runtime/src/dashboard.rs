//! The live dashboard both admin listeners serve: `GET /dashboard` (one HTML
//! page, its CSS and JS inline, charts drawn as inline SVG) and
//! `GET /dashboard.json`, which the page polls.
//!
//! The page is the same for the node and the aggregator; each binary fills
//! a [`Dashboard`] from its own `/status` numbers (so the page and `/status`
//! cannot disagree) and keeps a [`History`] of the last hour, sampled by a
//! background task every [`SAMPLE_EVERY`], never on the request path.
//!
//! Offline by construction: the page loads nothing but `/dashboard.json`
//! from the listener that served it, and a Content-Security-Policy header
//! makes the browser refuse anything else.
use std::{collections::VecDeque, time::Duration};

use http::{HeaderValue, Response, StatusCode, header};
use parking_lot::Mutex;
use serde::Serialize;
use waitroom_common::{estimate::WaitEstimate, phase::RoomPhase, time::UnixMillis};

use crate::{admin::text, body::Body, shutdown::Shutdown};

/// The page: HTML with its CSS and JS inline.
pub const PAGE: &str = include_str!("dashboard.html");

/// How often the history takes a sample.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// How far back the charts go.
pub const WINDOW: Duration = Duration::from_secs(60 * 60);
/// Samples kept: one hour at one every ten seconds. The ring never holds
/// more, however long the process runs.
pub const CAPACITY: usize = (WINDOW.as_secs() / SAMPLE_EVERY.as_secs()) as usize;

/// Allowed sources of the page: itself (inline script and style) and JSON
/// from its own origin. Nothing else loads, on or off line.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// What the page shows: one listener's view of every room.
#[derive(Debug, Clone, Serialize)]
pub struct Dashboard {
    /// `"node"` or `"aggregator"`: the page labels its columns by it.
    pub view: &'static str,
    /// The node's id, or `"aggregator"`.
    pub name: String,
    /// The node's colo (node view only).
    pub colo: Option<String>,
    /// The clock of the process when the numbers were read.
    pub at_ms: u64,
    pub rooms: Vec<RoomView>,
    /// The nodes the aggregator knows (aggregator view only).
    pub nodes: Vec<NodeView>,
    /// The node's link to the aggregator (node view only; `None` standalone).
    pub gossip: Option<GossipView>,
}

/// One room's numbers.
#[derive(Debug, Clone, Serialize)]
pub struct RoomView {
    pub id: String,
    pub phase: RoomPhase,
    /// The phase of a scheduled event (pre-queue, started, ended). Events do
    /// not exist yet; always `None` until the control plane has them.
    pub event_phase: Option<String>,
    /// Limits: active users at once, and new visitors per minute.
    pub total_active_users: u64,
    pub new_users_per_minute: u64,
    /// The room as a whole (on a node: the global state it holds).
    pub counts: Counts,
    pub admits_per_minute: f64,
    pub wait_estimate: WaitEstimate,
    /// Node view: how old the global state is.
    pub state_age_ms: Option<u64>,
    /// Node view: this node's own counters.
    pub this_node: Option<Counts>,
    /// Aggregator view: the counts summed by colo.
    pub by_colo: Vec<PlaceCounts>,
    /// Aggregator view: each node's counts.
    pub by_node: Vec<PlaceCounts>,
}

/// The three numbers a room is watched by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub active_users: u64,
    pub admitted_this_minute: u64,
    pub total_waiting: u64,
}

/// [`Counts`] of one node or one colo.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlaceCounts {
    /// The node's id or the colo's name.
    pub name: String,
    /// The node's colo (by node only).
    pub colo: Option<String>,
    /// The node is silent past the timeout (by node only).
    pub departed: bool,
    #[serde(flatten)]
    pub counts: Counts,
}

impl PlaceCounts {
    /// The nodes' counts summed by colo, colos in name order.
    #[must_use]
    pub fn by_colo(nodes: &[PlaceCounts]) -> Vec<PlaceCounts> {
        let mut colos: std::collections::BTreeMap<&str, Counts> = Default::default();
        for node in nodes {
            let sum = colos.entry(node.colo.as_deref().unwrap_or("")).or_default();
            sum.active_users = sum.active_users.saturating_add(node.counts.active_users);
            sum.admitted_this_minute = sum
                .admitted_this_minute
                .saturating_add(node.counts.admitted_this_minute);
            sum.total_waiting = sum.total_waiting.saturating_add(node.counts.total_waiting);
        }
        colos
            .into_iter()
            .map(|(name, counts)| PlaceCounts {
                name: name.to_owned(),
                colo: None,
                departed: false,
                counts,
            })
            .collect()
    }
}

/// A node known to the aggregator.
#[derive(Debug, Clone, Serialize)]
pub struct NodeView {
    pub node: String,
    pub colo: String,
    pub last_report_age_ms: u64,
    pub departed: bool,
    /// The room settings version the node runs (`None`: its file's).
    pub settings_version: Option<u64>,
    /// It does not run the aggregator's version in force.
    pub settings_behind: bool,
}

/// A node's link to the aggregator.
#[derive(Debug, Clone, Serialize)]
pub struct GossipView {
    pub connected: bool,
    pub fresh: bool,
    pub state_age_ms: Option<u64>,
}

/// One room at one sample.
#[derive(Debug, Clone, Copy, PartialEq)]
struct RoomSample {
    counts: Counts,
    this_node: Option<Counts>,
    /// `None` while no estimate is known.
    wait_minutes: Option<f64>,
}

/// One sample of every room.
#[derive(Debug, Clone)]
struct Sample {
    at: UnixMillis,
    rooms: Vec<(String, RoomSample)>,
}

/// The last hour of every room, at most [`CAPACITY`] samples.
#[derive(Debug, Default)]
pub struct History {
    ring: Mutex<VecDeque<Sample>>,
}

impl History {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a sample of `view`, dropping what is older than [`WINDOW`] (by
    /// the sample's clock) and whatever passes [`CAPACITY`].
    pub fn record(&self, view: &Dashboard) {
        let at = UnixMillis(view.at_ms);
        let rooms = view
            .rooms
            .iter()
            .map(|r| {
                (
                    r.id.clone(),
                    RoomSample {
                        counts: r.counts,
                        this_node: r.this_node,
                        wait_minutes: (r.wait_estimate.wait_time_known
                            && r.wait_estimate.minutes.is_finite())
                        .then_some(r.wait_estimate.minutes),
                    },
                )
            })
            .collect();
        let window = WINDOW.as_millis() as u64;
        let mut ring = self.ring.lock();
        // A clock that went back: what came "after" now is not history.
        while ring.back().is_some_and(|s| s.at > at) {
            ring.pop_back();
        }
        while ring.front().is_some_and(|s| s.at.0 + window < at.0) || ring.len() >= CAPACITY {
            ring.pop_front();
        }
        ring.push_back(Sample { at, rooms });
    }

    /// Samples held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.ring.lock().len()
    }

    /// True before the first sample.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The history as the page reads it: sample times, and per room one
    /// array per series aligned with them (`null` where the room had no
    /// sample, e.g. before a reload added it).
    #[must_use]
    pub fn to_json(&self) -> serde_json::Value {
        let ring = self.ring.lock();
        let mut ids: Vec<&str> = Vec::new();
        for sample in ring.iter() {
            for (id, _) in &sample.rooms {
                if !ids.contains(&id.as_str()) {
                    ids.push(id);
                }
            }
        }
        let series = |id: &str, f: &dyn Fn(&RoomSample) -> Option<f64>| -> serde_json::Value {
            ring.iter()
                .map(|s| {
                    s.rooms
                        .iter()
                        .find(|(r, _)| r == id)
                        .and_then(|(_, sample)| f(sample))
                })
                .collect::<Vec<Option<f64>>>()
                .into()
        };
        let rooms: serde_json::Map<String, serde_json::Value> = ids
            .iter()
            .map(|&id| {
                let mut room = serde_json::json!({
                    "active_users": series(id, &|s| Some(s.counts.active_users as f64)),
                    "admitted_this_minute": series(id, &|s| Some(s.counts.admitted_this_minute as f64)),
                    "total_waiting": series(id, &|s| Some(s.counts.total_waiting as f64)),
                    "wait_minutes": series(id, &|s| s.wait_minutes),
                });
                if ring
                    .iter()
                    .flat_map(|s| &s.rooms)
                    .any(|(r, s)| r == id && s.this_node.is_some())
                {
                    room["node_active_users"] =
                        series(id, &|s| s.this_node.map(|c| c.active_users as f64));
                    room["node_admitted_this_minute"] =
                        series(id, &|s| s.this_node.map(|c| c.admitted_this_minute as f64));
                    room["node_total_waiting"] =
                        series(id, &|s| s.this_node.map(|c| c.total_waiting as f64));
                }
                (id.to_owned(), room)
            })
            .collect();
        serde_json::json!({
            "sample_every_ms": SAMPLE_EVERY.as_millis() as u64,
            "window_ms": WINDOW.as_millis() as u64,
            "capacity": CAPACITY,
            "at_ms": ring.iter().map(|s| s.at.0).collect::<Vec<u64>>(),
            "rooms": rooms,
        })
    }
}

/// `GET /dashboard`.
#[must_use]
pub fn page() -> Response<Body> {
    let mut resp = text(StatusCode::OK, "text/html; charset=utf-8", PAGE.to_owned());
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    resp
}

/// `GET /dashboard.json`: `view` with `history` added.
#[must_use]
pub fn json(view: &Dashboard, history: &History) -> Response<Body> {
    let mut body = serde_json::to_value(view).unwrap_or_default();
    if let Some(object) = body.as_object_mut() {
        object.insert("history".into(), history.to_json());
    }
    let mut resp = text(
        StatusCode::OK,
        "application/json",
        serde_json::to_string(&body).unwrap_or_else(|_| "{}".into()),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// Calls `sample` now and then every [`SAMPLE_EVERY`] until shutdown: the
/// history's only writer, on a background task.
pub async fn sample_until_shutdown(mut shutdown: Shutdown, mut sample: impl FnMut()) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => sample(),
            () = shutdown.requested() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(at_ms: u64, active: u64) -> Dashboard {
        Dashboard {
            view: "node",
            name: "n1".into(),
            colo: Some("x".into()),
            at_ms,
            rooms: vec![RoomView {
                id: "shop".into(),
                phase: RoomPhase::NotQueueing,
                event_phase: None,
                total_active_users: 10,
                new_users_per_minute: 5,
                counts: Counts {
                    active_users: active,
                    admitted_this_minute: 1,
                    total_waiting: 0,
                },
                admits_per_minute: 0.0,
                wait_estimate: WaitEstimate::unknown(0),
                state_age_ms: Some(0),
                this_node: Some(Counts::default()),
                by_colo: vec![],
                by_node: vec![],
            }],
            nodes: vec![],
            gossip: None,
        }
    }

    #[test]
    fn the_ring_never_holds_more_than_an_hour() {
        let history = History::new();
        let step = SAMPLE_EVERY.as_millis() as u64;
        for i in 0..(CAPACITY as u64 * 3) {
            history.record(&view(1_000_000 + i * step, i));
            assert!(history.len() <= CAPACITY);
        }
        assert_eq!(history.len(), CAPACITY);
        let json = history.to_json();
        let at = json["at_ms"].as_array().unwrap();
        assert_eq!(at.len(), CAPACITY);
        let newest = at.last().unwrap().as_u64().unwrap();
        let oldest = at[0].as_u64().unwrap();
        assert!(newest - oldest <= WINDOW.as_millis() as u64);
        let active = json["rooms"]["shop"]["active_users"].as_array().unwrap();
        assert_eq!(active.len(), CAPACITY);
        assert_eq!(
            active.last().unwrap().as_f64(),
            Some((CAPACITY * 3 - 1) as f64)
        );
        assert!(json["rooms"]["shop"]["wait_minutes"][0].is_null());
        assert!(json["rooms"]["shop"]["node_active_users"].is_array());
    }

    #[test]
    fn samples_older_than_the_window_go_even_when_sampled_rarely() {
        let history = History::new();
        history.record(&view(0, 1));
        history.record(&view(30 * 60_000, 2));
        history.record(&view(61 * 60_000, 3));
        let json = history.to_json();
        assert_eq!(json["at_ms"], serde_json::json!([30 * 60_000, 61 * 60_000]));
        // A clock set back: the samples "from the future" are dropped.
        history.record(&view(40 * 60_000, 4));
        assert_eq!(
            history.to_json()["at_ms"],
            serde_json::json!([30 * 60_000, 40 * 60_000])
        );
    }

    #[test]
    fn colos_sum_their_nodes() {
        let node = |name: &str, colo: &str, active| PlaceCounts {
            name: name.into(),
            colo: Some(colo.into()),
            departed: false,
            counts: Counts {
                active_users: active,
                admitted_this_minute: 1,
                total_waiting: 2,
            },
        };
        let colos =
            PlaceCounts::by_colo(&[node("a", "y", 1), node("b", "x", 2), node("c", "y", 4)]);
        let got: Vec<(&str, Counts)> = colos.iter().map(|c| (c.name.as_str(), c.counts)).collect();
        assert_eq!(
            got,
            [
                (
                    "x",
                    Counts {
                        active_users: 2,
                        admitted_this_minute: 1,
                        total_waiting: 2
                    }
                ),
                (
                    "y",
                    Counts {
                        active_users: 5,
                        admitted_this_minute: 2,
                        total_waiting: 4
                    }
                ),
            ]
        );
    }

    #[test]
    fn the_page_loads_nothing_from_elsewhere() {
        // No URL in the page but the SVG namespace (a name, never fetched):
        // every request it makes is relative.
        let html = PAGE.replace("\"http://www.w3.org/2000/svg\"", "");
        for needle in [
            "http:", "https:", "//cdn", "src=", "href=", "@import", "url(",
        ] {
            assert!(!html.contains(needle), "the page mentions {needle}");
        }
        let resp = page();
        let csp = resp.headers()[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap();
        assert!(csp.starts_with("default-src 'none'"), "{csp}");
        assert_eq!(
            resp.headers()[header::CONTENT_TYPE],
            "text/html; charset=utf-8"
        );
    }
}
