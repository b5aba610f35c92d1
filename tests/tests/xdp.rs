//! Privileged tests of the XDP program (issue 6; the foundation test of issue 2).
//!
//! Two kinds:
//! - `test_run_*`: crafted frames fed to the loaded (unattached) program with
//!   `BPF_PROG_TEST_RUN`; each frame's verdict and counter changes are exact.
//! - `veth_*`: the program attached to the root end of a veth pair whose other
//!   end sits in a namespace the test creates ([`NetNs`]); packets are sent
//!   from inside the namespace with a raw socket (forged sources from the
//!   guard's own /20) and with real `connect()`s. Sending is paced so the
//!   veth ring never overflows, every wait has a deadline, and the guard
//!   removes the namespace and link also when an assertion fails.
//!
//! All of them skip (saying why) when not run as root.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    process::Command,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use waitroom_common::xdp::{DistinctSources, MINUTE_NS, PortCounters, XdpStats};
use waitroom_edge::xdp::{
    IpPrefix, RunStats, SynBudget, TelemetrySnapshot, XdpConfig, XdpGuard, XdpVerdict,
    enable_run_stats, spawn_telemetry,
};
use waitroom_tests::{netns::NetNs, require_root};

/// The service port of the `test_run` cases.
const SERVICE_PORT: u16 = 8443;
/// A port the program is not told about.
const OTHER_PORT: u16 = 9;
/// Ethernet + IPv4 + TCP without options: what a raw-socket SYN is on the wire.
const SYN_FRAME_LEN: u64 = 14 + 20 + 20;

/// veth tests run one at a time: they share the kernel's packet path, and the
/// cost measurement should not time other tests' traffic.
static NETWORK: Mutex<()> = Mutex::new(());

fn network_lock() -> MutexGuard<'static, ()> {
    NETWORK.lock().unwrap_or_else(PoisonError::into_inner)
}

fn load(config: &XdpConfig) -> XdpGuard {
    XdpGuard::load(config).unwrap_or_else(|e| panic!("loading the XDP program: {e}"))
}

/// The program loaded (not attached) for [`SERVICE_PORT`] with a SYN budget.
fn load_with_syn_budget(rate_per_sec: u32, burst: u32) -> XdpGuard {
    let mut config = XdpConfig::new("unused", [SERVICE_PORT]);
    config.syn_budget = Some(SynBudget {
        rate_per_sec,
        burst,
    });
    load(&config)
}

/// An IPv4 TCP frame from `src` to the service port of 192.0.2.1.
fn service_frame(src: Ipv4Addr, flags: u8) -> Vec<u8> {
    frames::ethernet(
        frames::ETH_P_IP,
        None,
        &frames::ipv4(
            src,
            Ipv4Addr::new(192, 0, 2, 1),
            frames::TCP,
            &frames::tcp(40000, SERVICE_PORT, flags),
        ),
    )
}

/// An IPv6 TCP frame from `src` to the service port of 2001:db8::1.
fn service_frame_v6(src: Ipv6Addr, flags: u8) -> Vec<u8> {
    frames::ethernet(
        frames::ETH_P_IPV6,
        None,
        &frames::ipv6(
            src,
            "2001:db8::1".parse().unwrap(),
            frames::TCP,
            &frames::tcp(40000, SERVICE_PORT, flags),
        ),
    )
}

// ---------------------------------------------------------------------------
// BPF_PROG_TEST_RUN
// ---------------------------------------------------------------------------

/// Counter changes caused by one frame.
#[derive(Debug, Default, PartialEq, Eq)]
struct Effect {
    totals: XdpStats,
    port: PortCounters,
}

fn effect(guard: &XdpGuard, frame: &[u8]) -> (XdpVerdict, Effect) {
    let before = guard.snapshot().expect("snapshot");
    let verdict = guard.test_run(frame).expect("BPF_PROG_TEST_RUN");
    let after = guard.snapshot().expect("snapshot");
    (verdict, difference(&before, &after, SERVICE_PORT))
}

fn difference(before: &TelemetrySnapshot, after: &TelemetrySnapshot, port: u16) -> Effect {
    let (a, b) = (&after.totals, &before.totals);
    let totals = XdpStats {
        packets: a.packets - b.packets,
        bytes: a.bytes - b.bytes,
        non_ip: a.non_ip - b.non_ip,
        malformed: a.malformed - b.malformed,
        denied_packets: a.denied_packets - b.denied_packets,
        denied_bytes: a.denied_bytes - b.denied_bytes,
        syn_budget_dropped: a.syn_budget_dropped - b.syn_budget_dropped,
    };
    let zero = PortCounters::default();
    let (a, b) = (
        after.ports.get(&port).unwrap_or(&zero),
        before.ports.get(&port).unwrap_or(&zero),
    );
    let port = PortCounters {
        packets: a.packets - b.packets,
        bytes: a.bytes - b.bytes,
        syns: a.syns - b.syns,
        syn_budget_dropped: a.syn_budget_dropped - b.syn_budget_dropped,
    };
    Effect { totals, port }
}

/// What a case expects besides `packets += 1, bytes += len`.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// Passed and counted on the service port (with `syn` if a new connection).
    Service { syn: bool },
    /// Passed, not counted by port.
    Uncounted,
    /// Passed, counted as not IP.
    NonIp,
    /// Passed, counted as malformed.
    Malformed,
}

