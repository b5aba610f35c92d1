//! The ground issue 20's ledger will stand on (docs/adr/0001), checked on a
//! real 3-member etcd cluster on loopback before any aggregator uses it:
//! granters racing on one pool by compare-and-swap through the v3 JSON
//! gateway never grant more than the pool, and together use all of it,
//! while one member is killed -9 mid-run; with two members gone a grant
//! fails within its deadline instead of hanging; a member restarted on its
//! data brings the quorum back and grants go on from the recorded total.
//!
//! What it taught: a compare-and-swap whose reply is lost (the member dies
//! after the commit; the retry on another member fails its compare) looks
//! like a lost race, and its slots would be spent and held by nobody. The
//! ledger keeps the ids of its last grants so the granter can tell (issue
//! 20's batch ids, docs/adr/0001).
use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use waitroom_tests::etcd::{EtcdCluster, Kv, require_etcd};

const KEY: &str = "/waitroom/test/shop/29000000/anywhere";
const POOL: u64 = 240;
const GRANTERS: usize = 4;
/// Every etcd call's deadline per endpoint.
const CALL: Duration = Duration::from_secs(2);

/// The ledger's value: the total granted and the ids of the last grants,
/// so a granter whose reply was lost (a member killed after the commit,
/// the retry on the next member failing its compare) can tell that the
/// grant was its own: without them the slots would be counted as spent
/// and held by nobody (this test saw exactly that before the ids).
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Ledger {
    total: u64,
    recent: Vec<(String, u64)>,
}

/// Ids kept: in this test every grant's (the pool allows at most 240), so
/// the end can compare the ledger with what each granter holds.
const RECENT: usize = 1_000;

/// What a granter thread ends with: the grants it holds (id, slots), its
/// lost races and its failed calls.
type GranterRun = (Vec<(String, u64)>, u32, u32);

enum Step {
    /// Grants now held (id, slots): this call's, and one whose reply was lost.
    Granted(Vec<(String, u64)>),
    /// Another granter wrote first: try again.
    Lost,
    /// The pool is used up.
    Full,
}

/// One grant of up to `want` slots under the id `id`: read the ledger,
/// write total + granted if nobody wrote since. `pending` is a grant whose
/// outcome is unknown (its call failed or its compare failed after a
/// retry): settled here from the ids the ledger keeps.
fn grant(
    kv: &Kv,
    id: &str,
    want: u64,
    pending: &mut Option<(String, u64)>,
) -> anyhow::Result<Step> {
    let entry = kv.get(KEY)?;
    let ledger: Ledger = match &entry.value {
        Some(v) => serde_json::from_slice(v)?,
        None => Ledger::default(),
    };
    let mut held = Vec::new();
    if let Some((pid, n)) = pending.take()
        && ledger.recent.iter().any(|(r, _)| *r == pid)
    {
        held.push((pid, n));
    }
    let granted = want.min(POOL.saturating_sub(ledger.total));
    if granted == 0 {
        return Ok(if held.is_empty() {
            Step::Full
        } else {
            Step::Granted(held)
        });
    }
    let mut next = Ledger {
        total: ledger.total + granted,
        recent: ledger.recent,
    };
    next.recent.push((id.to_owned(), granted));
    if next.recent.len() > RECENT {
        next.recent.remove(0);
    }
    *pending = Some((id.to_owned(), granted));
    let written = kv.swap(KEY, entry.mod_revision, &serde_json::to_vec(&next)?)?;
    if written {
        *pending = None;
        held.push((id.to_owned(), granted));
        return Ok(Step::Granted(held));
    }
    // A compare that failed may be our own write seen on the retry:
    // `pending` is settled on the next read.
    Ok(if held.is_empty() {
        Step::Lost
    } else {
        Step::Granted(held)
    })
}

fn total(kv: &Kv) -> u64 {
    kv.get(KEY)
        .ok()
        .and_then(|e| e.value)
        .and_then(|v| serde_json::from_slice::<Ledger>(&v).ok())
        .map_or(0, |l| l.total)
}

