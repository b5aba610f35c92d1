//! Who the client is, and what the origin is told about it.
//!
//! The node believes `X-Forwarded-For` / `Forwarded` only from an address in
//! `node.trusted_proxies` (nginx `set_real_ip_from` with `real_ip_recursive
//! on`): walking the chain from the right, the client is the first address
//! that is not itself a trusted proxy. Everyone else's forwarding headers are
//! the client's own words: they are removed before the origin sees them
//! (see [`rewrite_for_origin`]), and the client is the connection's address.
//!
//! The node's own hop is a `Via: 1.1 waitroom-<node id>` ([`Via`]); a request
//! that already carries it has come round (an origin that points back at the
//! node) and is refused with 508 instead of going round again.
use std::{
    fmt,
    net::{IpAddr, Ipv6Addr},
    str::FromStr,
};

use http::{HeaderMap, HeaderName, HeaderValue, Version, header};
use ipnet::IpNet;

/// One entry of `node.trusted_proxies`: an address (`10.0.0.1`) or a CIDR
/// block (`10.0.0.0/8`, `2001:db8::/32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyNet(pub IpNet);

impl FromStr for ProxyNet {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if let Ok(net) = s.parse::<IpNet>() {
            return Ok(Self(net.trunc()));
        }
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(Self(IpNet::from(ip)));
        }
        Err(format!(
            "{s:?} is not an address or CIDR block (as 10.0.0.0/8 or 2001:db8::/32)"
        ))
    }
}

impl fmt::Display for ProxyNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<'de> serde::Deserialize<'de> for ProxyNet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl serde::Serialize for ProxyNet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The addresses whose forwarding headers (and PROXY protocol headers) the
/// node believes.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    #[must_use]
    pub fn new(nets: &[ProxyNet]) -> Self {
        Self(nets.iter().map(|n| n.0).collect())
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `ip` is a trusted proxy. An IPv4-mapped IPv6 address
    /// (`::ffff:10.0.0.1`, what a dual-stack socket reports) counts as its
    /// IPv4 address.
    #[must_use]
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// The client of a request that `hop` (the connection's client: the
    /// socket's peer, or the PROXY header's source) handed to the node: `hop`
    /// itself unless it is trusted, else what its forwarding headers say
    /// (see [`Self::resolve_chain`]). `X-Forwarded-For` is read when
    /// present, else the `for=` of `Forwarded`.
    #[must_use]
    pub fn resolve(&self, hop: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.contains(hop) {
            return hop;
        }
        let xff: Vec<&str> = header_items(headers, &X_FORWARDED_FOR, ',').collect();
        if !xff.is_empty() {
            return self.resolve_chain(hop, xff.iter().rev().map(|e| parse_xff_entry(e)));
        }
        let forwarded: Vec<&str> = header_items(headers, &header::FORWARDED, ',').collect();
        if !forwarded.is_empty() {
            return self.resolve_chain(hop, forwarded.iter().rev().map(|e| parse_forwarded_for(e)));
        }
        hop
    }

    /// The standard walk (nginx `real_ip_recursive on`): from `hop`, while
    /// the address at hand is a trusted proxy, step to the one it names
    /// (`right_to_left`, nearest first; `None` for an entry that is not an
    /// address). The client is the first address that is not trusted; when
    /// every address is trusted, the left-most one; when a trusted proxy
    /// names something that is not an address (`unknown`, an obfuscated
    /// name, garbage), that proxy: nothing further can be believed.
    #[must_use]
    pub fn resolve_chain(
        &self,
        hop: IpAddr,
        right_to_left: impl Iterator<Item = Option<IpAddr>>,
    ) -> IpAddr {
        let mut client = hop.to_canonical();
        for entry in right_to_left {
            if !self.contains(client) {
                break;
            }
            match entry {
                Some(ip) => client = ip.to_canonical(),
                None => break,
            }
        }
        client
    }
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_PORT: HeaderName = HeaderName::from_static("x-forwarded-port");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// The headers a client could use to say who it is or how it came; from a
/// peer outside `trusted_proxies` they are removed before the origin sees
/// them.
/// A `static`: a `const` array is built and dropped, name by name, wherever
/// it is named (about 350 instructions a proxied request, issue 17).
pub static CLIENT_CLAIMS: [HeaderName; 6] = [
    header::FORWARDED,
    X_FORWARDED_FOR,
    X_FORWARDED_HOST,
    X_FORWARDED_PROTO,
    X_FORWARDED_PORT,
    X_REAL_IP,
];

/// End-to-end headers the node sets or routes by: a `Connection` header
/// nominating one of them (RFC 9110 §7.6.1 would make the node drop it) is
/// ignored for that name, so a client cannot take away the origin's `Host`
/// or the node's `Via` and `X-Forwarded-For`. (`Cookie` is not here: a
/// client that drops its own cookies gains nothing it could not get by not
/// sending them.)
/// A `static`: a `const` array is built and dropped, name by name, wherever
/// it is named (about 350 instructions a proxied request, issue 17).
pub static PROTECTED_FROM_NOMINATION: [HeaderName; 7] = [
    header::HOST,
    header::VIA,
    header::FORWARDED,
    X_FORWARDED_FOR,
    X_FORWARDED_HOST,
    X_FORWARDED_PROTO,
    X_REAL_IP,
];

/// Comma- (or other `sep`-) separated items of every `name` line, trimmed,
/// empty ones skipped; a line that is not visible ASCII counts as one
/// unreadable item (`"\u{0}"`, which parses as no address).
fn header_items<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
    sep: char,
) -> impl Iterator<Item = &'a str> {
    headers
        .get_all(name)
        .iter()
        .flat_map(move |v| match v.to_str() {
            Ok(s) => s
                .split(sep)
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .collect(),
            Err(_) => vec!["\u{0}"],
        })
}

