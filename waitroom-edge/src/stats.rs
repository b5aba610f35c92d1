//! `waitroom-edge stats`: the node counters, read straight from shared memory.
//!
//! Works whether or not the node is running (the file outlives the process),
//! and changes nothing in it.
use std::fmt::Write as _;

use anyhow::Context as _;

use waitroom_runtime::clock;

use crate::{config::EdgeConfig, counters::SharedCounters};

/// A table of every configured room's counters for the current minute.
pub fn render(config: &EdgeConfig) -> anyhow::Result<String> {
    let path = &config.node.counters_file();
    let counters = SharedCounters::open_existing(path).with_context(|| {
        format!(
            "reading the node counters (is node.counters_path {} right?)",
            path.display()
        )
    })?;
    let now = clock::now();
    let minute = now.minute();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "node {} ({}), counters {}",
        config.node.id,
        config.node.colo,
        path.display()
    );
    let _ = writeln!(
        out,
        "{:<16} {:>8} {:>8} {:>10} {:>10} {:>9} {:>9} {:>9}",
        "room", "active", "limit", "admitted", "per-min", "waiting", "buckets", "visitors"
    );
    for room in &config.rooms {
        let id = room.engine.id();
        let Some(c) = counters.room(id) else {
            let _ = writeln!(
                out,
                "{:<16} (no counters yet: the node has not run with this room)",
                room.id
            );
            continue;
        };
        let waiting: Vec<(waitroom_common::time::Minute, i64)> =
            c.waiting_buckets(minute).filter(|(_, n)| *n > 0).collect();
        let _ = writeln!(
            out,
            "{:<16} {:>8} {:>8} {:>10} {:>10} {:>9} {:>9} {:>9}",
            room.id,
            c.active_users(now.expiry_slot()),
            room.engine.total_active_users(),
            c.admits(minute).total(),
            room.engine.new_users_per_minute(),
            waiting.iter().map(|(_, n)| n).sum::<i64>(),
            waiting.len(),
            c.distinct_visitors(minute),
        );
    }
    let _ = writeln!(
        out,
        "(this node's own counts for the current minute; the global view is on the admin /status)"
    );
    Ok(out)
}
