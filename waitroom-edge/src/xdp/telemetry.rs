//! Reading the program's per-CPU maps into one [`TelemetrySnapshot`].

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, SystemTime},
};

use tokio::sync::watch;
use waitroom_common::xdp::{
    DistinctSources, MAP_PORTS, MAP_SOURCES, MAP_STATS, MINUTE_NS, PortCounters, XdpStats,
};

use super::{XdpError, XdpGuard, map_error};

/// Everything the XDP program counted, summed over CPUs.
///
/// Counters are cumulative since the program was loaded; consumers take
/// differences between snapshots for rates.
#[derive(Clone, Debug)]
pub struct TelemetrySnapshot {
    /// Wall-clock time of the read.
    pub taken_at: SystemTime,
    /// `CLOCK_MONOTONIC_COARSE` at the read: the clock of the program's minutes.
    pub clock_ns: u64,
    /// Whole-program counters.
    pub totals: XdpStats,
    /// Counters of each configured service port.
    pub ports: BTreeMap<u16, PortCounters>,
    /// Distinct sources of service traffic so far this minute.
    pub current_minute: MinuteSources,
    /// Distinct sources of service traffic in the whole previous minute:
    /// the per-colo traffic signal the node reports.
    pub previous_minute: MinuteSources,
}

impl TelemetrySnapshot {
    /// All service ports' counters added up.
    #[must_use]
    pub fn service_totals(&self) -> PortCounters {
        self.ports
            .values()
            .fold(PortCounters::default(), |sum, port| sum.merged(*port))
    }
}

/// The distinct-source sketch of one minute, CPUs merged.
#[derive(Clone, Debug)]
pub struct MinuteSources {
    /// `CLOCK_MONOTONIC_COARSE / 60 s`.
    pub minute: u64,
    /// Wall-clock start of that minute.
    pub started_at: SystemTime,
    /// The merged sketch (ship its registers to merge across nodes).
    pub sources: DistinctSources,
}

impl MinuteSources {
    /// Estimated distinct source addresses in the minute.
    #[must_use]
    pub fn estimate(&self) -> f64 {
        self.sources.estimate()
    }
}

/// Reads every map of `guard` once.
pub(super) fn read(guard: &XdpGuard) -> Result<TelemetrySnapshot, XdpError> {
    let taken_at = SystemTime::now();
    let clock_ns = program_clock_ns()?;

    let totals = guard
        .stats
        .get(&0, 0)
        .map_err(|source| map_error(MAP_STATS, "read", source))?
        .iter()
        .fold(XdpStats::default(), |sum, cpu| sum.merged(*cpu));

    let mut ports = BTreeMap::new();
    for &(port, slot) in &guard.service_ports {
        let sum = guard
            .ports
            .get(&slot, 0)
            .map_err(|source| map_error(MAP_PORTS, "read", source))?
            .iter()
            .fold(PortCounters::default(), |sum, cpu| sum.merged(*cpu));
        ports.insert(port, sum);
    }

    let minute = clock_ns / MINUTE_NS;
    let current_minute = read_minute(guard, minute, taken_at, clock_ns)?;
    let previous_minute = read_minute(guard, minute.saturating_sub(1), taken_at, clock_ns)?;
    Ok(TelemetrySnapshot {
        taken_at,
        clock_ns,
        totals,
        ports,
        current_minute,
        previous_minute,
    })
}

/// Merges the CPUs' sketches of `minute` by register maximum. A CPU whose
/// slot is stamped with another minute saw no service traffic in `minute`.
fn read_minute(
    guard: &XdpGuard,
    minute: u64,
    taken_at: SystemTime,
    clock_ns: u64,
) -> Result<MinuteSources, XdpError> {
    let sources = sources_in(guard, minute)?;
    let since_start = Duration::from_nanos(clock_ns.saturating_sub(minute * MINUTE_NS));
    Ok(MinuteSources {
        minute,
        started_at: taken_at.checked_sub(since_start).unwrap_or(taken_at),
        sources,
    })
}

