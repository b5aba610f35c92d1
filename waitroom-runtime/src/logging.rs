//! The `tracing` subscriber both binaries install first, fit for journald.
//!
//! Under systemd stderr is a socket to journald, which adds its own time,
//! unit and priority: colour codes there are noise in `journalctl` and in
//! every log shipper, so colour is only on when stderr is a terminal (and
//! `NO_COLOR` is unset). `WAITROOM_LOG_FORMAT=json` writes one JSON object
//! per line instead of text, for shippers that parse fields.
use std::io::IsTerminal as _;

/// The environment variable that picks the log format: `text` (default) or `json`.
pub const FORMAT_VAR: &str = "WAITROOM_LOG_FORMAT";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// tracing's human-readable lines.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, the event's
    /// fields (`message` among them) at the top level, and the `span` it is in.
    Json,
}

impl LogFormat {
    /// `text` or `json` (any case); anything else is `Err` with the value.
    pub fn parse(value: &str) -> Result<Self, String> {
        match value.to_ascii_lowercase().as_str() {
            "" | "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            _ => Err(value.to_owned()),
        }
    }
}

/// Structured logs on stderr, filtered by `RUST_LOG` (default `info`), in
/// the format `WAITROOM_LOG_FORMAT` names; colour only on a terminal.
pub fn init() {
    let (format, bad) = match std::env::var(FORMAT_VAR) {
        Ok(v) => {
            LogFormat::parse(&v).map_or_else(|bad| (LogFormat::Text, Some(bad)), |f| (f, None))
        }
        Err(_) => (LogFormat::Text, None),
    };
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
    };
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(std::io::stderr)
        .with_ansi(colour);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
    if let Some(bad) = bad {
        tracing::warn!(
            value = %bad,
            "{FORMAT_VAR} must be \"text\" or \"json\"; writing text"
        );
    }
}

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Lets a log line through at most once per `every_secs` (of the caller's
/// clock) and counts what it held back, so a flood of refusals (a scanner, a
/// bot sending thousands of requests a second) costs one line per period, and
/// that line says how many were not logged. Lock-free; shared by all workers.
#[derive(Debug)]
pub struct LogGate {
    every_secs: u64,
    /// Seconds of the last line let through, plus one (0: never).
    last: AtomicU64,
    held_back: AtomicU64,
}

impl Default for LogGate {
    /// One line per ten seconds.
    fn default() -> Self {
        Self::new(10)
    }
}

impl LogGate {
    #[must_use]
    pub const fn new(every_secs: u64) -> Self {
        Self {
            every_secs,
            last: AtomicU64::new(0),
            held_back: AtomicU64::new(0),
        }
    }

    /// [`LogGate::pass`] at the wall clock's second: for logs outside any
    /// decision, where no driven clock is at hand.
    pub fn pass_now(&self) -> Option<u64> {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.pass(secs)
    }

    /// `Some(held back since the last line)` when a line may be logged at
    /// `now_secs`, else `None` (and the event is counted as held back).
    pub fn pass(&self, now_secs: u64) -> Option<u64> {
        let last = self.last.load(Relaxed);
        let stamp = now_secs.saturating_add(1);
        if (last == 0 || stamp >= last.saturating_add(self.every_secs))
            && self
                .last
                .compare_exchange(last, stamp, Relaxed, Relaxed)
                .is_ok()
        {
            Some(self.held_back.swap(0, Relaxed))
        } else {
            self.held_back.fetch_add(1, Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_format_is_text_or_json_and_nothing_else() {
        assert_eq!(LogFormat::parse(""), Ok(LogFormat::Text));
        assert_eq!(LogFormat::parse("text"), Ok(LogFormat::Text));
        assert_eq!(LogFormat::parse("JSON"), Ok(LogFormat::Json));
        assert_eq!(LogFormat::parse("logfmt"), Err("logfmt".into()));
    }

    #[test]
    fn one_line_per_period_and_it_says_how_many_were_held_back() {
        let gate = LogGate::new(10);
        assert_eq!(gate.pass(100), Some(0));
        for s in 100..110 {
            assert_eq!(gate.pass(s), None, "second {s}");
        }
        assert_eq!(gate.pass(110), Some(10));
        assert_eq!(gate.pass(111), None);
        // A clock at zero (a driven clock) still logs the first line.
        assert_eq!(LogGate::new(10).pass(0), Some(0));
    }
}
