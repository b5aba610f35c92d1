//! What operators read about origin pools: Prometheus families and the
//! `/status` JSON, both from the shared atomics (admin listener only).
use std::{fmt::Write as _, sync::atomic::Ordering::Relaxed};

use waitroom_common::{aggregate::RoomReport, time::UnixMillis};

use super::{Steering, Upstream};
use waitroom_common::wire::PoolOpinion;
use waitroom_runtime::admin::family;

use crate::gossip::Reporter;

/// Writes the pool and origin families for every room's upstream.
pub fn render_metrics<'a>(out: &mut String, upstreams: impl Iterator<Item = &'a Upstream> + Clone) {
    family(
        out,
        "waitroom_pool_up",
        "gauge",
        "1 while at least one origin of the pool is up on this node.",
    );
    family(
        out,
        "waitroom_pool_rtt_ewma_seconds",
        "gauge",
        "Time-based EWMA of the pool's health-check round-trip times (absent before the first probe).",
    );
    for u in upstreams.clone() {
        for p in &u.pools {
            let l = format!("room=\"{}\",pool=\"{}\"", u.room, p.name);
            let _ = writeln!(out, "waitroom_pool_up{{{l}}} {}", u8::from(p.is_up()));
            if let Some(rtt) = p.rtt.get() {
                let _ = writeln!(out, "waitroom_pool_rtt_ewma_seconds{{{l}}} {rtt}");
            }
        }
    }
    family(
        out,
        "waitroom_origin_up",
        "gauge",
        "1 while the origin is up (fall/rise of health checks and failed connections).",
    );
    family(
        out,
        "waitroom_origin_requests_total",
        "counter",
        "Requests the origin answered.",
    );
    family(
        out,
        "waitroom_origin_connection_failures_total",
        "counter",
        "Requests that could not reach the origin (each counts against its health).",
    );
    family(
        out,
        "waitroom_origin_probe_failures_total",
        "counter",
        "Health checks the origin failed.",
    );
    family(
        out,
        "waitroom_origin_probe_rtt_seconds",
        "gauge",
        "Round-trip time of the origin's last successful health check.",
    );
    for u in upstreams {
        for p in &u.pools {
            for o in &p.origins {
                let l = format!(
                    "room=\"{}\",pool=\"{}\",origin=\"{}\"",
                    u.room, p.name, o.authority
                );
                let _ = writeln!(
                    out,
                    "waitroom_origin_up{{{l}}} {}",
                    u8::from(o.health.is_up())
                );
                let _ = writeln!(
                    out,
                    "waitroom_origin_requests_total{{{l}}} {}",
                    o.requests.load(Relaxed)
                );
                let _ = writeln!(
                    out,
                    "waitroom_origin_connection_failures_total{{{l}}} {}",
                    o.connection_failures.load(Relaxed)
                );
                let _ = writeln!(
                    out,
                    "waitroom_origin_probe_failures_total{{{l}}} {}",
                    o.probe_failures.load(Relaxed)
                );
                let rtt = o.last_rtt_micros.load(Relaxed);
                if rtt > 0 {
                    let _ = writeln!(
                        out,
                        "waitroom_origin_probe_rtt_seconds{{{l}}} {}",
                        rtt as f64 / 1e6
                    );
                }
            }
        }
    }
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
}
