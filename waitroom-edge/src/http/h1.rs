//! The common HTTP/1.1 request served without hyper's server (issue 17).
//!
//! Most of what reaches a waiting room is the same request over and over: a
//! `GET` (or `HEAD`) with a handful of headers and no body, from a browser,
//! an app polling its place, or a bot. For those, a connection starts here:
//! `httparse` reads the head in place, the request goes to the same handler
//! hyper would call, and the answer's head is written by hand with its body
//! in one write where it came whole. hyper's dispatcher, its buffers and
//! its state machine cost about as much as the handler's own work on a queue
//! page (docs/BENCHMARKS.md, "The ceiling of the data path").
//!
//! Anything else goes to hyper, with every byte read so far, for the rest of
//! the connection ([`End::HandOff`]): a request with a body or a length
//! (`Content-Length`, `Transfer-Encoding`), `Upgrade`, `Expect`, a
//! `Connection` token other than `keep-alive` or `close`, a method other than
//! `GET`/`HEAD`, HTTP/1.0, a target not in origin form, HTTP/2's preface, a
//! head longer than `max_header_bytes` or with more than `max_headers`
//! fields, and whatever `httparse` refuses. So the parser that judges hostile
//! input is never this module's: what it serves is what `httparse` parsed
//! strictly and found plain, and hyper answers every error as it did before
//! (400, 431). A bodiless request leaves nothing in the stream to smuggle.
//!
//! The answer is framed as hyper frames it (`Content-Length` from the body's
//! exact size, else chunked; none for `HEAD`, `204`, `304`; a `date`; a
//! `connection: close` on the last answer); trailers are dropped.
use std::{
    future::Future,
    io::{self, IoSlice},
    mem::MaybeUninit,
    ops::Range,
    pin::Pin,
    sync::atomic::{AtomicBool, Ordering::Relaxed},
    task::{Context, Poll},
};

use bytes::{Bytes, BytesMut};
use http::{
    HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri, header,
};
use http_body_util::BodyExt as _;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// A visitor's request body: hyper's, or none (a request served here).
#[derive(Debug)]
pub enum ReqBody {
    Hyper(Incoming),
    Empty,
}

impl HttpBody for ReqBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            Self::Hyper(body) => Pin::new(body).poll_frame(cx),
            Self::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Hyper(body) => body.is_end_stream(),
            Self::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Hyper(body) => body.size_hint(),
            Self::Empty => SizeHint::with_exact(0),
        }
    }
}

/// Header fields an answer carries already written, `name: value\r\n` each,
/// after those of its `HeaderMap` (handed beside the response: [`Answer`]).
/// The queue page's fields go this way: written once as bytes instead of
/// inserted into a map, hashed, encoded from it and dropped (about 1,500
/// instructions a page; as a response extension they cost ~550 more, the
/// extensions' map and box made and dropped). So do a plain-HTTP origin's
/// answer fields ([`crate::origin_h1`]: copied from its head as the origin
/// spelled them, the hop-by-hop ones left out). None of them may be
/// `content-length`, `transfer-encoding`, `connection` or `trailer`, whose
/// framing the writer decides, and `date` only in an origin's lines, which
/// say so (the writer then adds none); hyper's path puts them in the map
/// first ([`HeadLines::into_map`]).
#[derive(Debug, Clone)]
pub struct HeadLines {
    lines: Bytes,
    date: bool,
    /// Values of the room's origin-command field, not among the lines.
    commands: Vec<Vec<u8>>,
}

impl HeadLines {
    /// Appends `name: value\r\n` to `lines`.
    pub fn push(lines: &mut Vec<u8>, name: &HeaderName, value: &[u8]) {
        debug_assert!(!matches!(
            *name,
            header::CONTENT_LENGTH
                | header::TRANSFER_ENCODING
                | header::CONNECTION
                | header::DATE
                | header::TRAILER
        ));
        debug_assert!(!value.iter().any(|b| *b == b'\r' || *b == b'\n'));
        lines.extend_from_slice(name.as_str().as_bytes());
        lines.extend_from_slice(b": ");
        lines.extend_from_slice(value);
        lines.extend_from_slice(b"\r\n");
    }

    /// The lines, ready to attach to an answer.
    #[must_use]
    pub fn done(lines: Vec<u8>) -> Self {
        Self {
            lines: Bytes::from(lines),
            date: false,
            commands: Vec::new(),
        }
    }

    /// An origin's answer fields as [`crate::origin_h1`] copied them
    /// (names and values as httparse admitted them, no field of the framing
    /// or of the hop; `date`: one of them is `date`) and the values of the
    /// origin-command field it left out.
    #[must_use]
    pub fn from_origin(lines: crate::origin_h1::OriginLines) -> Self {
        Self {
            lines: Bytes::from(lines.lines),
            date: lines.date,
            commands: lines.commands,
        }
    }

    /// The lines as they will be written.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        &self.lines
    }

    /// The values of the origin-command field left out of an origin's
    /// lines as they were copied (`origin_h1`), taken once.
    pub fn take_commands(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.commands)
    }

    /// Moves the lines into `resp`'s `HeaderMap`, for an answer hyper
    /// writes (HTTP/2, or a connection handed over).
    pub fn into_map<B>(self, resp: &mut Response<B>) {
        let Self { lines, .. } = self;
        let headers = resp.headers_mut();
        for line in lines.split(|b| *b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let Some(colon) = line.iter().position(|b| *b == b':') else {
                continue;
            };
            let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii_start());
            if let (Ok(name), Ok(value)) =
                (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
            {
                headers.append(name, value);
            }
        }
    }
}

/// What the handler answers: the response, and the fields it carries
/// already written.
pub type Answer<B> = (Response<B>, Option<HeadLines>);

/// What the connection's task and [`serve`] tell each other.
#[derive(Debug, Default)]
pub struct Control {
    /// Waiting for a next request with nothing of it read: the connection
    /// can be closed without a word.
    idle: AtomicBool,
    /// Answer the request under way (if any), then close.
    draining: AtomicBool,
}

impl Control {
    pub fn idle(&self) -> bool {
        self.idle.load(Relaxed)
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Relaxed)
    }

    /// Close after the answer under way, with `connection: close`.
    pub fn drain(&self) {
        self.draining.store(true, Relaxed);
    }
}

/// How a connection served here ended.
#[derive(Debug)]
pub enum End<I> {
    /// Closed: by the client, after `Connection: close`, or draining.
    Closed,
    /// A request this module does not serve: hyper takes the connection
    /// and reads these bytes first.
    HandOff(I, Bytes),
}

