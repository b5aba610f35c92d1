//! Where a room stands right now, in the words an operator watching the queue
//! uses: is anyone being queued, and what would a visitor arriving now be told.
//!
//! Both are read from the same [`GlobalState`] the engine decides with, and
//! the estimate is the engine's own ([`crate::engine`]), so the node's and
//! the aggregator's `/status` and dashboards cannot tell a different story
//! from the queue page.
use serde::{Deserialize, Serialize};

use crate::{
    estimate::WaitEstimate,
    event::{EventPhase, format_rfc3339},
    room::{QueueingMethod, Room},
    state::GlobalState,
    time::Minute,
};

/// The room's phase as the dashboard shows it. Settings come first (they
/// decide whatever the numbers say), then the numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoomPhase {
    /// `queue_all`: every new visitor waits, whatever the limits say.
    QueueAll,
    /// Queueing method `passthrough`: the room lets everyone in (counting on).
    Passthrough,
    /// Queueing method `reject`: new visitors are refused.
    Reject,
    /// Visitors are waiting, or no slot is left: a newcomer joins the queue.
    Queueing,
    /// Slots are free and nobody waits: a newcomer goes straight in.
    NotQueueing,
}

impl RoomPhase {
    /// The phase of `room` given `state`.
    #[must_use]
    pub fn of(room: &Room, state: &GlobalState) -> Self {
        if room.queue_all() {
            return Self::QueueAll;
        }
        match room.queueing_method() {
            QueueingMethod::Passthrough => Self::Passthrough,
            QueueingMethod::Reject => Self::Reject,
            QueueingMethod::Fifo | QueueingMethod::Random => {
                if state.total_waiting > 0 || state.slots_available == 0 {
                    Self::Queueing
                } else {
                    Self::NotQueueing
                }
            }
        }
    }
}

/// The scheduled event in force in `room` (a room made by
/// [`Room::at`]), as the dashboards show it: `"prequeueing: sale (starts
/// 2027-01-15T08:10:00Z)"`, `"active: sale (ends 2027-01-15T09:00:00Z)"`;
/// `None` outside every event. `base` is the room as configured, for the
/// event's name.
#[must_use]
pub fn event_phase(base: &Room, room: &Room) -> Option<String> {
    let now = room.event()?;
    let name = base.events().get(now.index).map_or("", |e| e.name.as_str());
    Some(match now.phase {
        EventPhase::Prequeueing => {
            format!("prequeueing: {name} (starts {})", format_rfc3339(now.start))
        }
        EventPhase::Active => format!("active: {name} (ends {})", format_rfc3339(now.end)),
    })
}

/// What a visitor queued in `minute` (one arriving now) would be told: the
/// engine's estimate for that bucket.
#[must_use]
pub fn arrival_estimate(room: &Room, state: &GlobalState, minute: Minute) -> WaitEstimate {
    crate::engine::estimate(room, state, minute)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{room::RoomConfig, time::UnixMillis};

    fn room(f: impl FnOnce(&mut RoomConfig)) -> Room {
        let mut config = RoomConfig::with_limits(10, 5);
        f(&mut config);
        config.validate().unwrap().named("shop")
    }

    fn state(slots_available: u64, total_waiting: u64) -> GlobalState {
        GlobalState {
            slots_available,
            total_waiting,
            admits_per_minute: 5.0,
            ..GlobalState::empty(UnixMillis(0))
        }
    }

    #[test]
    fn settings_come_before_the_numbers() {
        let queue_all = room(|c| c.queue_all = true);
        assert_eq!(RoomPhase::of(&queue_all, &state(3, 0)), RoomPhase::QueueAll);
        let pass = room(|c| c.queueing_method = QueueingMethod::Passthrough);
        assert_eq!(RoomPhase::of(&pass, &state(0, 9)), RoomPhase::Passthrough);
        let reject = room(|c| c.queueing_method = QueueingMethod::Reject);
        assert_eq!(RoomPhase::of(&reject, &state(3, 0)), RoomPhase::Reject);
    }

    #[test]
    fn queueing_when_anyone_waits_or_no_slot_is_left() {
        let fifo = room(|_| {});
        assert_eq!(RoomPhase::of(&fifo, &state(3, 0)), RoomPhase::NotQueueing);
        assert_eq!(RoomPhase::of(&fifo, &state(0, 0)), RoomPhase::Queueing);
        assert_eq!(RoomPhase::of(&fifo, &state(3, 2)), RoomPhase::Queueing);
        assert_eq!(
            serde_json::to_string(&RoomPhase::NotQueueing).unwrap(),
            "\"not_queueing\""
        );
    }

    #[test]
    fn the_estimate_is_the_engines() {
        let fifo = room(|_| {});
        // Nobody waiting: nobody ahead, no wait.
        let e = arrival_estimate(&fifo, &state(0, 0), Minute(1));
        assert_eq!(e.visitors_ahead, 0);
        assert!(e.wait_time_known);
        assert_eq!(e.minutes, 0.0);
        let queue_all = room(|c| c.queue_all = true);
        assert!(!arrival_estimate(&queue_all, &state(0, 0), Minute(1)).wait_time_known);
        assert_eq!(
            arrival_estimate(&queue_all, &state(0, 100), Minute(1)).known_seconds(),
            None
        );
    }

    /// What `/metrics` exports as `waitroom_wait_estimate_seconds`.
    #[test]
    fn the_known_seconds_are_the_pages_minutes() {
        let fifo = room(|_| {});
        let waiting = |n, rate| GlobalState {
            admits_per_minute: rate,
            ..state(0, n)
        };
        assert_eq!(WaitEstimate::fifo(100, 50.0).known_seconds(), Some(120.0));
        assert_eq!(
            arrival_estimate(&fifo, &waiting(100, 0.0), Minute(1)).known_seconds(),
            None,
            "no rate yet"
        );
        let random = room(|c| c.queueing_method = QueueingMethod::Random);
        let median = arrival_estimate(&random, &waiting(99, 50.0), Minute(1))
            .known_seconds()
            .unwrap();
        assert!(median > 0.0 && median < 120.0, "{median}");
    }
}
