//! The request path, top to bottom: find the room, open the visitor's cookie,
//! ask the admission engine, then proxy to the origin or answer with the queue.
//!
//! Nothing here waits on anything but the origin: the global state is an
//! `ArcSwap` load, the counters are atomics in shared memory, and the cookie
//! is sealed and opened in place. The one exception is bounded: a new
//! visitor who would be queued only because this node's promise ran out is
//! held for at most `lease_wait_ms` while the node asks for more (step 3,
//! `crate::gossip::lease`).
use std::{sync::atomic::Ordering::Relaxed, time::Instant};

use crate::http::h1::{Answer, HeadLines, ReqBody};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Uri, header};
use waitroom_common::{
    engine::{self, Decision, Visitor},
    estimate::WaitEstimate,
    room::{CookieSameSite, CookieSecure, QueueingMethod, Room, TicketBinding},
    room_table::OriginCommand,
    ticket::Ticket,
    time::{EXPIRY_SLOT_MILLIS, UnixMillis},
};

use waitroom_runtime::{
    admin::text,
    body::{Body, full},
};

use crate::{
    access_log::{self, Outcome, Trace},
    bypass, cookie,
    forwarded::Forwarding,
    http::ConnInfo,
    metrics::{CookieFailure, Defence, Latency, RoomCount},
    node::{Node, RoomLive, RoomRuntime},
    pages, proxy,
    queue_page::{self, QueueView},
    target,
    unrouted::UnroutedOutcome,
    upgrade,
};

/// Per-worker state: the connection pool to origins (never shared across cores).
#[derive(Debug)]
pub struct Worker {
    pub index: usize,
    client: proxy::OriginClient,
    /// Connections this worker accepted, for [`Worker::next_connection_id`].
    connections: std::sync::atomic::AtomicU64,
    /// This worker's access log queue; `None`: the log is off.
    access_log: Option<access_log::WorkerLog>,
}

impl Worker {
    pub fn new(index: usize, node: &Node) -> Self {
        Self {
            index,
            client: proxy::client(std::time::Duration::from_secs(3), &node.origin_tls),
            connections: std::sync::atomic::AtomicU64::new(0),
            access_log: node.access_log.for_worker(index),
        }
    }

    /// A connection id unique on this node: the worker index in the top 16
    /// bits, this worker's count of connections below.
    pub fn next_connection_id(&self) -> u64 {
        let n = self.connections.fetch_add(1, Relaxed) & ((1 << 48) - 1);
        (self.index as u64) << 48 | n
    }
}

/// Handles one request. Never fails: every problem becomes a response.
/// With the access log on, what the line needs is copied from the head
/// first and the record queued after the answer (`crate::access_log`).
#[expect(
    clippy::manual_async_fn,
    reason = "an `async fn` stores its arguments twice in its future (rust-lang/rust#62958)"
)]
pub fn handle(
    node: &Node,
    worker: &Worker,
    req: Request<ReqBody>,
    conn: ConnInfo,
    scheme: &'static str,
) -> impl Future<Output = Answer<Body>> {
    // Not an `async fn`: see `to_origin`.
    async move {
        let mut lines = None;
        let mut logged = worker.access_log.as_ref().map(|log| {
            let started = Instant::now();
            (
                log,
                started,
                access_log::Record::from_request(&req, conn.client),
            )
        });
        let mut untraced = Trace::default();
        let trace = match &mut logged {
            Some((_, _, record)) => &mut record.trace,
            None => &mut untraced,
        };
        let resp = answer(node, worker, req, conn, scheme, trace, &mut lines).await;
        if let Some((log, started, mut record)) = logged {
            record.status = resp.status().as_u16();
            record.bytes = hyper::body::Body::size_hint(resp.body()).exact();
            record.total_micros = started.elapsed().as_micros() as u64;
            log.push(record);
        }
        (resp, lines)
    }
}

