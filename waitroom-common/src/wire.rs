//! The gossip wire format between a node and the aggregator.
//!
//! # Transport
//! One long-lived QUIC connection per node (mutual TLS, ALPN
//! `waitroom-gossip/1`; the transport lives in `waitroom-runtime`). Each report is one bidirectional stream: the node
//! writes one [`Message::Report`] frame and finishes its side; the aggregator
//! answers with one [`Message::Answer`] (or [`Message::Refused`]) frame and
//! finishes. A stream per exchange costs nothing in QUIC, keeps a slow or lost
//! answer from holding up the next report, and makes every exchange
//! self-delimiting, so no state is carried between frames.
//!
//! # Frame
//! ```text
//! "WRGP" | version: u16 BE | length: u32 BE | payload: `length` bytes of postcard
//! ```
//! The header is checked before the payload is read: a frame of another
//! version or longer than [`MAX_FRAME_BYTES`] is refused without reading it.
//!
//! # Why postcard
//! Reports are mostly lists of small integers (session expiries per second,
//! waiting per bucket); postcard's varints make a typical report about a
//! kilobyte per room (up to 120 expiry seconds of 6–7 bytes each) where JSON
//! would be several times that, it encodes and decodes
//! without a schema lookup, and it has no float-formatting or map-ordering
//! ambiguity. What it lacks, self-description, is what [`VERSION`] is for:
//! any change to a type carried here (including the engine's `NodeReport` and
//! `GlobalState`) changes the bytes, which the golden test below catches, and
//! must bump the version.
//!
//! # Changes
//! A second after a report, nearly all of the next one is the same. After a
//! connection's first answer the node sends each report as the changes since
//! the last one answered ([`Message::Changes`], `crate::changes`): about a
//! twelfth of the bytes (docs/BENCHMARKS.md, "Reports as changes"). The
//! aggregator rebuilds the whole report before anything else reads it, so
//! every rule below (identity, rooms of other groups, plausibility, the
//! merge) sees what it saw before.
use crate::{aggregate::NodeReport, room::RoomId, state::GlobalState, time::UnixMillis};
use serde::{Deserialize, Serialize};

/// Marks a gossip frame; anything else on the stream is refused at once.
pub const MAGIC: [u8; 4] = *b"WRGP";

/// Protocol version this build speaks. 2: reports carry the node's opinion
/// of its rooms' origin pools. 3: a report's session expiries are
/// [`ExpirySlot`](crate::time::ExpirySlot)s (seconds), no longer minutes.
/// The bytes have the same shape, so a version-2 report read as 3 would
/// count every session as ended; frames of another version are refused
/// instead, and a node refused goes on with its local-only state until both
/// sides speak the same version (upgrade the aggregator and the nodes
/// together; docs/BENCHMARKS.md). 4: a report says which version of the
/// room settings the node runs ([`ReportFrame::settings_version`]) and an
/// answer may carry newer ones ([`AnswerFrame::settings`]), both appended.
pub const VERSION: u16 = 4;

/// Magic, version and length.
pub const HEADER_LEN: usize = 10;

/// Largest payload accepted or sent. A report of 64 rooms with a full day of
/// session expiries and 2,000 queue buckets each stays under 3 MiB.
pub const MAX_FRAME_BYTES: usize = 4 << 20;

