//! Several aggregators: which one is this node's *home* (docs/adr/0001).
//!
//! A node configured with more than one aggregator reports to every one of
//! them, so each holds the whole picture and any of them can take over, but
//! takes its grants from one only: its home. If every aggregator granted,
//! the node would hold each grant several times over. The others get a peer
//! report (`Message::PeerReport`) that says which leases the node holds
//! from its home, so they count them as spent when they grant to the nodes
//! whose home they are.
//!
//! The home is the first aggregator, in an order of the node's own, that
//! answered within the last [`Homes::grace_ms`]: one interval and a half,
//! so a node changes home once its home has missed one answer, and comes
//! back when it answers again. The order is rendezvous hashing of the node
//! id with each aggregator's address (highest random weight): stable across
//! restarts, spread evenly over the aggregators, and when one aggregator is
//! removed only its nodes move. Before any answer, the first in the order.
//!
//! An aggregator that answers but says it cannot grant (`Message::Note`
//! after its answers, home or peer: its `[ledger]` failing, or fenced by
//! another epoch) is passed over while its answers say so: the home is the
//! first in the order that answers and whose last answer said nothing of
//! the kind, so the node is granted by an aggregator that can. Its first
//! answer without a note (it probes etcd every second while it cannot
//! commit) makes it eligible again. If every aggregator that answers says
//! so, the first that answers stays the home, as before.
//!
//! A node holds one home's grant at a time: while a report to its home is
//! unanswered no other aggregator is sent a report that asks for grants
//! ([`Homes::begin_grant`]), and a home that has gone past its grace is no
//! longer waited for ([`Homes::grant_wait`]), so its answer can never land
//! on top of the next home's. (Without this, an answer delayed past the
//! grace replaced the grant of the aggregator the node had moved to, whose
//! ledger then counted a lease the node did not hold.)
use std::{
    net::SocketAddr,
    sync::atomic::{
        AtomicBool, AtomicU64, AtomicUsize,
        Ordering::{AcqRel, Acquire, Relaxed},
    },
};

use waitroom_runtime::clock::Elapsed;

/// The aggregators of a node and when each last answered.
#[derive(Debug)]
pub struct Homes {
    addresses: Vec<SocketAddr>,
    /// Indexes into `addresses`, the node's order of preference.
    order: Vec<usize>,
    /// When each aggregator last answered (the node clock's monotonic ms); 0: never.
    answered: Vec<AtomicU64>,
    /// Each one's last answer said it cannot grant.
    held_back: Vec<AtomicBool>,
    /// An aggregator that answered within this long may be the home.
    grace_ms: u64,
    /// The home chosen by the last report sent (for `/metrics`).
    current: AtomicUsize,
    /// The aggregator a report asking for grants is in flight to, or
    /// [`NOBODY`].
    granting: AtomicUsize,
    /// Woken when the home's answer raised what the node holds: the other
    /// aggregators are told at once (`Homes::raised`).
    raised: tokio::sync::Notify,
}

/// No report asking for grants is in flight.
const NOBODY: usize = usize::MAX;

impl Homes {
    /// The aggregators at `addresses` as seen by the node `node`, which
    /// reports every `interval_ms`.
    #[must_use]
    pub fn new(node: &str, addresses: Vec<SocketAddr>, interval_ms: u64) -> Self {
        let mut order: Vec<usize> = (0..addresses.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(weight(node, &addresses[i])));
        let first = order.first().copied().unwrap_or(0);
        Self {
            answered: addresses.iter().map(|_| AtomicU64::new(0)).collect(),
            held_back: addresses.iter().map(|_| AtomicBool::new(false)).collect(),
            addresses,
            order,
            grace_ms: interval_ms + interval_ms / 2,
            current: AtomicUsize::new(first),
            granting: AtomicUsize::new(NOBODY),
            raised: tokio::sync::Notify::new(),
        }
    }

    /// The home's answer raised the leases the node holds: every other
    /// aggregator's client sends its peer report now rather than on its
    /// tick. A peer learns what the home granted from the leases named in
    /// the node's peer reports; on the tick, a peer report leaves with the
    /// leases held *before* the home's answer of the same tick, so a peer
    /// granting its own nodes within that interval counted this node at its
    /// old lease and could promise the same slots twice (31–34 of 24 in
    /// `aggregators.rs`, in 7 of 28 runs that began their traffic at once).
    pub fn raised(&self) {
        self.raised.notify_waiters();
    }