/// The limits of a head, as hyper's server has them.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_header_bytes: usize,
    pub max_headers: usize,
}

/// A plain request's head, as positions in the bytes read.
struct Plain {
    len: usize,
    head: bool,
    close: bool,
    path: Range<usize>,
}

/// What the bytes read so far hold.
enum Parsed {
    Plain(Plain),
    /// Not complete yet.
    Partial,
    /// For hyper: not plain, or not well formed.
    Other,
}

/// Serves requests on `io` until it closes or a request is not plain.
///
/// # Errors
/// The socket's errors, and an answer whose body failed or did not match
/// its length: the connection is then closed as hyper would.
pub async fn serve<I, F, Fut, B>(
    mut io: I,
    answer: &F,
    limits: Limits,
    ctl: &Control,
) -> io::Result<End<I>>
where
    I: AsyncRead + AsyncWrite + Unpin,
    F: Fn(Request<ReqBody>) -> Fut,
    Fut: Future<Output = Answer<B>>,
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let Buffers {
        read: mut buf,
        mut fields,
        mut out,
    } = spare_buffers();
    loop {
        let plain = loop {
            if !buf.is_empty() {
                match parse(&buf, limits, &mut fields) {
                    Parsed::Plain(p) => break p,
                    Parsed::Other => return Ok(End::HandOff(io, buf.freeze())),
                    Parsed::Partial if buf.len() >= limits.max_header_bytes => {
                        return Ok(End::HandOff(io, buf.freeze()));
                    }
                    Parsed::Partial => {}
                }
            } else if ctl.draining() {
                return Ok(End::Closed);
            }
            ctl.idle.store(buf.is_empty(), Relaxed);
            let n = std::future::poll_fn(|cx| {
                if buf.capacity() == 0 && fields.capacity() == 0 {
                    let spare = spare_buffers();
                    (buf, fields, out) = (spare.read, spare.fields, spare.out);
                }
                if buf.capacity() - buf.len() < READ_SIZE / 4 {
                    buf.reserve(READ_SIZE);
                }
                let read = std::pin::pin!(io.read_buf(&mut buf)).poll(cx);
                // Between requests, nothing to read yet: the buffers go
                // back while the visitor is quiet (nginx frees an idle
                // keep-alive connection's buffers too), 9 KiB of every idle
                // connection's memory; the wake-up that brings the next
                // request takes them again.
                if read.is_pending() && buf.is_empty() {
                    give_back(Buffers {
                        read: std::mem::take(&mut buf),
                        fields: std::mem::take(&mut fields),
                        out: std::mem::take(&mut out),
                    });
                }
                read
            })
            .await?;
            ctl.idle.store(false, Relaxed);
            if n == 0 {
                return Ok(End::Closed);
            }
        };
        let head = buf.split_to(plain.len).freeze();
        let Some(req) = request(&head, &plain, &fields) else {
            // What hyper answers a target or field the `http` types refuse.
            out.clear();
            out.extend_from_slice(
                b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n",
            );
            date_line(&mut out);
            out.extend_from_slice(b"\r\n");
            io.write_all(&out).await?;
            io.flush().await?;
            let _ = io.shutdown().await;
            return Ok(End::Closed);
        };
        drop(head);
        let (resp, lines) = answer(req).await;
        // Draining may have begun while the handler answered, or while the
        // body was written: either way this answer is the last.
        let close = write_response(
            &mut io,
            &mut out,
            resp,
            lines.as_ref(),
            plain.head,
            plain.close || ctl.draining(),
        )
        .await?
            || ctl.draining();
        if close {
            let _ = io.shutdown().await;
            return Ok(End::Closed);
        }
    }
}

/// What this exchange makes of the bytes `buf` begins with, as [`serve`]
/// judges them (for the fuzz target `h1_plain`): `None` when they are not a
/// complete plain head (hyper's to judge, or more to read), else the head's
/// length and the request the handler would get (`None` for a target or
/// field the `http` types refuse: a 400).
#[doc(hidden)]
#[must_use]
pub fn plain_request(buf: &[u8], limits: Limits) -> Option<(usize, Option<Request<ReqBody>>)> {
    let mut fields = Vec::new();
    let Parsed::Plain(plain) = parse(buf, limits, &mut fields) else {
        return None;
    };
    let head = Bytes::copy_from_slice(&buf[..plain.len]);
    Some((plain.len, request(&head, &plain, &fields)))
}

/// Bytes asked of the socket at a time (hyper's first read is 8 KiB too).
const READ_SIZE: usize = 8192;

/// Buffers a worker thread keeps for its connections between their
/// requests, at most: about 576 KiB a worker; a connection that gives its
/// buffers back beyond that frees them.
const SPARE_BUFFERS: usize = 64;

/// What [`serve`] holds only while a request is read and answered: the read
/// buffer, the head's field list and the answer's head.
struct Buffers {
    read: BytesMut,
    fields: Vec<(Range<usize>, Range<usize>)>,
    out: Vec<u8>,
}

