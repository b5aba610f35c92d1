//! The node's gossip client: reports to the aggregator over QUIC every
//! interval and keeps the last known global state for the request path.
//!
//! # How it fits
//! [`spawn`] starts one task on the node's control runtime. Every
//! `interval_ms` it asks the [`Reporter`] for this node's counts (read from
//! the shared-memory counters, off the request path), sends them on a fresh
//! stream of one long-lived connection (see [`waitroom_common::wire`]), and swaps the
//! answer into the [`WorldView`]. The request path only ever `load()`s that
//! view: it never waits on the network, and a lost aggregator only makes the
//! view older.
//!
//! When answers stop, the view goes stale after `stale_after_ms`
//! ([`WorldView::freshness`]); the node then decides with
//! [`waitroom_common::share::local_only_state`], its last known share of the room's limits,
//! and goes back to the global state with the first new answer.
//!
//! # Anywhere leases
//! The Anywhere slots a node may hand out arrive with each answer as the
//! state's `allowance.anywhere`, on top of what it had used when it reported;
//! the node's ticket counter (`RoomCounters::take_ticket` with
//! `Pool::Anywhere`) enforces the cap exactly. Leases are per minute: the
//! per-minute ticket counters start again at zero, and the next answer
//! replaces the lease (see [`waitroom_common::cluster`] for the ledger that
//! keeps the leases out within the pool).
//!
//! # Layout
//! - [`world`]: [`WorldView`], what the request path reads, and the local-only fallback.
//! - [`status`]: [`GossipStatus`], the `waitroom_gossip_*` metrics.
//! - [`client`]: the connect / report / backoff loop.
use std::{net::SocketAddr, path::PathBuf, sync::Arc};

use waitroom_common::{
    aggregate::RoomReport,
    counters::RoomCounters,
    room::RoomId,
    time::{Minute, UnixMillis},
};

use waitroom_runtime::{clock::Clock, shutdown::Shutdown, tls};

pub mod client;
pub mod home;
pub mod lease;
pub mod status;
pub mod world;

pub use lease::LeaseAsk;
pub use status::GossipStatus;
pub use world::{Freshness, RoomView, World, WorldView};

/// The `[aggregator]` table of the node's config.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct GossipConfig {
    /// `host:port` of the aggregator (UDP, QUIC).
    #[serde(default)]
    pub address: Option<SocketAddr>,
    /// Several aggregators instead of `address` (docs/adr/0001): the node
    /// reports to every one, takes its grants from one ([`home`]).
    #[serde(default)]
    pub addresses: Vec<SocketAddr>,
    /// Rooms sharded between aggregator groups instead of `address` or
    /// `addresses` (docs/adr/0001, decision 5): each room is reported only
    /// to the group that owns it (`waitroom_common::shard::owner` of the
    /// groups' names, which every aggregator's `[shard]` lists the same).
    #[serde(default)]
    pub groups: Vec<AggregatorGroup>,
    /// Name the aggregator's certificate must carry.
    #[serde(default = "default_server_name")]
    pub server_name: String,
    /// The cluster CA: the aggregator's certificate must chain to it.
    pub ca: PathBuf,
    /// This node's client certificate, issued by the cluster CA.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Milliseconds between reports.
    #[serde(default = "default_interval_ms")]
    pub interval_ms: u64,
    /// Without an answer for this long the node decides on its own, with its
    /// last known share of the limits. Keep it below the aggregator's
    /// `node_timeout_ms`, after which others are given this node's share.
    #[serde(default = "default_stale_after_ms")]
    pub stale_after_ms: u64,
    /// What the node does while it has no share of a room to go by (never
    /// heard from the aggregator since it started, and kept none from an
    /// earlier run): unset, it queues new visitors until it has one; set to
    /// the cluster's node count `n`, it takes `1/n` of the limits. Never the
    /// whole room: N nodes started during an outage would admit N times it.
    #[serde(default)]
    pub expected_nodes: Option<std::num::NonZeroU32>,
    /// The on-demand lease (`gossip::lease`): how long a new visitor who
    /// would be queued only because this node's promise ran out is held
    /// while the node asks the aggregator for more, out of cycle. 0: never
    /// held, and the aggregator promises this node its fair part each round
    /// instead of what its traffic needs (the behaviour before the lease).
    #[serde(default = "default_lease_wait_ms")]
    pub lease_wait_ms: u64,
}

