//! The aggregator's configuration: one TOML file.
//!
//! ```toml
//! listen = "0.0.0.0:4433"            # UDP, QUIC
//! admin_listen = "127.0.0.1:9300"    # optional: /status, /metrics
//! ca = "/etc/waitroom/ca.pem"        # the cluster CA: the only issuer of node certificates
//! cert = "/etc/waitroom/aggregator.pem"
//! key = "/etc/waitroom/aggregator.key"
//! snapshot_path = "/var/lib/waitroom/aggregator.json"
//! snapshot_interval_ms = 5000
//! node_timeout_ms = 15000
//! control_token_file = "/etc/waitroom/control.tokens"  # optional: the control API
//! # settings_path = "/var/lib/waitroom/room-settings.json"  # default: beside the snapshot
//! # audit_log = "/var/lib/waitroom/audit.jsonl"             # default: beside the snapshot
//!
//! [ledger]                            # optional: grants committed to etcd first (docs/adr/0001)
//! endpoints = ["http://10.0.0.1:2379", "http://10.0.0.2:2379", "http://10.0.0.3:2379"]
//! epoch = 1
//! call_timeout_ms = 200
//! commit_deadline_ms = 500
//! batch_interval_ms = 0               # at least this long between commits: bounds etcd's writes
//!
//! [shard]                             # optional: rooms sharded between aggregator groups
//! group = "eu"                        # this aggregator's group
//! groups = ["eu", "us"]               # every group, the same list on every aggregator and node
//!
//! [[rooms]]                           # the cluster's room settings, pushed to the nodes
//! id = "shop"
//! total_active_users = 200
//! new_users_per_minute = 50
//! ```
//! A `[[rooms]]` table may be copied from a node's config as it is: it is the
//! same [`RoomTable`], parsed and checked by the same rules. Its room
//! settings (every key but the node's routes, [`room_table::NODE_KEYS`]) are
//! the cluster's: the aggregator pushes them to the nodes, numbered, and the
//! control API changes them at run time (see [`waitroom_runtime::control`]).
//!
//! Every error names the file, the line and column, and the key path
//! (see [`waitroom_runtime::config_file`]).
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use serde::Deserialize;
use waitroom_common::{
    cluster::RoomDef,
    room_table::{self, RoomTable, RoomsError},
    shard::{GroupsError, Membership},
};
use waitroom_runtime::{
    config_file::{self, ConfigText},
    tls::TlsFiles,
};

pub use waitroom_runtime::config_file::ConfigError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    listen: SocketAddr,
    #[serde(default)]
    admin_listen: Option<SocketAddr>,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    snapshot_path: PathBuf,
    #[serde(default = "default_snapshot_interval_ms")]
    snapshot_interval_ms: u64,
    #[serde(default = "default_node_timeout_ms")]
    node_timeout_ms: u64,
    #[serde(default = "default_learning_ms")]
    learning_ms: u64,
    #[serde(default)]
    control_token_file: Option<PathBuf>,
    #[serde(default)]
    settings_path: Option<PathBuf>,
    #[serde(default)]
    audit_log: Option<PathBuf>,
    #[serde(default)]
    rooms: Vec<RoomTable>,
    #[serde(default)]
    ledger: Option<RawLedger>,
    #[serde(default)]
    shard: Option<RawShard>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShard {
    group: String,
    groups: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLedger {
    endpoints: Vec<String>,
    #[serde(default = "default_epoch")]
    epoch: u64,
    #[serde(default = "default_call_timeout_ms")]
    call_timeout_ms: u64,
    #[serde(default = "default_commit_deadline_ms")]
    commit_deadline_ms: u64,
    #[serde(default)]
    batch_interval_ms: u64,
}

fn default_epoch() -> u64 {
    1
}

/// A loopback or LAN etcd answers in a few ms; a member that takes this
/// long is skipped for the next.
fn default_call_timeout_ms() -> u64 {
    200
}

/// Well within the second a node waits for an answer at least.
fn default_commit_deadline_ms() -> u64 {
    500
}

/// What a node waits for an answer at least (its `answer_timeout`).
const NODE_WAIT_MS: u64 = 1_000;

/// Longest commit deadline: a node waits at least 1 s for an answer, and
/// the answer waits for the commit.
pub const MAX_COMMIT_DEADLINE_MS: u64 = 800;

/// The grant ledger in etcd (`[ledger]`; docs/adr/0001): every grant is
/// committed there before the node hears of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerConfig {
    /// The etcd members' client URLs (`http://host:port`), tried in turn.
    pub endpoints: Vec<String>,
    /// The keys' epoch (`/waitroom/<epoch>/…`): every aggregator of the
    /// cluster must use the same.
    pub epoch: u64,
    /// Each call's timeout per member.
    pub call_timeout_ms: u64,
    /// A commit's deadline over all its attempts; past it the node is
    /// answered with what it holds and nothing new.
    pub commit_deadline_ms: u64,
    /// The shortest time from one batch's start to the next's: with many
    /// nodes, each room's value (every node's cap) is rewritten at most
    /// `1000 / batch_interval_ms` times a second per aggregator. 0: a batch
    /// as soon as the last is done (group commit only).
    pub batch_interval_ms: u64,
}

