//! Loading the XDP program and reading its maps.

/// The XDP object built by `build.rs`; empty when built with `AYA_BUILD_SKIP=1`.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/waitroom"));
