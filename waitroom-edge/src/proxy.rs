//! The admitted path: a reverse proxy to an origin of the room's pools.
//!
//! One origin connection pool per worker ([`crate::origin_pool`]: connections
//! are reused, never shared across cores, and driven in the request's own
//! task); plain-HTTP origins are spoken to by [`crate::origin_h1`], TLS
//! origins by hyper's client. Bodies stream both ways; hop-by-hop headers are removed (but
//! never, on a client's `Connection` nomination, a header the node sets or
//! routes by), the forwarding headers say what the node knows of the client
//! (see [`crate::forwarded`]) and the node's `Via` is added. The origin comes
//! from the room's [`Upstream`]; one that cannot be reached is retried once
//! elsewhere for idempotent requests, else answers a clear 502 page within the
//! timeout; with every pool down the answer is a clear 503 page, never a hang.
use std::{
    pin::Pin,
    sync::{Arc, atomic::Ordering::Relaxed},
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{
    HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri, Version,
    header,
    uri::{Authority, PathAndQuery, Scheme},
};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::{Body as HttpBody, Frame, SizeHint};

use crate::http::h1::{Answer, HeadLines, ReqBody};

use waitroom_runtime::{
    admin::text,
    body::{Body, BoxError, full},
};

use crate::upstream::{OriginChoice, Upstream, tls::OriginTls};
use crate::{
    forwarded::{Additions, Forwarding, PROTECTED_FROM_NOMINATION, Via, forwarding_for_origin},
    metrics::{Defence, Defences},
    origin_h1::{H1Body, H1Error},
    origin_pool::{OriginError, OriginPool, PooledBody},
};

/// The connections a worker uses to reach origins (HTTP, or TLS for
/// `tls = true` pools).
pub type OriginClient = Arc<OriginPool>;

/// Builds a worker's origin connection pool.
pub fn client(connect_timeout: Duration, tls: &OriginTls) -> OriginClient {
    Arc::new(OriginPool::new(connect_timeout, tls))
}

/// Headers that describe one hop and must not be forwarded (RFC 9110 §7.6.1).
/// A `const`, unlike `forwarded::CLIENT_CLAIMS`: its names are compared
/// with every field of every request, and as a `const` the compiler folds
/// those comparisons (59 instructions a request against 292 as a `static`).
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers, including any named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    strip_hop_by_hop_except(headers, &[]);
}

/// `Proxy-Connection`: not standard, sent by old clients; hop-by-hop too.
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Removes hop-by-hop headers, including any named in `Connection` but
/// those in `protected`; returns whether `Connection` named one of those.
///
/// One pass over the names finds which hop-by-hop headers are there (most
/// requests carry none, most responses only `Connection`): a hashed lookup
/// for each of the nine names cost more than the rest of the function
/// (docs/BENCHMARKS.md, issue 17). What is removed is unchanged.
fn strip_hop_by_hop_except(headers: &mut HeaderMap, protected: &[HeaderName]) -> bool {
    // Bit i: `HOP_BY_HOP[i]` is present; the bit after them: `Proxy-Connection`.
    let mut present = 0u16;
    for name in headers.keys() {
        if let Some(i) = HOP_BY_HOP.iter().position(|h| h == name) {
            present |= 1 << i;
        } else if *name == PROXY_CONNECTION {
            present |= 1 << HOP_BY_HOP.len();
        }
    }
    if present == 0 {
        return false;
    }
    let mut ignored = false;
    // `HOP_BY_HOP[0]` is `Connection`.
    if present & 1 != 0 {
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            // `keep-alive` is removed below anyway (and is neither protected
            // nor worth an allocated name).
            .filter(|name| !name.trim().eq_ignore_ascii_case("keep-alive"))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            .collect();
        for name in &named {
            if protected.contains(name) {
                ignored = true;
            } else {
                headers.remove(name);
            }
        }
    }
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    if present & (1 << HOP_BY_HOP.len()) != 0 {
        headers.remove(PROXY_CONNECTION);
    }
    ignored
}

