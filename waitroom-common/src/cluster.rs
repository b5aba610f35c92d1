//! What the aggregator remembers: the latest report of every node, each
//! room's history, and the Anywhere leases it has granted.
//!
//! [`Cluster::apply`] takes one node's report and returns that node's state
//! per room. The answer is exactly what the engine's
//! [`aggregate`](crate::aggregate::aggregate()) over every report would give
//! that node, but kept in running sums per room (`running`): the node's
//! previous report is taken out and the new one added, so a merge costs one
//! report's entries and a round of N reports close to O(N), not O(N²) (issue 15;
//! figures in docs/BENCHMARKS.md, "Aggregation cost"). This module decides
//! *which* reports take part (live nodes, and what is left of departed ones)
//! and keeps the ledgers (Anywhere and colo-share leases) honest across rounds; `aggregate` stays the
//! reference (the simulator's ledger check, `/status`, and the test-only
//! `recompute` copy of the old merge that the proptests compare against).
//!
//! # Departed nodes
//! A node silent for longer than `node_timeout_ms` is *departed*: its live
//! counts (queue, traffic) no longer take part, but its session expiries and
//! this minute's admits do, because the visitors it admitted are still on the
//! site until their sessions end, and the minute's admits still count against
//! the new-users limit. A departed node is forgotten once nothing of it counts.
//!
//! # The Anywhere ledger
//! The engine splits each round's Anywhere pool between all nodes. Nodes hear
//! back at different moments, so one node may still hold the lease of an
//! earlier round while another is handed a part of the same slots again. The
//! ledger records every lease granted (per room, per node) and clamps each new
//! grant to the pool minus what other nodes still hold unused, so the leases
//! outstanding never add up to more than the pool. A lease is for one minute:
//! it lapses when its holder's next answer replaces it, and one of a departed
//! node lapses with the node (whose own view went stale before that, see
//! `stale_after_ms` on the node).
use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::{
    aggregate::{AggregateHistory, NodeReport, RoomReport, aggregate, totals},
    counters::PoolCounts,
    estimate::WaitEstimate,
    phase::{RoomPhase, arrival_estimate},
    room::{QueueingMethod, Room, RoomId},
    slots::{SlotInputs, SlotPlan},
    state::GlobalState,
    time::{ExpirySlot, Minute, UnixMillis},
};
use serde::{Deserialize, Serialize};

use crate::wire::{HeldLease, HeldVisitors, RoomAnswer};

pub mod grants;
pub mod promise;
#[cfg(test)]
mod recompute;
mod running;

pub use promise::PromisePolicy;

use running::{Live, NodeKey, RoomSums};

/// A room the aggregator serves: its name (as in the nodes' configs) and limits.
#[derive(Debug, Clone)]
pub struct RoomDef {
    pub name: String,
    pub room: Room,
}

/// Anywhere slots granted to one node for one minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The minute of the state that carried the lease.
    pub minute: Minute,
    /// The node's Anywhere admits in that minute when the lease was granted.
    pub used_at_grant: u64,
    /// Further Anywhere admits granted.
    pub allowance: u64,
}

impl Lease {
    /// Slots of this lease the holder has not used by `minute`, given its
    /// Anywhere admits in that minute. Mirrors `GlobalState::cap`: in the
    /// lease's minute the cap is `used_at_grant + allowance`; once the minute
    /// has rolled, the node applies the bare allowance to its fresh counters
    /// until its next answer arrives.
    #[must_use]
    pub fn outstanding(&self, minute: Minute, used: u64) -> u64 {
        let cap = if self.minute == minute {
            self.used_at_grant.saturating_add(self.allowance)
        } else {
            self.allowance
        };
        cap.saturating_sub(used)
    }

    /// The cap of this lease in `minute`: `used_at_grant + allowance` in the
    /// lease's own minute, the bare allowance in any other.
    fn cap_in(&self, minute: Minute) -> u64 {
        if self.minute == minute {
            self.used_at_grant.saturating_add(self.allowance)
        } else {
            self.allowance
        }
    }

    /// One lease of `minute` that counts at least as much as each of `a`
    /// and `b` does, this minute and later, for a holder with `used` admits
    /// this minute: this minute the larger cap, later the larger of that
    /// cap's rest and either bare allowance. What a ledger counts for a node
    /// that may hold either until it says which.
    #[must_use]
    pub fn covering(a: &Self, b: &Self, minute: Minute, used: u64) -> Self {
        let cap = a.cap_in(minute).max(b.cap_in(minute));
        let allowance = cap
            .saturating_sub(used)
            .max(a.allowance)
            .max(b.allowance)
            .min(cap);
        Self {
            minute,
            used_at_grant: cap - allowance,
            allowance,
        }
    }

    /// The lease `held` names for one of its pools (Anywhere with
    /// `anywhere`, else the colo share), each part never taken as more than
    /// `limit`.
    fn from_held(held: &HeldLease, anywhere: bool, limit: u64) -> Self {
        let (allowance, used) = if anywhere {
            (held.anywhere, held.anywhere_used)
        } else {
            (held.colo_share, held.colo_share_used)
        };
        Self {
            minute: held.minute,
            used_at_grant: used.min(limit),
            allowance: allowance.min(limit),
        }
    }
}

/// Bookkeeping about a node besides its report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeMeta {
    /// The aggregator's clock at the node's last report.
    pub last_seen: UnixMillis,
    /// Reports received from the node by this aggregator (and its snapshots).
    pub reports: u64,
    /// Silent for longer than the timeout: only its sessions still count.
    pub departed: bool,
}

/// What the aggregator keeps per room between rounds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RoomMemory {
    pub history: AggregateHistory,
    /// Anywhere leases by node.
    pub leases: BTreeMap<String, Lease>,
    /// Colo-share leases by node: the same bookkeeping for each colo's
    /// slots, which the nodes of one colo are handed by their recent traffic
    /// (so two answers a round apart may split the colo differently).
    #[serde(default)]
    pub colo_leases: BTreeMap<String, Lease>,
}

/// What the aggregator keeps per room between rounds, as a merge uses it:
/// [`RoomMemory`] with the leases found by node number (`Cluster::ids`)
/// rather than by name. A merge looks a node's leases up six times per room;
/// by name, in a `BTreeMap` of every node, that was a fifth of a merge's
/// cost at 1,000 nodes (`cargo bench -p waitroom-common --features std
/// --bench aggregation`). A snapshot writes them by name.
#[derive(Debug, Clone, Default)]
struct RoomBook {
    history: AggregateHistory,
    /// Anywhere leases: `leases[id]`, the node numbered `id`'s.
    leases: Vec<Option<Lease>>,
    /// Colo-share leases, the same way.
    colo_leases: Vec<Option<Lease>>,
    /// The room's admits at recent instants of the minute (not in a
    /// snapshot: a restarted aggregator measures it again within a second).
    pace: promise::RecentPace,
}

impl RoomBook {
    /// The node numbered `id`'s leases, `(colo share, Anywhere)`.
    fn leases_of(&self, id: u32) -> (Option<&Lease>, Option<&Lease>) {
        (lease_at(&self.colo_leases, id), lease_at(&self.leases, id))
    }

    /// The node numbered `id` holds no lease any more.
    fn forget(&mut self, id: u32) {
        for leases in [&mut self.leases, &mut self.colo_leases] {
            if let Some(lease) = leases.get_mut(id as usize) {
                *lease = None;
            }
        }
    }
}

fn lease_at(leases: &[Option<Lease>], id: u32) -> Option<&Lease> {
    leases.get(id as usize)?.as_ref()
}

/// Puts `lease` in `leases` for the node numbered `id`, returning the one it
/// replaces.
fn put_lease(leases: &mut Vec<Option<Lease>>, id: u32, lease: Lease) -> Option<Lease> {
    let at = id as usize;
    if leases.len() <= at {
        leases.resize(at + 1, None);
    }
    leases[at].replace(lease)
}

/// The aggregator's whole state. Not thread-safe by itself: the server holds
/// it behind one mutex, taken for the microseconds of one merge.
#[derive(Debug)]
pub struct Cluster {
    rooms: Vec<RoomDef>,
    memory: BTreeMap<RoomId, RoomBook>,
    /// Latest report per node, in the order the engine takes them.
    reports: Vec<NodeReport>,
    /// `meta[i]` is about `reports[i]`.
    meta: Vec<NodeMeta>,
    node_timeout_ms: u64,
    /// (node, room) pairs already warned about, so the log is not flooded.
    unknown_rooms: BTreeSet<(String, RoomId)>,
    /// Corrections made to reported numbers (see [`crate::plausible`]):
    /// entries dropped for a future minute, counts clamped.
    implausible: [u64; 2],
    /// Nodes marked departed (silent past the timeout) since the start.
    departures: u64,
    /// The last minute a correction was logged for each node: at most one
    /// warning per node per minute, however often it sends nonsense.
    implausible_logged: BTreeMap<String, Minute>,
    /// Per room, the sums of all `reports` (see [`running`]): a merge adds
    /// and takes away one node's entries instead of summing every node's.
    sums: BTreeMap<RoomId, RoomSums>,
    /// Node name → its index in `reports`.
    positions: HashMap<String, usize>,
    /// `ids[i]`: a number for `reports[i]` that stays while the node is known.
    ids: Vec<u32>,
    next_id: u32,
    /// Numbers of forgotten nodes, handed to new ones first: the numbers
    /// stay below the most nodes known at once, so the running sums can
    /// keep their items in lists indexed by them.
    free_ids: Vec<u32>,
    /// Colo name → a number, for the running sums.
    colo_ids: HashMap<String, u32>,
    /// Nodes not departed, by the time of their last report: the ones to
    /// mark departed are at the front.
    by_last_seen: BTreeSet<(UnixMillis, String)>,
    /// Departed nodes.
    departed: BTreeSet<String>,
    /// Every departed node has been stripped of what no longer counts at
    /// this second (expiry slot) or a later one.
    stripped: Option<ExpirySlot>,
    /// What a node that asks on demand is promised (see [`promise`]).
    promises: PromisePolicy,
    /// The grants of the last merge, for a shared ledger (with
    /// [`Cluster::with_shared_ledger`]).
    last_grants: Vec<SharedGrant>,
    /// Whether grants are recorded for a shared ledger.
    shared_ledger: bool,
    /// Until then nobody is granted more than it holds (see
    /// [`Cluster::learn_until`]).
    learning_until: Option<UnixMillis>,
}

/// Who a merge grants to, and how it asked.
struct Grantee<'a> {
    node: String,
    /// It asks on demand (`Message::LeaseReport`, or a home report that asks).
    asks: bool,
    /// The leases it says it holds (`Message::HomeReport`); `None` for a
    /// report that does not say.
    held: Option<&'a [HeldLease]>,
    /// When its previous report was taken in, and made.
    previous_seen: Option<Seen>,
    /// When it made this report.
    at: UnixMillis,
    /// Its distinct visitors this minute by its previous report (a node
    /// that asks).
    previous_visitors: Vec<(RoomId, u64)>,
    /// The visitors it holds now for this answer, per room
    /// (`Message::HeldReport`; none for any other report).
    held_visitors: &'a [HeldVisitors],
}

/// One grant of a merge, as a shared grant ledger takes it
/// ([`grants::GrantLedger`], docs/adr/0001): both shared pools (colo share
/// and Anywhere) together, since two aggregators race on both. The ledger
/// records one cap per node, what the node may admit this minute over both
/// pools; every node's cap together must stay within `budget`.
///
/// Until the answer reaches it the node still holds its last leases, and it
/// spends each pool on the larger of its old and new cap (the new one
/// counts from the admits of the report, not of the moment it arrives). So
/// the cap to record is, per pool, the larger of what it holds and what it
/// is granted ([`Lease::covering`]), summed; and a cut takes back only what
/// lowers that sum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedGrant {
    pub room: RoomId,
    pub minute: Minute,
    /// The node's admits this minute per pool (colo share, Anywhere).
    pub used: (u64, u64),
    /// The caps this minute of the leases the node holds per pool (by its
    /// home report; by this aggregator's record for a report that does not
    /// say).
    pub held: (u64, u64),
    pub colo_allowance: u64,
    pub anywhere_allowance: u64,
    /// The minute's shared budget over every node, as this aggregator sees
    /// it: the shared admits every node reported this minute, the round's
    /// free shared slots, less what leases of an earlier minute that other
    /// nodes still hold may admit (a node uses such a lease's allowance
    /// until its next answer).
    pub budget: u64,
    /// What the node holds and has not used (colo share, Anywhere): what it
    /// keeps when no ledger can be written (nothing new is granted then).
    pub holds: (u64, u64),
}

impl SharedGrant {
    /// The grant's allowances (colo share, Anywhere).
    #[must_use]
    pub fn allowances(&self) -> (u64, u64) {
        (self.colo_allowance, self.anywhere_allowance)
    }

    /// The cap to record for the node: [`SharedGrant::record_with`] the
    /// grant's allowances.
    #[must_use]
    pub fn record(&self) -> u64 {
        self.record_with(self.colo_allowance, self.anywhere_allowance)
    }

    /// The least that can be recorded, whatever is cut: what the node has
    /// admitted or holds ([`SharedGrant::record_with`] no allowance).
    #[must_use]
    pub fn floor(&self) -> u64 {
        self.record_with(0, 0)
    }

    /// The node's ask of a shared ledger for this grant.
    #[must_use]
    pub fn ask(&self, node: &str) -> grants::Ask {
        grants::Ask {
            node: node.to_owned(),
            cap: self.record(),
            pool: self.budget,
            floor: self.floor(),
        }
    }

    /// What the node may admit this minute over both pools with these
    /// allowances: per pool the larger of the cap it holds and the new one.
    #[must_use]
    pub fn record_with(&self, colo_allowance: u64, anywhere_allowance: u64) -> u64 {
        let colo = self.held.0.max(self.used.0.saturating_add(colo_allowance));
        let anywhere = self
            .held
            .1
            .max(self.used.1.saturating_add(anywhere_allowance));
        colo.saturating_add(anywhere)
    }

    /// The allowances (colo share, Anywhere) when the ledger recorded `cap`
    /// for the node: the grant cut until its record fits, Anywhere first.
    /// A part of an allowance under what the node holds anyway lowers
    /// nothing and is kept.
    #[must_use]
    pub fn cut_to(&self, cap: u64) -> (u64, u64) {
        let mut over = self.record().saturating_sub(cap);
        let above = |held: u64, used: u64, allowance: u64| {
            used.saturating_add(allowance)
                .saturating_sub(held.max(used))
                .min(allowance)
        };
        let anywhere_cut = over.min(above(self.held.1, self.used.1, self.anywhere_allowance));
        over -= anywhere_cut;
        let colo_cut = over.min(above(self.held.0, self.used.0, self.colo_allowance));
        (
            self.colo_allowance - colo_cut,
            self.anywhere_allowance - anywhere_cut,
        )
    }
}

/// A node's shared-pool admits (colo share and Anywhere) since its leases
/// were granted, by its admits `used` this minute: all of this minute's when
/// the leases are of an earlier one (or there are none).
pub(crate) fn admitted_since(
    (colo_lease, lease): (Option<&Lease>, Option<&Lease>),
    used: PoolCounts,
    minute: Minute,
) -> u64 {
    let since = |lease: Option<&Lease>, used: u64| {
        lease
            .filter(|l| l.minute == minute)
            .map_or(used, |l| used.saturating_sub(l.used_at_grant))
    };
    since(colo_lease, used.colo_share).saturating_add(since(lease, used.anywhere))
}

