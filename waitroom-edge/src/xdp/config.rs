//! The node's `[xdp]` table and the address prefixes of the deny list.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    str::FromStr,
};

use serde::{Deserialize, Serialize};

/// The `[xdp]` table of the node's configuration.
///
/// ```toml
/// [xdp]
/// interface = "enp1s0"
/// mode = "auto"            # "skb", "driver" or "auto"
/// ports = [80, 443]
/// deny = ["192.0.2.0/24", "2001:db8::/32"]
/// syn_budget = { rate_per_sec = 20, burst = 40 }
/// ```
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct XdpConfig {
    /// The ingress interface the program is attached to.
    pub interface: String,
    /// How the program is attached; `auto` lets the kernel choose.
    #[serde(default)]
    pub mode: XdpAttachMode,
    /// Service ports (TCP and UDP destination ports) whose traffic is counted
    /// and whose sources feed the distinct-source sketch.
    pub ports: Vec<u16>,
    /// Per-source budget of new TCP connections; absent = no budget.
    #[serde(default)]
    pub syn_budget: Option<SynBudget>,
    /// Source prefixes dropped from the start; the admin listener can change
    /// the list at run time.
    #[serde(default)]
    pub deny: Vec<IpPrefix>,
}

impl XdpConfig {
    /// A configuration for `interface` counting `ports`, everything else default.
    #[must_use]
    pub fn new(interface: impl Into<String>, ports: impl Into<Vec<u16>>) -> Self {
        Self {
            interface: interface.into(),
            mode: XdpAttachMode::default(),
            ports: ports.into(),
            syn_budget: None,
            deny: Vec::new(),
        }
    }

    /// The service ports, each once, in order: what the program gives a slot.
    pub(crate) fn distinct_ports(&self) -> Vec<u16> {
        let mut ports = self.ports.clone();
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    /// The SYN budget as (rate per second, burst), as the settings map wants it.
    pub(crate) fn syn_budget_pair(&self) -> Option<(u32, u32)> {
        self.syn_budget.map(|b| (b.rate_per_sec, b.burst))
    }

    /// What the loader would otherwise take silently or refuse only at
    /// start: no service port (nothing counted, no SYN budget anywhere),
    /// port 0, more ports than the program counts, a SYN budget of zero
    /// (read as "off" by a tired operator, it would let one SYN a second
    /// through) or one faster than the program can time (it would be off),
    /// and a deny prefix broad enough to cut the operator off, which the
    /// admin listener refuses without `force=true` and a file cannot force.
    /// The error names the field under `[xdp]`.
    pub fn validate(&self) -> Result<(), XdpFieldError> {
        let bad = |field: String, problem: String| Err(XdpFieldError { field, problem });
        if self.interface.trim().is_empty() {
            return bad(
                "interface".into(),
                "empty; name the ingress interface, e.g. \"enp1s0\"".into(),
            );
        }
        if self.ports.is_empty() {
            return bad(
                "ports".into(),
                "empty: the program would count nothing and budget no SYN; list the service ports, e.g. [80, 443]".into(),
            );
        }
        if let Some(at) = self.ports.iter().position(|&p| p == 0) {
            return bad(format!("ports[{at}]"), "0 is not a port".into());
        }
        let distinct = self.distinct_ports();
        let max = waitroom_common::xdp::MAX_SERVICE_PORTS as usize;
        if distinct.len() > max {
            return bad(
                "ports".into(),
                format!(
                    "{} distinct ports; the program counts at most {max}",
                    distinct.len()
                ),
            );
        }
        if let Some(budget) = self.syn_budget {
            if budget.rate_per_sec == 0 {
                return bad(
                    "syn_budget.rate_per_sec".into(),
                    "0; a budget needs at least 1 SYN a second (to have no budget, leave syn_budget out)".into(),
                );
            }
            if budget.rate_per_sec > SynBudget::MAX_RATE {
                return bad(
                    "syn_budget.rate_per_sec".into(),
                    format!(
                        "{}; at most {} (the program times SYNs in nanoseconds; to have no budget, leave syn_budget out)",
                        budget.rate_per_sec,
                        SynBudget::MAX_RATE
                    ),
                );
            }
            if budget.burst == 0 {
                return bad(
                    "syn_budget.burst".into(),
                    "0; a source needs at least 1 SYN at once (a browser opens up to 6 connections at once)".into(),
                );
            }
        }
        if let Some(at) = self.deny.iter().position(IpPrefix::is_broad) {
            return bad(
                format!("deny[{at}]"),
                format!(
                    "{} is broader than /{} (IPv4) or /{} (IPv6): it may drop your own SSH session; \
                     the admin listener takes it with force=true, the file does not",
                    self.deny[at],
                    IpPrefix::BROAD_V4,
                    IpPrefix::BROAD_V6
                ),
            );
        }
        Ok(())
    }
}

/// A field of the `[xdp]` table that is wrong, and why.
#[derive(Debug, PartialEq, Eq)]
pub struct XdpFieldError {
    /// The field under `[xdp]`, e.g. `syn_budget.burst` or `ports[2]`.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

/// How the program is attached to the interface.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum XdpAttachMode {
    /// Let the kernel choose (driver mode where the driver supports it).
    #[default]
    Auto,
    /// Generic XDP in the network stack: works everywhere, costs more.
    Skb,
    /// Native XDP in the driver: fails if the driver lacks support.
    Driver,
}

impl From<XdpAttachMode> for aya::programs::XdpMode {
    fn from(mode: XdpAttachMode) -> Self {
        match mode {
            XdpAttachMode::Auto => Self::Default,
            XdpAttachMode::Skb => Self::Skb,
            XdpAttachMode::Driver => Self::Driver,
        }
    }
}

/// A per-source token bucket for TCP SYNs: `burst` at once, then `rate_per_sec`.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SynBudget {
    /// Sustained new connections per second allowed from one source address.
    pub rate_per_sec: u32,
    /// Connections one source may open at once before the rate applies.
    pub burst: u32,
}

