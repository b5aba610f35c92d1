//! Map names, value layouts and the source-address sketch shared by the XDP
//! program (`waitroom-ebpf`) and its loader (`waitroom-edge::xdp`).
//!
//! # Maps
//! | name | kind | key | value | written by |
//! |---|---|---|---|---|
//! | [`MAP_STATS`] | per-CPU array, 1 slot | `u32` 0 | [`XdpStats`] | kernel |
//! | [`MAP_PORT_SLOTS`] | array, 65 536 slots | destination port (host order) | `u8` slot in [`MAP_PORTS`], 0 = not a service port | userspace |
//! | [`MAP_PORTS`] | per-CPU array, 1 + [`MAX_SERVICE_PORTS`] slots | port slot | [`PortCounters`] | kernel |
//! | [`MAP_SOURCES`] | per-CPU array, 2 slots | `minute % 2` | [`SourceSketch`] | kernel |
//! | [`MAP_DENY_V4`] / [`MAP_DENY_V6`] | LPM trie | prefix | `u64` packets dropped | userspace inserts, kernel counts |
//! | [`MAP_SYN_BUDGET`] | array, 2 × [`SYN_BUDGET_ROW`] slots | a source's bucket in each row ([`syn_budget_buckets`]) | [`SynBucket`] | kernel |
//! | [`MAP_SETTINGS`] | array, 1 slot | `u32` 0 | [`XdpSettings`] | userspace |
//!
//! Time is `CLOCK_MONOTONIC_COARSE` on both sides (jiffy resolution, which
//! minutes and SYN budgets need no better than). A service packet does not
//! read it: the clock helper was half the program's own cost, so userspace
//! writes the current minute into [`XdpSettings::minute`] at every minute's
//! start and the program records sources in that minute's sketch. Only a
//! SYN under a budget reads `bpf_ktime_get_coarse_ns()`. The kernel resets a
//! sketch slot the first time it touches it in a new minute, and a slot
//! whose [`SourceSketch::minute`] is stale simply holds no sources for the
//! minute asked about.

/// Name of the XDP program inside the object file.
pub const PROGRAM_NAME: &str = "waitroom";

/// Name of the object's second program, which passes every packet and does
/// nothing else: the peer the per-packet cost is measured against (what the
/// kernel's accounting and the hook cost without any of our work). Never
/// attached by the node.
pub const PASS_PROGRAM_NAME: &str = "waitroom_pass";

/// Per-CPU array of [`XdpStats`], one slot.
pub const MAP_STATS: &str = "STATS";
/// Array from destination port to its slot in [`MAP_PORTS`] (0: not a
/// service port). Two array lookups, which the verifier inlines, cost less
/// per packet than one hash lookup.
pub const MAP_PORT_SLOTS: &str = "PORT_SLOTS";
/// Per-CPU array of [`PortCounters`], indexed by port slot (slot 0 unused).
pub const MAP_PORTS: &str = "PORTS";
/// Per-CPU array of two [`SourceSketch`]es, indexed by minute parity.
pub const MAP_SOURCES: &str = "SOURCES";
/// LPM trie of denied IPv4 prefixes (`[u8; 4]` keys), value = packets dropped.
pub const MAP_DENY_V4: &str = "DENY_V4";
/// LPM trie of denied IPv6 prefixes (`[u8; 16]` keys), value = packets dropped.
pub const MAP_DENY_V6: &str = "DENY_V6";
/// Array of the SYN budget's buckets ([`SynBucket`]): two rows of
/// [`SYN_BUDGET_ROW`], a source's SYN charged to one bucket in each (see
/// [`syn_budget_charge`]).
pub const MAP_SYN_BUDGET: &str = "SYN_BUDGET";
/// Array of one [`XdpSettings`], written by userspace.
pub const MAP_SETTINGS: &str = "SETTINGS";

/// How many service ports the program can count.
pub const MAX_SERVICE_PORTS: u32 = 64;
/// How many prefixes each deny trie can hold.
pub const MAX_DENY_PREFIXES: u32 = 65_536;
/// Buckets in each of the SYN budget's two rows (a power of two; 4 MiB of
/// [`SynBucket`]s in all). The buckets never fill up or get evicted: sources
/// share them, and a source is held to its budget whatever shares its
/// buckets. One is wrongly limited only while *both* of its buckets are
/// loaded by other sources, which takes on the order of
/// `SYN_BUDGET_ROW × burst` SYNs from distinct sources within a burst's time
/// (a spoofed flood; one or a few abusers cannot: two given sources share
/// both buckets with a chance of one in 131,072²).
pub const SYN_BUDGET_ROW: u32 = 131_072;
/// Slots of [`MAP_SYN_BUDGET`]: two rows.
pub const SYN_BUDGET_BUCKETS: u32 = 2 * SYN_BUDGET_ROW;

