//! The XDP program's packet parser, shared by the kernel and userspace.
//!
//! One parser, two ways to read bytes: the program reads headers through
//! pointers it has bounds-checked against `data_end` (the comparison the
//! verifier follows, see `waitroom-ebpf`'s `Frame`), userspace through a
//! byte slice ([`SliceFrame`]). Everything between is this module, so what
//! the fuzzer and the unit tests exercise in userspace is the logic the
//! kernel runs. Every function is `#[inline(always)]` and generic, so the
//! program's copy is monomorphized for its frame exactly as before.

/// How the parser reads a header: the `N` bytes at `offset`, or `Err` when
/// the frame is shorter. Implementations check the bound once per header;
/// the parser reads the header's fields from the returned array only.
pub trait Headers {
    #[expect(
        clippy::result_unit_err,
        reason = "the program folds every parse failure into one action (pass the packet); there is nothing more to say"
    )]
    fn header<const N: usize>(&self, offset: usize) -> Result<&[u8; N], ()>;
}

/// A frame in userspace memory (tests, the fuzzer, tools).
#[derive(Clone, Copy, Debug)]
pub struct SliceFrame<'a>(pub &'a [u8]);

impl Headers for SliceFrame<'_> {
    #[inline(always)]
    fn header<const N: usize>(&self, offset: usize) -> Result<&[u8; N], ()> {
        let end = offset.checked_add(N).ok_or(())?;
        self.0
            .get(offset..end)
            .and_then(|b| b.try_into().ok())
            .ok_or(())
    }
}

const ETH_HLEN: usize = 14;
const VLAN_HLEN: usize = 4;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
const IPV4_HLEN: usize = 20;
const IPV6_HLEN: usize = 40;
const TCP_HLEN: usize = 20;
const UDP_HLEN: usize = 8;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const TCP_FLAG_SYN: u8 = 0x02;
const TCP_FLAG_ACK: u8 = 0x10;

/// The source address of a packet, IPv4 in its IPv4-mapped IPv6 form.
///
/// One fully initialised layout for both families: with an enum, the bytes
/// an IPv4 source leaves undefined can end up in a register LLVM spills,
/// and the verifier rejects reading an uninitialised register. The address
/// is held as two numbers (its big-endian halves), not sixteen bytes: the
/// program keeps a source across helper calls, and two registers spill and
/// reload in two instructions each where sixteen bytes took sixteen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Source {
    /// The address's first eight bytes, big-endian (0 for IPv4).
    pub hi: u64,
    /// The address's last eight bytes, big-endian (`0xffff_a.b.c.d` for IPv4).
    pub lo: u64,
    /// Whether the packet was IPv4.
    pub is_v4: bool,
}

impl Source {
    #[inline(always)]
    fn from_v4(a: [u8; 4]) -> Self {
        Self {
            hi: 0,
            lo: 0xffff_0000_0000 | u64::from(u32::from_be_bytes(a)),
            is_v4: true,
        }
    }

    /// The IPv4 address as a number (meaningful when `is_v4`).
    #[inline(always)]
    pub fn v4(&self) -> u32 {
        self.lo as u32
    }

    /// The IPv4 address (meaningful when `is_v4`).
    #[inline(always)]
    pub fn v4_addr(&self) -> [u8; 4] {
        self.v4().to_be_bytes()
    }

    /// The sixteen bytes of the address (`::ffff:a.b.c.d` for IPv4).
    #[inline(always)]
    pub fn addr(&self) -> [u8; 16] {
        (u128::from(self.hi) << 64 | u128::from(self.lo)).to_be_bytes()
    }
}

/// What the transport header says, as far as the program cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// TCP to `dst_port`; `syn` is a SYN without ACK (a new connection).
    Tcp { dst_port: u16, syn: bool },
    /// UDP to `dst_port`.
    Udp { dst_port: u16 },
    /// Another protocol, an IPv6 extension header, or a non-first IPv4
    /// fragment: nothing to count by port.
    Other,
}

/// An IP packet, parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    pub source: Source,
    pub transport: Transport,
}

