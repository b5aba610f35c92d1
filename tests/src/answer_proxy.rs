//! A QUIC proxy in front of a real aggregator that reshapes what follows
//! each answer, as a test sets it at any moment: the notes an aggregator
//! adds after an answer (`Message::Note`), right or wrong, and a broken
//! stream end (`tests/tests/answer_notes.rs`); answers it loses, and held
//! reports it refuses as an aggregator from before them would
//! (`tests/tests/lost_asks.rs`).
//!
//! Nodes connect to it as to an aggregator (the cluster's aggregator
//! certificate); it connects to the real one as the node (the node's own
//! certificate, so the aggregator's identity check passes), and relays each
//! report on a stream of its own. The answers are the real aggregator's;
//! only what comes after them is the test's.
use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use waitroom_common::wire::{self, AnswerNote, HeldLease, Message, Refusal, RefusalReason};
use waitroom_runtime::{frames, tls};

use crate::cluster::Certs;

/// What the proxy sends after (or instead of) each of the aggregator's
/// answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Tail {
    /// The aggregator's frames as they came.
    Faithful,
    /// The answer, then a note naming the answer's rooms: "held back".
    Note,
    /// The answer, then a note for another answer's `seq`.
    NoteOfAnotherAnswer,
    /// The answer, then a note that names no room.
    EmptyNote,
    /// A note in place of the answer.
    NoteFirst,
    /// The answer, then bytes that are no frame, then the stream's end.
    Garbage,
    /// The answer, and the stream left open (neither another frame nor its
    /// end) for two seconds.
    LeftOpen,
    /// No answer, the stream left open for five seconds: every answer lost
    /// (an aggregator that takes reports and never answers).
    Withheld,
}

impl Tail {
    const ALL: [Self; 8] = [
        Self::Faithful,
        Self::Note,
        Self::NoteOfAnotherAnswer,
        Self::EmptyNote,
        Self::NoteFirst,
        Self::Garbage,
        Self::LeftOpen,
        Self::Withheld,
    ];

    fn from_u8(v: u8) -> Self {
        Self::ALL
            .get(usize::from(v))
            .copied()
            .unwrap_or(Self::Faithful)
    }
}

/// Reports and answers relayed, and answers to lose (each a one-off
/// [`Tail::Withheld`]).
#[derive(Debug, Default)]
struct Counts {
    reports: AtomicU64,
    answers: AtomicU64,
    to_lose: AtomicU64,
    /// Answers to lose of reports that confirm a lowered cap.
    confirms_to_lose: AtomicU64,
    /// The answer to every n-th report is lost (0: none).
    lose_every: AtomicU64,
    lost: AtomicU64,
    /// The leases named by the last home report.
    last_held: Mutex<Option<Vec<HeldLease>>>,
    /// Held reports are refused as malformed, as by an aggregator from
    /// before them.
    refuse_held_reports: AtomicBool,
    /// The next this many reports sent as changes are refused, with
    /// `refuse_changes_malformed` as an aggregator from before them would,
    /// else as one that no longer holds their base.
    refuse_changes: AtomicU64,
    refuse_changes_malformed: AtomicBool,
    /// Every report's arrival, and whether its answer was lost.
    log: Mutex<Vec<Arrival>>,
}

/// A report as it reached the proxy.
#[derive(Clone, Copy, Debug)]
pub struct Arrival {
    pub at: Instant,
    /// It named a lower cap than the home report before it: it confirms a
    /// lowered cap.
    pub confirms: bool,
    /// Its answer was lost (by [`AnswerProxy::lose_next`],
    /// [`AnswerProxy::lose_next_confirmation`] or [`Tail::Withheld`]).
    pub lost: bool,
    /// It was a home report (`Message::HomeReport` or
    /// `Message::HeldReport`).
    pub home: bool,
    /// It was a held report (`Message::HeldReport`), naming this many held
    /// visitors in all; `None` for any other frame.
    pub held_visitors: Option<u64>,
    /// It was refused by [`AnswerProxy::refuse_held_reports`].
    pub refused: bool,
    /// It was sent as the changes since an earlier report (`Message::Changes`).
    pub changes: bool,
    /// It was refused by [`AnswerProxy::refuse_changes`].
    pub changes_refused: bool,
    /// The frame's length (header and payload).
    pub bytes: usize,
}

