//! XDP telemetry as the node's traffic signal and metrics.
//!
//! The kernel program counts distinct source addresses per minute of
//! `CLOCK_MONOTONIC_COARSE`; the engine thinks in wall-clock minutes. A kernel
//! minute is attributed to the wall-clock minute that holds its middle: the
//! aggregator splits slots by traffic two minutes back, so a shift of under
//! half a minute in the window is harmless, and the estimate counts every
//! connection attempt, including those that never reached HTTP.
use std::{
    fmt::Write as _,
    sync::Arc,
    time::{Duration, UNIX_EPOCH},
};

use tokio::sync::watch;
use waitroom_common::{room::RoomId, time::Minute};

use waitroom_runtime::admin::family;

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

    /// Prometheus families for the admin listener.
    pub fn render(&self, out: &mut String) {
        let Some(s) = self.latest() else { return };
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
            family(out, name, "counter", help);
            let _ = writeln!(out, "{name} {value}");
        }
        family(
            out,
            "waitroom_xdp_port_syns_total",
            "counter",
            "TCP SYNs (new connections) per service port.",
        );
        for (port, c) in &s.ports {
            let _ = writeln!(
                out,
                "waitroom_xdp_port_syns_total{{port=\"{port}\"}} {}",
                c.syns
            );
        }
        family(
            out,
            "waitroom_xdp_port_packets_total",
            "counter",
            "Packets per service port.",
        );
        for (port, c) in &s.ports {
            let _ = writeln!(
                out,
                "waitroom_xdp_port_packets_total{{port=\"{port}\"}} {}",
                c.packets
            );
        }
        family(
            out,
            "waitroom_xdp_distinct_sources",
            "gauge",
            "Distinct source addresses (HyperLogLog) this minute and the previous one.",
        );
        let _ = writeln!(
            out,
            "waitroom_xdp_distinct_sources{{minute=\"current\"}} {:.0}",
            s.current_minute.estimate()
        );
        let _ = writeln!(
            out,
            "waitroom_xdp_distinct_sources{{minute=\"previous\"}} {:.0}",
            s.previous_minute.estimate()
        );
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
