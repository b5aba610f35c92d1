//! The merge by full recomputation, as main's `Cluster::apply` did it before
//! the running sums (issue 15, item 4), with the colo-share ledger, the
//! clamp of both shared grants together, the split of a colo by recent
//! traffic and sessions counted per second: every merge runs [`aggregate`]
//! over every report of the room and keeps the reporting node's state;
//! departed nodes are found and stripped by a walk over all nodes. Kept,
//! test-only, as the reference the incremental [`Cluster`](super::Cluster)
//! must agree with exactly.
use std::collections::BTreeMap;

use super::{Lease, NodeMeta, RoomDef, RoomMemory, forget_live_counts};
use crate::{
    aggregate::{NodeReport, aggregate},
    room::RoomId,
    state::GlobalState,
    time::{Minute, UnixMillis},
    wire::RoomAnswer,
};

/// The aggregator's state, merged by full recomputation.
#[derive(Debug)]
pub(crate) struct Recomputing {
    pub(crate) rooms: Vec<RoomDef>,
    pub(crate) memory: BTreeMap<RoomId, RoomMemory>,
    pub(crate) reports: Vec<NodeReport>,
    pub(crate) meta: Vec<NodeMeta>,
    node_timeout_ms: u64,
    promises: super::PromisePolicy,
    /// The room's recent pace, as the running merge keeps it (a restart
    /// forgets it: it is not in a snapshot).
    pub(crate) pace: BTreeMap<RoomId, super::promise::RecentPace>,
}

impl Recomputing {
    pub(crate) fn new(rooms: Vec<RoomDef>, node_timeout_ms: u64) -> Self {
        let memory = rooms
            .iter()
            .map(|r| (r.room.id(), RoomMemory::default()))
            .collect();
        Self {
            rooms,
            memory,
            reports: Vec::new(),
            meta: Vec::new(),
            node_timeout_ms,
            promises: super::PromisePolicy::default(),
            pace: BTreeMap::new(),
        }
    }