/// The request path proper; `trace` gathers what the access log says of it,
/// `lines` the fields of the answer already written (the queue page's).
#[expect(
    clippy::manual_async_fn,
    reason = "an `async fn` stores its arguments twice in its future (rust-lang/rust#62958)"
)]
fn answer(
    node: &Node,
    worker: &Worker,
    mut req: Request<ReqBody>,
    conn: ConnInfo,
    scheme: &'static str,
    trace: &mut Trace,
    lines: &mut Option<HeadLines>,
) -> impl Future<Output = Response<Body>> {
    // Not an `async fn`: see `to_origin` (the request was held three times).
    async move {
        // 0. A request that already passed this node stops here; the client is
        //    who a trusted proxy says it is (`crate::forwarded`).
        if node.settings.via.seen_in(req.headers()) {
            node.defences.record(
                Defence::Loop,
                node.clock.now().0 / 1_000,
                Some(conn.client),
                "a request came back carrying this node's own Via: 508",
            );
            trace.outcome = Outcome::Loop;
            return proxy::loop_detected();
        }
        let hop = conn.client;
        let conn = ConnInfo {
            client: node.settings.trusted_proxies.resolve(hop, req.headers()),
            ..conn
        };
        trace.client = Some(conn.client);

        // 1. The room, by the one spelling of the target (`crate::target`); the
        //    origin gets that spelling too.
        let (index, rewrite, bypassed, live) = match target::normalize(req.uri(), req.headers()) {
            Ok(t) => {
                let Some(index) = node.routes.route(&t) else {
                    node.metrics.requests_unmatched.fetch_add(1, Relaxed);
                    // Slashes as sent: no room says to merge them.
                    let spelling = (t.path_and_query(false), t.host_header());
                    respell(&mut req, spelling);
                    // Boxed: the rare path's state stays out of every
                    // request's future (each byte of it is moved per request).
                    return Box::pin(unrouted(node, worker, req, conn, hop, scheme, trace, lines))
                        .await;
                };
                let merge = node.rooms[index].spec.merge_slashes;
                let changed = req.uri().authority().is_some()
                    || matches!(t.host, std::borrow::Cow::Owned(_))
                    || t.path(merge) != req.uri().path();
                // The room's live settings, loaded once for the whole request
                // (bypass rules, the decision, both sides of the origin's
                // answer): a reload while the request is at the origin takes
                // effect from the next request, and the request pays one
                // load (each is a fenced write to the thread's debt slot).
                let live = node.rooms[index].live.load_full();
                // Bypass rules see the spelling that was routed and is forwarded.
                let rules = &live.bypass;
                let bypassed = !rules.is_empty()
                    && rules
                        .find(&bypass::Probe {
                            method: req.method(),
                            path: t.path(merge),
                            headers: req.headers(),
                            client: conn.client,
                        })
                        .is_some();
                (
                    index,
                    changed.then(|| (t.path_and_query(merge), t.host_header())),
                    bypassed,
                    live,
                )
            }
            Err(err) => {
                node.refused_targets.record(err, node.clock.now().0 / 1_000);
                trace.outcome = Outcome::BadTarget;
                return bad_target(err);
            }
        };
        if let Some(spelling) = rewrite {
            respell(&mut req, spelling);
        }
        let room = &node.rooms[index];
        trace.room = Some(index as u16);

        // 1b. A bypass rule, or (1c) a suspended room (Cloudflare's
        //     `suspended`: out of the way, as if no room covered it): to the
        //     origin without a ticket, nothing counted. No ticket: nothing for
        //     an origin command to act on (its header is still removed).
        let through = if bypassed {
            Some(Outcome::Bypassed)
        } else if live.suspended {
            Some(Outcome::Suspended)
        } else {
            None
        };
        if let Some(outcome) = through {
            trace.outcome = outcome;
            let to = OriginCall {
                hop,
                scheme,
                now: node.clock.now(),
                live: &live,
                trace,
                lines,
            };
            return Box::pin(to_origin(node, worker, room, req, conn, to))
                .await
                .0;
        }
        let now = node.clock.now();
        // The room as it stands now: a scheduled event's overrides (`Room::at`).
        let engine_room = &live.engine.at(now);

        // 2. The ticket: whatever does not open is a new visitor, counted by why.
        let started = Instant::now();
        let now_secs = now.0 / 1_000;
        let config = engine_room.config();
        let mut ticket = open_ticket(node, room, engine_room, req.headers(), now, conn.id);
        // A ticket from another network (`ticket_binding`), or on more
        // connections than its budget (a copied cookie): a new visitor's.
        if let Some(t) = ticket {
            if config.ticket_binding == TicketBinding::Network
                && t.network != 0
                && t.network != t.network_tag(conn.client)
            {
                node.defences.record(
                    Defence::TicketBinding,
                    now_secs,
                    Some(conn.client),
                    "ticket bound to another network: served as a new visitor",
                );
                ticket = None;
            } else if !ticket_allowed_on(
                node,
                t.id,
                conn.id,
                now_secs,
                config.ticket_connection_budget,
                config.ticket_connection_window_secs,
            ) {
                node.defences.record(
                    Defence::TicketShared,
                    now_secs,
                    Some(conn.client),
                    "ticket on more connections than its budget: served as a new visitor",
                );
                ticket = None;
            }
        }
        let presented = ticket;

        // 2b. A new ticket for this client address, if the room queues and the
        //     engine is going to make a new visitor of this request (no usable
        //     ticket, or a session that ended): within the address's limit, or a
        //     429 with nothing issued and no counter moved. Asked here, before
        //     the engine, because afterwards its counts would already have moved.
        if node.new_tickets.is_on()
            && matches!(
                engine_room.queueing_method(),
                QueueingMethod::Fifo | QueueingMethod::Random
            )
            && engine::is_new_visitor(engine_room, ticket.as_ref(), now)
            && let Err(wait_ms) = node.new_tickets.take(conn.client, now)
        {
            node.defences.record(
                Defence::NewTicketRate,
                now_secs,
                Some(conn.client),
                "too many new tickets for one client address",
            );
            trace.outcome = Outcome::TooManyNewTickets;
            let view = pages::StatusView::new(
                pages::Reason::TooManyNewVisitors,
                429,
                wait_ms.div_ceil(1_000).max(1),
            );
            return status_page(Some(&live), &room.spec.id, view, wants_json(req.headers()));
        }

        // 3. The decision; counts move by the ticket ledger, not the cookie alone.
        //    A new visitor short of slots only because this node's promise ran
        //    out is first held (at most `lease_wait_ms`, one ask for every held
        //    visitor) while the node asks the aggregator for more; the engine
        //    then decides with whatever state there is.
        let mut now = now;
        if let Some(lease) = node.gossip.as_ref().map(|g| &g.lease)
            && lease.holding()
            && engine::is_new_visitor(engine_room, ticket.as_ref(), now)
            && engine::short_of_slots(
                engine_room,
                &room.state.load(),
                node.room_counters(index),
                now,
            )
        {
            // Counted as held while it waits, so the ask reads as this
            // visitor's need; noted as a visitor when the engine decides.
            // Held until an answer counted them, or an earlier one gave room.
            let _held = node.room_counters(index).hold_visitor(now.minute());
            lease
                .hold(|| {
                    engine::short_of_slots(
                        engine_room,
                        &room.state.load(),
                        node.room_counters(index),
                        node.clock.now(),
                    )
                })
                .await;
            now = node.clock.now();
        }
        let state = room.state.load();
        let (mut decision, noted) = engine::decide_noting(
            engine_room,
            &state,
            node.room_counters(index),
            node.ledger(),
            ticket,
            now,
            rand::random(),
        );
        if noted.replayed {
            node.defences.record(
                Defence::TicketReplayed,
                now_secs,
                Some(conn.client),
                "stale or replayed ticket: its counts were not moved again",
            );
        }
        let issued = decision.ticket_mut();
        if config.ticket_binding == TicketBinding::Network && issued.network == 0 {
            issued.network = issued.network_tag(conn.client);
        }
        if presented.is_none_or(|p| p.id != issued.id) {
            // A new ticket's first connection counts against its budget too.
            let _ = node.ledger().note_connection(
                issued.id,
                conn.id,
                now_secs,
                config.ticket_connection_budget,
                config.ticket_connection_window_secs,
            );
        }
        let set_cookie = if cookie_still_good(presented.as_ref(), &decision) {
            None
        } else {
            set_cookie_header(node, room, engine_room, decision.ticket(), scheme)
        };
        room.metrics.observe(Latency::Decision, started.elapsed());
        trace.bucket = Some(decision.ticket().bucket.0);

        // 4. The answer.
        match decision {
            Decision::Admit {
                visitor, ticket, ..
            } => {
                trace.outcome = Outcome::Admitted;
                trace.visitor = Some(visitor.into());
                room.metrics.count(if visitor == Visitor::Admitted {
                    RoomCount::AdmittedReturning
                } else {
                    RoomCount::AdmittedNew
                });
                // Boxed here and at the other two calls: inline, the origin
                // exchange's future made this one 12 KB (1.9 KB so), and a
                // request's future is moved whole more than once (hyper's
                // dispatch, each await that starts it): ~2,000 instructions of
                // `memcpy` a proxied request, against one allocation.
                let to = OriginCall {
                    hop,
                    scheme,
                    now,
                    live: &live,
                    trace,
                    lines,
                };
                let (mut resp, command) =
                    Box::pin(to_origin(node, worker, room, req, conn, to)).await;
                // 5. The origin's `revoke`: the session ends now, its slot is free,
                //    and the browser forgets the cookie (a kept copy is a new
                //    visitor's, see `engine::revoke`).
                let set_cookie = if command == Some(OriginCommand::Revoke)
                    && engine::revoke(node.room_counters(index), node.ledger(), &ticket, now)
                {
                    room.metrics.count(RoomCount::Revoked);
                    clear_cookie_header(room, engine_room, scheme)
                } else {
                    set_cookie.and_then(|c| c.header_value())
                };
                if let Some(c) = set_cookie {
                    resp.headers_mut().append(header::SET_COOKIE, c);
                }
                resp
            }
            Decision::Queue {
                ticket,
                estimate,
                visitor,
                ..
            } => {
                trace.outcome = Outcome::Queued;
                trace.visitor = Some(visitor.into());
                room.metrics.count(RoomCount::Queued);
                let wants_json = wants_json(req.headers());
                let language = if wants_json {
                    None
                } else {
                    live.language_of(req.headers())
                };
                let ask = Ask {
                    json: wants_json,
                    language,
                };
                let (resp, head) =
                    queue_response(room, &live, &ticket, &estimate, now, ask, set_cookie);
                *lines = Some(head);
                resp
            }
            Decision::Reject { visitor, .. } => {
                trace.outcome = Outcome::Rejected;
                trace.visitor = Some(visitor.into());
                room.metrics.count(RoomCount::Rejected);
                let mut view = pages::StatusView::new(pages::Reason::Rejected, 403, 0);
                view.queueing_method = "reject".into();
                let mut resp =
                    status_page(Some(&live), &room.spec.id, view, wants_json(req.headers()));
                if let Some(c) = set_cookie.and_then(|c| c.header_value()) {
                    resp.headers_mut().append(header::SET_COOKIE, c);
                }
                resp
            }
        }
    }
}

