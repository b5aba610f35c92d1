//! The waitroom node: what operators run on every edge server.
//!
//! A request is decided here in microseconds, without waiting on the network:
//! match the room, open the visitor's ticket, ask the admission engine
//! (`waitroom_common::engine::decide`), then proxy to the origin or answer
//! with the queue page. The rules are in `waitroom-common`; the plumbing the
//! node shares with the aggregator (clock, TLS, QUIC frames, admin loop,
//! signals, systemd) is in `waitroom-runtime`.
//!
//! # Layout
//! Start-up, in the order it runs:
//! - [`config`]: the TOML file ([`config::EdgeConfig`]) and its validation.
//! - [`counters`]: the node counters in a mapped file (they survive restarts).
//! - [`ledger`]: the ticket ledger beside them (a ticket moves counts once).
//! - [`state_dir`]: the directory the node owns and its private files.
//! - [`keys`]: the cookie keys tickets are sealed with.
//! - [`node`]: [`node::Node`], everything the workers share, and the rooms'
//!   state refresh (global world or local-only share).
//! - [`check`]: `--check`, every load step of a start without serving.
//! - [`start`]: the steps above in order, the background services, the
//!   workers; [`start::run`] is what the binary calls.
//! - [`reload`]: SIGHUP, what a new file may change while requests flow.
//!
//! The request path:
//! - [`http`]: per-core workers and listeners; [`http::handler`] is the
//!   request path read top to bottom (match room → open cookie → decide →
//!   proxy or queue).
//! - [`target`]: one spelling per path (normalization before routing).
//! - [`rooms`]: room specs and routing by host and longest path prefix.
//! - [`cookie`]: sealed tickets (ChaCha20-Poly1305, key rotation).
//! - [`new_tickets`]: how many new tickets one client address may be issued.
//! - [`queue_page`]: the Mustache queue page and its JSON twin.
//! - [`pages`]: the reject and error pages, and the queue page's language.
//! - [`proxy`]: the reverse proxy to the origin.
//! - [`origin_pool`]: each worker's HTTP/1.1 origin connections, driven in
//!   the request's own task.
//! - [`origin_h1`]: the exchange with a plain-HTTP origin (TLS origins and
//!   upgrades use hyper's client).
//! - [`upstream`]: origin pools, steering, health checks, origin TLS.
//!
//! Around it:
//! - [`gossip`]: the client that reports to the aggregator and keeps the
//!   world view the request path reads.
//! - [`xdp`], [`xdp_signal`]: the embedded XDP program, its loader, and its
//!   telemetry as a traffic signal.
//! - [`metrics`], [`exposition`], [`admin`], [`stats`], [`dashboard`]: what
//!   operators read (the request path's atomics, their Prometheus families,
//!   the listener, the live page).
//! - [`access_log`]: one line per request, written off the request path.

pub mod access_log;
pub mod admin;
pub mod bypass;
pub mod check;
pub mod config;
pub mod cookie;
pub mod counters;
pub mod dashboard;
pub mod exposition;
pub mod forwarded;
pub mod gossip;
pub mod http;
pub mod keys;
pub mod ledger;
mod mapped;
pub mod metrics;
pub mod new_tickets;
pub mod node;
pub mod origin_command;
pub mod origin_h1;
pub mod origin_pool;
pub mod pages;
pub mod proxy;
pub mod queue_page;
pub mod reload;
pub mod rooms;
pub mod start;
pub mod state_dir;
pub mod stats;
pub mod target;
pub mod unrouted;
pub mod upgrade;
pub mod upstream;
pub mod xdp;
pub mod xdp_signal;
