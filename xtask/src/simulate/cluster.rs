//! The discrete-event core: C colos × N nodes, one aggregator, visitors, all
//! in virtual time, driving the real engine.
//!
//! Nothing here decides anything. Every request is
//! [`decide`](waitroom_common::engine::decide) on the node's own
//! [`RoomCounters`], with the [`GlobalState`] the node last heard from the
//! aggregator; every gossip round is the real
//! [`aggregate`](waitroom_common::aggregate::aggregate) over every node's
//! [`RoomCounters::report`]. This module only moves time forward, delivers
//! answers late by the gossip delay, and writes down what happened.
//!
//! # Gossip
//! Rounds are aligned: every `gossip_interval_ms` all nodes report at the same
//! instant, the aggregator merges those reports, and each node starts using
//! its answer `gossip_delay_ms` later. So at any instant a node decides with
//! a state computed from reports exactly that old, as the real node does.
//! Alignment means every node holds a lease from the same round, which is
//! what the real aggregator's Anywhere ledger (in `waitroom-edge`, which xtask
//! cannot depend on) enforces when nodes report out of phase.
//!
//! # Visitors
//! A visitor arrives at one node and stays with it. Queued, they check in
//! when their ticket allows (`next_check_in`) plus a little network latency;
//! admitted, they request a page every ~15 s while they browse, then stop,
//! and their session ends `session_duration` minutes after the last request.
use std::{
    cmp::Reverse,
    collections::{BTreeMap, BinaryHeap},
};

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use waitroom_common::{
    aggregate::{AggregateHistory, NodeReport, aggregate},
    counters::RoomCounters,
    engine::{AdmitReason, Decision, QueueReason, decide},
    room::Room,
    state::GlobalState,
    ticket::Ticket,
    time::{MILLIS_PER_MINUTE, UnixMillis},
};

/// The instant the simulation starts: a minute boundary (14 Nov 2023 22:14 UTC).
pub const START: UnixMillis = UnixMillis(1_700_000_040_000);

/// Cluster shape and gossip timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Topology {
    pub colos: usize,
    pub nodes_per_colo: usize,
    /// Age of the reports an answer was computed from when the node starts using it.
    pub gossip_delay_ms: u64,
    /// Time between two gossip rounds.
    pub gossip_interval_ms: u64,
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
    /// Active users as the node counters count them (to the end of the expiry minute).
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
    pub end_ms: u64,
}

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
/// Timeline resolution; peaks are sampled every second.
const TIMELINE_EVERY_MS: u64 = 10_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// Aggregator answers of `round` reach the nodes.
    Deliver {
        round: u64,
    },
    GossipRound,
    Sample,
    Arrive(usize),
    Request(usize),
    SessionEnd(usize),
}

#[derive(Debug)]
struct Node {
    name: String,
    colo: String,
    counters: Box<RoomCounters>,
    state: GlobalState,
}

#[derive(Clone, Copy, Debug)]
struct Visitor {
    arrival: Arrival,
    ticket: Option<Ticket>,
    admitted_ms: Option<u64>,
    queued: bool,
    /// Ground truth: the session runs until this instant.
    session_end_ms: Option<u64>,
}

