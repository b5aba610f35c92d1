//! A TCP relay that delays what the target sends back, by an amount a test
//! sets at any moment: a slow etcd member (a busy disk, a long link) in
//! front of a real one. This machine's kernel has no `sch_netem`, and
//! loopback is the host's, so the delay is added here (see also
//! [`crate::udp_relay`]).
//!
//! Each accepted connection gets its own connection to the target. Bytes
//! towards the target pass at once; each chunk coming back is held for the
//! delay set when it arrived, so a request's answer arrives that much later.
//! Either direction can be cut: its bytes are dropped (a partition; cut
//! only the way back and requests still land, their answers never do).
use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
};

/// One direction's settings, shared with its pumps.
#[derive(Debug, Default)]
struct Way {
    cut: AtomicBool,
    delay_ms: AtomicU64,
    chunks: AtomicU64,
}

/// Copies `from` to `to` chunk by chunk as `way` says: dropped while cut,
/// else held for its delay; counted. Closes `to` when `from` ends.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    way: Arc<Way>,
) {
    let mut buf = vec![0_u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if way.cut.load(Relaxed) {
            continue;
        }
        let wait = way.delay_ms.load(Relaxed);
        if wait > 0 {
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
        way.chunks.fetch_add(1, Relaxed);
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// A running relay; it stops when dropped.
#[derive(Debug)]
pub struct TcpRelay {
    /// Where clients connect (127.0.0.1, a free port).
    pub listen: SocketAddr,
    towards: Arc<Way>,
    back: Arc<Way>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl TcpRelay {
    /// Starts a relay to `target` on its own runtime thread.
    pub fn start(target: SocketAddr) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0"))?;
        let listen = listener.local_addr()?;
        let (towards, back) = (Arc::new(Way::default()), Arc::new(Way::default()));
        let ways = (Arc::clone(&towards), Arc::clone(&back));
        runtime.spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (towards, back) = (Arc::clone(&ways.0), Arc::clone(&ways.1));
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::join!(
                        pump(client_read, server_write, towards),
                        pump(server_read, client_write, back)
                    );
                });
            }
        });
        Ok(Self {
            listen,
            towards,
            back,
            runtime: Some(runtime),
        })
    }

    /// Delays every chunk the target sends back from now on by `ms`.
    pub fn set_delay_ms(&self, ms: u64) {
        self.back.delay_ms.store(ms, Relaxed);
    }

    /// Cuts (true) or mends each direction from now on.
    pub fn cut(&self, towards: bool, back: bool) {
        self.towards.cut.store(towards, Relaxed);
        self.back.cut.store(back, Relaxed);
    }

    /// Chunks passed towards the target so far.
    pub fn sent(&self) -> u64 {
        self.towards.chunks.load(Relaxed)
    }
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
