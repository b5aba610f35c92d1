//! Replayed and shared cookies (issue 13, items 1 and 2): a ticket moves the
//! counters once, a shared ticket is held to its connection budget, and a
//! ticket bound to its network is refused elsewhere.
//!
//! A node in the test process on a driven clock ([`InProcNode`]) in front of
//! the demo origin; requests go over real TCP connections, written by hand
//! so a test controls exactly which connection (and which source address)
//! carries which cookie.
use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use waitroom_common::time::ExpirySlot;
use waitroom_edge::metrics::Defence;
use waitroom_tests::{edge::SITE, inproc::InProcNode};

/// One kept-alive HTTP/1.1 connection from a chosen local address.
struct Conn {
    reader: BufReader<TcpStream>,
}

/// What one response said.
struct Answer {
    /// The origin answered (the visitor was admitted).
    admitted: bool,
    /// `name=value` of the ticket cookie the node set, if it set one.
    cookie: Option<String>,
}

impl Conn {
    fn open(node: SocketAddr) -> Self {
        Self::open_from(node, "127.0.0.1")
    }

    /// Connects from `local` (any 127.x.y.z is this host's loopback).
    fn open_from(node: SocketAddr, local: &str) -> Self {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        let local: SocketAddr = format!("{local}:0").parse().expect("address");
        socket.bind(&local.into()).expect("bind the source address");
        socket
            .connect_timeout(&node.into(), Duration::from_secs(5))
            .expect("connect");
        let stream: TcpStream = socket.into();
        stream
            .set_read_timeout(Some(Duration::from_secs(15)))
            .expect("timeout");
        Self {
            reader: BufReader::new(stream),
        }
    }

    /// `GET /` with `cookie` (`name=value`), keeping the connection open.
    fn get(&mut self, cookie: Option<&str>) -> Answer {
        let cookie = cookie
            .map(|c| format!("Cookie: {c}\r\n"))
            .unwrap_or_default();
        let request = format!("GET / HTTP/1.1\r\nHost: shop.test\r\n{cookie}\r\n");
        self.reader
            .get_mut()
            .write_all(request.as_bytes())
            .expect("send");
        let mut status = String::new();
        self.reader.read_line(&mut status).expect("status line");
        assert!(status.starts_with("HTTP/1.1 "), "{status:?}");
        let (mut length, mut chunked, mut set_cookie) = (0, false, None);
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line).expect("header");
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':').expect("a header");
            let value = value.trim();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse().expect("length"),
                "transfer-encoding" => chunked = value.contains("chunked"),
                "set-cookie" => {
                    set_cookie = value.split(';').next().map(str::to_owned);
                }
                _ => {}
            }
        }
        let body = if chunked {
            let mut body = Vec::new();
            loop {
                let mut size = String::new();
                self.reader.read_line(&mut size).expect("chunk size");
                let size = usize::from_str_radix(size.trim(), 16).expect("hex size");
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk).expect("chunk");
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
            body
        } else {
            let mut body = vec![0; length];
            self.reader.read_exact(&mut body).expect("body");
            body
        };
        Answer {
            admitted: String::from_utf8_lossy(&body).contains(SITE),
            cookie: set_cookie,
        }
    }
}

/// A new visitor on a connection of its own: admitted or not, and its cookie.
fn visit(node: &InProcNode) -> (bool, String) {
    let answer = Conn::open(node.http).get(None);
    (
        answer.admitted,
        answer.cookie.expect("a new visitor gets a cookie"),
    )
}

/// The sessions counted at expiry slot `slot` on the node.
fn counted_at(node: &InProcNode, slot: ExpirySlot) -> i64 {
    node.node()
        .room_counters(0)
        .expiries(slot)
        .filter(|&(s, _)| s == slot)
        .map(|(_, n)| n)
        .sum()
}

