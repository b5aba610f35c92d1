//! Scheduled events: a window in which a room runs with other settings, as
//! Cloudflare Waiting Room defines them (field names and rules are theirs;
//! the differences are listed in docs/OPERATIONS.md, "Scheduled events").
//!
//! An event is one `[[rooms.events]]` table ([`EventTable`]), a plain serde
//! value of the room's settings, so it travels wherever the room table does
//! (the aggregator's push, the control API). [`validate_events`] turns the
//! tables into [`Event`]s with the times parsed, checking Cloudflare's rules:
//! the end at least one minute after the start, the pre-queue at least five
//! minutes before it, a shuffle only with a pre-queue, a per-event
//! `new_users_per_minute` only beside a per-event `total_active_users`, no two
//! events of a room overlapping, and the room with the event's overrides
//! still a valid room.
//!
//! The engine asks [`Room::at`](crate::room::Room::at) for the room as it
//! stands at `now`; this module only says which event is in force and how a
//! pre-queued ticket is placed at the start ([`Shuffle`]).
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::room::{QueueingMethod, RoomConfig, RoomError};
use crate::time::{MILLIS_PER_MINUTE, Minute, UnixMillis};

/// The shortest event, from Cloudflare: the start at least one minute before the end.
pub const MIN_EVENT_MILLIS: u64 = MILLIS_PER_MINUTE;

/// The shortest pre-queue, from Cloudflare: at least five minutes before the start.
pub const MIN_PREQUEUE_MILLIS: u64 = 5 * MILLIS_PER_MINUTE;

/// One `[[rooms.events]]` table. Every override left out inherits the room's
/// value, as in Cloudflare.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EventTable {
    /// Unique within the room; letters, digits, `-` and `_` (Cloudflare's rule).
    pub name: String,
    /// A note for operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// RFC 3339 with a zone: from here every visitor without a session is
    /// queued with the pre-queue page until the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prequeue_start_time: Option<String>,
    /// RFC 3339 with a zone: the overrides apply from here.
    pub event_start_time: String,
    /// RFC 3339 with a zone: the room's own settings apply again from here.
    pub event_end_time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_active_users: Option<u64>,
    /// Only beside `total_active_users` (Cloudflare's rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_users_per_minute: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queueing_method: Option<QueueingMethod>,
    /// Minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_duration: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_session_renewal: Option<bool>,
    /// Mustache template file for the queue page during the pre-queue and
    /// the event (Cloudflare's `custom_page_html`, as a file like the room's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_page: Option<PathBuf>,
    /// Give the pre-queued visitors a random order at the start; needs
    /// `prequeue_start_time`.
    #[serde(default)]
    pub shuffle_at_event_start: bool,
    /// Cloudflare's meaning: the event is ignored (the room runs with its
    /// own settings), not the room turned off.
    #[serde(default)]
    pub suspended: bool,
}

/// A validated event, times in unix milliseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub name: String,
    pub prequeue_start: Option<UnixMillis>,
    pub start: UnixMillis,
    pub end: UnixMillis,
    pub total_active_users: Option<u64>,
    pub new_users_per_minute: Option<u64>,
    pub queueing_method: Option<QueueingMethod>,
    pub session_duration: Option<u32>,
    pub disable_session_renewal: Option<bool>,
    pub queue_page: Option<PathBuf>,
    pub shuffle_at_event_start: bool,
    pub suspended: bool,
}

impl Event {
    /// Where the event's window opens: the pre-queue, or the start.
    #[must_use]
    pub fn opens(&self) -> UnixMillis {
        self.prequeue_start.unwrap_or(self.start)
    }

    /// The room's settings with this event's overrides.
    #[must_use]
    pub fn apply(&self, room: &RoomConfig) -> RoomConfig {
        RoomConfig {
            total_active_users: self.total_active_users.unwrap_or(room.total_active_users),
            new_users_per_minute: self
                .new_users_per_minute
                .unwrap_or(room.new_users_per_minute),
            session_duration: self.session_duration.unwrap_or(room.session_duration),
            disable_session_renewal: self
                .disable_session_renewal
                .unwrap_or(room.disable_session_renewal),
            queueing_method: self.queueing_method.unwrap_or(room.queueing_method),
            ..room.clone()
        }
    }

