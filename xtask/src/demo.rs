//! `cargo xtask demo`: a waitroom node in front of a small demo shop, on loopback.
//!
//! Builds the binaries, writes a demo config under `target/demo/`, starts the demo
//! origin and the edge node, prints the URL, and stops everything on Ctrl-C.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command},
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
    let root = cmd::workspace_root();
    let mut build = cmd::cargo();
    build.args(["build", "--package", "waitroom-edge", "--bins"]);
    if args.release {
        build.arg("--release");
    }
    cmd::run("building waitroom-edge", &mut build)?;
    let bin_dir = root
        .join("target")
        .join(if args.release { "release" } else { "debug" });
    let edge = bin_dir.join("waitroom-edge");

    let demo_dir = root.join("target").join("demo");
    std::fs::create_dir_all(&demo_dir).context("creating target/demo")?;
    let origin_port = args.port + 1;
    let admin_port = args.port + 10;
    let config = demo_dir.join("edge.toml");
    write_config(&config, &demo_dir, args.port, origin_port, admin_port)?;

    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))
            .context("installing the Ctrl-C handler")?;
    }

    cmd::step("starting the demo origin and the edge node");
    let mut services = vec![
        Service::start(
            "demo origin",
            Command::new(&edge).args([
                "demo-origin",
                "--listen",
                &format!("127.0.0.1:{origin_port}"),
            ]),
        )?,
        Service::start(
            "edge node",
            Command::new(&edge)
                .args(["run", "--config"])
                .arg(&config)
                .env("RUST_LOG", "info"),
        )?,
    ];
    wait_for_port(args.port, Duration::from_secs(20))?;
    println!();
    println!("    waitroom demo is up:");
    println!("      open   http://127.0.0.1:{}/", args.port);
    println!("      admin  http://127.0.0.1:{admin_port}/metrics");
    println!("      config {}", config.display());
    println!("    press Ctrl-C to stop everything");
    println!();

    let traffic = (!args.no_traffic).then(|| {
        println!(
            "    simulated visitors arrive now (a rush, then a trickle); open the URL to join them"
        );
        let nodes = vec![format!("http://127.0.0.1:{}", args.port)];
        let admins = vec![format!("http://127.0.0.1:{admin_port}")];
        let stop = Arc::clone(&stop);
        let limit = args.duration.map(Duration::from_secs);
        thread::spawn(move || crate::demo_traffic::run(&nodes, &admins, &stop, limit))
    });
    let deadline = args
        .duration
        .map(|s| Instant::now() + Duration::from_secs(s));
    while !stop.load(Ordering::SeqCst) && deadline.is_none_or(|d| Instant::now() < d) {
        for s in &mut services {
            if let Some(status) = s.exited() {
                bail!("{} exited unexpectedly ({status})", s.name);
            }
        }
        thread::sleep(Duration::from_millis(200));
    }
    cmd::step("stopping");
    stop.store(true, Ordering::SeqCst);
    if let Some(t) = traffic {
        let _ = t.join();
    }
    // Drop in reverse start order: the edge before its origin.
    while let Some(s) = services.pop() {
        drop(s);
    }
    Ok(())
}

fn write_config(
    path: &Path,
    demo_dir: &Path,
    port: u16,
    origin_port: u16,
    admin_port: u16,
) -> Result<()> {
    let counters: PathBuf = demo_dir.join("counters.shm");
    let text = format!(
        r#"# Written by `cargo xtask demo`; low limits so the queue shows quickly.
[node]
id = "demo-1"
colo = "local"
listen = "127.0.0.1:{port}"
admin_listen = "127.0.0.1:{admin_port}"
counters_path = "{counters}"

[[rooms]]
id = "shop"
host = "*"
path = "/"
origin = "127.0.0.1:{origin_port}"
total_active_users = 20
new_users_per_minute = 10
session_duration = 1
queueing_method = "fifo"
refresh_interval = 10
"#,
        counters = counters.display()
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
