//! Loading the XDP program, configuring it, reading its maps.
//!
//! The node calls [`XdpGuard::attach`] once at start-up. On success it shares
//! the guard (`Arc<XdpGuard>`) between the telemetry reader
//! ([`spawn_telemetry`]) and the admin listener ([`XdpGuard::deny`],
//! [`XdpGuard::allow`]); dropping the last reference detaches the program.
//! On failure (not root, no BPF, a binary built with `AYA_BUILD_SKIP=1`) the
//! [`XdpError`] says why in one line: the node logs it once and carries on
//! with userspace telemetry.
//!
//! # Layout
//! - `config`: the `[xdp]` table ([`XdpConfig`]) and [`IpPrefix`].
//! - [`deny_file`]: the deny list kept across restarts.
//! - `telemetry`: [`TelemetrySnapshot`] and the once-a-second reader.
//! - `log`: routes the program's `aya-log` records into `tracing`.
//! - [`privileges`]: the capabilities the node drops once the program is
//!   attached, and the proof of what it keeps.

mod config;
pub mod deny_file;
mod log;
pub mod privileges;
mod telemetry;

use std::{
    io,
    net::IpAddr,
    os::fd::OwnedFd,
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{
        Array, Map, MapData, MapError, PerCpuArray,
        lpm_trie::{Key, LpmTrie},
    },
    programs::{ProgramError, TestRun as _, TestRunOptions, Xdp, xdp::XdpLinkId},
};
use aya_log::EbpfLogger;
use waitroom_common::xdp::{
    DistinctSources, MAP_DENY_V4, MAP_DENY_V6, MAP_PORT_SLOTS, MAP_PORTS, MAP_SETTINGS,
    MAP_SOURCES, MAP_STATS, MAX_SERVICE_PORTS, MINUTE_NS, PASS_PROGRAM_NAME, PROGRAM_NAME,
    PortCounters, SourceSketch, XdpSettings, XdpStats,
};

pub use self::{
    config::{IpPrefix, IpPrefixParseError, SynBudget, XdpAttachMode, XdpConfig, XdpFieldError},
    telemetry::{MinuteSources, TelemetrySnapshot, spawn_telemetry},
};

/// The XDP object built by `build.rs`; empty when built with `AYA_BUILD_SKIP=1`.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/waitroom"));

/// What the program did with a packet (`xdp_action`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpVerdict {
    /// `XDP_ABORTED`: the program failed; the packet is dropped.
    Aborted,
    /// `XDP_DROP`.
    Drop,
    /// `XDP_PASS`: on to the kernel's stack.
    Pass,
    /// `XDP_TX`, `XDP_REDIRECT` or anything else the program never returns.
    Other(u32),
}

impl From<u32> for XdpVerdict {
    fn from(action: u32) -> Self {
        match action {
            0 => Self::Aborted,
            1 => Self::Drop,
            2 => Self::Pass,
            other => Self::Other(other),
        }
    }
}

/// Run-time statistics of the program, collected by the kernel while
/// statistics are enabled (see [`enable_run_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Invocations (one per packet).
    pub run_count: u64,
    /// Total time spent in the program.
    pub run_time: Duration,
}

impl RunStats {
    /// Mean nanoseconds per packet between `earlier` and `self`, if any ran.
    #[must_use]
    pub fn ns_per_packet_since(&self, earlier: &Self) -> Option<f64> {
        let count = self.run_count.checked_sub(earlier.run_count)?;
        let time = self.run_time.checked_sub(earlier.run_time)?;
        #[expect(clippy::cast_precision_loss, reason = "a mean, not a count")]
        (count > 0).then(|| time.as_nanos() as f64 / count as f64)
    }
}

