//! A cluster for a test: development certificates, an aggregator process and
//! the config text of nodes that gossip with it.
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

use crate::procs::{Proc, binary, ready_field};

/// PEM files made by `waitroom-aggregator gen-certs`.
#[derive(Debug, Clone)]
pub struct Certs {
    pub dir: PathBuf,
}

impl Certs {
    /// A new CA with an aggregator certificate and one client certificate per
    /// name in `nodes`, written to `dir`. Each call makes a different CA.
    pub fn generate(dir: &Path, nodes: &[&str]) -> Result<Self> {
        let mut cmd = Command::new(binary("waitroom-aggregator"));
        cmd.arg("gen-certs").arg("--out").arg(dir);
        for node in nodes {
            cmd.arg("--name").arg(node);
        }
        let out = cmd
            .output()
            .context("running waitroom-aggregator gen-certs")?;
        if !out.status.success() {
            bail!("gen-certs failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(Self {
            dir: dir.to_owned(),
        })
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// `(cert, key)` of `name` (`"aggregator"` or a node).
    pub fn pair(&self, name: &str) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("{name}.pem")),
            self.dir.join(format!("{name}.key")),
        )
    }
}

/// A node name `prefix-N` whose first choice of home among `aggregators`
/// (before any answer: its rendezvous order, `gossip::home::Homes`) is the
/// one at index `home`.
pub fn named_homed_at(prefix: &str, aggregators: &[SocketAddr], home: usize) -> String {
    // The order depends on the name and the addresses only; the interval
    // (here any) sets how long an aggregator counts as answering.
    (1..1_000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|name| {
            waitroom_edge::gossip::home::Homes::new(name, aggregators.to_vec(), 1_000).current()
                == home
        })
        .expect("some name hashes to each aggregator")
}

/// A loopback address whose UDP port was free a moment ago.
pub fn free_udp_addr() -> Result<SocketAddr> {
    Ok(SocketAddr::from(([127, 0, 0, 1], free_udp_port()?)))
}

/// A loopback UDP port that was free a moment ago (QUIC listens on UDP).
pub fn free_udp_port() -> Result<u16> {
    Ok(std::net::UdpSocket::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The text of an aggregator config; `rooms` is one or more `[[rooms]]` tables.
pub fn aggregator_config(
    listen: SocketAddr,
    certs: &Certs,
    snapshot: &Path,
    rooms: &str,
) -> String {
    let (cert, key) = certs.pair("aggregator");
    format!(
        r#"listen = "{listen}"
admin_listen = "127.0.0.1:0"
ca = "{ca}"
cert = "{cert}"
key = "{key}"
snapshot_path = "{snapshot}"
snapshot_interval_ms = 300
node_timeout_ms = 15000

{rooms}
"#,
        ca = certs.ca().display(),
        cert = cert.display(),
        key = key.display(),
        snapshot = snapshot.display(),
    )
}

/// A node's whole config in a cluster: `[node]` named `name` in `colo`
/// (its counters in `dir`, `workers` workers, an admin listener on loopback
/// when `admin`), then `rooms` (one or more `[[rooms]]` tables; `origin` is
/// added to the last one) and the `[aggregator]` table `gossip`.
#[expect(
    clippy::too_many_arguments,
    reason = "every field a test varies, named at the call"
)]
pub fn node_config(
    dir: &Path,
    name: &str,
    colo: &str,
    workers: usize,
    admin: bool,
    rooms: &str,
    origin: SocketAddr,
    gossip: &str,
) -> String {
    let admin = if admin {
        "admin_listen = \"127.0.0.1:0\"\n"
    } else {
        ""
    };
    format!(
        r#"[node]
id = "{name}"
colo = "{colo}"
listen = "127.0.0.1:0"
{admin}workers = {workers}
counters_path = "{counters}"

{rooms}origin = "{origin}"

{gossip}"#,
        counters = dir.join(format!("{name}.shm")).display(),
    )
}

