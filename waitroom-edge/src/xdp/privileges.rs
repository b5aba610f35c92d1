//! Dropping the capabilities a started node no longer needs.
//!
//! Loading and attaching the XDP program needs `CAP_BPF`, `CAP_NET_ADMIN` and
//! `CAP_PERFMON`, and binding a port below 1024 `CAP_NET_BIND_SERVICE`; once
//! the node is started, the deny-list API and the telemetry only operate on
//! maps through descriptors the node already holds, and detaching only closes
//! a link. What the running node keeps is decided by proof, on this kernel:
//!
//! - **maps**: with every capability out of the effective set, the node reads
//!   the deny list, rewrites the settings map with its current value and reads
//!   the telemetry maps. Kernels before 6.5 refuse every `bpf()` command
//!   without `CAP_BPF` when `kernel.unprivileged_bpf_disabled` is set; newer
//!   ones check only the commands that make objects. If the probe fails,
//!   `CAP_BPF` goes back into the effective set and the probe runs again: if
//!   it passes then, `CAP_BPF` is kept.
//! - **detach**: a program attached through a bpf_link is detached by closing
//!   the link (no capability); one attached through netlink (kernels or
//!   drivers without XDP links) needs `CAP_NET_ADMIN` to detach, so it is kept.
//!
//! Everything else leaves the effective, permitted, inheritable and ambient
//! sets, and the bounding set when the process may change it (`CAP_SETPCAP`;
//! under systemd the unit's `CapabilityBoundingSet=` already limits it).
//!
//! Capabilities are per thread: [`drop_unneeded`] changes the calling
//! thread's sets, and threads started afterwards inherit them. The node calls
//! it before it starts any other thread; [`Outcome::threads_with_more`] names
//! any task of the process that still holds more than was kept.
use caps::{CapSet, Capability, CapsHashSet};

use super::{XdpError, XdpGuard};

/// Why capabilities could not be dropped (the node then keeps what it had).
#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    /// Reading or changing a capability set failed.
    #[error("{action} the {set:?} capability set failed: {source}")]
    Caps {
        /// `"reading"` or `"changing"`.
        action: &'static str,
        /// Which set.
        set: CapSet,
        /// What the `caps` crate reported.
        #[source]
        source: caps::errors::CapsError,
    },
    /// The XDP maps could not be used even with `CAP_BPF` (or without it,
    /// when the process never had it): nothing was dropped.
    #[error("the XDP maps cannot be used with the reduced capabilities ({kept}): {source}")]
    Probe {
        /// The capabilities the probe ran with.
        kept: String,
        /// The failing map operation (boxed: `XdpError` is large).
        #[source]
        source: Box<XdpError>,
    },
}

/// What [`drop_unneeded`] kept and dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Left in the effective and permitted sets, by number.
    pub kept: Vec<Capability>,
    /// Removed from the permitted set, by number.
    pub dropped: Vec<Capability>,
    /// Whether the bounding set now holds only `kept` (needs `CAP_SETPCAP`).
    pub bounding_reduced: bool,
    /// Tasks (threads) of this process when the sets were changed.
    pub threads: usize,
    /// Tasks still holding more than `kept` in `CapEff` or `CapPrm`: threads
    /// started before the drop. Empty when the drop covers the process.
    pub threads_with_more: Vec<String>,
}

impl Outcome {
    /// The one log line: kept, dropped, and a warning for threads the drop
    /// did not reach.
    pub fn log(&self) {
        let kept = names(&self.kept);
        let dropped = names(&self.dropped);
        if self.dropped.is_empty() && self.kept.is_empty() {
            tracing::debug!("no capabilities to drop");
        } else {
            tracing::info!(
                %kept,
                %dropped,
                bounding_set_reduced = self.bounding_reduced,
                threads = self.threads,
                "capabilities dropped after start"
            );
        }
        if !self.threads_with_more.is_empty() {
            tracing::warn!(
                threads = %self.threads_with_more.join(", "),
                "threads started before the drop still hold capabilities"
            );
        }
    }
}

/// `set` ordered by capability number.
fn sorted<'a>(set: impl IntoIterator<Item = &'a Capability>) -> Vec<Capability> {
    let mut list: Vec<Capability> = set.into_iter().copied().collect();
    list.sort_unstable_by_key(|c| c.index());
    list
}