#[test]
fn test_run_parses_and_counts() {
    if !require_root() {
        return;
    }
    let guard = load(&XdpConfig::new("unused", [SERVICE_PORT, 443]));
    let src4 = Ipv4Addr::new(203, 0, 113, 10);
    let dst4 = Ipv4Addr::new(198, 51, 100, 1);
    let src6: Ipv6Addr = "2001:db8::10".parse().unwrap();
    let dst6: Ipv6Addr = "2001:db8::1".parse().unwrap();
    let syn = frames::tcp(40000, SERVICE_PORT, frames::SYN);
    let syn_ack = frames::tcp(40000, SERVICE_PORT, frames::SYN | frames::ACK);
    let ack = frames::tcp(40000, SERVICE_PORT, frames::ACK);
    let udp = frames::udp(40000, SERVICE_PORT, b"hello");
    let eth4 = |ip: Vec<u8>| frames::ethernet(frames::ETH_P_IP, None, &ip);
    let eth6 = |ip: Vec<u8>| frames::ethernet(frames::ETH_P_IPV6, None, &ip);
    let v4 = |proto, l4: &[u8]| eth4(frames::ipv4(src4, dst4, proto, l4));
    let v6 = |next, l4: &[u8]| eth6(frames::ipv6(src6, dst6, next, l4));

    let mut with_options = frames::ipv4(src4, dst4, frames::TCP, &syn);
    with_options.splice(20..20, [1, 1, 1, 1]); // four NOP option bytes
    with_options[0] = 0x46;
    let mut bad_ihl = frames::ipv4(src4, dst4, frames::TCP, &syn);
    bad_ihl[0] = 0x44;
    let mut long_ihl = frames::ipv4(src4, dst4, frames::TCP, &[]);
    long_ihl[0] = 0x4f; // claims 60 bytes of header, frame has 20
    let mut wrong_version = frames::ipv4(src4, dst4, frames::TCP, &syn);
    wrong_version[0] = 0x65;
    let mut later_fragment = frames::ipv4(src4, dst4, frames::TCP, &syn);
    later_fragment[6..8].copy_from_slice(&185u16.to_be_bytes());
    let mut first_fragment = frames::ipv4(src4, dst4, frames::TCP, &syn);
    first_fragment[6..8].copy_from_slice(&0x2000u16.to_be_bytes()); // MF, offset 0
    let truncated_ip = eth4(frames::ipv4(src4, dst4, frames::TCP, &syn))[..14 + 12].to_vec();
    let truncated_tcp = eth4(frames::ipv4(src4, dst4, frames::TCP, &syn))[..14 + 20 + 10].to_vec();
    let truncated_udp = eth4(frames::ipv4(src4, dst4, frames::UDP, &udp))[..14 + 20 + 6].to_vec();
    let truncated_v6 = v6(frames::TCP, &syn)[..14 + 30].to_vec();
    let hop_by_hop = v6(0, &[frames::TCP, 0, 0, 0, 0, 0, 0, 0]);
    let arp = frames::ethernet(0x0806, None, &[0; 28]);
    let vlan_truncated = frames::ethernet(0x8100, None, &[0, 7]);
    let qinq = frames::ethernet(
        0x8100,
        Some(7),
        &frames::ipv4(src4, dst4, frames::TCP, &syn),
    )
    .iter()
    .enumerate()
    .map(|(i, &b)| {
        if (16..18).contains(&i) {
            [0x81, 0x00][i - 16]
        } else {
            b
        }
    })
    .collect::<Vec<u8>>();

    let cases: Vec<(&str, Vec<u8>, Expect)> = vec![
        (
            "IPv4 TCP SYN",
            v4(frames::TCP, &syn),
            Expect::Service { syn: true },
        ),
        (
            "IPv4 TCP SYN-ACK",
            v4(frames::TCP, &syn_ack),
            Expect::Service { syn: false },
        ),
        (
            "IPv4 TCP ACK",
            v4(frames::TCP, &ack),
            Expect::Service { syn: false },
        ),
        (
            "IPv4 UDP",
            v4(frames::UDP, &udp),
            Expect::Service { syn: false },
        ),
        (
            "IPv4 with options",
            eth4(with_options),
            Expect::Service { syn: true },
        ),
        (
            "IPv4 first fragment",
            eth4(first_fragment),
            Expect::Service { syn: true },
        ),
        (
            "IPv4 later fragment",
            eth4(later_fragment),
            Expect::Uncounted,
        ),
        (
            "IPv4 TCP to another port",
            v4(frames::TCP, &frames::tcp(40000, OTHER_PORT, frames::SYN)),
            Expect::Uncounted,
        ),
        (
            "IPv4 UDP to another port",
            v4(frames::UDP, &frames::udp(40000, OTHER_PORT, b"x")),
            Expect::Uncounted,
        ),
        (
            "IPv4 ICMP",
            v4(1, &[8, 0, 0, 0, 0, 0, 0, 0]),
            Expect::Uncounted,
        ),
        (
            "VLAN IPv4 TCP SYN",
            frames::ethernet(
                frames::ETH_P_IP,
                Some(7),
                &frames::ipv4(src4, dst4, frames::TCP, &syn),
            ),
            Expect::Service { syn: true },
        ),
        (
            "IPv6 TCP SYN",
            v6(frames::TCP, &syn),
            Expect::Service { syn: true },
        ),
        (
            "IPv6 TCP SYN-ACK",
            v6(frames::TCP, &syn_ack),
            Expect::Service { syn: false },
        ),
        (
            "IPv6 UDP",
            v6(frames::UDP, &udp),
            Expect::Service { syn: false },
        ),
        (
            "VLAN IPv6 TCP SYN",
            frames::ethernet(
                frames::ETH_P_IPV6,
                Some(7),
                &frames::ipv6(src6, dst6, frames::TCP, &syn),
            ),
            Expect::Service { syn: true },
        ),
        (
            "IPv6 TCP to another port",
            v6(frames::TCP, &frames::tcp(40000, OTHER_PORT, frames::SYN)),
            Expect::Uncounted,
        ),
        ("IPv6 hop-by-hop header", hop_by_hop, Expect::Uncounted),
        ("ARP", arp, Expect::NonIp),
        ("two VLAN tags", qinq, Expect::NonIp),
        ("truncated VLAN header", vlan_truncated, Expect::Malformed),
        ("truncated IPv4 header", truncated_ip, Expect::Malformed),
        ("IPv4 IHL below 5", eth4(bad_ihl), Expect::Malformed),
        (
            "IPv4 IHL beyond the frame",
            eth4(long_ihl),
            Expect::Malformed,
        ),
        (
            "IPv4 ethertype, version 6",
            eth4(wrong_version),
            Expect::Malformed,
        ),
        ("truncated TCP header", truncated_tcp, Expect::Malformed),
        ("truncated UDP header", truncated_udp, Expect::Malformed),
        ("truncated IPv6 header", truncated_v6, Expect::Malformed),
    ];

    for (name, frame, expect) in cases {
        let len = frame.len() as u64;
        let (verdict, got) = effect(&guard, &frame);
        let mut want = Effect {
            totals: XdpStats {
                packets: 1,
                bytes: len,
                ..XdpStats::default()
            },
            port: PortCounters::default(),
        };
        match expect {
            Expect::Service { syn } => {
                want.port = PortCounters {
                    packets: 1,
                    bytes: len,
                    syns: u64::from(syn),
                    syn_budget_dropped: 0,
                };
            }
            Expect::Uncounted => {}
            Expect::NonIp => want.totals.non_ip = 1,
            Expect::Malformed => want.totals.malformed = 1,
        }
        assert_eq!(
            verdict,
            XdpVerdict::Pass,
            "{name}: every parsed or unparsable frame passes"
        );
        assert_eq!(got, want, "{name}");
    }

    let snapshot = guard.snapshot().unwrap();
    assert_eq!(
        snapshot.ports.keys().copied().collect::<Vec<_>>(),
        [443, SERVICE_PORT],
        "only configured ports have counters"
    );
    assert_eq!(snapshot.ports[&443], PortCounters::default());
}