/// Gives `req` the normalized target: `(path and query, Host)`.
fn respell(req: &mut Request<ReqBody>, (path_and_query, host): (String, String)) {
    if let Ok(uri) = Uri::try_from(path_and_query) {
        *req.uri_mut() = uri;
    }
    match HeaderValue::try_from(host) {
        Ok(h) if !h.is_empty() => {
            req.headers_mut().insert(header::HOST, h);
        }
        _ => {}
    }
}

/// A request no room covers: 404, or the default origin
/// (`[node.unrouted]`, see `crate::unrouted`) as a bypassed request goes
/// to its room's: no cookie opened, no ticket, nothing counted.
#[expect(
    clippy::too_many_arguments,
    reason = "the request's whole context, passed down once"
)]
async fn unrouted(
    node: &Node,
    worker: &Worker,
    req: Request<ReqBody>,
    conn: ConnInfo,
    hop: std::net::IpAddr,
    scheme: &'static str,
    trace: &mut Trace,
    lines: &mut Option<HeadLines>,
) -> Response<Body> {
    let Some(upstream) = &node.unrouted.origin else {
        node.unrouted.count(UnroutedOutcome::NotFound);
        return not_covered();
    };
    trace.outcome = Outcome::DefaultOrigin;
    let json = wants_json(req.headers());
    let started = Instant::now();
    let result = forward(
        node,
        worker,
        upstream,
        node.unrouted.timeout,
        req,
        conn,
        (hop, scheme, None, node.clock.now()),
    )
    .await;
    trace.upstream_micros = Some(started.elapsed().as_micros() as u64);
    match result {
        Ok((resp, head)) => {
            node.unrouted.count(UnroutedOutcome::Proxied);
            trace.upstream_status = Some(resp.status().as_u16());
            *lines = head;
            resp
        }
        Err(err) => {
            node.unrouted.count(UnroutedOutcome::OriginError);
            match proxy::failure(&err) {
                Some(view) => status_page(None, "", view, json),
                None => proxy::error_page(&err),
            }
        }
    }
}

