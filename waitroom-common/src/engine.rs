//! The admission decision: origin or queue, for one request.
//!
//! [`decide`] reads top to bottom in the order the seeds reason:
//! 1. a visitor with a live session goes through (and renews it);
//! 2. passthrough admits and reject refuses everyone else;
//! 3. a queued visitor checking in before their refresh interval is up gets
//!    no chance and consumes nothing;
//! 4. `queue_all` queues;
//! 5. in random queueing the lottery is among the waiting, not among
//!    requests: a new visitor (no usable ticket, or an ended session) joins
//!    the queue while others wait ([`QueueReason::JoinedQueue`]) and first
//!    gets a chance at their first on-time check-in, like everyone else.
//!    Otherwise every cookie-less request would be a fresh lottery ticket,
//!    and a client that drops its cookie and polls 20 times a second wins
//!    nearly every released slot (issue 13, item 7). "Others wait" means the
//!    global state's `total_waiting` is above zero: the whole room's queue,
//!    other nodes included, as of the last state (about a second old),
//!    counting everyone who checked in within the counters' waiting window.
//!    It is read from the state, never summed from this node's counters on
//!    the request path. When it is stale the error is on the safe side: a
//!    queue that just emptied (or holds only visitors who gave up) makes a
//!    newcomer wait one refresh interval before drawing, alone; a queue that
//!    formed within the last second lets a newcomer draw at once, as the
//!    first arrivals of that second did. With nobody waiting (an open room)
//!    a new visitor goes on to step 6 and is admitted at once if a slot is
//!    free: a quiet site queues nobody. FIFO is untouched: there new visitors
//!    already stand behind the waiting buckets (`pools_for`);
//! 6. otherwise the visitor tries for a slot from the pools they may use —
//!    in FIFO by their bucket, in random queueing from the shared pools —
//!    through the node's ticket counter, and is admitted or queued with an
//!    estimate.
//!
//! Every count a ticket holds is moved from where the [ticket
//! ledger](crate::ledger) says it sits, together with a compare-and-swap of
//! the ticket's entry, never from the cookie's word alone: a replayed or
//! stale cookie moves nothing twice (see the ledger's docs for the rule and
//! its bounds).
//!
//! A room with scheduled events is decided as it stands at `now`
//! ([`Room::at`]): an event's overrides, or its pre-queue as `queue_all`;
//! a pre-queued ticket is moved to its drawn bucket once the event starts
//! with a shuffle (see [`crate::event`]).
//!
//! It does no I/O, reads no clock and uses only the randomness it is given.
//! The admitted path allocates nothing.

use serde::{Deserialize, Serialize};

use crate::counters::{MAX_BUCKET_AGE_MINUTES, Pool, RoomCounters, WAITING_BUCKETS};
use crate::estimate::WaitEstimate;
use crate::event::EventPhase;
use crate::ledger::{Counted, Seen, TicketLedger, ticket_id};
use crate::room::{QueueingMethod, Room};
use crate::slots::SharedFor;
use crate::state::GlobalState;
use crate::ticket::Ticket;
use crate::time::{ExpirySlot, Minute, UnixMillis};

/// Check-ins this much before the ticket's refresh time still count, for
/// clock differences between nodes (not enough to gain anything by spamming).
pub const EARLY_CHECK_IN_TOLERANCE_MS: u64 = 1_000;

/// Who made the request, as their ticket showed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Visitor {
    /// No usable ticket, or an ended session: joins at the back.
    New,
    /// Queued and checking in.
    Waiting,
    /// Admitted with a session still running.
    Admitted,
}

/// Why a visitor was admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdmitReason {
    /// Returning visitor whose session is still valid.
    SessionValid,
    /// The room lets everyone through.
    Passthrough,
    /// A slot from this pool (bucket eligible, colo share or Anywhere).
    Slot(Pool),
}

/// Why a visitor waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueReason {
    /// Checked in before the ticket's refresh interval was up: no chance taken.
    TooEarly,
    /// The room queues everyone without a session.
    QueueAll,
    /// FIFO: older buckets take this minute's slots.
    BehindOlderBuckets,
    /// Every pool this visitor may use is spent for this minute.
    NoSlotLeft,
    /// Random queueing: a new visitor while others wait joins the lottery
    /// and draws from their first on-time check-in (step 5).
    JoinedQueue,
}

/// The engine's answer, always with the ticket to send back.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    Admit {
        ticket: Ticket,
        visitor: Visitor,
        reason: AdmitReason,
    },
    Queue {
        ticket: Ticket,
        visitor: Visitor,
        reason: QueueReason,
        estimate: WaitEstimate,
    },
    /// Queueing method `reject`: refused with no place in a queue.
    Reject { ticket: Ticket, visitor: Visitor },
}

impl Decision {
    /// The ticket to set as the visitor's cookie.
    #[must_use]
    pub fn ticket(&self) -> &Ticket {
        match self {
            Self::Admit { ticket, .. }
            | Self::Queue { ticket, .. }
            | Self::Reject { ticket, .. } => ticket,
        }
    }

    /// The ticket to set as the cookie, for the node to add what the engine
    /// does not know (the client's network, `ticket_binding`).
    pub fn ticket_mut(&mut self) -> &mut Ticket {
        match self {
            Self::Admit { ticket, .. }
            | Self::Queue { ticket, .. }
            | Self::Reject { ticket, .. } => ticket,
        }
    }

    #[must_use]
    pub fn is_admitted(&self) -> bool {
        matches!(self, Self::Admit { .. })
    }
}

/// What the ledger noticed while deciding (for the node's defence counts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LedgerNote {
    /// The cookie claimed a count the ledger says was moved since (a
    /// replayed or stale copy): its claim was not believed.
    pub replayed: bool,
}

/// Decides one request. See the module docs for the order of the rules.
///
/// `rng` is a fresh random `u64` from the caller; it jitters the next refresh
/// interval of a visitor who is queued and draws a new ticket's id.
pub fn decide(
    room: &Room,
    global: &GlobalState,
    counters: &RoomCounters,
    ledger: &TicketLedger,
    ticket: Option<Ticket>,
    now: UnixMillis,
    rng: u64,
) -> Decision {
    decide_noting(room, global, counters, ledger, ticket, now, rng).0
}

/// [`decide`], also saying what the ledger noticed.
pub fn decide_noting(
    room: &Room,
    global: &GlobalState,
    counters: &RoomCounters,
    ledger: &TicketLedger,
    ticket: Option<Ticket>,
    now: UnixMillis,
    rng: u64,
) -> (Decision, LedgerNote) {
    // The room as it stands now: a scheduled event's overrides, or its
    // pre-queue as `queue_all` (see `crate::event`).
    let room = &room.at(now);
    let minute = now.minute();
    let ticket = ticket
        .filter(|t| t.room == room.id())
        .and_then(Ticket::upgraded)
        .map(|(mut t, claims_hold)| {
            if t.id == 0 {
                t.id = ticket_id(rng);
            }
            (t, claims_hold)
        });
    let mut note = LedgerNote::default();
    let mut place = ticket.map(|(t, claims_hold)| {
        let mut place = Place::of(ledger, &t, minute);
        if !claims_hold {
            // A ticket of the old format points into counters this node has
            // set aside (see `crate::ticket`): counted nowhere here.
            place.claim = Counted::Nowhere;
        }
        note.replayed = place.replayed();
        place
    });
    let ticket = ticket.map(|(t, _)| t);

    // 1. A live session goes straight through, whatever the queue looks like,
    // unless the ledger says it was ended early ([`revoke`]): a session the
    // ledger counts nowhere while its cookie is still live was revoked, and
    // a kept copy of that cookie is a new visitor's.
    if let (Some(ticket), Some(place)) = (ticket, place.as_mut())
        && let Some(end) = ticket.session_end(room.session_minutes(), room.session_renewal())
    {
        let revoked = place.seen.known == Some(Counted::Nowhere)
            && matches!(place.claim, Counted::Session { .. });
        if revoked {
            note.replayed = true;
        } else if now < end {
            return (
                renew_session(room, counters, ledger, place, ticket, now),
                note,
            );
        }
        // Ended: uncount it now (if its counted slot has not passed yet),
        // from where the ledger says it is counted. A stale copy of a
        // ticket renewed since proves nothing about the later session.
        match (place.seen.known, place.claim) {
            // The ledger is ahead of this cookie: requests since its last seal
            // (the edge reseals a browsing visitor's cookie at most every
            // 30 s) renewed the session to a later slot. Not this cookie's to
            // end, and no replay: the later session ends at its own slot.
            (Some(Counted::Session { expiry: known }), Counted::Session { expiry: claimed })
                if known > claimed => {}
            (Some(known @ Counted::Session { .. }), claim) if known != claim => {
                note.replayed = true;
            }
            _ => place.settle(ledger, counters, Counted::Nowhere, now, false),
        }
    }
    let (ticket, visitor, mut place) = match (ticket, place) {
        (Some(ticket), Some(mut place)) if !ticket.is_admitted() => {
            let ticket = shuffle_at_event_start(room, ledger, counters, &mut place, ticket, now);
            (
                keep_bucket_trackable(ledger, counters, &mut place, ticket, now),
                Visitor::Waiting,
                place,
            )
        }
        _ => {
            let mut ticket = Ticket {
                id: ticket_id(rng),
                ..Ticket::new_visitor(room.id(), now, room.refresh_interval_secs())
            };
            // A pre-queue arrival in the minute the event starts joins the
            // last pre-queue bucket, so that the shuffle at the start
            // (buckets before the start's minute) includes them.
            if let Some(event) = room.event()
                && event.phase == EventPhase::Prequeueing
            {
                ticket.bucket = ticket.bucket.min(event.start.minute().minus(1));
            }
            let place = Place::of(ledger, &ticket, minute);
            (ticket, Visitor::New, place)
        }
    };
    (
        decide_for(
            room, global, counters, ledger, &mut place, ticket, visitor, now, rng,
        ),
        note,
    )
}

