//! Header parsing with the bounds checks the verifier wants to see.
//!
//! Every read goes through [`Frame::header`], which compares the end of the
//! header against `data_end` before handing out a reference; the verifier
//! tracks that comparison and accepts the loads. Offsets are small bounded
//! values (at most 18 + 60 bytes), which keeps its range tracking simple.

use aya_ebpf::programs::XdpContext;

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
/// and the verifier rejects reading an uninitialised register.
#[derive(Clone, Copy)]
pub struct Source {
    /// `::ffff:a.b.c.d` for IPv4.
    pub addr: [u8; 16],
    /// Whether the packet was IPv4.
    pub is_v4: bool,
}

impl Source {
    #[inline(always)]
    fn v4(a: [u8; 4]) -> Self {
        Self {
            addr: [
                0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a[0], a[1], a[2], a[3],
            ],
            is_v4: true,
        }
    }

    /// The IPv4 address (meaningful when `is_v4`).
    #[inline(always)]
    pub fn v4_addr(&self) -> [u8; 4] {
        [self.addr[12], self.addr[13], self.addr[14], self.addr[15]]
    }
}

/// What the transport header says, as far as the program cares.
#[derive(Clone, Copy)]
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
#[derive(Clone, Copy)]
pub struct Packet {
    pub source: Source,
    pub transport: Transport,
}

/// The frame of one XDP invocation.
struct Frame {
    start: usize,
    end: usize,
}

impl Frame {
    /// The `N` bytes at `offset`, or `Err` when the frame is shorter.
    ///
    /// Callers take each header whole with one call and read its fields from
    /// the returned array: one comparison per header, and every load is
    /// `pointer + constant` from the pointer that comparison checked, which
    /// is the shape the verifier follows even when `offset` is variable (the
    /// IPv4 header length). Checks are never stacked over one another, so
    /// LLVM cannot fold a later check into an earlier one made through a
    /// different pointer.
    #[inline(always)]
    fn header<const N: usize>(&self, offset: usize) -> Result<&[u8; N], ()> {
        let at = self.start + offset;
        if at + N > self.end {
            return Err(());
        }
        // SAFETY: `at .. at + N` lies inside `data .. data_end` by the check
        // just above, which is the comparison the verifier needs to allow the
        // loads; `[u8; N]` has alignment 1, so any address is fine; the
        // packet outlives this program run, which outlives the borrow.
        Ok(unsafe { &*(at as *const [u8; N]) })
    }
}

#[inline(always)]
fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Parses Ethernet (with at most one VLAN tag), IPv4 or IPv6, and TCP or UDP.
///
/// `Ok(None)` is a frame that is not IP; `Err(())` a frame too short for its
/// headers or with impossible fields (bad version or IHL, truncated TCP/UDP).
#[inline(always)]
pub fn parse(ctx: &XdpContext) -> Result<Option<Packet>, ()> {
    let frame = Frame {
        start: ctx.data(),
        end: ctx.data_end(),
    };
    let eth = frame.header::<ETH_HLEN>(0)?;
    let mut ether_type = be16(eth, 12);
    let mut l3 = ETH_HLEN;
    if ether_type == ETH_P_8021Q || ether_type == ETH_P_8021AD {
        let tag = frame.header::<VLAN_HLEN>(ETH_HLEN)?;
        ether_type = be16(tag, 2);
        l3 += VLAN_HLEN;
    }
    match ether_type {
        ETH_P_IP => parse_ipv4(&frame, l3).map(Some),
        ETH_P_IPV6 => parse_ipv6(&frame, l3).map(Some),
        _ => Ok(None),
    }
}

#[inline(always)]
fn parse_ipv4(frame: &Frame, l3: usize) -> Result<Packet, ()> {
    let ip = frame.header::<IPV4_HLEN>(l3)?;
    if ip[0] >> 4 != 4 {
        return Err(());
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ihl < IPV4_HLEN {
        return Err(());
    }
    let source = Source::v4([ip[12], ip[13], ip[14], ip[15]]);
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
fn parse_ipv6(frame: &Frame, l3: usize) -> Result<Packet, ()> {
    let ip = frame.header::<IPV6_HLEN>(l3)?;
    if ip[0] >> 4 != 6 {
        return Err(());
    }
    let mut addr = [0u8; 16];
    addr.copy_from_slice(&ip[8..24]);
    let transport = parse_transport(frame, l3 + IPV6_HLEN, ip[6])?;
    Ok(Packet {
        source: Source { addr, is_v4: false },
        transport,
    })
}

#[inline(always)]
fn parse_transport(frame: &Frame, l4: usize, protocol: u8) -> Result<Transport, ()> {
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
