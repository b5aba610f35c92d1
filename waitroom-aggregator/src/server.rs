//! The QUIC side of the aggregator: accept nodes, answer their reports.
//!
//! One task per connection (one per node), one task per stream (one per
//! report). The merge runs under a single mutex for the few microseconds of
//! [`Cluster::apply`]; everything slow (TLS, reading, encoding) happens outside it.
use std::{
    sync::{
        Arc,
        atomic::{AtomicI64, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use parking_lot::Mutex;
use tokio::sync::Semaphore;
use tracing::Instrument as _;

use waitroom_common::{
    aggregate::RoomReport,
    cluster::Cluster,
    wire::{self, Message, Refusal, RefusalReason, WireError},
};
use waitroom_runtime::{
    clock::Clock,
    frames::{self, FrameError},
    logging::LogGate,
    tls,
};

/// Most node connections served at once; more are refused (a cluster has
/// tens to hundreds of nodes, so this only stops a flood).
pub const MAX_CONNECTIONS: usize = 4_096;

/// A step of the wall clock at least this large (against the monotonic
/// clock) between two merges is handed to the cluster as a step.
const CLOCK_STEP_MS: i64 = 1_000;

/// A report must arrive in full within this long after its stream opens.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct ServerMetrics {
    pub connections_open: AtomicU64,
    pub connections_total: AtomicU64,
    /// Handshakes that failed: no client certificate, one from another CA, or
    /// no common protocol.
    pub handshakes_refused_total: AtomicU64,
    pub reports_total: AtomicU64,
    /// Of them, reports from nodes whose home is another aggregator.
    pub peer_reports_total: AtomicU64,
    /// Of them, reports that said which leases the node holds
    /// (`Message::HomeReport`).
    pub holding_reports_total: AtomicU64,
    /// Of them, reports that named visitors the node held for the answer
    /// (`Message::HeldReport` with some visitor held).
    pub held_visitor_reports_total: AtomicU64,
    /// Bytes of the frames received from nodes (header and payload).
    pub frame_bytes_total: AtomicU64,
    /// Of them, the bytes of reports sent as changes.
    pub changes_bytes_total: AtomicU64,
    /// Reports received as changes (`Message::Changes`) and rebuilt.
    pub changes_reports_total: AtomicU64,
    /// Reports as changes refused: their base not held, or not fitting it.
    pub changes_refused_total: AtomicU64,
    /// Frames answered with a refusal (bad version, malformed, too large).
    pub frames_refused_total: AtomicU64,
    /// Reports refused because they name a node the connection's certificate
    /// does not certify (an impostor, or a misconfigured `node.id`).
    pub identity_refused_total: AtomicU64,
    /// Older connections closed because the same node connected again.
    pub connections_replaced_total: AtomicU64,
    /// Rooms left out of reports because another aggregator group owns
    /// them (a node whose list of groups differs from this aggregator's).
    pub foreign_rooms_total: AtomicU64,
    pub snapshots_written_total: AtomicU64,
    /// Steps of the wall clock seen (see [`Shared::cluster`]).
    pub clock_steps_total: AtomicU64,
    pub snapshot_errors_total: AtomicU64,
    /// The clock's milliseconds at the last snapshot written, 0 if none.
    pub last_snapshot_ms: AtomicU64,
    /// How long each report held the cluster's lock to be merged and its
    /// answer computed (peer reports too): what a node's report costs the
    /// aggregator, and how long every other report waited behind it.
    pub merge: waitroom_runtime::metrics::Histogram,
    /// One log line per ten seconds per kind of refusal: an impostor or a
    /// scanner retrying in a loop must not flood the journal.
    pub logs: RefusalLogs,
}

/// The log gates of [`ServerMetrics`], one per kind of refusal.
#[derive(Debug, Default)]
pub struct RefusalLogs {
    pub limit: LogGate,
    pub handshake: LogGate,
    pub identity: LogGate,
    pub frames: LogGate,
    pub foreign: LogGate,
}

/// What every connection task shares.
#[derive(Debug)]
pub struct Shared {
    /// Where every decision reads the time (driven in tests).
    pub clock: Clock,
    pub cluster: Mutex<Cluster>,
    pub metrics: ServerMetrics,
    /// What configuration reloads (SIGHUP) did, for `/metrics`.
    pub reloads: waitroom_runtime::metrics::ReloadOutcomes,
    /// Each node's latest opinion of its origin pools, by node: shown in
    /// `/status`, never used for a decision.
    pub pools: Mutex<std::collections::BTreeMap<String, NodePools>>,
    /// The one live connection of each node, by the name its certificate
    /// certifies: a node that connects again replaces its older connection.
    pub live: Mutex<std::collections::HashMap<String, quinn::Connection>>,
    /// The dashboard's last hour, sampled by a background task.
    pub history: waitroom_runtime::dashboard::History,
    /// The room settings in force, as answers carry them to nodes behind.
    pub settings: Mutex<Arc<wire::SettingsPush>>,
    /// The settings version each node last said it runs (`None`: its own
    /// file's), by node: `/status` shows who is behind.
    pub node_settings: Mutex<std::collections::BTreeMap<String, Option<u64>>>,
    /// `clock.wall_over_elapsed()` at the last lock of `cluster`: a change
    /// is a step of the wall clock.
    pub clock_seen: AtomicI64,
    /// With `[ledger]`: commits every grant to etcd before it is answered.
    pub ledger: Option<crate::committer::Committer>,
    /// With `[shard]`: the rooms of other groups are left out of every
    /// report before it is merged.
    pub shard: Option<waitroom_common::shard::Membership>,
}

/// What one node last said about its origin pools.
#[derive(Debug, Clone)]
pub struct NodePools {
    pub colo: String,
    /// When the report came.
    pub at: waitroom_common::time::UnixMillis,
    pub pools: Vec<wire::PoolOpinion>,
}

impl Shared {
    /// Seconds of the clock, for the log gates.
    fn now_secs(&self) -> u64 {
        self.clock.now().0 / 1_000
    }

    /// The cluster, even if a task panicked while holding the lock: the
    /// state is plain data and every update leaves it consistent. A step of
    /// the wall clock since the last lock is handed to it first
    /// ([`Cluster::shift_clock`]).
    pub fn cluster(&self) -> parking_lot::MutexGuard<'_, Cluster> {
        let mut cluster = self.cluster.lock();
        let offset = self.clock.wall_over_elapsed();
        let step = offset.saturating_sub(self.clock_seen.swap(offset, Relaxed));
        if step.abs() >= CLOCK_STEP_MS {
            tracing::warn!(
                step_ms = step,
                "the wall clock stepped; nodes' silences are kept as they were (check NTP: the nodes count on this clock)"
            );
            cluster.shift_clock(step);
            self.metrics.clock_steps_total.fetch_add(1, Relaxed);
        }
        cluster
    }

    /// Records `connection` as `node`'s live one, closing an older one.
    /// Binds `node` to `connection`, closing an older connection of the
    /// node; `true` when the node was not bound to this connection yet.
    fn claim(&self, node: &str, connection: &quinn::Connection) -> bool {
        let mut live = self.live.lock();
        if let Some(old) = live.get(node) {
            if old.stable_id() == connection.stable_id() {
                return false;
            }
            self.metrics
                .connections_replaced_total
                .fetch_add(1, Relaxed);
            tracing::info!(%node, "node connected again; closing its older connection");
            old.close(
                wire::close::REPLACED.into(),
                b"replaced by a newer connection of this node",
            );
        }
        live.insert(node.to_owned(), connection.clone());
        true
    }

    /// Forgets `connection` once it has ended.
    fn release(&self, connection: &quinn::Connection) {
        self.live
            .lock()
            .retain(|_, c| c.stable_id() != connection.stable_id());
    }
}

/// Accepts connections until the endpoint is closed.
pub async fn accept_loop(endpoint: quinn::Endpoint, shared: Arc<Shared>) {
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    while let Some(incoming) = endpoint.accept().await {
        let remote = incoming.remote_address();
        let Ok(permit) = Arc::clone(&limit).try_acquire_owned() else {
            if let Some(suppressed) = shared.metrics.logs.limit.pass(shared.now_secs()) {
                tracing::warn!(%remote, suppressed, "connection limit reached; refusing");
            }
            incoming.refuse();
            continue;
        };
        let shared = Arc::clone(&shared);
        let span = tracing::info_span!("peer", %remote, node = tracing::field::Empty);
        tokio::spawn(
            async move {
                let _permit = permit;
                match incoming.await {
                    Ok(connection) => {
                        shared.metrics.connections_total.fetch_add(1, Relaxed);
                        shared.metrics.connections_open.fetch_add(1, Relaxed);
                        serve_connection(connection, &shared).await;
                        shared.metrics.connections_open.fetch_sub(1, Relaxed);
                    }
                    Err(err) => {
                        shared.metrics.handshakes_refused_total.fetch_add(1, Relaxed);
                        if let Some(suppressed) =
                            shared.metrics.logs.handshake.pass(shared.now_secs())
                        {
                            tracing::warn!(%err, suppressed, "refused connection: handshake failed (nodes need a client certificate issued by the cluster CA)");
                        }
                    }
                }
            }
            .instrument(span),
        );
    }
}

async fn serve_connection(connection: quinn::Connection, shared: &Arc<Shared>) {
    tracing::debug!("node connected");
    serve_streams(&connection, shared).await;
    shared.release(&connection);
}

/// Reports of one connection kept for the node's changes to be made
/// against (`Message::Changes`).
const BASES_KEPT: usize = 3;

/// Entries (session-expiry slots, admits, queue buckets, visitors) of the
/// largest report kept as a base: 2¹⁸, above the largest a node sends (64
/// rooms, each with a day of expiries and 2,000 queue buckets: about
/// 230,000), well below what a 4 MiB frame can carry (about 700,000, some
/// 11 MB once decoded). A larger report is merged but not kept, so changes
/// against it are refused and the node sends whole reports.
const MAX_BASE_ENTRIES: usize = 1 << 18;

/// The last [`BASES_KEPT`] reports received on one connection, by `seq`,
/// as the node sent them (before rooms of other groups are left out, and
/// before the cluster's plausibility checks): the node makes its changes
/// against the last report it was answered, which may be one or two before
/// the last one received when answers were lost. Each is bounded by
/// [`MAX_BASE_ENTRIES`], and all go with the connection.
#[derive(Debug, Default)]
struct Bases {
    reports: std::collections::VecDeque<(u64, Vec<RoomReport>)>,
}

impl Bases {
    fn keep(&mut self, seq: u64, rooms: &[RoomReport]) {
        let entries: usize = rooms.iter().map(RoomReport::entries).sum();
        if entries > MAX_BASE_ENTRIES {
            return;
        }
        self.reports.retain(|(s, _)| *s != seq);
        if self.reports.len() == BASES_KEPT {
            self.reports.pop_front();
        }
        self.reports.push_back((seq, rooms.to_vec()));
    }

    fn get(&self, seq: u64) -> Option<&[RoomReport]> {
        self.reports
            .iter()
            .find(|(s, _)| *s == seq)
            .map(|(_, rooms)| rooms.as_slice())
    }
}

async fn serve_streams(connection: &quinn::Connection, shared: &Arc<Shared>) {
    let bases = Arc::new(Mutex::new(Bases::default()));
    loop {
        let (send, recv) = match connection.accept_bi().await {
            Ok(streams) => streams,
            Err(
                quinn::ConnectionError::ApplicationClosed(_)
                | quinn::ConnectionError::LocallyClosed,
            ) => {
                tracing::debug!("connection closed");
                return;
            }
            Err(err) => {
                tracing::info!(%err, "connection lost");
                return;
            }
        };
        let shared = Arc::clone(shared);
        let connection = connection.clone();
        let bases = Arc::clone(&bases);
        tokio::spawn(
            async move { serve_stream(&connection, send, recv, &shared, &bases).await }
                .instrument(tracing::Span::current()),
        );
    }
}

/// One exchange: read a report, answer it.
async fn serve_stream(
    connection: &quinn::Connection,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    shared: &Shared,
    bases: &Mutex<Bases>,
) {
    let message = match tokio::time::timeout(READ_TIMEOUT, frames::read_sized(&mut recv)).await {
        Ok(Ok((message, bytes))) => {
            let bytes = bytes as u64;
            shared.metrics.frame_bytes_total.fetch_add(bytes, Relaxed);
            if matches!(message, Message::Changes(_)) {
                shared.metrics.changes_bytes_total.fetch_add(bytes, Relaxed);
            }
            message
        }
        Ok(Err(err)) => {
            refuse(connection, &mut send, &mut recv, &err, shared).await;
            return;
        }
        Err(_) => {
            // A slow or hostile node on every stream: once per period, counted.
            if let Some(suppressed) = shared.metrics.logs.frames.pass(shared.now_secs()) {
                tracing::warn!(
                    suppressed,
                    "report not received in full within {READ_TIMEOUT:?}; dropping the stream"
                );
            }
            let _ = recv.stop(wire::close::MALFORMED.into());
            let _ = send.reset(wire::close::MALFORMED.into());
            return;
        }
    };
    // Changes are rebuilt into the report the node sent, against the one
    // this connection kept; every report is kept for the next changes.
    let message = match message {
        Message::Changes(changes) => {
            let base = changes.base;
            let rebuilt = {
                let bases = bases.lock();
                match bases.get(base) {
                    Some(rooms) => changes.rebuild(rooms).ok_or("do not fit it"),
                    None => Err("is not one this aggregator holds for the connection"),
                }
            };
            match rebuilt {
                Ok(message) => {
                    shared.metrics.changes_reports_total.fetch_add(1, Relaxed);
                    message
                }
                Err(why) => {
                    shared.metrics.changes_refused_total.fetch_add(1, Relaxed);
                    tracing::debug!(base, why, "report as changes refused");
                    let refusal = Message::Refused(Refusal {
                        reason: RefusalReason::UnknownBase,
                        detail: format!(
                            "changes against report {base}, which {why}; send the report whole"
                        ),
                    });
                    if let Err(err) = frames::write(&mut send, &refusal).await {
                        tracing::debug!(%err, "could not send the refusal");
                    }
                    return;
                }
            }
        }
        other => other,
    };
    if let Some(frame) = message.report_frame() {
        bases.lock().keep(frame.seq, &frame.report.rooms);
    }
    // A lease report is a report from a node that asks on demand: merged
    // the same way, promised by its need (`cluster::promise`). A peer
    // report is a report from a node whose home is another aggregator:
    // merged, answered with no grant, its held leases counted. A home
    // report is either of the first two that also names the leases the
    // node holds, which the ledger counts until the node confirms.
    let (message, mut kind) = match message {
        Message::LeaseReport(frame) => (Message::Report(frame), Kind::Asking),
        Message::HomeReport(home) => (
            Message::Report(home.frame),
            Kind::Home {
                held: home.held,
                asks: home.asks,
                held_visitors: Vec::new(),
            },
        ),
        Message::HeldReport(report) => (
            Message::Report(report.home.frame),
            Kind::Home {
                held: report.home.held,
                asks: report.home.asks,
                held_visitors: report.held_visitors,
            },
        ),
        Message::PeerReport(peer) => (Message::Report(peer.frame), Kind::Peer(peer.held)),
        other => (other, Kind::Plain),
    };
    let answer = match message {
        Message::Report(frame) if !tls::peer_is(connection, &frame.report.node) => {
            shared.metrics.identity_refused_total.fetch_add(1, Relaxed);
            // An impostor retrying (or reconnecting) must not flood the log.
            if let Some(suppressed) = shared.metrics.logs.identity.pass(shared.now_secs()) {
                tracing::warn!(
                    claimed = %frame.report.node,
                    suppressed,
                    "refusing reports: the connection's certificate does not certify this node id"
                );
            }
            Message::Refused(Refusal {
                reason: RefusalReason::NotCertified,
                detail: format!(
                    "this connection's certificate does not certify node {:?}; node.id must be a name in the node's certificate",
                    frame.report.node
                ),
            })
        }
        Message::Report(mut frame) => {
            keep_own_rooms(shared, &mut frame, &mut kind);
            // The connection's span names the node once: a field recorded
            // again is appended by the log formatter, so recording it on
            // every report grew each connection's span (and every line it
            // logs) by the node's name twice a second, for as long as the
            // connection lived.
            if shared.claim(&frame.report.node, connection) {
                tracing::Span::current().record("node", frame.report.node.as_str());
            }
            let seq = frame.seq;
            let now = shared.clock.now();
            let running = frame.settings_version;
            shared
                .node_settings
                .lock()
                .insert(frame.report.node.clone(), running);
            let current = Arc::clone(&shared.settings.lock());
            // Only a node behind is sent the settings: most answers stay small.
            let settings = (running != Some(current.version)).then(|| (*current).clone());
            shared.pools.lock().insert(
                frame.report.node.clone(),
                NodePools {
                    colo: frame.report.colo.clone(),
                    at: now,
                    pools: frame.pools,
                },
            );
            let node = frame.report.node.clone();
            // The rooms a note would name (only a ledger can fail).
            let reported: Vec<_> = match shared.ledger {
                Some(_) => frame.report.rooms.iter().map(|r| r.room).collect(),
                None => Vec::new(),
            };
            let (mut rooms, grants) = {
                let mut cluster = shared.cluster();
                let merging = std::time::Instant::now();
                let rooms = match kind {
                    Kind::Asking => cluster.apply_asking(frame.report, now),
                    Kind::Plain => cluster.apply(frame.report, now),
                    Kind::Home {
                        held,
                        asks,
                        held_visitors,
                    } => {
                        shared.metrics.holding_reports_total.fetch_add(1, Relaxed);
                        if held_visitors.iter().any(|h| h.visitors > 0) {
                            shared
                                .metrics
                                .held_visitor_reports_total
                                .fetch_add(1, Relaxed);
                        }
                        if asks {
                            cluster.apply_held(frame.report, &held, &held_visitors, now)
                        } else {
                            cluster.apply_holding(frame.report, &held, false, now)
                        }
                    }
                    Kind::Peer(held) => {
                        cluster.apply_peer(frame.report, &held, now);
                        shared.metrics.peer_reports_total.fetch_add(1, Relaxed);
                        Vec::new()
                    }
                };
                // The grants of this merge, named by room for their keys
                // (none without a `[ledger]`, or for a peer report).
                let grants: Vec<_> = cluster
                    .shared_grants()
                    .iter()
                    .filter_map(|g| {
                        let def = cluster.rooms().iter().find(|d| d.room.id() == g.room)?;
                        Some((def.name.clone(), *g))
                    })
                    .collect();
                shared.metrics.merge.observe(merging.elapsed());
                (rooms, grants)
            };
            let mut held_back = match &shared.ledger {
                Some(ledger) if !grants.is_empty() => {
                    settle(shared, ledger, &node, &grants, &mut rooms).await
                }
                _ => Vec::new(),
            };
            // No grant to commit in this answer (or a peer's), but none
            // could be: the node hears it now, not at its next grant (a
            // minute's turn), and hears that it can again from the first
            // answer without a note.
            if held_back.is_empty() && shared.ledger.as_ref().is_some_and(|l| l.failing()) {
                held_back = reported;
            }
            shared.metrics.reports_total.fetch_add(1, Relaxed);
            let answer = Message::Answer(wire::AnswerFrame {
                seq,
                at: now,
                rooms,
                settings,
            });
            if !held_back.is_empty() {
                // The node learns that this aggregator could not grant, and
                // may take its grants from another one meanwhile.
                let note = Message::Note(wire::AnswerNote { seq, held_back });
                if let Err(err) = frames::write_all(&mut send, &[answer, note]).await {
                    tracing::debug!(%err, "could not send the answer");
                }
                return;
            }
            answer
        }
        Message::Answer(_)
        | Message::Refused(_)
        | Message::LeaseReport(_)
        | Message::PeerReport(_)
        | Message::HomeReport(_)
        | Message::HeldReport(_)
        | Message::Changes(_)
        | Message::Note(_) => {
            shared.metrics.frames_refused_total.fetch_add(1, Relaxed);
            if let Some(suppressed) = shared.metrics.logs.frames.pass(shared.now_secs()) {
                tracing::warn!(
                    suppressed,
                    "peer sent an answer or refusal where a report belongs"
                );
            }
            Message::Refused(Refusal {
                reason: RefusalReason::Unexpected,
                detail: "the aggregator only accepts reports".into(),
            })
        }
    };
    if let Err(err) = frames::write(&mut send, &answer).await {
        tracing::debug!(%err, "could not send the answer");
    }
}

/// Rooms sharded between aggregator groups: leaves out of `frame` (and of
/// the leases it says the node holds) every room another group owns, so
/// this aggregator neither sums nor grants it, and the node's answer says
/// nothing of it (the node goes by its own last share there). A node that
/// sends such rooms has another list of groups than this aggregator: it is
/// counted and logged, at most once per period.
fn keep_own_rooms(shared: &Shared, frame: &mut wire::ReportFrame, kind: &mut Kind) {
    let Some(shard) = &shared.shard else { return };
    let mut foreign = Vec::new();
    frame.report.rooms.retain(|r| {
        let own = shard.owns(r.room);
        if !own {
            foreign.push(r.room);
        }
        own
    });
    if let Kind::Home { held, .. } | Kind::Peer(held) = kind {
        held.retain(|h| shard.owns(h.room));
    }
    if let Kind::Home { held_visitors, .. } = kind {
        held_visitors.retain(|h| shard.owns(h.room));
    }
    if foreign.is_empty() {
        return;
    }
    shared
        .metrics
        .foreign_rooms_total
        .fetch_add(foreign.len() as u64, Relaxed);
    if let Some(suppressed) = shared.metrics.logs.foreign.pass(shared.now_secs()) {
        let rooms: Vec<String> = {
            let cluster = shared.cluster();
            foreign
                .iter()
                .map(|id| {
                    cluster
                        .rooms()
                        .iter()
                        .find(|d| d.room.id() == *id)
                        .map_or_else(|| format!("{:#x}", id.0), |d| d.name.clone())
                })
                .collect()
        };
        tracing::warn!(
            node = %frame.report.node,
            ?rooms,
            group = shard.name(),
            groups = %shard.canonical(),
            suppressed,
            "a report names rooms another aggregator group owns; left out (the node's [[aggregator.groups]] differ from this aggregator's shard.groups)"
        );
    }
}

/// Commits the grants of one answer and tells the node only what etcd
/// holds for it (or, without a commit, what it held already); the
/// aggregator's own ledger is brought down to the same. Returns the rooms
/// whose grants no commit covered (held back).
async fn settle(
    shared: &Shared,
    ledger: &crate::committer::Committer,
    node: &str,
    grants: &[(String, waitroom_common::cluster::SharedGrant)],
    rooms: &mut [wire::RoomAnswer],
) -> Vec<waitroom_common::room::RoomId> {
    let told = ledger.commit(node, grants).await;
    let mut cluster = None;
    let mut held_back = Vec::new();
    for ((_, grant), told) in grants.iter().zip(told) {
        if told.held_back {
            held_back.push(grant.room);
        }
        if told.allowances != grant.allowances() {
            cluster
                .get_or_insert_with(|| shared.cluster())
                .settle_shared(node, grant, told.allowances, rooms);
        }
    }
    held_back
}

/// How a report is merged: as a node's home (granting by fair part, or by
/// need for a node that asks on demand), or as a peer (no grant; the
/// leases the node holds from its home).
enum Kind {
    Plain,
    Asking,
    Peer(Vec<wire::HeldLease>),
    Home {
        held: Vec<wire::HeldLease>,
        asks: bool,
        /// Visitors the node holds now (`Message::HeldReport`; none for a
        /// home report).
        held_visitors: Vec<wire::HeldVisitors>,
    },
}

/// Answers a bad frame with a refusal; a peer of another protocol version is
/// also disconnected, since nothing it sends can be read.
async fn refuse(
    connection: &quinn::Connection,
    send: &mut quinn::SendStream,
    recv: &mut quinn::RecvStream,
    err: &FrameError,
    shared: &Shared,
) {
    let Some(refusal) = err.refusal() else {
        tracing::debug!(%err, "stream ended before a whole frame");
        return;
    };
    shared.metrics.frames_refused_total.fetch_add(1, Relaxed);
    if let Some(suppressed) = shared.metrics.logs.frames.pass(shared.now_secs()) {
        tracing::warn!(%err, suppressed, "refusing frame");
    }
    // Whatever else the peer was sending on this stream is not wanted.
    let _ = recv.stop(err.close_code().into());
    let _ = frames::write(send, &Message::Refused(refusal)).await;
    if matches!(err, FrameError::Wire(WireError::UnsupportedVersion { .. })) {
        // Let the refusal reach the peer before the connection goes.
        let _ = tokio::time::timeout(Duration::from_secs(1), send.stopped()).await;
        connection.close(
            err.close_code().into(),
            format!(
                "unsupported protocol version; this aggregator speaks {}",
                wire::VERSION
            )
            .as_bytes(),
        );
    }
}

#[cfg(test)]
mod tests {
    use waitroom_common::{room::RoomId, time::ExpirySlot};

    use super::{BASES_KEPT, Bases, MAX_BASE_ENTRIES, RoomReport};

    fn rooms(slots: usize) -> Vec<RoomReport> {
        vec![RoomReport {
            room: RoomId(1),
            expiries: (0..slots as u64).map(|s| (ExpirySlot(s), 1)).collect(),
            ..RoomReport::default()
        }]
    }

    /// A connection's last three reports are kept by number, the oldest
    /// going first, and one larger than any node sends is not kept at all
    /// (changes against it are refused): a node cannot make the aggregator
    /// hold more than three reports of a bounded size per connection.
    #[test]
    fn the_last_reports_are_kept_and_an_oversized_one_is_not() {
        let mut bases = Bases::default();
        for seq in 1..=4 {
            bases.keep(seq, &rooms(seq as usize));
        }
        assert!(bases.get(1).is_none(), "the oldest went");
        for seq in 2..=4 {
            assert_eq!(bases.get(seq).unwrap()[0].expiries.len(), seq as usize);
        }
        assert_eq!(bases.reports.len(), BASES_KEPT);
        bases.keep(5, &rooms(MAX_BASE_ENTRIES + 1));
        assert!(bases.get(5).is_none(), "too large to keep");
        assert!(bases.get(4).is_some(), "the others stay");
        bases.keep(6, &rooms(MAX_BASE_ENTRIES));
        assert!(bases.get(6).is_some(), "the largest a node sends is kept");
    }
}