fn default_snapshot_interval_ms() -> u64 {
    5_000
}

/// Longer than a node's default `stale_after_ms` (10 s), so a node cut off
/// from the aggregator has fallen back to its local limit before its lease
/// and live counts are given to others.
fn default_node_timeout_ms() -> u64 {
    15_000
}

/// Two of the nodes' default report intervals (1 s) and the answer's
/// round trip: by then every node that is up has said what it holds.
fn default_learning_ms() -> u64 {
    3_000
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct AggregatorConfig {
    /// UDP address for QUIC (port 0: any free port, printed when ready).
    pub listen: SocketAddr,
    /// Loopback address for `/status` and `/metrics`.
    pub admin_listen: Option<SocketAddr>,
    pub tls: TlsFiles,
    /// Where the state is written (temp file + rename), and read at start.
    pub snapshot_path: PathBuf,
    pub snapshot_interval_ms: u64,
    /// Silence after which a node's live counts are forgotten.
    pub node_timeout_ms: u64,
    /// After a start, how long nobody is granted more than it holds, while
    /// the nodes' reports say what they hold (`Cluster::learn_until`).
    pub learning_ms: u64,
    /// The `[[rooms]]` tables: where the cluster's room settings start.
    pub rooms: Vec<RoomTable>,
    pub control: ControlConfig,
    /// `[ledger]`: grants committed to etcd; `None`: this aggregator's own
    /// ledger only.
    pub ledger: Option<LedgerConfig>,
    /// `[shard]`: rooms sharded between aggregator groups; this aggregator
    /// takes part only in its group's rooms. `None`: every room.
    pub shard: Option<Membership>,
}

/// Where the control API keeps its state, and who may use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlConfig {
    /// `control_token_file`: `NAME TOKEN` per line; absent: the API is off.
    pub token_file: Option<PathBuf>,
    /// `settings_path`: the room settings in force, with their version.
    pub settings_path: PathBuf,
    /// `audit_log`: one JSON line per change (who, what, when).
    pub audit_log: PathBuf,
}

impl ControlConfig {
    /// No API, the settings and the audit log beside `snapshot_path`.
    #[must_use]
    pub fn beside(snapshot_path: &Path) -> Self {
        let dir = snapshot_path.parent().unwrap_or(Path::new("."));
        Self {
            token_file: None,
            settings_path: dir.join("room-settings.json"),
            audit_log: dir.join("audit.jsonl"),
        }
    }
}

/// The cluster's rooms from their tables (checked again: a table may come
/// from the control API's file as well as from the config).
pub fn room_defs(tables: &[RoomTable]) -> Result<Vec<RoomDef>, RoomsError> {
    Ok(room_table::validate_rooms(tables)?
        .into_iter()
        .zip(tables)
        .map(|(room, table)| RoomDef {
            name: table.id.clone(),
            room,
        })
        .collect())
}