    /// The shuffle this event makes at its start, if it makes one.
    #[must_use]
    pub fn shuffle(&self, room_seed: u64) -> Option<Shuffle> {
        let prequeue = self
            .prequeue_start
            .filter(|_| self.shuffle_at_event_start)?;
        let mut seed = room_seed ^ 0x9e37_79b9_7f4a_7c15;
        for byte in self.name.bytes() {
            seed = (seed ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        Some(Shuffle {
            from: prequeue.minute(),
            to: self.start.minute(),
            starts: self.start,
            seed: fmix64(seed ^ self.start.0),
        })
    }
}

/// Which part of an event is in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventPhase {
    /// Before the start: everyone without a session waits, nobody is
    /// admitted, the page says the event has not started (Cloudflare's
    /// status `event_prequeueing`).
    Prequeueing,
    /// Between start and end: the overrides apply.
    Active,
}

/// The event in force at some instant, as the engine and the pages need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventNow {
    /// Position of the event in the room's `events`.
    pub index: usize,
    pub phase: EventPhase,
    pub start: UnixMillis,
    pub end: UnixMillis,
    pub shuffle_at_event_start: bool,
}

/// How a pre-queued ticket is placed when its event starts.
///
/// The pre-queue's visitors hold FIFO buckets in `from..to` (their arrival
/// minutes). From the start a ticket with such a bucket is moved to the
/// bucket `from + h(id, seed) mod (to - from)`: a position drawn from the
/// ticket's id (chosen at random when the ticket was issued, sealed in the
/// cookie) and the event's seed (from the room, the event's name and start).
/// Every node computes the same bucket for the same ticket without talking to
/// the others, the move is idempotent (a ticket already moved is moved to
/// where it is), and a replayed or copied cookie carries the same id, so the
/// same place. Arrival within the pre-queue decides nothing; visitors after
/// the start queue behind, FIFO, in buckets from `to` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shuffle {
    /// First minute of the pre-queue.
    pub from: Minute,
    /// Minute of the start; pre-queue tickets of this minute are issued
    /// into `to - 1` so that they are shuffled too.
    pub to: Minute,
    /// When the shuffle applies.
    pub starts: UnixMillis,
    pub seed: u64,
}

/// What the gossip between nodes may still owe a node when a shuffle's
/// hold ends: a ticket moved on another node is seen here only once that
/// node has reported and the aggregator answered (about a second each).
pub const SHUFFLE_GOSSIP_ALLOWANCE_MS: u64 = 3_000;

impl Shuffle {
    /// When the start's hold ends: every pre-queued visitor who keeps
    /// checking in has done so once after the start (the longest jittered
    /// refresh interval, see [`jittered_interval`]), and the other nodes'
    /// moves have arrived ([`SHUFFLE_GOSSIP_ALLOWANCE_MS`]). Until then
    /// nobody is admitted (see [`Room::at`]); a visitor who stopped checking
    /// in (a tab in the background) still counts in their arrival bucket
    /// until they come back.
    ///
    /// [`jittered_interval`]: crate::engine::jittered_interval
    /// [`Room::at`]: crate::room::Room::at
    #[must_use]
    pub fn settles(&self, refresh_interval_secs: u16) -> UnixMillis {
        let longest = crate::engine::longest_interval(refresh_interval_secs);
        self.starts
            .plus_millis(u64::from(longest) * 1_000 + SHUFFLE_GOSSIP_ALLOWANCE_MS)
    }

    /// The bucket of a ticket of `bucket` and `id` once the event started;
    /// `None` for a ticket that was not pre-queued.
    #[must_use]
    pub fn bucket(&self, bucket: Minute, id: u64) -> Option<Minute> {
        let span = self.to.0.checked_sub(self.from.0).filter(|&s| s > 0)?;
        (self.from..self.to)
            .contains(&bucket)
            .then(|| self.from.plus(fmix64(id ^ self.seed) % span))
    }
}