/// Why the XDP program is not running (or a map operation failed).
#[derive(Debug, thiserror::Error)]
pub enum XdpError {
    /// The binary carries an empty object.
    #[error(
        "this binary has no XDP program (it was built with AYA_BUILD_SKIP=1); \
         running with userspace telemetry only"
    )]
    NotBuilt,
    /// The kernel refused the object (maps or BTF).
    #[error("loading the XDP object failed{hint}: {source}", hint = privilege_hint())]
    Load {
        /// What aya reported.
        #[source]
        source: aya::EbpfError,
    },
    /// The object lacks something the loader relies on (a build mismatch).
    #[error(
        "the XDP object has no {kind} named `{name}`; waitroom-edge and waitroom-ebpf disagree"
    )]
    Missing {
        /// `"program"` or `"map"`.
        kind: &'static str,
        /// The name looked for.
        name: &'static str,
    },
    /// Loading (verifying), attaching or test-running the program failed.
    #[error("XDP program: {action} failed{hint}: {source}", hint = privilege_hint())]
    Program {
        /// What was being done, e.g. `"attach to eth1 (auto mode)"`.
        action: String,
        /// What aya reported.
        #[source]
        source: ProgramError,
    },
    /// A map read or write failed.
    #[error("XDP map {map}: {action} failed: {source}")]
    Map {
        /// The map's name.
        map: &'static str,
        /// What was being done.
        action: &'static str,
        /// What aya reported.
        #[source]
        source: MapError,
    },
    /// More service ports than the port map holds.
    #[error("{count} service ports configured; the XDP program counts at most {max}")]
    TooManyPorts {
        /// Ports in the configuration.
        count: usize,
        /// Capacity of the port map.
        max: u32,
    },
    /// A system call outside aya failed.
    #[error("{call} failed: {source}")]
    Sys {
        /// The call, e.g. `"clock_gettime(CLOCK_MONOTONIC_COARSE)"`.
        call: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// The capabilities loading, attaching and reading the XDP program need.
const XDP_CAPABILITIES: [(u32, &str); 3] =
    [(39, "CAP_BPF"), (12, "CAP_NET_ADMIN"), (38, "CAP_PERFMON")];

/// Appended to load/attach errors: the capabilities this process lacks,
/// from its effective set (a service runs as its own user with ambient
/// capabilities; being uid 0 is neither needed nor enough).
fn privilege_hint() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    missing_capabilities_hint(&status)
}

/// The XDP capabilities missing from this process's effective set, named
/// (`"CAP_BPF, CAP_PERFMON"`), or `None` when none is (or the set cannot be read).
pub fn missing_capabilities() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    missing_capability_names(&status)
}

fn missing_capability_names(status: &str) -> Option<String> {
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())?;
    let missing: Vec<&str> = XDP_CAPABILITIES
        .iter()
        .filter(|(bit, _)| effective & (1 << bit) == 0)
        .map(|(_, name)| *name)
        .collect();
    (!missing.is_empty()).then(|| missing.join(", "))
}

/// The hint for `/proc/self/status` text: empty when every capability is in
/// `CapEff`, or when the set cannot be read.
fn missing_capabilities_hint(status: &str) -> String {
    missing_capability_names(status).map_or_else(String::new, |missing| {
        format!(
            " (this process lacks {missing} in its effective set: a systemd unit grants them \
             with AmbientCapabilities= and CapabilityBoundingSet=; otherwise start it with them)"
        )
    })
}

/// The loaded XDP program and its maps; detaches the program when dropped.
///
/// All methods take `&self`, so one `Arc<XdpGuard>` serves the telemetry
/// reader and the admin listener.
pub struct XdpGuard {
    /// The object: owns the program (and so the attachment).
    ebpf: Mutex<Ebpf>,
    /// The object's program this guard loaded: [`PROGRAM_NAME`], or the
    /// measuring peer [`PASS_PROGRAM_NAME`].
    program: &'static str,
    /// Where the program is attached, if it is.
    attachment: Option<Attachment>,
    /// Whole-program counters.
    stats: PerCpuArray<MapData, XdpStats>,
    /// The service ports and their slots in `ports`.
    service_ports: Vec<(u16, u32)>,
    /// Counters of each port slot.
    ports: PerCpuArray<MapData, PortCounters>,
    /// Distinct-source sketches, two minutes.
    sources: PerCpuArray<MapData, SourceSketch>,
    /// Denied IPv4 prefixes → packets dropped.
    deny_v4: Mutex<LpmTrie<MapData, [u8; 4], u64>>,
    /// Denied IPv6 prefixes → packets dropped.
    deny_v6: Mutex<LpmTrie<MapData, [u8; 16], u64>>,
    /// What the program reads per packet (SYN budget, which deny lists are
    /// in use, the current minute). Lock order: `settings` before either
    /// trie.
    settings: Mutex<Settings>,
    /// Drains the program's log ring into `tracing`; `None` if the object
    /// has no log calls.
    logger: Mutex<Option<EbpfLogger<log::TracingLog>>>,
}

