//! Criterion benchmarks of the request path's pieces that are not the engine
//! (the engine's own bench is in `waitroom-common/benches/engine.rs`):
//! - sealing and opening a cookie (ChaCha20-Poly1305 + postcard + base64);
//! - counting from 1, 2 and N threads: the exact ticket counter of
//!   `RoomCounters` (one shared word, CAS) against a plain shared `fetch_add`
//!   and against per-core shards — the figure behind the choice of one shared
//!   word per pool: shards would be faster but cannot enforce a cap exactly;
//! - the new-ticket limit per client address (`new_tickets`): what a request
//!   with a ticket pays (telling it is not new) and what a new visitor pays
//!   (that, plus a keyed hash of its address and one CAS);
//! - the front of every request: target normalization and the client address;
//! - the access log: a record copied and queued per request (against the
//!   front of every request), and the writer's formatting of a line.
use std::{
    hint::black_box,
    sync::{
        Arc, Barrier,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use waitroom_common::{
    counters::{Pool, RoomCounters},
    room::RoomId,
    ticket::Ticket,
    time::{Minute, UnixMillis},
};
use waitroom_edge::cookie::CookieKeys;

fn cookie(c: &mut Criterion) {
    let keys = CookieKeys::new(&[(1, [7; 32]), (2, [9; 32])]).expect("keys");
    let room = RoomId::from_name("shop");
    let now = UnixMillis(1_800_000_000_000);
    let mut ticket = Ticket::new_visitor(room, now, 20);
    ticket.accepted_at = Some(now);
    ticket.counted_expiry = Some(now.plus_minutes(10).expiry_slot());
    let bytes = postcard::to_allocvec(&ticket).expect("ticket encodes");
    let sealed = keys.seal("shop", &bytes);
    let mut g = c.benchmark_group("cookie");
    g.bench_function("seal", |b| {
        b.iter(|| {
            let bytes = postcard::to_allocvec(black_box(&ticket)).expect("encodes");
            keys.seal("shop", &bytes)
        });
    });
    g.bench_function("open", |b| {
        b.iter(|| {
            let bytes = keys.open("shop", black_box(&sealed)).expect("opens");
            postcard::from_bytes::<Ticket>(&bytes).expect("decodes")
        });
    });
    g.finish();
}

/// Per-core shards padded to a cache line each.
#[repr(align(64))]
struct Shard(AtomicU64);

/// Runs `per_thread` operations on each of `threads` threads; returns the wall time.
fn run_threads(threads: usize, per_thread: u64, op: Arc<dyn Fn(usize) + Send + Sync>) -> Duration {
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let barrier = Arc::clone(&barrier);
            let op = Arc::clone(&op);
            std::thread::spawn(move || {
                barrier.wait();
                for _ in 0..per_thread {
                    op(t);
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for h in handles {
        h.join().expect("bench thread");
    }
    start.elapsed()
}

fn counters(c: &mut Criterion) {
    let n = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .max(2);
    let mut thread_counts = vec![1, 2];
    if n > 2 {
        thread_counts.push(n);
    }
    let mut g = c.benchmark_group("counter_increment");
    g.measurement_time(Duration::from_secs(3));
    for &threads in &thread_counts {
        // Time per operation per thread: iters are split across threads.
        g.bench_with_input(
            BenchmarkId::new("ticket_cas_shared", threads),
            &threads,
            |b, &threads| {
                let counters: Arc<RoomCounters> = Arc::from(RoomCounters::new_boxed(RoomId(1)));
                b.iter_custom(|iters| {
                    counters.reset();
                    let counters = Arc::clone(&counters);
                    let per = iters.div_ceil(threads as u64);
                    run_threads(
                        threads,
                        per,
                        Arc::new(move |_| {
                            black_box(counters.take_ticket(Pool::ColoShare, Minute(1), u64::MAX));
                        }),
                    )
                });
            },
        );
        g.bench_with_input(
            BenchmarkId::new("fetch_add_shared", threads),
            &threads,
            |b, &threads| {
                let shared = Arc::new(AtomicU64::new(0));
                b.iter_custom(|iters| {
                    let shared = Arc::clone(&shared);
                    let per = iters.div_ceil(threads as u64);
                    run_threads(
                        threads,
                        per,
                        Arc::new(move |_| {
                            black_box(shared.fetch_add(1, Ordering::Relaxed));
                        }),
                    )
                });
            },
        );
        g.bench_with_input(
            BenchmarkId::new("fetch_add_per_core_shard", threads),
            &threads,
            |b, &threads| {
                let shards: Arc<Vec<Shard>> =
                    Arc::new((0..threads).map(|_| Shard(AtomicU64::new(0))).collect());
                b.iter_custom(|iters| {
                    let shards = Arc::clone(&shards);
                    let per = iters.div_ceil(threads as u64);
                    run_threads(
                        threads,
                        per,
                        Arc::new(move |t| {
                            black_box(shards[t].0.fetch_add(1, Ordering::Relaxed));
                        }),
                    )
                });
            },
        );
    }
    g.finish();
}

fn new_ticket_limit(c: &mut Criterion) {
    use waitroom_common::{engine::is_new_visitor, room::RoomConfig};
    use waitroom_edge::new_tickets::{NewTicketLimiter, NewTicketRate};
    let room = RoomConfig::with_limits(1_000, 100)
        .validate()
        .expect("valid room")
        .with_id(RoomId(1));
    let now = UnixMillis(1_800_000_000_000);
    let mut admitted = Ticket::new_visitor(RoomId(1), now, 20);
    admitted.accepted_at = Some(now);
    admitted.counted_expiry = Some(now.plus_minutes(5).expiry_slot());
    let mut g = c.benchmark_group("new_ticket_limit");
    g.bench_function("visitor_with_ticket", |b| {
        b.iter(|| is_new_visitor(&room, black_box(Some(&admitted)), black_box(now)));
    });
    // One ticket a millisecond per address; 1,024 addresses in turn and the
    // clock a millisecond on per request: every request is within its limit.
    let limiter = NewTicketLimiter::new(NewTicketRate {
        per_minute: 60_000,
        burst: 1_000,
    });
    let mut i = 0_u32;
    g.bench_function("new_visitor_within", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            let at = UnixMillis(now.0 + u64::from(i));
            let client = std::net::IpAddr::from((0xc000_0200 + (i % 1_024)).to_be_bytes());
            black_box(is_new_visitor(&room, black_box(None), at))
                && limiter.take(black_box(client), at).is_ok()
        });
    });
    let client = std::net::IpAddr::from([192, 0, 2, 7]);
    g.bench_function("new_visitor_over", |b| {
        b.iter(|| {
            black_box(is_new_visitor(&room, black_box(None), now))
                && limiter.take(black_box(client), now).is_ok()
        });
    });
    g.finish();
}

/// What every request pays before the engine: the one spelling of its target
/// (`target::normalize`) and its client's address (`forwarded`), for the
/// common case and for a load balancer's chain.
fn request_front(c: &mut Criterion) {
    use waitroom_edge::{
        forwarded::{ProxyNet, TrustedProxies},
        target,
    };
    let mut g = c.benchmark_group("request_front");
    let uri: http::Uri = "/drop/item?id=7".parse().expect("uri");
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::HOST, "shop.example".parse().expect("host"));
    g.bench_function("normalize_plain", |b| {
        b.iter(|| target::normalize(black_box(&uri), black_box(&headers)).is_ok());
    });
    let odd: http::Uri = "/x/../%64rop//item;x".parse().expect("uri");
    g.bench_function("normalize_odd", |b| {
        b.iter(|| target::normalize(black_box(&odd), black_box(&headers)).is_ok());
    });
    let peer = std::net::IpAddr::from([198, 51, 100, 7]);
    let none = TrustedProxies::default();
    g.bench_function("client_untrusted_peer", |b| {
        b.iter(|| none.resolve(black_box(peer), black_box(&headers)));
    });
    let nets: Vec<ProxyNet> = ["127.0.0.1/32", "10.0.0.0/8"]
        .iter()
        .map(|n| n.parse().expect("net"))
        .collect();
    let trusted = TrustedProxies::new(&nets);
    let mut chain = headers.clone();
    chain.insert(
        "x-forwarded-for",
        "6.6.6.6, 203.0.113.9, 10.1.2.3".parse().expect("xff"),
    );
    let lb = std::net::IpAddr::from([127, 0, 0, 1]);
    g.bench_function("client_trusted_chain", |b| {
        b.iter(|| trusted.resolve(black_box(lb), black_box(&chain)));
    });
    g.finish();
}

/// The access log's cost on the request path: copying what the line needs
/// out of the request head into a record and putting it on the worker's
/// queue (a writer thread drains it meanwhile, as in the node), against the
/// front of every request (`request_front`); and, off the request path,
/// what the writer spends formatting one line.
fn access_log(c: &mut Criterion) {
    use waitroom_edge::access_log::{
        AccessLog, AccessLogConfig, AccessLogFormat, Outcome, Record, Trace, VisitorKind,
    };
    let mut req = http::Request::get("/drop/item?id=7")
        .body(())
        .expect("request");
    let h = req.headers_mut();
    h.insert(http::header::HOST, "shop.example".parse().expect("host"));
    h.insert(
        http::header::USER_AGENT,
        "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
            .parse()
            .expect("ua"),
    );
    h.insert(
        http::header::REFERER,
        "https://shop.example/drop".parse().expect("referer"),
    );
    let client = std::net::IpAddr::from([198, 51, 100, 7]);
    let fill = |r: &mut Record| {
        r.status = 200;
        r.total_micros = 812;
        r.bytes = Some(5_120);
        r.trace = Trace {
            client: Some(client),
            outcome: Outcome::Admitted,
            visitor: Some(VisitorKind::Admitted),
            room: Some(0),
            bucket: Some(29_345_678),
            upstream_status: Some(200),
            upstream_micros: Some(640),
        };
    };
    let log = AccessLog::start(
        Some(&AccessLogConfig {
            enabled: true,
            path: "/dev/null".into(),
            format: AccessLogFormat::Json,
            queue_per_worker: 65_536,
        }),
        1,
        vec!["shop".into()],
    )
    .expect("access log to /dev/null");
    let worker = log.for_worker(0).expect("worker queue");
    let mut g = c.benchmark_group("access_log");
    // The copy alone (built and dropped), to tell it from the queue's share.
    g.bench_function("record_only", |b| {
        b.iter(|| {
            let mut r = Record::from_request(black_box(&req), client);
            fill(&mut r);
            black_box(r)
        });
    });
    // The writer takes about a microsecond a line, so at this bench's pace
    // most pushes find the queue full: the figure mixes queued and dropped
    // records (the counts are printed at the end).
    g.bench_function("record_and_enqueue", |b| {
        b.iter(|| {
            let mut r = Record::from_request(black_box(&req), client);
            fill(&mut r);
            worker.push(r);
        });
    });
    let mut r = Record::from_request(&req, client);
    fill(&mut r);
    let rooms = vec!["shop".to_owned()];
    let mut out = String::with_capacity(1024);
    for (name, format) in [
        ("format_json", AccessLogFormat::Json),
        ("format_combined", AccessLogFormat::Combined),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                out.clear();
                black_box(&r).format(format, &rooms, &mut out);
                out.len()
            });
        });
    }
    g.finish();
    log.finish();
    eprintln!(
        "access_log: {} lines written, {} dropped",
        log.written(),
        log.dropped()
    );
}

criterion_group!(
    benches,
    cookie,
    counters,
    new_ticket_limit,
    request_front,
    access_log
);
criterion_main!(benches);
