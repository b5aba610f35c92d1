//! The grant ledger in etcd (issue 20, docs/adr/0001, step 2): a client
//! for etcd's v3 JSON gateway and the compare-and-swap loop that commits
//! one aggregator's grants of a round
//! ([`GrantLedger`]) to the
//! room's and minute's key.
//!
//! # Why the JSON gateway, blocking
//! etcd 3.4 (Debian's `etcd-server`) serves `POST /v3/kv/range` and
//! `/v3/kv/txn` as JSON, keys and values in base64: no gRPC or protoc in
//! the build. An aggregator writes once per room per round (not per node),
//! so a blocking client on `spawn_blocking` costs nothing that matters and
//! keeps the deadlines plain: every call has one per member, and a commit
//! one over all its attempts.
//!
//! # Outcomes a client must tell apart
//! - the compare failed: another aggregator wrote first; read again and
//!   apply the batch to what it wrote;
//! - the call failed after it was sent (the member died, the reply was
//!   lost): the write may or may not have happened; read again, and the
//!   batch ids in the value tell (`GrantLedger::applied`);
//! - no member answers within the deadline (no quorum, all partitioned): an
//!   error, never a hang; the aggregator then grants nothing new and nodes
//!   decide on their last share (docs/adr/0001, decision 6).
use std::time::{Duration, Instant};

use base64::{Engine as _, engine::general_purpose::STANDARD as B64};
use serde_json::{Value, json};
use waitroom_common::{
    cluster::grants::{Ask, GrantLedger},
    time::Minute,
};

/// Compare-and-swap attempts per commit before it gives up as contended.
pub const MAX_ATTEMPTS: u32 = 16;

/// The key that fences the ledger: the epoch every aggregator of the
/// cluster commits under (`ledger.epoch`), as a decimal number, followed by
/// ` groups=` and the aggregator groups' names when rooms are sharded
/// (`[shard]`; `2 groups=eu,us`), so an aggregator with another list of
/// groups, which would own other rooms, is fenced too. Each commit
/// compares it in the same transaction, so an aggregator left at another
/// epoch (an epoch change under way, a mistyped config) cannot write: it
/// would keep a ledger of its own and grant the same slots again. The first
/// aggregator to commit writes it when it is absent.
pub const EPOCH_KEY: &str = "/waitroom/epoch";

/// Why a ledger call failed.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("no etcd member answered {what}: {errors}")]
    Unreachable { what: &'static str, errors: String },
    #[error(
        "etcd key {key}: the stored grant ledger does not decode ({detail}); refusing to grant from it"
    )]
    Corrupt { key: String, detail: String },
    #[error("etcd key {key}: still changing after {attempts} compare-and-swap attempts")]
    Contended { key: String, attempts: u32 },
    #[error("etcd key {key}: no commit within {deadline:?} (last error: {last})")]
    Deadline {
        key: String,
        deadline: Duration,
        last: String,
    },
    #[error("etcd answered {what} with {detail}")]
    Protocol { what: &'static str, detail: String },
    #[error(
        "fenced: this aggregator commits under {ours:?} (ledger.epoch, and shard.groups if set) but etcd's {EPOCH_KEY} is {theirs:?}; it grants nothing new until it runs with the epoch and groups written there (an epoch change under way, or a mistyped epoch or list of groups)"
    )]
    Fenced { ours: String, theirs: String },
}

/// What a fenced compare-and-swap did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Swap {
    /// Written.
    Written,
    /// The key moved since the revision read: another writer was first.
    Moved,
    /// The fence holds another value (`None`: no fence yet).
    Fenced(Option<Vec<u8>>),
}

/// A key's value and the revision it was last changed at (0: no such key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub value: Option<Vec<u8>>,
    pub mod_revision: i64,
}

/// etcd's v3 JSON gateway: each call tries the members in turn, each with
/// the call timeout, and fails when none answered. A call starts at the
/// member that answered last, so a member that hangs (or answers past the
/// timeout) costs one timeout, not one on every call: a commit is two
/// calls, and two timeouts of the default 200 ms nearly fill its 500 ms.
#[derive(Debug)]
pub struct Etcd {
    endpoints: Vec<String>,
    agent: ureq::Agent,
    /// The member that answered last.
    preferred: std::sync::atomic::AtomicUsize,
    call_timeout: Duration,
}

impl Etcd {
    /// `endpoints` are the members' client URLs (`http://host:port`).
    #[must_use]
    pub fn new(endpoints: Vec<String>, call_timeout: Duration) -> Self {
        Self {
            endpoints,
            agent: ureq::Agent::config_builder()
                .timeout_global(Some(call_timeout))
                .http_status_as_error(false)
                .build()
                .into(),
            preferred: std::sync::atomic::AtomicUsize::new(0),
            call_timeout,
        }
    }

