//! The discrete-event core: C colos × N nodes, one aggregator, visitors, all
//! in virtual time, driving the real engine and the real aggregator.
//!
//! Nothing here decides anything. Every request is
//! [`decide`] on the node's own
//! [`RoomCounters`], with the [`GlobalState`] the node holds; every report is
//! the node's [`RoomCounters::report`], merged by the aggregator's own
//! [`Cluster::apply`] (departed nodes, the Anywhere lease ledger); every answer
//! is taken in as the node takes it in (the share smoothing of the gossip
//! client, fresh answer or local-only state as in the node's refresh). This
//! module only moves time forward, carries reports and answers across the
//! gossip delay, and writes down what happened.
//!
//! # Gossip
//! Each node reports on its own tick, `gossip_interval_ms` apart; the ticks
//! of the nodes are spread evenly over the interval ([`Phases::Staggered`],
//! as real nodes started at different moments are) or all at the same
//! instant ([`Phases::Aligned`]). A report reaches the aggregator half a
//! gossip delay after it was made and is applied there at that instant; the
//! answer reaches the node `gossip_delay_ms` after the report was made. Like
//! the real gossip client, a node has one exchange in flight at a time: its
//! next report goes out on its next tick after the answer came back (so with
//! a delay longer than the interval it reports once per delay). A report sent
//! during an outage ([`Sim::with_outage`]) is lost; the node tries again when
//! the client would, after its answer timeout.
//!
//! # Several aggregators
//! With `--aggregators K`, node `i`'s home is aggregator `i % K`: its
//! reports are applied there as home reports (granted to) and at every
//! other aggregator, at the same instant, as peer reports naming the leases
//! the node holds then (its asks too, which the edge sends to its home
//! alone). When an answer from its home raises what the node holds
//! (`HeldLease::raised`, the edge's rule: a higher cap in the same minute,
//! or a lease of a later minute), the node also sends its peer reports at
//! once, as the edge's gossip client does (`Homes::raised`): over the open
//! connections, like an ask, so they reach the peers half a `lease_rtt_ms`
//! later. Without
//! them (`--no-raised-peer-reports`) the peers hear of the raised lease only
//! with the node's next report.
//!
//! # The harsher network ([`Conditions`])
//! Answers can be lost (the report was applied; the node waits for its answer
//! timeout, reports again, and after [`MAX_MISSED_ANSWERS`] in a row
//! reconnects with the client's backoff) or held back by up to two intervals
//! (taken late within the timeout, else dropped unread: the client reads only
//! the answer it waits for). [`Phases::Random`] puts the nodes out of phase
//! with jitter per report. Clock skew gives each node a fixed offset used for
//! everything it does: deciding, counting, reporting, the tickets it issues.
//!
//! # What a node decides with
//! As `Node::refresh_from_world` in `waitroom-edge`: the last answer while it
//! is at most `stale_after_ms` old, else the local-only state
//! ([`local_only_state`]) with the share smoothed over the answers, recomputed
//! every 200 ms (the node's refresh tick) while stale.
//!
//! # Checking the ledger
//! After every report applied, the sim adds up the Anywhere slots the leases
//! handed out so far still leave unused (each node's latest answer, at the
//! node's reported admits) and compares them with the Anywhere pool of that
//! moment, recomputed with `aggregate` from what the aggregator holds. It
//! does the same for the leases the engine alone would have granted (its
//! share of the pool, before the ledger's clamp): the ledger is what keeps
//! the first count at zero while the second is not.
//!
//! # Visitors
//! A visitor arrives at one node and stays with it, or (roaming) sends each
//! request to a random node of their colo with the ticket they hold. Some
//! may give up once queued past a time drawn per visitor. Queued, they check in
//! when their ticket allows (`next_check_in`) plus a little network latency;
//! admitted, they request a page every ~15 s while they browse, then stop,
//! and their session ends `session_duration` minutes after the last request.
use std::{
    cmp::Reverse,
    collections::{BTreeMap, BinaryHeap},
};

use rand::{Rng, RngExt as _, SeedableRng, rngs::ChaCha8Rng};
use serde::Serialize;
use waitroom_common::{
    aggregate::{NodeReport, aggregate},
    cluster::{
        Cluster, Lease, PromisePolicy, RoomDef,
        grants::GrantLedger,
        promise::{ask_timeout_ms, ask_within_hold_ms},
    },
    counters::RoomCounters,
    engine::{AdmitReason, Decision, QueueReason, decide, is_new_visitor, short_of_slots},
    ledger::TicketLedger,
    room::Room,
    share::{local_only_state, observed_share, own_counts, smooth_share, within_lease},
    state::{AdmitRate, GlobalState},
    ticket::Ticket,
    time::{MILLIS_PER_MINUTE, Minute, UnixMillis},
    wire::{HeldLease, HeldVisitors, RoomAnswer},
};

/// The instant the simulation starts: a minute boundary (14 Nov 2023 22:14 UTC).
pub const START: UnixMillis = UnixMillis(1_700_000_040_000);

/// Cluster shape, gossip timing and the timeouts of node and aggregator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Topology {
    pub colos: usize,
    pub nodes_per_colo: usize,
    /// Age of the report an answer was computed from when the node receives it
    /// (half of it on the way to the aggregator, half on the way back).
    pub gossip_delay_ms: u64,
    /// Time between two reports of a node.
    pub gossip_interval_ms: u64,
    /// When in the interval each node reports.
    pub phases: Phases,
    /// The node's `aggregator.stale_after_ms`: older answers are not used.
    pub stale_after_ms: u64,
    /// The aggregator's `node_timeout_ms`: a node silent this long has departed.
    pub node_timeout_ms: u64,
    /// What a node's answer carries as its Anywhere allowance.
    pub grants: Grants,
    /// The harsher network and visitors (all off by default).
    pub conditions: Conditions,
}

/// The conditions of the harsher simulator, each one a flag of
/// `cargo xtask simulate` (and all off in [`Conditions::NONE`], but for
/// what the edge's gossip client does when an answer is late, on there as
/// on the command line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conditions {
    /// Percent of answers lost on the way back (the report was applied).
    pub lost_answers_pct: u32,
    /// Percent of answers held back by up to two gossip intervals more, so
    /// they arrive after the answer to the node's next report would have.
    pub reordered_answers_pct: u32,
    /// Each node's clock is off by a fixed offset, uniform in ±this.
    pub skew_ms: u64,
    /// A node counts on the cluster's clock once an answer came, as the
    /// edge does (`Clock::following`): its clock is then the aggregator's
    /// reading carried forward, within the round trip that bounds it. Off:
    /// every node counts on its own (skewed) wall clock, as nodes did before
    /// they followed (to show what following buys).
    pub follow_clock: bool,
    /// The answer to an out-of-cycle ask is waited for
    /// `promise::ask_timeout_ms` (a few round trips), then the node reports
    /// again at once, as the edge's gossip client does; off: it waits as for
    /// a periodic answer (`answer_timeout_ms`), as the client did before.
    pub ask_again_when_lost: bool,
    /// With `ask_again_when_lost`, a held visitor's ask whose answer is late
    /// is sent again in time for that answer to come within the hold
    /// (`promise::ask_within_hold_ms`), as the edge's gossip client does;
    /// off (`--ask-again-late`): after `promise::ask_timeout_ms` (at least
    /// 100 ms, when the hold of `lease_wait_ms`, 50, has queued the visitor
    /// already), as the client did before.
    pub ask_within_hold: bool,
    /// With `ask_again_when_lost`, a report confirming a lowered cap whose
    /// answer is late is waited for as an ask (`promise::ask_timeout_ms`),
    /// then the node reports again at once, as the edge's gossip client
    /// does; off (`--confirm-waited-full`): it is waited for as a periodic
    /// report (`answer_timeout_ms`, 2 s), and no ask goes meanwhile, as the
    /// client did before.
    pub confirm_like_ask: bool,
    /// With `ask_again_when_lost`, the first report sent again after a
    /// lost ask or confirmation is itself waited for as the one it repeats
    /// (`ask_within_hold_ms` for a held visitor's ask, `ask_timeout_ms` for
    /// a confirmation), and sent again at once if its answer is late too; a
    /// second one sent again is waited for as a periodic report, as the
    /// edge's gossip client does since session 22. Off
    /// (`--again-waited-full`): every report sent again is waited for as a
    /// periodic report (2 s), as the client did before.
    pub again_like_ask: bool,
    /// A node that asks says in each report to its home how many visitors
    /// it holds now (`Message::HeldReport`), and is promised at least that
    /// many (`Cluster::apply_held`), as the edge's gossip client does since
    /// session 23. Off (`--held-unnamed`): its counts alone say it, and a
    /// report sent again after a lost ask reads as no need.
    pub name_held_visitors: bool,
    /// A held visitor whose hold an answer counted and still left short of
    /// slots is held on for one more answer within the hold, and the node
    /// asks again at once, as the edge's `LeaseAsk::hold` does since
    /// session 23. Off (`--hold-once`): they decide on that answer (and
    /// are queued).
    pub hold_again: bool,
    /// The aggregator's promise to an asking node covers at most half the
    /// time the minute's slots last at the room's recent pace
    /// (`PromisePolicy::recent_pace`, since session 24). Off
    /// (`--average-pace-only`): only the minute's average paces it.
    pub recent_pace: bool,
    /// Each request of a visitor goes to a random node of their colo.
    pub roaming: bool,
    /// Percent of visitors who give up once queued this long.
    pub give_up_pct: u32,
    pub give_up_after_ms: u64,
    /// Check the Anywhere ledger after every report (O(nodes) per report:
    /// off for the scale run).
    pub check_ledger: bool,
    /// The on-demand lease (`aggregator.lease_wait_ms` of the nodes): a new
    /// visitor short of slots is held this long at most while the node asks
    /// out of cycle; 0: off, and the aggregator promises fair parts.
    pub lease_wait_ms: u64,
    /// Round trip of an out-of-cycle ask (over the open connection; the
    /// gossip delay is the age of the periodic answers, not a round trip).
    pub lease_rtt_ms: u64,
    /// How far ahead the aggregator's promise to an asking node covers its
    /// recent rate (`PromisePolicy::horizon_ms`).
    pub promise_horizon_ms: u64,
    /// Aggregators (issue 20): node `i`'s home is aggregator `i % K`, and
    /// every report also goes to the others as a peer report
    /// (`Cluster::apply_peer`), each a `Cluster` of its own.
    pub aggregators: u32,
    /// Peer reports say which leases the node holds from its home (the
    /// real system); off: they say none, to show what that buys.
    pub peer_leases: bool,
    /// A node whose home's answer raised what it holds sends its peer
    /// reports at once, as the edge does (`Homes::raised`), over the open
    /// connections: they reach the peers half a `lease_rtt_ms` later. Off:
    /// the peers hear of it only with the node's next report.
    pub raised_peer_reports: bool,
    /// Every aggregator commits its grants of both shared pools (colo share
    /// and Anywhere, one cap per node) to one grant ledger per minute
    /// (`cluster::grants::GrantLedger`, the code the etcd ledger runs, here
    /// without the store's latency) before answering: what the replicated
    /// ledger of docs/adr/0001 buys.
    pub shared_ledger: bool,
}

