//! The ticket: what a visitor's encrypted cookie carries between requests.
//!
//! Besides the seeds' `bucketId`, `acceptedAt`, `lastCheckInTime` and
//! `refreshIntervalSeconds`, a ticket remembers where the visitor is counted
//! in the node counters (the session-expiry slot, or the waiting check-in
//! minute), so that the next check-in moves the count from the old slot to
//! the new one in O(1), on whichever node it lands.
//!
//! Since version 2 a ticket has a random id: the
//! [ticket ledger](crate::ledger) remembers by it where the ticket is counted
//! now, so a replayed cookie's claim moves nothing twice; and an optional
//! network binding (`ticket_binding = "network"`).
//!
//! Version 3 counts a session at its expiry slot (a second,
//! [`ExpirySlot`]) instead of its minute. A ticket of version 2 is still
//! honoured ([`Ticket::upgraded`]): its expiry minute becomes the last slot
//! of that minute, so its session lasts exactly as long as before and no
//! admitted visitor is sent back to the queue by an upgrade. Its claims of
//! where it is counted point into counters of the old layout, which an
//! upgraded node has set aside: they are not believed (the visitor is counted
//! afresh where the engine moves them next).
//!
//! Field names are one letter on the wire because the ticket becomes a cookie.
//! No field is skipped when serialising, so non-self-describing formats
//! (postcard, bincode) work as well as JSON.

use serde::{Deserialize, Serialize};

use crate::room::RoomId;
use crate::time::{ExpirySlot, Minute, UnixMillis};

/// Version of the ticket format; a ticket of another version (but
/// [`TICKET_VERSION_MINUTES`]) is treated as no ticket at all (a new
/// visitor), never as an error.
pub const TICKET_VERSION: u8 = 3;

/// The format before [`TICKET_VERSION`]: the same fields, but
/// `counted_expiry` is a unix minute. Read, converted, never written.
pub const TICKET_VERSION_MINUTES: u8 = 2;

/// A visitor's ticket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ticket {
    /// [`TICKET_VERSION`] when it was issued.
    #[serde(rename = "v")]
    pub version: u8,
    /// The room that issued it; another room ignores it.
    #[serde(rename = "r")]
    pub room: RoomId,
    /// Arrival minute: the visitor's place in a FIFO queue, kept in every
    /// queueing method so switching back to FIFO keeps everyone's order.
    #[serde(rename = "b")]
    pub bucket: Minute,
    /// When the visitor was admitted, if they were.
    #[serde(rename = "a")]
    pub accepted_at: Option<UnixMillis>,
    /// Last request that counted: a check-in while queued (not one refused as
    /// too early), or a request while admitted.
    #[serde(rename = "c")]
    pub last_check_in: UnixMillis,
    /// Seconds this visitor must wait before the next check-in counts; each
    /// is jittered around the room's mean so check-ins drift apart.
    #[serde(rename = "i")]
    pub refresh_interval_secs: u16,
    /// Session-expiry slot at which this admitted visitor is counted (a
    /// minute in tickets of [`TICKET_VERSION_MINUTES`]).
    #[serde(rename = "e")]
    pub counted_expiry: Option<ExpirySlot>,
    /// Check-in minute at which this queued visitor is counted as waiting in
    /// its bucket.
    #[serde(rename = "w")]
    pub counted_waiting: Option<Minute>,
    /// Random, non-zero, drawn at issue ([`crate::ledger::ticket_id`]): the
    /// ticket ledger's key. 0 only in tickets made by hand (tests): the
    /// engine gives such a ticket an id and believes its claim, as it does
    /// for any ticket its ledger does not know.
    #[serde(rename = "t")]
    pub id: u64,
    /// Keyed hash of the client's network at issue when the room binds
    /// tickets to it (`ticket_binding = "network"`); 0: not bound.
    #[serde(rename = "n")]
    pub network: u32,
}

