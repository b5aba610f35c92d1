//! The pages other than the queue's, and the queue page's language.
//!
//! - **Reject and error pages** are Mustache templates like the queue page: a
//!   built-in default each, an operator's file per room (`reject_page`,
//!   `error_page`), and a JSON twin for `Accept: application/json` under the
//!   room's `json_envelope`. Their variables are [`StatusView`]'s.
//! - **Languages**: a room may name a queue page per language
//!   (`queue_page_languages`); the visitor's `Accept-Language` picks one
//!   ([`pick_language`]), else the room's `default_template_language` page.
use ramhorns::{Content, Template};
use serde::Serialize;
use waitroom_common::room_table::valid_language_tag;

/// Why a visitor got a status page instead of the site or the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The room's queueing method is `reject`.
    Rejected,
    /// The client address is over its new-ticket limit (429).
    TooManyNewVisitors,
    /// Every origin pool is failing its health checks (503).
    OriginDown,
    /// The origin did not send its response head in time (502).
    OriginTimeout,
    /// The origin refused, reset or answered garbage (502).
    OriginUnreachable,
}

impl Reason {
    /// The code templates and apps see.
    #[must_use]
    pub const fn code(self) -> &'static str {
        match self {
            Self::Rejected => "rejected",
            Self::TooManyNewVisitors => "too_many_new_visitors",
            Self::OriginDown => "origin_down",
            Self::OriginTimeout => "origin_timeout",
            Self::OriginUnreachable => "origin_unreachable",
        }
    }
}

/// What a reject or error page and its JSON say.
#[derive(Debug, Clone, Content, Serialize)]
#[ramhorns(rename_all = "camelCase")]
#[serde(rename_all = "camelCase")]
pub struct StatusView {
    /// Always false: the visitor holds no place in a queue (Cloudflare's name).
    pub in_waiting_room: bool,
    /// The room's queueing method (`reject` on a reject page), empty where no
    /// room covers the request.
    pub queueing_method: String,
    /// The HTTP status of the answer.
    pub status: u16,
    /// [`Reason::code`].
    pub reason: &'static str,
    /// Seconds after which trying again makes sense (`Retry-After`); 0: none said.
    pub retry_after_seconds: u64,
    pub is_rejected: bool,
    pub is_too_many_new_visitors: bool,
    pub is_origin_down: bool,
    pub is_origin_timeout: bool,
    pub is_origin_unreachable: bool,
    /// The room's `default_template_language`.
    pub language: String,
    /// The room's name (templates only).
    #[serde(skip)]
    pub room: String,
}

impl StatusView {
    #[must_use]
    pub fn new(reason: Reason, status: u16, retry_after_seconds: u64) -> Self {
        Self {
            in_waiting_room: false,
            queueing_method: String::new(),
            status,
            reason: reason.code(),
            retry_after_seconds,
            is_rejected: reason == Reason::Rejected,
            is_too_many_new_visitors: reason == Reason::TooManyNewVisitors,
            is_origin_down: reason == Reason::OriginDown,
            is_origin_timeout: reason == Reason::OriginTimeout,
            is_origin_unreachable: reason == Reason::OriginUnreachable,
            language: String::new(),
            room: String::new(),
        }
    }
}

/// The built-in reject page.
pub const DEFAULT_REJECT_TEMPLATE: &str = r#"<!doctype html>
<html lang="{{language}}">
<head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1"><title>Not open right now</title></head>
<body style="font-family:system-ui,sans-serif;max-width:36rem;margin:4rem auto;padding:0 1rem">
<h1>Not open right now</h1>
<p id="waitroom-reject">This page is not admitting visitors at the moment, and there is no line to wait in. Please come back later.</p>
</body>
</html>
"#;