/// Sends `req` to an origin of `upstream` with the forwarding headers of
/// this hop (the peer it came from, its scheme): an upgrade through
/// `crate::upgrade`, anything else through `proxy::forward`, which leaves
/// the room's origin-command field out of a plain-HTTP origin's lines.
#[expect(
    clippy::manual_async_fn,
    reason = "an `async fn` stores its arguments twice in its future (rust-lang/rust#62958)"
)]
fn forward(
    node: &Node,
    worker: &Worker,
    upstream: &std::sync::Arc<crate::upstream::Upstream>,
    timeout: std::time::Duration,
    req: Request<ReqBody>,
    conn: ConnInfo,
    (hop, scheme, command, now): (
        std::net::IpAddr,
        &'static str,
        Option<&http::HeaderName>,
        UnixMillis,
    ),
) -> impl Future<Output = Result<Answer<Body>, proxy::ProxyError>> {
    // Not an `async fn`: see `to_origin`.
    async move {
        let origin_request = proxy::OriginRequest {
            forwarding: Forwarding {
                client: conn.client,
                hop,
                trusted: node.settings.trusted_proxies.contains(hop),
                scheme,
            },
            via: &node.settings.via,
            defences: &node.defences,
            now_secs: now.0 / 1_000,
            command,
        };
        // A request of the plain exchange (`h1`, an empty body) is no
        // upgrade: that exchange hands every `Upgrade` to hyper. Asked of
        // hyper's requests only (~110 instructions of map lookups).
        debug_assert!(matches!(req.body(), ReqBody::Hyper(_)) || !upgrade::is_upgrade(&req));
        if matches!(req.body(), ReqBody::Hyper(_)) && upgrade::is_upgrade(&req) {
            // Boxed: rare, and its future would be copied with every request's.
            Box::pin(upgrade::forward(
                &worker.client,
                upstream,
                timeout,
                req,
                &origin_request,
            ))
            .await
            .map(|resp| (resp, None))
        } else {
            proxy::forward(&worker.client, upstream, timeout, req, &origin_request).await
        }
    }
}

/// What [`to_origin`] needs of the request's context besides the request:
/// the peer it came from, its scheme, the room's live settings the request
/// was decided with, the access log's trace and where the answer's lines go.
struct OriginCall<'a> {
    hop: std::net::IpAddr,
    scheme: &'static str,
    /// The node's time the request was decided at (its defences' stamp).
    now: UnixMillis,
    live: &'a RoomLive,
    trace: &'a mut Trace,
    lines: &'a mut Option<HeadLines>,
}

/// Forwards the request to one of the room's origins (`proxy::forward`),
/// timing it; a failure becomes its error page. The room's origin-command
/// header goes from the request and from the response; the allowed command
/// the origin gave is returned beside the response.
#[expect(
    clippy::manual_async_fn,
    reason = "an `async fn` stores its arguments twice in its future (rust-lang/rust#62958)"
)]
fn to_origin(
    node: &Node,
    worker: &Worker,
    room: &RoomRuntime,
    mut req: Request<ReqBody>,
    conn: ConnInfo,
    to: OriginCall<'_>,
) -> impl Future<Output = (Response<Body>, Option<OriginCommand>)> {
    // An `async fn` keeps each argument twice in its future (the argument
    // and the body's binding of it, rust-lang/rust#62958): the request's
    // 264 bytes once more in every future that holds this one, all moved
    // per request. The block uses the captured arguments as they are.
    async move {
        let OriginCall {
            hop,
            scheme,
            now,
            live,
            trace,
            lines,
        } = to;
        // Read before the request goes: an error page answers in kind.
        let json = wants_json(req.headers());
        // The room's live settings the request was decided with serve both
        // sides of the origin's answer (the caller holds them, an `Arc`, not
        // an arc-swap guard, which would take one of the thread's few fast
        // slots for as long): the command field is stripped from the request
        // and taken from the answer by the same name, whatever a reload
        // renames meanwhile. The name goes with the request (a clone of
        // shared bytes): a plain-HTTP origin's answer is read without it.
        live.origin_commands.strip_request(req.headers_mut());
        let command = live.origin_commands.header().clone();
        let proxy_started = Instant::now();
        let (upstream, timeout) = (&room.upstream, room.spec.origin_timeout);
        let at = (hop, scheme, Some(&command), now);
        let result = forward(node, worker, upstream, timeout, req, conn, at).await;
        let proxy_time = proxy_started.elapsed();
        room.metrics.observe(Latency::Proxy, proxy_time);
        trace.upstream_micros = Some(proxy_time.as_micros() as u64);
        match result {
            Ok((mut resp, head)) => {
                trace.upstream_status = Some(resp.status().as_u16());
                let command = match head {
                    Some(mut head) => {
                        let command = live.origin_commands.take_lines(&mut head);
                        *lines = Some(head);
                        command
                    }
                    None => live.origin_commands.take(resp.headers_mut()),
                };
                (resp, command)
            }
            Err(err) => {
                room.metrics
                    .count(if matches!(err, proxy::ProxyError::ClientBody { .. }) {
                        RoomCount::ClientBodyErrors
                    } else {
                        RoomCount::ProxyErrors
                    });
                let resp = match proxy::failure(&err) {
                    Some(view) => status_page(Some(live), &room.spec.id, view, json),
                    None => proxy::error_page(&err),
                };
                (resp, None)
            }
        }
    }
}