/// Steps 2 to 6 of [`decide`], for a visitor without a live session.
#[expect(
    clippy::too_many_arguments,
    reason = "the decision's whole context, passed down once"
)]
fn decide_for(
    room: &Room,
    global: &GlobalState,
    counters: &RoomCounters,
    ledger: &TicketLedger,
    place: &mut Place,
    ticket: Ticket,
    visitor: Visitor,
    now: UnixMillis,
    rng: u64,
) -> Decision {
    let minute = now.minute();
    if visitor == Visitor::New || ticket.last_check_in.minute() != minute {
        counters.note_visitor(minute);
    }

    // 2. Methods that do not queue.
    match room.queueing_method() {
        QueueingMethod::Passthrough => {
            // Session first, then the admit count (see step 6).
            let decision = admit(
                room,
                counters,
                ledger,
                place,
                ticket,
                visitor,
                now,
                AdmitReason::Passthrough,
                None,
            );
            counters.count_admit(Pool::Uncapped, minute);
            return decision;
        }
        QueueingMethod::Reject => return Decision::Reject { ticket, visitor },
        QueueingMethod::Fifo | QueueingMethod::Random => {}
    }

    // 3. Refresh discipline: too early → no chance, nothing consumed, nothing
    // moved. Unless the ticket was just moved out of its count (the shuffle
    // at an event's start, a bucket made trackable): it is counted where it
    // now is at once, or it would wait uncounted until its next check-in,
    // and those drawn behind it could go first.
    if visitor == Visitor::Waiting
        && ticket.counted_waiting.is_some()
        && now.plus_millis(EARLY_CHECK_IN_TOLERANCE_MS) < ticket.next_check_in()
    {
        let estimate = estimate(room, global, ticket.bucket);
        return Decision::Queue {
            ticket,
            visitor,
            reason: QueueReason::TooEarly,
            estimate,
        };
    }

    // 4. The operator queues everyone.
    if room.queue_all() {
        return queue(
            room,
            global,
            counters,
            ledger,
            place,
            ticket,
            visitor,
            now,
            rng,
            QueueReason::QueueAll,
        );
    }

    // 5. Random queueing draws among the waiting: a newcomer joins them first.
    if room.queueing_method() == QueueingMethod::Random
        && visitor == Visitor::New
        && global.total_waiting > 0
    {
        let mut decision = queue(
            room,
            global,
            counters,
            ledger,
            place,
            ticket,
            visitor,
            now,
            rng,
            QueueReason::JoinedQueue,
        );
        // The state does not count the newcomer yet; the queue they joined does.
        if let Decision::Queue { estimate, .. } = &mut decision {
            *estimate = WaitEstimate::random(global.total_waiting + 1, global.admits_per_minute);
        }
        return decision;
    }

    // 6. A slot, or the queue. The session is counted *before* the ticket is
    // taken (and uncounted if none is left): a snapshot of the counters taken
    // meanwhile (`GlobalState::standalone`, `RoomCounters::report`, which read
    // admits, then sessions, then admits again) may then count one visitor too
    // many as active, never one too few, so the slots it hands out never
    // exceed the limits.
    let expiry = now.session_slot(room.session_minutes());
    counters.start_session(expiry);
    match take_slot(room, global, counters, ticket.bucket, visitor, now) {
        Ok(pool) => admit(
            room,
            counters,
            ledger,
            place,
            ticket,
            visitor,
            now,
            AdmitReason::Slot(pool),
            Some(expiry),
        ),
        Err(reason) => {
            counters.end_session(expiry);
            queue(
                room, global, counters, ledger, place, ticket, visitor, now, rng, reason,
            )
        }
    }
}

/// Ends an admitted visitor's session now (an origin's `revoke` command):
/// its count leaves the session histogram at once, so the slot is free for
/// the next visitor, and the ledger keeps the ticket as counted nowhere, so
/// [`decide`] takes a replay of its cookie for a new visitor. Returns whether
/// a session was ended (not a ticket without one, nor one ended already).
///
/// Pass the ticket as [`decide`] returned it for this request. A node whose
/// ledger does not know the ticket (evicted, or another node's) believes the
/// cookie's claim, as [`decide`] does.
pub fn revoke(
    counters: &RoomCounters,
    ledger: &TicketLedger,
    ticket: &Ticket,
    now: UnixMillis,
) -> bool {
    if !ticket.is_admitted() {
        return false;
    }
    let mut place = Place::of(ledger, ticket, now.minute());
    if matches!(
        place.seen.known,
        Some(Counted::Nowhere) | Some(Counted::Waiting { .. })
    ) {
        return false;
    }
    place.settle(ledger, counters, Counted::Nowhere, now, false);
    true
}

/// Whether [`decide`] would take this request for a [`Visitor::New`]: no
/// usable ticket for this room, or one whose session has ended. The edge asks
/// before deciding, so that it can refuse a client too many new tickets
/// without the engine having moved any counter.
#[must_use]
pub fn is_new_visitor(room: &Room, ticket: Option<&Ticket>, now: UnixMillis) -> bool {
    let room = &room.at(now);
    match ticket
        .filter(|t| t.room == room.id())
        .and_then(|t| t.upgraded())
        .map(|(t, _)| t)
    {
        None => true,
        // Only an admitted ticket has a session end; a queued one is Waiting.
        Some(t) => t
            .session_end(room.session_minutes(), room.session_renewal())
            .is_some_and(|end| now >= end),
    }
}

/// A returning admitted visitor: renew the session and move its expiry count
/// (from where the ledger says it is: a copy of the cookie may have moved it).
fn renew_session(
    room: &Room,
    counters: &RoomCounters,
    ledger: &TicketLedger,
    place: &mut Place,
    mut ticket: Ticket,
    now: UnixMillis,
) -> Decision {
    if ticket.last_check_in.minute() != now.minute() {
        counters.note_visitor(now.minute());
    }
    // Recorded even without renewal (the session then counts from `accepted_at`,
    // see `Ticket::session_end`): it is what tells a first request this minute.
    ticket.last_check_in = now;
    let expiry = match (room.session_renewal(), ticket.counted_expiry) {
        (false, Some(expiry)) => expiry,
        _ => now.session_slot(room.session_minutes()),
    };
    place.settle(ledger, counters, Counted::Session { expiry }, now, false);
    ticket.counted_expiry = Some(expiry);
    Decision::Admit {
        ticket,
        visitor: Visitor::Admitted,
        reason: AdmitReason::SessionValid,
    }
}

/// Which pools a visitor of `bucket` may take a slot from, tried in order.
fn pools_for(
    room: &Room,
    global: &GlobalState,
    bucket: Minute,
    visitor: Visitor,
) -> Result<&'static [Pool], QueueReason> {
    const ELIGIBLE: &[Pool] = &[Pool::Eligible, Pool::Anywhere];
    const SHARED: &[Pool] = &[Pool::ColoShare, Pool::Anywhere];
    if room.queueing_method() == QueueingMethod::Random {
        return Ok(SHARED);
    }
    // Eligible slots are reserved for the visitors counted as waiting in the
    // covered buckets, and every node holds all of them; a new visitor is not
    // one of those, even when this minute's bucket is covered.
    if visitor == Visitor::Waiting
        && global
            .eligible_before()
            .is_some_and(|frontier| bucket < frontier)
    {
        return Ok(ELIGIBLE);
    }
    match (global.first_uncovered, global.shared_for) {
        (None, _) => Ok(SHARED),
        (Some(partial), SharedFor::PartialBucket(shared))
            if partial == shared && bucket == partial =>
        {
            Ok(SHARED)
        }
        (Some(_), _) => Err(QueueReason::BehindOlderBuckets),
    }
}

/// Whether a new visitor deciding now would be queued only because every
/// shared pool it may use is spent on this node ([`QueueReason::NoSlotLeft`]),
/// moving no count. The edge asks before deciding: that is the one visitor a
/// bigger promise from the aggregator would admit, so it may hold the
/// decision for a bounded wait while the node asks for one (the on-demand
/// lease, issue 15). `false` whenever something else decides: a method that
/// does not queue, `queue_all`, a random queue with visitors waiting, or FIFO
/// buckets older than the visitor's (holding would not admit them sooner).
#[must_use]
pub fn short_of_slots(
    room: &Room,
    global: &GlobalState,
    counters: &RoomCounters,
    now: UnixMillis,
) -> bool {
    match room.queueing_method() {
        QueueingMethod::Passthrough | QueueingMethod::Reject => return false,
        QueueingMethod::Random if global.total_waiting > 0 => return false,
        QueueingMethod::Fifo | QueueingMethod::Random => {}
    }
    if room.queue_all() {
        return false;
    }
    let minute = now.minute();
    let Ok(pools) = pools_for(room, global, minute, Visitor::New) else {
        return false;
    };
    let used = counters.admits(minute);
    pools
        .iter()
        .all(|&pool| used.get(pool) >= global.cap(pool, now, false))
}

/// Takes one ticket from the first pool with room under its cap.
fn take_slot(
    room: &Room,
    global: &GlobalState,
    counters: &RoomCounters,
    bucket: Minute,
    visitor: Visitor,
    now: UnixMillis,
) -> Result<Pool, QueueReason> {
    let pools = pools_for(room, global, bucket, visitor)?;
    let spread = room.queueing_method() == QueueingMethod::Random && global.total_waiting > 0;
    pools
        .iter()
        .copied()
        .find(|&pool| counters.take_ticket(pool, now.minute(), global.cap(pool, now, spread)))
        .ok_or(QueueReason::NoSlotLeft)
}

/// Admits the visitor; `started` is the expiry slot when the session was
/// already counted (see step 6 of [`decide`]).
#[expect(
    clippy::too_many_arguments,
    reason = "the decision's whole context, passed down once"
)]
fn admit(
    room: &Room,
    counters: &RoomCounters,
    ledger: &TicketLedger,
    place: &mut Place,
    mut ticket: Ticket,
    visitor: Visitor,
    now: UnixMillis,
    reason: AdmitReason,
    started: Option<ExpirySlot>,
) -> Decision {
    let expiry = started.unwrap_or_else(|| now.session_slot(room.session_minutes()));
    place.settle(
        ledger,
        counters,
        Counted::Session { expiry },
        now,
        started.is_some(),
    );
    ticket.accepted_at = Some(now);
    ticket.last_check_in = now;
    ticket.counted_expiry = Some(expiry);
    ticket.counted_waiting = None;
    Decision::Admit {
        ticket,
        visitor,
        reason,
    }
}

#[expect(
    clippy::too_many_arguments,
    reason = "the decision's whole context, passed down once"
)]
fn queue(
    room: &Room,
    global: &GlobalState,
    counters: &RoomCounters,
    ledger: &TicketLedger,
    place: &mut Place,
    mut ticket: Ticket,
    visitor: Visitor,
    now: UnixMillis,
    rng: u64,
    reason: QueueReason,
) -> Decision {
    let minute = now.minute();
    place.settle(
        ledger,
        counters,
        Counted::Waiting {
            bucket: ticket.bucket,
            check_in: minute,
        },
        now,
        false,
    );
    ticket.counted_waiting = Some(minute);
    ticket.last_check_in = now;
    ticket.refresh_interval_secs = jittered_interval(room.refresh_interval_secs(), rng);
    let estimate = estimate(room, global, ticket.bucket);
    Decision::Queue {
        ticket,
        visitor,
        reason,
        estimate,
    }
}

pub(crate) fn estimate(room: &Room, global: &GlobalState, bucket: Minute) -> WaitEstimate {
    if room.queue_all() {
        return WaitEstimate::unknown(global.visitors_ahead(bucket));
    }
    match room.queueing_method() {
        QueueingMethod::Random => {
            WaitEstimate::random(global.total_waiting, global.admits_per_minute)
        }
        _ => WaitEstimate::fifo(global.visitors_ahead(bucket), global.admits_per_minute),
    }
}

/// A ticket pre-queued for an event with `shuffle_at_event_start` is moved,
/// once the event has started, to the bucket its id draws (see
/// [`Shuffle`](crate::event::Shuffle)): its count leaves the arrival bucket
/// through the ledger, and [`queue`] or [`admit`] counts it where it now is.
/// Idempotent, and the same on every node.
fn shuffle_at_event_start(
    room: &Room,
    ledger: &TicketLedger,
    counters: &RoomCounters,
    place: &mut Place,
    mut ticket: Ticket,
    now: UnixMillis,
) -> Ticket {
    if let Some(bucket) = room
        .shuffle()
        .and_then(|shuffle| shuffle.bucket(ticket.bucket, ticket.id))
        && bucket != ticket.bucket
    {
        place.settle(ledger, counters, Counted::Nowhere, now, false);
        ticket.bucket = bucket;
        ticket.counted_waiting = None;
    }
    ticket
}