impl Ticket {
    /// The ticket of a visitor seen for the first time at `now`: bucket is the
    /// current minute, not admitted, counted nowhere yet.
    #[must_use]
    pub fn new_visitor(room: RoomId, now: UnixMillis, refresh_interval_secs: u16) -> Self {
        Self {
            version: TICKET_VERSION,
            room,
            bucket: now.minute(),
            accepted_at: None,
            last_check_in: now,
            refresh_interval_secs,
            counted_expiry: None,
            counted_waiting: None,
            id: 0,
            network: 0,
        }
    }

    /// This ticket in the current format, and whether its claims of where it
    /// is counted hold (see the module docs); `None` for a format this build
    /// cannot read.
    #[must_use]
    pub fn upgraded(self) -> Option<(Self, bool)> {
        match self.version {
            TICKET_VERSION => Some((self, true)),
            TICKET_VERSION_MINUTES => Some((
                Self {
                    version: TICKET_VERSION,
                    counted_expiry: self
                        .counted_expiry
                        .map(|minute| ExpirySlot::end_of_minute(Minute(minute.0))),
                    ..self
                },
                false,
            )),
            _ => None,
        }
    }

    /// Whether the visitor has been admitted (the session may have ended since).
    #[must_use]
    pub fn is_admitted(&self) -> bool {
        self.accepted_at.is_some()
    }

    /// When the session ends: at the end of the expiry slot (the second)
    /// in which `session_minutes` after the last check-in falls, or after
    /// admission when renewal is disabled. `None` if never admitted.
    ///
    /// The counters count a session until the end of that slot
    /// ([`ExpirySlot::end`]); the session lasts exactly as long, so the
    /// sessions the node honours and the sessions it counts are the same
    /// at every instant. (Ending at the exact millisecond, a session went on
    /// being counted for up to a second after it ended: the sessions of a
    /// burst admitted in one second, all ending in the same second, made the
    /// counted number up to 6 % high inside that second.) A session lasts
    /// at most a second longer than `session_minutes`.
    #[must_use]
    pub fn session_end(&self, session_minutes: u64, renewal: bool) -> Option<UnixMillis> {
        let accepted_at = self.accepted_at?;
        let from = if renewal {
            self.last_check_in
        } else {
            accepted_at
        };
        Some(from.session_slot(session_minutes).end())
    }

