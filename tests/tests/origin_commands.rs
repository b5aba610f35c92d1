//! Origin commands end to end, on a driven clock: a checkout page that
//! answers `Waitroom-Command: revoke` ends its visitor's session at once and
//! the next queued visitor gets the slot; the header never reaches a visitor,
//! and a visitor who sends it, or keeps the revoked cookie, gains nothing.
use std::time::Duration;

use waitroom_tests::{
    edge::{QUEUE, SITE, client, get, metric},
    inproc::InProcNode,
    raw::{RawResponse, request},
};

/// One visitor at a time; a step above the 5 s ± 20 % refresh jitter.
const ROOM: &str = "total_active_users = 1\nnew_users_per_minute = 1\nrefresh_interval = 5\n";
const STEP: Duration = Duration::from_secs(7);

fn visit(node: &InProcNode, path: &str, cookie: &Option<String>) -> RawResponse {
    let headers: Vec<(&str, &str)> = cookie.iter().map(|c| ("Cookie", c.as_str())).collect();
    request(node.http, "GET", path, &headers)
}

fn active(node: &InProcNode) -> Option<f64> {
    let m = get(&client(), &node.admin_url("/metrics")).1;
    metric(&m, "waitroom_active_users{room=\"shop\",scope=\"node\"}")
}

#[test]
fn a_checkout_that_revokes_frees_the_slot_for_the_next_in_line() {
    let node = InProcNode::start(
        "cmd-revoke",
        &format!("{ROOM}enabled_origin_commands = [\"revoke\"]\n"),
    )
    .unwrap();
    let first = visit(&node, "/", &None);
    assert!(first.body.contains(SITE), "{}", first.body);
    let a = first.cookie();
    let queued = visit(&node, "/", &None);
    assert!(queued.body.contains(QUEUE));
    let b = queued.cookie();

    // A minute later A's session still holds the one place: B waits.
    node.advance_into_next_minute(1);
    let b_resp = visit(&node, "/", &b);
    assert!(b_resp.body.contains(QUEUE), "B got in while A browses");
    let b = b_resp.cookie().or(b);

    // A finishes the checkout: the header is gone, so is A's cookie and count.
    let done = visit(&node, "/checkout/done", &a);
    assert!(done.body.contains(SITE));
    assert_eq!(
        done.header("waitroom-command"),
        None,
        "the command reached the visitor"
    );
    let cleared = done.header("set-cookie").unwrap_or_default();
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
    node.advance(STEP);
    assert_eq!(active(&node), Some(0.0));

    // B's next check-in takes the freed place.
    let b_resp = visit(&node, "/", &b);
    assert!(
        b_resp.body.contains(SITE),
        "B still queued: {}",
        b_resp.body
    );
    assert_eq!(active(&node), Some(1.0));
    let m = get(&client(), &node.admin_url("/metrics")).1;
    assert_eq!(
        metric(&m, "waitroom_revoked_total{room=\"shop\"}"),
        Some(1.0)
    );

    // A kept the revoked cookie: a new visitor, behind B.
    let replay = visit(&node, "/", &a);
    assert!(replay.body.contains(QUEUE), "a revoked cookie was honoured");
}

/// The attacker and the tired operator: a visitor who sends the header
/// (to end someone's session, or to make the origin echo it) moves nothing
/// and the origin never sees it; a room that did not enable the command
/// ignores it and still strips it.
#[test]
fn the_command_is_the_origins_alone_and_only_where_enabled() {
    let node = InProcNode::start("cmd-off", ROOM).unwrap();
    let first = visit(&node, "/", &None);
    let a = first.cookie();
    assert!(first.body.contains(SITE));
    let done = visit(&node, "/checkout/done", &a);
    assert_eq!(
        done.header("waitroom-command"),
        None,
        "stripped though not enabled"
    );
    assert!(
        done.all("set-cookie").all(|c| !c.contains("Max-Age=0")),
        "not enabled: the session stays"
    );
    node.advance(STEP);
    assert_eq!(active(&node), Some(1.0));

    let on = InProcNode::start(
        "cmd-visitor",
        &format!("{ROOM}enabled_origin_commands = [\"revoke\"]\n"),
    )
    .unwrap();
    let first = visit(&on, "/", &None);
    let a = first.cookie().unwrap();
    let echo = request(
        on.http,
        "GET",
        "/echo",
        &[("Cookie", a.as_str()), ("Waitroom-Command", "revoke")],
    );
    assert!(echo.body.starts_with("GET /echo"), "{}", echo.body);
    assert!(
        !echo.body.to_ascii_lowercase().contains("waitroom-command"),
        "the origin saw the visitor's command: {}",
        echo.body
    );
    on.advance(STEP);
    assert_eq!(active(&on), Some(1.0), "a visitor's header moved a count");
    assert!(visit(&on, "/", &Some(a)).body.contains(SITE));
}

