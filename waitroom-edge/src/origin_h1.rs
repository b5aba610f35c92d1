//! A plain-HTTP/1.1 origin exchange written for the proxy alone.
//!
//! hyper's client, even driven in the request's own task
//! ([`crate::origin_pool`]), hands each request to its connection through a
//! dispatch channel, parses the answer into a fresh `HeaderMap` through its
//! role machinery and feeds the body through a second channel; on the
//! admitted path that was most of the difference between the edge and nginx
//! (docs/BENCHMARKS.md, issue 17). This module does only what the proxy needs
//! on a plain TCP connection it owns:
//!
//! - the request head is encoded from the visitor's (already rewritten)
//!   headers by reference — no copy of the map — into one buffer, framed by
//!   the body's exact length, or chunked when the length is unknown; a short
//!   body is written with the head in one `write`;
//! - the answer's head is parsed with `httparse` in place, its values are
//!   slices of the bytes read (no copy), interim `1xx` answers are skipped;
//! - the body is read from the same buffer: an answer read whole with its
//!   head (most of them) returns its connection to the pool at once and
//!   leaves as one frame;
//! - an origin that answers before reading all of an upload and closes (a
//!   `413`) has its answer passed on, not a `502` for the failed write.
//!
//! Framing follows RFC 9112 §6.3 strictly, since an origin answer that two
//! parties could frame differently is how responses get smuggled: no body
//! for `HEAD`, `204` and `304`; `Transfer-Encoding` wins over
//! `Content-Length` and such a connection is never reused; two different
//! lengths, a bad length or a bad chunk is an invalid answer; an answer
//! without either ends when the origin closes. TLS origins and upgrades stay
//! on hyper ([`crate::origin_pool`]).
use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, Waker, ready},
};

use bytes::{Bytes, BytesMut};
use http::{
    HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version, header, uri::Authority,
};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::{
    io::{AsyncRead as _, AsyncWriteExt as _, ReadBuf},
    net::TcpStream,
};
use waitroom_runtime::body::{Body, BoxError};

use crate::{forwarded::Additions, origin_pool::OriginPool};

/// Headers an origin answer may carry (hyper's default too).
pub const MAX_HEADERS: usize = 100;
/// Bytes an answer's head may take before it is refused (hyper's default
/// buffer limit, so an origin that worked before still does).
pub const MAX_HEAD: usize = 8192 + 4096 * 100;
/// Interim (`1xx`) answers passed over before the final one; more, and the
/// answer is refused. A real origin sends one `100 Continue` and a few `103
/// Early Hints` at most; one that streams them without end would otherwise
/// keep the node parsing until `origin_timeout_ms`. The interim heads also
/// count towards [`MAX_HEAD`] with the final one.
pub const MAX_INTERIM: usize = 16;
/// How an answer's head is read: httparse's defaults, which fold no line
/// (an obsolete folded field is malformed), so a field value holds only
/// HTAB, SP, VCHAR and obs-text — what `parse_head` relies on to make its
/// `HeaderValue`s unchecked.
fn answer_parser() -> httparse::ParserConfig {
    httparse::ParserConfig::default()
}

/// Longest chunk-size line accepted (size, extensions, CRLF).
const MAX_CHUNK_LINE: usize = 4096;
/// Room made in the read buffer before each read.
const READ_RESERVE: usize = 16 * 1024;
/// Buffer capacity an idle connection keeps (more is let go at check-in).
const KEPT_CAPACITY: usize = 2 * READ_RESERVE;
/// A request body's bytes gathered before they are written.
const WRITE_GATHER: usize = 64 * 1024;

/// Why an exchange with an origin failed.
#[derive(Debug, thiserror::Error)]
pub enum H1Error {
    /// The connection ended before a byte of the answer: an idle connection
    /// the origin had closed, or an origin that drops requests.
    #[error("the origin closed the connection without answering")]
    ClosedBeforeAnswer,
    /// The answer (head or body) ended before its end.
    #[error("the origin's answer ended early")]
    Incomplete,
    #[error("origin connection: {0}")]
    Io(#[from] io::Error),
    /// Not HTTP/1.1 as RFC 9112 frames it.
    #[error("invalid answer: {0}")]
    Invalid(&'static str),
    /// The visitor's request body failed or did not match its length: the
    /// visitor's fault, not the origin's.
    #[error("request body: {0}")]
    RequestBody(#[source] BoxError),
}

impl H1Error {
    /// The connection failed (as opposed to the origin answering badly or
    /// the visitor's body failing).
    pub fn is_connection_failure(&self) -> bool {
        matches!(
            self,
            Self::ClosedBeforeAnswer | Self::Incomplete | Self::Io(_)
        )
    }
}

/// One HTTP/1.1 connection to a plain-HTTP origin.
#[derive(Debug)]
pub struct H1Conn {
    io: TcpStream,
    /// What was read and not yet consumed (never holds a byte of the next
    /// answer once an answer is complete: such a connection is not reused).
    buf: BytesMut,
    /// The request head (and short bodies) being written; kept for its
    /// capacity.
    out: Vec<u8>,
    /// Header names and where their values sit in `buf`, while a head is
    /// turned into a `HeaderMap`; kept for its capacity.
    spans: Vec<(HeaderName, usize, usize)>,
    /// Where it goes (the pool's key).
    authority: Authority,
    /// Taken from the pool (it served an earlier request).
    pub reused: bool,
}

/// How the request's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RequestFraming {
    /// Nothing after the head; `Content-Length: 0` written when `true`.
    Empty(bool),
    Length(u64),
    Chunked,
}

/// How the answer's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    None,
    Length(u64),
    Chunked,
    /// Until the origin closes.
    Close,
}

/// What a parse of the buffer found.
#[derive(Debug)]
enum Parsed {
    /// The final answer's head, its body's framing and whether the
    /// connection may carry another exchange after it.
    Final(Head, Framing, bool),
    /// An interim (`1xx`) answer, consumed.
    Interim,
    /// Not all of a head yet.
    Partial,
}

/// The answer's head. `Connection` (when it names no field but `close` and
/// `keep-alive`) and `Keep-Alive` are read, not kept: they describe the
/// node's connection to the origin, and the proxy strips them anyway.
///
/// Most answers' fields come as `lines` ([`OriginLines`]), `name:
/// value\r\n` each, copied from the head as the origin wrote them (names
/// in its spelling) without the fields of the framing (the length is the
/// body's, which the writer states), of this hop or of the room's
/// origin-command header: what the visitor gets, written as it stands
/// (`h1::HeadLines`), where a `HeaderMap` cost ~3,000 instructions to
/// fill, strip, encode and drop (issue 17). `headers` is then empty.
/// The answer to a `HEAD`, a `204` or `304` (whose length the writer
/// cannot state) and one whose `Connection` names fields come in
/// `headers` instead, `lines` `None`.
#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub lines: Option<OriginLines>,
}

/// An answer's fields as the visitor gets them, copied from the origin's
/// head ([`Head`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct OriginLines {
    /// `name: value\r\n` each.
    pub lines: Vec<u8>,
    /// One of them is `date`.
    pub date: bool,
    /// The values of the room's origin-command field, left out of `lines`.
    pub commands: Vec<Vec<u8>>,
}

