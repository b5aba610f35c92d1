//! SIGHUP: apply what a new configuration file changes while requests flow.
use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use crate::{
    config::{ConfigError, EdgeConfig},
    keys,
    node::{Node, RoomLive},
};

/// Why a reload was refused (the old configuration stays in force).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{path}: rooms changed ({what}); adding, removing or re-routing rooms needs a restart")]
    Rooms { path: PathBuf, what: String },
    #[error("{path}: {source:#}")]
    Room {
        path: PathBuf,
        source: anyhow::Error,
    },
}

impl Node {
    /// Applies a new configuration read from `path` to the running node: room
    /// limits, queueing methods, templates, queue status and cookie keys change
    /// at once; connections, counters and visitors' tickets are untouched.
    ///
    /// Anything invalid refuses the whole reload, naming the file and field, and
    /// the old configuration stays. Changes that need new sockets or routes
    /// (listeners, rooms added, removed or re-routed, origins) are refused too:
    /// those need a restart, which keeps counters and cookies as well.
    pub fn reload(&self, path: &Path) -> Result<Vec<String>, ReloadError> {
        let new = EdgeConfig::parse(path, &waitroom_runtime::config_file::read(path)?)?;
        if new.rooms.len() != self.rooms.len() {
            return Err(ReloadError::Rooms {
                path: path.to_owned(),
                what: format!("{} rooms instead of {}", new.rooms.len(), self.rooms.len()),
            });
        }
        let mut lives = Vec::with_capacity(new.rooms.len());
        for (old, spec) in self.rooms.iter().zip(&new.rooms) {
            let o = &old.spec;
            if o.id != spec.id
                || o.host != spec.host
                || o.path != spec.path
                || o.upstream != spec.upstream
            {
                return Err(ReloadError::Rooms {
                    path: path.to_owned(),
                    what: format!("room {} (id, host, path or origins)", spec.id),
                });
            }
            lives.push(
                RoomLive::from_spec(spec).map_err(|source| ReloadError::Room {
                    path: path.to_owned(),
                    source,
                })?,
            );
        }
        let keys = if new.node.cookie_keys.is_empty() {
            None
        } else {
            Some(keys::load(&new.node).map_err(|source| ReloadError::Room {
                path: path.to_owned(),
                source,
            })?)
        };
        // Everything is valid: apply.
        let mut changes = Vec::new();
        for (room, live) in self.rooms.iter().zip(lives) {
            let before = room.live.load();
            if before.engine.config() != live.engine.config() {
                changes.push(format!("room {}: limits or method", room.spec.id));
            }
            room.live.store(Arc::new(live));
        }
        if let Some(keys) = keys {
            changes.push(format!("cookie keys: {keys:?}"));
            self.keys.store(Arc::new(keys));
        }
        Ok(changes)
    }
}
