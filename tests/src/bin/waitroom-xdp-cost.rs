//! `waitroom-xdp-cost`: the XDP program's cost per packet on a veth pair, by
//! kind of packet (issue 17, item 5). Run by `cargo xtask bench` as root.
//!
//! Makes a namespace with a veth pair ([`NetNs`]), attaches the node's
//! program to the root end in each mode asked for, and sends forged packets
//! from inside the namespace with a raw socket, paced so the backlog never
//! overflows. The cost is the kernel's own accounting while
//! `BPF_ENABLE_STATS` is on: run time ÷ run count (it includes the two clock
//! reads the accounting itself adds, as the kernel's figure always does).
//!
//! Cases, each on a freshly loaded program (so the SYN budget's buckets are empty):
//! - `pass`: the peer, measured the same way in the same run: the object's
//!   `waitroom_pass` program, which returns `XDP_PASS` and does nothing else,
//!   sent the same ACKs. What it costs is the hook and the accounting, which
//!   every other case pays too; a case's own cost is its figure minus this;
//! - `non_syn`: ACKs to the service port (what an established connection sends);
//! - `syn_no_budget`: SYNs from 4,096 sources, no SYN budget configured;
//! - `syn_budget_new_sources`: SYNs from 4,096 sources never seen before, with
//!   a budget (their buckets untouched; until session 29 the budget was an
//!   LRU hash of sources and every such packet inserted an entry);
//! - `syn_budget_known_sources`: the same 4,096 sources again (their buckets
//!   charged before, cold);
//! - `syn_budget_one_source`: SYNs from one source (its two buckets hot).
//!   The budget is far above what is sent, so every SYN passes.
//!
//! For comparison, each case's frame is also run hot with `BPF_PROG_TEST_RUN`
//! (100,000 repeats of one frame, the kernel's mean; no accounting clocks, a
//! warm cache; for the new-source case every repeat after the first finds
//! the source known, so it has no hot figure).
//!
//! Prints one JSON object on stdout.
use std::{
    io,
    net::Ipv4Addr,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use waitroom_edge::xdp::{
    RunStats, SynBudget, XdpAttachMode, XdpConfig, XdpGuard, enable_run_stats,
};
use waitroom_tests::netns::NetNs;

#[derive(Debug, Parser)]
struct Args {
    /// Packets per case and round (sources repeat every 4,096).
    #[arg(long, default_value_t = 4096)]
    packets: u32,
    /// Rounds per case; the JSON has each round's figure and their median.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Attach modes to measure: `skb` (generic XDP), `auto` (the driver's
    /// native XDP where it has one; veth does).
    #[arg(long, value_delimiter = ',', default_value = "skb,auto")]
    modes: Vec<String>,
}

/// The service port the program is told about.
const PORT: u16 = 8080;
/// Distinct forgeable sources of one [`NetNs`].
const SOURCES: u32 = 4096;
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;

#[derive(Debug, Clone, Copy)]
enum Case {
    Pass,
    NonSyn,
    SynNoBudget,
    SynBudgetNewSources,
    SynBudgetKnownSources,
    SynBudgetOneSource,
}

impl Case {
    const ALL: [Self; 6] = [
        Self::Pass,
        Self::NonSyn,
        Self::SynNoBudget,
        Self::SynBudgetNewSources,
        Self::SynBudgetKnownSources,
        Self::SynBudgetOneSource,
    ];

    fn key(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::NonSyn => "non_syn",
            Self::SynNoBudget => "syn_no_budget",
            Self::SynBudgetNewSources => "syn_budget_new_sources",
            Self::SynBudgetKnownSources => "syn_budget_known_sources",
            Self::SynBudgetOneSource => "syn_budget_one_source",
        }
    }

    fn budget(self) -> Option<SynBudget> {
        match self {
            Self::Pass | Self::NonSyn | Self::SynNoBudget => None,
            // Far above what is sent: every SYN passes, so the figure is the
            // cost of accounting, not of dropping.
            _ => Some(SynBudget {
                rate_per_sec: 1_000_000,
                burst: 1_000_000,
            }),
        }
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("waitroom-xdp-cost needs root (XDP, network namespaces)");
    }
    let ns = NetNs::new().context("namespace and veth pair")?;
    let sender = RawSender::open(&ns)?;
    let mut modes = serde_json::Map::new();
    for mode in &args.modes {
        let attach_mode = match mode.as_str() {
            "skb" => XdpAttachMode::Skb,
            "auto" => XdpAttachMode::Auto,
            "driver" => XdpAttachMode::Driver,
            other => bail!("--modes: unknown mode {other:?} (skb, auto, driver)"),
        };
        let mut cases = serde_json::Map::new();
        for case in Case::ALL {
            let mut rounds = Vec::new();
            let mut hot = Vec::new();
            for _ in 0..args.rounds {
                let (veth, test_run) = measure(&ns, &sender, attach_mode, case, args.packets)?;
                rounds.push(veth);
                hot.extend(test_run);
            }
            hot.sort_by(f64::total_cmp);
            let hot = hot.get(hot.len() / 2).copied();
            let mut sorted = rounds.clone();
            sorted.sort_by(f64::total_cmp);
            let median = sorted[sorted.len() / 2];
            eprintln!(
                "    XDP {mode:<4} {:<26} {median:>6.1} ns/packet (rounds {}; hot test run {})",
                case.key(),
                rounds
                    .iter()
                    .map(|r| format!("{r:.1}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                hot.map_or_else(|| "-".to_owned(), |h| format!("{h:.1}"))
            );
            cases.insert(
                case.key().into(),
                serde_json::json!({"ns_per_packet": median, "rounds": rounds, "test_run_ns": hot}),
            );
        }
        modes.insert(mode.clone(), serde_json::Value::Object(cases));
    }
    let out = serde_json::json!({
        "packets_per_round": args.packets,
        "rounds": args.rounds,
        "modes": modes,
    });
    println!("{out}");
    Ok(())
}

/// Nanoseconds per packet of `case` on the veth pair (a fresh program,
/// attached in `mode`), and hot in `BPF_PROG_TEST_RUN` where that means the same.
fn measure(
    ns: &NetNs,
    sender: &RawSender,
    mode: XdpAttachMode,
    case: Case,
    packets: u32,
) -> Result<(f64, Option<f64>)> {
    let mut config = XdpConfig::new(ns.host_if(), [PORT]);
    config.mode = mode;
    config.syn_budget = case.budget();
    let guard = if matches!(case, Case::Pass) {
        XdpGuard::attach_pass(&config).context("attaching the pass-only peer")?
    } else {
        XdpGuard::attach(&config).context("attaching the XDP program")?
    };
    let dst = ns.host_addr();
    let packet = |i: u32| -> Vec<u8> {
        let (source, flags) = match case {
            Case::Pass | Case::NonSyn => (ns.spoofed_source(i % 64), ACK),
            Case::SynBudgetOneSource => (ns.spoofed_source(7), SYN),
            _ => (ns.spoofed_source(i % SOURCES), SYN),
        };
        tcp_packet(source, dst, 1024 + (i % 60_000) as u16, PORT, flags)
    };
    let stats_on = enable_run_stats().context("BPF_ENABLE_STATS")?;
    if matches!(case, Case::SynBudgetKnownSources) {
        // First charge every source's buckets, unmeasured.
        let warm: Vec<_> = (0..SOURCES).map(packet).collect();
        send_paced(&guard, sender, &warm)?;
    }
    let all: Vec<_> = (0..packets).map(packet).collect();
    let before = guard.run_stats()?;
    send_paced(&guard, sender, &all)?;
    let after = guard.run_stats()?;
    drop(stats_on);
    let veth = after
        .ns_per_packet_since(&before)
        .context("the program did not run")?;
    let hot = if matches!(case, Case::SynBudgetNewSources) {
        None
    } else {
        // Ethernet header (any MACs, IPv4) before the IP packet.
        let mut frame = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x08, 0x00];
        frame.extend_from_slice(&packet(1));
        let (_, mean) = guard.test_run_repeat(&frame, 100_000)?;
        Some(mean.as_secs_f64() * 1e9)
    };
    Ok((veth, hot))
}

/// Sends `packets` in chunks small enough for the backlog, waiting after each
/// until the program has run once per packet of the chunk (at most 3 s).
fn send_paced(guard: &XdpGuard, sender: &RawSender, packets: &[Vec<u8>]) -> Result<()> {
    for chunk in packets.chunks(32) {
        let want = guard.run_stats()?.run_count + chunk.len() as u64;
        for packet in chunk {
            sender.send(packet)?;
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let RunStats { run_count, .. } = guard.run_stats()?;
            if run_count >= want {
                break;
            }
            if Instant::now() >= deadline {
                bail!("the program ran {run_count} of {want} times within 3 s");
            }
            std::thread::yield_now();
        }
    }
    Ok(())
}

/// A raw IPv4 socket inside the namespace: sends whole IP packets, forged
/// sources included, to the host end of the pair.
struct RawSender {
    fd: OwnedFd,
    dst: Ipv4Addr,
}

impl RawSender {
    fn open(ns: &NetNs) -> Result<Self> {
        let fd = ns.run_inside(|| {
            // SAFETY: plain socket(2); the result is checked below.
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `fd` is a fresh descriptor nobody else owns.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        })??;
        Ok(Self {
            fd,
            dst: ns.host_addr(),
        })
    }

    fn send(&self, packet: &[u8]) -> Result<()> {
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
        if sent != packet.len() as isize {
            bail!("sendto: {}", io::Error::last_os_error());
        }
        Ok(())
    }
}

/// An IPv4 packet carrying a 20-byte TCP header with `flags`, checksums filled in.
fn tcp_packet(src: Ipv4Addr, dst: Ipv4Addr, src_port: u16, dst_port: u16, flags: u8) -> Vec<u8> {
    let mut tcp = vec![0; 20];
    tcp[0..2].copy_from_slice(&src_port.to_be_bytes());
    tcp[2..4].copy_from_slice(&dst_port.to_be_bytes());
    tcp[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = flags;
    tcp[14..16].copy_from_slice(&64_240u16.to_be_bytes());
    let mut pseudo = Vec::with_capacity(12);
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&[0, 6, 0, 20]);
    let sum = checksum(&tcp, sum_words(&pseudo));
    tcp[16..18].copy_from_slice(&sum.to_be_bytes());

    let mut ip = vec![0; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&40u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let sum = checksum(&ip, 0);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    ip.extend_from_slice(&tcp);
    ip
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