/// MurmurHash3's 64-bit finaliser: every bit of the input moves every bit of
/// the output, so ids that differ in one bit land in unrelated buckets.
const fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

/// Why an event table was refused; [`field`](Self::field) names the key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("{name:?}: only letters, digits, '-' and '_' are allowed, and it must not be empty")]
    BadName { name: String },
    #[error("duplicate event name {name:?} (also events[{first}])")]
    DuplicateName { name: String, first: usize },
    #[error(
        "{field} {value:?} is not an RFC 3339 time with a zone (like 2026-11-27T09:00:00Z or 2026-11-27T10:00:00+01:00): {why}"
    )]
    BadTime {
        field: &'static str,
        value: String,
        why: TimeError,
    },
    #[error("event_end_time ({end}) must be at least one minute after event_start_time ({start})")]
    EndNotAfterStart { start: String, end: String },
    #[error(
        "prequeue_start_time ({prequeue}) must be at least five minutes before event_start_time ({start})"
    )]
    PrequeueTooLate { prequeue: String, start: String },
    #[error(
        "shuffle_at_event_start needs a prequeue_start_time: only pre-queued visitors are shuffled"
    )]
    ShuffleWithoutPrequeue,
    #[error("new_users_per_minute can only be set beside total_active_users in an event")]
    NewUsersWithoutTotal,
    #[error(
        "the event overlaps event {other:?} (events[{other_index}]): events of a room must not overlap, pre-queue included"
    )]
    Overlaps { other: String, other_index: usize },
    #[error("with the event's overrides: {0}")]
    Settings(RoomError),
}

impl EventError {
    /// The key of the event table to fix.
    #[must_use]
    pub fn field(&self) -> &'static str {
        match self {
            Self::BadName { .. } | Self::DuplicateName { .. } => "name",
            Self::BadTime { field, .. } => field,
            Self::EndNotAfterStart { .. } => "event_end_time",
            Self::PrequeueTooLate { .. } => "prequeue_start_time",
            Self::ShuffleWithoutPrequeue => "shuffle_at_event_start",
            Self::NewUsersWithoutTotal => "new_users_per_minute",
            Self::Overlaps { .. } => "event_start_time",
            Self::Settings(e) => e.field(),
        }
    }
}

/// A refused event among a room's: which one and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {problem}", self.key())]
pub struct EventsError {
    pub index: usize,
    pub problem: EventError,
}

impl EventsError {
    /// `events[1].event_end_time`.
    #[must_use]
    pub fn key(&self) -> String {
        format!("events[{}].{}", self.index, self.problem.field())
    }
}

/// Checks a room's events against Cloudflare's rules and `room` (the room's
/// own settings, which the overrides must leave valid).
pub fn validate_events(
    tables: &[EventTable],
    room: &RoomConfig,
) -> Result<Vec<Event>, EventsError> {
    let mut events: Vec<Event> = Vec::with_capacity(tables.len());
    for (index, table) in tables.iter().enumerate() {
        let refused = |problem| EventsError { index, problem };
        let event = table.validate(room).map_err(refused)?;
        if let Some(first) = events.iter().position(|e| e.name == event.name) {
            return Err(refused(EventError::DuplicateName {
                name: event.name,
                first,
            }));
        }
        if let Some(other_index) = events
            .iter()
            .position(|e| e.opens() < event.end && event.opens() < e.end)
        {
            return Err(refused(EventError::Overlaps {
                other: events[other_index].name.clone(),
                other_index,
            }));
        }
        events.push(event);
    }
    Ok(events)
}

