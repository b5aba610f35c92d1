//! Small promises and the on-demand lease (issue 15).
//!
//! # Why
//! Every shared slot promised to a node is counted as spent until that node
//! reports again (the ledgers of [`Cluster`](super::Cluster)). Promising each
//! node its whole fair part therefore locks a quiet node's part away for a
//! whole round while a busy node beside it queues visitors: the 7:1 burst of
//! seed 000, and at 1,200 nodes an Anywhere pool spread at under one slot a
//! node. Cloudflare's answer is to promise each data center what it will
//! need and keep the rest at the centre, handed out when a data center asks.
//!
//! # The rule
//! A node that can ask on demand (it sends `Message::LeaseReport`, see
//! [`crate::wire`]) is promised what its own recent admits say it will use
//! before it reports again, not its fair part:
//!
//! - *need* = its shared-pool admits (or new visitors, whichever is more)
//!   since its last answer, as a rate, over [`PromisePolicy::horizon_ms`]
//!   (twice the default report interval, so a steady node never runs dry
//!   between its reports). The visitors a node holds while it asks count
//!   among its new visitors (`RoomCounters::hold_visitor`), so an ask never
//!   reads as no need;
//! - an idle node's need is [`PromisePolicy::min_promise`], but never more
//!   than its fair part (at 1,200 nodes a fair part is under a slot), and
//!   only out of what the other nodes leave beyond the *reserve*, half of
//!   each pool and of the round's shared slots ([`Free::new`]): at 1,200
//!   nodes, 2 slots to each of the few hundred nodes with a visitor in the
//!   last minutes held the whole Anywhere pool, and the nodes that asked
//!   got nothing;
//! - the promise is the need, taken from what the node's colo has not
//!   promised first, then from the Anywhere pool, within what the ledgers
//!   leave ([`Free`]): a node that asks may take more than its fair part
//!   when others hold less than theirs, never more than nobody holds;
//! - *half of what is left*: a promise takes at most half (rounded up) of
//!   the round's shared slots that no other node holds. Near the end of a
//!   minute the last slots would otherwise go whole to the nodes that
//!   happened to report first, as two seconds of their traffic, while a
//!   node whose promise ran out asked and was promised nothing: visitors
//!   queued at 90 % of the per-minute limit in the worldwide spike
//!   (`cargo xtask simulate`, seeds 1–8: 7.1 a run queued with room for
//!   the whole line, 1.6 with the cap). Each node that asks then gets half
//!   of the rest, so the last slots follow the nodes that use them. The
//!   visitors a node holds as it asks (`Message::HeldReport`) are not a
//!   forecast: they came first and may take more than half, up to all of
//!   what is free (the 7:1 burst, seeds 1–24, K = 1 / 2 / 3, queued with
//!   room for the whole line: 1.92 / 2.12 / 2.75 a run → 1.71 / 2.04 /
//!   2.71; at 1,200 nodes 10 → 9);
//! - *the minute's last seconds*: the horizon is at most a sixth
//!   ([`PACE_SHARE`]) of the time the minute's slots have left at the
//!   room's pace (its admits this minute over the time into it, [`Pace`]).
//!   In the worldwide spike the last 20–70 slots of a minute went in about
//!   a second, while each node still held two seconds of its own rate: a
//!   node whose visitors came a moment early asked, found every slot held,
//!   and queued them while the holders spent theirs on later visitors.
//!   Lowering the holders' caps at the ask would have returned nothing in
//!   time: most of their slots were spent before their next report, and a
//!   cap changes only in the answer to its holder's report, which promises
//!   the holder its rate anew anyway. Smaller promises keep the last slots
//!   unheld, for whoever asks first (`cargo xtask simulate`, seeds 1–24, queued with
//!   room for the whole line: 1.25 / 2.08 / 2.29 a run with one / two /
//!   three aggregators, 0.46 / 0.62 / 0.46 with the pace);
//! - *a burst*: the horizon is also at most half ([`RECENT_PACE_SHARE`])
//!   of the time the minute's slots have left at the room's *recent* pace
//!   (its admits over the last half second to second, [`RecentPace`]).
//!   The minute's average lags a burst that starts late in it: in the 7:1
//!   burst the room went from under one admit a second to 400, the minute's
//!   average said its slots would last 27 s, and a node bursting at a
//!   seventh of the other's rate was promised 70 slots, two seconds of its
//!   rate, while the minute's last 281 lasted 0.7 s. It still held 51 of
//!   them unspent when the other node's visitors asked and were queued
//!   (`cargo xtask simulate`, 7:1 burst, seeds 1–72, K = 1 / 2 / 3,
//!   queued with room for the whole line: 0.71 / 0.83 / 1.12, 2.00 / 2.29 /
//!   2.54 and 1.88 / 2.25 / 2.54 a run on seeds 1–24, 25–48 and 49–72;
//!   0 / 0 / 0, 0.04 / 0.33 / 0.38 and 0 / 0 / 0 with the recent pace);
//! - what that leaves short is borrowed from the other colos' slots that
//!   none of their nodes holds, at most half of them, as an Anywhere lease.
//!   Colo slots follow traffic two minutes back (seed 002), so in a
//!   worldwide spike after a quiet spell a dozen colos hold 90 % of the
//!   slots while every other node shares the Anywhere tenth: at 1,200 nodes
//!   1,690 visitors were queued below 98 % of the limits, 293 with the
//!   loan. Each loan leaves half of what is unheld at that moment for the
//!   lending colo's own nodes, whose traffic earned it (a node asking again
//!   and again borrows half of what is left each time, as a FIFO room's
//!   newcomers anywhere would be admitted first come, first served);
//!   whatever is lent, the round's shared slots minus what every node holds
//!   bounds every grant, so the limits hold as before.
//!
//! What is not promised is the reserve: it stays unspent in the ledgers, so
//! the next node to ask, out of cycle because its promise ran out, is
//! granted it at once. Everything granted is still a lease in the ledgers,
//! so the limits hold exactly as before: a node asking again and again gets
//! no more than the pool minus what every other node holds.
//!
//! A node that does not ask (an older node, or `lease_wait_ms = 0`) is
//! promised its fair part as before, and so is every node in a random
//! room: there a visitor queued anywhere sends every new visitor to the
//! lottery (seed 001), so one node running dry early would queue the whole
//! room (the `gossip` integration test, a random room, admitted 9 of its 20
//! slots instead of 20 with small promises there).

