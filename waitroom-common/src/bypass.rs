//! Bypass rules: requests of a room that go to the origin without a ticket
//! and without moving any count (static assets, health checks, a partner's
//! API calls).
//!
//! A rule is a `[[rooms.bypass]]` table; every condition it gives must hold
//! (AND), and a room's rules are tried in order, the first that matches wins.
//! These are the plain settings, pushed as they are from the aggregator; the
//! node compiles them (`waitroom_edge::bypass`) and checks them against the
//! request. What is checked here is what both sides must refuse alike.
//!
//! # Safe by construction
//! A bypass rule opens a door past the queue, so every check errs towards
//! *not* matching:
//! - Paths are compared against the one normalized spelling the router uses,
//!   literally and case-sensitively (a room's case-insensitive routing errs
//!   towards covering; a bypass must err towards not opening). A rule's own
//!   path must already be in that spelling (no `%`, `//`, dot segments,
//!   `;` or `\`), so an operator cannot write a rule that normalization
//!   would make mean something else.
//! - A path with parameters (`;`) matches no path rule: servers disagree on
//!   what `/static;x/../checkout` names.
//! - A user agent is whatever the client says it is: a rule on it alone is
//!   refused; it needs `client_cidrs` beside it.
use serde::{Deserialize, Serialize};

/// Most bypass rules in one room (each is tried on every request).
pub const MAX_RULES: usize = 64;

/// One `[[rooms.bypass]]` table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BypassRule {
    /// Names the rule in metrics (`waitroom_bypassed_total{rule=..}`).
    pub name: String,
    /// The path starts with this (`/static/`); a prefix without a trailing
    /// `/` still only matches whole segments (`/healthz` is not `/healthzx`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// The path matches this glob: `*` is any run within one segment, `**`
    /// any run across segments (`/assets/**/*.css`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_glob: Option<String>,
    /// The method is one of these (upper-case, as HTTP spells them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// A request header is present (or has exactly `value`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<FieldMatch>,
    /// A cookie is present (or has exactly `value`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<FieldMatch>,
    /// The client address (after PROXY protocol and trusted forwarding
    /// headers) is in one of these blocks (`10.0.0.0/8`, `2001:db8::/32`, or
    /// a single address).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_cidrs: Vec<String>,
    /// The `User-Agent` contains this (ASCII case-insensitive). Needs
    /// `client_cidrs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_agent: Option<String>,
}

/// A header or cookie the rule looks for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldMatch {
    pub name: String,
    /// Absent: presence is enough. Present: the value must be exactly this
    /// (compared in constant time: it is typically a partner's key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// Why a bypass rule was refused; [`field`](Self::field) names the key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BypassError {
    #[error("more than {MAX_RULES} bypass rules")]
    TooMany,
    #[error("must not be empty")]
    EmptyName,
    #[error("duplicate rule name {name:?} (also bypass[{first}])")]
    DuplicateName { name: String, first: usize },
    #[error(
        "the rule has no condition: it would let every request past the queue (give a path, method, header, cookie or client_cidrs)"
    )]
    NoCondition,
    #[error(
        "{path:?} is not in the one spelling requests are matched in: it must start with '/' and have no '%', '\\', ';', '//' or dot segments"
    )]
    PathNotNormal { field: &'static str, path: String },
    #[error("{method:?} is not an upper-case HTTP method")]
    Method { method: String },
    #[error("{name:?} is not a header or cookie name")]
    FieldName { field: &'static str, name: String },
    #[error("must not be empty")]
    EmptyValue { field: &'static str },
    #[error("{cidr:?} is not an address or CIDR block (as 10.0.0.0/8 or 2001:db8::/32)")]
    Cidr { cidr: String },
    #[error("a user agent is whatever the client says it is: combine user_agent with client_cidrs")]
    UserAgentAlone,
}

impl BypassError {
    /// The key to fix, relative to the rule (`path_prefix`).
    #[must_use]
    pub fn field(&self) -> &'static str {
        match self {
            Self::TooMany | Self::NoCondition => "",
            Self::EmptyName | Self::DuplicateName { .. } => "name",
            Self::PathNotNormal { field, .. }
            | Self::FieldName { field, .. }
            | Self::EmptyValue { field } => field,
            Self::Method { .. } => "methods",
            Self::Cidr { .. } => "client_cidrs",
            Self::UserAgentAlone => "user_agent",
        }
    }
}

/// Checks a room's rules; on failure, which rule (`None`: the list) and why.
pub fn validate_rules(rules: &[BypassRule]) -> Result<(), (Option<usize>, BypassError)> {
    if rules.len() > MAX_RULES {
        return Err((None, BypassError::TooMany));
    }
    for (i, rule) in rules.iter().enumerate() {
        if let Some(first) = rules[..i].iter().position(|r| r.name == rule.name) {
            return Err((
                Some(i),
                BypassError::DuplicateName {
                    name: rule.name.clone(),
                    first,
                },
            ));
        }
        rule.validate().map_err(|e| (Some(i), e))?;
    }
    Ok(())
}

impl BypassRule {
    /// Checks what serde's types cannot say.
    pub fn validate(&self) -> Result<(), BypassError> {
        if self.name.is_empty() {
            return Err(BypassError::EmptyName);
        }
        for (field, path) in [
            ("path_prefix", &self.path_prefix),
            ("path_glob", &self.path_glob),
        ] {
            if let Some(path) = path
                && !is_normal_path(path)
            {
                return Err(BypassError::PathNotNormal {
                    field,
                    path: path.clone(),
                });
            }
        }
        for method in &self.methods {
            if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(BypassError::Method {
                    method: method.clone(),
                });
            }
        }
        for (field, m) in [("header", &self.header), ("cookie", &self.cookie)] {
            let Some(m) = m else { continue };
            if m.name.is_empty() || !m.name.bytes().all(is_token_byte) {
                return Err(BypassError::FieldName {
                    field,
                    name: m.name.clone(),
                });
            }
            if m.value.as_deref() == Some("") {
                return Err(BypassError::EmptyValue { field });
            }
        }
        for cidr in &self.client_cidrs {
            if parse_cidr(cidr).is_none() {
                return Err(BypassError::Cidr { cidr: cidr.clone() });
            }
        }
        if self.user_agent.as_deref() == Some("") {
            return Err(BypassError::EmptyValue {
                field: "user_agent",
            });
        }
        if self.user_agent.is_some() && self.client_cidrs.is_empty() {
            return Err(BypassError::UserAgentAlone);
        }
        let any = self.path_prefix.is_some()
            || self.path_glob.is_some()
            || !self.methods.is_empty()
            || self.header.is_some()
            || self.cookie.is_some()
            || !self.client_cidrs.is_empty();
        if !any {
            return Err(BypassError::NoCondition);
        }
        Ok(())
    }
}