#[test]
fn racing_granters_never_exceed_the_pool_through_a_crash_and_a_lost_quorum() {
    if !require_etcd() {
        return;
    }
    let mut cluster = EtcdCluster::start("etcd-ledger", 3).unwrap();
    let endpoints = cluster.endpoints();
    let granted_total = Arc::new(AtomicU64::new(0));
    let granters: Vec<_> = (0..GRANTERS)
        .map(|g| {
            let kv = Kv::new(endpoints.clone(), CALL);
            let granted_total = Arc::clone(&granted_total);
            std::thread::spawn(move || {
                let (mut mine, mut lost, mut errors) = (Vec::new(), 0u32, 0u32);
                let mut pending = None;
                let started = Instant::now();
                for round in 0..5_000u64 {
                    if started.elapsed() > Duration::from_secs(60) {
                        break;
                    }
                    let id = format!("g{g}-{round}");
                    match grant(&kv, &id, 1 + (round + g as u64) % 3, &mut pending) {
                        Ok(Step::Full) => break,
                        Ok(Step::Granted(held)) => {
                            for (_, n) in &held {
                                granted_total.fetch_add(*n, Ordering::Relaxed);
                            }
                            mine.extend(held);
                        }
                        Ok(Step::Lost) => lost += 1,
                        // A member dying under a call: the next call tries
                        // the others.
                        Err(_) => errors += 1,
                    }
                }
                (mine, lost, errors)
            })
        })
        .collect();

    // Once a third of the pool is out, a member crashes.
    let deadline = Instant::now() + Duration::from_secs(30);
    while granted_total.load(Ordering::Relaxed) < POOL / 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        granted_total.load(Ordering::Relaxed) >= POOL / 3,
        "no progress"
    );
    cluster.kill(0);

    let results: Vec<GranterRun> = granters.into_iter().map(|t| t.join().unwrap()).collect();
    let summary: Vec<(u64, u32, u32)> = results
        .iter()
        .map(|(held, lost, errors)| (held.iter().map(|h| h.1).sum(), *lost, *errors))
        .collect();
    eprintln!("granters (slots, lost races, errors): {summary:?}");
    let kv = Kv::new(endpoints.clone(), CALL);
    let ledger: Ledger = serde_json::from_slice(&kv.get(KEY).unwrap().value.unwrap()).unwrap();
    assert_eq!(ledger.total, POOL, "the pool is used up, no more");
    let mut held: Vec<(String, u64)> = results.iter().flat_map(|r| r.0.clone()).collect();
    let mut recorded = ledger.recent.clone();
    held.sort();
    recorded.sort();
    let missing: Vec<_> = recorded.iter().filter(|r| !held.contains(r)).collect();
    let extra: Vec<_> = held.iter().filter(|h| !recorded.contains(h)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "grants etcd recorded that no granter holds: {missing:?}; held but not recorded: {extra:?}"
    );
    assert_eq!(held.iter().map(|h| h.1).sum::<u64>(), POOL);
    assert!(
        summary.iter().map(|r| r.1).sum::<u32>() > 0,
        "the granters did race (a compare failed at least once)"
    );

    // Two of three gone: no quorum. A grant fails within its deadline.
    cluster.kill(1);
    let started = Instant::now();
    let attempt = Kv::new(endpoints.clone(), CALL).swap(KEY, 1, b"{}");
    let took = started.elapsed();
    assert!(attempt.is_err(), "a write without quorum: {attempt:?}");
    assert!(
        took < CALL * 3 + Duration::from_secs(2),
        "failed after {took:?}, not within the deadline"
    );

    // One member back on its data: quorum again, and the total is intact.
    cluster.restart(0).unwrap();
    cluster.wait_healthy(0, Duration::from_secs(30)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut back = None;
    while back.is_none() && Instant::now() < deadline {
        back = kv.get(KEY).ok();
        if back.is_none() {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let entry = back.expect("reads work again with two members");
    assert_eq!(total(&kv), POOL, "the total survived the lost quorum");
    let empty = serde_json::to_vec(&Ledger::default()).unwrap();
    assert!(
        !kv.swap(KEY, entry.mod_revision - 1, &empty).unwrap(),
        "a writer with a stale revision changes nothing"
    );
    assert!(
        kv.swap(KEY, entry.mod_revision, &empty).unwrap(),
        "a fresh one does"
    );
}