/// A `[[rooms]]` table `shop` that queues at random: every admission comes
/// from a shared pool, so a minute's admits over the nodes sum exactly.
pub fn random_room(total_active_users: u64, new_users_per_minute: u64) -> String {
    format!(
        "[[rooms]]\nid = \"shop\"\ntotal_active_users = {total_active_users}\n\
         new_users_per_minute = {new_users_per_minute}\nqueueing_method = \"random\"\n"
    )
}

/// Starts one node per `(name, colo)` of `nodes` (two workers, an admin
/// listener, the room tables `rooms` in front of `origin`), each reporting
/// every `interval_ms` to all of `aggregators` with its certificate from
/// `certs`.
pub fn start_nodes(
    dir: &Path,
    certs: &Certs,
    aggregators: &[SocketAddr],
    nodes: &[(&str, &str)],
    rooms: &str,
    origin: SocketAddr,
    interval_ms: u64,
) -> Vec<crate::edge::Edge> {
    start_nodes_with(
        dir,
        certs,
        aggregators,
        nodes,
        rooms,
        origin,
        interval_ms,
        "",
    )
}

/// As [`start_nodes`], with `gossip_lines` (e.g. `lease_wait_ms = 250\n`)
/// added to each node's `[aggregator]` table.
#[expect(
    clippy::too_many_arguments,
    reason = "start_nodes' arguments and the lines added"
)]
pub fn start_nodes_with(
    dir: &Path,
    certs: &Certs,
    aggregators: &[SocketAddr],
    nodes: &[(&str, &str)],
    rooms: &str,
    origin: SocketAddr,
    interval_ms: u64,
    gossip_lines: &str,
) -> Vec<crate::edge::Edge> {
    nodes
        .iter()
        .map(|&(name, colo)| {
            let gossip =
                node_gossip_table_many(aggregators, certs, certs, name, interval_ms) + gossip_lines;
            let config = node_config(dir, name, colo, 2, true, rooms, origin, &gossip);
            crate::edge::Edge::start(dir, name, &config).unwrap()
        })
        .collect()
}

/// The `[aggregator]` table of a node: its certificate `name` from `certs`,
/// trusting the CA in `trust`.
pub fn node_gossip_table(
    aggregator: SocketAddr,
    trust: &Certs,
    certs: &Certs,
    name: &str,
    interval_ms: u64,
) -> String {
    gossip_table(
        &format!("address = \"{aggregator}\""),
        trust,
        certs,
        name,
        interval_ms,
    )
}

/// The `[aggregator]` table of a node that reports to several aggregators
/// (`addresses`), otherwise as [`node_gossip_table`].
pub fn node_gossip_table_many(
    aggregators: &[SocketAddr],
    trust: &Certs,
    certs: &Certs,
    name: &str,
    interval_ms: u64,
) -> String {
    let list: Vec<String> = aggregators.iter().map(|a| format!("\"{a}\"")).collect();
    let target = format!("addresses = [{}]", list.join(", "));
    gossip_table(&target, trust, certs, name, interval_ms)
}

/// The `[aggregator]` table of a node whose rooms are sharded between
/// aggregator groups (`groups`: each group's name and aggregators),
/// otherwise as [`node_gossip_table`].
pub fn node_gossip_table_groups(
    groups: &[(&str, &[SocketAddr])],
    trust: &Certs,
    certs: &Certs,
    name: &str,
    interval_ms: u64,
) -> String {
    let groups: Vec<String> = groups
        .iter()
        .map(|(group, addresses)| {
            let list: Vec<String> = addresses.iter().map(|a| format!("\"{a}\"")).collect();
            format!(
                "{{ name = \"{group}\", addresses = [{}] }}",
                list.join(", ")
            )
        })
        .collect();
    let target = format!("groups = [{}]", groups.join(", "));
    gossip_table(&target, trust, certs, name, interval_ms)
}

