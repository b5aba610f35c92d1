//! [`Node`]: everything the workers share, complete when constructed.
//!
//! Start-up ([`crate::start`]) opens the counters, loads the keys, builds the
//! rooms, attaches XDP and starts gossip first, then hands the finished parts
//! to [`Node::new`]; nothing is filled in later.
use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use arc_swap::ArcSwap;
use waitroom_common::{
    counters::{Pool, RoomCounters},
    room::Room,
    share::{ColdStart, cold_start_state, local_only_state, within_lease},
    state::{AdmitRate, GlobalState},
    time::UnixMillis,
};
use waitroom_runtime::{clock::Clock, tls::CertSwap};

use crate::{
    config::{EdgeConfig, NodeSection},
    cookie::{self, CookieKeys},
    counters::SharedCounters,
    gossip::{self, GossipHandle},
    metrics, pages, queue_page, reload, rooms, upstream, xdp, xdp_signal,
};

/// Request-path settings derived from the config, read by every worker.
#[derive(Debug, Clone)]
pub struct Settings {
    pub max_connections_per_worker: usize,
    /// `node.cpu_affinity`: worker `i` is pinned to `cpu_affinity[i % len]`.
    pub cpu_affinity: Vec<usize>,
    /// 0: no per-address cap.
    pub max_connections_per_address: usize,
    /// From accept to the first complete request head.
    pub header_read_timeout: Duration,
    /// No request in flight for this long: the connection is closed.
    pub keepalive_timeout: Duration,
    /// A response write stuck this long: the connection is closed.
    pub send_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    /// `node.http1_fast_path`: plain HTTP/1.1 requests served by `http::h1`.
    pub http1_fast_path: bool,
    pub shutdown_grace: Duration,
    /// `node.trusted_proxies`: whose forwarding and PROXY headers are believed.
    pub trusted_proxies: crate::forwarded::TrustedProxies,
    /// This node's `Via` entry, which also tells a request that came round.
    pub via: crate::forwarded::Via,
}

impl Settings {
    #[must_use]
    pub fn from_node(n: &NodeSection) -> Self {
        Self {
            max_connections_per_worker: n.max_connections_per_worker.max(1),
            cpu_affinity: n.cpu_affinity.clone(),
            max_connections_per_address: n.max_connections_per_address,
            header_read_timeout: Duration::from_millis(n.header_read_timeout_ms.max(1)),
            keepalive_timeout: Duration::from_millis(n.keepalive_timeout_ms.max(1)),
            send_timeout: Duration::from_millis(n.send_timeout_ms.max(1)),
            max_header_bytes: n.max_header_bytes,
            max_headers: n.max_headers,
            http1_fast_path: n.http1_fast_path,
            shutdown_grace: Duration::from_millis(n.shutdown_grace_ms),
            trusted_proxies: crate::forwarded::TrustedProxies::new(&n.trusted_proxies),
            via: crate::forwarded::Via::new(&n.id),
        }
    }
}

/// One room at run time: its spec, the engine's room, its page and metrics.
#[derive(Debug)]
pub struct RoomRuntime {
    /// Where the room applies and where its origin is, as started (a change of
    /// these needs a restart; see [`Node::reload`]).
    pub spec: rooms::RoomSpec,
    /// What a reload (SIGHUP) may change while requests flow: limits, method,
    /// template, queue status. Loaded once per request.
    pub live: ArcSwap<RoomLive>,
    /// Name of this room's cookie.
    pub cookie_name: String,
    /// This room's slot in the node counters file.
    pub counters_slot: usize,
    pub metrics: metrics::RoomMetrics,
    /// The latest global state; the request path only loads it.
    pub state: ArcSwap<GlobalState>,
    /// The room's origin pools and their health (shared with the checker).
    pub upstream: Arc<upstream::Upstream>,
}

impl RoomRuntime {
    /// Builds every configured room, each bound to its slot in `counters`.
    pub fn build_all(
        config: &EdgeConfig,
        counters: &SharedCounters,
        clock: &Clock,
    ) -> anyhow::Result<Vec<Self>> {
        let now = clock.now();
        config
            .rooms
            .iter()
            .map(|spec| {
                Ok(Self {
                    cookie_name: cookie::cookie_name(&spec.id),
                    counters_slot: counters
                        .slot_of(spec.engine.id())
                        .context("the counters file has no slot for this room")?,
                    live: ArcSwap::from_pointee(RoomLive::from_spec(spec)?),
                    spec: spec.clone(),
                    metrics: metrics::RoomMetrics::default(),
                    state: ArcSwap::from_pointee(GlobalState::empty(now)),
                    upstream: Arc::new(upstream::Upstream::new(&spec.id, &spec.upstream)),
                })
            })
            .collect()
    }
}

