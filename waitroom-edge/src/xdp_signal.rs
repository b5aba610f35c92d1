//! XDP telemetry as the node's traffic signal and metrics.
//!
//! The kernel program counts distinct source addresses per minute of
//! `CLOCK_MONOTONIC_COARSE`; the engine thinks in wall-clock minutes. A kernel
//! minute is attributed to the wall-clock minute that holds its middle: the
//! aggregator splits slots by traffic two minutes back, so a shift of under
//! half a minute in the window is harmless, and the estimate counts every
//! connection attempt, including those that never reached HTTP.
use std::{
    fmt,
    sync::Arc,
    time::{Duration, UNIX_EPOCH},
};

use tokio::sync::watch;
use waitroom_common::{room::RoomId, time::Minute};

use waitroom_runtime::metrics::Families;

use crate::{gossip::TrafficSignal, xdp::TelemetrySnapshot};

/// The latest XDP snapshot, published every second by the telemetry task.
#[derive(Debug)]
pub struct Telemetry {
    rx: watch::Receiver<Option<Arc<TelemetrySnapshot>>>,
}

impl Telemetry {
    pub fn new(rx: watch::Receiver<Option<Arc<TelemetrySnapshot>>>) -> Self {
        Self { rx }
    }

    /// The latest snapshot, if one was read yet.
    pub fn latest(&self) -> Option<Arc<TelemetrySnapshot>> {
        self.rx.borrow().clone()
    }

    /// The `waitroom_xdp_*` families of the latest snapshot (none before the first).
    pub fn encode(&self, f: &mut Families<'_>) -> fmt::Result {
        let Some(s) = self.latest() else {
            return Ok(());
        };
        let t = &s.totals;
        for (name, help, value) in [
            (
                "waitroom_xdp_packets_total",
                "Packets the XDP program saw.",
                t.packets,
            ),
            (
                "waitroom_xdp_bytes_total",
                "Bytes the XDP program saw.",
                t.bytes,
            ),
            (
                "waitroom_xdp_malformed_total",
                "Packets the program could not parse (passed).",
                t.malformed,
            ),
            (
                "waitroom_xdp_denied_packets_total",
                "Packets dropped by the deny list.",
                t.denied_packets,
            ),
            (
                "waitroom_xdp_syn_budget_dropped_total",
                "SYNs dropped by the per-source SYN budget.",
                t.syn_budget_dropped,
            ),
        ] {
            f.counter(name, help, value)?;
        }
        let ports: Vec<(String, _)> = s.ports.iter().map(|(p, c)| (p.to_string(), c)).collect();
        f.counters(
            "waitroom_xdp_port_syns_total",
            "TCP SYNs (new connections) per service port.",
            ports.iter().map(|(p, c)| ([("port", p.as_str())], c.syns)),
        )?;
        f.counters(
            "waitroom_xdp_port_packets_total",
            "Packets per service port.",
            ports
                .iter()
                .map(|(p, c)| ([("port", p.as_str())], c.packets)),
        )?;
        f.gauges(
            "waitroom_xdp_distinct_sources",
            "Distinct source addresses (HyperLogLog) this minute and the previous one.",
            [
                ([("minute", "current")], s.current_minute.estimate().round()),
                (
                    [("minute", "previous")],
                    s.previous_minute.estimate().round(),
                ),
            ],
        )
    }
}

impl TrafficSignal for Telemetry {
    fn distinct_visitors(&self, _room: RoomId, minute: Minute) -> Option<u64> {
        let s = self.latest()?;
        [&s.previous_minute, &s.current_minute]
            .into_iter()
            .find(|m| {
                let middle = m.started_at + Duration::from_secs(30);
                middle
                    .duration_since(UNIX_EPOCH)
                    .is_ok_and(|d| d.as_secs() / 60 == minute.0)
            })
            .map(|m| m.estimate().round() as u64)
            .filter(|n| *n > 0)
    }
}
