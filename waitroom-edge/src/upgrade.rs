//! HTTP/1.1 `Upgrade` (WebSocket and the like) for admitted visitors: the
//! request goes to the origin with its `Connection: upgrade` and `Upgrade`
//! kept; when the origin answers `101 Switching Protocols`, both connections
//! are upgraded (hyper's upgrade on each side) and bytes are copied both ways
//! until either side closes.
//!
//! Only admitted (or bypassed) requests get here: the handler decides first,
//! so a queued visitor's upgrade attempt gets the queue page, never a tunnel.
//! An origin that refuses the upgrade answers as usual. HTTP/2's extended
//! CONNECT is not supported (such a request is forwarded as any other).
//!
//! A tunnel outlives its HTTP connection's bookkeeping: once upgraded, the
//! connection no longer counts against `max_connections_per_worker` or the
//! per-address cap, and the shutdown grace does not wait for it.
use std::sync::Arc;

use crate::http::h1::ReqBody;
use http::{HeaderValue, Request, Response, StatusCode, Uri, Version, header, uri::PathAndQuery};
use http_body_util::{BodyExt as _, Empty};
use hyper_util::rt::TokioIo;

use waitroom_runtime::body::{Body, BoxError};

use crate::{
    origin_pool::OriginError,
    proxy::{self, OriginClient, OriginRequest, ProxyError},
    upstream::Upstream,
};

/// An HTTP/1.1 request asking to switch protocols: `Connection` names
/// `upgrade` and `Upgrade` is present.
#[must_use]
pub fn is_upgrade<B>(req: &Request<B>) -> bool {
    req.version() == Version::HTTP_11
        && req.headers().contains_key(header::UPGRADE)
        && req
            .headers()
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Forwards an upgrade request to an origin of `upstream`; on `101`, joins
/// the two upgraded connections in a task of their own.
pub async fn forward(
    client: &OriginClient,
    upstream: &Arc<Upstream>,
    response_timeout: std::time::Duration,
    mut req: Request<ReqBody>,
    to_origin: &OriginRequest<'_>,
) -> Result<Response<Body>, ProxyError> {
    let visitor_side = hyper::upgrade::on(&mut req);
    let (mut parts, _body) = req.into_parts();
    let protocol = parts.headers.get(header::UPGRADE).cloned();
    let path_and_query = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    proxy::prepare_request_headers(
        &mut parts.headers,
        parts.version,
        parts.uri.authority(),
        &to_origin.forwarding,
        to_origin.via,
    );
    // The hop-by-hop pair this hop is about, put back for the next.
    if let Some(protocol) = protocol {
        parts.headers.insert(header::UPGRADE, protocol);
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    let Some(choice) = upstream.select(rand::random(), None) else {
        return Err(ProxyError::NoHealthyOrigin {
            room: upstream.room.clone(),
        });
    };
    let origin = upstream.origin(choice);
    let scheme = &upstream.pool(choice).scheme;
    let mut out = Request::new(Empty::new().map_err(|never| match never {}).boxed_unsync());
    *out.method_mut() = parts.method;
    *out.uri_mut() = Uri::from(path_and_query);
    *out.version_mut() = Version::HTTP_11;
    *out.headers_mut() = parts.headers;

    // A connection of its own, never from the idle pool: after a `101` it
    // is the tunnel's, and a refused upgrade is rare enough not to keep it.
    let exchange = async {
        let mut conn = client.connect(scheme, &origin.authority).await?;
        let resp = conn
            .send(out)
            .await
            .map_err(|e| OriginError::Exchange(e.into_error()))?;
        let (parts, body) = resp.into_parts();
        // Hands the connection's driver to a task on `101` (the upgrade
        // completes there), else streams the refusal's body and pools it.
        let body = conn.into_body(client, parts.status, body);
        Ok::<_, OriginError>(Response::from_parts(parts, body))
    };
    let mut resp = tokio::time::timeout(response_timeout, exchange)
        .await
        .map_err(|_| ProxyError::Timeout {
            origin: origin.authority.clone(),
            timeout: response_timeout,
        })?
        .map_err(|source| {
            if matches!(source, OriginError::Connect(_)) {
                upstream.connection_failed(choice);
                ProxyError::Unreachable {
                    origin: origin.authority.clone(),
                    source,
                    reused: false,
                }
            } else {
                ProxyError::Invalid {
                    origin: origin.authority.clone(),
                    source,
                }
            }
        })?;
    origin
        .requests
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);

    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        // Refused: an ordinary answer.
        let (mut parts, body) = resp.into_parts();
        proxy::strip_hop_by_hop(&mut parts.headers);
        parts
            .headers
            .append(header::VIA, to_origin.via.value(Version::HTTP_11));
        return Ok(Response::from_parts(
            parts,
            body.map_err(BoxError::from).boxed_unsync(),
        ));
    }
    let origin_side = hyper::upgrade::on(&mut resp);
    let (mut parts, _) = resp.into_parts();
    let protocol = parts.headers.get(header::UPGRADE).cloned();
    proxy::strip_hop_by_hop(&mut parts.headers);
    if let Some(protocol) = protocol {
        parts.headers.insert(header::UPGRADE, protocol);
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    parts
        .headers
        .append(header::VIA, to_origin.via.value(Version::HTTP_11));
    let authority = origin.authority.clone();
    tokio::spawn(async move {
        let (visitor, origin) = match tokio::try_join!(visitor_side, origin_side) {
            Ok(both) => both,
            Err(err) => {
                tracing::debug!(%err, origin = %authority, "upgrade did not complete");
                return;
            }
        };
        let (mut visitor, mut origin) = (TokioIo::new(visitor), TokioIo::new(origin));
        match tokio::io::copy_bidirectional(&mut visitor, &mut origin).await {
            Ok((up, down)) => tracing::debug!(up, down, origin = %authority, "tunnel closed"),
            Err(err) => tracing::debug!(%err, origin = %authority, "tunnel failed"),
        }
    });
    Ok(Response::from_parts(
        parts,
        Empty::new().map_err(|never| match never {}).boxed_unsync(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_http11_request_naming_upgrade_in_connection_is_one() {
        let req = |version, connection: &str, upgrade: Option<&str>| {
            let mut b = Request::builder()
                .version(version)
                .header(header::CONNECTION, connection);
            if let Some(u) = upgrade {
                b = b.header(header::UPGRADE, u);
            }
            b.body(()).unwrap()
        };
        assert!(is_upgrade(&req(
            Version::HTTP_11,
            "keep-alive, Upgrade",
            Some("websocket")
        )));
        assert!(!is_upgrade(&req(
            Version::HTTP_11,
            "keep-alive",
            Some("websocket")
        )));
        assert!(!is_upgrade(&req(Version::HTTP_11, "upgrade", None)));
        assert!(!is_upgrade(&req(
            Version::HTTP_2,
            "upgrade",
            Some("websocket")
        )));
    }
}