/// Everything that travels on a gossip stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Message {
    /// Node → aggregator, every interval.
    Report(ReportFrame),
    /// Aggregator → node, in answer to a report.
    Answer(AnswerFrame),
    /// Either way: the other side's frame was not accepted.
    Refused(Refusal),
    /// Node → aggregator: a report from a node that asks on demand when its
    /// promise runs out (its `lease_wait_ms` is not 0), on its interval or
    /// out of cycle. Answered like a report, but the node is promised what
    /// its recent admits need rather than its fair part, so the rest stays
    /// in reserve for whoever asks ([`crate::cluster::promise`]). Appended
    /// without a version change: every earlier frame keeps its bytes, and an
    /// aggregator that predates it refuses it as malformed, on which the
    /// node goes back to plain reports and stops asking.
    LeaseReport(ReportFrame),
    /// Node → aggregator: a report to an aggregator that is not the node's
    /// *home* (a cluster of several aggregators, docs/adr/0001): merged
    /// like a report, so every aggregator holds every node's counts, but
    /// answered with no grant; it says which leases the node holds from its
    /// home, so this aggregator counts them as spent. Appended without a
    /// version change, like [`Message::LeaseReport`]; only nodes configured
    /// with more than one aggregator send it.
    PeerReport(PeerReportFrame),
    /// Node → its home aggregator: a report (asking on demand or not) that
    /// also says which leases the node holds, as [`Message::PeerReport`]
    /// does for the others. The home then counts, until the node's next
    /// report confirms what it received, the larger of what it last granted
    /// and what the node holds: a lowered cap whose answer was lost, or a
    /// grant an aggregator restarted from an old snapshot no longer knows
    /// of, is still counted as spent (`Cluster::apply_holding`). Appended
    /// without a version change; an aggregator that predates it refuses it
    /// as malformed, on which the node goes back to [`Message::Report`] and
    /// [`Message::LeaseReport`].
    HomeReport(HomeReportFrame),
    /// Aggregator → node, after an [`Message::Answer`] on the same stream
    /// (its second frame): what the answer's own frame cannot say. Sent
    /// only when there is something to say. Appended without a version
    /// change, and safe with nodes that predate it: a node reads one frame
    /// per stream and never sees a second.
    Note(AnswerNote),
    /// Node → its home aggregator: a home report that asks, and says how
    /// many visitors the node holds right now for its answer, per room
    /// (`Cluster::apply_held`). A report sent again after a lost answer
    /// counts no visitor new since the lost one, which had counted the held
    /// visitor, so by its counts alone it reads as no need; at 1,200 nodes
    /// an idle node is promised nothing, and the held visitor queued with
    /// room to spare. Appended without a version change; an aggregator that
    /// predates it refuses it as malformed, on which the node goes back to
    /// [`Message::HomeReport`].
    HeldReport(HeldReportFrame),
    /// Node → aggregator: any report above said as the changes since an
    /// earlier report of the same connection that this aggregator answered
    /// (`crate::changes`): about a tenth of the bytes of a whole report a
    /// second after the last one. The aggregator rebuilds the whole report
    /// from the one it kept and goes on as if it had been sent whole. It
    /// keeps the last few reports of each connection; changes against one
    /// it no longer holds (another connection's, one from before a
    /// restart, or a forged number) are refused with
    /// [`RefusalReason::UnknownBase`], on which the node sends its next
    /// report whole. Appended without a version change; an aggregator that
    /// predates it refuses it as malformed, on which the node sends whole
    /// reports on that connection.
    Changes(ChangesFrame),
}

/// A report as changes (see [`Message::Changes`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangesFrame {
    /// The `seq` of the report the changes are against.
    pub base: u64,
    /// The changes of the report's rooms since the base's, as
    /// [`crate::changes::changes`] gives them.
    pub rooms: Vec<crate::aggregate::RoomReport>,
    /// The report itself, with no rooms: they are the base's with `rooms`
    /// made.
    pub report: ReportKind,
}

/// Every kind of report, and nothing else: what a [`ChangesFrame`] carries.
/// Not a [`Message`], so changes cannot nest (a frame of changes within
/// changes within changes… would be decoded by recursion, one stack frame
/// per level, and a 4 MiB frame holds a million levels).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReportKind {
    Report(ReportFrame),
    LeaseReport(ReportFrame),
    PeerReport(PeerReportFrame),
    HomeReport(HomeReportFrame),
    HeldReport(HeldReportFrame),
}

impl ReportKind {
    /// `message` if it is a report of any kind, else `message` back.
    pub fn of(message: Message) -> Result<Self, Box<Message>> {
        Ok(match message {
            Message::Report(f) => Self::Report(f),
            Message::LeaseReport(f) => Self::LeaseReport(f),
            Message::PeerReport(f) => Self::PeerReport(f),
            Message::HomeReport(f) => Self::HomeReport(f),
            Message::HeldReport(f) => Self::HeldReport(f),
            other @ (Message::Answer(_)
            | Message::Refused(_)
            | Message::Note(_)
            | Message::Changes(_)) => return Err(Box::new(other)),
        })
    }

    /// The report as the message it was.
    #[must_use]
    pub fn into_message(self) -> Message {
        match self {
            Self::Report(f) => Message::Report(f),
            Self::LeaseReport(f) => Message::LeaseReport(f),
            Self::PeerReport(f) => Message::PeerReport(f),
            Self::HomeReport(f) => Message::HomeReport(f),
            Self::HeldReport(f) => Message::HeldReport(f),
        }
    }

    fn frame_mut(&mut self) -> &mut ReportFrame {
        match self {
            Self::Report(f) | Self::LeaseReport(f) => f,
            Self::PeerReport(peer) => &mut peer.frame,
            Self::HomeReport(home) => &mut home.frame,
            Self::HeldReport(held) => &mut held.home.frame,
        }
    }
}