/// An `X-Forwarded-For` entry: an address, optionally with a port
/// (`192.0.2.1:4711`, `[2001:db8::1]:4711`).
fn parse_xff_entry(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim().trim_matches('"');
    if let Ok(ip) = entry.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(rest) = entry.strip_prefix('[') {
        let (inside, _) = rest.split_once(']')?;
        return inside.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    let (host, port) = entry.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

/// The `for=` of one `Forwarded` element (RFC 7239): `for=192.0.2.1`,
/// `for="[2001:db8::1]:4711"`; `unknown` and obfuscated names are no address.
fn parse_forwarded_for(element: &str) -> Option<IpAddr> {
    element.split(';').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        if !key.trim().eq_ignore_ascii_case("for") {
            return None;
        }
        parse_xff_entry(value)
    })
}

/// The node's own `Via` entry: `1.1 waitroom-<node id>`.
#[derive(Debug, Clone)]
pub struct Via {
    token: String,
    /// `Via` values for a request received over HTTP/1.0, 1.1 and 2.
    values: [HeaderValue; 3],
}

impl Via {
    /// The node's `Via` pseudonym: `waitroom-` and the node id, every
    /// character that may not appear in an HTTP token made `-`.
    #[must_use]
    pub fn new(node_id: &str) -> Self {
        let id: String = node_id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c) {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        let token = format!("waitroom-{id}");
        // Static bytes: cloning the value for every request and response is
        // then a copy, not a reference count every worker would share. Made
        // at start and at a reload, a few dozen bytes each time.
        let value = |v: &str| {
            let text = format!("{v} {token}");
            if HeaderValue::from_str(&text).is_ok() {
                HeaderValue::from_static(Box::leak(text.into_boxed_str()))
            } else {
                HeaderValue::from_static("1.1 waitroom")
            }
        };
        Self {
            values: [value("1.0"), value("1.1"), value("2")],
            token,
        }
    }

    #[must_use]
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The entry for a request (or response) received over `version`.
    #[must_use]
    pub fn value(&self, version: Version) -> HeaderValue {
        match version {
            Version::HTTP_10 | Version::HTTP_09 => self.values[0].clone(),
            Version::HTTP_2 | Version::HTTP_3 => self.values[2].clone(),
            _ => self.values[1].clone(),
        }
    }

    /// Whether the request already passed this node: a `Via` entry whose
    /// received-by is this node's token (any case).
    #[must_use]
    pub fn seen_in(&self, headers: &HeaderMap) -> bool {
        header_items(headers, &header::VIA, ',').any(|entry| {
            entry
                .split_ascii_whitespace()
                .nth(1)
                .is_some_and(|by| by.eq_ignore_ascii_case(&self.token))
        })
    }
}