use crate::{state::GlobalState, time::UnixMillis};

/// How much the aggregator promises a node that asks on demand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromisePolicy {
    /// What an idle node is promised (at most its fair part): enough for its
    /// first visitors without a round trip.
    pub min_promise: u64,
    /// How far ahead a promise covers the node's recent rate of admits.
    pub horizon_ms: u64,
    /// Whether the horizon is also held within the time the minute's slots
    /// last at the room's recent pace (see "a burst" in the module's rule);
    /// off, only at its pace over the whole minute.
    pub recent_pace: bool,
}

impl Default for PromisePolicy {
    fn default() -> Self {
        Self {
            min_promise: 2,
            horizon_ms: 2_000,
            recent_pace: true,
        }
    }
}

/// The shortest wait for the answer to an out-of-cycle ask (see
/// [`ask_timeout_ms`]).
pub const MIN_ASK_TIMEOUT_MS: u64 = 100;

/// How long a node waits for the answer to an out-of-cycle ask (a held
/// visitor's or a prefetch) before it stops waiting and reports again at
/// once: four round trips (QUIC has then retransmitted a lost packet of the
/// answer and still brought nothing), at least `lease_wait_ms` (the held
/// visitors' bound) and [`MIN_ASK_TIMEOUT_MS`] (an answer that waits for a
/// ledger's commit is slow, not lost), at most `answer_timeout_ms` (the wait
/// of a periodic report).
///
/// Why: the gossip client sends one report at a time. With the periodic
/// report's wait, one lost answer to an ask kept the node from reporting for
/// two seconds, and since its held visitors had timed out, it held nobody
/// meanwhile: every new visitor of a burst queued behind them with room to
/// spare (`cargo xtask simulate --preset hostile`, the 7:1 burst).
#[must_use]
pub fn ask_timeout_ms(lease_wait_ms: u64, rtt_ms: u64, answer_timeout_ms: u64) -> u64 {
    rtt_ms
        .saturating_mul(4)
        .max(lease_wait_ms)
        .max(MIN_ASK_TIMEOUT_MS)
        .min(answer_timeout_ms)
}

