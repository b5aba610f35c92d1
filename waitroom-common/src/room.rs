//! The room model: what an operator configures and what the engine may rely on.
//!
//! [`RoomConfig`] is the engine's part of a room table (the keys themselves are
//! defined once, in [`RoomTable`](crate::room_table::RoomTable)); [`Room`] is
//! the same after [`RoomConfig::validate`] has checked it, so the engine never has to handle
//! a zero session or a new-user limit above the total. Bounds that look
//! arbitrary are there because fixed-size rings in
//! [`RoomCounters`](crate::counters::RoomCounters) depend on them.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::event::{Event, EventNow, EventPhase, Shuffle};
use crate::time::UnixMillis;

/// Longest session the counters can track: the session-expiry ring covers
/// one day ahead of now.
pub const MAX_SESSION_MINUTES: u32 = 1_440;

/// Shortest refresh interval a room may ask of its queued visitors.
pub const MIN_REFRESH_SECS: u16 = 5;

/// Longest refresh interval. With the ±20 % jitter a queued visitor checks in
/// at least every 108 s, inside the 3-minute window in which the counters
/// still count them as waiting.
pub const MAX_REFRESH_SECS: u16 = 90;

/// Largest user limit: per-node counts are kept in 32 bits.
pub const MAX_USERS: u64 = 1 << 30;

/// Distinct connections one ticket may use within
/// [`DEFAULT_TICKET_CONNECTION_WINDOW_SECS`] when a room does not set
/// `ticket_connection_budget`. A browser opens 6 to 8 HTTP/1.1 connections
/// per host (1 with HTTP/2) and may replace them as they idle out; 16 leaves
/// it twice that, while a cookie copied to hundreds of clients gets 16 in.
/// A phone that changes address keeps its ticket: the budget counts
/// connections, not addresses.
pub const DEFAULT_TICKET_CONNECTION_BUDGET: u16 = 16;

/// The window of the connection budget, seconds.
pub const DEFAULT_TICKET_CONNECTION_WINDOW_SECS: u16 = 10;

/// Longest connection-budget window, seconds.
pub const MAX_TICKET_CONNECTION_WINDOW_SECS: u16 = 3_600;

/// Session length when a room does not set `session_duration`, minutes.
pub const DEFAULT_SESSION_MINUTES: u32 = 5;

/// Refresh interval when a room does not set `refresh_interval`, seconds.
pub const DEFAULT_REFRESH_SECS: u16 = 20;

/// Identity of a room, carried in every ticket so a cookie from one room is
/// never honoured by another.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct RoomId(pub u64);

impl RoomId {
    /// Id derived from the room's name with FNV-1a (64 bit).
    ///
    /// The hash is fixed by this function, not by `std`'s hasher, so ids stay
    /// the same across releases and machines and old cookies stay valid.
    #[must_use]
    pub fn from_name(name: &str) -> Self {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in name.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        Self(hash)
    }
}

/// How visitors leave the queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueingMethod {
    /// First in, first out by arrival minute (seed 002).
    #[default]
    Fifo,
    /// Every queued visitor has the same chance at each check-in (seed 001).
    Random,
    /// Everyone is admitted; accounting goes on so a switch back is seamless.
    Passthrough,
    /// Nobody new is admitted; visitors without a session get a refusal page.
    Reject,
}

impl QueueingMethod {
    /// The name the room table and the queue page's `queueingMethod` use.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Fifo => "fifo",
            Self::Random => "random",
            Self::Passthrough => "passthrough",
            Self::Reject => "reject",
        }
    }
}

/// The `SameSite` attribute of the ticket cookie.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CookieSameSite {
    /// `None` over HTTPS (so the room works in an iframe), `Lax` otherwise.
    #[default]
    Auto,
    Lax,
    None,
    Strict,
}

/// What a ticket is bound to besides the room (`ticket_binding`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TicketBinding {
    /// Nothing: a ticket works from any address (phones change networks).
    #[default]
    None,
    /// The client's /24 (IPv4) or /48 (IPv6) at issue: a ticket presented
    /// from another network is a new visitor's.
    Network,
}

/// The `Secure` attribute of the ticket cookie.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CookieSecure {
    /// Set on HTTPS requests only.
    #[default]
    Auto,
    Always,
    Never,
}