/// The settings map and the value last written to it.
struct Settings {
    /// The one-slot array the program reads.
    map: Array<MapData, XdpSettings>,
    /// What slot 0 holds.
    current: XdpSettings,
}

impl Settings {
    fn write(&mut self, new: XdpSettings) -> Result<(), XdpError> {
        self.map
            .set(0, new, 0)
            .map_err(|source| map_error(MAP_SETTINGS, "set", source))?;
        self.current = new;
        Ok(())
    }

    /// Writes `minute` as the program's current minute if it is later than
    /// the one it holds; whether it wrote.
    fn turn_minute(&mut self, minute: u64) -> Result<bool, XdpError> {
        if minute <= self.current.minute {
            return Ok(false);
        }
        self.write(XdpSettings {
            minute,
            ..self.current
        })?;
        Ok(true)
    }
}

/// Where the program is attached.
#[derive(Debug)]
struct Attachment {
    /// The interface name, for messages.
    interface: String,
    /// The mode asked for.
    mode: XdpAttachMode,
    /// Detaches in `Drop`.
    link: XdpLinkId,
}

impl std::fmt::Debug for XdpGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpGuard")
            .field("attachment", &self.attachment)
            .finish_non_exhaustive()
    }
}

impl XdpGuard {
    /// Loads the embedded program, configures it from `config` and attaches it
    /// to `config.interface` in `config.mode`.
    pub fn attach(config: &XdpConfig) -> Result<Self, XdpError> {
        Self::attach_program(config, PROGRAM_NAME)
    }

    /// Attaches the object's pass-everything program instead, with the same
    /// maps configured from `config`: the peer the program's cost per packet
    /// is measured against (`waitroom-xdp-cost`). The node never uses it.
    pub fn attach_pass(config: &XdpConfig) -> Result<Self, XdpError> {
        Self::attach_program(config, PASS_PROGRAM_NAME)
    }

    fn attach_program(config: &XdpConfig, name: &'static str) -> Result<Self, XdpError> {
        let mut guard = Self::load_object(EBPF_OBJECT, config, name)?;
        let mode = config.mode;
        let action = || format!("attach to {} ({mode:?} mode)", config.interface);
        let link = {
            let mut ebpf = lock(&guard.ebpf);
            program_mut(&mut ebpf, name)?
                .attach(&config.interface, mode.into())
                .map_err(|source| XdpError::Program {
                    action: action(),
                    source,
                })?
        };
        guard.attachment = Some(Attachment {
            interface: config.interface.clone(),
            mode,
            link,
        });
        tracing::info!(interface = %config.interface, ?mode, ports = ?config.ports, "XDP program attached");
        Ok(guard)
    }

    /// Loads and configures the program without attaching it: for
    /// [`Self::test_run`] and benchmarks. `config.interface` and `config.mode`
    /// are not used.
    pub fn load(config: &XdpConfig) -> Result<Self, XdpError> {
        Self::load_object(EBPF_OBJECT, config, PROGRAM_NAME)
    }