#[test]
fn test_run_deny_list_drops_and_counts() {
    if !require_root() {
        return;
    }
    let mut config = XdpConfig::new("unused", [SERVICE_PORT]);
    config.deny = vec!["198.51.100.0/24".parse().unwrap()];
    let guard = load(&config);
    let slash24: IpPrefix = "203.0.113.0/24".parse().unwrap();
    let slash25: IpPrefix = "203.0.113.128/25".parse().unwrap();
    let v6: IpPrefix = "2001:db8:dead::/48".parse().unwrap();
    for prefix in [slash24, slash25, v6] {
        guard.deny(prefix).unwrap();
    }
    guard.deny(slash24).unwrap(); // twice is fine

    let dst4 = Ipv4Addr::new(192, 0, 2, 1);
    let dst6: Ipv6Addr = "2001:db8::1".parse().unwrap();
    let syn = frames::tcp(40000, SERVICE_PORT, frames::SYN);
    let syn4 = |src: [u8; 4]| {
        frames::ethernet(
            frames::ETH_P_IP,
            None,
            &frames::ipv4(src.into(), dst4, frames::TCP, &syn),
        )
    };
    let syn6 = |src: &str| {
        let src: Ipv6Addr = src.parse().unwrap();
        frames::ethernet(
            frames::ETH_P_IPV6,
            None,
            &frames::ipv6(src, dst6, frames::TCP, &syn),
        )
    };
    let icmp = frames::ethernet(
        frames::ETH_P_IP,
        None,
        &frames::ipv4(
            Ipv4Addr::new(203, 0, 113, 6),
            dst4,
            1,
            &[8, 0, 0, 0, 0, 0, 0, 0],
        ),
    );
    let mut unparsable = syn4([203, 0, 113, 7]);
    unparsable[14] = 0x44; // bad IHL: the source cannot be trusted, so it passes

    let cases: Vec<(&str, Vec<u8>, XdpVerdict)> = vec![
        ("denied /24", syn4([203, 0, 113, 5]), XdpVerdict::Drop),
        (
            "longer denied /25",
            syn4([203, 0, 113, 200]),
            XdpVerdict::Drop,
        ),
        ("denied ICMP", icmp, XdpVerdict::Drop),
        (
            "denied from config",
            syn4([198, 51, 100, 9]),
            XdpVerdict::Drop,
        ),
        ("denied IPv6", syn6("2001:db8:dead::1"), XdpVerdict::Drop),
        ("other IPv4", syn4([203, 0, 114, 5]), XdpVerdict::Pass),
        ("other IPv6", syn6("2001:db8:beef::1"), XdpVerdict::Pass),
        (
            "unparsable from a denied source",
            unparsable,
            XdpVerdict::Pass,
        ),
    ];
    let mut denied_bytes = 0;
    for (name, frame, verdict) in &cases {
        let (got, change) = effect(&guard, frame);
        assert_eq!(got, *verdict, "{name}");
        let dropped = u64::from(*verdict == XdpVerdict::Drop);
        assert_eq!(change.totals.denied_packets, dropped, "{name}");
        assert_eq!(
            change.totals.denied_bytes,
            dropped * frame.len() as u64,
            "{name}"
        );
        denied_bytes += dropped * frame.len() as u64;
        if dropped == 1 {
            assert_eq!(
                change.port,
                PortCounters::default(),
                "{name}: denied is not service traffic"
            );
        }
    }
    let snapshot = guard.snapshot().unwrap();
    assert_eq!(snapshot.totals.denied_packets, 5);
    assert_eq!(snapshot.totals.denied_bytes, denied_bytes);
    assert_eq!(snapshot.ports[&SERVICE_PORT].syns, 2);

    let list = guard.deny_list().unwrap();
    let expected: Vec<(IpPrefix, u64)> = vec![
        ("198.51.100.0/24".parse().unwrap(), 1),
        (slash24, 2),
        (slash25, 1),
        (v6, 1),
    ];
    assert_eq!(list, expected, "per-prefix drop counts (longest match)");

    assert!(guard.allow(slash24).unwrap());
    assert!(!guard.allow(slash24).unwrap(), "already removed");
    assert_eq!(
        guard.test_run(&syn4([203, 0, 113, 5])).unwrap(),
        XdpVerdict::Pass
    );
    assert_eq!(
        guard.test_run(&syn4([203, 0, 113, 200])).unwrap(),
        XdpVerdict::Drop
    );
    assert!(guard.allow(v6).unwrap());
    assert_eq!(
        guard.test_run(&syn6("2001:db8:dead::1")).unwrap(),
        XdpVerdict::Pass
    );
}