/// A session lasts exactly as long as the node counts it: admitted 300 ms
/// into a second, its cookie is honoured to the last millisecond of the
/// second its five minutes end in, while the counters still count it and a
/// newcomer would find the room full; at the next millisecond the counters
/// have let it go, a newcomer takes the room, and the old cookie is a new
/// visitor, queued. (Before, the session ended at the exact millisecond and
/// the counters held its place to the end of the second: room nobody could
/// use, and the counted number ran ahead of the sessions.)
#[test]
fn a_session_lasts_exactly_as_long_as_it_is_counted() {
    let node = InProcNode::start(
        "session-end",
        "total_active_users = 1\nnew_users_per_minute = 1\nsession_duration = 5",
    )
    .unwrap();
    node.advance(Duration::from_millis(300));
    let (admitted, first) = visit(&node);
    assert!(admitted);
    let slot = node.now().plus_minutes(5).expiry_slot();
    let active = |node: &InProcNode| {
        node.node()
            .room_counters(0)
            .active_users(node.now().expiry_slot())
    };
    // The last millisecond it is counted: honoured (and renewed).
    node.advance(Duration::from_millis(slot.end().0 - 1 - node.now().0));
    assert_eq!((counted_at(&node, slot), active(&node)), (1, 1));
    let answer = Conn::open(node.http).get(Some(&first));
    assert!(answer.admitted, "counted, so honoured");
    let renewed = answer.cookie.unwrap_or(first);
    // The renewed session's end: counted to the end of its second, then not.
    let slot = node.now().plus_minutes(5).expiry_slot();
    assert_eq!(counted_at(&node, slot), 1, "renewed at its new slot");
    node.advance(Duration::from_millis(slot.end().0 - node.now().0));
    assert_eq!(active(&node), 0, "no longer counted");
    assert!(visit(&node).0, "a newcomer takes the room it left");
    let again = Conn::open(node.http).get(Some(&renewed));
    assert!(
        !again.admitted,
        "the session is over: a new visitor, queued"
    );
}

/// Forty replays of one expired admitted cookie, then fifteen new visitors,
/// on a full 10-user room: the expired session frees one place, once.
#[test]
fn forty_replays_of_an_expired_cookie_free_one_place_once() {
    let mut node = InProcNode::start(
        "replay-expired",
        "total_active_users = 10\nnew_users_per_minute = 10\nsession_duration = 5",
    )
    .unwrap();
    let start = node.now();
    let mut cookies: Vec<String> = (0..10)
        .map(|i| {
            let (admitted, cookie) = visit(&node);
            assert!(admitted, "visitor {i} fills the room");
            cookie
        })
        .collect();
    // Four minutes on, all but the first renew their sessions.
    node.advance(Duration::from_secs(240));
    for cookie in &mut cookies[1..] {
        let answer = Conn::open(node.http).get(Some(cookie));
        assert!(answer.admitted);
        if let Some(renewed) = answer.cookie {
            *cookie = renewed;
        }
    }
    // The operator shortens the sessions to four minutes: the first session
    // has ended (four minutes after its last request) but is still counted
    // in its expiry slot of five: the room is full. (Its cookie says five;
    // the room in force decides.)
    node.reconfigure(|c| c.replace("session_duration = 5", "session_duration = 4"))
        .unwrap();
    let expired_at = start.plus_minutes(5).expiry_slot();
    node.advance(Duration::from_millis(
        start.plus_minutes(5).plus_millis(400).0 - node.now().0,
    ));
    assert_eq!(node.now().expiry_slot(), expired_at);
    assert_eq!(counted_at(&node, expired_at), 1);
    let replayed_before = node.node().defences.count(Defence::TicketReplayed);
    let mut conn = Conn::open(node.http);
    let mut admitted = (0..40)
        .filter(|_| conn.get(Some(&cookies[0])).admitted)
        .count();
    assert_eq!(
        counted_at(&node, expired_at),
        0,
        "uncounted once, not forty times"
    );
    assert!(node.node().defences.count(Defence::TicketReplayed) - replayed_before >= 39);
    node.advance(Duration::from_secs(1));
    admitted += (0..15).filter(|_| visit(&node).0).count();
    assert!(
        admitted <= 1,
        "{admitted} admitted: one place was freed, once"
    );
}

