//! The merge as it was before the running sums (issue 15, item 4): every
//! merge runs [`aggregate`] over every report of the room and keeps the
//! reporting node's state; departed nodes are found and stripped by a walk
//! over all nodes. Kept, test-only, as the reference the incremental
//! [`Cluster`](super::Cluster) must agree with exactly.
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
        }
    }

    /// `Cluster::apply` before the running sums.
    pub(crate) fn apply(&mut self, mut report: NodeReport, now: UnixMillis) -> Vec<RoomAnswer> {
        self.expire(now);
        report.rooms.retain(|r| self.memory.contains_key(&r.room));
        for room_report in &mut report.rooms {
            if let Some(def) = self.rooms.iter().find(|d| d.room.id() == room_report.room) {
                room_report.make_plausible(&def.room, now);
            }
        }
        let node = report.node.clone();
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
            let granted = clamp_anywhere(&states, &node, &memory.leases, minute);
            state.allowance.anywhere = granted;
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
                }
            }
            if meta.departed {
                for room in &mut report.rooms {
                    forget_live_counts(room, minute);
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
    let engine = states
        .iter()
        .find(|(name, _)| name == node)
        .map_or(0, |(_, s)| s.allowance.anywhere);
    engine.min(pool.saturating_sub(held))
}