    fn load_object(
        object: &[u8],
        config: &XdpConfig,
        name: &'static str,
    ) -> Result<Self, XdpError> {
        if object.is_empty() {
            return Err(XdpError::NotBuilt);
        }
        let distinct_ports = config.distinct_ports();
        if distinct_ports.len() > MAX_SERVICE_PORTS as usize {
            return Err(XdpError::TooManyPorts {
                count: distinct_ports.len(),
                max: MAX_SERVICE_PORTS,
            });
        }
        let mut ebpf = EbpfLoader::new()
            .load(object)
            .map_err(|source| XdpError::Load { source })?;
        let logger = match EbpfLogger::init_with_logger(&mut ebpf, log::TracingLog) {
            Ok(logger) => Some(logger),
            Err(error) => {
                tracing::debug!(%error, "the XDP program's log records are not forwarded");
                None
            }
        };
        {
            let program = program_mut(&mut ebpf, name)?;
            program.load().map_err(|source| XdpError::Program {
                action: "load (verify)".to_owned(),
                source,
            })?;
        }

        let stats: PerCpuArray<_, XdpStats> = take_map(&mut ebpf, MAP_STATS)?;
        let mut port_slots: Array<_, u8> = take_map(&mut ebpf, MAP_PORT_SLOTS)?;
        let ports: PerCpuArray<_, PortCounters> = take_map(&mut ebpf, MAP_PORTS)?;
        let sources: PerCpuArray<_, SourceSketch> = take_map(&mut ebpf, MAP_SOURCES)?;
        let deny_v4: LpmTrie<_, [u8; 4], u64> = take_map(&mut ebpf, MAP_DENY_V4)?;
        let deny_v6: LpmTrie<_, [u8; 16], u64> = take_map(&mut ebpf, MAP_DENY_V6)?;
        let mut settings = Settings {
            map: take_map(&mut ebpf, MAP_SETTINGS)?,
            current: XdpSettings::default(),
        };

        let mut service_ports: Vec<(u16, u32)> = Vec::new();
        for &port in &config.ports {
            if service_ports.iter().any(|&(p, _)| p == port) {
                continue;
            }
            // Slots start at 1: 0 in `PORT_SLOTS` means "not a service port".
            let slot = u8::try_from(service_ports.len() + 1).unwrap_or(u8::MAX);
            port_slots
                .set(u32::from(port), slot, 0)
                .map_err(|source| map_error(MAP_PORT_SLOTS, "set", source))?;
            service_ports.push((port, u32::from(slot)));
        }
        settings.write(XdpSettings {
            minute: telemetry::program_clock_ns()? / MINUTE_NS,
            // Which sources share a SYN budget bucket, secret to this load.
            syn_seed: rand::random(),
            ..XdpSettings::default().with_syn_budget(config.syn_budget_pair())
        })?;

        let guard = Self {
            ebpf: Mutex::new(ebpf),
            program: name,
            attachment: None,
            stats,
            service_ports,
            ports,
            sources,
            deny_v4: Mutex::new(deny_v4),
            deny_v6: Mutex::new(deny_v6),
            settings: Mutex::new(settings),
            logger: Mutex::new(logger),
        };
        for &prefix in &config.deny {
            guard.deny(prefix)?;
        }
        Ok(guard)
    }

    /// The interface the program is attached to, if it is.
    #[must_use]
    pub fn interface(&self) -> Option<&str> {
        self.attachment.as_ref().map(|a| a.interface.as_str())
    }

    /// The mode the program was attached in, if it is.
    #[must_use]
    pub fn attach_mode(&self) -> Option<XdpAttachMode> {
        self.attachment.as_ref().map(|a| a.mode)
    }

    /// Whether detaching needs `CAP_NET_ADMIN`: a program attached through
    /// netlink (aya falls back to it where the kernel or driver has no XDP
    /// bpf_link) is detached with another netlink request; one attached
    /// through a bpf_link is detached by closing the link.
    #[must_use]
    pub fn detach_needs_net_admin(&self) -> bool {
        // aya 0.14 does not say which it made; its link id's `Debug` names
        // the kind (`XdpLinkId(FdLinkId(..))` or `XdpLinkId(NlLinkId(..))`).
        self.attachment
            .as_ref()
            .is_some_and(|a| !format!("{:?}", a.link).contains("FdLinkId"))
    }

    /// Every kind of map operation the running node makes, without changing
    /// anything: reads the deny list, rewrites the settings slot with the
    /// value it holds, reads the telemetry maps. Run after the node dropped
    /// capabilities, it proves the deny-list API and the telemetry still work.
    pub fn probe_maps(&self) -> Result<(), XdpError> {
        self.deny_list()?;
        {
            let mut settings = lock(&self.settings);
            let current = settings.current;
            settings.write(current)?;
        }
        self.snapshot().map(drop)
    }