impl H1Conn {
    /// A fresh connection to `authority`.
    pub fn new(io: TcpStream, authority: Authority) -> Self {
        Self {
            io,
            authority,
            buf: BytesMut::new(),
            out: Vec::new(),
            spans: Vec::new(),
            reused: false,
        }
    }

    /// Whether an idle connection may take another request: the origin has
    /// neither closed it nor written to it unasked.
    ///
    /// By what the worker's reactor has seen, without a system call while
    /// it has seen nothing since the answer was read (whose last, short
    /// read left the socket not ready, `poll_fill`). A close still
    /// on its way to the reactor is then not seen, as by nginx's pool of
    /// kept-alive upstreams: a request sent on it fails as `reused` and goes
    /// again on a new connection when it can be replayed
    /// (`proxy::forward`). With `sure` (a request that cannot be sent
    /// twice: a body, a method that is not idempotent) the socket is asked
    /// anyway, one `recv` that peeks.
    pub fn is_idle_and_open(&mut self, sure: bool) -> bool {
        // Bytes left over from the last answer would be read as the next.
        if !self.buf.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(Waker::noop());
        match self.io.poll_read_ready(&mut cx) {
            Poll::Pending if sure => {
                let mut probe = [std::mem::MaybeUninit::<u8>::uninit(); 1];
                matches!(
                    socket2::SockRef::from(&self.io).peek(&mut probe),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock
                )
            }
            Poll::Pending => true,
            Poll::Ready(Err(_)) => false,
            Poll::Ready(Ok(())) => {
                let mut probe = [0u8; 1];
                matches!(self.io.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
        }
    }

    /// Lets go of what an upload or a large answer grew the buffers to: up
    /// to 256 idle connections per origin wait in each worker's pool.
    pub fn trim_buffers(&mut self) {
        if self.out.capacity() > KEPT_CAPACITY {
            self.out = Vec::new();
        }
        if self.buf.capacity() > KEPT_CAPACITY {
            self.buf = BytesMut::new();
        }
    }

    /// Reads more of the answer into `buf`; `Ok(0)` when the origin closed.
    ///
    /// Through tokio's `AsyncRead`, which takes a read that did not fill
    /// the space offered as the socket drained (edge-triggered epoll) and
    /// forgets its readiness: the connection, back in the pool, is then
    /// checked without a system call ([`Self::is_idle_and_open`]), where
    /// `try_read_buf` left the readiness set and the check paid a read that
    /// could only say "nothing yet" (one `recvfrom` a proxied request).
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < READ_RESERVE / 4 {
            self.buf.reserve(READ_RESERVE);
        }
        let mut read = ReadBuf::uninit(self.buf.spare_capacity_mut());
        ready!(Pin::new(&mut self.io).poll_read(cx, &mut read))?;
        let n = read.filled().len();
        // SAFETY: `poll_read` initialised the first `n` bytes of the spare
        // capacity (`ReadBuf::filled`), which directly follow `len`.
        unsafe { self.buf.set_len(self.buf.len() + n) };
        Poll::Ready(Ok(n))
    }

    async fn fill(&mut self) -> io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_fill(cx)).await
    }

    /// Sends the request and reads the answer's head.
    ///
    /// `headers` are sent as they are but for the framing headers
    /// (`Content-Length`, `Transfer-Encoding`), which follow `body`, and
    /// those `additions` replace; `additions` follow them; `host` is sent as
    /// `Host` when `headers` have none; `command`, the room's
    /// origin-command field, is taken out of the answer's lines
    /// ([`OriginLines::commands`]). Returns the head and the body, which
    /// owns the connection until the answer has been read.
    #[expect(
        clippy::too_many_arguments,
        reason = "the request's parts, borrowed rather than copied into a struct per request"
    )]
    pub async fn send(
        mut self,
        method: &Method,
        target: &str,
        headers: &HeaderMap,
        additions: &Additions,
        host: &str,
        mut body: Body,
        command: Option<&HeaderName>,
    ) -> Result<(Head, H1Body), H1Error> {
        let framing = request_framing(method, headers, &body);
        self.out.clear();
        encode_head(
            &mut self.out,
            method,
            target,
            (headers, additions),
            host,
            framing,
        );
        let written = self.write_body(&mut body, framing).await;
        drop(body);
        let (head, framing, reusable) = match written {
            Ok(()) => self.read_head(method, command).await?,
            // An origin may answer before it has read all of the request
            // (refusing an upload) and close: if its answer came, that is
            // the answer, on a connection that is done.
            Err(err @ H1Error::Io(_)) => match self.read_head(method, command).await {
                Ok((head, framing, _)) => (head, framing, false),
                Err(_) => return Err(err),
            },
            Err(err) => return Err(err),
        };
        Ok((head, H1Body::new(self, framing, reusable)))
    }

    /// The pool's key.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// Writes what `out` holds and the request body after it.
    async fn write_body(
        &mut self,
        body: &mut Body,
        framing: RequestFraming,
    ) -> Result<(), H1Error> {
        let (mut left, chunked) = match framing {
            RequestFraming::Empty(_) => {
                self.io.write_all(&self.out).await?;
                return Ok(());
            }
            RequestFraming::Length(n) => (n, false),
            RequestFraming::Chunked => (0, true),
        };
        let mut trailers_sent = false;
        loop {
            // What the body has ready now goes out with what is gathered;
            // when it has nothing ready, the gathered bytes go first.
            let polled =
                std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *body).poll_frame(cx))).await;
            let frame = match polled {
                Poll::Ready(frame) => frame,
                Poll::Pending => {
                    self.flush_out().await?;
                    std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
                }
            };
            let Some(frame) = frame else { break };
            let frame = frame.map_err(H1Error::RequestBody)?;
            match frame.into_data() {
                Ok(data) => {
                    if data.is_empty() {
                        continue;
                    }
                    if chunked {
                        write_hex_line(&mut self.out, data.len());
                    } else {
                        let n = data.len() as u64;
                        if n > left {
                            return Err(H1Error::RequestBody(
                                "the request body is longer than its Content-Length".into(),
                            ));
                        }
                        left -= n;
                    }
                    if data.len() >= WRITE_GATHER / 4 {
                        self.flush_out().await?;
                        self.io.write_all(&data).await?;
                    } else {
                        self.out.extend_from_slice(&data);
                    }
                    if chunked {
                        self.out.extend_from_slice(b"\r\n");
                    }
                    if self.out.len() >= WRITE_GATHER {
                        self.flush_out().await?;
                    }
                }
                Err(frame) => {
                    if let (true, Ok(trailers)) = (chunked, frame.into_trailers()) {
                        self.out.extend_from_slice(b"0\r\n");
                        encode_headers(&mut self.out, &trailers, |_| true);
                        self.out.extend_from_slice(b"\r\n");
                        trailers_sent = true;
                        break;
                    }
                }
            }
        }
        if chunked && !trailers_sent {
            self.out.extend_from_slice(b"0\r\n\r\n");
        }
        if !chunked && left > 0 {
            return Err(H1Error::RequestBody(
                "the request body is shorter than its Content-Length".into(),
            ));
        }
        self.flush_out().await
    }

    async fn flush_out(&mut self) -> Result<(), H1Error> {
        if !self.out.is_empty() {
            self.io.write_all(&self.out).await?;
            self.out.clear();
        }
        Ok(())
    }

    /// Reads up to the final answer's head (interim `1xx` answers skipped).
    async fn read_head(
        &mut self,
        method: &Method,
        command: Option<&HeaderName>,
    ) -> Result<(Head, Framing, bool), H1Error> {
        let mut answered = false;
        let mut interims = 0;
        // Bytes of the interim heads passed over.
        let mut passed = 0;
        loop {
            if !self.buf.is_empty() {
                answered = true;
                let before = self.buf.len();
                match self.parse_head(method, command)? {
                    Parsed::Final(head, framing, reusable) => return Ok((head, framing, reusable)),
                    Parsed::Interim => {
                        interims += 1;
                        passed += before - self.buf.len();
                        if interims > MAX_INTERIM || passed >= MAX_HEAD {
                            return Err(H1Error::Invalid("too many interim (1xx) answers"));
                        }
                        // What follows it may be complete already.
                        continue;
                    }
                    Parsed::Partial if passed + self.buf.len() >= MAX_HEAD => {
                        return Err(H1Error::Invalid("the answer's head is too large"));
                    }
                    Parsed::Partial => {}
                }
            }
            if self.fill().await? == 0 {
                return Err(if answered {
                    H1Error::Incomplete
                } else {
                    H1Error::ClosedBeforeAnswer
                });
            }
        }
    }

    /// The final answer's head if `buf` holds all of it; an interim answer
    /// is consumed.
    fn parse_head(
        &mut self,
        method: &Method,
        command: Option<&HeaderName>,
    ) -> Result<Parsed, H1Error> {
        // Uninitialised (httparse writes a slot before it reads it): a
        // hundred slots set to empty first cost ~100 instructions a request.
        let mut slots = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut []);
        let len = match answer_parser().parse_response_with_uninit_headers(
            &mut parsed,
            &self.buf,
            &mut slots,
        ) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
            Err(httparse::Error::TooManyHeaders) => {
                return Err(H1Error::Invalid("too many header fields"));
            }
            Err(_) => return Err(H1Error::Invalid("malformed head")),
        };
        let code = parsed.code.unwrap_or(0);
        let status = StatusCode::from_u16(code).map_err(|_| H1Error::Invalid("bad status code"))?;
        if status.is_informational() {
            if status == StatusCode::SWITCHING_PROTOCOLS {
                return Err(H1Error::Invalid("101 to a request that asked no upgrade"));
            }
            let _ = self.buf.split_to(len);
            return Ok(Parsed::Interim);
        }
        let version = if parsed.version == Some(0) {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        };
        // The answer's fields go to the visitor as lines copied from the head
        // (`HeadLines`), not through a `HeaderMap` — unless the visitor's
        // `HEAD` or a bodiless status makes the writer need the origin's
        // length, or a `Connection` names fields to drop with it (rare: the
        // map path handles both).
        let as_lines = *method != Method::HEAD
            && status != StatusCode::NO_CONTENT
            && status != StatusCode::NOT_MODIFIED;
        let Fields {
            length,
            transfer_encoding,
            chunked,
            close,
            keep_alive,
            lines,
        } = read_fields(
            &parsed,
            &self.buf,
            as_lines.then_some(len + LINES_SPARE),
            command,
        )?;
        if lines.is_none() {
            field_spans(&parsed, self.buf.as_ptr() as usize, &mut self.spans)?;
        }
        let head_bytes = self.buf.split_to(len).freeze();
        let mut headers = if lines.is_none() {
            answer_map(&mut self.spans, &head_bytes)
        } else {
            HeaderMap::new()
        };
        let mut reusable = if version == Version::HTTP_11 {
            !close
        } else {
            keep_alive && !close
        };
        let framing = if *method == Method::HEAD
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            Framing::None
        } else if transfer_encoding {
            if length.is_some() {
                // Both: the length is ignored, and so is the rest of what
                // this connection may carry (RFC 9112 §6.3, 3).
                headers.remove(header::CONTENT_LENGTH);
                reusable = false;
            }
            if chunked {
                Framing::Chunked
            } else {
                Framing::Close
            }
        } else if let Some(n) = length {
            Framing::Length(n)
        } else {
            Framing::Close
        };
        if framing == Framing::Close {
            reusable = false;
        }
        Ok(Parsed::Final(
            Head {
                status,
                version,
                headers,
                lines,
            },
            framing,
            reusable,
        ))
    }
}