/// The number of `colo` for the running sums, given on first sight.
fn intern(colo_ids: &mut HashMap<String, u32>, colo: &str) -> u32 {
    if let Some(&id) = colo_ids.get(colo) {
        return id;
    }
    let id = colo_ids.len() as u32;
    colo_ids.insert(colo.to_owned(), id);
    id
}

/// Each room's distinct visitors this minute in `report` (the node's
/// previous report), to tell how many came since.
pub(crate) fn visitors_now(report: Option<&NodeReport>, minute: Minute) -> Vec<(RoomId, u64)> {
    report.map_or_else(Vec::new, |r| {
        r.rooms
            .iter()
            .map(|room| (room.room, distinct_in(room, minute)))
            .collect()
    })
}

fn distinct_in(room: &RoomReport, minute: Minute) -> u64 {
    room.distinct_visitors
        .iter()
        .find(|&&(m, _)| m == minute)
        .map_or(0, |&(_, n)| n)
}

/// New visitors (distinct this minute) since the previous report: unlike
/// admits, not cut short by a promise that ran out, so a burst shows at its
/// full rate in the first request for more.
pub(crate) fn visitors_since(
    previous: &[(RoomId, u64)],
    report: &RoomReport,
    minute: Minute,
) -> u64 {
    let before = previous
        .iter()
        .find(|&&(room, _)| room == report.room)
        .map_or(0, |&(_, n)| n);
    distinct_in(report, minute).saturating_sub(before)
}

/// When the aggregator took in a node's report (`seen`) and when the node
/// made it (`at`, the node's own time).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seen {
    pub seen: UnixMillis,
    pub at: UnixMillis,
}

/// Milliseconds the counts since the node's previous report were made in,
/// the report made at `at` taken in `now`: between the two reports' own
/// times, and no further back than this minute's start. Not between the
/// times the aggregator took them in: a periodic report can spend longer on
/// its way than an out-of-cycle ask that follows it on a fresher connection
/// (in the simulator 500 ms against 10 ms), and then the counts of a second
/// and a half read as made in half a second (the quiet node of the 7:1
/// burst at 1,200 nodes was promised three times what it used). When the
/// node's times do not move forward (a report overtaken by a later one),
/// the aggregator's are used, as before.
pub(crate) fn elapsed_since(previous: Option<Seen>, at: UnixMillis, now: UnixMillis) -> u64 {
    let into_minute = now.0 % crate::time::MILLIS_PER_MINUTE;
    previous.map_or(into_minute, |p| {
        let made = if at > p.at {
            at.0 - p.at.0
        } else {
            now.0.saturating_sub(p.seen.0)
        };
        made.min(into_minute)
    })
}

/// Status of one room, for `/status`.
#[derive(Debug, Clone, Serialize)]
pub struct RoomStatus {
    pub id: String,
    pub room_id: u64,
    pub total_active_users: u64,
    pub new_users_per_minute: u64,
    /// The scheduled event in force ([`crate::phase::event_phase`]).
    #[serde(default)]
    pub event_phase: Option<String>,
    pub active_users: u64,
    pub admitted_this_minute: u64,
    pub slots_available: u64,
    pub total_waiting: u64,
    pub admits_per_minute: f64,
    /// The room's admits a second over the last half second to second, as
    /// promises are paced by ([`promise::RecentPace`]); `None` until the
    /// aggregator has such a window in this minute.
    pub recent_admits_per_second: Option<f64>,
    /// Anywhere slots leased and not yet used, by all nodes.
    pub anywhere_leased: u64,
    pub nodes_reporting: usize,
    /// Queueing or not, or what a setting makes of the room.
    pub phase: RoomPhase,
    /// What a visitor arriving now would be told (the engine's estimate).
    pub wait_estimate: WaitEstimate,
    /// Each reporting node's own counts, so a dashboard can show where the
    /// visitors are (by node, and summed by colo) without a second source.
    pub per_node: Vec<RoomNodeStatus>,
}

/// One node's counts in one room, as its last report says.
#[derive(Debug, Clone, Serialize)]
pub struct RoomNodeStatus {
    pub node: String,
    pub colo: String,
    /// Silent past the timeout: only its sessions and this minute's admits
    /// still count.
    pub departed: bool,
    pub active_users: u64,
    pub admitted_this_minute: u64,
    pub total_waiting: u64,
}

/// Status of one node, for `/status`.
#[derive(Debug, Clone, Serialize)]
pub struct NodeStatus {
    pub node: String,
    pub colo: String,
    pub last_report_age_ms: u64,
    pub reports: u64,
    pub departed: bool,
    /// Active users counted on this node (its signed share of the sum).
    pub active_users: i64,
}

/// Everything `/status` shows.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub at: UnixMillis,
    pub rooms: Vec<RoomStatus>,
    pub nodes: Vec<NodeStatus>,
}

/// The on-disk form of a [`Cluster`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Layout of this struct; a snapshot of another layout is not restored.
    pub version: u32,
    pub taken_at: UnixMillis,
    pub nodes: Vec<(NodeReport, NodeMeta)>,
    pub rooms: Vec<(RoomId, RoomMemory)>,
}

/// Current snapshot layout. 2: reports hold session expiries per
/// [`crate::time::ExpirySlot`]; a snapshot of 1 (expiry minutes) is refused, not misread:
/// the state rebuilds from the nodes' next reports.
pub const SNAPSHOT_VERSION: u32 = 2;

impl Cluster {
    #[must_use]
    pub fn new(rooms: Vec<RoomDef>, node_timeout_ms: u64) -> Self {
        let memory = rooms
            .iter()
            .map(|r| (r.room.id(), RoomBook::default()))
            .collect();
        let mut cluster = Self {
            rooms,
            memory,
            reports: Vec::new(),
            meta: Vec::new(),
            node_timeout_ms,
            unknown_rooms: BTreeSet::new(),
            implausible: [0; 2],
            departures: 0,
            implausible_logged: BTreeMap::new(),
            sums: BTreeMap::new(),
            positions: HashMap::new(),
            ids: Vec::new(),
            next_id: 0,
            free_ids: Vec::new(),
            colo_ids: HashMap::new(),
            by_last_seen: BTreeSet::new(),
            departed: BTreeSet::new(),
            stripped: None,
            promises: PromisePolicy::default(),
            last_grants: Vec::new(),
            shared_ledger: false,
            learning_until: None,
        };
        cluster.rebuild(None);
        cluster
    }

    /// The same cluster promising nodes that ask on demand by `policy`.
    #[must_use]
    pub fn with_promises(mut self, policy: PromisePolicy) -> Self {
        self.promises = policy;
        self
    }

    /// The same cluster recording each merge's grants for a shared ledger
    /// ([`Cluster::shared_grants`]; computing each grant's budget walks the
    /// room's leases, which a cluster without one does not pay for).
    #[must_use]
    pub fn with_shared_ledger(mut self) -> Self {
        self.shared_ledger = true;
        self
    }

    /// The running sums and indexes recomputed from `reports`, `meta` and
    /// the leases (after a restore), with the minute view for `minute`.
    fn rebuild(&mut self, minute: Option<Minute>) {
        self.sums = self
            .rooms
            .iter()
            .map(|def| (def.room.id(), RoomSums::default()))
            .collect();
        self.positions = self
            .reports
            .iter()
            .enumerate()
            .map(|(i, r)| (r.node.clone(), i))
            .collect();
        self.ids = (0..self.reports.len() as u32).collect();
        self.next_id = self.reports.len() as u32;
        self.free_ids.clear();
        self.by_last_seen = self
            .reports
            .iter()
            .zip(&self.meta)
            .filter(|(_, m)| !m.departed)
            .map(|(r, m)| (m.last_seen, r.node.clone()))
            .collect();
        self.departed = self
            .reports
            .iter()
            .zip(&self.meta)
            .filter(|(_, m)| m.departed)
            .map(|(r, _)| r.node.clone())
            .collect();
        self.stripped = None;
        for i in 0..self.reports.len() {
            self.account(i, 1, true);
        }
        if let Some(minute) = minute {
            self.refresh(minute);
        }
    }

    /// Adds (`sign` = 1) or takes away (−1) `reports[i]` from the running
    /// sums: all of it, or (`counts` false) only its minute view.
    fn account(&mut self, i: usize, sign: i64, counts: bool) {
        let report = &self.reports[i];
        let colo = intern(&mut self.colo_ids, &report.colo);
        let key = NodeKey {
            id: self.ids[i],
            colo,
            position: i,
        };
        for (j, room) in report.rooms.iter().enumerate() {
            // The merge reads the first entry of a room, as `aggregate` does.
            if report.rooms[..j].iter().any(|r| r.room == room.room) {
                continue;
            }
            let Some(sums) = self.sums.get_mut(&room.room) else {
                continue;
            };
            if counts {
                sums.account_counts(room, sign);
            }
            let leases = self
                .memory
                .get(&room.room)
                .map_or((None, None), |m| m.leases_of(key.id));
            sums.account_live(room, key, leases, sign);
        }
    }

    /// Puts `report` in place of `reports[i]` (the same node's) and in the
    /// running sums, as `account(i, -1, true)`, the swap and
    /// `account(i, 1, true)` would, but looking each room's leases up once
    /// and changing the sums of session expiries by the difference of the
    /// two reports in one walk ([`running::KeyedSums::replace`]).
    fn replace_report(&mut self, i: usize, report: NodeReport) {
        let old = std::mem::replace(&mut self.reports[i], report);
        let new = &self.reports[i];
        let key = |colo| NodeKey {
            id: self.ids[i],
            colo,
            position: i,
        };
        let old_key = key(intern(&mut self.colo_ids, &old.colo));
        let new_key = key(intern(&mut self.colo_ids, &new.colo));
        // The merge reads the first entry of a room, as `aggregate` does.
        let first =
            |rooms: &[RoomReport], j: usize| rooms[..j].iter().all(|r| r.room != rooms[j].room);
        for (j, room) in new.rooms.iter().enumerate() {
            if !first(&new.rooms, j) {
                continue;
            }
            let Some(sums) = self.sums.get_mut(&room.room) else {
                continue;
            };
            let leases = self
                .memory
                .get(&room.room)
                .map_or((None, None), |m| m.leases_of(new_key.id));
            match old.rooms.iter().find(|r| r.room == room.room) {
                Some(before) if old_key.colo == new_key.colo => {
                    sums.replace_counts(before, room);
                    sums.replace_live(before, room, new_key, leases);
                }
                Some(before) => {
                    sums.replace_counts(before, room);
                    sums.account_live(before, old_key, leases, -1);
                    sums.account_live(room, new_key, leases, 1);
                }
                None => {
                    sums.account_counts(room, 1);
                    sums.account_live(room, new_key, leases, 1);
                }
            }
        }
        for (j, room) in old.rooms.iter().enumerate() {
            if !first(&old.rooms, j) || new.rooms.iter().any(|r| r.room == room.room) {
                continue;
            }
            let Some(sums) = self.sums.get_mut(&room.room) else {
                continue;
            };
            let leases = self
                .memory
                .get(&room.room)
                .map_or((None, None), |m| m.leases_of(old_key.id));
            sums.account_counts(room, -1);
            sums.account_live(room, old_key, leases, -1);
        }
    }

    /// Makes the minute views of every room describe `minute`, rebuilding
    /// them from every report when the minute changed (once a minute).
    fn refresh(&mut self, minute: Minute) {
        let fresh = |s: &RoomSums| s.live.as_ref().is_some_and(|l| l.minute == minute);
        if self.sums.values().all(fresh) {
            return;
        }
        for sums in self.sums.values_mut() {
            sums.live = Some(Live::new(minute));
        }
        for i in 0..self.reports.len() {
            self.account(i, 1, false);
        }
    }

    /// Nodes marked departed (silent past `node_timeout_ms`) since start.
    #[must_use]
    pub fn departures_total(&self) -> u64 {
        self.departures
    }

    /// Corrections made to reported numbers since start.
    #[must_use]
    pub fn implausible_total(&self) -> u64 {
        self.implausible[0].saturating_add(self.implausible[1])
    }

