//! Routes the XDP program's `aya-log` records into `tracing`.
//!
//! `aya-log` hands records to a [`log::Log`]; this one turns each into a
//! `tracing` event with target `waitroom_ebpf`, so no global `log` logger
//! (and no `tracing-log` bridge) is needed for them.

/// A [`log::Log`] that re-emits records as `tracing` events.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TracingLog;

impl log::Log for TracingLog {
    fn enabled(&self, _metadata: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let message = record.args();
        let module = record.module_path().unwrap_or("waitroom_ebpf");
        match record.level() {
            log::Level::Error => tracing::error!(target: "waitroom_ebpf", module, "{message}"),
            log::Level::Warn => tracing::warn!(target: "waitroom_ebpf", module, "{message}"),
            log::Level::Info => tracing::info!(target: "waitroom_ebpf", module, "{message}"),
            log::Level::Debug => tracing::debug!(target: "waitroom_ebpf", module, "{message}"),
            log::Level::Trace => tracing::trace!(target: "waitroom_ebpf", module, "{message}"),
        }
    }

    fn flush(&self) {}
}