impl Conditions {
    /// The simulator as it was: nothing lost, no skew, visitors stay and wait.
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "the command line sets every field")
    )]
    pub const NONE: Self = Self {
        lost_answers_pct: 0,
        reordered_answers_pct: 0,
        skew_ms: 0,
        follow_clock: true,
        ask_again_when_lost: true,
        ask_within_hold: true,
        confirm_like_ask: true,
        again_like_ask: true,
        name_held_visitors: true,
        hold_again: true,
        recent_pace: true,
        roaming: false,
        give_up_pct: 0,
        give_up_after_ms: 0,
        check_ledger: true,
        lease_wait_ms: 0,
        lease_rtt_ms: 0,
        promise_horizon_ms: 2_000,
        aggregators: 1,
        peer_leases: true,
        raised_peer_reports: true,
        shared_ledger: false,
    };
}

/// The Anywhere allowance handed to the nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Grants {
    /// The ledger's grant, as the aggregator answers (the real system).
    Ledger,
    /// The engine's share of the pool, unclamped: an experiment that shows
    /// what the ledger changes.
    EngineShare,
}

/// When in the gossip interval the nodes report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Phases {
    /// Node `i` of `n` reports `i/n` of an interval after node 0.
    Staggered,
    /// Every node reports at the same instant (the simulator before the ledger was in it).
    Aligned,
    /// Each node at a random point of the interval, and each report up to a
    /// tenth of an interval late (the task was busy): out of phase.
    Random,
}

impl Topology {
    #[must_use]
    pub fn nodes(&self) -> usize {
        self.colos * self.nodes_per_colo
    }

    /// The index of node `node` of colo `colo`.
    #[must_use]
    pub fn node(&self, colo: usize, node: usize) -> usize {
        colo * self.nodes_per_colo + node
    }

    /// When node `node` first reports; `draw` is uniform in `[0, 1)` (used by
    /// [`Phases::Random`] only).
    #[must_use]
    pub fn phase_ms(&self, node: usize, draw: f64) -> u64 {
        match self.phases {
            Phases::Staggered => self.gossip_interval_ms * node as u64 / self.nodes() as u64,
            Phases::Aligned => 0,
            Phases::Random => (self.gossip_interval_ms as f64 * draw) as u64,
        }
    }

    /// How long the gossip client waits for an answer: two intervals, at
    /// least 1 s (`Client::answer_timeout`). The simulator waits at least one
    /// gossip delay too, so that a delay longer than the timeout (the 3 s
    /// runs) still delivers its answers, as it did before answers could be
    /// lost.
    #[must_use]
    pub fn answer_timeout_ms(&self) -> u64 {
        (2 * self.gossip_interval_ms)
            .max(1_000)
            .max(self.gossip_delay_ms)
    }

    /// When traffic starts: after the first answer has reached every node
    /// (before it a node knows no slot and would queue everyone), on a minute
    /// boundary so that arrival minutes are queue buckets.
    #[must_use]
    pub fn warmup_ms(&self) -> u64 {
        (self.gossip_delay_ms + self.gossip_interval_ms + 1_000).next_multiple_of(MILLIS_PER_MINUTE)
    }
}

/// One visitor as the traffic generator made them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// Milliseconds after [`START`].
    pub at_ms: u64,
    /// Index of the node the visitor talks to.
    pub node: usize,
    /// How long they browse once admitted.
    pub browse_ms: u64,
}

/// What happened to one visitor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub arrival_ms: u64,
    pub node: usize,
    /// Arrival minute (the ticket's bucket), counted from [`START`].
    pub bucket: u64,
    pub admitted_ms: Option<u64>,
    /// Was queued at least once.
    pub queued: bool,
    /// Gave up waiting (and was never admitted).
    pub gave_up: bool,
    /// Requests of this visitor reached more than one node.
    pub roamed: bool,
}

impl Outcome {
    /// Seconds from arrival to admission.
    #[must_use]
    pub fn wait_secs(&self) -> Option<f64> {
        self.admitted_ms
            .map(|a| (a - self.arrival_ms) as f64 / 1_000.0)
    }
}

/// The first time the engine queued someone for lack of a slot.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FirstQueue {
    pub at_ms: u64,
    /// Visitors with a live session then (ground truth).
    pub active: u64,
    /// Admits in that minute so far.
    pub admits_this_minute: u64,
}

/// One row of the timeline.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Sample {
    pub at_s: u64,
    /// Visitors with a live session (ground truth).
    pub active: u64,
    /// Active users as the node counters count them (to the end of the expiry slot, a second).
    pub active_counted: i64,
    pub admits_this_minute: u64,
    pub queued: u64,
}

/// Everything a run produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    pub outcomes: Vec<Outcome>,
    pub peak_active: u64,
    pub peak_active_counted: i64,
    /// Admits (slots taken, not session renewals) per minute after [`START`].
    pub admits_per_minute: BTreeMap<u64, u64>,
    pub first_queue: Option<FirstQueue>,
    /// Visitors first queued while both limits were less than 90 % used.
    pub queued_early: u64,
    pub timeline: Vec<Sample>,
    /// Decisions the engine made.
    pub decisions: u64,
    /// Of those, made with the local-only state (the node's answer was stale).
    pub local_only_decisions: u64,
    pub ledger: LedgerCheck,
    /// Reports the aggregator applied while it counted some node departed.
    pub applied_with_departed: u64,
    pub end_ms: u64,
    /// Visitors first queued while both limits were less than 98 % used
    /// (the target of issue 15: none).
    pub queued_below_target: u64,
    /// Of those, visitors queued while others were already waiting (FIFO
    /// keeps the minute's slots for the queue's check-ins first).
    pub queued_below_target_behind_queue: u64,
    /// Of those, visitors queued while both limits would have stayed less
    /// than 98 % used with every visitor already waiting admitted as well:
    /// room the line ahead could not fill, so early even in a FIFO room,
    /// where a newcomer behind a line that fills the room must wait (what
    /// the target is judged on).
    pub queued_below_target_line_fits: u64,
    /// The counters' active users against the true number, every second.
    pub counted_error: CountedError,
    /// What the network did to the gossip.
    pub gossip: GossipCounts,
    /// With `--shared-ledger`: what the checker found.
    pub shared: SharedAudit,
    /// Each node's clock minus the true time at the end of the run.
    pub clock_offsets_ms: Vec<i64>,
}

/// With `--shared-ledger`, the checker of issue 20 (item 3) over the shared
/// ledger, which plays etcd: every grant is recorded there, and every
/// report's admits are checked against the cap the node held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SharedAudit {
    /// Grants the ledger cut (another home had granted the slots first).
    pub cuts: u64,
    /// Reports from a node that already held a cap in the ledger for the
    /// minute of its admits.
    pub checked: u64,
    /// Of them, a node whose shared admits (colo share and Anywhere) in the
    /// minute passed that cap: a slot no grant covered.
    pub overspent: u64,
    /// Commits after which the minute's caps summed past the room's
    /// per-minute limit (a slot granted twice).
    pub over_limit: u64,
}

/// How far the active users the node counters count (summed over the nodes,
/// each at its own clock's second) are from the true number, over the samples
/// taken in the last millisecond of every second.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CountedError {
    /// Worst |counted − true| ÷ true where true is at least
    /// [`COUNTED_FLOOR`] of the total (the target's measure).
    pub worst_relative: f64,
    /// When that was, in seconds after [`START`].
    pub worst_relative_at_s: Option<u64>,
    /// Worst |counted − true| ÷ the total limit, over every sample.
    pub worst_of_total: f64,
    /// Worst |counted − true| ÷ true over every sample with true > 0.
    pub worst_relative_any: f64,
}

