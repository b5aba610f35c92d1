//! The gossip task: connect, report every interval, store the answers,
//! reconnect with jittered exponential backoff when anything breaks.
use std::{net::SocketAddr, sync::Arc, sync::atomic::Ordering::Relaxed, time::Duration};

use tracing::Instrument as _;
use waitroom_common::{
    aggregate::NodeReport,
    cluster::promise::{ask_timeout_ms, ask_within_hold_ms},
    share::{observed_share, own_counts, smooth_share},
    wire::{
        self, AnswerFrame, AnswerNote, ChangesFrame, HeldLease, HeldReportFrame, HomeReportFrame,
        Message, PeerReportFrame, RefusalReason, ReportFrame,
    },
};
use waitroom_runtime::{
    clock::{Clock, Elapsed},
    frames::{self, FrameError},
    shutdown::Shutdown,
};

use super::{
    GossipConfig, LeaseAsk, NodeIdentity, Reporter,
    home::Homes,
    status::GossipStatus,
    world::{RoomView, World, WorldView},
};

/// First reconnect delay; doubles per failed attempt up to [`BACKOFF_CAP`].
const BACKOFF_BASE: Duration = Duration::from_millis(100);
/// Longest wait between attempts, so a restarted aggregator hears from every
/// node within a few seconds.
const BACKOFF_CAP: Duration = Duration::from_secs(5);
/// A handshake that takes longer than this is abandoned and retried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Unanswered exchanges in a row after which the connection is presumed dead
/// (an aggregator killed without a goodbye sends no close, and QUIC's idle
/// timeout is longer than we want to wait).
const MAX_MISSED_ANSWERS: u32 = 2;

/// A move of the node's time to the aggregator's at least this large is
/// logged as a warning (this machine's clock is off, or stepped).
const CLOCK_STEP_WARN_MS: i64 = 1_000;

/// Jittered exponential backoff ("equal jitter": half fixed, half random), so
/// nodes that lost the aggregator together do not all come back in the same
/// millisecond.
#[derive(Debug, Clone)]
pub struct Backoff {
    attempt: u32,
    base: Duration,
    cap: Duration,
}

impl Backoff {
    #[must_use]
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            attempt: 0,
            base,
            cap,
        }
    }

    /// The next delay, with `jitter` in `[0, 1)`.
    pub fn next_delay(&mut self, jitter: f64) -> Duration {
        let exp = self
            .base
            .saturating_mul(1_u32 << self.attempt.min(16))
            .min(self.cap);
        self.attempt = self.attempt.saturating_add(1);
        exp / 2 + exp.mul_f64(jitter.clamp(0.0, 1.0) / 2.0)
    }

    /// After a success: the next failure starts from the base delay again.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// Why one report/answer exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error("cannot start a connection: {source}")]
    Connect { source: quinn::ConnectError },
    #[error("connection: {source}")]
    Connection { source: quinn::ConnectionError },
    #[error("{source}")]
    Wire { source: FrameError },
    #[error("aggregator refused the report ({reason:?}): {detail}")]
    Refused {
        reason: RefusalReason,
        detail: String,
    },
    #[error("answer for report {got}, expected {expected}")]
    WrongAnswer { got: u64, expected: u64 },
    #[error("aggregator sent a report instead of an answer")]
    Unexpected,
    #[error("no answer within {timeout:?}")]
    Timeout { timeout: Duration },
}

/// Everything the gossip task of one aggregator needs.
pub(super) struct Client {
    pub config: GossipConfig,
    /// This client's aggregator, `index` in [`Homes::addresses`].
    pub address: SocketAddr,
    pub index: usize,
    /// Which aggregator of the group is the node's home; shared by the
    /// group's clients.
    pub homes: Arc<Homes>,
    /// This client's aggregator group (index into `groups`), and every
    /// group's name: it reports only the rooms its group owns.
    pub group: usize,
    pub groups: Arc<[String]>,
    pub identity: NodeIdentity,
    pub reporter: Arc<dyn Reporter>,
    pub world: Arc<WorldView>,
    pub status: Arc<GossipStatus>,
    pub endpoint: quinn::Endpoint,
    /// The node's clock: report times and answer ages.
    pub clock: Clock,
    /// The on-demand lease: asks for out-of-cycle reports, told of failures.
    pub lease: Arc<LeaseAsk>,
}