/// One aggregator group of `[[aggregator.groups]]`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct AggregatorGroup {
    /// The group's name, as in its aggregators' `shard.group`.
    pub name: String,
    /// Its aggregators: the node reports the group's rooms to every one
    /// and takes their grants from one ([`home`]).
    pub addresses: Vec<SocketAddr>,
}

/// The most aggregators a node reports to.
pub const MAX_AGGREGATORS: usize = 16;

/// The name in the development aggregator certificate (`cargo xtask certs`).
fn default_server_name() -> String {
    tls::DEV_AGGREGATOR_NAME.to_owned()
}
fn default_interval_ms() -> u64 {
    1_000
}
fn default_stale_after_ms() -> u64 {
    10_000
}
fn default_lease_wait_ms() -> u64 {
    50
}

/// What is wrong with an `[aggregator]` table: the field and the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("aggregator.{field}: {problem}")]
pub struct GossipConfigError {
    pub field: &'static str,
    pub problem: String,
}

impl GossipConfig {
    /// What a node without a share does (see `expected_nodes`).
    #[must_use]
    pub fn cold_start(&self) -> waitroom_common::share::ColdStart {
        match self.expected_nodes {
            Some(n) => waitroom_common::share::ColdStart::ExpectedNodes(n),
            None => waitroom_common::share::ColdStart::QueueAll,
        }
    }

    /// Every aggregator, of `address`, `addresses` or `groups`.
    #[must_use]
    pub fn aggregators(&self) -> Vec<SocketAddr> {
        self.address
            .into_iter()
            .chain(self.addresses.iter().copied())
            .chain(self.groups.iter().flat_map(|g| g.addresses.iter().copied()))
            .collect()
    }

    /// The aggregator groups: `groups`, or one unnamed group of `address`
    /// or `addresses` (which owns every room).
    #[must_use]
    pub fn groups(&self) -> Vec<AggregatorGroup> {
        if self.groups.is_empty() {
            vec![AggregatorGroup {
                name: String::new(),
                addresses: self.aggregators(),
            }]
        } else {
            self.groups.clone()
        }
    }