    /// One call, each member tried with the call timeout, none past `until`
    /// (a commit's deadline: with every member hung, trying them all would
    /// otherwise take members × call timeout, past the nodes' wait).
    fn call(
        &self,
        what: &'static str,
        path: &str,
        body: &Value,
        until: Option<Instant>,
    ) -> Result<Value, LedgerError> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut errors = Vec::new();
        let first = self.preferred.load(Relaxed);
        let n = self.endpoints.len();
        for i in (0..n).map(|k| (first + k) % n) {
            let endpoint = &self.endpoints[i];
            let timeout = until.map_or(self.call_timeout, |u| {
                u.saturating_duration_since(Instant::now())
                    .min(self.call_timeout)
            });
            if timeout.is_zero() {
                errors.push(format!("{endpoint}: not tried, the deadline passed"));
                break;
            }
            let url = format!("{endpoint}{path}");
            let request = self
                .agent
                .post(&url)
                .config()
                .timeout_global(Some(timeout))
                .build();
            match request.send(body.to_string()) {
                Ok(mut resp) => {
                    let status = resp.status();
                    let text = resp.body_mut().read_to_string().unwrap_or_default();
                    if status.is_success() {
                        self.preferred.store(i, Relaxed);
                        return serde_json::from_str(&text).map_err(|e| LedgerError::Protocol {
                            what,
                            detail: format!("a body that is not JSON ({e})"),
                        });
                    }
                    errors.push(format!("{endpoint}: {status} {}", text.trim()));
                }
                Err(e) => errors.push(format!("{endpoint}: {e}")),
            }
        }
        Err(LedgerError::Unreachable {
            what,
            errors: errors.join("; "),
        })
    }

    /// The value of `key` and its revision.
    pub fn get(&self, key: &str) -> Result<Entry, LedgerError> {
        self.get_by(key, None)
    }

    /// [`Etcd::get`], given up at `until`.
    fn get_by(&self, key: &str, until: Option<Instant>) -> Result<Entry, LedgerError> {
        let answer = self.call(
            "a range",
            "/v3/kv/range",
            &json!({ "key": B64.encode(key) }),
            until,
        )?;
        let Some(kv) = answer["kvs"].get(0) else {
            return Ok(Entry {
                value: None,
                mod_revision: 0,
            });
        };
        let protocol = |detail: String| LedgerError::Protocol {
            what: "a range",
            detail,
        };
        let value = B64
            .decode(kv["value"].as_str().unwrap_or(""))
            .map_err(|e| protocol(format!("a value that is not base64 ({e})")))?;
        let mod_revision = kv["mod_revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .ok_or_else(|| protocol(format!("no mod_revision in {kv}")))?;
        Ok(Entry {
            value: Some(value),
            mod_revision,
        })
    }

    /// Writes `value` to `key` only if the key is still at `mod_revision`
    /// (0: the key does not exist): compare-and-swap. True if written.
    pub fn swap(&self, key: &str, mod_revision: i64, value: &[u8]) -> Result<bool, LedgerError> {
        Ok(self.swap_by(key, mod_revision, value, None, None)? == Swap::Written)
    }

    /// [`Etcd::swap`], also requiring `fence` (a key and the value it must
    /// hold) in the same transaction, given up at `until`; when a compare
    /// fails, says which.
    fn swap_by(
        &self,
        key: &str,
        mod_revision: i64,
        value: &[u8],
        fence: Option<(&str, &[u8])>,
        until: Option<Instant>,
    ) -> Result<Swap, LedgerError> {
        let key = B64.encode(key);
        let mut compare = vec![json!({
            "key": key,
            "target": "MOD",
            "result": "EQUAL",
            "mod_revision": mod_revision.to_string(),
        })];
        let mut failure = Vec::new();
        if let Some((fence, expected)) = fence {
            let fence = B64.encode(fence);
            compare.push(json!({
                "key": fence,
                "target": "VALUE",
                "result": "EQUAL",
                "value": B64.encode(expected),
            }));
            failure.push(json!({ "request_range": { "key": fence } }));
        }
        let answer = self.call(
            "a transaction",
            "/v3/kv/txn",
            &json!({
                "compare": compare,
                "success": [{ "request_put": { "key": key, "value": B64.encode(value) } }],
                "failure": failure,
            }),
            until,
        )?;
        if answer["succeeded"].as_bool().unwrap_or(false) {
            return Ok(Swap::Written);
        }
        let Some((_, expected)) = fence else {
            return Ok(Swap::Moved);
        };
        let held = answer["responses"][0]["response_range"]["kvs"]
            .get(0)
            .map(|kv| B64.decode(kv["value"].as_str().unwrap_or("")))
            .transpose()
            .map_err(|e| LedgerError::Protocol {
                what: "a transaction",
                detail: format!("a fence value that is not base64 ({e})"),
            })?;
        Ok(match held {
            Some(held) if held == expected => Swap::Moved,
            other => Swap::Fenced(other),
        })
    }

    /// Writes `value` to `key` only if the key does not exist, given up at
    /// `until`; true if written.
    fn create_by(
        &self,
        key: &str,
        value: &[u8],
        until: Option<Instant>,
    ) -> Result<bool, LedgerError> {
        let key = B64.encode(key);
        let answer = self.call(
            "a create",
            "/v3/kv/txn",
            &json!({
                "compare": [{
                    "key": key,
                    "target": "CREATE",
                    "result": "EQUAL",
                    "create_revision": "0",
                }],
                "success": [{ "request_put": { "key": key, "value": B64.encode(value) } }],
            }),
            until,
        )?;
        Ok(answer["succeeded"].as_bool().unwrap_or(false))
    }
}