    /// `Cluster::apply` before the running sums.
    /// `Cluster::apply_as` before the running sums: the promise of a node
    /// that asks on demand from the same rule and the same free parts.
    pub(crate) fn apply_as(
        &mut self,
        mut report: NodeReport,
        now: UnixMillis,
        asks: bool,
    ) -> Vec<RoomAnswer> {
        self.expire(now);
        report.rooms.retain(|r| self.memory.contains_key(&r.room));
        for room_report in &mut report.rooms {
            if let Some(def) = self.rooms.iter().find(|d| d.room.id() == room_report.room) {
                room_report.make_plausible(&def.room, now);
            }
        }
        let node = report.node.clone();
        let at = report.at;
        let previous_seen = self
            .reports
            .iter()
            .position(|r| r.node == node)
            .map(|i| super::Seen {
                seen: self.meta[i].last_seen,
                at: self.reports[i].at,
            });
        let previous_visitors =
            super::visitors_now(self.reports.iter().find(|r| r.node == node), now.minute());
        let index = match self.reports.iter().position(|r| r.node == node) {
            Some(i) => {
                self.reports[i] = report;
                let meta = &mut self.meta[i];
                meta.last_seen = now;
                meta.reports += 1;
                meta.departed = false;
                i
            }
            None => {
                self.reports.push(report);
                self.meta.push(NodeMeta {
                    last_seen: now,
                    reports: 1,
                    departed: false,
                });
                self.reports.len() - 1
            }
        };

        let minute = now.minute();
        let mut answers = Vec::new();
        for def in &self.rooms {
            if !self.reports[index]
                .rooms
                .iter()
                .any(|r| r.room == def.room.id())
            {
                continue;
            }
            let memory = self.memory.entry(def.room.id()).or_default();
            let states = aggregate(&def.room, &self.reports, &mut memory.history, now);
            let Some(mut state) = states
                .iter()
                .find(|(name, _)| *name == node)
                .map(|(_, s)| s.clone())
            else {
                continue;
            };
            let recent = self
                .pace
                .entry(def.room.id())
                .or_default()
                .observe(now, state.admitted_this_minute);
            let colo_alone =
                clamp_colo_share(&states, &node, &self.reports, &memory.colo_leases, minute);
            let any_alone = clamp_anywhere(&states, &node, &memory.leases, minute);
            let (mut colo_granted, mut granted) = clamp_shared(
                (colo_alone, any_alone),
                &states,
                &node,
                [&memory.colo_leases, &memory.leases],
                minute,
            );
            if asks && def.room.queueing_method() == crate::room::QueueingMethod::Fifo {
                let (total, _) = clamp_shared(
                    (u64::MAX, 0),
                    &states,
                    &node,
                    [&memory.colo_leases, &memory.leases],
                    minute,
                );
                let shared_slots = shared_pool(&states);
                let (colo_pool, colo_left) =
                    colo_free(&states, &node, &self.reports, &memory.colo_leases, minute);
                let (any_pool, any_left) = anywhere_free(&states, &node, &memory.leases, minute);
                let free = super::promise::Free::new(
                    colo_left,
                    any_left,
                    total,
                    (colo_pool, any_pool, shared_slots),
                );
                let leases = (memory.colo_leases.get(&node), memory.leases.get(&node));
                let room_report = self.reports[index]
                    .rooms
                    .iter()
                    .find(|r| r.room == def.room.id())
                    .expect("the room is in the report (checked above)");
                let need = self.promises.need_paced(
                    super::admitted_since(leases, state.used, minute).max(super::visitors_since(
                        &previous_visitors,
                        room_report,
                        minute,
                    )),
                    super::elapsed_since(previous_seen, at, now),
                    super::promise::Pace::of(&state, def.room.at(now).new_users_per_minute(), now)
                        .with_recent(recent),
                );
                (colo_granted, granted) =
                    self.promises.promise((colo_granted, granted), free, need);
            }
            state.allowance.anywhere = granted;
            state.allowance.colo_share = colo_granted;
            memory.colo_leases.insert(
                node.clone(),
                Lease {
                    minute,
                    used_at_grant: state.used.colo_share,
                    allowance: colo_granted,
                },
            );
            memory.leases.insert(
                node.clone(),
                Lease {
                    minute,
                    used_at_grant: state.used.anywhere,
                    allowance: granted,
                },
            );
            answers.push(RoomAnswer {
                room: def.room.id(),
                state,
            });
        }
        answers
    }