/// The longest name a `HeaderName` holds.
const MAX_NAME: usize = (1 << 16) - 1;
/// Room kept after an answer's lines for the node's own (`Via`).
const LINES_SPARE: usize = 64;

/// What an answer's field is to the proxy, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AnswerField {
    Length,
    TransferEncoding,
    Connection,
    KeepAlive,
    /// `Proxy-Connection`, `Proxy-Authenticate`, `Proxy-Authorization`,
    /// `TE`, `Trailer`, `Upgrade` (with the three above, what
    /// `proxy::strip_hop_by_hop` removes).
    HopByHop,
    Date,
    Other,
}

/// Which [`AnswerField`] `name` is (ASCII case-insensitive).
#[inline]
fn answer_field(name: &[u8]) -> AnswerField {
    let is = |known: &[u8]| name.eq_ignore_ascii_case(known);
    match name.len() {
        2 if is(b"te") => AnswerField::HopByHop,
        4 if is(b"date") => AnswerField::Date,
        7 if is(b"trailer") || is(b"upgrade") => AnswerField::HopByHop,
        10 if is(b"connection") => AnswerField::Connection,
        10 if is(b"keep-alive") => AnswerField::KeepAlive,
        14 if is(b"content-length") => AnswerField::Length,
        16 if is(b"proxy-connection") => AnswerField::HopByHop,
        17 if is(b"transfer-encoding") => AnswerField::TransferEncoding,
        18 if is(b"proxy-authenticate") => AnswerField::HopByHop,
        19 if is(b"proxy-authorization") => AnswerField::HopByHop,
        _ => AnswerField::Other,
    }
}

/// What a `Connection` value says.
#[derive(Debug, Clone, Copy)]
struct ConnectionSays {
    close: bool,
    keep_alive: bool,
    /// A token other than `close` and `keep-alive`: a field that goes with
    /// it (RFC 9110 §7.6.1).
    names_fields: bool,
}

/// Reads a `Connection` value's comma-separated tokens (ASCII
/// case-insensitive, empty ones skipped).
fn connection_says(value: &[u8]) -> ConnectionSays {
    let mut says = ConnectionSays {
        close: false,
        keep_alive: false,
        names_fields: false,
    };
    for token in value.split(|b| *b == b',') {
        let token = token.trim_ascii();
        let is_close = token.eq_ignore_ascii_case(b"close");
        let is_keep_alive = token.eq_ignore_ascii_case(b"keep-alive");
        says.close |= is_close;
        says.keep_alive |= is_keep_alive;
        says.names_fields |= !(is_close || is_keep_alive || token.is_empty());
    }
    says
}

/// What an answer's fields say of its framing and connection, and the
/// fields themselves as lines when they can go so ([`Head`]).
#[derive(Debug, Default)]
struct Fields {
    length: Option<u64>,
    transfer_encoding: bool,
    /// The last coding of `Transfer-Encoding` is `chunked`.
    chunked: bool,
    close: bool,
    keep_alive: bool,
    /// Every field but those of the framing and of this hop; `None` when
    /// asked for none or when a `Connection` names a field (or a name is
    /// longer than a `HeaderName` holds).
    lines: Option<OriginLines>,
}

