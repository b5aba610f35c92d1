//! The waitroom XDP program.
//!
//! It sees every packet on the ingress interface before the kernel's TCP stack
//! does, and for each one:
//! 1. counts it (per CPU);
//! 2. parses Ethernet (one VLAN tag), IPv4/IPv6 and TCP/UDP — what it cannot
//!    parse it passes, counted as non-IP or malformed;
//! 3. drops it if the source matches the deny list (LPM tries), counting the
//!    drop per CPU and per prefix;
//! 4. for TCP/UDP to a service port (the keys of `PORTS`): records the source
//!    in this minute's HyperLogLog sketch, applies the per-source SYN budget
//!    to SYNs (dropping the excess; a sketch of token buckets, so a new
//!    source inserts nothing), and counts packets, bytes and SYNs.
//!
//! Map layouts live in `waitroom_common::xdp`.
// Only the BPF build is a real program; on the host (`cargo check
// --workspace --all-targets`) this compiles to an empty binary.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// `AtomicU64::fetch_add` is missing on the BPF target (it has no compare-and-swap),
// but the backend lowers a relaxed `atomicrmw add` to BPF's atomic add.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(
    target_arch = "bpf",
    expect(internal_features, reason = "atomic_xadd: see the feature above")
)]

mod parse;

use core::sync::atomic::AtomicU64;

use aya_ebpf::{
    bindings::xdp_action,
    helpers::bpf_ktime_get_coarse_ns,
    macros::{map, xdp},
    maps::{Array, LpmTrie, PerCpuArray, lpm_trie::Key},
    programs::XdpContext,
};
use aya_log_ebpf::warn;
use waitroom_common::xdp::{
    HLL_REGISTERS, MAX_DENY_PREFIXES, MAX_SERVICE_PORTS, PortCounters, SYN_BUDGET_BUCKETS,
    SourceSketch, SynBucket, SynVerdict, XdpSettings, XdpStats, hll_position, source_hash_v4,
    source_hash_v6, syn_budget_buckets, syn_budget_charge, syn_budget_hash_v6,
};

use crate::parse::{Packet, Source, Transport};

#[map(name = "STATS")]
static STATS: PerCpuArray<XdpStats> = PerCpuArray::with_max_entries(1, 0);

/// Destination port → slot in `PORTS` (0: not a service port).
#[map(name = "PORT_SLOTS")]
static PORT_SLOTS: Array<u8> = Array::with_max_entries(1 << 16, 0);

#[map(name = "PORTS")]
static PORTS: PerCpuArray<PortCounters> = PerCpuArray::with_max_entries(MAX_SERVICE_PORTS + 1, 0);

#[map(name = "SOURCES")]
static SOURCES: PerCpuArray<SourceSketch> = PerCpuArray::with_max_entries(2, 0);

/// Value: packets dropped by the prefix, shared by all CPUs (atomic adds).
#[map(name = "DENY_V4")]
static DENY_V4: LpmTrie<[u8; 4], AtomicU64> = LpmTrie::with_max_entries(MAX_DENY_PREFIXES, 0);

#[map(name = "DENY_V6")]
static DENY_V6: LpmTrie<[u8; 16], AtomicU64> = LpmTrie::with_max_entries(MAX_DENY_PREFIXES, 0);

/// Two rows of buckets shared by all CPUs; a source is charged to one in
/// each (`waitroom_common::xdp::syn_budget_charge`).
#[map(name = "SYN_BUDGET")]
static SYN_BUDGET: Array<SynBucket> = Array::with_max_entries(SYN_BUDGET_BUCKETS, 0);

#[map(name = "SETTINGS")]
static SETTINGS: Array<XdpSettings> = Array::with_max_entries(1, 0);

#[xdp]
pub fn waitroom(ctx: XdpContext) -> u32 {
    match try_waitroom(&ctx) {
        Ok(action) => action,
        Err(()) => {
            count(|stats| stats.malformed += 1);
            // Fail open: what we cannot parse still reaches the stack.
            xdp_action::XDP_PASS
        }
    }
}