/// What the node knows about the request it hands to the origin.
#[derive(Debug, Clone, Copy)]
pub struct Forwarding {
    /// The resolved client ([`TrustedProxies::resolve`]).
    pub client: IpAddr,
    /// Who handed the request to the node: the connection's client (the
    /// peer, or the PROXY header's source).
    pub hop: IpAddr,
    /// `hop` is in `trusted_proxies`: its forwarding headers are kept and
    /// appended to.
    pub trusted: bool,
    /// `http` or `https`: how the request reached the node.
    pub scheme: &'static str,
}

/// Makes the origin's forwarding headers say what the node knows, and
/// returns whether client-supplied ones were removed (an untrusted hop
/// sent some):
///
/// - untrusted hop: every [`CLIENT_CLAIMS`] header is removed; then
///   `X-Forwarded-For: <client>`, `X-Real-IP: <client>`,
///   `X-Forwarded-Proto: <scheme>`, `Forwarded: for=<client>;proto=<scheme>`.
/// - trusted hop: its headers stay; `X-Forwarded-For` gets `<hop>` appended,
///   a `Forwarded` it sent gets `for=<hop>;proto=<scheme>` appended,
///   `X-Forwarded-Proto` is set to `<scheme>` only when it sent none, and
///   `X-Real-IP` is the resolved client.
pub fn rewrite_for_origin(headers: &mut HeaderMap, f: &Forwarding) -> bool {
    let (removed, additions) = forwarding_for_origin(headers, f);
    additions.apply(headers);
    removed
}

/// [`rewrite_for_origin`] with the node's headers returned instead of put
/// in `headers` (client claims from an untrusted hop are removed from
/// `headers` all the same): a request written by hand to the origin
/// ([`crate::origin_h1`]) writes them after the visitor's, where four
/// insertions into the map (and the map growing for them) cost more than
/// the rest of the rewrite (issue 17).
pub fn forwarding_for_origin(headers: &mut HeaderMap, f: &Forwarding) -> (bool, Additions) {
    // Which claims the request carries, from one pass over its names: a
    // hashed lookup per claim cost more than the rewrite (issue 17).
    let mut present = claims_present(headers);
    let has = |present: u8, name: &HeaderName| {
        CLIENT_CLAIMS
            .iter()
            .position(|c| c == name)
            .is_some_and(|i| present & (1 << i) != 0)
    };
    let mut removed = false;
    if !f.trusted && present != 0 {
        for (i, name) in CLIENT_CLAIMS.iter().enumerate() {
            if present & (1 << i) != 0 {
                headers.remove(name);
            }
        }
        present = 0;
        removed = true;
    }
    let hop = f.hop.to_canonical();
    let own = OwnEntries::of(hop, f.client.to_canonical(), f.scheme);
    let mut additions = Additions::default();
    // Several lines are one list, in order (RFC 9110 §5.3); a line that is
    // not text leaves only the node's own entry.
    let xff = if has(present, &X_FORWARDED_FOR) {
        let lines: Option<Vec<&str>> = headers
            .get_all(&X_FORWARDED_FOR)
            .iter()
            .map(|v| v.to_str().ok())
            .collect();
        match lines {
            Some(lines) => value_or_empty(&format!("{}, {hop}", lines.join(", "))),
            None => own.hop,
        }
    } else {
        own.hop
    };
    additions.replaces_present = has(present, &X_FORWARDED_FOR) || has(present, &X_REAL_IP);
    additions.push(X_FORWARDED_FOR, xff, true);
    additions.push(X_REAL_IP, own.client, true);
    if !has(present, &X_FORWARDED_PROTO) {
        additions.push(X_FORWARDED_PROTO, HeaderValue::from_static(f.scheme), true);
    }
    if has(present, &header::FORWARDED) {
        additions.push(header::FORWARDED, own.element, false);
    } else if !f.trusted {
        additions.push(header::FORWARDED, own.element, true);
    }
    (removed, additions)
}

/// A header the node sets on a request to the origin.
#[derive(Debug, Clone)]
pub struct Addition {
    pub name: HeaderName,
    pub value: HeaderValue,
    /// Replaces every value the request carried under the name (else it
    /// follows them).
    pub replace: bool,
}

/// The headers the node sets on a request to the origin, in order; at most
/// five (the forwarding headers and `Via`), so no allocation.
#[derive(Debug, Clone, Default)]
pub struct Additions {
    items: [Option<Addition>; 5],
    len: usize,
    /// The request carries a header that one of these replaces (else
    /// nothing of the request's needs to be left out for them).
    pub replaces_present: bool,
}