/// A running proxy; it stops when dropped.
#[derive(Debug)]
pub struct AnswerProxy {
    /// Where nodes connect.
    pub listen: SocketAddr,
    tail: Arc<AtomicU8>,
    counts: Arc<Counts>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl AnswerProxy {
    /// Starts a proxy on `listen` to the aggregator at `upstream` for the
    /// node `node` (its certificate from `certs`), on its own runtime thread.
    pub fn start(
        listen: SocketAddr,
        upstream: SocketAddr,
        certs: &Certs,
        node: &str,
    ) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let (cert, key) = certs.pair("aggregator");
        let server_files = tls::TlsFiles {
            ca: certs.ca(),
            cert,
            key,
        };
        let (cert, key) = certs.pair(node);
        let client_files = tls::TlsFiles {
            ca: certs.ca(),
            cert,
            key,
        };
        let server = tls::server_config(&server_files).context("the proxy's server config")?;
        let client = tls::client_config(&client_files).context("the proxy's client config")?;
        let (front, back) = runtime.block_on(async {
            let front = tls::server_endpoint(server, listen, &server_files)?;
            let mut back = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
            back.set_default_client_config(client);
            anyhow::Ok((front, back))
        })?;
        let listen = front.local_addr()?;
        let tail = Arc::new(AtomicU8::new(Tail::Faithful as u8));
        let counts = Arc::new(Counts::default());
        runtime.spawn(accept(
            front,
            back,
            upstream,
            Arc::clone(&tail),
            Arc::clone(&counts),
        ));
        Ok(Self {
            listen,
            tail,
            counts,
            runtime: Some(runtime),
        })
    }

    /// What follows each answer from now on.
    pub fn set(&self, tail: Tail) {
        self.tail.store(tail as u8, Relaxed);
    }

    /// The aggregator's answers relayed so far (whatever followed them; not
    /// those lost).
    pub fn answers(&self) -> u64 {
        self.counts.answers.load(Relaxed)
    }

    /// Reports that reached the proxy so far.
    pub fn reports(&self) -> u64 {
        self.counts.reports.load(Relaxed)
    }

    /// The answers to the next `n` reports are lost ([`Tail::Withheld`]
    /// for them alone).
    pub fn lose_next(&self, n: u64) {
        self.counts.to_lose.store(n, Relaxed);
    }

    /// The answer to the next report that confirms a lowered cap (a home
    /// report naming a lower cap than the home report before it) is lost.
    pub fn lose_next_confirmation(&self) {
        self.counts.confirms_to_lose.store(1, Relaxed);
    }

    /// From now on the answer to every `n`-th report is lost (0: none): a
    /// path that loses one answer in `n`, deterministically.
    pub fn lose_every(&self, n: u64) {
        self.counts.lose_every.store(n, Relaxed);
    }

    /// From now on held reports are refused as malformed, as an aggregator
    /// from before them refuses them (`false`: relayed again).
    pub fn refuse_held_reports(&self, refuse: bool) {
        self.counts.refuse_held_reports.store(refuse, Relaxed);
    }

    /// The next `n` reports sent as changes are refused (`u64::MAX`: all
    /// from now on): as malformed, as an aggregator from before changes
    /// refuses them, or (`malformed` false) as changes against a report the
    /// aggregator no longer holds (`RefusalReason::UnknownBase`).
    pub fn refuse_changes(&self, n: u64, malformed: bool) {
        self.counts
            .refuse_changes_malformed
            .store(malformed, Relaxed);
        self.counts.refuse_changes.store(n, Relaxed);
    }