impl ChangesFrame {
    /// `message` (a report of any kind) as changes against `base`, its
    /// report's rooms against `base_rooms`; `message` back, to be sent
    /// whole, when they cannot be said as changes
    /// (`crate::changes::changes`) or it is no report.
    pub fn of(
        base: u64,
        base_rooms: &[crate::aggregate::RoomReport],
        message: Message,
    ) -> Result<Self, Box<Message>> {
        let mut report = ReportKind::of(message)?;
        let whole = &mut report.frame_mut().report;
        let Some(rooms) = crate::changes::changes(base_rooms, &whole.rooms) else {
            return Err(Box::new(report.into_message()));
        };
        whole.rooms = Vec::new();
        Ok(Self {
            base,
            rooms,
            report,
        })
    }

    /// The report as it was sent, its rooms rebuilt from `base_rooms`;
    /// `None` when the report carries rooms of its own or the changes do
    /// not fit the base.
    #[must_use]
    pub fn rebuild(self, base_rooms: &[crate::aggregate::RoomReport]) -> Option<Message> {
        let mut report = self.report;
        let whole = &mut report.frame_mut().report;
        if !whole.rooms.is_empty() {
            return None;
        }
        whole.rooms = crate::changes::apply(base_rooms, &self.rooms)?;
        Some(report.into_message())
    }
}

impl Message {
    /// The report frame a report of any kind carries; `None` for every
    /// other message (changes included: they carry no whole report).
    #[must_use]
    pub fn report_frame(&self) -> Option<&ReportFrame> {
        match self {
            Self::Report(frame) | Self::LeaseReport(frame) => Some(frame),
            Self::HomeReport(home) => Some(&home.frame),
            Self::HeldReport(held) => Some(&held.home.frame),
            Self::PeerReport(peer) => Some(&peer.frame),
            Self::Answer(_) | Self::Refused(_) | Self::Note(_) | Self::Changes(_) => None,
        }
    }
}

/// A home report with the visitors the node holds as it reports (see
/// [`Message::HeldReport`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldReportFrame {
    pub home: HomeReportFrame,
    /// Rooms with visitors held now for an on-demand lease; a room not
    /// named holds none.
    pub held_visitors: Vec<HeldVisitors>,
}

/// Visitors a node holds in one room, each waiting for a slot from the
/// answer to this report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldVisitors {
    pub room: RoomId,
    pub visitors: u64,
}

/// What an aggregator adds to an answer (see [`Message::Note`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerNote {
    /// The answer's `seq`.
    pub seq: u64,
    /// Rooms whose grants this aggregator could not make durable, or could
    /// not if asked (a peer's answer; its `[ledger]` failing: etcd out of
    /// reach or without a quorum, a commit past its deadline, or the
    /// aggregator fenced by another epoch): the node was answered with what
    /// it held and nothing new there. A node with another aggregator to go
    /// to takes its grants from that one until this one answers without a
    /// note (`waitroom-edge`'s `gossip::home`).
    pub held_back: Vec<RoomId>,
}

/// A report to the node's home aggregator, with the leases the node holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HomeReportFrame {
    pub frame: ReportFrame,
    /// The node asks on demand (what [`Message::LeaseReport`] says).
    pub asks: bool,
    /// The leases the node holds, from its last answer, one per room (none
    /// before its first answer).
    pub held: Vec<HeldLease>,
}

/// A report to an aggregator that is not the node's home.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerReportFrame {
    pub frame: ReportFrame,
    /// The leases the node holds, from its home's last answer, one per
    /// room (none before its first answer).
    pub held: Vec<HeldLease>,
}

/// The shared slots a node holds of one room for one minute, as its home
/// aggregator granted them: what the home's answer said the node may admit
/// (`allowance`) on top of what it had admitted when it reported (`used`),
/// for the Anywhere pool and the colo share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldLease {
    pub room: RoomId,
    pub minute: crate::time::Minute,
    pub anywhere: u64,
    pub anywhere_used: u64,
    pub colo_share: u64,
    pub colo_share_used: u64,
}

impl HeldLease {
    /// The lease a node holds of `room` by the state its last answer gave.
    #[must_use]
    pub fn of(room: RoomId, state: &GlobalState) -> Self {
        Self {
            room,
            minute: state.as_of.minute(),
            anywhere: state.allowance.anywhere,
            anywhere_used: state.used.anywhere,
            colo_share: state.allowance.colo_share,
            colo_share_used: state.used.colo_share,
        }
    }

    /// What the lease lets the node admit in its minute: used and unused.
    #[must_use]
    pub fn cap(&self) -> u64 {
        self.anywhere
            .saturating_add(self.anywhere_used)
            .saturating_add(self.colo_share)
            .saturating_add(self.colo_share_used)
    }