impl EventTable {
    /// The event with its times parsed, if it keeps every rule on its own.
    pub fn validate(&self, room: &RoomConfig) -> Result<Event, EventError> {
        if self.name.is_empty()
            || !self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(EventError::BadName {
                name: self.name.clone(),
            });
        }
        let time = |field: &'static str, value: &str| {
            parse_rfc3339(value).map_err(|why| EventError::BadTime {
                field,
                value: value.to_owned(),
                why,
            })
        };
        let prequeue_start = self
            .prequeue_start_time
            .as_deref()
            .map(|v| time("prequeue_start_time", v))
            .transpose()?;
        let start = time("event_start_time", &self.event_start_time)?;
        let end = time("event_end_time", &self.event_end_time)?;
        if end.0 < start.0.saturating_add(MIN_EVENT_MILLIS) {
            return Err(EventError::EndNotAfterStart {
                start: self.event_start_time.clone(),
                end: self.event_end_time.clone(),
            });
        }
        if let Some(prequeue) = prequeue_start
            && prequeue.0.saturating_add(MIN_PREQUEUE_MILLIS) > start.0
        {
            return Err(EventError::PrequeueTooLate {
                prequeue: self.prequeue_start_time.clone().unwrap_or_default(),
                start: self.event_start_time.clone(),
            });
        }
        if self.shuffle_at_event_start && prequeue_start.is_none() {
            return Err(EventError::ShuffleWithoutPrequeue);
        }
        if self.new_users_per_minute.is_some() && self.total_active_users.is_none() {
            return Err(EventError::NewUsersWithoutTotal);
        }
        let event = Event {
            name: self.name.clone(),
            prequeue_start,
            start,
            end,
            total_active_users: self.total_active_users,
            new_users_per_minute: self.new_users_per_minute,
            queueing_method: self.queueing_method,
            session_duration: self.session_duration,
            disable_session_renewal: self.disable_session_renewal,
            queue_page: self.queue_page.clone(),
            shuffle_at_event_start: self.shuffle_at_event_start,
            suspended: self.suspended,
        };
        event.apply(room).validate().map_err(EventError::Settings)?;
        Ok(event)
    }
}

/// Why a time did not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    #[error("no zone: add Z (UTC) or an offset like +01:00")]
    NoZone,
    #[error("not of the form YYYY-MM-DDTHH:MM:SS")]
    Shape,
    #[error("a field is out of range")]
    Range,
    #[error("before 1970")]
    BeforeEpoch,
}

/// Parses an RFC 3339 time (`2026-11-27T09:00:00Z`, `…T10:00:00.5+01:00`;
/// a space for the `T` and a lower-case `t`/`z` are accepted, as RFC 3339
/// allows). A time without a zone is refused: on a launch day "09:00" in
/// whose time is the mistake this check is for.
pub fn parse_rfc3339(text: &str) -> Result<UnixMillis, TimeError> {
    let b = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Result<u64, TimeError> {
        let part = b.get(range).ok_or(TimeError::Shape)?;
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return Err(TimeError::Shape);
        }
        Ok(part.iter().fold(0, |n, &d| n * 10 + u64::from(d - b'0')))
    };
    if b.len() < 19
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(TimeError::Shape);
    }
    let (year, month, day) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    let (hour, minute, second) = (digits(11..13)?, digits(14..16)?, digits(17..19)?);
    let mut rest = &b[19..];
    let mut millis = 0;
    if let Some((b'.', frac)) = rest.split_first() {
        let n = frac.iter().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 {
            return Err(TimeError::Shape);
        }
        millis = frac[..n.min(3)]
            .iter()
            .chain(std::iter::repeat_n(&b'0', 3 - n.min(3)))
            .fold(0, |m, &d| m * 10 + u64::from(d - b'0'));
        rest = &frac[n..];
    }
    let offset_secs: i64 = match rest {
        [] => return Err(TimeError::NoZone),
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let two = |a: u8, c: u8| -> Result<i64, TimeError> {
                if a.is_ascii_digit() && c.is_ascii_digit() {
                    Ok(i64::from(a - b'0') * 10 + i64::from(c - b'0'))
                } else {
                    Err(TimeError::Shape)
                }
            };
            let (h, m) = (two(*h1, *h2)?, two(*m1, *m2)?);
            if h > 23 || m > 59 {
                return Err(TimeError::Range);
            }
            let secs = h * 3_600 + m * 60;
            if *sign == b'+' { secs } else { -secs }
        }
        _ => return Err(TimeError::Shape),
    };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&month)
        || day == 0
        || day > month_days[(month - 1) as usize]
        || hour > 23
        || minute > 59
        || second > 60
    {
        return Err(TimeError::Range);
    }
    let days = days_from_civil(year as i64, month as i64, day as i64);
    let secs = days * 86_400 + (hour * 3_600 + minute * 60 + second.min(59)) as i64 - offset_secs;
    let secs = u64::try_from(secs).map_err(|_| TimeError::BeforeEpoch)?;
    Ok(UnixMillis(secs * 1_000 + millis))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Days since 1970-01-01 to (year, month, day) in the civil calendar