/// An origin on its own threads that answers `/checkout…` only when the
/// test lets it (each such request said on `held`), with the command field
/// under its default name; anything else at once. HTTP/1.1, kept alive.
fn held_origin() -> (
    std::net::SocketAddr,
    std::sync::mpsc::Receiver<()>,
    std::sync::mpsc::Sender<()>,
) {
    use std::io::{Read, Write};
    use std::sync::{Arc, Mutex, mpsc};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (held_tx, held) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let release_rx = Arc::new(Mutex::new(release_rx));
    std::thread::spawn(move || {
        for conn in listener.incoming().take(64) {
            let Ok(mut conn) = conn else { return };
            let (held_tx, release_rx) = (held_tx.clone(), Arc::clone(&release_rx));
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match conn.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end + 4);
                    let mut words = head.split(' ');
                    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
                    let command = if path.starts_with("/checkout") {
                        let _ = held_tx.send(());
                        let released = release_rx
                            .lock()
                            .unwrap()
                            .recv_timeout(Duration::from_secs(20));
                        assert!(released.is_ok(), "the test never released the origin");
                        "Waitroom-Command: revoke\r\n"
                    } else {
                        ""
                    };
                    let body = if method == "HEAD" { "" } else { "ok" };
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n{command}\r\n{body}"
                    );
                    if conn.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, held, release)
}

/// A visitor's checkout (`method /checkout/done` with `cookie`) on a thread
/// of its own, while the test does something else.
fn checkout_meanwhile(
    http: std::net::SocketAddr,
    method: &'static str,
    cookie: String,
) -> std::thread::JoinHandle<RawResponse> {
    std::thread::spawn(move || {
        request(
            http,
            method,
            "/checkout/done",
            &[("Cookie", cookie.as_str())],
        )
    })
}

/// The tired operator renames the command field (`origin_command_header`)
/// by a reload while a checkout is at the origin: that answer is read by the
/// name its request left with — its command acted on, the field kept from
/// the visitor — whether its fields come as lines (`GET`) or as a map
/// (`HEAD`); the next request goes by the new name.
#[test]
fn a_reload_renaming_the_field_mid_request_keeps_the_name_the_request_left_with() {
    for method in ["GET", "HEAD"] {
        let (origin, held, release) = held_origin();
        let node = InProcNode::start_in_front_of(
            &format!("cmd-rename-{method}"),
            origin,
            &format!("{ROOM}enabled_origin_commands = [\"revoke\"]\n"),
        )
        .unwrap();
        let first = request(node.http, "GET", "/", &[]);
        assert_eq!(first.status, 200, "{method}: {first:?}");
        let a = first.cookie().unwrap();

        let checkout = checkout_meanwhile(node.http, method, a);
        held.recv_timeout(Duration::from_secs(10))
            .expect("the checkout reached the origin");
        node.reload(|c| format!("{c}origin_command_header = \"X-Shop-Command\"\n"))
            .unwrap();
        release.send(()).unwrap();
        let done = checkout.join().unwrap();
        assert_eq!(done.status, 200, "{method}: {done:?}");
        assert_eq!(
            done.header("waitroom-command"),
            None,
            "{method}: the command reached the visitor"
        );
        let cleared = done.header("set-cookie").unwrap_or_default();
        assert!(
            cleared.contains("Max-Age=0"),
            "{method}: the revoke was lost: {cleared:?}"
        );

        // The reload is in force: under the old name the field is no
        // command any more, and passes as any other.
        node.advance_into_next_minute(1);
        let next = request(node.http, "GET", "/", &[]);
        assert_eq!(next.body, "ok", "{method}: the freed place was not given");
        let checkout = checkout_meanwhile(node.http, method, next.cookie().unwrap());
        held.recv_timeout(Duration::from_secs(10)).unwrap();
        release.send(()).unwrap();
        let done = checkout.join().unwrap();
        assert_eq!(done.header("waitroom-command"), Some("revoke"), "{method}");
        assert!(
            done.all("set-cookie").all(|c| !c.contains("Max-Age=0")),
            "{method}: revoked by the old name"
        );
    }
}
