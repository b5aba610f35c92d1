//! A real etcd cluster for a test (issue 20, docs/adr/0001): `n` members of
//! Debian's `etcd` on loopback ports nobody else holds, each with its own
//! data directory under a [`TempDir`], stopped when the guard drops (also
//! when a test panics). A member can be killed (`kill -9`), frozen
//! (`SIGSTOP`), thawed and restarted on its own data, as the fault tests need.
//!
//! [`Kv`] is the aggregator's client of etcd's v3 JSON gateway
//! (`waitroom_aggregator::ledger::Etcd`), with a deadline on every call.
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::procs::{Proc, TempDir, free_port};

/// Where Debian's `etcd-server` puts the binary.
const ETCD: &str = "/usr/bin/etcd";

/// Whether etcd is installed (`cargo xtask setup` installs `etcd-server`);
/// if not, says on stderr that the calling test skips and why.
#[track_caller]
#[must_use]
pub fn require_etcd() -> bool {
    if Path::new(ETCD).exists() {
        return true;
    }
    eprintln!(
        "skipping etcd test at {}: {ETCD} is missing; `cargo xtask setup` installs the Debian \
         package etcd-server (CI has it)",
        std::panic::Location::caller()
    );
    false
}

#[derive(Debug)]
struct Member {
    name: String,
    client: SocketAddr,
    peer: SocketAddr,
    data: PathBuf,
    proc: Option<Proc>,
}

/// A running etcd cluster; every member stops when it drops.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: TempDir,
}

impl EtcdCluster {
    /// Starts `n` members as one new cluster and waits until every one
    /// answers `/health` (at most 30 s).
    pub fn start(tag: &str, n: usize) -> Result<Self> {
        let dir = TempDir::new(tag);
        let mut members = Vec::with_capacity(n);
        for i in 0..n {
            let addr =
                |port: u16| -> Result<SocketAddr> { Ok(format!("127.0.0.1:{port}").parse()?) };
            members.push(Member {
                name: format!("m{i}"),
                client: addr(free_port()?)?,
                peer: addr(free_port()?)?,
                data: dir.path().join(format!("m{i}.data")),
                proc: None,
            });
        }
        let mut cluster = Self { members, dir };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        for i in 0..n {
            cluster.wait_healthy(i, Duration::from_secs(30))?;
        }
        Ok(cluster)
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts member `i` (on its existing data, if it has any: then the
    /// bootstrap flags are ignored, as etcd documents).
    fn spawn(&mut self, i: usize) -> Result<()> {
        let initial = self.initial_cluster();
        let m = &self.members[i];
        let mut cmd = Command::new(ETCD);
        cmd.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&m.data)
            .arg("--listen-client-urls")
            .arg(format!("http://{}", m.client))
            .arg("--advertise-client-urls")
            .arg(format!("http://{}", m.client))
            .arg("--listen-peer-urls")
            .arg(format!("http://{}", m.peer))
            .arg("--initial-advertise-peer-urls")
            .arg(format!("http://{}", m.peer))
            .arg("--initial-cluster")
            .arg(initial)
            .arg("--initial-cluster-state")
            .arg("new")
            .arg("--initial-cluster-token")
            // One token per cluster: members of two tests' clusters never
            // take each other for peers.
            .arg(self.dir.path().file_name().unwrap_or_default())
            // Fast elections: the fault tests wait for them.
            .arg("--heartbeat-interval")
            .arg("50")
            .arg("--election-timeout")
            .arg("500");
        let proc = Proc::spawn(&m.name, cmd, self.dir.path())
            .with_context(|| format!("starting etcd member {}", m.name))?;
        self.members[i].proc = Some(proc);
        Ok(())
    }

    /// Waits until member `i` says it is healthy (it has a leader).
    pub fn wait_healthy(&self, i: usize, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        let url = format!("http://{}/health", self.members[i].client);
        let agent = agent(Duration::from_millis(500));
        loop {
            let healthy = agent
                .get(&url)
                .call()
                .ok()
                .and_then(|mut r| r.body_mut().read_to_string().ok())
                .is_some_and(|b| b.contains("\"health\":\"true\""));
            if healthy {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let log = self.members[i]
                    .proc
                    .as_ref()
                    .map(Proc::stderr)
                    .unwrap_or_default();
                let tail: String = log.lines().rev().take(10).collect::<Vec<_>>().join("\n");
                bail!("etcd member m{i} not healthy within {limit:?}; its log ends:\n{tail}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every member's client URL, `http://127.0.0.1:PORT`.
    #[must_use]
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://{}", m.client))
            .collect()
    }

    /// `kill -9` of member `i`, as a crash.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].proc.take() {
            p.kill();
        }
    }

    /// Starts member `i` again on its own data, after [`Self::kill`].
    pub fn restart(&mut self, i: usize) -> Result<()> {
        self.kill(i);
        self.spawn(i)
    }

    /// `SIGSTOP` (`true`) or `SIGCONT` (`false`) to member `i`.
    pub fn freeze(&mut self, i: usize, frozen: bool) {
        if let Some(proc) = self.members[i].proc.as_mut() {
            proc.freeze(frozen);
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            // SIGKILL, which a frozen member sees too.
            self.kill(i);
        }
    }
}

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .build()
        .into()
}

/// The v3 JSON gateway of a cluster, as the aggregator's ledger speaks it:
/// each call tries the endpoints in turn, each with its timeout.
pub use waitroom_aggregator::ledger::{Entry, Etcd as Kv};

/// Every version of `key` still in etcd's history (no compaction in the
/// tests' clusters), oldest first, each with its revision: what every
/// compare-and-swap on it wrote, for a checker. Asks `endpoint` only.
pub fn history(endpoint: &str, key: &str) -> Result<Vec<(i64, Vec<u8>)>> {
    use base64::{Engine as _, engine::general_purpose::STANDARD as B64};
    let agent = agent(Duration::from_secs(5));
    let mut versions = Vec::new();
    // Read at the newest revision, then just before each version's own.
    let mut at: Option<i64> = None;
    loop {
        let mut body = serde_json::json!({ "key": B64.encode(key) });
        if let Some(revision) = at {
            body["revision"] = serde_json::Value::String(revision.to_string());
        }
        let mut resp = agent
            .post(&format!("{endpoint}/v3/kv/range"))
            .send(body.to_string())?;
        let text = resp.body_mut().read_to_string()?;
        let answer: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("range answer {text}"))?;
        let Some(kv) = answer["kvs"].get(0) else {
            break;
        };
        let revision: i64 = kv["mod_revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .with_context(|| format!("no mod_revision in {kv}"))?;
        let value = B64.decode(kv["value"].as_str().unwrap_or(""))?;
        versions.push((revision, value));
        if revision <= 1 || versions.len() >= 100_000 {
            break;
        }
        at = Some(revision - 1);
    }
    versions.reverse();
    Ok(versions)
}