/// Passes every packet, touching nothing: the peer `waitroom-xdp-cost`
/// measures in the same run, so the program's own cost per packet is the
/// difference (the hook and the kernel's accounting are in both). The node
/// never attaches it.
#[xdp]
pub fn waitroom_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

fn try_waitroom(ctx: &XdpContext) -> Result<u32, ()> {
    let len = (ctx.data_end() - ctx.data()) as u64;
    count(|stats| {
        stats.packets += 1;
        stats.bytes += len;
    });
    let Some(Packet { source, transport }) = parse::parse(ctx)? else {
        count(|stats| stats.non_ip += 1);
        return Ok(xdp_action::XDP_PASS);
    };
    let Some(settings) = SETTINGS.get(0) else {
        return Ok(xdp_action::XDP_PASS); // cannot happen: slot 0 always exists
    };

    if let Some(dropped) = denied(settings, source) {
        atomic_add(dropped, 1);
        count(|stats| {
            stats.denied_packets += 1;
            stats.denied_bytes += len;
        });
        return Ok(xdp_action::XDP_DROP);
    }

    let (dst_port, syn) = match transport {
        Transport::Tcp { dst_port, syn } => (dst_port, syn),
        Transport::Udp { dst_port } => (dst_port, false),
        Transport::Other => return Ok(xdp_action::XDP_PASS),
    };
    let slot = PORT_SLOTS.get(u32::from(dst_port)).copied().unwrap_or(0);
    if slot == 0 {
        return Ok(xdp_action::XDP_PASS);
    }
    let Some(port) = PORTS.get_ptr_mut(u32::from(slot)) else {
        return Ok(xdp_action::XDP_PASS); // a slot beyond the array: a loader bug
    };

    let hash = if source.is_v4 {
        source_hash_v4(source.v4())
    } else {
        source_hash_v6(source.hi, source.lo)
    };
    record_source(settings.minute, hash);

    if syn && !syn_allowed(ctx, settings, source, syn_budget_hash(source, hash)) {
        // SAFETY: `port` is this CPU's copy of a per-CPU array slot, checked
        // non-null by `get_ptr_mut`; nothing else writes this CPU's copy while
        // the program runs on it (XDP does not nest), so the plain
        // read-modify-write cannot race.
        unsafe { (*port).syn_budget_dropped += 1 };
        count(|stats| stats.syn_budget_dropped += 1);
        return Ok(xdp_action::XDP_DROP);
    }

    // SAFETY: as above: a non-null per-CPU value only this CPU writes.
    unsafe {
        (*port).packets += 1;
        (*port).bytes += len;
        if syn {
            (*port).syns += 1;
        }
    }
    Ok(xdp_action::XDP_PASS)
}

/// Adds `n` to a counter shared by all CPUs.
#[inline(always)]
fn atomic_add(counter: &AtomicU64, n: u64) {
    #[cfg(target_arch = "bpf")]
    // SAFETY: `as_ptr` of a live `AtomicU64` (a trie value, which RCU keeps
    // mapped while the program runs); the add is atomic, so CPUs counting
    // the same prefix do not lose updates.
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
            counter.as_ptr(),
            n,
        );
    }
    // Host builds (`cargo check --workspace`) have compare-and-swap.
    #[cfg(not(target_arch = "bpf"))]
    counter.fetch_add(n, core::sync::atomic::Ordering::Relaxed);
}

/// Applies `update` to this CPU's [`XdpStats`].
#[inline(always)]
fn count(update: impl FnOnce(&mut XdpStats)) {
    if let Some(stats) = STATS.get_ptr_mut(0) {
        // SAFETY: slot 0 of a one-slot per-CPU array, non-null by the check;
        // only this CPU's program touches this copy and XDP does not nest on
        // a CPU, so the exclusive borrow is real for the closure's duration.
        update(unsafe { &mut *stats });
    }
}