/// A ticket whose bucket the counters can no longer tell apart from a newer
/// one (waiting for more than [`MAX_BUCKET_AGE_MINUTES`]) is moved up to the
/// oldest trackable bucket: still first in line. A bucket in the future (a
/// node with a fast clock) is brought back to now.
fn keep_bucket_trackable(
    ledger: &TicketLedger,
    counters: &RoomCounters,
    place: &mut Place,
    mut ticket: Ticket,
    now: UnixMillis,
) -> Ticket {
    let minute = now.minute();
    let bucket = ticket
        .bucket
        .clamp(minute.minus(MAX_BUCKET_AGE_MINUTES), minute);
    if bucket != ticket.bucket {
        place.settle(ledger, counters, Counted::Nowhere, now, false);
        ticket.bucket = bucket;
        ticket.counted_waiting = None;
    }
    ticket
}

/// A ticket's entry in the ledger and what its cookie claims: where its
/// counts are moved from.
#[derive(Clone, Copy, Debug)]
struct Place {
    seen: Seen,
    /// Where the cookie says the ticket is counted: believed only while the
    /// ledger does not know the ticket (once; then the entry is written).
    claim: Counted,
}

impl Place {
    fn of(ledger: &TicketLedger, ticket: &Ticket, now: Minute) -> Self {
        let claim = match (
            ticket.accepted_at,
            ticket.counted_expiry,
            ticket.counted_waiting,
        ) {
            (Some(_), Some(expiry), _) => Counted::Session { expiry },
            (None, _, Some(check_in)) => Counted::Waiting {
                bucket: ticket.bucket,
                check_in,
            },
            _ => Counted::Nowhere,
        };
        Self {
            seen: ledger.look(ticket.id, now),
            claim,
        }
    }

    /// The cookie claims a count the ledger says has moved since (a session
    /// renewed by a parallel request of the same browser is not one: its
    /// expiry slot only moved on).
    fn replayed(&self) -> bool {
        match (self.seen.known, self.claim) {
            (None, _) => false,
            (Some(Counted::Session { .. }), Counted::Session { .. }) => false,
            (Some(known), claim) => known != claim,
        }
    }

    /// Moves the ticket's counts to `to`: from where the ledger says they
    /// are (or, for a ticket it does not know, from the cookie's claim), and
    /// only after the entry was swapped from that state, so no count moves
    /// twice. `provisional`: the count at `to` was already added by the
    /// caller (a session counted before its admit ticket was taken).
    fn settle(
        &mut self,
        ledger: &TicketLedger,
        counters: &RoomCounters,
        to: Counted,
        now: UnixMillis,
        provisional: bool,
    ) {
        let minute = now.minute();
        // Each failed swap means another request of this ticket moved it;
        // bounded so a pathological storm cannot hold a worker.
        for _ in 0..64 {
            let from = self.seen.known.unwrap_or(self.claim);
            if from == to && self.seen.known.is_some() {
                if provisional {
                    uncount(counters, to, now);
                }
                return;
            }
            if ledger.replace(&mut self.seen, to, minute) {
                // A ledger that remembers nothing (`TicketLedger::forgetful`)
                // leaves `seen` unknown: the next move of this request starts
                // from here, not again from the cookie's claim.
                self.claim = to;
                uncount(counters, from, now);
                if !provisional {
                    count(counters, to, now);
                }
                return;
            }
        }
        if provisional {
            uncount(counters, to, now);
        }
    }
}

/// Takes a ticket's count away from where it was.
fn uncount(counters: &RoomCounters, from: Counted, now: UnixMillis) {
    let minute = now.minute();
    match from {
        Counted::Nowhere => {}
        // A slot that has ended no longer counts; only the current one and later.
        Counted::Session { expiry } => {
            if expiry >= now.expiry_slot() {
                counters.end_session(expiry);
            }
        }
        Counted::Waiting { bucket, check_in } => {
            // The row is only safe to touch while it cannot hold a live bucket.
            if bucket.plus(WAITING_BUCKETS as u64) > minute && bucket <= minute {
                counters.move_waiting(bucket, Some(check_in), None, minute);
            }
        }
    }
}

/// Counts a ticket where it now is.
fn count(counters: &RoomCounters, to: Counted, now: UnixMillis) {
    match to {
        Counted::Nowhere => {}
        Counted::Session { expiry } => counters.start_session(expiry),
        Counted::Waiting { bucket, check_in } => {
            counters.move_waiting(bucket, None, Some(check_in), now.minute());
        }
    }
}

/// The next refresh interval: uniform on `mean ± mean/5` (at least ±1 s), so
/// bounded, and with exactly `mean` as its mean, from one random `u64`.
#[must_use]
pub fn jittered_interval(mean: u16, rng: u64) -> u16 {
    let spread = jitter_spread(mean);
    let low = mean.saturating_sub(spread);
    let high = mean.saturating_add(spread);
    low + (rng % u64::from(high - low + 1)) as u16
}

/// The longest interval [`jittered_interval`] draws around `mean`.
#[must_use]
pub const fn longest_interval(mean: u16) -> u16 {
    mean.saturating_add(jitter_spread(mean))
}

