//! `cargo xtask demo`: a waitroom node in front of a small demo shop, on loopback.
//!
//! Builds the binaries, writes a demo config under `target/demo/`, starts the demo
//! origin and the edge node, prints the URL, and stops everything on Ctrl-C.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::cmd;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Port for visitors.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Stop by itself after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    duration: Option<u64>,
    /// Build and run release binaries.
    #[arg(long)]
    release: bool,
    /// Do not start the built-in traffic generator.
    #[arg(long)]
    no_traffic: bool,
    /// One node and no aggregator (the smallest complete deployment).
    #[arg(long)]
    single: bool,
    /// Skip `cargo xtask setup` (when you know the machine is ready).
    #[arg(long)]
    no_setup: bool,
}

/// A started process that is stopped (SIGTERM, then SIGKILL) when dropped.
struct Service {
    name: &'static str,
    child: Child,
}

impl Service {
    fn start(name: &'static str, cmd: &mut Command) -> Result<Self> {
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name}: {cmd:?}"))?;
        Ok(Self { name, child })
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if self.exited().is_some() {
            return;
        }
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) on a pid we spawned and have not reaped yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.exited().is_some() {
                println!("    stopped {}", self.name);
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        println!("    killed {} (did not stop within 5 s)", self.name);
    }
}

pub fn run(args: &Args) -> Result<()> {
    // The README's first command on a fresh machine: the eBPF build needs
    // nightly rust-src and bpf-linker before anything else.
    if !args.no_setup {
        crate::setup::run()?;
    }
    let mut build = cmd::cargo();
    // The same build as `cargo xtask test` runs, so neither rebuilds for the other.
    build.args(["build", "--workspace", "--bins"]);
    if args.release {
        build.arg("--release");
    }
    cmd::run(
        "building waitroom-edge, waitroom-aggregator and the demo origin",
        &mut build,
    )?;
    // Where that build put them: `CARGO_TARGET_DIR` if set (else a stale
    // binary from an old `target/` would run).
    let bin_dir = cmd::target_dir().join(if args.release { "release" } else { "debug" });
    let edge = bin_dir.join("waitroom-edge");
    let aggregator = bin_dir.join("waitroom-aggregator");
    let origin = bin_dir.join("waitroom-demo-origin");

    let dir = cmd::target_dir().join("demo");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // A demo starts empty: counters and snapshots of an earlier run would still
    // hold that run's visitors (they survive restarts on purpose).
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path
            .extension()
            .is_some_and(|e| e == "counters" || e == "snapshot")
        {
            let _ = std::fs::remove_file(path);
        }
    }
    let p = Ports::from_base(args.port);
    let nodes: Vec<(&str, &str, u16, u16)> = if args.single {
        vec![("demo-ams-1", "ams", p.node_a, p.admin_a)]
    } else {
        vec![
            ("demo-ams-1", "ams", p.node_a, p.admin_a),
            ("demo-sin-1", "sin", p.node_b, p.admin_b),
        ]
    };
    let certs = dir.join("certs");
    // The aggregator takes each node's id from its certificate: one
    // certificate per node id.
    if !args.single
        && !nodes
            .iter()
            .all(|n| certs.join(format!("{}.pem", n.0)).exists())
    {
        let mut gen_certs = Command::new(&aggregator);
        gen_certs.arg("gen-certs").arg("--out").arg(&certs);
        for (id, ..) in &nodes {
            gen_certs.args(["--name", id]);
        }
        cmd::run(
            "making development certificates for the demo cluster",
            &mut gen_certs,
        )?;
    }

    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))
            .context("installing the Ctrl-C handler")?;
    }

    cmd::step("starting the demo origin, the aggregator and the edge nodes");
    let mut services = vec![Service::start(
        "demo origin",
        Command::new(&origin)
            .args(["--listen", &format!("127.0.0.1:{}", p.origin)])
            .stderr(log_file(&dir, "origin")?),
    )?];
    if !args.single {
        let config = dir.join("aggregator.toml");
        write_aggregator_config(&config, &dir, &p)?;
        services.push(Service::start(
            "aggregator",
            Command::new(&aggregator)
                .arg("--config")
                .arg(&config)
                .env("RUST_LOG", "info")
                .stdout(Stdio::null())
                .stderr(log_file(&dir, "aggregator")?),
        )?);
    }
    for (id, colo, port, admin) in &nodes {
        let config = dir.join(format!("{id}.toml"));
        let gossip = (!args.single).then_some((p.aggregator, certs.as_path()));
        write_edge_config(&config, &dir, id, colo, (*port, *admin, p.origin), gossip)?;
        services.push(Service::start(
            "edge node",
            Command::new(&edge)
                .arg("--config")
                .arg(&config)
                .env("RUST_LOG", "info")
                .stdout(Stdio::null())
                .stderr(log_file(&dir, id)?),
        )?);
    }
    for (_, _, port, _) in &nodes {
        wait_for_port(*port, Duration::from_secs(20))?;
    }
    println!();
    println!("    waitroom demo is up (room \"shop\": 20 visitors at once, 10 new per minute):");
    for (id, colo, port, admin) in &nodes {
        println!(
            "      {id} ({colo}):  open http://127.0.0.1:{port}/   metrics http://127.0.0.1:{admin}/metrics   dashboard http://127.0.0.1:{admin}/dashboard"
        );
    }
    if !args.single {
        println!(
            "      aggregator:        status http://127.0.0.1:{admin}/status   dashboard http://127.0.0.1:{admin}/dashboard (every node)",
            admin = p.aggregator_admin
        );
    }
    println!("      logs and configs:  {}", dir.display());
    println!("    press Ctrl-C to stop everything");
    println!();

    let traffic = (!args.no_traffic).then(|| {
        println!(
            "    simulated visitors arrive now (a rush, then a trickle); open a URL to join them"
        );
        let urls: Vec<String> = nodes
            .iter()
            .map(|n| format!("http://127.0.0.1:{}", n.2))
            .collect();
        let admins: Vec<String> = nodes
            .iter()
            .map(|n| format!("http://127.0.0.1:{}", n.3))
            .collect();
        let stop = Arc::clone(&stop);
        let limit = args.duration.map(Duration::from_secs);
        thread::spawn(move || crate::demo_traffic::run(&urls, &admins, &stop, limit))
    });
    let deadline = args
        .duration
        .map(|s| Instant::now() + Duration::from_secs(s));
    while !stop.load(Ordering::SeqCst) && deadline.is_none_or(|d| Instant::now() < d) {
        for s in &mut services {
            if let Some(status) = s.exited() {
                bail!(
                    "{} exited unexpectedly ({status}); see its log in {}",
                    s.name,
                    dir.display()
                );
            }
        }
        thread::sleep(Duration::from_millis(200));
    }
    cmd::step("stopping");
    stop.store(true, Ordering::SeqCst);
    if let Some(t) = traffic {
        let _ = t.join();
    }
    // Reverse start order: edges, then the aggregator, then the origin.
    while let Some(s) = services.pop() {
        drop(s);
    }
    Ok(())
}