/// 300 connections replaying one admitted cookie on a full room: at most
/// the budget (16 connections per 10 s) get in; the rest are new visitors,
/// queued.
#[test]
fn a_cookie_copied_to_300_connections_admits_at_most_the_budget() {
    let node = InProcNode::start(
        "replay-shared",
        "total_active_users = 1\nnew_users_per_minute = 1\nsession_duration = 5",
    )
    .unwrap();
    let (admitted, cookie) = visit(&node);
    assert!(admitted);
    let mut conns: Vec<Conn> = (0..300).map(|_| Conn::open(node.http)).collect();
    let shared_before = node.node().defences.count(Defence::TicketShared);
    let admitted = conns
        .iter_mut()
        .map(|conn| conn.get(Some(&cookie)).admitted)
        .filter(|&admitted| admitted)
        .count();
    assert!(
        (1..=16).contains(&admitted),
        "{admitted} of 300 connections admitted with one cookie"
    );
    assert_eq!(
        node.node().defences.count(Defence::TicketShared) - shared_before,
        300 - admitted as u64
    );
}

/// The first connection of a copied cookie keeps it, request after request
/// within the same second (the node asks its ledger once per connection,
/// ticket and second), while each of 300 other connections, asking between
/// two of its requests, is still held to the budget: what the first one's
/// requests skip is never another connection's.
#[test]
fn a_cookie_kept_on_its_connection_does_not_open_the_budget_to_others() {
    let node = InProcNode::start(
        "replay-kept",
        "total_active_users = 1\nnew_users_per_minute = 1\nsession_duration = 5",
    )
    .unwrap();
    let (admitted, cookie) = visit(&node);
    assert!(admitted);
    let mut first = Conn::open(node.http);
    assert!(first.get(Some(&cookie)).admitted);
    let shared_before = node.node().defences.count(Defence::TicketShared);
    let mut others = 0;
    for _ in 0..300 {
        assert!(
            first.get(Some(&cookie)).admitted,
            "the first connection keeps its cookie"
        );
        if Conn::open(node.http).get(Some(&cookie)).admitted {
            others += 1;
        }
    }
    assert!(
        others < 16,
        "{others} of 300 other connections admitted with the first one's cookie"
    );
    assert_eq!(
        node.node().defences.count(Defence::TicketShared) - shared_before,
        300 - others
    );
}

/// A browser: eight kept-alive connections, one cookie jar, several rounds
/// of requests over a minute: admitted on every connection every time.
#[test]
fn a_browser_with_eight_connections_is_admitted_on_all_of_them() {
    let node = InProcNode::start(
        "replay-browser",
        "total_active_users = 1\nnew_users_per_minute = 1\nsession_duration = 5",
    )
    .unwrap();
    let (admitted, mut cookie) = visit(&node);
    assert!(admitted);
    let mut conns: Vec<Conn> = (0..8).map(|_| Conn::open(node.http)).collect();
    for round in 0..6 {
        for (i, conn) in conns.iter_mut().enumerate() {
            let answer = conn.get(Some(&cookie));
            assert!(answer.admitted, "round {round}, connection {i}");
            if let Some(renewed) = answer.cookie {
                cookie = renewed;
            }
        }
        node.advance(Duration::from_secs(12));
    }
    assert_eq!(node.node().defences.count(Defence::TicketShared), 0);
}

