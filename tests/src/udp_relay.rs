//! A UDP relay between nodes and an aggregator that drops and delays
//! packets, each way, as a test sets it at any moment: the loss and delay
//! `tc netem` would give, for kernels built without it (this machine's has
//! no `sch_netem`; `tests/tests/aggregator_faults.rs`).
//!
//! Each client address gets a socket of its own towards the target, so the
//! aggregator sees one peer per node, as without the relay. Packets are
//! real: QUIC's loss recovery, handshakes and timeouts run as on a network.
use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU32, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use tokio::net::UdpSocket;

/// Loss (percent) and delay (ms) of one direction, changeable at any time.
#[derive(Debug, Default)]
pub struct Impairment {
    pub loss_pct: AtomicU32,
    pub delay_ms: AtomicU64,
}

impl Impairment {
    pub fn set(&self, loss_pct: u32, delay_ms: u64) {
        self.loss_pct.store(loss_pct.min(100), Relaxed);
        self.delay_ms.store(delay_ms, Relaxed);
    }
}

/// A running relay; it stops when dropped.
#[derive(Debug)]
pub struct UdpRelay {
    /// Where nodes send (127.0.0.1, a free port).
    pub listen: SocketAddr,
    /// Nodes → target.
    pub towards: Arc<Impairment>,
    /// Target → nodes.
    pub back: Arc<Impairment>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl UdpRelay {
    /// Starts a relay to `target` on its own runtime thread.
    pub fn start(target: SocketAddr) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let front = runtime.block_on(UdpSocket::bind("127.0.0.1:0"))?;
        let listen = front.local_addr()?;
        let towards = Arc::new(Impairment::default());
        let back = Arc::new(Impairment::default());
        runtime.spawn(relay(
            Arc::new(front),
            target,
            Arc::clone(&towards),
            Arc::clone(&back),
        ));
        Ok(Self {
            listen,
            towards,
            back,
            runtime: Some(runtime),
        })
    }
}

impl Drop for UdpRelay {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A small xorshift: loss draws need no quality, only independence from
/// the traffic.
struct Draw(u64);

impl Draw {
    fn percent(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % 100) as u32
    }
}

fn seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1
}

/// Sends `packet` on `socket` to `to` after the direction's delay, unless
/// the draw drops it.
fn pass(socket: &Arc<UdpSocket>, to: SocketAddr, packet: &[u8], how: &Impairment, draw: &mut Draw) {
    if draw.percent() < how.loss_pct.load(Relaxed) {
        return;
    }
    let delay = how.delay_ms.load(Relaxed);
    if delay == 0 {
        let _ = socket.try_send_to(packet, to);
        return;
    }
    let socket = Arc::clone(socket);
    let packet = packet.to_vec();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let _ = socket.send_to(&packet, to).await;
    });
}

async fn relay(
    front: Arc<UdpSocket>,
    target: SocketAddr,
    towards: Arc<Impairment>,
    back: Arc<Impairment>,
) {
    let mut upstreams: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
    let mut draw = Draw(seed());
    let mut buf = vec![0_u8; 65_536];
    loop {
        let Ok((n, client)) = front.recv_from(&mut buf).await else {
            return;
        };
        let upstream = match upstreams.get(&client) {
            Some(socket) => Arc::clone(socket),
            None => {
                let Ok(socket) = UdpSocket::bind("0.0.0.0:0").await else {
                    continue;
                };
                if socket.connect(target).await.is_err() {
                    continue;
                }
                let socket = Arc::new(socket);
                upstreams.insert(client, Arc::clone(&socket));
                // The target's packets for this client, back through the front.
                let (front, upstream, back) =
                    (Arc::clone(&front), Arc::clone(&socket), Arc::clone(&back));
                tokio::spawn(async move {
                    let mut draw = Draw(seed().rotate_left(17));
                    let mut buf = vec![0_u8; 65_536];
                    while let Ok(n) = upstream.recv(&mut buf).await {
                        pass(&front, client, &buf[..n], &back, &mut draw);
                    }
                });
                socket
            }
        };
        pass_connected(&upstream, &buf[..n], &towards, &mut draw);
    }
}

/// [`pass`] for a socket connected to its target.
fn pass_connected(socket: &Arc<UdpSocket>, packet: &[u8], how: &Impairment, draw: &mut Draw) {
    if draw.percent() < how.loss_pct.load(Relaxed) {
        return;
    }
    let delay = how.delay_ms.load(Relaxed);
    if delay == 0 {
        let _ = socket.try_send(packet);
        return;
    }
    let socket = Arc::clone(socket);
    let packet = packet.to_vec();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let _ = socket.send(&packet).await;
    });
}
