//! One spelling per path: the request target as the room table sees it.
//!
//! A room on `/drop` must not be skipped by `/%64rop`, `/./drop`,
//! `/x/../drop`, `//drop`, `/DROP`, `/drop;x`, a trailing-dot host or an
//! absolute-form URI whose authority differs from `Host`. So before routing,
//! the target is normalized the way RFC 3986 §6.2.2 and RFC 9112 §3.2.2 say,
//! and the origin receives exactly the normalized target that was routed:
//!
//! - **Host**: the absolute-form authority if there is one (it wins over the
//!   `Host` header), else `Host` (or HTTP/2's `:authority`); lower-cased,
//!   trailing dot removed, port kept apart.
//! - **Path**: percent-encoded unreserved characters (`A-Z a-z 0-9 - . _ ~`)
//!   decoded, other escapes upper-cased; dot segments removed (never above the
//!   root); runs of `/` merged unless the room asks otherwise
//!   (`merge_slashes = false`).
//! - **Matching** (not forwarding): path parameters (`;...` in a segment, which
//!   Java servers ignore) are cut, and paths compare case-insensitively unless
//!   the room says `path_case_sensitive = true`. Both defaults err towards
//!   the room covering a request rather than missing it.
//! - **Refused with 400** (ambiguous, whatever the origin might make of
//!   them): an encoded `/` or `\` (`%2F`, `%5C`), an encoded or raw control
//!   character (`%00`, ...), a raw `\`, a broken escape (`%G1`, `%4`), a dot
//!   segment with parameters (`/..;/`), a host that is not a host name or
//!   address, and targets other than origin- or absolute-form.
//!
//! The common case (a plain lower-case path) allocates nothing.
use std::{
    borrow::Cow,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
};

use http::{HeaderMap, Uri, header};

/// Why a target was refused (400): each is a way to make a proxy and an
/// origin disagree about which resource was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("an encoded '/' or '\\' in the path")]
    EncodedSeparator,
    #[error("a control character in the path")]
    Control,
    #[error("a raw '\\' in the path")]
    Backslash,
    #[error("a broken percent-escape in the path")]
    BadEscape,
    #[error("a dot segment with parameters in the path")]
    DotSegmentParameters,
    #[error("no usable host")]
    BadHost,
    #[error("not an origin-form or absolute-form target")]
    BadForm,
}

impl TargetError {
    const ALL: [Self; 7] = [
        Self::EncodedSeparator,
        Self::Control,
        Self::Backslash,
        Self::BadEscape,
        Self::DotSegmentParameters,
        Self::BadHost,
        Self::BadForm,
    ];

    /// The label of `waitroom_requests_refused_total{reason}`.
    #[must_use]
    pub fn reason(self) -> &'static str {
        match self {
            Self::EncodedSeparator => "encoded_separator",
            Self::Control => "control_character",
            Self::Backslash => "backslash",
            Self::BadEscape => "bad_escape",
            Self::DotSegmentParameters => "dot_segment_parameters",
            Self::BadHost => "bad_host",
            Self::BadForm => "bad_form",
        }
    }
}

/// Targets refused, by reason, and a log that speaks at most once per ten
/// seconds (a scanner sends thousands of these).
#[derive(Debug)]
pub struct RefusedTargets {
    counts: [AtomicU64; 7],
    log: waitroom_runtime::logging::LogGate,
}

impl Default for RefusedTargets {
    fn default() -> Self {
        Self {
            counts: Default::default(),
            log: waitroom_runtime::logging::LogGate::new(10),
        }
    }
}

impl RefusedTargets {
    /// Counts one refusal at `now_secs` and logs it unless another was logged
    /// in the last ten seconds (then the next line says how many were not).
    pub fn record(&self, err: TargetError, now_secs: u64) {
        let i = TargetError::ALL.iter().position(|e| *e == err).unwrap_or(0);
        self.counts[i].fetch_add(1, Relaxed);
        if let Some(suppressed) = self.log.pass(now_secs) {
            tracing::warn!(
                reason = err.reason(),
                suppressed,
                "request target refused (400): {err}"
            );
        }
    }

    /// `waitroom_requests_refused_total{reason=...}` for the target reasons.
    pub fn encode(&self, f: &mut waitroom_runtime::metrics::Families<'_>) -> std::fmt::Result {
        f.counters(
            "waitroom_requests_refused_total",
            "Requests refused with 400 before routing, by reason (ambiguous targets).",
            TargetError::ALL
                .iter()
                .zip(&self.counts)
                .map(|(err, n)| ([("reason", err.reason())], n.load(Relaxed))),
        )
    }
}