/// (Howard Hinnant's days-to-civil; the inverse of `days_from_civil`).
#[must_use]
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `2026-11-27T09:00:00Z` (UTC, whole seconds): how times are shown back.
#[must_use]
pub fn format_rfc3339(t: UnixMillis) -> String {
    let secs = t.0 / 1_000;
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    let (h, min, s) = (rem / 3_600, (rem % 3_600) / 60, rem % 60);
    let year = match u64::try_from(y) {
        Ok(year) if year <= 9_999 => year,
        _ => return format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}Z"),
    };
    // Digits by hand: `format!` with padded fields cost about 2,700
    // instructions, a tenth of a queue page's whole answer (it is on every
    // one, as `lastUpdated`).
    let mut out = *b"0000-00-00T00:00:00Z";
    for (at, width, v) in [
        (0, 4, year),
        (5, 2, u64::from(m)),
        (8, 2, u64::from(d)),
        (11, 2, h),
        (14, 2, min),
        (17, 2, s),
    ] {
        crate::time::put_digits(&mut out[at..at + width], v);
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::room::RoomId;
    use crate::room_table::RoomTable;
    use crate::time::tests::at;

    /// A room of 100 / 50 with `events` (TOML `[[events]]` tables).
    fn table(events: &str) -> RoomTable {
        toml::from_str(&format!(
            "id = \"shop\"\ntotal_active_users = 100\nnew_users_per_minute = 50\n{events}"
        ))
        .unwrap()
    }

    fn refused(events: &str) -> (String, String) {
        let err = table(events).validate().unwrap_err();
        (err.field(), err.to_string())
    }

    const SALE: &str = r#"
[[events]]
name = "sale"
prequeue_start_time = "2021-05-27T09:50:00Z"
event_start_time = "2021-05-27T10:00:00Z"
event_end_time = "2021-05-27T11:00:00Z"
total_active_users = 400
new_users_per_minute = 200
queueing_method = "fifo"
session_duration = 10
shuffle_at_event_start = true
"#;

    #[test]
    fn an_event_is_read_with_its_times_and_overrides() {
        let room = table(SALE).validate().unwrap();
        let [event] = room.events() else {
            panic!("{:?}", room.events())
        };
        assert_eq!(event.prequeue_start, Some(at(9, 50, 0)));
        assert_eq!((event.start, event.end), (at(10, 0, 0), at(11, 0, 0)));
        let during = event.apply(room.config());
        assert_eq!(
            (during.total_active_users, during.new_users_per_minute),
            (400, 200)
        );
        assert_eq!(during.session_duration, 10);
        assert_eq!(during.refresh_interval, 20, "inherited");
    }

    #[test]
    fn times_with_an_offset_are_the_same_instant() {
        assert_eq!(parse_rfc3339("2021-05-27T12:00:00+02:00"), Ok(at(10, 0, 0)));
        assert_eq!(
            parse_rfc3339("2021-05-27T09:30:00.250-00:30"),
            Ok(at(10, 0, 0).plus_millis(250))
        );
        assert_eq!(parse_rfc3339("2021-05-27t10:00:00z"), Ok(at(10, 0, 0)));
        assert_eq!(
            format_rfc3339(parse_rfc3339("2024-02-29T23:59:59Z").unwrap()),
            "2024-02-29T23:59:59Z"
        );
        for bad in [
            "2021-05-27 10:00",
            "27/05/2021 10:00:00Z",
            "2021-02-29T10:00:00Z",
            "2021-05-27T24:00:00Z",
            "2021-05-27T10:00:00+1",
            "",
        ] {
            assert!(parse_rfc3339(bad).is_err(), "{bad}");
        }
    }

    /// The digits written by hand say what `format!` says of the same date,
    /// from the epoch past year 9999 (where `format!` takes over), and parse
    /// back; the date itself is checked against known instants and by
    /// parsing back (`days_from_civil`, written apart).
    #[test]
    fn formatted_times_match_format_and_parse_back() {
        let reference = |t: UnixMillis| {
            let secs = t.0 / 1_000;
            let (y, m, d) = civil_from_days((secs / 86_400) as i64);
            let rem = secs % 86_400;
            format!(
                "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
                rem / 3_600,
                (rem % 3_600) / 60,
                rem % 60
            )
        };
        // Every 0.97 days or so (an odd step, to visit every hour and
        // minute) from 1970 to past 10000.
        let mut t = 0_u64;
        let mut seen = 0;
        while t < 260_000_000_000_000 {
            let at = UnixMillis(t);
            let text = format_rfc3339(at);
            assert_eq!(text, reference(at), "{t}");
            if text.len() == 20 {
                assert_eq!(parse_rfc3339(&text), Ok(UnixMillis(t / 1_000 * 1_000)));
            }
            seen += 1;
            t += 83_941_237_019;
        }
        assert!(seen > 3_000);
        for (t, text) in [
            (0, "1970-01-01T00:00:00Z"),
            (1_596_498_360_000, "2020-08-03T23:46:00Z"),
            (1_709_210_096_999, "2024-02-29T12:34:56Z"),
            (253_402_300_799_999, "9999-12-31T23:59:59Z"),
            (253_402_300_800_000, "10000-01-01T00:00:00Z"),
        ] {
            assert_eq!(format_rfc3339(UnixMillis(t)), text, "{t}");
        }
    }

    /// What a tired operator writes at 3 a.m. before a launch, and what
    /// they are told.
    #[test]
    fn a_tired_operators_mistakes_name_the_field() {
        let one = |name: &str, prequeue: &str, start: &str, end: &str, extra: &str| {
            let prequeue = if prequeue.is_empty() {
                String::new()
            } else {
                format!("prequeue_start_time = \"{prequeue}\"\n")
            };
            format!(
                "[[events]]\nname = \"{name}\"\n{prequeue}event_start_time = \"{start}\"\nevent_end_time = \"{end}\"\n{extra}"
            )
        };
        let ok = one("a", "", "2021-05-27T10:00:00Z", "2021-05-27T11:00:00Z", "");
        assert!(table(&ok).validate().is_ok());

        // The end before the start (AM/PM mixed up).
        let (field, message) = refused(&one(
            "a",
            "",
            "2021-05-27T10:00:00Z",
            "2021-05-27T09:00:00Z",
            "",
        ));
        assert_eq!(field, "events[0].event_end_time");
        assert!(message.contains("at least one minute after"), "{message}");
        // Less than a minute long.
        let (field, _) = refused(&one(
            "a",
            "",
            "2021-05-27T10:00:00Z",
            "2021-05-27T10:00:30Z",
            "",
        ));
        assert_eq!(field, "events[0].event_end_time");

        // The pre-queue one minute before the start.
        let (field, message) = refused(&one(
            "a",
            "2021-05-27T09:59:00Z",
            "2021-05-27T10:00:00Z",
            "2021-05-27T11:00:00Z",
            "",
        ));
        assert_eq!(field, "events[0].prequeue_start_time");
        assert!(message.contains("at least five minutes"), "{message}");
        // Exactly five minutes is enough.
        assert!(
            table(&one(
                "a",
                "2021-05-27T09:55:00Z",
                "2021-05-27T10:00:00Z",
                "2021-05-27T11:00:00Z",
                ""
            ))
            .validate()
            .is_ok()
        );

        // Times without a zone.
        let (field, message) = refused(&one(
            "a",
            "",
            "2021-05-27T10:00:00",
            "2021-05-27T11:00:00Z",
            "",
        ));
        assert_eq!(field, "events[0].event_start_time");
        assert!(message.contains("no zone"), "{message}");
        let (field, _) = refused(&one(
            "a",
            "2021-05-27T09:00:00",
            "2021-05-27T10:00:00Z",
            "2021-05-27T11:00:00Z",
            "",
        ));
        assert_eq!(field, "events[0].prequeue_start_time");

        // Overlapping events: the second's pre-queue opens before the first ends.
        let second = one(
            "b",
            "2021-05-27T10:55:00Z",
            "2021-05-27T11:30:00Z",
            "2021-05-27T12:00:00Z",
            "",
        );
        let (field, message) = refused(&format!("{ok}{second}"));
        assert_eq!(field, "events[1].event_start_time");
        assert!(message.contains("overlaps event \"a\""), "{message}");
        // Back to back is fine.
        let after = one("b", "", "2021-05-27T11:00:00Z", "2021-05-27T12:00:00Z", "");
        assert!(table(&format!("{ok}{after}")).validate().is_ok());

        // Shuffle without a pre-queue.
        let (field, _) = refused(&one(
            "a",
            "",
            "2021-05-27T10:00:00Z",
            "2021-05-27T11:00:00Z",
            "shuffle_at_event_start = true\n",
        ));
        assert_eq!(field, "events[0].shuffle_at_event_start");

        // A rate without a total (Cloudflare's rule), and overrides that make
        // an invalid room.
        let (field, _) = refused(&one(
            "a",
            "",
            "2021-05-27T10:00:00Z",
            "2021-05-27T11:00:00Z",
            "new_users_per_minute = 10\n",
        ));
        assert_eq!(field, "events[0].new_users_per_minute");
        let (field, message) = refused(&one(
            "a",
            "",
            "2021-05-27T10:00:00Z",
            "2021-05-27T11:00:00Z",
            "total_active_users = 20\n",
        ));
        assert_eq!(field, "events[0].new_users_per_minute");
        assert!(
            message.contains("above total_active_users (20)"),
            "{message}"
        );
        let (field, _) = refused(&one(
            "a",
            "",
            "2021-05-27T10:00:00Z",
            "2021-05-27T11:00:00Z",
            "session_duration = 0\n",
        ));
        assert_eq!(field, "events[0].session_duration");

        // Names: Cloudflare's alphabet, unique.
        let (field, _) = refused(&one(
            "big sale!",
            "",
            "2021-05-27T10:00:00Z",
            "2021-05-27T11:00:00Z",
            "",
        ));
        assert_eq!(field, "events[0].name");
        let again = one("a", "", "2021-05-27T12:00:00Z", "2021-05-27T13:00:00Z", "");
        let (field, _) = refused(&format!("{ok}{again}"));
        assert_eq!(field, "events[1].name");

        // A misspelt key is refused by the parser.
        let err = toml::from_str::<RoomTable>(&format!(
            "id = \"shop\"\ntotal_active_users = 1\nnew_users_per_minute = 1\n{}",
            one(
                "a",
                "",
                "2021-05-27T10:00:00Z",
                "2021-05-27T11:00:00Z",
                "shuffle = true\n"
            )
        ))
        .unwrap_err();
        assert!(err.message().contains("unknown field `shuffle`"), "{err}");
    }

    #[test]
    fn the_room_at_an_instant_follows_the_event() {
        let room = table(SALE).validate().unwrap();
        let before = room.at(at(9, 49, 59));
        assert_eq!(before.event(), None);
        assert_eq!(before.total_active_users(), 100);
        assert!(!before.queue_all());

        let prequeue = room.at(at(9, 50, 0));
        let event = prequeue.event().unwrap();
        assert_eq!(event.phase, EventPhase::Prequeueing);
        assert!(prequeue.queue_all(), "everyone waits in the pre-queue");
        assert_eq!(prequeue.shuffle(), None, "no shuffle before the start");

        // The start: the event's limits, but nobody is admitted until the
        // shuffle has settled (every visitor checked in once since).
        let start = room.at(at(10, 0, 0));
        assert_eq!(start.event().unwrap().phase, EventPhase::Active);
        assert!(start.queue_all(), "the shuffle settles first");
        let settles = start
            .shuffle()
            .unwrap()
            .settles(room.refresh_interval_secs());
        assert_eq!(
            settles,
            at(10, 0, 0).plus_millis(
                u64::from(crate::engine::longest_interval(
                    room.refresh_interval_secs()
                )) * 1_000
                    + SHUFFLE_GOSSIP_ALLOWANCE_MS
            )
        );
        assert!(
            room.at(UnixMillis(settles.0 - 1)).queue_all(),
            "held to the end"
        );
        let during = room.at(settles);
        assert_eq!(during.event().unwrap().phase, EventPhase::Active);
        assert!(!during.queue_all());
        assert_eq!(
            (during.total_active_users(), during.new_users_per_minute()),
            (400, 200)
        );
        assert_eq!(during.session_minutes(), 10);
        let shuffle = during.shuffle().unwrap();
        assert_eq!(
            (shuffle.from, shuffle.to),
            (at(9, 50, 0).minute(), at(10, 0, 0).minute())
        );

        let after = room.at(at(11, 0, 0));
        assert_eq!(after.event(), None);
        assert_eq!(after.total_active_users(), 100);
        assert_eq!(after.session_minutes(), 5);
        assert_eq!(after.shuffle(), Some(shuffle), "stragglers still placed");
    }

    #[test]
    fn only_a_shuffled_start_is_held() {
        let plain = SALE.replace("shuffle_at_event_start = true\n", "");
        let room = table(&plain).validate().unwrap();
        let start = room.at(at(10, 0, 0));
        assert_eq!(start.event().unwrap().phase, EventPhase::Active);
        assert!(!start.queue_all(), "nothing to settle without a shuffle");

        // A passthrough room holds its shuffled start too, FIFO meanwhile.
        let pass = table(&SALE.replace("\"fifo\"", "\"passthrough\""))
            .validate()
            .unwrap();
        let start = pass.at(at(10, 0, 0));
        assert!(start.queue_all());
        assert_eq!(start.queueing_method(), QueueingMethod::Fifo);
        let later = pass.at(at(10, 1, 0));
        assert!(!later.queue_all());
        assert_eq!(later.queueing_method(), QueueingMethod::Passthrough);
    }

    #[test]
    fn a_suspended_event_is_ignored() {
        let room = table(&format!("{SALE}suspended = true\n"))
            .validate()
            .unwrap();
        for t in [at(9, 55, 0), at(10, 30, 0)] {
            let now = room.at(t);
            assert_eq!(now.event(), None);
            assert!(!now.queue_all());
            assert_eq!(now.total_active_users(), 100);
            assert_eq!(now.shuffle(), None);
        }
    }

    #[test]
    fn the_shuffle_spreads_prequeue_tickets_and_keeps_everyone_else() {
        let shuffle = Event {
            name: "sale".into(),
            prequeue_start: Some(at(9, 50, 0)),
            start: at(10, 0, 0),
            end: at(11, 0, 0),
            total_active_users: None,
            new_users_per_minute: None,
            queueing_method: None,
            session_duration: None,
            disable_session_renewal: None,
            queue_page: None,
            shuffle_at_event_start: true,
            suspended: false,
        }
        .shuffle(RoomId::from_name("shop").0)
        .unwrap();
        let (from, to) = (at(9, 50, 0).minute(), at(10, 0, 0).minute());
        // Everyone arrived in the first pre-queue minute: spread over all ten.
        let mut seen = [0_u32; 10];
        for id in 1..=1_000_u64 {
            let b = shuffle.bucket(from, id).unwrap();
            assert!(b >= from && b < to);
            assert_eq!(shuffle.bucket(b, id), Some(b), "idempotent");
            seen[(b.0 - from.0) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| (60..=140).contains(&n)), "{seen:?}");
        // The bucket depends on the id only, not on the arrival minute.
        assert_eq!(shuffle.bucket(from, 77), shuffle.bucket(from.plus(9), 77));
        // Not pre-queued: untouched.
        assert_eq!(shuffle.bucket(to, 77), None);
        assert_eq!(shuffle.bucket(from.minus(1), 77), None);
    }
}