    /// Checks the numbers (the files are checked by [`tls::check`]).
    pub fn validate(&self) -> Result<(), GossipConfigError> {
        let given = [
            self.address.is_some(),
            !self.addresses.is_empty(),
            !self.groups.is_empty(),
        ];
        // The key a problem with the list of aggregators is named by.
        let list = if self.groups.is_empty() {
            "addresses"
        } else {
            "groups"
        };
        match given.iter().filter(|&&g| g).count() {
            0 => {
                return Err(GossipConfigError {
                    field: "address",
                    problem:
                        "missing: the aggregator's host:port (or addresses = [...] for several, or [[aggregator.groups]] for rooms sharded between groups)"
                            .into(),
                });
            }
            1 => {}
            _ => {
                return Err(GossipConfigError {
                    field: list,
                    problem: "give one of address, addresses or groups".into(),
                });
            }
        }
        let names: Vec<&str> = self.groups.iter().map(|g| g.name.as_str()).collect();
        if !names.is_empty() {
            waitroom_common::shard::check_names(&names).map_err(|e| GossipConfigError {
                field: "groups",
                problem: e.to_string(),
            })?;
        }
        if let Some(g) = self.groups.iter().find(|g| g.addresses.is_empty()) {
            return Err(GossipConfigError {
                field: "groups",
                problem: format!("group {:?} has no addresses", g.name),
            });
        }
        let all = self.aggregators();
        if all.len() > MAX_AGGREGATORS {
            return Err(GossipConfigError {
                field: list,
                problem: format!("{} aggregators; at most {MAX_AGGREGATORS}", all.len()),
            });
        }
        if let Some(twice) = all
            .iter()
            .enumerate()
            .find_map(|(i, a)| all[..i].contains(a).then_some(a))
        {
            return Err(GossipConfigError {
                field: list,
                problem: format!("{twice} is listed twice"),
            });
        }
        if all.iter().any(|a| a.is_ipv6() != all[0].is_ipv6()) {
            return Err(GossipConfigError {
                field: "addresses",
                problem: "mixes IPv4 and IPv6 addresses (one client socket serves them all)".into(),
            });
        }
        if self.expected_nodes.is_some_and(|n| n.get() > 100_000) {
            return Err(GossipConfigError {
                field: "expected_nodes",
                problem: "more than 100000 nodes".into(),
            });
        }
        if !(100..=60_000).contains(&self.interval_ms) {
            return Err(GossipConfigError {
                field: "interval_ms",
                problem: format!("{} is outside 100 ..= 60000", self.interval_ms),
            });
        }
        if self.stale_after_ms < 2 * self.interval_ms {
            return Err(GossipConfigError {
                field: "stale_after_ms",
                problem: format!(
                    "{} is less than two intervals ({} ms): one late answer would make the view stale",
                    self.stale_after_ms,
                    2 * self.interval_ms
                ),
            });
        }
        if self.lease_wait_ms > 1_000 || self.lease_wait_ms >= self.interval_ms {
            return Err(GossipConfigError {
                field: "lease_wait_ms",
                problem: format!(
                    "{} is over 1000 or not below interval_ms ({}): a visitor would wait longer than the next report",
                    self.lease_wait_ms, self.interval_ms
                ),
            });
        }
        if self.server_name.is_empty() {
            return Err(GossipConfigError {
                field: "server_name",
                problem: "must not be empty".into(),
            });
        }
        Ok(())
    }

    /// The PEM files, in the shape [`tls`] takes them.
    #[must_use]
    pub fn tls_files(&self) -> tls::TlsFiles {
        tls::TlsFiles {
            ca: self.ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
        }
    }
}

/// Who this node is to the aggregator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    /// Unique per node (`node.id`): the aggregator keys reports by it.
    pub node: String,
    /// The node's colo (`node.colo`): traffic shares are kept per colo.
    pub colo: String,
}

/// Builds this node's counts for every room it serves. Called on the control
/// runtime once per interval; it reads atomics and must not block.
pub trait Reporter: Send + Sync + 'static {
    fn report(&self, now: UnixMillis) -> Vec<RoomReport>;

    /// This node's opinion of its rooms' origin pools (none by default).
    fn pools(&self) -> Vec<waitroom_common::wire::PoolOpinion> {
        Vec::new()
    }

    /// The visitors held now for an on-demand lease, per room with any
    /// (`RoomCounters::hold_visitor`). No default: a wrapper that forgot
    /// to pass it on would report nobody held.
    fn held_visitors(&self, now: UnixMillis) -> Vec<waitroom_common::wire::HeldVisitors>;
}

/// The visitors `counters` holds now for an on-demand lease: those whose
/// hold began this minute or the one before (a hold lasts `lease_wait_ms`,
/// far under a minute).
#[must_use]
pub fn held_now(counters: &RoomCounters, now: UnixMillis) -> u64 {
    let minute = now.minute();
    counters
        .held_visitors(minute)
        .saturating_add(counters.held_visitors(minute.minus(1)))
}

impl<F> Reporter for F
where
    F: Fn(UnixMillis) -> Vec<RoomReport> + Send + Sync + 'static,
{
    fn report(&self, now: UnixMillis) -> Vec<RoomReport> {
        self(now)
    }

    /// A bare function of the time holds nobody.
    fn held_visitors(&self, _now: UnixMillis) -> Vec<waitroom_common::wire::HeldVisitors> {
        Vec::new()
    }
}