    /// Adds `prefix` to the deny list: from now on its packets are dropped.
    /// Adding a prefix already present keeps its drop count.
    pub fn deny(&self, prefix: IpPrefix) -> Result<(), XdpError> {
        const BPF_NOEXIST: u64 = 1;
        let mut settings = lock(&self.settings);
        let len = u32::from(prefix.prefix_len());
        let (result, map) = match prefix.addr() {
            IpAddr::V4(addr) => (
                lock(&self.deny_v4).insert(&Key::new(len, addr.octets()), 0, BPF_NOEXIST),
                MAP_DENY_V4,
            ),
            IpAddr::V6(addr) => (
                lock(&self.deny_v6).insert(&Key::new(len, addr.octets()), 0, BPF_NOEXIST),
                MAP_DENY_V6,
            ),
        };
        match result {
            Ok(()) => {}
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::EEXIST) => {
                return Ok(());
            }
            Err(source) => return Err(map_error(map, "insert", source)),
        }
        // The trie first, then the count that makes the program search it.
        let mut new = settings.current;
        if prefix.addr().is_ipv4() {
            new.deny_v4_prefixes += 1;
        } else {
            new.deny_v6_prefixes += 1;
        }
        settings.write(new)
    }

    /// Removes exactly `prefix` from the deny list (not prefixes inside it);
    /// returns whether it was there.
    pub fn allow(&self, prefix: IpPrefix) -> Result<bool, XdpError> {
        let mut settings = lock(&self.settings);
        let len = u32::from(prefix.prefix_len());
        let (result, map) = match prefix.addr() {
            IpAddr::V4(addr) => (
                lock(&self.deny_v4).remove(&Key::new(len, addr.octets())),
                MAP_DENY_V4,
            ),
            IpAddr::V6(addr) => (
                lock(&self.deny_v6).remove(&Key::new(len, addr.octets())),
                MAP_DENY_V6,
            ),
        };
        match result {
            Ok(()) => {}
            Err(MapError::KeyNotFound) => return Ok(false),
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => {
                return Ok(false);
            }
            Err(source) => return Err(map_error(map, "remove", source)),
        }
        let mut new = settings.current;
        if prefix.addr().is_ipv4() {
            new.deny_v4_prefixes = new.deny_v4_prefixes.saturating_sub(1);
        } else {
            new.deny_v6_prefixes = new.deny_v6_prefixes.saturating_sub(1);
        }
        settings.write(new)?;
        Ok(true)
    }

    /// The deny list with the packets each prefix has dropped, sorted.
    pub fn deny_list(&self) -> Result<Vec<(IpPrefix, u64)>, XdpError> {
        let mut list = Vec::new();
        for entry in lock(&self.deny_v4).iter() {
            let (key, dropped) =
                entry.map_err(|source| map_error(MAP_DENY_V4, "iterate", source))?;
            list.extend(
                prefix_of(key.prefix_len(), IpAddr::from(key.data())).map(|p| (p, dropped)),
            );
        }
        for entry in lock(&self.deny_v6).iter() {
            let (key, dropped) =
                entry.map_err(|source| map_error(MAP_DENY_V6, "iterate", source))?;
            list.extend(
                prefix_of(key.prefix_len(), IpAddr::from(key.data())).map(|p| (p, dropped)),
            );
        }
        list.sort_unstable();
        Ok(list)
    }

    /// Replaces the SYN budget (`None` turns it off). The buckets keep their
    /// times; the new rate applies from a source's next SYN.
    pub fn set_syn_budget(&self, budget: Option<SynBudget>) -> Result<(), XdpError> {
        let mut settings = lock(&self.settings);
        let new = settings
            .current
            .with_syn_budget(budget.map(|b| (b.rate_per_sec, b.burst)));
        settings.write(new)
    }

    /// Reads every counter and both minutes' sketches, summing the CPUs.
    pub fn snapshot(&self) -> Result<TelemetrySnapshot, XdpError> {
        telemetry::read(self)
    }

    /// Distinct sources the program recorded in `minute` (of
    /// `CLOCK_MONOTONIC_COARSE`), the CPUs' sketches merged; empty for a
    /// minute the sketches no longer (or not yet) hold. The program keeps
    /// two: the current minute and the one before.
    pub fn sources_in(&self, minute: u64) -> Result<DistinctSources, XdpError> {
        telemetry::sources_in(self, minute)
    }

    /// The minute the program records sources in (`XdpSettings::minute`).
    #[must_use]
    pub fn program_minute(&self) -> u64 {
        lock(&self.settings).current.minute
    }

    /// Tells the program that `minute` has begun, if it is later than the
    /// minute it holds (never backwards); whether it wrote. The telemetry
    /// reader ([`spawn_telemetry`]) turns the clock's minutes: call this
    /// only to test the program's minutes without waiting for the clock
    /// (the clock's next minute is then not written until it is later).
    pub fn turn_minute(&self, minute: u64) -> Result<bool, XdpError> {
        lock(&self.settings).turn_minute(minute)
    }

    /// Tells the program the current minute of `CLOCK_MONOTONIC_COARSE`
    /// (see [`Self::turn_minute`]); whether it wrote.
    pub fn turn_to_the_clock_minute(&self) -> Result<bool, XdpError> {
        self.turn_minute(telemetry::program_clock_ns()? / MINUTE_NS)
    }

    /// Forwards the program's pending log records to `tracing`.
    pub fn flush_logs(&self) {
        if let Some(logger) = lock(&self.logger).as_mut() {
            logger.flush();
        }
    }

    /// Runs the program once on `frame` with `BPF_PROG_TEST_RUN`, maps and
    /// all, and returns its verdict.
    pub fn test_run(&self, frame: &[u8]) -> Result<XdpVerdict, XdpError> {
        Ok(self.test_run_repeat(frame, 1)?.0)
    }

    /// Runs the program `repeat` times on `frame`; returns the verdict and
    /// the kernel's mean duration of one run.
    pub fn test_run_repeat(
        &self,
        frame: &[u8],
        repeat: u32,
    ) -> Result<(XdpVerdict, Duration), XdpError> {
        let ebpf = lock(&self.ebpf);
        let program = program(&ebpf, self.program)?;
        let result = program
            .test_run(TestRunOptions {
                data_in: Some(frame),
                repeat,
                ..TestRunOptions::default()
            })
            .map_err(|source| XdpError::Program {
                action: "BPF_PROG_TEST_RUN".to_owned(),
                source,
            })?;
        Ok((result.return_value.into(), result.duration))
    }

    /// The kernel's run count and run time of the program (they only move
    /// while statistics are enabled: [`enable_run_stats`]).
    pub fn run_stats(&self) -> Result<RunStats, XdpError> {
        let ebpf = lock(&self.ebpf);
        let program = program(&ebpf, self.program)?;
        let info = program.info().map_err(|source| XdpError::Program {
            action: "read program info".to_owned(),
            source,
        })?;
        Ok(RunStats {
            run_count: info.run_count(),
            run_time: info.run_time(),
        })
    }
}