impl Client {
    fn interval(&self) -> Duration {
        Duration::from_millis(self.config.interval_ms)
    }

    /// An answer must come back within two intervals (at least 1 s).
    fn answer_timeout(&self) -> Duration {
        (self.interval() * 2).max(Duration::from_secs(1))
    }

    /// Whether `room` is reported to this client's group.
    fn mine(&self, room: waitroom_common::room::RoomId) -> bool {
        self.groups.len() < 2
            || waitroom_common::shard::owner(room, &self.groups) == Some(self.group)
    }

    /// This client's aggregator is the node's home at the moment.
    fn is_home(&self) -> bool {
        self.homes.home(self.clock.elapsed()) == self.index
    }

    /// Runs until shutdown.
    pub async fn run(self, mut shutdown: Shutdown) {
        let span =
            tracing::info_span!("gossip", aggregator = %self.address, node = %self.identity.node);
        async move {
            let mut backoff = Backoff::new(BACKOFF_BASE, BACKOFF_CAP);
            let mut seq = 0_u64;
            let mut failed_attempts = 0_u32;
            loop {
                let connected = tokio::select! {
                    c = self.connect() => c,
                    () = shutdown.requested() => return,
                };
                match connected {
                    Ok(connection) => {
                        failed_attempts = 0;
                        if self.is_home() {
                            self.lease.connected();
                        }
                        self.status.connects_total.fetch_add(1, Relaxed);
                        tracing::info!("connected to the aggregator");
                        let ended = tokio::select! {
                            ended = self.session(&connection, &mut seq, &mut backoff) => ended,
                            () = shutdown.requested() => {
                                connection.close(wire::close::DONE.into(), b"node shutting down");
                                if self.homes.current() == self.index {
                                    self.status.groups[self.group].connected.store(false, Relaxed);
                                }
                                return;
                            }
                        };
                        if self.homes.current() == self.index {
                            self.status.groups[self.group].connected.store(false, Relaxed);
                            self.lease.failed();
                        }
                        tracing::warn!(reason = %ended, "gossip connection ended; reconnecting");
                        connection.close(wire::close::DONE.into(), b"reconnecting");
                    }
                    Err(err) => {
                        self.status.errors_total.fetch_add(1, Relaxed);
                        failed_attempts += 1;
                        // Loud on the first failure, quieter while it goes on (at most one line per 5 s anyway).
                        if failed_attempts == 1 {
                            tracing::warn!(%err, "cannot reach the aggregator; retrying with backoff");
                        } else {
                            tracing::debug!(%err, attempt = failed_attempts, "still cannot reach the aggregator");
                        }
                    }
                }
                let delay = backoff.next_delay(rand::random::<f64>());
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = shutdown.requested() => return,
                }
            }
        }
        .instrument(span)
        .await;
    }

    async fn connect(&self) -> Result<quinn::Connection, ExchangeError> {
        let connecting = self
            .endpoint
            .connect(self.address, &self.config.server_name)
            .map_err(|source| ExchangeError::Connect { source })?;
        match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
            Ok(Ok(connection)) => Ok(connection),
            Ok(Err(source)) => Err(ExchangeError::Connection { source }),
            Err(_) => Err(ExchangeError::Timeout {
                timeout: CONNECT_TIMEOUT,
            }),
        }
    }

    /// Reports every interval on `connection` until it breaks; returns why.
    async fn session(
        &self,
        connection: &quinn::Connection,
        seq: &mut u64,
        backoff: &mut Backoff,
    ) -> ExchangeError {
        let mut tick = tokio::time::interval(self.interval());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut missed = 0;
        // Home reports name the leases held, and held reports the visitors
        // held too; an aggregator from before either refuses it as
        // malformed, and then this connection sends the frame before it.
        let mut home_frames = HomeFrames::Held;
        // When a report last went at once to confirm a lowered cap (see
        // below): at most one such report per interval.
        let mut confirmed_at: Option<u64> = None;
        // Reports sent again at once since the last answer, each after an
        // ask's answer did not come within its wait (or a held visitor cut
        // a report's wait short). The first is waited for as the ask it
        // repeats; the second as a periodic report, so an aggregator that
        // answers nothing gets at most two reports more per answer.
        let mut sent_again = 0_u8;
        // The next report confirms a lowered cap: waited for as an ask.
        let mut confirming = false;
        // How long the last answered report took, sent to answered: with
        // the connection's round trip, how soon an ask sent again can be
        // answered (an aggregator that commits grants to a ledger answers
        // slower than the path's round trip).
        let mut answer_ms = 0_u64;
        // The last report of this connection the aggregator answered, by
        // `seq`: the next goes as the changes since it
        // (`Message::Changes`), about a tenth of the bytes. None before the
        // first answer and after the aggregator said it no longer holds it.
        let mut base: Option<(u64, Vec<waitroom_common::aggregate::RoomReport>)> = None;
        // An aggregator from before reports as changes refuses them as
        // malformed: whole reports from then on, on this connection.
        let mut changes_understood = true;
        loop {
            // On the interval, or at once for visitors held on the lease
            // (and prefetches): one report answers them all. Only the home
            // is asked out of cycle: only it grants.
            let was_home = self.is_home();
            let out_of_cycle = tokio::select! {
                _ = tick.tick() => false,
                () = self.lease.wanted(self.group), if was_home => true,
                // Another aggregator, the home, raised what the node holds:
                // this peer hears of it now, not an interval later.
                () = self.homes.wait_raised(), if !was_home => false,
            };
            if out_of_cycle {
                self.lease.asks_total.fetch_add(1, Relaxed);
            }
            *seq += 1;
            let now = self.clock.now();
            let at = self.clock.elapsed();
            // Asks for grants only as the home, with no other aggregator's
            // grant still to come, and waits for the answer no longer than
            // this aggregator stays the home (module `home`).
            let wait = self.homes.grant_wait(self.index, at);
            let home = self.homes.home(at) == self.index
                && wait != Some(0)
                && self.homes.begin_grant(self.index);
            let granting = home.then(|| Granting {
                homes: &self.homes,
                index: self.index,
            });
            // Numbered before the counters are read: a visitor held from
            // here on may not be counted, and waits for a later answer.
            let number = home.then(|| self.lease.begin_report());
            let mut rooms = self.reporter.report(now);
            rooms.retain(|r| self.mine(r.room));
            let mut held_visitors = self.reporter.held_visitors(now);
            held_visitors.retain(|h| self.mine(h.room));
            let report = NodeReport {
                node: self.identity.node.clone(),
                colo: self.identity.colo.clone(),
                at: now,
                rooms,
            };
            let full = self.answer_timeout();
            let (timeout, home_moves) = match wait.map(Duration::from_millis) {
                Some(wait) if home && wait < full => (wait, true),
                _ => (full, false),
            };
            let lease_report = home && self.lease.sends_lease_reports();
            // An ask waits a few round trips, not two intervals (module
            // `lease`); so does a confirmation of a lowered cap (no ask can
            // go meanwhile), and the first report sent again after either.
            // Whatever the report, once a visitor is held it is waited for
            // only within the hold. A second report sent again waits as a
            // periodic one does.
            let again = sent_again > 0;
            let confirm = std::mem::take(&mut confirming) && !out_of_cycle;
            let (ask_wait, hold_wait) = {
                let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
                let (wait, rtt, full) = (
                    ms(self.lease.wait()),
                    ms(connection.rtt()).max(answer_ms),
                    ms(full),
                );
                let asks = lease_report && sent_again < 2;
                (
                    (asks && (out_of_cycle || confirm || again))
                        .then(|| Duration::from_millis(ask_timeout_ms(wait, rtt, full))),
                    asks.then(|| Duration::from_millis(ask_within_hold_ms(wait, rtt, full))),
                )
            };
            let (timeout, short_ask) = match ask_wait {
                Some(wait) if wait < timeout => (wait, true),
                _ => (timeout, false),
            };
            let frame = ReportFrame {
                seq: *seq,
                report: report.clone(),
                pools: {
                    let mut pools = self.reporter.pools();
                    pools.retain(|p| self.mine(waitroom_common::room::RoomId::from_name(&p.room)));
                    pools
                },
                settings_version: match self.status.settings_version.load(Relaxed) {
                    0 => None,
                    v => Some(v),
                },
            };
            // What this node holds as it reports: sent to its home, and
            // compared with the answer's (one home grant at a time, so
            // nothing else changes it meanwhile).
            let held_before = if home { self.held() } else { Vec::new() };
            let message = if !home {
                Message::PeerReport(PeerReportFrame {
                    frame,
                    held: self.held(),
                })
            } else if home_frames != HomeFrames::None {
                let home = HomeReportFrame {
                    frame,
                    asks: lease_report,
                    held: held_before.clone(),
                };
                if lease_report && home_frames == HomeFrames::Held {
                    Message::HeldReport(HeldReportFrame {
                        home,
                        held_visitors,
                    })
                } else {
                    Message::HomeReport(home)
                }
            } else if lease_report {
                Message::LeaseReport(frame)
            } else {
                Message::Report(frame)
            };
            let holding_report = matches!(message, Message::HomeReport(_) | Message::HeldReport(_));
            let held_report = matches!(message, Message::HeldReport(_));
            let message = match base.as_ref().filter(|_| changes_understood) {
                Some((base, rooms)) => ChangesFrame::of(*base, rooms, message)
                    .map_or_else(|whole| *whole, Message::Changes),
                None => message,
            };
            let as_changes = matches!(message, Message::Changes(_));
            let sent = self.clock.elapsed();
            let (result, cut_short) = self
                .answer_within(exchange(connection, *seq, &message), timeout, hold_wait)
                .await;
            let result = match result {
                Ok((answer, recv)) => {
                    // Before the note, which may be waited for.
                    answer_ms = self.clock.elapsed().since(sent);
                    Ok((answer, read_note(recv, *seq).await))
                }
                Err(err) => Err(err),
            };
            match result {
                Ok((answer, note)) => {
                    base = Some((*seq, report.rooms.clone()));
                    missed = 0;
                    sent_again = 0;
                    backoff.reset();
                    let answered_at = self.clock.elapsed();
                    self.homes.answered(self.index, answered_at);
                    self.status.groups[self.group].answered_by[self.index].fetch_add(1, Relaxed);
                    // Whether it can grant, home or peer (module `home`).
                    let cannot_grant = note.is_some_and(|note| !note.held_back.is_empty());
                    let moved = if cannot_grant {
                        self.cannot_grant(answered_at, home)
                    } else {
                        if self.homes.grants_again(self.index) {
                            tracing::info!("the aggregator can grant again");
                        }
                        false
                    };
                    // A peer's answer grants nothing: it only shows that
                    // this aggregator could take over.
                    if home {
                        // Visitors held for this report wait for the next
                        // home's answer rather than decide on this one,
                        // which granted nothing new.
                        if let Some(number) = number
                            && !moved
                        {
                            self.lease.answer_to(number);
                        }
                        self.store(&report, answer, sent);
                        // A lowered cap stays counted at the home until
                        // this node says it got it: say so at once (once
                        // per interval), so the slots go back to the pool
                        // within a round trip, not an interval.
                        let now = self.clock.elapsed().0;
                        let interval_ms =
                            u64::try_from(self.interval().as_millis()).unwrap_or(u64::MAX);
                        let held_after = self.held();
                        if holding_report
                            && confirmed_at.is_none_or(|at| now.saturating_sub(at) >= interval_ms)
                            && HeldLease::lowered(&held_before, &held_after)
                        {
                            confirmed_at = Some(now);
                            confirming = true;
                            self.lease.confirms_total.fetch_add(1, Relaxed);
                            tick.reset_immediately();
                        }
                        if HeldLease::raised(&held_before, &held_after) {
                            self.homes.raised();
                        }
                        self.status.reports_total.fetch_add(1, Relaxed);
                        if !self.status.groups[self.group].connected.swap(true, Relaxed) {
                            tracing::info!("aggregator answering");
                        }
                        if moved {
                            // The next home reports now, once this grant
                            // is over.
                            drop(granting);
                            self.homes.raised();
                        }
                    }
                }
                Err(ExchangeError::Refused {
                    reason: RefusalReason::UnknownBase,
                    ..
                }) if as_changes => {
                    // The aggregator no longer holds the report these
                    // changes were against (answers lost, or it restarted):
                    // the report whole, at once.
                    tracing::debug!("changes refused: their base is not held; reporting whole");
                    base = None;
                    tick.reset_immediately();
                }
                Err(ExchangeError::Refused {
                    reason: RefusalReason::Malformed,
                    ..
                }) if as_changes => {
                    tracing::info!(
                        "the aggregator does not take reports as changes (an older version); sending whole reports"
                    );
                    changes_understood = false;
                    tick.reset_immediately();
                }
                Err(err) => {
                    self.status.errors_total.fetch_add(1, Relaxed);
                    let malformed = matches!(
                        err,
                        ExchangeError::Refused {
                            reason: RefusalReason::Malformed,
                            ..
                        }
                    );
                    if holding_report && malformed {
                        // An aggregator from before this frame: the frame
                        // before it, at once.
                        let (back, says) = HomeFrames::before(held_report);
                        tracing::info!("{says}");
                        home_frames = back;
                        tick.reset_immediately();
                        continue;
                    }
                    if lease_report && malformed {
                        // An aggregator from before lease reports: plain
                        // reports again, at once.
                        self.lease.unsupported();
                        tick.reset_immediately();
                        continue;
                    }
                    if home {
                        self.lease.failed();
                    }
                    match err {
                        ExchangeError::Timeout { timeout } if short_ask || cut_short => {
                            // Lost or slow: report again at once, and
                            // wait for that one as for any report. Not a
                            // sign of a dead connection by itself.
                            if out_of_cycle || again {
                                self.lease.asks_unanswered_total.fetch_add(1, Relaxed);
                            } else {
                                self.lease.reports_cut_short_total.fetch_add(1, Relaxed);
                            }
                            tracing::debug!(
                                ?timeout,
                                confirm,
                                cut_short,
                                "no answer to an ask, or to a report a held visitor waits behind; reporting again"
                            );
                            sent_again += 1;
                            tick.reset_immediately();
                        }
                        ExchangeError::Timeout { .. } if home_moves => {
                            // Past its grace: the next report goes to the
                            // next home. Not a sign of a dead connection
                            // by itself (the full timeout is).
                            tracing::debug!("no answer within the home's grace; the home moves");
                        }
                        ExchangeError::Timeout { .. } => {
                            missed += 1;
                            tracing::debug!(missed, "no answer in time");
                            if missed >= MAX_MISSED_ANSWERS {
                                return err;
                            }
                        }
                        ExchangeError::Refused {
                            reason: RefusalReason::TooLarge { .. } | RefusalReason::Malformed,
                            ..
                        } => {
                            // The next report may be fine; the connection is.
                            tracing::warn!(%err, "report refused");
                        }
                        other => return other,
                    }
                }
            }
        }
    }

    /// Waits for `exchange`'s answer at most `timeout`; once a visitor is
    /// held (at once if one is), at most `hold_wait` more from then
    /// (`promise::ask_within_hold_ms`): the client sends one report at a
    /// time, so a lost answer to the report on its way would keep the held
    /// visitor's ask from going until the hold ended. `true` with the
    /// timeout when the hold cut the wait short.
    async fn answer_within<T>(
        &self,
        exchange: impl Future<Output = Result<T, ExchangeError>>,
        timeout: Duration,
        hold_wait: Option<Duration>,
    ) -> (Result<T, ExchangeError>, bool) {
        let started = tokio::time::Instant::now();
        let mut deadline = started + timeout;
        let mut watching = hold_wait.is_some();
        let mut cut = false;
        tokio::pin!(exchange);
        loop {
            tokio::select! {
                result = &mut exchange => return (result, false),
                () = tokio::time::sleep_until(deadline) => {
                    let timeout = deadline.duration_since(started);
                    return (Err(ExchangeError::Timeout { timeout }), cut);
                }
                () = self.lease.hold_begins(), if watching => {
                    watching = false;
                    let by = tokio::time::Instant::now() + hold_wait.unwrap_or(timeout);
                    if by < deadline {
                        deadline = by;
                        cut = true;
                    }
                }
            }
        }
    }

    /// This aggregator answered that it cannot grant (`Message::Note`):
    /// noted, counted, logged when it starts; for the home's answer,
    /// whether the node now has another home to take its grants from.
    fn cannot_grant(&self, at: Elapsed, home: bool) -> bool {
        self.status.groups[self.group].held_back_by[self.index].fetch_add(1, Relaxed);
        let started = self.homes.held_back(self.index);
        let next = self.homes.home(at);
        let moved = home && next != self.index;
        if started && next != self.index {
            tracing::warn!(
                next = %self.homes.addresses()[next],
                "the aggregator cannot make grants durable (its [ledger] failing or fenced); taking grants from another aggregator while it says so"
            );
        } else if started {
            tracing::warn!(
                "the aggregator cannot make grants durable (its [ledger] failing or fenced), and no other aggregator that can answers; admitting within what this node holds"
            );
        }
        moved
    }

    /// The leases this node holds from its home, as its last answer gave
    /// them, for a peer or home report.
    fn held(&self) -> Vec<HeldLease> {
        self.world
            .load()
            .rooms
            .iter()
            .filter(|room| self.mine(room.room))
            .map(|room| HeldLease::of(room.room, &room.state))
            .collect()
    }

    /// Swaps in a world built from `answer`, carrying each room's share over.
    /// `sent`: the monotonic clock when the report left, which bounds when
    /// the aggregator read its clock for `answer.at`.
    fn store(&self, report: &NodeReport, answer: AnswerFrame, sent: Elapsed) {
        let received = self.clock.elapsed();
        let step = self.clock.follow(answer.at, sent, received);
        let offset_ms = self.clock.offset_from_wall();
        self.status.clock_offset_ms.store(offset_ms, Relaxed);
        if let Some(step) = step
            && step.abs() >= CLOCK_STEP_WARN_MS
        {
            tracing::warn!(
                step_ms = step,
                offset_ms,
                "this node's time moved to the aggregator's: the node counts minutes and sessions on the cluster's time (offset_ms: how far this machine's own clock is behind it); check its NTP"
            );
        }
        let received_at = self.clock.now();
        self.world.update(|previous| {
            // The other groups' rooms stay as their homes last told them.
            let mut rooms: Vec<RoomView> = previous
                .rooms
                .iter()
                .filter(|r| !self.mine(r.room))
                .cloned()
                .collect();
            rooms.extend(answer.rooms.into_iter().filter(|r| self.mine(r.room)).map(
                |room_answer| {
                    let own = report.rooms.iter().find(|r| r.room == room_answer.room);
                    let observed = own.and_then(|own| {
                        let (active, admitted) = own_counts(own, room_answer.state.as_of);
                        observed_share(&room_answer.state, active, admitted)
                    });
                    let before = previous.room(room_answer.room).and_then(|r| r.share);
                    RoomView {
                        room: room_answer.room,
                        state: Arc::new(room_answer.state),
                        share: smooth_share(before, observed),
                        received,
                    }
                },
            ));
            let mut world = World {
                received_at: Some(received_at),
                groups: previous.groups.clone(),
                aggregator_at: Some(answer.at),
                rooms,
                settings: answer.settings.map(Arc::new),
            };
            world.answered(self.group, self.groups.len().max(1), received);
            world
        });
    }
}