thread_local! {
    /// Buffers this worker's idle connections gave back ([`serve`]): a busy
    /// connection takes a set back at its next request without the
    /// allocator (an 8 KiB allocation and its free cost ~500 instructions a
    /// request here, mimalloc's slower path).
    static SPARE: std::cell::RefCell<Vec<Buffers>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Buffers given back before, or new ones.
fn spare_buffers() -> Buffers {
    SPARE.with_borrow_mut(Vec::pop).unwrap_or_else(|| Buffers {
        read: BytesMut::with_capacity(READ_SIZE),
        fields: Vec::with_capacity(16),
        out: Vec::with_capacity(512),
    })
}

/// Keeps a connection's empty buffers for the thread's next connection
/// that reads, while fewer than [`SPARE_BUFFERS`] sets are kept and the read
/// buffer still has room for a read; frees them otherwise. Nothing is kept
/// in them: the field list and the answer's head are cleared before each
/// use.
fn give_back(mut buffers: Buffers) {
    if buffers.read.capacity() >= READ_SIZE / 4 {
        // A long head (many fields, a large answer's head) does not keep
        // its larger lists in every spare set.
        buffers.fields.shrink_to(64);
        buffers.out.shrink_to(COALESCED_MAX);
        SPARE.with_borrow_mut(|spare| {
            if spare.len() < SPARE_BUFFERS {
                spare.push(buffers);
            }
        });
    }
}

/// The most fields a head may have (`max_headers` is at most this).
const MAX_HEADERS: usize = 1_024;

/// Reads the head in `buf`: plain, partial, or hyper's to judge (a head
/// beyond `limits` too: more than `max_headers` fields, or complete but
/// longer than `max_header_bytes`; hyper answers it 431).
fn parse(buf: &[u8], limits: Limits, fields: &mut Vec<(Range<usize>, Range<usize>)>) -> Parsed {
    let max_headers = limits.max_headers.min(MAX_HEADERS);
    // Uninitialised (httparse writes a slot before it reads it), on the
    // stack of this call only.
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut req,
        buf,
        &mut slots[..max_headers],
    ) {
        Ok(httparse::Status::Complete(len)) if len <= limits.max_header_bytes => len,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Ok(httparse::Status::Complete(_)) | Err(_) => return Parsed::Other,
    };
    let head = match req.method {
        Some("GET") => false,
        Some("HEAD") => true,
        _ => return Parsed::Other,
    };
    if req.version != Some(1) {
        return Parsed::Other;
    }
    let Some(path) = req.path.filter(|p| p.starts_with('/')) else {
        return Parsed::Other;
    };
    let base = buf.as_ptr() as usize;
    let at = |s: &[u8]| {
        let start = s.as_ptr() as usize - base;
        start..start + s.len()
    };
    let mut close = false;
    fields.clear();
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        match name.len() {
            // content-length, transfer-encoding, upgrade, expect: a body, a
            // protocol switch or an interim answer, all hyper's.
            14 if name.eq_ignore_ascii_case(b"content-length") => return Parsed::Other,
            17 if name.eq_ignore_ascii_case(b"transfer-encoding") => return Parsed::Other,
            7 if name.eq_ignore_ascii_case(b"upgrade") => return Parsed::Other,
            6 if name.eq_ignore_ascii_case(b"expect") => return Parsed::Other,
            10 if name.eq_ignore_ascii_case(b"connection") => {
                for token in h.value.split(|b| *b == b',') {
                    let token = token.trim_ascii();
                    if token.eq_ignore_ascii_case(b"close") {
                        close = true;
                    } else if !token.eq_ignore_ascii_case(b"keep-alive") && !token.is_empty() {
                        return Parsed::Other;
                    }
                }
            }
            _ => {}
        }
        fields.push((at(name), at(h.value)));
    }
    Parsed::Plain(Plain {
        len,
        head,
        close,
        path: at(path.as_bytes()),
    })
}

/// The request, its parts sliced from `head`; `None` where the `http` types
/// refuse the target or a field (hyper answers those 400 too).
fn request(
    head: &Bytes,
    plain: &Plain,
    fields: &[(Range<usize>, Range<usize>)],
) -> Option<Request<ReqBody>> {
    let uri = Uri::from_maybe_shared(head.slice(plain.path.clone())).ok()?;
    let mut headers = HeaderMap::with_capacity(fields.len());
    for (name, value) in fields {
        let name = HeaderName::from_bytes(&head[name.clone()]).ok()?;
        // SAFETY: httparse admits in a value only HTAB, SP, VCHAR and
        // obs-text (`b'\t' | b' '..=0x7e | 0x80..=0xff`), exactly the bytes
        // a `HeaderValue` may hold (`b >= 32 && b != 127 || b == b'\t'`):
        // checking them again cost ~3 instructions a byte (issue 17). A
        // debug build checks anyway (`from_maybe_shared_unchecked` panics).
        let value = unsafe { HeaderValue::from_maybe_shared_unchecked(head.slice(value.clone())) };
        headers.append(name, value);
    }
    let mut req = Request::new(ReqBody::Empty);
    *req.method_mut() = if plain.head {
        Method::HEAD
    } else {
        Method::GET
    };
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    Some(req)
}

/// How an answer's body is framed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(u64),
    Chunked,
}

/// Writes `resp` and its body; returns whether the connection must close
/// after it (asked, or an answer that says so).
async fn write_response<I, B>(
    io: &mut I,
    out: &mut Vec<u8>,
    resp: Response<B>,
    lines: Option<&HeadLines>,
    head_req: bool,
    close: bool,
) -> io::Result<bool>
where
    I: AsyncWrite + Unpin,
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let (parts, mut body) = resp.into_parts();
    let hint = if body.is_end_stream() {
        None
    } else {
        Some(body.size_hint())
    };
    let (framing, close) = encode_head(out, &parts, lines, hint, head_req, close)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let Some(framing) = framing else {
        // No body on the wire (`HEAD`, `204`, `304`, a length of 0).
        drop(body);
        io.write_all(out).await?;
        io.flush().await?;
        return Ok(close);
    };
    let mut left = match framing {
        Framing::Length(n) => n,
        _ => u64::MAX,
    };
    // The head goes with the first piece of the body when that is ready now
    // (most answers: a page, or an origin's answer that came whole).
    let mut head_sent = false;
    // The last chunk written already.
    let mut ended = false;
    let first = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx))).await;
    let mut pending = match first {
        Poll::Ready(frame) => Some(frame),
        Poll::Pending => {
            io.write_all(out).await?;
            io.flush().await?;
            head_sent = true;
            None
        }
    };
    loop {
        let frame = match pending.take() {
            Some(f) => f,
            None => body.frame().await,
        };
        let data = match frame {
            None => break,
            Some(Err(err)) => {
                return Err(io::Error::other(format!("answer body failed: {err}")));
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                // Trailers: dropped (hyper sends them only to a client that
                // asked for them with `TE: trailers`).
                Err(_) => continue,
            },
        };
        if data.is_empty() {
            continue;
        }
        let chunk_line;
        let prefix: &[u8] = match framing {
            Framing::Length(_) => {
                if data.len() as u64 > left {
                    return Err(io::Error::other("answer body longer than its length"));
                }
                left -= data.len() as u64;
                b""
            }
            Framing::Chunked => {
                chunk_line = format!("{:x}\r\n", data.len());
                chunk_line.as_bytes()
            }
        };
        let suffix: &[u8] = if framing == Framing::Chunked {
            b"\r\n"
        } else {
            b""
        };
        // With room for a chunked body's end: the buffer never grows past
        // what a spare set keeps, so it is not shrunk and grown again.
        let piece = prefix.len() + data.len() + suffix.len();
        let end = if framing == Framing::Chunked {
            LAST_CHUNK.len()
        } else {
            0
        };
        if !head_sent && out.len() + piece + end <= COALESCED_MAX {
            // The head and a small first piece (most answers: a page, an
            // origin's answer that came whole) in one contiguous write: the
            // kernel takes one slice about 400 ns sooner than the same bytes
            // in several (`writev`), more than the copy costs here.
            out.reserve(piece + end);
            out.extend_from_slice(prefix);
            out.extend_from_slice(&data);
            out.extend_from_slice(suffix);
            if framing == Framing::Chunked {
                // A chunked body's end goes in the same write when it is
                // known already (an origin's chunked answer that came
                // whole), not in a packet of its own.
                let next =
                    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx)))
                        .await;
                match next {
                    Poll::Ready(None) => {
                        out.extend_from_slice(LAST_CHUNK);
                        ended = true;
                    }
                    Poll::Ready(frame) => pending = Some(frame),
                    Poll::Pending => {}
                }
            }
            io.write_all(out).await?;
            head_sent = true;
            if ended {
                break;
            }
        } else {
            let head: &[u8] = if head_sent { b"" } else { out };
            write_all_vectored(io, &mut [head, prefix, &data, suffix]).await?;
        }
        head_sent = true;
    }
    match framing {
        Framing::Length(_) if left != 0 => {
            if !head_sent {
                io.write_all(out).await?;
            }
            return Err(io::Error::other("answer body shorter than its length"));
        }
        Framing::Chunked if !ended => {
            let head: &[u8] = if head_sent { b"" } else { out };
            write_all_vectored(io, &mut [head, LAST_CHUNK]).await?;
        }
        _ if !head_sent => io.write_all(out).await?,
        _ => {}
    }
    io.flush().await?;
    Ok(close)
}