/// A normalized request target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target<'a> {
    /// Lower-case, no trailing dot, no port; empty when the request named none.
    pub host: Cow<'a, str>,
    /// The port the client named with the host, if any.
    pub port: Option<&'a str>,
    /// The normalized path with runs of `/` merged.
    pub merged: Cow<'a, str>,
    /// The normalized path with runs of `/` kept (rooms with `merge_slashes = false`).
    pub unmerged: Cow<'a, str>,
    /// The query, untouched.
    pub query: Option<&'a str>,
}

impl Target<'_> {
    /// The path this room routes on and forwards.
    #[must_use]
    pub fn path(&self, merge_slashes: bool) -> &str {
        if merge_slashes {
            &self.merged
        } else {
            &self.unmerged
        }
    }

    /// `path?query` for the origin.
    #[must_use]
    pub fn path_and_query(&self, merge_slashes: bool) -> String {
        let path = self.path(merge_slashes);
        match self.query {
            Some(q) => format!("{path}?{q}"),
            None => path.to_owned(),
        }
    }

    /// The `Host` header for the origin: the normalized host and the port.
    #[must_use]
    pub fn host_header(&self) -> String {
        match self.port {
            Some(p) => format!("{}:{p}", self.host),
            None => self.host.clone().into_owned(),
        }
    }
}

/// Normalizes the target of a request with `uri` and `headers`.
pub fn normalize<'a>(uri: &'a Uri, headers: &'a HeaderMap) -> Result<Target<'a>, TargetError> {
    // Origin-form (`/p`) or absolute-form (`http://h/p`); hyper has already
    // refused what is neither, except `*` and authority-form.
    let raw_path = uri.path();
    let authority = match uri.authority() {
        Some(a) => a.as_str(),
        None => match headers.get(header::HOST) {
            Some(h) => h.to_str().map_err(|_| TargetError::BadHost)?,
            None => "",
        },
    };
    let mut target = from_parts(authority, raw_path)?;
    target.query = uri.query();
    Ok(target)
}

/// A target from a host (as in `Host`) and a path (no query).
pub fn from_parts<'a>(host: &'a str, path: &'a str) -> Result<Target<'a>, TargetError> {
    if !path.starts_with('/') {
        return Err(TargetError::BadForm);
    }
    let (host, port) = split_host(host)?;
    // The common case needs neither: one spelling already, nothing allocated.
    let scan = PathScan::of(path.as_bytes());
    let unmerged = if scan.needs_work {
        normalize_path(path)?
    } else {
        Cow::Borrowed(path)
    };
    let merged = if scan.needs_work || scan.double_slash {
        merge_slashes(&unmerged)
    } else {
        unmerged.clone()
    };
    Ok(Target {
        host,
        port,
        merged,
        unmerged,
        query: None,
    })
}

/// `Host` → (lower-case host without trailing dot, port).
///
/// Userinfo (`user@host`) has no place in a request target: `@` is neither a
/// host character nor a digit of the port nor part of an IPv6 literal, so
/// the checks below refuse it wherever it stands.
fn split_host(authority: &str) -> Result<(Cow<'_, str>, Option<&str>), TargetError> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        // An IPv6 literal: `[::1]` or `[::1]:8080`.
        let (inner, after) = rest.split_once(']').ok_or(TargetError::BadHost)?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or(TargetError::BadHost)?),
        };
        if inner.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(TargetError::BadHost);
        }
        (&authority[..inner.len() + 2], port)
    } else {
        // A loop over a short host, not `rsplit_once`'s `memrchr` set-up.
        match authority.bytes().rposition(|b| b == b':') {
            Some(at) => (&authority[..at], Some(&authority[at + 1..])),
            None => (authority, None),
        }
    };
    if let Some(p) = port
        && (p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(TargetError::BadHost);
    }
    let host = host.strip_suffix('.').unwrap_or(host);
    // One pass for what took four (issue 17): every byte a host character,
    // no `..`, and whether any is upper case.
    let (mut all, mut any, mut dot_dot, mut previous) = (HOST_CHAR, 0, false, 0);
    for &b in host.as_bytes() {
        let class = BYTE_CLASS[usize::from(b)];
        all &= class;
        any |= class;
        dot_dot |= b == b'.' && previous == b'.';
        previous = b;
    }
    if all & HOST_CHAR == 0 || host.starts_with('.') || dot_dot {
        return Err(TargetError::BadHost);
    }
    let host = if any & UPPER != 0 {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    };
    Ok((host, port))
}

