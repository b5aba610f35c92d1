//! `waitroom-http-ceiling`: what a server on the edge's runtime can reach at
//! best, answering every request with the same fixed bytes (issue 17).
//!
//! The edge's answers cost its handler's work plus the HTTP/1 machinery and
//! the runtime under it. This binary keeps the machinery and drops the
//! handler: every request on a connection gets the bytes of `--response`
//! (a whole HTTP/1.1 response, head and body, e.g. the edge's own queue page
//! captured with `curl -i`), written as they are. Two servers:
//! - `hyper`: hyper's HTTP/1 server, as the edge runs it (one current-thread
//!   runtime per worker, `SO_REUSEPORT`), a handler that returns the parsed
//!   response's head and body: the ceiling of the edge's data path as built;
//! - `bare`: no HTTP library but `httparse`: the connection's task reads into
//!   a buffer, parses each request head, writes the response bytes, keeps
//!   pipelined requests in order: the ceiling of a hand-written data path on
//!   the same runtime (what issue 17's "no hyper on the hot path" could buy).
//!
//!
//! And the same for the proxied path, each visitor connection with one
//! origin connection of its own, opened at its first request:
//! - `hyper-proxy`: hyper's server and hyper's HTTP/1 client, the origin
//!   connection driven in the visitor connection's task (as the edge's
//!   origin pool does), every request forwarded as it came and the origin's
//!   response streamed back: the edge's proxy without its handler;
//! - `bare-proxy`: `httparse` on both sides, the request's bytes written to
//!   the origin as they came, the origin's response (`Content-Length`
//!   bodies only) copied back byte for byte.
//!
//! Measured against nginx serving the same bytes from a file, or proxying
//! to the same origin (docs/flamegraphs/ceiling.sh). Not a server for
//! anything else: it has no timeouts, no limits beyond the head's size, no
//! request bodies.
use std::{net::SocketAddr, sync::Arc};

use anyhow::{Context as _, Result, bail};
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use http_body_util::Full;
use hyper::{Response, StatusCode, header::HeaderName, header::HeaderValue};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Server {
    Hyper,
    Bare,
    HyperProxy,
    BareProxy,
}

#[derive(Debug, Parser)]
struct Args {
    #[arg(long)]
    listen: SocketAddr,
    /// A file holding the whole response (status line, headers, blank
    /// line, body); CRLF or LF line ends. For `hyper` and `bare`.
    #[arg(long, required_if_eq_any([("server", "hyper"), ("server", "bare")]))]
    response: Option<std::path::PathBuf>,
    /// The origin the proxies forward to.
    #[arg(long, required_if_eq_any([("server", "hyper-proxy"), ("server", "bare-proxy")]))]
    origin: Option<SocketAddr>,
    #[arg(long, value_enum)]
    server: Server,
    /// Worker threads, each with its own current-thread runtime and
    /// `SO_REUSEPORT` listener (as the edge's workers).
    #[arg(long, default_value_t = 1)]
    workers: usize,
}

/// The largest request head the bare server reads.
const MAX_HEAD: usize = 16 * 1024;

/// What every connection gets: the stored response, or the origin.
#[derive(Clone)]
enum Job {
    Answer(Arc<Fixed>),
    Proxy(SocketAddr),
}

fn main() -> Result<()> {
    let args = Args::parse();
    let job = match args.server {
        Server::Hyper | Server::Bare => {
            let path = args.response.context("--response is needed")?;
            let raw =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            Job::Answer(Arc::new(Fixed::parse(&raw)?))
        }
        Server::HyperProxy | Server::BareProxy => {
            Job::Proxy(args.origin.context("--origin is needed")?)
        }
    };
    let mut threads = Vec::new();
    for _ in 0..args.workers.max(1) {
        let listener = waitroom_edge::http::bind_reuseport(args.listen, 4096)?;
        let job = job.clone();
        let server = args.server;
        threads.push(std::thread::spawn(move || -> Result<()> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                loop {
                    let (stream, _) = listener.accept().await?;
                    stream.set_nodelay(true)?;
                    let job = job.clone();
                    tokio::spawn(async move {
                        let _ = match (server, job) {
                            (Server::Hyper, Job::Answer(fixed)) => serve_hyper(stream, fixed).await,
                            (Server::Bare, Job::Answer(fixed)) => serve_bare(stream, &fixed).await,
                            (Server::HyperProxy, Job::Proxy(origin)) => {
                                serve_hyper_proxy(stream, origin).await
                            }
                            (Server::BareProxy, Job::Proxy(origin)) => {
                                serve_bare_proxy(stream, origin).await
                            }
                            _ => unreachable!("the job is made for the server"),
                        };
                    });
                }
            })
        }));
    }
    for thread in threads {
        match thread.join() {
            Ok(result) => result?,
            Err(_) => bail!("a worker panicked"),
        }
    }
    Ok(())
}

/// The response, whole (for the bare server) and parsed (for hyper).
struct Fixed {
    whole: Bytes,
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
}

impl Fixed {
    fn parse(raw: &[u8]) -> Result<Self> {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut parsed = httparse::Response::new(&mut headers);
        let httparse::Status::Complete(head_len) = parsed.parse(raw)? else {
            bail!("the response's head is incomplete");
        };
        let status = StatusCode::from_u16(parsed.code.unwrap_or(200))?;
        let body = Bytes::copy_from_slice(&raw[head_len..]);
        let mut kept = Vec::new();
        let mut whole = format!(
            "HTTP/1.1 {} {}\r\n",
            status.as_str(),
            status.canonical_reason().unwrap_or("")
        )
        .into_bytes();
        for h in parsed.headers.iter() {
            let name = HeaderName::from_bytes(h.name.as_bytes())?;
            // hyper writes these itself; the bare server writes them as
            // they are, except the length, which must match the body.
            if name == hyper::header::CONTENT_LENGTH || name == hyper::header::TRANSFER_ENCODING {
                continue;
            }
            whole.extend_from_slice(h.name.as_bytes());
            whole.extend_from_slice(b": ");
            whole.extend_from_slice(h.value);
            whole.extend_from_slice(b"\r\n");
            if name != hyper::header::DATE && name != hyper::header::CONNECTION {
                kept.push((name, HeaderValue::from_bytes(h.value)?));
            }
        }
        whole.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
        whole.extend_from_slice(&body);
        Ok(Self {
            whole: Bytes::from(whole),
            status,
            headers: kept,
            body,
        })
    }
}