/// The demo's ports, all on loopback, derived from `--port`.
struct Ports {
    node_a: u16,
    origin: u16,
    node_b: u16,
    admin_a: u16,
    admin_b: u16,
    aggregator: u16,
    aggregator_admin: u16,
}

impl Ports {
    fn from_base(base: u16) -> Self {
        Self {
            node_a: base,
            origin: base + 1,
            node_b: base + 2,
            admin_a: base + 10,
            admin_b: base + 12,
            aggregator: base + 20,
            aggregator_admin: base + 21,
        }
    }
}

fn log_file(dir: &Path, name: &str) -> Result<Stdio> {
    let f = std::fs::File::create(dir.join(format!("{name}.log")))
        .with_context(|| format!("creating {name}.log"))?;
    Ok(Stdio::from(f))
}

/// The demo's cookie key: the same on both nodes, so a visitor may move between them.
const DEMO_COOKIE_KEY: &str = "64656d6f2d6b65792d6e6f742d666f722d70726f64756374696f6e2d7573652d";

/// The room every demo config shares (the aggregator needs the same limits).
const DEMO_ROOM_LIMITS: &str = "total_active_users = 20
new_users_per_minute = 10
session_duration = 1
queueing_method = \"fifo\"
refresh_interval = 10
";

fn write_edge_config(
    path: &Path,
    dir: &Path,
    id: &str,
    colo: &str,
    (port, admin, origin): (u16, u16, u16),
    gossip: Option<(u16, &Path)>,
) -> Result<()> {
    let counters: PathBuf = dir.join(format!("{id}.counters"));
    let mut text = format!(
        r#"# Written by `cargo xtask demo`; low limits so the queue shows quickly.
[node]
id = "{id}"
colo = "{colo}"
listen = "127.0.0.1:{port}"
admin_listen = "127.0.0.1:{admin}"
workers = 1
counters_path = "{counters}"

[[node.cookie_keys]]
id = 1
secret_hex = "{DEMO_COOKIE_KEY}"

[[rooms]]
id = "shop"
host = "*"
path = "/"
origin = "127.0.0.1:{origin}"
{DEMO_ROOM_LIMITS}"#,
        counters = counters.display()
    );
    if let Some((aggregator, certs)) = gossip {
        text.push_str(&format!(
            r#"
[aggregator]
address = "127.0.0.1:{aggregator}"
ca = "{ca}"
cert = "{cert}"
key = "{key}"
"#,
            ca = certs.join("ca.pem").display(),
            cert = certs.join(format!("{id}.pem")).display(),
            key = certs.join(format!("{id}.key")).display(),
        ));
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn write_aggregator_config(path: &Path, dir: &Path, p: &Ports) -> Result<()> {
    let certs = dir.join("certs");
    let text = format!(
        r#"# Written by `cargo xtask demo`.
listen = "127.0.0.1:{quic}"
admin_listen = "127.0.0.1:{admin}"
ca = "{ca}"
cert = "{cert}"
key = "{key}"
snapshot_path = "{snapshot}"

[[rooms]]
id = "shop"
{DEMO_ROOM_LIMITS}"#,
        quic = p.aggregator,
        admin = p.aggregator_admin,
        ca = certs.join("ca.pem").display(),
        cert = certs.join("aggregator.pem").display(),
        key = certs.join("aggregator.key").display(),
        snapshot = dir.join("aggregator.snapshot").display(),
    );
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn wait_for_port(port: u16, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(100));
    }
    bail!("the edge node did not listen on 127.0.0.1:{port} within {limit:?}")
}