/// The built-in error page: what failed, in words, by [`Reason`].
pub const DEFAULT_ERROR_TEMPLATE: &str = r#"<!doctype html>
<html lang="{{language}}">
<head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1"><title>Site unavailable</title></head>
<body style="font-family:system-ui,sans-serif;max-width:36rem;margin:4rem auto;padding:0 1rem">
<main id="waitroom-error">
{{#isOriginDown}}<h1>The site is down for the moment</h1><p>Every server of the website is failing its health checks. Please try again in a minute.</p>{{/isOriginDown}}
{{#isOriginTimeout}}<h1>The site is not answering</h1><p>The website did not respond in time. Please try again in a minute.</p>{{/isOriginTimeout}}
{{#isOriginUnreachable}}<h1>The site is not answering</h1><p>The website could not be reached. Please try again in a minute.</p>{{/isOriginUnreachable}}
{{#isTooManyNewVisitors}}<h1>Too many new visitors from your address</h1><p>Keep the cookie this site sets, or try again in {{retryAfterSeconds}} seconds.</p>{{/isTooManyNewVisitors}}
{{#isRejected}}<h1>Not open right now</h1><p>This page is not admitting visitors at the moment.</p>{{/isRejected}}
<p><small>{{status}} · {{reason}}</small></p>
</main>
</body>
</html>
"#;

/// A parsed reject or error page template.
#[derive(Debug)]
pub struct StatusPage {
    template: Template<'static>,
}

impl StatusPage {
    /// The built-in reject page.
    #[must_use]
    pub fn builtin_reject() -> Self {
        Self {
            template: Template::new(DEFAULT_REJECT_TEMPLATE).expect("the built-in page parses"),
        }
    }

    /// The built-in error page.
    #[must_use]
    pub fn builtin_error() -> Self {
        Self {
            template: Template::new(DEFAULT_ERROR_TEMPLATE).expect("the built-in page parses"),
        }
    }

    /// A page from an operator's template file.
    pub fn from_source(
        path: &str,
        source: String,
    ) -> Result<Self, crate::queue_page::TemplateError> {
        Template::new(source)
            .map(|template| Self { template })
            .map_err(|source| crate::queue_page::TemplateError {
                path: path.to_owned(),
                source,
            })
    }

    #[must_use]
    pub fn render(&self, view: &StatusView) -> String {
        self.template.render(view)
    }
}

/// `{"<envelope>": view}`.
#[must_use]
pub fn json_in(view: &StatusView, envelope: &str) -> String {
    crate::queue_page::enveloped(view, envelope)
}

/// Bytes of an `Accept-Language` value looked at; the rest is ignored (a
/// browser sends well under 200).
const MAX_ACCEPT_LANGUAGE: usize = 1024;
/// Language ranges looked at.
const MAX_RANGES: usize = 32;

/// The best of `available` (lower-case language tags) for an
/// `Accept-Language` value, by RFC 4647 lookup with q-values: ranges in
/// falling q (ties in the order sent), `q=0` never chosen; a range matches a
/// tag equal to it, else a tag it is a prefix of (`de` → `de-ch`), else its
/// own prefixes in turn (`de-ch` → `de`). `*` and anything unreadable choose
/// nothing: `None` is the room's default language.
#[must_use]
pub fn pick_language(value: &[u8], available: &[String]) -> Option<usize> {
    if available.is_empty() {
        return None;
    }
    let value = &value[..value.len().min(MAX_ACCEPT_LANGUAGE)];
    let value = std::str::from_utf8(value).ok()?;
    // (q in thousandths, order, range)
    let mut ranges: Vec<(u16, usize, &str)> = Vec::new();
    for (order, item) in value.split(',').take(MAX_RANGES).enumerate() {
        let mut parts = item.split(';');
        let range = parts.next().unwrap_or("").trim();
        if range.is_empty() || (range != "*" && !valid_language_tag(range)) {
            continue;
        }
        let mut q = 1000;
        for param in parts {
            let Some((name, v)) = param.split_once('=') else {
                q = 0;
                break;
            };
            if name.trim().eq_ignore_ascii_case("q") {
                q = parse_q(v.trim()).unwrap_or(0);
            }
        }
        if q > 0 {
            ranges.push((q, order, range));
        }
    }
    ranges.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for (_, _, range) in ranges {
        if range == "*" {
            return None;
        }
        if let Some(i) = available.iter().position(|t| t.eq_ignore_ascii_case(range)) {
            return Some(i);
        }
        if let Some(i) = available.iter().position(|t| {
            t.len() > range.len()
                && t.as_bytes()[range.len()] == b'-'
                && t[..range.len()].eq_ignore_ascii_case(range)
        }) {
            return Some(i);
        }
        let mut prefix = range;
        while let Some(cut) = prefix.rfind('-') {
            prefix = &prefix[..cut];
            if let Some(i) = available
                .iter()
                .position(|t| t.eq_ignore_ascii_case(prefix))
            {
                return Some(i);
            }
        }
    }
    None
}

/// A q-value (`0`, `0.5`, `1.000`) in thousandths; `None` if malformed.
fn parse_q(v: &str) -> Option<u16> {
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u16 = match int {
        "0" => 0,
        "1" => 1,
        _ => return None,
    };
    let mut thousandths = 0u16;
    for (i, b) in frac.bytes().enumerate() {
        thousandths += u16::from(b - b'0') * [100, 10, 1][i];
    }
    let q = whole * 1000 + thousandths;
    (q <= 1000).then_some(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn langs(tags: &[&str]) -> Vec<String> {
        tags.iter().map(|t| (*t).to_owned()).collect()
    }

    #[test]
    fn the_best_language_by_q_value_and_prefix() {
        let available = langs(&["de", "fr", "pt-br"]);
        let pick = |v: &str| pick_language(v.as_bytes(), &available);
        assert_eq!(
            pick("de-CH,de;q=0.9,en;q=0.8"),
            Some(0),
            "de-CH falls back to de"
        );
        assert_eq!(pick("en;q=0.9, fr"), Some(1), "higher q wins over order");
        assert_eq!(pick("fr;q=0, *"), None, "q=0 excludes; * is the default");
        assert_eq!(pick("FR"), Some(1), "case-insensitive");
        assert_eq!(pick("pt"), Some(2), "a range matches a longer tag");
        assert_eq!(
            pick("pt-BR;q=0.5,de;q=0.50"),
            Some(2),
            "ties keep the order sent"
        );
        assert_eq!(pick("en-US,en;q=0.9"), None, "nothing available: default");
        assert_eq!(pick("de;q=1.000"), Some(0));
    }

    #[test]
    fn garbage_chooses_the_default_and_never_panics() {
        let available = langs(&["de", "fr"]);
        for bad in [
            &b";;;,q=abc"[..],
            b"*;q=0",
            b"de;q=2",
            b"de;q=0.1234",
            b"de;q=-1",
            b"de;q",
            b"\xff\xfe de",
            b"",
            b",,,,,",
            b"d\xc3\xa9",
            b"de-;q=1",
            b"-de",
            b"thisisaverylonglanguagetagthatexceedsthirtyfive",
        ] {
            assert_eq!(pick_language(bad, &available), None, "{bad:?}");
        }
        let huge = "xx;q=0.1,".repeat(2_000) + "de";
        assert_eq!(
            pick_language(huge.as_bytes(), &available),
            None,
            "what lies beyond the first kilobyte is not read"
        );
        assert_eq!(pick_language(b"de", &[]), None);
    }

    #[test]
    fn built_in_pages_say_what_failed_and_json_has_the_envelope() {
        let mut view = StatusView::new(Reason::OriginTimeout, 502, 0);
        view.language = "en".into();
        let html = StatusPage::builtin_error().render(&view);
        assert!(html.contains("did not respond in time"), "{html}");
        assert!(!html.contains("let you in"), "{html}");
        assert!(html.contains("502 · origin_timeout"), "{html}");
        let json: serde_json::Value =
            serde_json::from_str(&json_in(&view, "cfWaitingRoom")).unwrap();
        assert_eq!(json["cfWaitingRoom"]["reason"], "origin_timeout");
        assert_eq!(json["cfWaitingRoom"]["inWaitingRoom"], false);
        assert_eq!(json["cfWaitingRoom"]["status"], 502);
        let mut reject = StatusView::new(Reason::Rejected, 403, 0);
        reject.queueing_method = "reject".into();
        let json: serde_json::Value =
            serde_json::from_str(&json_in(&reject, "waitingRoom")).unwrap();
        assert_eq!(json["waitingRoom"]["queueingMethod"], "reject");
        assert_eq!(json["waitingRoom"]["isRejected"], true);
        assert!(
            StatusPage::builtin_reject()
                .render(&reject)
                .contains("Not open right now")
        );
    }

    #[test]
    fn a_broken_template_names_its_file() {
        let err = StatusPage::from_source(
            "/etc/waitroom/err.mustache",
            "{{#open}} never closed {{/other}}".into(),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("/etc/waitroom/err.mustache"),
            "{err}"
        );
    }
}