impl Drop for XdpGuard {
    fn drop(&mut self) {
        let Some(attachment) = self.attachment.take() else {
            return;
        };
        let ebpf = self
            .ebpf
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let result = program_mut(ebpf, self.program).and_then(|program| {
            program
                .detach(attachment.link)
                .map_err(|source| XdpError::Program {
                    action: format!("detach from {}", attachment.interface),
                    source,
                })
        });
        match result {
            Ok(()) => tracing::info!(interface = %attachment.interface, "XDP program detached"),
            // Closing the object's descriptors right after this detaches it anyway.
            Err(error) => tracing::warn!(%error, "detaching the XDP program"),
        }
    }
}

/// Turns on the kernel's per-program run-time statistics for as long as the
/// returned descriptor is open (`BPF_ENABLE_STATS`, the scoped form of
/// `sysctl kernel.bpf_stats_enabled=1`).
pub fn enable_run_stats() -> Result<OwnedFd, XdpError> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime).map_err(|e| XdpError::Sys {
        call: "bpf(BPF_ENABLE_STATS)",
        source: e.io_error,
    })
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves the map itself intact.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn program_mut<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut Xdp, XdpError> {
    ebpf.program_mut(name)
        .and_then(|p| p.try_into().ok())
        .ok_or(XdpError::Missing {
            kind: "program",
            name,
        })
}

