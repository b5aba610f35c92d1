//! What operators read about origin pools: Prometheus families and the
//! `/status` JSON, both from the shared atomics (admin listener only).
use std::{fmt, sync::atomic::Ordering::Relaxed};

use waitroom_common::{aggregate::RoomReport, time::UnixMillis};

use super::{Steering, Upstream};
use waitroom_common::wire::PoolOpinion;
use waitroom_runtime::metrics::Families;

use crate::gossip::Reporter;

/// The pool and origin families of every room's upstream.
pub fn encode<'a>(
    f: &mut Families<'_>,
    upstreams: impl Iterator<Item = &'a Upstream> + Clone,
) -> fmt::Result {
    let pools = || {
        upstreams.clone().flat_map(|u| {
            u.pools
                .iter()
                .map(move |p| ([("room", u.room.as_str()), ("pool", p.name.as_str())], p))
        })
    };
    f.gauges(
        "waitroom_pool_up",
        "1 while at least one origin of the pool is up on this node.",
        pools().map(|(l, p)| (l, i64::from(p.is_up()))),
    )?;
    f.gauges(
        "waitroom_pool_rtt_ewma_seconds",
        "Time-based EWMA of the pool's health-check round-trip times (absent before the first probe).",
        pools().filter_map(|(l, p)| Some((l, p.rtt.get()?))),
    )?;
    let origins = || {
        pools().flat_map(|([room, pool], p)| {
            p.origins
                .iter()
                .map(move |o| ([room, pool, ("origin", o.authority.as_str())], o))
        })
    };
    f.gauges(
        "waitroom_origin_up",
        "1 while the origin is up (fall/rise of health checks and failed connections).",
        origins().map(|(l, o)| (l, i64::from(o.health.is_up()))),
    )?;
    f.counters(
        "waitroom_origin_requests_total",
        "Requests the origin answered.",
        origins().map(|(l, o)| (l, o.requests.load(Relaxed))),
    )?;
    f.counters(
        "waitroom_origin_connection_failures_total",
        "Requests that could not reach the origin (each counts against its health).",
        origins().map(|(l, o)| (l, o.connection_failures.load(Relaxed))),
    )?;
    f.counters(
        "waitroom_origin_probe_failures_total",
        "Health checks the origin failed.",
        origins().map(|(l, o)| (l, o.probe_failures.load(Relaxed))),
    )?;
    f.gauges(
        "waitroom_origin_probe_rtt_seconds",
        "Round-trip time of the origin's last successful health check (absent before it).",
        origins().filter_map(|(l, o)| {
            let rtt = o.last_rtt_micros.load(Relaxed);
            (rtt > 0).then(|| (l, rtt as f64 / 1e6))
        }),
    )
}

/// The room's `upstream` object in `/status`.
pub fn json(u: &Upstream) -> serde_json::Value {
    let pools: Vec<serde_json::Value> = u
        .pools
        .iter()
        .map(|p| {
            let origins: Vec<serde_json::Value> = p
                .origins
                .iter()
                .map(|o| {
                    let rtt = o.last_rtt_micros.load(Relaxed);
                    serde_json::json!({
                        "origin": o.authority.as_str(),
                        "up": o.health.is_up(),
                        "requests": o.requests.load(Relaxed),
                        "connection_failures": o.connection_failures.load(Relaxed),
                        "probe_failures": o.probe_failures.load(Relaxed),
                        "last_rtt_ms": (rtt > 0).then(|| rtt as f64 / 1000.0),
                    })
                })
                .collect();
            serde_json::json!({
                "name": p.name,
                "weight": p.weight,
                "tls": p.scheme == http::uri::Scheme::HTTPS,
                "up": p.is_up(),
                "rtt_ewma_ms": p.rtt.get().map(|s| s * 1000.0),
                "origins": origins,
            })
        })
        .collect();
    serde_json::json!({
        "steering": match u.steering {
            Steering::Ordered => "ordered",
            Steering::Random => "random",
            Steering::Dynamic => "dynamic",
        },
        "health_checks": u.health.as_ref().map(|h| serde_json::json!({
            "path": h.path,
            "interval_ms": h.interval.as_millis() as u64,
            "timeout_ms": h.timeout.as_millis() as u64,
            "expected_status": h.expected_status,
            "fall": h.fall,
            "rise": h.rise,
            "ewma_time_bias_ms": h.ewma_time_bias.as_millis() as u64,
        })),
        "pools": pools,
    })
}

/// This node's opinion of every pool, for the aggregator.
pub fn opinions<'a>(upstreams: impl Iterator<Item = &'a Upstream>) -> Vec<PoolOpinion> {
    upstreams
        .flat_map(|u| {
            u.pool_opinions().map(|(pool, up, ewma_ms)| PoolOpinion {
                room: u.room.clone(),
                pool: pool.to_owned(),
                up,
                rtt_ewma_micros: ewma_ms.map(|ms| (ms * 1000.0).round() as u64),
            })
        })
        .collect()
}

/// A gossip reporter that also reports the rooms' pools.
pub struct WithPools<R> {
    pub rooms: R,
    pub upstreams: Vec<std::sync::Arc<Upstream>>,
}

impl<R> std::fmt::Debug for WithPools<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WithPools")
            .field("upstreams", &self.upstreams.len())
            .finish_non_exhaustive()
    }
}

impl<R: Reporter> Reporter for WithPools<R> {
    fn report(&self, now: UnixMillis) -> Vec<RoomReport> {
        self.rooms.report(now)
    }

    fn pools(&self) -> Vec<PoolOpinion> {
        opinions(self.upstreams.iter().map(|u| &**u))
    }

    fn held_visitors(&self, now: UnixMillis) -> Vec<waitroom_common::wire::HeldVisitors> {
        self.rooms.held_visitors(now)
    }
}