/// How long a node waits for the answer to an ask made for a held visitor
/// before it asks again: until the ask sent again then is still answered
/// (one `rtt_ms` later) 5 ms before the hold of `lease_wait_ms` ends, but
/// at least a round trip and a quarter (an answer a little slow is not
/// asked for twice), at most `answer_timeout_ms`. At a 50 ms hold and 20 ms
/// round trips: 25 ms, where [`ask_timeout_ms`] waits 100. A prefetch,
/// which holds nobody, waits [`ask_timeout_ms`].
///
/// Why: under the simulator's hostile preset (10 % of answers lost) the
/// steady scenario queued ~16 visitors a run with room for the whole line,
/// three quarters of them held on an ask whose answer was lost: the hold
/// ended at 50 ms, the ask went again at 100 ms (`cargo xtask simulate
/// --preset hostile --scenario steady`, seeds 1-16: 15.6 a run, 3.2 with
/// this wait; 1.3 with every lost answer asked again within the hold,
/// session 22).
#[must_use]
pub fn ask_within_hold_ms(lease_wait_ms: u64, rtt_ms: u64, answer_timeout_ms: u64) -> u64 {
    lease_wait_ms
        .saturating_sub(rtt_ms)
        .saturating_sub(5)
        .max(rtt_ms.saturating_add(rtt_ms / 4))
        .max(1)
        .min(answer_timeout_ms)
}

/// The shortest time a rate is measured over: an out-of-cycle report right
/// after an answer does not make a handful of admits look like thousands a
/// second.
const MIN_ELAPSED_MS: u64 = 100;

/// A promise covers at most this share of the time the minute's slots have
/// left at the room's pace (see [`Pace`]).
pub const PACE_SHARE: u64 = 6;

/// The shortest part of the minute the room's pace is measured over: a
/// handful of admits in a minute's first milliseconds is no pace.
const MIN_PACE_MS: u64 = 1_000;

/// How fast the room spends its minute, for [`PromisePolicy::need_paced`]:
/// its admits this minute (every node's, every pool), `elapsed_ms` into the
/// minute, against the per-minute limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    /// The room's admits this minute, as the aggregator knows them.
    pub admitted: u64,
    /// The per-minute limit in force.
    pub per_minute: u64,
    /// How far into the minute it is.
    pub elapsed_ms: u64,
    /// The room's admits over the last moments of the minute and how long
    /// those moments were, `(admits, milliseconds)`, from [`RecentPace`];
    /// `None` until it has a window.
    pub recent: Option<(u64, u64)>,
}

impl Pace {
    /// The pace of the room whose state this round is `state` (its admits
    /// this minute), at `now`.
    #[must_use]
    pub fn of(state: &GlobalState, per_minute: u64, now: UnixMillis) -> Self {
        Self {
            admitted: state.admitted_this_minute,
            per_minute,
            elapsed_ms: now.0.saturating_sub(now.minute().start().0),
            recent: None,
        }
    }

    /// The same pace, also measured over `recent` (see [`RecentPace`]).
    #[must_use]
    pub fn with_recent(self, recent: Option<(u64, u64)>) -> Self {
        Self { recent, ..self }
    }

    /// How long the minute's slots last at this pace, in milliseconds
    /// (`u64::MAX` before any admit).
    #[must_use]
    pub fn left_ms(&self) -> u64 {
        self.lasts_ms(self.admitted, self.elapsed_ms.max(MIN_PACE_MS))
    }

    /// How long the minute's slots last at the recent pace, in
    /// milliseconds (`u64::MAX` without a window or an admit in it).
    #[must_use]
    pub fn recent_left_ms(&self) -> u64 {
        self.recent
            .map_or(u64::MAX, |(admits, ms)| self.lasts_ms(admits, ms))
    }

    /// How long the minute's slots last at `admits` every `over_ms`
    /// (`u64::MAX` at none).
    fn lasts_ms(&self, admits: u64, over_ms: u64) -> u64 {
        if admits == 0 {
            return u64::MAX;
        }
        let left = u128::from(self.per_minute.saturating_sub(self.admitted));
        u64::try_from(left * u128::from(over_ms) / u128::from(admits)).unwrap_or(u64::MAX)
    }
}

/// A promise covers at most this share of the time the minute's slots have
/// left at the room's recent pace (see [`RecentPace`]).
pub const RECENT_PACE_SHARE: u64 = 2;

/// The shortest window [`RecentPace`] measures over.
pub const RECENT_PACE_MS: u64 = 500;

/// The room's admits this minute at two recent instants, so that its pace
/// can be measured over the last moments as well as over the whole minute:
/// a burst that starts late in a minute spends the minute's slots many
/// times faster than the minute's average says. The aggregator keeps one
/// per room and notes the room's admits at every merge.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecentPace {
    /// `(when, the room's admits this minute then)`, older first; both in
    /// the same minute.
    marks: [(UnixMillis, u64); 2],
    /// The last note, `(when, admits this minute then)`: the window runs
    /// from the older mark to it.
    last: (UnixMillis, u64),
}