impl Etcd {
    /// Deletes every key from `from` up to, not including, `to`; the number
    /// deleted.
    pub fn delete_range(&self, from: &str, to: &str) -> Result<u64, LedgerError> {
        let answer = self.call(
            "a delete",
            "/v3/kv/deleterange",
            &json!({ "key": B64.encode(from), "range_end": B64.encode(to) }),
            None,
        )?;
        Ok(answer["deleted"]
            .as_str()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0))
    }
}

/// The grant ledger of every room and minute, in etcd.
#[derive(Debug)]
pub struct EtcdLedger {
    etcd: Etcd,
    /// The longest a commit may take over all its attempts.
    deadline: Duration,
    /// The epoch its commits are fenced by ([`EPOCH_KEY`]); `None`: no fence.
    epoch: Option<u64>,
    /// The aggregator groups' names (`Membership::canonical`), written
    /// into the fence after the epoch; `None`: rooms not sharded.
    groups: Option<String>,
}

impl EtcdLedger {
    #[must_use]
    pub fn new(etcd: Etcd, deadline: Duration) -> Self {
        Self {
            etcd,
            deadline,
            epoch: None,
            groups: None,
        }
    }

    /// The fence also names the aggregator groups (`Membership::canonical`):
    /// an aggregator with another list under the same epoch is refused.
    #[must_use]
    pub fn sharded(mut self, groups: String) -> Self {
        self.groups = Some(groups);
        self
    }

    /// The fence's value for this aggregator (see [`EPOCH_KEY`]).
    fn fence(&self) -> Option<String> {
        let epoch = self.epoch?;
        Some(match &self.groups {
            Some(groups) => format!("{epoch} groups={groups}"),
            None => epoch.to_string(),
        })
    }

    /// Commits only while etcd's [`EPOCH_KEY`] is `epoch` (writing it when
    /// absent); and a room's first commit of a minute under `epoch` starts
    /// from that minute's ledger under `epoch - 1`, if any, so a change of
    /// epoch inside a minute grants nothing twice (epochs go up by one).
    #[must_use]
    pub fn fenced(mut self, epoch: u64) -> Self {
        self.epoch = Some(epoch);
        self
    }

    /// Reads the fence: `Err(Fenced)` when etcd's [`EPOCH_KEY`] holds
    /// another value than this aggregator's, so it could commit nothing;
    /// `Ok` when it holds ours, is absent (the first commit writes it), or
    /// this ledger is not fenced.
    pub fn check_fence(&self) -> Result<(), LedgerError> {
        let Some(ours) = self.fence() else {
            return Ok(());
        };
        match self.etcd.get(EPOCH_KEY)?.value {
            Some(theirs) if theirs != ours.as_bytes() => Err(LedgerError::Fenced {
                ours,
                theirs: String::from_utf8_lossy(&theirs).into_owned(),
            }),
            _ => Ok(()),
        }
    }

    /// The key of a room's shared grants (colo shares and Anywhere, one cap
    /// per node) in a minute, under the epoch of the aggregator group that
    /// owns the room (docs/adr/0001, decision 5).
    #[must_use]
    pub fn key(epoch: u64, room: &str, minute: Minute) -> String {
        format!("/waitroom/{epoch}/{room}/{}/shared", minute.0)
    }

    /// Deletes `room`'s ledgers of every minute before `minute`: a key is
    /// written for every room and minute, and none is read once its minute
    /// is over. Returns how many were deleted.
    pub fn forget_before(
        &self,
        epoch: u64,
        room: &str,
        minute: Minute,
    ) -> Result<u64, LedgerError> {
        // Minutes since 1970 have the same number of digits for centuries,
        // so the keys of earlier minutes sort before this one's.
        let prefix = format!("/waitroom/{epoch}/{room}/");
        self.etcd
            .delete_range(&prefix, &format!("{prefix}{}", minute.0))
    }