/// Slots of a worker thread's [`NOTED`] cache, chosen by connection id.
const NOTED_SLOTS: usize = 64;

thread_local! {
    /// Per slot, the last `(connection, ticket, second)` the ledger let
    /// through ([`ticket_allowed_on`]).
    static NOTED: std::cell::RefCell<[(u64, u64, u64); NOTED_SLOTS]> =
        const { std::cell::RefCell::new([(0, 0, 0); NOTED_SLOTS]) };
}

/// Whether ticket `id` may be used on connection `conn`
/// (`Ledger::note_connection`: within its budget of connections), asked of
/// the ledger once per connection, ticket and second. The ledger stamps a
/// connection's use to the second, so the next request of the same
/// connection with the same ticket in the same second would write the same
/// stamp into its own live slot and be let through again: a browser's
/// kept-alive connection skips the ledger's keyed hashes and row walk
/// (about 1,800 instructions, issue 17) on all but its first request of
/// each second. Refusals are never remembered, and another connection
/// (even one sharing the slot) always asks the ledger.
fn ticket_allowed_on(
    node: &Node,
    id: u64,
    conn: u64,
    now_secs: u64,
    budget: u16,
    window_secs: u16,
) -> bool {
    let slot = (conn % NOTED_SLOTS as u64) as usize;
    let key = (conn, id, now_secs);
    if NOTED.with_borrow(|noted| noted[slot] == key) {
        return true;
    }
    let allowed = node
        .ledger()
        .note_connection(id, conn, now_secs, budget, window_secs);
    if allowed {
        NOTED.with_borrow_mut(|noted| noted[slot] = key);
    }
    allowed
}

/// Opens the room's cookie into a ticket, counting every failure.
fn open_ticket(
    node: &Node,
    room: &RoomRuntime,
    engine_room: &Room,
    headers: &HeaderMap,
    now: UnixMillis,
    conn_id: u64,
) -> Option<Ticket> {
    let value = cookie::find(headers, &room.cookie_name)?;
    // Opened once per connection while the value stays the same (`cookie`).
    let ticket = match node.keys.load().open_ticket(&room.spec.id, value, conn_id) {
        Ok(t) => t,
        Err(why) => {
            room.metrics.cookie_failure(why);
            return None;
        }
    };
    if ticket.room != engine_room.id() {
        room.metrics.cookie_failure(CookieFailure::OtherRoom);
        return None;
    }
    // A session that ended makes a new visitor in the engine; count it here.
    if let Some(end) =
        ticket.session_end(engine_room.session_minutes(), engine_room.session_renewal())
        && now >= end
    {
        room.metrics.cookie_failure(CookieFailure::Expired);
    }
    Some(ticket)
}

/// How stale a browsing visitor's cookie may get before it is sealed anew.
const RESEAL_AFTER_MS: u64 = 30_000;

/// A returning admitted visitor's cookie needs no new seal while it was
/// sealed less than [`RESEAL_AFTER_MS`] ago and its counted expiry slot lags
/// the renewed one by less than that: the session it proves ends at most
/// that much earlier than the renewed one. Saves an AEAD seal and a header
/// on most requests of a visitor who is browsing.
///
/// Since expiries are counted per second the cookie's claim of where the
/// session is counted lags by up to those 30 s (with minutes it was exact).
/// Only a node whose ledger does not know the ticket believes the claim: it
/// then takes the count from the earlier slot while the session is counted
/// at the later one, so the session counts twice for at most 30 s and is
/// never uncounted early (too few slots, never too many).
fn cookie_still_good(presented: Option<&Ticket>, decision: &Decision) -> bool {
    let (
        Some(old),
        Decision::Admit {
            ticket: new,
            visitor: Visitor::Admitted,
            ..
        },
    ) = (presented, decision)
    else {
        return false;
    };
    let expiry_close = match (old.counted_expiry, new.counted_expiry) {
        (Some(old), Some(new)) => {
            new >= old && (new.0 - old.0) * EXPIRY_SLOT_MILLIS < RESEAL_AFTER_MS
        }
        (old, new) => old == new,
    };
    expiry_close
        && old.accepted_at == new.accepted_at
        && old.id == new.id
        && old.network == new.network
        && new.last_check_in.0.saturating_sub(old.last_check_in.0) < RESEAL_AFTER_MS
}

/// How long a queued visitor's cookie lives: their place in the queue,
/// however long the wait (seconds).
const QUEUED_COOKIE_MAX_AGE_SECS: u64 = 86_400;