/// The engine's part of a room, as configured.
///
/// Not `Deserialize` itself: a config file's `[[rooms]]` table is a
/// [`RoomTable`](crate::room_table::RoomTable), which holds these keys beside
/// the node's and builds this with
/// [`RoomTable::limits`](crate::room_table::RoomTable::limits).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoomConfig {
    /// Most visitors allowed on the site at once.
    pub total_active_users: u64,
    /// Most visitors admitted in any one minute.
    pub new_users_per_minute: u64,
    /// Minutes a visitor stays active after their last request.
    pub session_duration: u32,
    /// Count the session from admission instead of from the last request.
    pub disable_session_renewal: bool,
    pub queueing_method: QueueingMethod,
    /// Queue every visitor without a session, whatever the limits say.
    pub queue_all: bool,
    /// Mean seconds between a queued visitor's check-ins.
    pub refresh_interval: u16,
    pub cookie_same_site: CookieSameSite,
    pub cookie_secure: CookieSecure,
    /// Distinct connections one ticket may use per window (0: no limit);
    /// beyond it a request is a new visitor's. At most
    /// [`CONNECTION_SLOTS`](crate::ledger::CONNECTION_SLOTS).
    pub ticket_connection_budget: u16,
    /// The budget's window, seconds.
    pub ticket_connection_window_secs: u16,
    pub ticket_binding: TicketBinding,
}

impl RoomConfig {
    /// A room with these two limits and every other key at its default, as
    /// a table that gives only the limits would say.
    #[must_use]
    pub fn with_limits(total_active_users: u64, new_users_per_minute: u64) -> Self {
        Self {
            total_active_users,
            new_users_per_minute,
            session_duration: DEFAULT_SESSION_MINUTES,
            disable_session_renewal: false,
            queueing_method: QueueingMethod::default(),
            queue_all: false,
            refresh_interval: DEFAULT_REFRESH_SECS,
            cookie_same_site: CookieSameSite::default(),
            cookie_secure: CookieSecure::default(),
            ticket_connection_budget: DEFAULT_TICKET_CONNECTION_BUDGET,
            ticket_connection_window_secs: DEFAULT_TICKET_CONNECTION_WINDOW_SECS,
            ticket_binding: TicketBinding::None,
        }
    }
}

/// Why a [`RoomConfig`] was refused. Each message names the field to fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RoomError {
    #[error("{field} must be at least 1")]
    ZeroLimit { field: &'static str },
    #[error("{field} ({value}) is above the maximum of {max}")]
    LimitTooLarge {
        field: &'static str,
        value: u64,
        max: u64,
    },
    #[error(
        "new_users_per_minute ({new_users_per_minute}) is above total_active_users ({total_active_users})"
    )]
    NewUsersAboveTotal {
        new_users_per_minute: u64,
        total_active_users: u64,
    },
    #[error("session_duration must be at least 1 minute")]
    ZeroSession,
    #[error("session_duration ({minutes} minutes) is above the maximum of {max} minutes")]
    SessionTooLong { minutes: u32, max: u32 },
    #[error("refresh_interval ({seconds} s) must be between {min} and {max} seconds")]
    RefreshIntervalOutOfRange { seconds: u16, min: u16, max: u16 },
    #[error(
        "cookie_same_site = \"none\" needs a Secure cookie, but cookie_secure is \"never\" (browsers would drop the cookie)"
    )]
    SameSiteNoneWithoutSecure,
    #[error("ticket_connection_budget ({budget}) is above the maximum of {max}")]
    ConnectionBudgetTooLarge { budget: u16, max: usize },
    #[error("ticket_connection_window_secs ({seconds}) must be between 1 and {max} seconds")]
    ConnectionWindowOutOfRange { seconds: u16, max: u16 },
}

impl RoomError {
    /// The key of the room table to fix.
    #[must_use]
    pub fn field(&self) -> &'static str {
        match self {
            Self::ZeroLimit { field } | Self::LimitTooLarge { field, .. } => field,
            Self::NewUsersAboveTotal { .. } => "new_users_per_minute",
            Self::ZeroSession | Self::SessionTooLong { .. } => "session_duration",
            Self::RefreshIntervalOutOfRange { .. } => "refresh_interval",
            Self::SameSiteNoneWithoutSecure => "cookie_same_site",
            Self::ConnectionBudgetTooLarge { .. } => "ticket_connection_budget",
            Self::ConnectionWindowOutOfRange { .. } => "ticket_connection_window_secs",
        }
    }
}