/// [`BYTE_CLASS`]: a character a host may hold (`Host` as this node accepts it).
const HOST_CHAR: u8 = 1;
/// [`BYTE_CLASS`]: an upper-case ASCII letter.
const UPPER: u8 = 2;
/// [`BYTE_CLASS`]: a byte that makes a path need decoding or refusing
/// (`%`, a backslash, a control character).
const PATH_WORK: u8 = 4;

/// What each byte is, for the one-pass scans of a host and a path.
static BYTE_CLASS: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        let mut class = 0;
        if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'[' | b']' | b':') {
            class |= HOST_CHAR;
        }
        if c.is_ascii_uppercase() {
            class |= UPPER;
        }
        if matches!(c, b'%' | b'\\') || c.is_ascii_control() {
            class |= PATH_WORK;
        }
        table[b] = class;
        b += 1;
    }
    table
};

/// A path's bytes read once: whether it needs decoding, refusing or dot
/// segments removed (`%`, a backslash, a control character, a `/.`), and whether
/// it holds `//`.
#[derive(Debug, PartialEq, Eq)]
struct PathScan {
    needs_work: bool,
    double_slash: bool,
}

impl PathScan {
    fn of(path: &[u8]) -> Self {
        let (mut work, mut slash_dot, mut double_slash, mut previous) = (0, false, false, 0);
        for &b in path {
            work |= BYTE_CLASS[usize::from(b)];
            slash_dot |= previous == b'/' && b == b'.';
            double_slash |= previous == b'/' && b == b'/';
            previous = b;
        }
        Self {
            needs_work: work & PATH_WORK != 0 || slash_dot,
            double_slash,
        }
    }
}

/// Whether `text` holds the two bytes of `pair` side by side: what
/// `text.contains(pair)` says, without setting up `str::contains`'s
/// two-way searcher, which cost about 300 instructions a call on a short
/// host or path (three calls a request; issue 17).
fn has_pair(text: &str, pair: [u8; 2]) -> bool {
    text.as_bytes().windows(2).any(|w| w == pair.as_slice())
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Decodes unreserved escapes, upper-cases the rest, refuses the ambiguous,
/// and removes dot segments.
///
/// For a path [`PathScan`] says needs work; the caller keeps one that does
/// not as it is.
fn normalize_path(path: &str) -> Result<Cow<'_, str>, TargetError> {
    let bytes = path.as_bytes();
    let mut decoded = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'%' => {
                let (Some(hi), Some(lo)) = (
                    bytes.get(i + 1).copied().and_then(hex),
                    bytes.get(i + 2).copied().and_then(hex),
                ) else {
                    return Err(TargetError::BadEscape);
                };
                let value = hi << 4 | lo;
                if value == b'/' || value == b'\\' {
                    return Err(TargetError::EncodedSeparator);
                }
                if value.is_ascii_control() {
                    return Err(TargetError::Control);
                }
                if is_unreserved(value) {
                    decoded.push(char::from(value));
                } else {
                    decoded.push('%');
                    decoded.push(char::from(b"0123456789ABCDEF"[usize::from(hi)]));
                    decoded.push(char::from(b"0123456789ABCDEF"[usize::from(lo)]));
                }
                i += 3;
            }
            b'\\' => return Err(TargetError::Backslash),
            _ if b.is_ascii_control() => return Err(TargetError::Control),
            _ => {
                decoded.push(char::from(b));
                i += 1;
            }
        }
    }
    remove_dot_segments(&decoded).map(Cow::Owned)
}

/// RFC 3986 §5.2.4 for an absolute path: `.` and `..` segments go, `..`
/// never climbs above the root. A dot segment with parameters (`..;x`) is
/// refused: servers disagree about whether it is a dot segment.
fn remove_dot_segments(path: &str) -> Result<String, TargetError> {
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path[1..].split('/').collect();
    let last = segments.len() - 1;
    let mut trailing_slash = false;
    for (i, seg) in segments.iter().enumerate() {
        let bare = seg.split(';').next().unwrap_or("");
        if (bare == "." || bare == "..") && seg.contains(';') {
            return Err(TargetError::DotSegmentParameters);
        }
        match *seg {
            "." => trailing_slash = i == last,
            ".." => {
                out.pop();
                trailing_slash = i == last;
            }
            s => {
                out.push(s);
                trailing_slash = false;
            }
        }
    }
    let mut result = String::with_capacity(path.len());
    for seg in &out {
        result.push('/');
        result.push_str(seg);
    }
    if trailing_slash || result.is_empty() {
        result.push('/');
    }
    Ok(result)
}