/// The cookie's `Max-Age` (seconds): an admitted visitor's cookie lives as
/// long as their session (seed 002: "expire Session Duration minutes from
/// when we last saw them"), plus the [`RESEAL_AFTER_MS`] by which a cookie
/// that was not sealed anew may lag the session the node counts, so the
/// browser never forgets a session the node still holds. A queued visitor's
/// lives a day.
fn cookie_max_age(ticket: &Ticket, room: &Room, now: UnixMillis) -> u64 {
    match ticket.session_end(room.session_minutes(), room.session_renewal()) {
        Some(end) => (end.0.saturating_sub(now.0) + RESEAL_AFTER_MS).div_ceil(1_000),
        None => QUEUED_COOKIE_MAX_AGE_SECS,
    }
}

/// A `Set-Cookie` value written on the stack (a ticket's is about 200
/// bytes): the queue page copies it into its head's lines as it stands, the
/// other answers make it a [`HeaderValue`]. Every byte is a header value's:
/// the cookie's name is made of letters, digits and `_`
/// ([`cookie::cookie_name`]), its path is escaped (`rooms::RoomSpec`), the
/// value is base64url.
#[expect(
    clippy::large_enum_variant,
    reason = "the line on the stack is the point; it lives for one request"
)]
enum CookieLine {
    Stack {
        bytes: [u8; COOKIE_ON_STACK],
        len: usize,
    },
    /// A line longer than [`COOKIE_ON_STACK`] (a long room name or path).
    Heap(Vec<u8>),
}

/// Bytes of a `Set-Cookie` value kept on the stack.
const COOKIE_ON_STACK: usize = 256;

impl CookieLine {
    fn new() -> Self {
        Self::Stack {
            bytes: [0; COOKIE_ON_STACK],
            len: 0,
        }
    }

    /// Appends `more` (on the stack while it fits: `SmallVec`'s
    /// `extend_from_slice` cost a tenth of the whole function).
    fn push(&mut self, more: &[u8]) {
        if let Self::Stack { bytes, len } = self {
            if let Some(to) = bytes.get_mut(*len..*len + more.len()) {
                to.copy_from_slice(more);
                *len += more.len();
                return;
            }
            let mut heap = Vec::with_capacity(*len + more.len() + 64);
            heap.extend_from_slice(&bytes[..*len]);
            *self = Self::Heap(heap);
        }
        if let Self::Heap(heap) = self {
            heap.extend_from_slice(more);
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Stack { bytes, len } => &bytes[..*len],
            Self::Heap(heap) => heap,
        }
    }

    fn header_value(&self) -> Option<HeaderValue> {
        HeaderValue::from_bytes(self.as_bytes()).ok()
    }
}

/// `Set-Cookie` for the visitor's updated ticket.
fn set_cookie_header(
    node: &Node,
    room: &RoomRuntime,
    engine_room: &Room,
    ticket: &Ticket,
    scheme: &str,
) -> Option<CookieLine> {
    // On the stack: `to_allocvec` grew a vector a byte at a time.
    let mut buf = [0u8; 128];
    let bytes = postcard::to_slice(ticket, &mut buf).ok()?;
    let config = engine_room.config();
    let https = scheme == "https";
    let secure = match config.cookie_secure {
        CookieSecure::Always => true,
        CookieSecure::Never => false,
        CookieSecure::Auto => https,
    }
    // Browsers drop `SameSite=None` without `Secure`: it always carries it
    // (over plain HTTP the browser then refuses the cookie; such a room
    // belongs behind HTTPS, see docs/OPERATIONS.md).
        || config.cookie_same_site == CookieSameSite::None;
    let same_site: &[u8] = match config.cookie_same_site {
        CookieSameSite::Lax => b"Lax",
        CookieSameSite::Strict => b"Strict",
        CookieSameSite::None => b"None",
        // SameSite=None needs Secure; over plain HTTP browsers would drop it.
        CookieSameSite::Auto => {
            if secure {
                b"None"
            } else {
                b"Lax"
            }
        }
    };
    let max_age = cookie_max_age(ticket, engine_room, node.clock.now());
    // `<name>=<value>; Path=<path>; Max-Age=<s>; HttpOnly; SameSite=<s>[; Secure]`,
    // written into one buffer on the stack, which the queue page copies as
    // it stands: no `String`, no `HeaderValue` check of its ~200 bytes
    // (issue 17; the cipher, base64 and postcard are most of the rest).
    let mut text = CookieLine::new();
    text.push(room.cookie_name.as_bytes());
    text.push(b"=");
    node.keys
        .load()
        .seal_with(&room.spec.id, bytes, |v| text.push(v))?;
    text.push(b"; Path=");
    text.push(room.spec.cookie_path.as_bytes());
    text.push(b"; Max-Age=");
    text.push(itoa::Buffer::new().format(max_age).as_bytes());
    text.push(b"; HttpOnly; SameSite=");
    text.push(same_site);
    if secure {
        text.push(b"; Secure");
    }
    debug_assert!(text.header_value().is_some());
    Some(text)
}

/// `Set-Cookie` that makes the browser forget the room's cookie.
fn clear_cookie_header(
    room: &RoomRuntime,
    engine_room: &Room,
    scheme: &str,
) -> Option<HeaderValue> {
    let secure = match engine_room.config().cookie_secure {
        CookieSecure::Always => true,
        CookieSecure::Never => false,
        CookieSecure::Auto => scheme == "https",
    };
    let mut text = format!(
        "{}=; Path={}; Max-Age=0; HttpOnly; SameSite=Lax",
        room.cookie_name, room.spec.cookie_path
    );
    if secure {
        text.push_str("; Secure");
    }
    HeaderValue::from_str(&text).ok()
}

fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/json"))
}

