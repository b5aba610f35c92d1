//! What the request path reads: the latest global state per room, with its
//! age, behind one `ArcSwap`.
//!
//! The gossip task builds a new [`World`] from each answer and swaps it in;
//! readers `load()` it without a lock and never see half an update. Whether
//! the world is still trustworthy is a function of its age and `now`
//! ([`WorldView::freshness`]), so a view goes stale on its own when answers
//! stop, and fresh again with the next answer: there is no flag to forget to
//! reset.
use std::sync::Arc;

use arc_swap::ArcSwap;
use waitroom_common::{
    counters::RoomCounters,
    room::{Room, RoomConfig, RoomId},
    state::{AdmitRate, GlobalState},
    time::UnixMillis,
};

/// Weight of the newest observation in a room's share of the cluster.
const SHARE_ALPHA: f64 = 0.3;

/// Below this many users (active + admitted this minute) in the whole room a
/// share says little; the previous one is kept.
const SHARE_MIN_SAMPLE: u64 = 10;

/// The world as of the last answer from the aggregator.
#[derive(Debug, Clone, Default)]
pub struct World {
    /// The node's clock when the answer arrived; `None` before the first.
    pub received_at: Option<UnixMillis>,
    /// The aggregator's clock when it computed the answer.
    pub aggregator_at: Option<UnixMillis>,
    /// One entry per room the aggregator answered for, in the order answered.
    pub rooms: Vec<RoomView>,
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
}