const fn jitter_spread(mean: u16) -> u16 {
    let fifth = mean / 5;
    if fifth > 1 { fifth } else { 1 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::PoolCounts;
    use crate::room::RoomId;
    use crate::room::tests::config;
    use crate::slots::{SlotInputs, SlotPlan};
    use crate::time::tests::at;

    const ROOM: RoomId = RoomId(42);

    fn room(total: u64, per_minute: u64) -> Room {
        config(total, per_minute).validate().unwrap().with_id(ROOM)
    }

    fn with_method(room: &Room, method: QueueingMethod) -> Room {
        room.clone().with_queueing_method(method)
    }

    /// A state with `allowance` to hand out and the given queue.
    fn state(
        now: UnixMillis,
        waiting: &[(Minute, u64)],
        slots: u64,
        allowance: PoolCounts,
        random: bool,
    ) -> GlobalState {
        let plan = SlotPlan::new(SlotInputs {
            total_active_users: 1_000_000,
            new_users_per_minute: slots,
            active_users: 0,
            admitted_this_minute: 0,
            random,
            waiting,
            traffic: &[],
            anywhere_weight: 0,
        });
        GlobalState::from_plan(now, 0, 0, &plan, 10.0, PoolCounts::default(), allowance)
    }

    fn open(now: UnixMillis, slots: u64) -> GlobalState {
        state(
            now,
            &[],
            slots,
            PoolCounts {
                colo_share: slots,
                ..PoolCounts::default()
            },
            false,
        )
    }

    fn ticket_of(decision: &Decision) -> Ticket {
        *decision.ticket()
    }

    /// The engine with a ledger that remembers nothing: every cookie's
    /// claim is believed, as these tests were written for. The tests of the
    /// ledger's rule are in `mod ledger` below.
    fn decide(
        room: &Room,
        global: &GlobalState,
        counters: &RoomCounters,
        ticket: Option<Ticket>,
        now: UnixMillis,
        rng: u64,
    ) -> Decision {
        super::decide(
            room,
            global,
            counters,
            &TicketLedger::forgetful(),
            ticket,
            now,
            rng,
        )
    }

    #[test]
    fn new_visitor_admitted_with_a_slot_and_counted_active() {
        let room = room(200, 200);
        let counters = RoomCounters::new_boxed(ROOM);
        let now = at(11, 45, 54);
        let decision = decide(&room, &open(now, 10), &counters, None, now, 0);
        let Decision::Admit {
            ticket,
            visitor: Visitor::New,
            reason: AdmitReason::Slot(Pool::ColoShare),
        } = decision
        else {
            panic!("{decision:?}")
        };
        assert_eq!(ticket.bucket, now.minute());
        assert_eq!(ticket.accepted_at, Some(now));
        assert_eq!(
            ticket.counted_expiry,
            Some(now.plus_minutes(5).expiry_slot())
        );
        assert_eq!(counters.active_users(now.expiry_slot()), 1);
        assert_eq!(counters.admits(now.minute()).colo_share, 1);
        assert_eq!(counters.distinct_visitors(now.minute()), 1);
    }

    /// The on-demand lease's question: exactly the visitor the engine would
    /// queue for want of a slot, asked without moving a count.
    #[test]
    fn short_of_slots_is_the_visitor_queued_for_want_of_a_slot() {
        let room = room(200, 200);
        let counters = RoomCounters::new_boxed(ROOM);
        let now = at(11, 45, 54);
        let global = open(now, 2);
        for i in 0..2 {
            assert!(!short_of_slots(&room, &global, &counters, now));
            assert!(matches!(
                decide(&room, &global, &counters, None, now, i),
                Decision::Admit { .. }
            ));
        }
        let before = counters.admits(now.minute());
        assert!(short_of_slots(&room, &global, &counters, now));
        assert_eq!(counters.admits(now.minute()), before, "nothing moved");
        let Decision::Queue { reason, .. } = decide(&room, &global, &counters, None, now, 9) else {
            panic!("queued")
        };
        assert_eq!(reason, QueueReason::NoSlotLeft);
        // Where something else decides, holding would not help.
        let all = crate::room::RoomConfig {
            queue_all: true,
            ..config(200, 200)
        }
        .validate()
        .unwrap()
        .with_id(ROOM);
        assert!(!short_of_slots(&all, &global, &counters, now));
        let pass = with_method(&room, QueueingMethod::Passthrough);
        assert!(!short_of_slots(&pass, &global, &counters, now));
        let behind = state(
            now,
            &[(now.minute().minus(1), 5)],
            2,
            PoolCounts::default(),
            false,
        );
        assert!(!short_of_slots(&room, &behind, &counters, now));
    }

    /// Seed 000: San Jose may send 15 of its own and Anywhere holds 113, so
    /// even 128 new users on one San Jose node are not queued; the 129th is.
    #[test]
    fn seed_san_jose_15_plus_anywhere_113_admits_128() {
        let room = room(200, 200);
        let counters = RoomCounters::new_boxed(ROOM);
        let now = at(11, 45, 54);
        let global = state(
            now,
            &[],
            150,
            PoolCounts {
                colo_share: 15,
                anywhere: 113,
                ..PoolCounts::default()
            },
            false,
        );
        let admitted: Vec<Decision> = (0..129)
            .map(|i| decide(&room, &global, &counters, None, now, i))
            .collect();
        let from = |pool| {
            admitted.iter().filter(|d| matches!(d, Decision::Admit { reason: AdmitReason::Slot(p), .. } if *p == pool)).count()
        };
        assert_eq!((from(Pool::ColoShare), from(Pool::Anywhere)), (15, 113));
        assert!(matches!(
            admitted[128],
            Decision::Queue {
                reason: QueueReason::NoSlotLeft,
                ..
            }
        ));
    }

    /// Many workers deciding at once on one node never admit past the node's cap.
    #[test]
    fn concurrent_decisions_never_over_admit() {
        let room = room(10_000, 10_000);
        let counters = RoomCounters::new_boxed(ROOM);
        let now = at(11, 0, 0);
        let global = state(
            now,
            &[],
            100,
            PoolCounts {
                colo_share: 70,
                anywhere: 30,
                ..PoolCounts::default()
            },
            false,
        );
        let admitted: usize = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..4)
                .map(|w| {
                    let (room, global, counters) = (&room, &global, &counters);
                    scope.spawn(move || {
                        (0..200)
                            .filter(|&i| {
                                decide(room, global, counters, None, now, w * 1_000 + i)
                                    .is_admitted()
                            })
                            .count()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        assert_eq!(admitted, 100);
        assert_eq!(counters.active_users(now.expiry_slot()), 100);
        assert_eq!(counters.waiting(now.minute(), now.minute()), 700);
    }

    /// A snapshot taken while admissions race it never sees an admit without
    /// its session: that is what keeps the slots computed from it within the
    /// limits (this failed when the ticket was taken before the session).
    #[test]
    fn snapshots_racing_admissions_never_count_an_admit_without_its_session() {
        use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
        let room = room(1_000_000, 1_000_000);
        let counters = RoomCounters::new_boxed(ROOM);
        let now = at(11, 0, 0);
        let global = open(now, 1_000_000);
        let done = AtomicBool::new(false);
        // Snapshots taken so far: the deciders go on past their 20,000 until
        // the watcher took some while they ran (a loaded machine may not
        // schedule it at first), within 10 s.
        let taken = AtomicU32::new(0);
        let decided = std::thread::scope(|scope| {
            let deciders: Vec<_> = (0..2)
                .map(|w| {
                    let (room, global, counters, taken) = (&room, &global, &counters, &taken);
                    scope.spawn(move || {
                        let started = std::time::Instant::now();
                        let mut i = 0;
                        while i < 20_000
                            || (taken.load(Ordering::Relaxed) < 10
                                && started.elapsed() < std::time::Duration::from_secs(10))
                        {
                            decide(room, global, counters, None, now, w * 1_000_000 + i);
                            i += 1;
                        }
                        i
                    })
                })
                .collect();
            let (counters, done_ref, taken) = (&counters, &done, &taken);
            let watcher = scope.spawn(move || {
                let mut snapshots = 0;
                while !done_ref.load(Ordering::Relaxed) {
                    let (admits, active) = counters.admits_and_active(now);
                    assert!(
                        active >= i64::try_from(admits.total()).unwrap(),
                        "{} admits but only {active} sessions",
                        admits.total()
                    );
                    let report = counters.report(now);
                    let reported_active: i64 = report.expiries.iter().map(|(_, n)| n).sum();
                    let reported_admits: u64 = report.admits.iter().map(|a| a.admits.total()).sum();
                    assert!(reported_active >= i64::try_from(reported_admits).unwrap());
                    snapshots += 1;
                    taken.store(snapshots, Ordering::Relaxed);
                }
                snapshots
            });
            let decided: u64 = deciders.into_iter().map(|d| d.join().unwrap()).sum();
            done.store(true, Ordering::Relaxed);
            assert!(watcher.join().unwrap() >= 10);
            decided
        });
        assert!(decided >= 40_000);
        assert_eq!(
            counters.active_users(now.expiry_slot()),
            i64::try_from(decided).unwrap()
        );
    }

    #[test]
    fn returning_admitted_visitor_renews_and_moves_expiry() {
        let room = room(200, 200);
        let counters = RoomCounters::new_boxed(ROOM);
        let t0 = at(20, 1, 13);
        let first = ticket_of(&decide(&room, &open(t0, 10), &counters, None, t0, 0));
        let t1 = at(20, 4, 0);
        let decision = decide(
            &room,
            &GlobalState::empty(t1),
            &counters,
            Some(first),
            t1,
            0,
        );
        let Decision::Admit {
            ticket,
            visitor: Visitor::Admitted,
            reason: AdmitReason::SessionValid,
        } = decision
        else {
            panic!("{decision:?}")
        };
        assert_eq!(ticket.last_check_in, t1);
        assert_eq!(ticket.accepted_at, Some(t0));
        assert_eq!(ticket.counted_expiry, Some(at(20, 9, 0).expiry_slot()));
        assert_eq!(
            counters.expiries(t1.expiry_slot()).collect::<Vec<_>>(),
            vec![(at(20, 9, 0).expiry_slot(), 1)]
        );
        assert_eq!(
            counters.admits(t1.minute()),
            PoolCounts::default(),
            "a session consumes no slot"
        );
    }

    #[test]
    fn expired_session_is_a_new_visitor() {
        let room = room(200, 200);
        let counters = RoomCounters::new_boxed(ROOM);
        let t0 = at(20, 1, 13);
        let first = ticket_of(&decide(&room, &open(t0, 10), &counters, None, t0, 0));
        // 5 minutes after the last check-in, to the end of that second: over
        // (valid through 20:06:13.999, the end of its counted slot).
        let t1 = at(20, 6, 14);
        let decision = decide(
            &room,
            &GlobalState::empty(t1),
            &counters,
            Some(first),
            t1,
            0,
        );
        let Decision::Queue {
            ticket,
            visitor: Visitor::New,
            ..
        } = decision
        else {
            panic!("{decision:?}")
        };
        assert_eq!(ticket.bucket, t1.minute(), "back of the queue");
        assert_eq!(ticket.accepted_at, None);
        assert_eq!(counters.active_users(t1.expiry_slot()), 0, "uncounted");
        assert_eq!(counters.waiting(t1.minute(), t1.minute()), 1);
    }

    #[test]
    fn without_renewal_the_session_counts_from_acceptance() {
        let room = crate::room::RoomConfig {
            disable_session_renewal: true,
            ..config(200, 200)
        }
        .validate()
        .unwrap()
        .with_id(ROOM);
        let counters = RoomCounters::new_boxed(ROOM);
        let t0 = at(8, 0, 0);
        let mut ticket = ticket_of(&decide(&room, &open(t0, 10), &counters, None, t0, 0));
        for minute in 1..5 {
            let now = at(8, minute, 59);
            let decision = decide(
                &room,
                &GlobalState::empty(now),
                &counters,
                Some(ticket),
                now,
                0,
            );
            assert!(decision.is_admitted(), "minute {minute}");
            ticket = ticket_of(&decision);
            assert_eq!(
                ticket.counted_expiry,
                Some(at(8, 5, 0).expiry_slot()),
                "the expiry does not move"
            );
        }
        let now = at(8, 5, 1);
        assert!(
            !decide(
                &room,
                &GlobalState::empty(now),
                &counters,
                Some(ticket),
                now,
                0
            )
            .is_admitted()
        );
    }

    #[test]
    fn check_in_too_early_gets_no_chance_and_consumes_nothing() {
        let room = room(200, 200);
        let counters = RoomCounters::new_boxed(ROOM);
        let t0 = at(9, 0, 0);
        let queued = ticket_of(&decide(
            &room,
            &GlobalState::empty(t0),
            &counters,
            None,
            t0,
            7,
        ));
        let interval = u64::from(queued.refresh_interval_secs);
        // Plenty of slots now, but the visitor refreshed after 5 s.
        let early = t0.plus_secs(5);
        let decision = decide(&room, &open(early, 10), &counters, Some(queued), early, 0);
        let Decision::Queue {
            ticket,
            reason: QueueReason::TooEarly,
            estimate,
            ..
        } = decision
        else {
            panic!("{decision:?}")
        };
        assert_eq!(ticket, queued, "the ticket is not touched");
        assert!(estimate.wait_time_known);
        assert_eq!(counters.admits(early.minute()), PoolCounts::default());
        // On time, the same visitor gets in.
        let on_time = t0.plus_secs(interval);
        let decision = decide(
            &room,
            &open(on_time, 10),
            &counters,
            Some(queued),
            on_time,
            0,
        );
        assert!(
            matches!(
                decision,
                Decision::Admit {
                    visitor: Visitor::Waiting,
                    ..
                }
            ),
            "{decision:?}"
        );
        assert_eq!(
            counters.waiting(t0.minute(), on_time.minute()),
            0,
            "left the queue"
        );
    }

    #[test]
    fn queued_check_in_moves_the_waiting_count_and_rejitters() {
        let room = room(200, 200);
        let counters = RoomCounters::new_boxed(ROOM);
        let t0 = at(9, 0, 50);
        let mut ticket = ticket_of(&decide(
            &room,
            &GlobalState::empty(t0),
            &counters,
            None,
            t0,
            0,
        ));
        let mut intervals = Vec::new();
        let mut now = t0;
        for rng in 1..10 {
            now = now.plus_secs(u64::from(ticket.refresh_interval_secs));
            let decision = decide(
                &room,
                &GlobalState::empty(now),
                &counters,
                Some(ticket),
                now,
                rng,
            );
            assert!(matches!(
                decision,
                Decision::Queue {
                    reason: QueueReason::NoSlotLeft,
                    ..
                }
            ));
            ticket = ticket_of(&decision);
            intervals.push(ticket.refresh_interval_secs);
            assert_eq!(ticket.counted_waiting, Some(now.minute()));
            assert_eq!(
                counters.waiting(t0.minute(), now.minute()),
                1,
                "counted once, wherever they checked in"
            );
        }
        assert!(
            intervals.iter().any(|&i| i != intervals[0]),
            "{intervals:?}"
        );
    }

    #[test]
    fn jitter_is_bounded_and_mean_preserving() {
        for mean in [5_u16, 20, 30, 90] {
            let spread = (mean / 5).max(1);
            let values: Vec<u16> = (0..(2 * u64::from(spread) + 1))
                .map(|rng| jittered_interval(mean, rng))
                .collect();
            assert_eq!(*values.iter().min().unwrap(), mean - spread);
            assert_eq!(*values.iter().max().unwrap(), mean + spread);
            // One full cycle of residues is the uniform distribution: its mean is exact.
            let sum: u64 = values.iter().map(|&v| u64::from(v)).sum();
            assert_eq!(sum, u64::from(mean) * values.len() as u64);
            // And over arbitrary random input too, approximately.
            let n = 10_000_u64;
            let mut x = 0x9e37_79b9_7f4a_7c15_u64;
            let total: u64 = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    u64::from(jittered_interval(mean, x))
                })
                .sum();
            assert!((total as f64 / n as f64 - f64::from(mean)).abs() < 0.1);
        }
        assert!(
            jittered_interval(90, u64::MAX) <= 108,
            "within the counters' waiting window"
        );
    }

    #[test]
    fn passthrough_admits_everyone_and_still_counts() {
        let room = with_method(&room(10, 10), QueueingMethod::Passthrough);
        let counters = RoomCounters::new_boxed(ROOM);
        let now = at(1, 2, 3);
        for i in 0..50 {
            let decision = decide(&room, &GlobalState::empty(now), &counters, None, now, i);
            assert!(matches!(
                decision,
                Decision::Admit {
                    reason: AdmitReason::Passthrough,
                    ..
                }
            ));
        }
        assert_eq!(counters.active_users(now.expiry_slot()), 50);
        assert_eq!(counters.admits(now.minute()).uncapped, 50);
    }

    #[test]
    fn reject_admits_nobody_new_but_keeps_sessions() {
        let fifo = room(10, 10);
        let counters = RoomCounters::new_boxed(ROOM);
        let now = at(1, 2, 3);
        let admitted = ticket_of(&decide(&fifo, &open(now, 10), &counters, None, now, 0));
        let reject = with_method(&fifo, QueueingMethod::Reject);
        assert!(matches!(
            decide(&reject, &open(now, 10), &counters, None, now, 0),
            Decision::Reject {
                visitor: Visitor::New,
                ..
            }
        ));
        assert!(decide(&reject, &open(now, 10), &counters, Some(admitted), now, 0).is_admitted());
        assert_eq!(counters.admits(now.minute()).total(), 1);
    }

    #[test]
    fn queue_all_queues_new_and_waiting_visitors_without_an_estimate() {
        let room = crate::room::RoomConfig {
            queue_all: true,
            ..config(10, 10)
        }
        .validate()
        .unwrap()
        .with_id(ROOM);
        let counters = RoomCounters::new_boxed(ROOM);
        let now = at(1, 2, 3);
        let decision = decide(&room, &open(now, 10), &counters, None, now, 0);
        let Decision::Queue {
            reason: QueueReason::QueueAll,
            estimate,
            ticket,
            ..
        } = decision
        else {
            panic!("{decision:?}")
        };
        assert!(!estimate.wait_time_known);
        let later = now.plus_secs(30);
        assert!(matches!(
            decide(&room, &open(later, 10), &counters, Some(ticket), later, 0),
            Decision::Queue {
                reason: QueueReason::QueueAll,
                visitor: Visitor::Waiting,
                ..
            }
        ));
        assert_eq!(counters.admits(now.minute()).total(), 0);
    }

    /// A room of 10 / 10 (session 5 min) with one event: pre-queue from
    /// 09:50, start 10:00:30 with a shuffle, session 10 min, end 11:00.
    fn room_with_event() -> Room {
        let event: crate::event::EventTable = toml::from_str(
            r#"
name = "sale"
prequeue_start_time = "2021-05-27T09:50:00Z"
event_start_time = "2021-05-27T10:00:30Z"
event_end_time = "2021-05-27T11:00:00Z"
session_duration = 10
shuffle_at_event_start = true
"#,
        )
        .unwrap();
        let events = crate::event::validate_events(&[event], &config(10, 10)).unwrap();
        room(10, 10).with_events(events)
    }

    /// Prequeue → start (shuffle) → end, with the engine alone.
    #[test]
    fn an_event_prequeues_shuffles_at_the_start_and_ends() {
        let room = room_with_event();
        let counters = RoomCounters::new_boxed(ROOM);

        // Before the pre-queue: an open room admits, with the room's session.
        let before = at(9, 49, 0);
        let d = decide(&room, &open(before, 10), &counters, None, before, 1);
        assert!(d.is_admitted(), "{d:?}");
        assert_eq!(
            d.ticket().counted_expiry,
            Some(before.plus_minutes(5).expiry_slot())
        );

        // The pre-queue: everyone waits, wait time unknown, slots or not.
        let arrive = |now: UnixMillis, rng: u64| {
            let d = decide(&room, &open(now, 10), &counters, None, now, rng);
            let Decision::Queue {
                reason: QueueReason::QueueAll,
                estimate,
                ticket,
                ..
            } = d
            else {
                panic!("{d:?}")
            };
            assert!(!estimate.wait_time_known);
            ticket
        };
        let first = arrive(at(9, 50, 0), 2);
        assert_eq!(first.bucket, at(9, 50, 0).minute());
        // In the start's own minute, before the start: the last pre-queue bucket.
        let last = arrive(at(10, 0, 10), 3);
        assert_eq!(last.bucket, at(9, 59, 0).minute());
        // Checking in again (or a copy of the cookie) in the pre-queue: still waiting.
        let again = at(9, 50, 30);
        let d = decide(&room, &open(again, 10), &counters, Some(first), again, 4);
        assert!(
            matches!(
                d,
                Decision::Queue {
                    reason: QueueReason::QueueAll,
                    ..
                }
            ),
            "{d:?}"
        );
        assert_eq!(counters.admits(again.minute()).total(), 0);

        // The start: tickets move to the bucket their id draws, not by arrival.
        let shuffle = room.at(at(10, 1, 0)).shuffle().unwrap();
        let (from, to) = (at(9, 50, 0).minute(), at(9, 59, 0).minute());
        let id_for = |want: Minute| {
            (1..10_000_u64)
                .find(|&id| shuffle.bucket(from, id) == Some(want))
                .unwrap()
        };
        // The earliest arrival draws the last bucket, the latest the first.
        let early = Ticket {
            id: id_for(to),
            last_check_in: at(9, 50, 0),
            ..Ticket::new_visitor(ROOM, at(9, 50, 0), 20)
        };
        let late = Ticket {
            id: id_for(from),
            last_check_in: at(9, 59, 50),
            ..Ticket::new_visitor(ROOM, at(9, 59, 50), 20)
        };
        let now = at(10, 1, 0);
        // One eligible slot for the one visitor counted in the first bucket.
        let global = state(
            now,
            &[(from, 1), (to, 1)],
            1,
            PoolCounts {
                eligible: 1,
                ..PoolCounts::default()
            },
            false,
        );
        let d = decide(&room, &global, &counters, Some(early), now, 5);
        let Decision::Queue {
            reason: QueueReason::BehindOlderBuckets,
            ticket: moved,
            ..
        } = d
        else {
            panic!("{d:?}")
        };
        assert_eq!(moved.bucket, to, "the early arrival drew the last bucket");
        // A replayed copy of its pre-queue cookie lands in the same place.
        let d = decide(&room, &global, &counters, Some(early), now, 6);
        assert_eq!(d.ticket().bucket, to);
        let d = decide(&room, &global, &counters, Some(late), now, 7);
        let Decision::Admit {
            reason: AdmitReason::Slot(Pool::Eligible),
            ticket: admitted,
            ..
        } = d
        else {
            panic!("{d:?}")
        };
        assert_eq!(admitted.bucket, from);
        // During the event: the event's session of 10 minutes.
        assert_eq!(
            admitted.counted_expiry,
            Some(now.plus_minutes(10).expiry_slot())
        );
        // A newcomer after the start is behind the pre-queue, FIFO.
        let d = decide(&room, &global, &counters, None, now, 8);
        assert_eq!(d.ticket().bucket, now.minute());
        assert!(!d.is_admitted());

        // After the end: the room's own session again; stragglers keep their draw.
        let after = at(11, 0, 0);
        let d = decide(&room, &open(after, 10), &counters, None, after, 9);
        assert!(d.is_admitted());
        assert_eq!(
            d.ticket().counted_expiry,
            Some(after.plus_minutes(5).expiry_slot())
        );
        let straggler = Ticket {
            last_check_in: after.minus_secs(20),
            ..early
        };
        let d = decide(
            &room,
            &open(after, 10),
            &counters,
            Some(straggler),
            after,
            10,
        );
        assert_eq!(d.ticket().bucket, to);
    }

    /// Right after a shuffled start nobody is admitted, slots or not, until
    /// the pre-queue has checked in and moved to its drawn buckets; a
    /// ticket that checks in early then is counted in its drawn bucket at
    /// once (not left uncounted until its next check-in, while those drawn
    /// behind it go first).
    #[test]
    fn a_shuffled_start_admits_nobody_until_the_draw_has_settled() {
        let room = room_with_event();
        let counters = RoomCounters::new_boxed(ROOM);
        let start = at(10, 0, 30);
        let shuffle = room.at(start).shuffle().unwrap();
        let settles = shuffle.settles(room.refresh_interval_secs());
        let (from, to) = (at(9, 50, 0).minute(), at(9, 59, 0).minute());
        // Arrived last, drew first; arrived just before the start, so its
        // next check-in is due after the start.
        let arrived = at(10, 0, 25);
        let rng = (1..10_000_u64)
            .find(|&rng| shuffle.bucket(to, ticket_id(rng)) == Some(from))
            .unwrap();
        let d = decide(&room, &open(arrived, 10), &counters, None, arrived, rng);
        let ticket = ticket_of(&d);
        assert_eq!((ticket.bucket, d.is_admitted()), (to, false));
        assert_eq!(counters.waiting(to, arrived.minute()), 1);
        let early = start.plus_millis(1_000);
        assert!(early.plus_millis(EARLY_CHECK_IN_TOLERANCE_MS) < ticket.next_check_in());
        assert!(early < settles);

        let d = decide(&room, &open(early, 10), &counters, Some(ticket), early, 1);
        let Decision::Queue {
            reason: QueueReason::QueueAll,
            ticket: moved,
            ..
        } = d
        else {
            panic!("held while the shuffle settles, not {d:?}")
        };
        assert_eq!(moved.bucket, from);
        assert_eq!(moved.counted_waiting, Some(early.minute()));
        assert_eq!(
            counters.waiting(from, early.minute()),
            1,
            "counted where it drew"
        );
        assert_eq!(
            counters.waiting(to, early.minute()),
            0,
            "and no longer where it came"
        );
        // A newcomer in the hold waits too, behind the pre-queue.
        let d = decide(&room, &open(early, 10), &counters, None, early, 2);
        assert!(!d.is_admitted(), "{d:?}");
        assert_eq!(counters.admits(early.minute()).total(), 0);

        // Once settled the drawn ticket goes in on the slot.
        let d = decide(
            &room,
            &open(settles, 10),
            &counters,
            Some(moved),
            settles,
            3,
        );
        assert!(d.is_admitted(), "{d:?}");
    }

    /// Two nodes that never talked place the same pre-queued ticket in the
    /// same drawn bucket, whichever checks it in first and however often.
    #[test]
    fn the_shuffle_is_the_same_on_every_node() {
        let room = room_with_event();
        let now = at(10, 2, 0);
        let queued = |node: &RoomCounters, ticket: Ticket, rng: u64| {
            // No slot anywhere: the ticket stays queued and shows its bucket.
            let d = decide(&room, &open(now, 0), node, Some(ticket), now, rng);
            assert!(!d.is_admitted(), "{d:?}");
            d.ticket().bucket
        };
        for id in 1..200_u64 {
            let arrived = at(9, 50, 0).plus_minutes(id % 10);
            let ticket = Ticket {
                id,
                last_check_in: arrived,
                ..Ticket::new_visitor(ROOM, arrived, 20)
            };
            let (a, b) = (RoomCounters::new_boxed(ROOM), RoomCounters::new_boxed(ROOM));
            let on_a = queued(&a, ticket, id);
            assert_eq!(on_a, queued(&b, ticket, id.wrapping_mul(7)));
            assert_eq!(on_a, queued(&a, ticket, 3), "a replay on the same node");
            assert!(on_a >= at(9, 50, 0).minute() && on_a < at(10, 0, 0).minute());
        }
    }

    #[test]
    fn tickets_of_another_room_or_version_are_new_visitors() {
        let room = room(10, 10);
        let counters = RoomCounters::new_boxed(ROOM);
        let now = at(1, 2, 3);
        let admitted = ticket_of(&decide(&room, &open(now, 10), &counters, None, now, 0));
        for stranger in [
            Ticket {
                room: RoomId(1),
                ..admitted
            },
            Ticket {
                version: 0,
                ..admitted
            },
        ] {
            let decision = decide(
                &room,
                &GlobalState::empty(now),
                &counters,
                Some(stranger),
                now,
                0,
            );
            assert!(
                matches!(
                    decision,
                    Decision::Queue {
                        visitor: Visitor::New,
                        ..
                    }
                ),
                "{decision:?}"
            );
        }
    }

    /// Seed 002: with 52 slots the 15:54 and 15:55 buckets are eligible; 15:56 waits, 60 ahead → 2 minutes at 30/min.
    #[test]
    fn seed_fifo_eligible_buckets_pass_newer_wait_with_estimate() {
        let room = room(200, 200);
        let counters = RoomCounters::new_boxed(ROOM);
        let now = at(16, 0, 0);
        let waiting = [
            (at(15, 54, 0).minute(), 2),
            (at(15, 55, 0).minute(), 50),
            (at(15, 56, 0).minute(), 60),
        ];
        let mut global = state(
            now,
            &waiting,
            52,
            PoolCounts {
                eligible: 52,
                ..PoolCounts::default()
            },
            false,
        );
        global.admits_per_minute = 30.0;
        let waiter = |bucket: UnixMillis| Ticket {
            last_check_in: now.minus_secs(20),
            ..Ticket::new_visitor(ROOM, bucket, 20)
        };
        let old = decide(
            &room,
            &global,
            &counters,
            Some(waiter(at(15, 55, 30))),
            now,
            0,
        );
        assert!(
            matches!(
                old,
                Decision::Admit {
                    reason: AdmitReason::Slot(Pool::Eligible),
                    ..
                }
            ),
            "{old:?}"
        );
        let newer = decide(
            &room,
            &global,
            &counters,
            Some(waiter(at(15, 56, 10))),
            now,
            0,
        );
        let Decision::Queue {
            reason: QueueReason::BehindOlderBuckets,
            estimate,
            ..
        } = newer
        else {
            panic!("{newer:?}")
        };
        assert_eq!((estimate.visitors_ahead, estimate.whole_minutes()), (60, 2));
        let new = decide(&room, &global, &counters, None, now, 0);
        assert!(matches!(
            new,
            Decision::Queue {
                reason: QueueReason::BehindOlderBuckets,
                visitor: Visitor::New,
                ..
            }
        ));
    }

    /// The eligible slots of a covered bucket are reserved for the visitors
    /// counted as waiting in it. Every node is handed all of them (any node
    /// may admit those visitors), so a brand-new visitor, whose bucket is this
    /// minute, must not draw on them: on two nodes that would admit up to
    /// twice the reservation on top of the shared slots (found by
    /// `cargo xtask simulate`, scenario 3, 534 admits against a limit of 500).
    #[test]
    fn new_visitors_leave_the_eligible_reservation_to_the_waiting() {
        let room = room(1_000, 1_000);
        let now = at(12, 0, 30);
        let waiting = [(now.minute(), 5)];
        let node = |colo_share| {
            state(
                now,
                &waiting,
                10,
                PoolCounts {
                    eligible: 5,
                    colo_share,
                    ..PoolCounts::default()
                },
                false,
            )
        };
        let (a, b) = (node(3), node(2));
        assert_eq!((a.slots_available, a.allowance.eligible), (10, 5));
        let (ca, cb) = (RoomCounters::new_boxed(ROOM), RoomCounters::new_boxed(ROOM));
        let new_admitted: usize = [(&a, &ca), (&b, &cb)]
            .into_iter()
            .map(|(global, counters)| {
                (0..20)
                    .filter(|&i| decide(&room, global, counters, None, now, i).is_admitted())
                    .count()
            })
            .sum();
        assert_eq!(
            new_admitted, 5,
            "only the 5 shared slots go to new visitors"
        );
        // The five who were waiting in the covered bucket still find their slots.
        let waiter = Ticket {
            last_check_in: now.minus_secs(25),
            counted_waiting: Some(now.minute()),
            ..Ticket::new_visitor(ROOM, now.minus_secs(25), 20)
        };
        let waiting_admitted = (0..5)
            .filter(|&i| {
                let (global, counters) = if i % 2 == 0 { (&a, &ca) } else { (&b, &cb) };
                matches!(
                    decide(&room, global, counters, Some(waiter), now, 0),
                    Decision::Admit {
                        reason: AdmitReason::Slot(Pool::Eligible),
                        visitor: Visitor::Waiting,
                        ..
                    }
                )
            })
            .count();
        assert_eq!(waiting_admitted, 5);
    }

    /// Seed 001: users 1..5 queued FIFO (1 first). Switch to random, user 4
    /// gets in; switch back to FIFO and the order is 1, 2, 3, 5.
    #[test]
    fn seed_fifo_random_fifo_keeps_order_users_1_to_5_user_4_admitted() {
        let fifo = room(1_000, 1_000);
        let random = with_method(&fifo, QueueingMethod::Random);
        let counters = RoomCounters::new_boxed(ROOM);
        let t0 = at(10, 0, 0);
        // Users 1..5 arrive a minute apart while nothing is free.
        let mut users: Vec<Ticket> = (0..5)
            .map(|i| {
                let now = t0.plus_minutes(i);
                ticket_of(&decide(
                    &fifo,
                    &GlobalState::empty(now),
                    &counters,
                    None,
                    now,
                    0,
                ))
            })
            .collect();
        // Random: one slot; user 4 happens to check in first and takes it.
        let now = t0.plus_minutes(5);
        let queue_now = |now: UnixMillis| -> Vec<(Minute, u64)> {
            counters
                .waiting_buckets(now.minute())
                .map(|(b, n)| (b, n as u64))
                .collect()
        };
        // Keep everyone checking in so the counters still see them.
        for (i, ticket) in users.iter_mut().enumerate() {
            let at_ = now.plus_secs(i as u64);
            *ticket = ticket_of(&decide(
                &fifo,
                &GlobalState::empty(at_),
                &counters,
                Some(*ticket),
                at_,
                0,
            ));
        }
        let later = now.plus_secs(30);
        let one_slot = state(
            later,
            &queue_now(later),
            1,
            PoolCounts {
                colo_share: 1,
                ..PoolCounts::default()
            },
            true,
        );
        let four = decide(
            &random,
            &one_slot,
            &counters,
            Some(users[3]),
            later.plus_secs(30),
            0,
        );
        assert!(
            matches!(
                four,
                Decision::Admit {
                    visitor: Visitor::Waiting,
                    ..
                }
            ),
            "{four:?}"
        );
        let one = decide(
            &random,
            &one_slot,
            &counters,
            Some(users[0]),
            later.plus_secs(30),
            0,
        );
        assert!(!one.is_admitted(), "the one slot is gone");
        // Back to FIFO with one slot per round: 1, 2, 3, 5 in that order.
        let mut order = Vec::new();
        let mut now = t0.plus_minutes(7);
        let mut left: Vec<(usize, Ticket)> = users
            .iter()
            .copied()
            .enumerate()
            .filter(|&(i, _)| i != 3)
            .collect();
        while !left.is_empty() {
            let waiting = queue_now(now);
            let global = state(
                now,
                &waiting,
                1,
                PoolCounts {
                    eligible: 1,
                    colo_share: 1,
                    ..PoolCounts::default()
                },
                false,
            );
            let mut next = Vec::new();
            for (user, ticket) in left {
                let decision = decide(&fifo, &global, &counters, Some(ticket), now, 0);
                if decision.is_admitted() {
                    order.push(user + 1);
                } else {
                    next.push((user, ticket_of(&decision)));
                }
            }
            left = next;
            now = now.plus_minutes(1);
        }
        assert_eq!(order, [1, 2, 3, 5]);
    }

    #[test]
    fn random_mode_releases_slots_over_the_minute() {
        let room = with_method(&room(1_000, 1_000), QueueingMethod::Random);
        let counters = RoomCounters::new_boxed(ROOM);
        let start = at(10, 0, 0);
        let global = state(
            start,
            &[(start.minute().minus(3), 100)],
            60,
            PoolCounts {
                colo_share: 60,
                ..PoolCounts::default()
            },
            true,
        );
        // The hundred who wait check in on time (new visitors would only
        // join them: see `random_mode_new_visitors_join_the_waiting_first`).
        let admitted_by = |now: UnixMillis| {
            let waiter = Ticket {
                last_check_in: now.minus_secs(25),
                ..Ticket::new_visitor(ROOM, UnixMillis(start.0 - 180_000), 20)
            };
            (0..100)
                .filter(|&i| decide(&room, &global, &counters, Some(waiter), now, i).is_admitted())
                .count()
        };
        assert_eq!(
            admitted_by(start.plus_secs(10)),
            10,
            "a sixth of the minute: a sixth of the slots"
        );
        assert_eq!(admitted_by(start.plus_secs(59)), 49);
    }

    /// Issue 13, item 7: in random queueing a request without a ticket is
    /// not a lottery ticket of its own. While others wait, a new visitor
    /// joins them (and is counted waiting) and draws from their first
    /// on-time check-in; checking in early still gets no chance.
    #[test]
    fn random_mode_new_visitors_join_the_waiting_first() {
        let room = with_method(&room(1_000, 1_000), QueueingMethod::Random);
        let counters = RoomCounters::new_boxed(ROOM);
        let t0 = at(10, 0, 30);
        let global = |now: UnixMillis| {
            state(
                now,
                &[(t0.minute().minus(2), 30)],
                60,
                PoolCounts {
                    colo_share: 60,
                    ..PoolCounts::default()
                },
                true,
            )
        };
        let joined = decide(&room, &global(t0), &counters, None, t0, 3);
        let Decision::Queue {
            ticket,
            visitor: Visitor::New,
            reason: QueueReason::JoinedQueue,
            estimate,
        } = joined
        else {
            panic!("{joined:?}")
        };
        assert_eq!(counters.admits(t0.minute()), PoolCounts::default());
        assert_eq!(
            counters.waiting(t0.minute(), t0.minute()),
            1,
            "counted waiting"
        );
        assert_eq!(ticket.bucket, t0.minute());
        assert_eq!(ticket.counted_waiting, Some(t0.minute()));
        assert!(estimate.wait_time_known, "{estimate:?}");
        assert_eq!(estimate.visitors_ahead, 31, "the 30 and the newcomer");
        // Many fresh requests at once, while slots are free: none wins.
        let fresh_wins = (0..100)
            .filter(|&i| decide(&room, &global(t0), &counters, None, t0, i).is_admitted())
            .count();
        assert_eq!(fresh_wins, 0);
        // Early: no chance, nothing moved.
        let early = t0.plus_secs(2);
        let too_early = decide(&room, &global(early), &counters, Some(ticket), early, 0);
        assert!(
            matches!(
                too_early,
                Decision::Queue {
                    reason: QueueReason::TooEarly,
                    visitor: Visitor::Waiting,
                    ..
                }
            ),
            "{too_early:?}"
        );
        // On time: a draw like everyone else's, and the slots are there.
        let on_time = ticket.next_check_in();
        let drawn = decide(&room, &global(on_time), &counters, Some(ticket), on_time, 0);
        assert!(
            matches!(
                drawn,
                Decision::Admit {
                    visitor: Visitor::Waiting,
                    reason: AdmitReason::Slot(Pool::ColoShare),
                    ..
                }
            ),
            "{drawn:?}"
        );
        // It left the queue; the hundred fresh requests are each still
        // counted waiting (what the edge's per-address limit is for).
        assert_eq!(counters.waiting(t0.minute(), on_time.minute()), 100);
    }

    /// With nobody waiting a random room queues nobody who can have a slot:
    /// a quiet site lets a new visitor straight in.
    #[test]
    fn random_mode_with_nobody_waiting_admits_new_visitors_at_once() {
        let room = with_method(&room(1_000, 1_000), QueueingMethod::Random);
        let counters = RoomCounters::new_boxed(ROOM);
        let now = at(10, 0, 30);
        let decision = decide(&room, &open(now, 10), &counters, None, now, 0);
        assert!(
            matches!(
                decision,
                Decision::Admit {
                    visitor: Visitor::New,
                    reason: AdmitReason::Slot(Pool::ColoShare),
                    ..
                }
            ),
            "{decision:?}"
        );
        // FIFO is untouched by the rule: a new visitor behind waiting
        // buckets still waits for them, for its own reason.
        let fifo = room_fifo_with_waiting(now);
        let decision = decide(
            &room_of(QueueingMethod::Fifo),
            &fifo,
            &counters,
            None,
            now,
            0,
        );
        assert!(
            matches!(
                decision,
                Decision::Queue {
                    reason: QueueReason::BehindOlderBuckets,
                    ..
                }
            ),
            "{decision:?}"
        );
    }

    fn room_of(method: QueueingMethod) -> Room {
        with_method(&room(1_000, 1_000), method)
    }

    /// Two waiting buckets that the 10 slots do not cover.
    fn room_fifo_with_waiting(now: UnixMillis) -> GlobalState {
        state(
            now,
            &[(now.minute().minus(2), 8), (now.minute().minus(1), 8)],
            10,
            PoolCounts {
                eligible: 8,
                colo_share: 2,
                ..PoolCounts::default()
            },
            false,
        )
    }

    /// [`is_new_visitor`] is what the edge rate-limits by: it must say
    /// exactly what `decide` then makes of the ticket.
    #[test]
    fn is_new_visitor_agrees_with_decide() {
        let room = room(200, 200);
        let counters = RoomCounters::new_boxed(ROOM);
        let t0 = at(20, 1, 13);
        let admitted = ticket_of(&decide(&room, &open(t0, 10), &counters, None, t0, 0));
        let queued = ticket_of(&decide(
            &room,
            &GlobalState::empty(t0),
            &counters,
            None,
            t0,
            0,
        ));
        let cases = [
            (None, t0.plus_secs(30)),
            (Some(admitted), t0.plus_secs(30)),
            (Some(admitted), at(20, 6, 13)),
            (Some(queued), t0.plus_secs(30)),
            (Some(queued), t0.plus_secs(1)),
            (
                Some(Ticket {
                    room: RoomId(1),
                    ..admitted
                }),
                t0.plus_secs(30),
            ),
            (
                Some(Ticket {
                    version: 0,
                    ..queued
                }),
                t0.plus_secs(30),
            ),
        ];
        for (ticket, now) in cases {
            let decision = decide(&room, &open(now, 10), &counters, ticket, now, 0);
            let visitor = match decision {
                Decision::Admit { visitor, .. }
                | Decision::Queue { visitor, .. }
                | Decision::Reject { visitor, .. } => visitor,
            };
            assert_eq!(
                is_new_visitor(&room, ticket.as_ref(), now),
                visitor == Visitor::New,
                "{ticket:?} at {now:?}: {decision:?}"
            );
        }
    }

    #[test]
    fn very_old_tickets_stay_first_in_line() {
        let room = room(10, 10);
        let counters = RoomCounters::new_boxed(ROOM);
        let now = at(12, 0, 0).plus_minutes(3_000);
        let ancient = Ticket {
            last_check_in: now.minus_secs(20),
            ..Ticket::new_visitor(ROOM, at(12, 0, 0), 20)
        };
        let decision = decide(
            &room,
            &GlobalState::empty(now),
            &counters,
            Some(ancient),
            now,
            0,
        );
        assert_eq!(
            decision.ticket().bucket,
            now.minute().minus(MAX_BUCKET_AGE_MINUTES)
        );
        assert_eq!(
            counters.waiting(now.minute().minus(MAX_BUCKET_AGE_MINUTES), now.minute()),
            1
        );
    }

    /// The ticket ledger: a ticket moves the counters once (issue 13, item 1).
    mod ledger {
        use super::*;

        const KEY: [u64; 2] = [0xdead_beef, 0x0bad_cafe];

        fn ledger() -> Box<TicketLedger> {
            TicketLedger::new_boxed(4_096, KEY)
        }

        /// A full room: no slot for anyone new.
        fn full(now: UnixMillis) -> GlobalState {
            GlobalState::empty(now)
        }

        /// An origin's `revoke`: the session's count goes at once, and the
        /// revoked cookie kept and replayed is a new visitor's (the attacker
        /// who saves it gets nothing back), counted once however often.
        #[test]
        fn a_revoked_session_frees_its_slot_and_its_cookie_is_a_new_visitors() {
            let room = room(200, 200);
            let counters = RoomCounters::new_boxed(ROOM);
            let ledger = ledger();
            let t0 = at(20, 1, 13);
            let d = super::super::decide(&room, &open(t0, 10), &counters, &ledger, None, t0, 1);
            assert!(d.is_admitted());
            let admitted = ticket_of(&d);
            let t1 = at(20, 2, 0);
            let d =
                super::super::decide(&room, &full(t1), &counters, &ledger, Some(admitted), t1, 2);
            assert!(d.is_admitted(), "a live session: {d:?}");
            let renewed = ticket_of(&d);
            assert_eq!(counters.active_users(t1.expiry_slot()), 1);
            assert!(revoke(&counters, &ledger, &renewed, t1));
            assert_eq!(counters.active_users(t1.expiry_slot()), 0, "freed at once");
            assert!(!revoke(&counters, &ledger, &renewed, t1), "once");
            assert_eq!(counters.active_users(t1.expiry_slot()), 0);
            for (cookie, rng) in [(renewed, 3), (admitted, 4)] {
                let t2 = at(20, 2, 5);
                let (d, note) = super::super::decide_noting(
                    &room,
                    &full(t2),
                    &counters,
                    &ledger,
                    Some(cookie),
                    t2,
                    rng,
                );
                let Decision::Queue {
                    visitor: Visitor::New,
                    ..
                } = d
                else {
                    panic!("a revoked cookie was honoured: {d:?}")
                };
                assert!(note.replayed);
                assert_eq!(counters.active_users(t2.expiry_slot()), 0);
            }
            // A queued visitor has no session to revoke.
            let queued = ticket_of(&super::super::decide(
                &room,
                &full(t1),
                &counters,
                &ledger,
                None,
                t1,
                9,
            ));
            assert!(!revoke(&counters, &ledger, &queued, t1));
        }

        /// One visitor admitted at `t0` on `counters`/`ledger`.
        fn admitted(
            room: &Room,
            counters: &RoomCounters,
            ledger: &TicketLedger,
            t0: UnixMillis,
        ) -> Ticket {
            let decision = super::super::decide(room, &open(t0, 10), counters, ledger, None, t0, 1);
            assert!(decision.is_admitted(), "{decision:?}");
            assert_ne!(decision.ticket().id, 0, "issued with an id");
            ticket_of(&decision)
        }

        /// Issue 15: a session whose end passed seconds ago frees its room at
        /// once, not at the end of its expiry minute. One place, taken at
        /// 10:00:30 for five minutes; the next visitor comes at 10:05:33.
        #[test]
        fn room_a_session_frees_is_reused_within_seconds() {
            let room = room(1, 1);
            let (counters, ledger) = (RoomCounters::new_boxed(ROOM), ledger());
            let t0 = at(10, 0, 30);
            let _first = admitted(&room, &counters, &ledger, t0);
            let mut rate = crate::state::AdmitRate::default();
            let ending = at(10, 5, 29);
            let state = GlobalState::standalone(&room, &counters, &mut rate, ending);
            assert_eq!(state.active_users, 1, "a second before its end");
            let next = at(10, 5, 33);
            assert_eq!(counters.active_users(next.expiry_slot()), 0);
            let state = GlobalState::standalone(&room, &counters, &mut rate, next);
            assert_eq!(state.active_users, 0, "3 s after its end, same minute");
            let d = super::super::decide(&room, &state, &counters, &ledger, None, next, 9);
            assert!(d.is_admitted(), "the freed place is taken: {d:?}");
            assert_eq!(counters.active_users(next.expiry_slot()), 1);
        }

        /// A renewal within the minute moves the count to the new slot; the
        /// stale cookie replayed later moves it once more (from where the
        /// ledger says it is), never adds a second session.
        #[test]
        fn a_renewal_moves_the_count_to_its_new_slot_and_replays_move_it_once() {
            let room = room(10, 10);
            let (counters, ledger) = (RoomCounters::new_boxed(ROOM), ledger());
            let t0 = at(10, 0, 30);
            let first = admitted(&room, &counters, &ledger, t0);
            let renew_at = at(10, 0, 45);
            let renewed = ticket_of(&super::super::decide(
                &room,
                &full(renew_at),
                &counters,
                &ledger,
                Some(first),
                renew_at,
                2,
            ));
            assert_eq!(renewed.counted_expiry, Some(at(10, 5, 45).expiry_slot()));
            assert_eq!(
                counters.expiries(t0.expiry_slot()).collect::<Vec<_>>(),
                vec![(at(10, 5, 45).expiry_slot(), 1)]
            );
            let replay_at = at(10, 0, 50);
            for i in 0..5 {
                let d = super::super::decide(
                    &room,
                    &full(replay_at),
                    &counters,
                    &ledger,
                    Some(first),
                    replay_at,
                    i,
                );
                assert!(d.is_admitted());
            }
            assert_eq!(
                counters.expiries(t0.expiry_slot()).collect::<Vec<_>>(),
                vec![(at(10, 5, 50).expiry_slot(), 1)],
                "one session, at its latest slot"
            );
        }

        /// A cookie issued before the upgrade (ticket format 2: expiry minute
        /// 10:05) on a node whose counters and ledger were set aside: the
        /// session goes on, is counted once at its new slot, and its old claim
        /// moves nothing (there is nothing of it in the new counters).
        #[test]
        fn a_version_2_ticket_from_before_the_upgrade_is_honoured() {
            use crate::ticket::TICKET_VERSION_MINUTES;
            let room = room(10, 10);
            let (counters, ledger) = (RoomCounters::new_boxed(ROOM), ledger());
            let t0 = at(10, 0, 30);
            let old = Ticket {
                version: TICKET_VERSION_MINUTES,
                accepted_at: Some(t0),
                counted_expiry: Some(ExpirySlot(at(10, 5, 0).minute().0)),
                id: 99,
                ..Ticket::new_visitor(ROOM, at(9, 59, 0), 20)
            };
            let now = at(10, 3, 0);
            let d = super::super::decide(&room, &full(now), &counters, &ledger, Some(old), now, 1);
            let Decision::Admit {
                ticket,
                reason: AdmitReason::SessionValid,
                ..
            } = d
            else {
                panic!("an admitted visitor stays admitted: {d:?}")
            };
            assert_eq!(ticket.version, crate::ticket::TICKET_VERSION);
            assert_eq!(ticket.id, old.id, "the same ticket, rewritten");
            assert_eq!(ticket.counted_expiry, Some(at(10, 8, 0).expiry_slot()));
            assert_eq!(
                counters.expiries(now.expiry_slot()).collect::<Vec<_>>(),
                vec![(at(10, 8, 0).expiry_slot(), 1)],
                "counted once, nothing taken from the old minute"
            );
            // Without renewal the old expiry is kept, as the end of its minute.
            let fixed = room_without_renewal();
            let (counters, fresh) = (
                RoomCounters::new_boxed(ROOM),
                TicketLedger::new_boxed(4_096, KEY),
            );
            let d = super::super::decide(&fixed, &full(now), &counters, &fresh, Some(old), now, 1);
            assert!(d.is_admitted());
            assert_eq!(
                d.ticket().counted_expiry,
                Some(ExpirySlot::end_of_minute(at(10, 5, 0).minute()))
            );
            assert_eq!(counters.active_users(at(10, 5, 59).expiry_slot()), 1);
            assert_eq!(counters.active_users(at(10, 6, 0).expiry_slot()), 0);
            assert!(!super::super::is_new_visitor(&room, Some(&old), now));
        }

        /// The 10 / 10 room with `edit` made to its configuration.
        fn room_with(edit: impl FnOnce(&mut crate::room::RoomConfig)) -> Room {
            let mut config = config(10, 10);
            edit(&mut config);
            config.validate().unwrap().with_id(ROOM)
        }

        fn room_without_renewal() -> Room {
            room_with(|c| c.disable_session_renewal = true)
        }

        /// The room with sessions of `minutes`: the operator lowered
        /// `session_duration` (SIGHUP), and a session counted to its old end
        /// has ended while still counted.
        fn shortened(minutes: u32) -> Room {
            room_with(|c| c.session_duration = minutes)
        }

        #[test]
        fn forty_replays_of_an_expired_admitted_ticket_uncount_it_once() {
            let room = room(10, 10);
            let (counters, ledger) = (RoomCounters::new_boxed(ROOM), ledger());
            let t0 = at(10, 0, 30);
            let ticket = admitted(&room, &counters, &ledger, t0);
            // Counted until 10:05:31; with four-minute sessions it ended at
            // 10:04:31, so an uncount is due.
            let shorter = shortened(4);
            let later = at(10, 4, 31).plus_millis(400);
            assert_eq!(counters.active_users(later.expiry_slot()), 1);
            let mut replayed = 0;
            for i in 0..40 {
                let (decision, note) = decide_noting(
                    &shorter,
                    &full(later),
                    &counters,
                    &ledger,
                    Some(ticket),
                    later,
                    i,
                );
                assert!(!decision.is_admitted());
                replayed += usize::from(note.replayed);
            }
            assert_eq!(
                counters.active_users(later.expiry_slot()),
                0,
                "uncounted once, not forty times"
            );
            assert_eq!(replayed, 39, "every replay after the first is noticed");
        }

        #[test]
        fn a_stale_copy_replayed_after_a_renewal_moves_nothing_twice() {
            let room = room(10, 10);
            let (counters, ledger) = (RoomCounters::new_boxed(ROOM), ledger());
            let t0 = at(10, 0, 30);
            let first = admitted(&room, &counters, &ledger, t0);
            let renew_at = t0.plus_minutes(2);
            let renewed = ticket_of(&super::super::decide(
                &room,
                &full(renew_at),
                &counters,
                &ledger,
                Some(first),
                renew_at,
                2,
            ));
            assert_ne!(renewed.counted_expiry, first.counted_expiry);
            // The stale copy comes back three times, a minute later.
            let now = t0.plus_minutes(3);
            for i in 0..3 {
                let d = super::super::decide(
                    &room,
                    &full(now),
                    &counters,
                    &ledger,
                    Some(first),
                    now,
                    i,
                );
                assert!(d.is_admitted(), "the session is live: {d:?}");
            }
            let expiry = now.plus_minutes(5).expiry_slot();
            assert_eq!(
                counters.expiries(t0.expiry_slot()).collect::<Vec<_>>(),
                vec![(expiry, 1)],
                "one session, counted once, at its latest expiry"
            );
            // After the stale copy's own session has ended, it ends nothing:
            // the ticket's later session is still counted.
            let stale_end = t0.plus_minutes(5).plus_secs(30);
            let d = super::super::decide(
                &room,
                &full(stale_end),
                &counters,
                &ledger,
                Some(first),
                stale_end,
                3,
            );
            assert!(!d.is_admitted());
            assert_eq!(counters.active_users(stale_end.expiry_slot()), 1);
        }

        #[test]
        fn concurrent_replays_move_counts_once() {
            let room = room(10, 10);
            let (counters, ledger) = (RoomCounters::new_boxed(ROOM), ledger());
            let t0 = at(10, 0, 30);
            let ticket = admitted(&room, &counters, &ledger, t0);
            let replay_all = |room: &Room, now: UnixMillis| {
                std::thread::scope(|scope| {
                    for thread in 0..6_u64 {
                        let (counters, ledger) = (&counters, &ledger);
                        scope.spawn(move || {
                            for i in 0..50 {
                                let _ = super::super::decide(
                                    room,
                                    &full(now),
                                    counters,
                                    ledger,
                                    Some(ticket),
                                    now,
                                    thread * 1_000 + i,
                                );
                            }
                        });
                    }
                });
            };
            // Renewals racing: the session moves once, to one expiry.
            let renew_at = t0.plus_minutes(2);
            replay_all(&room, renew_at);
            assert_eq!(
                counters.expiries(t0.expiry_slot()).collect::<Vec<_>>(),
                vec![(renew_at.plus_minutes(5).expiry_slot(), 1)]
            );
            // Expired replays racing (the sessions shortened by a minute),
            // while its slot still counts it: uncounted once.
            let shorter = shortened(4);
            let later = renew_at.plus_minutes(4).plus_millis(1_300);
            assert_eq!(counters.active_users(later.expiry_slot()), 1);
            replay_all(&shorter, later);
            assert_eq!(counters.active_users(later.expiry_slot()), 0);
        }

        #[test]
        fn a_ticket_the_ledger_does_not_know_is_believed_once() {
            let room = room(10, 10);
            let t0 = at(10, 0, 30);
            // Issued on node A, replayed on node B once expired.
            let (a, b) = (RoomCounters::new_boxed(ROOM), RoomCounters::new_boxed(ROOM));
            let (ledger_a, ledger_b) = (ledger(), TicketLedger::new_boxed(4_096, [7, 8]));
            let ticket = admitted(&room, &a, &ledger_a, t0);
            // Sessions shortened to four minutes: ended at 10:04:31, its slot
            // still counted on A until 10:05:31.
            let shorter = shortened(4);
            let later = at(10, 4, 31).plus_millis(500);
            assert_eq!(a.active_users(later.expiry_slot()), 1);
            for i in 0..10 {
                let _ = super::super::decide(
                    &shorter,
                    &full(later),
                    &b,
                    &ledger_b,
                    Some(ticket),
                    later,
                    i,
                );
            }
            assert_eq!(
                a.active_users(later.expiry_slot()) + b.active_users(later.expiry_slot()),
                0,
                "B believed the claim once: -1 there, +1 on A"
            );
        }

        #[test]
        fn replays_of_a_waiting_ticket_move_its_waiting_count_once() {
            let room = room(10, 10);
            let (counters, ledger) = (RoomCounters::new_boxed(ROOM), ledger());
            let t0 = at(10, 0, 30);
            let queued = ticket_of(&super::super::decide(
                &room,
                &full(t0),
                &counters,
                &ledger,
                None,
                t0,
                1,
            ));
            assert_eq!(queued.counted_waiting, Some(t0.minute()));
            // The fresh copy checks in every minute; the first copy, whose
            // check-in minute has left the waiting window, keeps coming.
            let mut fresh = queued;
            for minute in 1..=3 {
                let now = t0.plus_minutes(minute);
                fresh = ticket_of(&super::super::decide(
                    &room,
                    &full(now),
                    &counters,
                    &ledger,
                    Some(fresh),
                    now,
                    minute,
                ));
                assert_eq!(fresh.counted_waiting, Some(now.minute()));
            }
            let next = t0.plus_minutes(3);
            for i in 0..20 {
                let now = next.plus_secs(25 + i);
                let _ = super::super::decide(
                    &room,
                    &full(now),
                    &counters,
                    &ledger,
                    Some(queued),
                    now,
                    i,
                );
                assert_eq!(counters.total_waiting(now.minute()), 1, "replay {i}");
            }
            let now = next.plus_minutes(1);
            let _ =
                super::super::decide(&room, &full(now), &counters, &ledger, Some(fresh), now, 9);
            assert_eq!(counters.total_waiting(now.minute()), 1);
            assert_eq!(
                counters.waiting(t0.minute(), now.minute()),
                1,
                "still in its bucket"
            );
        }
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        proptest! {
            /// Switching methods back and forth never reorders FIFO: after
            /// any switches, visitors are admitted oldest bucket first.
            #[test]
            fn method_switches_keep_positions(
                arrivals in prop::collection::vec(0..6_u64, 2..12),
                switches in prop::collection::vec(any::<bool>(), 1..6),
            ) {
                let fifo = room(1_000, 1_000);
                let random = with_method(&fifo, QueueingMethod::Random);
                let counters = RoomCounters::new_boxed(ROOM);
                let t0 = at(10, 0, 0);
                let mut tickets: Vec<Ticket> = arrivals.iter().map(|&m| {
                    let now = t0.plus_minutes(m);
                    ticket_of(&decide(&fifo, &GlobalState::empty(now), &counters, None, now, 0))
                }).collect();
                let mut now = t0.plus_minutes(7);
                for &to_random in &switches {
                    let room = if to_random { &random } else { &fifo };
                    for ticket in &mut tickets {
                        let decision = decide(room, &GlobalState::empty(now), &counters, Some(*ticket), now, 0);
                        *ticket = ticket_of(&decision);
                    }
                    now = now.plus_minutes(1);
                }
                // Every ticket still carries its arrival bucket...
                for (ticket, &m) in tickets.iter().zip(&arrivals) {
                    prop_assert_eq!(ticket.bucket, t0.plus_minutes(m).minute());
                }
                // ... and back in FIFO with one slot, the oldest bucket goes first.
                let waiting: Vec<(Minute, u64)> = counters.waiting_buckets(now.minute()).map(|(b, n)| (b, n as u64)).collect();
                let total: u64 = waiting.iter().map(|w| w.1).sum();
                prop_assert_eq!(total, arrivals.len() as u64);
                let global = state(now, &waiting, 1, PoolCounts { eligible: 1, colo_share: 1, ..PoolCounts::default() }, false);
                let oldest = *arrivals.iter().min().unwrap();
                for (ticket, &m) in tickets.iter().zip(&arrivals) {
                    let decision = decide(&fifo, &global, &counters, Some(*ticket), now, 0);
                    if decision.is_admitted() {
                        prop_assert_eq!(m, oldest);
                    }
                }
            }
        }
    }
}
