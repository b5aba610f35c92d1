//! Graceful shutdown: a watch channel that flips once to "stop accepting".
//!
//! Every listener loop selects on it; in-flight connections are then drained by
//! hyper's graceful shutdown within the configured grace period.
use tokio::sync::watch;

/// The sending half, held by whoever decides to stop (the signal handler).
#[derive(Debug, Clone)]
pub struct Trigger(watch::Sender<bool>);

/// The receiving half, cloned into every task that must stop.
#[derive(Debug, Clone)]
pub struct Shutdown(watch::Receiver<bool>);

/// A connected trigger and receiver.
pub fn channel() -> (Trigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (Trigger(tx), Shutdown(rx))
}

impl Trigger {
    /// Asks every listener to stop accepting. Idempotent.
    pub fn fire(&self) {
        self.0.send_replace(true);
    }
}

impl Shutdown {
    /// True once shutdown has been requested.
    pub fn is_requested(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves when shutdown is requested (at once if it already was).
    pub async fn requested(&mut self) {
        // An error means the trigger is gone, which also means stop.
        let _ = self.0.wait_for(|stop| *stop).await;
    }
}