    /// Corrections since start by reason: `("future_minute", n)` for entries
    /// dropped, `("clamped", n)` for counts brought down to their bound.
    #[must_use]
    pub fn implausible_by_reason(&self) -> [(&'static str, u64); 2] {
        [
            ("future_minute", self.implausible[0]),
            ("clamped", self.implausible[1]),
        ]
    }

    /// Brings every number of `report` into what its rooms allow, counting
    /// and (once per node per minute) logging each correction.
    fn check_plausible(&mut self, report: &mut NodeReport, now: UnixMillis) {
        for room_report in &mut report.rooms {
            let Some(def) = self.rooms.iter().find(|d| d.room.id() == room_report.room) else {
                continue;
            };
            let found = room_report.make_plausible(&def.room, now);
            if found.is_empty() {
                continue;
            }
            for correction in &found {
                let i = match correction.problem {
                    crate::plausible::ImplausibleKind::FutureMinute => 0,
                    crate::plausible::ImplausibleKind::Clamped { .. } => 1,
                };
                self.implausible[i] = self.implausible[i].saturating_add(1);
            }
            let minute = now.minute();
            let logged = self.implausible_logged.get(&report.node);
            if logged != Some(&minute) {
                self.implausible_logged.insert(report.node.clone(), minute);
                tracing::warn!(
                    node = %report.node,
                    room = %def.name,
                    corrections = found.len(),
                    first = %found[0],
                    "node reported impossible numbers; corrected before merging (further warnings for this node suppressed this minute)"
                );
            }
        }
    }

    /// Takes new limits for the same rooms (a reload): the rooms' memory
    /// and the nodes' reports stay; the next answers use the new limits.
    /// Refused, changing nothing, when a room was added, removed or renamed.
    pub fn set_rooms(&mut self, rooms: Vec<RoomDef>) -> Result<(), RoomsChangeError> {
        let ids = |defs: &[RoomDef]| -> Vec<(String, RoomId)> {
            defs.iter().map(|d| (d.name.clone(), d.room.id())).collect()
        };
        if ids(&self.rooms) != ids(&rooms) {
            let names = |defs: &[RoomDef]| defs.iter().map(|d| d.name.clone()).collect();
            return Err(RoomsChangeError::Ids {
                before: names(&self.rooms),
                after: names(&rooms),
            });
        }
        self.rooms = rooms;
        Ok(())
    }

    fn index_of(&self, node: &str) -> Option<usize> {
        self.positions.get(node).copied()
    }

    /// Takes one node's report at `now` and returns its state per room.
    ///
    /// Rooms the aggregator does not serve are dropped from the report (and
    /// warned about once); the node gets no state for them.
    ///
    /// The answers are exactly what [`aggregate`] over every report gives
    /// the node (then clamped by the ledger), but computed from the running
    /// sums: the node's previous report is taken away and this one added,
    /// so a merge costs this report's entries, not every node's.
    pub fn apply(&mut self, report: NodeReport, now: UnixMillis) -> Vec<RoomAnswer> {
        self.apply_as(report, now, false, None, &[])
    }

    /// [`Cluster::apply`] for a node that asks on demand when its promise
    /// runs out (`Message::LeaseReport`): its shared grants are what its
    /// recent admits need, not its fair part, so the rest stays in reserve
    /// for whoever asks next ([`promise`]). Out-of-cycle reports are the
    /// asking; they are merged like any other.
    pub fn apply_asking(&mut self, report: NodeReport, now: UnixMillis) -> Vec<RoomAnswer> {
        self.apply_as(report, now, true, None, &[])
    }

    /// [`Cluster::apply`] (or, with `asks`, [`Cluster::apply_asking`]) for
    /// a report that says which leases the node holds
    /// (`Message::HomeReport`). Until its next report, the node's leases
    /// count as the larger of what it holds and what this answer grants
    /// ([`Lease::covering`]): the answer may be lost, and then the node
    /// still holds the old lease. Without this, an aggregator that lowered a
    /// node's cap and whose answer was lost counted the lower cap and handed
    /// the difference to others; and one restarted from an old snapshot did
    /// not know the grants made since it was taken. Each part of a claim
    /// (admits at grant, allowance) is capped at the room's per-minute
    /// limit, so a lying node can hold the room while its claim stands but
    /// cannot overflow the ledger.
    pub fn apply_holding(
        &mut self,
        report: NodeReport,
        held: &[HeldLease],
        asks: bool,
        now: UnixMillis,
    ) -> Vec<RoomAnswer> {
        self.apply_as(report, now, asks, Some(held), &[])
    }

    /// [`Cluster::apply_holding`] for a node that asks and says how many
    /// visitors it holds now for this answer (`Message::HeldReport`): in
    /// each room it is promised at least that many, within what the ledgers
    /// leave (held visitors may take more than half of what is left, a
    /// forecast may not: `PromisePolicy::promise_holding`). Its counts alone cannot say so when it reports again after a
    /// lost answer: the visitors it holds were counted by the report whose
    /// answer was lost, so none is new since, and at 1,200 nodes an idle
    /// node is promised nothing (`cargo xtask simulate --preset hostile
    /// --colos 300 --nodes-per-colo 4`, the steady scenario).
    pub fn apply_held(
        &mut self,
        report: NodeReport,
        held: &[HeldLease],
        held_visitors: &[HeldVisitors],
        now: UnixMillis,
    ) -> Vec<RoomAnswer> {
        self.apply_as(report, now, true, Some(held), held_visitors)
    }

    /// Until `until`, no node is granted more than the leases it holds (by
    /// its home report; for a node whose reports do not say, by this
    /// ledger's record), so a ledger that may have forgotten grants (an
    /// aggregator restarted, from a snapshot or none) learns them from the
    /// nodes' reports before it grants from its pools again. Google's
    /// Doorman runs such a learning mode after a failover; unlike Doorman's,
    /// nobody is given what it claims beyond what it holds.
    pub fn learn_until(&mut self, until: UnixMillis) {
        self.learning_until = Some(until);
    }

    /// Whether the ledger is still learning at `now` ([`Cluster::learn_until`]).
    #[must_use]
    pub fn learning(&self, now: UnixMillis) -> bool {
        self.learning_until.is_some_and(|until| now < until)
    }

    /// The grants of the last [`Cluster::apply`] (or `apply_asking`,
    /// `apply_holding`), one per room answered, with
    /// [`Cluster::with_shared_ledger`]; empty without.
    #[must_use]
    pub fn shared_grants(&self) -> &[SharedGrant] {
        &self.last_grants
    }

    /// A shared ledger set the cap of `grant` (to the node `node`) lower than
    /// the grant: the node is answered the allowances `(colo share,
    /// Anywhere)` instead ([`SharedGrant::cut_to`]; in `answers`, the
    /// answer to its report), and this ledger counts no more than that in a
    /// pool that was cut, so what was cut is free for the next grant.
    pub fn settle_shared(
        &mut self,
        node: &str,
        grant: &SharedGrant,
        allowances: (u64, u64),
        answers: &mut [RoomAnswer],
    ) {
        for answer in answers.iter_mut().filter(|a| a.room == grant.room) {
            (
                answer.state.allowance.colo_share,
                answer.state.allowance.anywhere,
            ) = allowances;
        }
        let Some(index) = self.index_of(node) else {
            return;
        };
        let Some(room_report) = self.reports[index]
            .rooms
            .iter()
            .find(|r| r.room == grant.room)
        else {
            return;
        };
        let (Some(memory), Some(sums)) = (
            self.memory.get_mut(&grant.room),
            self.sums.get_mut(&grant.room),
        ) else {
            return;
        };
        let colo = self.colo_ids.get(&self.reports[index].colo).copied();
        let key = NodeKey {
            id: self.ids[index],
            colo: colo.unwrap_or(u32::MAX),
            position: index,
        };
        // Per pool: only a pool whose allowance was cut changes, and only
        // down to the cut grant, which never goes under what the node holds
        // (`SharedGrant::cut_to`). A pool left alone keeps the lease this
        // ledger counts, which may cover a larger one the node still holds:
        // replacing it too under-counted the node until its next report.
        let lower = |local: &Lease, used: u64, held: u64, granted: u64, told: u64| {
            let cut = Lease {
                minute: grant.minute,
                used_at_grant: used,
                allowance: told,
            };
            let cap = cut.cap_in(grant.minute);
            if told < granted && cap < local.cap_in(grant.minute) && cap >= held {
                cut
            } else {
                *local
            }
        };
        if let Some(Some(local)) = memory.colo_leases.get_mut(key.id as usize) {
            let old = *local;
            *local = lower(
                &old,
                grant.used.0,
                grant.held.0,
                grant.colo_allowance,
                allowances.0,
            );
            let new = *local;
            sums.swap_colo_lease(room_report, key, Some(&old), Some(&new));
        }
        if let Some(Some(local)) = memory.leases.get_mut(key.id as usize) {
            let old = *local;
            *local = lower(
                &old,
                grant.used.1,
                grant.held.1,
                grant.anywhere_allowance,
                allowances.1,
            );
            let new = *local;
            sums.swap_lease(room_report, Some(&old), Some(&new));
        }
    }

    /// What leases of a minute before `minute`, held by nodes other than
    /// the one at `index` of `reports`, may still admit in `minute`: each
    /// its bare allowance less the holder's admits this minute
    /// ([`Lease::outstanding`]).
    fn earlier_leases_outstanding(
        memory: &RoomBook,
        reports: &[NodeReport],
        ids: &[u32],
        room: RoomId,
        index: usize,
        minute: Minute,
    ) -> u64 {
        let mut sum = 0_u64;
        for (i, (report, &id)) in reports.iter().zip(ids).enumerate() {
            if i == index {
                continue;
            }
            let (colo_lease, lease) = memory.leases_of(id);
            let (colo_lease, lease) = (
                colo_lease.filter(|l| l.minute != minute),
                lease.filter(|l| l.minute != minute),
            );
            if colo_lease.is_none() && lease.is_none() {
                continue;
            }
            let used = report
                .rooms
                .iter()
                .find(|r| r.room == room)
                .map(|r| running::admits_in(r, minute))
                .unwrap_or_default();
            for (lease, used) in [(lease, used.anywhere), (colo_lease, used.colo_share)] {
                if let Some(lease) = lease {
                    sum = sum.saturating_add(lease.outstanding(minute, used));
                }
            }
        }
        sum
    }

    /// A report from a node whose home is another aggregator
    /// (`Message::PeerReport`, a cluster of several aggregators): merged
    /// like any report, so this aggregator's picture holds every node, but
    /// nothing is granted. The node's leases in both ledgers become the
    /// ones it says it holds from its home (none if it names none), so the
    /// nodes this aggregator grants to are never given what the node holds.
    /// A lease of another minute counts as the node uses it: its bare
    /// allowance against this minute's admits, until its home's next answer
    /// replaces it (as the home's own ledger counts it, [`Lease::outstanding`]).
    /// Ignoring it let a peer hand its own nodes, at every minute's start,
    /// the slots a node still held from the last minute's lease. A claim is
    /// never taken as more than the room's per-minute limit.
    pub fn apply_peer(&mut self, report: NodeReport, held: &[HeldLease], now: UnixMillis) {
        // A peer's merge grants nothing.
        self.last_grants.clear();
        let (index, ..) = self.merge(report, now, false);
        let minute = now.minute();
        self.refresh(minute);
        let colo = self.colo_ids.get(&self.reports[index].colo).copied();
        let key = NodeKey {
            id: self.ids[index],
            colo: colo.unwrap_or(u32::MAX),
            position: index,
        };
        for def in &self.rooms {
            let id = def.room.id();
            let Some(room_report) = self.reports[index].rooms.iter().find(|r| r.room == id) else {
                continue;
            };
            let (Some(memory), Some(sums)) = (self.memory.get_mut(&id), self.sums.get_mut(&id))
            else {
                continue;
            };
            let cap = def.room.at(now).new_users_per_minute();
            let held = held.iter().find(|h| h.room == id).copied();
            let lease = |minute: Minute, allowance: u64, used: u64| Lease {
                minute,
                used_at_grant: used,
                allowance: allowance.min(cap),
            };
            let none = lease(minute, 0, 0);
            let new_colo = held.map_or(none, |h| lease(h.minute, h.colo_share, h.colo_share_used));
            let new = held.map_or(none, |h| lease(h.minute, h.anywhere, h.anywhere_used));
            let old_colo = put_lease(&mut memory.colo_leases, key.id, new_colo);
            sums.swap_colo_lease(room_report, key, old_colo.as_ref(), Some(&new_colo));
            let old = put_lease(&mut memory.leases, key.id, new);
            sums.swap_lease(room_report, old.as_ref(), Some(&new));
        }
    }

    fn apply_as(
        &mut self,
        report: NodeReport,
        now: UnixMillis,
        asks: bool,
        held: Option<&[HeldLease]>,
        held_visitors: &[HeldVisitors],
    ) -> Vec<RoomAnswer> {
        let at = report.at;
        let (index, node, previous_seen, previous_visitors) = self.merge(report, now, asks);
        self.grant(
            index,
            Grantee {
                node,
                asks,
                held,
                previous_seen,
                at,
                previous_visitors,
                held_visitors,
            },
            now,
        )
    }

    /// Takes `report` into the cluster (its node's previous one out of the
    /// running sums, this one in): the node's index, its name, when its
    /// previous report was taken in and made, and (for a node that asks) its
    /// visitors before.
    fn merge(
        &mut self,
        mut report: NodeReport,
        now: UnixMillis,
        asks: bool,
    ) -> (usize, String, Option<Seen>, Vec<(RoomId, u64)>) {
        self.expire(now);
        report.rooms.retain(|r| {
            let known = self.memory.contains_key(&r.room);
            if !known && self.unknown_rooms.insert((report.node.clone(), r.room)) {
                tracing::warn!(node = %report.node, room = r.room.0, "node reports a room this aggregator does not serve; ignoring it");
            }
            known
        });
        self.check_plausible(&mut report, now);
        let node = report.node.clone();
        let previous_seen = self.index_of(&node).map(|i| Seen {
            seen: self.meta[i].last_seen,
            at: self.reports[i].at,
        });
        let previous_visitors = if asks {
            visitors_now(self.index_of(&node).map(|i| &self.reports[i]), now.minute())
        } else {
            Vec::new()
        };
        let index = match self.index_of(&node) {
            Some(i) => {
                let meta = &mut self.meta[i];
                if meta.departed {
                    tracing::info!(%node, "departed node is back");
                    self.departed.remove(&node);
                } else {
                    self.by_last_seen.remove(&(meta.last_seen, node.clone()));
                }
                meta.last_seen = now;
                meta.reports += 1;
                meta.departed = false;
                self.by_last_seen.insert((now, node.clone()));
                self.replace_report(i, report);
                i
            }
            None => {
                tracing::info!(%node, colo = %report.colo, "first report from node");
                self.reports.push(report);
                self.meta.push(NodeMeta {
                    last_seen: now,
                    reports: 1,
                    departed: false,
                });
                let id = self.free_ids.pop().unwrap_or_else(|| {
                    let id = self.next_id;
                    self.next_id = self.next_id.wrapping_add(1);
                    id
                });
                self.ids.push(id);
                let i = self.reports.len() - 1;
                self.positions.insert(node.clone(), i);
                self.by_last_seen.insert((now, node.clone()));
                self.account(i, 1, true);
                i
            }
        };
        (index, node, previous_seen, previous_visitors)
    }

    /// This round's answers for the node at `index`: its state per room,
    /// with what the ledgers grant it.
    fn grant(&mut self, index: usize, grantee: Grantee<'_>, now: UnixMillis) -> Vec<RoomAnswer> {
        let Grantee {
            node,
            asks,
            held,
            previous_seen,
            at,
            previous_visitors,
            held_visitors,
        } = grantee;
        let minute = now.minute();
        let learning = self.learning(now);
        self.last_grants.clear();
        self.refresh(minute);
        let colo = self.colo_ids.get(&self.reports[index].colo).copied();
        let key = NodeKey {
            id: self.ids[index],
            colo: colo.unwrap_or(u32::MAX),
            position: index,
        };
        let mut answers = Vec::with_capacity(self.rooms.len());
        for def in &self.rooms {
            let id = def.room.id();
            let Some(room_report) = self.reports[index].rooms.iter().find(|r| r.room == id) else {
                continue;
            };
            let (Some(memory), Some(sums)) = (self.memory.get_mut(&id), self.sums.get_mut(&id))
            else {
                continue;
            };
            let active = u64::try_from(sums.expiries.sum_from(now.expiry_slot())).unwrap_or(0);
            let admitted = sums.admits.total_in(minute);
            let waiting: Vec<(Minute, u64)> = sums.waiting.positive().collect();
            memory
                .history
                .admit_rate
                .fold_until(minute, |m| sums.admits.total_in(m));
            let recent = memory.pace.observe(now, admitted);
            // The plan without colos: what is shared between colos and
            // Anywhere is split by the running sums below.
            // The limits in force now (a scheduled event's overrides).
            let room_now = def.room.at(now);
            let plan = SlotPlan::new(SlotInputs {
                total_active_users: room_now.total_active_users(),
                new_users_per_minute: room_now.new_users_per_minute(),
                active_users: active,
                admitted_this_minute: admitted,
                random: room_now.queueing_method() == QueueingMethod::Random,
                waiting: &waiting,
                traffic: &[],
                anywhere_weight: 0,
            });
            let leases = memory.leases_of(key.id);
            let Some(shares) = sums.shares(minute, plan.shared_slots, room_report, key, leases)
            else {
                continue;
            };
            let used = room_report
                .admits
                .iter()
                .find(|a| a.minute == minute)
                .map(|a| a.admits)
                .unwrap_or_default();
            let mut state = GlobalState::from_plan(
                now,
                active,
                admitted,
                &plan,
                memory.history.admit_rate.per_minute,
                used,
                PoolCounts {
                    eligible: plan.fully_eligible,
                    colo_share: shares.colo_share,
                    anywhere: shares.anywhere,
                    uncapped: 0,
                },
            );
            // The ledgers: each grant never more than its pool minus what
            // the other nodes still hold of their own leases of it (the colo
            // share within the node's colo), then both together never more
            // than the round's shared slots minus what the other nodes hold
            // of both (Anywhere cut first), as `clamp_shared` did.
            let colo_alone = shares
                .colo_share
                .min(shares.colo_pool.saturating_sub(shares.colo_held_in_colo));
            let any_alone = shares
                .anywhere
                .min(shares.pool.saturating_sub(shares.held_by_others));
            let room_left = plan.shared_slots.saturating_sub(
                shares
                    .colo_held_by_others
                    .saturating_add(shares.held_by_others),
            );
            let mut granted = any_alone.min(room_left.saturating_sub(colo_alone));
            let mut colo_granted = colo_alone.min(room_left);
            // Small promises in FIFO rooms only: in a random room a visitor
            // queued anywhere sends every new visitor to the lottery, so a
            // node running dry early would queue the whole room.
            if asks && def.room.queueing_method() == QueueingMethod::Fifo {
                // The visitors it holds now need a slot each, whatever its
                // counts say, and may take more than half of what is left
                // (`Cluster::apply_held`).
                let holds_now = held_visitors
                    .iter()
                    .filter(|h| h.room == id)
                    .fold(0_u64, |n, h| n.saturating_add(h.visitors));
                let need = self.promises.need_paced(
                    admitted_since(leases, state.used, minute).max(visitors_since(
                        &previous_visitors,
                        room_report,
                        minute,
                    )),
                    elapsed_since(previous_seen, at, now),
                    promise::Pace::of(&state, room_now.new_users_per_minute(), now)
                        .with_recent(recent),
                );
                let free = promise::Free::new(
                    shares.colo_pool.saturating_sub(shares.colo_held_in_colo),
                    shares.pool.saturating_sub(shares.held_by_others),
                    room_left,
                    (shares.colo_pool, shares.pool, plan.shared_slots),
                );
                (colo_granted, granted) =
                    self.promises
                        .promise_holding((colo_granted, granted), free, need, holds_now);
            }
            // What the node holds: by its report, or (a report that does
            // not say) by this ledger's record.
            let limit = room_now.new_users_per_minute();
            let claim = held.map(|held| {
                let h = held.iter().find(|h| h.room == id);
                (
                    h.map(|h| Lease::from_held(h, false, limit)),
                    h.map(|h| Lease::from_held(h, true, limit)),
                )
            });
            let holding = claim.unwrap_or((leases.0.copied(), leases.1.copied()));
            let rests = {
                let (colo_holds, holds) = holding;
                let rest = |lease: Option<Lease>, used: u64| {
                    lease.map_or(0, |l| l.outstanding(minute, used))
                };
                (
                    rest(colo_holds, state.used.colo_share),
                    rest(holds, state.used.anywhere),
                )
            };
            if learning {
                colo_granted = colo_granted.min(rests.0);
                granted = granted.min(rests.1);
            }
            tracing::debug!(
                %node,
                room = %def.name,
                engine = state.allowance.anywhere,
                granted,
                used = state.used.anywhere,
                colo_share = state.allowance.colo_share,
                eligible = state.allowance.eligible,
                slots = state.slots_available,
                "Anywhere lease"
            );
            state.allowance.anywhere = granted;
            state.allowance.colo_share = colo_granted;
            // What the node keeps when no shared ledger can be written.
            let holds = (colo_granted.min(rests.0), granted.min(rests.1));
            let mut new_colo = Lease {
                minute,
                used_at_grant: state.used.colo_share,
                allowance: colo_granted,
            };
            let mut new = Lease {
                minute,
                used_at_grant: state.used.anywhere,
                allowance: granted,
            };
            if let Some((colo_holds, holds)) = claim {
                if let Some(h) = colo_holds {
                    new_colo = Lease::covering(&h, &new_colo, minute, state.used.colo_share);
                }
                if let Some(h) = holds {
                    new = Lease::covering(&h, &new, minute, state.used.anywhere);
                }
            }
            if self.shared_ledger {
                let earlier = Self::earlier_leases_outstanding(
                    memory,
                    &self.reports,
                    &self.ids,
                    id,
                    index,
                    minute,
                );
                let (colo_lease, lease) = holding;
                let cap = |lease: Option<Lease>| lease.map_or(0, |l| l.cap_in(minute));
                self.last_grants.push(SharedGrant {
                    room: id,
                    minute,
                    used: (state.used.colo_share, state.used.anywhere),
                    held: (cap(colo_lease), cap(lease)),
                    colo_allowance: colo_granted,
                    anywhere_allowance: granted,
                    budget: sums
                        .admits
                        .shared_in(minute)
                        .saturating_add(plan.shared_slots)
                        .saturating_sub(earlier),
                    holds,
                });
            }
            let old_colo = put_lease(&mut memory.colo_leases, key.id, new_colo);
            sums.swap_colo_lease(room_report, key, old_colo.as_ref(), Some(&new_colo));
            let old = put_lease(&mut memory.leases, key.id, new);
            sums.swap_lease(room_report, old.as_ref(), Some(&new));
            answers.push(RoomAnswer { room: id, state });
        }
        answers
    }

    /// The aggregator's wall clock stepped by `step_ms` (positive: forward)
    /// without that much time passing: every node's last report moves with
    /// it, so a node's silence (`node_timeout_ms`) stays what it really was.
    /// Without this a step forward past the timeout would mark every node
    /// departed at the next merge and drop the leases they hold, which the
    /// first nodes to report could then be granted again.
    pub fn shift_clock(&mut self, step_ms: i64) {
        for meta in &mut self.meta {
            meta.last_seen = UnixMillis(meta.last_seen.0.saturating_add_signed(step_ms));
        }
        self.by_last_seen = self
            .by_last_seen
            .iter()
            .map(|(seen, node)| {
                (
                    UnixMillis(seen.0.saturating_add_signed(step_ms)),
                    node.clone(),
                )
            })
            .collect();
    }

    /// Marks nodes silent for longer than the timeout as departed, keeps only
    /// what still counts of them, and forgets those of whom nothing does.
    pub fn expire(&mut self, now: UnixMillis) {
        let (minute, slot) = (now.minute(), now.expiry_slot());
        let fresh = |s: &RoomSums| s.live.as_ref().is_some_and(|l| l.minute == minute);
        if !self.sums.values().all(fresh) {
            // Rebuilt below, once, after the changes.
            for sums in self.sums.values_mut() {
                sums.live = None;
            }
        }
        let mut check = Vec::new();
        while let Some((seen, node)) = self.by_last_seen.first().cloned() {
            if now.0.saturating_sub(seen.0) <= self.node_timeout_ms {
                break;
            }
            self.by_last_seen.pop_first();
            let Some(i) = self.index_of(&node) else {
                continue;
            };
            self.account(i, -1, true);
            let report = &mut self.reports[i];
            self.meta[i].departed = true;
            self.departures += 1;
            tracing::warn!(node = %report.node, colo = %report.colo, silent_ms = now.0.saturating_sub(seen.0),
                "node silent past node_timeout_ms: forgetting its live counts, keeping its sessions");
            for memory in self.memory.values_mut() {
                memory.forget(self.ids[i]);
            }
            for room in &mut report.rooms {
                forget_live_counts(room, now);
            }
            self.account(i, 1, true);
            self.departed.insert(node.clone());
            // Stripped at this second only: an earlier mark covers it no more.
            self.stripped = self.stripped.map(|s| s.min(slot));
            check.push(node);
        }
        if self.stripped.is_none_or(|s| slot > s) {
            // A new second: the departed nodes' sessions that ended in the
            // last one go (and at a new minute, what they held for it).
            let departed: Vec<String> = self.departed.iter().cloned().collect();
            for node in departed {
                let Some(i) = self.index_of(&node) else {
                    continue;
                };
                self.account(i, -1, true);
                for room in &mut self.reports[i].rooms {
                    forget_live_counts(room, now);
                }
                self.account(i, 1, true);
                check.push(node);
            }
            self.stripped = Some(slot);
        }
        // Forgotten as the reference loop forgets them: the lowest index
        // first, the last report moving into its place.
        let mut gone: BTreeSet<usize> = check
            .iter()
            .filter_map(|node| self.index_of(node))
            .filter(|&i| {
                self.meta[i].departed
                    && self.reports[i].rooms.iter().all(|r| {
                        r.expiries.is_empty() && r.admits.iter().all(|a| a.minute < minute)
                    })
            })
            .collect();
        while let Some(i) = gone.pop_first() {
            let node = self.reports[i].node.clone();
            tracing::info!(%node, "departed node's sessions have all ended; forgotten");
            self.account(i, -1, true);
            let last = self.reports.len() - 1;
            if i != last {
                self.account(last, -1, true);
            }
            self.reports.swap_remove(i);
            self.meta.swap_remove(i);
            let id = self.ids.swap_remove(i);
            for memory in self.memory.values_mut() {
                memory.forget(id);
            }
            self.free_ids.push(id);
            self.positions.remove(&node);
            self.departed.remove(&node);
            if i != last {
                self.positions.insert(self.reports[i].node.clone(), i);
                self.account(i, 1, true);
                if gone.remove(&last) {
                    gone.insert(i);
                }
            }
        }
        self.refresh(minute);
    }

    /// Rooms served, in config order.
    #[must_use]
    pub fn rooms(&self) -> &[RoomDef] {
        &self.rooms
    }

    /// What `/status` and `/metrics` show.
    #[must_use]
    pub fn status(&self, now: UnixMillis) -> Status {
        let minute = now.minute();
        let rooms = self
            .rooms
            .iter()
            .map(|def| {
                let id = def.room.id();
                let reporting: Vec<&RoomReport> = self
                    .reports
                    .iter()
                    .filter_map(|n| n.rooms.iter().find(|r| r.room == id))
                    .collect();
                let sums = totals(reporting.iter().copied(), now);
                // A throwaway copy of the history: showing status must not fold minutes.
                let memory = self.memory.get(&id);
                let mut history = memory.map(|m| m.history.clone()).unwrap_or_default();
                let states = aggregate(&def.room, &self.reports, &mut history, now);
                let any: Option<&GlobalState> = states.first().map(|(_, s)| s);
                let room_now = def.room.at(now);
                let (phase, wait_estimate) = match any {
                    Some(state) => (
                        RoomPhase::of(&room_now, state),
                        arrival_estimate(&room_now, state, minute),
                    ),
                    None => {
                        let empty = GlobalState::empty(now);
                        (
                            RoomPhase::of(&room_now, &empty),
                            arrival_estimate(&room_now, &empty, minute),
                        )
                    }
                };
                let per_node = self
                    .reports
                    .iter()
                    .zip(&self.meta)
                    .filter_map(|(n, meta)| {
                        let report = n.rooms.iter().find(|r| r.room == id)?;
                        let sums = totals([report], now);
                        Some(RoomNodeStatus {
                            node: n.node.clone(),
                            colo: n.colo.clone(),
                            departed: meta.departed,
                            active_users: sums.active_users,
                            admitted_this_minute: sums.admitted_this_minute,
                            total_waiting: sums
                                .waiting
                                .iter()
                                .fold(0_u64, |t, &(_, n)| t.saturating_add(n)),
                        })
                    })
                    .collect();
                let anywhere_leased = states
                    .iter()
                    .filter_map(|(node, s)| {
                        let id = self.ids[self.index_of(node)?];
                        memory
                            .and_then(|m| m.leases_of(id).1)
                            .map(|l| l.outstanding(minute, s.used.anywhere))
                    })
                    .fold(0_u64, u64::saturating_add);
                RoomStatus {
                    id: def.name.clone(),
                    room_id: id.0,
                    total_active_users: room_now.total_active_users(),
                    new_users_per_minute: room_now.new_users_per_minute(),
                    event_phase: crate::phase::event_phase(&def.room, &room_now),
                    active_users: sums.active_users,
                    admitted_this_minute: sums.admitted_this_minute,
                    slots_available: any.map_or(0, |s| s.slots_available),
                    total_waiting: sums
                        .waiting
                        .iter()
                        .fold(0_u64, |t, &(_, n)| t.saturating_add(n)),
                    admits_per_minute: history.admit_rate.per_minute,
                    recent_admits_per_second: memory.and_then(|m| m.pace.per_second(now)),
                    anywhere_leased,
                    nodes_reporting: reporting.len(),
                    phase,
                    wait_estimate,
                    per_node,
                }
            })
            .collect();
        let nodes = self
            .reports
            .iter()
            .zip(&self.meta)
            .map(|(report, meta)| NodeStatus {
                node: report.node.clone(),
                colo: report.colo.clone(),
                last_report_age_ms: now.0.saturating_sub(meta.last_seen.0),
                reports: meta.reports,
                departed: meta.departed,
                active_users: report
                    .rooms
                    .iter()
                    .flat_map(|r| &r.expiries)
                    .filter(|&&(s, _)| s >= now.expiry_slot())
                    .fold(0_i64, |t, &(_, n)| t.saturating_add(n)),
            })
            .collect();
        Status {
            at: now,
            rooms,
            nodes,
        }
    }

    /// The state to write to disk.
    #[must_use]
    pub fn snapshot(&self, now: UnixMillis) -> Snapshot {
        Snapshot {
            version: SNAPSHOT_VERSION,
            taken_at: now,
            nodes: self
                .reports
                .iter()
                .cloned()
                .zip(self.meta.iter().cloned())
                .collect(),
            rooms: self
                .memory
                .iter()
                .map(|(id, book)| (*id, self.remembered(book)))
                .collect(),
        }
    }

    /// A room's book as a snapshot keeps it: the leases by node name.
    fn remembered(&self, book: &RoomBook) -> RoomMemory {
        let by_name = |leases: &[Option<Lease>]| -> BTreeMap<String, Lease> {
            self.reports
                .iter()
                .zip(&self.ids)
                .filter_map(|(report, &id)| Some((report.node.clone(), *lease_at(leases, id)?)))
                .collect()
        };
        RoomMemory {
            history: book.history.clone(),
            leases: by_name(&book.leases),
            colo_leases: by_name(&book.colo_leases),
        }
    }

    /// Takes over a snapshot written by an earlier run. Rooms no longer
    /// served are dropped; nodes silent for too long become departed on the
    /// next [`Cluster::expire`], exactly as if this process had never stopped.
    /// Takes over a snapshot at `now`, checking every number in it as a
    /// report is checked: impossible entries are dropped or clamped, a
    /// snapshot from the future is refused, and what was corrected is
    /// returned for the log (the room stays usable either way).
    pub fn restore(
        &mut self,
        snapshot: Snapshot,
        now: UnixMillis,
    ) -> Result<Vec<String>, RestoreError> {
        if snapshot.version != SNAPSHOT_VERSION {
            return Err(RestoreError::Version {
                found: snapshot.version,
                expected: SNAPSHOT_VERSION,
            });
        }
        if snapshot.taken_at.0 > now.0.saturating_add(crate::time::MILLIS_PER_MINUTE) {
            return Err(RestoreError::FromTheFuture {
                taken_at: snapshot.taken_at,
                now,
            });
        }
        let mut dropped = Vec::new();
        let mut restored = Vec::new();
        for (id, mut memory) in snapshot.rooms {
            let Some(def) = self.rooms.iter().find(|d| d.room.id() == id) else {
                dropped.push(format!("room {}: not served by this aggregator", id.0));
                continue;
            };
            let rate = memory.history.admit_rate.per_minute;
            if !rate.is_finite() || !(0.0..=crate::plausible::MAX_COUNT as f64).contains(&rate) {
                dropped.push(format!("room {}: admit rate {rate}: reset", def.name));
                memory.history = AggregateHistory::default();
            }
            let (_, per_minute) = crate::plausible::node_bounds(&def.room);
            let plausible = |node: &String, lease: &Lease, dropped: &mut Vec<String>| {
                let ok = lease.allowance <= per_minute
                    && lease.used_at_grant <= per_minute
                    && lease.minute <= now.minute().plus(1);
                if !ok {
                    dropped.push(format!(
                        "room {}: lease of node {node} ({lease:?}): dropped",
                        def.name
                    ));
                }
                ok
            };
            memory
                .colo_leases
                .retain(|node, lease| plausible(node, lease, &mut dropped));
            memory
                .leases
                .retain(|node, lease| plausible(node, lease, &mut dropped));
            restored.push((id, def.name.clone(), memory));
        }
        self.reports.clear();
        self.meta.clear();
        self.positions.clear();
        for (mut report, mut meta) in snapshot.nodes {
            report.rooms.retain(|r| self.memory.contains_key(&r.room));
            if self.index_of(&report.node).is_some() {
                dropped.push(format!("node {}: listed twice: dropped", report.node));
                continue;
            }
            for room_report in &mut report.rooms {
                let Some(def) = self.rooms.iter().find(|d| d.room.id() == room_report.room) else {
                    continue;
                };
                for problem in room_report.make_plausible(&def.room, now) {
                    dropped.push(format!(
                        "node {}: room {}: {problem}",
                        report.node, def.name
                    ));
                }
            }
            if meta.last_seen.0 > now.0 {
                dropped.push(format!(
                    "node {}: last seen in the future: set to now",
                    report.node
                ));
                meta.last_seen = now;
            }
            self.reports.push(report);
            self.meta.push(meta);
            self.positions.insert(
                self.reports[self.reports.len() - 1].node.clone(),
                self.reports.len() - 1,
            );
        }
        // Every room's leases were of the nodes before; the snapshot's are
        // of the nodes it lists, numbered as `rebuild` numbers them (by
        // place). A lease of a node it does not list (a snapshot never
        // holds one) could never be used up, so it is dropped.
        for book in self.memory.values_mut() {
            book.leases.clear();
            book.colo_leases.clear();
        }
        for (id, name, memory) in restored {
            let Some(book) = self.memory.get_mut(&id) else {
                continue;
            };
            book.history = memory.history;
            for (leases, by_name) in [
                (&mut book.leases, memory.leases),
                (&mut book.colo_leases, memory.colo_leases),
            ] {
                for (node, lease) in by_name {
                    match self.positions.get(&node) {
                        Some(&i) => {
                            put_lease(leases, i as u32, lease);
                        }
                        None => dropped.push(format!(
                            "room {name}: lease of node {node} ({lease:?}), which the snapshot does not list: dropped"
                        )),
                    }
                }
            }
        }
        self.rebuild(Some(now.minute()));
        Ok(dropped)
    }
}

/// Why a snapshot was not taken over.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("snapshot layout {found}, this build reads {expected}")]
    Version { found: u32, expected: u32 },
    #[error("snapshot taken at {} ms, after now ({} ms): a clock or file problem", taken_at.0, now.0)]
    FromTheFuture {
        taken_at: UnixMillis,
        now: UnixMillis,
    },
}

