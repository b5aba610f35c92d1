//! Origin pools: which origin an admitted request goes to (seed 004).
//!
//! A room has one or more pools of origins and a steering policy. State that
//! the request path reads (up/down, the pools' round-trip EWMA, round-robin
//! cursors) lives in atomics shared by every worker; the health checker on the
//! control runtime and the workers' passive failures write it.
//!
//! # Layout
//! - [`config`]: the `[[rooms.pools]]`, `steering` and `[rooms.health]` keys.
//! - this file: [`Upstream`] state, [`Upstream::select`], fall/rise, the EWMA.
//! - [`health`]: the probe loop per origin.
//! - [`tls`]: the connector for `tls = true` pools (SNI, CA file).
//! - [`status`]: pools and origins in `/metrics` and `/status`.
use std::{
    sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed},
    time::{Duration, Instant},
};

use http::uri::{Authority, Scheme};

pub mod config;
pub mod health;
pub mod status;
pub mod tls;

pub use config::{FieldError, HealthSpec, PoolSpec, Steering, UpstreamSpec};

/// The origins of one room and what this node believes about them.
#[derive(Debug)]
pub struct Upstream {
    /// The room's id, for logs and metrics labels.
    pub room: String,
    pub steering: Steering,
    /// Probe settings; `None` = no probes, and passive failures mark nothing down
    /// (nothing would ever mark it up again).
    pub health: Option<HealthSpec>,
    pub pools: Vec<Pool>,
    /// Zero of the EWMA's clock (sample times are offsets from it).
    epoch: Instant,
}

/// A pool: origins that are steered to as one.
#[derive(Debug)]
pub struct Pool {
    pub name: String,
    pub weight: u32,
    /// `https` for `tls = true`, else `http`.
    pub scheme: Scheme,
    pub origins: Vec<Origin>,
    /// Round-trip time of the pool's successful probes.
    pub rtt: Ewma,
    /// Round-robin position among the pool's origins.
    cursor: AtomicUsize,
}

/// One origin server and its health on this node.
#[derive(Debug)]
pub struct Origin {
    pub authority: Authority,
    pub health: Health,
    /// Last successful probe's round-trip time in microseconds (0: none yet).
    pub last_rtt_micros: AtomicU64,
    /// Requests forwarded to it that got a response.
    pub requests: AtomicU64,
    /// Requests that could not reach it (connection failures).
    pub connection_failures: AtomicU64,
    /// Probes that failed (error, timeout or unexpected status).
    pub probe_failures: AtomicU64,
}

/// Which origin a request goes to: indexes into [`Upstream::pools`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OriginChoice {
    pub pool: usize,
    pub origin: usize,
}

impl Upstream {
    pub fn new(room: &str, spec: &UpstreamSpec) -> Self {
        let pools = spec
            .pools
            .iter()
            .map(|p| Pool {
                name: p.name.clone(),
                weight: p.weight,
                scheme: if p.tls.is_some() {
                    Scheme::HTTPS
                } else {
                    Scheme::HTTP
                },
                origins: p
                    .origins
                    .iter()
                    .map(|a| Origin {
                        authority: a.clone(),
                        health: Health::default(),
                        last_rtt_micros: AtomicU64::new(0),
                        requests: AtomicU64::new(0),
                        connection_failures: AtomicU64::new(0),
                        probe_failures: AtomicU64::new(0),
                    })
                    .collect(),
                rtt: Ewma::default(),
                cursor: AtomicUsize::new(0),
            })
            .collect();
        Self {
            room: room.to_owned(),
            steering: spec.steering,
            health: spec.health.clone(),
            pools,
            epoch: Instant::now(),
        }
    }

    pub fn pool(&self, choice: OriginChoice) -> &Pool {
        &self.pools[choice.pool]
    }

    pub fn origin(&self, choice: OriginChoice) -> &Origin {
        &self.pools[choice.pool].origins[choice.origin]
    }

