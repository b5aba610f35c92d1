//! What the request path reads: the latest global state per room, with its
//! age, behind one `ArcSwap`.
//!
//! The gossip task builds a new [`World`] from each answer and swaps it in;
//! readers `load()` it without a lock and never see half an update. Whether
//! the world is still trustworthy is a function of its age and `now`
//! ([`WorldView::freshness`]), so a view goes stale on its own when answers
//! stop, and fresh again with the next answer: there is no flag to forget to
//! reset. Ages are measured on the monotonic clock ([`Clock::elapsed`]), so
//! a step of the wall clock neither ages a fresh answer nor freshens an old
//! one (`tests/tests/clock_jump.rs`).
//!
//! [`Clock::elapsed`]: waitroom_runtime::clock::Clock::elapsed
use std::sync::Arc;

use arc_swap::ArcSwap;
use waitroom_common::{room::RoomId, state::GlobalState, time::UnixMillis};
use waitroom_runtime::clock::Elapsed;

/// The world as of the last answer from the aggregator (from each group's
/// home, rooms sharded between groups: each answer replaces its group's
/// rooms and keeps the others').
#[derive(Debug, Clone, Default)]
pub struct World {
    /// The node's clock when the last answer arrived; `None` before the first.
    pub received_at: Option<UnixMillis>,
    /// Per aggregator group (one unless rooms are sharded), the node's
    /// monotonic clock when its last answer arrived: what ages are
    /// measured from.
    pub groups: Vec<Option<Elapsed>>,
    /// The aggregator's clock when it computed the answer.
    pub aggregator_at: Option<UnixMillis>,
    /// One entry per room the aggregator answered for, in the order answered.
    pub rooms: Vec<RoomView>,
    /// Room settings the last answer carried (the node reported another
    /// version): the node's refresh loop puts them in force.
    pub settings: Option<Arc<waitroom_common::wire::SettingsPush>>,
}

/// One room's global state as this node knows it.
#[derive(Debug, Clone)]
pub struct RoomView {
    pub room: RoomId,
    pub state: Arc<GlobalState>,
    /// This node's part of the room's users (active + admitted this minute),
    /// smoothed over answers: what the node may keep using on its own when
    /// the aggregator is out of reach. `None` until a big enough sample.
    pub share: Option<f64>,
    /// The node's monotonic clock when the answer that carried it arrived.
    pub received: Elapsed,
}

impl World {
    /// The view of `room`, if the aggregator answered for it.
    #[must_use]
    pub fn room(&self, room: RoomId) -> Option<&RoomView> {
        self.rooms.iter().find(|r| r.room == room)
    }

    /// Group `group` of `groups` answered at `received`.
    pub fn answered(&mut self, group: usize, groups: usize, received: Elapsed) {
        self.groups.resize(groups, None);
        self.groups[group] = Some(received);
    }

    /// When the oldest of the groups' last answers arrived (the world's
    /// age); `None` until every group answered.
    #[must_use]
    pub fn received(&self) -> Option<Elapsed> {
        self.groups.iter().copied().min().flatten()
    }
}

/// How far the world can be trusted at some instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// No answer yet since the node started.
    Never,
    /// The last answer is younger than `stale_after_ms`.
    Fresh { age_ms: u64 },
    /// The last answer is older: decide with the local-only limit.
    Stale { age_ms: u64 },
}

impl Freshness {
    #[must_use]
    pub fn is_fresh(self) -> bool {
        matches!(self, Self::Fresh { .. })
    }

    /// Age of the last answer, if there was one.
    #[must_use]
    pub fn age_ms(self) -> Option<u64> {
        match self {
            Self::Never => None,
            Self::Fresh { age_ms } | Self::Stale { age_ms } => Some(age_ms),
        }
    }
}

