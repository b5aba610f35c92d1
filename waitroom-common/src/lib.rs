//! What two sides of a boundary must agree on.
//!
//! Without features this crate is `#![no_std]` and holds only the `#[repr(C)]`
//! types shared with the kernel program in `waitroom-ebpf`. The `user` feature
//! implements [`aya::Pod`] for them so userspace can read the maps; the `std`
//! feature adds the room model, the admission engine and the gossip protocol.
//!
//! # Layout
//! - [`xdp`]: map names and value layouts of the XDP program.
#![cfg_attr(not(feature = "std"), no_std)]

pub mod xdp;