/// Nanoseconds in the minute the sketches are kept by.
pub const MINUTE_NS: u64 = 60_000_000_000;

/// Number of index bits of the HyperLogLog sketch.
pub const HLL_PRECISION: u32 = 12;
/// Number of HyperLogLog registers (2^[`HLL_PRECISION`]).
pub const HLL_REGISTERS: usize = 1 << HLL_PRECISION;

/// Whole-program counters, kept per CPU.
///
/// Userspace sums the per-CPU values; the kernel side only ever adds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XdpStats {
    /// Every packet the program saw, whatever it did with it.
    pub packets: u64,
    /// Bytes of those packets (frame length as seen by XDP).
    pub bytes: u64,
    /// Frames that are not IPv4 or IPv6 (ARP, LLDP, ...): passed.
    pub non_ip: u64,
    /// Frames too short for their headers or with impossible header fields: passed.
    pub malformed: u64,
    /// Packets dropped because their source matched the deny list.
    pub denied_packets: u64,
    /// Bytes of the denied packets.
    pub denied_bytes: u64,
    /// TCP SYNs dropped because their source exceeded its SYN budget.
    pub syn_budget_dropped: u64,
}

impl XdpStats {
    /// Adds another CPU's counters to these.
    #[must_use]
    pub fn merged(self, other: Self) -> Self {
        Self {
            packets: self.packets.wrapping_add(other.packets),
            bytes: self.bytes.wrapping_add(other.bytes),
            non_ip: self.non_ip.wrapping_add(other.non_ip),
            malformed: self.malformed.wrapping_add(other.malformed),
            denied_packets: self.denied_packets.wrapping_add(other.denied_packets),
            denied_bytes: self.denied_bytes.wrapping_add(other.denied_bytes),
            syn_budget_dropped: self
                .syn_budget_dropped
                .wrapping_add(other.syn_budget_dropped),
        }
    }
}

/// Counters of one service port, kept per CPU.
///
/// Only traffic that got past the deny list is counted here.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// Packets (TCP or UDP) to this port that were passed to the stack.
    pub packets: u64,
    /// Bytes of those packets.
    pub bytes: u64,
    /// TCP SYNs without ACK (connection attempts) passed to the stack.
    pub syns: u64,
    /// TCP SYNs to this port dropped by the per-source SYN budget.
    pub syn_budget_dropped: u64,
}

impl PortCounters {
    /// Adds another CPU's counters to these.
    #[must_use]
    pub fn merged(self, other: Self) -> Self {
        Self {
            packets: self.packets.wrapping_add(other.packets),
            bytes: self.bytes.wrapping_add(other.bytes),
            syns: self.syns.wrapping_add(other.syns),
            syn_budget_dropped: self
                .syn_budget_dropped
                .wrapping_add(other.syn_budget_dropped),
        }
    }
}

/// One CPU's HyperLogLog registers of the source addresses seen in one minute.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceSketch {
    /// Minute (`CLOCK_MONOTONIC_COARSE / 60 s`) the registers belong to.
    pub minute: u64,
    /// Register `i` holds the largest rank seen among hashes whose top
    /// [`HLL_PRECISION`] bits are `i` (0 = none seen).
    pub registers: [u8; HLL_REGISTERS],
}

impl SourceSketch {
    /// An empty sketch for `minute`.
    #[must_use]
    pub const fn empty(minute: u64) -> Self {
        Self {
            minute,
            registers: [0; HLL_REGISTERS],
        }
    }
}

impl Default for SourceSketch {
    fn default() -> Self {
        Self::empty(0)
    }
}