    /// Every report so far, in the order they arrived.
    pub fn arrivals(&self) -> Vec<Arrival> {
        self.counts
            .log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Answers lost so far by [`Self::lose_next`] or [`Tail::Withheld`].
    pub fn lost(&self) -> u64 {
        self.counts.lost.load(Relaxed)
    }
}

impl Drop for AnswerProxy {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

async fn accept(
    front: quinn::Endpoint,
    back: quinn::Endpoint,
    upstream: SocketAddr,
    tail: Arc<AtomicU8>,
    counts: Arc<Counts>,
) {
    while let Some(incoming) = front.accept().await {
        let (back, tail, counts) = (back.clone(), Arc::clone(&tail), Arc::clone(&counts));
        tokio::spawn(async move {
            let Ok(node) = incoming.await else { return };
            let Ok(connecting) = back.connect(upstream, "localhost") else {
                return;
            };
            let Ok(aggregator) = connecting.await else {
                node.close(0u32.into(), b"upstream unreachable");
                return;
            };
            while let Ok((send, recv)) = node.accept_bi().await {
                let (aggregator, tail, counts) =
                    (aggregator.clone(), Arc::clone(&tail), Arc::clone(&counts));
                tokio::spawn(async move {
                    let _ = relay(&aggregator, send, recv, &tail, &counts).await;
                });
            }
            aggregator.close(0u32.into(), b"node gone");
        });
    }
}

/// One report to the aggregator and its frames back, with the tail the
/// test set.
async fn relay(
    aggregator: &quinn::Connection,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    tail: &AtomicU8,
    counts: &Counts,
) -> Result<()> {
    let (report, bytes) = frames::read_sized(&mut recv).await?;
    let at = Instant::now();
    let number = counts.reports.fetch_add(1, Relaxed) + 1;
    let every = counts.lose_every.load(Relaxed);
    // A report sent as changes is judged by the report it carries.
    let whole = match &report {
        Message::Changes(changes) => changes.report.clone().into_message(),
        other => other.clone(),
    };
    let held_visitors = match &whole {
        Message::HeldReport(held) => Some(held.held_visitors.iter().map(|h| h.visitors).sum()),
        _ => None,
    };
    let refused = held_visitors.is_some() && counts.refuse_held_reports.load(Relaxed);
    let home = match &whole {
        Message::HomeReport(home) => Some(home),
        Message::HeldReport(held) => Some(&held.home),
        _ => None,
    };
    let confirms = match home {
        Some(home) if !refused => {
            let mut last = counts
                .last_held
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let lowered = last
                .as_ref()
                .is_some_and(|before| HeldLease::lowered(before, &home.held));
            *last = Some(home.held.clone());
            lowered
        }
        _ => false,
    };
    let take = |n: &AtomicU64| {
        n.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
            .is_ok()
    };
    let changes = matches!(report, Message::Changes(_));
    let changes_refused = changes && take(&counts.refuse_changes);
    let refused = refused && !changes_refused;
    // Decided as the report arrives: the answer to this report is lost.
    let lose = !refused
        && !changes_refused
        && ((confirms && take(&counts.confirms_to_lose))
            || take(&counts.to_lose)
            || (every > 0 && number.is_multiple_of(every)));
    let withheld = !refused
        && !changes_refused
        && (lose || Tail::from_u8(tail.load(Relaxed)) == Tail::Withheld);
    counts
        .log
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(Arrival {
            at,
            confirms,
            lost: withheld,
            home: home.is_some(),
            held_visitors,
            refused,
            changes,
            changes_refused,
            bytes,
        });
    if changes_refused {
        let reason = if counts.refuse_changes_malformed.load(Relaxed) {
            RefusalReason::Malformed
        } else {
            RefusalReason::UnknownBase
        };
        let refusal = Message::Refused(Refusal {
            reason,
            detail: "refused by the test's proxy".into(),
        });
        frames::write(&mut send, &refusal).await?;
        return Ok(());
    }
    if refused {
        // As an aggregator from before held reports: an unknown variant
        // does not decode.
        let refusal = Message::Refused(Refusal {
            reason: RefusalReason::Malformed,
            detail: "the frame's payload does not decode".into(),
        });
        frames::write(&mut send, &refusal).await?;
        return Ok(());
    }
    let (mut up_send, mut up_recv) = aggregator.open_bi().await?;
    frames::write(&mut up_send, &report).await?;
    let mut replies = Vec::new();
    while let Some(message) = frames::read_next(&mut up_recv).await? {
        replies.push(message);
    }
    let Some(Message::Answer(answer)) = replies.first() else {
        // A refusal goes back as it came.
        frames::write_all(&mut send, &replies).await?;
        return Ok(());
    };
    let tail = match Tail::from_u8(tail.load(Relaxed)) {
        _ if lose => Tail::Withheld,
        tail => tail,
    };
    if tail != Tail::Withheld {
        counts.answers.fetch_add(1, Relaxed);
    }
    let note = |seq, held_back| Message::Note(AnswerNote { seq, held_back });
    let rooms: Vec<_> = answer.rooms.iter().map(|r| r.room).collect();
    let (seq, answer) = (answer.seq, replies[0].clone());
    match tail {
        Tail::Faithful => frames::write_all(&mut send, &replies).await?,
        Tail::Note => frames::write_all(&mut send, &[answer, note(seq, rooms)]).await?,
        Tail::NoteOfAnotherAnswer => {
            frames::write_all(&mut send, &[answer, note(seq + 1, rooms)]).await?;
        }
        Tail::EmptyNote => frames::write_all(&mut send, &[answer, note(seq, Vec::new())]).await?,
        Tail::NoteFirst => frames::write(&mut send, &note(seq, rooms)).await?,
        Tail::Garbage => {
            send.write_all(&wire::encode(&answer)?).await?;
            send.write_all(b"\xff\xffnot a frame at all").await?;
            send.finish()?;
        }
        Tail::LeftOpen => {
            send.write_all(&wire::encode(&answer)?).await?;
            tokio::time::sleep(Duration::from_secs(2)).await;
            send.finish()?;
        }
        Tail::Withheld => {
            counts.lost.fetch_add(1, Relaxed);
            tokio::time::sleep(Duration::from_secs(5)).await;
            send.finish()?;
        }
    }
    Ok(())
}

/// One node that reaches its first-choice aggregator through an
/// [`AnswerProxy`], with the real binaries on loopback: an origin,
/// `aggregators` real aggregators serving `room` (the first behind the
/// proxy), and the node, whose name makes the proxy its first choice of
/// home. Returned once the node is fresh through the proxy.
#[derive(Debug)]
pub struct ProxiedNode {
    _dir: crate::procs::TempDir,
    _origin: crate::procs::Proc,
    aggregators: Vec<crate::cluster::Aggregator>,
    pub proxy: AnswerProxy,
    /// What the node lists: the proxy (its first choice), then the other
    /// aggregators.
    pub addresses: Vec<SocketAddr>,
    pub edge: crate::edge::Edge,
}

impl ProxiedNode {
    /// Starts it all in a temporary directory named after `name`; the node
    /// reports every `interval_ms`.
    pub fn start(name: &str, aggregators: usize, room: &str, interval_ms: u64) -> Self {
        use crate::cluster::{
            Aggregator, aggregator_config, free_udp_addr, named_homed_at, start_nodes,
        };
        let dir = crate::procs::TempDir::new(name);
        let (origin_proc, origin) = crate::procs::start_origin(dir.path(), "origin").unwrap();
        let addresses: Vec<SocketAddr> = (0..aggregators.max(1))
            .map(|_| free_udp_addr().unwrap())
            .collect();
        let node = named_homed_at("ams", &addresses, 0);
        let certs = Certs::generate(&dir.path().join("certs"), &[node.as_str()]).unwrap();
        let behind = free_udp_addr().unwrap();
        let started: Vec<Aggregator> = std::iter::once(behind)
            .chain(addresses[1..].iter().copied())
            .enumerate()
            .map(|(i, at)| {
                let snapshot = dir.path().join(format!("aggregator-{i}.json"));
                let config = aggregator_config(at, &certs, &snapshot, room);
                Aggregator::start(dir.path(), &format!("aggregator-{i}"), &config).unwrap()
            })
            .collect();
        let proxy = AnswerProxy::start(addresses[0], behind, &certs, &node).unwrap();
        let edge = start_nodes(
            dir.path(),
            &certs,
            &addresses,
            &[(node.as_str(), "ams")],
            room,
            origin,
            interval_ms,
        )
        .pop()
        .unwrap();
        let setup = Self {
            _dir: dir,
            _origin: origin_proc,
            aggregators: started,
            proxy,
            addresses,
            edge,
        };
        let since = crate::minutes::now_secs();
        assert!(
            crate::eventually(Duration::from_secs(15), || setup.fresh_at(0, since)),
            "the node fresh from its first choice, through the proxy"
        );
        setup
    }