/// The parts of a room a reload replaces.
#[derive(Debug)]
pub struct RoomLive {
    /// The engine's room: limits, queueing method, cookie attributes.
    pub engine: Room,
    pub page: queue_page::QueuePage,
    /// The tags of `queue_page_languages`, lower-case, in the order of
    /// `language_pages`.
    pub languages: Vec<String>,
    pub language_pages: Vec<queue_page::QueuePage>,
    /// `default_template_language`: the language of `page` and of the
    /// reject and error pages.
    pub default_language: String,
    /// The page of a `reject` room.
    pub reject_page: pages::StatusPage,
    /// The page of an origin that failed, or of too many new visitors.
    pub error_page: pages::StatusPage,
    /// The queue page of each scheduled event (by position in the room's
    /// events); `None`: the room's page.
    pub event_pages: Vec<Option<queue_page::QueuePage>>,
    /// HTTP status of the queue page.
    pub queue_status: u16,
    /// The room is out of the way: straight to the origin, nothing counted.
    pub suspended: bool,
    /// Requests that skip the queue and the counts (`[[rooms.bypass]]`).
    pub bypass: crate::bypass::BypassRules,
    /// What the origin may tell the room in a response header.
    pub origin_commands: crate::origin_command::OriginCommands,
    /// The key the queue's JSON answer is wrapped in (`json_envelope`).
    pub json_envelope: String,
}

/// A room's page or rule that does not load: the key to fix and why.
#[derive(Debug, thiserror::Error)]
#[error("room {room}: {key}: {message}")]
pub struct RoomLiveError {
    pub room: String,
    /// The key of the room's table (`queue_page`, `queue_page_languages.de`,
    /// `events[0].queue_page`, `reject_page`, `error_page`, `bypass`).
    pub key: String,
    pub message: String,
}

impl RoomLive {
    pub fn from_spec(spec: &rooms::RoomSpec) -> Result<Self, RoomLiveError> {
        let fail = |key: &str, message: String| RoomLiveError {
            room: spec.id.clone(),
            key: key.to_owned(),
            message,
        };
        let read = |key: &str, path: &std::path::Path| {
            std::fs::read_to_string(path)
                .map_err(|e| fail(key, format!("reading {}: {e}", path.display())))
                .map(|source| (path.display().to_string(), source))
        };
        let page = match &spec.queue_page {
            Some(path) => {
                let (name, source) = read("queue_page", path)?;
                queue_page::QueuePage::from_source(&name, source)
                    .map_err(|e| fail("queue_page", e.to_string()))?
            }
            None => queue_page::QueuePage::builtin(),
        };
        let mut languages = Vec::new();
        let mut language_pages = Vec::new();
        for (tag, path) in &spec.queue_page_languages {
            let key = format!("queue_page_languages.{tag}");
            let (name, source) = read(&key, path)?;
            language_pages.push(
                queue_page::QueuePage::from_source(&name, source)
                    .map_err(|e| fail(&key, e.to_string()))?,
            );
            languages.push(tag.to_ascii_lowercase());
        }
        let status_page =
            |key: &str, path: &Option<std::path::PathBuf>, builtin: fn() -> pages::StatusPage| {
                match path {
                    Some(path) => {
                        let (name, source) = read(key, path)?;
                        pages::StatusPage::from_source(&name, source)
                            .map_err(|e| fail(key, e.to_string()))
                    }
                    None => Ok(builtin()),
                }
            };
        let reject_page = status_page(
            "reject_page",
            &spec.reject_page,
            pages::StatusPage::builtin_reject,
        )?;
        let error_page = status_page(
            "error_page",
            &spec.error_page,
            pages::StatusPage::builtin_error,
        )?;
        let event_pages = spec
            .engine
            .events()
            .iter()
            .enumerate()
            .map(|(i, event)| {
                event
                    .queue_page
                    .as_ref()
                    .map(|path| {
                        let key = format!("events[{i}].queue_page");
                        let (name, source) = read(&key, path)?;
                        queue_page::QueuePage::from_source(&name, source)
                            .map_err(|e| fail(&key, e.to_string()))
                    })
                    .transpose()
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            engine: spec.engine.clone(),
            page,
            languages,
            language_pages,
            default_language: spec.default_template_language.clone(),
            reject_page,
            error_page,
            event_pages,
            queue_status: spec.queue_status,
            suspended: spec.suspended,
            bypass: crate::bypass::BypassRules::new(&spec.bypass)
                .map_err(|e| fail("bypass", format!("{e:#}")))?,
            origin_commands: spec.origin_commands.clone(),
            json_envelope: spec.json_envelope.clone(),
        })
    }

