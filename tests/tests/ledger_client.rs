//! The aggregator's grant ledger client (issue 20, docs/adr/0001 step 2:
//! `waitroom_aggregator::ledger::EtcdLedger`) on a real 3-member etcd on
//! loopback:
//! - four clients, as four aggregators, commit batches of caps for their own
//!   nodes against one pool while a member is killed -9 mid-run: the caps
//!   never pass the pool, the pool is used, and what each client was told
//!   is exactly what etcd holds for its nodes;
//! - a batch committed again (a retry after a lost reply) gets what it got
//!   the first time and writes nothing;
//! - junk at the key (an operator's mistake, another program) is an error
//!   naming the key, and nothing is granted or overwritten;
//! - with two members gone (no quorum) a commit fails within its deadline,
//!   never hangs;
//! - an aggregator at another epoch than etcd's fence is refused every
//!   commit (its error names `ledger.epoch`), and after an operator moves
//!   the fence mid-minute the new epoch's first commit starts from the old
//!   epoch's ledger of that minute, so nothing is granted twice;
//! - a slow member (its replies delayed past the call timeout, by a relay in
//!   front of it) is passed over once and not asked again while another
//!   answers; with every member slow the aggregator's committer answers
//!   within the nodes' wait with what they hold and nothing new, and commits
//!   again once etcd is fast;
//! - with `batch_interval_ms`, reports arriving every 125 ms for a second
//!   are committed in at most one batch per interval, each told its grant.
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use waitroom_aggregator::{
    committer::Committer,
    config::LedgerConfig,
    ledger::{EPOCH_KEY, Etcd, EtcdLedger, LedgerError},
};
use waitroom_common::{
    cluster::{
        SharedGrant,
        grants::{Ask, GrantLedger},
    },
    room::RoomId,
    time::{Minute, UnixMillis},
};
use waitroom_tests::{
    etcd::{EtcdCluster, history, require_etcd},
    tcp_relay::TcpRelay,
};

const POOL: u64 = 300;
const CLIENTS: usize = 4;
const NODES_PER_CLIENT: usize = 3;
/// Every etcd call's deadline per member, and a commit's over its attempts.
const CALL: Duration = Duration::from_millis(700);
const COMMIT: Duration = Duration::from_secs(3);

/// Each `(node, cap)` asked against the same `pool`.
fn with_pool(asks: &[(String, u64)], pool: u64) -> Vec<Ask> {
    asks.iter()
        .map(|(node, cap)| Ask {
            node: node.clone(),
            cap: *cap,
            pool,
            floor: 0,
        })
        .collect()
}

fn ledger(endpoints: &[String]) -> EtcdLedger {
    EtcdLedger::new(Etcd::new(endpoints.to_vec(), CALL), COMMIT)
}

#[test]
fn four_aggregators_commit_within_the_pool_through_a_member_crash() {
    if !require_etcd() {
        return;
    }
    let mut cluster = EtcdCluster::start("ledger-race", 3).unwrap();
    let endpoints = cluster.endpoints();
    let key = EtcdLedger::key(1, "shop", Minute(29_000_000));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let ledger = ledger(&endpoints);
            let key = key.clone();
            std::thread::spawn(move || {
                // Each node's cap as last told, and errors seen.
                let mut told: BTreeMap<String, u64> = BTreeMap::new();
                let mut errors = Vec::new();
                let started = Instant::now();
                for round in 0..400_u64 {
                    if started.elapsed() > Duration::from_secs(40) {
                        break;
                    }
                    // Every round, each node asks for 5 more than it holds.
                    let asks: Vec<(String, u64)> = (0..NODES_PER_CLIENT)
                        .map(|n| {
                            let node = format!("agg{c}-node{n}");
                            let held = told.get(&node).copied().unwrap_or(0);
                            (node, held + 5)
                        })
                        .collect();
                    match ledger.commit(&key, &format!("agg{c}/{round}"), &with_pool(&asks, POOL)) {
                        Ok(set) => {
                            let full = set
                                .iter()
                                .zip(&asks)
                                .all(|((_, cap), (_, asked))| cap < asked);
                            told.extend(set);
                            if full {
                                break;
                            }
                        }
                        // A member dying under a commit: the next one goes on.
                        Err(e) => errors.push(e.to_string()),
                    }
                }
                (told, errors)
            })
        })
        .collect();
    // A member crashes once a third of the pool is out.
    let watcher = ledger(&endpoints);
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let total = watcher.read(&key).map_or(0, |(l, _)| l.total());
        if total >= POOL / 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    cluster.kill(0);
    let killed_at = watcher.read(&key).map(|(l, _)| l.total());
    let results: Vec<(BTreeMap<String, u64>, Vec<String>)> =
        clients.into_iter().map(|t| t.join().unwrap()).collect();
    let (stored, _) = watcher.read(&key).unwrap();
    eprintln!(
        "member killed at {killed_at:?} of {POOL}; per client (slots told, errors): {:?}",
        results
            .iter()
            .map(|(t, e)| (t.values().sum::<u64>(), e.len()))
            .collect::<Vec<_>>()
    );
    assert!(
        stored.total() <= POOL,
        "caps {} > pool {POOL}",
        stored.total()
    );
    assert_eq!(stored.total(), POOL, "the pool is used");
    for (told, _) in &results {
        for (node, cap) in told {
            assert_eq!(
                stored.caps.get(node),
                Some(cap),
                "{node}: told {cap}, etcd holds {:?}",
                stored.caps.get(node)
            );
        }
    }
    let told_total: u64 = results.iter().flat_map(|(t, _)| t.values()).sum();
    assert_eq!(told_total, POOL, "every slot is held by exactly one node");
    assert!(
        stored.recent.len() > CLIENTS,
        "the clients raced over many batches"
    );
}

