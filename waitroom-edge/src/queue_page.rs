//! What a queued visitor sees: a Mustache page, or JSON for apps.
//!
//! The variables are those of the hosted product the operators know (seed 001):
//! `waitTime`, `waitTime25Percentile`…, `waitTimeFormatted`, `queueIsFull`,
//! `queueAll`, `lastUpdated`, `refreshIntervalSeconds`, `queueingMethod`,
//! `isFIFOQueue`, `isRandomQueue`, the scheduled event's `isEventActive`,
//! `isEventPrequeueing`, `timeUntilEventStart(Formatted)`,
//! `timeUntilEventEnd(Formatted)`, `shuffleAtEventStart`, plus our
//! `visitorsAhead`, `eventStartTime` and `eventEndTime` (RFC 3339). The built-in page works
//! without JavaScript: it refreshes itself with `<meta http-equiv="refresh">`
//! and the response's `Refresh` header after the ticket's own interval.
use std::{
    borrow::Cow,
    cell::RefCell,
    sync::atomic::{AtomicU64, Ordering},
};

use bytes::Bytes;

use ramhorns::{Content, Template};
use serde::Serialize;
use waitroom_common::{
    event::{EventPhase, format_rfc3339},
    room::Room,
    time::UnixMillis,
};

/// Everything a queue page or an app is told.
#[derive(Debug, Clone, PartialEq, Eq, Content, Serialize)]
#[ramhorns(rename_all = "camelCase")]
#[serde(rename_all = "camelCase")]
pub struct QueueView {
    pub in_waiting_room: bool,
    pub wait_time_known: bool,
    /// Minutes (FIFO: the estimate; random: the median).
    pub wait_time: u64,
    #[ramhorns(rename = "waitTime25Percentile")]
    #[serde(rename = "waitTime25Percentile")]
    pub wait_time_25_percentile: u64,
    #[ramhorns(rename = "waitTime50Percentile")]
    #[serde(rename = "waitTime50Percentile")]
    pub wait_time_50_percentile: u64,
    #[ramhorns(rename = "waitTime75Percentile")]
    #[serde(rename = "waitTime75Percentile")]
    pub wait_time_75_percentile: u64,
    pub wait_time_formatted: Cow<'static, str>,
    pub queue_is_full: bool,
    pub queue_all: bool,
    /// RFC 3339, UTC.
    pub last_updated: String,
    pub refresh_interval_seconds: u64,
    pub queueing_method: Cow<'static, str>,
    #[ramhorns(rename = "isFIFOQueue")]
    #[serde(rename = "isFIFOQueue")]
    pub is_fifo_queue: bool,
    pub is_random_queue: bool,
    pub visitors_ahead: u64,
    /// A scheduled event is in force and has started (Cloudflare's name).
    pub is_event_active: bool,
    /// A scheduled event's pre-queue: nobody is admitted before the start,
    /// and `waitTimeKnown` is false (Cloudflare's name).
    pub is_event_prequeueing: bool,
    /// Whole minutes until the event starts, rounded up; 0 outside a
    /// pre-queue (Cloudflare's name).
    pub time_until_event_start: u64,
    pub time_until_event_start_formatted: Cow<'static, str>,
    /// Whole minutes until the event ends, rounded up; 0 outside an event.
    pub time_until_event_end: u64,
    pub time_until_event_end_formatted: Cow<'static, str>,
    /// The pre-queue is shuffled at the start: arriving early gives no
    /// better place (Cloudflare's name).
    pub shuffle_at_event_start: bool,
    /// RFC 3339 (UTC) start of the event in force; empty outside one (ours:
    /// Cloudflare gives only the minutes until it).
    pub event_start_time: Cow<'static, str>,
    /// RFC 3339 (UTC) end of the event in force; empty outside one (ours).
    pub event_end_time: Cow<'static, str>,
    /// The room's name (for templates).
    #[serde(skip)]
    pub room: String,
    /// The language of the page (templates only): the tag the visitor's
    /// `Accept-Language` chose among `queue_page_languages`, or the room's
    /// `default_template_language`.
    #[serde(skip)]
    pub language: String,
}

/// The event variables of a [`QueueView`], from the room as it stands at
/// `now` ([`Room::at`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventVars {
    pub is_event_active: bool,
    pub is_event_prequeueing: bool,
    pub time_until_event_start: u64,
    pub time_until_event_end: u64,
    pub shuffle_at_event_start: bool,
    pub event_start_time: Cow<'static, str>,
    pub event_end_time: Cow<'static, str>,
}