/// Reads `parsed`'s fields (read from `head`); lines are made when
/// `lines` gives the bytes to reserve for them.
///
/// A field is copied as the origin wrote it, name in its spelling, when
/// its line is `name: value\r\n` exactly (most origins write every line
/// so), and a run of such lines with nothing dropped between them as one
/// slice; any other line is written out as `name: value\r\n`. Four
/// copies a field cost more than the `HeaderMap` saved (issue 17).
fn read_fields(
    parsed: &httparse::Response<'_, '_>,
    head: &[u8],
    lines: Option<usize>,
    command: Option<&HeaderName>,
) -> Result<Fields, H1Error> {
    let mut raw = lines.is_some();
    let mut out = Vec::with_capacity(lines.unwrap_or(0));
    let mut date = false;
    let mut commands = Vec::new();
    let command = command.map_or(&[][..], |c| c.as_str().as_bytes());
    let mut f = Fields::default();
    let base = head.as_ptr() as usize;
    // Bytes of `head` to copy as they stand, not yet copied.
    let mut run = 0..0;
    for h in parsed.headers.iter() {
        let name = h.name.as_bytes();
        let field = answer_field(name);
        match field {
            AnswerField::Length => {
                let n = parse_length(h.value).ok_or(H1Error::Invalid("bad Content-Length"))?;
                if f.length.is_some_and(|l| l != n) {
                    return Err(H1Error::Invalid("two different Content-Lengths"));
                }
                f.length = Some(n);
            }
            AnswerField::TransferEncoding => {
                f.transfer_encoding = true;
                // Only the last coding decides (RFC 9112 §6.3, 4).
                f.chunked = last_token(h.value).is_some_and(|t| t.eq_ignore_ascii_case(b"chunked"));
            }
            AnswerField::Connection => {
                let says = connection_says(h.value);
                f.close |= says.close;
                f.keep_alive |= says.keep_alive;
                // Names a field that goes with it: the map path strips both.
                raw &= !says.names_fields;
            }
            // Said of this hop only: never the visitor's.
            AnswerField::KeepAlive | AnswerField::HopByHop => {}
            // The origin's word to the node, never the visitor's.
            AnswerField::Date | AnswerField::Other if name.eq_ignore_ascii_case(command) => {
                commands.push(h.value.to_vec());
            }
            AnswerField::Date | AnswerField::Other if raw => {
                if name.len() > MAX_NAME {
                    // A `HeaderName` could not hold it: the map path
                    // refuses the answer.
                    raw = false;
                    continue;
                }
                date |= field == AnswerField::Date;
                // httparse admitted only token bytes in the name (what a
                // `HeaderName` holds:
                // `every_name_byte_httparse_admits_is_a_header_names`) and
                // only HTAB, SP, VCHAR and obs-text in the value.
                let at = name.as_ptr() as usize - base;
                // Where the value starts on a line written `name: value`.
                let value_at = at + name.len() + 2;
                let end = value_at + h.value.len() + 2;
                let as_written = h.value.as_ptr() as usize == base + value_at
                    && head[value_at - 1] == b' '
                    && head.get(end - 2..end) == Some(b"\r\n");
                if as_written && run.end == at {
                    run.end = end;
                    continue;
                }
                out.extend_from_slice(&head[run.clone()]);
                if as_written {
                    run = at..end;
                    continue;
                }
                run = 0..0;
                out.extend_from_slice(name);
                out.extend_from_slice(b": ");
                out.extend_from_slice(h.value);
                out.extend_from_slice(b"\r\n");
                continue;
            }
            AnswerField::Date | AnswerField::Other => {}
        }
        // A field not copied ends the run.
        if raw && !run.is_empty() {
            out.extend_from_slice(&head[run.clone()]);
        }
        run = 0..0;
    }
    out.extend_from_slice(&head[run]);
    f.lines = raw.then_some(OriginLines {
        lines: out,
        date,
        commands,
    });
    Ok(f)
}

/// An answer's head read both ways, for the tests and the fuzz target
/// `origin_answer`: the fields as lines (`read_fields`, `command` left
/// out; `None` where the map path is taken) and as the map path gives them
/// to the visitor (hop-by-hop fields stripped as the proxy strips them,
/// `Content-Length` removed: the writer states the body's). `None` for
/// bytes that are not a complete head httparse admits, or an answer the
/// node refuses.
#[doc(hidden)]
#[must_use]
pub fn fields_both_ways(
    head: &[u8],
    command: Option<&HeaderName>,
) -> Option<(Option<OriginLines>, HeaderMap)> {
    with_parsed(head, |parsed, len| {
        let fields = read_fields(parsed, head, Some(len), command).ok()?;
        let mut spans = Vec::new();
        field_spans(parsed, head.as_ptr() as usize, &mut spans).ok()?;
        let mut map = answer_map(&mut spans, &Bytes::copy_from_slice(head));
        crate::proxy::strip_hop_by_hop(&mut map);
        map.remove(header::CONTENT_LENGTH);
        Some((fields.lines, map))
    })
    .flatten()
}

/// Fields that never reach a visitor from an answer's lines: the hop's
/// and the framing's, listed here apart from the reader's own lists so the
/// check below does not share their mistakes.
const NEVER_PASSED: [&str; 10] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

/// Checks what [`fields_both_ways`] gave for `head` (the room's command
/// field `command`), for the unit tests and the fuzz target
/// `origin_answer`: the command's values kept aside are the map's; every
/// line ends in CR LF and reads `name: value`, a valid field, its name in
/// the origin's own spelling, neither a field of the hop or the framing
/// nor the command; and the lines carry under each name exactly the values
/// the map path does, in the same order; `date` says whether they hold one.
/// The first broken rule, named, where one is.
#[doc(hidden)]
pub fn check_lines_against_map(
    head: &[u8],
    command: Option<&HeaderName>,
    lines: &OriginLines,
    mut map: HeaderMap,
) -> Result<(), String> {
    let said: Vec<Vec<u8>> = command.map_or_else(Vec::new, |c| {
        map.get_all(c)
            .iter()
            .map(|v| v.as_bytes().to_vec())
            .collect()
    });
    if lines.commands != said {
        return Err(format!(
            "command values {:?}, the map's {said:?}",
            lines.commands
        ));
    }
    if let Some(c) = command {
        map.remove(c);
    }
    let mut from_lines = HeaderMap::new();
    for line in lines.lines.split_inclusive(|b| *b == b'\n') {
        let shown = String::from_utf8_lossy(line);
        let line = line
            .strip_suffix(b"\r\n")
            .ok_or_else(|| format!("{shown:?} does not end in CR LF"))?;
        let colon = line
            .iter()
            .position(|b| *b == b':')
            .ok_or_else(|| format!("{shown:?} has no colon"))?;
        if line.get(colon + 1) != Some(&b' ') {
            return Err(format!("{shown:?}: no single space after the colon"));
        }
        let name = HeaderName::from_bytes(&line[..colon])
            .map_err(|_| format!("{shown:?}: not a field name"))?;
        let value = HeaderValue::from_bytes(&line[colon + 2..])
            .map_err(|_| format!("{shown:?}: not a field value"))?;
        // After the line end before it (httparse admits a bare LF).
        let spelled = [&b"\n"[..], &line[..=colon]].concat();
        if !head.windows(spelled.len()).any(|w| w == spelled) {
            return Err(format!(
                "{shown:?}: the name is not spelled as the origin did"
            ));
        }
        if NEVER_PASSED.contains(&name.as_str()) || command == Some(&name) {
            return Err(format!("{shown:?} passed"));
        }
        from_lines.append(name, value);
    }
    if lines.date != from_lines.contains_key(header::DATE) {
        return Err(format!("date {} for lines {from_lines:?}", lines.date));
    }
    if from_lines.len() != map.len() {
        return Err(format!("lines {from_lines:?}, the map {map:?}"));
    }
    for name in map.keys() {
        if !from_lines.get_all(name).iter().eq(map.get_all(name).iter()) {
            return Err(format!("{name}: lines {from_lines:?}, the map {map:?}"));
        }
    }
    Ok(())
}