fn gossip_table(
    target: &str,
    trust: &Certs,
    certs: &Certs,
    name: &str,
    interval_ms: u64,
) -> String {
    let (cert, key) = certs.pair(name);
    format!(
        r#"[aggregator]
{target}
server_name = "localhost"
ca = "{ca}"
cert = "{cert}"
key = "{key}"
interval_ms = {interval_ms}
stale_after_ms = {stale}
"#,
        ca = trust.ca().display(),
        cert = cert.display(),
        key = key.display(),
        stale = interval_ms * 6,
    )
}

/// A running `waitroom-aggregator`.
#[derive(Debug)]
pub struct Aggregator {
    pub proc: Proc,
    pub quic: SocketAddr,
    pub admin: SocketAddr,
    pub config: PathBuf,
}

impl Aggregator {
    /// Writes `config` to `dir/NAME.toml` and starts an aggregator with it.
    pub fn start(dir: &Path, name: &str, config: &str) -> Result<Self> {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, config)?;
        Self::start_with(dir, name, &path)
    }

    /// Starts an aggregator with an existing config file.
    pub fn start_with(dir: &Path, name: &str, path: &Path) -> Result<Self> {
        Self::start_in(dir, name, path, None)
    }

    /// Starts an aggregator with an existing config file inside the
    /// network namespace `netns` (`ip netns exec`, which execs it: the
    /// process killed is the aggregator).
    pub fn start_in(dir: &Path, name: &str, path: &Path, netns: Option<&str>) -> Result<Self> {
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns])
                    .arg(binary("waitroom-aggregator"));
                c
            }
            None => Command::new(binary("waitroom-aggregator")),
        };
        cmd.arg("--config").arg(path).env(
            "RUST_LOG",
            "info,waitroom_edge=debug,waitroom_aggregator::committer=debug",
        );
        let mut proc = Proc::spawn(name, cmd, dir)?;
        let line = proc.wait_line("waitroom-aggregator ready:", Duration::from_secs(20))?;
        Ok(Self {
            quic: ready_field(&line, "quic")?.parse()?,
            admin: ready_field(&line, "admin")?.parse()?,
            proc,
            config: path.to_owned(),
        })
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    /// `series` from this aggregator's `/metrics`.
    pub fn metric(&self, series: &str) -> Option<f64> {
        crate::edge::metric(&crate::edge::get_text(&self.admin_url("/metrics")), series)
    }
}

/// Writes a control API token file (`NAME TOKEN` lines), private as the
/// aggregator requires.
pub fn write_tokens(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, text).expect("writing the token file");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .expect("making the token file private");
}

/// An aggregator with the control API on (`control_token_file = tokens`)
/// and `rooms`, listening for gossip on a free loopback port; its config is
/// `dir/aggregator.toml`, its snapshot `dir/aggregator.json`.
pub fn controlled_aggregator(
    dir: &Path,
    certs: &Certs,
    tokens: &Path,
    rooms: &str,
) -> Result<(Aggregator, SocketAddr)> {
    let listen = free_udp_addr()?;
    let config = format!(
        "control_token_file = \"{}\"\n{}",
        tokens.display(),
        aggregator_config(listen, certs, &dir.join("aggregator.json"), rooms)
    );
    Ok((Aggregator::start(dir, "aggregator", &config)?, listen))
}

/// Runs `waitroom-aggregator ctl ARGS` against `aggregator` with the token
/// file `tokens`: (succeeded, stdout, stderr).
pub fn ctl(aggregator: &Aggregator, tokens: &Path, args: &[&str]) -> (bool, String, String) {
    ctl_all(&[aggregator.admin_url("")], tokens, args)
}

/// [`ctl`] against several aggregators at once, by their admin URLs
/// (`--url` for each).
pub fn ctl_all(urls: &[String], tokens: &Path, args: &[&str]) -> (bool, String, String) {
    let mut command = Command::new(binary("waitroom-aggregator"));
    command.arg("ctl");
    for url in urls {
        command.arg("--url").arg(url);
    }
    let out = command
        .arg("--token-file")
        .arg(tokens)
        .args(args)
        .output()
        .expect("running waitroom-aggregator ctl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