/// Which frame a home report goes in on a connection: the newest the
/// aggregator takes (each older aggregator refuses the newer frames as
/// malformed, and the connection steps back one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HomeFrames {
    /// `Message::HeldReport` when asking (`Message::HomeReport` if not).
    Held,
    /// `Message::HomeReport`.
    Home,
    /// `Message::LeaseReport` or `Message::Report`.
    None,
}

impl HomeFrames {
    /// The frames to send once a held report (`held`) or a home report was
    /// refused as malformed, and what to log.
    fn before(held: bool) -> (Self, &'static str) {
        if held {
            (
                Self::Home,
                "the aggregator does not take held reports; sending home reports",
            )
        } else {
            (
                Self::None,
                "the aggregator does not take home reports; sending plain reports",
            )
        }
    }
}

/// A report asking for grants in flight ([`Homes::begin_grant`]); ends it
/// when dropped: answered, failed, timed out, or the session dropped
/// mid-exchange.
struct Granting<'a> {
    homes: &'a Homes,
    index: usize,
}

impl Drop for Granting<'_> {
    fn drop(&mut self) {
        self.homes.end_grant(self.index);
    }
}

/// The note after answer `seq` on its stream, if the aggregator added one
/// (`Message::Note`). The aggregator finishes the stream right after the
/// answer or its note, so this is at once; at most [`NOTE_WAIT`] if the
/// end of the stream travels apart from the answer and is lost. A note
/// that cannot be read takes nothing from the answer.
async fn read_note(mut recv: quinn::RecvStream, seq: u64) -> Option<AnswerNote> {
    match tokio::time::timeout(NOTE_WAIT, frames::read_next(&mut recv)).await {
        Ok(Ok(Some(Message::Note(note)))) if note.seq == seq => Some(note),
        Ok(Ok(_)) | Err(_) => None,
        Ok(Err(err)) => {
            tracing::debug!(%err, "could not read the answer's note");
            None
        }
    }
}

