//! Grants made durable before a node hears of them (docs/adr/0001,
//! decisions 2 and 3): every home answer's grants go through here when a
//! `[ledger]` is configured.
//!
//! # Group commit
//! One task commits; reports hand it their grants and wait. While a commit
//! is in flight the next reports queue, and the task takes all of them in
//! the next batch: one compare-and-swap per room and minute per batch, not
//! one per report. With etcd answering in a few ms that is a batch per few
//! ms under load and one per report when quiet, with no timer to tune.
//!
//! # What a node is told
//! - committed: the cap etcd holds for it (its grant, cut if the other
//!   aggregators' grants left less room);
//! - not committed (no quorum, the deadline passed, junk at the key): what
//!   it already holds and nothing new. Its earlier caps are in etcd, so
//!   keeping them is safe; anything more might not be. The node stays fresh
//!   on its held slots, and new visitors beyond them queue until etcd is back.
//!
//! # An outage costs one deadline a second, not one per batch
//! After a failed commit, batches for the next `BACKOFF` are answered
//! with what is held at once, without trying etcd; then one batch tries
//! again. Otherwise every batch would wait its whole deadline and the
//! reports queued behind it longer than the nodes wait for an answer.
use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use tokio::sync::{mpsc, oneshot};
use waitroom_common::{
    cluster::{SharedGrant, grants::Ask},
    time::Minute,
};

use crate::ledger::{Etcd, EtcdLedger};

/// Reports waiting for a commit, most: past it a report is answered with
/// what its node holds, without waiting.
const QUEUE: usize = 4_096;

/// How long after a failed commit batches skip etcd (see the module doc).
const BACKOFF: Duration = Duration::from_secs(1);

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct LedgerMetrics {
    /// Compare-and-swap commits (one per room and minute per batch) that
    /// succeeded.
    pub commits_total: AtomicU64,
    /// Commits that failed (no quorum, deadline, contention, junk).
    pub commit_failures_total: AtomicU64,
    /// Grants etcd cut because other aggregators' grants left less room.
    pub grants_cut_total: AtomicU64,
    /// Grants answered with only what the node held, because no commit
    /// covered them.
    pub grants_held_back_total: AtomicU64,
    /// Batches committed, and the grants they carried.
    pub batches_total: AtomicU64,
    pub batched_grants_total: AtomicU64,
    /// Wall time of the last batch, µs.
    pub last_batch_us: AtomicU64,
    /// Reports answered at once with what their nodes hold, because
    /// `QUEUE` reports were already waiting for a commit (etcd far
    /// behind, or a flood of reports).
    pub queue_full_total: AtomicU64,
}

/// One grant to commit: its room, minute and key, and the node's ask.
struct Grant {
    room: String,
    minute: Minute,
    key: String,
    ask: Ask,
}

/// One report's grants, waiting for their commit.
struct Pending {
    asks: Vec<Grant>,
    /// The cap etcd holds for each ask, in order; `None` where the commit failed.
    reply: oneshot::Sender<Vec<Option<u64>>>,
}

/// The committing task's handle.
#[derive(Debug)]
pub struct Committer {
    tx: mpsc::Sender<Pending>,
    epoch: u64,
    pub metrics: Arc<LedgerMetrics>,
    /// The last batch that went to etcd failed (or the fence, read at
    /// start, holds another epoch): the answers say so
    /// ([`Committer::failing`]).
    failing: Arc<AtomicBool>,
}