impl SynBudget {
    /// The fastest rate the program can time (one SYN a nanosecond).
    pub const MAX_RATE: u32 = 1_000_000_000;
}

/// An IPv4 or IPv6 prefix such as `192.0.2.0/24`; a bare address is a host
/// prefix. Parsed text must have its host bits clear: `10.1.2.3/8` is an
/// error, not `10.0.0.0/8`, because an operator who typed it meant something
/// else (a host? a /24?) and a deny list is the wrong place to guess.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct IpPrefix {
    /// The network address (host bits zero).
    addr: IpAddr,
    /// Prefix length in bits: at most 32 for IPv4, 128 for IPv6.
    len: u8,
}

impl IpPrefix {
    /// IPv4 prefixes shorter than this are refused by the admin listener
    /// without `force=true`: a /7 is 2^25 addresses, and `0.0.0.0/0` drops
    /// every packet, the operator's SSH session included.
    pub const BROAD_V4: u8 = 8;
    /// The same for IPv6: shorter than a /32 (one regional registry's
    /// allocation to a large network).
    pub const BROAD_V6: u8 = 32;

    /// The prefix of `len` bits that holds `addr` (host bits cleared: this is
    /// for code that means "the network around this address"), or `None` if
    /// `len` is too long.
    #[must_use]
    pub fn new(addr: IpAddr, len: u8) -> Option<Self> {
        let addr = match addr {
            IpAddr::V4(a) if len <= 32 => {
                let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) if len <= 128 => {
                let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
            _ => return None,
        };
        Some(Self { addr, len })
    }

    /// The network address.
    #[must_use]
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length in bits.
    #[must_use]
    pub fn prefix_len(&self) -> u8 {
        self.len
    }

    /// Whether the prefix is shorter than [`Self::BROAD_V4`] or
    /// [`Self::BROAD_V6`]: too much of the Internet to drop without `force`.
    #[must_use]
    pub fn is_broad(&self) -> bool {
        let limit = if self.addr.is_ipv4() {
            Self::BROAD_V4
        } else {
            Self::BROAD_V6
        };
        self.len < limit
    }

    /// Whether the prefix holds `addr`.
    #[must_use]
    pub fn contains(&self, addr: IpAddr) -> bool {
        Self::new(addr, self.len).is_some_and(|p| p.addr == self.addr)
    }
}

impl fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl From<IpAddr> for IpPrefix {
    fn from(addr: IpAddr) -> Self {
        let len = if addr.is_ipv4() { 32 } else { 128 };
        Self { addr, len }
    }
}

/// Why a string is not an [`IpPrefix`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IpPrefixParseError {
    #[error("`{input}` is not an IP prefix like 192.0.2.0/24 or 2001:db8::/32")]
    Syntax {
        /// The text that failed to parse.
        input: String,
    },
    #[error("`{input}` has host bits set beyond /{len}; the network is {network}")]
    HostBits {
        input: String,
        len: u8,
        /// What the operator may have meant.
        network: String,
    },
}