/// The largest head and first piece of a body (and a chunked body's end)
/// written as one copy ([`write_response`]): the answer buffer a spare set
/// keeps ([`give_back`]), so a connection's answers do not grow it again
/// and again. A queue page (about 1.8 KB with its head) fits.
const COALESCED_MAX: usize = 2048;

/// The end of a chunked body (no trailers: they are dropped).
const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Writes every slice, in order, with as few writes as the socket allows.
async fn write_all_vectored<I: AsyncWrite + Unpin>(
    io: &mut I,
    parts: &mut [&[u8]],
) -> io::Result<()> {
    let mut first = 0;
    loop {
        while first < parts.len() && parts[first].is_empty() {
            first += 1;
        }
        if first == parts.len() {
            return Ok(());
        }
        let slices: [IoSlice<'_>; 4] = std::array::from_fn(|i| {
            IoSlice::new(parts.get(first + i).copied().unwrap_or_default())
        });
        let mut n = io.write_vectored(&slices).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        for part in parts[first..].iter_mut() {
            let k = n.min(part.len());
            *part = &part[k..];
            n -= k;
            if n == 0 {
                break;
            }
        }
    }
}

/// The answer's head into `out`, framed as hyper frames it (`hint`: the
/// body's size, `None` for a body already at its end); returns the body's
/// framing (`None`: no body on the wire) and whether the connection closes
/// after it.
fn encode_head(
    out: &mut Vec<u8>,
    parts: &http::response::Parts,
    lines: Option<&HeadLines>,
    hint: Option<SizeHint>,
    head_req: bool,
    close: bool,
) -> Result<(Option<Framing>, bool), &'static str> {
    let status = parts.status;
    out.clear();
    if status == StatusCode::OK {
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if status.is_informational() {
        // The handler never answers 1xx (upgrades are hyper's).
        return Err("1xx answer");
    }
    // 204 and 304 carry no body and get no length of ours; `HEAD` gets the
    // length the `GET` would have, and no body.
    let bodiless_status = matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED);
    let mut framing: Option<Framing> = None;
    let mut length: Option<u64> = None;
    let mut close = close;
    let mut wrote_date = false;
    let mut wrote_close = false;
    // As hyper: the values of `Connection` and `Transfer-Encoding` joined on
    // one line, `chunked` added last to a coding that does not end with it.
    let mut open_line: Option<&HeaderName> = None;
    let mut must_chunk = false;
    let mut connection_line_end = None;
    let mut end_line = |out: &mut Vec<u8>, open: Option<&HeaderName>, must_chunk: bool| {
        match open {
            Some(&header::TRANSFER_ENCODING) if must_chunk => out.extend_from_slice(b", chunked"),
            Some(&header::CONNECTION) => connection_line_end = Some(out.len()),
            _ => {}
        }
        if open.is_some() {
            out.extend_from_slice(b"\r\n");
        }
    };
    for (name, value) in &parts.headers {
        match *name {
            // An empty body's length is written below (hyper: a `HEAD`
            // answer keeps the length the `GET` would have).
            header::CONTENT_LENGTH if hint.is_none() && !head_req => continue,
            header::CONTENT_LENGTH => {
                let n = parse_length(value.as_bytes()).ok_or("bad content-length")?;
                match length {
                    Some(l) if l == n => continue,
                    Some(_) => return Err("two content-lengths"),
                    None if framing.is_some() => {
                        return Err("content-length and transfer-encoding");
                    }
                    None => {}
                }
                length = Some(n);
                framing = Some(Framing::Length(n));
            }
            header::TRANSFER_ENCODING => {
                if head_req || bodiless_status {
                    continue;
                }
                if length.is_some() {
                    return Err("content-length and transfer-encoding");
                }
                framing = Some(Framing::Chunked);
                must_chunk = !last_token_is_chunked(value.as_bytes());
            }
            header::CONNECTION
                if value
                    .as_bytes()
                    .split(|b| *b == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close")) =>
            {
                close = true;
                wrote_close = true;
            }
            header::DATE => wrote_date = true,
            // Trailers are not sent.
            header::TRAILER => continue,
            _ => {}
        }
        let joined = open_line == Some(name)
            && matches!(*name, header::CONNECTION | header::TRANSFER_ENCODING);
        if joined {
            out.extend_from_slice(b", ");
        } else {
            end_line(out, open_line, must_chunk);
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            open_line = Some(name);
        }
        out.extend_from_slice(value.as_bytes());
    }
    end_line(out, open_line, must_chunk);
    if let Some(lines) = lines {
        out.extend_from_slice(&lines.lines);
        wrote_date |= lines.date;
    }
    // The last answer says so, in the answer's own `Connection` if it has one.
    if close && !wrote_close {
        match connection_line_end {
            Some(at) => drop(out.splice(at..at, *b", close")),
            None => out.extend_from_slice(b"connection: close\r\n"),
        }
    }
    if framing.is_none() {
        match hint.map_or(Some(0), |h| h.exact()) {
            Some(n) => {
                if !bodiless_status && (n != 0 || !head_req) {
                    out.extend_from_slice(b"content-length: ");
                    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
                    out.extend_from_slice(b"\r\n");
                }
                framing = Some(Framing::Length(n));
            }
            None if head_req || bodiless_status => framing = Some(Framing::Length(0)),
            None => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n");
                framing = Some(Framing::Chunked);
            }
        }
    }
    if !wrote_date {
        date_line(out);
    }
    out.extend_from_slice(b"\r\n");
    let framing = match framing {
        _ if head_req || bodiless_status => None,
        Some(Framing::Length(0)) => None,
        other => other,
    };
    Ok((framing, close))
}