    /// The origin for the next request: a pool by the steering policy among
    /// pools with a healthy origin, then round-robin among that pool's healthy
    /// origins. `except` (the origin that just failed) is never chosen.
    /// `random` picks the pool under `random` steering. `None`: nothing healthy.
    pub fn select(&self, random: u64, except: Option<OriginChoice>) -> Option<OriginChoice> {
        let usable = |p: usize| self.pools[p].has_usable(except_in(except, p));
        let pool = match self.steering {
            Steering::Ordered => (0..self.pools.len()).find(|&p| usable(p)),
            Steering::Random => {
                let usable_pools = || (0..self.pools.len()).filter(|&p| usable(p));
                let weight = |p: usize| u64::from(self.pools[p].weight);
                let total: u64 = usable_pools().map(weight).sum();
                if total == 0 {
                    // Only zero-weight pools are left: they still beat a 503.
                    let n = usable_pools().count() as u64;
                    random
                        .checked_rem(n)
                        .and_then(|i| usable_pools().nth(i as usize))
                } else {
                    let mut left = random % total;
                    usable_pools().find(|&p| {
                        let w = weight(p);
                        let hit = left < w;
                        left = left.saturating_sub(w);
                        hit
                    })
                }
            }
            Steering::Dynamic => {
                // Lowest EWMA wins; pools without a sample yet come after, in order.
                let mut best: Option<(usize, f64)> = None;
                for p in (0..self.pools.len()).filter(|&p| usable(p)) {
                    let rtt = self.pools[p].rtt.get().unwrap_or(f64::INFINITY);
                    if best.is_none_or(|(_, b)| rtt < b) {
                        best = Some((p, rtt));
                    }
                }
                best.map(|(p, _)| p)
            }
        }?;
        let origin = self.pools[pool].next_origin(except_in(except, pool))?;
        Some(OriginChoice { pool, origin })
    }

    /// A request could not reach `choice` (refused, reset, TLS failure): passive
    /// health, counted like a failed probe when probes are configured.
    pub fn connection_failed(&self, choice: OriginChoice) {
        let origin = self.origin(choice);
        origin.connection_failures.fetch_add(1, Relaxed);
        if let Some(health) = &self.health
            && origin.health.record(false, health.fall, health.rise) == Some(false)
        {
            tracing::warn!(
                room = %self.room,
                pool = %self.pools[choice.pool].name,
                origin = %origin.authority,
                "origin marked down after failed connections"
            );
        }
    }

    /// Time since this upstream's epoch, the EWMA's clock.
    pub fn elapsed(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// This node's opinion of every pool: `(pool, up, ewma_ms)`.
    pub fn pool_opinions(&self) -> impl Iterator<Item = (&str, bool, Option<f64>)> {
        self.pools
            .iter()
            .map(|p| (p.name.as_str(), p.is_up(), p.rtt.get().map(|s| s * 1000.0)))
    }
}

fn except_in(except: Option<OriginChoice>, pool: usize) -> Option<usize> {
    except.filter(|c| c.pool == pool).map(|c| c.origin)
}

impl Pool {
    /// True while at least one origin is up.
    pub fn is_up(&self) -> bool {
        self.origins.iter().any(|o| o.health.is_up())
    }

    fn has_usable(&self, except: Option<usize>) -> bool {
        self.origins
            .iter()
            .enumerate()
            .any(|(i, o)| Some(i) != except && o.health.is_up())
    }

    /// Round-robin among the up origins, skipping `except`.
    fn next_origin(&self, except: Option<usize>) -> Option<usize> {
        let n = self.origins.len();
        let start = self.cursor.fetch_add(1, Relaxed);
        (0..n)
            .map(|k| (start.wrapping_add(k)) % n)
            .find(|&i| Some(i) != except && self.origins[i].health.is_up())
    }
}

/// Up or down by consecutive results: `fall` failures in a row mark an up
/// origin down, `rise` successes in a row mark a down origin up. Origins start
/// up, so a node serves before its first probe round.
#[derive(Debug)]
pub struct Health {
    up: AtomicBool,
    failures_in_a_row: AtomicU32,
    successes_in_a_row: AtomicU32,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            up: AtomicBool::new(true),
            failures_in_a_row: AtomicU32::new(0),
            successes_in_a_row: AtomicU32::new(0),
        }
    }
}