/// The queue page (or JSON) for a queued visitor, and its fields written.
fn queue_response(
    room: &RoomRuntime,
    live: &RoomLive,
    ticket: &Ticket,
    estimate: &WaitEstimate,
    now: UnixMillis,
    ask: Ask,
    set_cookie: Option<CookieLine>,
) -> (Response<Body>, HeadLines) {
    let engine = live.engine.at(now);
    let mut view = queue_view(room, &engine, ticket, estimate, now);
    view.language = live.language_tag(ask.language).to_owned();
    let body = if ask.json {
        queue_page::json_body(&view, &live.json_envelope)
    } else {
        queue_page::page_body(live.page_in(&engine, ask.language), &view)
    };
    let mut resp = Response::new(full(body));
    *resp.status_mut() = StatusCode::from_u16(live.queue_status).unwrap_or(StatusCode::OK);
    // Written as lines, not inserted into the map (`h1::HeadLines`); what
    // never changes as one slice (a line at a time cost 600 instructions).
    let mut lines =
        Vec::with_capacity(200 + set_cookie.as_ref().map_or(0, |c| c.as_bytes().len() + 14));
    lines.extend_from_slice(if ask.json {
        b"content-type: application/json\r\ncache-control: no-store\r\nrefresh: "
    } else {
        b"content-type: text/html; charset=utf-8\r\ncache-control: no-store\r\nrefresh: "
    });
    let mut digits = itoa::Buffer::new();
    let interval = digits.format(ticket.refresh_interval_secs).as_bytes();
    lines.extend_from_slice(interval);
    // For clients that know `Retry-After` rather than `Refresh`; and the
    // answer is HTML or JSON by `Accept`, which a cache must key on.
    lines.extend_from_slice(b"\r\nretry-after: ");
    lines.extend_from_slice(interval);
    lines.extend_from_slice(if live.languages.is_empty() {
        b"\r\nvary: Accept\r\n"
    } else {
        b"\r\nvary: Accept, Accept-Language\r\n"
    });
    if let Some(c) = set_cookie {
        HeadLines::push(&mut lines, &header::SET_COOKIE, c.as_bytes());
    }
    (resp, HeadLines::done(lines))
}

/// How a visitor asked to be answered: JSON (`Accept`), and which of the
/// room's languages (`Accept-Language`; `None`: the default).
#[derive(Clone, Copy, Debug)]
struct Ask {
    json: bool,
    language: Option<usize>,
}

/// A reject or error page, or its JSON, from the room's template (`live`;
/// `None` where no room covers the request: the built-in error page under
/// the default envelope). `Cache-Control: no-store`, `Vary: Accept`, and
/// `Retry-After` where the view says when to try again.
fn status_page(
    live: Option<&RoomLive>,
    room_name: &str,
    mut view: pages::StatusView,
    json: bool,
) -> Response<Body> {
    static BUILTIN_ERROR: std::sync::LazyLock<pages::StatusPage> =
        std::sync::LazyLock::new(pages::StatusPage::builtin_error);
    let (page, envelope, language) = match live {
        Some(l) => (
            if view.is_rejected {
                &l.reject_page
            } else {
                &l.error_page
            },
            l.json_envelope.as_str(),
            l.default_language.as_str(),
        ),
        None => (
            &*BUILTIN_ERROR,
            waitroom_common::room_table::DEFAULT_JSON_ENVELOPE,
            waitroom_common::room_table::DEFAULT_TEMPLATE_LANGUAGE,
        ),
    };
    if let Some(l) = live {
        view.queueing_method = l.engine.queueing_method().name().into();
    }
    view.language = language.to_owned();
    view.room = room_name.to_owned();
    let (body, content_type) = if json {
        (pages::json_in(&view, envelope), "application/json")
    } else {
        (page.render(&view), "text/html; charset=utf-8")
    };
    let mut resp = Response::new(full(body));
    *resp.status_mut() = StatusCode::from_u16(view.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::VARY, HeaderValue::from_static("Accept"));
    if view.retry_after_seconds > 0 {
        h.insert(
            header::RETRY_AFTER,
            HeaderValue::from(view.retry_after_seconds),
        );
    }
    resp
}

/// What the template and the JSON say, from the engine's estimate.
pub fn queue_view(
    room: &RoomRuntime,
    engine: &Room,
    ticket: &Ticket,
    estimate: &WaitEstimate,
    now: UnixMillis,
) -> QueueView {
    let method = engine.queueing_method();
    let event = queue_page::EventVars::of(engine, now);
    let fifo = method != QueueingMethod::Random;
    let [p25, p50, p75] = estimate.whole_percentiles().map(u64::from);
    let minutes = u64::from(estimate.whole_minutes());
    let (p25, p50, p75) = if fifo {
        (minutes, minutes, minutes)
    } else {
        (p25, p50, p75)
    };
    QueueView {
        in_waiting_room: true,
        wait_time_known: estimate.wait_time_known,
        wait_time: if fifo { minutes } else { p50 },
        wait_time_25_percentile: if fifo { 0 } else { p25 },
        wait_time_50_percentile: if fifo { 0 } else { p50 },
        wait_time_75_percentile: if fifo { 0 } else { p75 },
        wait_time_formatted: queue_page::format_wait(
            estimate.wait_time_known,
            fifo,
            p25,
            p50,
            p75,
            estimate.queue_is_full,
        ),
        queue_is_full: estimate.queue_is_full,
        queue_all: engine.queue_all(),
        last_updated: last_updated(now),
        refresh_interval_seconds: u64::from(ticket.refresh_interval_secs),
        queueing_method: method.name().into(),
        is_fifo_queue: fifo,
        is_random_queue: !fifo,
        visitors_ahead: estimate.visitors_ahead,
        is_event_active: event.is_event_active,
        is_event_prequeueing: event.is_event_prequeueing,
        time_until_event_start: event.time_until_event_start,
        time_until_event_start_formatted: queue_page::format_until(event.time_until_event_start),
        time_until_event_end: event.time_until_event_end,
        time_until_event_end_formatted: queue_page::format_until(event.time_until_event_end),
        shuffle_at_event_start: event.shuffle_at_event_start,
        event_start_time: event.event_start_time,
        event_end_time: event.event_end_time,
        room: room.spec.id.clone(),
        language: String::new(),
    }
}

