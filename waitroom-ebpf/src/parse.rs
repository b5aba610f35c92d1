//! The frame the packet parser reads in the kernel: headers through pointers
//! bounds-checked against `data_end`, the comparison the verifier wants to
//! see. The parser itself is `waitroom_common::xdp_parse`, shared with
//! userspace (tests, the fuzzer).

use aya_ebpf::programs::XdpContext;
use waitroom_common::xdp_parse::{Headers, parse as parse_frame};
pub use waitroom_common::xdp_parse::{Packet, Source, Transport};

/// The frame of one XDP invocation.
struct Frame {
    start: usize,
    end: usize,
}

impl Headers for Frame {
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

/// Parses the packet of `ctx` (see `waitroom_common::xdp_parse::parse`).
#[inline(always)]
pub fn parse(ctx: &XdpContext) -> Result<Option<Packet>, ()> {
    parse_frame(&Frame {
        start: ctx.data(),
        end: ctx.data_end(),
    })
}