/// The shared, lock-free view of the world (one per node).
#[derive(Debug)]
pub struct WorldView {
    current: ArcSwap<World>,
    /// After this long without an answer the world is stale.
    stale_after_ms: u64,
    /// Woken on every store, so whoever turns the world into the rooms'
    /// states does so at once instead of on its next tick.
    changed: tokio::sync::Notify,
    /// Held by [`WorldView::update`].
    writer: parking_lot::Mutex<()>,
}

impl WorldView {
    #[must_use]
    pub fn new(stale_after_ms: u64) -> Self {
        Self {
            current: ArcSwap::from_pointee(World::default()),
            stale_after_ms,
            changed: tokio::sync::Notify::new(),
            writer: parking_lot::Mutex::new(()),
        }
    }

    /// The current world. Lock-free; hold the guard only briefly.
    pub fn load(&self) -> arc_swap::Guard<Arc<World>> {
        self.current.load()
    }

    /// The current world as an owned `Arc` (for work off the request path).
    #[must_use]
    pub fn load_full(&self) -> Arc<World> {
        self.current.load_full()
    }

    /// How fresh the world is at `now` (the node clock's monotonic
    /// reading): as fresh as its oldest group.
    #[must_use]
    pub fn freshness(&self, now: Elapsed) -> Freshness {
        freshness(self.current.load().received(), now, self.stale_after_ms)
    }

    /// How fresh group `group`'s rooms in `world` are at `now`.
    #[must_use]
    pub fn group_freshness(&self, world: &World, group: usize, now: Elapsed) -> Freshness {
        let received = world.groups.get(group).copied().flatten();
        freshness(received, now, self.stale_after_ms)
    }

    /// Staleness limit in milliseconds.
    #[must_use]
    pub fn stale_after_ms(&self) -> u64 {
        self.stale_after_ms
    }

    /// Whether `room`'s state, from its group's last answer, is still
    /// fresh at `now`.
    #[must_use]
    pub fn room_fresh(&self, room: &RoomView, now: Elapsed) -> bool {
        freshness(Some(room.received), now, self.stale_after_ms).is_fresh()
    }

    /// Swaps in a new world (tests, and a single gossip task).
    pub fn store(&self, world: World) {
        self.current.store(Arc::new(world));
        self.changed.notify_one();
    }

    /// Swaps in the world `next` builds from the current one. The gossip
    /// clients of several groups update it in turn (under a lock of their
    /// own; readers never take it), so none loses another's rooms.
    pub fn update(&self, next: impl FnOnce(&World) -> World) {
        let _one_writer = self.writer.lock();
        let world = next(&self.current.load());
        self.store(world);
    }

    /// Resolves after the next [`WorldView::store`] (at once if one happened
    /// since the last call). Meant for one waiter: the node's refresh loop.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

/// The freshness at `now` of news that arrived at `received` (`None`:
/// never) and goes stale after `stale_after_ms`.
#[must_use]
pub fn freshness(received: Option<Elapsed>, now: Elapsed, stale_after_ms: u64) -> Freshness {
    match received {
        None => Freshness::Never,
        Some(at) => {
            let age_ms = now.since(at);
            if age_ms <= stale_after_ms {
                Freshness::Fresh { age_ms }
            } else {
                Freshness::Stale { age_ms }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_world_goes_stale_by_itself_and_is_fresh_again_with_the_next_answer() {
        let view = WorldView::new(10_000);
        assert_eq!(view.freshness(Elapsed(5)), Freshness::Never);
        view.store(World {
            groups: vec![Some(Elapsed(1_000))],
            ..World::default()
        });
        assert_eq!(
            view.freshness(Elapsed(3_000)),
            Freshness::Fresh { age_ms: 2_000 }
        );
        assert_eq!(
            view.freshness(Elapsed(11_001)),
            Freshness::Stale { age_ms: 10_001 }
        );
        view.store(World {
            groups: vec![Some(Elapsed(11_500))],
            ..World::default()
        });
        assert!(view.freshness(Elapsed(11_600)).is_fresh());
    }
}