impl RoomConfig {
    /// Checks the configuration and returns the room the engine works with.
    ///
    /// The room's id is [`RoomId::default`] until [`Room::named`] sets it.
    pub fn validate(self) -> Result<Room, RoomError> {
        for (field, value) in [
            ("total_active_users", self.total_active_users),
            ("new_users_per_minute", self.new_users_per_minute),
        ] {
            if value == 0 {
                return Err(RoomError::ZeroLimit { field });
            }
            if value > MAX_USERS {
                return Err(RoomError::LimitTooLarge {
                    field,
                    value,
                    max: MAX_USERS,
                });
            }
        }
        if self.new_users_per_minute > self.total_active_users {
            return Err(RoomError::NewUsersAboveTotal {
                new_users_per_minute: self.new_users_per_minute,
                total_active_users: self.total_active_users,
            });
        }
        if self.session_duration == 0 {
            return Err(RoomError::ZeroSession);
        }
        if self.session_duration > MAX_SESSION_MINUTES {
            return Err(RoomError::SessionTooLong {
                minutes: self.session_duration,
                max: MAX_SESSION_MINUTES,
            });
        }
        if !(MIN_REFRESH_SECS..=MAX_REFRESH_SECS).contains(&self.refresh_interval) {
            return Err(RoomError::RefreshIntervalOutOfRange {
                seconds: self.refresh_interval,
                min: MIN_REFRESH_SECS,
                max: MAX_REFRESH_SECS,
            });
        }
        if self.cookie_same_site == CookieSameSite::None
            && self.cookie_secure == CookieSecure::Never
        {
            return Err(RoomError::SameSiteNoneWithoutSecure);
        }
        if usize::from(self.ticket_connection_budget) > crate::ledger::CONNECTION_SLOTS {
            return Err(RoomError::ConnectionBudgetTooLarge {
                budget: self.ticket_connection_budget,
                max: crate::ledger::CONNECTION_SLOTS,
            });
        }
        if !(1..=MAX_TICKET_CONNECTION_WINDOW_SECS).contains(&self.ticket_connection_window_secs) {
            return Err(RoomError::ConnectionWindowOutOfRange {
                seconds: self.ticket_connection_window_secs,
                max: MAX_TICKET_CONNECTION_WINDOW_SECS,
            });
        }
        Ok(Room {
            id: RoomId::default(),
            config: self,
            events: None,
            event: None,
            shuffle: None,
        })
    }
}

/// A validated room. Only [`RoomConfig::validate`] makes one.
///
/// A room with scheduled events is asked for the room as it stands at an
/// instant with [`Room::at`]: the event's overrides applied, the pre-queue
/// as `queue_all`. That room has no events of its own (so making it copies
/// nothing and moves no shared reference count on the request path); it
/// knows the event in force ([`Room::event`]) and the latest shuffle
/// ([`Room::shuffle`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Room {
    id: RoomId,
    config: RoomConfig,
    /// The scheduled events (validated, without overlaps); `None` when the
    /// room has none and in a room made by [`Room::at`].
    events: Option<Arc<[Event]>>,
    /// In a room made by [`Room::at`]: the event in force at that instant.
    event: Option<EventNow>,
    /// In a room made by [`Room::at`]: the shuffle of the latest event that
    /// started with one (its pre-queued tickets keep being placed by it
    /// after the event ended, for those still waiting).
    shuffle: Option<Shuffle>,
}

impl Room {
    /// The same room with its id derived from `name` (see [`RoomId::from_name`]).
    #[must_use]
    pub fn named(self, name: &str) -> Self {
        self.with_id(RoomId::from_name(name))
    }

    /// The same room with an explicit id.
    #[must_use]
    pub fn with_id(mut self, id: RoomId) -> Self {
        self.id = id;
        self
    }

    #[must_use]
    pub fn id(&self) -> RoomId {
        self.id
    }

    /// The configuration this room was validated from.
    #[must_use]
    pub fn config(&self) -> &RoomConfig {
        &self.config
    }

    #[must_use]
    pub fn total_active_users(&self) -> u64 {
        self.config.total_active_users
    }

    #[must_use]
    pub fn new_users_per_minute(&self) -> u64 {
        self.config.new_users_per_minute
    }

    /// Session length in minutes, 1 ..= [`MAX_SESSION_MINUTES`].
    #[must_use]
    pub fn session_minutes(&self) -> u64 {
        u64::from(self.config.session_duration)
    }

    #[must_use]
    pub fn session_renewal(&self) -> bool {
        !self.config.disable_session_renewal
    }

    #[must_use]
    pub fn queueing_method(&self) -> QueueingMethod {
        self.config.queueing_method
    }

    #[must_use]
    pub fn queue_all(&self) -> bool {
        self.config.queue_all
    }

