//! The admitted path: a reverse proxy to the room's origin.
//!
//! One pooled hyper client per worker (connections are reused, never shared
//! across cores). Bodies stream both ways; hop-by-hop headers are removed and
//! `X-Forwarded-For`, `X-Forwarded-Proto` and `Via` are added. An origin that
//! cannot be reached answers a clear 502 page within the timeout, never a hang.
use std::{net::SocketAddr, time::Duration};

use bytes::Bytes;
use http::{
    HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, Uri, Version, header,
    uri::{Authority, Scheme},
};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};

use crate::http::{Body, full};

/// The pooled client a worker uses to reach origins.
pub type OriginClient = Client<HttpConnector, Incoming>;

/// Builds a worker's origin client.
pub fn client(connect_timeout: Duration) -> OriginClient {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_nodelay(true);
    connector.enforce_http(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(256)
        .build(connector)
}

/// Where and how long to wait when forwarding.
#[derive(Debug, Clone)]
pub struct Target {
    /// `host:port` of the origin.
    pub authority: Authority,
    /// Time for the origin to send its response head.
    pub response_timeout: Duration,
}

/// Headers that describe one hop and must not be forwarded (RFC 9110 §7.6.1).
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
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
    headers.remove(HeaderName::from_static("proxy-connection"));
}

/// Why forwarding failed; each becomes a 502 page.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("origin {origin} did not answer within {timeout:?}")]
    Timeout {
        origin: Authority,
        timeout: Duration,
    },
    #[error("origin {origin} unreachable: {source}")]
    Unreachable {
        origin: Authority,
        source: hyper_util::client::legacy::Error,
    },
    #[error("cannot build the origin URI: {0}")]
    Uri(#[from] http::Error),
}

/// Forwards `req` to `target` and streams the answer back.
pub async fn forward(
    client: &OriginClient,
    target: &Target,
    mut req: Request<Incoming>,
    peer: SocketAddr,
    scheme: &'static str,
) -> Result<Response<Body>, ProxyError> {
    let path_and_query = req
        .uri()
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/")
        .to_owned();
    let visitor_authority = req.uri().authority().cloned();
    let version = req.version();
    *req.uri_mut() = Uri::builder()
        .scheme(Scheme::HTTP)
        .authority(target.authority.clone())
        .path_and_query(path_and_query)
        .build()?;
    *req.version_mut() = Version::HTTP_11;

    let headers = req.headers_mut();
    strip_hop_by_hop(headers);
    // HTTP/2 visitors carry the host in :authority; the origin speaks HTTP/1.1.
    if !headers.contains_key(header::HOST)
        && let Some(a) = visitor_authority
        && let Ok(v) = HeaderValue::from_str(a.as_str())
    {
        headers.insert(header::HOST, v);
    }
    append_forwarded_for(headers, peer);
    headers.insert(
        HeaderName::from_static("x-forwarded-proto"),
        HeaderValue::from_static(scheme),
    );
    headers.append(header::VIA, via_value(version));

    let response = tokio::time::timeout(target.response_timeout, client.request(req))
        .await
        .map_err(|_| ProxyError::Timeout {
            origin: target.authority.clone(),
            timeout: target.response_timeout,
        })?
        .map_err(|source| ProxyError::Unreachable {
            origin: target.authority.clone(),
            source,
        })?;
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    parts
        .headers
        .append(header::VIA, via_value(Version::HTTP_11));
    Ok(Response::from_parts(
        parts,
        body.map_err(crate::http::BoxError::from).boxed_unsync(),
    ))
}

fn append_forwarded_for(headers: &mut HeaderMap, peer: SocketAddr) {
    let ip = peer.ip().to_string();
    let value = match headers.get(HeaderName::from_static("x-forwarded-for")) {
        Some(prev) => match prev.to_str() {
            Ok(prev) => format!("{prev}, {ip}"),
            Err(_) => ip,
        },
        None => ip,
    };
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(HeaderName::from_static("x-forwarded-for"), v);
    }
}

fn via_value(version: Version) -> HeaderValue {
    HeaderValue::from_static(match version {
        Version::HTTP_2 => "2 waitroom",
        Version::HTTP_10 => "1.0 waitroom",
        _ => "1.1 waitroom",
    })
}

/// The page a visitor sees when the origin cannot be reached.
pub fn bad_gateway(err: &ProxyError) -> Response<Body> {
    tracing::warn!(%err, "origin request failed");
    let body: &str = 
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Site unavailable</title></head>\
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