/// `"CAP_NET_ADMIN,CAP_BPF"` (one word in a log line), or `"none"`.
fn names(set: &[Capability]) -> String {
    if set.is_empty() {
        return "none".to_owned();
    }
    set.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn read(set: CapSet) -> Result<CapsHashSet, PrivilegeError> {
    caps::read(None, set).map_err(|source| PrivilegeError::Caps {
        action: "reading",
        set,
        source,
    })
}

fn write(set: CapSet, value: &CapsHashSet) -> Result<(), PrivilegeError> {
    caps::set(None, set, value).map_err(|source| PrivilegeError::Caps {
        action: "changing",
        set,
        source,
    })
}

/// Drops from the calling thread every capability the running node does not
/// need (see the module docs); `xdp` is the attached program, if any. On an
/// error the effective set is as it was and nothing was dropped.
pub fn drop_unneeded(xdp: Option<&XdpGuard>) -> Result<Outcome, PrivilegeError> {
    let permitted = read(CapSet::Permitted)?;
    let effective = read(CapSet::Effective)?;
    let mut needed = CapsHashSet::new();
    if xdp.is_some_and(XdpGuard::detach_needs_net_admin) {
        needed.insert(Capability::CAP_NET_ADMIN);
    }
    needed.retain(|c| permitted.contains(c));
    if let Some(guard) = xdp {
        write(CapSet::Effective, &needed)?;
        if let Err(first) = guard.probe_maps() {
            let retried = permitted.contains(&Capability::CAP_BPF) && {
                let mut with_bpf = needed.clone();
                with_bpf.insert(Capability::CAP_BPF);
                write(CapSet::Effective, &with_bpf)?;
                guard.probe_maps().is_ok()
            };
            if retried {
                needed.insert(Capability::CAP_BPF);
            } else {
                let kept = names(&sorted(&needed));
                write(CapSet::Effective, &effective)?;
                return Err(PrivilegeError::Probe {
                    kept,
                    source: Box::new(first),
                });
            }
        }
    }
    // The bounding set can only shrink with CAP_SETPCAP in the effective set.
    let bounding_reduced = permitted.contains(&Capability::CAP_SETPCAP) && {
        let mut with_setpcap = needed.clone();
        with_setpcap.insert(Capability::CAP_SETPCAP);
        write(CapSet::Effective, &with_setpcap)?;
        for cap in read(CapSet::Bounding)? {
            if !needed.contains(&cap) {
                caps::drop(None, CapSet::Bounding, cap).map_err(|source| PrivilegeError::Caps {
                    action: "changing",
                    set: CapSet::Bounding,
                    source,
                })?;
            }
        }
        true
    };
    caps::clear(None, CapSet::Ambient).map_err(|source| PrivilegeError::Caps {
        action: "changing",
        set: CapSet::Ambient,
        source,
    })?;
    write(CapSet::Inheritable, &CapsHashSet::new())?;
    write(CapSet::Effective, &needed)?;
    write(CapSet::Permitted, &needed)?;

    let kept_mask = needed.iter().fold(0u64, |m, c| m | c.bitmask());
    let tasks = task_statuses();
    let threads_with_more = tasks
        .iter()
        .filter(|(_, status)| {
            ["CapEff:", "CapPrm:"]
                .iter()
                .any(|field| status_mask(status, field).is_none_or(|m| m & !kept_mask != 0))
        })
        .map(|(tid, status)| {
            let name = status
                .lines()
                .find_map(|l| l.strip_prefix("Name:"))
                .unwrap_or("?")
                .trim();
            format!("{tid} ({name})")
        })
        .collect();
    Ok(Outcome {
        kept: sorted(&needed),
        dropped: sorted(permitted.difference(&needed)),
        bounding_reduced,
        threads: tasks.len(),
        threads_with_more,
    })
}

/// `/proc/self/task/<tid>/status` of every task of this process.
fn task_statuses() -> Vec<(String, String)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| {
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            Some((entry.file_name().to_string_lossy().into_owned(), status))
        })
        .collect()
}

/// The hex mask after `field` (`"CapEff:"`) in a `/proc/.../status` text.
#[must_use]
pub fn status_mask(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_and_names() {
        let status = "Name:\twaitroom-edge\nCapPrm:\t0000008000000000\nCapEff:\t0000000000001000\n";
        assert_eq!(status_mask(status, "CapPrm:"), Some(1 << 39));
        assert_eq!(status_mask(status, "CapEff:"), Some(1 << 12));
        assert_eq!(status_mask(status, "CapBnd:"), None);
        assert_eq!(names(&[]), "none");
        assert_eq!(
            names(&sorted(&[Capability::CAP_BPF, Capability::CAP_NET_ADMIN])),
            "CAP_NET_ADMIN,CAP_BPF"
        );
    }
}
