//! The grant ledger kept in a replicated store (issue 20, docs/adr/0001):
//! what aggregators that share one Anywhere pool write, one value per room
//! and minute, changed only by compare-and-swap.
//!
//! # The rule
//! A node's grant is a *cap*: the count of Anywhere admits it may reach this
//! minute (its admits when it was granted plus its allowance). A new grant
//! replaces the node's cap, so what it did not use goes back to the pool at
//! once. The ledger holds every node's cap and keeps
//! `Σ caps ≤ pool`: a batch (one aggregator's grants of one round) gets
//! what it asks for each node only while the sum of every other node's cap
//! leaves room, in the batch's order. Since a node never admits past its
//! cap, the minute's Anywhere admits never pass the pool, however many
//! aggregators grant.
//!
//! Caps only compare within one minute: every minute has its own value
//! (and key), and a node starts each minute with none.
//!
//! # Batch ids
//! A batch carries an id, and the ledger keeps the ids (and results) of the
//! last [`RECENT_BATCHES`] batches. A batch applied again — a retry after a
//! reply was lost, e.g. the store's member died after the commit — returns
//! what it got the first time and changes nothing. Without the ids such a
//! retry would find its own write, read it as another aggregator's, and the
//! slots would be spent and held by nobody (`tests/tests/etcd_ledger.rs`
//! found exactly that).
use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

/// Batches whose results the ledger keeps for retries.
pub const RECENT_BATCHES: usize = 64;

/// One room's Anywhere grants for one minute, as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantLedger {
    /// Node → its cap this minute.
    pub caps: BTreeMap<String, u64>,
    /// The last batches applied, oldest first: id and the caps it set.
    pub recent: VecDeque<Applied>,
}

/// One node's ask in a batch: its cap, to be cut so that every node's cap
/// stays within `pool` (the minute's budget as the asking aggregator saw
/// it when it granted), but never below `floor`: the admits the node has
/// already made this minute and the caps it says it holds. Those are spent,
/// or may be before the node hears of a lower cap, whatever the ledger says;
/// a cap below them would leave them free in the ledger for another node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ask {
    pub node: String,
    pub cap: u64,
    pub pool: u64,
    pub floor: u64,
}

/// A batch the ledger applied, and what it gave.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub id: String,
    pub caps: Vec<(String, u64)>,
}