    /// Mean refresh interval in seconds, [`MIN_REFRESH_SECS`] ..= [`MAX_REFRESH_SECS`].
    #[must_use]
    pub fn refresh_interval_secs(&self) -> u16 {
        self.config.refresh_interval
    }

    /// The same room with these scheduled events (see [`validate_events`]
    /// for the rules they have been checked against).
    ///
    /// [`validate_events`]: crate::event::validate_events
    #[must_use]
    pub fn with_events(mut self, events: Vec<Event>) -> Self {
        self.events = (!events.is_empty()).then(|| events.into());
        self
    }

    /// The scheduled events, in the order they were configured.
    #[must_use]
    pub fn events(&self) -> &[Event] {
        self.events.as_deref().unwrap_or(&[])
    }

    /// The room as it stands at `now`: with the overrides of the event in
    /// force (a suspended event is ignored, as in Cloudflare). In the
    /// pre-queue, and while a shuffle at the start settles
    /// ([`Shuffle::settles`]), every visitor without a session waits
    /// (`queue_all`).
    #[must_use]
    pub fn at(&self, now: UnixMillis) -> Self {
        let Some(events) = &self.events else {
            return self.clone();
        };
        let mut room = Self {
            id: self.id,
            config: self.config.clone(),
            events: None,
            event: None,
            shuffle: None,
        };
        let mut latest_shuffle: Option<Shuffle> = None;
        for (index, event) in events.iter().enumerate().filter(|(_, e)| !e.suspended) {
            if let Some(shuffle) = event.shuffle(self.id.0)
                && shuffle.starts <= now
                && latest_shuffle.is_none_or(|s| s.starts < shuffle.starts)
            {
                latest_shuffle = Some(shuffle);
            }
            if event.opens() <= now && now < event.end {
                let phase = if now < event.start {
                    EventPhase::Prequeueing
                } else {
                    EventPhase::Active
                };
                room.config = event.apply(&self.config);
                if phase == EventPhase::Prequeueing {
                    room.hold_everyone();
                }
                room.event = Some(EventNow {
                    index,
                    phase,
                    start: event.start,
                    end: event.end,
                    shuffle_at_event_start: event.shuffle_at_event_start,
                });
            }
        }
        // Right after a shuffled start nobody is admitted until the shuffle
        // has settled: a ticket moves to its drawn bucket only when it next
        // checks in, and until then it is counted in its arrival bucket,
        // where a lower draw cannot be told from a later arrival. Admitting
        // then would let a visitor who checked in first go ahead of one who
        // drew an earlier place but had not checked in yet.
        if let (Some(shuffle), Some(event)) = (latest_shuffle, room.event)
            && event.phase == EventPhase::Active
            && event.start == shuffle.starts
            && now < shuffle.settles(room.config.refresh_interval)
        {
            room.hold_everyone();
        }
        room.shuffle = latest_shuffle;
        room
    }

    /// Every visitor without a session waits (a pre-queue, a settling
    /// shuffle); a method that does not queue (`passthrough`, `reject`)
    /// queues FIFO meanwhile, since a hold admits nobody and turns nobody
    /// away.
    fn hold_everyone(&mut self) {
        self.config.queue_all = true;
        if matches!(
            self.config.queueing_method,
            QueueingMethod::Passthrough | QueueingMethod::Reject
        ) {
            self.config.queueing_method = QueueingMethod::Fifo;
        }
    }

    /// The event in force, in a room made by [`Room::at`].
    #[must_use]
    pub fn event(&self) -> Option<EventNow> {
        self.event
    }

    /// The latest shuffle that applies, in a room made by [`Room::at`].
    #[must_use]
    pub fn shuffle(&self) -> Option<Shuffle> {
        self.shuffle
    }