fn merge_slashes<'a>(path: &Cow<'a, str>) -> Cow<'a, str> {
    if !has_pair(path, *b"//") {
        return path.clone();
    }
    let mut merged = String::with_capacity(path.len());
    let mut previous_slash = false;
    for c in path.chars() {
        if c == '/' && previous_slash {
            continue;
        }
        previous_slash = c == '/';
        merged.push(c);
    }
    Cow::Owned(merged)
}

/// What a path is compared as: parameters cut from every segment, and
/// lower-cased unless the room is case-sensitive.
#[must_use]
pub fn match_key(path: &str, case_sensitive: bool) -> Cow<'_, str> {
    let plain =
        !path.contains(';') && (case_sensitive || !path.bytes().any(|b| b.is_ascii_uppercase()));
    if plain {
        return Cow::Borrowed(path);
    }
    let mut key = String::with_capacity(path.len());
    for (i, seg) in path.split('/').enumerate() {
        if i > 0 {
            key.push('/');
        }
        key.push_str(seg.split(';').next().unwrap_or(""));
    }
    if !case_sensitive {
        key.make_ascii_lowercase();
    }
    Cow::Owned(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every string of up to `len` characters over `alphabet`, the empty
    /// one included: the inputs of the exhaustive tests below.
    fn strings_over(alphabet: &[char], len: usize) -> Vec<String> {
        let mut all = vec![String::new()];
        let mut last = all.clone();
        for _ in 0..len {
            last = last
                .iter()
                .flat_map(|t| alphabet.iter().map(move |c| format!("{t}{c}")))
                .collect();
            all.extend(last.iter().cloned());
        }
        all
    }

    #[test]
    fn has_pair_is_contains() {
        for text in &strings_over(&['.', '/', 'a', '%'], 5) {
            for pair in ["..", "/.", "//", "a.", "./"] {
                let bytes: [u8; 2] = pair.as_bytes().try_into().unwrap();
                assert_eq!(
                    has_pair(text, bytes),
                    text.contains(pair),
                    "{text:?} {pair}"
                );
            }
        }
    }

    /// The one-pass scan of a path says what the checks it replaced said,
    /// on every string of up to five bytes over the bytes that matter.
    #[test]
    fn the_path_scan_agrees_with_the_checks_it_replaces() {
        let alphabet = ['.', '/', 'a', 'B', '%', '\\', '\u{1}', ':', '@', '~'];
        for text in &strings_over(&alphabet, 5) {
            let scan = PathScan::of(text.as_bytes());
            let needs_work = text
                .bytes()
                .any(|b| matches!(b, b'%' | b'\\') || b.is_ascii_control())
                || text.contains("/.");
            assert_eq!(scan.needs_work, needs_work, "{text:?}");
            assert_eq!(scan.double_slash, text.contains("//"), "{text:?}");
        }
    }

    /// `split_host` as it was before its one-pass checks (session 26):
    /// the reference the new one must agree with.
    fn split_host_before(authority: &str) -> Result<(Cow<'_, str>, Option<&str>), TargetError> {
        if authority.contains('@') {
            return Err(TargetError::BadHost);
        }
        let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
            let (inner, after) = rest.split_once(']').ok_or(TargetError::BadHost)?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or(TargetError::BadHost)?),
            };
            if inner.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(TargetError::BadHost);
            }
            (&authority[..inner.len() + 2], port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if let Some(p) = port
            && (p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(TargetError::BadHost);
        }
        let host = host.strip_suffix('.').unwrap_or(host);
        let valid = host.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'[' | b']' | b':')
        });
        if !valid || host.starts_with('.') || host.contains("..") {
            return Err(TargetError::BadHost);
        }
        Ok((Cow::Owned(host.to_ascii_lowercase()), port))
    }

    #[test]
    fn split_host_agrees_with_its_former_self_on_every_short_authority() {
        let mut texts = strings_over(&['.', ':', '[', ']', '@', 'a', 'B', '1', '-', '%'], 5);
        let own = |r: Result<(Cow<'_, str>, Option<&str>), TargetError>| {
            r.map(|(h, p)| (h.into_owned(), p.map(str::to_owned)))
                .map_err(|e| e.to_string())
        };
        for extra in [
            "", "[::1]", "[::1]:80", "[::1]@x", "u@[::1]", "h.:8080", "a..:1",
        ] {
            texts.push(extra.to_owned());
        }
        for text in &texts {
            assert_eq!(
                own(split_host(text)),
                own(split_host_before(text)),
                "{text:?}"
            );
        }
    }

    fn target(uri: &str, host: Option<&str>) -> Result<(String, String, String), TargetError> {
        let uri: Uri = uri.parse().unwrap();
        let mut headers = HeaderMap::new();
        if let Some(h) = host {
            headers.insert(header::HOST, h.parse().unwrap());
        }
        let t = normalize(&uri, &headers)?;
        Ok((
            t.host.into_owned(),
            t.merged.into_owned(),
            t.unmerged.into_owned(),
        ))
    }

    #[test]
    fn every_spelling_of_a_path_normalizes_to_one() {
        for spelling in [
            "/drop",
            "/%64rop",
            "/%64%72%6F%70",
            "/./drop",
            "/x/../drop",
            "/x/y/../../drop",
            "/../drop",
            "/%2e/drop",
            "/%2E%2E/drop",
            "/x/%2e%2e/drop",
            "//drop",
            "///drop",
        ] {
            let (_, merged, _) = target(spelling, Some("shop.example")).unwrap();
            assert_eq!(merged, "/drop", "{spelling}");
        }
        assert_eq!(target("/drop/", Some("h")).unwrap().1, "/drop/");
        assert_eq!(target("/drop/.", Some("h")).unwrap().1, "/drop/");
        assert_eq!(target("/drop/x/..", Some("h")).unwrap().1, "/drop/");
        assert_eq!(target("/a%20b", Some("h")).unwrap().1, "/a%20b");
        assert_eq!(target("/a%c3%a9", Some("h")).unwrap().1, "/a%C3%A9");
        assert_eq!(
            target("//drop", Some("h")).unwrap().2,
            "//drop",
            "unmerged kept"
        );
    }

    #[test]
    fn hosts_are_lower_case_without_trailing_dot_and_authority_wins() {
        assert_eq!(
            target("/", Some("Shop.Example.")).unwrap().0,
            "shop.example"
        );
        assert_eq!(
            target("/", Some("shop.example.:8080")).unwrap().0,
            "shop.example"
        );
        assert_eq!(
            target("http://shop.example/drop", Some("other.example"))
                .unwrap()
                .0,
            "shop.example",
            "RFC 9112 §3.2.2: the absolute-form authority, not Host"
        );
        assert_eq!(target("/", Some("[::1]:80")).unwrap().0, "[::1]");
        assert_eq!(target("/", None).unwrap().0, "");
    }

    #[test]
    fn ambiguous_targets_are_refused() {
        for (uri, err) in [
            ("/drop%2fx", TargetError::EncodedSeparator),
            ("/drop%2Fx", TargetError::EncodedSeparator),
            ("/drop%5cx", TargetError::EncodedSeparator),
            ("/drop%00", TargetError::Control),
            ("/drop%0a", TargetError::Control),
            ("/drop%zz", TargetError::BadEscape),
            ("/drop%4", TargetError::BadEscape),
            ("/x/..;/drop", TargetError::DotSegmentParameters),
            ("/x/.;a/drop", TargetError::DotSegmentParameters),
        ] {
            assert_eq!(target(uri, Some("h")), Err(err), "{uri}");
        }
        for host in ["a@b", "h:x", "h:123456", "[zz]", "a..b", ".a", "a b"] {
            let mut headers = HeaderMap::new();
            if let Ok(v) = host.parse() {
                headers.insert(header::HOST, v);
                let uri: Uri = "/".parse().unwrap();
                assert_eq!(
                    normalize(&uri, &headers),
                    Err(TargetError::BadHost),
                    "{host}"
                );
            }
        }
    }

    #[test]
    fn match_keys_cut_parameters_and_case() {
        assert_eq!(match_key("/drop;jsessionid=1/x", false), "/drop/x");
        assert_eq!(match_key("/DROP", false), "/drop");
        assert_eq!(match_key("/DROP", true), "/DROP");
        assert!(matches!(match_key("/drop", false), Cow::Borrowed(_)));
    }

    #[test]
    fn a_plain_path_allocates_nothing() {
        let uri: Uri = "/drop/item?x=1".parse().unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, "shop.example".parse().unwrap());
        let t = normalize(&uri, &headers).unwrap();
        assert!(matches!(t.merged, Cow::Borrowed(_)));
        assert!(matches!(t.host, Cow::Borrowed(_)));
        assert_eq!(t.path_and_query(true), "/drop/item?x=1");
    }
}