impl EventVars {
    /// What the page says of the event in force in `room` at `now`.
    #[must_use]
    pub fn of(room: &Room, now: UnixMillis) -> Self {
        let Some(event) = room.event() else {
            return Self::default();
        };
        let minutes_until = |t: UnixMillis| t.0.saturating_sub(now.0).div_ceil(60_000);
        let prequeue = event.phase == EventPhase::Prequeueing;
        Self {
            is_event_active: !prequeue,
            is_event_prequeueing: prequeue,
            time_until_event_start: if prequeue {
                minutes_until(event.start)
            } else {
                0
            },
            time_until_event_end: minutes_until(event.end),
            shuffle_at_event_start: event.shuffle_at_event_start,
            event_start_time: format_rfc3339(event.start).into(),
            event_end_time: format_rfc3339(event.end).into(),
        }
    }
}

/// "in 5 minutes", "in 1 minute", "now".
#[must_use]
pub fn format_until(minutes: u64) -> Cow<'static, str> {
    match minutes {
        0 => "now".into(),
        1 => "in 1 minute".into(),
        n => format!("in {n} minutes").into(),
    }
}

/// "about 10 minutes", "5 minutes to 15 minutes", "less than a minute".
pub fn format_wait(
    known: bool,
    fifo: bool,
    p25: u64,
    p50: u64,
    p75: u64,
    full: bool,
) -> Cow<'static, str> {
    if full {
        return "more than a day".into();
    }
    if !known {
        return "being calculated".into();
    }
    let m = |n: u64| -> Cow<'static, str> {
        match n {
            0 => "less than a minute".into(),
            1 => "1 minute".into(),
            n => format!("{n} minutes").into(),
        }
    };
    if fifo || p25 == p75 {
        m(p50)
    } else {
        format!("{} to {}", m(p25), m(p75)).into()
    }
}