/// Why new room definitions were refused on reload.
#[derive(Debug, thiserror::Error)]
pub enum RoomsChangeError {
    #[error(
        "rooms: the set of room ids changed ({before:?} -> {after:?}); adding or removing a room needs a restart"
    )]
    Ids {
        before: Vec<String>,
        after: Vec<String>,
    },
}

/// Strips a departed node's room report down to what still counts.
fn forget_live_counts(room: &mut RoomReport, now: UnixMillis) {
    room.waiting.clear();
    room.distinct_visitors.clear();
    room.expiries.retain(|&(s, _)| s >= now.expiry_slot());
    room.admits.retain(|a| a.minute >= now.minute());
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use crate::{
        aggregate::MinuteAdmits,
        counters::PoolCounts,
        room::{QueueingMethod, RoomConfig},
    };

    use super::*;

    /// 16:00:10 on 27 May 2021 (seed 002's day).
    const T0: UnixMillis = UnixMillis(1_622_073_600_000 + 16 * 3_600_000 + 10_000);

    fn room(total: u64, per_minute: u64) -> RoomDef {
        let config = crate::room::tests::config(total, per_minute);
        RoomDef {
            name: "shop".into(),
            room: config.validate().unwrap().named("shop"),
        }
    }

    fn report(node: &str, colo: &str, at: UnixMillis, room: RoomReport) -> NodeReport {
        NodeReport {
            node: node.into(),
            colo: colo.into(),
            at,
            rooms: vec![room],
        }
    }

    fn sessions(now: UnixMillis, n: i64, anywhere_used: u64, current: u64) -> RoomReport {
        let m = now.minute();
        RoomReport {
            room: RoomId::from_name("shop"),
            expiries: vec![(crate::time::ExpirySlot::end_of_minute(m.plus(3)), n)],
            admits: vec![MinuteAdmits {
                minute: m,
                admits: PoolCounts {
                    anywhere: anywhere_used,
                    ..PoolCounts::default()
                },
            }],
            waiting: vec![],
            distinct_visitors: vec![(m, current)],
        }
    }

    #[test]
    fn every_node_sees_the_sum_of_active_users() {
        let mut cluster = Cluster::new(vec![room(1_000, 100)], 5_000);
        cluster.apply(report("a", "x", T0, sessions(T0, 10, 0, 1)), T0);
        cluster.apply(report("b", "x", T0, sessions(T0, 20, 0, 1)), T0);
        let answer = cluster.apply(report("c", "y", T0, sessions(T0, 5, 0, 1)), T0);
        assert_eq!(answer.len(), 1);
        assert_eq!(answer[0].state.active_users, 35);
        let status = cluster.status(T0);
        assert_eq!(status.rooms[0].active_users, 35);
        assert_eq!(status.nodes.len(), 3);
        // The room's numbers by node add up to the room's.
        let by_node: Vec<(&str, &str, u64)> = status.rooms[0]
            .per_node
            .iter()
            .map(|n| (n.node.as_str(), n.colo.as_str(), n.active_users))
            .collect();
        assert_eq!(by_node, [("a", "x", 10), ("b", "x", 20), ("c", "y", 5)]);
        assert_eq!(status.rooms[0].phase, RoomPhase::NotQueueing);
        // No complete minute yet, so no admit rate to divide by.
        assert!(!status.rooms[0].wait_estimate.wait_time_known);
    }

    /// Status shows the room's recent pace, the one promises are held to:
    /// the admits of the last half second to second, in this minute only.
    #[test]
    fn status_shows_the_rooms_admits_a_second_of_the_last_moments() {
        let mut cluster = Cluster::new(vec![room(1_000, 500)], 5_000);
        cluster.apply(report("a", "x", T0, sessions(T0, 10, 10, 10)), T0);
        assert_eq!(cluster.status(T0).rooms[0].recent_admits_per_second, None);
        // 40 more admits in the next 800 ms: 50 a second.
        let t = T0.plus_millis(800);
        cluster.apply(report("a", "x", t, sessions(t, 50, 50, 50)), t);
        assert_eq!(
            cluster.status(t).rooms[0].recent_admits_per_second,
            Some(50.0)
        );
        // The next minute has no window until it has been measured.
        let next = T0.minute().plus(1).start();
        assert_eq!(cluster.status(next).rooms[0].recent_admits_per_second, None);
    }

    #[test]
    fn a_silent_node_keeps_its_sessions_until_they_end_then_is_forgotten() {
        let mut cluster = Cluster::new(vec![room(1_000, 100)], 5_000);
        let mut waiting = sessions(T0, 10, 0, 7);
        waiting.waiting = vec![(T0.minute(), 4)];
        cluster.apply(report("a", "x", T0, waiting), T0);
        cluster.apply(report("b", "x", T0, sessions(T0, 1, 0, 1)), T0);

        // b keeps reporting; a is silent for longer than the timeout.
        let later = T0.plus_millis(6_000);
        let answer = cluster.apply(report("b", "x", later, sessions(later, 1, 0, 1)), later);
        assert_eq!(answer[0].state.active_users, 11, "a's sessions still count");
        assert_eq!(answer[0].state.total_waiting, 0, "a's queue does not");
        let status = cluster.status(later);
        assert!(status.nodes.iter().any(|n| n.node == "a" && n.departed));
        // By node too: a is shown departed, with its sessions and no queue.
        let a = &status.rooms[0].per_node[0];
        assert_eq!(
            (a.node.as_str(), a.departed, a.active_users, a.total_waiting),
            ("a", true, 10, 0)
        );

        // Expiries were at minute +3: from minute +4 on nothing of a counts.
        let after = T0.plus_minutes(4);
        let answer = cluster.apply(report("b", "x", after, sessions(after, 1, 0, 1)), after);
        assert_eq!(answer[0].state.active_users, 1);
        assert_eq!(cluster.status(after).nodes.len(), 1, "a forgotten");
    }

    #[test]
    fn a_departed_node_that_comes_back_counts_fully_again() {
        let mut cluster = Cluster::new(vec![room(1_000, 100)], 1_000);
        cluster.apply(report("a", "x", T0, sessions(T0, 3, 0, 1)), T0);
        let later = T0.plus_millis(2_000);
        cluster.expire(later);
        assert!(cluster.status(later).nodes[0].departed);
        cluster.apply(report("a", "x", later, sessions(later, 4, 0, 1)), later);
        let status = cluster.status(later);
        assert!(!status.nodes[0].departed);
        assert_eq!(status.rooms[0].active_users, 4);
    }

    #[test]
    fn a_clock_step_is_not_a_silence() {
        // Two nodes hold Anywhere leases; the aggregator's clock steps 45 s
        // forward (within the minute), past the 30 s timeout, and a reports.
        let at = T0.minute().start().plus_millis(5_000);
        let stepped = at.plus_millis(45_500);
        let run = |shift: bool| {
            let mut cluster = Cluster::new(vec![room(10_000, 100)], 30_000);
            let b_cap = ["b", "a"]
                .iter()
                .map(|node| {
                    let answer = cluster.apply(report(node, "x", at, sessions(at, 0, 0, 10)), at);
                    answer[0].state.allowance.anywhere
                })
                .next()
                .unwrap();
            if shift {
                cluster.shift_clock(45_000);
            }
            let answer = cluster.apply(
                report("a", "x", stepped, sessions(stepped, 0, 0, 10)),
                stepped,
            );
            let departed = cluster
                .status(stepped)
                .nodes
                .iter()
                .filter(|n| n.departed)
                .count();
            (answer[0].state.allowance.anywhere, b_cap, departed)
        };
        // Unshifted: b looks silent, is departed, and a is granted what b holds.
        let (a_cap, b_cap, departed) = run(false);
        assert_eq!(departed, 1);
        assert!(
            a_cap + b_cap > 100,
            "a {a_cap} + b {b_cap}: the failure this guards"
        );
        // Shifted: b is not departed and its lease still counts.
        let (a_cap, b_cap, departed) = run(true);
        assert_eq!(departed, 0);
        assert!(
            a_cap + b_cap <= 100,
            "a was granted {a_cap} while b holds {b_cap}"
        );
    }

    #[test]
    fn anywhere_leases_never_add_up_to_more_than_the_pool() {
        // No colo history at all: every shared slot of the minute is Anywhere.
        let mut cluster = Cluster::new(vec![room(10_000, 100)], 5_000);
        let nodes = ["a", "b", "c", "d"];
        let (mut used, mut caps) = ([0_u64; 4], [0_u64; 4]);
        let mut now = T0;
        for round in 0..30_u64 {
            for (i, node) in nodes.iter().enumerate() {
                let traffic = (i as u64 + 1) * 10;
                let answer = cluster.apply(
                    report(node, "x", now, sessions(now, 0, used[i], traffic)),
                    now,
                );
                let state = &answer[0].state;
                caps[i] = state.used.anywhere + state.allowance.anywhere;
                let promised: u64 = caps.iter().sum();
                assert!(
                    promised <= 100,
                    "round {round} node {node}: caps {caps:?} promise more than the pool"
                );
                // The node uses part of its lease before its next report.
                used[i] += (caps[i] - used[i]) / (round % 3 + 1);
                now = now.plus_millis(100);
            }
        }
        assert!(
            used.iter().sum::<u64>() >= 90,
            "the pool does get used: {used:?}"
        );
    }

    /// Two nodes of one colo with the same history; then one of them gets a
    /// burst. The colo's slots follow the burst, and the caps the two hold
    /// never add up to more than the minute's limit although each answer
    /// splits the colo by the traffic of its own moment.
    #[test]
    fn colo_shares_follow_a_burst_and_never_promise_more_than_the_colo() {
        let mut cluster = Cluster::new(vec![room(10_000, 100)], 5_000);
        let nodes = ["a", "b"];
        let mut used = [PoolCounts::default(); 2];
        let mut caps = [0_u64; 2];
        let (mut clamped, mut now) = (0, T0);
        for round in 0..20_u64 {
            for (i, node) in nodes.iter().enumerate() {
                // Node a sees a burst, b stays at its usual pace.
                let current = if i == 0 { 10 + 20 * round } else { 2 };
                let answer = cluster.apply(asking_report(node, now, used[i], current), now);
                let state = &answer[0].state;
                let engine = aggregate(
                    &room(10_000, 100).room,
                    &cluster.reports,
                    &mut AggregateHistory::default(),
                    now,
                )
                .into_iter()
                .find(|(n, _)| n == node)
                .map(|(_, s)| s.allowance.colo_share)
                .unwrap();
                if state.allowance.colo_share < engine {
                    clamped += 1;
                }
                caps[i] = state.used.colo_share
                    + state.allowance.colo_share
                    + state.used.anywhere
                    + state.allowance.anywhere;
                assert!(
                    caps.iter().sum::<u64>() <= 100,
                    "round {round} node {node}: caps {caps:?} promise more than the minute's 100: {state:?}"
                );
                // The bursting node uses all it holds, the other a little.
                let spend = if i == 0 { caps[i] } else { used[i].total() + 1 };
                let more = spend.min(caps[i]).saturating_sub(used[i].total());
                let from_colo = (state.used.colo_share + state.allowance.colo_share)
                    .saturating_sub(used[i].colo_share)
                    .min(more);
                used[i].colo_share += from_colo;
                used[i].anywhere += more - from_colo;
                now = now.plus_millis(500);
            }
        }
        assert!(
            clamped > 0,
            "the ledger was needed: the engine alone would have over-promised"
        );
        assert!(
            used[0].total() >= 85,
            "the burst gets the colo's slots as the other node gives its part back: {used:?}"
        );
    }

    /// A report of node `node` in colo "x" (for the burst and asking tests):
    /// `used` this minute, the same history two minutes back, `current`
    /// visitors now.
    fn asking_report(node: &str, now: UnixMillis, used: PoolCounts, current: u64) -> NodeReport {
        report_in_colo(node, "x", now, used, 10, current)
    }

    /// The same in `colo`, with `back` visitors two minutes back.
    fn report_in_colo(
        node: &str,
        colo: &str,
        now: UnixMillis,
        used: PoolCounts,
        back: u64,
        current: u64,
    ) -> NodeReport {
        let m = now.minute();
        report(
            node,
            colo,
            now,
            RoomReport {
                room: RoomId::from_name("shop"),
                expiries: vec![(crate::time::ExpirySlot::end_of_minute(m.plus(3)), 1)],
                admits: vec![MinuteAdmits {
                    minute: m,
                    admits: used,
                }],
                waiting: vec![],
                distinct_visitors: vec![(m.minus(2), back), (m, current)],
            },
        )
    }

    fn shared_cap(state: &GlobalState) -> u64 {
        state.used.colo_share
            + state.allowance.colo_share
            + state.used.anywhere
            + state.allowance.anywhere
    }

    /// A node's shared-pool admits once it has spent all `state` promised
    /// it, for its next report (a node asking again).
    fn spent(state: &GlobalState) -> PoolCounts {
        PoolCounts {
            colo_share: state.used.colo_share + state.allowance.colo_share,
            anywhere: state.used.anywhere + state.allowance.anywhere,
            ..PoolCounts::default()
        }
    }

    /// The leases a node holds, as its peer report would say them.
    fn held(state: &GlobalState, minute: Minute) -> HeldLease {
        HeldLease {
            room: RoomId::from_name("shop"),
            minute,
            anywhere: state.allowance.anywhere,
            anywhere_used: state.used.anywhere,
            colo_share: state.allowance.colo_share,
            colo_share_used: state.used.colo_share,
        }
    }

    /// Three aggregators, each the home of one node, each told by the
    /// other nodes' peer reports what those nodes hold: their grants
    /// together never exceed the room's shared slots. Without the held
    /// leases each would hand its own node half of the pool (a promise's
    /// cap; three halves are more than the pool: the test that shows the
    /// report is needed), and a claim of another minute or of more than
    /// the limit counts for nothing or for at most the limit.
    #[test]
    fn peer_reports_make_each_aggregator_count_what_the_other_granted() {
        let run = |tell: bool| {
            let names = ["a", "b", "c"];
            let mut homes: Vec<Cluster> = (0..3)
                .map(|_| Cluster::new(vec![room(10_000, 100)], 5_000))
                .collect();
            let quiet = PoolCounts::default();
            let mut caps = [0; 3];
            // Every node asks on demand, and all burst: each home promises
            // its own node what it needs from the reserve.
            for round in 0..3 {
                for (i, name) in names.iter().enumerate() {
                    let t = T0.plus_millis(1_000 * round + 300 * i as u64);
                    let answer =
                        homes[i].apply_asking(asking_report(name, t, quiet, 10 + 30 * round), t);
                    caps[i] = shared_cap(&answer[0].state);
                    let held_now = if tell {
                        vec![held(&answer[0].state, t.minute())]
                    } else {
                        vec![]
                    };
                    for (j, peer) in homes.iter_mut().enumerate() {
                        if j != i {
                            peer.apply_peer(asking_report(name, t, quiet, 10), &held_now, t);
                        }
                    }
                }
            }
            caps
        };
        let caps = run(true);
        let sum: u64 = caps.iter().sum();
        assert!(
            caps.iter().all(|&c| c > 0),
            "every node holds slots: {caps:?}"
        );
        assert!(sum <= 100, "told, the grants fit the pool: {caps:?}");
        let caps = run(false);
        let sum: u64 = caps.iter().sum();
        assert!(sum > 100, "untold, each grants half of the pool: {caps:?}");

        // A lying or confused node: a claim over the limit counts as the
        // limit, never more, in this minute or of another.
        for minute in [T0.minute(), T0.minute().minus(1), T0.minute().plus(1)] {
            let mut y = Cluster::new(vec![room(10_000, 100)], 5_000);
            let quiet = PoolCounts::default();
            let claim = HeldLease {
                anywhere: u64::MAX,
                colo_share: u64::MAX,
                ..held(&GlobalState::empty(T0), minute)
            };
            y.apply_peer(asking_report("a", T0, quiet, 10), &[claim], T0);
            let b = y.apply(asking_report("b", T0, quiet, 10), T0);
            assert_eq!(
                shared_cap(&b[0].state),
                0,
                "a huge claim of {minute:?} takes the pool, no more"
            );
            assert_eq!(y.status(T0).nodes.len(), 2, "both nodes are in the picture");
        }
    }

    /// The worst case of two homes (each told nothing of the other's
    /// grants, as when peer reports are lost): alone they promise more than
    /// the pool (the test above, 100+ of 100); committing every grant to one
    /// shared ledger first (what the etcd ledger does) keeps both within it,
    /// each node told only what the ledger holds for it.
    #[test]
    fn two_homes_through_one_shared_ledger_never_promise_more_than_the_pool() {
        let mut x = Cluster::new(vec![room(10_000, 100)], 5_000).with_shared_ledger();
        let mut y = Cluster::new(vec![room(10_000, 100)], 5_000).with_shared_ledger();
        let mut ledger = grants::GrantLedger::default();
        let quiet = PoolCounts::default();
        let mut cuts = 0;
        let mut commit =
            |cluster: &mut Cluster, node: &str, answers: &mut Vec<RoomAnswer>, id: String| {
                let grant = cluster.shared_grants()[0];
                let set = ledger.apply_asks(&id, &[grant.ask(node)]);
                let told = grant.cut_to(set[0].1);
                if told != grant.allowances() {
                    cuts += 1;
                    cluster.settle_shared(node, &grant, told, answers);
                }
            };
        // Each node spends what it was promised before it reports again,
        // and the peer reports say nothing of it (as when they are lost): a
        // promise is at most half of what its home sees free, so without
        // spending the two homes' promises would not overlap.
        let (mut used_a, mut used_b) = (quiet, quiet);
        let mut caps = (0, 0);
        for round in 0..3 {
            let t = T0.plus_millis(1_000 * round);
            let report = |used| asking_report("a", t, used, 10 + 30 * round);
            let mut a = x.apply_asking(report(used_a), t);
            commit(&mut x, "a", &mut a, format!("x/{round}"));
            caps.0 = shared_cap(&a[0].state);
            used_a = spent(&a[0].state);
            y.apply_peer(report(quiet), &[], t);
            let t = t.plus_millis(500);
            let report = |used| asking_report("b", t, used, 10 + 30 * round);
            let mut b = y.apply_asking(report(used_b), t);
            commit(&mut y, "b", &mut b, format!("y/{round}"));
            caps.1 = shared_cap(&b[0].state);
            used_b = spent(&b[0].state);
            x.apply_peer(report(quiet), &[], t);
        }
        let (a, b) = caps;
        assert!(a > 0 && b > 0, "both nodes hold slots: {a} + {b}");
        assert!(
            a + b <= 100,
            "through the ledger the grants fit the pool: {a} + {b}"
        );
        assert!(ledger.total() <= 100, "and so do the caps it holds");
        assert!(cuts > 0, "the ledger cut what the other home had granted");
    }

    /// A grant cut by the ledger loses Anywhere slots first, then colo
    /// share; a cap below what the node already used tells it nothing new.
    #[test]
    fn a_cut_takes_anywhere_first() {
        let mut grant = SharedGrant {
            room: RoomId::from_name("shop"),
            minute: T0.minute(),
            used: (6, 4),
            held: (0, 0),
            colo_allowance: 5,
            anywhere_allowance: 7,
            budget: 100,
            holds: (0, 0),
        };
        assert_eq!((grant.record(), grant.floor()), (22, 10));
        assert_eq!(grant.cut_to(22), (5, 7));
        assert_eq!(grant.cut_to(30), (5, 7), "a ledger never raises a grant");
        assert_eq!(grant.cut_to(17), (5, 2));
        assert_eq!(grant.cut_to(13), (3, 0));
        assert_eq!(grant.cut_to(4), (0, 0));

        // The node still holds a colo-share cap of 9 and an Anywhere cap of
        // 8 until the answer lands: with this grant it may spend 11 + 11,
        // and 9 + 8 whatever it is told. A ledger holding 18 takes back the
        // parts of the grant above what the node holds, Anywhere first
        // (11 -> 8, then colo 11 -> 10); no cut goes below the floor.
        grant.held = (9, 8);
        assert_eq!((grant.record(), grant.floor()), (22, 17));
        assert_eq!(grant.cut_to(18), (4, 4));
        assert_eq!(grant.cut_to(17), (3, 4));
        assert_eq!(
            grant.cut_to(10),
            (3, 4),
            "nothing lower can be told: the floor"
        );
        assert_eq!(grant.record_with(3, 4), grant.floor());
    }

    /// A ledger that cuts only the Anywhere part of a grant leaves the colo
    /// share this aggregator counts for the node as it was: the node still
    /// holds a colo cap larger than the new grant (until the answer lands),
    /// and replacing that lease with the grant's smaller one as well left
    /// the slots it holds free here for another node's next grant.
    #[test]
    fn a_settled_cut_lowers_only_the_pool_it_cut() {
        let mut x = Cluster::new(vec![room(10_000, 100)], 5_000).with_shared_ledger();
        let quiet = PoolCounts::default();
        x.apply_peer(asking_report("b", T0, quiet, 10), &[], T0);
        let minute = T0.minute();
        let claim = HeldLease {
            colo_share: 70,
            colo_share_used: 0,
            anywhere: 0,
            anywhere_used: 0,
            ..held(&GlobalState::empty(T0), minute)
        };
        let mut answers = x.apply_holding(asking_report("a", T0, quiet, 40), &[claim], false, T0);
        let grant = x.shared_grants()[0];
        assert!(
            grant.colo_allowance < 70 && grant.anywhere_allowance >= 2,
            "the setting under test: a colo grant under what a holds, some Anywhere: {grant:?}"
        );
        let id = RoomId::from_name("shop");
        let caps = |x: &Cluster| {
            let (colo, anywhere) = x.memory[&id].leases_of(x.ids[x.index_of("a").unwrap()]);
            (
                colo.unwrap().cap_in(minute),
                anywhere.unwrap().cap_in(minute),
            )
        };
        let (colo_before, _) = caps(&x);
        assert_eq!(colo_before, 70, "the colo lease counted covers the claim");
        let told = (grant.colo_allowance, grant.anywhere_allowance - 2);
        x.settle_shared("a", &grant, told, &mut answers);
        assert_eq!(
            caps(&x),
            (70, grant.used.1 + told.1),
            "Anywhere lowered to what was told; the colo share as counted"
        );
        assert_eq!(
            (
                answers[0].state.allowance.colo_share,
                answers[0].state.allowance.anywhere
            ),
            told,
            "the answer says what was told"
        );
    }

    /// At a minute's start a node still holds the last minute's lease (it
    /// applies the bare allowance to its fresh counters until its home
    /// answers in the new minute, `GlobalState::cap`), and under loss that
    /// answer can be seconds late. A peer aggregator counts that lease as
    /// the home's own ledger does, so it does not hand its own nodes the
    /// same slots again. (It used to take a lease of another minute for
    /// nothing: the grants below then added up to 150 of 100.)
    #[test]
    fn a_peer_counts_a_lease_of_the_last_minute_as_the_home_does() {
        let quiet = PoolCounts::default();
        let last_minute = UnixMillis(T0.0 - 30_000);
        assert_eq!(last_minute.minute(), T0.minute().minus(1));
        let mut x = Cluster::new(vec![room(10_000, 100)], 60_000);
        let mut y = Cluster::new(vec![room(10_000, 100)], 60_000);
        // Last minute: `a`'s home (x), which knows b too, grants it a part
        // it does not use; its peer report tells y.
        x.apply_peer(asking_report("b", last_minute, quiet, 10), &[], last_minute);
        let a = x.apply(asking_report("a", last_minute, quiet, 10), last_minute);
        let held_a = held(&a[0].state, last_minute.minute());
        let kept = shared_cap(&a[0].state);
        assert!(kept > 0 && kept < 100, "a holds part of the pool: {kept}");
        y.apply_peer(
            asking_report("a", last_minute, quiet, 10),
            &[held_a],
            last_minute,
        );
        // The minute turns; a's first report of it reaches its peer before
        // its home has answered it, so it still names last minute's lease.
        y.apply_peer(asking_report("a", T0, quiet, 0), &[held_a], T0);
        // b, whose home is y, bursts and asks for all it can get.
        let b = y.apply_asking(asking_report("b", T0, quiet, 500), T0);
        let b_cap = shared_cap(&b[0].state);
        assert!(b_cap > 0, "b is granted what a does not hold");
        assert!(
            b_cap + kept <= 100,
            "b's grant and what a still holds fit the limit: {b_cap} + {kept}"
        );
        // The home's own ledger gives b the same.
        let b_at_home = x.apply_asking(asking_report("b", T0, quiet, 500), T0);
        assert_eq!(shared_cap(&b_at_home[0].state), b_cap);
    }

    /// A home lowers a node's cap and the answer is lost: the node still
    /// holds the higher one. With home reports (`apply_holding`) the ledger
    /// counts the higher cap until the node's next report says what it
    /// holds, so another node's burst is never granted those slots; with
    /// plain reports it is (the test that shows the hole).
    #[test]
    fn a_lowered_cap_counts_until_the_node_says_it_got_it() {
        let run = |holding: bool| {
            let mut cluster = Cluster::new(vec![room(10_000, 100)], 60_000);
            let quiet = PoolCounts::default();
            let ask = |c: &mut Cluster, r, held: &[HeldLease], t| {
                if holding {
                    c.apply_holding(r, held, true, t)
                } else {
                    c.apply_asking(r, t)
                }
            };
            // a's burst: it asks and is promised much of the pool.
            let first = ask(&mut cluster, asking_report("a", T0, quiet, 400), &[], T0);
            let holds = held(&first[0].state, T0.minute());
            let a_cap = shared_cap(&first[0].state);
            // Its burst is over: its next report is promised little. That
            // answer is lost; a still holds `holds`.
            let t = T0.plus_millis(1_000);
            let lowered = ask(&mut cluster, asking_report("a", t, quiet, 400), &[holds], t);
            let a_lowered = shared_cap(&lowered[0].state);
            // b bursts and asks for all it can get, three times in a row,
            // spending each promise (an ask is promised half of what is
            // free): its cap after the third.
            let mut b_used = quiet;
            let mut b_asks = |c: &mut Cluster, from: UnixMillis, visitors: u64| {
                let mut cap = 0;
                for k in 0..3 {
                    let t = from.plus_millis(100 * k);
                    let b = ask(c, asking_report("b", t, b_used, visitors), &[], t);
                    let state = &b[0].state;
                    cap = shared_cap(state);
                    b_used = spent(state);
                }
                cap
            };
            let b_cap = b_asks(&mut cluster, T0.plus_millis(1_500), 900);
            // a's next report gets through and says it holds the lowered
            // cap (this time the answer came): the rest is free again.
            let confirmed = held(&lowered[0].state, T0.minute());
            let t = T0.plus_millis(2_000);
            let again = ask(
                &mut cluster,
                asking_report("a", t, quiet, 400),
                &[confirmed],
                t,
            );
            let a_now = shared_cap(&again[0].state);
            let b_later = b_asks(&mut cluster, T0.plus_millis(2_500), 1_800);
            (a_cap, a_lowered, b_cap, a_now, b_later)
        };
        let (a_cap, a_lowered, b_cap, ..) = run(false);
        assert!(
            a_lowered < a_cap,
            "the cap is lowered: {a_cap} → {a_lowered}"
        );
        assert!(
            a_cap + b_cap > 100,
            "plain reports: b is granted what a still holds ({a_cap} + {b_cap})"
        );
        let (a_cap, a_lowered, b_cap, a_now, b_later) = run(true);
        assert!(
            a_lowered < a_cap,
            "the cap is lowered: {a_cap} → {a_lowered}"
        );
        assert!(b_cap > 0, "b is granted what is free");
        assert!(
            a_cap + b_cap <= 100,
            "home reports: what a still holds is not granted again ({a_cap} + {b_cap})"
        );
        assert!(
            b_later > b_cap && a_now + b_later <= 100,
            "once a says it holds less, b gets the rest: {b_cap} → {b_later} beside a's {a_now}"
        );
    }

    /// A home report that claims absurd leases (a lying or broken node):
    /// each field of the claim is capped at the room's limit, nothing
    /// overflows the ledger's sums, others are starved at most while the
    /// claim stands, and the claimant's next sane report frees the room.
    #[test]
    fn an_absurd_held_claim_is_capped_and_does_not_stick() {
        let quiet = PoolCounts::default();
        let mut cluster = Cluster::new(vec![room(10_000, 100)], 60_000);
        let absurd = HeldLease {
            room: RoomId::from_name("shop"),
            minute: T0.minute(),
            anywhere: u64::MAX,
            anywhere_used: u64::MAX,
            colo_share: u64::MAX,
            colo_share_used: u64::MAX,
        };
        let a = cluster.apply_holding(asking_report("a", T0, quiet, 400), &[absurd], true, T0);
        assert!(shared_cap(&a[0].state) <= 100, "{:?}", a[0].state);
        let t = T0.plus_millis(500);
        let b = cluster.apply_holding(asking_report("b", t, quiet, 400), &[], true, t);
        assert_eq!(shared_cap(&b[0].state), 0, "a's claim holds the room");
        // a reports again, holding nothing: b is granted again.
        let t = T0.plus_millis(1_000);
        cluster.apply_holding(asking_report("a", t, quiet, 400), &[], true, t);
        let t = T0.plus_millis(1_500);
        let b = cluster.apply_holding(asking_report("b", t, quiet, 800), &[], true, t);
        assert!(shared_cap(&b[0].state) > 0, "{:?}", b[0].state);
    }

    /// An aggregator restarted from a snapshot taken before its last grant
    /// does not know that grant. While it learns (`learn_until`) nobody is
    /// granted more than it holds, and the first report of the node holding
    /// the forgotten grant puts it back in the ledger: another node's burst
    /// is never granted those slots. Without learning, it is.
    #[test]
    fn a_restarted_ledger_learns_what_the_nodes_hold_before_granting() {
        let run = |learn: bool| {
            let quiet = PoolCounts::default();
            let mut before = Cluster::new(vec![room(10_000, 100)], 60_000);
            let b0 = before.apply_holding(asking_report("b", T0, quiet, 1), &[], true, T0);
            let b_holds = held(&b0[0].state, T0.minute());
            let b0_cap = shared_cap(&b0[0].state);
            let snapshot = before.snapshot(T0);
            // The grant the snapshot misses: a's burst.
            let t = T0.plus_millis(500);
            let a = before.apply_holding(asking_report("a", t, quiet, 400), &[], true, t);
            let a_holds = held(&a[0].state, T0.minute());
            let a_cap = shared_cap(&a[0].state);
            // kill -9; a restart from the snapshot.
            let t = T0.plus_millis(1_000);
            let mut after = Cluster::new(vec![room(10_000, 100)], 60_000);
            assert!(after.restore(snapshot, t).unwrap().is_empty());
            if learn {
                after.learn_until(t.plus_millis(3_000));
            }
            // b bursts first, asking twice and spending the first promise
            // (an ask is promised half of what is free); a reports a moment
            // later, then b again.
            let b1 = after.apply_holding(asking_report("b", t, quiet, 900), &[b_holds], true, t);
            let b1_spent = spent(&b1[0].state);
            let b1_again = held(&b1[0].state, T0.minute());
            let t = T0.plus_millis(1_100);
            let b1 =
                after.apply_holding(asking_report("b", t, b1_spent, 900), &[b1_again], true, t);
            let b1_cap = shared_cap(&b1[0].state);
            let t = T0.plus_millis(1_500);
            let a1 = after.apply_holding(asking_report("a", t, quiet, 400), &[a_holds], true, t);
            let a1_cap = shared_cap(&a1[0].state);
            let b1_holds = held(&b1[0].state, T0.minute());
            let t = T0.plus_millis(4_500);
            assert!(!after.learning(t));
            // b still has visitors coming (an idle node is promised nothing
            // of the reserve, half the pool, which a holds).
            let b2 = after.apply_holding(asking_report("b", t, quiet, 950), &[b1_holds], true, t);
            (b0_cap, a_cap, b1_cap, a1_cap, shared_cap(&b2[0].state))
        };
        let (_, a_cap, b1_cap, ..) = run(false);
        assert!(
            a_cap + b1_cap > 100,
            "without learning b is granted what a holds: {a_cap} + {b1_cap}"
        );
        let (b0_cap, a_cap, b1_cap, a1_cap, b2_cap) = run(true);
        assert!(
            b1_cap <= b0_cap,
            "learning: b is granted no more than it held ({b1_cap} of {b0_cap})"
        );
        assert!(
            a1_cap <= a_cap,
            "a keeps no more than it held: {a1_cap} of {a_cap}"
        );
        assert!(
            a_cap + b2_cap <= 100 && b2_cap > 0,
            "after learning, b is granted what a does not hold: {a_cap} + {b2_cap}"
        );
    }

    /// The 7:1 burst at the aggregator: with fair parts, the quiet node
    /// holds half the colo and the bursting node's out-of-cycle reports find
    /// nothing free; with small promises the quiet node holds a little and
    /// the asking node is granted the reserve, half of what is free at each
    /// ask.
    #[test]
    fn an_asking_node_is_granted_the_reserve_a_quiet_node_was_not_promised() {
        let burst = |asking: bool| {
            let mut cluster = Cluster::new(vec![room(10_000, 100)], 5_000);
            let apply = |c: &mut Cluster, r, now| {
                if asking {
                    c.apply_asking(r, now)
                } else {
                    c.apply(r, now)
                }
            };
            let quiet = PoolCounts::default();
            // Two rounds of the usual pace, every node reporting each second.
            let mut caps = [0; 2];
            for round in 0..2 {
                let t = T0.plus_millis(1_000 * round);
                let a = apply(&mut cluster, asking_report("a", t, quiet, 1), t);
                caps[0] = shared_cap(&a[0].state);
                let t = t.plus_millis(500);
                let b = apply(&mut cluster, asking_report("b", t, quiet, 1), t);
                caps[1] = shared_cap(&b[0].state);
            }
            // The burst at a: it spends what it holds and asks out of
            // cycle, twice (an ask is promised half of what is free).
            let mut a_cap = caps[0];
            for (ask, visitors) in [(0, 40), (1, 80)] {
                let spent = PoolCounts {
                    colo_share: a_cap,
                    ..PoolCounts::default()
                };
                let t = T0.plus_millis(1_600 + 100 * ask);
                let a = apply(&mut cluster, asking_report("a", t, spent, visitors), t);
                a_cap = shared_cap(&a[0].state);
                assert!(a_cap + caps[1] <= 100, "{a_cap} + {}", caps[1]);
            }
            (caps[0], caps[1], a_cap)
        };
        let (_, b_fair, a_fair) = burst(false);
        assert!(b_fair >= 40, "a quiet node holds its fair half: {b_fair}");
        assert!(a_fair <= 60, "and the busy node cannot get it: {a_fair}");
        let (a_first, b_small, a_asked) = burst(true);
        assert!(
            a_first <= 2,
            "an idle node's first promise is small: {a_first}"
        );
        assert!(
            b_small <= 2,
            "the quiet node is promised a little: {b_small}"
        );
        assert!(
            a_asked > a_fair,
            "the asking node gets the reserve: {a_asked} against {a_fair} with fair parts"
        );
    }

    /// A node's rate is measured between the times it made its reports,
    /// not the times the aggregator took them in: a periodic report that
    /// spent 500 ms on its way, followed by an ask that took 5 ms, covers a
    /// second of the node's visitors, not half of one.
    #[test]
    fn an_asking_nodes_rate_is_measured_between_the_times_it_made_its_reports() {
        let need_after = |made: u64, taken: u64| {
            let mut cluster = Cluster::new(vec![room(10_000, 1_000)], 5_000);
            let quiet = PoolCounts::default();
            // Made at T0, taken in at T0 + 500 (a long way).
            let mut first = asking_report("a", T0, quiet, 10);
            first.at = T0;
            cluster.apply_asking(first, T0.plus_millis(500));
            // 30 new visitors later it asks: made at T0 + `made`, taken in
            // at T0 + `taken`.
            let mut ask = asking_report("a", T0.plus_millis(made), quiet, 40);
            ask.at = T0.plus_millis(made);
            let answer = cluster.apply_asking(ask, T0.plus_millis(taken));
            shared_cap(&answer[0].state)
        };
        // 30 visitors in the 1,000 ms between the reports: 60 over the
        // two-second horizon (it was 30 over 505 ms, 119).
        assert_eq!(need_after(1_000, 1_005), 60);
        // A report the node made no later than the one before it (overtaken
        // on the way) falls back to the times they were taken in.
        assert_eq!(
            elapsed_since(Some(Seen { seen: T0, at: T0 }), T0, T0.plus_millis(300)),
            300
        );
        assert_eq!(
            elapsed_since(
                Some(Seen {
                    seen: T0,
                    at: T0.plus_millis(50)
                }),
                T0,
                T0.plus_millis(300)
            ),
            300
        );
        // Never further back than the minute's start.
        let into_minute = T0.0 % crate::time::MILLIS_PER_MINUTE;
        assert_eq!(
            elapsed_since(
                Some(Seen {
                    seen: UnixMillis(0),
                    at: UnixMillis(0)
                }),
                T0,
                T0
            ),
            into_minute
        );
    }

    /// A node in a colo without history asks for more than its colo and
    /// the Anywhere pool hold: it borrows half of what the colo with history
    /// leaves unheld, and that colo's own node, asking next, still gets the
    /// other half; together never more than the minute's limit.
    #[test]
    fn an_asking_node_borrows_half_of_what_other_colos_leave_unheld() {
        let in_colo = report_in_colo;
        let quiet = PoolCounts::default();
        let mut cluster = Cluster::new(vec![room(10_000, 100)], 5_000);
        // Colo x had all the traffic two minutes back: 90 of the 100 slots
        // are its colo's; Anywhere is the other 10. Its node is idle now.
        let a = cluster.apply_asking(in_colo("a", "x", T0, quiet, 10, 0), T0);
        let a_cap = shared_cap(&a[0].state);
        assert!(a_cap <= 2, "an idle node's promise is small: {a_cap}");
        // The spike reaches colo y, which had no traffic: its node asks for
        // far more than Anywhere's 10 (5,000 visitors in 10.3 s of the minute).
        let t = T0.plus_millis(300);
        let b = cluster.apply_asking(in_colo("b", "y", t, quiet, 0, 5_000), t);
        let b_cap = shared_cap(&b[0].state);
        let unheld_in_x = 90 - a_cap;
        assert_eq!(
            b_cap,
            (10 + unheld_in_x / 2).min((100 - a_cap).div_ceil(2)),
            "Anywhere and half of what x leaves unheld, within half of what is free"
        );
        // Colo x's own node now asks, spending each promise and asking
        // again (each ask is promised half of what is free): the half left
        // is there for it.
        let mut t = t;
        let mut a_cap = 0;
        let mut used = quiet;
        for _ in 0..8 {
            t = t.plus_millis(100);
            let a = cluster.apply_asking(in_colo("a", "x", t, used, 10, 5_000), t);
            let state = &a[0].state;
            a_cap = shared_cap(state);
            used = spent(state);
        }
        assert!(a_cap >= unheld_in_x / 2, "x keeps its half: {a_cap}");
        assert!(a_cap + b_cap <= 100, "{a_cap} + {b_cap}");
        // A third colo's node (not asking: fair parts) gets what is left.
        let t = t.plus_millis(300);
        let c = cluster.apply(in_colo("c", "z", t, quiet, 0, 5_000), t);
        let c_cap = shared_cap(&c[0].state);
        assert!(a_cap + b_cap + c_cap <= 100, "{a_cap} + {b_cap} + {c_cap}");
    }

    /// At scale an idle node is promised nothing (its fair part is under a
    /// slot). A node holding a visitor asks, its answer is lost, and it
    /// reports again with the same counts: by them nothing is new since the
    /// lost ask, so it is promised nothing again and the visitor queues
    /// with 19 of the minute's 20 slots free. A held report that names the visitor is promised
    /// a slot for it; one that claims more visitors than there are slots
    /// gets no more than the ledgers leave it.
    #[test]
    fn a_report_sent_again_for_a_held_visitor_is_promised_a_slot_for_it() {
        let quiet = PoolCounts::default();
        let again = |held_visitors: &[HeldVisitors]| {
            let mut cluster = Cluster::new(vec![room(10_000, 20)], 5_000);
            // 300 idle nodes in 60 colos: a fair part is a third of a slot,
            // and the first to report hold what idle promises may take.
            for n in (0..300).rev() {
                let colo = format!("c{}", n % 60);
                cluster.apply_asking(report_in_colo(&format!("n{n}"), &colo, T0, quiet, 1, 0), T0);
            }
            let t = T0.plus_millis(1_000);
            let first = cluster.apply_asking(report_in_colo("n0", "c0", t, quiet, 1, 0), t);
            let idle = shared_cap(&first[0].state);
            let holding = [held(&first[0].state, t.minute())];
            // A visitor is held: the ask counts it, and is promised a slot.
            let t = t.plus_millis(500);
            let ask = cluster.apply_holding(
                report_in_colo("n0", "c0", t, quiet, 1, 1),
                &holding,
                true,
                t,
            );
            let asked = shared_cap(&ask[0].state);
            // Its answer is lost; 45 ms later the node reports again, still
            // holding the visitor (and still holding the lease before).
            let t = t.plus_millis(45);
            let report = report_in_colo("n0", "c0", t, quiet, 1, 1);
            let answer = if held_visitors.is_empty() {
                cluster.apply_holding(report, &holding, true, t)
            } else {
                cluster.apply_held(report, &holding, held_visitors, t)
            };
            (idle, asked, shared_cap(&answer[0].state))
        };
        let one = [HeldVisitors {
            room: RoomId::from_name("shop"),
            visitors: 1,
        }];
        let (idle, asked, blind) = again(&[]);
        assert_eq!(idle, 0, "an idle node at scale is promised nothing");
        assert!(asked >= 1, "the ask is promised a slot: {asked}");
        assert_eq!(
            blind, 0,
            "by its counts the report sent again needs nothing"
        );
        let (_, _, named) = again(&one);
        assert!(named >= 1, "named, the held visitor gets a slot: {named}");
        let (_, _, greedy) = again(&[HeldVisitors {
            visitors: u64::MAX,
            ..one[0]
        }]);
        // What the ledgers leave it: its colo's free slots, the Anywhere
        // pool's and half of the other colos' unheld ones (what a node
        // asking again and again ends up with), within the minute's 20.
        assert!(
            (named..=20).contains(&greedy),
            "a claim of endless held visitors gets what the ledgers leave: {greedy}"
        );
        // Another room's held visitors are not this room's.
        let (_, _, elsewhere) = again(&[HeldVisitors {
            room: RoomId::from_name("other"),
            visitors: 5,
        }]);
        assert_eq!(elsewhere, 0);
    }

    /// The attacker (or a runaway node): it asks every millisecond, each
    /// time claiming to have spent everything it holds. Its grants grow,
    /// but what every node holds never passes the minute's limit, and an
    /// honest node's lease is never taken from it.
    #[test]
    fn a_node_asking_again_and_again_never_holds_more_than_the_pool() {
        let mut cluster = Cluster::new(vec![room(10_000, 100)], 5_000);
        let honest =
            cluster.apply_asking(asking_report("honest", T0, PoolCounts::default(), 30), T0);
        let mut now = T0.plus_millis(400);
        let honest = cluster.apply_asking(
            asking_report("honest", now, honest[0].state.allowance, 30),
            now,
        );
        let honest_cap = shared_cap(&honest[0].state);
        assert!(honest_cap > 0);
        let mut used = PoolCounts::default();
        let mut evil_cap = 0;
        for _ in 0..1_000 {
            now = now.plus_millis(1);
            let answer = cluster.apply_asking(asking_report("evil", now, used, 10_000), now);
            let state = &answer[0].state;
            evil_cap = shared_cap(state);
            assert!(
                evil_cap + honest_cap <= 100,
                "evil {evil_cap} + honest {honest_cap} over the minute's limit"
            );
            used = spent(state);
        }
        assert!(evil_cap > 50, "it did get what nobody held: {evil_cap}");
    }

    #[test]
    fn a_lease_from_the_previous_minute_counts_until_replaced() {
        let lease = Lease {
            minute: Minute(10),
            used_at_grant: 5,
            allowance: 3,
        };
        assert_eq!(lease.outstanding(Minute(10), 6), 2);
        assert_eq!(
            lease.outstanding(Minute(11), 0),
            3,
            "fresh counters, bare allowance"
        );
        assert_eq!(lease.outstanding(Minute(11), 9), 0);
    }

    /// The lease a ledger counts for a node that may hold either of two
    /// counts at least as much as each, this minute and the next, and no
    /// more than the larger cap this minute.
    #[test]
    fn a_covering_lease_counts_at_least_either_one() {
        let m = Minute(10);
        let cases = [
            // the same minute, a higher old cap (a lowered cap, its answer lost)
            (
                Lease {
                    minute: m,
                    used_at_grant: 2,
                    allowance: 30,
                },
                Lease {
                    minute: m,
                    used_at_grant: 8,
                    allowance: 4,
                },
                8,
            ),
            // an old lease of last minute beside this minute's grant
            (
                Lease {
                    minute: Minute(9),
                    used_at_grant: 40,
                    allowance: 25,
                },
                Lease {
                    minute: m,
                    used_at_grant: 5,
                    allowance: 10,
                },
                5,
            ),
            // the new grant is the larger
            (
                Lease {
                    minute: m,
                    used_at_grant: 0,
                    allowance: 3,
                },
                Lease {
                    minute: m,
                    used_at_grant: 6,
                    allowance: 50,
                },
                6,
            ),
        ];
        for (a, b, used) in cases {
            let c = Lease::covering(&a, &b, m, used);
            assert_eq!(c.minute, m);
            for later_used in [used, used + 3, used + 40] {
                let now = |l: &Lease| l.outstanding(m, later_used);
                assert!(now(&c) >= now(&a).max(now(&b)), "{a:?} {b:?} {c:?}");
                assert_eq!(now(&c), now(&a).max(now(&b)), "no more this minute");
                let next = |l: &Lease| l.outstanding(m.plus(1), later_used.min(5));
                assert!(
                    next(&c) >= next(&a).max(next(&b)),
                    "next minute: {a:?} {b:?} {c:?}"
                );
            }
        }
    }

    #[test]
    fn snapshot_round_trips_and_restores_global_state() {
        let mut cluster = Cluster::new(vec![room(1_000, 100)], 5_000);
        cluster.apply(report("a", "x", T0, sessions(T0, 10, 2, 1)), T0);
        cluster.apply(report("b", "y", T0, sessions(T0, 20, 0, 1)), T0);
        let snapshot = cluster.snapshot(T0);
        let json = serde_json::to_string(&snapshot).unwrap();
        let back: Snapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(back, snapshot);

        let mut restarted = Cluster::new(vec![room(1_000, 100)], 5_000);
        assert!(restarted.restore(back, T0).unwrap().is_empty());
        let status = restarted.status(T0.plus_millis(500));
        assert_eq!(status.rooms[0].active_users, 30);
        assert_eq!(status.rooms[0].admitted_this_minute, 2);

        let mut wrong = snapshot.clone();
        wrong.version = 99;
        assert!(matches!(
            Cluster::new(vec![room(1_000, 100)], 5_000).restore(wrong, T0),
            Err(RestoreError::Version { found: 99, .. })
        ));
    }

    #[test]
    fn a_poisoned_snapshot_is_corrected_and_the_room_stays_usable() {
        let mut cluster = Cluster::new(vec![room(1_000, 100)], 5_000);
        cluster.apply(report("a", "x", T0, sessions(T0, 10, 2, 1)), T0);
        let mut poisoned = cluster.snapshot(T0);
        // Sessions that would never end and an overflowing count.
        let expiries = &mut poisoned.nodes[0].0.rooms[0].expiries;
        expiries.push((
            crate::time::ExpirySlot::end_of_minute(T0.minute().plus(1_000_000)),
            5,
        ));
        expiries.push((
            crate::time::ExpirySlot::end_of_minute(T0.minute().plus(1)),
            i64::MAX,
        ));
        poisoned.nodes.push(poisoned.nodes[0].clone());
        let lease = Lease {
            minute: T0.minute(),
            used_at_grant: 0,
            allowance: u64::MAX,
        };
        poisoned.rooms[0].1.leases.insert("a".into(), lease);
        let kept = poisoned.rooms[0].1.colo_leases["a"];
        // A lease of a node the snapshot does not list: nothing would ever
        // use it up.
        let ghost = Lease {
            allowance: 3,
            ..kept
        };
        poisoned.rooms[0]
            .1
            .colo_leases
            .insert("ghost".into(), ghost);
        poisoned.rooms[0].1.history.admit_rate.per_minute = f64::NAN;

        let mut restarted = Cluster::new(vec![room(1_000, 100)], 5_000);
        let dropped = restarted.restore(poisoned, T0).unwrap();
        let text = dropped.join("\n");
        assert!(text.contains("listed twice"), "{text}");
        assert!(text.contains("in the future: dropped"), "{text}");
        assert!(text.contains("clamped"), "{text}");
        assert!(text.contains("lease of node a"), "{text}");
        assert!(text.contains("admit rate NaN"), "{text}");
        assert!(
            text.contains("lease of node ghost") && text.contains("does not list"),
            "{text}"
        );
        let leases = &restarted.snapshot(T0).rooms[0].1.colo_leases;
        assert_eq!(
            leases.keys().collect::<Vec<_>>(),
            ["a"],
            "a's lease is kept, the ghost's dropped"
        );
        assert_eq!(leases["a"], kept);
        let status = restarted.status(T0.plus_millis(500));
        assert_eq!(
            status.rooms[0].active_users,
            10 + 2_064,
            "the overflow is clamped to what one node can hold, not summed"
        );
        // Still usable: a new node's report merges and gets an answer.
        let answers = restarted.apply(report("b", "y", T0, sessions(T0, 1, 0, 1)), T0);
        assert_eq!(answers.len(), 1);

        let mut future = cluster.snapshot(T0.plus_minutes(10));
        future.version = SNAPSHOT_VERSION;
        assert!(matches!(
            Cluster::new(vec![room(1_000, 100)], 5_000).restore(future, T0),
            Err(RestoreError::FromTheFuture { .. })
        ));
    }

    #[test]
    fn a_report_of_impossible_numbers_is_corrected_before_the_merge() {
        let mut cluster = Cluster::new(vec![room(1_000, 100)], 5_000);
        cluster.apply(report("honest", "x", T0, sessions(T0, 10, 0, 1)), T0);
        let mut bad = report("liar", "y", T0, sessions(T0, 0, 0, 1));
        bad.rooms[0].expiries = vec![
            (
                crate::time::ExpirySlot::end_of_minute(T0.minute().plus(2)),
                i64::MIN,
            ),
            (
                crate::time::ExpirySlot::end_of_minute(T0.minute().plus(2)),
                i64::MIN,
            ),
            (
                crate::time::ExpirySlot::end_of_minute(T0.minute().plus(100_000)),
                1,
            ),
        ];
        let answers = cluster.apply(bad, T0);
        assert_eq!(answers.len(), 1);
        assert_eq!(cluster.implausible_total(), 3);
        assert_eq!(
            cluster.implausible_by_reason(),
            [("future_minute", 1), ("clamped", 2)]
        );
        let status = cluster.status(T0);
        assert_eq!(
            status.rooms[0].active_users, 0,
            "negative sessions saturate at zero instead of wrapping or panicking"
        );
    }

    #[test]
    fn set_rooms_takes_new_limits_and_refuses_a_different_set_of_rooms() {
        let mut cluster = Cluster::new(vec![room(100, 20)], 60_000);
        let now = UnixMillis(1_000_000);
        cluster.apply(report("a", "x", now, sessions(now, 30, 0, 0)), now);
        cluster.set_rooms(vec![room(50, 5)]).unwrap();
        let status = cluster.status(now);
        assert_eq!(status.rooms[0].total_active_users, 50);
        assert_eq!(status.rooms[0].new_users_per_minute, 5);
        assert_eq!(status.rooms[0].active_users, 30, "the nodes' counts stay");
        let mut other = room(50, 5);
        other.name = "other".into();
        let err = cluster.set_rooms(vec![other]).unwrap_err();
        assert!(err.to_string().contains("needs a restart"), "{err}");
        assert_eq!(cluster.status(now).rooms[0].id, "shop", "nothing changed");
    }

    /// One step of a random life of the cluster.
    #[derive(Clone, Debug)]
    enum Step {
        /// Node `node` of colo `colo` reports `rooms` after `advance_ms`.
        Report {
            node: usize,
            colo: usize,
            advance_ms: u64,
            rooms: Vec<(usize, RandomRoom)>,
        },
        /// Time passes (or steps back a little) and the server expires.
        Expire { advance_ms: u64, back: bool },
        /// The aggregator restarts from its own snapshot.
        Restart,
        /// The operator reloads with other limits.
        Reload { total: u64, per_minute: u64 },
    }

    /// A room report relative to the minute it is sent in.
    #[derive(Clone, Debug)]
    struct RandomRoom {
        expiries: Vec<(u64, i64)>,
        admits: Vec<(u64, [u64; 4])>,
        waiting: Vec<(u64, i64)>,
        distinct: Vec<(u64, u64)>,
    }

    fn random_room() -> impl Strategy<Value = RandomRoom> {
        (
            // Expiry slots: seconds from the report on, up to 7 minutes.
            prop::collection::vec((0..420_u64, -5..300_i64), 0..6),
            prop::collection::vec((0..4_u64, prop::array::uniform4(0..40_u64)), 0..4),
            prop::collection::vec((0..5_u64, -3..60_i64), 0..5),
            prop::collection::vec((0..4_u64, 0..400_u64), 0..5),
        )
            .prop_map(|(expiries, admits, waiting, distinct)| RandomRoom {
                expiries,
                admits,
                waiting,
                distinct,
            })
    }

    fn random_step() -> impl Strategy<Value = Step> {
        prop_oneof![
            8 => (
                0..7_usize,
                0..3_usize,
                prop_oneof![4 => 0..2_000_u64, 1 => 0..40_000_u64],
                prop::collection::vec((0..4_usize, random_room()), 0..4),
            )
                .prop_map(|(node, colo, advance_ms, rooms)| Step::Report {
                    node,
                    colo,
                    advance_ms,
                    rooms,
                }),
            1 => (0..200_000_u64, prop::bool::weighted(0.2))
                .prop_map(|(advance_ms, back)| Step::Expire { advance_ms: if back { advance_ms % 3_000 } else { advance_ms }, back }),
            1 => Just(Step::Restart),
            1 => (400..3_000_u64, 10..400_u64)
                .prop_map(|(total, per_minute)| Step::Reload { total, per_minute }),
        ]
    }

    fn three_rooms(total: u64, per_minute: u64) -> Vec<RoomDef> {
        ["shop", "tickets", "random"]
            .into_iter()
            .map(|name| {
                let mut def = room(total, per_minute);
                if name == "random" {
                    let config = RoomConfig {
                        queueing_method: QueueingMethod::Random,
                        ..RoomConfig::with_limits(total, per_minute)
                    };
                    def.room = config.validate().unwrap();
                }
                def.room = def.room.named(name);
                def.name = name.into();
                def
            })
            .collect()
    }

    fn build(
        step_rooms: &[(usize, RandomRoom)],
        defs: &[RoomDef],
        now: UnixMillis,
    ) -> Vec<RoomReport> {
        let m = now.minute();
        step_rooms
            .iter()
            .map(|(r, room)| RoomReport {
                room: defs.get(*r).map_or(RoomId(7), |d| d.room.id()),
                expiries: room
                    .expiries
                    .iter()
                    .map(|&(a, n)| (now.expiry_slot().plus(a), n))
                    .collect(),
                admits: room
                    .admits
                    .iter()
                    .map(|&(b, [e, c, a, u])| MinuteAdmits {
                        minute: m.minus(b),
                        admits: PoolCounts {
                            eligible: e,
                            colo_share: c,
                            anywhere: a,
                            uncapped: u,
                        },
                    })
                    .collect(),
                waiting: room.waiting.iter().map(|&(b, n)| (m.minus(b), n)).collect(),
                distinct_visitors: room
                    .distinct
                    .iter()
                    .map(|&(b, n)| (m.minus(b), n))
                    .collect(),
            })
            .collect()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// The running sums answer exactly as the full recomputation did,
        /// through departures, returns, forgetting, minute rollovers,
        /// restarts from a snapshot and reloads, and keep the same state.
        #[test]
        fn the_incremental_merge_answers_exactly_as_the_full_recomputation(
            steps in proptest::collection::vec(random_step(), 1..60),
            timeout in 1_000..20_000_u64,
            (total, per_minute) in (400..5_000_u64, 10..400_u64),
        ) {
            let defs = three_rooms(total, per_minute);
            let mut cluster = Cluster::new(defs.clone(), timeout);
            let mut reference = recompute::Recomputing::new(defs.clone(), timeout);
            let mut now = T0;
            for step in steps {
                match step {
                    Step::Report { node, colo, advance_ms, rooms } => {
                        now = now.plus_millis(advance_ms);
                        let rooms = build(&rooms, &defs, now);
                        let report = NodeReport {
                            node: format!("n{node}"),
                            colo: format!("c{colo}"),
                            at: now,
                            rooms,
                        };
                        // Even nodes ask on demand (small promises), odd ones do not.
                        let asks = node % 2 == 0;
                        let got = cluster.apply_as(report.clone(), now, asks, None, &[]);
                        let want = reference.apply_as(report, now, asks);
                        proptest::prop_assert_eq!(got, want);
                    }
                    Step::Expire { advance_ms, back } => {
                        now = if back { UnixMillis(now.0 - advance_ms) } else { now.plus_millis(advance_ms) };
                        cluster.expire(now);
                        reference.expire(now);
                    }
                    Step::Restart => {
                        let snapshot = cluster.snapshot(now);
                        if snapshot.nodes.iter().any(|(_, m)| m.last_seen > now) {
                            // The clock stepped back: a restore corrects such
                            // a snapshot (tested on its own), which the
                            // reference does not.
                            continue;
                        }
                        cluster = Cluster::new(cluster.rooms().to_vec(), timeout);
                        // What a restore corrects (leases beyond lowered
                        // limits) the reference takes over from it too.
                        cluster.restore(snapshot, now).unwrap();
                        let restored = cluster.snapshot(now);
                        (reference.reports, reference.meta) = restored.nodes.into_iter().unzip();
                        reference.memory = restored.rooms.into_iter().collect();
                        reference.pace.clear();
                    }
                    Step::Reload { total, per_minute } => {
                        let mut new = three_rooms(total, per_minute);
                        for (def, old) in new.iter_mut().zip(&defs) {
                            def.room = def.room.clone().with_id(old.room.id());
                        }
                        cluster.set_rooms(new.clone()).unwrap();
                        reference.rooms = new;
                    }
                }
                let snapshot = cluster.snapshot(now);
                let nodes: Vec<(NodeReport, NodeMeta)> = reference
                    .reports
                    .iter()
                    .cloned()
                    .zip(reference.meta.iter().cloned())
                    .collect();
                proptest::prop_assert_eq!(&snapshot.nodes, &nodes);
                let memory: Vec<(RoomId, RoomMemory)> =
                    reference.memory.iter().map(|(id, m)| (*id, m.clone())).collect();
                proptest::prop_assert_eq!(&snapshot.rooms, &memory);
            }
        }
    }

    #[test]
    fn rooms_the_aggregator_does_not_serve_get_no_answer() {
        let mut cluster = Cluster::new(vec![room(1_000, 100)], 5_000);
        let mut other = sessions(T0, 1, 0, 1);
        other.room = RoomId::from_name("elsewhere");
        let answer = cluster.apply(report("a", "x", T0, other), T0);
        assert!(answer.is_empty());
    }
}