/// The drop counter of the longest denied prefix holding `source`, if any.
/// An empty trie is not searched: the lookup is the dearest step of a packet
/// that is not for a service port.
#[inline(always)]
fn denied(settings: &XdpSettings, source: Source) -> Option<&'static AtomicU64> {
    if source.is_v4 {
        if settings.deny_v4_prefixes == 0 {
            return None;
        }
        DENY_V4.get(Key::new(32, source.v4_addr()))
    } else {
        if settings.deny_v6_prefixes == 0 {
            return None;
        }
        DENY_V6.get(Key::new(128, source.addr()))
    }
}

/// Records a source hash in the HyperLogLog sketch of `minute` (the current
/// one, as userspace last wrote it into the settings).
#[inline(always)]
fn record_source(minute: u64, hash: u64) {
    let Some(sketch) = SOURCES.get_ptr_mut((minute & 1) as u32) else {
        return;
    };
    // SAFETY: this CPU's copy of a per-CPU array slot, non-null by the check
    // above, written only by this CPU's program (XDP does not nest). The
    // register index is masked to the array length, which the verifier sees.
    unsafe {
        if (*sketch).minute != minute {
            // First packet of a new minute on this CPU: the slot still holds
            // the minute before last, which nobody asks about any more.
            let words = (*sketch).registers.as_mut_ptr().cast::<u64>();
            let mut i = 0;
            while i < HLL_REGISTERS / 8 {
                // Volatile, so LLVM keeps a bounded loop instead of emitting a
                // `memset` call the BPF target cannot link.
                words.add(i).write_volatile(0);
                i += 1;
            }
            (*sketch).minute = minute;
        }
        let (index, rank) = hll_position(hash);
        let register = (*sketch)
            .registers
            .as_mut_ptr()
            .add(index & (HLL_REGISTERS - 1));
        if rank > *register {
            *register = rank;
        }
    }
}

/// The hash a source's SYN budget is kept by: its IPv4 address (`hash`,
/// the sketch's), or its IPv6 /64 — one host or household holds a whole
/// /64 and can change its address within it at will, so a budget per
/// address would give it 2^64 budgets.
#[inline(always)]
fn syn_budget_hash(source: Source, hash: u64) -> u64 {
    if source.is_v4 {
        hash
    } else {
        syn_budget_hash_v6(source.hi)
    }
}

/// Whether a SYN from `source` (whose budget is kept by `hash`) fits its
/// budget; always true when no budget is configured. The decision is
/// `syn_budget_charge` over the source's two buckets: a count-min sketch of
/// GCRA token buckets, so no entry is ever inserted — a source never seen
/// costs what a known one does.
#[inline(always)]
fn syn_allowed(ctx: &XdpContext, settings: &XdpSettings, source: Source, hash: u64) -> bool {
    let interval = settings.syn_interval_ns;
    if interval == 0 {
        return true;
    }
    let (first, second) = syn_budget_buckets(hash, settings.syn_seed);
    let (Some(a), Some(b)) = (
        SYN_BUDGET.get_ptr_mut(first),
        SYN_BUDGET.get_ptr_mut(second),
    ) else {
        return true; // cannot happen: both indices are masked into the array
    };
    // SAFETY: the helper reads CLOCK_MONOTONIC_COARSE; no memory is involved.
    // Read only here, for a SYN under a budget: the helper was half the
    // program's own cost, and nothing else on the path needs it (the
    // sketch's minute comes from the settings). Coarse (one jiffy) is plenty
    // for a SYN budget and cheaper than the precise clocks.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    // SAFETY: two non-null slots of an array map, which stay mapped while
    // the program runs; they are distinct (one in each row), so the two
    // exclusive borrows do not alias. Other CPUs may charge the same buckets
    // at once (plain reads and writes, as the hash table's values were): a
    // race can let a few extra SYNs through or lose a drop count, which a
    // budget tolerates — never memory safety.
    let verdict =
        unsafe { syn_budget_charge(&mut *a, &mut *b, now, interval, settings.syn_burst_ns) };
    match verdict {
        SynVerdict::Pass => true,
        SynVerdict::Drop { first } => {
            if first {
                if source.is_v4 {
                    warn!(ctx, "SYN budget exceeded by {:i}", source.v4_addr());
                } else {
                    warn!(ctx, "SYN budget exceeded by {:i}", source.addr());
                }
            }
            false
        }
    }
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