/// The hook for a better traffic signal than the userspace counter: distinct
/// visitors of a room in a minute, e.g. the XDP program's distinct-source
/// sketch. `None` for a minute it has no estimate of.
pub trait TrafficSignal: Send + Sync {
    fn distinct_visitors(&self, room: RoomId, minute: Minute) -> Option<u64>;
}

/// One room's report from its counters, with the distinct-visitor counts
/// taken from `traffic` where it has them (the userspace counts otherwise).
#[must_use]
pub fn room_report(
    counters: &RoomCounters,
    now: UnixMillis,
    traffic: Option<&dyn TrafficSignal>,
) -> RoomReport {
    let mut report = counters.report(now);
    if let Some(traffic) = traffic {
        for (minute, count) in &mut report.distinct_visitors {
            if let Some(better) = traffic.distinct_visitors(report.room, *minute) {
                // The visitors held for an on-demand lease stay counted
                // (`RoomCounters::hold_visitor`): the sketch may not have
                // seen them, and the ask they caused must read as need.
                *count = better.saturating_add(counters.held_visitors(*minute));
            }
        }
        // Minutes the sketch saw that the userspace counter did not.
        let recent =
            (0..waitroom_common::counters::RECENT_MINUTES as u64).map(|b| now.minute().minus(b));
        for minute in recent {
            if !report.distinct_visitors.iter().any(|&(m, _)| m == minute)
                && let Some(n) = traffic
                    .distinct_visitors(report.room, minute)
                    .filter(|&n| n > 0)
            {
                report.distinct_visitors.push((minute, n));
            }
        }
        report
            .distinct_visitors
            .sort_by_key(|&(m, _)| core::cmp::Reverse(m));
    }
    report
}