/// Gossip exchanges and what became of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GossipCounts {
    pub reports: u64,
    /// Answers taken in by their node.
    pub answers_taken: u64,
    /// Answers lost on the way (`--lost-answers-pct`) or reports lost in an outage.
    pub lost: u64,
    /// Answers held back (`--reordered-answers-pct`) but still in time.
    pub late_taken: u64,
    /// Held-back answers that came after the node had stopped waiting for
    /// them: ignored, as the client reads only the answer it waits for.
    pub late_ignored: u64,
    /// Exchanges the node stopped waiting for (answer timeout).
    pub timeouts: u64,
    /// Connections dropped after [`MAX_MISSED_ANSWERS`] timeouts in a row.
    pub reconnects: u64,
    /// Out-of-cycle asks of the on-demand lease, visitors held on them, and
    /// holds that ended without an answer (the node then holds nobody until
    /// its next answer).
    pub lease_asks: u64,
    /// Reports sent at once after an ask's answer did not come within
    /// `promise::ask_timeout_ms` (counted in `lease_asks` too).
    pub asks_again: u64,
    /// Reports sent at once to confirm a cap an answer had lowered, and
    /// those of them lost (not in `lost`).
    pub confirms: u64,
    pub confirms_lost: u64,
    /// Confirmations sent again at once after a confirmation's answer did
    /// not come within `promise::ask_timeout_ms` (counted in `confirms`
    /// too; only with `Conditions::confirm_like_ask`).
    pub confirms_again: u64,
    /// Waits for a lost answer cut short by a visitor held meanwhile
    /// (`Conditions::ask_within_hold`): the report went again sooner.
    pub cut_short: u64,
    /// Peer reports sent at once because the home's answer raised what the
    /// node holds (one per other aggregator).
    pub raised_peer_reports: u64,
    pub lease_holds: u64,
    pub lease_holds_timed_out: u64,
    /// Held visitors held on once after an answer left them short.
    pub lease_holds_again: u64,
    /// Largest |report time − true time| over all reports, in ms (the skew).
    pub max_report_skew_ms: u64,
    /// Answers taken in that were computed before the one the node held:
    /// the client must never go back (0 unless the simulator is wrong).
    pub went_back: u64,
    /// Report entries the aggregator found implausible (`Cluster::check_plausible`):
    /// dropped for a future minute, or clamped to their bound.
    pub aggregator_future_minute: u64,
    pub aggregator_clamped: u64,
}

/// The ledgers of shared leases (colo shares and Anywhere together), checked
/// after every report the aggregator applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LedgerCheck {
    /// Reports applied, each followed by one check.
    pub checks: u64,
    /// Checks where the shared slots leased and not yet used (colo shares
    /// and Anywhere) exceeded the round's shared slots. The ledgers exist to
    /// keep this at 0.
    pub over_pool: u64,
    /// Of those, checks where a lease granted in an earlier minute still
    /// counted (its bare allowance, which the holder may spend on the new
    /// minute until its next answer).
    pub over_pool_carried: u64,
    /// Most slots by which the leases exceeded the pool, all of them granted
    /// in the current minute (the pool shrank after they were granted).
    pub worst_excess: u64,
    /// The same where a lease of an earlier minute counted.
    pub worst_excess_carried: u64,
    /// The same count for the leases the engine alone would have granted
    /// (each node's shares of the pools, unclamped) at the same moments.
    pub over_pool_without_ledger: u64,
    /// Most slots by which those unclamped leases exceeded the pool.
    pub worst_excess_without_ledger: u64,
    /// Answers whose shared allowance (both pools) the ledgers cut below the
    /// engine's shares.
    pub clamped: u64,
}

/// A node's two shared leases: (colo share, Anywhere).
type SharedLeases = (Lease, Lease);

/// When a run stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    /// At this many milliseconds after [`START`].
    Time(u64),
    /// Once every visitor has been admitted, or at this time at the latest.
    AllAdmitted { latest_ms: u64 },
}

/// Mean time between an admitted visitor's page requests.
const PAGE_INTERVAL_MS: u64 = 15_000;
/// Most a check-in arrives after the ticket allows it (browser and network).
const CHECK_IN_LATENCY_MS: u64 = 500;
/// A visitor queued while both limits are less than this much used was queued early.
pub const EARLY: f64 = 0.9;
/// Issue 15's target: nobody queued while both limits are less than this much used.
pub const EARLY_TARGET: f64 = 0.98;
/// The counted-vs-true target is judged where the true number is at least
/// this share of the total (below it a few sessions are a large relative error).
pub const COUNTED_FLOOR: f64 = 0.1;
/// Unanswered exchanges in a row after which the gossip client drops the
/// connection and reconnects (`MAX_MISSED_ANSWERS` in the edge's client).
pub const MAX_MISSED_ANSWERS: u32 = 2;
/// The client's reconnect backoff: first delay, doubling up to the cap,
/// "equal jitter" (`BACKOFF_BASE`, `BACKOFF_CAP` in the edge's client).
const BACKOFF_BASE_MS: u64 = 100;
const BACKOFF_CAP_MS: u64 = 5_000;
/// Timeline resolution; peaks are sampled every second.
const TIMELINE_EVERY_MS: u64 = 10_000;

/// Where in each second the samples are taken (see [`Sim::sample`]).
const SAMPLE_PHASE_MS: u64 = 999;
/// How often the node recomputes a local-only state (its refresh tick).
const REFRESH_MS: u64 = 200;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// Node `.0` sends a report.
    Report(usize),
    /// The report of exchange `.0` reaches the aggregator.
    Apply(u64),
    /// The answer of exchange `.0` reaches its node.
    Deliver(u64),
    /// Node of exchange `.0` stops waiting for its answer.
    Timeout(u64),
    Sample,
    Arrive(usize),
    Request(usize),
    SessionEnd(usize),
    /// Visitor `.0`'s hold at node `.1` ends (`lease_wait_ms` passed).
    HoldEnd(usize, usize),
    /// Node `.0` stops waiting for the answer to its out-of-cycle ask.
    AskTimeout(usize),
    /// The peer reports sent at once after a raised lease (`.0` in
    /// `Sim::peer_reports`) reach the other aggregators.
    PeerReport(u64),
}

/// Why a node reports out of cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ask {
    /// For visitors held on the on-demand lease (or a prefetch).
    Hold,
    /// To confirm a cap an answer lowered (counted apart, its loss too, so
    /// the periodic reports' counts stay what they were).
    Confirm,
    /// At once, after an ask's answer did not come within its wait.
    Again,
    /// At once, after a confirmation's answer did not come within its wait
    /// (with `Conditions::confirm_like_ask`): counted as a confirmation.
    ConfirmAgain,
    /// At once, after the answer to a report sent again did not come within
    /// its wait either (with `Conditions::again_like_ask`): counted as the
    /// report it repeats.
    AgainLast { confirm: bool },
}

/// The last answer a node took in: the node's `World` for this one room.
#[derive(Debug)]
struct Heard {
    /// The node's clock when the answer arrived.
    received_ms: u64,
    /// The aggregator answered for the room (its state is then the node's).
    answered: bool,
    /// The smoothed share, carried over answers (`RoomView::share`).
    share: Option<f64>,
}

#[derive(Debug)]
struct Node {
    name: String,
    colo: String,
    counters: Box<RoomCounters>,
    /// Where each ticket's count sits on this node (the edge's ticket ledger).
    ledger: Box<TicketLedger>,
    /// What `decide` is handed.
    state: GlobalState,
    heard: Option<Heard>,
    /// When `state` was last computed as local-only; `None` while it is the answer's.
    local_since_ms: Option<u64>,
    /// The last answer's state, kept when the node goes local-only.
    lease: Option<GlobalState>,
    /// The node's admit rate for local-only states.
    rate: AdmitRate,
    /// The node's last gossip tick (its report went out then, plus jitter).
    tick_ms: u64,
    /// When the node last reported at once to confirm a lowered cap (at
    /// most once per interval, as the edge's gossip client does).
    confirmed_ms: Option<u64>,
    /// The node's clock minus the true time: its wall clock's skew
    /// (`--skew-ms`) until it follows the cluster's clock, then the offset
    /// the answers bound (see [`Sim::follow`]).
    offset_ms: i64,
    /// The node's clock follows the cluster's (an answer came).
    following: bool,
    /// The exchange whose answer the node waits for: the only answer it reads.
    in_flight: Option<u64>,
    /// Unanswered exchanges in a row.
    missed: u32,
    /// Reconnect attempts since the last answer (the backoff's exponent).
    reconnect_attempt: u32,
    /// Visitors held for an on-demand lease.
    held: Vec<HeldVisitor>,
    /// An out-of-cycle ask is outstanding until this instant (its answer,
    /// or the answer timeout when it is lost).
    asking_until: Option<u64>,
    /// A visitor was held while an ask made before its hold was out: that
    /// ask does not count them, so another goes when it is answered (the
    /// edge's `LeaseAsk`: one report for every hold begun since the last).
    ask_again: bool,
    /// A hold ended without an answer: nobody is held until the next one.
    degraded: bool,
    /// The node's ask (or confirmation) is lost, and the node stops waiting
    /// for its answer at this instant, to report again at once: an ask sent
    /// again ([`Ask::Again`]) or a confirmation ([`Ask::ConfirmAgain`]).
    ask_lost_until: Option<(u64, Ask)>,
}

/// Peer reports a node sent at once after its home raised its lease, on
/// their way to the other aggregators (their answers grant nothing).
#[derive(Debug)]
struct PeerReports {
    node: usize,
    report: NodeReport,
    held: Vec<HeldLease>,
}

/// One report on its way to the aggregator, then its answer on the way back.
#[derive(Debug)]
struct Exchange {
    node: usize,
    sent_ms: u64,
    report: NodeReport,
    answers: Vec<RoomAnswer>,
    /// When the answer reaches the node, if it does.
    answer_ms: Option<u64>,
    /// An out-of-cycle ask of the on-demand lease (beside the periodic
    /// exchange, which it neither waits for nor replaces).
    on_demand: bool,
    /// The visitors the node held as it reported.
    held_visitors: u64,
}

/// A visitor held for an on-demand lease.
#[derive(Clone, Copy, Debug)]
struct HeldVisitor {
    visitor: usize,
    /// The node's minute the hold began in (counted as held in the node's
    /// counters meanwhile).
    minute: Minute,
    /// When the hold (or its holding on) began: only an answer to a report
    /// made since releases them.
    since_ms: u64,
    /// Held on after an answer counted them and left them short
    /// (`Conditions::hold_again`); once only.
    again: bool,
}