impl Committer {
    /// Starts the committing task on the current tokio runtime.
    #[must_use]
    /// With `shard`, the fence names the aggregator groups as well.
    pub fn start(
        config: &crate::config::LedgerConfig,
        shard: Option<&waitroom_common::shard::Membership>,
    ) -> Self {
        let mut ledger = EtcdLedger::new(
            Etcd::new(
                config.endpoints.clone(),
                Duration::from_millis(config.call_timeout_ms),
            ),
            Duration::from_millis(config.commit_deadline_ms),
        )
        .fenced(config.epoch);
        if let Some(shard) = shard {
            ledger = ledger.sharded(shard.canonical());
        }
        let ledger = Arc::new(ledger);
        let (tx, rx) = mpsc::channel(QUEUE);
        let metrics = Arc::new(LedgerMetrics::default());
        let failing = Arc::new(AtomicBool::new(false));
        // A mistyped epoch is said at once, not at the first commit, and
        // the nodes hear of it from the first answer.
        let (check, fenced) = (Arc::clone(&ledger), Arc::clone(&failing));
        tokio::task::spawn_blocking(move || match check.check_fence() {
            Ok(()) => {}
            Err(err @ crate::ledger::LedgerError::Fenced { .. }) => {
                fenced.store(true, Relaxed);
                tracing::warn!(%err, "grants not committed; nodes are answered with what they hold and nothing new");
            }
            Err(err) => tracing::debug!(%err, "could not read the fence at start"),
        });
        tokio::spawn(probe(Arc::clone(&ledger), Arc::downgrade(&failing)));
        tokio::spawn(run(
            ledger,
            config.epoch,
            Duration::from_millis(config.batch_interval_ms),
            rx,
            Arc::clone(&metrics),
            Arc::clone(&failing),
        ));
        Self {
            tx,
            epoch: config.epoch,
            metrics,
            failing,
        }
    }

    /// Grants cannot be committed at the moment: the last batch that went
    /// to etcd failed (no quorum, deadline, fenced), or the fence read at
    /// start holds another epoch. Cleared by the next batch that commits.
    #[must_use]
    pub fn failing(&self) -> bool {
        self.failing.load(Relaxed)
    }

    /// The key of `room`'s shared grants in `minute`.
    #[must_use]
    pub fn key(&self, room: &str, minute: Minute) -> String {
        EtcdLedger::key(self.epoch, room, minute)
    }

    /// Commits `grants` (each with its room's name) to `node`'s name and
    /// returns what the node may be told for each: the allowances
    /// `(colo share, Anywhere)` etcd holds, or what it holds already when
    /// no commit covered the grant (held back).
    pub async fn commit(&self, node: &str, grants: &[(String, SharedGrant)]) -> Vec<Told> {
        let asks = grants
            .iter()
            .map(|(room, g)| Grant {
                room: room.clone(),
                minute: g.minute,
                key: self.key(room, g.minute),
                ask: g.ask(node),
            })
            .collect();
        let (reply, answer) = oneshot::channel();
        let caps = match self.tx.try_send(Pending { asks, reply }) {
            Ok(()) => answer.await.unwrap_or_default(),
            // Full (etcd far behind) or the task gone: answer from what is held.
            Err(_) => {
                self.metrics.queue_full_total.fetch_add(1, Relaxed);
                Vec::new()
            }
        };
        grants
            .iter()
            .enumerate()
            .map(|(i, (room, g))| {
                let cap = caps.get(i).copied().flatten();
                let told = match cap {
                    Some(cap) => {
                        let told = g.cut_to(cap);
                        if told != g.allowances() {
                            self.metrics.grants_cut_total.fetch_add(1, Relaxed);
                        }
                        told
                    }
                    None => {
                        self.metrics.grants_held_back_total.fetch_add(1, Relaxed);
                        g.holds
                    }
                };
                let held_back = cap.is_none();
                tracing::debug!(
                    node, %room, minute = g.minute.0, used = ?g.used, held = ?g.held,
                    asked = ?g.allowances(), budget = g.budget, recorded = ?cap, ?told,
                    "shared grant"
                );
                Told {
                    allowances: told,
                    held_back,
                }
            })
            .collect()
    }
}

/// What a node may be told of one grant ([`Committer::commit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Told {
    /// `(colo share, Anywhere)`.
    pub allowances: (u64, u64),
    /// No commit covered the grant: `allowances` are what the node held.
    pub held_back: bool,
}

/// While grants cannot be committed, reads the fence once per [`BACKOFF`]
/// (a linearizable read: it needs a quorum, as a commit does) and clears
/// [`Committer::failing`] when it reads back this aggregator's: its nodes
/// may have moved to other aggregators and send it no grant to try, so
/// without this it would never learn that it can grant again. Ends with
/// the committer.
async fn probe(ledger: Arc<EtcdLedger>, failing: std::sync::Weak<AtomicBool>) {
    loop {
        tokio::time::sleep(BACKOFF).await;
        let Some(flag) = failing.upgrade() else {
            return;
        };
        if !flag.load(Relaxed) {
            continue;
        }
        let ledger = Arc::clone(&ledger);
        if let Ok(Ok(())) = tokio::task::spawn_blocking(move || ledger.check_fence()).await {
            flag.store(false, Relaxed);
            tracing::info!("etcd reachable with this aggregator's epoch again; granting");
        }
    }
}

