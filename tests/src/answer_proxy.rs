//! A QUIC proxy in front of a real aggregator that reshapes what follows
//! each answer, as a test sets it at any moment: the notes an aggregator
//! adds after an answer (`Message::Note`), right or wrong, and a broken
//! stream end (`tests/tests/answer_notes.rs`).
//!
//! Nodes connect to it as to an aggregator (the cluster's aggregator
//! certificate); it connects to the real one as the node (the node's own
//! certificate, so the aggregator's identity check passes), and relays each
//! report on a stream of its own. The answers are the real aggregator's;
//! only what comes after them is the test's.
use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU8, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use anyhow::{Context, Result};
use waitroom_common::wire::{self, AnswerNote, Message};
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
    lost: AtomicU64,
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
    let report = frames::read(&mut recv).await?;
    counts.reports.fetch_add(1, Relaxed);
    // Decided as the report arrives: the answer to this report is lost.
    let lose = counts
        .to_lose
        .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
        .is_ok();
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
