//! WebSocket through the room: an admitted visitor's upgrade becomes a
//! tunnel to a real WebSocket echo origin (tungstenite), both ways; a queued
//! visitor's upgrade attempt gets the queue page, never a tunnel.
use std::{
    net::{SocketAddr, TcpListener, TcpStream},
    thread,
    time::Duration,
};

use tungstenite::{Message, client::IntoClientRequest as _, handshake::client::Response};
use waitroom_tests::{edge::QUEUE, inproc::InProcNode, raw::request};

/// A WebSocket echo origin on its own thread: each connection echoes text
/// and binary messages until it is closed; at most `connections` accepted.
fn echo_origin(connections: usize) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for stream in listener.incoming().take(connections).flatten() {
            thread::spawn(move || {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let Ok(mut ws) = tungstenite::accept(stream) else {
                    return;
                };
                for _ in 0..1_000 {
                    match ws.read() {
                        Ok(m @ (Message::Text(_) | Message::Binary(_))) => {
                            if ws.send(m).is_err() {
                                return;
                            }
                        }
                        Ok(Message::Close(_)) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            });
        }
    });
    addr
}

fn connect(
    node: &InProcNode,
    cookie: Option<&str>,
) -> Result<(tungstenite::WebSocket<TcpStream>, Response), tungstenite::Error> {
    let mut req = format!("ws://{}/live", node.http)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("host", "shop.example".parse().unwrap());
    if let Some(c) = cookie {
        req.headers_mut().insert("cookie", c.parse().unwrap());
    }
    let stream = TcpStream::connect(node.http).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    tungstenite::client(req, stream).map_err(|e| match e {
        tungstenite::HandshakeError::Failure(e) => e,
        tungstenite::HandshakeError::Interrupted(_) => tungstenite::Error::ConnectionClosed,
    })
}

#[test]
fn an_admitted_visitor_gets_a_tunnel_and_a_queued_one_the_queue() {
    let origin = echo_origin(8);
    let node = InProcNode::start_in_front_of(
        "ws",
        origin,
        "total_active_users = 1\nnew_users_per_minute = 1\n",
    )
    .unwrap();
    // The one place: a page load gives the cookie, then the socket opens.
    let page = request(node.http, "GET", "/", &[]);
    let cookie = page.cookie().expect("admitted with a cookie");
    let (mut ws, resp) = connect(&node, Some(&cookie)).expect("the upgrade went through");
    assert_eq!(resp.status(), 101);
    for i in 0..3 {
        ws.send(Message::text(format!("hello {i}"))).unwrap();
        assert_eq!(ws.read().unwrap(), Message::text(format!("hello {i}")));
    }
    ws.send(Message::binary(vec![0u8, 1, 2, 255])).unwrap();
    assert_eq!(ws.read().unwrap(), Message::binary(vec![0u8, 1, 2, 255]));
    ws.close(None).unwrap();

    // Someone new: the room is full, so their upgrade is answered with the
    // queue page (no 101, no tunnel).
    match connect(&node, None) {
        Err(tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status(), 200);
            let body = String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default());
            assert!(body.contains(QUEUE), "{body}");
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("a queued visitor got a tunnel"),
    }
    // Nor does a forged cookie open one.
    assert!(connect(&node, Some("__wr_shop=AAAA")).is_err());
}