/// `ticket_binding = "network"`: a cookie works from its own /24 and is a
/// new visitor's from another (127.0.1.1 is loopback too, but another /24).
#[test]
fn a_bound_cookie_is_refused_from_another_network() {
    let node = InProcNode::start(
        "replay-binding",
        "total_active_users = 1\nnew_users_per_minute = 1\nsession_duration = 5\nticket_binding = \"network\"",
    )
    .unwrap();
    let (admitted, cookie) = visit(&node);
    assert!(admitted);
    assert!(
        Conn::open_from(node.http, "127.0.0.2")
            .get(Some(&cookie))
            .admitted,
        "the same /24"
    );
    let elsewhere = Conn::open_from(node.http, "127.0.1.1").get(Some(&cookie));
    assert!(
        !elsewhere.admitted,
        "another network: a new visitor, queued"
    );
    assert_eq!(node.node().defences.count(Defence::TicketBinding), 1);
    assert!(
        Conn::open(node.http).get(Some(&cookie)).admitted,
        "still good at home"
    );
}

/// The ledger lives in a file beside the counters: after a restart, a
/// replay of a cookie whose count was already moved still moves nothing.
#[test]
fn the_ledger_survives_a_restart() {
    let mut node = InProcNode::start(
        "replay-restart",
        "total_active_users = 1\nnew_users_per_minute = 1\nsession_duration = 5",
    )
    .unwrap();
    let start = node.now();
    let (admitted, cookie) = visit(&node);
    assert!(admitted);
    // Sessions shortened to four minutes; five minutes and 0.4 s on, the
    // session has ended, and its slot of five minutes still counts it.
    node.reconfigure(|c| c.replace("session_duration = 5", "session_duration = 4"))
        .unwrap();
    node.advance(Duration::from_millis(300_400 - (node.now().0 - start.0)));
    let expired_at = start.plus_minutes(5).expiry_slot();
    assert_eq!(node.now().expiry_slot(), expired_at);
    assert_eq!(counted_at(&node, expired_at), 1);
    let _ = Conn::open(node.http).get(Some(&cookie));
    assert_eq!(counted_at(&node, expired_at), 0, "ended, uncounted");
    node.restart().unwrap();
    assert_eq!(counted_at(&node, expired_at), 0, "the counters survive");
    let replayed_before = node.node().defences.count(Defence::TicketReplayed);
    for _ in 0..5 {
        let _ = Conn::open(node.http).get(Some(&cookie));
    }
    assert_eq!(
        counted_at(&node, expired_at),
        0,
        "the ledger survived: the replays moved nothing"
    );
    assert_eq!(
        node.node().defences.count(Defence::TicketReplayed) - replayed_before,
        5
    );
}

/// `--check` ⇔ start: a ledger file others may write is refused by both,
/// naming the counters file's key (the ledger lives beside it).
#[test]
fn check_refuses_a_ledger_file_others_may_write() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = waitroom_tests::procs::TempDir::new("ledger-perm");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let ledger = state.join("edge.counters.tickets");
    std::fs::write(&ledger, b"planted").unwrap();
    std::fs::set_permissions(&ledger, std::fs::Permissions::from_mode(0o666)).unwrap();
    let path = dir.path().join("edge.toml");
    std::fs::write(
        &path,
        format!(
            "[node]\nid = \"n\"\nlisten = \"127.0.0.1:0\"\nstate_dir = \"{}\"\n\n[[rooms]]\nid = \"shop\"\norigin = \"127.0.0.1:9\"\ntotal_active_users = 10\nnew_users_per_minute = 1\n",
            state.display()
        ),
    )
    .unwrap();
    let check = || {
        std::process::Command::new(waitroom_tests::procs::binary("waitroom-edge"))
            .args(["--check", "--config"])
            .arg(&path)
            .output()
            .unwrap()
    };
    let out = check();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains("node.counters_path") && stderr.contains("edge.counters.tickets"),
        "{stderr}"
    );
    std::fs::set_permissions(&ledger, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = check();
    assert!(
        out.status.success(),
        "an existing private file of another size is set aside at start, not refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
