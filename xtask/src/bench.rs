//! `cargo xtask bench`: admission latency under load, side by side with nginx.
//!
//! Starts the demo origin, `waitroom-edge` in front of it, and nginx as a plain
//! reverse proxy in front of the same origin (the peer operators would otherwise
//! use). Servers are pinned to core 0 and the load generator to core 1 where the
//! machine has two or more cores. Each scenario runs against both, in the same
//! run, so the figures that matter are the ratios waitroom ÷ nginx:
//! - (a) admitted visitors with a valid cookie, proxied to the origin;
//! - (b) new visitors, admitted and proxied;
//! - (c) queued visitors served the queue page (nginx: the same bytes, static);
//! - (d) apps polling with `Accept: application/json` (nginx: the same JSON, static).
//!
//! For each: requests per second at saturation (closed loop), and p50/p99/p99.9
//! at a fixed rate of half the slower server's saturation (open loop, latency
//! from the scheduled send time). Then (a) once more against a second node
//! with the access log on (JSON lines to a file): its cost as the ratio on ÷
//! off. Markdown on stdout, JSON in `target/bench/`.
//!
//! The criterion micro-benchmarks ([`CRITERION`]) are listed at the end of
//! every run; `--criterion` runs them instead (`--criterion NAME` only one).
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use crate::{cmd, setup};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Measured seconds per run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Connections of the load generator.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Skip `cargo xtask setup` (nginx must be installed).
    #[arg(long)]
    no_setup: bool,
    /// Skip the XDP overhead runs (they need root).
    #[arg(long)]
    no_xdp: bool,
    /// Only the XDP overhead runs.
    #[arg(long)]
    xdp_only: bool,
    /// Run the criterion micro-benchmarks instead (all of them, or the one
    /// named, e.g. `--criterion aggregation`).
    #[arg(long, num_args = 0..=1, default_missing_value = "all")]
    criterion: Option<String>,
}

/// The criterion benchmarks of the workspace: package, bench target, the
/// features it needs, and what it measures.
pub const CRITERION: &[(&str, &str, &str, &str)] = &[
    (
        "waitroom-common",
        "engine",
        "std",
        "one admission decision, with and without the ticket ledger",
    ),
    (
        "waitroom-common",
        "aggregation",
        "std",
        "one aggregation round: 100 / 1,000 / 10,000 node reports of 10 rooms through Cluster::apply",
    ),
    (
        "waitroom-edge",
        "hot_path",
        "",
        "the node's request path in process",
    ),
];

/// Runs the criterion benchmarks named by `which` ("all" for every one).
fn criterion(which: &str) -> Result<()> {
    let chosen: Vec<_> = CRITERION
        .iter()
        .filter(|(_, bench, _, _)| which == "all" || *bench == which)
        .collect();
    if chosen.is_empty() {
        let names: Vec<&str> = CRITERION.iter().map(|c| c.1).collect();
        bail!("no criterion bench {which:?}; there are {names:?}");
    }
    for (package, bench, features, what) in chosen {
        let mut c = cmd::cargo();
        c.args(["bench", "--package", package, "--bench", bench]);
        if !features.is_empty() {
            c.args(["--features", features]);
        }
        cmd::run(&format!("criterion bench {bench}: {what}"), &mut c)?;
    }
    Ok(())
}

/// Where to find the criterion benchmarks, printed after every run.
fn list_criterion() {
    println!("Criterion micro-benchmarks (`cargo xtask bench --criterion [NAME]`):");
    for (package, bench, features, what) in CRITERION {
        let features = if features.is_empty() {
            String::new()
        } else {
            format!(" --features {features}")
        };
        println!("    {bench}: {what} (cargo bench -p {package}{features} --bench {bench})");
    }
}

/// A server process stopped on drop.
struct Running {
    name: &'static str,
    child: Child,
}

impl Drop for Running {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own unreaped child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        eprintln!("    {} had to be killed", self.name);
    }
}

struct Scenario {
    key: &'static str,
    title: &'static str,
    waitroom_path: &'static str,
    nginx_path: &'static str,
    headers: Vec<String>,
}