async fn serve_hyper(stream: tokio::net::TcpStream, response: Arc<Fixed>) -> Result<()> {
    let service = hyper::service::service_fn(move |_request| {
        let response = Arc::clone(&response);
        async move {
            let mut answer = Response::new(Full::new(response.body.clone()));
            *answer.status_mut() = response.status;
            let headers = answer.headers_mut();
            for (name, value) in &response.headers {
                headers.append(name.clone(), value.clone());
            }
            Ok::<_, std::convert::Infallible>(answer)
        }
    });
    hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await?;
    Ok(())
}

/// Request heads read from a visitor connection: a buffer of [`MAX_HEAD`],
/// the heads parsed in order, what follows the last whole one kept.
struct Heads {
    buf: Vec<u8>,
    /// Where the next head starts.
    start: usize,
    /// Bytes read.
    filled: usize,
}

impl Heads {
    fn new() -> Self {
        Self {
            buf: vec![0u8; MAX_HEAD],
            start: 0,
            filled: 0,
        }
    }

    /// Reads more from `stream`, after moving what is not parsed yet to the
    /// front; `false` at the end of the stream.
    async fn fill(&mut self, stream: &mut tokio::net::TcpStream) -> Result<bool> {
        self.buf.copy_within(self.start..self.filled, 0);
        self.filled -= self.start;
        self.start = 0;
        if self.filled == self.buf.len() {
            bail!("a request head over {MAX_HEAD} bytes");
        }
        let n = stream.read(&mut self.buf[self.filled..]).await?;
        self.filled += n;
        Ok(n > 0)
    }

    /// The next whole request head in the buffer, if there is one.
    fn next(&mut self) -> Result<Option<&[u8]>> {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut request = httparse::Request::new(&mut headers);
        let httparse::Status::Complete(len) = request.parse(&self.buf[self.start..self.filled])?
        else {
            return Ok(None);
        };
        let head = &self.buf[self.start..self.start + len];
        self.start += len;
        Ok(Some(head))
    }
}

async fn serve_bare(mut stream: tokio::net::TcpStream, response: &Fixed) -> Result<()> {
    let mut heads = Heads::new();
    let mut out = Vec::with_capacity(response.whole.len() * 4);
    while heads.fill(&mut stream).await? {
        // Answer every whole request head read, in order, in one write.
        while heads.next()?.is_some() {
            out.extend_from_slice(&response.whole);
        }
        if !out.is_empty() {
            stream.write_all(&out).await?;
            out.clear();
        }
    }
    Ok(())
}

async fn connect(origin: SocketAddr) -> Result<tokio::net::TcpStream> {
    let upstream = tokio::net::TcpStream::connect(origin).await?;
    upstream.set_nodelay(true)?;
    Ok(upstream)
}

async fn serve_hyper_proxy(stream: tokio::net::TcpStream, origin: SocketAddr) -> Result<()> {
    let (sender, origin_conn) = hyper::client::conn::http1::handshake::<_, hyper::body::Incoming>(
        hyper_util::rt::TokioIo::new(connect(origin).await?),
    )
    .await?;
    let sender = Arc::new(tokio::sync::Mutex::new(sender));
    let service = hyper::service::service_fn(move |request| {
        let sender = Arc::clone(&sender);
        async move { sender.lock().await.send_request(request).await }
    });
    let serve = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    // Both connections in this one task: no hand-over between tasks.
    tokio::select! {
        served = serve => served?,
        driven = origin_conn => driven?,
    }
    Ok(())
}

async fn serve_bare_proxy(mut stream: tokio::net::TcpStream, origin: SocketAddr) -> Result<()> {
    let mut upstream = connect(origin).await?;
    let mut heads = Heads::new();
    let mut answer = vec![0u8; 64 * 1024];
    let mut answered = 0;
    while heads.fill(&mut stream).await? {
        while let Some(head) = heads.next()? {
            upstream.write_all(head).await?;
            // The origin's response: its head, then Content-Length bytes.
            let total = loop {
                let mut headers = [httparse::EMPTY_HEADER; 64];
                let mut response = httparse::Response::new(&mut headers);
                if let httparse::Status::Complete(head) = response.parse(&answer[..answered])? {
                    let length: usize = response
                        .headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                        .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
                        .context("an origin response without Content-Length")?;
                    break head + length;
                }
                answered += read_more(&mut upstream, &mut answer[answered..]).await?;
            };
            if total > answer.len() {
                bail!("an origin response over {} bytes", answer.len());
            }
            while answered < total {
                answered += read_more(&mut upstream, &mut answer[answered..]).await?;
            }
            stream.write_all(&answer[..total]).await?;
            answer.copy_within(total..answered, 0);
            answered -= total;
        }
    }
    Ok(())
}

/// Reads what the origin sent into `into`; an error if it closed mid-response.
async fn read_more(upstream: &mut tokio::net::TcpStream, into: &mut [u8]) -> Result<usize> {
    match upstream.read(into).await? {
        0 => bail!("the origin closed mid-response"),
        n => Ok(n),
    }
}
