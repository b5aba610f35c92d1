//! A room's bypass rules, compiled: which requests go to the origin without
//! a ticket and without moving any count (see [`waitroom_common::bypass`]
//! for the settings and why each check errs towards not matching).
//!
//! The request path asks [`BypassRules::find`] right after routing, with the
//! normalized path the router matched and the origin will receive, and the
//! client address after PROXY protocol and trusted forwarding headers. Each
//! rule counts its matches for `waitroom_bypassed_total`.
use std::{
    fmt,
    net::IpAddr,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
};

use http::{HeaderMap, HeaderName, Method, header};
use ipnet::IpNet;
use ring::digest::{SHA256, digest};
use waitroom_common::bypass::{BypassError, BypassRule, parse_cidr};
use waitroom_runtime::metrics::Families;

/// A room's rules, in order; the first that matches wins.
#[derive(Debug, Default)]
pub struct BypassRules {
    rules: Vec<Compiled>,
}

/// One rule, ready to test a request.
struct Compiled {
    name: String,
    prefix: Option<String>,
    glob: Option<String>,
    methods: Vec<Method>,
    header: Option<(HeaderName, Option<Secret>)>,
    cookie: Option<(String, Option<Secret>)>,
    nets: Vec<IpNet>,
    /// Lower-case.
    user_agent: Option<String>,
    /// Requests this rule let through.
    hits: AtomicU64,
}

impl fmt::Debug for Compiled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the values: they are partners' keys.
        f.debug_struct("Compiled")
            .field("name", &self.name)
            .field("prefix", &self.prefix)
            .field("glob", &self.glob)
            .finish_non_exhaustive()
    }
}

/// A value compared in constant time: the SHA-256 of the configured value
/// against that of the presented one, so neither the bytes nor the length
/// of the secret shows in the timing.
struct Secret([u8; 32]);

impl Secret {
    fn new(value: &str) -> Self {
        Self(sha256(value.as_bytes()))
    }

    fn matches(&self, presented: &[u8]) -> bool {
        let other = sha256(presented);
        self.0
            .iter()
            .zip(other)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0; 32];
    out.copy_from_slice(digest(&SHA256, bytes).as_ref());
    out
}

/// What a rule looks at in a request.
#[derive(Debug, Clone, Copy)]
pub struct Probe<'a> {
    pub method: &'a Method,
    /// The normalized path (as routed and as forwarded), without the query.
    pub path: &'a str,
    pub headers: &'a HeaderMap,
    /// The client after PROXY protocol and trusted forwarding headers.
    pub client: IpAddr,
}