impl AggregatorConfig {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::parse(path, &config_file::read(path)?)
    }

    /// Parses and validates the text of the file at `path`.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let file = ConfigText::new(path, text);
        let raw: Raw = file.parse()?;
        if raw.snapshot_interval_ms < 100 {
            return Err(file.invalid("snapshot_interval_ms", "must be at least 100"));
        }
        if raw.node_timeout_ms < 1_000 {
            return Err(file.invalid(
                "node_timeout_ms",
                "must be at least 1000 (several report intervals)",
            ));
        }
        if raw.learning_ms > raw.node_timeout_ms {
            return Err(file.invalid(
                "learning_ms",
                format!(
                    "{} is longer than node_timeout_ms ({}): a node silent that long is gone, so there is nothing left to learn from it",
                    raw.learning_ms, raw.node_timeout_ms
                ),
            ));
        }
        if raw.rooms.is_empty() {
            return Err(file.invalid("rooms", "at least one [[rooms]] table is required"));
        }
        room_defs(&raw.rooms).map_err(|e| file.invalid(e.key(), e.problem))?;
        let ledger = raw.ledger.map(|l| ledger_config(&file, l)).transpose()?;
        let shard = raw
            .shard
            .map(|s| {
                Membership::new(&s.group, s.groups).map_err(|e| {
                    let key = match e {
                        GroupsError::NotAmong(_) => "shard.group",
                        GroupsError::List(_) => "shard.groups",
                    };
                    file.invalid(key, e.to_string())
                })
            })
            .transpose()?;
        let beside = ControlConfig::beside(&raw.snapshot_path);
        let control = ControlConfig {
            token_file: raw.control_token_file,
            settings_path: raw.settings_path.unwrap_or(beside.settings_path),
            audit_log: raw.audit_log.unwrap_or(beside.audit_log),
        };
        Ok(Self {
            listen: raw.listen,
            admin_listen: raw.admin_listen,
            tls: TlsFiles {
                ca: raw.ca,
                cert: raw.cert,
                key: raw.key,
            },
            snapshot_path: raw.snapshot_path,
            snapshot_interval_ms: raw.snapshot_interval_ms,
            node_timeout_ms: raw.node_timeout_ms,
            learning_ms: raw.learning_ms,
            rooms: raw.rooms,
            control,
            ledger,
            shard,
        })
    }
}