/// One bucket of the SYN budget: a token bucket kept in its GCRA form, so
/// that one timestamp is the whole state and no division runs per packet.
/// Shared by the sources that hash to it ([`syn_budget_charge`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SynBucket {
    /// Theoretical arrival time (monotonic ns) of the next SYN at the
    /// configured rate, at least that of every source charged here; a SYN is
    /// allowed while it would not push this more than the burst allowance
    /// ahead of now.
    pub tat_ns: u64,
    /// SYNs dropped since the bucket last ran empty of charges (approximate:
    /// CPUs race on it). The program logs a source's first drop while one of
    /// its buckets still reads 0, so an abuser is named once per episode.
    pub dropped: u64,
}

/// The hash an IPv6 source's SYN budget is kept by: its /64 (`hi`, the
/// address's first eight bytes, big-endian), since one host or household
/// holds a whole /64 and can change its address within it at will. An IPv4
/// source's budget is kept by its address ([`source_hash_v4`]).
#[inline(always)]
#[must_use]
pub const fn syn_budget_hash_v6(hi: u64) -> u64 {
    source_hash_v6(hi, 0)
}

/// A source's two buckets in [`MAP_SYN_BUDGET`], one in each row, from its
/// budget's hash ([`source_hash_v4`] / [`syn_budget_hash_v6`]) and the node's
/// secret `seed` ([`XdpSettings::syn_seed`], drawn at every load), so that
/// which addresses share a bucket cannot be worked out from outside.
#[inline(always)]
#[must_use]
pub const fn syn_budget_buckets(hash: u64, seed: u64) -> (u32, u32) {
    let h = fmix64(hash ^ seed);
    let mask = SYN_BUDGET_ROW as u64 - 1;
    (
        (h & mask) as u32,
        SYN_BUDGET_ROW + ((h >> 32) & mask) as u32,
    )
}

/// What [`syn_budget_charge`] did with a SYN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynVerdict {
    /// Within the budget: passed, and charged to both buckets.
    Pass,
    /// Over it: dropped. `first` while one of the source's buckets had no
    /// drop yet since it last ran empty: the program names the source then.
    Drop { first: bool },
}

/// Charges one SYN at `now` to its source's two buckets `a` and `b` (distinct
/// slots, one in each row): the SYN budget's whole decision, which the
/// program runs on the map's slots.
///
/// A count-min sketch of GCRA token buckets with conservative update: the
/// SYN is judged by the less loaded of the two buckets, and if it passes,
/// each bucket behind the new time is raised to it (none is lowered). A
/// bucket's time is thus never below the one the source would have with a
/// bucket of its own, so a source never gets more than `burst` plus
/// `rate × t` SYNs through, whoever shares its buckets; alone in either one it
/// is judged exactly as by a bucket of its own. Sharing can only err towards
/// dropping, and only while both buckets are loaded by others. Nothing is
/// ever inserted or evicted: a SYN costs two array slots, where a hash table
/// of sources paid an insert (about 0.4 µs) for every source it had not
/// seen — that is, for every SYN of a spoofed flood.
#[inline(always)]
pub fn syn_budget_charge(
    a: &mut SynBucket,
    b: &mut SynBucket,
    now: u64,
    interval: u64,
    burst: u64,
) -> SynVerdict {
    let least = if a.tat_ns < b.tat_ns {
        a.tat_ns
    } else {
        b.tat_ns
    };
    let tat = if least > now { least } else { now };
    let next = tat.saturating_add(interval);
    if next - now > burst {
        let first = a.dropped == 0 || b.dropped == 0;
        a.dropped = a.dropped.wrapping_add(1);
        b.dropped = b.dropped.wrapping_add(1);
        return SynVerdict::Drop { first };
    }
    raise(a, now, next);
    raise(b, now, next);
    SynVerdict::Pass
}

/// Raises `bucket` to `next` if it is behind; a bucket that had run empty
/// of charges (its time not after `now`) starts counting drops afresh.
#[inline(always)]
fn raise(bucket: &mut SynBucket, now: u64, next: u64) {
    if bucket.tat_ns <= now {
        bucket.dropped = 0;
    }
    if bucket.tat_ns < next {
        bucket.tat_ns = next;
    }
}