#[derive(Clone, Copy, Debug)]
struct Visitor {
    arrival: Arrival,
    ticket: Option<Ticket>,
    admitted_ms: Option<u64>,
    queued: bool,
    /// Ground truth: the session runs until this instant.
    session_end_ms: Option<u64>,
    /// The node whose ticket set the session's end, and that end on its
    /// clock: the session ends when that node's clock reaches it.
    session_end_at: Option<(usize, UnixMillis)>,
    /// Queued, this visitor stops checking in from this instant (`--give-up-*`).
    gives_up_ms: Option<u64>,
    gave_up: bool,
    /// The node of the visitor's last request.
    last_node: Option<usize>,
    roamed: bool,
}

/// The simulation of one room on one cluster.
pub struct Sim {
    room: Room,
    topology: Topology,
    nodes: Vec<Node>,
    /// The aggregator: the real one's memory, fed at virtual times.
    cluster: Cluster,
    /// With `--aggregators K`, aggregators 1..K (the first is `cluster`).
    peers: Vec<Cluster>,
    /// With `--shared-ledger`: the grant ledger of each minute, and how
    /// many grants it cut.
    shared: BTreeMap<Minute, GrantLedger>,
    shared_audit: SharedAudit,
    /// Reports sent from `.0` until `.1` (ms after [`START`]) are lost.
    outage: Option<(u64, u64)>,
    /// Each node's latest lease as answered: with the ledger, and as the
    /// engine alone would have granted it.
    leases: BTreeMap<String, (SharedLeases, SharedLeases)>,
    visitors: Vec<Visitor>,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    rng: ChaCha8Rng,
    /// The network's and visitors' draws (phases, skew, losses, roaming):
    /// a stream apart, so that with every condition off the engine's draws
    /// and so the results are those of the simulator before the conditions.
    net_rng: ChaCha8Rng,
    exchanges: BTreeMap<u64, Exchange>,
    next_exchange: u64,
    /// Peer reports sent at once and not yet arrived, by the id of their
    /// [`Event::PeerReport`] (numbered with the exchanges).
    peer_reports: BTreeMap<u64, PeerReports>,
    // What is measured.
    active: u64,
    peak_active: u64,
    peak_active_counted: i64,
    queued_now: u64,
    admitted: usize,
    given_up: usize,
    queued_below_target: u64,
    queued_below_target_behind_queue: u64,
    queued_below_target_line_fits: u64,
    counted_error: CountedError,
    gossip: GossipCounts,
    admits_per_minute: BTreeMap<u64, u64>,
    first_queue: Option<FirstQueue>,
    queued_early: u64,
    timeline: Vec<Sample>,
    decisions: u64,
    local_only_decisions: u64,
    ledger: LedgerCheck,
    applied_with_departed: u64,
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim")
            .field("topology", &self.topology)
            .field("visitors", &self.visitors.len())
            .finish_non_exhaustive()
    }
}

impl Sim {
    /// A cluster for `room` with `arrivals`; `seed` drives the engine's
    /// randomness and the visitors' timing (the arrivals are already made).
    #[must_use]
    pub fn new(room: Room, topology: Topology, arrivals: &[Arrival], seed: u64) -> Self {
        assert!(topology.nodes() > 0, "a cluster needs a node");
        assert!(topology.gossip_interval_ms > 0, "nodes report on a tick");
        let nodes = (0..topology.colos)
            .flat_map(|c| (0..topology.nodes_per_colo).map(move |n| (c, n)))
            .map(|(c, n)| Node {
                name: format!("c{c}-n{n}"),
                colo: format!("c{c}"),
                counters: RoomCounters::new_boxed(room.id()),
                // Seeded per node, as the edge draws a key per ledger file.
                ledger: TicketLedger::new_boxed(1 << 16, [c as u64 + 1, n as u64 + 1]),
                state: GlobalState::empty(START),
                heard: None,
                local_since_ms: None,
                lease: None,
                rate: AdmitRate::default(),
                tick_ms: 0,
                confirmed_ms: None,
                offset_ms: 0,
                following: false,
                in_flight: None,
                missed: 0,
                reconnect_attempt: 0,
                held: Vec::new(),
                asking_until: None,
                ask_again: false,
                degraded: false,
                ask_lost_until: None,
            })
            .collect::<Vec<_>>();
        let aggregator = || {
            Cluster::new(
                vec![RoomDef {
                    // Only the aggregator's log lines name it.
                    name: format!("room-{}", room.id().0),
                    room: room.clone(),
                }],
                topology.node_timeout_ms,
            )
            .with_promises(PromisePolicy {
                horizon_ms: topology.conditions.promise_horizon_ms,
                recent_pace: topology.conditions.recent_pace,
                ..PromisePolicy::default()
            })
        };
        let aggregator = || {
            if topology.conditions.shared_ledger {
                aggregator().with_shared_ledger()
            } else {
                aggregator()
            }
        };
        let cluster = aggregator();
        let peers = (1..topology.conditions.aggregators.max(1))
            .map(|_| aggregator())
            .collect();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // A stream of its own, so traffic made from the same seed is independent of it.
        rng.set_stream(2);
        let mut net_rng = ChaCha8Rng::seed_from_u64(seed);
        net_rng.set_stream(3);
        let mut give_up_rng = ChaCha8Rng::seed_from_u64(seed);
        give_up_rng.set_stream(4);
        let mut sim = Self {
            room,
            topology,
            nodes,
            cluster,
            peers,
            shared: BTreeMap::new(),
            shared_audit: SharedAudit::default(),
            outage: None,
            leases: BTreeMap::new(),
            visitors: Vec::with_capacity(arrivals.len()),
            events: BinaryHeap::new(),
            seq: 0,
            rng,
            net_rng,
            exchanges: BTreeMap::new(),
            next_exchange: 0,
            peer_reports: BTreeMap::new(),
            active: 0,
            peak_active: 0,
            peak_active_counted: 0,
            queued_now: 0,
            admitted: 0,
            given_up: 0,
            queued_below_target: 0,
            queued_below_target_behind_queue: 0,
            queued_below_target_line_fits: 0,
            counted_error: CountedError::default(),
            gossip: GossipCounts::default(),
            admits_per_minute: BTreeMap::new(),
            first_queue: None,
            queued_early: 0,
            timeline: Vec::new(),
            decisions: 0,
            local_only_decisions: 0,
            ledger: LedgerCheck::default(),
            applied_with_departed: 0,
        };
        let conditions = topology.conditions;
        for (i, &arrival) in arrivals.iter().enumerate() {
            assert!(arrival.node < topology.nodes(), "arrival at a missing node");
            let gives_up = conditions.give_up_pct > 0
                && give_up_rng.random_range(0..100) < conditions.give_up_pct;
            sim.visitors.push(Visitor {
                arrival,
                ticket: None,
                admitted_ms: None,
                queued: false,
                session_end_ms: None,
                session_end_at: None,
                gives_up_ms: gives_up.then_some(arrival.at_ms + conditions.give_up_after_ms),
                gave_up: false,
                last_node: None,
                roamed: false,
            });
            sim.schedule(arrival.at_ms, Event::Arrive(i));
        }
        for node in 0..topology.nodes() {
            let draw = if topology.phases == Phases::Random {
                sim.net_rng.random::<f64>()
            } else {
                0.0
            };
            let phase = topology.phase_ms(node, draw);
            if conditions.skew_ms > 0 {
                let skew = conditions.skew_ms as i64;
                sim.nodes[node].offset_ms = sim.net_rng.random_range(-skew..=skew);
            }
            sim.nodes[node].tick_ms = phase;
            sim.schedule(phase, Event::Report(node));
        }
        // The last millisecond of every second: the counters count a session
        // to the end of its one-second expiry slot, so this is when they run
        // furthest ahead of the truth (sampling at a slot's start would hide it).
        sim.schedule(SAMPLE_PHASE_MS, Event::Sample);
        sim
    }