impl BypassRules {
    /// Compiles validated rules; a rule that does not validate is refused
    /// (the config check already said so; this keeps a pushed setting honest).
    pub fn new(rules: &[BypassRule]) -> Result<Self, BypassError> {
        let compiled = rules
            .iter()
            .map(|rule| {
                rule.validate()?;
                Ok(Compiled {
                    name: rule.name.clone(),
                    prefix: rule.path_prefix.clone(),
                    glob: rule.path_glob.clone(),
                    methods: rule
                        .methods
                        .iter()
                        .filter_map(|m| Method::from_bytes(m.as_bytes()).ok())
                        .collect(),
                    header: rule.header.as_ref().and_then(|h| {
                        let name = HeaderName::from_bytes(h.name.as_bytes()).ok()?;
                        Some((name, h.value.as_deref().map(Secret::new)))
                    }),
                    cookie: rule
                        .cookie
                        .as_ref()
                        .map(|c| (c.name.clone(), c.value.as_deref().map(Secret::new))),
                    nets: rule
                        .client_cidrs
                        .iter()
                        .filter_map(|c| parse_cidr(c))
                        .filter_map(|(addr, len)| IpNet::new(addr, len).ok())
                        .map(|n| n.trunc())
                        .collect(),
                    user_agent: rule.user_agent.as_ref().map(|u| u.to_ascii_lowercase()),
                    hits: AtomicU64::new(0),
                })
            })
            .collect::<Result<_, BypassError>>()?;
        Ok(Self { rules: compiled })
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The first rule the request matches (its name), counted.
    #[must_use]
    pub fn find(&self, probe: &Probe<'_>) -> Option<&str> {
        let rule = self.rules.iter().find(|r| r.matches(probe))?;
        rule.hits.fetch_add(1, Relaxed);
        Some(&rule.name)
    }

    /// Keeps the counts of rules of the same name across a reload.
    pub fn carry_over(&self, before: &Self) {
        for rule in &self.rules {
            if let Some(old) = before.rules.iter().find(|o| o.name == rule.name) {
                rule.hits.store(old.hits.load(Relaxed), Relaxed);
            }
        }
    }

    /// `(rule, requests let through)`.
    pub fn counts(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.rules
            .iter()
            .map(|r| (r.name.as_str(), r.hits.load(Relaxed)))
    }
}

impl Compiled {
    fn matches(&self, p: &Probe<'_>) -> bool {
        let has_path_rule = self.prefix.is_some() || self.glob.is_some();
        // Servers disagree on what a path with parameters names: no path
        // rule opens one.
        if has_path_rule && p.path.contains(';') {
            return false;
        }
        if let Some(prefix) = &self.prefix
            && !has_prefix(p.path, prefix)
        {
            return false;
        }
        if let Some(glob) = &self.glob
            && !glob_matches(glob.as_bytes(), p.path.as_bytes())
        {
            return false;
        }
        if !self.methods.is_empty() && !self.methods.contains(p.method) {
            return false;
        }
        if let Some((name, value)) = &self.header {
            let mut values = p.headers.get_all(name).iter();
            let ok = match value {
                None => values.next().is_some(),
                Some(secret) => values.any(|v| secret.matches(v.as_bytes())),
            };
            if !ok {
                return false;
            }
        }
        if let Some((name, value)) = &self.cookie {
            let mut values = cookie_values(p.headers, name);
            let ok = match value {
                None => values.next().is_some(),
                Some(secret) => values.any(|v| secret.matches(v.as_bytes())),
            };
            if !ok {
                return false;
            }
        }
        if !self.nets.is_empty() {
            let client = p.client.to_canonical();
            if !self.nets.iter().any(|n| n.contains(&client)) {
                return false;
            }
        }
        if let Some(ua) = &self.user_agent {
            let Some(value) = p.headers.get(header::USER_AGENT) else {
                return false;
            };
            if !value
                .as_bytes()
                .to_ascii_lowercase()
                .windows(ua.len())
                .any(|w| w == ua.as_bytes())
            {
                return false;
            }
        }
        true
    }
}

/// Every value of cookie `name` in the request's `Cookie` headers.
fn cookie_values<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = &'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(move |(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// `/static/` covers `/static/app.js`; `/healthz` covers `/healthz` and
/// `/healthz/x` but not `/healthzx`.
fn has_prefix(path: &str, prefix: &str) -> bool {
    if prefix.ends_with('/') {
        return path.starts_with(prefix);
    }
    path == prefix || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

/// `*`: any run of bytes but `/`; `**/`: zero or more whole segments; `**`
/// elsewhere: any run. Backtracking is bounded by the lengths (at most 64
/// rules × a path the header limit bounds).
fn glob_matches(pattern: &[u8], path: &[u8]) -> bool {
    match pattern {
        [] => path.is_empty(),
        [b'*', b'*', b'/', rest @ ..] => (0..=path.len())
            .any(|i| (i == 0 || path[i - 1] == b'/') && glob_matches(rest, &path[i..])),
        [b'*', b'*', rest @ ..] => (0..=path.len()).any(|i| glob_matches(rest, &path[i..])),
        [b'*', rest @ ..] => {
            let segment = path.iter().position(|&b| b == b'/').unwrap_or(path.len());
            (0..=segment).any(|i| glob_matches(rest, &path[i..]))
        }
        [c, rest @ ..] => path.first() == Some(c) && glob_matches(rest, &path[1..]),
    }
}

/// `waitroom_bypassed_total{room, rule}`.
pub fn encode<'a>(
    f: &mut Families<'_>,
    rooms: impl Iterator<Item = (&'a str, &'a BypassRules)>,
) -> fmt::Result {
    let samples: Vec<([(&str, &str); 2], u64)> = rooms
        .flat_map(|(room, rules)| {
            rules
                .counts()
                .map(move |(rule, n)| ([("room", room), ("rule", rule)], n))
        })
        .collect();
    f.counters(
        "waitroom_bypassed_total",
        "Requests a bypass rule sent to the origin without a ticket and without counting, by rule.",
        samples,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn rules(text: &str) -> BypassRules {
        #[derive(serde::Deserialize)]
        struct File {
            bypass: Vec<BypassRule>,
        }
        let file: File = toml::from_str(text).unwrap();
        BypassRules::new(&file.bypass).unwrap()
    }

    const EXAMPLE: &str = r#"
[[bypass]]
name = "static"
path_prefix = "/static/"
methods = ["GET", "HEAD"]
[[bypass]]
name = "css"
path_glob = "/assets/**/*.css"
[[bypass]]
name = "health"
path_prefix = "/healthz"
[[bypass]]
name = "partner"
path_prefix = "/api/"
header = { name = "x-partner-key", value = "s3cret-partner-key" }
[[bypass]]
name = "office"
client_cidrs = ["10.20.0.0/16", "2001:db8::/32"]
[[bypass]]
name = "monitor"
user_agent = "pingdom"
client_cidrs = ["203.0.113.0/24"]
"#;

    fn probe<'a>(method: &'a Method, path: &'a str, headers: &'a HeaderMap) -> Probe<'a> {
        Probe {
            method,
            path,
            headers,
            client: "198.51.100.9".parse().unwrap(),
        }
    }