#[test]
fn test_run_syn_budget_drops_the_excess_of_one_source() {
    if !require_root() {
        return;
    }
    let guard = load_with_syn_budget(1, 3);
    let frame = service_frame;
    let flooder = Ipv4Addr::new(203, 0, 113, 66);
    let polite = Ipv4Addr::new(203, 0, 113, 67);
    let v6_syn = service_frame_v6("2001:db8::66".parse().unwrap(), frames::SYN);

    let started = Instant::now();
    let flood: Vec<XdpVerdict> = (0..10)
        .map(|_| guard.test_run(&frame(flooder, frames::SYN)).unwrap())
        .collect();
    let polite_verdicts: Vec<XdpVerdict> = (0..3)
        .map(|_| guard.test_run(&frame(polite, frames::SYN)).unwrap())
        .collect();
    let ack = guard.test_run(&frame(flooder, frames::ACK)).unwrap();
    let v6: Vec<XdpVerdict> = (0..4).map(|_| guard.test_run(&v6_syn).unwrap()).collect();
    // At 1 SYN/s a new token needs a second; the runs above take milliseconds.
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "too slow to be exact"
    );

    use XdpVerdict::{Drop, Pass};
    assert_eq!(
        flood,
        [Pass, Pass, Pass, Drop, Drop, Drop, Drop, Drop, Drop, Drop]
    );
    assert_eq!(
        polite_verdicts, [Pass; 3],
        "a polite source keeps its own budget"
    );
    assert_eq!(ack, Pass, "only SYNs are budgeted");
    assert_eq!(v6, [Pass, Pass, Pass, Drop]);

    let snapshot = guard.snapshot().unwrap();
    let port = snapshot.ports[&SERVICE_PORT];
    assert_eq!(port.syns, 9);
    assert_eq!(port.syn_budget_dropped, 8);
    assert_eq!(snapshot.totals.syn_budget_dropped, 8);

    guard.set_syn_budget(None).unwrap();
    assert_eq!(guard.test_run(&frame(flooder, frames::SYN)).unwrap(), Pass);
}

/// An IPv6 abuser changes its address for every SYN, as any host may within
/// its /64: the budget is the /64's, so it gets one burst, not one per
/// address; a neighbour in another /64 keeps its own, and IPv4 sources stay
/// budgeted per address.
#[test]
fn test_run_an_ipv6_abuser_rotating_addresses_in_its_64_gets_one_budget() {
    if !require_root() {
        return;
    }
    let guard = load_with_syn_budget(1, 3);
    let syn6 = |src| service_frame_v6(src, frames::SYN);
    let in_64 =
        |i: u64| Ipv6Addr::from((0x2001_0db8_0001_0002_u128 << 64) | u128::from(i * 7919 + 1));
    let started = Instant::now();
    let rotating = (0..12)
        .filter(|&i| guard.test_run(&syn6(in_64(i))).unwrap() == XdpVerdict::Pass)
        .count();
    let neighbour: Vec<XdpVerdict> = (0..3)
        .map(|_| {
            guard
                .test_run(&syn6("2001:db8:1:3::1".parse().unwrap()))
                .unwrap()
        })
        .collect();
    let v4_neighbours = (0..12u32)
        .filter(|&i| {
            guard
                .test_run(&service_frame(Ipv4Addr::from(0xcb00_7100 + i), frames::SYN))
                .unwrap()
                == XdpVerdict::Pass
        })
        .count();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "too slow to be exact"
    );
    assert_eq!(rotating, 3, "one burst for the whole /64");
    assert_eq!(
        neighbour,
        [XdpVerdict::Pass; 3],
        "another /64, its own budget"
    );
    assert_eq!(v4_neighbours, 12, "IPv4 addresses each have their own");
}

/// A crowd of SYNs from more distinct (spoofed) sources than the old table of
/// sources held, sent between an abuser's SYNs: every one of the crowd's
/// passes (each is its source's first, within any budget, though the crowd
/// shares every bucket with others), and the abuser stays held to what its
/// rate earned meanwhile — the crowd's charges neither free nor crowd out
/// its buckets. (The kernel's LRU table passed this too: it kept the
/// abuser's busy entry. What it paid was an insert per crowd SYN.)
#[test]
fn test_run_a_crowd_of_new_sources_neither_frees_an_abuser_nor_is_dropped() {
    if !require_root() {
        return;
    }
    const BURST: u32 = 10;
    let guard = load_with_syn_budget(1, BURST);
    let syn = |src| service_frame(src, frames::SYN);
    let abuser = syn(Ipv4Addr::new(203, 0, 113, 66));
    let started = Instant::now();
    let first: Vec<XdpVerdict> = (0..BURST + 2)
        .map(|_| guard.test_run(&abuser).unwrap())
        .collect();
    // 150,000 sources: more than one row of buckets, so most share one.
    const CROWD: u32 = 150_000;
    let mut crowd_dropped = 0;
    for i in 0..CROWD {
        let src = Ipv4Addr::from(0x6440_0000 + i);
        if guard.test_run(&syn(src)).unwrap() == XdpVerdict::Drop {
            crowd_dropped += 1;
        }
    }
    let again = (0..BURST)
        .filter(|_| guard.test_run(&abuser).unwrap() == XdpVerdict::Pass)
        .count();
    let elapsed = started.elapsed();

    use XdpVerdict::{Drop, Pass};
    let mut expected = vec![Pass; BURST as usize];
    expected.extend([Drop, Drop]);
    assert_eq!(first, expected, "the abuser's burst, then drops");
    assert_eq!(crowd_dropped, 0, "a new source's first SYN always fits");
    // At 1 SYN a second the abuser earned one SYN per second since.
    let earned = elapsed.as_secs_f64().ceil() as usize;
    assert!(
        again <= earned && earned < BURST as usize,
        "the abuser passed {again} SYNs after the crowd, {earned} earned in {elapsed:?}"
    );
    let snapshot = guard.snapshot().unwrap();
    assert_eq!(
        snapshot.ports[&SERVICE_PORT].syn_budget_dropped,
        2 + (BURST as u64 - again as u64)
    );
}

