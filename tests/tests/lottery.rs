//! Random queueing is a lottery among the waiting, not among requests
//! (issue 13, item 7), and one client address is issued new tickets at a
//! limited rate.
//!
//! Both run a node in the test process on a driven clock ([`InProcNode`]) in
//! front of the real demo origin, over real HTTP. Requests go through a tiny
//! client that binds the loopback address it is told (127.0.0.x), so that
//! distinct clients have distinct addresses, and that sends exactly the
//! cookie it is given: a client that never keeps its cookie sends none.
use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, SocketAddr, TcpStream},
    time::Duration,
};

use waitroom_common::time::UnixMillis;
use waitroom_tests::{
    edge::{QUEUE, SITE, client, get_text, metric},
    inproc::{InProcNode, START},
};

/// One answer, as the tiny client read it.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// Header lines as `(lower-case name, value)`.
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// `name=value` of the `Set-Cookie`, if any.
    fn cookie(&self) -> Option<String> {
        let value = self.header("set-cookie")?;
        Some(value.split(';').next()?.trim().to_owned())
    }

    fn admitted(&self) -> bool {
        self.status == 200 && self.body.contains(SITE)
    }

    fn queued(&self) -> bool {
        self.status == 200 && self.body.contains(QUEUE)
    }
}

/// `GET /` to `node` from the loopback address `from`, with `cookie` (or none).
fn get_from(from: IpAddr, node: SocketAddr, cookie: Option<&str>) -> Answer {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.bind(&SocketAddr::new(from, 0).into()).unwrap();
    socket.connect(&node.into()).unwrap();
    let mut stream: TcpStream = socket.into();
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let cookie = cookie.map_or(String::new(), |c| format!("Cookie: {c}\r\n"));
    write!(
        stream,
        "GET / HTTP/1.1\r\nHost: {node}\r\nConnection: close\r\n{cookie}\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").expect("a complete head");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

fn loopback(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

/// What the node's `/status` says room `shop` has waiting on this node.
fn node_waiting(node: &InProcNode) -> i64 {
    let status: serde_json::Value =
        serde_json::from_str(&get_text(&node.admin_url("/status"))).unwrap();
    status["rooms"][0]["node_waiting"].as_i64().unwrap()
}

fn new_ticket_rate_defended(node: &InProcNode) -> Option<f64> {
    let m = waitroom_tests::edge::get(&client(), &node.admin_url("/metrics")).1;
    metric(&m, "waitroom_defended_total{reason=\"new_ticket_rate\"}")
}

/// A queued visitor who keeps its cookie and checks in when its `Refresh` says.
#[derive(Debug)]
struct Honest {
    from: IpAddr,
    cookie: String,
    next_check_in: UnixMillis,
    admitted_at: Option<UnixMillis>,
}

impl Honest {
    fn follow(&mut self, answer: &Answer, now: UnixMillis) {
        if let Some(cookie) = answer.cookie() {
            self.cookie = cookie;
        }
        if answer.admitted() {
            self.admitted_at.get_or_insert(now);
            // Keeps browsing, so holds its slot to the end.
            self.next_check_in = UnixMillis(now.0 + 20_000);
            return;
        }
        assert!(self.admitted_at.is_none(), "lost its session: {answer:?}");
        assert!(answer.queued(), "{answer:?}");
        let refresh: u64 = answer
            .header("refresh")
            .and_then(|r| r.parse().ok())
            .expect("a queue page says when to come back");
        self.next_check_in = UnixMillis(now.0 + refresh * 1_000);
    }
}

/// Issue 13, item 7: a full random room; 30 honest visitors queue and check
/// in on time, one client drops its cookie and asks 20 times a second. Ten
/// sessions end over 120 s (four, four, two at three minute boundaries),
/// and whoever wins a slot keeps browsing, so exactly ten slots are
/// released in the 330 s the test runs. Before the
/// lottery rule the poller won all of them, every request being a fresh
/// lottery ticket; now its requests only join the queue, and it never
/// checks in, so it wins nothing (its fair share as one of 31 would be a
/// third of a slot) and the honest visitors win all ten.
#[test]
fn a_cookie_less_poller_wins_no_slot_from_the_waiting() {
    let node = InProcNode::start_with(
        "lottery",
        // The lottery rule alone: the per-address limit is tested below.
        "new_tickets_per_address_per_minute = 0",
        "total_active_users = 10\nnew_users_per_minute = 10\nsession_duration = 1\n\
         queueing_method = \"random\"\nrefresh_interval = 5",
    )
    .unwrap();
    let addr = node.http;
    // Ten holders fill the site at START (one second into a minute).
    let mut holders: Vec<String> = (0..10)
        .map(|i| {
            let answer = get_from(loopback(10 + i), addr, None);
            assert!(answer.admitted(), "holder {i}: {answer:?}");
            answer.cookie().unwrap()
        })
        .collect();
    // Thirty honest visitors queue behind them.
    node.advance(Duration::from_secs(1));
    let mut honest: Vec<Honest> = (0..30)
        .map(|i| {
            let from = loopback(100 + i);
            let answer = get_from(from, addr, None);
            let mut visitor = Honest {
                from,
                cookie: String::new(),
                next_check_in: node.now(),
                admitted_at: None,
            };
            visitor.follow(&answer, node.now());
            assert!(visitor.admitted_at.is_none(), "the site is full");
            visitor
        })
        .collect();
    let poller = loopback(250);

    // Sessions last a minute from the last request and count to the end of
    // their expiry slot (the second they end in). Holders that never come
    // back end 60 s after START; holders 4..=9 browse once more 59.5 s after
    // START (before their session ends) and end at 119.5 s; holders 8 and 9
    // again at 119.25 s and end at 179.25 s. Four slots come free at 60 s
    // after START, four at 119.5 s and two at 179.25 s.
    let renewals: [(u64, std::ops::Range<usize>); 2] = [(59_500, 4..10), (119_250, 8..10)];
    let mut renewed = [false; 2];

    const POLL: Duration = Duration::from_millis(50);
    let limit = START.0 + 330_000;
    let (mut poller_requests, mut poller_wins) = (0_u32, 0_u32);
    while node.now().0 < limit {
        let now = node.advance(POLL);
        for ((after, who), done) in renewals.iter().zip(&mut renewed) {
            if !*done && now.0 >= START.0 + after {
                *done = true;
                for i in who.clone() {
                    let answer = get_from(loopback(10 + i as u8), addr, Some(&holders[i]));
                    assert!(answer.admitted(), "holder {i} browses: {answer:?}");
                    if let Some(cookie) = answer.cookie() {
                        holders[i] = cookie;
                    }
                }
            }
        }
        let answer = get_from(poller, addr, None);
        poller_requests += 1;
        if answer.admitted() {
            poller_wins += 1;
        } else {
            assert!(answer.queued(), "{answer:?}");
        }
        for visitor in honest.iter_mut().filter(|v| v.next_check_in <= now) {
            let answer = get_from(visitor.from, addr, Some(&visitor.cookie));
            visitor.follow(&answer, now);
        }
    }
    let won: Vec<u64> = honest
        .iter()
        .filter_map(|v| v.admitted_at.map(|t| (t.0 - START.0) / 1_000))
        .collect();
    assert!(poller_requests > 6_000, "{poller_requests} polls");
    assert_eq!(
        poller_wins, 0,
        "the poller won {poller_wins} of the slots; honest visitors won at {won:?} s"
    );
    assert_eq!(won.len(), 10, "the honest visitors won every slot: {won:?}");
    let freed_by = |from: u64, to: u64| won.iter().filter(|&&t| (from..to).contains(&t)).count();
    assert!(
        won.iter().all(|&t| t >= 60)
            && freed_by(60, 119) == 4
            && freed_by(119, 179) == 4
            && freed_by(179, u64::MAX) == 2,
        "slots came free as the sessions ended: {won:?}"
    );
}

/// One address is issued at most its burst of new tickets, then one per
/// interval: over it, 429 with `Retry-After`, no cookie, not counted
/// waiting. Another address, and visitors with a ticket from the limited
/// one, are not affected; after `Retry-After` the address gets one again.
#[test]
fn new_tickets_are_limited_per_address() {
    let node = InProcNode::start_with(
        "ticket-rate",
        "new_tickets_per_address_per_minute = 6\nnew_tickets_burst_per_address = 3",
        "total_active_users = 1\nnew_users_per_minute = 1\nsession_duration = 5\nrefresh_interval = 5",
    )
    .unwrap();
    let addr = node.http;
    let (a, b) = (loopback(1), loopback(2));

    // A's burst of three: one admitted, two queued.
    let browsing = get_from(a, addr, None);
    assert!(browsing.admitted(), "{browsing:?}");
    let browsing = browsing.cookie().unwrap();
    let queued: Vec<String> = (0..2)
        .map(|_| {
            let answer = get_from(a, addr, None);
            assert!(answer.queued(), "{answer:?}");
            answer.cookie().unwrap()
        })
        .collect();
    assert_eq!(node_waiting(&node), 2);
    assert_eq!(new_ticket_rate_defended(&node), Some(0.0));

    // The fourth new ticket from A in the same instant: refused.
    let refused = get_from(a, addr, None);
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.cookie(), None, "no ticket issued");
    let retry_after: u64 = refused
        .header("retry-after")
        .and_then(|r| r.parse().ok())
        .expect("a Retry-After in seconds");
    assert_eq!(retry_after, 10, "one new ticket every 10 s at 6 a minute");
    assert_eq!(node_waiting(&node), 2, "the refused client is not waiting");
    assert_eq!(new_ticket_rate_defended(&node), Some(1.0));

    // A's visitors with tickets are untouched: browsing, and checking in.
    let again = get_from(a, addr, Some(&browsing));
    assert!(again.admitted(), "{again:?}");
    node.advance(Duration::from_secs(7));
    let check_in = get_from(a, addr, Some(&queued[0]));
    assert!(check_in.queued(), "{check_in:?}");
    // B is another client: its own budget.
    let other = get_from(b, addr, None);
    assert!(other.queued(), "{other:?}");
    assert!(other.cookie().is_some());
    assert_eq!(node_waiting(&node), 3);
    // Still too soon for A (7 of 10 s) ...
    assert_eq!(get_from(a, addr, None).status, 429);
    assert_eq!(new_ticket_rate_defended(&node), Some(2.0));
    // ... and after Retry-After, one new ticket again.
    node.advance(Duration::from_secs(3));
    let later = get_from(a, addr, None);
    assert!(later.queued(), "{later:?}");
    assert_eq!(node_waiting(&node), 4);
}