    /// Whether the cap of some room's lease in `after` is below the one in
    /// `before` for the same minute: an answer took back slots the node
    /// held (a new minute's smaller lease takes nothing back).
    #[must_use]
    pub fn lowered(before: &[Self], after: &[Self]) -> bool {
        after.iter().any(|a| {
            before
                .iter()
                .find(|b| b.room == a.room && b.minute == a.minute)
                .is_some_and(|b| a.cap() < b.cap())
        })
    }

    /// Whether `after` holds more than `before` in some room: a higher cap
    /// in the same minute, or a lease of a later minute (or the first one)
    /// with anything in it.
    #[must_use]
    pub fn raised(before: &[Self], after: &[Self]) -> bool {
        after
            .iter()
            .any(|a| match before.iter().find(|b| b.room == a.room) {
                Some(b) if b.minute == a.minute => a.cap() > b.cap(),
                Some(b) => a.minute > b.minute && a.cap() > 0,
                None => a.cap() > 0,
            })
    }
}

/// A node's report: its counts for every room it serves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportFrame {
    /// Increases by one per report on a node; echoed in the answer so the
    /// node can tell a late answer from the current one.
    pub seq: u64,
    pub report: NodeReport,
    /// This node's opinion of every origin pool of its rooms, from its own
    /// health checks (the aggregator shows every node's view side by side).
    pub pools: Vec<PoolOpinion>,
    /// The version of the room settings this node runs, from an earlier
    /// answer (or kept from one across a restart); `None` while it runs its
    /// own file's. The aggregator answers with its settings while this is
    /// not its current version, and shows the node as behind.
    pub settings_version: Option<u64>,
}

/// One node's view of one origin pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolOpinion {
    /// The room's configured id.
    pub room: String,
    pub pool: String,
    /// At least one origin of the pool is up on this node.
    pub up: bool,
    /// EWMA of the pool's health-check round-trip time, in microseconds;
    /// `None` before the first successful probe.
    pub rtt_ewma_micros: Option<u64>,
}

/// The aggregator's answer: this node's global state for each room.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AnswerFrame {
    /// The report's `seq`.
    pub seq: u64,
    /// The aggregator's clock when it computed the answer.
    pub at: UnixMillis,
    pub rooms: Vec<RoomAnswer>,
    /// The cluster's room settings, when the node reported another version
    /// than the aggregator's current one; `None` otherwise (most answers).
    pub settings: Option<SettingsPush>,
}

/// A version of the cluster's room settings, pushed to a node.
///
/// # Why JSON inside postcard
/// The settings are the room tables themselves
/// ([`RoomTable`](crate::room_table::RoomTable), every key but the node's
/// routes), and keys are added to them as features come (events, bypass
/// rules). In postcard every such key would change this frame's bytes and
/// need a new [`VERSION`]; as JSON text the frame keeps its shape, a key
/// added at the aggregator reaches nodes that know it, and a node that does
/// not refuses that version by name (unknown field) and keeps running the
/// one it has, reporting it, so the aggregator shows it as behind. Settings
/// travel only when a node is behind, so their size does not matter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettingsPush {
    /// Increases with every change at the aggregator.
    pub version: u64,
    /// The room tables as a JSON array, in the aggregator's room order.
    pub rooms_json: String,
}

/// One room's state for the node that reported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoomAnswer {
    pub room: RoomId,
    pub state: GlobalState,
}

/// Why a frame was refused, in terms both sides can act on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub reason: RefusalReason,
    /// Human-readable detail for the log of the refused side.
    pub detail: String,
}

/// The machine-readable part of a [`Refusal`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RefusalReason {
    /// The frame's version is not one this side speaks; `supported` is.
    UnsupportedVersion { supported: u16 },
    /// The header or payload could not be decoded.
    Malformed,
    /// The frame was longer than `max` bytes.
    TooLarge { max: u32 },
    /// A valid message that does not belong here (an answer sent to the aggregator).
    Unexpected,
    /// The report names a node its sender's certificate does not certify
    /// (appended in version 2: older peers read it as a malformed frame).
    NotCertified,
    /// Changes against a report this aggregator does not hold for the
    /// connection ([`Message::Changes`]): send the report whole. Appended
    /// without a version change; only nodes that send changes receive it.
    UnknownBase,
}

/// QUIC application error codes used when closing a connection or stream
/// because of the protocol (readable whatever the peer's frame version).
pub mod close {
    /// Normal shutdown.
    pub const DONE: u32 = 0;
    /// The peer speaks another protocol version.
    pub const UNSUPPORTED_VERSION: u32 = 1;
    /// The peer sent frames that could not be decoded.
    pub const MALFORMED: u32 = 2;
    /// The peer sent a frame over the size limit.
    pub const TOO_LARGE: u32 = 3;
    /// A newer connection of the same node took over (one live connection per node).
    pub const REPLACED: u32 = 4;
}

