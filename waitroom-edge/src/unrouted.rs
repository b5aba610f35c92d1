//! Requests no room covers: `[node.unrouted]`.
//!
//! By default such a request gets 404, as it always has. A node in front of a
//! whole site can instead send them to a default origin: one origin or pools,
//! with steering and health checks, written as a room's are. They go there
//! the way a bypassed request goes to its room's origin: no ticket, nothing
//! counted, the `X-Forwarded-*` headers and `Via` of any proxied request,
//! hop-by-hop headers removed, and the target in its normalized spelling
//! (`crate::target`, slashes kept as sent).
//!
//! This is the node's own routing, like a room's `host`, `path` and origins:
//! not a room setting, so the aggregator never pushes it and the control API
//! cannot change it. A change needs a restart (the reload names it).
//!
//! It is no way around a room: a request reaches this only after routing,
//! which sees the one normalized spelling of host and path, so `//shop`,
//! `/x/../shop`, `/%73hop`, `SHOP.example.` or an absolute-form target all
//! find the room that covers `/shop`; ambiguous spellings (`%2F`) are refused
//! with 400 before routing. A waitroom cookie sent with an unrouted request
//! is never opened: there is no room for it to be a ticket of.
use std::{
    num::NonZeroU64,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use serde::{Deserialize, Serialize};
use waitroom_common::room::RoomConfig;
use waitroom_common::room_table::{HealthTable, PoolTable, RoomTable, Steering};

use crate::upstream::{FieldError, Upstream, UpstreamSpec};

/// The label the default origin's pools carry in metrics, logs and the
/// status page, where a room's id would be.
pub const LABEL: &str = "(unrouted)";

/// Where requests no room covers go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SendTo {
    /// 404, as without the table.
    #[default]
    NotFound,
    /// The origin or pools of the table.
    Origin,
}

/// The `[node.unrouted]` table.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UnroutedConfig {
    /// `"not_found"` (404) or `"origin"`: said out loud, so that a table
    /// with an origin does not quietly change where a site's unknown paths
    /// go, and so that one can be switched off without deleting it.
    pub send_to: SendTo,
    /// Shorthand for one pool named `default` with this one origin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// Origin pools, as a room's `[[rooms.pools]]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pools: Option<Vec<PoolTable>>,
    #[serde(default)]
    pub steering: Steering,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthTable>,
    /// How long the origin may take to send its response head.
    #[serde(default = "default_origin_timeout_ms")]
    pub origin_timeout_ms: NonZeroU64,
}

fn default_origin_timeout_ms() -> NonZeroU64 {
    NonZeroU64::new(10_000).expect("not zero")
}

/// The default origin as the node runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultOrigin {
    pub upstream: UpstreamSpec,
    pub timeout: Duration,
}

impl UnroutedConfig {
    /// The default origin, or `None` for 404; a field error is relative to
    /// the table (`pools[0].origins`). The origin keys are checked by the
    /// very code that checks a room's, so they read and fail alike.
    pub fn validate(&self) -> Result<Option<DefaultOrigin>, FieldError> {
        let given = self.origin.is_some() || self.pools.is_some();
        match self.send_to {
            SendTo::NotFound if given => {
                return Err(FieldError {
                    field: "send_to".into(),
                    problem: "is \"not_found\" but an origin is given: set send_to = \"origin\" \
                              to use it, or remove it"
                        .into(),
                });
            }
            SendTo::NotFound => return Ok(None),
            SendTo::Origin => {}
        }
        let table = RoomTable {
            origin: self.origin.clone(),
            pools: self.pools.clone(),
            steering: self.steering,
            health: self.health.clone(),
            origin_timeout_ms: self.origin_timeout_ms,
            ..RoomTable::from_config(LABEL, &RoomConfig::with_limits(1, 1))
        };
        table.validate().map_err(|e| FieldError {
            field: e.field(),
            problem: e.to_string(),
        })?;
        Ok(Some(DefaultOrigin {
            upstream: UpstreamSpec::from_table(&table)?,
            timeout: Duration::from_millis(self.origin_timeout_ms.get()),
        }))
    }
}