/// What the node tells the origin about a request, and where it counts what
/// it caught on the way.
#[derive(Debug, Clone, Copy)]
pub struct OriginRequest<'a> {
    pub forwarding: Forwarding,
    /// The node's own `Via` entry.
    pub via: &'a Via,
    pub defences: &'a Defences,
    pub now_secs: u64,
    /// The room's origin-command field, left out of a plain-HTTP origin's
    /// answer as its fields are copied (`origin_h1::OriginLines`).
    pub command: Option<&'a HeaderName>,
}

/// What [`prepare_request_headers`] caught.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caught {
    /// `Connection` nominated a header the node sets or routes by.
    pub nomination_ignored: bool,
    /// An untrusted client's forwarding headers were removed.
    pub untrusted_removed: bool,
}

/// The origin's request headers from the client's: hop-by-hop headers
/// removed (a nomination of a [`PROTECTED_FROM_NOMINATION`] header ignored),
/// `Host` from `:authority` for HTTP/2, the forwarding headers rewritten
/// ([`crate::forwarded::rewrite_for_origin`]) and the node's `Via` appended.
pub fn prepare_request_headers(
    headers: &mut HeaderMap,
    version: Version,
    authority: Option<&Authority>,
    forwarding: &Forwarding,
    via: &Via,
) -> Caught {
    let (caught, additions) = prepare_for_origin(headers, version, authority, forwarding, via);
    additions.apply(headers);
    caught
}

/// [`prepare_request_headers`] with the node's own headers (forwarding,
/// `Via`) returned rather than put in `headers`
/// ([`crate::forwarded::forwarding_for_origin`]).
pub fn prepare_for_origin(
    headers: &mut HeaderMap,
    version: Version,
    authority: Option<&Authority>,
    forwarding: &Forwarding,
    via: &Via,
) -> (Caught, Additions) {
    let nomination_ignored = strip_hop_by_hop_except(headers, &PROTECTED_FROM_NOMINATION);
    // HTTP/2 visitors carry the host in :authority; the origin speaks HTTP/1.1.
    if !headers.contains_key(header::HOST)
        && let Some(a) = authority
        && let Ok(v) = HeaderValue::from_str(a.as_str())
    {
        headers.insert(header::HOST, v);
    }
    let (untrusted_removed, mut additions) = forwarding_for_origin(headers, forwarding);
    additions.push(header::VIA, via.value(version), false);
    (
        Caught {
            nomination_ignored,
            untrusted_removed,
        },
        additions,
    )
}

/// Why forwarding failed; each becomes a 502 page, but `NoHealthyOrigin` a 503.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("room {room}: every origin pool is down")]
    NoHealthyOrigin { room: String },
    #[error("origin {origin} did not answer within {timeout:?}")]
    Timeout {
        origin: Authority,
        timeout: Duration,
    },
    #[error("origin {origin} unreachable: {source}")]
    Unreachable {
        origin: Authority,
        source: OriginError,
        /// On a connection kept alive from an earlier request.
        reused: bool,
    },
    #[error("origin {origin} answered badly: {source}")]
    Invalid {
        origin: Authority,
        source: OriginError,
    },
    /// The visitor's request body ended early or was malformed: the
    /// visitor's fault, a 400, and no mark against the origin.
    #[error("the client's request body failed: {source}")]
    ClientBody { source: OriginError },
}

