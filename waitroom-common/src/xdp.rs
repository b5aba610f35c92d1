//! Map names and value layouts shared by the XDP program and its loader.

/// Name of the XDP program inside the object file.
pub const PROGRAM_NAME: &str = "waitroom";

/// Per-CPU array of [`PacketCounters`], one slot.
pub const MAP_COUNTERS: &str = "COUNTERS";

/// Packet counters kept per CPU by the XDP program.
///
/// Userspace sums the per-CPU values; the kernel side only ever adds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacketCounters {
    /// Every packet the program saw, whatever it did with it.
    pub packets: u64,
    /// Bytes of those packets (frame length as seen by XDP).
    pub bytes: u64,
}

impl PacketCounters {
    /// Adds another CPU's counters to these.
    #[must_use]
    pub fn merged(self, other: Self) -> Self {
        Self {
            packets: self.packets.wrapping_add(other.packets),
            bytes: self.bytes.wrapping_add(other.bytes),
        }
    }
}

#[cfg(feature = "user")]
// SAFETY: `PacketCounters` is `#[repr(C)]`, made only of `u64`s (no padding), and
// every bit pattern is a valid value.
unsafe impl aya::Pod for PacketCounters {}
