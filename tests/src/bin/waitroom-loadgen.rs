//! `waitroom-loadgen`: the HTTP load generator of `cargo xtask bench`.
//!
//! Keep-alive HTTP/1.1 connections, spread over `--threads` OS threads, each
//! with its own single-threaded tokio runtime (share-nothing, like wrk's
//! threads: no work stealing, no cross-thread wake-ups). Two modes:
//! - closed loop (`--rate 0`): every connection sends its next request as soon
//!   as the previous answer arrives — the saturation throughput;
//! - open loop (`--rate R`): requests are scheduled at a fixed total rate and
//!   latency is measured from the *scheduled* send time, so a stalled server
//!   is charged for the requests it delayed (no coordinated omission).
//!
//! Latencies go into an HDR histogram; the result is one JSON object on stdout.
use std::time::{Duration, Instant};

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
    /// OS threads, each driving every `threads`-th connection on its own
    /// single-threaded runtime (at most `--connections`).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

/// What one connection (or, summed, the whole run) counted while measuring.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    ok: u64,
    errors: u64,
    non_2xx: u64,
    bytes: u64,
}

impl Counts {
    fn add(&mut self, other: Self) {
        self.ok += other.ok;
        self.errors += other.errors;
        self.non_2xx += other.non_2xx;
        self.bytes += other.bytes;
    }
}

/// The request every connection sends, and the run's timetable.
#[derive(Debug, Clone)]
struct Plan {
    authority: hyper::http::uri::Authority,
    path: String,
    headers: Vec<(String, String)>,
    connections: usize,
    start: Instant,
    measure_from: Instant,
    end: Instant,
    /// Per-connection interval in open-loop mode.
    interval: Option<Duration>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let result = run(&args)?;
    println!("{result}");
    Ok(())
}

fn run(args: &Args) -> Result<serde_json::Value> {
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
    let start = Instant::now() + Duration::from_millis(200);
    let measure_from = start + Duration::from_secs_f64(args.warmup);
    let plan = Plan {
        authority,
        path,
        headers,
        connections: args.connections,
        start,
        measure_from,
        end: measure_from + Duration::from_secs_f64(args.duration),
        interval: (args.rate > 0.0)
            .then(|| Duration::from_secs_f64(args.connections as f64 / args.rate)),
    };
    let threads = args.threads.clamp(1, args.connections.max(1));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let plan = plan.clone();
            std::thread::Builder::new()
                .name(format!("loadgen-{t}"))
                .spawn(move || -> Result<(Histogram<u64>, Counts)> {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    runtime.block_on(thread_connections(plan, t, threads))
                })
        })
        .collect::<Result<_, _>>()?;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut counts = Counts::default();
    for w in workers {
        let (h, c) = w
            .join()
            .map_err(|_| anyhow::anyhow!("a load thread panicked"))??;
        hist.add(h)?;
        counts.add(c);
    }
    let secs = args.duration;
    Ok(serde_json::json!({
        "url": args.url,
        "mode": if plan.interval.is_some() { "fixed-rate" } else { "saturation" },
        "target_rps": args.rate,
        "connections": args.connections,
        "threads": threads,
        "seconds": secs,
        "requests": counts.ok,
        "errors": counts.errors,
        "non_2xx": counts.non_2xx,
        "rps": counts.ok as f64 / secs,
        "mean_body_bytes": counts.bytes.checked_div(counts.ok).unwrap_or(0),
        "p50_us": hist.value_at_quantile(0.50),
        "p99_us": hist.value_at_quantile(0.99),
        "p999_us": hist.value_at_quantile(0.999),
        "max_us": hist.max(),
    }))
}

/// Drives connections `thread`, `thread + threads`, … on this thread's runtime.
async fn thread_connections(
    plan: Plan,
    thread: usize,
    threads: usize,
) -> Result<(Histogram<u64>, Counts)> {
    let mut tasks = Vec::new();
    for i in (thread..plan.connections).step_by(threads) {
        let plan = plan.clone();
        tasks.push(tokio::spawn(async move { connection(&plan, i).await }));
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut counts = Counts::default();
    for t in tasks {
        let (h, c) = t.await?;
        hist.add(h)?;
        counts.add(c);
    }
    Ok((hist, counts))
}

/// One keep-alive connection's requests until the plan's end.
async fn connection(plan: &Plan, i: usize) -> (Histogram<u64>, Counts) {
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds");
    let mut counts = Counts::default();
    let (interval, end, n) = (plan.interval, plan.end, plan.connections);
    // Stagger open-loop connections so the total rate is smooth.
    let mut next = match interval {
        Some(iv) => plan.start + iv.mul_f64(i as f64 / n as f64),
        None => plan.start,
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
            match connect(&plan.authority).await {
                Ok(s) => sender = Some(s),
                Err(_) => {
                    counts.errors += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    if let Some(iv) = interval {
                        next += iv;
                    }
                    continue;
                }
            }
        }
        let s = sender.as_mut().expect("connected above");
        let mut req = Request::get(plan.path.as_str()).header("host", plan.authority.as_str());
        for (k, v) in &plan.headers {
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
        let measured = next >= plan.measure_from;
        match outcome {
            Ok((status, len)) => {
                if measured {
                    let us = done.saturating_duration_since(next).as_micros() as u64;
                    let _ = hist.record(us.max(1));
                    counts.ok += 1;
                    counts.bytes += len as u64;
                    if !status.is_success() {
                        counts.non_2xx += 1;
                    }
                }
            }
            Err(_) => {
                if measured {
                    counts.errors += 1;
                }
                sender = None;
            }
        }
        if let Some(iv) = interval {
            next += iv;
        }
    }
    (hist, counts)
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