/// Why bytes are not a frame.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("frame truncated: {len} bytes, the header alone is {HEADER_LEN}")]
    Truncated { len: usize },
    #[error("not a gossip frame (magic {found:02x?})")]
    BadMagic { found: [u8; 4] },
    #[error("protocol version {found} is not supported (this side speaks {VERSION})")]
    UnsupportedVersion { found: u16 },
    #[error("frame of {len} bytes is over the limit of {MAX_FRAME_BYTES}")]
    TooLarge { len: usize },
    #[error("header says {declared} payload bytes, {actual} follow")]
    LengthMismatch { declared: usize, actual: usize },
    #[error("payload does not decode: {source}")]
    Payload { source: postcard::Error },
    #[error("{extra} bytes after the message")]
    TrailingBytes { extra: usize },
}

impl WireError {
    /// The refusal to send back to the peer whose bytes these were.
    #[must_use]
    pub fn refusal(&self) -> Refusal {
        let reason = match self {
            Self::UnsupportedVersion { .. } => {
                RefusalReason::UnsupportedVersion { supported: VERSION }
            }
            Self::TooLarge { .. } => RefusalReason::TooLarge {
                max: MAX_FRAME_BYTES as u32,
            },
            Self::Truncated { .. }
            | Self::BadMagic { .. }
            | Self::LengthMismatch { .. }
            | Self::Payload { .. }
            | Self::TrailingBytes { .. } => RefusalReason::Malformed,
        };
        Refusal {
            reason,
            detail: self.to_string(),
        }
    }

    /// The QUIC close code matching this error.
    #[must_use]
    pub fn close_code(&self) -> u32 {
        match self {
            Self::UnsupportedVersion { .. } => close::UNSUPPORTED_VERSION,
            Self::TooLarge { .. } => close::TOO_LARGE,
            _ => close::MALFORMED,
        }
    }
}

/// Encodes one frame.
pub fn encode(message: &Message) -> Result<Vec<u8>, WireError> {
    let mut frame = vec![0; HEADER_LEN];
    frame = postcard::to_extend(message, frame).map_err(|source| WireError::Payload { source })?;
    let len = frame.len() - HEADER_LEN;
    if len > MAX_FRAME_BYTES {
        return Err(WireError::TooLarge { len });
    }
    frame[..4].copy_from_slice(&MAGIC);
    frame[4..6].copy_from_slice(&VERSION.to_be_bytes());
    frame[6..10].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(frame)
}

/// Checks a header and returns the payload length it announces.
pub fn decode_header(header: &[u8]) -> Result<usize, WireError> {
    let Some(header) = header.get(..HEADER_LEN) else {
        return Err(WireError::Truncated { len: header.len() });
    };
    let magic: [u8; 4] = header[..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(WireError::BadMagic { found: magic });
    }
    let version = u16::from_be_bytes([header[4], header[5]]);
    if version != VERSION {
        return Err(WireError::UnsupportedVersion { found: version });
    }
    let len = u32::from_be_bytes(header[6..10].try_into().expect("4 bytes")) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(WireError::TooLarge { len });
    }
    Ok(len)
}

/// Decodes a payload (the bytes after the header).
pub fn decode_payload(payload: &[u8]) -> Result<Message, WireError> {
    let (message, rest) =
        postcard::take_from_bytes(payload).map_err(|source| WireError::Payload { source })?;
    if !rest.is_empty() {
        return Err(WireError::TrailingBytes { extra: rest.len() });
    }
    Ok(message)
}

/// Decodes one whole frame.
pub fn decode(frame: &[u8]) -> Result<Message, WireError> {
    let len = decode_header(frame)?;
    let payload = &frame[HEADER_LEN..];
    if payload.len() != len {
        return Err(WireError::LengthMismatch {
            declared: len,
            actual: payload.len(),
        });
    }
    decode_payload(payload)
}

#[cfg(test)]
mod tests {
    use crate::{
        aggregate::{MinuteAdmits, RoomReport},
        counters::PoolCounts,
        time::{ExpirySlot, Minute},
    };

    use super::*;

