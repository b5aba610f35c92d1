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

/// A running relay; it stops when dropped.
#[derive(Debug)]
pub struct TcpRelay {
    /// Where clients connect (127.0.0.1, a free port).
    pub listen: SocketAddr,
    /// Delay of every chunk the target sends back, ms.
    pub delay_ms: Arc<AtomicU64>,
    /// Chunks passed towards the target so far (requests, near enough).
    pub sent: Arc<AtomicU64>,
    /// Drop what clients send (towards) / what the target sends back.
    pub cut_towards: Arc<AtomicBool>,
    pub cut_back: Arc<AtomicBool>,
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
        let delay_ms = Arc::new(AtomicU64::new(0));
        let sent = Arc::new(AtomicU64::new(0));
        let cut_towards = Arc::new(AtomicBool::new(false));
        let cut_back = Arc::new(AtomicBool::new(false));
        let delay = Arc::clone(&delay_ms);
        let counted = Arc::clone(&sent);
        let (towards_cut, back_cut) = (Arc::clone(&cut_towards), Arc::clone(&cut_back));
        runtime.spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let delay = Arc::clone(&delay);
                let counted = Arc::clone(&counted);
                let (towards_cut, back_cut) = (Arc::clone(&towards_cut), Arc::clone(&back_cut));
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let towards = async {
                        let mut buf = vec![0_u8; 16 * 1024];
                        loop {
                            let n = match client_read.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            if towards_cut.load(Relaxed) {
                                continue;
                            }
                            counted.fetch_add(1, Relaxed);
                            if server_write.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = server_write.shutdown().await;
                    };
                    let back = async {
                        let mut buf = vec![0_u8; 16 * 1024];
                        loop {
                            let n = match server_read.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            if back_cut.load(Relaxed) {
                                continue;
                            }
                            let wait = delay.load(Relaxed);
                            if wait > 0 {
                                tokio::time::sleep(Duration::from_millis(wait)).await;
                            }
                            if client_write.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = client_write.shutdown().await;
                    };
                    tokio::join!(towards, back);
                });
            }
        });
        Ok(Self {
            listen,
            delay_ms,
            sent,
            cut_towards,
            cut_back,
            runtime: Some(runtime),
        })
    }

    /// Delays every chunk the target sends back from now on by `ms`.
    pub fn set_delay_ms(&self, ms: u64) {
        self.delay_ms.store(ms, Relaxed);
    }

    /// Cuts (true) or mends each direction from now on.
    pub fn cut(&self, towards: bool, back: bool) {
        self.cut_towards.store(towards, Relaxed);
        self.cut_back.store(back, Relaxed);
    }

    /// Chunks passed towards the target so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Relaxed)
    }
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