#[test]
fn test_run_distinct_sources() {
    if !require_root() {
        return;
    }
    let guard = load(&XdpConfig::new("unused", [SERVICE_PORT]));
    let dst = Ipv4Addr::new(192, 0, 2, 1);
    let syn = frames::tcp(40000, SERVICE_PORT, frames::SYN);
    let to_other = frames::tcp(40000, OTHER_PORT, frames::SYN);
    const K: u32 = 20_000;
    // Every source twice, from 100.64.0.0/10 upwards: repeats must not count.
    for round in 0..2 {
        for i in 0..K {
            let src = Ipv4Addr::from(0x6440_0000 + i);
            let frame = frames::ethernet(
                frames::ETH_P_IP,
                None,
                &frames::ipv4(src, dst, frames::TCP, &syn),
            );
            assert_eq!(
                guard.test_run(&frame).unwrap(),
                XdpVerdict::Pass,
                "round {round}"
            );
        }
    }
    let before = union_of_minutes(&guard.snapshot().unwrap());
    // Sources of non-service traffic are not visitors.
    for i in 0..1_000 {
        let src = Ipv4Addr::from(0x0a00_0000 + i);
        let frame = frames::ethernet(
            frames::ETH_P_IP,
            None,
            &frames::ipv4(src, dst, frames::TCP, &to_other),
        );
        guard.test_run(&frame).unwrap();
    }
    let after = union_of_minutes(&guard.snapshot().unwrap());
    assert_eq!(before, after, "non-service traffic left the sketch alone");
    assert_within_three_standard_errors(after.estimate(), K);
}

/// A frame of an established connection (an ACK) from `src` to the service port.
fn ack_from(src: Ipv4Addr) -> Vec<u8> {
    let ack = frames::tcp(40000, SERVICE_PORT, frames::ACK);
    frames::ethernet(
        frames::ETH_P_IP,
        None,
        &frames::ipv4(src, Ipv4Addr::new(192, 0, 2, 1), frames::TCP, &ack),
    )
}

/// Sends an ACK from each of `n` sources counted from `first`.
fn acks_from(guard: &XdpGuard, first: u32, n: u32) {
    for i in 0..n {
        let verdict = guard
            .test_run(&ack_from(Ipv4Addr::from(first + i)))
            .unwrap();
        assert_eq!(verdict, XdpVerdict::Pass);
    }
}

/// The program records a source in the minute userspace last told it, not
/// the clock's (it no longer reads the clock per packet): each minute's
/// sources stay in that minute's sketch, a turn never goes backwards, and
/// the minute before last is forgotten when its slot is reused. Minutes far
/// ahead of the clock, so that nothing turning the clock's minute could
/// interfere (no telemetry reader runs here).
#[test]
fn test_run_sources_count_in_the_minute_userspace_names() {
    if !require_root() {
        return;
    }
    let guard = load(&XdpConfig::new("unused", [SERVICE_PORT]));
    let clock_minute = guard.snapshot().unwrap().clock_ns / MINUTE_NS;
    let loaded = guard.program_minute();
    assert!(
        loaded == clock_minute || loaded + 1 == clock_minute,
        "loaded with minute {loaded}, the clock's is {clock_minute}"
    );

    let m = clock_minute + 10;
    assert!(guard.turn_minute(m).unwrap());
    assert!(!guard.turn_minute(m - 1).unwrap(), "a turn backwards");
    assert!(!guard.turn_minute(m).unwrap(), "the same minute again");
    assert_eq!(guard.program_minute(), m);

    acks_from(&guard, 0x6440_0000, 10);
    let first = guard.sources_in(m).unwrap().estimate();
    assert!((9.5..10.5).contains(&first), "minute m: {first}");

    assert!(guard.turn_minute(m + 1).unwrap());
    // Five sources of the minute before and five new ones.
    acks_from(&guard, 0x6440_0005, 10);
    let second = guard.sources_in(m + 1).unwrap().estimate();
    assert!((9.5..10.5).contains(&second), "minute m + 1: {second}");
    let first_again = guard.sources_in(m).unwrap().estimate();
    assert!(
        (first_again - first).abs() < 1e-9,
        "minute m moved: {first} -> {first_again}"
    );

    assert!(guard.turn_minute(m + 2).unwrap());
    acks_from(&guard, 0x0a00_0000, 1);
    let third = guard.sources_in(m + 2).unwrap().estimate();
    assert!((0.5..1.5).contains(&third), "minute m + 2: {third}");
    assert_eq!(
        guard.sources_in(m).unwrap().estimate(),
        0.0,
        "the minute before last shares its slot with this one and is reset"
    );
    assert!((guard.sources_in(m + 1).unwrap().estimate() - second).abs() < 1e-9);
}