impl Health {
    pub fn is_up(&self) -> bool {
        self.up.load(Relaxed)
    }

    /// Counts one result; returns the new state when it changed.
    ///
    /// Workers (passive failures) and the checker may race here; the worst a
    /// race does is miscount one result of a streak, never a stuck state.
    pub fn record(&self, ok: bool, fall: u32, rise: u32) -> Option<bool> {
        if ok {
            self.failures_in_a_row.store(0, Relaxed);
            let n = self
                .successes_in_a_row
                .fetch_add(1, Relaxed)
                .saturating_add(1);
            if n >= rise && !self.up.swap(true, Relaxed) {
                return Some(true);
            }
        } else {
            self.successes_in_a_row.store(0, Relaxed);
            let n = self
                .failures_in_a_row
                .fetch_add(1, Relaxed)
                .saturating_add(1);
            if n >= fall && self.up.swap(false, Relaxed) {
                return Some(false);
            }
        }
        None
    }
}

/// A time-based exponentially weighted moving average (seed 004): a sample
/// Δt after the previous one weighs `1 − e^(−Δt/τ)`, so with τ = 1 minute the
/// last minute of samples makes ~63.2 % of the value and the minute before
/// ~23.3 %, whatever the probe interval.
///
/// One writer (the health checker on the control runtime); the value is an
/// `f64` in an `AtomicU64` so workers read it without a lock.
#[derive(Debug)]
pub struct Ewma {
    /// Seconds as `f64` bits; NaN = no sample yet.
    bits: AtomicU64,
    /// When the last sample came, in microseconds since the upstream's epoch.
    at_micros: AtomicU64,
}

impl Default for Ewma {
    fn default() -> Self {
        Self {
            bits: AtomicU64::new(f64::NAN.to_bits()),
            at_micros: AtomicU64::new(0),
        }
    }
}

impl Ewma {
    /// The average in seconds, if any sample came.
    pub fn get(&self) -> Option<f64> {
        let v = f64::from_bits(self.bits.load(Relaxed));
        (!v.is_nan()).then_some(v)
    }

    /// Adds a sample (seconds) taken at `now` (offset from the epoch).
    pub fn record(&self, sample: f64, now: Duration, time_bias: Duration) {
        let now_micros = now.as_micros() as u64;
        let prev_micros = self.at_micros.swap(now_micros, Relaxed);
        let dt = Duration::from_micros(now_micros.saturating_sub(prev_micros));
        let next = ewma_next(self.get(), sample, dt, time_bias);
        self.bits.store(next.to_bits(), Relaxed);
    }
}