/// Checks `[ledger]`; every error names its key.
fn ledger_config(file: &ConfigText<'_>, raw: RawLedger) -> Result<LedgerConfig, ConfigError> {
    if raw.endpoints.is_empty() {
        return Err(file.invalid(
            "ledger.endpoints",
            "at least one etcd member's client URL is required (three for a majority that survives one loss)",
        ));
    }
    for (i, url) in raw.endpoints.iter().enumerate() {
        let rest = url.strip_prefix("http://").unwrap_or("");
        let host_port = rest.trim_end_matches('/');
        let port_ok = host_port.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if !port_ok || host_port.contains('/') {
            return Err(file.invalid(
                format!("ledger.endpoints[{i}]"),
                format!("{url:?} is not an etcd client URL of the form http://host:port"),
            ));
        }
    }
    if raw.epoch == 0 {
        return Err(file.invalid("ledger.epoch", "must be at least 1"));
    }
    if raw.call_timeout_ms < 10 {
        return Err(file.invalid("ledger.call_timeout_ms", "must be at least 10"));
    }
    if raw.commit_deadline_ms < raw.call_timeout_ms {
        return Err(file.invalid(
            "ledger.commit_deadline_ms",
            format!(
                "{} is shorter than call_timeout_ms ({}): not one call would fit",
                raw.commit_deadline_ms, raw.call_timeout_ms
            ),
        ));
    }
    if raw.commit_deadline_ms > MAX_COMMIT_DEADLINE_MS {
        return Err(file.invalid(
            "ledger.commit_deadline_ms",
            format!(
                "{} is above {MAX_COMMIT_DEADLINE_MS}: a node waits at least 1 s for its answer, which waits for the commit",
                raw.commit_deadline_ms
            ),
        ));
    }
    if raw.batch_interval_ms + raw.commit_deadline_ms > NODE_WAIT_MS {
        return Err(file.invalid(
            "ledger.batch_interval_ms",
            format!(
                "{} with commit_deadline_ms ({}) is above {NODE_WAIT_MS}: a node waits at least 1 s for its answer, which may wait this long for its batch and then its commit",
                raw.batch_interval_ms, raw.commit_deadline_ms
            ),
        ));
    }
    Ok(LedgerConfig {
        endpoints: raw
            .endpoints
            .into_iter()
            .map(|u| u.trim_end_matches('/').to_owned())
            .collect(),
        epoch: raw.epoch,
        call_timeout_ms: raw.call_timeout_ms,
        commit_deadline_ms: raw.commit_deadline_ms,
        batch_interval_ms: raw.batch_interval_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
listen = "127.0.0.1:0"
ca = "ca.pem"
cert = "a.pem"
key = "a.key"
snapshot_path = "snap.json"
"#;

    fn parse(extra: &str) -> Result<AggregatorConfig, ConfigError> {
        AggregatorConfig::parse(Path::new("agg.toml"), &format!("{BASE}{extra}"))
    }

    /// Line 1 of `extra` is line 7 of the file.
    const FIRST_EXTRA_LINE: usize = 7;

    #[test]
    fn a_node_room_table_is_accepted_as_it_is() {
        let config = parse(
            r#"
[[rooms]]
id = "shop"
host = "*"
path = "/"
origin = "127.0.0.1:8081"
total_active_users = 200
new_users_per_minute = 50
"#,
        )
        .unwrap();
        assert_eq!(config.rooms[0].total_active_users, 200);
        assert_eq!(config.rooms[0].id, "shop");
        assert_eq!(config.node_timeout_ms, 15_000);
        assert_eq!(config.learning_ms, 3_000);
        assert_eq!(
            config.control,
            ControlConfig {
                token_file: None,
                settings_path: "room-settings.json".into(),
                audit_log: "audit.jsonl".into(),
            },
            "beside the snapshot, API off"
        );
    }

    #[test]
    fn the_example_room_table_with_pools_health_and_steering_is_accepted() {
        let config = parse(room_table::EXAMPLE).unwrap();
        assert_eq!(config.rooms.len(), 1);
        assert_eq!(config.rooms[0].id, "shop");
        assert_eq!(config.rooms[0].total_active_users, 200);
        assert_eq!(config.rooms[0].new_users_per_minute, 50);
    }

    #[test]
    fn errors_name_the_field() {
        let err = parse("").unwrap_err().to_string();
        assert!(err.starts_with("agg.toml: rooms:"), "{err}");

        let err =
            parse("[[rooms]]\nid = \"shop\"\ntotal_active_users = 10\nnew_users_per_minute = 20\n")
                .unwrap_err()
                .to_string();
        assert_eq!(
            err,
            format!(
                "agg.toml:{}:24: rooms[0].new_users_per_minute: new_users_per_minute (20) is above total_active_users (10)",
                FIRST_EXTRA_LINE + 3
            )
        );

        let err = parse("[[rooms]]\nid = \"shop\"\ntotal_active_users = 10\nnew_users_per_minute = 5\nnew_users_per_hour = 1\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!(
                "agg.toml:{}:1: rooms[0].new_users_per_hour: unknown field `new_users_per_hour`",
                FIRST_EXTRA_LINE + 4
            )),
            "{err}"
        );

        let err = AggregatorConfig::parse(Path::new("agg.toml"), "listen = \"127.0.0.1:0\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains(" ca: missing"), "{err}");

        let err = parse("node_timeout_ms = 10\n[[rooms]]\nid = \"a\"\ntotal_active_users = 1\nnew_users_per_minute = 1\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!("agg.toml:{FIRST_EXTRA_LINE}:19: node_timeout_ms:")),
            "{err}"
        );

        // A learning longer than a node may be silent learns nothing more.
        let err = parse("learning_ms = 20000\n[[rooms]]\nid = \"a\"\ntotal_active_users = 1\nnew_users_per_minute = 1\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!("agg.toml:{FIRST_EXTRA_LINE}:15: learning_ms: 20000 is longer than node_timeout_ms (15000)")),
            "{err}"
        );
        let err = parse("learning_ms = -1\n[[rooms]]\nid = \"a\"\ntotal_active_users = 1\nnew_users_per_minute = 1\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("learning_ms"), "{err}");

        let two = "[[rooms]]\nid = \"a\"\ntotal_active_users = 1\nnew_users_per_minute = 1\n";
        let err = parse(&format!("{two}{two}")).unwrap_err().to_string();
        assert!(
            err.contains("rooms[1].id: duplicate room id \"a\" (also rooms[0])"),
            "{err}"
        );
    }

    const ROOM: &str = "[[rooms]]\nid = \"a\"\ntotal_active_users = 1\nnew_users_per_minute = 1\n";

    #[test]
    fn a_ledger_table_is_checked_field_by_field() {
        let ok = parse(&format!(
            "{ROOM}[ledger]\nendpoints = [\"http://127.0.0.1:2379/\", \"http://etcd-2:2379\"]\n"
        ))
        .unwrap();
        assert_eq!(
            ok.ledger,
            Some(LedgerConfig {
                endpoints: vec!["http://127.0.0.1:2379".into(), "http://etcd-2:2379".into()],
                epoch: 1,
                call_timeout_ms: 200,
                commit_deadline_ms: 500,
                batch_interval_ms: 0,
            })
        );
        assert_eq!(parse(ROOM).unwrap().ledger, None, "no table: no store");
        for (table, names) in [
            ("endpoints = []", "ledger.endpoints: at least one"),
            (
                "endpoints = [\"127.0.0.1:2379\"]",
                "ledger.endpoints[0]: \"127.0.0.1:2379\" is not an etcd client URL",
            ),
            (
                "endpoints = [\"http://a:1\", \"https://b:2379\"]",
                "ledger.endpoints[1]:",
            ),
            ("endpoints = [\"http://a:0\"]", "ledger.endpoints[0]:"),
            ("endpoints = [\"http://a:1/v3\"]", "ledger.endpoints[0]:"),
            (
                "endpoints = [\"http://a:1\"]\nepoch = 0",
                "ledger.epoch: must be at least 1",
            ),
            (
                "endpoints = [\"http://a:1\"]\ncall_timeout_ms = 1",
                "ledger.call_timeout_ms: must be at least 10",
            ),
            (
                "endpoints = [\"http://a:1\"]\ncall_timeout_ms = 300\ncommit_deadline_ms = 100",
                "ledger.commit_deadline_ms: 100 is shorter than call_timeout_ms (300)",
            ),
            (
                "endpoints = [\"http://a:1\"]\ncommit_deadline_ms = 5000",
                "ledger.commit_deadline_ms: 5000 is above 800",
            ),
            (
                "endpoints = [\"http://a:1\"]\nendpoint = 2",
                "ledger.endpoint: unknown field",
            ),
            ("epoch = 2", "ledger.endpoints: missing"),
            (
                "endpoints = [\"http://a:1\"]\nbatch_interval_ms = 600",
                "ledger.batch_interval_ms: 600 with commit_deadline_ms (500) is above 1000",
            ),
        ] {
            let err = parse(&format!("{ROOM}[ledger]\n{table}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(names), "{table}: {err}");
        }
    }

    #[test]
    fn a_shard_table_is_checked_naming_the_key() {
        let ok = parse(&format!(
            "{ROOM}[shard]\ngroup = \"us\"\ngroups = [\"eu\", \"us\"]\n"
        ))
        .unwrap();
        let shard = ok.shard.unwrap();
        assert_eq!((shard.name(), shard.canonical().as_str()), ("us", "eu,us"));
        assert_eq!(parse(ROOM).unwrap().shard, None, "no table: every room");
        for (table, names) in [
            (
                "group = \"ap\"\ngroups = [\"eu\", \"us\"]",
                "shard.group: this aggregator's group \"ap\" is not among them",
            ),
            (
                "group = \"eu\"\ngroups = [\"eu\", \"eu\"]",
                "shard.groups: \"eu\" is listed twice",
            ),
            (
                "group = \"eu\"\ngroups = []",
                "shard.groups: at least one group",
            ),
            (
                "group = \"e,u\"\ngroups = [\"e,u\"]",
                "shard.groups: \"e,u\" is not a group name",
            ),
            ("groups = [\"eu\"]", "shard.group: missing"),
        ] {
            let err = parse(&format!("{ROOM}[shard]\n{table}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(names), "{table}: {err}");
        }
    }

    #[test]
    fn an_unknown_queueing_method_is_named_with_its_line() {
        let err = parse(
            "[[rooms]]\nid = \"shop\"\ntotal_active_users = 10\nnew_users_per_minute = 5\nqueueing_method = \"lottery\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with(&format!(
                "agg.toml:{}:19: rooms[0].queueing_method: unknown variant `lottery`",
                FIRST_EXTRA_LINE + 4
            )),
            "{err}"
        );
    }

    #[test]
    fn node_keys_are_checked_by_the_same_rules_as_on_the_node() {
        let err = parse(
            "[[rooms]]\nid = \"shop\"\norigin = \"a:1\"\ntotal_active_users = 10\nnew_users_per_minute = 5\nqueue_status = 500\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("rooms[0].queue_status: 500 is not 200, 202 or 429"),
            "{err}"
        );
        let err = parse(
            "[[rooms]]\nid = \"shop\"\ntotal_active_users = 10\nnew_users_per_minute = 5\n[[rooms.pools]]\nname = \"p\"\norigins = [\"a:1\"]\nweigth = 2\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("rooms[0].pools[0].weigth: unknown field"),
            "{err}"
        );
    }

    #[test]
    fn the_deploy_example_is_valid() {
        let text = include_str!("../../deploy/aggregator.example.toml");
        let config = AggregatorConfig::parse(Path::new("aggregator.example.toml"), text).unwrap();
        assert_eq!(config.rooms[0].id, "shop");
    }
}