impl RecentPace {
    /// Notes that the room has `admitted` this minute at `now`, and returns
    /// its admits over the last [`RECENT_PACE_MS`] to twice that, with the
    /// window's length; `None` until a window that long in this minute.
    /// A new minute (or a clock that went back) starts again.
    pub fn observe(&mut self, now: UnixMillis, admitted: u64) -> Option<(u64, u64)> {
        let newer = self.marks[1];
        if newer.0.minute() != now.minute() || newer.0 > now {
            self.marks = [(now, admitted); 2];
        } else if now.0 >= newer.0.0.saturating_add(RECENT_PACE_MS) {
            self.marks = [newer, (now, admitted)];
        }
        self.last = (now, admitted);
        self.window()
    }

    /// The room's admits from the older mark to the last note, and the
    /// window's length; `None` while it is shorter than [`RECENT_PACE_MS`].
    fn window(&self) -> Option<(u64, u64)> {
        let ((from, then), (to, admitted)) = (self.marks[0], self.last);
        let ms = to.0.saturating_sub(from.0);
        (ms >= RECENT_PACE_MS).then(|| (admitted.saturating_sub(then), ms))
    }

    /// The room's admits a second over the window the last note measured,
    /// if it was made in `now`'s minute and not after `now` (for `/status`
    /// and the metrics: the pace promises are held to).
    #[must_use]
    pub fn per_second(&self, now: UnixMillis) -> Option<f64> {
        let at = self.last.0;
        if at.minute() != now.minute() || at > now {
            return None;
        }
        self.window()
            .map(|(admits, ms)| admits as f64 * 1_000.0 / ms as f64)
    }
}

/// What the ledgers leave for one node this round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Free {
    /// The node's colo's slots this round minus what its other nodes hold.
    pub colo: u64,
    /// The Anywhere pool this round minus what the other nodes hold.
    pub anywhere: u64,
    /// The round's shared slots minus what the other nodes hold of both.
    pub total: u64,
    /// What an idle node's promise never takes of each, `(colo, anywhere,
    /// total)`: half of the colo's slots, of the Anywhere pool and of the
    /// round's shared slots. It stays for the nodes that ask.
    pub reserve: (u64, u64, u64),
}

impl Free {
    /// What the ledgers leave, with the reserve kept out of idle promises;
    /// `pools` are the colo's slots, the Anywhere pool and the round's
    /// shared slots.
    #[must_use]
    pub fn new(colo: u64, anywhere: u64, total: u64, pools: (u64, u64, u64)) -> Self {
        Self {
            colo,
            anywhere,
            total,
            reserve: (pools.0 / 2, pools.1 / 2, pools.2 / 2),
        }
    }

    /// What an idle node may be promised of: what is free beyond the reserve.
    fn beyond_reserve(self) -> Self {
        let (colo, anywhere, total) = self.reserve;
        Self {
            colo: self.colo.saturating_sub(colo),
            anywhere: self.anywhere.saturating_sub(anywhere),
            total: self.total.saturating_sub(total),
            reserve: (0, 0, 0),
        }
    }

    /// `want` taken from the colo's slots first, then from Anywhere,
    /// within what each leaves and the total.
    fn take(self, want: u64) -> (u64, u64) {
        let colo = want.min(self.colo).min(self.total);
        let anywhere = want
            .saturating_sub(colo)
            .min(self.anywhere)
            .min(self.total.saturating_sub(colo));
        (colo, anywhere)
    }

    /// What the other colos' nodes do not hold of their colos' slots: the
    /// round's free shared slots beyond this node's colo and Anywhere.
    fn unheld_elsewhere(self) -> u64 {
        self.total
            .saturating_sub(self.colo.saturating_add(self.anywhere))
    }

    /// `want` for a node that asked: as [`Free::take`], and what that
    /// leaves short borrowed from the other colos' unheld slots, at most
    /// half of them (the other half is left for those colos' own nodes,
    /// whose traffic earned the slots). The borrowed slots are an Anywhere
    /// lease.
    ///
    /// Never more than half of the round's free shared slots (rounded
    /// up): see "half of what is left" in the module's rule.
    fn take_asked(self, want: u64, held: u64) -> (u64, u64) {
        let want = want.min(self.total.div_ceil(2).max(held));
        let (colo, anywhere) = self.take(want);
        let borrowed = want
            .saturating_sub(colo + anywhere)
            .min(self.unheld_elsewhere() / 2)
            .min(self.total.saturating_sub(colo + anywhere));
        (colo, anywhere + borrowed)
    }
}