    /// An answer lowers a cap only against a lease of the same room and
    /// minute; a new minute's smaller lease is not taking anything back. It
    /// raises a cap in the same minute, or by a later minute's lease with
    /// anything in it (the edge's gossip client and the simulator alike).
    #[test]
    fn a_cap_is_lowered_only_within_its_minute_and_raised_by_a_later_one() {
        use crate::time::Minute;
        let lease = |minute: u64, anywhere: u64, used: u64| HeldLease {
            room: RoomId::from_name("shop"),
            minute: Minute(minute),
            anywhere,
            anywhere_used: used,
            colo_share: 1,
            colo_share_used: 0,
        };
        let lowered = HeldLease::lowered;
        let raised = HeldLease::raised;
        assert!(lowered(&[lease(5, 30, 2)], &[lease(5, 4, 8)]), "32 → 12");
        assert!(!lowered(&[lease(5, 30, 2)], &[lease(5, 24, 8)]), "32 → 32");
        assert!(
            !lowered(&[lease(5, 30, 2)], &[lease(6, 1, 0)]),
            "another minute"
        );
        assert!(!lowered(&[], &[lease(5, 1, 0)]), "nothing held before");
        // Raised: the peers are told at once.
        assert!(raised(&[lease(5, 4, 8)], &[lease(5, 30, 2)]), "12 → 32");
        assert!(!raised(&[lease(5, 24, 8)], &[lease(5, 30, 2)]), "32 → 32");
        assert!(!raised(&[lease(5, 30, 2)], &[lease(5, 4, 8)]), "lowered");
        assert!(
            raised(&[lease(5, 30, 2)], &[lease(6, 1, 0)]),
            "a new minute's lease"
        );
        assert!(
            !raised(&[lease(6, 30, 2)], &[lease(5, 40, 0)]),
            "an older minute"
        );
        let empty = HeldLease {
            colo_share: 0,
            ..lease(6, 0, 0)
        };
        assert!(
            !raised(&[lease(5, 30, 2)], &[empty]),
            "a new minute's lease with nothing in it"
        );
        assert!(raised(&[], &[lease(5, 1, 0)]), "nothing held before");
        assert!(!raised(&[lease(5, 1, 0)], &[]), "nothing held after");
    }

    fn sample_report() -> Message {
        Message::Report(ReportFrame {
            seq: 7,
            report: NodeReport {
                node: "n1".into(),
                colo: "c".into(),
                at: UnixMillis(1_622_073_600_000),
                rooms: vec![RoomReport {
                    room: RoomId(3),
                    expiries: vec![(ExpirySlot(10), 2), (ExpirySlot(12), -1)],
                    admits: vec![MinuteAdmits {
                        minute: Minute(9),
                        admits: PoolCounts {
                            eligible: 1,
                            colo_share: 2,
                            anywhere: 3,
                            uncapped: 0,
                        },
                    }],
                    waiting: vec![(Minute(8), 5)],
                    distinct_visitors: vec![(Minute(9), 4)],
                }],
            },
            pools: vec![PoolOpinion {
                room: "shop".into(),
                pool: "eu".into(),
                up: true,
                rtt_ewma_micros: Some(1500),
            }],
            settings_version: None,
        })
    }

    fn sample_answer() -> Message {
        let mut state = GlobalState::empty(UnixMillis(1_622_073_600_000));
        state.active_users = 201;
        state.admits_per_minute = 30.5;
        state.allowance.anywhere = 4;
        Message::Answer(AnswerFrame {
            seq: 7,
            at: UnixMillis(1_622_073_600_000),
            rooms: vec![RoomAnswer {
                room: RoomId(3),
                state,
            }],
            settings: Some(SettingsPush {
                version: 2,
                rooms_json: "[]".into(),
            }),
        })
    }

    #[test]
    fn frames_round_trip() {
        for message in [
            sample_report(),
            sample_answer(),
            Message::Refused(Refusal {
                reason: RefusalReason::TooLarge { max: 9 },
                detail: "x".into(),
            }),
        ] {
            let frame = encode(&message).unwrap();
            assert_eq!(decode(&frame).unwrap(), message);
        }
    }

    /// Pins the bytes of version 4: if this fails, a carried type changed
    /// shape and [`VERSION`] must be bumped (and this test updated).
    /// Version 4 appended one field to reports (the settings version, `00`
    /// for none, the last byte below) and one to answers; a frame of
    /// version 3 is refused.
    #[test]
    fn version_4_bytes_are_pinned() {
        let report = hex::encode(encode(&sample_report()).unwrap());
        assert_eq!(
            report,
            "5752475000040000002e0007026e31016380d0fbd89a2f0103020a040c0101\
             090102030001080a010904010473686f700265750101dc0b00"
        );
        let answer = encode(&sample_answer()).unwrap();
        assert_eq!(&answer[..6], b"WRGP\x00\x04");
        assert!(
            hex::encode(&answer).ends_with("0102025b5d"),
            "settings: Some, version 2, \"[]\""
        );
        let mut old = encode(&sample_report()).unwrap();
        old[4..6].copy_from_slice(&3u16.to_be_bytes());
        let err = decode(&old).unwrap_err();
        assert!(
            matches!(err, WireError::UnsupportedVersion { found: 3 }),
            "{err}"
        );
        assert_eq!(
            err.refusal().reason,
            RefusalReason::UnsupportedVersion { supported: 4 }
        );
        assert_eq!(decode(&answer).unwrap(), sample_answer());
    }