#[inline(always)]
fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Parses Ethernet (with at most one VLAN tag), IPv4 or IPv6, and TCP or UDP.
///
/// `Ok(None)` is a frame that is not IP; `Err(())` a frame too short for its
/// headers or with impossible fields (bad version or IHL, truncated TCP/UDP).
#[expect(
    clippy::result_unit_err,
    reason = "the program folds every parse failure into one action (pass the packet); there is nothing more to say"
)]
#[inline(always)]
pub fn parse<F: Headers>(frame: &F) -> Result<Option<Packet>, ()> {
    let eth = frame.header::<ETH_HLEN>(0)?;
    let mut ether_type = be16(eth, 12);
    let mut l3 = ETH_HLEN;
    if ether_type == ETH_P_8021Q || ether_type == ETH_P_8021AD {
        let tag = frame.header::<VLAN_HLEN>(ETH_HLEN)?;
        ether_type = be16(tag, 2);
        l3 += VLAN_HLEN;
    }
    match ether_type {
        ETH_P_IP => parse_ipv4(frame, l3).map(Some),
        ETH_P_IPV6 => parse_ipv6(frame, l3).map(Some),
        _ => Ok(None),
    }
}

#[inline(always)]
fn parse_ipv4<F: Headers>(frame: &F, l3: usize) -> Result<Packet, ()> {
    let ip = frame.header::<IPV4_HLEN>(l3)?;
    if ip[0] >> 4 != 4 {
        return Err(());
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ihl < IPV4_HLEN {
        return Err(());
    }
    let source = Source::from_v4([ip[12], ip[13], ip[14], ip[15]]);
    // A non-first fragment carries no transport header. (Options, when the
    // IHL says there are some, are covered by the transport header's check,
    // which starts after them.)
    let transport = if be16(ip, 6) & 0x1fff != 0 {
        Transport::Other
    } else {
        parse_transport(frame, l3 + ihl, ip[9])?
    };
    Ok(Packet { source, transport })
}

#[inline(always)]
fn parse_ipv6<F: Headers>(frame: &F, l3: usize) -> Result<Packet, ()> {
    let ip = frame.header::<IPV6_HLEN>(l3)?;
    if ip[0] >> 4 != 6 {
        return Err(());
    }
    let half = |at: usize| {
        u64::from_be_bytes([
            ip[at],
            ip[at + 1],
            ip[at + 2],
            ip[at + 3],
            ip[at + 4],
            ip[at + 5],
            ip[at + 6],
            ip[at + 7],
        ])
    };
    let source = Source {
        hi: half(8),
        lo: half(16),
        is_v4: false,
    };
    let transport = parse_transport(frame, l3 + IPV6_HLEN, ip[6])?;
    Ok(Packet { source, transport })
}

#[inline(always)]
fn parse_transport<F: Headers>(frame: &F, l4: usize, protocol: u8) -> Result<Transport, ()> {
    match protocol {
        IPPROTO_TCP => {
            let tcp = frame.header::<TCP_HLEN>(l4)?;
            let syn = tcp[13] & (TCP_FLAG_SYN | TCP_FLAG_ACK) == TCP_FLAG_SYN;
            Ok(Transport::Tcp {
                dst_port: be16(tcp, 2),
                syn,
            })
        }
        IPPROTO_UDP => {
            let udp = frame.header::<UDP_HLEN>(l4)?;
            Ok(Transport::Udp {
                dst_port: be16(udp, 2),
            })
        }
        _ => Ok(Transport::Other),
    }
}

// With `std` (as every workspace test build has it): the frames are `Vec`s.
#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;

    /// Ethernet + IPv4 (IHL words) + TCP with `flags` to `port`.
    fn tcp4(ihl_words: u8, flags: u8, port: u16) -> std::vec::Vec<u8> {
        let mut f = std::vec![0u8; 12];
        f.extend([0x08, 0x00]);
        let ihl = usize::from(ihl_words) * 4;
        let mut ip = std::vec![0u8; ihl];
        ip[0] = 0x40 | ihl_words;
        ip[9] = IPPROTO_TCP;
        ip[12..16].copy_from_slice(&[192, 0, 2, 7]);
        f.extend(ip);
        let mut tcp = [0u8; 20];
        tcp[2..4].copy_from_slice(&port.to_be_bytes());
        tcp[13] = flags;
        f.extend(tcp);
        f
    }

    #[test]
    fn a_syn_to_a_port_is_parsed_with_its_source() {
        let p = parse(&SliceFrame(&tcp4(5, TCP_FLAG_SYN, 443)))
            .unwrap()
            .unwrap();
        assert_eq!(
            p.transport,
            Transport::Tcp {
                dst_port: 443,
                syn: true
            }
        );
        assert!(p.source.is_v4);
        assert_eq!(p.source.v4_addr(), [192, 0, 2, 7]);
        assert_eq!(p.source.v4(), 0xc000_0207);
        assert_eq!(
            p.source.addr(),
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 7]
        );
        let ack = parse(&SliceFrame(&tcp4(5, TCP_FLAG_SYN | TCP_FLAG_ACK, 443)))
            .unwrap()
            .unwrap();
        assert_eq!(
            ack.transport,
            Transport::Tcp {
                dst_port: 443,
                syn: false
            }
        );
        let options = parse(&SliceFrame(&tcp4(6, TCP_FLAG_SYN, 80)))
            .unwrap()
            .unwrap();
        assert_eq!(
            options.transport,
            Transport::Tcp {
                dst_port: 80,
                syn: true
            }
        );
    }

    /// Ethernet (a VLAN tag if `vlan`) + IPv6 from `src` + UDP or TCP SYN to `port`.
    fn ip6(src: [u8; 16], vlan: bool, protocol: u8, port: u16) -> std::vec::Vec<u8> {
        let mut f = std::vec![0u8; 12];
        if vlan {
            f.extend([0x81, 0x00, 0x00, 0x07]);
        }
        f.extend([0x86, 0xdd]);
        let mut ip = [0u8; IPV6_HLEN];
        ip[0] = 0x60;
        ip[6] = protocol;
        ip[8..24].copy_from_slice(&src);
        ip[24..40].copy_from_slice(&[0xff; 16]);
        f.extend(ip);
        let mut l4 = [0u8; TCP_HLEN];
        l4[2..4].copy_from_slice(&port.to_be_bytes());
        l4[13] = TCP_FLAG_SYN;
        f.extend(l4);
        f
    }

    /// An IPv6 source's halves in the order the program's maps key on
    /// (the deny list's prefixes are big-endian from the first byte): the
    /// first eight bytes in `hi`, the last in `lo`, each big-endian.
    #[test]
    fn an_ipv6_source_is_parsed_into_its_halves() {
        let src = [
            0x20, 0x01, 0x0d, 0xb8, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x02,
            0x03, 0x04,
        ];
        for vlan in [false, true] {
            let p = parse(&SliceFrame(&ip6(src, vlan, IPPROTO_TCP, 443)))
                .unwrap()
                .unwrap();
            assert!(!p.source.is_v4);
            assert_eq!(p.source.hi, 0x2001_0db8_1234_5678);
            assert_eq!(p.source.lo, 0x9abc_def0_0102_0304);
            assert_eq!(p.source.addr(), src, "the sixteen bytes back, in order");
            assert_eq!(
                p.transport,
                Transport::Tcp {
                    dst_port: 443,
                    syn: true
                }
            );
        }
        let udp = parse(&SliceFrame(&ip6(src, false, IPPROTO_UDP, 53)))
            .unwrap()
            .unwrap();
        assert_eq!(udp.transport, Transport::Udp { dst_port: 53 });
        // An extension header (hop-by-hop, 0): nothing to count by port.
        let ext = parse(&SliceFrame(&ip6(src, false, 0, 53)))
            .unwrap()
            .unwrap();
        assert_eq!(ext.transport, Transport::Other);
        // The same address as an IPv4-mapped one is not mistaken for IPv4.
        let mapped = parse(&SliceFrame(&ip6(
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 7],
            false,
            IPPROTO_TCP,
            443,
        )))
        .unwrap()
        .unwrap();
        assert!(!mapped.source.is_v4);
        assert_eq!(mapped.source.addr()[12..], [192, 0, 2, 7]);
        // Truncated: the fixed header cut short is an error, not a panic.
        let full = ip6(src, true, IPPROTO_TCP, 443);
        for len in 18..full.len() {
            assert_eq!(parse(&SliceFrame(&full[..len])), Err(()), "{len} bytes");
        }
    }

    #[test]
    fn short_and_impossible_frames_are_errors_not_panics() {
        let full = tcp4(5, TCP_FLAG_SYN, 443);
        for len in 0..full.len() {
            let r = parse(&SliceFrame(&full[..len]));
            assert!(r.is_err() || len < 14, "a {len}-byte prefix parsed: {r:?}");
        }
        let mut bad_ihl = full.clone();
        bad_ihl[14] = 0x44;
        assert_eq!(parse(&SliceFrame(&bad_ihl)), Err(()));
        let mut not_ip = full.clone();
        not_ip[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(parse(&SliceFrame(&not_ip)), Ok(None));
        assert_eq!(SliceFrame(&[1, 2, 3]).header::<4>(usize::MAX), Err(()));
    }
}