    /// The aggregator is out of reach from `from_ms` until `to_ms`: reports
    /// sent then get no answer.
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "only the unit tests cut the gossip")
    )]
    #[must_use]
    pub fn with_outage(mut self, from_ms: u64, to_ms: u64) -> Self {
        self.outage = Some((from_ms, to_ms));
        self
    }

    fn schedule(&mut self, at_ms: u64, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((at_ms, self.seq, event)));
    }

    /// Runs the event loop and returns what happened.
    #[must_use]
    pub fn run(mut self, until: Until) -> Run {
        let end = match until {
            Until::Time(t) | Until::AllAdmitted { latest_ms: t } => t,
        };
        let mut now_ms = 0;
        while let Some(Reverse((at_ms, _, event))) = self.events.pop() {
            if at_ms > end {
                break;
            }
            now_ms = at_ms;
            self.handle(event, at_ms);
            if matches!(until, Until::AllAdmitted { .. })
                && self.admitted + self.given_up == self.visitors.len()
            {
                break;
            }
        }
        let [(_, future), (_, clamped)] = self.cluster.implausible_by_reason();
        self.gossip.aggregator_future_minute = future;
        self.gossip.aggregator_clamped = clamped;
        Run {
            outcomes: self
                .visitors
                .iter()
                .map(|v| Outcome {
                    arrival_ms: v.arrival.at_ms,
                    node: v.arrival.node,
                    bucket: v.arrival.at_ms / MILLIS_PER_MINUTE,
                    admitted_ms: v.admitted_ms,
                    queued: v.queued,
                    gave_up: v.gave_up,
                    roamed: v.roamed,
                })
                .collect(),
            peak_active: self.peak_active,
            peak_active_counted: self.peak_active_counted,
            admits_per_minute: self.admits_per_minute,
            first_queue: self.first_queue,
            queued_early: self.queued_early,
            timeline: self.timeline,
            decisions: self.decisions,
            local_only_decisions: self.local_only_decisions,
            ledger: self.ledger,
            applied_with_departed: self.applied_with_departed,
            end_ms: now_ms,
            queued_below_target: self.queued_below_target,
            queued_below_target_behind_queue: self.queued_below_target_behind_queue,
            queued_below_target_line_fits: self.queued_below_target_line_fits,
            counted_error: self.counted_error,
            gossip: self.gossip,
            shared: self.shared_audit,
            clock_offsets_ms: self.nodes.iter().map(|n| n.offset_ms).collect(),
        }
    }

    fn handle(&mut self, event: Event, now_ms: u64) {
        match event {
            Event::Report(node) => self.report(node, now_ms),
            Event::Apply(exchange) => self.apply(exchange, now_ms),
            Event::Deliver(exchange) => self.deliver(exchange, now_ms),
            Event::Timeout(exchange) => self.time_out(exchange, now_ms),
            Event::PeerReport(id) => {
                let sent = self.peer_reports.remove(&id).expect("arrives once");
                let home = sent.node % (self.peers.len() + 1);
                self.tell_peers(home, &sent.report, &sent.held, at(now_ms));
            }
            Event::Sample => self.sample(now_ms),
            Event::Arrive(v) | Event::Request(v) => self.request(v, now_ms),
            Event::HoldEnd(v, i) => {
                let node = &mut self.nodes[i];
                if let Some(at) = node.held.iter().position(|h| h.visitor == v) {
                    let held = node.held.swap_remove(at);
                    node.counters.end_held(held.minute);
                    // Held on after an answer: the aggregator answers.
                    if !held.again {
                        node.degraded = true;
                        self.gossip.lease_holds_timed_out += 1;
                    }
                    self.decide_at(v, i, now_ms, false);
                }
            }
            Event::AskTimeout(i) => {
                if let Some((at, again)) = self.nodes[i].ask_lost_until
                    && at == now_ms
                {
                    self.nodes[i].ask_lost_until = None;
                    self.ask(i, now_ms, again);
                }
            }
            Event::SessionEnd(v) => {
                if self.visitors[v].session_end_ms == Some(now_ms) {
                    self.end_session_if_over(v, now_ms);
                }
            }
        }
    }

    /// The node's clock at `ms` after [`START`] (true time plus its skew).
    fn node_at(&self, i: usize, ms: u64) -> UnixMillis {
        let ms = i64::try_from(START.0 + ms).expect("virtual time fits") + self.nodes[i].offset_ms;
        UnixMillis(u64::try_from(ms).expect("skew is smaller than the epoch"))
    }

    /// Node `i` took an answer in at `now_ms`: with `follow_clock`, its
    /// clock follows the aggregator's (true time here), as
    /// `Clock::follow` does. The reading is modelled as taken half a
    /// connection round trip (`lease_rtt_ms`) before the answer arrived,
    /// the round trip bounding it: the gossip delay is the age of the state
    /// an answer carries, not the connection's. The first answer sets the
    /// clock to the earliest the reading allows (half a round trip behind);
    /// later ones move it only if it lies outside their bounds. A step of
    /// the node's clock moves when its sessions end (see
    /// [`Sim::end_session_if_over`]).
    fn follow(&mut self, i: usize, now_ms: u64) {
        if !self.topology.conditions.follow_clock {
            return;
        }
        let half = i64::try_from(self.topology.conditions.lease_rtt_ms / 2).expect("small");
        let node = &mut self.nodes[i];
        let before = node.offset_ms;
        node.offset_ms = if node.following {
            before.clamp(-half, half)
        } else {
            -half
        };
        node.following = true;
        if node.offset_ms > before {
            // Forward: sessions this node ended meanwhile end now.
            for v in 0..self.visitors.len() {
                if self.visitors[v].session_end_ms.is_some()
                    && self.visitors[v].session_end_at.is_some_and(|(n, _)| n == i)
                {
                    self.end_session_if_over(v, now_ms);
                }
            }
        }
    }

    /// Visitor `v`'s session ends now if the clock of the node that set its
    /// end reads at least that end; else its end is scheduled again where
    /// that clock will (the clock stepped back since).
    fn end_session_if_over(&mut self, v: usize, now_ms: u64) {
        let Some((i, end)) = self.visitors[v].session_end_at else {
            return;
        };
        let end_ms = self.true_ms(i, end);
        if end_ms <= now_ms {
            self.visitors[v].session_end_ms = None;
            self.visitors[v].session_end_at = None;
            self.active -= 1;
        } else if self.visitors[v].session_end_ms != Some(end_ms) {
            self.visitors[v].session_end_ms = Some(end_ms);
            self.schedule(end_ms, Event::SessionEnd(v));
        }
    }

    /// The true instant (ms after [`START`]) at which node `i`'s clock shows `t`.
    fn true_ms(&self, i: usize, t: UnixMillis) -> u64 {
        let ms = i64::try_from(t.0).expect("virtual time fits")
            - self.nodes[i].offset_ms
            - i64::try_from(START.0).expect("virtual time fits");
        u64::try_from(ms.max(0)).expect("non-negative")
    }

    /// Node `i` reports again on its next gossip tick (the interval's, or at
    /// once if that has passed), plus the jitter of [`Phases::Random`].
    fn next_tick(&mut self, i: usize, now_ms: u64) {
        let next = (self.nodes[i].tick_ms + self.topology.gossip_interval_ms).max(now_ms);
        self.nodes[i].tick_ms = next;
        let jitter = if self.topology.phases == Phases::Random {
            self.net_rng
                .random_range(0..=self.topology.gossip_interval_ms / 10)
        } else {
            0
        };
        self.schedule(next + jitter, Event::Report(i));
    }

    /// What node `i` reports at its own clock's `now`.
    fn node_report(&self, i: usize, now: UnixMillis) -> NodeReport {
        let node = &self.nodes[i];
        NodeReport {
            node: node.name.clone(),
            colo: node.colo.clone(),
            at: now,
            rooms: vec![node.counters.report(now)],
        }
    }

    /// The node's gossip tick: one report. What becomes of its answer is
    /// drawn here: on time, held back (`reordered_answers_pct`) or lost
    /// (`lost_answers_pct`; during an outage the report itself is lost).
    fn report(&mut self, i: usize, now_ms: u64) {
        let now = self.node_at(i, now_ms);
        let skew = now.0.abs_diff(at(now_ms).0);
        let report = self.node_report(i, now);
        self.gossip.reports += 1;
        self.gossip.max_report_skew_ms = self.gossip.max_report_skew_ms.max(skew);
        let id = self.next_exchange;
        self.next_exchange += 1;
        self.nodes[i].in_flight = Some(id);
        let delay = self.topology.gossip_delay_ms;
        let conditions = self.topology.conditions;
        let report_lost = self
            .outage
            .is_some_and(|(from, to)| (from..to).contains(&now_ms));
        let answer_ms = if report_lost || self.chance(conditions.lost_answers_pct) {
            self.gossip.lost += 1;
            None
        } else if self.chance(conditions.reordered_answers_pct) {
            let extra = self
                .net_rng
                .random_range(1..=2 * self.topology.gossip_interval_ms);
            Some(now_ms + delay + extra)
        } else {
            Some(now_ms + delay)
        };
        self.exchanges.insert(
            id,
            Exchange {
                node: i,
                sent_ms: now_ms,
                report,
                answers: Vec::new(),
                answer_ms,
                on_demand: false,
                held_visitors: self.nodes[i].held.len() as u64,
            },
        );
        if !report_lost {
            self.schedule(now_ms + delay / 2, Event::Apply(id));
        }
        let timeout_ms = now_ms + self.topology.answer_timeout_ms();
        if answer_ms.is_none_or(|t| t > timeout_ms) {
            self.schedule(timeout_ms, Event::Timeout(id));
        }
    }

    /// True with probability `pct` percent (no draw at 0).
    fn chance(&mut self, pct: u32) -> bool {
        pct > 0 && self.net_rng.random_range(0..100) < pct
    }

    /// The aggregator takes the report in at its arrival time; with several,
    /// the node's home grants and the others take a peer report.
    fn apply(&mut self, id: u64, now_ms: u64) {
        let now = at(now_ms);
        let exchange = &self.exchanges[&id];
        let (i, report) = (exchange.node, exchange.report.clone());
        let home = i % (self.peers.len() + 1);
        // The leases the node holds, by its last answer: a node reports
        // them to its home (`Message::HomeReport`) and, with
        // `peer_leases`, to the others.
        let holding = self.holding(i);
        // An out-of-cycle report (an ask, a confirmation) goes to the home
        // only, as the edge's gossip client sends it: the other
        // aggregators hear of the node with its next periodic report, or
        // at once after a raised lease (`tell_peers_if_raised`).
        if !exchange.on_demand {
            let held = self.peer_held(i);
            self.tell_peers(home, &report, &held, now);
        }
        let exchange = &self.exchanges[&id];
        let aggregator = if home == 0 {
            &mut self.cluster
        } else {
            &mut self.peers[home - 1]
        };
        let asks = self.topology.conditions.lease_wait_ms > 0;
        let mut answers = if asks && self.topology.conditions.name_held_visitors {
            let held_visitors: Vec<HeldVisitors> = (exchange.held_visitors > 0)
                .then(|| HeldVisitors {
                    room: self.room.id(),
                    visitors: exchange.held_visitors,
                })
                .into_iter()
                .collect();
            aggregator.apply_held(report, &holding, &held_visitors, now)
        } else {
            aggregator.apply_holding(report, &holding, asks, now)
        };
        if self.topology.conditions.shared_ledger {
            let node = &exchange.report.node;
            let limit = self.room.at(now).new_users_per_minute();
            for g in aggregator.shared_grants().to_vec() {
                let ledger = self.shared.entry(g.minute).or_default();
                if let Some(&held) = ledger.caps.get(node) {
                    self.shared_audit.checked += 1;
                    self.shared_audit.overspent += u64::from(g.used.0 + g.used.1 > held);
                }
                let set = ledger.apply_asks(&format!("{node}/{id}"), &[g.ask(node)]);
                self.shared_audit.over_limit += u64::from(ledger.total() > limit);
                let told = g.cut_to(set[0].1);
                if told != g.allowances() {
                    self.shared_audit.cuts += 1;
                    aggregator.settle_shared(node, &g, told, &mut answers);
                }
            }
            // Minutes past are done with.
            let minute = now.minute();
            self.shared.retain(|m, _| *m >= minute.minus(1));
        }
        let node = exchange.report.node.clone();
        if let Some(deliver_ms) = exchange.answer_ms {
            self.schedule(deliver_ms, Event::Deliver(id));
        }
        if self.topology.conditions.check_ledger {
            self.check_ledger(&node, &mut answers, now);
        }
        self.exchanges
            .get_mut(&id)
            .expect("still in flight")
            .answers = answers;
    }

    /// The leases node `i` holds, by its last answer, as its reports name them.
    fn holding(&self, i: usize) -> Vec<HeldLease> {
        vec![HeldLease::of(self.room.id(), &self.nodes[i].state)]
    }

    /// The leases `state` says a node holds; none before its first answer.
    fn held_in(&self, state: &GlobalState) -> Vec<HeldLease> {
        if state.as_of.0 > 0 {
            vec![HeldLease::of(self.room.id(), state)]
        } else {
            Vec::new()
        }
    }

    /// The leases node `i` holds from its last answer (the edge's `held`,
    /// which reads the answer, not a local-only state made since); none
    /// before an answer for the room.
    fn answered_held(&self, i: usize) -> Vec<HeldLease> {
        let node = &self.nodes[i];
        if !node.heard.as_ref().is_some_and(|h| h.answered) {
            return Vec::new();
        }
        self.held_in(node.lease.as_ref().unwrap_or(&node.state))
    }

    /// What node `i`'s peer reports name: what it holds, or with
    /// `peer_leases` off, nothing.
    fn peer_held(&self, i: usize) -> Vec<HeldLease> {
        if self.topology.conditions.peer_leases {
            self.holding(i)
        } else {
            Vec::new()
        }
    }

    /// Every aggregator but `home` takes `report` in as a peer report.
    fn tell_peers(
        &mut self,
        home: usize,
        report: &NodeReport,
        held: &[HeldLease],
        now: UnixMillis,
    ) {
        let k = self.peers.len() + 1;
        for a in (0..k).filter(|&a| a != home) {
            let peer = if a == 0 {
                &mut self.cluster
            } else {
                &mut self.peers[a - 1]
            };
            peer.apply_peer(report.clone(), held, now);
        }
    }

    /// The answer node `i` just took in from its home raised what it holds
    /// from `before` (`HeldLease::raised`, as the edge judges it): with
    /// `raised_peer_reports`, the node sends its peer reports now rather
    /// than with its next report, as the edge's gossip client does
    /// (`Homes::raised`). Over the open connections like an ask: they arrive
    /// half a `lease_rtt_ms` later (never, in an outage).
    fn tell_peers_if_raised(&mut self, i: usize, before: &[HeldLease], now_ms: u64) {
        let k = self.peers.len() + 1;
        if k < 2 || !self.topology.conditions.raised_peer_reports {
            return;
        }
        if !HeldLease::raised(before, &self.answered_held(i)) {
            return;
        }
        if self
            .outage
            .is_some_and(|(from, to)| (from..to).contains(&now_ms))
        {
            return;
        }
        self.gossip.raised_peer_reports += k as u64 - 1;
        let id = self.next_exchange;
        self.next_exchange += 1;
        let report = self.node_report(i, self.node_at(i, now_ms));
        let held = self.peer_held(i);
        self.peer_reports.insert(
            id,
            PeerReports {
                node: i,
                report,
                held,
            },
        );
        let arrive = now_ms + self.topology.conditions.lease_rtt_ms / 2;
        self.schedule(arrive, Event::PeerReport(id));
    }

    /// The node stops waiting for exchange `id` (`Client::session`): it
    /// reports again on its next tick, or after [`MAX_MISSED_ANSWERS`] in a
    /// row reconnects (backoff, then one round trip of handshake) and reports
    /// at once.
    fn time_out(&mut self, id: u64, now_ms: u64) {
        let exchange = &self.exchanges[&id];
        let i = exchange.node;
        if exchange.answer_ms.is_none() {
            self.exchanges.remove(&id);
        }
        self.gossip.timeouts += 1;
        let node = &mut self.nodes[i];
        debug_assert_eq!(node.in_flight, Some(id), "one exchange in flight");
        node.in_flight = None;
        node.missed += 1;
        if node.missed < MAX_MISSED_ANSWERS {
            self.next_tick(i, now_ms);
            return;
        }
        node.missed = 0;
        let exp = (BACKOFF_BASE_MS << node.reconnect_attempt.min(16)).min(BACKOFF_CAP_MS);
        node.reconnect_attempt += 1;
        let backoff = exp / 2 + self.net_rng.random_range(0..=exp / 2);
        let again = now_ms + backoff + self.topology.gossip_delay_ms;
        self.gossip.reconnects += 1;
        self.nodes[i].tick_ms = again;
        self.schedule(again, Event::Report(i));
    }

    /// Counts Anywhere slots leased and unused against the pool, with the
    /// leases as handed out and as the engine alone would have granted them.
    /// With [`Grants::EngineShare`] it also hands out the engine's share.
    fn check_ledger(&mut self, node: &str, answers: &mut [RoomAnswer], now: UnixMillis) {
        let minute = now.minute();
        // What the aggregator holds now, merged again on a copy of its
        // history (as its `/status` does): the pool and the engine's shares.
        let snapshot = self.cluster.snapshot(now);
        // A departed node's lease lapsed with it (the ledger dropped it).
        let departed: Vec<String> = snapshot
            .nodes
            .iter()
            .filter(|(_, meta)| meta.departed)
            .map(|(report, _)| report.node.clone())
            .collect();
        self.applied_with_departed += u64::from(!departed.is_empty());
        let reports: Vec<NodeReport> = snapshot
            .nodes
            .into_iter()
            .map(|(report, _)| report)
            .collect();
        let Some((_, memory)) = snapshot.rooms.into_iter().next() else {
            return;
        };
        let mut history = memory.history;
        let states = aggregate(&self.room, &reports, &mut history, now);
        if let Some(answer) = answers.iter_mut().find(|a| a.room == self.room.id()) {
            let engine = states
                .iter()
                .find(|(name, _)| name == node)
                .map_or((0, 0), |(_, s)| {
                    (s.allowance.colo_share, s.allowance.anywhere)
                });
            let allowance = &mut answer.state.allowance;
            if allowance.colo_share + allowance.anywhere < engine.0 + engine.1 {
                self.ledger.clamped += 1;
            }
            if self.topology.grants == Grants::EngineShare {
                allowance.anywhere = engine.1;
            }
            let used = answer.state.used;
            let leases = |(colo, anywhere): (u64, u64)| {
                let lease = |used_at_grant, allowance| Lease {
                    minute,
                    used_at_grant,
                    allowance,
                };
                (lease(used.colo_share, colo), lease(used.anywhere, anywhere))
            };
            self.leases.insert(
                node.to_owned(),
                (
                    leases((allowance.colo_share, allowance.anywhere)),
                    leases(engine),
                ),
            );
        }
        // Both shared pools together: a node that asks may borrow the other
        // colos' unheld slots as an Anywhere lease, so what the ledgers
        // keep within bounds is the round's shared slots, not the Anywhere
        // pool alone.
        let pool: u64 = states
            .iter()
            .map(|(_, s)| s.allowance.colo_share + s.allowance.anywhere)
            .sum();
        let (mut held, mut held_engine, mut carried) = (0, 0, false);
        for (name, state) in states.iter().filter(|(name, _)| !departed.contains(name)) {
            if let Some((lease, engine)) = self.leases.get(name) {
                let outstanding = |(colo, any): &SharedLeases| {
                    colo.outstanding(minute, state.used.colo_share)
                        + any.outstanding(minute, state.used.anywhere)
                };
                let out = outstanding(lease);
                held += out;
                carried |= out > 0 && (lease.0.minute != minute || lease.1.minute != minute);
                held_engine += outstanding(engine);
            }
        }
        self.ledger.checks += 1;
        if held > pool {
            self.ledger.over_pool += 1;
            let worst = if carried {
                self.ledger.over_pool_carried += 1;
                &mut self.ledger.worst_excess_carried
            } else {
                &mut self.ledger.worst_excess
            };
            *worst = (*worst).max(held - pool);
        }
        if held_engine > pool {
            self.ledger.over_pool_without_ledger += 1;
            self.ledger.worst_excess_without_ledger = self
                .ledger
                .worst_excess_without_ledger
                .max(held_engine - pool);
        }
    }

    /// The node takes its answer in (`Client::store`), decides with it from
    /// now on, and reports again on its next tick. An answer the node has
    /// stopped waiting for is dropped unread, as the client reads only the
    /// answer to the report it waits for (on that report's own stream).
    fn deliver(&mut self, id: u64, now_ms: u64) {
        let exchange = self.exchanges.remove(&id).expect("delivered once");
        let made_ms = exchange.sent_ms;
        if exchange.on_demand {
            self.gossip.answers_taken += 1;
            let i = exchange.node;
            self.nodes[i].asking_until = None;
            let before = self.held_in(&self.nodes[i].state);
            let held_before = self.answered_held(i);
            self.take_answer(exchange, now_ms);
            self.tell_peers_if_raised(i, &held_before, now_ms);
            self.confirm_if_lowered(i, &before, now_ms);
            self.release_held(i, now_ms, made_ms);
            // Visitors held since this ask was made wait for the next one
            // (a confirmation just sent counts them too).
            let node = &mut self.nodes[i];
            if std::mem::take(&mut node.ask_again)
                && !node.held.is_empty()
                && node.asking_until.is_none()
            {
                self.ask(i, now_ms, Ask::Hold);
            }
            return;
        }
        if self.nodes[exchange.node].in_flight != Some(id) {
            self.gossip.late_ignored += 1;
            return;
        }
        self.gossip.answers_taken += 1;
        if now_ms > exchange.sent_ms + self.topology.gossip_delay_ms {
            self.gossip.late_taken += 1;
        }
        let i = exchange.node;
        let before = self.held_in(&self.nodes[i].state);
        let held_before = self.answered_held(i);
        self.take_answer(exchange, now_ms);
        self.tell_peers_if_raised(i, &held_before, now_ms);
        let node = &mut self.nodes[i];
        node.in_flight = None;
        node.missed = 0;
        node.reconnect_attempt = 0;
        self.next_tick(i, now_ms);
        self.confirm_if_lowered(i, &before, now_ms);
        self.release_held(i, now_ms, made_ms);
    }

    /// The answer node `i` just took in lowered its cap from `before`: the
    /// home counts the higher one until the node says it got the lower, so
    /// the node reports at once (at most once per interval), as the edge's
    /// client does. On the open connection like an ask: one
    /// `lease_rtt_ms` round trip.
    fn confirm_if_lowered(&mut self, i: usize, before: &[HeldLease], now_ms: u64) {
        let lowered = HeldLease::lowered(before, &self.held_in(&self.nodes[i].state));
        let node = &self.nodes[i];
        let interval = self.topology.gossip_interval_ms;
        if lowered
            && node.confirmed_ms.is_none_or(|at| now_ms >= at + interval)
            && node.asking_until.is_none_or(|t| now_ms >= t)
        {
            self.nodes[i].confirmed_ms = Some(now_ms);
            self.ask(i, now_ms, Ask::Confirm);
        }
    }

    /// A visitor was held while the node waits for an ask's answer: with
    /// [`Conditions::ask_within_hold`], an answer that will not come (lost)
    /// is waited for at most `promise::ask_within_hold_ms` from now, then
    /// the node reports again as it would have at the end of the wait, as
    /// the edge's client does (`Client::answer_within`: once a visitor is
    /// held, whatever report is on its way is waited for only within the
    /// hold).
    fn cut_short_for_the_hold(&mut self, i: usize, now_ms: u64) {
        let conditions = self.topology.conditions;
        if !conditions.ask_within_hold {
            return;
        }
        let cut = now_ms
            + ask_within_hold_ms(
                conditions.lease_wait_ms,
                conditions.lease_rtt_ms,
                self.topology.answer_timeout_ms(),
            );
        let node = &mut self.nodes[i];
        if let Some((at, again)) = node.ask_lost_until
            && cut < at
        {
            node.ask_lost_until = Some((cut, again));
            node.asking_until = Some(cut);
            self.gossip.cut_short += 1;
            self.schedule(cut, Event::AskTimeout(i));
        }
    }

    /// The node's held visitors decide again with its new answer (the
    /// refresh loop's `LeaseAsk::answered`), and it may hold again; but a
    /// visitor held after the answered report was made (`made_ms`) and
    /// still short of slots with it stays held: that answer did not count
    /// them (a periodic answer computed before they came would queue them
    /// on the old promise).
    fn release_held(&mut self, i: usize, now_ms: u64, made_ms: u64) {
        self.nodes[i].degraded = false;
        let now = self.node_at(i, now_ms);
        let node = &mut self.nodes[i];
        let held = std::mem::take(&mut node.held);
        let (counted, later): (Vec<_>, Vec<_>) = held.into_iter().partition(|h| {
            h.since_ms <= made_ms || !short_of_slots(&self.room, &node.state, &node.counters, now)
        });
        node.held = later;
        let wait = self.topology.conditions.lease_wait_ms;
        let mut asks = false;
        for held in counted {
            let node = &mut self.nodes[i];
            // Counted and still short: held on once, within the hold (its
            // end is still `since_ms + wait`), for the answer to one more ask.
            if self.topology.conditions.hold_again
                && !held.again
                && now_ms < held.since_ms + wait
                && short_of_slots(&self.room, &node.state, &node.counters, now)
            {
                node.held.push(HeldVisitor {
                    since_ms: now_ms,
                    again: true,
                    ..held
                });
                self.gossip.lease_holds_again += 1;
                asks = true;
                continue;
            }
            node.counters.end_held(held.minute);
            self.decide_at(held.visitor, i, now_ms, false);
        }
        if asks {
            self.ask_for_held(i, now_ms);
        }
    }

    /// An ask for the visitors node `i` holds: now, or (one outstanding)
    /// once its answer comes. `true` when it went now.
    fn ask_for_held(&mut self, i: usize, now_ms: u64) -> bool {
        if self.nodes[i].asking_until.is_none_or(|t| now_ms >= t) {
            self.ask(i, now_ms, Ask::Hold);
            true
        } else {
            self.nodes[i].ask_again = true;
            false
        }
    }

    /// The node asks the aggregator out of cycle: a report on the open
    /// connection, answered one `lease_rtt_ms` later (or lost as answers are).
    /// A lost ask's answer is waited for `promise::ask_within_hold_ms` (with
    /// `Conditions::ask_within_hold`) or `promise::ask_timeout_ms`, a lost
    /// confirmation's for `promise::ask_timeout_ms` (with
    /// `Conditions::confirm_like_ask`), then the node reports again at once
    /// ([`Event::AskTimeout`]); a lost report sent again is waited for as a
    /// periodic answer is (the client waits so for any report that is not
    /// an ask or a confirmation), as is everything without
    /// `Conditions::ask_again_when_lost`.
    fn ask(&mut self, i: usize, now_ms: u64, kind: Ask) {
        let now = self.node_at(i, now_ms);
        let report = self.node_report(i, now);
        match kind {
            Ask::Confirm => self.gossip.confirms += 1,
            Ask::ConfirmAgain | Ask::AgainLast { confirm: true } => {
                self.gossip.confirms += 1;
                self.gossip.confirms_again += 1;
            }
            Ask::Hold => self.gossip.lease_asks += 1,
            Ask::Again | Ask::AgainLast { confirm: false } => {
                self.gossip.lease_asks += 1;
                self.gossip.asks_again += 1;
            }
        }
        let id = self.next_exchange;
        self.next_exchange += 1;
        let conditions = self.topology.conditions;
        let rtt = conditions.lease_rtt_ms;
        let report_lost = self
            .outage
            .is_some_and(|(from, to)| (from..to).contains(&now_ms));
        let lost = report_lost || self.chance(conditions.lost_answers_pct);
        let answer_ms = (!lost).then_some(now_ms + rtt);
        if lost
            && matches!(
                kind,
                Ask::Confirm | Ask::ConfirmAgain | Ask::AgainLast { confirm: true }
            )
        {
            self.gossip.confirms_lost += 1;
        } else if lost {
            self.gossip.lost += 1;
        }
        let full = self.topology.answer_timeout_ms();
        let (wait, again) = match kind {
            _ if !conditions.ask_again_when_lost => (full, None),
            Ask::Hold if conditions.ask_within_hold => (
                ask_within_hold_ms(conditions.lease_wait_ms, rtt, full),
                Some(Ask::Again),
            ),
            Ask::Hold => (
                ask_timeout_ms(conditions.lease_wait_ms, rtt, full),
                Some(Ask::Again),
            ),
            Ask::Confirm if conditions.confirm_like_ask => (
                ask_timeout_ms(conditions.lease_wait_ms, rtt, full),
                Some(Ask::ConfirmAgain),
            ),
            Ask::Again if conditions.again_like_ask && conditions.ask_within_hold => (
                ask_within_hold_ms(conditions.lease_wait_ms, rtt, full),
                Some(Ask::AgainLast { confirm: false }),
            ),
            Ask::Again if conditions.again_like_ask => (
                ask_timeout_ms(conditions.lease_wait_ms, rtt, full),
                Some(Ask::AgainLast { confirm: false }),
            ),
            Ask::ConfirmAgain if conditions.again_like_ask => (
                ask_timeout_ms(conditions.lease_wait_ms, rtt, full),
                Some(Ask::AgainLast { confirm: true }),
            ),
            Ask::Confirm | Ask::Again | Ask::ConfirmAgain | Ask::AgainLast { .. } => (full, None),
        };
        self.nodes[i].asking_until = Some(answer_ms.unwrap_or(now_ms + wait));
        self.nodes[i].ask_lost_until = None;
        if lost
            && wait < full
            && let Some(again) = again
        {
            self.nodes[i].ask_lost_until = Some((now_ms + wait, again));
            self.schedule(now_ms + wait, Event::AskTimeout(i));
        }
        self.exchanges.insert(
            id,
            Exchange {
                node: i,
                sent_ms: now_ms,
                report,
                answers: Vec::new(),
                answer_ms,
                on_demand: true,
                held_visitors: self.nodes[i].held.len() as u64,
            },
        );
        if report_lost {
            self.exchanges.remove(&id);
        } else {
            self.schedule(now_ms + rtt / 2, Event::Apply(id));
        }
    }

    /// The node takes an answer in (`Client::store`) and decides with it.
    fn take_answer(&mut self, exchange: Exchange, now_ms: u64) {
        self.follow(exchange.node, now_ms);
        let room = self.room.id();
        let node = &mut self.nodes[exchange.node];
        let answer = exchange.answers.into_iter().find(|a| a.room == room);
        let own = exchange.report.rooms.iter().find(|r| r.room == room);
        let heard = match answer {
            Some(answer) => {
                let observed = own.and_then(|own| {
                    let (active, admitted) = own_counts(own, answer.state.as_of);
                    observed_share(&answer.state, active, admitted)
                });
                let before = node.heard.as_ref().and_then(|h| h.share);
                let older = node.heard.as_ref().is_some_and(|h| h.answered)
                    && node.local_since_ms.is_none()
                    && answer.state.as_of < node.state.as_of;
                if older && self.topology.conditions.lease_wait_ms == 0 {
                    self.gossip.went_back += 1;
                }
                // A periodic answer computed before the answer to an ask
                // that overtook it (the gossip delay is an answer's age, the
                // ask's round trip is short) is not taken: the real client's
                // exchanges are one after the other, so its answers come in
                // the order they were computed, and the ledger holds the
                // later lease.
                if !older {
                    node.state = answer.state;
                }
                Heard {
                    received_ms: now_ms,
                    answered: true,
                    share: smooth_share(before, observed),
                }
            }
            // The node's world then has no view of the room, so no share either.
            None => Heard {
                received_ms: now_ms,
                answered: false,
                share: None,
            },
        };
        node.heard = Some(heard);
        node.local_since_ms = None;
        node.lease = None;
    }

    /// `Node::refresh_from_world` for node `i` at `now_ms`: the answer while
    /// fresh, else the local-only state, recomputed on the refresh tick.
    /// Returns whether the node decides local-only.
    fn refresh(&mut self, i: usize, now_ms: u64) -> bool {
        let now = self.node_at(i, now_ms);
        let node = &mut self.nodes[i];
        let fresh = node.heard.as_ref().is_some_and(|h| {
            h.answered && now_ms.saturating_sub(h.received_ms) <= self.topology.stale_after_ms
        });
        if fresh {
            return false;
        }
        if node
            .local_since_ms
            .is_none_or(|since| now_ms >= since + REFRESH_MS)
        {
            let share = node.heard.as_ref().and_then(|h| h.share);
            let local = local_only_state(&self.room, &node.counters, &mut node.rate, share, now);
            // Within the last answer's leases until its minute ends, as
            // the edge does (`share::within_lease`).
            if node.local_since_ms.is_none() && node.heard.as_ref().is_some_and(|h| h.answered) {
                node.lease = Some(node.state.clone());
            }
            node.state = match &node.lease {
                Some(lease) => within_lease(local, lease, now),
                None => local,
            };
            node.local_since_ms = Some(now_ms);
        }
        true
    }

    fn sample(&mut self, now_ms: u64) {
        let counted: i64 = (0..self.nodes.len())
            .map(|i| {
                let slot = self.node_at(i, now_ms).expiry_slot();
                self.nodes[i].counters.active_users(slot)
            })
            .sum();
        self.peak_active_counted = self.peak_active_counted.max(counted);
        self.measure_counted(counted, now_ms);
        let second_end = now_ms + 1_000 - SAMPLE_PHASE_MS;
        if second_end.is_multiple_of(TIMELINE_EVERY_MS) {
            self.timeline.push(Sample {
                at_s: second_end / 1_000,
                active: self.active,
                active_counted: counted,
                admits_this_minute: self.admits_in(now_ms),
                queued: self.queued_now,
            });
        }
        self.schedule(now_ms + 1_000, Event::Sample);
    }

    /// The counted active users against the true number (see [`CountedError`]).
    fn measure_counted(&mut self, counted: i64, now_ms: u64) {
        let truth = self.active as f64;
        let error = (counted as f64 - truth).abs();
        let total = self.room.total_active_users() as f64;
        let e = &mut self.counted_error;
        e.worst_of_total = e.worst_of_total.max(error / total);
        if self.active > 0 {
            e.worst_relative_any = e.worst_relative_any.max(error / truth);
        }
        if truth >= COUNTED_FLOOR * total && error / truth > e.worst_relative {
            e.worst_relative = error / truth;
            e.worst_relative_at_s = Some(now_ms / 1_000);
        }
    }

    fn admits_in(&self, now_ms: u64) -> u64 {
        self.admits_per_minute
            .get(&(now_ms / MILLIS_PER_MINUTE))
            .copied()
            .unwrap_or(0)
    }

    /// The node visitor `v`'s request lands on: their own, or with
    /// `--roaming` any node of their colo.
    fn node_for(&mut self, v: usize) -> usize {
        let home = self.visitors[v].arrival.node;
        if !self.topology.conditions.roaming {
            return home;
        }
        let per_colo = self.topology.nodes_per_colo;
        let colo = home / per_colo;
        let node = self
            .topology
            .node(colo, self.net_rng.random_range(0..per_colo));
        let visitor = &mut self.visitors[v];
        visitor.roamed |= visitor.last_node.is_some_and(|last| last != node);
        visitor.last_node = Some(node);
        node
    }

    /// One request of visitor `v` at their node: the engine decides.
    fn request(&mut self, v: usize, now_ms: u64) {
        let i = self.node_for(v);
        self.decide_at(v, i, now_ms, true);
    }

    /// Visitor `v`'s request at node `i`: held on the on-demand lease when
    /// `may_hold` and the node would queue this new visitor only for want
    /// of a slot (`engine::short_of_slots`, as the edge's handler), else
    /// decided by the engine.
    fn decide_at(&mut self, v: usize, i: usize, now_ms: u64, may_hold: bool) {
        let visitor = self.visitors[v];
        let now = self.node_at(i, now_ms);
        let local_only = self.refresh(i, now_ms);
        let wait = self.topology.conditions.lease_wait_ms;
        let node = &self.nodes[i];
        if may_hold
            && wait > 0
            && !local_only
            && !node.degraded
            && node.heard.is_some()
            && is_new_visitor(&self.room, visitor.ticket.as_ref(), now)
            && short_of_slots(&self.room, &node.state, &node.counters, now)
        {
            self.gossip.lease_holds += 1;
            self.nodes[i].held.push(HeldVisitor {
                visitor: v,
                minute: now.minute(),
                since_ms: now_ms,
                again: false,
            });
            self.nodes[i].counters.note_held(now.minute());
            if !self.ask_for_held(i, now_ms) {
                self.cut_short_for_the_hold(i, now_ms);
            }
            self.schedule(now_ms + wait, Event::HoldEnd(v, i));
            return;
        }
        if local_only {
            self.local_only_decisions += 1;
        }
        let node = &self.nodes[i];
        let decision = decide(
            &self.room,
            &node.state,
            &node.counters,
            &node.ledger,
            visitor.ticket,
            now,
            self.rng.next_u64(),
        );
        self.decisions += 1;
        self.visitors[v].ticket = Some(*decision.ticket());
        match decision {
            Decision::Admit { reason, .. } => {
                let first = !matches!(reason, AdmitReason::SessionValid);
                if first {
                    self.admitted_now(v, now_ms);
                }
                // The session ends where the engine ends it (the ticket's
                // end, on this node's clock): that is the truth the counters
                // are judged against.
                let end = decision
                    .ticket()
                    .session_end(self.room.session_minutes(), self.room.session_renewal())
                    .expect("an admitted ticket has a session end");
                let session_end = self.true_ms(i, end).max(now_ms + 1);
                let v_state = &mut self.visitors[v];
                v_state.session_end_ms = Some(session_end);
                v_state.session_end_at = Some((i, end));
                self.schedule(session_end, Event::SessionEnd(v));
                let admitted = self.visitors[v]
                    .admitted_ms
                    .expect("an admitted visitor has an admission time");
                let next = now_ms
                    + self
                        .rng
                        .random_range(PAGE_INTERVAL_MS * 2 / 3..=PAGE_INTERVAL_MS * 4 / 3);
                if next < admitted + visitor.arrival.browse_ms {
                    self.schedule(next, Event::Request(v));
                }
            }
            Decision::Queue { ticket, reason, .. } => {
                if !self.visitors[v].queued {
                    let waiting_ahead = self.queued_now;
                    self.visitors[v].queued = true;
                    self.queued_now += 1;
                    if reason != QueueReason::TooEarly && self.below_limits(now_ms, EARLY, 0) {
                        self.queued_early += 1;
                    }
                    if reason != QueueReason::TooEarly && self.below_limits(now_ms, EARLY_TARGET, 0)
                    {
                        self.queued_below_target += 1;
                        self.queued_below_target_behind_queue += u64::from(waiting_ahead > 0);
                        self.queued_below_target_line_fits +=
                            u64::from(self.below_limits(now_ms, EARLY_TARGET, waiting_ahead));
                    }
                }
                if reason != QueueReason::TooEarly && self.first_queue.is_none() {
                    self.first_queue = Some(FirstQueue {
                        at_ms: now_ms,
                        active: self.active,
                        admits_this_minute: self.admits_in(now_ms),
                    });
                }
                // The ticket's time is the deciding node's clock.
                let check_in = self.true_ms(i, ticket.next_check_in())
                    + self.rng.random_range(0..=CHECK_IN_LATENCY_MS);
                let check_in = check_in.max(now_ms + 1);
                if self.visitors[v].gives_up_ms.is_some_and(|g| g <= check_in) {
                    self.visitors[v].gave_up = true;
                    self.given_up += 1;
                    self.queued_now -= 1;
                    return;
                }
                self.schedule(check_in, Event::Request(v));
            }
            Decision::Reject { .. } => {}
        }
    }

    /// Both limits are less than `fraction` used (ground truth), with
    /// `waiting` more visitors admitted (0: as they are).
    fn below_limits(&self, now_ms: u64, fraction: f64, waiting: u64) -> bool {
        ((self.active + waiting) as f64) < fraction * self.room.total_active_users() as f64
            && ((self.admits_in(now_ms) + waiting) as f64)
                < fraction * self.room.new_users_per_minute() as f64
    }

    fn admitted_now(&mut self, v: usize, now_ms: u64) {
        let visitor = &mut self.visitors[v];
        visitor.admitted_ms = Some(now_ms);
        if visitor.queued {
            self.queued_now -= 1;
        }
        self.active += 1;
        self.admitted += 1;
        self.peak_active = self.peak_active.max(self.active);
        *self
            .admits_per_minute
            .entry(now_ms / MILLIS_PER_MINUTE)
            .or_default() += 1;
    }
}

/// The instant `ms` after [`START`].
#[must_use]
pub fn at(ms: u64) -> UnixMillis {
    START.plus_millis(ms)
}

/// Seeded randomness for traffic (a stream apart from the engine's).
#[must_use]
pub fn traffic_rng(seed: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(1);
    rng
}