pub fn run(args: &Args) -> Result<()> {
    if let Some(which) = &args.criterion {
        return criterion(which);
    }
    if !args.no_setup {
        setup::ensure_all(&[("nginx", "the reverse-proxy peer of cargo xtask bench")])?;
    }
    let root = cmd::workspace_root();
    cmd::run(
        "building release binaries (waitroom-edge, waitroom-loadgen, waitroom-demo-origin)",
        cmd::cargo().args([
            "build",
            "--release",
            "--package",
            "waitroom-edge",
            "--bin",
            "waitroom-edge",
            "--package",
            "waitroom-tests",
            "--bin",
            "waitroom-loadgen",
            "--bin",
            "waitroom-demo-origin",
        ]),
    )?;
    let bin = root.join("target/release");
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (server_cpu, load_cpu) = if cores >= 2 {
        (Some("0"), Some("1"))
    } else {
        (None, None)
    };

    let origin_port = free_port()?;
    let edge_port = free_port()?;
    let nginx_port = free_port()?;
    let _origin = start(
        "origin",
        pinned(server_cpu, &bin.join("waitroom-demo-origin"))
            .args(["--listen", &format!("127.0.0.1:{origin_port}")]),
    )?;
    wait_port(origin_port)?;
    let edge_cfg = out.join("edge.toml");
    std::fs::write(&edge_cfg, edge_config(&out, edge_port, origin_port))?;
    let _ = std::fs::remove_file(out.join("counters.shm"));
    let _edge = start(
        "waitroom-edge",
        pinned(server_cpu, &bin.join("waitroom-edge"))
            .arg("--config")
            .arg(&edge_cfg)
            .env("RUST_LOG", "warn"),
    )?;
    wait_port(edge_port)?;

    // The nginx peer serves the very bytes waitroom's queue answers carry.
    let page = fetch(edge_port, "/queue/page", None)?;
    let json_body = fetch(edge_port, "/queue/page", Some("application/json"))?;
    std::fs::write(out.join("queue.html"), &page)?;
    std::fs::write(out.join("queue.json"), &json_body)?;
    let nginx_conf = out.join("nginx.conf");
    std::fs::write(&nginx_conf, nginx_config(&out, nginx_port, origin_port))?;
    let _nginx = start(
        "nginx",
        pinned(server_cpu, Path::new("/usr/sbin/nginx"))
            .arg("-c")
            .arg(&nginx_conf)
            .args(["-g", "daemon off;"]),
    )?;
    wait_port(nginx_port)?;
    let cookie = admitted_cookie(edge_port)?;

    let scenarios = [
        Scenario {
            key: "a_admitted_with_cookie",
            title: "(a) admitted, valid cookie, proxied",
            waitroom_path: "/product/1",
            nginx_path: "/product/1",
            headers: vec![format!("Cookie: {cookie}")],
        },
        Scenario {
            key: "b_new_visitor_admitted",
            title: "(b) new visitor admitted, proxied",
            waitroom_path: "/product/1",
            nginx_path: "/product/1",
            headers: vec![],
        },
        Scenario {
            key: "c_queue_page",
            title: "(c) queued, queue page",
            waitroom_path: "/queue/page",
            nginx_path: "/queue/page",
            headers: vec![],
        },
        Scenario {
            key: "d_queue_json",
            title: "(d) queued app, JSON",
            waitroom_path: "/queue/page",
            nginx_path: "/queue/json",
            headers: vec!["Accept: application/json".into()],
        },
    ];

    let mut results = Vec::new();
    let xdp = if args.no_xdp {
        None
    } else if !cmd::is_root() {
        println!("    skipping the XDP overhead runs: they need root (a veth pair in a namespace)");
        None
    } else {
        Some(xdp_overhead(&bin, &out, origin_port, args)?)
    };
    let scenarios = if args.xdp_only {
        &scenarios[..0]
    } else {
        &scenarios[..]
    };
    for s in scenarios {
        cmd::step(&format!("scenario {}", s.title));
        let w_sat = load(
            &bin,
            load_cpu,
            edge_port,
            s.waitroom_path,
            &s.headers,
            0.0,
            args,
        )?;
        let n_sat = load(
            &bin,
            load_cpu,
            nginx_port,
            s.nginx_path,
            &s.headers,
            0.0,
            args,
        )?;
        let rate =
            (w_sat["rps"].as_f64().unwrap_or(0.0)).min(n_sat["rps"].as_f64().unwrap_or(0.0)) * 0.5;
        let w_fixed = load(
            &bin,
            load_cpu,
            edge_port,
            s.waitroom_path,
            &s.headers,
            rate,
            args,
        )?;
        let n_fixed = load(
            &bin,
            load_cpu,
            nginx_port,
            s.nginx_path,
            &s.headers,
            rate,
            args,
        )?;
        results.push(json!({
            "scenario": s.key,
            "title": s.title,
            "fixed_rate_rps": rate,
            "waitroom": {"saturation": w_sat, "fixed_rate": w_fixed},
            "nginx": {"saturation": n_sat, "fixed_rate": n_fixed},
        }));
    }
    let access_log = if args.xdp_only {
        None
    } else {
        Some(access_log_overhead(
            &bin,
            &out,
            origin_port,
            load_cpu,
            server_cpu,
            &results[0],
            args,
        )?)
    };
    let machine = machine();
    let report = json!({
        "machine": machine,
        "connections": args.connections,
        "seconds": args.seconds,
        "pinning": if server_cpu.is_some() { "servers on CPU 0, load generator on CPU 1" } else { "none (one core)" },
        "results": results,
        "xdp_overhead": xdp,
        "access_log_overhead": access_log,
    });
    let path = out.join("results.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    println!();
    println!("{}", markdown(&report));
    if let Some(x) = report.get("xdp_overhead").filter(|x| !x.is_null()) {
        println!("{}", xdp_markdown(x));
    }
    if let Some(x) = report.get("access_log_overhead").filter(|x| !x.is_null()) {
        println!("{}", access_log_markdown(x));
    }
    println!("JSON: {}", path.display());
    list_criterion();
    Ok(())
}

fn load(
    bin: &Path,
    cpu: Option<&str>,
    port: u16,
    path: &str,
    headers: &[String],
    rate: f64,
    args: &Args,
) -> Result<Value> {
    let mut c = pinned(cpu, &bin.join("waitroom-loadgen"));
    c.args(["--url", &format!("http://127.0.0.1:{port}{path}")])
        .args(["--connections", &args.connections.to_string()])
        .args(["--duration", &args.seconds.to_string()])
        .args(["--rate", &format!("{rate:.0}")]);
    for h in headers {
        c.args(["--header", h]);
    }
    let out = c
        .stderr(Stdio::inherit())
        .output()
        .context("running waitroom-loadgen")?;
    if !out.status.success() {
        bail!("waitroom-loadgen failed: {}", out.status);
    }
    let v: Value = serde_json::from_slice(&out.stdout).context("loadgen output")?;
    println!(
        "    port {port} {path}: {:>9.0} req/s  p50 {:>6} µs  p99 {:>6} µs  p99.9 {:>6} µs  ({}{})",
        v["rps"].as_f64().unwrap_or(0.0),
        v["p50_us"],
        v["p99_us"],
        v["p999_us"],
        v["mode"].as_str().unwrap_or(""),
        if v["errors"].as_u64().unwrap_or(0) > 0 {
            format!(", {} errors", v["errors"])
        } else {
            String::new()
        }
    );
    Ok(v)
}

fn markdown(report: &Value) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "Machine: {}. {}; {} connections, {} s per run.\n\n",
        report["machine"]["description"].as_str().unwrap_or("?"),
        report["pinning"].as_str().unwrap_or(""),
        report["connections"],
        report["seconds"]
    ));
    s.push_str("| scenario | waitroom req/s | nginx req/s | ratio | fixed rate | waitroom p50/p99/p99.9 µs | nginx p50/p99/p99.9 µs | p99 ratio |\n");
    s.push_str("|---|---:|---:|---:|---:|---|---|---:|\n");
    for r in report["results"].as_array().into_iter().flatten() {
        let w = &r["waitroom"];
        let n = &r["nginx"];
        let wr = w["saturation"]["rps"].as_f64().unwrap_or(0.0);
        let nr = n["saturation"]["rps"].as_f64().unwrap_or(0.0);
        let wp99 = w["fixed_rate"]["p99_us"].as_f64().unwrap_or(0.0);
        let np99 = n["fixed_rate"]["p99_us"].as_f64().unwrap_or(0.0);
        s.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.2} | {:.0}/s | {}/{}/{} | {}/{}/{} | {:.2} |\n",
            r["title"].as_str().unwrap_or(""),
            wr,
            nr,
            if nr > 0.0 { wr / nr } else { 0.0 },
            r["fixed_rate_rps"].as_f64().unwrap_or(0.0),
            w["fixed_rate"]["p50_us"],
            w["fixed_rate"]["p99_us"],
            w["fixed_rate"]["p999_us"],
            n["fixed_rate"]["p50_us"],
            n["fixed_rate"]["p99_us"],
            n["fixed_rate"]["p999_us"],
            if np99 > 0.0 { wp99 / np99 } else { 0.0 },
        ));
    }
    s
}

fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let kernel = cmd::output(Command::new("uname").arg("-r")).unwrap_or_default();
    json!({
        "cpu": cpu,
        "cores": cores,
        "kernel": kernel.trim(),
        "description": format!("{cores} × {cpu}, Linux {}", kernel.trim()),
    })
}

fn pinned(cpu: Option<&str>, program: &Path) -> Command {
    match cpu {
        Some(cpu) => {
            let mut c = Command::new("taskset");
            c.args(["-c", cpu]).arg(program);
            c
        }
        None => Command::new(program),
    }
}

fn start(name: &'static str, cmd: &mut Command) -> Result<Running> {
    let child = cmd
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    Ok(Running { name, child })
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn wait_port(port: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("nothing listens on 127.0.0.1:{port}")
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .http_status_as_error(false)
        .build()
        .into()
}

fn fetch(port: u16, path: &str, accept: Option<&str>) -> Result<Vec<u8>> {
    let mut req = agent().get(&format!("http://127.0.0.1:{port}{path}"));
    if let Some(a) = accept {
        req = req.header("Accept", a);
    }
    Ok(req.call()?.body_mut().read_to_vec()?)
}

/// A cookie of an admitted visitor (name=value), for scenario (a).
fn admitted_cookie(port: u16) -> Result<String> {
    let resp = agent().get(&format!("http://127.0.0.1:{port}/")).call()?;
    let set = resp
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .context("the admitted answer carried no cookie")?;
    Ok(set.split(';').next().unwrap_or_default().to_owned())
}

fn edge_config(dir: &Path, port: u16, origin: u16) -> String {
    let counters: PathBuf = dir.join("counters.shm");
    format!(
        r#"# cargo xtask bench: one worker, like nginx's one worker process.
[node]
id = "bench"
listen = "127.0.0.1:{port}"
workers = 1
counters_path = "{counters}"
max_connections_per_worker = 100000
# The load comes from one address and keeps no cookie in (b)-(d): the
# per-address limit on new tickets would answer most of it with 429.
new_tickets_per_address_per_minute = 0

[[rooms]]
id = "admit"
path = "/"
origin = "127.0.0.1:{origin}"
total_active_users = 1000000000
new_users_per_minute = 1000000000
session_duration = 10
# (a) replays one admitted cookie on all 32 connections of one load
# generator: over the ticket's connection budget (16) most requests would be
# served as new visitors (`ticket_shared`), and (a) would measure (b).
ticket_connection_budget = 0

[[rooms]]
id = "queue"
path = "/queue"
origin = "127.0.0.1:{origin}"
total_active_users = 1000
new_users_per_minute = 100
queue_all = true
"#,
        counters = counters.display()
    )
}

fn nginx_config(dir: &Path, port: u16, origin: u16) -> String {
    let d = dir.display();
    format!(
        r#"# cargo xtask bench: the peer, one worker like waitroom's one worker.
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 10000000;
    client_body_temp_path {d}/nginx-body;
    proxy_temp_path {d}/nginx-proxy;
    fastcgi_temp_path {d}/nginx-fastcgi;
    uwsgi_temp_path {d}/nginx-uwsgi;
    scgi_temp_path {d}/nginx-scgi;
    upstream origin {{ server 127.0.0.1:{origin}; keepalive 256; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        }}
        location = /queue/page {{ default_type "text/html; charset=utf-8"; alias {d}/queue.html; }}
        location = /queue/json {{ default_type application/json; alias {d}/queue.json; }}
    }}
}}
"#
    )
}