impl FromStr for IpPrefix {
    type Err = IpPrefixParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || IpPrefixParseError::Syntax {
            input: s.to_owned(),
        };
        match s.split_once('/') {
            None => s.parse::<IpAddr>().map(Self::from).map_err(|_| err()),
            Some((addr, len)) => {
                let addr: IpAddr = addr.parse().map_err(|_| err())?;
                // Digits only: `u8::from_str` would take "+8".
                if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(err());
                }
                let len: u8 = len.parse().map_err(|_| err())?;
                let prefix = Self::new(addr, len).ok_or_else(err)?;
                if prefix.addr != addr {
                    return Err(IpPrefixParseError::HostBits {
                        input: s.to_owned(),
                        len,
                        network: prefix.to_string(),
                    });
                }
                Ok(prefix)
            }
        }
    }
}

impl From<IpPrefix> for String {
    fn from(p: IpPrefix) -> Self {
        p.to_string()
    }
}

impl TryFrom<String> for IpPrefix {
    type Error = IpPrefixParseError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tired operator's `[xdp]` tables, each refused naming its field.
    #[test]
    fn validate_names_the_field_a_tired_operator_got_wrong() {
        let good = || {
            let mut c = XdpConfig::new("enp1s0", [80, 443]);
            c.syn_budget = Some(SynBudget {
                rate_per_sec: 20,
                burst: 40,
            });
            c.deny = vec![
                "192.0.2.0/24".parse().unwrap(),
                "2001:db8::/32".parse().unwrap(),
            ];
            c
        };
        assert_eq!(good().validate(), Ok(()));
        let budget = |rate_per_sec, burst| {
            let mut c = good();
            c.syn_budget = Some(SynBudget {
                rate_per_sec,
                burst,
            });
            c
        };
        let cases: Vec<(XdpConfig, &str)> = vec![
            (XdpConfig::new(" ", [80]), "interface"),
            (XdpConfig::new("eth1", []), "ports"),
            (XdpConfig::new("eth1", [80, 0]), "ports[1]"),
            (
                XdpConfig::new("eth1", (1..=65).collect::<Vec<u16>>()),
                "ports",
            ),
            (budget(0, 40), "syn_budget.rate_per_sec"),
            (
                budget(SynBudget::MAX_RATE + 1, 40),
                "syn_budget.rate_per_sec",
            ),
            (budget(20, 0), "syn_budget.burst"),
            (
                {
                    let mut c = good();
                    c.deny.push("0.0.0.0/0".parse().unwrap());
                    c
                },
                "deny[2]",
            ),
            (
                {
                    let mut c = good();
                    c.deny.insert(0, "2000::/3".parse().unwrap());
                    c
                },
                "deny[0]",
            ),
        ];
        for (config, field) in cases {
            let error = config.validate().expect_err(field);
            assert_eq!(error.field, field, "{error:?}");
        }
        // What stays accepted: repeats of one port (counted once), 64
        // distinct ports, the extremes of a budget, the narrowest broad-enough prefix.
        let mut edge = good();
        edge.ports = (1..=63).chain([80, 80]).collect();
        edge.syn_budget = Some(SynBudget {
            rate_per_sec: SynBudget::MAX_RATE,
            burst: 1,
        });
        edge.deny = vec![
            "10.0.0.0/8".parse().unwrap(),
            "2001:db8::/32".parse().unwrap(),
        ];
        assert_eq!(edge.validate(), Ok(()));
    }

