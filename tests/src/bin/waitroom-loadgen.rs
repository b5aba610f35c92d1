//! `waitroom-loadgen`: the HTTP load generator of `cargo xtask bench`.
//!
//! Keep-alive HTTP/1.1 connections from one tokio runtime. Two modes:
//! - closed loop (`--rate 0`): every connection sends its next request as soon
//!   as the previous answer arrives — the saturation throughput;
//! - open loop (`--rate R`): requests are scheduled at a fixed total rate and
//!   latency is measured from the *scheduled* send time, so a stalled server
//!   is charged for the requests it delayed (no coordinated omission).
//!
//! Latencies go into an HDR histogram; the result is one JSON object on stdout.
use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use bytes::Bytes;
use clap::Parser;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt as _, Empty};
use hyper::{Request, client::conn::http1};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

#[derive(Debug, Parser)]
struct Args {
    /// Target, e.g. http://127.0.0.1:8080/product/1
    #[arg(long)]
    url: String,
    /// Concurrent keep-alive connections.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Measured seconds (after the warm-up).
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Warm-up seconds (not measured).
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Requests per second in total; 0 = as fast as answers come (closed loop).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Extra request header, `Name: value` (repeatable).
    #[arg(long = "header")]
    headers: Vec<String>,
}

#[derive(Debug, Default)]
struct Shared {
    ok: AtomicU64,
    errors: AtomicU64,
    non_2xx: AtomicU64,
    bytes: AtomicU64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(run(args))?;
    println!("{result}");
    Ok(())
}

async fn run(args: Args) -> Result<serde_json::Value> {
    let uri: hyper::Uri = args.url.parse().context("--url")?;
    let authority = uri.authority().context("--url needs host:port")?.clone();
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let mut headers = Vec::new();
    for h in &args.headers {
        let Some((k, v)) = h.split_once(':') else {
            bail!("--header {h:?}: expected `Name: value`");
        };
        headers.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    let shared = Arc::new(Shared::default());
    let start = Instant::now() + Duration::from_millis(200);
    let measure_from = start + Duration::from_secs_f64(args.warmup);
    let end = measure_from + Duration::from_secs_f64(args.duration);
    // Per-connection interval in open-loop mode.
    let interval =
        (args.rate > 0.0).then(|| Duration::from_secs_f64(args.connections as f64 / args.rate));

    let n = args.connections;
    let mut tasks = Vec::with_capacity(n);
    for i in 0..args.connections {
        let shared = Arc::clone(&shared);
        let authority = authority.clone();
        let path = path.clone();
        let headers = headers.clone();
        tasks.push(tokio::spawn(async move {
            let mut hist =
                Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds");
            // Stagger open-loop connections so the total rate is smooth.
            let mut next = match interval {
                Some(iv) => start + iv.mul_f64(i as f64 / n as f64),
                None => start,
            };
            let mut sender = None;
            while Instant::now() < end {
                if interval.is_some() {
                    tokio::time::sleep_until(next.into()).await;
                    if next >= end {
                        break;
                    }
                } else {
                    next = Instant::now();
                }
                if sender.is_none() {
                    match connect(&authority).await {
                        Ok(s) => sender = Some(s),
                        Err(_) => {
                            shared.errors.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            if let Some(iv) = interval {
                                next += iv;
                            }
                            continue;
                        }
                    }
                }
                let s = sender.as_mut().expect("connected above");
                let mut req = Request::get(path.as_str()).header("host", authority.as_str());
                for (k, v) in &headers {
                    req = req.header(k.as_str(), v.as_str());
                }
                let req = req.body(Empty::<Bytes>::new()).expect("valid request");
                let outcome = async {
                    let resp = s.send_request(req).await?;
                    let status = resp.status();
                    let body = resp.into_body().collect().await?.to_bytes();
                    Ok::<_, hyper::Error>((status, body.len()))
                }
                .await;
                let done = Instant::now();
                let measured = next >= measure_from;
                match outcome {
                    Ok((status, len)) => {
                        if measured {
                            let us = done.saturating_duration_since(next).as_micros() as u64;
                            let _ = hist.record(us.max(1));
                            shared.ok.fetch_add(1, Ordering::Relaxed);
                            shared.bytes.fetch_add(len as u64, Ordering::Relaxed);
                            if !status.is_success() {
                                shared.non_2xx.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    Err(_) => {
                        if measured {
                            shared.errors.fetch_add(1, Ordering::Relaxed);
                        }
                        sender = None;
                    }
                }
                if let Some(iv) = interval {
                    next += iv;
                }
            }
            hist
        }));
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for t in tasks {
        hist.add(t.await?)?;
    }
    let ok = shared.ok.load(Ordering::Relaxed);
    let secs = args.duration;
    Ok(serde_json::json!({
        "url": args.url,
        "mode": if interval.is_some() { "fixed-rate" } else { "saturation" },
        "target_rps": args.rate,
        "connections": args.connections,
        "seconds": secs,
        "requests": ok,
        "errors": shared.errors.load(Ordering::Relaxed),
        "non_2xx": shared.non_2xx.load(Ordering::Relaxed),
        "rps": ok as f64 / secs,
        "mean_body_bytes": shared.bytes.load(Ordering::Relaxed).checked_div(ok).unwrap_or(0),
        "p50_us": hist.value_at_quantile(0.50),
        "p99_us": hist.value_at_quantile(0.99),
        "p999_us": hist.value_at_quantile(0.999),
        "max_us": hist.max(),
    }))
}

async fn connect(
    authority: &hyper::http::uri::Authority,
) -> Result<http1::SendRequest<Empty<Bytes>>> {
    let stream = TcpStream::connect(authority.as_str()).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}