    /// The node's `/metrics`.
    pub fn metrics(&self) -> String {
        crate::edge::get_text(&self.edge.admin_url("/metrics"))
    }

    /// One series of the node's metrics (0 when absent).
    pub fn metric(&self, series: &str) -> f64 {
        crate::edge::metric(&self.metrics(), series).unwrap_or(0.0)
    }

    /// Home at `addresses[i]`, with a state taken since `since` (seconds).
    pub fn fresh_at(&self, i: usize, since: f64) -> bool {
        crate::edge::fresh_from(&self.metrics(), self.addresses[i], since)
    }

    /// The node's home now, by index into `addresses`.
    pub fn home(&self) -> Option<usize> {
        crate::edge::home_among(&self.metrics(), &self.addresses)
    }

    /// Sets the proxy's `tail`, then the node must be fresh at
    /// `addresses[i]` since then within 5 s (`what` says why).
    pub fn set_until_fresh_at(&self, tail: Tail, i: usize, what: &str) {
        self.proxy.set(tail);
        let since = crate::minutes::now_secs();
        assert!(
            crate::eventually(Duration::from_secs(5), || self.fresh_at(i, since)),
            "{what}"
        );
    }

    /// One series of the metrics of the aggregator behind the proxy (0
    /// when absent).
    pub fn aggregator_metric(&self, series: &str) -> f64 {
        let text = crate::edge::get_text(&self.aggregators[0].admin_url("/metrics"));
        crate::edge::metric(&text, series).unwrap_or(0.0)
    }

    /// `family{aggregator=<the proxy>}` at the node (0 when absent).
    pub fn of_the_proxy(&self, family: &str) -> f64 {
        self.metric(&format!("{family}{{aggregator=\"{}\"}}", self.addresses[0]))
    }

    /// Returns just after a periodic answer passed the proxy, so that the
    /// node's next report is one the test causes (the next periodic one is
    /// an interval away).
    pub fn just_after_an_answer(&self) {
        let before = self.proxy.answers();
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while self.proxy.answers() == before {
            assert!(
                std::time::Instant::now() < until,
                "an answer every interval"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        // The node takes it in.
        std::thread::sleep(Duration::from_millis(20));
    }
}