/// Forwards `req` to an origin of `upstream` and streams the answer back.
///
/// The origin comes from [`Upstream::select`]. A request that cannot reach it
/// (refused, reset, closed before an answer or in the middle of it: not an
/// HTTP error status) counts against that origin's health and, when its
/// method is idempotent and it has no body to lose, goes once more to another
/// healthy origin. A request whose body the *visitor* cuts short or garbles
/// is [`ProxyError::ClientBody`] and counts against nobody.
#[inline(always)]
pub fn forward(
    client: &OriginClient,
    upstream: &Arc<Upstream>,
    response_timeout: Duration,
    req: Request<ReqBody>,
    to_origin: &OriginRequest<'_>,
) -> impl Future<Output = Result<Answer<Body>, ProxyError>> {
    let (mut parts, body) = req.into_parts();
    let path_and_query = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    let (caught, additions) = prepare_for_origin(
        &mut parts.headers,
        parts.version,
        parts.uri.authority(),
        &to_origin.forwarding,
        to_origin.via,
    );
    let visitor = Some(to_origin.forwarding.client);
    if caught.nomination_ignored {
        to_origin.defences.record(
            Defence::HopByHopNomination,
            to_origin.now_secs,
            visitor,
            "Connection named a header the node sets or routes by: the nomination was ignored",
        );
    }
    if caught.untrusted_removed {
        to_origin.defences.record(
            Defence::ForwardedUntrusted,
            to_origin.now_secs,
            visitor,
            "forwarding headers from a client outside trusted_proxies were removed",
        );
    }

    // The request taken apart and its forwarding fields prepared before
    // the future is made, which holds only the parts: an `async fn` would
    // keep the request's 264 bytes beside them to the end (and every
    // argument twice, rust-lang/rust#62958), moved with it per request.
    async move {
        let replayable = is_idempotent(&parts.method) && body.is_end_stream();
        let mut body = Some(body);
        let mut failed: Option<(OriginChoice, ProxyError)> = None;
        // Set when a kept-alive connection failed: the same origin once more, on
        // a new connection.
        let mut again: Option<OriginChoice> = None;
        let mut fresh = false;
        loop {
            let except = failed.as_ref().map(|(choice, _)| *choice);
            let Some(choice) = again
                .take()
                .or_else(|| upstream.select(rand::random(), except))
            else {
                return Err(match failed {
                    // Nowhere left to retry: the first failure is the answer.
                    Some((_, err)) => err,
                    None => ProxyError::NoHealthyOrigin {
                        room: upstream.room.clone(),
                    },
                });
            };
            let origin = upstream.origin(choice);
            let body = match body.take() {
                Some(b) => ClientBody(b).boxed_unsync(),
                None => Empty::new().map_err(|never| match never {}).boxed_unsync(),
            };
            let result = if upstream.pool(choice).scheme == Scheme::HTTP {
                // The head is encoded from the visitor's headers as they are:
                // nothing to copy for a retry.
                let request = OutgoingH1 {
                    method: &parts.method,
                    target: &path_and_query,
                    headers: &parts.headers,
                    additions: &additions,
                    body,
                    command: to_origin.command,
                    replayable,
                };
                send_h1(
                    client,
                    upstream,
                    choice,
                    response_timeout,
                    request,
                    to_origin.via,
                    fresh,
                )
                .await
            } else {
                // Origin-form: the connection already says which origin.
                let uri = Uri::from(path_and_query.clone());
                let mut req = Request::new(body);
                *req.method_mut() = parts.method.clone();
                *req.uri_mut() = uri;
                *req.version_mut() = Version::HTTP_11;
                *req.headers_mut() = if replayable && failed.is_none() {
                    parts.headers.clone()
                } else {
                    std::mem::take(&mut parts.headers)
                };
                additions.clone().apply(req.headers_mut());
                // A visitor without `Host` (HTTP/1.0): the origin's own name.
                if !req.headers().contains_key(header::HOST)
                    && let Ok(host) = HeaderValue::from_str(origin.authority.as_str())
                {
                    req.headers_mut().insert(header::HOST, host);
                }
                // Boxed: hyper's exchange is the larger future (1.9 KB against
                // the plain one's 1.3 KB), and inline it sized every proxied
                // request's future, which is moved into its box whole.
                Box::pin(send(
                    client,
                    upstream,
                    choice,
                    response_timeout,
                    req,
                    to_origin.via,
                    fresh,
                ))
                .await
                .map(|resp| (resp, None))
            };
            match result {
                Ok(resp) => {
                    origin.requests.fetch_add(1, Relaxed);
                    return Ok(resp);
                }
                // The origin closed a kept-alive connection as the request went
                // out (its idle timeout racing ours): not the origin failing.
                Err(err @ ProxyError::Unreachable { reused: true, .. }) if replayable && !fresh => {
                    tracing::debug!(%err, "kept-alive origin connection failed; once more on a new one");
                    again = Some(choice);
                    fresh = true;
                    continue;
                }
                Err(err @ ProxyError::Unreachable { .. }) => {
                    upstream.connection_failed(choice);
                    if replayable && failed.is_none() {
                        tracing::debug!(%err, "retrying on another origin");
                        failed = Some((choice, err));
                        continue;
                    }
                    return Err(err);
                }
                Err(err) => return Err(err),
            }
        }
    }
}