    /// Resolves at the next [`Homes::raised`].
    pub async fn wait_raised(&self) {
        self.raised.notified().await;
    }

    /// How long an aggregator may be silent and stay the home.
    #[must_use]
    pub fn grace_ms(&self) -> u64 {
        self.grace_ms
    }

    #[must_use]
    pub fn addresses(&self) -> &[SocketAddr] {
        &self.addresses
    }

    /// The aggregator (index into the addresses) this node's grants come
    /// from at `now`: the first in its order that answered within the
    /// grace and whose last answer did not say it cannot grant, else the
    /// first that answered, else the first in its order.
    pub fn home(&self, now: Elapsed) -> usize {
        let home = self
            .order
            .iter()
            .copied()
            .find(|&i| self.answering(i, now) && !self.holding_back(i))
            .or_else(|| self.order.iter().copied().find(|&i| self.answering(i, now)))
            .unwrap_or(self.order[0]);
        self.current.store(home, Relaxed);
        home
    }

    /// The home chosen by the last report.
    #[must_use]
    pub fn current(&self) -> usize {
        self.current.load(Relaxed)
    }

    /// Aggregator `i` answered at `now`.
    pub fn answered(&self, i: usize, now: Elapsed) {
        self.answered[i].store(now.0.max(1), Relaxed);
    }

    /// Aggregator `i` answered that it cannot grant; whether that starts
    /// an episode (its answer before did not say so).
    pub fn held_back(&self, i: usize) -> bool {
        !self.held_back[i].swap(true, AcqRel)
    }

    /// Aggregator `i` answered without saying it cannot grant; whether
    /// that ends an episode.
    pub fn grants_again(&self, i: usize) -> bool {
        self.held_back[i].swap(false, AcqRel)
    }

    /// Aggregator `i`'s last answer said it cannot grant.
    #[must_use]
    pub fn holding_back(&self, i: usize) -> bool {
        self.held_back[i].load(Acquire)
    }

    /// Aggregator `i`, the home at the moment, is about to be sent a report
    /// that asks for grants: true unless another aggregator's is still in
    /// flight (its grant may still come; the caller then sends a peer
    /// report). [`Homes::end_grant`] when the exchange is over, whatever
    /// its outcome.
    pub fn begin_grant(&self, i: usize) -> bool {
        self.granting
            .compare_exchange(NOBODY, i, AcqRel, Acquire)
            .is_ok()
    }

    /// The exchange [`Homes::begin_grant`] allowed for `i` is over.
    pub fn end_grant(&self, i: usize) {
        let _ = self.granting.compare_exchange(i, NOBODY, AcqRel, Acquire);
    }

    /// How long a report to the home `i`, sent at `now`, is waited for when
    /// another aggregator could take over: until `i`'s grace runs out, when
    /// the home moves anyway. `None` (the caller's own timeout) with a
    /// single aggregator, or when `i` is the home only because nobody
    /// answers.
    #[must_use]
    pub fn grant_wait(&self, i: usize, now: Elapsed) -> Option<u64> {
        if self.addresses.len() < 2 || !self.answering(i, now) {
            return None;
        }
        let at = self.answered[i].load(Relaxed);
        Some((at + self.grace_ms).saturating_sub(now.0))
    }

    /// Aggregator `i` answered within the grace before `now`.
    #[must_use]
    pub fn answering(&self, i: usize, now: Elapsed) -> bool {
        match self.answered[i].load(Relaxed) {
            0 => false,
            at => now.0.saturating_sub(at) <= self.grace_ms,
        }
    }
}