    /// The queue page for `engine` (the room as it stands now) and a visitor
    /// whose `Accept-Language` chose `language` (an index of
    /// [`Self::languages`]): the page of the event in force, if it names
    /// one; else the page of the chosen language; else the room's.
    #[must_use]
    pub fn page_in(&self, engine: &Room, language: Option<usize>) -> &queue_page::QueuePage {
        engine
            .event()
            .and_then(|event| self.event_pages.get(event.index)?.as_ref())
            .or_else(|| self.language_pages.get(language?))
            .unwrap_or(&self.page)
    }

    /// The language a visitor's `Accept-Language` chooses among the room's
    /// pages (`None`: the default). Nothing is parsed when the room has no
    /// pages by language.
    #[must_use]
    pub fn language_of(&self, headers: &hyper::HeaderMap) -> Option<usize> {
        if self.languages.is_empty() {
            return None;
        }
        let value = headers.get(hyper::header::ACCEPT_LANGUAGE)?;
        pages::pick_language(value.as_bytes(), &self.languages)
    }

    /// The tag of `language` (an index of [`Self::languages`]), or the default's.
    #[must_use]
    pub fn language_tag(&self, language: Option<usize>) -> &str {
        language
            .and_then(|i| self.languages.get(i))
            .map_or(self.default_language.as_str(), String::as_str)
    }
}

/// Every origin spec of `config` with the name it is reported under: each
/// room's, and the default origin's (`[node.unrouted]`).
pub fn origin_specs(config: &EdgeConfig) -> impl Iterator<Item = (&str, &upstream::UpstreamSpec)> {
    config
        .rooms
        .iter()
        .map(|r| (r.id.as_str(), &r.upstream))
        .chain(
            config
                .default_origin
                .as_ref()
                .map(|d| (crate::unrouted::LABEL, &d.upstream)),
        )
}

/// The attached XDP program and what it tells.
#[derive(Debug)]
pub struct NodeXdp {
    /// The program: the admin deny list goes through it; dropping the last
    /// reference detaches it.
    pub guard: Arc<xdp::XdpGuard>,
    /// Its telemetry, read every second off the request path.
    pub telemetry: Arc<xdp_signal::Telemetry>,
    /// Where the admin listener keeps the deny list across restarts.
    pub deny_file: std::path::PathBuf,
}

/// Everything the workers share: settings, rooms, counters, keys, metrics.
#[derive(Debug)]
pub struct Node {
    pub settings: Settings,
    pub routes: rooms::RoomTable,
    pub rooms: Vec<RoomRuntime>,
    pub counters: Arc<SharedCounters>,
    /// Where each ticket's count sits (a ticket moves the counters once).
    pub ledger: Arc<crate::ledger::SharedLedger>,
    /// Cookie keys; a reload may rotate them.
    pub keys: ArcSwap<CookieKeys>,
    pub metrics: metrics::NodeMetrics,
    /// Open visitor connections per client address, across workers.
    pub connections_per_address: Arc<crate::http::conn::AddressCounts>,
    pub id: String,
    pub colo: String,
    /// Where the request path and the refresh loop read the time.
    pub clock: Clock,
    /// The gossip client (`[aggregator]` configured), or `None`: the node is
    /// the whole world.
    pub gossip: Option<GossipHandle>,
    /// The XDP program, if `[xdp]` is configured and it attached.
    pub xdp: Option<NodeXdp>,
    /// Requests no room covers: 404 or the default origin, and their counts.
    pub unrouted: crate::unrouted::Unrouted,
    /// Trust and server names for `tls = true` origin pools.
    pub origin_tls: upstream::tls::OriginTls,
    /// The configuration in force and what reloads did.
    pub reloads: reload::ReloadState,
    /// Request targets refused before routing (400), by reason.
    pub refused_targets: crate::target::RefusedTargets,
    /// Hostile or broken client behaviour caught, by reason.
    pub defences: crate::metrics::Defences,
    /// New tickets per client address (`new_tickets_per_address_per_minute`).
    pub new_tickets: crate::new_tickets::NewTicketLimiter,
    /// The admin dashboard's last hour, sampled by a background task.
    pub history: waitroom_runtime::dashboard::History,
    /// `[node.access_log]`: each worker's queue and the writer thread.
    pub access_log: crate::access_log::AccessLog,
    /// Each room's share as last persisted, from an earlier run: what the
    /// node goes by until the aggregator answers.
    restored_shares: Vec<Option<f64>>,
    /// Where shares are kept across restarts (in the state directory).
    shares_path: std::path::PathBuf,
    /// What a room without any share to go by does.
    cold_start: ColdStart,
}