/// Runtime settings of the program, written by userspace.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XdpSettings {
    /// Nanoseconds between SYNs at the budgeted rate (1 s ÷ rate); 0 turns
    /// the SYN budget off.
    pub syn_interval_ns: u64,
    /// How far ahead of now a source's theoretical arrival time may run:
    /// `burst × syn_interval_ns`.
    pub syn_burst_ns: u64,
    /// Prefixes in [`MAP_DENY_V4`]; while 0 the program skips the lookup.
    pub deny_v4_prefixes: u32,
    /// Prefixes in [`MAP_DENY_V6`]; while 0 the program skips the lookup.
    pub deny_v6_prefixes: u32,
    /// The current minute of `CLOCK_MONOTONIC_COARSE` (its nanoseconds ÷
    /// [`MINUTE_NS`]), written by userspace at load and at every minute's
    /// start: the minute whose sketch the program records sources in. A
    /// packet does not read the clock for it — the clock helper was half
    /// the program's own cost — so a source seen in the milliseconds before
    /// userspace turns the minute counts in the minute before.
    pub minute: u64,
    /// Secret mixed into a source's hash to pick its SYN budget buckets
    /// ([`syn_budget_buckets`]), drawn at random by the loader, so that
    /// nobody outside can pick addresses that share a victim's buckets.
    pub syn_seed: u64,
}

impl XdpSettings {
    /// These settings with a SYN budget of `rate_per_sec` and bursts of
    /// `burst` SYNs; `None` turns the budget off, and so does a rate above
    /// 10^9/s. A rate or burst of zero is raised to one.
    #[must_use]
    pub const fn with_syn_budget(self, budget: Option<(u32, u32)>) -> Self {
        let (syn_interval_ns, syn_burst_ns) = match budget {
            None => (0, 0),
            Some((rate_per_sec, burst)) => {
                let rate = if rate_per_sec == 0 { 1 } else { rate_per_sec } as u64;
                let interval = 1_000_000_000 / rate;
                let burst = if burst == 0 { 1 } else { burst } as u64;
                (interval, interval * burst)
            }
        };
        Self {
            syn_interval_ns,
            syn_burst_ns,
            ..self
        }
    }
}

/// The murmur3 64-bit finalizer: a bijection with full avalanche, cheap in BPF.
/// The one copy in the project: the ticket ledger's placement and the ticket's
/// network tag use it too.
#[inline(always)]
#[must_use]
pub const fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

/// Hash of an IPv4 source address (as a number: `a.b.c.d` is
/// `u32::from_be_bytes([a, b, c, d])`) for the sketch.
#[inline(always)]
#[must_use]
pub const fn source_hash_v4(addr: u32) -> u64 {
    fmix64(addr as u64 ^ 0x9e37_79b9_7f4a_7c15)
}

/// Hash of an IPv6 source address, given as its two big-endian halves
/// (`hi` the first eight bytes), for the sketch.
#[inline(always)]
#[must_use]
pub const fn source_hash_v6(hi: u64, lo: u64) -> u64 {
    fmix64(fmix64(hi ^ 0x6a09_e667_f3bc_c908) ^ lo)
}

/// Register index and rank of a hash: the top [`HLL_PRECISION`] bits pick the
/// register, the rank is one more than the number of leading zeros of the rest.
#[inline(always)]
#[must_use]
pub const fn hll_position(hash: u64) -> (usize, u8) {
    let index = (hash >> (64 - HLL_PRECISION)) as usize;
    // A sentinel bit below the remaining 52 bits caps the rank at 53.
    let rest = (hash << HLL_PRECISION) | (1 << (HLL_PRECISION - 1));
    (index, leading_zeros(rest) as u8 + 1)
}

/// `u64::leading_zeros` by binary search, because the BPF backend has no
/// count-leading-zeros instruction and its expansion is longer than this.
#[inline(always)]
const fn leading_zeros(mut x: u64) -> u32 {
    if x == 0 {
        return 64;
    }
    let mut n = 0;
    if x & 0xffff_ffff_0000_0000 == 0 {
        n += 32;
        x <<= 32;
    }
    if x & 0xffff_0000_0000_0000 == 0 {
        n += 16;
        x <<= 16;
    }
    if x & 0xff00_0000_0000_0000 == 0 {
        n += 8;
        x <<= 8;
    }
    if x & 0xf000_0000_0000_0000 == 0 {
        n += 4;
        x <<= 4;
    }
    if x & 0xc000_0000_0000_0000 == 0 {
        n += 2;
        x <<= 2;
    }
    if x & 0x8000_0000_0000_0000 == 0 {
        n += 1;
    }
    n
}

#[cfg(feature = "std")]
pub use sketch::DistinctSources;

#[cfg(feature = "std")]
mod sketch {
    use super::{HLL_REGISTERS, hll_position};