/// A `Content-Length` value: digits only, as hyper accepts it.
fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// Whether the last coding of a `Transfer-Encoding` is `chunked`.
fn last_token_is_chunked(v: &[u8]) -> bool {
    v.rsplit(|b| *b == b',')
        .next()
        .is_some_and(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"))
}

thread_local! {
    /// The second of the last `date` written on this thread, and its line.
    static DATE: std::cell::RefCell<(u64, Vec<u8>)> =
        const { std::cell::RefCell::new((u64::MAX, Vec::new())) };
}

/// `date: <IMF-fixdate>\r\n`, formatted once a second per worker thread.
fn date_line(out: &mut Vec<u8>) {
    let now = std::time::SystemTime::now();
    let second = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with_borrow_mut(|(at, line)| {
        if *at != second {
            line.clear();
            line.extend_from_slice(b"date: ");
            line.extend_from_slice(httpdate::fmt_http_date(now).as_bytes());
            line.extend_from_slice(b"\r\n");
            *at = second;
        }
        out.extend_from_slice(line);
    });
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering::SeqCst},
    };

    use http_body_util::Full;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream};

    use super::*;

    /// A body of given frames whose size it does not tell (streamed).
    struct Frames(Vec<Bytes>);

    impl HttpBody for Frames {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(if self.0.is_empty() {
                None
            } else {
                Some(Ok(Frame::data(self.0.remove(0))))
            })
        }
    }

    /// What the test handler answers, by path.
    fn answer_for(req: &Request<ReqBody>) -> Response<http_body_util::Either<Full<Bytes>, Frames>> {
        use http_body_util::Either::{Left, Right};
        let path = req.uri().path().to_owned();
        let mut resp = match path.as_str() {
            "/streamed" => Response::new(Right(Frames(vec![
                Bytes::from_static(b"abc"),
                Bytes::from_static(b"defgh"),
            ]))),
            "/no-content" => {
                let mut r = Response::new(Left(Full::new(Bytes::new())));
                *r.status_mut() = StatusCode::NO_CONTENT;
                r
            }
            "/not-modified" => {
                let mut r = Response::new(Left(Full::new(Bytes::new())));
                *r.status_mut() = StatusCode::NOT_MODIFIED;
                r.headers_mut()
                    .insert(header::CONTENT_LENGTH, HeaderValue::from_static("1234"));
                r
            }
            "/short" => {
                let mut r = Response::new(Right(Frames(vec![Bytes::from_static(b"abc")])));
                r.headers_mut()
                    .insert(header::CONTENT_LENGTH, HeaderValue::from_static("10"));
                r
            }
            "/closing" => {
                let mut r = Response::new(Left(Full::new(Bytes::from_static(b"bye"))));
                r.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                r
            }
            _ => Response::new(Left(Full::new(Bytes::from(format!(
                "{} {}",
                req.method(),
                req.uri()
            ))))),
        };
        resp.headers_mut()
            .insert("x-test", HeaderValue::from_static("1"));
        resp
    }

    const LIMITS: Limits = Limits {
        max_header_bytes: 1024,
        max_headers: 8,
    };

    /// Runs [`serve`] on one end of a pipe, writes `input` to the other
    /// (and closes it unless `keep_open`), and returns what came back, how
    /// `serve` ended, and how many requests the handler saw.
    async fn exchange(
        input: &[u8],
        ctl: Control,
    ) -> (String, io::Result<End<DuplexStream>>, usize) {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let seen = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&seen);
        let ctl = Arc::new(ctl);
        let drains = Arc::clone(&ctl);
        // `/drain`: the node starts draining while it answers.
        let answer = move |req: Request<ReqBody>| {
            counted.fetch_add(1, SeqCst);
            if req.uri().path() == "/drain" {
                drains.drain();
            }
            let resp = answer_for(&req);
            async move { (resp, None) }
        };
        client.write_all(input).await.unwrap();
        client.shutdown().await.unwrap();
        let end = serve(server, &answer, LIMITS, &ctl).await;
        // The server end is dropped with `end` only for `Closed`; a handed
        // off one is still open: read what came until now.
        let mut out = Vec::new();
        let read = async {
            let mut buf = [0u8; 4096];
            loop {
                match client.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => out.extend_from_slice(&buf[..n]),
                }
            }
        };
        let _ = tokio::time::timeout(std::time::Duration::from_millis(200), read).await;
        (
            String::from_utf8_lossy(&out).into_owned(),
            end,
            seen.load(SeqCst),
        )
    }

    /// The answers in `text`, each its head (without `date`) and body.
    fn answers(text: &str) -> Vec<String> {
        text.split("HTTP/1.1 ")
            .filter(|a| !a.is_empty())
            .map(|a| {
                a.lines()
                    .filter(|l| !l.starts_with("date: "))
                    .collect::<Vec<_>>()
                    .join("|")
            })
            .collect()
    }

    /// `request` makes each value a `HeaderValue` unchecked: whatever byte
    /// a plain request's field value may hold is one a `HeaderValue` holds,
    /// and arrives as sent (a debug build would panic in the conversion).
    #[test]
    fn every_value_byte_a_plain_request_may_hold_is_a_header_values() {
        let mut admitted = 0;
        for b in 0..=255u8 {
            let head = [&b"GET / HTTP/1.1\r\nx: a"[..], &[b], b"b\r\n\r\n"].concat();
            let Some((_, req)) = plain_request(&head, LIMITS) else {
                continue;
            };
            let req = req.expect("a plain request with a valid target");
            let value = req.headers()["x"].as_bytes();
            assert_eq!(value, [b'a', b, b'b'], "byte {b:#04x}");
            assert!(HeaderValue::from_bytes(value).is_ok(), "byte {b:#04x}");
            admitted += 1;
        }
        // HTAB, SP..=0x7e and obs-text; not CR, LF, NUL, DEL or other controls.
        assert_eq!(admitted, 1 + 95 + 128);
    }

    #[tokio::test]
    async fn plain_requests_are_answered_in_order_on_one_connection() {
        let (out, end, seen) = exchange(
            b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nHEAD /b?q=1 HTTP/1.1\r\nHost: x\r\n\r\nGET /c HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n",
            Control::default(),
        )
        .await;
        assert!(matches!(end, Ok(End::Closed)), "{end:?}");
        assert_eq!(seen, 3);
        assert_eq!(
            answers(&out),
            [
                "200 OK|x-test: 1|content-length: 6||GET /a",
                // HEAD: the length the GET would have, no body.
                "200 OK|x-test: 1|content-length: 11|",
                "200 OK|x-test: 1|content-length: 6||GET /c",
            ],
            "{out}"
        );
        assert_eq!(out.matches("date: ").count(), 3);
    }

    #[tokio::test]
    async fn anything_not_plain_goes_to_hyper_with_every_byte_of_it() {
        let others: [&[u8]; 17] = [
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
            b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            // The smuggler's pair, in both orders and spellings.
            b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\ntransfer-encoding : chunked\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nTRANSFER-ENCODING: chunked\r\n\r\n0\r\n\r\n",
            b"GET /chat HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n",
            b"GET / HTTP/1.0\r\nHost: x\r\n\r\n",
            b"GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n",
            b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, TE\r\nTE: trailers\r\n\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            // Folded and broken fields: hyper's 400.
            b"GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n folded\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nX-\x00A: 1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nA:1\r\nB:1\r\nC:1\r\nD:1\r\nE:1\r\nF:1\r\nG:1\r\nH:1\r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
        ];
        for other in others {
            let mut input = b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
            input.extend_from_slice(other);
            let (out, end, seen) = exchange(&input, Control::default()).await;
            let shown = String::from_utf8_lossy(other);
            assert_eq!(
                seen, 1,
                "served more than the first request before {shown:?}"
            );
            assert_eq!(
                answers(&out),
                ["200 OK|x-test: 1|content-length: 10||GET /first"],
                "{shown:?}"
            );
            match end {
                Ok(End::HandOff(_, rest)) => assert_eq!(&rest[..], other, "{shown:?}"),
                other_end => panic!("{shown:?}: {other_end:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_complete_head_longer_than_the_limit_goes_to_hyper() {
        let mut input = b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: ".to_vec();
        input.resize(LIMITS.max_header_bytes, b'a');
        input.extend_from_slice(b"\r\n\r\n");
        let (out, end, seen) = exchange(&input, Control::default()).await;
        assert_eq!((seen, out.as_str()), (0, ""));
        match end {
            Ok(End::HandOff(_, rest)) => assert_eq!(&rest[..], &input[..]),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_head_longer_than_the_limit_goes_to_hyper_unread_further() {
        let mut input = b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: ".to_vec();
        input.resize(LIMITS.max_header_bytes + 100, b'a');
        let (out, end, seen) = exchange(&input, Control::default()).await;
        assert_eq!((seen, out.as_str()), (0, ""));
        match end {
            Ok(End::HandOff(_, rest)) => {
                assert!(rest.len() >= LIMITS.max_header_bytes);
                assert_eq!(&rest[..], &input[..rest.len()]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn answers_are_framed_as_hyper_frames_them() {
        let (out, end, _) = exchange(
            b"GET /streamed HTTP/1.1\r\n\r\nHEAD /streamed HTTP/1.1\r\n\r\nGET /no-content HTTP/1.1\r\n\r\nGET /not-modified HTTP/1.1\r\n\r\nHEAD /no-content HTTP/1.1\r\n\r\nHEAD /not-modified HTTP/1.1\r\n\r\n",
            Control::default(),
        )
        .await;
        assert!(matches!(end, Ok(End::Closed)), "{end:?}");
        assert_eq!(
            answers(&out),
            [
                // Size unknown: chunked.
                "200 OK|x-test: 1|transfer-encoding: chunked||3|abc|5|defgh|0|",
                // HEAD of a streamed answer: neither length nor body.
                "200 OK|x-test: 1|",
                "204 No Content|x-test: 1|",
                // An empty 304's length is dropped, as hyper drops it.
                "304 Not Modified|x-test: 1|",
                "204 No Content|x-test: 1|",
                // ... and kept for `HEAD`.
                "304 Not Modified|content-length: 1234|x-test: 1|",
            ],
            "{out}"
        );
    }

    /// A pipe end that records every write it takes: whether it came as
    /// slices (`writev`) and how many bytes.
    #[derive(Debug)]
    pub(in crate::http) struct Recorded {
        pub(in crate::http) io: DuplexStream,
        pub(in crate::http) writes: Arc<std::sync::Mutex<Vec<(bool, usize)>>>,
    }

    impl AsyncRead for Recorded {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.io).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Recorded {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let r = Pin::new(&mut self.io).poll_write(cx, buf);
            if let Poll::Ready(Ok(n)) = r {
                self.writes.lock().unwrap().push((false, n));
            }
            r
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
            if let Poll::Ready(Ok(n)) = r {
                self.writes.lock().unwrap().push((true, n));
            }
            r
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.io).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.io).poll_shutdown(cx)
        }
    }

    /// One request with `Connection: close` answered with `make()`'s
    /// response: the bytes the client read and the writes `serve` made.
    async fn recorded<B, M>(make: M) -> (Vec<u8>, Vec<(bool, usize)>)
    where
        M: Fn() -> Response<B>,
        B: HttpBody<Data = Bytes> + Unpin,
        B::Error: std::fmt::Display,
    {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let writes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let io = Recorded {
            io: server,
            writes: Arc::clone(&writes),
        };
        let answer = move |_req: Request<ReqBody>| {
            let resp = make();
            async move { (resp, None) }
        };
        client
            .write_all(b"GET / HTTP/1.1\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let end = serve(io, &answer, LIMITS, &Control::default()).await;
        assert!(matches!(end, Ok(End::Closed)), "{end:?}");
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        let writes = writes.lock().unwrap().clone();
        (got, writes)
    }

    /// The head and a first piece that fit [`COALESCED_MAX`] together go
    /// out as one contiguous write (the kernel takes one slice sooner than
    /// several); a larger body goes as slices beside the head, uncopied;
    /// the bytes on the wire are the same either way.
    #[tokio::test]
    async fn a_small_answer_is_one_write_a_large_one_is_not_copied_into_it() {
        // The head this test's answers carry: status, close, length, date.
        let head_len = |body: usize| {
            let head = format!(
                "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: {body}\r\ndate: Sun, 06 Nov 1994 08:49:37 GMT\r\n\r\n"
            );
            head.len()
        };
        let fits = COALESCED_MAX - head_len(COALESCED_MAX);
        for (body, one_write) in [(3, true), (fits, true), (fits + 1, false), (20_000, false)] {
            let (got, writes) =
                recorded(|| Response::new(Full::new(Bytes::from(vec![b'x'; body])))).await;
            let text = String::from_utf8_lossy(&got);
            let (head, sent) = text.split_once("\r\n\r\n").unwrap();
            assert!(head.contains(&format!("content-length: {body}")), "{head}");
            assert_eq!(sent, "x".repeat(body), "body of {body} bytes");
            assert_eq!(head.len() + 4, head_len(body), "{head}");
            if one_write {
                assert_eq!(writes, [(false, got.len())], "body of {body} bytes");
            } else {
                assert!(
                    writes.first().is_some_and(|w| w.0),
                    "body of {body} bytes: {writes:?}"
                );
                assert_eq!(writes.iter().map(|w| w.1).sum::<usize>(), got.len());
            }
        }
    }

    /// A chunked answer whose end is known with its first piece (an
    /// origin's answer that came whole) ends in the same write; one with
    /// more to come writes the rest, and the end, after it.
    #[tokio::test]
    async fn a_chunked_answer_that_came_whole_ends_in_its_one_write() {
        let (got, writes) =
            recorded(|| Response::new(Frames(vec![Bytes::from_static(b"abc")]))).await;
        let text = String::from_utf8_lossy(&got);
        assert!(text.ends_with("\r\n\r\n3\r\nabc\r\n0\r\n\r\n"), "{text}");
        assert_eq!(writes, [(false, got.len())], "{text}");

        let (got, writes) = recorded(|| {
            Response::new(Frames(vec![
                Bytes::from_static(b"abc"),
                Bytes::from_static(b"defgh"),
            ]))
        })
        .await;
        let text = String::from_utf8_lossy(&got);
        assert!(
            text.ends_with("\r\n\r\n3\r\nabc\r\n5\r\ndefgh\r\n0\r\n\r\n"),
            "{text}"
        );
        let first = text.find("3\r\nabc\r\n").unwrap() + 8;
        assert_eq!(writes.first(), Some(&(false, first)), "{text}");
        assert_eq!(writes.iter().map(|w| w.1).sum::<usize>(), got.len());
    }

    #[tokio::test]
    async fn connection_close_from_either_side_or_a_drain_ends_after_the_answer() {
        for (input, ctl) in [
            (
                &b"GET /a HTTP/1.1\r\nConnection: close\r\n\r\nGET /never HTTP/1.1\r\n\r\n"[..],
                Control::default(),
            ),
            (
                &b"GET /closing HTTP/1.1\r\n\r\nGET /never HTTP/1.1\r\n\r\n"[..],
                Control::default(),
            ),
            (
                &b"GET /drain HTTP/1.1\r\n\r\nGET /never HTTP/1.1\r\n\r\n"[..],
                Control::default(),
            ),
        ] {
            let (out, end, seen) = exchange(input, ctl).await;
            assert!(matches!(end, Ok(End::Closed)), "{end:?}");
            assert_eq!(seen, 1, "{out}");
            assert!(out.contains("connection: close\r\n"), "{out}");
            assert!(!out.contains("/never"), "{out}");
        }
    }

    /// A connection waiting for its visitor's next request holds none of
    /// its buffers (read buffer, field list, answer head): they went back to
    /// the worker's spares as one set, and the next request (arriving later,
    /// and split over two writes) is read into a set again. The thread's
    /// spares are bounded.
    #[tokio::test]
    async fn a_quiet_connection_gives_its_read_buffer_back() {
        let spares = || SPARE.with_borrow(Vec::len);
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let answer = |req: Request<ReqBody>| {
            let resp = answer_for(&req);
            async move { (resp, None) }
        };
        let ctl = Control::default();
        let served = tokio::spawn(async move { serve(server, &answer, LIMITS, &ctl).await });
        let before = spares();
        let mut got = Vec::new();
        let mut read_answer = async |client: &mut DuplexStream, path: &str| {
            got.clear();
            let mut buf = [0u8; 1024];
            while !String::from_utf8_lossy(&got).ends_with(path) {
                let n = client.read(&mut buf).await.unwrap();
                assert!(n > 0, "closed");
                got.extend_from_slice(&buf[..n]);
            }
        };
        client
            .write_all(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        read_answer(&mut client, "GET /a").await;
        // The server reads again, finds nothing and waits: the buffer is back.
        for _ in 0..100 {
            if spares() > before {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(
            spares(),
            before + 1,
            "the quiet connection's buffer is kept for others"
        );
        let given = SPARE.with_borrow(|s| {
            s.last()
                .map(|b| (b.read.capacity(), b.fields.capacity(), b.out.capacity()))
        });
        assert!(
            given.is_some_and(|(r, f, o)| r >= READ_SIZE / 4 && f > 0 && o > 0),
            "the field list and the answer's head go back with it: {given:?}"
        );
        client.write_all(b"GET /b HTTP/1.1\r\nHo").await.unwrap();
        tokio::task::yield_now().await;
        client.write_all(b"st: x\r\n\r\n").await.unwrap();
        read_answer(&mut client, "GET /b").await;
        drop(client);
        assert!(matches!(served.await.unwrap(), Ok(End::Closed)));
        // Given back more often than it holds, the thread keeps at most its bound.
        for _ in 0..2 * SPARE_BUFFERS {
            give_back(spare_buffers());
            give_back(Buffers {
                read: BytesMut::with_capacity(READ_SIZE),
                fields: Vec::new(),
                out: Vec::new(),
            });
        }
        assert_eq!(spares(), SPARE_BUFFERS);
    }

    #[tokio::test]
    async fn a_drain_between_requests_closes_without_reading_more() {
        let ctl = Control::default();
        ctl.drain();
        let (out, end, seen) = exchange(b"GET /a HTTP/1.1\r\n\r\n", ctl).await;
        assert!(matches!(end, Ok(End::Closed)), "{end:?}");
        assert_eq!((seen, out.as_str()), (0, ""));
    }

    #[tokio::test]
    async fn a_body_shorter_than_its_length_breaks_the_connection() {
        let (out, end, _) = exchange(
            b"GET /short HTTP/1.1\r\n\r\nGET /a HTTP/1.1\r\n\r\n",
            Control::default(),
        )
        .await;
        assert!(end.is_err(), "{end:?}");
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\nabc"), "{out}");
        assert!(!out.contains("GET /a"), "{out}");
    }

    #[tokio::test]
    async fn a_target_the_http_types_refuse_is_a_400_and_the_end() {
        // httparse takes `<`, `>` and a backquote in a target; `http::Uri`
        // does not (hyper: 400 and close).
        for target in ["/a<b", "/a>b", "/a`b"] {
            let input = format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\nGET /a HTTP/1.1\r\n\r\n");
            let (out, end, seen) = exchange(input.as_bytes(), Control::default()).await;
            assert!(matches!(end, Ok(End::Closed)), "{end:?}");
            assert_eq!(seen, 0, "{target}");
            assert!(
                out.starts_with(
                    "HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n"
                ),
                "{out}"
            );
            assert!(!out.contains("GET /a"), "{out}");
        }
    }

    /// One answer of `(status, headers, body)` to `method` with `Connection:
    /// close`, as written by `serve` here and by hyper's own HTTP/1 server;
    /// both with the `date` line taken out.
    async fn both_ways(
        method: &str,
        status: u16,
        headers: &'static [(&'static str, &'static str)],
        body: &'static [&'static [u8]],
        exact: bool,
    ) -> (String, String) {
        use http_body_util::Either::{Left, Right};
        let make = move || {
            let body = if exact {
                Left(Full::new(Bytes::from(body.concat())))
            } else {
                Right(Frames(body.iter().map(|b| Bytes::from_static(b)).collect()))
            };
            let mut resp = Response::new(body);
            *resp.status_mut() = StatusCode::from_u16(status).unwrap();
            for (n, v) in headers {
                resp.headers_mut().append(*n, HeaderValue::from_static(v));
            }
            (resp, None)
        };
        let request = format!("{method} /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        here_and_hyper(request.as_bytes(), make).await
    }

    /// `request`'s answer from `make`, as written by `serve` here and by
    /// hyper's own HTTP/1 server (its lines moved into the map first, as the
    /// node's service does); both with the `date` line taken out.
    async fn here_and_hyper<B, M>(request: &[u8], make: M) -> (String, String)
    where
        M: Fn() -> Answer<B> + Clone + Send + Sync + 'static,
        B: HttpBody<Data = Bytes> + Unpin + Send + 'static,
        B::Error: std::fmt::Display + Send + Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let strip = |raw: Vec<u8>| {
            String::from_utf8_lossy(&raw)
                .split("\r\n")
                .filter(|l| !l.starts_with("date: "))
                .collect::<Vec<_>>()
                .join("\r\n")
        };
        let (mut client, server) = tokio::io::duplex(1 << 16);
        client.write_all(request).await.unwrap();
        let here = make.clone();
        let answer = move |_req: Request<ReqBody>| {
            let resp = here();
            async move { resp }
        };
        let ctl = Control::default();
        let ours = tokio::spawn(async move {
            let _ = serve(server, &answer, LIMITS, &ctl).await;
        });
        let mut mine = Vec::new();
        client.read_to_end(&mut mine).await.unwrap();
        ours.await.unwrap();
        let (mut client, server) = tokio::io::duplex(1 << 16);
        client.write_all(request).await.unwrap();
        let service = hyper::service::service_fn(move |_req| {
            let (mut resp, lines) = make();
            if let Some(lines) = lines {
                lines.into_map(&mut resp);
            }
            async move { Ok::<_, std::convert::Infallible>(resp) }
        });
        let theirs = tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(server), service)
                .await;
        });
        let mut hypers = Vec::new();
        client.read_to_end(&mut hypers).await.unwrap();
        theirs.await.unwrap();
        (strip(mine), strip(hypers))
    }

    #[tokio::test]
    async fn every_answer_is_framed_byte_for_byte_as_hyper_frames_it() {
        const HEADERS: [&[(&str, &str)]; 7] = [
            &[],
            &[
                ("content-type", "text/plain"),
                ("set-cookie", "a=1"),
                ("set-cookie", "b=2"),
            ],
            &[("content-length", "5")],
            &[("connection", "close")],
            &[("transfer-encoding", "chunked")],
            &[("transfer-encoding", "gzip")],
            &[
                ("date", "Thu, 01 Jan 1970 00:00:00 GMT"),
                ("connection", "keep-alive"),
            ],
        ];
        const BODIES: [&[&[u8]]; 3] = [&[], &[b"hello"], &[b"hel", b"lo"]];
        let mut checked = 0;
        for method in ["GET", "HEAD"] {
            for status in [200, 204, 304, 404, 599] {
                for headers in HEADERS {
                    for body in BODIES {
                        for exact in [true, false] {
                            // A length header that lies about the body is
                            // the handler's bug, not a framing to compare.
                            let claims = headers.iter().any(|(n, _)| *n == "content-length");
                            if claims && (body.concat().len() != 5 || !exact) {
                                continue;
                            }
                            let (mine, mut hypers) =
                                both_ways(method, status, headers, body, exact).await;
                            // hyper 1.x adds `, chunked` after a coding that
                            // lacks it, and then also to the next joined line
                            // (`connection: close, chunked`): a slip of its
                            // own, not copied here.
                            if headers == [("transfer-encoding", "gzip")] {
                                hypers = hypers.replace(
                                    "connection: close, chunked\r\n",
                                    "connection: close\r\n",
                                );
                            }
                            assert_eq!(
                                mine, hypers,
                                "{method} {status} {headers:?} {body:?} exact={exact}"
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 250, "{checked}");
    }

    #[tokio::test]
    async fn head_lines_are_written_as_hyper_writes_them_from_the_map() {
        let make = || {
            let mut lines = Vec::with_capacity(64);
            HeadLines::push(
                &mut lines,
                &header::CONTENT_TYPE,
                b"text/html; charset=utf-8",
            );
            HeadLines::push(&mut lines, &header::SET_COOKIE, b"a=1; Path=/");
            HeadLines::push(&mut lines, &header::SET_COOKIE, b"b=2");
            HeadLines::push(&mut lines, &header::VARY, b"Accept, Accept-Language");
            let mut resp = Response::new(Full::new(Bytes::from_static(b"page")));
            resp.headers_mut()
                .insert("x-first", HeaderValue::from_static("map"));
            (resp, Some(HeadLines::done(lines)))
        };
        // Moved into the map: in order, after what the map held.
        let (mut moved, lines) = make();
        lines.unwrap().into_map(&mut moved);
        let fields: Vec<String> = moved
            .headers()
            .iter()
            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
            .collect();
        assert_eq!(
            fields,
            [
                "x-first: map",
                "content-type: text/html; charset=utf-8",
                "set-cookie: a=1; Path=/",
                "set-cookie: b=2",
                "vary: Accept, Accept-Language",
            ]
        );
        // Written here from the lines, and by hyper from the map: the same
        // bytes, `connection: close` after the lines as after the map.
        let (mine, hypers) =
            here_and_hyper(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n", make).await;
        assert!(mine.contains("\r\nset-cookie: b=2\r\n"), "{mine}");
        assert_eq!(mine, hypers);
    }
}