/// The CPUs' sketches of `minute` merged by register maximum.
pub(super) fn sources_in(guard: &XdpGuard, minute: u64) -> Result<DistinctSources, XdpError> {
    let slot = u32::try_from(minute & 1).unwrap_or_default();
    let per_cpu = guard
        .sources
        .get(&slot, 0)
        .map_err(|source| map_error(MAP_SOURCES, "read", source))?;
    let mut sources = DistinctSources::new();
    for sketch in per_cpu.iter().filter(|s| s.minute == minute) {
        sources.merge_registers(&sketch.registers);
    }
    Ok(sources)
}

/// `CLOCK_MONOTONIC_COARSE` in nanoseconds: the clock of the program's
/// minutes (`XdpSettings::minute`, which the telemetry reader turns) and of
/// `bpf_ktime_get_coarse_ns` (the SYN budget's clock).
pub(super) fn program_clock_ns() -> Result<u64, XdpError> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &raw mut ts) } != 0 {
        return Err(XdpError::Sys {
            call: "clock_gettime(CLOCK_MONOTONIC_COARSE)",
            source: std::io::Error::last_os_error(),
        });
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or_default();
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or_default();
    Ok(secs * 1_000_000_000 + nanos)
}

/// Starts the telemetry reader on the current tokio runtime: every `every`
/// it forwards the program's log records to `tracing` and publishes a fresh
/// snapshot, and at every minute's start of `CLOCK_MONOTONIC_COARSE` (a
/// couple of milliseconds after) it tells the program the new minute
/// ([`XdpGuard::turn_to_the_clock_minute`]): the program does not read the
/// clock per packet, it records each source in the minute it was told.
/// The task ends when the last receiver is dropped.
///
/// A task on the caller's runtime, not a thread of the guard's: the node
/// drops its capabilities before the runtime's thread starts, and a thread
/// started at load would keep them.
///
/// A failed read (or minute turn) is logged once (at `warn`) until one
/// succeeds again; the receivers keep the last good snapshot meanwhile. A
/// read is a handful of map syscalls (well under a millisecond), done
/// inline: spawn this on the node's background runtime, not on a per-core
/// request worker.
#[must_use]
pub fn spawn_telemetry(
    guard: Arc<XdpGuard>,
    every: Duration,
) -> watch::Receiver<Option<Arc<TelemetrySnapshot>>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        let mut minute_failing = false;
        loop {
            let minute_starts = tokio::time::sleep(until_the_next_minute());
            let tick = tokio::select! {
                _ = ticks.tick() => true,
                () = minute_starts => false,
                () = tx.closed() => break,
            };
            match guard.turn_to_the_clock_minute() {
                Ok(_) => minute_failing = false,
                Err(error) if !minute_failing => {
                    tracing::warn!(%error, "telling the XDP program the minute");
                    minute_failing = true;
                }
                Err(error) => tracing::debug!(%error, "telling the XDP program the minute"),
            }
            if !tick {
                continue;
            }
            guard.flush_logs();
            match guard.snapshot() {
                Ok(snapshot) => {
                    if failing {
                        tracing::info!("XDP telemetry readable again");
                        failing = false;
                    }
                    tx.send_replace(Some(Arc::new(snapshot)));
                }
                Err(error) if !failing => {
                    tracing::warn!(%error, "reading XDP telemetry");
                    failing = true;
                }
                Err(error) => tracing::debug!(%error, "reading XDP telemetry"),
            }
        }
    });
    rx
}

/// After a minute's start, how long the reader waits beyond it before
/// reading the coarse clock (which advances a jiffy at a time).
const MINUTE_SLACK: Duration = Duration::from_millis(2);

/// How long until the next minute of `CLOCK_MONOTONIC_COARSE` has surely
/// begun; a second if the clock cannot be read.
fn until_the_next_minute() -> Duration {
    program_clock_ns().map_or(Duration::from_secs(1), |now| {
        Duration::from_nanos(MINUTE_NS - now % MINUTE_NS) + MINUTE_SLACK
    })
}