    /// The same room's and minute's key under the epoch before this one
    /// (with a fence above 1).
    fn previous_epoch_key(&self, key: &str) -> Option<String> {
        let epoch = self.epoch.filter(|&e| e > 1)?;
        let ours = format!("/waitroom/{epoch}/");
        key.strip_prefix(&ours)
            .map(|rest| format!("/waitroom/{}/{rest}", epoch - 1))
    }

    /// The ledger at `key` and its revision (empty at revision 0 when absent).
    pub fn read(&self, key: &str) -> Result<(GrantLedger, i64), LedgerError> {
        self.read_by(key, None)
    }

    /// [`EtcdLedger::read`], given up at `until`.
    fn read_by(
        &self,
        key: &str,
        until: Option<Instant>,
    ) -> Result<(GrantLedger, i64), LedgerError> {
        let entry = self.etcd.get_by(key, until)?;
        let ledger = match &entry.value {
            None => GrantLedger::default(),
            Some(bytes) => serde_json::from_slice(bytes).map_err(|e| LedgerError::Corrupt {
                key: key.to_owned(),
                detail: e.to_string(),
            })?,
        };
        Ok((ledger, entry.mod_revision))
    }

    /// Commits the batch `batch_id` (each node's cap asked, in order) to the
    /// ledger at `key`, each cap cut so that all caps stay within its ask's pool,
    /// and returns the caps set, once they are durable: read, apply, write
    /// if nobody wrote since, else again. A batch the ledger already holds
    /// (a retry after a lost reply) returns what it got then.
    pub fn commit(
        &self,
        key: &str,
        batch_id: &str,
        asks: &[Ask],
    ) -> Result<Vec<(String, u64)>, LedgerError> {
        let started = Instant::now();
        let until = Some(started + self.deadline);
        // The fence's expected value, with an epoch.
        let fence = self.fence();
        let mut last = String::from("none");
        for _ in 0..MAX_ATTEMPTS {
            if started.elapsed() >= self.deadline {
                return Err(LedgerError::Deadline {
                    key: key.to_owned(),
                    deadline: self.deadline,
                    last,
                });
            }
            let (mut ledger, revision) = match self.read_by(key, until) {
                Ok(read) => read,
                Err(err @ LedgerError::Corrupt { .. }) => return Err(err),
                Err(err) => {
                    last = err.to_string();
                    continue;
                }
            };
            if revision == 0
                && let Some(previous) = self.previous_epoch_key(key)
            {
                match self.read_by(&previous, until) {
                    Ok((earlier, r)) if r > 0 => ledger = earlier,
                    Ok(_) => {}
                    Err(err @ LedgerError::Corrupt { .. }) => return Err(err),
                    Err(err) => {
                        last = err.to_string();
                        continue;
                    }
                }
            }
            if let Some(done) = ledger.applied(batch_id) {
                return Ok(done.to_vec());
            }
            let set = ledger.apply_asks(batch_id, asks);
            let bytes = serde_json::to_vec(&ledger).map_err(|e| LedgerError::Protocol {
                what: "an encoding",
                detail: e.to_string(),
            })?;
            match self.etcd.swap_by(
                key,
                revision,
                &bytes,
                fence.as_deref().map(|f| (EPOCH_KEY, f.as_bytes())),
                until,
            ) {
                Ok(Swap::Written) => return Ok(set),
                // Another writer was first, or (a retry inside the gateway
                // after a lost reply) this one: the next read tells.
                Ok(Swap::Moved) => last = "a compare failed".into(),
                // No fence yet: the first aggregator to commit sets it.
                Ok(Swap::Fenced(None)) => {
                    let ours = fence.as_deref().unwrap_or_default();
                    match self.etcd.create_by(EPOCH_KEY, ours.as_bytes(), until) {
                        Ok(_) => last = format!("{EPOCH_KEY} was absent; written"),
                        Err(err) => last = err.to_string(),
                    }
                }
                Ok(Swap::Fenced(Some(theirs))) => {
                    return Err(LedgerError::Fenced {
                        ours: fence.unwrap_or_default(),
                        theirs: String::from_utf8_lossy(&theirs).into_owned(),
                    });
                }
                // Sent or not: the next read tells.
                Err(err) => last = err.to_string(),
            }
        }
        Err(LedgerError::Contended {
            key: key.to_owned(),
            attempts: MAX_ATTEMPTS,
        })
    }
}
