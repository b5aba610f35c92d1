//! `--check`: every load step [`crate::start`] runs, without serving, so a
//! file `--check` accepts is one the node starts with (and `systemctl
//! reload`, which runs `--check` first, refuses what a start would).
//!
//! Parsing ([`crate::config::EdgeConfig::parse`]) already refused unknown
//! keys, numbers out of range, duplicate ids and key ids, non-hex secrets
//! and more rooms than the counters file has slots. Here come the steps that
//! read files: the admin token, the state directory and the cookie key in
//! it, the counters file (read, never written: a probe file shows the
//! directory takes new files), every queue page template, the TLS listener's
//! certificate and key (which must belong together), the aggregator's CA,
//! certificate and key, the origins' CA files, and the access log's file
//! (opened for appending, so created if missing). What `--check` does not
//! do is bind the listeners: a running node holds them while its reload is
//! checked.
use std::path::Path;

use crate::{
    admin::AdminAuth,
    config::EdgeConfig,
    counters::{SLOTS, SharedCounters},
    node::RoomLive,
    state_dir,
};

/// Why `--check` refused a configuration: the key of the file it concerns
/// and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {key}: {problem}")]
pub struct CheckError {
    pub file: String,
    pub key: String,
    pub problem: String,
}

/// Runs every load step of a start on `config` (read from `path`).
pub fn check(config: &EdgeConfig, path: &Path) -> Result<(), CheckError> {
    let err = |key: &str, problem: String| CheckError {
        file: path.display().to_string(),
        key: key.to_owned(),
        problem,
    };
    let node = &config.node;
    AdminAuth::load(node).map_err(|e| err("node.admin_token_file", e.to_string()))?;
    let dir = node.state_dir();
    state_dir::check(&dir).map_err(|e| err("node.state_dir", e.to_string()))?;
    check_counters(config).map_err(|problem| err("node.counters_path", problem))?;
    check_ledger(config).map_err(|problem| err("node.counters_path", problem))?;
    if !node.cookie_keys.is_empty() {
        let pairs: Vec<(u8, &str)> = node
            .cookie_keys
            .iter()
            .map(|k| (k.id, k.secret_hex.as_str()))
            .collect();
        crate::cookie::CookieKeys::from_hex(&pairs)
            .map_err(|e| err("node.cookie_keys", e.to_string()))?;
    }
    for (i, spec) in config.rooms.iter().enumerate() {
        RoomLive::from_spec(spec)
            .map_err(|e| err(&format!("rooms[{i}].{}", e.key), e.to_string()))?;
    }
    if let Some(tls) = &node.tls {
        waitroom_runtime::tls::https_server_config(&tls.cert, &tls.key)
            .map_err(|e| err("node.tls", e.to_string()))?;
    }
    if let Some(gossip) = &config.aggregator {
        waitroom_runtime::tls::client_config(&gossip.tls_files())
            .map_err(|e| err("aggregator", e.to_string()))?;
    }
    if let Some(log) = node.access_log.as_ref().filter(|l| l.enabled) {
        // Opened for appending as the start opens it (a missing file is created).
        log.open().map_err(|e| {
            let problem = e.to_string();
            let problem = problem
                .strip_prefix("node.access_log.path: ")
                .unwrap_or(&problem)
                .to_owned();
            err("node.access_log.path", problem)
        })?;
    }
    crate::upstream::tls::OriginTls::new(crate::node::origin_specs(config))
        .map_err(|e| err("rooms", e.to_string()))?;
    Ok(())
}

/// The ticket ledger file as start will open it: an existing one must be
/// the node's and writable by no one else (one of another size or layout is
/// set aside at start, not refused); a new one goes beside the counters,
/// whose directory [`check_counters`] probed.
fn check_ledger(config: &EdgeConfig) -> Result<(), String> {
    let path = config.node.ticket_ledger_file();
    if let Some(file) = state_dir::open_existing(&path, false).map_err(|e| e.to_string())? {
        state_dir::check_owned_unwritable(&file, &path).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The counters file as start will open it: an existing one must be the
/// node's and have a slot for every room; a new one needs a directory that
/// takes files.
fn check_counters(config: &EdgeConfig) -> Result<(), String> {
    let path = config.node.counters_file();
    if let Some(file) = state_dir::open_existing(&path, false).map_err(|e| e.to_string())? {
        state_dir::check_owned_unwritable(&file, &path).map_err(|e| e.to_string())?;
        // A file of another layout is set aside at start, not refused.
        if let Ok(existing) = SharedCounters::open_existing(&path) {
            let claimed = existing.claimed_rooms();
            let missing = config
                .rooms
                .iter()
                .filter(|r| !claimed.contains(&r.engine.id()))
                .count();
            if claimed.len() + missing > SLOTS {
                return Err(format!(
                    "{}: {} slots are claimed by rooms and {missing} more are needed (at most {SLOTS}); delete the file to start afresh",
                    path.display(),
                    claimed.len()
                ));
            }
        }
        return Ok(());
    }
    // A new file: the nearest existing directory must take a new file.
    let mut dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    while !dir.as_os_str().is_empty() && !dir.exists() {
        dir = dir.parent().map(Path::to_path_buf).unwrap_or_default();
    }
    if dir.as_os_str().is_empty() {
        dir = ".".into();
    }
    if !dir.is_dir() {
        return Err(format!("{}: not a directory", dir.display()));
    }
    let probe = dir.join(format!(".waitroom-check-{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(format!(
            "{}: cannot create the counters file there: {e}",
            dir.display()
        )),
    }
}