/// The rendezvous weight of `address` for `node` (the same hash that
/// shards rooms between aggregator groups).
fn weight(node: &str, address: &SocketAddr) -> u64 {
    waitroom_common::shard::weight(node.as_bytes(), address.to_string().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(n: u16) -> Vec<SocketAddr> {
        (0..n)
            .map(|i| SocketAddr::from(([10, 0, 0, 1], 7000 + i)))
            .collect()
    }

    #[test]
    fn homes_spread_over_the_aggregators_and_stay_put() {
        let mut per = [0_u32; 3];
        for n in 0..3_000 {
            let homes = Homes::new(&format!("node-{n}"), addrs(3), 1_000);
            per[homes.home(Elapsed(5))] += 1;
            // The same node, later or restarted: the same home.
            let again = Homes::new(&format!("node-{n}"), addrs(3), 1_000);
            assert_eq!(again.home(Elapsed(9)), homes.current());
        }
        for count in per {
            assert!((850..=1_150).contains(&count), "{per:?}");
        }
    }

    #[test]
    fn removing_an_aggregator_moves_only_its_nodes() {
        let all = addrs(3);
        let fewer: Vec<SocketAddr> = all[..2].to_vec();
        for n in 0..500 {
            let node = format!("node-{n}");
            let before = all[Homes::new(&node, all.clone(), 1_000).home(Elapsed(1))];
            let after = fewer[Homes::new(&node, fewer.clone(), 1_000).home(Elapsed(1))];
            if before != all[2] {
                assert_eq!(before, after, "{node} moved though its home stayed");
            }
        }
    }

    #[test]
    fn one_report_asking_for_grants_at_a_time_waited_for_until_the_grace_ends() {
        let homes = Homes::new("ams-1", addrs(2), 1_000);
        assert!(homes.begin_grant(0));
        assert!(!homes.begin_grant(1), "another's grant may still come");
        homes.end_grant(1);
        assert!(!homes.begin_grant(1), "only the holder ends it");
        homes.end_grant(0);
        assert!(homes.begin_grant(1));
        homes.end_grant(1);

        assert_eq!(homes.grant_wait(0, Elapsed(5)), None, "never answered");
        homes.answered(0, Elapsed(1_000));
        assert_eq!(homes.grant_wait(0, Elapsed(1_900)), Some(600));
        assert_eq!(homes.grant_wait(0, Elapsed(2_500)), Some(0));
        assert_eq!(homes.grant_wait(0, Elapsed(2_501)), None, "past the grace");
        let alone = Homes::new("ams-1", addrs(1), 1_000);
        alone.answered(0, Elapsed(1_000));
        assert_eq!(
            alone.grant_wait(0, Elapsed(1_900)),
            None,
            "nobody to move to"
        );
    }

    #[test]
    fn a_home_that_cannot_grant_is_passed_over_while_another_answers() {
        let homes = Homes::new("ams-1", addrs(3), 1_000);
        let first = homes.home(Elapsed(1));
        for i in 0..3 {
            homes.answered(i, Elapsed(1_000));
        }
        assert_eq!(homes.home(Elapsed(1_000)), first);
        assert!(homes.held_back(first), "an episode starts");
        let second = homes.home(Elapsed(1_000));
        assert_ne!(second, first, "another answers and can grant");
        assert!(!homes.held_back(first), "the same episode");
        // The next one cannot grant either: the third.
        homes.held_back(second);
        let third = homes.home(Elapsed(1_500));
        assert!(third != first && third != second, "{third}");
        // The third stops answering: every one that answers cannot grant,
        // so the first that answers, as without the note.
        for i in [first, second] {
            homes.answered(i, Elapsed(3_000));
        }
        assert_eq!(homes.home(Elapsed(3_000)), first, "nobody better");
        // The second answers without a note: it can grant again.
        assert!(homes.grants_again(second), "an episode ends");
        assert!(!homes.grants_again(second), "ended once");
        assert_eq!(homes.home(Elapsed(3_000)), second);
        // And the first: the first choice again, however soon.
        homes.grants_again(first);
        assert_eq!(homes.home(Elapsed(3_001)), first);
        // Alone, a node keeps its one aggregator.
        let alone = Homes::new("ams-1", addrs(1), 1_000);
        alone.answered(0, Elapsed(1_000));
        alone.held_back(0);
        assert_eq!(alone.home(Elapsed(1_001)), 0);
    }

    #[test]
    fn a_silent_home_is_left_after_an_interval_and_a_half_and_taken_back() {
        let homes = Homes::new("ams-1", addrs(2), 1_000);
        let first = homes.home(Elapsed(1));
        let other = 1 - first;
        // Nobody answered yet: the first in the order, even if it is down.
        homes.answered(other, Elapsed(1_000));
        assert_eq!(homes.home(Elapsed(1_000)), other, "the only one answering");
        homes.answered(first, Elapsed(1_100));
        assert_eq!(homes.home(Elapsed(1_200)), first, "preferred again");
        homes.answered(other, Elapsed(2_000));
        assert_eq!(homes.home(Elapsed(2_600)), first, "within the grace");
        assert_eq!(homes.home(Elapsed(2_601)), other, "one answer missed");
        assert!(!homes.answering(first, Elapsed(2_601)));
        assert_eq!(
            homes.home(Elapsed(3_501)),
            first,
            "nobody answering: the first"
        );
    }
}
