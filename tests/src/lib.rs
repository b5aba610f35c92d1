//! Support for the integration tests in `tests/`: most start the real
//! binaries, the privileged ones build network namespaces for XDP, and tests
//! of time run a node in-process on a driven clock.
//!
//! # Layout
//! - [`demo_origin`]: the demo shop, a real HTTP origin (binary
//!   `waitroom-demo-origin`, also used by `cargo xtask demo` and `bench`).
//! - [`procs`]: starting the real binaries, stopping them in `Drop`.
//! - [`edge`], [`cluster`]: a node, an aggregator with nodes, as processes.
//! - [`answer_proxy`]: a QUIC proxy in front of an aggregator that reshapes
//!   what follows its answers (notes right and wrong, broken stream ends,
//!   answers lost), and `ProxiedNode`, one node behind it with its origin
//!   and aggregators.
//! - [`inproc`]: a node in the test process on a driven clock, for tests of
//!   minutes, sessions and the queue's flow that need no real minutes.
//! - [`inproc_cluster`]: an aggregator and nodes in the test process on one
//!   driven clock, over real QUIC and HTTP, for tests that need minutes of
//!   history.
//! - [`browser`]: headless Chromium over the DevTools protocol.
//! - [`minutes`]: waiting for minute boundaries in the real-minute tests.
//! - [`netns`]: a namespace + veth pair guard for XDP tests.
//! - [`etcd`]: a real etcd cluster on loopback and its v3 JSON gateway
//!   (issue 20's ledger).
//! - [`require_root`]: the skip check of privileged tests.

pub mod answer_proxy;
pub mod browser;
pub mod cluster;
pub mod demo_origin;
pub mod edge;
pub mod etcd;
pub mod inproc;
pub mod inproc_cluster;
pub mod minutes;
pub mod netns;
pub mod procs;
pub mod raw;
pub mod tcp_relay;
pub mod udp_relay;
pub mod xdp_node;

/// Whether the process runs as root; if not, says on stderr that the calling
/// test skips and why. Privileged tests start with
/// `if !require_root() { return; }`.
#[track_caller]
#[must_use]
pub fn require_root() -> bool {
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    eprintln!(
        "skipping privileged test at {}: it needs root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN) \
         to load XDP and create network namespaces; CI runs it as root",
        std::panic::Location::caller()
    );
    false
}

/// Polls `check` every 100 ms for at most `limit`; true if it held once.
pub fn eventually(limit: std::time::Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    check()
}

/// Runs each named scenario on its own thread, all at once, and fails with
/// the names of those that failed (each one's panic message is printed under
/// its thread's name, the scenario's).
///
/// For scenarios that spend most of a wall-clock minute waiting (a pressed
/// minute of a cluster of real processes, a few requests a second): run one
/// after another on the test harness's two threads they took minutes of CI
/// that a machine mostly idle spent waiting. Each scenario must build its own
/// cluster (its own temporary directory, ports and processes).
pub fn concurrently(scenarios: &[(&str, fn())]) {
    let started = std::time::Instant::now();
    let results: Vec<(&str, Result<std::time::Duration, ()>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = scenarios
            .iter()
            .map(|&(name, run)| {
                let handle = std::thread::Builder::new()
                    .name(name.to_owned())
                    .spawn_scoped(scope, move || {
                        run();
                        started.elapsed()
                    })
                    .expect("a thread for the scenario");
                (name, handle)
            })
            .collect();
        handles
            .into_iter()
            .map(|(name, handle)| (name, handle.join().map_err(|_| ())))
            .collect()
    });
    for (name, result) in &results {
        match result {
            Ok(took) => eprintln!("scenario {name}: ok in {:.1} s", took.as_secs_f64()),
            Err(()) => eprintln!("scenario {name}: FAILED (its panic is printed above)"),
        }
    }
    let failed: Vec<&str> = results
        .iter()
        .filter(|(_, r)| r.is_err())
        .map(|(name, _)| *name)
        .collect();
    assert!(failed.is_empty(), "scenarios failed: {failed:?}");
}
