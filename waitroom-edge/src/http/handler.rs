//! The request path, top to bottom: find the room, open the visitor's cookie,
//! ask the admission engine, then proxy to the origin or answer with the queue.
use std::{net::SocketAddr, time::Instant};

use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;

use crate::{
    Node,
    http::{Body, full},
    proxy,
};

/// Per-worker state: the origin pool and per-room proxy targets.
#[derive(Debug)]
pub struct Worker {
    pub index: usize,
    client: proxy::OriginClient,
    targets: Vec<proxy::Target>,
}

impl Worker {
    pub fn new(index: usize, node: &Node) -> Self {
        let targets = node
            .rooms
            .rooms
            .iter()
            .map(|r| proxy::Target {
                authority: r.origin.clone(),
                response_timeout: r.origin_timeout,
            })
            .collect();
        Self {
            index,
            client: proxy::client(std::time::Duration::from_secs(3)),
            targets,
        }
    }
}

/// Handles one request. Never fails: every problem becomes a response.
pub async fn handle(
    node: &Node,
    worker: &Worker,
    req: Request<Incoming>,
    peer: SocketAddr,
    scheme: &'static str,
) -> Response<Body> {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().host())
        .unwrap_or("");
    let Some(room) = node.rooms.find(host, req.uri().path()) else {
        node.metrics
            .requests_unmatched
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return not_covered();
    };
    let started = Instant::now();
    let result = proxy::forward(&worker.client, &worker.targets[room], req, peer, scheme).await;
    let _elapsed = started.elapsed();
    match result {
        Ok(resp) => resp,
        Err(err) => proxy::bad_gateway(&err),
    }
}

fn not_covered() -> Response<Body> {
    let mut resp = Response::new(full("no waiting room covers this host and path\n"));
    *resp.status_mut() = StatusCode::NOT_FOUND;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    resp
}
