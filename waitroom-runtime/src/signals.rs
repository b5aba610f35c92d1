//! The process signals both binaries act on.
use tokio::signal::unix::{Signal, SignalKind, signal};

/// SIGTERM and SIGINT, listened for from the moment this is made (so a
/// signal sent right after the ready line is never missed).
#[derive(Debug)]
pub struct Terminate {
    term: Signal,
    int: Signal,
}

impl Terminate {
    /// Starts listening. Call inside a tokio runtime with its signal driver.
    pub fn listen() -> std::io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Resolves on the next SIGTERM or SIGINT.
    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

/// Resolves on the first SIGTERM or SIGINT. If neither can be listened for
/// it logs that and never resolves: the process then stops only with SIGKILL.
pub async fn terminate() {
    match Terminate::listen() {
        Ok(mut t) => t.recv().await,
        Err(err) => {
            tracing::error!(%err, "cannot listen for SIGTERM/SIGINT; stop with SIGKILL");
            std::future::pending().await
        }
    }
}

/// A stream of SIGHUPs (reload requests), or `None` after logging why not.
pub fn hangups() -> Option<Signal> {
    match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(err) => {
            tracing::error!(%err, "cannot listen for SIGHUP; reloads will not work");
            None
        }
    }
}

/// Why a reload request could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum HangupError {
    #[error("--pid {0}: not a service's process id")]
    BadPid(i32),
    #[error("sending SIGHUP to {pid}: {source}")]
    Kill { pid: i32, source: std::io::Error },
}

/// Sends SIGHUP to `pid`: what the units' `ExecReload` runs (`BIN reload
/// --pid $MAINPID`), so a reload needs no `/bin/kill` (procps), which a
/// minimal Debian lacks.
pub fn send_hangup(pid: i32) -> Result<(), HangupError> {
    if pid <= 1 {
        return Err(HangupError::BadPid(pid));
    }
    // SAFETY: kill has no memory-safety preconditions; pid > 1 so it never
    // names a process group, every process, or init.
    if unsafe { libc::kill(pid, libc::SIGHUP) } != 0 {
        return Err(HangupError::Kill {
            pid,
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}