    /// `Cluster::expire` before the running sums.
    pub(crate) fn expire(&mut self, now: UnixMillis) {
        let minute = now.minute();
        for (report, meta) in self.reports.iter_mut().zip(&mut self.meta) {
            if !meta.departed && now.0.saturating_sub(meta.last_seen.0) > self.node_timeout_ms {
                meta.departed = true;
                for memory in self.memory.values_mut() {
                    memory.leases.remove(&report.node);
                    memory.colo_leases.remove(&report.node);
                }
            }
            if meta.departed {
                for room in &mut report.rooms {
                    forget_live_counts(room, now);
                }
            }
        }
        let mut i = 0;
        while i < self.reports.len() {
            let gone = self.meta[i].departed
                && self.reports[i]
                    .rooms
                    .iter()
                    .all(|r| r.expiries.is_empty() && r.admits.iter().all(|a| a.minute < minute));
            if gone {
                self.reports.swap_remove(i);
                self.meta.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }
}

/// The Anywhere slots `node` may be granted: what the engine gives it this
/// round, but never more than the round's pool minus what other nodes still
/// hold unused from their own leases.
fn clamp_anywhere(
    states: &[(String, GlobalState)],
    node: &str,
    leases: &BTreeMap<String, Lease>,
    minute: Minute,
) -> u64 {
    let engine = states
        .iter()
        .find(|(name, _)| name == node)
        .map_or(0, |(_, s)| s.allowance.anywhere);
    engine.min(anywhere_free(states, node, leases, minute).1)
}

/// The round's Anywhere pool, and that pool minus what other nodes still hold unused.
fn anywhere_free(
    states: &[(String, GlobalState)],
    node: &str,
    leases: &BTreeMap<String, Lease>,
    minute: Minute,
) -> (u64, u64) {
    let pool: u64 = states
        .iter()
        .fold(0_u64, |t, (_, s)| t.saturating_add(s.allowance.anywhere));
    let held: u64 = states
        .iter()
        .filter(|(name, _)| name != node)
        .filter_map(|(name, s)| {
            leases
                .get(name)
                .map(|l| l.outstanding(minute, s.used.anywhere))
        })
        .fold(0_u64, u64::saturating_add);
    (pool, pool.saturating_sub(held))
}

/// The round's shared slots: every node's colo share and Anywhere part.
fn shared_pool(states: &[(String, GlobalState)]) -> u64 {
    states.iter().fold(0_u64, |sum, (_, s)| {
        sum.saturating_add(s.allowance.colo_share)
            .saturating_add(s.allowance.anywhere)
    })
}

/// Both shared grants of `node` together, `(colo_share, anywhere)`, cut to
/// the round's shared slots minus what every other node still holds unused
/// of both its leases (Anywhere first). Each pool has its own ledger, but
/// the pools' sizes move between rounds (a colo's rounding remainder goes to
/// Anywhere), so two grants each within their own pool could still add up
/// to more than the minute's limit.
fn clamp_shared(
    (colo, anywhere): (u64, u64),
    states: &[(String, GlobalState)],
    node: &str,
    [colo_leases, leases]: [&BTreeMap<String, Lease>; 2],
    minute: Minute,
) -> (u64, u64) {
    let pool = shared_pool(states);
    let mut held = 0_u64;
    for (name, state) in states {
        if name != node {
            let outstanding = |leases: &BTreeMap<String, Lease>, used| {
                leases
                    .get(name)
                    .map_or(0, |l: &Lease| l.outstanding(minute, used))
            };
            held = held
                .saturating_add(outstanding(colo_leases, state.used.colo_share))
                .saturating_add(outstanding(leases, state.used.anywhere));
        }
    }
    let room = pool.saturating_sub(held);
    let anywhere = anywhere.min(room.saturating_sub(colo));
    (colo.min(room), anywhere)
}

/// The colo-share slots `node` may be granted: what the engine gives it
/// this round, but never more than its colo's slots this round minus what
/// the colo's other nodes still hold unused from their own leases. The
/// engine splits a colo by each node's recent traffic, which moves between
/// rounds; without this, a node handed a larger part now and one still
/// holding its larger part of an earlier round could together admit more
/// than the colo's slots (and the room's limit).
fn clamp_colo_share(
    states: &[(String, GlobalState)],
    node: &str,
    reports: &[NodeReport],
    leases: &BTreeMap<String, Lease>,
    minute: Minute,
) -> u64 {
    let engine = states
        .iter()
        .find(|(name, _)| name == node)
        .map_or(0, |(_, s)| s.allowance.colo_share);
    engine.min(colo_free(states, node, reports, leases, minute).1)
}

/// `node`'s colo's slots this round, and those minus what its other nodes still hold.
fn colo_free(
    states: &[(String, GlobalState)],
    node: &str,
    reports: &[NodeReport],
    leases: &BTreeMap<String, Lease>,
    minute: Minute,
) -> (u64, u64) {
    let colos: BTreeMap<&str, &str> = reports
        .iter()
        .map(|r| (r.node.as_str(), r.colo.as_str()))
        .collect();
    let colo_of = |name: &str| colos.get(name).copied();
    let Some(colo) = colo_of(node) else {
        return (0, 0);
    };
    let (mut pool, mut held) = (0_u64, 0_u64);
    for (name, state) in states
        .iter()
        .filter(|(name, _)| colo_of(name) == Some(colo))
    {
        pool = pool.saturating_add(state.allowance.colo_share);
        if name != node
            && let Some(lease) = leases.get(name)
        {
            held = held.saturating_add(lease.outstanding(minute, state.used.colo_share));
        }
    }
    (pool, pool.saturating_sub(held))
}