/// The simulation of one room on one cluster.
pub struct Sim {
    room: Room,
    topology: Topology,
    nodes: Vec<Node>,
    history: AggregateHistory,
    visitors: Vec<Visitor>,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    rng: ChaCha8Rng,
    in_flight: BTreeMap<u64, Vec<(String, GlobalState)>>,
    next_round: u64,
    // What is measured.
    active: u64,
    peak_active: u64,
    peak_active_counted: i64,
    queued_now: u64,
    admitted: usize,
    admits_per_minute: BTreeMap<u64, u64>,
    first_queue: Option<FirstQueue>,
    queued_early: u64,
    timeline: Vec<Sample>,
    decisions: u64,
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
        let nodes = (0..topology.colos)
            .flat_map(|c| (0..topology.nodes_per_colo).map(move |n| (c, n)))
            .map(|(c, n)| Node {
                name: format!("c{c}-n{n}"),
                colo: format!("c{c}"),
                counters: RoomCounters::new_boxed(room.id()),
                state: GlobalState::empty(START),
            })
            .collect();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // A stream of its own, so traffic made from the same seed is independent of it.
        rng.set_stream(2);
        let mut sim = Self {
            room,
            topology,
            nodes,
            history: AggregateHistory::default(),
            visitors: Vec::with_capacity(arrivals.len()),
            events: BinaryHeap::new(),
            seq: 0,
            rng,
            in_flight: BTreeMap::new(),
            next_round: 0,
            active: 0,
            peak_active: 0,
            peak_active_counted: 0,
            queued_now: 0,
            admitted: 0,
            admits_per_minute: BTreeMap::new(),
            first_queue: None,
            queued_early: 0,
            timeline: Vec::new(),
            decisions: 0,
        };
        for (i, &arrival) in arrivals.iter().enumerate() {
            assert!(arrival.node < topology.nodes(), "arrival at a missing node");
            sim.visitors.push(Visitor {
                arrival,
                ticket: None,
                admitted_ms: None,
                queued: false,
                session_end_ms: None,
            });
            sim.schedule(arrival.at_ms, Event::Arrive(i));
        }
        sim.schedule(0, Event::GossipRound);
        sim.schedule(0, Event::Sample);
        sim
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
            if matches!(until, Until::AllAdmitted { .. }) && self.admitted == self.visitors.len() {
                break;
            }
        }
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
                })
                .collect(),
            peak_active: self.peak_active,
            peak_active_counted: self.peak_active_counted,
            admits_per_minute: self.admits_per_minute,
            first_queue: self.first_queue,
            queued_early: self.queued_early,
            timeline: self.timeline,
            decisions: self.decisions,
            end_ms: now_ms,
        }
    }

    fn handle(&mut self, event: Event, now_ms: u64) {
        match event {
            Event::GossipRound => self.gossip_round(now_ms),
            Event::Deliver { round } => {
                let states = self
                    .in_flight
                    .remove(&round)
                    .expect("each round is delivered once");
                for (node, (name, state)) in self.nodes.iter_mut().zip(states) {
                    debug_assert_eq!(node.name, name, "aggregate answers in report order");
                    node.state = state;
                }
            }
            Event::Sample => self.sample(now_ms),
            Event::Arrive(v) | Event::Request(v) => self.request(v, now_ms),
            Event::SessionEnd(v) => {
                if self.visitors[v].session_end_ms == Some(now_ms) {
                    self.visitors[v].session_end_ms = None;
                    self.active -= 1;
                }
            }
        }
    }

    fn gossip_round(&mut self, now_ms: u64) {
        let now = at(now_ms);
        let reports: Vec<NodeReport> = self
            .nodes
            .iter()
            .map(|n| NodeReport {
                node: n.name.clone(),
                colo: n.colo.clone(),
                at: now,
                rooms: vec![n.counters.report(now)],
            })
            .collect();
        let states = aggregate(&self.room, &reports, &mut self.history, now);
        assert_eq!(
            states.len(),
            self.nodes.len(),
            "every node reported the room"
        );
        let round = self.next_round;
        self.next_round += 1;
        self.in_flight.insert(round, states);
        self.schedule(
            now_ms + self.topology.gossip_delay_ms,
            Event::Deliver { round },
        );
        self.schedule(
            now_ms + self.topology.gossip_interval_ms,
            Event::GossipRound,
        );
    }

    fn sample(&mut self, now_ms: u64) {
        let minute = at(now_ms).minute();
        let counted: i64 = self
            .nodes
            .iter()
            .map(|n| n.counters.active_users(minute))
            .sum();
        self.peak_active_counted = self.peak_active_counted.max(counted);
        if now_ms.is_multiple_of(TIMELINE_EVERY_MS) {
            self.timeline.push(Sample {
                at_s: now_ms / 1_000,
                active: self.active,
                active_counted: counted,
                admits_this_minute: self.admits_in(now_ms),
                queued: self.queued_now,
            });
        }
        self.schedule(now_ms + 1_000, Event::Sample);
    }

    fn admits_in(&self, now_ms: u64) -> u64 {
        self.admits_per_minute
            .get(&(now_ms / MILLIS_PER_MINUTE))
            .copied()
            .unwrap_or(0)
    }

    /// One request of visitor `v` at their node: the engine decides.
    fn request(&mut self, v: usize, now_ms: u64) {
        let now = at(now_ms);
        let visitor = self.visitors[v];
        let node = &self.nodes[visitor.arrival.node];
        let decision = decide(
            &self.room,
            &node.state,
            &node.counters,
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
                let v_state = &mut self.visitors[v];
                let session_end = now_ms + self.room.session_minutes() * MILLIS_PER_MINUTE;
                v_state.session_end_ms = Some(session_end);
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
                    self.visitors[v].queued = true;
                    self.queued_now += 1;
                    if reason != QueueReason::TooEarly && self.below_limits(now_ms, EARLY) {
                        self.queued_early += 1;
                    }
                }
                if reason != QueueReason::TooEarly && self.first_queue.is_none() {
                    self.first_queue = Some(FirstQueue {
                        at_ms: now_ms,
                        active: self.active,
                        admits_this_minute: self.admits_in(now_ms),
                    });
                }
                let check_in = ticket.next_check_in().0 - START.0
                    + self.rng.random_range(0..=CHECK_IN_LATENCY_MS);
                self.schedule(check_in.max(now_ms + 1), Event::Request(v));
            }
            Decision::Reject { .. } => {}
        }
    }

    /// Both limits are less than `fraction` used (ground truth).
    fn below_limits(&self, now_ms: u64, fraction: f64) -> bool {
        (self.active as f64) < fraction * self.room.total_active_users() as f64
            && (self.admits_in(now_ms) as f64) < fraction * self.room.new_users_per_minute() as f64
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
