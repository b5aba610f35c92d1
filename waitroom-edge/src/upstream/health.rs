//! Active health checks: every origin of every room with `[rooms.health]` is
//! probed from this node every interval (a GET of the health path on a fresh
//! connection, so a probe also proves the origin accepts connections). The
//! round-trip time of a successful probe feeds the pool's EWMA; results count
//! toward fall/rise.
//!
//! The tasks run on the node's control runtime, never on a worker.
use std::{
    sync::{Arc, atomic::Ordering::Relaxed},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{Request, Uri, header};
use http_body_util::Empty;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};

use super::{HealthSpec, Upstream, tls::OriginConnector};
use waitroom_runtime::shutdown::Shutdown;

type ProbeClient = Client<OriginConnector, Empty<Bytes>>;

/// Why a probe did not count as a success.
#[derive(Debug, thiserror::Error)]
pub enum ProbeFailure {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("request failed: {0}")]
    Request(#[from] hyper_util::client::legacy::Error),
    #[error("status {got}, expected {expected}")]
    Status { got: u16, expected: u16 },
}

/// Starts one probe task per origin on `runtime` for every upstream with health
/// checks. They stop when `shutdown` fires.
pub fn spawn(
    runtime: &tokio::runtime::Handle,
    upstreams: &[Arc<Upstream>],
    connector: OriginConnector,
    shutdown: &Shutdown,
) {
    // A fresh connection per probe: no idle pool.
    let client: ProbeClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(connector);
    for upstream in upstreams {
        if upstream.health.is_none() {
            continue;
        }
        for (p, pool) in upstream.pools.iter().enumerate() {
            for o in 0..pool.origins.len() {
                runtime.spawn(probe_loop(
                    Arc::clone(upstream),
                    p,
                    o,
                    client.clone(),
                    shutdown.clone(),
                ));
            }
        }
    }
}

async fn probe_loop(
    upstream: Arc<Upstream>,
    pool: usize,
    origin: usize,
    client: ProbeClient,
    mut shutdown: Shutdown,
) {
    let Some(spec) = upstream.health.clone() else {
        return;
    };
    let p = &upstream.pools[pool];
    let authority = p.origins[origin].authority.clone();
    let uri = match Uri::builder()
        .scheme(p.scheme.clone())
        .authority(authority.clone())
        .path_and_query(spec.path.as_str())
        .build()
    {
        Ok(uri) => uri,
        Err(err) => {
            tracing::error!(room = %upstream.room, origin = %authority, %err, "cannot build the health-check URI");
            return;
        }
    };
    let mut tick = tokio::time::interval(spec.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.requested() => return,
        }
        let result = tokio::select! {
            r = probe(&client, &uri, &spec) => r,
            () = shutdown.requested() => return,
        };
        apply(&upstream, pool, origin, &spec, result);
    }
}

/// One GET of the health path; the round-trip time until the response head.
pub async fn probe(
    client: &ProbeClient,
    uri: &Uri,
    spec: &HealthSpec,
) -> Result<Duration, ProbeFailure> {
    let mut req = Request::get(uri.clone())
        .body(Empty::new())
        .expect("a GET of a valid URI is a valid request");
    req.headers_mut().insert(
        header::USER_AGENT,
        header::HeaderValue::from_static("waitroom-health-check"),
    );
    let started = Instant::now();
    let resp = tokio::time::timeout(spec.timeout, client.request(req))
        .await
        .map_err(|_| ProbeFailure::Timeout(spec.timeout))??;
    let rtt = started.elapsed();
    let got = resp.status().as_u16();
    if got != spec.expected_status {
        return Err(ProbeFailure::Status {
            got,
            expected: spec.expected_status,
        });
    }
    Ok(rtt)
}

/// Records a probe result: the RTT into the pool's EWMA, the result into the
/// origin's fall/rise streak; logs a change of state.
pub fn apply(
    upstream: &Upstream,
    pool: usize,
    origin: usize,
    spec: &HealthSpec,
    result: Result<Duration, ProbeFailure>,
) {
    let p = &upstream.pools[pool];
    let o = &p.origins[origin];
    let changed = match &result {
        Ok(rtt) => {
            o.last_rtt_micros
                .store((rtt.as_micros() as u64).max(1), Relaxed);
            p.rtt
                .record(rtt.as_secs_f64(), upstream.elapsed(), spec.ewma_time_bias);
            o.health.record(true, spec.fall, spec.rise)
        }
        Err(failure) => {
            o.probe_failures.fetch_add(1, Relaxed);
            tracing::debug!(room = %upstream.room, pool = %p.name, origin = %o.authority, %failure, "health check failed");
            o.health.record(false, spec.fall, spec.rise)
        }
    };
    match (changed, &result) {
        (Some(true), _) => tracing::info!(
            room = %upstream.room, pool = %p.name, origin = %o.authority,
            "origin healthy again: marked up"
        ),
        (Some(false), Err(failure)) => tracing::warn!(
            room = %upstream.room, pool = %p.name, origin = %o.authority, %failure,
            "origin failed its health checks: marked down"
        ),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;
    use crate::upstream::tls::OriginTls;

    /// A one-shot origin on loopback answering every connection with `status`.
    async fn canned(status: u16) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let text = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n");
                let _ = s.write_all(text.as_bytes()).await;
            }
        });
        addr
    }

    fn setup(addr: std::net::SocketAddr) -> (Arc<Upstream>, ProbeClient) {
        let text = format!(
            "origin = \"{addr}\"\n[health]\npath = \"/healthz\"\ninterval_ms = 100\ntimeout_ms = 100\nfall = 2\nrise = 1"
        );
        let spec = crate::upstream::config::spec_from_text(&text).unwrap();
        let tls = OriginTls::new([("r", &spec)]).unwrap();
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(tls.connector(Duration::from_millis(200)));
        (Arc::new(Upstream::new("r", &spec)), client)
    }

    #[tokio::test]
    async fn probes_count_status_and_refusals_as_failures() {
        let ok = canned(200).await;
        let (up, client) = setup(ok);
        let spec = up.health.clone().unwrap();
        let uri: Uri = format!("http://{ok}/healthz").parse().unwrap();
        let rtt = probe(&client, &uri, &spec).await.unwrap();
        apply(&up, 0, 0, &spec, Ok(rtt));
        assert!(up.pools[0].rtt.get().unwrap() > 0.0);

        let bad = canned(503).await;
        let uri: Uri = format!("http://{bad}/healthz").parse().unwrap();
        let failure = probe(&client, &uri, &spec).await.unwrap_err();
        assert!(matches!(
            failure,
            ProbeFailure::Status {
                got: 503,
                expected: 200
            }
        ));
        apply(&up, 0, 0, &spec, Err(failure));
        assert!(up.pools[0].origins[0].health.is_up(), "fall = 2");

        // A port nobody listens on: refused.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let uri: Uri = format!("http://{closed}/healthz").parse().unwrap();
        let failure = probe(&client, &uri, &spec).await.unwrap_err();
        assert!(matches!(failure, ProbeFailure::Request(_)), "{failure}");
        apply(&up, 0, 0, &spec, Err(failure));
        assert!(!up.pools[0].origins[0].health.is_up());
        assert_eq!(up.pools[0].origins[0].probe_failures.load(Relaxed), 2);
    }
}
