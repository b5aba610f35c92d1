//! Support for the integration tests in `tests/`: they start the real
//! binaries, and the privileged ones build network namespaces for XDP.
//!
//! # Layout
//! - [`netns`]: a namespace + veth pair guard for XDP tests.
//! - [`require_root`]: the skip check of privileged tests.

pub mod browser;
pub mod cluster;
pub mod edge;
pub mod minutes;
pub mod netns;
pub mod procs;

/// Whether the process runs as root; if not, says on stderr that the calling
/// test skips and why. Privileged tests start with
/// `if !require_root() { return; }`.
#[track_caller]
#[must_use]
pub fn require_root() -> bool {
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    eprintln!(
        "skipping privileged test at {}: it needs root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN) \
         to load XDP and create network namespaces; CI runs it as root",
        std::panic::Location::caller()
    );
    false
}