/// A path as the router's normalization leaves it, and without parameters.
fn is_normal_path(path: &str) -> bool {
    path.starts_with('/')
        && !path.contains(['%', '\\', ';', '?', '#'])
        && !path.contains("//")
        && !path.bytes().any(|b| b.is_ascii_control() || b == b' ')
        && !path.split('/').any(|seg| seg == "." || seg == "..")
}

/// RFC 9110 `tchar`.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// `addr/len` or a single address, as (network address, prefix length); the
/// host bits need not be zero (they are ignored when matching).
#[must_use]
pub fn parse_cidr(text: &str) -> Option<(core::net::IpAddr, u8)> {
    let text = text.trim();
    let (addr, len) = match text.split_once('/') {
        Some((addr, len)) => (addr, Some(len)),
        None => (text, None),
    };
    let addr: core::net::IpAddr = addr.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len = match len {
        Some(len) if !len.is_empty() && len.bytes().all(|b| b.is_ascii_digit()) => {
            len.parse::<u8>().ok()?
        }
        Some(_) => return None,
        None => max,
    };
    (len <= max).then_some((addr, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(text: &str) -> BypassRule {
        toml::from_str(&format!("name = \"r\"\n{text}")).unwrap()
    }

    #[test]
    fn typical_rules_are_accepted() {
        for text in [
            "path_prefix = \"/static/\"",
            "path_glob = \"/assets/**/*.css\"\nmethods = [\"GET\", \"HEAD\"]",
            "path_prefix = \"/healthz\"",
            "header = { name = \"x-partner-key\", value = \"s3cret\" }",
            "cookie = { name = \"staff\" }",
            "client_cidrs = [\"10.0.0.0/8\", \"2001:db8::/32\", \"192.0.2.7\"]",
            "user_agent = \"Pingdom\"\nclient_cidrs = [\"203.0.113.0/24\"]",
        ] {
            assert_eq!(rule(text).validate(), Ok(()), "{text}");
        }
    }

    /// The tired operator: each mistake that would open more than meant is
    /// refused, naming the key.
    #[test]
    fn rules_that_would_open_too_much_are_refused() {
        let cases = [
            ("", ""),
            ("path_prefix = \"static/\"", "path_prefix"),
            ("path_prefix = \"/static/../checkout\"", "path_prefix"),
            ("path_prefix = \"/static/%2e%2e/\"", "path_prefix"),
            ("path_prefix = \"//static\"", "path_prefix"),
            ("path_glob = \"/a;x/*\"", "path_glob"),
            ("methods = [\"get\"]", "methods"),
            ("header = { name = \"x key\" }", "header"),
            ("header = { name = \"x-key\", value = \"\" }", "header"),
            ("client_cidrs = [\"10.0.0.0/33\"]", "client_cidrs"),
            ("client_cidrs = [\"example.com\"]", "client_cidrs"),
            ("user_agent = \"Googlebot\"", "user_agent"),
        ];
        for (text, field) in cases {
            let err = rule(text).validate().unwrap_err();
            assert_eq!(err.field(), field, "{text}: {err}");
        }
        assert_eq!(rule("").validate(), Err(BypassError::NoCondition));
        let twice = [rule("methods = [\"OPTIONS\"]"), rule("methods = [\"GET\"]")];
        let (at, err) = validate_rules(&twice).unwrap_err();
        assert_eq!((at, err.field()), (Some(1), "name"));
    }

    #[test]
    fn cidrs_parse_like_the_node_reads_them() {
        assert_eq!(
            parse_cidr("10.1.2.3/8"),
            Some(("10.1.2.3".parse().unwrap(), 8))
        );
        assert_eq!(parse_cidr("::1"), Some(("::1".parse().unwrap(), 128)));
        for bad in ["10.0.0.0/", "10.0.0.0/+8", "::/129", "x/1"] {
            assert_eq!(parse_cidr(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_rule_round_trips_through_json_as_the_aggregator_pushes_it() {
        let r =
            rule("path_prefix = \"/api/\"\nheader = { name = \"x-partner-key\", value = \"k\" }");
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<BypassRule>(&json).unwrap(), r);
    }
}
