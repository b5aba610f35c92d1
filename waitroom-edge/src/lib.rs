//! The waitroom node: what operators run on every edge server.
//!
//! # Layout
//! - [`config`]: the TOML file and its validation.
//! - [`http`]: per-core workers, listeners, and [`http::handler`], the request
//!   path read top to bottom (match room → open cookie → decide → proxy or queue).
//! - [`proxy`]: the pooled reverse proxy to the origin.
//! - [`metrics`], [`admin`]: what operators read.
//! - [`xdp`]: the embedded XDP program and its loader.
//! - [`demo_origin`]: a small origin for the demo and the tests.
//! - [`shutdown`]: stop accepting, drain, exit.
use std::{path::Path, sync::Arc, time::Duration};

use anyhow::Context as _;

pub mod admin;
pub mod config;
pub mod demo_origin;
pub mod http;
pub mod metrics;
pub mod proxy;
pub mod rooms;
pub mod shutdown;
pub mod xdp;

pub use config::ConfigError;

/// The whole validated configuration of a node.
#[derive(Debug, Clone)]
pub struct EdgeConfig {
    pub node: config::NodeSection,
    pub rooms: Vec<rooms::RoomSpec>,
}

impl EdgeConfig {
    /// Parses and validates a configuration read from `path`.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            node: config::NodeSection,
            #[serde(default)]
            rooms: Vec<toml::Table>,
        }
        let raw: Raw = toml::from_str(text).map_err(|source| ConfigError::Syntax {
            path: path.to_owned(),
            source: Box::new(source),
        })?;
        if raw.rooms.is_empty() {
            return Err(ConfigError::Field {
                path: path.to_owned(),
                field: "rooms".into(),
                problem: "at least one [[rooms]] table is required".into(),
            });
        }
        let mut rooms = Vec::with_capacity(raw.rooms.len());
        for (index, table) in raw.rooms.into_iter().enumerate() {
            let spec = rooms::RoomSpec::from_table(table).map_err(|e| ConfigError::Room {
                path: path.to_owned(),
                index,
                room: e.room,
                field: e.field,
                problem: e.problem,
            })?;
            if let Some(prev) = rooms.iter().position(|r: &rooms::RoomSpec| r.id == spec.id) {
                return Err(ConfigError::Room {
                    path: path.to_owned(),
                    index,
                    room: spec.id.clone(),
                    field: "id".into(),
                    problem: format!("duplicate room id (also rooms[{prev}])"),
                });
            }
            rooms.push(spec);
        }
        Ok(Self {
            node: raw.node,
            rooms,
        })
    }
}

/// Request-path settings derived from the config, read by every worker.
#[derive(Debug, Clone)]
pub struct Settings {
    pub max_connections_per_worker: usize,
    pub header_read_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    pub shutdown_grace: Duration,
}

impl Settings {
    fn from_node(n: &config::NodeSection) -> Self {
        Self {
            max_connections_per_worker: n.max_connections_per_worker.max(1),
            header_read_timeout: Duration::from_millis(n.header_read_timeout_ms.max(1)),
            max_header_bytes: n.max_header_bytes,
            max_headers: n.max_headers,
            shutdown_grace: Duration::from_millis(n.shutdown_grace_ms),
        }
    }
}

/// Everything the workers share: settings, rooms, counters, metrics.
#[derive(Debug)]
pub struct Node {
    pub settings: Settings,
    pub rooms: rooms::RoomTable,
    pub metrics: metrics::NodeMetrics,
}

impl Node {
    pub fn new(config: &EdgeConfig) -> anyhow::Result<Self> {
        Ok(Self {
            settings: Settings::from_node(&config.node),
            rooms: rooms::RoomTable::new(&config.rooms),
            metrics: metrics::NodeMetrics::default(),
        })
    }
}

/// Runs a node until SIGTERM or SIGINT; returns after draining.
pub fn run(config: EdgeConfig) -> anyhow::Result<()> {
    let node = Arc::new(Node::new(&config)?);
    let (trigger, shutdown) = shutdown::channel();

    let plain = http::ListenerSpec {
        addr: config.node.listen,
        tls: None,
    };
    let (first, plain) = http::resolve(&plain)
        .with_context(|| format!("binding node.listen {}", config.node.listen))?;
    let workers = if config.node.workers == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        config.node.workers
    };
    let listeners = vec![(first, plain.clone())];

    // The control runtime: signals, admin listener, background tasks. Small and
    // separate, so nothing on it can delay a request.
    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the control runtime")?;
    let admin_addr = match config.node.admin_listen {
        Some(addr) => {
            let listener = control
                .block_on(tokio::net::TcpListener::bind(addr))
                .with_context(|| format!("binding node.admin_listen {addr}"))?;
            let bound = listener.local_addr()?;
            control.spawn(admin::serve(listener, Arc::clone(&node), shutdown.clone()));
            Some(bound)
        }
        None => None,
    };

    let handles = http::spawn_workers(workers, Arc::clone(&node), listeners, shutdown.clone())
        .context("starting worker threads")?;
    // One machine-readable line that tests and scripts wait for.
    println!(
        "waitroom-edge ready: http={} admin={} workers={workers}",
        plain.addr,
        admin_addr.map_or_else(|| "-".to_owned(), |a| a.to_string()),
    );
    tracing::info!(http = %plain.addr, workers, "node serving");

    control.block_on(async {
        wait_for_signal().await;
        tracing::info!("stopping: no new connections, draining in-flight requests");
        trigger.fire();
    });
    for h in handles {
        let _ = h.join();
    }
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(err) => {
            tracing::error!(%err, "cannot listen for SIGTERM");
            return std::future::pending().await;
        }
    };
    let mut int = match signal(SignalKind::interrupt()) {
        Ok(s) => s,
        Err(err) => {
            tracing::error!(%err, "cannot listen for SIGINT");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
