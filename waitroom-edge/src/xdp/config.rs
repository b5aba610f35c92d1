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

    /// The SYN budget as (rate per second, burst), as the settings map wants it.
    pub(crate) fn syn_budget_pair(&self) -> Option<(u32, u32)> {
        self.syn_budget.map(|b| (b.rate_per_sec, b.burst))
    }
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

/// An IPv4 or IPv6 prefix such as `192.0.2.0/24`; a bare address is a host
/// prefix. Bits beyond the prefix length are cleared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct IpPrefix {
    /// The network address (host bits zero).
    addr: IpAddr,
    /// Prefix length in bits: at most 32 for IPv4, 128 for IPv6.
    len: u8,
}

impl IpPrefix {
    /// The prefix of `len` bits of `addr`, or `None` if `len` is too long.
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
#[error("`{input}` is not an IP prefix like 192.0.2.0/24 or 2001:db8::/32")]
pub struct IpPrefixParseError {
    /// The text that failed to parse.
    pub input: String,
}

impl FromStr for IpPrefix {
    type Err = IpPrefixParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || IpPrefixParseError {
            input: s.to_owned(),
        };
        match s.split_once('/') {
            None => s.parse::<IpAddr>().map(Self::from).map_err(|_| err()),
            Some((addr, len)) => {
                let addr: IpAddr = addr.parse().map_err(|_| err())?;
                let len: u8 = len.parse().map_err(|_| err())?;
                Self::new(addr, len).ok_or_else(err)
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

    #[test]
    fn parses_the_documented_table() {
        let text = r#"
            interface = "enp1s0"
            mode = "skb"
            ports = [80, 443]
            deny = ["192.0.2.7/24", "2001:db8::1/32", "198.51.100.1"]
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
        let p: IpPrefix = "10.1.2.3/8".parse().unwrap();
        assert_eq!(p.to_string(), "10.0.0.0/8");
        assert!(p.contains("10.255.0.1".parse().unwrap()));
        assert!(!p.contains("11.0.0.1".parse().unwrap()));
        assert!(!p.contains("::1".parse().unwrap()));
        assert_eq!("0.0.0.0/0".parse::<IpPrefix>().unwrap().prefix_len(), 0);
        assert_eq!("::/0".parse::<IpPrefix>().unwrap().to_string(), "::/0");
        assert_eq!(
            "fe80::1/10".parse::<IpPrefix>().unwrap().to_string(),
            "fe80::/10"
        );
        for bad in [
            "",
            "10.0.0.0/",
            "10.0.0.0/x",
            "::/129",
            "host/8",
            "10.0.0.0/8/8",
        ] {
            assert!(bad.parse::<IpPrefix>().is_err(), "{bad}");
        }
    }
}