/// The batch id's prefix: this process, so no two aggregators (or two runs
/// of one) ever reuse an id (a reused id would be taken for a retry).
fn instance() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:x}-{nanos:x}", std::process::id())
}

async fn run(
    ledger: Arc<EtcdLedger>,
    epoch: u64,
    interval: Duration,
    mut rx: mpsc::Receiver<Pending>,
    metrics: Arc<LedgerMetrics>,
    failing: Arc<AtomicBool>,
) {
    let instance = instance();
    // Each room's latest minute seen: when it moves, the keys of minutes
    // two and more before go (each minute writes a key; none is read after).
    let mut latest: BTreeMap<String, Minute> = BTreeMap::new();
    let mut batch_no = 0_u64;
    let mut failures_logged: Option<Instant> = None;
    let mut skip_until: Option<Instant> = None;
    let mut last_batch: Option<Instant> = None;
    while let Some(first) = rx.recv().await {
        // Every report that comes meanwhile joins this batch.
        if let Some(next) = last_batch.map(|at| at + interval)
            && Instant::now() < next
        {
            tokio::time::sleep_until(next.into()).await;
        }
        let started = Instant::now();
        last_batch = Some(started);
        let mut batch = vec![first];
        while let Ok(more) = rx.try_recv() {
            batch.push(more);
        }
        if skip_until.is_some_and(|until| started < until) {
            for pending in batch {
                let _ = pending.reply.send(Vec::new());
            }
            continue;
        }
        batch_no += 1;
        let id = format!("{instance}/{batch_no}");
        // Each key's asks in arrival order, with where their answers go.
        let mut by_key: BTreeMap<&str, Vec<(usize, usize)>> = BTreeMap::new();
        for (p, pending) in batch.iter().enumerate() {
            for (a, grant) in pending.asks.iter().enumerate() {
                by_key.entry(grant.key.as_str()).or_default().push((p, a));
                let seen = latest.entry(grant.room.clone()).or_insert(grant.minute);
                if grant.minute > *seen {
                    *seen = grant.minute;
                    let (ledger, room, before) = (
                        Arc::clone(&ledger),
                        grant.room.clone(),
                        grant.minute.minus(2),
                    );
                    // The epoch before this one too: its keys are read only
                    // for the minute of an epoch change (to start from).
                    tokio::task::spawn_blocking(move || {
                        for epoch in (epoch.saturating_sub(1).max(1)..=epoch).rev() {
                            if let Err(err) = ledger.forget_before(epoch, &room, before) {
                                tracing::debug!(%room, epoch, %err, "could not delete past minutes' ledgers");
                            }
                        }
                    });
                }
            }
        }
        let commits: Vec<_> = by_key
            .iter()
            .map(|(key, places)| {
                let asks: Vec<Ask> = places
                    .iter()
                    .map(|&(p, a)| batch[p].asks[a].ask.clone())
                    .collect();
                let (ledger, key, id) = (Arc::clone(&ledger), (*key).to_owned(), id.clone());
                tokio::task::spawn_blocking(move || ledger.commit(&key, &id, &asks))
            })
            .collect();
        let mut caps: Vec<Vec<Option<u64>>> =
            batch.iter().map(|p| vec![None; p.asks.len()]).collect();
        let mut grants = 0;
        let mut failed = false;
        skip_until = None;
        for ((key, places), commit) in by_key.iter().zip(commits) {
            grants += places.len() as u64;
            match commit.await {
                Ok(Ok(set)) => {
                    metrics.commits_total.fetch_add(1, Relaxed);
                    for (&(p, a), (_, cap)) in places.iter().zip(set) {
                        caps[p][a] = Some(cap);
                    }
                }
                Ok(Err(err)) => {
                    metrics.commit_failures_total.fetch_add(1, Relaxed);
                    failed = true;
                    skip_until = Some(Instant::now() + BACKOFF);
                    // One line per 10 s: a dead etcd fails every batch.
                    if failures_logged.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
                        failures_logged = Some(Instant::now());
                        tracing::warn!(%key, %err, "grants not committed; nodes are answered with what they hold and nothing new");
                    }
                }
                Err(err) => {
                    metrics.commit_failures_total.fetch_add(1, Relaxed);
                    failed = true;
                    tracing::error!(%key, %err, "the commit task failed");
                }
            }
        }
        if failed || grants > 0 {
            failing.store(failed, Relaxed);
        }
        metrics.batches_total.fetch_add(1, Relaxed);
        metrics.batched_grants_total.fetch_add(grants, Relaxed);
        metrics.last_batch_us.store(
            u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
            Relaxed,
        );
        for (pending, caps) in batch.into_iter().zip(caps) {
            let _ = pending.reply.send(caps);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use waitroom_common::{room::RoomId, time::UnixMillis};

    use super::*;
    use crate::config::LedgerConfig;

    /// An etcd member that accepts connections and never answers: a hung
    /// process, or a member behind a link that drops every reply.
    fn hung_member() -> (String, std::thread::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let holder = std::thread::spawn(move || {
            listener.set_nonblocking(true).unwrap();
            let mut held = Vec::new();
            let until = Instant::now() + Duration::from_secs(20);
            // Bounded in time and in connections held.
            while Instant::now() < until && held.len() < 256 {
                match listener.accept() {
                    Ok((stream, _)) => held.push(stream),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        (url, holder)
    }

    fn grant(node: u64) -> SharedGrant {
        SharedGrant {
            room: RoomId::from_name("shop"),
            minute: UnixMillis(1_700_000_000_000).minute(),
            used: (node % 3, 1),
            held: (2, 3),
            colo_allowance: 5,
            anywhere_allowance: 7,
            budget: 100,
            holds: (1 + node % 2, 2),
        }
    }

    /// A flood of home reports while etcd hangs: more reports than the
    /// queue holds, all at once. Every one is answered, within the
    /// nodes' wait (1 s) plus scheduling, with what its node holds and
    /// nothing new; the ones past the queue at once, counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flood_while_etcd_hangs_is_answered_with_what_nodes_hold() {
        let (member, _holder) = hung_member();
        let committer = Arc::new(Committer::start(
            &LedgerConfig {
                endpoints: vec![member],
                epoch: 1,
                call_timeout_ms: 200,
                commit_deadline_ms: 500,
                batch_interval_ms: 0,
            },
            None,
        ));
        // One report first, so the committer is already waiting on the hung
        // member when the flood comes: a committer scheduled late would
        // otherwise take thousands of the flood into its first batch, and
        // the queue would never fill (seen once in CI).
        let first = {
            let committer = Arc::clone(&committer);
            tokio::spawn(async move {
                let g = grant(u64::MAX);
                (
                    g,
                    committer
                        .commit("node-first", &[("shop".to_owned(), g)])
                        .await,
                )
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let flood = QUEUE as u64 + 1_000;
        let reports = flood + 1;
        let started = Instant::now();
        let tasks: Vec<_> = (0..flood)
            .map(|n| {
                let committer = Arc::clone(&committer);
                tokio::spawn(async move {
                    let g = grant(n);
                    let told = committer
                        .commit(&format!("node-{n}"), &[("shop".to_owned(), g)])
                        .await;
                    (g, told, started.elapsed())
                })
            })
            .collect();
        // Each report is told what it holds, held back: nothing new.
        let held_back = |holds| {
            vec![Told {
                allowances: holds,
                held_back: true,
            }]
        };
        let (g, told) = first.await.unwrap();
        assert_eq!(told, held_back(g.holds), "nothing new while etcd hangs");
        let mut slowest = Duration::ZERO;
        for task in tasks {
            let (g, told, took) = task.await.unwrap();
            assert_eq!(told, held_back(g.holds), "nothing new while etcd hangs");
            slowest = slowest.max(took);
        }
        let m = &committer.metrics;
        let full = m.queue_full_total.load(Relaxed);
        eprintln!(
            "{reports} reports: {full} past the queue, {} failed commits, slowest answer {slowest:?}",
            m.commit_failures_total.load(Relaxed)
        );
        assert_eq!(m.grants_held_back_total.load(Relaxed), reports);
        assert!(full >= 1, "some reports found the queue full");
        assert!(m.commit_failures_total.load(Relaxed) >= 1);
        assert_eq!(m.commits_total.load(Relaxed), 0);
        assert!(
            slowest < Duration::from_secs(5),
            "every report answered, none left waiting: {slowest:?}"
        );
    }
}
