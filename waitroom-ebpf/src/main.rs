//! The waitroom XDP program.
//!
//! It sees every packet on the ingress interface before the kernel's TCP stack
//! does. For now it counts packets and bytes per CPU; it always passes.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::xdp_action,
    macros::{map, xdp},
    maps::PerCpuArray,
    programs::XdpContext,
};
use waitroom_common::xdp::PacketCounters;

/// Per-CPU packet and byte counters; userspace sums the CPUs.
#[map(name = "COUNTERS")]
static COUNTERS: PerCpuArray<PacketCounters> = PerCpuArray::with_max_entries(1, 0);

#[xdp]
pub fn waitroom(ctx: XdpContext) -> u32 {
    match try_waitroom(&ctx) {
        Ok(action) => action,
        // Fail open: whatever we could not account for still reaches the stack.
        Err(()) => xdp_action::XDP_PASS,
    }
}

fn try_waitroom(ctx: &XdpContext) -> Result<u32, ()> {
    let len = (ctx.data_end() - ctx.data()) as u64;
    let counters = COUNTERS.get_ptr_mut(0).ok_or(())?;
    // SAFETY: the pointer comes from a per-CPU array lookup that the verifier has
    // checked against null above; per-CPU storage is only touched by this CPU while
    // the program runs, so a plain read-modify-write cannot race.
    unsafe {
        (*counters).packets += 1;
        (*counters).bytes += len;
    }
    Ok(xdp_action::XDP_PASS)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
