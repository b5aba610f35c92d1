//! A small built-in origin for the demo and the tests: a "shop" with a few pages.
//!
//! It is a real HTTP server (hyper) on its own socket, so the edge proxies to it
//! exactly as it would to an operator's site. `/slow?ms=N` answers after N ms and
//! `/echo` returns the request's headers, which tests use to check the proxy.
//!
//! `/checkout/done` answers with the origin command `Waitroom-Command: revoke`.
//!
//! For tests of origin pools: every response carries `x-demo-origin: ADDR`
//! (which origin served it), every response waits `--delay-ms` first, and
//! `POST /_demo/delay?ms=N` changes that delay while it runs (a slow origin the
//! test controls).
use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use hyper::{body::Incoming, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

/// Serves the demo origin on `listen` until the process ends.
pub async fn serve(listen: SocketAddr) -> std::io::Result<()> {
    serve_with(listen, Duration::ZERO).await
}

/// What every connection of one demo origin shares.
#[derive(Debug)]
struct Demo {
    /// `x-demo-origin` of every response.
    name: http::HeaderValue,
    /// Added before every response, in milliseconds.
    delay_ms: AtomicU64,
}

/// Serves the demo origin, delaying every response by `delay` at first.
pub async fn serve_with(listen: SocketAddr, delay: Duration) -> std::io::Result<()> {
    serve_on(TcpListener::bind(listen).await?, delay).await
}

/// Serves the demo origin on a bound `listener` (a test that binds port 0
/// knows the address before the origin runs).
pub async fn serve_on(listener: TcpListener, delay: Duration) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    tracing::info!(%addr, ?delay, "demo origin listening");
    let demo = Arc::new(Demo {
        name: http::HeaderValue::from_str(&addr.to_string()).expect("an address is a header value"),
        delay_ms: AtomicU64::new(delay.as_millis() as u64),
    });
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(conn) => conn,
            Err(err) => {
                tracing::warn!(%err, "accept failed");
                continue;
            }
        };
        let demo = Arc::clone(&demo);
        tokio::spawn(async move {
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let service = service_fn(move |req| {
                let demo = Arc::clone(&demo);
                async move {
                    let delay = demo.delay_ms.load(Relaxed);
                    if delay > 0 && !req.uri().path().starts_with("/_demo/") {
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                    }
                    let mut resp = handle(req, &demo).await?;
                    resp.headers_mut()
                        .insert("x-demo-origin", demo.name.clone());
                    Ok::<_, Infallible>(resp)
                }
            });
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(req: Request<Incoming>, demo: &Demo) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or_default().to_owned();
    let response = match path.as_str() {
        "/_demo/delay" if req.method() == http::Method::POST => {
            match query
                .split('&')
                .find_map(|kv| kv.strip_prefix("ms="))
                .and_then(|v| v.parse::<u64>().ok())
            {
                Some(ms) => {
                    demo.delay_ms.store(ms.min(60_000), Relaxed);
                    text_response(StatusCode::OK, "text/plain", format!("delay {ms} ms\n"))
                }
                None => text_response(StatusCode::BAD_REQUEST, "text/plain", "need ?ms=N\n".into()),
            }
        }
        "/echo" => {
            let mut text = format!("{} {}\n", req.method(), req.uri());
            for (name, value) in req.headers() {
                text.push_str(&format!(
                    "{name}: {}\n",
                    value.to_str().unwrap_or("<binary>")
                ));
            }
            let body = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            text.push_str(&format!("\nbody-bytes: {}\n", body.len()));
            text_response(StatusCode::OK, "text/plain; charset=utf-8", text)
        }
        "/slow" => {
            let ms = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("ms="))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(1000)
                .min(60_000);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            text_response(StatusCode::OK, "text/plain", format!("slept {ms} ms\n"))
        }
        "/healthz" => text_response(StatusCode::OK, "text/plain", "ok\n".into()),
        // The end of a checkout: the origin tells the room the visitor is
        // done (an origin command, see `waitroom_edge::origin_command`).
        "/checkout/done" => {
            let mut resp =
                text_response(StatusCode::OK, "text/html; charset=utf-8", shop_page(&path));
            resp.headers_mut().insert(
                "waitroom-command",
                header::HeaderValue::from_static("revoke"),
            );
            resp
        }
        // A large answer, for clients that never read it (send timeouts).
        "/big" => {
            let mb = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("mb="))
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(1)
                .min(256);
            let mut resp = Response::new(Full::new(Bytes::from(vec![b'x'; mb << 20])));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/octet-stream"),
            );
            resp
        }
        _ => text_response(StatusCode::OK, "text/html; charset=utf-8", shop_page(&path)),
    };
    Ok(response)
}

fn text_response(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp
}

fn shop_page(path: &str) -> String {
    let path = html_escape(path);
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Demo Shop</title>
<meta name="viewport" content="width=device-width,initial-scale=1">
<style>body{{font-family:system-ui,sans-serif;max-width:40rem;margin:3rem auto;padding:0 1rem;color:#222}}
.card{{border:1px solid #ddd;border-radius:8px;padding:1rem;margin:1rem 0}}</style></head>
<body><h1 id="shop">Demo Shop</h1>
<p>You are on the site (page <code>{path}</code>). The waiting room let you in.</p>
<div class="card"><h2>Limited sneakers</h2><p>Only 100 pairs. <a href="/product/1">View</a></p></div>
<div class="card"><h2>Concert tickets</h2><p>Going fast. <a href="/product/2">View</a></p></div>
</body></html>
"#
    )
}

/// Escapes text for HTML element content and attribute values.
pub fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