/// Methods whose request may be sent twice (RFC 9110 §9.2.2).
fn is_idempotent(method: &Method) -> bool {
    [
        Method::GET,
        Method::HEAD,
        Method::OPTIONS,
        Method::PUT,
        Method::DELETE,
    ]
    .contains(method)
}

/// One attempt: `ClientBody` when the visitor's body failed, `Unreachable`
/// only when the origin's connection failed, any other failure of the origin
/// (a malformed answer) is `Invalid`.
async fn send(
    client: &OriginClient,
    upstream: &Arc<Upstream>,
    choice: OriginChoice,
    response_timeout: Duration,
    req: Request<Body>,
    via: &Via,
    fresh: bool,
) -> Result<Response<Body>, ProxyError> {
    let origin = &upstream.origin(choice).authority;
    let scheme = &upstream.pool(choice).scheme;
    let mut reused = false;
    let exchange = async {
        let mut conn = if fresh {
            client.connect(scheme, origin).await?
        } else {
            client.checkout(scheme, origin).await?
        };
        reused = conn.reused;
        let response = match conn.send(req).await {
            Ok(r) => r,
            // An idle connection the origin closed before hyper wrote a byte
            // of the request: the request goes on a new connection.
            Err(mut err) if conn.reused && err.message().is_some() => {
                let req = err.take_message().expect("checked just above");
                tracing::debug!(%origin, err = %err.error(), "idle origin connection closed; reconnecting");
                conn = client.connect(scheme, origin).await?;
                reused = false;
                conn.send(req).await.map_err(|e| e.into_error())?
            }
            Err(err) => return Err(OriginError::Exchange(err.into_error())),
        };
        let (parts, body) = response.into_parts();
        let mut body = conn.into_body(client, parts.status, body);
        body.finish_if_empty().await;
        Ok::<_, OriginError>((parts, body))
    };
    let outcome = tokio::time::timeout(response_timeout, exchange).await;
    let (mut parts, body) = settle(outcome, origin, response_timeout, reused)?;
    answer_headers_for_visitor(&mut parts.headers, via);
    Ok(Response::from_parts(
        parts,
        OriginBody {
            inner: OriginStream::Hyper(body),
            upstream: Arc::clone(upstream),
            choice,
        }
        .boxed_unsync(),
    ))
}

/// A request for a plain-HTTP origin, borrowed from the visitor's.
struct OutgoingH1<'a> {
    method: &'a Method,
    target: &'a PathAndQuery,
    headers: &'a HeaderMap,
    /// The node's headers, written after the visitor's.
    additions: &'a Additions,
    body: Body,
    /// The room's origin-command field, read out of the answer's lines.
    command: Option<&'a HeaderName>,
    /// The request can be sent again after a kept-alive connection failed
    /// it; else a kept-alive connection is asked whether it is still open
    /// before it is used (`H1Conn::is_idle_and_open`).
    replayable: bool,
}