    #[test]
    fn the_example_rules_let_their_requests_through() {
        let r = rules(EXAMPLE);
        let none = HeaderMap::new();
        let get = Method::GET;
        assert_eq!(
            r.find(&probe(&get, "/static/app.js", &none)),
            Some("static")
        );
        assert_eq!(r.find(&probe(&Method::POST, "/static/app.js", &none)), None);
        assert_eq!(
            r.find(&probe(&get, "/assets/a/b/site.css", &none)),
            Some("css")
        );
        assert_eq!(r.find(&probe(&get, "/assets/site.css", &none)), Some("css"));
        assert_eq!(r.find(&probe(&get, "/healthz", &none)), Some("health"));
        let mut key = HeaderMap::new();
        key.insert(
            "x-partner-key",
            HeaderValue::from_static("s3cret-partner-key"),
        );
        assert_eq!(r.find(&probe(&get, "/api/orders", &key)), Some("partner"));
        let mut office = probe(&get, "/checkout", &none);
        office.client = "10.20.3.4".parse().unwrap();
        assert_eq!(r.find(&office), Some("office"));
        office.client = "::ffff:10.20.3.4".parse().unwrap();
        assert_eq!(r.find(&office), Some("office"), "a v4-mapped client");
        let mut ua = HeaderMap::new();
        ua.insert(
            header::USER_AGENT,
            HeaderValue::from_static("Pingdom.com_bot"),
        );
        let mut monitor = probe(&get, "/checkout", &ua);
        monitor.client = "203.0.113.5".parse().unwrap();
        assert_eq!(r.find(&monitor), Some("monitor"));
        let counts: Vec<_> = r.counts().collect();
        assert_eq!(counts[0], ("static", 1));
        assert_eq!(counts[4], ("office", 2));
    }

    /// The attacker: the router's normalization already turned
    /// `/static/../checkout`, `/static/%2e%2e/checkout` and `//static/..//checkout`
    /// into `/checkout` (see `crate::target`); what reaches a rule is that.
    /// Spellings that survive normalization must not open anything either.
    #[test]
    fn spellings_and_spoofs_do_not_open_a_protected_path() {
        let r = rules(EXAMPLE);
        let none = HeaderMap::new();
        let get = Method::GET;
        for path in [
            "/checkout",
            "/STATIC/app.js",   // bypass paths compare case-sensitively
            "/static;x/app.js", // parameters: servers disagree
            "/static/x;/../../checkout",
            "/healthzx",
            "/healthz;/../checkout",
            "/assets/checkout",
            "/assets/x.css/checkout",
            "/api/orders", // no key
        ] {
            assert_eq!(r.find(&probe(&get, path, &none)), None, "{path}");
        }
        for (path, routed) in [
            ("/static/../checkout", true),
            ("/static/%2e%2e/checkout", true),
            ("//static/..//checkout", true),
            ("/static/%2E%2E/checkout", true),
        ] {
            let t = crate::target::from_parts("shop.example", path).unwrap();
            let normalized = t.path(routed);
            assert_eq!(normalized, "/checkout", "{path}");
            assert_eq!(r.find(&probe(&get, normalized, &none)), None, "{path}");
        }
        // A wrong key, a prefix of the key, the key in another header, and a
        // user agent from outside the monitor's block.
        for (name, value) in [
            ("x-partner-key", "s3cret"),
            ("x-partner-key", "s3cret-partner-key "),
            ("x-partner-keys", "s3cret-partner-key"),
        ] {
            let mut h = HeaderMap::new();
            h.insert(
                HeaderName::from_static(name),
                HeaderValue::from_str(value).unwrap(),
            );
            assert_eq!(
                r.find(&probe(&get, "/api/orders", &h)),
                None,
                "{name}: {value}"
            );
        }
        let mut ua = HeaderMap::new();
        ua.insert(
            header::USER_AGENT,
            HeaderValue::from_static("Pingdom.com_bot"),
        );
        assert_eq!(r.find(&probe(&get, "/checkout", &ua)), None);
    }

    #[test]
    fn counts_survive_a_reload_by_rule_name() {
        let before = rules(EXAMPLE);
        let none = HeaderMap::new();
        assert!(
            before
                .find(&probe(&Method::GET, "/healthz", &none))
                .is_some()
        );
        let after = rules(EXAMPLE);
        after.carry_over(&before);
        assert!(after.counts().any(|(rule, n)| rule == "health" && n == 1));
    }

    #[test]
    fn globs_keep_single_stars_within_a_segment() {
        assert!(glob_matches(b"/a/*.js", b"/a/x.js"));
        assert!(!glob_matches(b"/a/*.js", b"/a/b/x.js"));
        assert!(glob_matches(b"/a/**.js", b"/a/b/x.js"));
        assert!(glob_matches(b"/**", b"/"));
        assert!(glob_matches(b"/a/**/x.js", b"/a/x.js"));
        assert!(glob_matches(b"/a/**/x.js", b"/a/b/c/x.js"));
        assert!(!glob_matches(b"/a/**/x.js", b"/a/bx.js"));
        assert!(!glob_matches(b"/a/*", b"/b/x"));
    }
}