/// How long an answer's note is waited for once the answer is in.
const NOTE_WAIT: Duration = Duration::from_millis(100);

/// One report (`message`, numbered `seq`) on a fresh bidirectional stream,
/// one answer back, and the stream to read its note from.
async fn exchange(
    connection: &quinn::Connection,
    seq: u64,
    message: &Message,
) -> Result<(AnswerFrame, quinn::RecvStream), ExchangeError> {
    let (mut send, mut recv) = connection
        .open_bi()
        .await
        .map_err(|source| ExchangeError::Connection { source })?;
    frames::write(&mut send, message)
        .await
        .map_err(|source| ExchangeError::Wire { source })?;
    match frames::read(&mut recv).await {
        Ok(Message::Answer(answer)) if answer.seq == seq => Ok((answer, recv)),
        Ok(Message::Answer(answer)) => Err(ExchangeError::WrongAnswer {
            got: answer.seq,
            expected: seq,
        }),
        Ok(Message::Refused(refusal)) => Err(ExchangeError::Refused {
            reason: refusal.reason,
            detail: refusal.detail,
        }),
        Ok(
            Message::Report(_)
            | Message::LeaseReport(_)
            | Message::PeerReport(_)
            | Message::HomeReport(_)
            | Message::HeldReport(_)
            | Message::Changes(_)
            | Message::Note(_),
        ) => Err(ExchangeError::Unexpected),
        // A stream reset or connection loss shows up as a read error; surface
        // the connection's own reason when there is one.
        Err(source) => Err(match connection.close_reason() {
            Some(source) => ExchangeError::Connection { source },
            None => ExchangeError::Wire { source },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        assert_eq!(b.next_delay(0.0), Duration::from_millis(50));
        assert_eq!(b.next_delay(1.0), Duration::from_millis(200));
        assert_eq!(b.next_delay(0.5), Duration::from_millis(300));
        for _ in 0..40 {
            let d = b.next_delay(0.999);
            assert!(d <= Duration::from_secs(5), "{d:?}");
        }
        assert!(
            b.next_delay(0.0) >= Duration::from_millis(2_500),
            "at the cap, at least half of it"
        );
        b.reset();
        assert_eq!(b.next_delay(0.0), Duration::from_millis(50));
    }
}