/// What happened to an unrouted request: the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnroutedOutcome {
    /// Answered 404 (no default origin).
    NotFound,
    /// The default origin answered.
    Proxied,
    /// The default origin could not be reached or did not answer in time
    /// (502/504).
    OriginError,
}

impl UnroutedOutcome {
    const ALL: [Self; 3] = [Self::NotFound, Self::Proxied, Self::OriginError];

    fn label(self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::Proxied => "proxied",
            Self::OriginError => "origin_error",
        }
    }
}

/// Requests no room covers: where they go, and how many went.
#[derive(Debug, Default)]
pub struct Unrouted {
    /// `None`: 404.
    pub origin: Option<Arc<Upstream>>,
    pub timeout: Duration,
    counts: [AtomicU64; 3],
}

impl Unrouted {
    #[must_use]
    pub fn new(spec: Option<&DefaultOrigin>) -> Self {
        Self {
            origin: spec.map(|d| Arc::new(Upstream::new(LABEL, &d.upstream))),
            timeout: spec.map_or(Duration::ZERO, |d| d.timeout),
            counts: Default::default(),
        }
    }

    pub fn count(&self, outcome: UnroutedOutcome) {
        self.counts[outcome as usize].fetch_add(1, Relaxed);
    }

    /// `waitroom_unrouted_requests_total{outcome}`.
    pub fn encode(&self, f: &mut waitroom_runtime::metrics::Families<'_>) -> std::fmt::Result {
        f.counters(
            "waitroom_unrouted_requests_total",
            "Requests no room covers, by outcome: not_found (404), proxied to the default \
             origin, origin_error (it could not answer).",
            UnroutedOutcome::ALL.iter().map(|o| {
                (
                    [("outcome", o.label())],
                    self.counts[*o as usize].load(Relaxed),
                )
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<Option<DefaultOrigin>, FieldError> {
        toml::from_str::<UnroutedConfig>(text).unwrap().validate()
    }

    #[test]
    fn not_found_needs_nothing_and_origin_needs_an_origin() {
        assert_eq!(read("send_to = \"not_found\""), Ok(None));
        let origin = read("send_to = \"origin\"\norigin = \"127.0.0.1:8081\"")
            .unwrap()
            .unwrap();
        assert_eq!(
            origin.upstream.pools[0].origins[0].as_str(),
            "127.0.0.1:8081"
        );
        assert_eq!(origin.timeout, Duration::from_secs(10));
        let field = |text: &str| read(text).unwrap_err().field;
        assert_eq!(field("send_to = \"origin\""), "origin");
        assert_eq!(
            field("send_to = \"not_found\"\norigin = \"127.0.0.1:1\""),
            "send_to"
        );
        assert_eq!(
            field("send_to = \"origin\"\norigin = \"no-port\""),
            "origin"
        );
        assert_eq!(
            field("send_to = \"origin\"\n[[pools]]\nname = \"\"\norigins = [\"127.0.0.1:1\"]"),
            "pools[0].name"
        );
        assert_eq!(
            field("send_to = \"origin\"\norigin = \"127.0.0.1:1\"\nsteering = \"dynamic\""),
            "steering"
        );
    }

    #[test]
    fn outcomes_are_counted_by_label() {
        use waitroom_runtime::metrics::{encode, registry};
        let u = Arc::new(Unrouted::new(None));
        u.count(UnroutedOutcome::NotFound);
        u.count(UnroutedOutcome::OriginError);
        u.count(UnroutedOutcome::OriginError);
        let scraped = Arc::clone(&u);
        let text = encode(&registry(move |f| scraped.encode(f)));
        assert!(
            text.contains("waitroom_unrouted_requests_total{outcome=\"not_found\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("waitroom_unrouted_requests_total{outcome=\"origin_error\"} 2"),
            "{text}"
        );
    }
}