/// What [`Node::new`] is built from: each part made by its own start-up step.
#[derive(Debug)]
pub struct NodeParts {
    pub counters: Arc<SharedCounters>,
    pub ledger: Arc<crate::ledger::SharedLedger>,
    pub keys: CookieKeys,
    pub rooms: Vec<RoomRuntime>,
    pub clock: Clock,
    pub gossip: Option<GossipHandle>,
    pub xdp: Option<NodeXdp>,
    /// The TLS listener's certificate (`[node.tls]`), which a reload replaces.
    pub https_cert: Option<Arc<CertSwap>>,
    /// The access log, opened (or off).
    pub access_log: crate::access_log::AccessLog,
    /// A standalone node's control API store (its own room settings
    /// versions); `None` with an aggregator, whose settings it runs.
    pub settings_store: Option<Arc<parking_lot::Mutex<waitroom_runtime::control::SettingsStore>>>,
}

impl Node {
    pub fn new(config: &EdgeConfig, parts: NodeParts) -> anyhow::Result<Self> {
        let now = parts.clock.now();
        let shares_path = config.node.state_dir().join("shares.json");
        let restored = read_shares(&shares_path);
        Ok(Self {
            settings: Settings::from_node(&config.node),
            routes: rooms::RoomTable::new(&config.rooms),
            rooms: parts.rooms,
            counters: parts.counters,
            ledger: parts.ledger,
            keys: ArcSwap::from_pointee(parts.keys),
            metrics: metrics::NodeMetrics::default(),
            connections_per_address: Arc::default(),
            id: config.node.id.clone(),
            colo: config.node.colo.clone(),
            clock: parts.clock,
            gossip: parts.gossip,
            xdp: parts.xdp,
            unrouted: crate::unrouted::Unrouted::new(config.default_origin.as_ref()),
            origin_tls: upstream::tls::OriginTls::new(origin_specs(config))?,
            reloads: reload::ReloadState::new(config, parts.https_cert, parts.settings_store, now),
            refused_targets: crate::target::RefusedTargets::default(),
            defences: crate::metrics::Defences::default(),
            new_tickets: crate::new_tickets::NewTicketLimiter::new(
                crate::new_tickets::NewTicketRate {
                    per_minute: config.node.new_tickets_per_address_per_minute,
                    burst: config.node.new_tickets_burst_per_address,
                },
            ),
            history: waitroom_runtime::dashboard::History::new(),
            access_log: parts.access_log,
            restored_shares: config
                .rooms
                .iter()
                .map(|r| {
                    restored
                        .get(&r.id)
                        .copied()
                        .filter(|s| (0.0..=1.0).contains(s))
                })
                .collect(),
            shares_path,
            cold_start: config
                .aggregator
                .as_ref()
                .map_or(ColdStart::QueueAll, |g| g.cold_start()),
        })
    }

    /// The ticket ledger the engine moves counts by.
    pub fn ledger(&self) -> &waitroom_common::ledger::TicketLedger {
        self.ledger.ledger()
    }

    /// The counters of room `index` (claimed at start, so always there).
    pub fn room_counters(&self, index: usize) -> &RoomCounters {
        self.counters.slot(self.rooms[index].counters_slot)
    }

    /// Recomputes every room's state: from the gossiped world when an
    /// aggregator is configured, else from this node's own counters.
    pub fn refresh_states(&self, rates: &mut [AdmitRate]) {
        match &self.gossip {
            Some(gossip) => self.refresh_from_world(&gossip.world, rates),
            None => self.refresh_standalone(rates),
        }
    }