/// Why gossip could not start.
#[derive(Debug, thiserror::Error)]
pub enum GossipError {
    #[error(transparent)]
    Config(#[from] GossipConfigError),
    #[error("aggregator TLS: {0}")]
    Tls(#[from] tls::TlsError),
    #[error("opening the QUIC client socket: {source}")]
    Socket { source: std::io::Error },
}

/// The running gossip client.
#[derive(Debug)]
pub struct GossipHandle {
    /// What the request path reads.
    pub world: Arc<WorldView>,
    /// What `/metrics` renders.
    pub status: Arc<GossipStatus>,
    /// The on-demand lease: the request path holds and asks through it.
    pub lease: Arc<LeaseAsk>,
    /// Milliseconds between reports (the prefetch's horizon).
    pub interval_ms: u64,
    /// The task; it ends after shutdown is requested.
    pub task: tokio::task::JoinHandle<()>,
}

/// Starts the gossip client on `runtime` (the node's control runtime).
///
/// Returns at once: connecting happens in the background, and until the
/// first answer [`WorldView::freshness`] is [`Freshness::Never`].
pub fn spawn(
    runtime: &tokio::runtime::Handle,
    config: GossipConfig,
    identity: NodeIdentity,
    reporter: Arc<dyn Reporter>,
    clock: Clock,
    shutdown: Shutdown,
) -> Result<GossipHandle, GossipError> {
    config.validate()?;
    let client_config = tls::client_config(&config.tls_files())?;
    let aggregators = config.aggregators();
    let bind: SocketAddr = if aggregators[0].is_ipv6() {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    };
    let mut endpoint = {
        let _guard = runtime.enter();
        quinn::Endpoint::client(bind).map_err(|source| GossipError::Socket { source })?
    };
    endpoint.set_default_client_config(client_config);
    let world = Arc::new(WorldView::new(config.stale_after_ms));
    let groups = config.groups();
    let names: Arc<[String]> = groups.iter().map(|g| g.name.clone()).collect();
    let status = Arc::new(GossipStatus::new(
        groups
            .iter()
            .map(|g| {
                let homes =
                    home::Homes::new(&identity.node, g.addresses.clone(), config.interval_ms);
                status::GroupStatus::new(g.name.clone(), Arc::new(homes))
            })
            .collect(),
    ));
    let lease = Arc::new(LeaseAsk::with_groups(config.lease_wait_ms, groups.len()));
    let interval_ms = config.interval_ms;
    // One client per aggregator, each on its own connection; the task
    // ends when they all have.
    let clients: Vec<_> = groups
        .iter()
        .enumerate()
        .flat_map(|(group, g)| {
            g.addresses
                .iter()
                .enumerate()
                .map(move |(index, &address)| (group, index, address))
        })
        .map(|(group, index, address)| {
            runtime.spawn(
                client::Client {
                    lease: Arc::clone(&lease),
                    config: config.clone(),
                    address,
                    index,
                    homes: Arc::clone(&status.groups[group].homes),
                    group,
                    groups: Arc::clone(&names),
                    identity: identity.clone(),
                    reporter: Arc::clone(&reporter),
                    world: Arc::clone(&world),
                    status: Arc::clone(&status),
                    endpoint: endpoint.clone(),
                    clock: clock.clone(),
                }
                .run(shutdown.clone()),
            )
        })
        .collect();
    let task = runtime.spawn(async move {
        for client in clients {
            let _ = client.await;
        }
    });
    Ok(GossipHandle {
        world,
        status,
        lease,
        interval_ms,
        task,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> GossipConfig {
        toml::from_str(
            r#"
address = "127.0.0.1:4433"
ca = "ca.pem"
cert = "n.pem"
key = "n.key"
"#,
        )
        .unwrap()
    }

    #[test]
    fn defaults_and_validation_name_the_field() {
        let c = config();
        assert_eq!((c.interval_ms, c.stale_after_ms), (1_000, 10_000));
        assert_eq!(c.lease_wait_ms, 50);
        let err = GossipConfig {
            lease_wait_ms: 1_000,
            ..config()
        }
        .validate()
        .unwrap_err();
        assert_eq!(err.field, "lease_wait_ms");
        assert_eq!(c.server_name, "aggregator.waitroom.internal");
        c.validate().unwrap();
        let err = GossipConfig {
            stale_after_ms: 1_500,
            ..config()
        }
        .validate()
        .unwrap_err();
        assert_eq!(err.field, "stale_after_ms");
        assert!(err.to_string().starts_with("aggregator.stale_after_ms:"));
        let err = GossipConfig {
            interval_ms: 10,
            ..config()
        }
        .validate()
        .unwrap_err();
        assert_eq!(err.field, "interval_ms");
    }

    /// `address` or `addresses`, never both or neither, no aggregator
    /// twice, no mix of families: each refused naming the key.
    #[test]
    fn several_aggregators_are_validated_naming_the_key() {
        let base = config();
        assert_eq!(base.aggregators(), vec!["127.0.0.1:4433".parse().unwrap()]);
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let six: SocketAddr = "[::1]:3".parse().unwrap();
        let with = |address: Option<SocketAddr>, addresses: Vec<SocketAddr>| GossipConfig {
            address,
            addresses,
            ..config()
        };
        let ok = with(None, vec![a, b]);
        ok.validate().unwrap();
        assert_eq!(ok.aggregators(), vec![a, b]);
        for (bad, field, says) in [
            (with(None, vec![]), "address", "missing"),
            (
                with(Some(a), vec![b]),
                "addresses",
                "one of address, addresses or groups",
            ),
            (
                with(None, vec![a, b, a]),
                "addresses",
                "127.0.0.1:1 is listed twice",
            ),
            (with(None, vec![a, six]), "addresses", "mixes IPv4 and IPv6"),
            (with(None, vec![a; 17]), "addresses", "at most 16"),
        ] {
            let err = bad.validate().unwrap_err();
            assert_eq!(err.field, field, "{err}");
            assert!(err.problem.contains(says), "{err}");
        }
        let parsed: GossipConfig = toml::from_str(
            "addresses = [\"127.0.0.1:1\", \"127.0.0.1:2\"]\nca = \"c\"\ncert = \"c\"\nkey = \"k\"\n",
        )
        .unwrap();
        assert_eq!(parsed.aggregators(), vec![a, b]);
    }

    /// Rooms sharded between groups: every group named once, with
    /// addresses, no aggregator in two groups, not mixed with `address`.
    #[test]
    fn aggregator_groups_are_validated_naming_the_key() {
        let parse = |extra: &str| -> GossipConfig {
            toml::from_str(&format!("ca = \"c\"\ncert = \"c\"\nkey = \"k\"\n{extra}")).unwrap()
        };
        let ok = parse(
            "[[groups]]\nname = \"eu\"\naddresses = [\"127.0.0.1:1\", \"127.0.0.1:2\"]\n[[groups]]\nname = \"us\"\naddresses = [\"127.0.0.1:3\"]\n",
        );
        ok.validate().unwrap();
        assert_eq!(ok.aggregators().len(), 3);
        let groups = ok.groups();
        assert_eq!(
            groups
                .iter()
                .map(|g| (g.name.as_str(), g.addresses.len()))
                .collect::<Vec<_>>(),
            [("eu", 2), ("us", 1)]
        );
        let one = config().groups();
        assert_eq!(
            (one.len(), one[0].name.as_str()),
            (1, ""),
            "one unnamed group"
        );
        for (extra, field, says) in [
            (
                "address = \"127.0.0.1:9\"\n[[groups]]\nname = \"eu\"\naddresses = [\"127.0.0.1:1\"]\n",
                "groups",
                "one of address, addresses or groups",
            ),
            (
                "[[groups]]\nname = \"eu\"\naddresses = [\"127.0.0.1:1\"]\n[[groups]]\nname = \"eu\"\naddresses = [\"127.0.0.1:2\"]\n",
                "groups",
                "\"eu\" is listed twice",
            ),
            (
                "[[groups]]\nname = \"e u\"\naddresses = [\"127.0.0.1:1\"]\n",
                "groups",
                "not a group name",
            ),
            (
                "[[groups]]\nname = \"eu\"\naddresses = []\n",
                "groups",
                "\"eu\" has no addresses",
            ),
            (
                "[[groups]]\nname = \"eu\"\naddresses = [\"127.0.0.1:1\"]\n[[groups]]\nname = \"us\"\naddresses = [\"127.0.0.1:1\"]\n",
                "groups",
                "127.0.0.1:1 is listed twice",
            ),
        ] {
            let err = parse(extra).validate().unwrap_err();
            assert_eq!(err.field, field, "{err}");
            assert!(err.problem.contains(says), "{err}");
        }
    }

    struct Sketch;
    impl TrafficSignal for Sketch {
        fn distinct_visitors(&self, _room: RoomId, minute: Minute) -> Option<u64> {
            Some(minute.0 % 100)
        }
    }

    #[test]
    fn traffic_signal_overrides_the_userspace_count() {
        let room = RoomId::from_name("shop");
        let counters = RoomCounters::new_boxed(room);
        let now = UnixMillis(1_622_073_600_000 + 30_000);
        counters.note_visitor(now.minute());
        let plain = room_report(&counters, now, None);
        assert_eq!(plain.distinct_visitors, vec![(now.minute(), 1)]);
        let with = room_report(&counters, now, Some(&Sketch));
        let m = now.minute();
        assert_eq!(with.distinct_visitors[0], (m, m.0 % 100));
        assert_eq!(
            with.distinct_visitors.len(),
            4,
            "all recent minutes the sketch knows"
        );
        // A visitor held for an on-demand lease counts on top of either: the
        // ask it causes must read as need.
        let _held = counters.hold_visitor(m);
        let plain = room_report(&counters, now, None);
        assert_eq!(plain.distinct_visitors, vec![(m, 2)]);
        let with = room_report(&counters, now, Some(&Sketch));
        assert_eq!(with.distinct_visitors[0], (m, m.0 % 100 + 1));
    }
}