fn program<'a>(ebpf: &'a Ebpf, name: &'static str) -> Result<&'a Xdp, XdpError> {
    ebpf.program(name)
        .and_then(|p| p.try_into().ok())
        .ok_or(XdpError::Missing {
            kind: "program",
            name,
        })
}

fn take_map<M>(ebpf: &mut Ebpf, name: &'static str) -> Result<M, XdpError>
where
    M: TryFrom<Map, Error = MapError>,
{
    let map = ebpf
        .take_map(name)
        .ok_or(XdpError::Missing { kind: "map", name })?;
    M::try_from(map).map_err(|source| map_error(name, "open", source))
}

fn map_error(map: &'static str, action: &'static str, source: MapError) -> XdpError {
    XdpError::Map {
        map,
        action,
        source,
    }
}

fn prefix_of(len: u32, addr: IpAddr) -> Option<IpPrefix> {
    IpPrefix::new(addr, u8::try_from(len).ok()?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_privilege_hint_names_exactly_the_missing_capabilities() {
        let status = |eff: &str| format!("Name:\tx\nCapInh:\t0\nCapEff:\t{eff}\nCapBnd:\t0\n");
        // A user service with only CAP_NET_ADMIN (bit 12).
        let hint = missing_capabilities_hint(&status("0000000000001000"));
        assert!(hint.contains("CAP_BPF, CAP_PERFMON"), "{hint}");
        assert!(
            !hint.contains("NET_ADMIN") && !hint.contains("root"),
            "{hint}"
        );
        // Bits 12, 38, 39: nothing missing, no hint.
        assert_eq!(missing_capabilities_hint(&status("000000c000001000")), "");
        // Nothing at all.
        assert!(
            missing_capabilities_hint(&status("0")).contains("CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON")
        );
        // Unreadable: say nothing rather than guess.
        assert_eq!(missing_capabilities_hint("garbage"), "");
    }

    use super::*;

    #[test]
    fn refuses_before_touching_the_kernel() {
        let config = XdpConfig::new("eth9", [443]);
        let err = XdpGuard::load_object(&[], &config, PROGRAM_NAME).unwrap_err();
        assert!(matches!(err, XdpError::NotBuilt));
        assert!(err.to_string().contains("AYA_BUILD_SKIP"), "{err}");

        let ports: Vec<u16> = (1..=65).chain([1, 2]).collect();
        let err = XdpGuard::load_object(b"not empty", &XdpConfig::new("eth9", ports), PROGRAM_NAME)
            .unwrap_err();
        assert!(
            matches!(err, XdpError::TooManyPorts { count: 65, max: 64 }),
            "{err}"
        );
    }

    #[test]
    fn garbage_object_is_a_load_error() {
        let err = XdpGuard::load_object(
            b"not an ELF file",
            &XdpConfig::new("eth9", [443]),
            PROGRAM_NAME,
        )
        .unwrap_err();
        assert!(matches!(err, XdpError::Load { .. }), "{err}");
        assert!(
            err.to_string().starts_with("loading the XDP object failed"),
            "{err}"
        );
    }

    #[test]
    fn verdicts_and_run_stats() {
        assert_eq!(XdpVerdict::from(1), XdpVerdict::Drop);
        assert_eq!(XdpVerdict::from(2), XdpVerdict::Pass);
        assert_eq!(XdpVerdict::from(0), XdpVerdict::Aborted);
        assert_eq!(XdpVerdict::from(4), XdpVerdict::Other(4));
        let earlier = RunStats {
            run_count: 10,
            run_time: Duration::from_nanos(1_000),
        };
        let later = RunStats {
            run_count: 110,
            run_time: Duration::from_nanos(21_000),
        };
        assert_eq!(later.ns_per_packet_since(&earlier), Some(200.0));
        assert_eq!(earlier.ns_per_packet_since(&earlier), None);
        assert_eq!(earlier.ns_per_packet_since(&later), None);
    }
}