    /// The tag of the client's network for `ticket_binding = "network"`: its
    /// /24 (IPv4, or IPv4-mapped IPv6) or /48 (IPv6), hashed with the
    /// ticket's own random id as the key, so one network gives every ticket
    /// another tag and the ticket never carries the address. Never 0 (0 is
    /// "not bound"). The same on every node: nothing but the ticket keys it.
    #[must_use]
    pub fn network_tag(&self, client: core::net::IpAddr) -> u32 {
        let (family, prefix): (u64, u128) = match client {
            core::net::IpAddr::V4(v4) => (4, u128::from(u32::from(v4) >> 8)),
            core::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => (4, u128::from(u32::from(v4) >> 8)),
                None => (6, u128::from(v6) >> 80),
            },
        };
        let mix = crate::xdp::fmix64;
        let h = mix(mix(mix(self.id ^ family) ^ prefix as u64) ^ (prefix >> 64) as u64);
        (h as u32) | 1
    }

    /// The earliest instant a queued visitor's next check-in gets a chance.
    #[must_use]
    pub fn next_check_in(&self) -> UnixMillis {
        self.last_check_in
            .plus_secs(u64::from(self.refresh_interval_secs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::tests::at;

    #[test]
    fn seed_cookie_example_valid_for_session_after_last_check_in() {
        // Seed 002: bucket 19:51, accepted and last seen 20:01:13; a 5-minute
        // session lasts until 20:06:13 and is renewed by each request. It
        // ends with the second it ends in (its counted expiry slot): valid
        // through 20:06:13.999.
        let ticket = Ticket {
            accepted_at: Some(at(20, 1, 13)),
            last_check_in: at(20, 1, 13),
            ..Ticket::new_visitor(RoomId(7), at(19, 51, 0), 20)
        };
        assert_eq!(ticket.bucket, at(19, 51, 0).minute());
        assert_eq!(ticket.session_end(5, true), Some(at(20, 6, 14)));
        let later = Ticket {
            last_check_in: at(20, 4, 0),
            ..ticket
        };
        assert_eq!(later.session_end(5, true), Some(at(20, 9, 1)));
        assert_eq!(
            later.session_end(5, false),
            Some(at(20, 6, 14)),
            "no renewal: counts from acceptedAt"
        );
        assert_eq!(
            Ticket::new_visitor(RoomId(7), at(1, 0, 0), 20).session_end(5, true),
            None
        );
        // Within a second: the end is where the counters stop counting it.
        let mid = Ticket {
            last_check_in: at(20, 1, 13).plus_millis(250),
            ..ticket
        };
        let end = mid.session_end(5, true).unwrap();
        assert_eq!(end, at(20, 6, 14));
        assert_eq!(
            end,
            mid.last_check_in.plus_minutes(5).expiry_slot().end(),
            "the end of the slot it is counted in"
        );
    }

    #[test]
    fn network_tags_tell_networks_apart_not_hosts() {
        let ticket = Ticket {
            id: 0x1234_5678_9abc,
            ..Ticket::new_visitor(RoomId(9), UnixMillis(1), 20)
        };
        let tag = |ip: &str| ticket.network_tag(ip.parse().unwrap());
        assert_eq!(tag("192.0.2.1"), tag("192.0.2.200"), "same /24");
        assert_eq!(tag("192.0.2.1"), tag("::ffff:192.0.2.9"), "mapped");
        assert_ne!(tag("192.0.2.1"), tag("192.0.3.1"));
        assert_eq!(tag("2001:db8:1::1"), tag("2001:db8:1:ffff::2"), "same /48");
        assert_ne!(tag("2001:db8:1::1"), tag("2001:db8:2::1"));
        assert_ne!(tag("127.0.0.1"), 0);
        let other = Ticket { id: 7, ..ticket };
        assert_ne!(
            other.network_tag("192.0.2.1".parse().unwrap()),
            tag("192.0.2.1")
        );
    }

    #[test]
    fn compact_json_round_trip() {
        let ticket = Ticket {
            counted_waiting: Some(Minute(3)),
            ..Ticket::new_visitor(RoomId(9), UnixMillis(1), 20)
        };
        let json = serde_json::to_string(&ticket).unwrap();
        assert_eq!(
            json,
            r#"{"v":3,"r":9,"b":0,"a":null,"c":1,"i":20,"e":null,"w":3,"t":0,"n":0}"#
        );
        assert_eq!(serde_json::from_str::<Ticket>(&json).unwrap(), ticket);
    }

    /// A cookie issued before the upgrade (format 2, expiry minute 10:05):
    /// read, its session counted to the end of 10:05 as it was, its claims
    /// not believed; any other version is no ticket.
    #[test]
    fn a_version_2_ticket_is_read_with_its_minute_as_the_minutes_end() {
        let json = format!(
            r#"{{"v":2,"r":9,"b":{b},"a":{a},"c":{a},"i":20,"e":{e},"w":null,"t":77,"n":0}}"#,
            b = at(10, 0, 0).minute().0,
            a = at(10, 0, 20).0,
            e = at(10, 5, 0).minute().0,
        );
        let old: Ticket = serde_json::from_str(&json).unwrap();
        let (ticket, claims_hold) = old.upgraded().unwrap();
        assert!(!claims_hold);
        assert_eq!(ticket.version, TICKET_VERSION);
        let expiry = ticket.counted_expiry.unwrap();
        assert_eq!(expiry.end(), at(10, 6, 0), "counted to the end of 10:05");
        assert_eq!(ticket.id, 77);
        assert_eq!(ticket.accepted_at, Some(at(10, 0, 20)));
        let current = Ticket {
            version: TICKET_VERSION,
            ..old
        };
        assert_eq!(current.upgraded(), Some((current, true)));
        assert_eq!(Ticket { version: 1, ..old }.upgraded(), None);
        assert_eq!(Ticket { version: 4, ..old }.upgraded(), None);
    }
}