thread_local! {
    /// The second of the last `lastUpdated` written on this thread, and it.
    static LAST_UPDATED: std::cell::RefCell<(u64, String)> =
        const { std::cell::RefCell::new((u64::MAX, String::new())) };
}

/// `lastUpdated` at `now`: `format_rfc3339(now)`, which shows whole seconds,
/// formatted once a second per worker thread (a second has many queue
/// pages). `u64::MAX` is no second a clock in milliseconds reaches.
fn last_updated(now: UnixMillis) -> String {
    let second = now.0 / 1_000;
    LAST_UPDATED.with_borrow_mut(|(at, text)| {
        if *at != second {
            *text = waitroom_common::event::format_rfc3339(now);
            *at = second;
        }
        text.clone()
    })
}

fn bad_target(err: target::TargetError) -> Response<Body> {
    text(
        StatusCode::BAD_REQUEST,
        "text/plain",
        format!("bad request target: {err}\n"),
    )
}

fn not_covered() -> Response<Body> {
    text(
        StatusCode::NOT_FOUND,
        "text/plain",
        "no waiting room covers this host and path\n".into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_updated_is_the_second_of_now() {
        use waitroom_common::event::format_rfc3339;
        // First on this (the test's own) thread: the epoch's second is no
        // "nothing written yet".
        assert_eq!(last_updated(UnixMillis(0)), "1970-01-01T00:00:00Z");
        let base = 1_800_000_000_000;
        for ms in [
            0, 999, 1_000, 59_999, 60_000, 1_999, 2_000, 86_399_999, 86_400_000, 3_000,
        ] {
            let now = UnixMillis(base + ms);
            assert_eq!(last_updated(now), format_rfc3339(now), "{ms}");
            assert_eq!(last_updated(now), format_rfc3339(now), "{ms}, again");
        }
    }

    #[test]
    fn a_browsing_visitors_cookie_is_resealed_only_when_it_matters() {
        use waitroom_common::{engine::AdmitReason, room::RoomId, time::ExpirySlot};
        let now = UnixMillis(1_800_000_000_000);
        let mut old = Ticket::new_visitor(RoomId(1), now, 20);
        old.accepted_at = Some(now);
        old.counted_expiry = Some(ExpirySlot(6_000));
        let admit = |t: Ticket| Decision::Admit {
            ticket: t,
            visitor: Visitor::Admitted,
            reason: AdmitReason::SessionValid,
        };
        let mut same = old;
        same.last_check_in = UnixMillis(now.0 + 10_000);
        assert!(cookie_still_good(Some(&old), &admit(same)));
        let mut later = old;
        later.last_check_in = UnixMillis(now.0 + RESEAL_AFTER_MS);
        assert!(!cookie_still_good(Some(&old), &admit(later)), "too old");
        let mut moved = same;
        moved.counted_expiry = Some(ExpirySlot(6_010));
        assert!(
            cookie_still_good(Some(&old), &admit(moved)),
            "expiry moved with the 10 s of browsing"
        );
        moved.counted_expiry = Some(ExpirySlot(6_030));
        assert!(
            !cookie_still_good(Some(&old), &admit(moved)),
            "expiry moved too far"
        );
        moved.counted_expiry = Some(ExpirySlot(5_999));
        assert!(
            !cookie_still_good(Some(&old), &admit(moved)),
            "expiry moved back"
        );
        assert!(
            !cookie_still_good(None, &admit(same)),
            "new visitors always get a cookie"
        );
    }

    #[test]
    fn an_admitted_cookie_lives_as_long_as_its_session_a_queued_one_a_day() {
        use waitroom_common::room::{RoomConfig, RoomId};
        let now = UnixMillis(1_800_000_000_000);
        let room = RoomConfig {
            session_duration: 10,
            ..RoomConfig::with_limits(10, 10)
        }
        .validate()
        .unwrap();
        let mut t = Ticket::new_visitor(RoomId(1), now, 20);
        assert_eq!(cookie_max_age(&t, &room, now), QUEUED_COOKIE_MAX_AGE_SECS);
        t.accepted_at = Some(now);
        // The session ends with the second it ends in (1 s more than ten
        // minutes from a whole second), and the cookie lives as long.
        assert_eq!(cookie_max_age(&t, &room, now), 601 + 30);
        // Sealed 20 s after the last request: 20 s less.
        assert_eq!(
            cookie_max_age(&t, &room, UnixMillis(now.0 + 20_000)),
            581 + 30
        );
        let fixed = RoomConfig {
            disable_session_renewal: true,
            ..room.config().clone()
        }
        .validate()
        .unwrap();
        t.last_check_in = UnixMillis(now.0 + 300_000);
        assert_eq!(
            cookie_max_age(&t, &fixed, UnixMillis(now.0 + 300_000)),
            301 + 30,
            "without renewal the session counts from admission"
        );
    }
}