/// `f` over `head` read as `parse_head` reads an answer (its parser, its
/// slots) and the head's length; `None` where httparse does not admit
/// `head` as a complete answer head. For the checks beside the reader
/// (tests, `fields_both_ways`): `parse_head` itself tells a partial head
/// from a malformed one.
fn with_parsed<R>(
    head: &[u8],
    f: impl FnOnce(&httparse::Response<'_, '_>, usize) -> R,
) -> Option<R> {
    let mut slots = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut []);
    match answer_parser().parse_response_with_uninit_headers(&mut parsed, head, &mut slots) {
        Ok(httparse::Status::Complete(len)) => Some(f(&parsed, len)),
        _ => None,
    }
}

/// The names of `parsed`'s fields and where their values sit after `base`
/// (the address of the bytes it was read from), into `spans`: every field
/// but `Keep-Alive` and a `Connection` that names no other field (the
/// proxy strips the rest, `proxy::strip_hop_by_hop`).
fn field_spans(
    parsed: &httparse::Response<'_, '_>,
    base: usize,
    spans: &mut Vec<(HeaderName, usize, usize)>,
) -> Result<(), H1Error> {
    spans.clear();
    for h in parsed.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| H1Error::Invalid("bad header name"))?;
        match answer_field(h.name.as_bytes()) {
            AnswerField::KeepAlive => continue,
            AnswerField::Connection if !connection_says(h.value).names_fields => continue,
            _ => {}
        }
        let start = h.value.as_ptr() as usize - base;
        spans.push((name, start, start + h.value.len()));
    }
    Ok(())
}

/// The fields of `spans` as a `HeaderMap` of slices of `head`.
fn answer_map(spans: &mut Vec<(HeaderName, usize, usize)>, head: &Bytes) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(spans.len());
    for (name, start, end) in spans.drain(..) {
        // SAFETY: httparse admits in a value only HTAB, SP, VCHAR and
        // obs-text (`b'\t' | b' '..=0x7e | 0x80..=0xff`), exactly the
        // bytes a `HeaderValue` may hold (`b >= 32 && b != 127 || b ==
        // b'\t'`): checking them again cost ~3 instructions a byte
        // (issue 17). A debug build checks anyway (it panics).
        let value = unsafe { HeaderValue::from_maybe_shared_unchecked(head.slice(start..end)) };
        headers.append(name, value);
    }
    headers
}

/// `Content-Length`'s value: decimal digits only (no sign, no space inside).
fn parse_length(value: &[u8]) -> Option<u64> {
    let value = value.trim_ascii();
    if value.is_empty() || value.len() > 19 {
        return None;
    }
    value.iter().try_fold(0u64, |n, b| {
        b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0'))
    })
}

/// The last comma-separated token of a header value.
fn last_token(value: &[u8]) -> Option<&[u8]> {
    value
        .rsplit(|b| *b == b',')
        .map(<[u8]>::trim_ascii)
        .find(|t| !t.is_empty())
}

fn request_framing(method: &Method, headers: &HeaderMap, body: &Body) -> RequestFraming {
    if body.is_end_stream() {
        let declared = headers.contains_key(header::CONTENT_LENGTH);
        let expects_body =
            *method == Method::POST || *method == Method::PUT || *method == Method::PATCH;
        return RequestFraming::Empty(declared || expects_body);
    }
    match body.size_hint().exact() {
        Some(n) => RequestFraming::Length(n),
        None => RequestFraming::Chunked,
    }
}