    /// A HyperLogLog sketch of distinct source addresses, merged from the
    /// per-CPU [`super::SourceSketch`]es (or from several nodes' sketches).
    #[derive(Clone, PartialEq, Eq)]
    pub struct DistinctSources {
        /// One rank per register; the layout of [`super::SourceSketch::registers`].
        registers: Box<[u8; HLL_REGISTERS]>,
    }

    impl std::fmt::Debug for DistinctSources {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("DistinctSources")
                .field("estimate", &self.estimate())
                .finish_non_exhaustive()
        }
    }

    impl Default for DistinctSources {
        fn default() -> Self {
            Self {
                registers: Box::new([0; HLL_REGISTERS]),
            }
        }
    }

    impl DistinctSources {
        /// Relative standard error of [`Self::estimate`]: 1.04 / √m.
        pub const STANDARD_ERROR: f64 = 1.04 / 64.0; // √4096 = 64

        /// An empty sketch.
        #[must_use]
        pub fn new() -> Self {
            Self::default()
        }

        /// The registers, for shipping to another merger.
        #[must_use]
        pub fn registers(&self) -> &[u8; HLL_REGISTERS] {
            &self.registers
        }

        /// Records one hashed source (the userspace twin of the kernel update).
        pub fn insert_hash(&mut self, hash: u64) {
            let (index, rank) = hll_position(hash);
            let register = &mut self.registers[index];
            *register = (*register).max(rank);
        }

        /// Merges another sketch into this one by register maximum.
        pub fn merge_registers(&mut self, other: &[u8; HLL_REGISTERS]) {
            for (mine, theirs) in self.registers.iter_mut().zip(other.iter()) {
                *mine = (*mine).max(*theirs);
            }
        }

        /// Estimated number of distinct sources, with the small-range
        /// (linear counting) correction of Flajolet et al.
        #[must_use]
        pub fn estimate(&self) -> f64 {
            #[expect(clippy::cast_precision_loss, reason = "4096 is exactly representable")]
            let m = HLL_REGISTERS as f64;
            let alpha = 0.7213 / (1.0 + 1.079 / m);
            let mut sum = 0.0;
            let mut zeros = 0u32;
            for &register in self.registers.iter() {
                sum += 2f64.powi(-i32::from(register));
                if register == 0 {
                    zeros += 1;
                }
            }
            let raw = alpha * m * m / sum;
            if raw <= 2.5 * m && zeros > 0 {
                m * (m / f64::from(zeros)).ln()
            } else {
                raw
            }
        }

        /// Whether no source was recorded.
        #[must_use]
        pub fn is_empty(&self) -> bool {
            self.registers.iter().all(|&r| r == 0)
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY (all impls below): the types are `#[repr(C)]`, made only of
    // integers and `u8` arrays laid out without padding (`SourceSketch` is
    // 8 + 4096 bytes, a multiple of its 8-byte alignment; `XdpSettings` has
    // its two `u32`s side by side, filling 8 bytes between `u64`s), and every bit pattern is a valid value.
    // SAFETY: see above.
    unsafe impl aya::Pod for super::XdpStats {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::PortCounters {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::SourceSketch {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::SynBucket {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::XdpSettings {}
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;

    #[test]
    fn leading_zeros_matches_core() {
        for shift in 0..64 {
            let x = 1u64 << shift;
            assert_eq!(leading_zeros(x), x.leading_zeros());
            assert_eq!(leading_zeros(x | 1), (x | 1).leading_zeros());
        }
        assert_eq!(leading_zeros(0), 64);
        assert_eq!(leading_zeros(u64::MAX), 0);
    }

    #[test]
    fn position_uses_top_bits_and_caps_rank() {
        assert_eq!(hll_position(0), (0, 53));
        assert_eq!(hll_position(u64::MAX), (HLL_REGISTERS - 1, 1));
        let (index, rank) = hll_position(0x0010_0000_0000_0000 | (1 << 40));
        assert_eq!((index, rank), (1, 12));
    }

    #[test]
    fn estimate_within_three_standard_errors() {
        for k in [0u32, 1, 10, 1_000, 10_000, 100_000, 1_000_000] {
            let mut sketch = DistinctSources::new();
            for i in 0..k {
                sketch.insert_hash(source_hash_v4(0x0a00_0000 + i));
            }
            let estimate = sketch.estimate();
            let k = f64::from(k);
            let tolerance = 3.0 * DistinctSources::STANDARD_ERROR * k;
            assert!(
                (estimate - k).abs() <= tolerance.max(0.5),
                "k = {k}, estimate = {estimate}"
            );
        }
    }

    #[test]
    fn merging_is_union() {
        let mut a = DistinctSources::new();
        let mut b = DistinctSources::new();
        let mut both = DistinctSources::new();
        for i in 0..5_000u32 {
            let h = source_hash_v6(0, u64::from(i));
            if i % 2 == 0 {
                a.insert_hash(h)
            } else {
                b.insert_hash(h)
            }
            both.insert_hash(h);
        }
        a.merge_registers(b.registers());
        assert_eq!(a, both);
    }

    /// A GCRA bucket of the source's own: what the sketch must match for a
    /// source alone in its buckets, and bound for any source.
    fn own_bucket(tat: &mut u64, now: u64, interval: u64, burst: u64) -> bool {
        let next = (*tat).max(now) + interval;
        if next - now > burst {
            return false;
        }
        *tat = next;
        true
    }

    /// Charges one SYN to buckets `i` and `j` (`i` < `j`) of `table`, as
    /// the program does to the map's slots.
    fn sketch_syn(
        table: &mut [SynBucket],
        (i, j): (usize, usize),
        now: u64,
        interval: u64,
        burst: u64,
    ) -> bool {
        let (low, high) = table.split_at_mut(j);
        syn_budget_charge(&mut low[i], &mut high[0], now, interval, burst) == SynVerdict::Pass
    }

    const INTERVAL: u64 = 1_000;
    const BURST: u64 = 3 * INTERVAL;

    proptest::proptest! {
        /// Alone in its buckets a source is judged exactly as by a bucket of
        /// its own: the same SYNs pass, the same are dropped.
        #[test]
        fn a_source_alone_is_judged_as_by_its_own_bucket(
            gaps in proptest::collection::vec(0u64..2_500, 1..200),
            interval in 1u64..2_000,
            burst_syns in 1u64..6,
        ) {
            let burst = interval * burst_syns;
            let (mut own, mut table, mut now) = (0, [SynBucket::default(); 2], 1_000_000);
            for gap in gaps {
                now += gap;
                let alone = own_bucket(&mut own, now, interval, burst);
                proptest::prop_assert_eq!(sketch_syn(&mut table, (0, 1), now, interval, burst), alone);
            }
        }

        /// However sources share buckets (rows of three here, so nearly every
        /// pair shares one), no source gets more through than its own bucket
        /// would have let through: the SYNs that passed, replayed against a
        /// bucket of its own, all pass.
        #[test]
        fn no_source_passes_more_than_its_budget_whoever_shares_its_buckets(
            buckets in proptest::collection::vec((0usize..3, 3usize..6), 2..10),
            syns in proptest::collection::vec((0usize..10, 0u64..1_500), 1..400),
        ) {
            let mut table = [SynBucket::default(); 6];
            let mut passed: Vec<Vec<u64>> = vec![Vec::new(); buckets.len()];
            let mut now = 1_000_000;
            for (source, gap) in syns {
                let source = source % buckets.len();
                now += gap;
                if sketch_syn(&mut table, buckets[source], now, INTERVAL, BURST) {
                    passed[source].push(now);
                }
            }
            for (source, times) in passed.iter().enumerate() {
                let mut own = 0;
                for &t in times {
                    proptest::prop_assert!(
                        own_bucket(&mut own, t, INTERVAL, BURST),
                        "source {} passed a SYN at {} beyond its budget", source, t
                    );
                }
            }
        }
    }

    #[test]
    fn an_abuser_sharing_one_bucket_leaves_a_polite_source_its_budget() {
        // Rows of two: the flooder uses buckets (0, 2); the polite source
        // shares 0, not 2.
        let (flooder, neighbour) = ((0, 2), (0, 3));
        let mut table = [SynBucket::default(); 4];
        let now = 1_000_000;
        let flood: Vec<bool> = (0..10)
            .map(|_| sketch_syn(&mut table, flooder, now, INTERVAL, BURST))
            .collect();
        assert_eq!(
            flood.iter().filter(|&&p| p).count(),
            3,
            "the burst, then drops"
        );
        let polite: Vec<bool> = (0..3)
            .map(|_| sketch_syn(&mut table, neighbour, now, INTERVAL, BURST))
            .collect();
        assert_eq!(polite, [true; 3], "its other bucket is its own");
        assert!(
            !sketch_syn(&mut table, neighbour, now, INTERVAL, BURST),
            "and its burst is 3"
        );
        // The flooder is still held: its own bucket 2 is spent, and bucket 0
        // now carries the polite source's charges too.
        assert!(!sketch_syn(
            &mut table,
            flooder,
            now + INTERVAL / 2,
            INTERVAL,
            BURST
        ));
        assert!(
            sketch_syn(&mut table, flooder, now + INTERVAL, INTERVAL, BURST),
            "refilled"
        );
    }

    #[test]
    fn a_source_is_wrongly_limited_only_when_both_its_buckets_are_loaded() {
        // Rows of three: buckets 0–2 and 3–5.
        let mut table = [SynBucket::default(); 6];
        let now = 1_000_000;
        // Two abusers load buckets 0 and 4; the victim hashes to both.
        for _ in 0..10 {
            sketch_syn(&mut table, (0, 3), now, INTERVAL, BURST);
            sketch_syn(&mut table, (1, 4), now, INTERVAL, BURST);
        }
        assert!(
            !sketch_syn(&mut table, (0, 4), now, INTERVAL, BURST),
            "both loaded: held"
        );
        assert!(
            sketch_syn(&mut table, (0, 5), now, INTERVAL, BURST),
            "one free: passes"
        );
    }

    #[test]
    fn an_abuser_is_named_once_per_episode() {
        let (mut a, mut b) = (SynBucket::default(), SynBucket::default());
        let now = 1_000_000;
        let mut charge = |at| syn_budget_charge(&mut a, &mut b, at, INTERVAL, BURST);
        let verdicts: Vec<SynVerdict> = (0..6).map(|_| charge(now)).collect();
        use SynVerdict::{Drop, Pass};
        assert_eq!(
            verdicts,
            [
                Pass,
                Pass,
                Pass,
                Drop { first: true },
                Drop { first: false },
                Drop { first: false }
            ]
        );
        // Quiet long enough for the buckets to run empty: a new episode.
        let later = now + 10 * BURST;
        assert_eq!(charge(later), Pass);
        assert_eq!(charge(later), Pass);
        assert_eq!(charge(later), Pass);
        assert_eq!(charge(later), Drop { first: true });
    }

    #[test]
    fn a_sources_buckets_lie_one_in_each_row_spread_and_move_with_the_seed() {
        let mut moved = 0;
        for i in 0..10_000u32 {
            let hash = source_hash_v4(0x0a00_0000 + i);
            let (a, b) = syn_budget_buckets(hash, 0x1234);
            assert!(a < SYN_BUDGET_ROW, "first row");
            assert!(
                (SYN_BUDGET_ROW..SYN_BUDGET_BUCKETS).contains(&b),
                "second row"
            );
            let (c, d) = syn_budget_buckets(hash, 0x5678);
            moved += u32::from(a != c && b != d);
        }
        assert!(
            moved > 9_990,
            "another seed, other buckets: {moved} of 10,000 moved"
        );
        // Neighbouring addresses do not crowd into neighbouring buckets.
        let rows: std::collections::HashSet<u32> = (0..1_000u32)
            .map(|i| syn_budget_buckets(source_hash_v4(0x0a00_0000 + i), 7).0)
            .collect();
        assert!(
            rows.len() > 990,
            "1,000 neighbours in {} buckets",
            rows.len()
        );
    }

    #[test]
    fn syn_budget_settings() {
        let off = XdpSettings::default();
        assert_eq!(off.with_syn_budget(None), off);
        let s = off.with_syn_budget(Some((10, 5)));
        assert_eq!(s.syn_interval_ns, 100_000_000);
        assert_eq!(s.syn_burst_ns, 500_000_000);
        assert_eq!(s.with_syn_budget(None), off);
        let s = off.with_syn_budget(Some((u32::MAX, 1)));
        assert_eq!(
            (s.syn_interval_ns, s.syn_burst_ns),
            (0, 0),
            "above 10^9/s: no budget"
        );
        let s = off.with_syn_budget(Some((0, 0)));
        assert_eq!(
            (s.syn_interval_ns, s.syn_burst_ns),
            (1_000_000_000, 1_000_000_000)
        );
    }
}