/// The telemetry reader tells the program each new minute of the clock
/// within milliseconds of its start, so a source seen early in a minute is
/// in that minute's count (what the node's reports read). Waits for the
/// clock's next minute: up to a minute.
#[test]
fn test_run_the_reader_turns_the_program_minute_with_the_clock() {
    if !require_root() {
        return;
    }
    let guard = Arc::new(load(&XdpConfig::new("unused", [SERVICE_PORT])));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // A long tick: the minute's turn is its own wake-up, not the reads'.
    let _feed =
        runtime.block_on(async { spawn_telemetry(Arc::clone(&guard), Duration::from_secs(3600)) });
    let clock_minute = || guard.snapshot().unwrap().clock_ns / MINUTE_NS;
    let start = clock_minute();
    let deadline = Instant::now() + Duration::from_secs(65);
    while clock_minute() == start {
        assert!(Instant::now() < deadline, "the clock's minute never turned");
        std::thread::sleep(Duration::from_millis(20));
    }
    let next = clock_minute();
    let deadline = Instant::now() + Duration::from_secs(2);
    while guard.program_minute() < next {
        assert!(
            Instant::now() < deadline,
            "the program still holds minute {} two seconds into minute {next}",
            guard.program_minute()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    acks_from(&guard, 0x6440_0000, 3);
    let snapshot = guard.snapshot().unwrap();
    assert_eq!(snapshot.current_minute.minute, next);
    let now = snapshot.current_minute.estimate();
    assert!((2.5..3.5).contains(&now), "this minute's sources: {now}");
    assert_eq!(snapshot.previous_minute.estimate(), 0.0);
}

/// Both minutes merged: a test that straddles a minute boundary splits its
/// sources between them.
fn union_of_minutes(snapshot: &TelemetrySnapshot) -> DistinctSources {
    let mut union = snapshot.current_minute.sources.clone();
    union.merge_registers(snapshot.previous_minute.sources.registers());
    union
}

fn assert_within_three_standard_errors(estimate: f64, k: u32) {
    let k = f64::from(k);
    let tolerance = 3.0 * DistinctSources::STANDARD_ERROR * k;
    assert!(
        (estimate - k).abs() <= tolerance,
        "estimate {estimate:.0} is not within {tolerance:.0} of {k}"
    );
}

// ---------------------------------------------------------------------------
// veth pair
// ---------------------------------------------------------------------------

/// A raw IPv4 socket created inside the namespace: sends whole IP packets
/// (forged sources included) to the host end of the pair.
struct RawSender {
    fd: OwnedFd,
    dst: Ipv4Addr,
}

impl RawSender {
    fn open(ns: &NetNs) -> Self {
        let fd = ns
            .run_inside(|| {
                // SAFETY: plain socket(2) call; the result is checked below.
                let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: `fd` is a fresh descriptor nobody else owns.
                Ok(unsafe { OwnedFd::from_raw_fd(fd) })
            })
            .and_then(|r| r)
            .expect("raw socket inside the namespace");
        Self {
            fd,
            dst: ns.host_addr(),
        }
    }

    fn send(&self, packet: &[u8]) {
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from(self.dst).to_be(),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: `packet` and `addr` are valid for the lengths passed.
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                packet.as_ptr().cast(),
                packet.len(),
                0,
                (&raw const addr).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        assert_eq!(
            sent,
            packet.len() as isize,
            "sendto: {}",
            io::Error::last_os_error()
        );
    }
}

/// Polls snapshots until `done` holds or `within` passes; returns the last one.
fn wait_for(
    guard: &XdpGuard,
    within: Duration,
    done: impl Fn(&TelemetrySnapshot) -> bool,
) -> TelemetrySnapshot {
    let deadline = Instant::now() + within;
    loop {
        let snapshot = guard.snapshot().expect("snapshot");
        if done(&snapshot) || Instant::now() >= deadline {
            return snapshot;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Sends `packets` in chunks small enough for the veth ring, waiting after
/// each until the program has seen the whole chunk.
fn send_paced(guard: &XdpGuard, sender: &RawSender, packets: &[Vec<u8>]) {
    for chunk in packets.chunks(32) {
        let seen = guard.snapshot().expect("snapshot").totals.packets;
        for packet in chunk {
            sender.send(packet);
        }
        let want = seen + chunk.len() as u64;
        let got = wait_for(guard, Duration::from_secs(3), |s| s.totals.packets >= want);
        assert!(
            got.totals.packets >= want,
            "the program saw {} of {want} packets within 3 s",
            got.totals.packets
        );
    }
}

/// A SYN (IP header onwards) from `src` to `dst:port`.
fn syn_from(src: Ipv4Addr, dst: Ipv4Addr, port: u16, i: u32) -> Vec<u8> {
    let src_port = 1024 + (i % 60_000) as u16;
    frames::ipv4(
        src,
        dst,
        frames::TCP,
        &frames::tcp(src_port, port, frames::SYN),
    )
}

/// Issue 2's foundation test and issue 6's counting test: N SYNs from K
/// forged sources across the pair, read back from the maps exactly.
#[test]
fn veth_counts_syns_and_distinct_sources() {
    if !require_root() {
        return;
    }
    let _serial = network_lock();
    let ns = NetNs::new().expect("namespace and veth pair");
    let port = 8080;
    let guard = XdpGuard::attach(&XdpConfig::new(ns.host_if(), [port, 8081]))
        .unwrap_or_else(|e| panic!("attaching to {}: {e}", ns.host_if()));
    assert_eq!(guard.interface(), Some(ns.host_if()));
    assert!(xdp_attached(ns.host_if()), "ip link shows the program");
    let sender = RawSender::open(&ns);
    let dst = ns.host_addr();

    const K: u32 = 1_000;
    const ROUNDS: u32 = 3;
    let mut packets: Vec<Vec<u8>> = (0..K * ROUNDS)
        .map(|i| syn_from(ns.spoofed_source(i % K), dst, port, i))
        .collect();
    // Traffic the port counters must ignore: other ports, and non-SYN / UDP
    // traffic that counts as packets but not as connections.
    let udp: Vec<Vec<u8>> = (0..100)
        .map(|i| {
            frames::ipv4(
                ns.spoofed_source(i),
                dst,
                frames::UDP,
                &frames::udp(5353, port, b"ping"),
            )
        })
        .collect();
    let elsewhere: Vec<Vec<u8>> = (0..200)
        .map(|i| syn_from(ns.spoofed_source(K + i), dst, OTHER_PORT, i))
        .collect();
    let udp_len = udp[0].len() as u64 + 14;
    packets.extend(udp);
    packets.extend(elsewhere);
    send_paced(&guard, &sender, &packets);

    let want_syns = u64::from(K * ROUNDS);
    let snapshot = wait_for(&guard, Duration::from_secs(3), |s| {
        s.ports
            .get(&port)
            .is_some_and(|p| p.packets >= want_syns + 100)
    });
    std::thread::sleep(Duration::from_millis(50));
    let settled = guard.snapshot().unwrap();
    assert_eq!(settled.ports, snapshot.ports, "nothing more arrived");

    let counted = settled.ports[&port];
    assert_eq!(counted.syns, want_syns, "every SYN counted once");
    assert_eq!(counted.packets, want_syns + 100, "SYNs and UDP to the port");
    assert_eq!(counted.bytes, want_syns * SYN_FRAME_LEN + 100 * udp_len);
    assert_eq!(settled.ports[&8081], PortCounters::default());
    assert_eq!(
        settled.ports.len(),
        2,
        "ports outside the configured set are not counted"
    );
    assert!(settled.totals.packets >= want_syns + 300);
    assert_eq!(settled.totals.malformed, 0);
    // 1 000 sources sent SYNs to the service port; the 200 that only wrote
    // to another port are not visitors.
    assert_within_three_standard_errors(union_of_minutes(&settled).estimate(), K);

    drop(guard);
    assert!(
        !xdp_attached(ns.host_if()),
        "dropping the guard detaches the program"
    );
}

/// Whether `ip link` shows an XDP program on `interface`.
fn xdp_attached(interface: &str) -> bool {
    let output = Command::new("ip")
        .args(["link", "show", "dev", interface])
        .output()
        .expect("ip link show");
    String::from_utf8_lossy(&output.stdout).contains("prog/xdp")
}

/// The node's once-a-second reader, sped up: it publishes snapshots that
/// include new traffic, and ends when its last receiver is dropped.
#[test]
fn veth_telemetry_reader_publishes_and_stops() {
    if !require_root() {
        return;
    }
    let _serial = network_lock();
    let ns = NetNs::new().expect("namespace and veth pair");
    let port = 8080;
    let guard = Arc::new(XdpGuard::attach(&XdpConfig::new(ns.host_if(), [port])).unwrap());
    let sender = RawSender::open(&ns);
    let packets: Vec<Vec<u8>> = (0..64)
        .map(|i| syn_from(ns.spoofed_source(i), ns.host_addr(), port, i))
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut feed = spawn_telemetry(Arc::clone(&guard), Duration::from_millis(20));
        send_paced(&guard, &sender, &packets);
        let published = tokio::time::timeout(Duration::from_secs(3), async {
            loop {
                feed.changed().await.expect("the reader is running");
                if let Some(snapshot) = feed.borrow_and_update().clone()
                    && snapshot.ports[&port].syns >= 64
                {
                    return snapshot;
                }
            }
        })
        .await
        .expect("a snapshot with the SYNs within 3 s");
        assert_eq!(published.ports[&port].syns, 64);
        assert!(published.current_minute.estimate() + published.previous_minute.estimate() > 0.0);

        drop(feed);
        let deadline = Instant::now() + Duration::from_secs(3);
        while Arc::strong_count(&guard) > 1 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    assert_eq!(
        Arc::strong_count(&guard),
        1,
        "the reader let go of the guard"
    );
}

#[test]
fn veth_deny_list_drops_and_counts_while_others_pass() {
    if !require_root() {
        return;
    }
    let _serial = network_lock();
    let ns = NetNs::new().expect("namespace and veth pair");
    let listener = TcpListener::bind(SocketAddrV4::new(ns.host_addr(), 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let guard = XdpGuard::attach(&XdpConfig::new(ns.host_if(), [port])).unwrap();
    let target = SocketAddr::from((ns.host_addr(), port));
    let connect = || {
        ns.run_inside(|| TcpStream::connect_timeout(&target, Duration::from_millis(500)).is_ok())
            .unwrap()
    };

    assert!(connect(), "a real connection passes before any deny");
    let peer = IpPrefix::from(IpAddr::V4(ns.peer_addr()));
    guard.deny(peer).unwrap();
    assert!(
        !connect(),
        "the peer's SYN is dropped once its address is denied"
    );
    let dropped = guard.deny_list().unwrap();
    assert!(
        dropped.iter().any(|&(p, n)| p == peer && n >= 1),
        "the drop is counted on the peer's prefix: {dropped:?}"
    );
    assert!(guard.allow(peer).unwrap());
    assert!(connect(), "allowed again");

    // Exact counts with forged sources: the first /26 of the guard's range
    // is denied, the second is not.
    let denied = IpPrefix::new(IpAddr::V4(ns.spoofed_source(0)), 26).unwrap();
    guard.deny(denied).unwrap();
    let before = guard.snapshot().unwrap();
    let sender = RawSender::open(&ns);
    let packets: Vec<Vec<u8>> = (0..256)
        .map(|i| syn_from(ns.spoofed_source(i % 128), ns.host_addr(), port, i))
        .collect();
    send_paced(&guard, &sender, &packets);
    let after = wait_for(&guard, Duration::from_secs(3), |s| {
        s.totals.denied_packets >= before.totals.denied_packets + 128
            && s.ports[&port].syns >= before.ports[&port].syns + 128
    });
    let effect = difference(&before, &after, port);
    assert_eq!(effect.totals.denied_packets, 128);
    assert_eq!(effect.totals.denied_bytes, 128 * SYN_FRAME_LEN);
    assert_eq!(effect.port.syns, 128, "the other /26 passed, counted");
    let list = guard.deny_list().unwrap();
    assert_eq!(list, [(denied, 128)]);
}

#[test]
fn veth_syn_budget_drops_a_flood_not_polite_sources() {
    if !require_root() {
        return;
    }
    let _serial = network_lock();
    let ns = NetNs::new().expect("namespace and veth pair");
    let port = 8080;
    let mut config = XdpConfig::new(ns.host_if(), [port]);
    config.syn_budget = Some(SynBudget {
        rate_per_sec: 2,
        burst: 5,
    });
    let guard = XdpGuard::attach(&config).unwrap();
    let sender = RawSender::open(&ns);
    let dst = ns.host_addr();

    const FLOOD: u32 = 300;
    const POLITE_SOURCES: u32 = 50;
    const POLITE_EACH: u32 = 4;
    let flooder = ns.spoofed_source(4000);
    let flood = (0..FLOOD).map(|i| syn_from(flooder, dst, port, i));
    // Polite sources, each below its burst, interleaved with the flood.
    let polite = (0..POLITE_SOURCES * POLITE_EACH)
        .map(|n| syn_from(ns.spoofed_source(n % POLITE_SOURCES), dst, port, n));
    let mut packets = Vec::new();
    let (mut flood, mut polite) = (flood.fuse(), polite.fuse());
    loop {
        let (a, b) = (flood.next(), polite.next());
        if a.is_none() && b.is_none() {
            break;
        }
        packets.extend(a);
        packets.extend(b);
    }
    let started = Instant::now();
    send_paced(&guard, &sender, &packets);
    let elapsed = started.elapsed();

    let polite = u64::from(POLITE_SOURCES * POLITE_EACH);
    let total = u64::from(FLOOD) + polite;
    let snapshot = wait_for(&guard, Duration::from_secs(3), |s| {
        let p = s.ports[&port];
        p.syns + p.syn_budget_dropped >= total
    });
    let counted = snapshot.ports[&port];
    assert_eq!(counted.syns + counted.syn_budget_dropped, total);
    // The flooder gets its burst plus what the rate refilled while sending.
    let refilled = (elapsed.as_secs_f64() * 2.0).ceil() as u64;
    let flood_passed = counted.syns - polite;
    assert!(
        counted.syns >= polite + 5 && flood_passed <= 5 + refilled,
        "passed {} SYNs: {polite} polite + 5 burst + at most {refilled} refilled",
        counted.syns
    );
    assert_eq!(counted.syn_budget_dropped, u64::from(FLOOD) - flood_passed);
    assert_eq!(
        snapshot.totals.syn_budget_dropped,
        counted.syn_budget_dropped
    );
}

/// Cost per packet: the kernel's run time ÷ run count (BPF_ENABLE_STATS, the
/// scoped form of `sysctl kernel.bpf_stats_enabled=1`) over SYNs crossing
/// the pair, and BPF_PROG_TEST_RUN's own mean for comparison. Prints both.
#[test]
fn veth_cost_per_packet() {
    if !require_root() {
        return;
    }
    let _serial = network_lock();
    let ns = NetNs::new().expect("namespace and veth pair");
    let port = 8080;
    let guard = XdpGuard::attach(&XdpConfig::new(ns.host_if(), [port])).unwrap();
    let sender = RawSender::open(&ns);
    let packets: Vec<Vec<u8>> = (0..10_000)
        .map(|i| syn_from(ns.spoofed_source(i), ns.host_addr(), port, i))
        .collect();

    let stats_on = enable_run_stats().expect("BPF_ENABLE_STATS");
    let before: RunStats = guard.run_stats().unwrap();
    send_paced(&guard, &sender, &packets);
    let after = guard.run_stats().unwrap();
    drop(stats_on);
    assert!(after.run_count - before.run_count >= 10_000);
    let attached = after.ns_per_packet_since(&before).unwrap();

    let frame = frames::ethernet(
        frames::ETH_P_IP,
        None,
        &syn_from(ns.spoofed_source(1), ns.host_addr(), port, 1),
    );
    let (verdict, mean) = guard.test_run_repeat(&frame, 100_000).unwrap();
    assert_eq!(verdict, XdpVerdict::Pass);
    eprintln!(
        "XDP cost per packet: {attached:.0} ns attached to veth ({} runs, bpf stats); \
         {} ns per BPF_PROG_TEST_RUN repeat (service-port SYN)",
        after.run_count - before.run_count,
        mean.as_nanos()
    );
}

/// Frame builders: Ethernet (with an optional VLAN tag), IPv4, IPv6, TCP, UDP,
/// with correct checksums.
mod frames {
    use std::net::{Ipv4Addr, Ipv6Addr};

    pub const ETH_P_IP: u16 = 0x0800;
    pub const ETH_P_IPV6: u16 = 0x86dd;
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const SYN: u8 = 0x02;
    pub const ACK: u8 = 0x10;

    pub fn ethernet(ether_type: u16, vlan: Option<u16>, payload: &[u8]) -> Vec<u8> {
        let mut frame = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
        if let Some(id) = vlan {
            frame.extend_from_slice(&0x8100u16.to_be_bytes());
            frame.extend_from_slice(&id.to_be_bytes());
        }
        frame.extend_from_slice(&ether_type.to_be_bytes());
        frame.extend_from_slice(payload);
        frame
    }

    /// A 20-byte TCP header (checksum filled in by [`ipv4`] / [`ipv6`]).
    pub fn tcp(src_port: u16, dst_port: u16, flags: u8) -> Vec<u8> {
        let mut h = vec![0; 20];
        h[0..2].copy_from_slice(&src_port.to_be_bytes());
        h[2..4].copy_from_slice(&dst_port.to_be_bytes());
        h[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes());
        h[12] = 5 << 4;
        h[13] = flags;
        h[14..16].copy_from_slice(&64_240u16.to_be_bytes());
        h
    }

    pub fn udp(src_port: u16, dst_port: u16, payload: &[u8]) -> Vec<u8> {
        let mut h = vec![0; 8];
        h[0..2].copy_from_slice(&src_port.to_be_bytes());
        h[2..4].copy_from_slice(&dst_port.to_be_bytes());
        let len = u16::try_from(8 + payload.len()).unwrap();
        h[4..6].copy_from_slice(&len.to_be_bytes());
        h.extend_from_slice(payload);
        h
    }

    pub fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, l4: &[u8]) -> Vec<u8> {
        let mut p = vec![0; 20];
        p[0] = 0x45;
        let total = u16::try_from(20 + l4.len()).unwrap();
        p[2..4].copy_from_slice(&total.to_be_bytes());
        p[8] = 64;
        p[9] = protocol;
        p[12..16].copy_from_slice(&src.octets());
        p[16..20].copy_from_slice(&dst.octets());
        let sum = checksum(&p, 0);
        p[10..12].copy_from_slice(&sum.to_be_bytes());
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&src.octets());
        pseudo.extend_from_slice(&dst.octets());
        pseudo.extend_from_slice(&[0, protocol]);
        pseudo.extend_from_slice(&u16::try_from(l4.len()).unwrap().to_be_bytes());
        p.extend_from_slice(&with_l4_checksum(protocol, &pseudo, l4));
        p
    }

    pub fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, l4: &[u8]) -> Vec<u8> {
        let mut p = vec![0; 40];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&u16::try_from(l4.len()).unwrap().to_be_bytes());
        p[6] = next_header;
        p[7] = 64;
        p[8..24].copy_from_slice(&src.octets());
        p[24..40].copy_from_slice(&dst.octets());
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&src.octets());
        pseudo.extend_from_slice(&dst.octets());
        pseudo.extend_from_slice(&u32::try_from(l4.len()).unwrap().to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, next_header]);
        p.extend_from_slice(&with_l4_checksum(next_header, &pseudo, l4));
        p
    }

    fn with_l4_checksum(protocol: u8, pseudo: &[u8], l4: &[u8]) -> Vec<u8> {
        let mut l4 = l4.to_vec();
        let at = match protocol {
            TCP if l4.len() >= 20 => 16,
            UDP if l4.len() >= 8 => 6,
            _ => return l4,
        };
        l4[at..at + 2].fill(0);
        let sum = checksum(&l4, sum_words(pseudo));
        l4[at..at + 2].copy_from_slice(&sum.to_be_bytes());
        l4
    }

    fn sum_words(data: &[u8]) -> u32 {
        data.chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
            .sum()
    }

    fn checksum(data: &[u8], initial: u32) -> u16 {
        let mut sum = initial + sum_words(data);
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }
}