    /// Changes the queueing method of a running room (an operator's switch);
    /// the counters and tickets stay as they are, which is what keeps
    /// everyone's place across FIFO → random → FIFO.
    #[must_use]
    pub fn with_queueing_method(mut self, method: QueueingMethod) -> Self {
        self.config.queueing_method = method;
        self
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The page's `queueingMethod` is the name the room table takes.
    #[test]
    fn a_queueing_methods_name_is_its_room_table_spelling() {
        for method in [
            QueueingMethod::Fifo,
            QueueingMethod::Random,
            QueueingMethod::Passthrough,
            QueueingMethod::Reject,
        ] {
            let spelled = serde_json::to_string(&method).unwrap();
            assert_eq!(spelled, format!("\"{}\"", method.name()));
        }
    }

    pub(crate) fn config(total: u64, per_minute: u64) -> RoomConfig {
        RoomConfig {
            total_active_users: total,
            new_users_per_minute: per_minute,
            session_duration: 5,
            disable_session_renewal: false,
            queueing_method: QueueingMethod::Fifo,
            queue_all: false,
            refresh_interval: 20,
            cookie_same_site: CookieSameSite::Auto,
            cookie_secure: CookieSecure::Auto,
            ticket_connection_budget: DEFAULT_TICKET_CONNECTION_BUDGET,
            ticket_connection_window_secs: DEFAULT_TICKET_CONNECTION_WINDOW_SECS,
            ticket_binding: TicketBinding::None,
        }
    }

    #[test]
    fn defaults_from_a_minimal_config() {
        let cfg = RoomConfig::with_limits(200, 200);
        assert_eq!(cfg, config(200, 200));
        let room = cfg.validate().unwrap().named("shop");
        assert_eq!(room.refresh_interval_secs(), 20);
        assert_eq!(room.id(), RoomId::from_name("shop"));
        assert_ne!(room.id(), RoomId::from_name("shop2"));
    }

    #[test]
    fn every_error_names_the_key_its_message_starts_with() {
        let refused = [
            config(0, 0),
            config(MAX_USERS + 1, 1),
            config(200, 300),
            RoomConfig {
                session_duration: 0,
                ..config(1, 1)
            },
            RoomConfig {
                refresh_interval: 1,
                ..config(1, 1)
            },
            RoomConfig {
                cookie_same_site: CookieSameSite::None,
                cookie_secure: CookieSecure::Never,
                ..config(1, 1)
            },
        ];
        for cfg in refused {
            let err = cfg.validate().unwrap_err();
            assert!(err.to_string().starts_with(err.field()), "{err:?}");
        }
    }

    #[test]
    fn new_users_above_total_names_both_fields() {
        let err = config(200, 300).validate().unwrap_err();
        assert_eq!(
            err.to_string(),
            "new_users_per_minute (300) is above total_active_users (200)"
        );
    }

    #[test]
    fn zero_session_is_refused() {
        let err = RoomConfig {
            session_duration: 0,
            ..config(200, 200)
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "session_duration must be at least 1 minute"
        );
    }

    #[test]
    fn session_longer_than_the_ring_is_refused() {
        let err = RoomConfig {
            session_duration: 1_441,
            ..config(200, 200)
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            err,
            RoomError::SessionTooLong {
                minutes: 1_441,
                max: 1_440
            }
        );
        assert!(
            err.to_string()
                .starts_with("session_duration (1441 minutes)")
        );
        assert!(
            RoomConfig {
                session_duration: 1_440,
                ..config(200, 200)
            }
            .validate()
            .is_ok()
        );
    }

    #[test]
    fn zero_and_huge_limits_name_the_field() {
        let err = config(0, 0).validate().unwrap_err();
        assert_eq!(err.to_string(), "total_active_users must be at least 1");
        let err = config(10, 0).validate().unwrap_err();
        assert_eq!(err.to_string(), "new_users_per_minute must be at least 1");
        let err = config(MAX_USERS + 1, 1).validate().unwrap_err();
        assert!(err.to_string().starts_with("total_active_users ("), "{err}");
    }

    #[test]
    fn refresh_interval_bounds_name_the_field() {
        for seconds in [0, 4, 91] {
            let err = RoomConfig {
                refresh_interval: seconds,
                ..config(10, 10)
            }
            .validate()
            .unwrap_err();
            assert!(err.to_string().starts_with("refresh_interval ("), "{err}");
        }
        for seconds in [5, 20, 90] {
            assert!(
                RoomConfig {
                    refresh_interval: seconds,
                    ..config(10, 10)
                }
                .validate()
                .is_ok()
            );
        }
    }

    #[test]
    fn same_site_none_needs_secure() {
        let refused = RoomConfig {
            cookie_same_site: CookieSameSite::None,
            cookie_secure: CookieSecure::Never,
            ..config(10, 10)
        };
        let err = refused.clone().validate().unwrap_err();
        assert_eq!(err, RoomError::SameSiteNoneWithoutSecure);
        assert!(
            err.to_string().contains("cookie_same_site")
                && err.to_string().contains("cookie_secure")
        );
        for secure in [CookieSecure::Auto, CookieSecure::Always] {
            assert!(
                RoomConfig {
                    cookie_secure: secure,
                    ..refused.clone()
                }
                .validate()
                .is_ok()
            );
        }
    }
}