/// The EWMA after `sample`, `dt` after the previous value: the first sample is
/// the average; then `prev + (1 − e^(−dt/τ)) · (sample − prev)`.
pub fn ewma_next(prev: Option<f64>, sample: f64, dt: Duration, time_bias: Duration) -> f64 {
    match prev {
        None => sample,
        Some(prev) => {
            let tau = time_bias.as_secs_f64().max(1e-9);
            let weight = 1.0 - (-dt.as_secs_f64() / tau).exp();
            prev + weight * (sample - prev)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn the_last_minute_weighs_63_percent_and_the_one_before_23() {
        // Start at 0, one minute of 1.0, then one minute of 0.0: what is left of
        // the 1.0 is its weight once it is a minute old.
        let after_one = ewma_next(Some(0.0), 1.0, MINUTE, MINUTE);
        assert!((after_one - 0.632).abs() < 0.001, "{after_one}");
        let after_two = ewma_next(Some(after_one), 0.0, MINUTE, MINUTE);
        assert!((after_two - 0.233).abs() < 0.001, "{after_two}");
        // Older than t minutes weighs 1/e^t.
        let old = ewma_next(Some(1.0), 0.0, 3 * MINUTE, MINUTE);
        assert!((old - (-3.0f64).exp()).abs() < 1e-9);
    }

    #[test]
    fn the_weight_depends_on_time_not_on_the_number_of_samples() {
        // Twelve probes 5 s apart move the average as far as one probe after 60 s.
        let mut v = 0.0;
        for _ in 0..12 {
            v = ewma_next(Some(v), 1.0, Duration::from_secs(5), MINUTE);
        }
        let once = ewma_next(Some(0.0), 1.0, MINUTE, MINUTE);
        assert!((v - once).abs() < 1e-9, "{v} vs {once}");
        assert_eq!(ewma_next(None, 0.25, Duration::ZERO, MINUTE), 0.25);
    }

    #[test]
    fn ewma_cell_uses_the_time_between_samples() {
        let e = Ewma::default();
        assert_eq!(e.get(), None);
        e.record(0.0, Duration::from_secs(10), MINUTE);
        e.record(1.0, Duration::from_secs(70), MINUTE);
        assert!((e.get().unwrap() - 0.632).abs() < 0.001);
    }

    #[test]
    fn fall_and_rise_need_consecutive_results() {
        let h = Health::default();
        assert!(h.is_up());
        assert_eq!(h.record(false, 3, 2), None);
        assert_eq!(h.record(false, 3, 2), None);
        assert_eq!(h.record(true, 3, 2), None, "a success breaks the streak");
        assert_eq!(h.record(false, 3, 2), None);
        assert_eq!(h.record(false, 3, 2), None);
        assert_eq!(h.record(false, 3, 2), Some(false));
        assert!(!h.is_up());
        assert_eq!(h.record(false, 3, 2), None, "already down");
        assert_eq!(h.record(true, 3, 2), None);
        assert_eq!(h.record(false, 3, 2), None);
        assert_eq!(h.record(true, 3, 2), None);
        assert_eq!(h.record(true, 3, 2), Some(true));
        assert!(h.is_up());
    }

    fn upstream(steering: &str, pools: &[(&str, u32, usize)]) -> Upstream {
        let mut text = format!("steering = \"{steering}\"\n[health]\n");
        for (name, weight, n) in pools {
            let origins: Vec<String> = (0..*n).map(|i| format!("\"{name}{i}:80\"")).collect();
            text.push_str(&format!(
                "[[pools]]\nname = \"{name}\"\nweight = {weight}\norigins = [{}]\n",
                origins.join(", ")
            ));
        }
        let spec = crate::upstream::config::spec_from_text(&text).unwrap();
        Upstream::new("room", &spec)
    }

    fn down(u: &Upstream, pool: usize, origin: usize) {
        u.pools[pool].origins[origin]
            .health
            .up
            .store(false, Relaxed);
    }

    fn name(u: &Upstream, c: Option<OriginChoice>) -> Option<String> {
        c.map(|c| u.origin(c).authority.to_string())
    }

    #[test]
    fn ordered_fails_over_in_listed_order() {
        let u = upstream("ordered", &[("a", 1, 1), ("b", 1, 1), ("c", 1, 1)]);
        assert_eq!(name(&u, u.select(7, None)).as_deref(), Some("a0:80"));
        down(&u, 0, 0);
        assert_eq!(name(&u, u.select(7, None)).as_deref(), Some("b0:80"));
        down(&u, 1, 0);
        assert_eq!(name(&u, u.select(7, None)).as_deref(), Some("c0:80"));
        down(&u, 2, 0);
        assert_eq!(u.select(7, None), None);
    }

    #[test]
    fn round_robin_among_healthy_origins_of_a_pool() {
        let u = upstream("ordered", &[("a", 1, 3)]);
        let seq: Vec<_> = (0..6)
            .map(|_| name(&u, u.select(0, None)).unwrap())
            .collect();
        assert_eq!(seq, ["a0:80", "a1:80", "a2:80", "a0:80", "a1:80", "a2:80"]);
        down(&u, 0, 1);
        let seq: Vec<_> = (0..4)
            .map(|_| name(&u, u.select(0, None)).unwrap())
            .collect();
        assert!(!seq.contains(&"a1:80".to_owned()), "{seq:?}");
        assert!(seq.contains(&"a0:80".to_owned()) && seq.contains(&"a2:80".to_owned()));
    }

    #[test]
    fn a_retry_skips_the_failed_origin_and_may_leave_the_pool() {
        let u = upstream("ordered", &[("a", 1, 2), ("b", 1, 1)]);
        let first = u.select(0, None).unwrap();
        let retry = u.select(0, Some(first)).unwrap();
        assert_eq!(retry.pool, 0);
        assert_ne!(retry, first);
        down(&u, 0, retry.origin);
        assert_eq!(name(&u, u.select(0, Some(first))).as_deref(), Some("b0:80"));
        let single = upstream("ordered", &[("a", 1, 1)]);
        let only = single.select(0, None).unwrap();
        assert_eq!(single.select(0, Some(only)), None);
    }

    #[test]
    fn random_follows_the_weights_of_healthy_pools() {
        let u = upstream("random", &[("a", 1, 1), ("b", 3, 1), ("z", 0, 1)]);
        let mut counts = [0usize; 3];
        for r in 0..4000u64 {
            counts[u.select(r, None).unwrap().pool] += 1;
        }
        assert_eq!(counts, [1000, 3000, 0]);
        down(&u, 1, 0);
        assert!((0..100).all(|r| u.select(r, None).unwrap().pool == 0));
        down(&u, 0, 0);
        assert!(
            (0..10).all(|r| u.select(r, None).unwrap().pool == 2),
            "zero weight still serves when nothing else can"
        );
    }

    #[test]
    fn dynamic_takes_the_lowest_ewma_among_healthy_pools() {
        let u = upstream("dynamic", &[("a", 1, 1), ("b", 1, 1), ("c", 1, 1)]);
        // No samples yet: listed order.
        assert_eq!(u.select(0, None).unwrap().pool, 0);
        let t = Duration::from_secs(1);
        u.pools[1].rtt.record(0.050, t, MINUTE);
        assert_eq!(u.select(0, None).unwrap().pool, 1, "a sample beats none");
        u.pools[0].rtt.record(0.120, t, MINUTE);
        u.pools[2].rtt.record(0.020, t, MINUTE);
        assert_eq!(u.select(0, None).unwrap().pool, 2);
        down(&u, 2, 0);
        assert_eq!(u.select(0, None).unwrap().pool, 1);
        // c slows down: once its average passes b's, b stays ahead.
        let opinions: Vec<_> = u.pool_opinions().collect();
        assert_eq!(opinions[2].0, "c");
        assert!(!opinions[2].1);
        assert!((opinions[2].2.unwrap() - 20.0).abs() < 1e-9);
    }

    #[test]
    fn passive_failures_mark_down_only_with_health_checks() {
        let u = upstream("ordered", &[("a", 1, 2)]);
        let c = OriginChoice { pool: 0, origin: 0 };
        for _ in 0..3 {
            u.connection_failed(c);
        }
        assert!(!u.origin(c).health.is_up());
        assert_eq!(u.origin(c).connection_failures.load(Relaxed), 3);
        let spec = crate::upstream::config::spec_from_text("origin = \"x:1\"").unwrap();
        let plain = Upstream::new("room", &spec);
        for _ in 0..10 {
            plain.connection_failed(c);
        }
        assert!(
            plain.origin(c).health.is_up(),
            "nothing would bring it back"
        );
    }
}
