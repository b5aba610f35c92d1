//! What both waitroom binaries need around their work, written once: the
//! node (`waitroom-edge`) and the aggregator (`waitroom-aggregator`) depend on
//! this crate and on `waitroom-common`, never on each other.
//!
//! Nothing here decides anything about visitors or rooms; the rules are in
//! `waitroom-common`. This is I/O and process plumbing.
//!
//! # Layout
//! - [`clock`]: the [`Clock`](clock::Clock) the binaries read time through
//!   (the system clock in production, a driven one in tests).
//! - [`config_file`]: TOML config files read so that every refusal names the
//!   file, line and column, and key path.
//! - [`control`]: the runtime control API over room settings: tokens,
//!   the versioned and persisted store, its audit log, the routes.
//! - [`shutdown`]: the stop signal every listener loop selects on.
//! - [`signals`]: SIGTERM/SIGINT and SIGHUP as futures.
//! - [`systemd`]: READY, watchdog keep-alives, STOPPING.
//! - [`logging`]: the `tracing` subscriber both binaries install first.
//! - [`tls`]: PEM files in, rustls and quinn configs out (gossip and HTTPS).
//! - [`frames`]: one gossip frame per QUIC stream direction.
//! - [`admin`]: the operators' HTTP listener loop and its small responses.
//! - [`dashboard`]: the live dashboard page both admin listeners serve, and
//!   its last hour of samples.
//! - [`metrics`]: Prometheus exposition (`prometheus-client` collectors
//!   that read the binaries' atomics at scrape time).
//! - [`body`]: the response body type every local page and proxied body uses.
//! - [`docs`]: man pages and shell completions from a binary's clap definition.
//! - `devcerts` (feature `devcerts`): a development CA and certificates.

pub mod admin;
pub mod body;
pub mod clock;
pub mod config_file;
pub mod control;
pub mod dashboard;
#[cfg(any(test, feature = "devcerts"))]
pub mod devcerts;
pub mod docs;
pub mod file;
pub mod frames;
pub mod logging;
pub mod metrics;
pub mod shutdown;
pub mod signals;
pub mod systemd;
pub mod tls;