/// The request line and headers, framed by `framing`.
fn encode_head(
    out: &mut Vec<u8>,
    method: &Method,
    target: &str,
    (headers, additions): (&HeaderMap, &Additions),
    host: &str,
    framing: RequestFraming,
) {
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    if !headers.contains_key(header::HOST) {
        out.extend_from_slice(b"host: ");
        out.extend_from_slice(host.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    encode_headers(out, headers, |name| {
        name != header::CONTENT_LENGTH
            && name != header::TRANSFER_ENCODING
            && !additions.replaces(name)
    });
    for a in additions.iter() {
        header_line(out, &a.name, &a.value);
    }
    match framing {
        RequestFraming::Empty(false) => {}
        RequestFraming::Empty(true) => out.extend_from_slice(b"content-length: 0\r\n"),
        RequestFraming::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        RequestFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
}

/// `name: value` lines for the headers `keep` accepts.
fn encode_headers(out: &mut Vec<u8>, headers: &HeaderMap, keep: impl Fn(&HeaderName) -> bool) {
    for (name, value) in headers {
        if keep(name) {
            header_line(out, name, value);
        }
    }
}

/// One `name: value` line.
fn header_line(out: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    out.extend_from_slice(name.as_str().as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// A chunk's size line.
fn write_hex_line(out: &mut Vec<u8>, n: usize) {
    use std::io::Write as _;
    // Writing to a `Vec` cannot fail.
    let _ = write!(out, "{n:x}\r\n");
}

/// Where a chunked body's reader is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Before a chunk-size line.
    Size,
    /// Inside a chunk: bytes left.
    Data(u64),
    /// After a chunk's data: its CRLF.
    DataEnd,
    /// After the last chunk: trailer fields, then the final CRLF.
    Trailers,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Length(u64),
    Chunked(Chunk),
    Close,
    Done,
}

/// An origin answer's body, read from the connection that carries it; the
/// end of the body hands the connection back to its pool when it may be
/// reused.
/// Dropped early (the visitor left), it drops (closes) the connection.
pub struct H1Body {
    state: State,
    conn: Option<H1Conn>,
    /// Read with the head: the first frame.
    ready: Option<Bytes>,
    reusable: bool,
    pool: Option<Arc<OriginPool>>,
}

impl std::fmt::Debug for H1Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H1Body")
            .field("state", &self.state)
            .field("reusable", &self.reusable)
            .finish_non_exhaustive()
    }
}

impl H1Body {
    fn new(mut conn: H1Conn, framing: Framing, reusable: bool) -> Self {
        let mut ready = None;
        let state = match framing {
            Framing::None => State::Done,
            Framing::Length(0) => State::Done,
            Framing::Length(n) if conn.buf.len() as u64 >= n => {
                // The whole body came with the head.
                ready = Some(conn.buf.split_to(n as usize).freeze());
                State::Done
            }
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::Chunked(Chunk::Size),
            Framing::Close => State::Close,
        };
        Self {
            state,
            conn: Some(conn),
            ready,
            reusable,
            pool: None,
        }
    }

    /// The pool the connection goes back to once the body is read (if the
    /// answer allows it); at once if it already is.
    pub fn return_to(&mut self, pool: &Arc<OriginPool>) {
        self.pool = Some(Arc::clone(pool));
        if self.state == State::Done {
            self.finish();
        }
    }

    /// The body has been read: the connection goes back if nothing else
    /// came on it.
    fn finish(&mut self) {
        if let Some(conn) = self.conn.take()
            && self.reusable
            && conn.buf.is_empty()
            && let Some(pool) = self.pool.take()
        {
            pool.check_in_h1(conn);
        }
    }

    fn fail(&mut self, err: H1Error) -> Poll<Option<Result<Frame<Bytes>, H1Error>>> {
        self.conn = None;
        self.state = State::Done;
        Poll::Ready(Some(Err(err)))
    }

    /// Reads more into the connection's buffer; `Ok(false)` at its end.
    fn poll_more(&mut self, cx: &mut Context<'_>) -> Poll<Result<bool, H1Error>> {
        let Some(conn) = self.conn.as_mut() else {
            return Poll::Ready(Ok(false));
        };
        Poll::Ready(
            ready!(conn.poll_fill(cx))
                .map(|n| n > 0)
                .map_err(H1Error::Io),
        )
    }

    fn poll_chunked(
        &mut self,
        cx: &mut Context<'_>,
        at: Chunk,
    ) -> Poll<Option<Result<Frame<Bytes>, H1Error>>> {
        let mut at = at;
        loop {
            let Some(conn) = self.conn.as_mut() else {
                return self.fail(H1Error::Incomplete);
            };
            let buf = &mut conn.buf;
            let step = match at {
                Chunk::Size => match buf.iter().position(|b| *b == b'\n') {
                    Some(end) => {
                        let line = buf.split_to(end + 1);
                        match parse_chunk_size(&line) {
                            Some(0) => Some(Chunk::Trailers),
                            Some(n) => Some(Chunk::Data(n)),
                            None => return self.fail(H1Error::Invalid("bad chunk size")),
                        }
                    }
                    None if buf.len() > MAX_CHUNK_LINE => {
                        return self.fail(H1Error::Invalid("chunk-size line too long"));
                    }
                    None => None,
                },
                Chunk::Data(left) if !buf.is_empty() => {
                    let take = left.min(buf.len() as u64);
                    let data = buf.split_to(take as usize).freeze();
                    let left = left - take;
                    self.state = State::Chunked(if left == 0 {
                        Chunk::DataEnd
                    } else {
                        Chunk::Data(left)
                    });
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Chunk::Data(_) => None,
                Chunk::DataEnd if buf.len() >= 2 => {
                    if &buf[..2] != b"\r\n" {
                        return self.fail(H1Error::Invalid("chunk data not ended by CRLF"));
                    }
                    let _ = buf.split_to(2);
                    Some(Chunk::Size)
                }
                Chunk::DataEnd => None,
                Chunk::Trailers => {
                    if buf.starts_with(b"\r\n") {
                        let _ = buf.split_to(2);
                        self.state = State::Done;
                        self.finish();
                        return Poll::Ready(None);
                    }
                    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
                    match httparse::parse_headers(buf, &mut slots) {
                        Ok(httparse::Status::Complete((len, fields))) => {
                            let mut trailers = HeaderMap::with_capacity(fields.len());
                            for f in fields {
                                if let (Ok(name), Ok(value)) = (
                                    HeaderName::from_bytes(f.name.as_bytes()),
                                    HeaderValue::from_bytes(f.value),
                                ) {
                                    trailers.append(name, value);
                                }
                            }
                            let _ = buf.split_to(len);
                            self.state = State::Done;
                            self.finish();
                            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                        }
                        Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD => None,
                        _ => return self.fail(H1Error::Invalid("bad trailer fields")),
                    }
                }
            };
            match step {
                Some(next) => {
                    at = next;
                    self.state = State::Chunked(at);
                }
                None => match ready!(self.poll_more(cx)) {
                    Ok(true) => {}
                    Ok(false) => return self.fail(H1Error::Incomplete),
                    Err(err) => return self.fail(err),
                },
            }
        }
    }
}

/// A chunk-size line's size (hex digits, then optional extensions).
fn parse_chunk_size(line: &[u8]) -> Option<u64> {
    let line = line.strip_suffix(b"\n")?;
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 15 {
        return None;
    }
    let rest = line[digits..].trim_ascii_start();
    if !(rest.is_empty() || rest.starts_with(b";")) {
        return None;
    }
    line[..digits].iter().try_fold(0u64, |n, b| {
        let d = (*b as char).to_digit(16)?;
        Some(n << 4 | u64::from(d))
    })
}

impl HttpBody for H1Body {
    type Data = Bytes;
    type Error = H1Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, H1Error>>> {
        let this = &mut *self;
        if let Some(data) = this.ready.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        loop {
            match this.state {
                State::Done => {
                    this.finish();
                    return Poll::Ready(None);
                }
                State::Chunked(at) => return this.poll_chunked(cx, at),
                State::Length(left) => {
                    let Some(conn) = this.conn.as_mut() else {
                        return this.fail(H1Error::Incomplete);
                    };
                    if conn.buf.is_empty() {
                        match ready!(this.poll_more(cx)) {
                            Ok(true) => continue,
                            Ok(false) => return this.fail(H1Error::Incomplete),
                            Err(err) => return this.fail(err),
                        }
                    }
                    let take = left.min(conn.buf.len() as u64);
                    let data = conn.buf.split_to(take as usize).freeze();
                    if take == left {
                        this.state = State::Done;
                        this.finish();
                    } else {
                        this.state = State::Length(left - take);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                State::Close => {
                    let Some(conn) = this.conn.as_mut() else {
                        this.state = State::Done;
                        continue;
                    };
                    if !conn.buf.is_empty() {
                        let data = conn.buf.split().freeze();
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    match ready!(this.poll_more(cx)) {
                        Ok(true) => {}
                        Ok(false) => {
                            this.conn = None;
                            this.state = State::Done;
                        }
                        Err(err) => return this.fail(err),
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.state == State::Done && self.ready.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let ready = self.ready.as_ref().map_or(0, |b| b.len() as u64);
        match self.state {
            State::Done => SizeHint::with_exact(ready),
            State::Length(left) => SizeHint::with_exact(ready + left),
            State::Chunked(_) | State::Close => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kept-alive connection and the origin's end of it.
    async fn idle_pair() -> (H1Conn, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let io = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (origin, _) = listener.accept().unwrap();
        (H1Conn::new(io, Authority::from_static("origin")), origin)
    }

    /// Until the reactor has run, its readiness cannot tell a close or
    /// unasked bytes (a request that may be sent again risks that); the
    /// sure check reads the socket and sees both. After the reactor has
    /// run, both checks see them. One thread: nothing runs the reactor
    /// between two lines without an await.
    #[tokio::test(flavor = "current_thread")]
    async fn a_close_the_reactor_has_not_seen_is_found_by_the_sure_check() {
        for unasked in [false, true] {
            let (mut conn, mut origin) = idle_pair().await;
            assert!(conn.is_idle_and_open(true), "open and quiet");
            assert!(conn.is_idle_and_open(false), "open and quiet");
            if unasked {
                std::io::Write::write_all(&mut origin, b"HTTP/1.1 200 OK\r\n").unwrap();
            } else {
                drop(origin);
            }
            assert!(
                conn.is_idle_and_open(false),
                "unasked {unasked}: not seen yet"
            );
            assert!(
                !conn.is_idle_and_open(true),
                "unasked {unasked}: the socket says"
            );
            let seen = async {
                while conn.is_idle_and_open(false) {
                    tokio::task::yield_now().await;
                }
            };
            tokio::time::timeout(std::time::Duration::from_secs(5), seen)
                .await
                .expect("the reactor sees it");
        }
    }

    #[test]
    fn lengths_are_plain_decimal() {
        assert_eq!(parse_length(b"0"), Some(0));
        assert_eq!(parse_length(b" 42 "), Some(42));
        assert_eq!(
            parse_length(b"9999999999999999999"),
            Some(9_999_999_999_999_999_999)
        );
        for bad in [
            &b""[..],
            b"+1",
            b"-1",
            b"1 2",
            b"0x10",
            b"1,1",
            b"99999999999999999999",
        ] {
            assert_eq!(
                parse_length(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn chunk_sizes_are_hex_with_optional_extensions() {
        assert_eq!(parse_chunk_size(b"1a\r\n"), Some(26));
        assert_eq!(parse_chunk_size(b"FF;name=value\r\n"), Some(255));
        assert_eq!(parse_chunk_size(b"0\r\n"), Some(0));
        assert_eq!(parse_chunk_size(b"10 ; ext\r\n"), Some(16));
        assert_eq!(parse_chunk_size(b"10\n"), Some(16));
        for bad in [
            &b"\r\n"[..],
            b"zz\r\n",
            b"-1\r\n",
            b"0x10\r\n",
            b"1 2\r\n",
            b"1000000000000000\r\n",
            b"10",
        ] {
            assert_eq!(
                parse_chunk_size(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// The first field of an answer head as `parse_head` reads heads (name,
    /// value); `None` when httparse does not admit it whole.
    fn first_field(head: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
        with_parsed(head, |parsed, _| {
            let h = parsed.headers.first()?;
            Some((h.name.as_bytes().to_vec(), h.value.to_vec()))
        })
        .flatten()
    }

    /// `parse_head` makes each value a `HeaderValue` unchecked: whatever
    /// byte httparse lets through in an answer's field value (read with
    /// `parse_head`'s own `answer_parser`) is one a `HeaderValue` holds.
    #[test]
    fn every_value_byte_httparse_admits_is_a_header_values() {
        let mut admitted = 0;
        for b in 0..=255u8 {
            let head = [
                &b"HTTP/1.1 200 OK\r\nx: a"[..],
                &[b],
                b"b\r\ncontent-length: 0\r\n\r\n",
            ]
            .concat();
            let Some((_, value)) = first_field(&head) else {
                continue;
            };
            assert!(HeaderValue::from_bytes(&value).is_ok(), "byte {b:#04x}");
            admitted += 1;
        }
        // HTAB, SP..=0x7e and obs-text; not CR, LF, NUL, DEL or other controls.
        assert_eq!(admitted, 1 + 95 + 128);
        // Nor a folded line, whose value would carry CR LF.
        let folded = b"HTTP/1.1 200 OK\r\nx: a\r\n b\r\ncontent-length: 0\r\n\r\n";
        assert!(with_parsed(folded, |_, _| ()).is_none());
    }

    /// Every name httparse admits in an answer is a `HeaderName`'s (which
    /// holds it in lower case): what lets `read_fields` copy names without
    /// making `HeaderName`s, and hyper's path put every line in a map. An
    /// httparse that loosened its rule fails this.
    #[test]
    fn every_name_byte_httparse_admits_is_a_header_names() {
        let mut admitted = 0;
        for b in 0..=255u8 {
            let head = [&b"HTTP/1.1 200 OK\r\nx"[..], &[b], b"y: 1\r\n\r\n"].concat();
            let Some((name, _)) = first_field(&head) else {
                continue;
            };
            let name = name.as_slice();
            if name == b"x" {
                // `x:y: 1`: the colon ends the name.
                assert_eq!(b, b':');
                continue;
            }
            let header = HeaderName::from_bytes(name);
            assert!(header.is_ok(), "byte {b:#04x}");
            assert_eq!(
                header.unwrap().as_str().as_bytes(),
                name.to_ascii_lowercase(),
                "byte {b:#04x}"
            );
            admitted += 1;
        }
        // RFC 9110's tchar: letters, digits and !#$%&'*+-.^_`|~.
        assert_eq!(admitted, 52 + 10 + 15);
    }

    /// The fields written as lines are what the visitor got from the map:
    /// the map path's fields, hop-by-hop ones stripped as the proxy strips
    /// them, less `Content-Length` (the writer states the body's length).
    /// Over every sequence of three fields from a hostile set (every
    /// hop-by-hop name in odd spellings, near-miss names, repeated fields,
    /// obs-text, a `Connection` naming a field). Classifying a hop-by-hop
    /// name as another field, or a near miss as hop-by-hop, fails it.
    #[test]
    fn lines_carry_what_the_map_carries_less_the_framing() {
        const FIELDS: [&[u8]; 27] = [
            b"Server: nginx",
            b"X-Tight:tight",
            b"X-Tab:\tv",
            b"X-Wide: \t wide \t",
            b"Date: Sun, 29 Nov 2026 12:00:00 GMT",
            b"Content-Length: 2",
            b"Transfer-Encoding: gzip, chunked",
            b"Connection: keep-alive",
            b"connection: close, X-A",
            b"Keep-Alive: timeout=5",
            b"TE: trailers",
            b"Trailer: X-T",
            b"UPGRADE: h2c",
            b"Proxy-Connection: keep-alive",
            b"Proxy-Authenticate: Basic",
            b"proxy-authorization: x",
            b"Set-Cookie: a=1",
            b"SET-COOKIE: b=2",
            b"X-A: secret",
            b"X-Obs: caf\xe9 \t!",
            b"Via: 1.1 origin",
            b"teapot: 1",
            b"Dates: x",
            b"upgrades: y",
            b"te-x: z",
            b"Connectionx: w",
            b"Content-Lengths: 3",
        ];
        let mut compared = 0;
        let mut as_map = 0;
        for a in FIELDS {
            for b in FIELDS {
                for c in FIELDS {
                    let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
                    for f in [a, b, c] {
                        head.extend_from_slice(f);
                        head.extend_from_slice(b"\r\n");
                    }
                    head.extend_from_slice(b"\r\n");
                    let what = String::from_utf8_lossy(&head).into_owned();
                    // The room's command field is `X-A` every other time.
                    let command = (compared % 2 == 1).then(|| HeaderName::from_static("x-a"));
                    let (lines, map) = fields_both_ways(&head, command.as_ref()).expect(&what);
                    let names_a_field = [a, b, c].contains(&FIELDS[8]);
                    let Some(lines) = lines else {
                        assert!(names_a_field, "{what}");
                        as_map += 1;
                        continue;
                    };
                    assert!(!names_a_field, "{what}");
                    if let Err(broken) =
                        check_lines_against_map(&head, command.as_ref(), &lines, map)
                    {
                        panic!("{what}: {broken}");
                    }
                    compared += 1;
                }
            }
        }
        assert_eq!(compared + as_map, 27 * 27 * 27);
        assert!(as_map > 0 && compared > 10_000);
    }

    /// The checker the test above and the fuzz target lean on refuses each
    /// kind of wrong lines (else both would pass whatever the reader did).
    #[test]
    fn the_lines_checker_refuses_wrong_lines() {
        let head = b"HTTP/1.1 200 OK\r\nX-One: 1\r\nDate: d\r\nX-Cmd: c\r\nTE: x\r\n\r\n";
        let command = HeaderName::from_static("x-cmd");
        let (Some(good), map) = fields_both_ways(head, Some(&command)).unwrap() else {
            panic!("read as lines");
        };
        assert_eq!(
            check_lines_against_map(head, Some(&command), &good, map.clone()),
            Ok(())
        );
        let wrong = |lines: &[u8], date: bool, commands: &[&[u8]]| OriginLines {
            lines: lines.to_vec(),
            date,
            commands: commands.iter().map(|c| c.to_vec()).collect(),
        };
        for (bad, why) in [
            (wrong(b"X-One: 1\r\n", true, &[b"c"]), "a field lost"),
            (
                wrong(b"X-One: 1\r\nDate: d\r\nX-One: 1\r\n", true, &[b"c"]),
                "one twice",
            ),
            (
                wrong(b"X-One: 2\r\nDate: d\r\n", true, &[b"c"]),
                "a value changed",
            ),
            (
                wrong(b"x-one: 1\r\nDate: d\r\n", true, &[b"c"]),
                "respelled",
            ),
            (
                wrong(b"X-One: 1\r\nDate: d\r\n", false, &[b"c"]),
                "date unsaid",
            ),
            (wrong(b"X-One: 1\r\nDate: d\r\n", true, &[]), "command lost"),
            (
                wrong(b"X-One: 1\r\nDate: d\r\nTE: x\r\n", true, &[b"c"]),
                "a hop field",
            ),
            (
                wrong(b"X-One: 1\r\nDate: d\r\nX-Cmd: c\r\n", true, &[b"c"]),
                "the command",
            ),
            (wrong(b"X-One: 1\r\nDate: d\n", true, &[b"c"]), "LF alone"),
            (wrong(b"X-One:1\r\nDate: d\r\n", true, &[b"c"]), "no space"),
        ] {
            assert!(
                check_lines_against_map(head, Some(&command), &bad, map.clone()).is_err(),
                "{why}"
            );
        }
    }

    /// Lines are made only when asked for, and framing is read either way.
    #[test]
    fn fields_read_without_lines_say_the_same_framing() {
        let head = b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nTransfer-Encoding: x, CHUNKED\r\nContent-Length: 7\r\nContent-Length: 7\r\n\r\n";
        let (with, without) = with_parsed(head, |parsed, _| {
            (
                read_fields(parsed, head, Some(64), None).unwrap(),
                read_fields(parsed, head, None, None).unwrap(),
            )
        })
        .unwrap();
        for f in [&with, &without] {
            assert_eq!(f.length, Some(7));
            assert!(f.transfer_encoding && f.chunked && f.keep_alive && !f.close);
        }
        assert_eq!(with.lines, Some(OriginLines::default()));
        assert_eq!(without.lines, None);
        let two = b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nContent-Length: 8\r\n\r\n";
        assert!(
            with_parsed(two, |parsed, _| read_fields(parsed, two, Some(64), None)
                .is_err())
            .unwrap()
        );
    }

    #[test]
    fn hex_lines_round_trip() {
        for n in [0usize, 1, 15, 16, 255, 4096, 65_535, 1 << 40] {
            let mut out = Vec::new();
            write_hex_line(&mut out, n);
            assert_eq!(parse_chunk_size(&out), Some(n as u64), "{n}");
            assert_eq!(out, format!("{n:x}\r\n").into_bytes());
        }
    }

    /// The head's header lines, name (lower case) by name, each name's
    /// values in the order written.
    fn fields_of(head: &[u8]) -> std::collections::BTreeMap<String, Vec<Vec<u8>>> {
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut request = httparse::Request::new(&mut slots);
        assert!(request.parse(head).unwrap().is_complete());
        let mut fields = std::collections::BTreeMap::<String, Vec<Vec<u8>>>::new();
        for h in request.headers.iter() {
            fields
                .entry(h.name.to_ascii_lowercase())
                .or_default()
                .push(h.value.to_vec());
        }
        fields
    }

    /// The node's headers written after the visitor's say to the origin what
    /// the same headers put in the map say: for every mix of forwarding
    /// claims, trusted and untrusted hops, HTTP/1.1 and HTTP/2 visitors.
    #[test]
    fn additions_written_by_hand_equal_the_rewritten_map() {
        use crate::forwarded::{Forwarding, Via};
        use crate::proxy::{prepare_for_origin, prepare_request_headers};
        let claims: [(&str, &str); 7] = [
            ("x-forwarded-for", "203.0.113.9"),
            ("x-forwarded-for", "10.0.0.1, 10.0.0.2"),
            ("x-real-ip", "203.0.113.10"),
            ("x-forwarded-proto", "https"),
            ("forwarded", "for=203.0.113.11;proto=https"),
            ("x-forwarded-host", "elsewhere.example"),
            ("via", "1.1 upstream-proxy"),
        ];
        let via = Via::new("n1");
        let mut cases = 0;
        for mask in 0u32..(1 << claims.len()) {
            for trusted in [false, true] {
                for version in [Version::HTTP_11, Version::HTTP_2] {
                    let mut visitor = HeaderMap::new();
                    visitor.insert(header::HOST, HeaderValue::from_static("shop.example"));
                    visitor.insert(header::COOKIE, HeaderValue::from_static("a=b"));
                    for (i, (name, value)) in claims.iter().enumerate() {
                        if mask & (1 << i) != 0 {
                            visitor.append(
                                HeaderName::from_static(name),
                                HeaderValue::from_static(value),
                            );
                        }
                    }
                    visitor.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
                    let forwarding = Forwarding {
                        client: "198.51.100.7".parse().unwrap(),
                        hop: "192.0.2.1".parse().unwrap(),
                        trusted,
                        scheme: "https",
                    };
                    let mut in_map = visitor.clone();
                    let caught_a =
                        prepare_request_headers(&mut in_map, version, None, &forwarding, &via);
                    let mut a = Vec::new();
                    let none = Additions::default();
                    let framing = RequestFraming::Empty(false);
                    encode_head(
                        &mut a,
                        &Method::GET,
                        "/p",
                        (&in_map, &none),
                        "o:80",
                        framing,
                    );
                    let mut by_hand = visitor.clone();
                    let (caught_b, additions) =
                        prepare_for_origin(&mut by_hand, version, None, &forwarding, &via);
                    let mut b = Vec::new();
                    encode_head(
                        &mut b,
                        &Method::GET,
                        "/p",
                        (&by_hand, &additions),
                        "o:80",
                        framing,
                    );
                    let what = format!("claims {mask:07b}, trusted {trusted}, {version:?}");
                    assert_eq!(caught_a, caught_b, "{what}");
                    assert_eq!(fields_of(&a), fields_of(&b), "{what}");
                    cases += 1;
                }
            }
        }
        assert_eq!(cases, 512);
    }

    #[test]
    fn the_last_coding_decides_chunked() {
        assert_eq!(last_token(b"gzip, chunked"), Some(&b"chunked"[..]));
        assert_eq!(last_token(b"chunked, gzip"), Some(&b"gzip"[..]));
        assert_eq!(last_token(b"chunked ,"), Some(&b"chunked"[..]));
        assert_eq!(last_token(b""), None);
    }
}