/// A veth pair into a namespace of the benchmark's own, removed on drop.
struct BenchNetns;

const NS: &str = "wr-bench";
const HOST_IF: &str = "wrb0";
const PEER_IF: &str = "wrb1";
const HOST_ADDR: &str = "198.18.100.1";
const PEER_ADDR: &str = "198.18.100.2";

impl BenchNetns {
    fn new() -> Result<Self> {
        let _ = Command::new("ip").args(["netns", "del", NS]).output();
        let _ = Command::new("ip").args(["link", "del", HOST_IF]).output();
        let this = Self;
        for args in [
            vec!["netns", "add", NS],
            vec![
                "link", "add", HOST_IF, "type", "veth", "peer", "name", PEER_IF,
            ],
            vec!["link", "set", PEER_IF, "netns", NS],
            vec!["addr", "add", &format!("{HOST_ADDR}/30"), "dev", HOST_IF],
            vec!["link", "set", HOST_IF, "up"],
            vec![
                "netns",
                "exec",
                NS,
                "ip",
                "addr",
                "add",
                &format!("{PEER_ADDR}/30"),
                "dev",
                PEER_IF,
            ],
            vec!["netns", "exec", NS, "ip", "link", "set", PEER_IF, "up"],
            vec!["netns", "exec", NS, "ip", "link", "set", "lo", "up"],
        ] {
            let out = Command::new("ip").args(&args).output()?;
            if !out.status.success() {
                bail!(
                    "ip {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        Ok(this)
    }
}

impl Drop for BenchNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", HOST_IF]).output();
        let _ = Command::new("ip").args(["netns", "del", NS]).output();
    }
}

/// Requests per second and latency through a veth pair, with the node's XDP
/// program attached to the receiving end and without it (issue 6's cost figure).
fn xdp_overhead(bin: &Path, out: &Path, origin_port: u16, args: &Args) -> Result<Value> {
    cmd::step("XDP overhead: the node behind a veth pair, program attached vs detached");
    let _ns = BenchNetns::new()?;
    let mut runs = serde_json::Map::new();
    for attached in [false, true] {
        let port = free_port()?;
        let mut cfg = edge_config(out, port, origin_port).replace(
            &format!("listen = \"127.0.0.1:{port}\""),
            &format!("listen = \"{HOST_ADDR}:{port}\""),
        );
        if attached {
            cfg.push_str(&format!(
                "\n[xdp]\ninterface = \"{HOST_IF}\"\nports = [{port}]\n"
            ));
        }
        let path = out.join(format!("edge-xdp-{attached}.toml"));
        std::fs::write(&path, cfg)?;
        let _ = std::fs::remove_file(out.join("counters.shm"));
        let _edge = start(
            "waitroom-edge (veth)",
            Command::new(bin.join("waitroom-edge"))
                .arg("--config")
                .arg(&path)
                .env("RUST_LOG", "warn"),
        )?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect((HOST_ADDR, port)).is_err() {
            if Instant::now() > deadline {
                bail!("the node did not listen on {HOST_ADDR}:{port}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if attached {
            let link = cmd::output(Command::new("ip").args(["link", "show", "dev", HOST_IF]))
                .unwrap_or_default();
            if !link.contains("xdp") {
                bail!("the node did not attach its XDP program to {HOST_IF}");
            }
        }
        let url = format!("http://{HOST_ADDR}:{port}/queue/page");
        let run = |rate: f64| -> Result<Value> {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", NS])
                .arg(bin.join("waitroom-loadgen"));
            c.args(["--url", &url])
                .args(["--connections", &args.connections.to_string()])
                .args(["--duration", &args.seconds.to_string()])
                .args(["--rate", &format!("{rate:.0}")]);
            let o = c.stderr(Stdio::inherit()).output()?;
            if !o.status.success() {
                bail!("waitroom-loadgen in the namespace failed: {}", o.status);
            }
            Ok(serde_json::from_slice(&o.stdout)?)
        };
        let sat = run(0.0)?;
        println!(
            "    XDP {}: {:>9.0} req/s at saturation",
            if attached { "attached" } else { "detached" },
            sat["rps"].as_f64().unwrap_or(0.0)
        );
        runs.insert(
            if attached { "attached" } else { "detached" }.into(),
            json!({"saturation": sat}),
        );
    }
    Ok(Value::Object(runs))
}

/// Scenario (a) against a second node with the access log on, compared with
/// (a)'s figures for the node with it off (`off`, one entry of `results`).
fn access_log_overhead(
    bin: &Path,
    out: &Path,
    origin_port: u16,
    load_cpu: Option<&str>,
    server_cpu: Option<&str>,
    off: &Value,
    args: &Args,
) -> Result<Value> {
    cmd::step("access log overhead: (a) with [node.access_log] on (JSON lines to a file)");
    let port = free_port()?;
    let log = out.join("access.log");
    let _ = std::fs::remove_file(&log);
    let mut cfg = edge_config(out, port, origin_port).replace("counters.shm", "counters-log.shm");
    cfg.push_str(&format!(
        "\n[node.access_log]\nenabled = true\npath = \"{}\"\nformat = \"json\"\n",
        log.display()
    ));
    let path = out.join("edge-access-log.toml");
    std::fs::write(&path, cfg)?;
    let _ = std::fs::remove_file(out.join("counters-log.shm"));
    let _ = std::fs::remove_file(out.join("counters-log.shm.tickets"));
    let _edge = start(
        "waitroom-edge (access log)",
        pinned(server_cpu, &bin.join("waitroom-edge"))
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", "warn"),
    )?;
    wait_port(port)?;
    let headers = vec![format!("Cookie: {}", admitted_cookie(port)?)];
    let sat = load(bin, load_cpu, port, "/product/1", &headers, 0.0, args)?;
    let rate = off["fixed_rate_rps"].as_f64().unwrap_or(0.0);
    let fixed = load(bin, load_cpu, port, "/product/1", &headers, rate, args)?;
    let lines = std::fs::read(&log).map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count());
    Ok(json!({
        "off": off["waitroom"],
        "on": {"saturation": sat, "fixed_rate": fixed},
        "fixed_rate_rps": rate,
        "lines_written": lines,
    }))
}

fn access_log_markdown(x: &Value) -> String {
    let rps = |v: &Value| v["saturation"]["rps"].as_f64().unwrap_or(0.0);
    let p99 = |v: &Value| v["fixed_rate"]["p99_us"].as_f64().unwrap_or(0.0);
    let (off, on) = (&x["off"], &x["on"]);
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    format!(
        "Access log, (a) admitted with a valid cookie ({} lines written):\n\n\
         | access log | req/s | p50/p99/p99.9 µs at {:.0}/s |\n|---|---:|---|\n\
         | off | {:.0} | {}/{}/{} |\n| on (JSON to a file) | {:.0} | {}/{}/{} |\n\
         | ratio on ÷ off | {:.3} | p99 {:.2} |\n",
        x["lines_written"],
        x["fixed_rate_rps"].as_f64().unwrap_or(0.0),
        rps(off),
        off["fixed_rate"]["p50_us"],
        off["fixed_rate"]["p99_us"],
        off["fixed_rate"]["p999_us"],
        rps(on),
        on["fixed_rate"]["p50_us"],
        on["fixed_rate"]["p99_us"],
        on["fixed_rate"]["p999_us"],
        ratio(rps(on), rps(off)),
        ratio(p99(on), p99(off)),
    )
}

fn xdp_markdown(x: &Value) -> String {
    let rps = |k: &str| x[k]["saturation"]["rps"].as_f64().unwrap_or(0.0);
    let p = |k: &str, q: &str| x[k]["saturation"][q].as_u64().unwrap_or(0);
    format!(
        "XDP overhead (queue page through a veth pair, load from inside a namespace):\n\n\
         | XDP program | req/s | p50/p99/p99.9 µs (saturation) |\n|---|---:|---|\n\
         | detached | {:.0} | {}/{}/{} |\n| attached | {:.0} | {}/{}/{} |\n\
         | attached ÷ detached | {:.3} | |\n",
        rps("detached"),
        p("detached", "p50_us"),
        p("detached", "p99_us"),
        p("detached", "p999_us"),
        rps("attached"),
        p("attached", "p50_us"),
        p("attached", "p99_us"),
        p("attached", "p999_us"),
        if rps("detached") > 0.0 {
            rps("attached") / rps("detached")
        } else {
            0.0
        },
    )
}