impl PromisePolicy {
    /// What a node will use before it reports again: `admitted` shared-pool
    /// admits in the last `elapsed_ms`, as a rate over the horizon.
    #[must_use]
    pub fn need(&self, admitted: u64, elapsed_ms: u64) -> u64 {
        Self::need_over(admitted, elapsed_ms, self.horizon_ms)
    }

    /// [`PromisePolicy::need`] over a horizon of at most a
    /// [`PACE_SHARE`]th of the time the minute's slots last at the room's
    /// `pace` and (with [`PromisePolicy::recent_pace`]) a
    /// [`RECENT_PACE_SHARE`]th of the time they last at its recent pace:
    /// see "the minute's last seconds" and "a burst" in the module's rule.
    #[must_use]
    pub fn need_paced(&self, admitted: u64, elapsed_ms: u64, pace: Pace) -> u64 {
        let recent = if self.recent_pace {
            pace.recent_left_ms() / RECENT_PACE_SHARE
        } else {
            u64::MAX
        };
        let horizon = self.horizon_ms.min(pace.left_ms() / PACE_SHARE).min(recent);
        Self::need_over(admitted, elapsed_ms, horizon)
    }

    fn need_over(admitted: u64, elapsed_ms: u64, horizon_ms: u64) -> u64 {
        let elapsed = u128::from(elapsed_ms.max(MIN_ELAPSED_MS));
        let n = u128::from(admitted) * u128::from(horizon_ms);
        u64::try_from(n.div_ceil(elapsed)).unwrap_or(u64::MAX)
    }

    /// The grants `(colo_share, anywhere)` for a node that asks on demand,
    /// given its fair grants (already within the ledgers) and `need`.
    #[must_use]
    pub fn promise(&self, fair: (u64, u64), free: Free, need: u64) -> (u64, u64) {
        self.promise_holding(fair, free, need, 0)
    }