impl GrantLedger {
    /// The sum of every node's cap.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.caps
            .values()
            .fold(0, |sum, &cap| sum.saturating_add(cap))
    }

    /// What the batch `id` got, if the ledger applied it.
    #[must_use]
    pub fn applied(&self, id: &str) -> Option<&[(String, u64)]> {
        self.recent
            .iter()
            .find(|a| a.id == id)
            .map(|a| a.caps.as_slice())
    }

    /// Applies the batch `id`: each `(node, cap)` asked, in order, becomes
    /// the node's cap, cut so that the caps of all nodes stay within
    /// `pool`. Returns the caps set. A batch already applied changes
    /// nothing and returns what it got then.
    pub fn apply(&mut self, id: &str, asks: &[(String, u64)], pool: u64) -> Vec<(String, u64)> {
        let asks: Vec<Ask> = asks
            .iter()
            .map(|(node, cap)| Ask {
                node: node.clone(),
                cap: *cap,
                pool,
                floor: 0,
            })
            .collect();
        self.apply_asks(id, &asks)
    }

    /// [`GrantLedger::apply`] with a pool per ask: each cap is cut so that
    /// the caps of all nodes stay within that ask's pool, but not below
    /// [`Ask::floor`] (the caps pass the pool then only by what the node has
    /// spent or holds already, which no ledger can take back).
    pub fn apply_asks(&mut self, id: &str, asks: &[Ask]) -> Vec<(String, u64)> {
        if let Some(done) = self.applied(id) {
            return done.to_vec();
        }
        let mut set = Vec::with_capacity(asks.len());
        for Ask {
            node,
            cap,
            pool,
            floor,
        } in asks
        {
            let others = self
                .total()
                .saturating_sub(self.caps.get(node).copied().unwrap_or(0));
            let cap = (*cap)
                .min(pool.saturating_sub(others))
                .max((*floor).min(*cap));
            self.caps.insert(node.clone(), cap);
            set.push((node.clone(), cap));
        }
        self.recent.push_back(Applied {
            id: id.to_owned(),
            caps: set.clone(),
        });
        while self.recent.len() > RECENT_BATCHES {
            self.recent.pop_front();
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn asks(list: &[(&str, u64)]) -> Vec<(String, u64)> {
        list.iter().map(|&(n, c)| (n.to_owned(), c)).collect()
    }

    /// What one room's minute costs in etcd: every node's cap, and the
    /// last 64 batches' results (`cargo test -p waitroom-common --features
    /// std value_size -- --nocapture` prints the figures in OPERATIONS.md).
    /// The value grows by the name and cap of each node, plus those of the
    /// nodes in the batches it keeps, and by nothing else.
    #[test]
    fn the_stored_value_grows_by_each_node_s_name_and_cap() {
        let name = |n: usize| format!("edge-ams-{n:05}");
        for (nodes, per_batch) in [(100, 2), (1_000, 16), (10_000, 160)] {
            let mut ledger = GrantLedger::default();
            // Every node asks once, in batches of `per_batch` (group commit:
            // the reports waiting when the last commit ended).
            for (b, chunk) in (0..nodes).collect::<Vec<_>>().chunks(per_batch).enumerate() {
                let batch: Vec<Ask> = chunk
                    .iter()
                    .map(|&n| Ask {
                        node: name(n),
                        cap: 100 + (n as u64 % 900),
                        pool: u64::MAX,
                        floor: 0,
                    })
                    .collect();
                ledger.apply_asks(&format!("aggregator-1/{b}"), &batch);
            }
            let bytes = serde_json::to_vec(&ledger).unwrap().len();
            let caps = serde_json::to_vec(&ledger.caps).unwrap().len();
            let one = name(0).len() + r#""":999,"#.len();
            eprintln!(
                "{nodes} nodes, batches of {per_batch}: {bytes} bytes ({caps} of caps, {} of the last {} batches)",
                bytes - caps,
                ledger.recent.len()
            );
            assert!(caps <= nodes * one + 2, "{caps} for {nodes} caps");
            let batch_bytes =
                per_batch * (one + 2) + r#"{"id":"aggregator-1/99999","caps":[]},"#.len();
            assert!(
                bytes - caps <= RECENT_BATCHES * batch_bytes + 32,
                "{} for {} batches",
                bytes - caps,
                ledger.recent.len()
            );
        }
    }

    #[test]
    fn a_cap_replaces_the_last_and_what_is_left_goes_to_the_next() {
        let mut ledger = GrantLedger::default();
        assert_eq!(
            ledger.apply("x/1", &asks(&[("a", 60), ("b", 60)]), 100),
            asks(&[("a", 60), ("b", 40)])
        );
        // a used 20 of its 60 and is granted 30 more: cap 50, 10 go back.
        assert_eq!(
            ledger.apply("y/1", &asks(&[("a", 50), ("c", 20)]), 100),
            asks(&[("a", 50), ("c", 10)])
        );
        assert_eq!(ledger.total(), 100);
        // The retry of a batch whose reply was lost: the same answer, no change.
        let before = ledger.clone();
        assert_eq!(
            ledger.apply("x/1", &asks(&[("a", 99)]), 100),
            asks(&[("a", 60), ("b", 40)])
        );
        assert_eq!(ledger, before);
    }

    #[test]
    fn only_the_last_batches_are_kept() {
        let mut ledger = GrantLedger::default();
        for i in 0..RECENT_BATCHES + 10 {
            ledger.apply(&format!("b{i}"), &asks(&[("a", 1)]), 10);
        }
        assert_eq!(ledger.recent.len(), RECENT_BATCHES);
        assert!(ledger.applied("b0").is_none());
        assert!(
            ledger
                .applied(&format!("b{}", RECENT_BATCHES + 9))
                .is_some()
        );
    }

    proptest! {
        /// Whatever batches, in whatever order, retried or not: the caps
        /// never pass the pool, nodes outside a batch keep theirs, and a
        /// retried batch changes nothing.
        #[test]
        fn caps_never_pass_the_pool(
            pool in 0_u64..500,
            batches in prop::collection::vec(
                (0_usize..12, prop::collection::vec((0_usize..6, 0_u64..300), 0..6)),
                1..40,
            ),
        ) {
            let mut ledger = GrantLedger::default();
            for (id, batch) in &batches {
                let id = format!("batch-{id}");
                let asks: Vec<(String, u64)> =
                    batch.iter().map(|&(n, c)| (format!("n{n}"), c)).collect();
                let before = ledger.clone();
                let retry = before.applied(&id).map(<[_]>::to_vec);
                let set = ledger.apply(&id, &asks, pool);
                prop_assert!(ledger.total() <= pool.max(before.total()));
                match retry {
                    Some(done) => {
                        prop_assert_eq!(&set, &done);
                        prop_assert_eq!(&ledger.caps, &before.caps);
                    }
                    None => {
                        for (node, cap) in &before.caps {
                            if !asks.iter().any(|(n, _)| n == node) {
                                prop_assert_eq!(ledger.caps.get(node), Some(cap));
                            }
                        }
                        for ((node, asked), (set_node, cap)) in asks.iter().zip(&set) {
                            prop_assert_eq!(node, set_node);
                            prop_assert!(cap <= asked);
                        }
                    }
                }
            }
            prop_assert!(ledger.total() <= pool);
        }
    }
}
