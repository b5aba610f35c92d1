//! What two sides of a boundary must agree on.
//!
//! Without features this crate is `#![no_std]` and holds only the `#[repr(C)]`
//! types shared with the kernel program in `waitroom-ebpf`. The `user` feature
//! implements `aya::Pod` for them so userspace can read the maps; the `std`
//! feature adds every pure rule the node, the aggregator and the simulator
//! agree on: the room model, the admission engine, the aggregation and the
//! cluster's lease ledger, the local-only share, and the gossip messages with
//! their frame codec. Time is always passed in.
//!
//! # The admission engine
//! Pure functions from (room, global state, node counters, ticket, now,
//! randomness) to a decision: no I/O, no clock, no randomness it was not
//! given, so the edge, the aggregator and the simulator run the same code.
//!
//! # Layout
//! - [`xdp`]: map names and value layouts of the XDP program.
//! - [`xdp_parse`]: the XDP program's packet parser, run by the kernel and by
//!   userspace tests and the fuzzer alike.
//! - `time`: [`UnixMillis`](time::UnixMillis) and [`Minute`](time::Minute), passed in by the caller.
//! - `room`: [`RoomConfig`](room::RoomConfig) as configured, [`Room`](room::Room) once validated.
//! - `room_table`: [`RoomTable`](room_table::RoomTable), one `[[rooms]]` table
//!   of a config file as the node and the aggregator both parse it.
//! - `ticket`: [`Ticket`](ticket::Ticket), what the visitor's encrypted cookie carries.
//! - `counters`: [`RoomCounters`](counters::RoomCounters), the node's atomics in shared memory.
//! - `slots`: [`SlotPlan`](slots::SlotPlan), the seeds' slot arithmetic.
//! - `estimate`: [`WaitEstimate`](estimate::WaitEstimate) for queued visitors.
//! - `state`: [`GlobalState`](state::GlobalState), what a node decides with.
//! - `aggregate`: [`NodeReport`](aggregate::NodeReport) and [`aggregate`](aggregate::aggregate).
//! - `engine`: [`decide`](engine::decide), one request's decision.
//! - `ledger`: [`TicketLedger`](ledger::TicketLedger), where each ticket's count
//!   sits, so a replayed cookie moves the counters once; connections per ticket.
//! - `phase`: [`RoomPhase`](phase::RoomPhase) and the wait a visitor arriving now
//!   would be told, for `/status` and the dashboards.
//! - `plausible`: reported and restored numbers checked against the room.
//! - `shard`: which aggregator group owns a room.
//! - `share`: the local-only share a node decides with when its news is stale.
//! - `cluster`: [`Cluster`](cluster::Cluster), the aggregator's memory: reports,
//!   departed nodes and the Anywhere lease ledger (the merge around `aggregate`).
//! - `changes`: a report as the changes since an earlier one of the same node.
//! - `wire`: the gossip [`Message`](wire::Message)s and their frame codec
//!   (the QUIC transport is in `waitroom-runtime`).
#![cfg_attr(not(feature = "std"), no_std)]

pub mod xdp;
pub mod xdp_parse;

#[cfg(feature = "std")]
pub mod aggregate;
#[cfg(feature = "std")]
pub mod bypass;
#[cfg(feature = "std")]
pub mod changes;
#[cfg(feature = "std")]
pub mod cluster;
#[cfg(feature = "std")]
pub mod counters;
#[cfg(feature = "std")]
pub mod engine;
#[cfg(feature = "std")]
pub mod estimate;
#[cfg(feature = "std")]
pub mod event;
#[cfg(feature = "std")]
pub mod ledger;
#[cfg(feature = "std")]
pub mod phase;
#[cfg(feature = "std")]
pub mod plausible;
#[cfg(feature = "std")]
pub mod room;
#[cfg(feature = "std")]
pub mod room_table;
#[cfg(feature = "std")]
pub mod shard;
#[cfg(feature = "std")]
pub mod share;
#[cfg(feature = "std")]
pub mod slots;
#[cfg(feature = "std")]
pub mod state;
#[cfg(feature = "std")]
pub mod ticket;
#[cfg(feature = "std")]
pub mod time;
#[cfg(feature = "std")]
pub mod wire;