    /// Recomputes every room's state from the gossiped world: the aggregator's
    /// answer while it is fresh, else the local-only state (this node's last
    /// known share of the limits; the whole room if no answer ever came).
    /// Each room's freshness is its own: rooms sharded between aggregator
    /// groups, one group's outage leaves the others' rooms global.
    pub fn refresh_from_world(&self, world: &gossip::WorldView, rates: &mut [AdmitRate]) {
        let now = self.clock.now();
        let elapsed = self.clock.elapsed();
        let current = world.load();
        for (i, room) in self.rooms.iter().enumerate() {
            let view = current.room(room.spec.engine.id());
            let engine = &room.live.load().engine;
            let state = match view {
                Some(view) if world.room_fresh(view, elapsed) => Arc::clone(&view.state),
                _ => match view.and_then(|v| v.share).or(self.restored_shares[i]) {
                    Some(share) => {
                        let local = local_only_state(
                            engine,
                            self.room_counters(i),
                            &mut rates[i],
                            Some(share),
                            now,
                        );
                        // Within the last answer's leases until its minute
                        // ends: the aggregators still count them.
                        Arc::new(match view {
                            Some(view) => within_lease(local, &view.state, now),
                            None => local,
                        })
                    }
                    // Never a share: not the whole room (see `ColdStart`).
                    None => Arc::new(cold_start_state(
                        engine,
                        self.room_counters(i),
                        &mut rates[i],
                        self.cold_start,
                        now,
                    )),
                },
            };
            room.state.store(state);
        }
    }

    /// The on-demand lease's prefetch, on the refresh tick: asks the
    /// aggregator out of cycle when a room's remaining shared slots will run
    /// out within the next report interval at the rate since the last tick
    /// (`samples` keeps each room's last (time, shared admits)).
    pub fn prefetch_lease(&self, samples: &mut [Option<(UnixMillis, u64)>]) {
        let Some(gossip) = &self.gossip else { return };
        if !gossip.lease.holding() {
            return;
        }
        let now = self.clock.now();
        let interval_ms = gossip.interval_ms;
        for (i, room) in self.rooms.iter().enumerate() {
            let state = room.state.load();
            let minute = now.minute();
            let admits = self.room_counters(i).admits(minute);
            let used = admits.colo_share.saturating_add(admits.anywhere);
            let cap = state
                .cap(Pool::ColoShare, now, false)
                .saturating_add(state.cap(Pool::Anywhere, now, false));
            let before = samples[i].replace((now, used));
            let Some((then, used_then)) = before.filter(|(t, _)| t.minute() == minute) else {
                continue;
            };
            if gossip::lease::runs_out_within(
                cap.saturating_sub(used),
                used.saturating_sub(used_then),
                now.0.saturating_sub(then.0),
                interval_ms,
            ) {
                gossip.lease.ask();
            }
        }
    }

    /// Recomputes every room's state from this node's own counters: the node as
    /// the whole world (no aggregator).
    pub fn refresh_standalone(&self, rates: &mut [AdmitRate]) {
        let now = self.clock.now();
        for (i, room) in self.rooms.iter().enumerate() {
            let state = GlobalState::standalone(
                &room.live.load().engine,
                self.room_counters(i),
                &mut rates[i],
                now,
            );
            room.state.store(Arc::new(state));
        }
    }
}

impl Node {
    /// Writes each room's current share (from the aggregator's answers) to
    /// the shares file, so a restart during an aggregator outage goes by it
    /// instead of the cold-start rule. Written atomically; failures logged.
    pub fn persist_shares(&self) {
        let Some(gossip) = &self.gossip else { return };
        let world = gossip.world.load();
        let shares: std::collections::BTreeMap<&str, f64> = self
            .rooms
            .iter()
            .filter_map(|r| {
                let share = world.room(r.spec.engine.id())?.share?;
                Some((r.spec.id.as_str(), share))
            })
            .collect();
        if shares.is_empty() {
            return;
        }
        let write = || -> anyhow::Result<()> {
            crate::state_dir::replace(&self.shares_path, &serde_json::to_vec(&shares)?)?;
            Ok(())
        };
        if let Err(err) = write() {
            tracing::warn!(%err, path = %self.shares_path.display(), "could not keep the rooms' shares");
        }
    }
}

/// The shares kept by an earlier run, by room name (none if unreadable).
fn read_shares(path: &std::path::Path) -> std::collections::BTreeMap<String, f64> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|err| {
            tracing::warn!(%err, path = %path.display(), "shares file unreadable; ignoring it");
            Default::default()
        }),
        Err(_) => Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_shares_are_read_back_and_junk_is_ignored() {
        let dir = std::env::temp_dir().join(format!("wr-shares-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.shares");
        assert!(read_shares(&path).is_empty(), "no file: no shares");
        std::fs::write(&path, br#"{"shop":0.25,"drop":1.0}"#).unwrap();
        let shares = read_shares(&path);
        assert_eq!(shares.get("shop"), Some(&0.25));
        std::fs::write(&path, b"\x00garbage").unwrap();
        assert!(
            read_shares(&path).is_empty(),
            "unreadable: the cold-start rule"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