/// One attempt on a plain-HTTP origin ([`crate::origin_h1`]); its failures
/// are told apart as in [`send`].
async fn send_h1(
    client: &OriginClient,
    upstream: &Arc<Upstream>,
    choice: OriginChoice,
    response_timeout: Duration,
    request: OutgoingH1<'_>,
    via: &Via,
    fresh: bool,
) -> Result<Answer<Body>, ProxyError> {
    let origin = &upstream.origin(choice).authority;
    let mut reused = false;
    let exchange = async {
        let conn = if fresh {
            client.connect_h1(origin).await?
        } else {
            client.checkout_h1(origin, !request.replayable).await?
        };
        reused = conn.reused;
        let (head, mut body) = conn
            .send(
                request.method,
                request.target.as_str(),
                request.headers,
                request.additions,
                origin.as_str(),
                request.body,
                request.command,
            )
            .await?;
        body.return_to(client);
        Ok::<_, OriginError>((head, body))
    };
    let outcome = tokio::time::timeout(response_timeout, exchange).await;
    let (mut head, body) = settle(outcome, origin, response_timeout, reused)?;
    let lines = match head.lines.take() {
        // Copied without the hop-by-hop fields already (`origin_h1::Head`).
        Some(mut lines) => {
            let via = via.value(Version::HTTP_11);
            HeadLines::push(&mut lines.lines, &header::VIA, via.as_bytes());
            Some(HeadLines::from_origin(lines))
        }
        None => {
            answer_headers_for_visitor(&mut head.headers, via);
            None
        }
    };
    let mut response = Response::new(
        OriginBody {
            inner: OriginStream::H1(body),
            upstream: Arc::clone(upstream),
            choice,
        }
        .boxed_unsync(),
    );
    *response.status_mut() = head.status;
    *response.version_mut() = head.version;
    *response.headers_mut() = head.headers;
    Ok((response, lines))
}

/// An attempt's outcome within `response_timeout`: the answer's head, or
/// why there is none ([`classify`]).
fn settle<T>(
    outcome: Result<Result<T, OriginError>, tokio::time::error::Elapsed>,
    origin: &Authority,
    response_timeout: Duration,
    reused: bool,
) -> Result<T, ProxyError> {
    outcome
        .map_err(|_| ProxyError::Timeout {
            origin: origin.clone(),
            timeout: response_timeout,
        })?
        .map_err(|source| classify(source, origin, reused))
}

/// The origin's answer headers as the visitor gets them: hop-by-hop ones
/// removed, the node's `Via` appended.
fn answer_headers_for_visitor(headers: &mut HeaderMap, via: &Via) {
    strip_hop_by_hop(headers);
    headers.append(header::VIA, via.value(Version::HTTP_11));
}

/// Whose fault a failed attempt was: the visitor's body, the connection, or
/// the origin's answer.
fn classify(source: OriginError, origin: &Authority, reused: bool) -> ProxyError {
    if caused_by_client_body(&source) {
        ProxyError::ClientBody { source }
    } else if is_connection_failure(&source) {
        ProxyError::Unreachable {
            origin: origin.clone(),
            source,
            reused,
        }
    } else {
        ProxyError::Invalid {
            origin: origin.clone(),
            source,
        }
    }
}

/// The visitor's request body on its way to the origin; its errors are marked
/// [`ClientBodyError`] so a failed forward can tell whose fault it was.
#[derive(Debug)]
struct ClientBody(ReqBody);

/// The visitor's request body failed (cut short, malformed chunking).
#[derive(Debug, thiserror::Error)]
#[error("client request body: {0}")]
pub struct ClientBodyError(#[source] hyper::Error);

impl HttpBody for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.0)
            .poll_frame(cx)
            .map_err(|e| BoxError::from(ClientBodyError(e)))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.0.size_hint()
    }
}

/// The origin's response body on its way to the visitor: an origin that
/// resets or closes in the middle of it counts against its health, like one
/// that fails before the head.
#[derive(Debug)]
struct OriginBody {
    inner: OriginStream,
    upstream: Arc<Upstream>,
    choice: OriginChoice,
}

/// Which client reads the body.
#[derive(Debug)]
enum OriginStream {
    Hyper(PooledBody),
    H1(H1Body),
}

impl OriginBody {
    fn connection_failed(&self, err: &dyn std::fmt::Display) {
        tracing::debug!(origin = %self.upstream.origin(self.choice).authority, %err, "origin failed mid-response");
        self.upstream.connection_failed(self.choice);
    }
}

