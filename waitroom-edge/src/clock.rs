//! The node's one clock. Everything below the request handler gets time passed
//! in (the engine never reads a clock); this is where it is read.
use std::time::{SystemTime, UNIX_EPOCH};

use waitroom_common::time::UnixMillis;

/// Wall-clock time as the engine counts it.
pub fn now() -> UnixMillis {
    UnixMillis(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    )
}