    /// The lease report is appended: the report's bytes under the next
    /// variant tag (3), so every earlier frame keeps its bytes and an older
    /// aggregator refuses it as malformed (its tags end at 2).
    #[test]
    fn a_lease_report_is_a_report_under_an_appended_tag() {
        let Message::Report(frame) = sample_report() else {
            unreachable!()
        };
        let report = encode(&sample_report()).unwrap();
        let lease = encode(&Message::LeaseReport(frame.clone())).unwrap();
        assert_eq!(report[HEADER_LEN], 0);
        assert_eq!(lease[HEADER_LEN], 3);
        assert_eq!(report[HEADER_LEN + 1..], lease[HEADER_LEN + 1..]);
        assert_eq!(decode(&lease).unwrap(), Message::LeaseReport(frame));
    }

    fn sample_held() -> HeldLease {
        HeldLease {
            room: RoomId::from_name("shop"),
            minute: crate::time::Minute(29_000_000),
            anywhere: 7,
            anywhere_used: 3,
            colo_share: 2,
            colo_share_used: 1,
        }
    }

    /// The peer report is appended too (tag 4): an aggregator from before
    /// it refuses it as malformed, every earlier frame keeps its bytes.
    #[test]
    fn a_peer_report_is_appended_and_round_trips() {
        let Message::Report(frame) = sample_report() else {
            unreachable!()
        };
        let peer = Message::PeerReport(PeerReportFrame {
            frame,
            held: vec![sample_held()],
        });
        let bytes = encode(&peer).unwrap();
        assert_eq!(bytes[HEADER_LEN], 4);
        assert_eq!(decode(&bytes).unwrap(), peer);
    }

    /// The home report is appended too (tag 5), and round-trips.
    #[test]
    fn a_home_report_is_appended_and_round_trips() {
        let Message::Report(frame) = sample_report() else {
            unreachable!()
        };
        let home = Message::HomeReport(HomeReportFrame {
            frame,
            asks: true,
            held: vec![sample_held()],
        });
        let bytes = encode(&home).unwrap();
        assert_eq!(bytes[HEADER_LEN], 5);
        assert_eq!(decode(&bytes).unwrap(), home);
    }

    /// The note after an answer is appended too (tag 6), and round-trips.
    #[test]
    fn an_answer_note_is_appended_and_round_trips() {
        let note = Message::Note(AnswerNote {
            seq: 9,
            held_back: vec![RoomId::from_name("shop")],
        });
        let bytes = encode(&note).unwrap();
        assert_eq!(bytes[HEADER_LEN], 6);
        assert_eq!(decode(&bytes).unwrap(), note);
    }

    /// The held report is appended too (tag 7), and round-trips: an
    /// aggregator from before it refuses it as malformed, every earlier
    /// frame keeps its bytes, and its home report's bytes are the home
    /// report's own.
    #[test]
    fn a_held_report_is_a_home_report_appended_with_its_held_visitors() {
        let Message::Report(frame) = sample_report() else {
            unreachable!()
        };
        let home = HomeReportFrame {
            frame,
            asks: true,
            held: vec![sample_held()],
        };
        let held = Message::HeldReport(HeldReportFrame {
            home: home.clone(),
            held_visitors: vec![HeldVisitors {
                room: RoomId(3),
                visitors: 2,
            }],
        });
        let bytes = encode(&held).unwrap();
        assert_eq!(bytes[HEADER_LEN], 7);
        assert_eq!(decode(&bytes).unwrap(), held);
        let plain = encode(&Message::HomeReport(home)).unwrap();
        let body = &plain[HEADER_LEN + 1..];
        assert_eq!(&bytes[HEADER_LEN + 1..HEADER_LEN + 1 + body.len()], body);
        assert_eq!(&bytes[HEADER_LEN + 1 + body.len()..], [1, 3, 2]);
    }