impl HttpBody for OriginBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match &mut this.inner {
            OriginStream::H1(body) => Pin::new(body).poll_frame(cx).map_err(|e| {
                if e.is_connection_failure() {
                    this.connection_failed(&e);
                }
                BoxError::from(e)
            }),
            OriginStream::Hyper(body) => Pin::new(body).poll_frame(cx).map_err(|e| {
                if e.is_incomplete_message()
                    || std::error::Error::source(&e)
                        .is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some())
                {
                    this.connection_failed(&e);
                }
                BoxError::from(e)
            }),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            OriginStream::H1(body) => body.is_end_stream(),
            OriginStream::Hyper(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            OriginStream::H1(body) => body.size_hint(),
            OriginStream::Hyper(body) => body.size_hint(),
        }
    }
}

/// The forward failed because the visitor's body did (anywhere in the chain).
fn caused_by_client_body(err: &OriginError) -> bool {
    if matches!(err, OriginError::H1(H1Error::RequestBody(_))) {
        return true;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if e.downcast_ref::<ClientBodyError>().is_some() {
            return true;
        }
        source = e.source();
    }
    false
}

/// Connecting failed, or the connection closed or reset before an answer.
fn is_connection_failure(err: &OriginError) -> bool {
    let err = match err {
        OriginError::Connect(_) => return true,
        OriginError::H1(err) => return err.is_connection_failure(),
        OriginError::Exchange(err) => err,
    };
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() || h.is_closed() || h.is_canceled() {
                return true;
            }
        } else if e.downcast_ref::<std::io::Error>().is_some() {
            return true;
        }
        source = e.source();
    }
    false
}