impl Additions {
    /// Adds one; over five is a bug of the caller.
    pub fn push(&mut self, name: HeaderName, value: HeaderValue, replace: bool) {
        self.items[self.len] = Some(Addition {
            name,
            value,
            replace,
        });
        self.len += 1;
    }

    pub fn iter(&self) -> impl Iterator<Item = &Addition> {
        self.items[..self.len].iter().flatten()
    }

    /// Whether the request's own `name` headers are left out for one of these.
    pub fn replaces(&self, name: &HeaderName) -> bool {
        self.replaces_present && self.iter().any(|a| a.replace && a.name == *name)
    }

    /// Puts them in `headers`: each replacing one inserted, the others
    /// appended.
    pub fn apply(self, headers: &mut HeaderMap) {
        for a in self.items.into_iter().flatten() {
            if a.replace {
                headers.insert(a.name, a.value);
            } else {
                headers.append(a.name, a.value);
            }
        }
    }
}

/// Bit i set: the request carries `CLIENT_CLAIMS[i]`.
fn claims_present(headers: &HeaderMap) -> u8 {
    let mut present = 0;
    for name in headers.keys() {
        if let Some(i) = CLIENT_CLAIMS.iter().position(|c| c == name) {
            present |= 1 << i;
        }
    }
    present
}