#[test]
fn retries_count_once_junk_is_refused_and_a_lost_quorum_fails_in_time() {
    if !require_etcd() {
        return;
    }
    let mut cluster = EtcdCluster::start("ledger-faults", 3).unwrap();
    let endpoints = cluster.endpoints();
    let client = ledger(&endpoints);
    let key = EtcdLedger::key(1, "shop", Minute(29_000_001));

    // --- The same batch twice: the second is told what the first got.
    let asks = vec![("a".to_owned(), 80), ("b".to_owned(), 80)];
    let first = client
        .commit(&key, "agg0/7", &with_pool(&asks, 100))
        .unwrap();
    assert_eq!(first, vec![("a".to_owned(), 80), ("b".to_owned(), 20)]);
    let (_, revision) = client.read(&key).unwrap();
    let again = client
        .commit(&key, "agg0/7", &with_pool(&[("a".to_owned(), 100)], 100))
        .unwrap();
    assert_eq!(again, first, "a retried batch gets what it got");
    let (after, revision_after) = client.read(&key).unwrap();
    assert_eq!(revision_after, revision, "and writes nothing");
    let versions = history(&endpoints[0], &key).unwrap();
    assert_eq!(
        versions.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
        vec![revision],
        "the key's history is the one write"
    );
    assert_eq!(after.total(), 100);

    // --- Junk at a key: an error naming it, nothing granted or written.
    let junk_key = EtcdLedger::key(1, "shop", Minute(29_000_002));
    let etcd = Etcd::new(endpoints.clone(), CALL);
    assert!(etcd.swap(&junk_key, 0, b"{not a ledger").unwrap());
    let err = client
        .commit(&junk_key, "agg0/8", &with_pool(&[("a".to_owned(), 5)], 100))
        .unwrap_err();
    assert!(matches!(err, LedgerError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains(&junk_key), "{err}");
    assert_eq!(
        etcd.get(&junk_key).unwrap().value.as_deref(),
        Some(&b"{not a ledger"[..]),
        "the junk is left for the operator to look at"
    );
    // An empty ledger is not junk.
    let empty_key = EtcdLedger::key(1, "shop", Minute(29_000_003));
    let empty = serde_json::to_vec(&GrantLedger::default()).unwrap();
    assert!(etcd.swap(&empty_key, 0, &empty).unwrap());
    assert_eq!(
        client
            .commit(
                &empty_key,
                "agg0/9",
                &with_pool(&[("a".to_owned(), 5)], 100)
            )
            .unwrap(),
        vec![("a".to_owned(), 5)]
    );

    // --- Past minutes' ledgers are deleted, this room's only.
    for m in 29_000_100..29_000_104 {
        for room in ["shop", "shop2"] {
            client
                .commit(
                    &EtcdLedger::key(1, room, Minute(m)),
                    &format!("agg0/m{m}"),
                    &with_pool(&[("a".to_owned(), 1)], 10),
                )
                .unwrap();
        }
    }
    assert_eq!(
        client.forget_before(1, "shop", Minute(29_000_102)).unwrap(),
        2 + 3,
        "these two minutes, and the three keys above"
    );
    for m in 29_000_100..29_000_104 {
        let (shop, _) = client.read(&EtcdLedger::key(1, "shop", Minute(m))).unwrap();
        let (shop2, _) = client
            .read(&EtcdLedger::key(1, "shop2", Minute(m)))
            .unwrap();
        assert_eq!(shop.total(), u64::from(m >= 29_000_102), "shop, minute {m}");
        assert_eq!(shop2.total(), 1, "another room's minute {m} stays");
    }

    // --- Two of three members gone: no quorum, an error within the deadline.
    cluster.kill(0);
    cluster.kill(1);
    let started = Instant::now();
    let err = client
        .commit(&key, "agg0/10", &with_pool(&[("c".to_owned(), 1)], 200))
        .unwrap_err();
    let took = started.elapsed();
    eprintln!("without quorum: {err} after {took:?}");
    assert!(
        matches!(
            err,
            LedgerError::Deadline { .. } | LedgerError::Contended { .. }
        ),
        "{err}"
    );
    assert!(
        took < COMMIT + 3 * CALL + Duration::from_millis(500),
        "failed after {took:?}: the deadline is {COMMIT:?} plus one round of calls"
    );
}

#[test]
fn a_slow_member_is_passed_over_and_an_all_slow_etcd_grants_nothing_new_in_time() {
    if !require_etcd() {
        return;
    }
    let cluster = EtcdCluster::start("ledger-slow", 3).unwrap();
    let relays: Vec<TcpRelay> = cluster
        .endpoints()
        .iter()
        .map(|e| TcpRelay::start(e.trim_start_matches("http://").parse().unwrap()).unwrap())
        .collect();
    // A little above the aggregator's defaults (200 ms a call, 500 ms a
    // commit), for a loaded machine; the delays below are past them.
    let config = LedgerConfig {
        endpoints: relays
            .iter()
            .map(|r| format!("http://{}", r.listen))
            .collect(),
        epoch: 1,
        call_timeout_ms: 300,
        commit_deadline_ms: 600,
        batch_interval_ms: 0,
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let committer = runtime.block_on(async { Committer::start(&config, None) });
    let now = UnixMillis(waitroom_tests::minutes::unix_secs() * 1_000);
    let grant = |anywhere: u64| SharedGrant {
        room: RoomId::from_name("shop"),
        minute: now.minute(),
        used: (0, 0),
        held: (0, 2),
        colo_allowance: 0,
        anywhere_allowance: anywhere,
        budget: 100,
        holds: (0, 2),
    };
    let commit = |anywhere: u64| {
        let g = grant(anywhere);
        let started = Instant::now();
        let told = runtime.block_on(committer.commit("ams-1", &[("shop".to_owned(), g)]));
        (told[0].allowances, started.elapsed(), told[0].held_back)
    };
    let failures = || {
        committer
            .metrics
            .commit_failures_total
            .load(std::sync::atomic::Ordering::Relaxed)
    };

    // --- Fast: the grant is committed and told (once the new cluster
    // takes writes).
    let deadline = Instant::now() + Duration::from_secs(10);
    while commit(10).0 != (0, 10) {
        assert!(Instant::now() < deadline, "a fresh etcd takes commits");
        std::thread::sleep(Duration::from_millis(200));
    }
    let failures_before = failures();

    // --- The first member answers 1.5 s late: passed over once, then left
    // alone while the second answers.
    relays[0].set_delay_ms(1_500);
    let (told, took, held_back) = commit(11);
    assert!(!held_back);
    eprintln!("one slow member: the first commit took {took:?}");
    assert_eq!(told, (0, 11), "committed through the other members");
    let asked_slow = relays[0].sent();
    for anywhere in 12..17 {
        assert_eq!(commit(anywhere).0, (0, anywhere));
    }
    assert_eq!(
        relays[0].sent(),
        asked_slow,
        "the slow member was not asked again"
    );
    assert_eq!(failures(), failures_before);

    // --- Every member answers 700 ms late (past the call timeout): the
    // node is told what it holds within the commit's deadline, not after
    // three call timeouts (900 ms, near the node's 1 s wait).
    for relay in &relays {
        relay.set_delay_ms(700);
    }
    let (told, took, held_back) = commit(20);
    eprintln!("every member slow: answered in {took:?}");
    assert_eq!(told, (0, 2), "nothing new, what it holds");
    assert!(held_back, "and the node is told so");
    assert!(
        took < Duration::from_millis(600 + 250),
        "answered by the commit's deadline (and a scheduling slice), well within the node's 1 s wait: {took:?}"
    );
    assert!(failures() > failures_before);

    // --- Fast again: commits resume (after the 1 s backoff).
    for relay in &relays {
        relay.set_delay_ms(0);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while commit(21).0 != (0, 21) {
        assert!(
            Instant::now() < deadline,
            "commits resume once etcd is fast"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (caps, _) = ledger(&cluster.endpoints())
        .read(&EtcdLedger::key(1, "shop", now.minute()))
        .unwrap();
    assert_eq!(
        caps.caps.get("ams-1"),
        Some(&21),
        "etcd holds what was told"
    );
}

#[test]
fn another_epoch_is_fenced_off_and_a_new_epoch_starts_from_the_old_minute() {
    if !require_etcd() {
        return;
    }
    let cluster = EtcdCluster::start("ledger-epoch", 3).unwrap();
    let endpoints = cluster.endpoints();
    let etcd = Etcd::new(endpoints.clone(), CALL);
    let minute = Minute(29_000_200);
    let (old, new) = (ledger(&endpoints).fenced(1), ledger(&endpoints).fenced(2));
    let (old_key, new_key) = (
        EtcdLedger::key(1, "shop", minute),
        EtcdLedger::key(2, "shop", minute),
    );
    let asks = |node: &str, cap: u64| with_pool(&[(node.to_owned(), cap)], 100);
    assert!(
        old.check_fence().is_ok() && new.check_fence().is_ok(),
        "no fence yet"
    );

    // --- The first commit writes the fence with its epoch.
    assert_eq!(
        old.commit(&old_key, "old/1", &asks("a", 80)).unwrap(),
        vec![("a".to_owned(), 80)]
    );
    assert_eq!(
        etcd.get(EPOCH_KEY).unwrap().value.as_deref(),
        Some(&b"1"[..])
    );

    // --- An aggregator configured with epoch 2 (a typo, or started early)
    // is refused and writes nothing: it would keep a ledger of its own.
    let err = new.commit(&new_key, "new/1", &asks("b", 80)).unwrap_err();
    assert!(
        matches!(&err, LedgerError::Fenced { ours, theirs } if ours == "2" && theirs == "1"),
        "{err}"
    );
    assert!(err.to_string().contains("ledger.epoch"), "{err}");
    assert_eq!(
        etcd.get(&new_key).unwrap().mod_revision,
        0,
        "nothing written"
    );
    // Said at start too, before any commit (the aggregator's first answers
    // tell its nodes).
    assert!(
        matches!(new.check_fence(), Err(LedgerError::Fenced { ours, theirs }) if ours == "2" && theirs == "1")
    );
    assert!(old.check_fence().is_ok());

    // --- The operator moves the fence to 2 in the middle of the minute:
    // epoch 1 is refused from now on, and epoch 2's first commit of the
    // minute starts from epoch 1's 80, so b gets the 20 left.
    let fence = etcd.get(EPOCH_KEY).unwrap();
    assert!(etcd.swap(EPOCH_KEY, fence.mod_revision, b"2").unwrap());
    let err = old.commit(&old_key, "old/2", &asks("a", 90)).unwrap_err();
    assert!(
        matches!(&err, LedgerError::Fenced { ours, theirs } if ours == "1" && theirs == "2"),
        "{err}"
    );
    assert_eq!(old.read(&old_key).unwrap().0.total(), 80, "unchanged");
    assert_eq!(
        new.commit(&new_key, "new/2", &asks("b", 80)).unwrap(),
        vec![("b".to_owned(), 20)],
        "the old epoch's caps of the minute count"
    );
    let (caps, _) = new.read(&new_key).unwrap();
    assert_eq!(caps.caps.get("a"), Some(&80));
    assert_eq!(caps.total(), 100);

    // --- The next minute starts empty under epoch 2 (its minute under
    // epoch 1 was never written).
    let next = EtcdLedger::key(2, "shop", Minute(minute.0 + 1));
    assert_eq!(
        new.commit(&next, "new/3", &asks("b", 80)).unwrap(),
        vec![("b".to_owned(), 80)]
    );

    // --- Rooms sharded between two groups from epoch 3: the fence names
    // the groups too. An aggregator whose `shard.groups` lacks one (so it
    // believes it owns rooms the other group owns) is refused under the
    // right epoch; one with the same list, in another order, commits, and
    // starts from epoch 2's minute.
    let fence = etcd.get(EPOCH_KEY).unwrap();
    assert!(
        etcd.swap(EPOCH_KEY, fence.mod_revision, b"3 groups=eu,us")
            .unwrap()
    );
    let third = EtcdLedger::key(3, "shop", Minute(minute.0 + 1));
    let partial = ledger(&endpoints).fenced(3).sharded("eu".into());
    let err = partial.commit(&third, "eu/1", &asks("c", 10)).unwrap_err();
    assert!(
        matches!(&err, LedgerError::Fenced { ours, theirs } if ours == "3 groups=eu" && theirs == "3 groups=eu,us"),
        "{err}"
    );
    assert!(err.to_string().contains("shard.groups"), "{err}");
    assert_eq!(etcd.get(&third).unwrap().mod_revision, 0, "nothing written");
    let unsharded = ledger(&endpoints).fenced(3);
    assert!(matches!(
        unsharded.commit(&third, "plain/1", &asks("c", 10)),
        Err(LedgerError::Fenced { .. })
    ));
    let members = waitroom_common::shard::Membership::new("us", vec!["us".into(), "eu".into()])
        .unwrap()
        .canonical();
    let sharded = ledger(&endpoints).fenced(3).sharded(members);
    assert_eq!(
        sharded.commit(&third, "us/1", &asks("c", 40)).unwrap(),
        vec![("c".to_owned(), 20)],
        "b's 80 of epoch 2 count under epoch 3"
    );
}

/// `batch_interval_ms` bounds how often a room's value is rewritten: the
/// same waves of reports (5 nodes every 125 ms for a second) committed by a
/// committer without it and by one with 200 ms, on one etcd. Without it
/// each wave is a batch (unless the machine is slow enough to merge some);
/// with it there are at most one batch per 200 ms. Every node is told its
/// grant either way.
#[test]
fn a_batch_interval_bounds_how_often_a_room_is_written() {
    if !require_etcd() {
        return;
    }
    let cluster = EtcdCluster::start("ledger-interval", 3).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let now = UnixMillis(waitroom_tests::minutes::unix_secs() * 1_000);
    let waves = |interval_ms: u64, room: &str| -> (u64, u64) {
        let config = LedgerConfig {
            endpoints: cluster.endpoints(),
            epoch: 1,
            call_timeout_ms: 500,
            commit_deadline_ms: 500,
            batch_interval_ms: interval_ms,
        };
        runtime.block_on(async {
            let committer = std::sync::Arc::new(Committer::start(&config, None));
            // A fresh cluster takes its first write a little late.
            let warm = SharedGrant {
                room: RoomId::from_name(room),
                minute: now.minute(),
                used: (0, 0),
                held: (0, 0),
                colo_allowance: 0,
                anywhere_allowance: 1,
                budget: 1_000,
                holds: (0, 0),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while committer.commit("warm", &[(room.to_owned(), warm)]).await[0].allowances != (0, 1)
            {
                assert!(Instant::now() < deadline, "a fresh etcd takes commits");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let before = committer
                .metrics
                .batches_total
                .load(std::sync::atomic::Ordering::Relaxed);
            let mut tasks = Vec::new();
            for wave in 0..8_u64 {
                for n in 0..5_u64 {
                    let (committer, room) = (std::sync::Arc::clone(&committer), room.to_owned());
                    let grant = SharedGrant {
                        anywhere_allowance: 2 + n,
                        ..warm
                    };
                    tasks.push(tokio::spawn(async move {
                        let node = format!("node-{wave}-{n}");
                        committer.commit(&node, &[(room, grant)]).await[0].allowances == (0, 2 + n)
                    }));
                }
                tokio::time::sleep(Duration::from_millis(125)).await;
            }
            let mut told = 0;
            for task in tasks {
                told += u64::from(task.await.unwrap());
            }
            let batches = committer
                .metrics
                .batches_total
                .load(std::sync::atomic::Ordering::Relaxed)
                - before;
            (batches, told)
        })
    };
    let (plain, told) = waves(0, "shop");
    assert_eq!(told, 40, "every node told its grant");
    let (spaced, told) = waves(200, "shop2");
    assert_eq!(told, 40, "every node told its grant");
    eprintln!(
        "8 waves of 5 reports over 1 s: {plain} batches without an interval, {spaced} with 200 ms"
    );
    // The waves span 875 ms: at most one batch at 0, 200, …, 800 ms, and
    // one for a wave that came as the last began.
    assert!(spaced <= 6, "{spaced} batches with 200 ms between them");
}