    /// [`PromisePolicy::promise`] for a node that holds `held` visitors
    /// now: it is promised at least a slot for each, within what the
    /// ledgers leave; they may take more than half of what is left (the
    /// rest of `need`, a forecast, may not).
    #[must_use]
    pub fn promise_holding(
        &self,
        (fair_colo, fair_any): (u64, u64),
        free: Free,
        need: u64,
        held: u64,
    ) -> (u64, u64) {
        let fair = fair_colo.saturating_add(fair_any);
        let idle = free.beyond_reserve().take(self.min_promise.min(fair));
        let asked = free.take_asked(need.max(held), held);
        if idle.0 + idle.1 > asked.0 + asked.1 {
            idle
        } else {
            asked
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FREE: Free = Free {
        colo: 100,
        anywhere: 30,
        total: 120,
        reserve: (0, 0, 0),
    };

    #[test]
    fn a_held_visitors_ask_is_asked_again_while_the_hold_can_still_take_the_answer() {
        // 20 ms round trips, 50 ms hold: again at 25 ms, answered at 45.
        assert_eq!(ask_within_hold_ms(50, 20, 2_000), 25);
        // Loopback: again at 44 ms, answered within the hold.
        assert_eq!(ask_within_hold_ms(50, 1, 2_000), 44);
        assert_eq!(ask_within_hold_ms(50, 0, 2_000), 45);
        // Too slow for the hold: at least a round trip and a quarter.
        assert_eq!(ask_within_hold_ms(50, 40, 2_000), 50);
        assert_eq!(ask_within_hold_ms(0, 0, 2_000), 1);
        assert_eq!(ask_within_hold_ms(50, 900, 2_000), 1_125);
        assert_eq!(ask_within_hold_ms(50, u64::MAX, 2_000), 2_000);
        // Never later than the ask's own wait.
        for rtt in [0, 1, 10, 20, 40, 100, 1_000] {
            assert!(ask_within_hold_ms(50, rtt, 2_000) <= ask_timeout_ms(50, rtt, 2_000));
        }
    }

    #[test]
    fn an_ask_waits_four_round_trips_within_its_bounds() {
        // 20 ms round trips: the floor; 60 ms: four of them.
        assert_eq!(ask_timeout_ms(50, 20, 2_000), 100);
        assert_eq!(ask_timeout_ms(50, 60, 2_000), 240);
        // Never shorter than the held visitors' wait.
        assert_eq!(ask_timeout_ms(300, 1, 2_000), 300);
        // Never longer than a periodic report waits, however slow the path.
        assert_eq!(ask_timeout_ms(50, 900, 2_000), 2_000);
        assert_eq!(ask_timeout_ms(50, u64::MAX, 2_000), 2_000);
    }

    #[test]
    fn an_idle_node_is_promised_a_little_of_its_fair_part_and_the_rest_stays_in_reserve() {
        let p = PromisePolicy::default();
        assert_eq!(p.need(0, 1_000), 0);
        assert_eq!(p.promise((50, 5), FREE, 0), (2, 0));
        // Never more than its fair part: at scale that is under a slot.
        assert_eq!(p.promise((0, 1), FREE, 0), (1, 0));
        assert_eq!(p.promise((0, 0), FREE, 0), (0, 0));
    }

    #[test]
    fn idle_promises_leave_half_the_shared_slots_to_the_nodes_that_ask() {
        let p = PromisePolicy::default();
        // 500 shared slots, all Anywhere, 249 of them held by others: 251
        // left, 250 of them the reserve, so an idle node gets one of its two.
        let free = Free::new(0, 251, 251, (0, 500, 500));
        assert_eq!(free.reserve, (0, 250, 250));
        assert_eq!(p.promise((0, 5), free, 0), (0, 1));
        // Half held: an idle node is promised nothing; the reserve is
        // there for whoever asks, in full.
        let free = Free::new(0, 250, 250, (0, 500, 500));
        assert_eq!(p.promise((0, 5), free, 0), (0, 0));
        assert_eq!(p.promise((0, 5), free, 3), (0, 3));
        assert_eq!(p.promise((0, 5), free, 1_000), (0, 125));
        // Each pool has its reserve: a small Anywhere pool (60 of 500, the
        // rest in colos that saw traffic) held by idle nodes down to its
        // half is left to askers from colos without slots, although the
        // round has plenty.
        let free = Free::new(0, 30, 400, (0, 60, 500));
        assert_eq!(p.promise((0, 5), free, 0), (0, 0));
        assert_eq!(p.promise((0, 5), free, 2), (0, 2));
        // The colo's own pool likewise.
        let free = Free::new(10, 150, 400, (20, 200, 500));
        assert_eq!(p.promise((5, 5), free, 0), (0, 2));
        // At the old scale nothing changes: a few nodes' idle promises
        // are far from half of any pool.
        let free = Free::new(100, 40, 490, (110, 50, 500));
        assert_eq!(p.promise((50, 5), free, 0), (2, 0));
    }

    #[test]
    fn a_busy_node_is_promised_its_rate_over_the_horizon_beyond_its_fair_part() {
        let p = PromisePolicy::default();
        // 10 admits in 500 ms: 40 over two seconds.
        assert_eq!(p.need(10, 500), 40);
        // A report right after an answer: measured over 100 ms at least.
        assert_eq!(p.need(3, 5), 60);
        assert_eq!(p.promise((20, 0), FREE, 40), (40, 0));
        // Colo first, then Anywhere, within what each leaves and the total,
        // and never more than half of the total free.
        let plenty = Free { total: 400, ..FREE };
        assert_eq!(p.promise((20, 0), plenty, 110), (100, 10));
        assert_eq!(p.promise((20, 0), plenty, 1_000), (100, 100));
        assert_eq!(p.promise((20, 0), FREE, 1_000), (60, 0));
    }

    /// Visitors held now are promised a slot each, up to all of what is
    /// free; a forecast beyond them takes at most half of it.
    #[test]
    fn held_visitors_may_take_more_than_half_of_what_is_left() {
        let p = PromisePolicy::default();
        let free = Free::new(50, 0, 50, (100, 0, 100));
        // 40 forecast, none held: half of the 50 free.
        assert_eq!(p.promise_holding((50, 0), free, 40, 0), (25, 0));
        // 40 held: all 40; a forecast of more still gets the 40 held.
        assert_eq!(p.promise_holding((50, 0), free, 0, 40), (40, 0));
        assert_eq!(p.promise_holding((50, 0), free, 45, 40), (40, 0));
        // More held than free: what is free, never more.
        assert_eq!(p.promise_holding((50, 0), free, 0, 80), (50, 0));
        assert_eq!(p.promise_holding((50, 0), free, 0, u64::MAX), (50, 0));
        // Few held: the forecast's half as before.
        assert_eq!(p.promise_holding((50, 0), free, 40, 3), (25, 0));
        // Held visitors borrow no more of other colos than a forecast does.
        let lend = Free {
            colo: 0,
            anywhere: 0,
            total: 40,
            reserve: (0, 0, 0),
        };
        assert_eq!(p.promise_holding((0, 0), lend, 0, 30), (0, 20));
        assert_eq!(p.promise((0, 0), lend, 30), (0, 20));
    }

    #[test]
    fn a_promise_takes_at_most_half_of_what_nobody_holds() {
        let p = PromisePolicy::default();
        // The minute's last 50 shared slots, nobody else holding any: a
        // busy node needing 40 over the horizon is promised 25, and the
        // next node to ask (the other 25 still free) 13 of them.
        let free = Free::new(50, 0, 50, (100, 0, 100));
        assert_eq!(p.promise((50, 0), free, 40), (25, 0));
        let next = Free::new(25, 0, 25, (100, 0, 100));
        assert_eq!(p.promise((50, 0), next, 40), (13, 0));
        // The last slot still goes to whoever asks for it.
        let last = Free::new(1, 0, 1, (100, 0, 100));
        assert_eq!(p.promise((50, 0), last, 40), (1, 0));
        // A need within half is promised whole.
        assert_eq!(p.promise((50, 0), free, 20), (20, 0));
    }

    #[test]
    fn in_the_minutes_last_seconds_a_promise_covers_a_sixth_of_the_time_left() {
        let p = PromisePolicy::default();
        // The worldwide spike, seed 4: 476 of 500 admitted 14.358 s into
        // the minute, so the last 24 slots last about 0.72 s at the room's
        // pace. A node admitting 4 a second is promised its rate over a
        // sixth of that (120 ms), one slot, not two seconds' eight: the
        // rest stays unheld for the node whose visitors come first.
        let late = Pace {
            admitted: 476,
            per_minute: 500,
            elapsed_ms: 14_358,
            recent: None,
        };
        assert_eq!(late.left_ms(), 723);
        assert_eq!(p.need(4, 1_000), 8);
        assert_eq!(p.need_paced(4, 1_000, late), 1);
        // A held visitor's ask still reads as need.
        assert_eq!(p.need_paced(1, 100, late), 2);
        // Far from the end of the minute's slots: the whole horizon.
        let early = Pace {
            admitted: 100,
            per_minute: 500,
            elapsed_ms: 10_000,
            recent: None,
        };
        assert_eq!(p.need_paced(4, 1_000, early), 8);
        assert_eq!(
            p.need_paced(
                4,
                1_000,
                Pace {
                    admitted: 0,
                    ..late
                }
            ),
            8
        );
        // A minute's first admits are measured over a second at least.
        let first = Pace {
            admitted: 50,
            per_minute: 500,
            elapsed_ms: 100,
            recent: None,
        };
        assert_eq!(first.left_ms(), 9_000);
        assert_eq!(p.need_paced(4, 1_000, first), 6);
        // The limit reached (or lowered below the admits): no time left.
        let full = Pace {
            admitted: 520,
            ..late
        };
        assert_eq!(p.need_paced(4, 1_000, full), 0);
    }

    #[test]
    fn in_a_burst_a_promise_covers_half_of_the_time_left_at_the_recent_pace() {
        let p = PromisePolicy::default();
        // The 7:1 burst, seed 9: 219 of 500 admitted 21.135 s into the
        // minute, most of them in the last second. At the minute's average
        // the last 281 slots last 27 s, so a node admitting 35 a second is
        // promised its whole horizon, 70 slots.
        let burst = Pace {
            admitted: 219,
            per_minute: 500,
            elapsed_ms: 21_135,
            recent: None,
        };
        assert_eq!(burst.left_ms(), 27_118);
        assert_eq!(p.need_paced(35, 1_000, burst), 70);
        // The room admitted 205 in the last second: the 281 slots last
        // 1.37 s, and the promise covers half of that, 24 slots.
        let seen = burst.with_recent(Some((205, 1_000)));
        assert_eq!(seen.recent_left_ms(), 1_370);
        assert_eq!(p.need_paced(35, 1_000, seen), 24);
        // Off, the minute's average alone.
        let average_only = PromisePolicy {
            recent_pace: false,
            ..p
        };
        assert_eq!(average_only.need_paced(35, 1_000, seen), 70);
        // A quiet recent pace changes nothing: the average or the horizon
        // binds first (10 a second: the slots last 28 s).
        assert_eq!(
            p.need_paced(35, 1_000, burst.with_recent(Some((10, 1_000)))),
            70
        );
        assert_eq!(
            p.need_paced(35, 1_000, burst.with_recent(Some((0, 1_000)))),
            70
        );
        // The limit reached: nothing, at any pace.
        let full = Pace {
            admitted: 500,
            ..seen
        };
        assert_eq!(p.need_paced(35, 1_000, full), 0);
        // Absurd counts (a node lying about its admits) neither overflow
        // nor promise more: endless admits leave no time, an endless window
        // leaves the average in charge.
        let lied = burst.with_recent(Some((u64::MAX, RECENT_PACE_MS)));
        assert_eq!(p.need_paced(35, 1_000, lied), 0);
        let endless = burst.with_recent(Some((1, u64::MAX)));
        assert_eq!(endless.recent_left_ms(), u64::MAX);
        assert_eq!(p.need_paced(35, 1_000, endless), 70);
    }

    #[test]
    fn the_recent_pace_is_measured_over_half_a_second_to_a_second_of_this_minute() {
        let t0 = UnixMillis(60_000 * 1_000 + 10_000);
        let mut pace = RecentPace::default();
        // No window yet: the first note, and any within half a second.
        assert_eq!(pace.observe(t0, 100), None);
        assert_eq!(pace.observe(t0.plus_millis(300), 130), None);
        // Half a second on: the admits since the first note.
        assert_eq!(pace.observe(t0.plus_millis(500), 150), Some((50, 500)));
        // The window slides: measured from the note half a second before
        // the last mark, never over more than a second.
        assert_eq!(pace.observe(t0.plus_millis(900), 190), Some((90, 900)));
        assert_eq!(pace.observe(t0.plus_millis(1_000), 200), Some((50, 500)));
        assert_eq!(pace.observe(t0.plus_millis(1_400), 260), Some((110, 900)));
        // Admits that went down (a node forgotten) count as none.
        assert_eq!(pace.observe(t0.plus_millis(1_450), 100), Some((0, 950)));
        // A new minute starts again, and so does a clock that went back.
        let next = t0.minute().plus(1).start();
        assert_eq!(pace.observe(next.plus_millis(10), 3), None);
        assert_eq!(pace.observe(next.plus_millis(600), 40), Some((37, 590)));
        // What status shows: the last window's admits a second, in its
        // minute only.
        assert_eq!(
            pace.per_second(next.plus_millis(700)),
            Some(37_000.0 / 590.0)
        );
        assert_eq!(pace.per_second(next.minute().plus(1).start()), None);
        assert_eq!(pace.observe(next.plus_millis(100), 40), None);
        assert_eq!(pace.per_second(next.plus_millis(700)), None);
    }

    #[test]
    fn an_asking_node_borrows_half_of_the_other_colos_unheld_slots() {
        let p = PromisePolicy::default();
        // 100 shared slots: its colo has none free, Anywhere 10; the other
        // colos hold 20 of their 90, so 70 are unheld elsewhere.
        let free = Free::new(0, 10, 80, (0, 10, 100));
        assert_eq!(p.promise((0, 1), free, 5), (0, 5));
        assert_eq!(p.promise((0, 1), free, 30), (0, 30));
        assert_eq!(p.promise((0, 1), free, 1_000), (0, 40));
        // An idle node borrows nothing: its small promise (here its fair
        // part, one) comes from Anywhere beyond the reserve.
        assert_eq!(p.promise((0, 1), free, 0), (0, 1));
        // Its own colo first: nothing is borrowed while it has room.
        let free = Free::new(40, 10, 80, (60, 10, 100));
        assert_eq!(p.promise((10, 1), free, 50), (40, 0));
        assert_eq!(p.promise((10, 1), free, 1_000), (40, 0));
    }

    #[test]
    fn a_node_asking_again_and_again_never_gets_more_than_nobody_holds() {
        // The attacker (or a tired operator's runaway node): every request
        // claims a huge rate. Whatever it asks, the grant is within each
        // pool's free part and the total; the ledgers then count it held.
        let p = PromisePolicy {
            min_promise: 1_000,
            horizon_ms: u64::MAX,
            ..PromisePolicy::default()
        };
        for need in [0, 1, 1_000, u64::MAX] {
            let (colo, any) = p.promise((u64::MAX, u64::MAX), FREE, need);
            assert!(colo <= FREE.colo && any <= FREE.anywhere, "{need}");
            assert!(colo + any <= FREE.total, "{need}");
        }
        assert_eq!(p.need(u64::MAX, 0), u64::MAX);
        let nothing = Free {
            colo: 0,
            anywhere: 0,
            total: 0,
            reserve: (0, 0, 0),
        };
        assert_eq!(p.promise((5, 5), nothing, u64::MAX), (0, 0));
    }
}