/// The node's own forwarding entries for one (hop, client, scheme): the hop
/// for `X-Forwarded-For`, the client for `X-Real-IP`, and the `Forwarded`
/// element. Every request of a connection carries the same, so each worker
/// thread keeps the last ones it formatted: a keep-alive connection's
/// requests reuse them instead of formatting and allocating three values
/// each time.
#[derive(Clone)]
struct OwnEntries {
    key: (IpAddr, IpAddr, &'static str),
    hop: HeaderValue,
    client: HeaderValue,
    element: HeaderValue,
}

thread_local! {
    static LAST_ENTRIES: std::cell::RefCell<Option<OwnEntries>> =
        const { std::cell::RefCell::new(None) };
}

impl OwnEntries {
    fn of(hop: IpAddr, client: IpAddr, scheme: &'static str) -> Self {
        let key = (hop, client, scheme);
        LAST_ENTRIES.with(|last| {
            let mut last = last.borrow_mut();
            if let Some(entries) = last.as_ref().filter(|e| e.key == key) {
                return entries.clone();
            }
            let entries = Self {
                key,
                hop: value_or_empty(&hop.to_string()),
                client: value_or_empty(&client.to_string()),
                element: value_or_empty(&format!("for={};proto={scheme}", forwarded_node(hop))),
            };
            *last = Some(entries.clone());
            entries
        })
    }
}

fn value_or_empty(value: &str) -> HeaderValue {
    HeaderValue::from_str(value).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// RFC 7239 §6: an IPv6 node is quoted and bracketed.
fn forwarded_node(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("\"[{v6}]\""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trusted(nets: &[&str]) -> TrustedProxies {
        let nets: Vec<ProxyNet> = nets.iter().map(|n| n.parse().unwrap()).collect();
        TrustedProxies::new(&nets)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    /// One row: trusted proxies, the hop, its headers, the client.
    type Case<'a> = (&'a [&'a str], &'a str, &'a [(&'a str, &'a str)], &'a str);

    #[test]
    fn the_client_is_the_right_most_untrusted_address() {
        let lb = &["10.0.0.0/8", "2001:db8:1::/48"];
        let cases: &[Case<'_>] = &[
            // Nobody trusted: the peer, whatever it says.
            (
                &[],
                "198.51.100.7",
                &[("x-forwarded-for", "1.2.3.4")],
                "198.51.100.7",
            ),
            // An untrusted peer's claims are not believed.
            (
                lb,
                "198.51.100.7",
                &[("x-forwarded-for", "1.2.3.4")],
                "198.51.100.7",
            ),
            (
                lb,
                "198.51.100.7",
                &[("forwarded", "for=1.2.3.4")],
                "198.51.100.7",
            ),
            // A trusted peer without a chain: the peer.
            (lb, "10.0.0.1", &[], "10.0.0.1"),
            // One trusted hop.
            (
                lb,
                "10.0.0.1",
                &[("x-forwarded-for", "203.0.113.9")],
                "203.0.113.9",
            ),
            // The client's own spoofed entry on the left is not reached.
            (
                lb,
                "10.0.0.1",
                &[("x-forwarded-for", "6.6.6.6, 203.0.113.9")],
                "203.0.113.9",
            ),
            // Two trusted hops, recursively.
            (
                lb,
                "10.0.0.1",
                &[("x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.1.2.3")],
                "203.0.113.9",
            ),
            // Several lines are one list, in order.
            (
                lb,
                "10.0.0.1",
                &[
                    ("x-forwarded-for", "6.6.6.6"),
                    ("x-forwarded-for", "203.0.113.9, 10.9.9.9"),
                ],
                "203.0.113.9",
            ),
            // Every address trusted: the left-most.
            (
                lb,
                "10.0.0.1",
                &[("x-forwarded-for", "10.3.3.3, 10.2.2.2")],
                "10.3.3.3",
            ),
            // Garbage where a trusted proxy should have named someone: that proxy.
            (
                lb,
                "10.0.0.1",
                &[("x-forwarded-for", "1.2.3.4, bogus")],
                "10.0.0.1",
            ),
            (
                lb,
                "10.0.0.1",
                &[("x-forwarded-for", "bogus, 10.2.2.2")],
                "10.2.2.2",
            ),
            (
                lb,
                "10.0.0.1",
                &[("x-forwarded-for", "unknown")],
                "10.0.0.1",
            ),
            // Ports are allowed and dropped.
            (
                lb,
                "10.0.0.1",
                &[("x-forwarded-for", "203.0.113.9:4711")],
                "203.0.113.9",
            ),
            (
                lb,
                "10.0.0.1",
                &[("x-forwarded-for", "[2001:db8:2::5]:4711")],
                "2001:db8:2::5",
            ),
            // IPv6 hops and an IPv4-mapped peer.
            (
                lb,
                "2001:db8:1::1",
                &[("x-forwarded-for", "2001:db8:2::5")],
                "2001:db8:2::5",
            ),
            (
                lb,
                "::ffff:10.0.0.1",
                &[("x-forwarded-for", "203.0.113.9")],
                "203.0.113.9",
            ),
            (
                lb,
                "10.0.0.1",
                &[("x-forwarded-for", "::ffff:203.0.113.9")],
                "203.0.113.9",
            ),
            // Forwarded when there is no X-Forwarded-For.
            (
                lb,
                "10.0.0.1",
                &[(
                    "forwarded",
                    "for=6.6.6.6, for=\"[2001:db8:2::5]:80\";proto=https",
                )],
                "2001:db8:2::5",
            ),
            (
                lb,
                "10.0.0.1",
                &[("forwarded", "proto=https;For=203.0.113.9:80;by=10.0.0.1")],
                "203.0.113.9",
            ),
            (lb, "10.0.0.1", &[("forwarded", "for=_hidden")], "10.0.0.1"),
            (lb, "10.0.0.1", &[("forwarded", "for=unknown")], "10.0.0.1"),
            // X-Forwarded-For wins over Forwarded.
            (
                lb,
                "10.0.0.1",
                &[
                    ("forwarded", "for=6.6.6.6"),
                    ("x-forwarded-for", "203.0.113.9"),
                ],
                "203.0.113.9",
            ),
            // A bare address is a /32.
            (
                &["10.0.0.1"],
                "10.0.0.1",
                &[("x-forwarded-for", "10.0.0.2")],
                "10.0.0.2",
            ),
            (
                &["10.0.0.1"],
                "10.0.0.2",
                &[("x-forwarded-for", "1.1.1.1")],
                "10.0.0.2",
            ),
        ];
        for (nets, hop, hs, want) in cases {
            let got = trusted(nets).resolve(ip(hop), &headers(hs));
            assert_eq!(got, ip(want), "trusted {nets:?}, hop {hop}, {hs:?}");
        }
    }

    #[test]
    fn trusted_proxies_parse_addresses_and_blocks_and_refuse_the_rest() {
        assert_eq!(
            "10.1.2.3/8".parse::<ProxyNet>().unwrap().to_string(),
            "10.0.0.0/8"
        );
        assert_eq!("::1".parse::<ProxyNet>().unwrap().to_string(), "::1/128");
        for bad in ["", "10.0.0.0/33", "example.com", "10.0.0"] {
            assert!(bad.parse::<ProxyNet>().is_err(), "{bad}");
        }
    }

    #[test]
    fn an_untrusted_hops_claims_are_replaced_by_what_the_node_knows() {
        let mut h = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-real-ip", "6.6.6.6"),
            ("forwarded", "for=6.6.6.6"),
            ("x-forwarded-host", "evil.example"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-port", "443"),
            ("accept", "*/*"),
        ]);
        let f = Forwarding {
            client: ip("198.51.100.7"),
            hop: ip("198.51.100.7"),
            trusted: false,
            scheme: "http",
        };
        assert!(rewrite_for_origin(&mut h, &f));
        assert_eq!(h["x-forwarded-for"], "198.51.100.7");
        assert_eq!(h["x-real-ip"], "198.51.100.7");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["forwarded"], "for=198.51.100.7;proto=http");
        assert!(!h.contains_key("x-forwarded-host") && !h.contains_key("x-forwarded-port"));
        assert_eq!(h["accept"], "*/*");
        // Nothing to remove: nothing counted.
        let mut clean = headers(&[("accept", "*/*")]);
        let v6 = Forwarding {
            client: ip("2001:db8::7"),
            hop: ip("2001:db8::7"),
            ..f
        };
        assert!(!rewrite_for_origin(&mut clean, &v6));
        assert_eq!(clean["forwarded"], "for=\"[2001:db8::7]\";proto=http");
    }

    /// The entries a thread formatted last are reused only for the same
    /// hop, client and scheme: clients taking turns each get their own.
    #[test]
    fn remembered_entries_belong_to_their_own_client() {
        let f = |client: &str, scheme: &'static str| Forwarding {
            client: ip(client),
            hop: ip(client),
            trusted: false,
            scheme,
        };
        for (client, scheme) in [
            ("198.51.100.7", "http"),
            ("198.51.100.7", "http"),
            ("198.51.100.8", "http"),
            ("198.51.100.8", "https"),
            ("198.51.100.7", "http"),
        ] {
            let mut h = HeaderMap::new();
            rewrite_for_origin(&mut h, &f(client, scheme));
            assert_eq!(h["x-forwarded-for"], client);
            assert_eq!(h["x-real-ip"], client);
            assert_eq!(
                h["forwarded"],
                format!("for={client};proto={scheme}").as_str()
            );
        }
    }

    #[test]
    fn a_trusted_hops_chain_is_appended_to() {
        let mut h = headers(&[
            ("x-forwarded-for", "203.0.113.9"),
            ("x-forwarded-for", "10.2.2.2"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "shop.example"),
            ("forwarded", "for=203.0.113.9;proto=https"),
        ]);
        let f = Forwarding {
            client: ip("203.0.113.9"),
            hop: ip("10.0.0.1"),
            trusted: true,
            scheme: "http",
        };
        assert!(!rewrite_for_origin(&mut h, &f));
        assert_eq!(h["x-forwarded-for"], "203.0.113.9, 10.2.2.2, 10.0.0.1");
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(h["x-real-ip"], "203.0.113.9");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h["x-forwarded-host"], "shop.example");
        let forwarded: Vec<_> = h.get_all("forwarded").iter().collect();
        assert_eq!(
            forwarded,
            ["for=203.0.113.9;proto=https", "for=10.0.0.1;proto=http"]
        );
    }

    #[test]
    fn via_is_a_token_and_finds_itself_only() {
        let via = Via::new("edge 1/fra");
        assert_eq!(via.token(), "waitroom-edge-1-fra");
        assert_eq!(via.value(Version::HTTP_2), "2 waitroom-edge-1-fra");
        assert_eq!(via.value(Version::HTTP_11), "1.1 waitroom-edge-1-fra");
        let seen = |v: &str| via.seen_in(&headers(&[("via", v)]));
        assert!(seen("1.1 waitroom-edge-1-fra"));
        assert!(seen("1.0 cache, 1.1 WAITROOM-edge-1-fra (waitroom)"));
        assert!(!seen("1.1 waitroom-edge-2-fra"));
        assert!(!seen("1.1 waitroom"));
        assert!(!seen("waitroom-edge-1-fra"));
        assert!(!via.seen_in(&HeaderMap::new()));
    }
}