    /// Changes are appended (tag 8) and round-trip; a second later they
    /// are a fraction of the whole report and rebuild it exactly, whatever
    /// kind of report they carry. A report with rooms of its own beside the
    /// changes rebuilds into nothing; what is not a report has no changes.
    #[test]
    fn changes_are_appended_and_rebuild_the_report() {
        let base = sample_report();
        let Message::Report(mut plain) = base.clone() else {
            unreachable!()
        };
        plain.seq = 8;
        plain.report.rooms[0].expiries.push((ExpirySlot(300), 1));
        let next = Message::Report(plain.clone());
        let home = Message::HomeReport(HomeReportFrame {
            frame: plain,
            asks: true,
            held: vec![sample_held()],
        });
        let base_rooms = &base.report_frame().unwrap().report.rooms;
        for message in [next, home] {
            let changes = ChangesFrame::of(7, base_rooms, message.clone()).unwrap();
            assert_eq!(changes.rooms[0].expiries, [(ExpirySlot(300), 1)]);
            assert!(changes.rooms[0].admits.is_empty());
            let wrapped = Message::Changes(changes.clone());
            let bytes = encode(&wrapped).unwrap();
            assert_eq!(bytes[HEADER_LEN], 8);
            assert!(bytes.len() < encode(&message).unwrap().len());
            assert_eq!(decode(&bytes).unwrap(), wrapped);
            assert_eq!(changes.rebuild(base_rooms), Some(message));
        }
        let rooms_beside = ChangesFrame {
            base: 7,
            rooms: Vec::new(),
            report: ReportKind::of(base.clone()).unwrap(),
        };
        assert_eq!(rooms_beside.rebuild(base_rooms), None);
        assert_eq!(
            ChangesFrame::of(7, base_rooms, sample_answer()),
            Err(Box::new(sample_answer())),
            "no report: handed back"
        );
        let Message::Report(mut elsewhere) = base.clone() else {
            unreachable!()
        };
        elsewhere.report.rooms[0].room = RoomId(4);
        let elsewhere = Message::Report(elsewhere);
        assert_eq!(
            ChangesFrame::of(7, base_rooms, elsewhere.clone()),
            Err(Box::new(elsewhere)),
            "not said as changes: handed back to be sent whole"
        );
    }

    #[test]
    fn bad_frames_are_refused_with_a_reason() {
        let good = encode(&sample_report()).unwrap();

        let err = decode(&good[..5]).unwrap_err();
        assert!(matches!(err, WireError::Truncated { len: 5 }), "{err}");

        let mut bad_magic = good.clone();
        bad_magic[0] = b'X';
        assert!(matches!(
            decode(&bad_magic),
            Err(WireError::BadMagic { .. })
        ));

        let mut future = good.clone();
        future[4..6].copy_from_slice(&5u16.to_be_bytes());
        let err = decode(&future).unwrap_err();
        assert!(matches!(err, WireError::UnsupportedVersion { found: 5 }));
        assert_eq!(
            err.refusal().reason,
            RefusalReason::UnsupportedVersion { supported: 4 }
        );
        assert_eq!(err.close_code(), close::UNSUPPORTED_VERSION);

        let mut huge = good.clone();
        huge[6..10].copy_from_slice(&u32::MAX.to_be_bytes());
        let err = decode(&huge).unwrap_err();
        assert!(matches!(err, WireError::TooLarge { .. }));
        assert_eq!(
            err.refusal().reason,
            RefusalReason::TooLarge {
                max: MAX_FRAME_BYTES as u32
            }
        );

        let short = &good[..good.len() - 1];
        assert!(matches!(
            decode(short),
            Err(WireError::LengthMismatch { .. })
        ));

        let mut trailing = good.clone();
        trailing.push(0);
        let len = (trailing.len() - HEADER_LEN) as u32;
        trailing[6..10].copy_from_slice(&len.to_be_bytes());
        assert!(matches!(
            decode(&trailing),
            Err(WireError::TrailingBytes { extra: 1 })
        ));

        // A variant tag past the last variant.
        let mut garbage = good[..HEADER_LEN].to_vec();
        garbage[6..10].copy_from_slice(&3u32.to_be_bytes());
        garbage.extend([0x7f, 0xff, 0xff]);
        let err = decode(&garbage).unwrap_err();
        assert!(matches!(err, WireError::Payload { .. }), "{err}");
        assert_eq!(err.refusal().reason, RefusalReason::Malformed);
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A cheap deterministic fuzz: every prefix and many bit flips of valid frames.
        let Message::Report(frame) = sample_report() else {
            unreachable!()
        };
        let frames = [
            encode(&sample_report()).unwrap(),
            encode(&sample_answer()).unwrap(),
            encode(&Message::LeaseReport(frame.clone())).unwrap(),
            encode(&Message::HomeReport(HomeReportFrame {
                frame,
                asks: false,
                held: Vec::new(),
            }))
            .unwrap(),
        ];
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for frame in &frames {
            for cut in 0..frame.len() {
                let _ = decode(&frame[..cut]);
            }
            for _ in 0..5_000 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let mut mutated = frame.clone();
                let at = HEADER_LEN + (seed as usize % (frame.len() - HEADER_LEN));
                mutated[at] ^= (seed >> 32) as u8 | 1;
                let _ = decode(&mutated);
            }
        }
    }
}