    #[test]
    fn parses_the_documented_table() {
        let text = r#"
            interface = "enp1s0"
            mode = "skb"
            ports = [80, 443]
            deny = ["192.0.2.0/24", "2001:db8::/32", "198.51.100.1"]
            syn_budget = { rate_per_sec = 20, burst = 40 }
        "#;
        let config: XdpConfig = toml::from_str(text).unwrap();
        assert_eq!(config.interface, "enp1s0");
        assert_eq!(config.mode, XdpAttachMode::Skb);
        assert_eq!(config.ports, [80, 443]);
        assert_eq!(
            config.syn_budget,
            Some(SynBudget {
                rate_per_sec: 20,
                burst: 40
            })
        );
        let deny: Vec<String> = config.deny.iter().map(ToString::to_string).collect();
        assert_eq!(deny, ["192.0.2.0/24", "2001:db8::/32", "198.51.100.1/32"]);
        assert_eq!(config.syn_budget_pair(), Some((20, 40)));
    }

    #[test]
    fn defaults_and_unknown_fields() {
        let config: XdpConfig = toml::from_str("interface = \"eth1\"\nports = [443]").unwrap();
        assert_eq!(config, XdpConfig::new("eth1", [443]));
        assert_eq!(config.syn_budget_pair(), None);
        assert!(toml::from_str::<XdpConfig>("interface = \"x\"\nports = []\nport = 1").is_err());
        assert!(
            toml::from_str::<XdpConfig>("interface = \"x\"\nports = []\nmode = \"hw\"").is_err()
        );
        assert!(
            toml::from_str::<XdpConfig>("interface = \"x\"\nports = []\ndeny = [\"10.0.0.0/33\"]")
                .is_err()
        );
    }

    #[test]
    fn prefixes() {
        let p: IpPrefix = "10.0.0.0/8".parse().unwrap();
        assert_eq!(p.to_string(), "10.0.0.0/8");
        assert!(p.contains("10.255.0.1".parse().unwrap()));
        assert!(!p.contains("11.0.0.1".parse().unwrap()));
        assert!(!p.contains("::1".parse().unwrap()));
        assert_eq!("0.0.0.0/0".parse::<IpPrefix>().unwrap().prefix_len(), 0);
        assert_eq!("::/0".parse::<IpPrefix>().unwrap().to_string(), "::/0");
        assert_eq!(
            "fe80::/10".parse::<IpPrefix>().unwrap().to_string(),
            "fe80::/10"
        );
        for bad in [
            "+10.0.0.0/8",
            "10.0.0.0/+8",
            "10.0.0.0/ 8",
            "",
            "10.0.0.0/",
            "10.0.0.0/x",
            "::/129",
            "host/8",
            "10.0.0.0/8/8",
        ] {
            assert!(bad.parse::<IpPrefix>().is_err(), "{bad}");
        }
        // Code may ask for the network around an address; text may not.
        let around = IpPrefix::new("10.1.2.3".parse().unwrap(), 8).unwrap();
        assert_eq!(around.to_string(), "10.0.0.0/8");
    }

    #[test]
    fn host_bits_are_an_error_naming_the_network() {
        for (input, network) in [
            ("10.1.2.3/8", "10.0.0.0/8"),
            ("192.0.2.7/24", "192.0.2.0/24"),
            ("2001:db8::1/32", "2001:db8::/32"),
            ("fe80::1/10", "fe80::/10"),
            ("0.0.0.1/0", "0.0.0.0/0"),
        ] {
            let err = input.parse::<IpPrefix>().unwrap_err();
            assert!(
                matches!(&err, IpPrefixParseError::HostBits { network: n, .. } if n == network),
                "{input}: {err}"
            );
            assert!(err.to_string().contains(network), "{err}");
        }
        // The same in the [xdp] table.
        assert!(
            toml::from_str::<XdpConfig>("interface = \"x\"\nports = []\ndeny = [\"192.0.2.7/24\"]")
                .is_err()
        );
    }

    #[test]
    fn broad_prefixes_are_marked() {
        for (p, broad) in [
            ("0.0.0.0/0", true),
            ("8.0.0.0/7", true),
            ("8.0.0.0/8", false),
            ("192.0.2.1", false),
            ("::/0", true),
            ("2001:d00::/31", true),
            ("2001:db8::/32", false),
            ("2001:db8::1", false),
        ] {
            assert_eq!(p.parse::<IpPrefix>().unwrap().is_broad(), broad, "{p}");
        }
    }
}