/// The built-in page: plain HTML and CSS, no JavaScript needed.
pub const DEFAULT_TEMPLATE: &str = r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<meta http-equiv="refresh" content="{{refreshIntervalSeconds}}">
<title>You are in line</title>
<style>
 body{margin:0;font-family:system-ui,-apple-system,"Segoe UI",sans-serif;background:#f4f5f7;color:#1d2330}
 main{max-width:34rem;margin:10vh auto;background:#fff;border-radius:12px;padding:2rem 2.2rem;box-shadow:0 2px 12px rgba(0,0,0,.08)}
 h1{font-size:1.5rem;margin:0 0 .8rem}
 .wait{font-size:2rem;font-weight:600;margin:.6rem 0 1rem;color:#234}
 .muted{color:#667085;font-size:.9rem}
 .bar{height:6px;background:#e6e8ee;border-radius:3px;overflow:hidden;margin:1.2rem 0}
 .bar span{display:block;height:100%;width:40%;background:#3b6fe0;animation:slide 2s ease-in-out infinite}
 @keyframes slide{0%{margin-left:-40%}100%{margin-left:100%}}
</style>
</head>
<body>
<main id="waitroom-queue">
<h1>You are in line</h1>
{{#isEventPrequeueing}}<p id="event-prequeue">The event has not started yet. It starts at <strong id="event-start">{{eventStartTime}}</strong> ({{timeUntilEventStartFormatted}}); nobody goes in before then.{{#shuffleAtEventStart}} When it starts, everyone waiting here gets a place in line at random: arriving early gives no better place, and neither does reloading.{{/shuffleAtEventStart}}</p>{{/isEventPrequeueing}}
{{^isEventPrequeueing}}<p>This site is busy right now. We are letting people in as room frees up{{#isRandomQueue}}, at random among everyone waiting{{/isRandomQueue}}{{#isFIFOQueue}}, in the order they arrived{{/isFIFOQueue}}.</p>{{/isEventPrequeueing}}
{{#queueIsFull}}<p class="wait">The line is very long.</p><p>Your estimated wait is more than a day. Please keep this page open or try again later.</p>{{/queueIsFull}}
{{^queueIsFull}}
<p class="muted">Estimated wait</p>
<p class="wait" id="wait-time">{{waitTimeFormatted}}</p>
{{#isFIFOQueue}}{{#waitTimeKnown}}<p>People ahead of you: <strong id="visitors-ahead">{{visitorsAhead}}</strong></p>{{/waitTimeKnown}}{{/isFIFOQueue}}
{{/queueIsFull}}
<div class="bar"><span></span></div>
<p class="muted">Keep this page open: it checks again every {{refreshIntervalSeconds}} seconds and takes you to the site when it is your turn. Reloading does not move you forward.</p>
<p class="muted">Last updated {{lastUpdated}}</p>
</main>
</body>
</html>
"#;

/// A parsed queue page template.
#[derive(Debug)]
pub struct QueuePage {
    template: Template<'static>,
    /// This page's number among every page the process has parsed (never
    /// reused, so a reloaded template is another page): what a rendered
    /// body is remembered under ([`page_body`]).
    id: u64,
}

/// The next [`QueuePage::id`].
static NEXT_PAGE_ID: AtomicU64 = AtomicU64::new(1);

fn next_page_id() -> u64 {
    NEXT_PAGE_ID.fetch_add(1, Ordering::Relaxed)
}

/// A template that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("queue page template {path}: {source}")]
pub struct TemplateError {
    pub path: String,
    pub source: ramhorns::Error,
}

impl QueuePage {
    /// The built-in page.
    pub fn builtin() -> Self {
        Self {
            template: Template::new(DEFAULT_TEMPLATE).expect("the built-in template parses"),
            id: next_page_id(),
        }
    }

    /// A page from an operator's template file.
    pub fn from_source(path: &str, source: String) -> Result<Self, TemplateError> {
        Template::new(source)
            .map(|template| Self {
                template,
                id: next_page_id(),
            })
            .map_err(|source| TemplateError {
                path: path.to_owned(),
                source,
            })
    }

    pub fn render(&self, view: &QueueView) -> String {
        self.template.render(view)
    }
}

/// What a remembered body was made from: a page (by [`QueuePage::id`]) or
/// the JSON under an envelope.
#[derive(Debug, PartialEq, Eq)]
enum Source {
    Page(u64),
    Json(String),
}

impl Source {
    fn is(&self, other: &SourceRef<'_>) -> bool {
        match (self, other) {
            (Self::Page(a), SourceRef::Page(b)) => a == b,
            (Self::Json(a), SourceRef::Json(b)) => a == b,
            _ => false,
        }
    }
}

#[derive(Clone, Copy)]
enum SourceRef<'a> {
    Page(u64),
    Json(&'a str),
}

/// Slots of [`BODIES`], per worker thread.
const BODY_SLOTS: usize = 64;

/// The last bodies rendered on this thread, each with everything it was
/// rendered from: the page (or the JSON's envelope) and the whole view. A
/// body is a function of the two alone (the template has no partials and
/// reads nothing but the view), so a request whose page and view are equal
/// to a slot's gets that slot's bytes; any other request renders, and
/// takes the slot if its body was served again since it was stored (else
/// only every [`STORE_EVERY`] misses). Visitors of one room in the same
/// second mostly see the same view (the wait is the room's; the refresh
/// interval is one of a few jittered values, hence the slots by interval);
/// a FIFO queue's `visitorsAhead` differs between visitors, and there this
/// costs the comparison and, now and then, a store.
#[derive(Default)]
struct Slot {
    body: Option<(Source, QueueView, Bytes)>,
    /// The body was served from the slot since it was stored.
    hit: bool,
    /// Misses since the body was stored.
    misses: u32,
}

/// A slot whose body was never served again is replaced only every this
/// many misses: where every visitor's view differs (a FIFO queue's
/// `visitorsAhead`), storing each one cost more than it saved (a miss that
/// stores: about 1,600 instructions of (c) and 2,000 of (d) over rendering
/// alone, docs/BENCHMARKS.md).
const STORE_EVERY: u32 = 16;

thread_local! {
    static BODIES: RefCell<Vec<Slot>> = RefCell::new((0..BODY_SLOTS).map(|_| Slot::default()).collect());
}

fn remembered(source: SourceRef<'_>, view: &QueueView, render: impl FnOnce() -> String) -> Bytes {
    let index = (view.refresh_interval_seconds as usize * 2
        + usize::from(matches!(source, SourceRef::Json(_))))
        % BODY_SLOTS;
    BODIES.with(|bodies| {
        let mut bodies = bodies.borrow_mut();
        let slot = &mut bodies[index];
        if let Some((s, v, body)) = &slot.body
            && s.is(&source)
            && v == view
        {
            slot.hit = true;
            return body.clone();
        }
        let body = Bytes::from(render());
        slot.misses += 1;
        if slot.body.is_none() || slot.hit || slot.misses >= STORE_EVERY {
            let owned = match source {
                SourceRef::Page(id) => Source::Page(id),
                SourceRef::Json(envelope) => Source::Json(envelope.to_owned()),
            };
            *slot = Slot {
                body: Some((owned, view.clone(), body.clone())),
                hit: false,
                misses: 0,
            };
        }
        body
    })
}

/// `page` rendered with `view`: the same bytes as [`QueuePage::render`],
/// remembered per worker thread (see `BODIES`).
pub fn page_body(page: &QueuePage, view: &QueueView) -> Bytes {
    remembered(SourceRef::Page(page.id), view, || page.render(view))
}

/// [`json_in`] of `view` under `envelope`, remembered per worker thread.
pub fn json_body(view: &QueueView, envelope: &str) -> Bytes {
    remembered(SourceRef::Json(envelope), view, || json_in(view, envelope))
}

/// The JSON answer for `Accept: application/json`, under `waitingRoom`.
pub fn json(view: &QueueView) -> String {
    json_in(view, waitroom_common::room_table::DEFAULT_JSON_ENVELOPE)
}

/// The JSON answer under the room's `json_envelope` (`cfWaitingRoom` for
/// apps written for Cloudflare's): what `serde_json` writes of the view
/// (its `Serialize`, the reference the tests hold this to, byte for byte),
/// written by hand. Through `serde_json` the field names alone, escaped
/// byte by byte, cost about 6,000 instructions a queued app's request, a
/// sixth of its whole answer (`cargo xtask bench`, scenario (d)).
pub fn json_in(view: &QueueView, envelope: &str) -> String {
    let mut out = Vec::with_capacity(1024);
    out.push(b'{');
    json_str(&mut out, envelope);
    out.extend_from_slice(b":{");
    view.write_json_fields(&mut out);
    out.extend_from_slice(b"}}");
    String::from_utf8(out).unwrap_or_else(|_| "{}".into())
}

impl QueueView {
    /// The view's fields as JSON members, in `Serialize`'s order and names.
    fn write_json_fields(&self, out: &mut Vec<u8>) {
        let mut first = true;
        let mut key = |out: &mut Vec<u8>, name: &str| {
            if !std::mem::take(&mut first) {
                out.push(b',');
            }
            out.push(b'"');
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b"\":");
        };
        let boolean = |out: &mut Vec<u8>, v: bool| {
            out.extend_from_slice(if v { b"true" } else { b"false" });
        };
        let number = |out: &mut Vec<u8>, v: u64| {
            out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
        };
        key(out, "inWaitingRoom");
        boolean(out, self.in_waiting_room);
        key(out, "waitTimeKnown");
        boolean(out, self.wait_time_known);
        key(out, "waitTime");
        number(out, self.wait_time);
        key(out, "waitTime25Percentile");
        number(out, self.wait_time_25_percentile);
        key(out, "waitTime50Percentile");
        number(out, self.wait_time_50_percentile);
        key(out, "waitTime75Percentile");
        number(out, self.wait_time_75_percentile);
        key(out, "waitTimeFormatted");
        json_str(out, &self.wait_time_formatted);
        key(out, "queueIsFull");
        boolean(out, self.queue_is_full);
        key(out, "queueAll");
        boolean(out, self.queue_all);
        key(out, "lastUpdated");
        json_str(out, &self.last_updated);
        key(out, "refreshIntervalSeconds");
        number(out, self.refresh_interval_seconds);
        key(out, "queueingMethod");
        json_str(out, &self.queueing_method);
        key(out, "isFIFOQueue");
        boolean(out, self.is_fifo_queue);
        key(out, "isRandomQueue");
        boolean(out, self.is_random_queue);
        key(out, "visitorsAhead");
        number(out, self.visitors_ahead);
        key(out, "isEventActive");
        boolean(out, self.is_event_active);
        key(out, "isEventPrequeueing");
        boolean(out, self.is_event_prequeueing);
        key(out, "timeUntilEventStart");
        number(out, self.time_until_event_start);
        key(out, "timeUntilEventStartFormatted");
        json_str(out, &self.time_until_event_start_formatted);
        key(out, "timeUntilEventEnd");
        number(out, self.time_until_event_end);
        key(out, "timeUntilEventEndFormatted");
        json_str(out, &self.time_until_event_end_formatted);
        key(out, "shuffleAtEventStart");
        boolean(out, self.shuffle_at_event_start);
        key(out, "eventStartTime");
        json_str(out, &self.event_start_time);
        key(out, "eventEndTime");
        json_str(out, &self.event_end_time);
        // `room` and `language` are for templates only (`serde(skip)`).
    }
}

/// `text` as a JSON string: copied as it is when nothing in it needs an
/// escape (the view's strings are the engine's words and numbers), else
/// escaped by `serde_json`.
fn json_str(out: &mut Vec<u8>, text: &str) {
    if text.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    } else if serde_json::to_writer(&mut *out, text).is_err() {
        out.extend_from_slice(b"\"\"");
    }
}

/// `{"<envelope>": value}`, written straight into one buffer: going through
/// a `serde_json::Value` allocated every field into a map per request, and
/// scenario (d) of `cargo xtask bench` fell to 0.71 of nginx (0.96 so).
/// Also the reject and error pages' JSON (`crate::pages`).
pub fn enveloped(value: &impl Serialize, envelope: &str) -> String {
    let mut out = Vec::with_capacity(1024);
    out.push(b'{');
    // The envelope is letters, digits and '_' (validated in `room_table`);
    // serialized as a JSON string all the same.
    let written = serde_json::to_writer(&mut out, envelope)
        .and_then(|()| {
            out.push(b':');
            serde_json::to_writer(&mut out, value)
        })
        .is_ok();
    out.push(b'}');
    match String::from_utf8(out) {
        Ok(json) if written => json,
        _ => "{}".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(fifo: bool) -> QueueView {
        QueueView {
            in_waiting_room: true,
            wait_time_known: true,
            wait_time: 10,
            wait_time_25_percentile: 5,
            wait_time_50_percentile: 10,
            wait_time_75_percentile: 15,
            wait_time_formatted: format_wait(true, fifo, 5, 10, 15, false),
            queue_is_full: false,
            queue_all: false,
            last_updated: "2026-11-22T10:00:00Z".into(),
            refresh_interval_seconds: 20,
            queueing_method: if fifo { "fifo" } else { "random" }.into(),
            is_fifo_queue: fifo,
            is_random_queue: !fifo,
            visitors_ahead: 42,
            is_event_active: false,
            is_event_prequeueing: false,
            time_until_event_start: 0,
            time_until_event_start_formatted: format_until(0),
            time_until_event_end: 0,
            time_until_event_end_formatted: format_until(0),
            shuffle_at_event_start: false,
            event_start_time: Cow::Borrowed(""),
            event_end_time: Cow::Borrowed(""),
            room: "shop".into(),
            language: "en".into(),
        }
    }

    fn prequeue_view() -> QueueView {
        QueueView {
            wait_time_known: false,
            wait_time_formatted: format_wait(false, true, 0, 0, 0, false),
            queue_all: true,
            is_event_prequeueing: true,
            time_until_event_start: 7,
            time_until_event_start_formatted: format_until(7),
            time_until_event_end: 67,
            time_until_event_end_formatted: format_until(67),
            shuffle_at_event_start: true,
            event_start_time: "2027-01-15T08:10:00Z".into(),
            event_end_time: "2027-01-15T09:10:00Z".into(),
            ..view(true)
        }
    }

    #[test]
    fn the_prequeue_page_says_the_event_has_not_started() {
        let html = QueuePage::builtin().render(&prequeue_view());
        assert!(html.contains("The event has not started yet"), "{html}");
        assert!(html.contains(">2027-01-15T08:10:00Z<"), "{html}");
        assert!(html.contains("in 7 minutes"));
        assert!(html.contains("at random"));
        assert!(html.contains("being calculated"));
        assert!(!html.contains("This site is busy"));
        let normal = QueuePage::builtin().render(&view(true));
        assert!(!normal.contains("has not started"));
        let v: serde_json::Value = serde_json::from_str(&json(&prequeue_view())).unwrap();
        let w = &v["waitingRoom"];
        assert_eq!(w["waitTimeKnown"], false);
        assert_eq!(w["isEventPrequeueing"], true);
        assert_eq!(w["isEventActive"], false);
        assert_eq!(w["timeUntilEventStart"], 7);
        assert_eq!(w["eventStartTime"], "2027-01-15T08:10:00Z");
        assert_eq!(w["shuffleAtEventStart"], true);
        let custom = QueuePage::from_source(
            "e.html",
            "{{#isEventPrequeueing}}opens {{eventStartTime}}{{/isEventPrequeueing}}".into(),
        )
        .unwrap();
        assert_eq!(
            custom.render(&prequeue_view()),
            "opens 2027-01-15T08:10:00Z"
        );
    }

    #[test]
    fn builtin_page_shows_the_wait_and_refreshes_itself() {
        let html = QueuePage::builtin().render(&view(true));
        assert!(html.contains(r#"<meta http-equiv="refresh" content="20">"#));
        assert!(html.contains(">10 minutes<"), "{html}");
        assert!(html.contains(">42<"));
        assert!(html.contains("in the order they arrived"));
        let random = QueuePage::builtin().render(&view(false));
        assert!(random.contains("5 minutes to 15 minutes"));
        assert!(!random.contains("visitors-ahead"));
    }

    #[test]
    fn json_uses_the_template_variable_names() {
        let v: serde_json::Value = serde_json::from_str(&json(&view(false))).unwrap();
        let w = &v["waitingRoom"];
        assert_eq!(w["waitTime25Percentile"], 5);
        assert_eq!(w["isFIFOQueue"], false);
        assert_eq!(w["isRandomQueue"], true);
        assert_eq!(w["refreshIntervalSeconds"], 20);
        assert_eq!(w["visitorsAhead"], 42);
        assert_eq!(w["waitTimeFormatted"], "5 minutes to 15 minutes");
        assert!(w.get("room").is_none());
    }

    #[test]
    fn the_envelope_is_the_rooms_choice() {
        let text = json_in(&view(true), "cfWaitingRoom");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["cfWaitingRoom"]["waitTime"], 10);
        assert_eq!(v["cfWaitingRoom"]["inWaitingRoom"], true);
        assert!(v.get("waitingRoom").is_none());
    }

    /// The JSON written by hand is, byte for byte, what `serde_json` writes
    /// of the view under the envelope: every field, name and order (a field
    /// added to the view and not to the writer fails here), numbers at
    /// their extremes, and strings that need escaping.
    #[test]
    fn the_hand_written_json_is_serde_jsons() {
        let reference = |view: &QueueView, envelope: &str| enveloped(view, envelope);
        let mut odd = view(false);
        odd.wait_time = u64::MAX;
        odd.visitors_ahead = 0;
        odd.time_until_event_end = 1_000_000_007;
        odd.wait_time_formatted = "say \"hi\" \\ then\nleave\t\u{1}".into();
        odd.queueing_method = "fïfo ✓ \u{7f}".into();
        odd.event_start_time = String::from("<script>").into();
        odd.room = "not in JSON".into();
        odd.language = "de".into();
        for v in [view(true), view(false), prequeue_view(), odd] {
            for envelope in ["waitingRoom", "cfWaitingRoom", "x_1"] {
                let text = json_in(&v, envelope);
                assert_eq!(text, reference(&v, envelope));
                let _: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
            }
        }
    }

    #[test]
    fn custom_templates_use_the_same_variables() {
        let p = QueuePage::from_source(
            "t.html",
            "{{waitTime}}/{{queueingMethod}}/{{#queueAll}}all{{/queueAll}}".into(),
        )
        .unwrap();
        assert_eq!(p.render(&view(true)), "10/fifo/");
        assert!(
            QueuePage::from_source("bad.html", "{{#open}} never closed {{/other}}".into()).is_err()
        );
        assert!(QueuePage::from_source("bad.html", "{{waitTime".into()).is_err());
    }

    /// A remembered body is served only for the same page (a template
    /// parsed again, as on a reload, is another page, even at the address of
    /// a dropped one) or the same envelope, and the same view in every
    /// field: each case below renders on its own thread's slots, and every
    /// answer is what rendering gives.
    #[test]
    fn a_remembered_body_is_the_same_page_and_view_only() {
        let page = |text: &str| QueuePage::from_source("t.html", text.into()).unwrap();
        // Each case in a slot of its own (slots are chosen by the refresh
        // interval), which is empty on the test's thread: its first body
        // is stored, and a wrong key would serve it to the second request.
        let mut interval = 0;
        let mut fresh = |v: &QueueView| {
            interval += 1;
            QueueView {
                refresh_interval_seconds: interval,
                ..v.clone()
            }
        };
        let a = page(
            "A {{lastUpdated}} {{language}} {{room}} {{visitorsAhead}} {{refreshIntervalSeconds}}",
        );
        let v = fresh(&view(true));
        assert_eq!(page_body(&a, &v), a.render(&v).as_bytes());
        assert_eq!(page_body(&a, &v), a.render(&v).as_bytes(), "remembered");
        // Another page with the same view: its own bytes.
        let v = fresh(&v);
        assert_eq!(page_body(&a, &v), a.render(&v).as_bytes());
        let b = page("B {{lastUpdated}}");
        assert_eq!(page_body(&b, &v), b.render(&v).as_bytes());
        // A reloaded template: dropped and parsed again with other text.
        let v = fresh(&v);
        assert_eq!(page_body(&a, &v), a.render(&v).as_bytes());
        drop(a);
        for _ in 0..4 {
            let again = page("C {{lastUpdated}}");
            assert_eq!(page_body(&again, &v), again.render(&v).as_bytes());
        }
        // One field changed at a time: the second, the language, the room,
        // the place in line, a flag.
        let a = page(
            "A {{lastUpdated}} {{language}} {{room}} {{visitorsAhead}} {{#queueAll}}all{{/queueAll}}",
        );
        let changed: [fn(&mut QueueView); 5] = [
            |v| v.last_updated = "2026-11-22T10:00:01Z".into(),
            |v| v.language = "de".into(),
            |v| v.room = "other".into(),
            |v| v.visitors_ahead += 1,
            |v| v.queue_all = !v.queue_all,
        ];
        for change in changed {
            let v = fresh(&v);
            assert_eq!(page_body(&a, &v), a.render(&v).as_bytes());
            let mut w = v.clone();
            change(&mut w);
            assert_ne!(a.render(&w), a.render(&v));
            assert_eq!(page_body(&a, &w), a.render(&w).as_bytes());
            assert_eq!(page_body(&a, &v), a.render(&v).as_bytes());
        }
        // The JSON: by envelope, and never a page's body of the same view.
        let v = fresh(&v);
        assert_eq!(
            json_body(&v, "waitingRoom"),
            json_in(&v, "waitingRoom").as_bytes()
        );
        assert_eq!(
            json_body(&v, "cfWaitingRoom"),
            json_in(&v, "cfWaitingRoom").as_bytes()
        );
        let v = fresh(&v);
        assert_eq!(
            json_body(&v, "waitingRoom"),
            json_in(&v, "waitingRoom").as_bytes()
        );
        let mut w = v.clone();
        w.last_updated = "2026-11-22T10:00:01Z".into();
        assert_eq!(
            json_body(&w, "waitingRoom"),
            json_in(&w, "waitingRoom").as_bytes()
        );
        assert_eq!(page_body(&a, &v), a.render(&v).as_bytes());
    }

    /// A slot whose body is never served again is replaced on every
    /// STORE_EVERY-th miss only, and one that was served on the next miss;
    /// every answer is still the rendering.
    #[test]
    fn a_slot_that_only_misses_is_replaced_seldom() {
        let p = QueuePage::from_source("t.html", "{{visitorsAhead}}".into()).unwrap();
        let mut v = view(true);
        v.refresh_interval_seconds = 7;
        let stored = |v: &QueueView| {
            BODIES.with_borrow(|b| {
                b.iter()
                    .any(|s| s.body.as_ref().is_some_and(|(_, w, _)| w == v))
            })
        };
        for n in 0..(2 * STORE_EVERY as u64 + 1) {
            v.visitors_ahead = n;
            assert_eq!(page_body(&p, &v), n.to_string().as_bytes());
            let expected = n % u64::from(STORE_EVERY) == 0;
            assert_eq!(stored(&v), expected, "{n}");
        }
        // Served once: the next miss stores.
        assert_eq!(page_body(&p, &v), v.visitors_ahead.to_string().as_bytes());
        v.visitors_ahead += 1;
        assert_eq!(page_body(&p, &v), v.visitors_ahead.to_string().as_bytes());
        assert!(stored(&v));
    }

    #[test]
    fn wait_formatting() {
        assert_eq!(format_wait(false, true, 0, 0, 0, false), "being calculated");
        assert_eq!(
            format_wait(true, true, 0, 0, 0, false),
            "less than a minute"
        );
        assert_eq!(format_wait(true, true, 2, 2, 2, false), "2 minutes");
        assert_eq!(format_wait(true, true, 2, 2, 2, true), "more than a day");
    }
}