/// The answer to a request that already passed this node (its own `Via`):
/// forwarding it again would go round for ever.
pub fn loop_detected() -> Response<Body> {
    let mut resp = text(
        StatusCode::LOOP_DETECTED,
        "text/plain; charset=utf-8",
        "508 Loop Detected: this request already passed this waiting room node.\n".into(),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// The page for a failed forward: 503 when every pool is down, 400 when the
/// visitor's body failed, else 502.
pub fn error_page(err: &ProxyError) -> Response<Body> {
    match err {
        ProxyError::NoHealthyOrigin { .. } => unavailable(err),
        ProxyError::ClientBody { .. } => bad_request_body(err),
        _ => bad_gateway(err),
    }
}

/// What a failed forward tells the visitor, for the room's error page
/// (`crate::pages`): 503 `origin_down` (try again in 30 s) when every pool
/// is down, 502 `origin_timeout` or `origin_unreachable` otherwise. `None`
/// for a visitor's own broken body: [`error_page`] answers that in plain
/// text. Logged as [`error_page`] logs it.
pub fn failure(err: &ProxyError) -> Option<crate::pages::StatusView> {
    use crate::pages::{Reason, StatusView};
    match err {
        ProxyError::ClientBody { .. } => None,
        ProxyError::NoHealthyOrigin { .. } => {
            tracing::debug!(%err, "no healthy origin");
            Some(StatusView::new(Reason::OriginDown, 503, 30))
        }
        _ => {
            log_origin_failure(err);
            let reason = if matches!(err, ProxyError::Timeout { .. }) {
                Reason::OriginTimeout
            } else {
                Reason::OriginUnreachable
            };
            Some(StatusView::new(reason, 502, 0))
        }
    }
}

/// A dead origin under load fails thousands of requests a second; the
/// metric counts each, the log says it once per ten seconds.
fn log_origin_failure(err: &ProxyError) {
    static LOG: waitroom_runtime::logging::LogGate = waitroom_runtime::logging::LogGate::new(10);
    if let Some(suppressed) = LOG.pass_now() {
        tracing::warn!(%err, suppressed, "origin request failed");
    }
}

/// The answer to a visitor whose request body broke off or was malformed.
fn bad_request_body(err: &ProxyError) -> Response<Body> {
    tracing::debug!(%err, "client request body failed");
    let mut resp = text(
        StatusCode::BAD_REQUEST,
        "text/plain; charset=utf-8",
        "400 Bad Request: the request body was incomplete or malformed.\n".into(),
    );
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// The page a visitor sees when no origin is healthy: nothing was tried.
fn unavailable(err: &ProxyError) -> Response<Body> {
    tracing::debug!(%err, "no healthy origin");
    let body: &str = "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Site unavailable</title></head>\
         <body style=\"font-family:system-ui,sans-serif;max-width:36rem;margin:4rem auto\">\
         <h1>The site is down for the moment</h1><p>The waiting room let you in, but every server \
         of the website behind it is failing its health checks. Please try again in a minute.</p>\
         <p><small>503 Service Unavailable</small></p></body></html>";
    let mut resp = Response::new(full(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::RETRY_AFTER, HeaderValue::from_static("30"));
    resp
}

/// The page a visitor sees when the origin cannot be reached.
pub fn bad_gateway(err: &ProxyError) -> Response<Body> {
    log_origin_failure(err);
    let body: &str = "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Site unavailable</title></head>\
         <body style=\"font-family:system-ui,sans-serif;max-width:36rem;margin:4rem auto\">\
         <h1>The site is not answering</h1><p>The waiting room let you in, but the website behind it \
         did not respond. Please try again in a minute.</p><p><small>502 Bad Gateway</small></p></body></html>";
    let mut resp = Response::new(full(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = StatusCode::BAD_GATEWAY;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nomination_cannot_take_away_what_the_node_sets_or_routes_by() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("shop.example"));
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("Host, X-Forwarded-For, via, x-secret, keep-alive"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("accept", HeaderValue::from_static("*/*"));
        let forwarding = Forwarding {
            client: "198.51.100.7".parse().unwrap(),
            hop: "198.51.100.7".parse().unwrap(),
            trusted: false,
            scheme: "http",
        };
        let via = Via::new("n1");
        let caught = prepare_request_headers(&mut h, Version::HTTP_11, None, &forwarding, &via);
        assert_eq!(
            caught,
            Caught {
                nomination_ignored: true,
                untrusted_removed: false
            }
        );
        assert_eq!(h[header::HOST], "shop.example");
        assert_eq!(h["x-forwarded-for"], "198.51.100.7");
        assert_eq!(h[header::VIA], "1.1 waitroom-n1");
        assert_eq!(h["accept"], "*/*");
        for gone in ["x-secret", "keep-alive", "connection"] {
            assert!(!h.contains_key(gone), "{gone} was forwarded");
        }
        // An ordinary nomination is not counted.
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("x-secret"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        let caught = prepare_request_headers(&mut h, Version::HTTP_2, None, &forwarding, &via);
        assert!(!caught.nomination_ignored && !h.contains_key("x-secret"));
        assert_eq!(h[header::VIA], "2 waitroom-n1");
    }

    #[test]
    fn every_hop_by_hop_header_goes_and_nothing_else() {
        let mut h = HeaderMap::new();
        for name in HOP_BY_HOP.iter().chain([&PROXY_CONNECTION]) {
            h.append(name, HeaderValue::from_static("x"));
            h.append(name, HeaderValue::from_static("y"));
        }
        h.append(header::CONNECTION, HeaderValue::from_static("X-A , close"));
        h.insert("x-a", HeaderValue::from_static("1"));
        h.insert("close", HeaderValue::from_static("1"));
        h.insert("x-b", HeaderValue::from_static("2"));
        h.insert(header::COOKIE, HeaderValue::from_static("c=1"));
        strip_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["x-b", "cookie"]);
        assert_eq!(h.len(), 2, "every value of a removed name went");

        // Nothing hop-by-hop: untouched, in order.
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("a"));
        h.append("x-keep", HeaderValue::from_static("1"));
        h.append("x-keep", HeaderValue::from_static("2"));
        let before = h.clone();
        assert!(!strip_hop_by_hop_except(&mut h, &PROTECTED_FROM_NOMINATION));
        assert_eq!(h, before);
    }
}