impl World {
    /// The view of `room`, if the aggregator answered for it.
    #[must_use]
    pub fn room(&self, room: RoomId) -> Option<&RoomView> {
        self.rooms.iter().find(|r| r.room == room)
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
}

impl WorldView {
    #[must_use]
    pub fn new(stale_after_ms: u64) -> Self {
        Self {
            current: ArcSwap::from_pointee(World::default()),
            stale_after_ms,
            changed: tokio::sync::Notify::new(),
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

    /// How fresh the world is at `now`.
    #[must_use]
    pub fn freshness(&self, now: UnixMillis) -> Freshness {
        freshness(&self.current.load(), now, self.stale_after_ms)
    }

    /// Staleness limit in milliseconds.
    #[must_use]
    pub fn stale_after_ms(&self) -> u64 {
        self.stale_after_ms
    }

    /// Swaps in a new world (the gossip task only).
    pub fn store(&self, world: World) {
        self.current.store(Arc::new(world));
        self.changed.notify_one();
    }

    /// Resolves after the next [`WorldView::store`] (at once if one happened
    /// since the last call). Meant for one waiter: the node's refresh loop.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

/// The freshness of `world` at `now` when it goes stale after `stale_after_ms`.
#[must_use]
pub fn freshness(world: &World, now: UnixMillis, stale_after_ms: u64) -> Freshness {
    match world.received_at {
        None => Freshness::Never,
        Some(at) => {
            let age_ms = now.0.saturating_sub(at.0);
            if age_ms <= stale_after_ms {
                Freshness::Fresh { age_ms }
            } else {
                Freshness::Stale { age_ms }
            }
        }
    }
}

/// This node's part of the room at the moment of `state`, given its own
/// active users and admits this minute; `None` when the room is too empty for
/// the ratio to mean anything.
#[must_use]
pub fn observed_share(state: &GlobalState, own_active: i64, own_admitted: u64) -> Option<f64> {
    let total = state.active_users + state.admitted_this_minute;
    if total < SHARE_MIN_SAMPLE {
        return None;
    }
    let own = u64::try_from(own_active).unwrap_or(0) + own_admitted;
    Some((own as f64 / total as f64).clamp(0.0, 1.0))
}

/// Folds an observation into the smoothed share.
#[must_use]
pub fn smooth_share(previous: Option<f64>, observed: Option<f64>) -> Option<f64> {
    match (previous, observed) {
        (Some(p), Some(o)) => Some(SHARE_ALPHA * o + (1.0 - SHARE_ALPHA) * p),
        (p, o) => o.or(p),
    }
}

/// The local-only state: the node decides alone with its last known share of
/// the room's limits (the seeds' "data center limit" without fresh news).
///
/// With no share known (the node never heard from the aggregator) it takes the
/// whole room, as a single node would; an operator who must never exceed the
/// limits before the first answer sets the room to `queue_all` at start.
#[must_use]
pub fn local_only_state(
    room: &Room,
    counters: &RoomCounters,
    rate: &mut AdmitRate,
    share: Option<f64>,
    now: UnixMillis,
) -> GlobalState {
    let scaled;
    let room = match share {
        Some(share) => {
            let scale = |limit: u64| ((limit as f64 * share).floor() as u64).max(1);
            let config = room.config();
            let total = scale(config.total_active_users);
            let config = RoomConfig {
                total_active_users: total,
                new_users_per_minute: scale(config.new_users_per_minute).min(total),
                ..config.clone()
            };
            scaled = config
                .validate()
                .map(|r| r.with_id(room.id()))
                .unwrap_or_else(|_| room.clone());
            &scaled
        }
        None => room,
    };
    GlobalState::standalone(room, counters, rate, now)
}

#[cfg(test)]
mod tests {
    use waitroom_common::room::{CookieSameSite, CookieSecure, QueueingMethod};

    use super::*;

    #[test]
    fn a_world_goes_stale_by_itself_and_is_fresh_again_with_the_next_answer() {
        let view = WorldView::new(10_000);
        assert_eq!(view.freshness(UnixMillis(5)), Freshness::Never);
        view.store(World {
            received_at: Some(UnixMillis(1_000)),
            ..World::default()
        });
        assert_eq!(
            view.freshness(UnixMillis(3_000)),
            Freshness::Fresh { age_ms: 2_000 }
        );
        assert_eq!(
            view.freshness(UnixMillis(11_001)),
            Freshness::Stale { age_ms: 10_001 }
        );
        view.store(World {
            received_at: Some(UnixMillis(11_500)),
            ..World::default()
        });
        assert!(view.freshness(UnixMillis(11_600)).is_fresh());
    }

    #[test]
    fn share_needs_a_sample_and_is_smoothed() {
        let mut state = GlobalState::empty(UnixMillis(0));
        state.active_users = 5;
        assert_eq!(observed_share(&state, 5, 0), None);
        state.active_users = 90;
        state.admitted_this_minute = 10;
        assert_eq!(observed_share(&state, 20, 5), Some(0.25));
        assert_eq!(observed_share(&state, -3, 0), Some(0.0));
        assert_eq!(smooth_share(None, Some(0.5)), Some(0.5));
        assert_eq!(smooth_share(Some(0.5), None), Some(0.5));
        let s = smooth_share(Some(0.5), Some(1.0)).unwrap();
        assert!((s - 0.65).abs() < 1e-9);
    }

    #[test]
    fn local_only_uses_the_share_of_the_limits() {
        let room = RoomConfig {
            total_active_users: 100,
            new_users_per_minute: 40,
            session_duration: 5,
            disable_session_renewal: false,
            queueing_method: QueueingMethod::Fifo,
            queue_all: false,
            refresh_interval: 20,
            cookie_same_site: CookieSameSite::Auto,
            cookie_secure: CookieSecure::Auto,
        }
        .validate()
        .unwrap()
        .named("shop");
        let counters = RoomCounters::new_boxed(room.id());
        let now = UnixMillis(1_622_073_600_000);
        let mut rate = AdmitRate::default();
        let state = local_only_state(&room, &counters, &mut rate, Some(0.25), now);
        assert_eq!(
            state.slots_available, 10,
            "a quarter of 40 new users per minute"
        );
        let alone = local_only_state(&room, &counters, &mut rate, None, now);
        assert_eq!(alone.slots_available, 40);
        let tiny = local_only_state(&room, &counters, &mut rate, Some(0.0), now);
        assert_eq!(
            tiny.slots_available, 1,
            "never a limit of zero (the config would be invalid)"
        );
    }
}
