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

/// `cargo xtask bench`. The default run measures scenarios a, b, c, d on the
/// fast origin and (a) on the demo origin, with both load generators, for 1
/// and 2 workers, then the XDP runs (as root) and the access log's cost:
/// about 11 minutes. `--workers 1 --generators loadgen` takes about a quarter
/// of that.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Measured seconds per run.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Saturation rounds per scenario and generator, waitroom and nginx in
    /// turn (the order alternating); the ratio reported is the median
    /// round's. The fixed-rate runs are one round.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Connections of the load generator.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Scenarios: a, b, c, d (proxied ones to the fast origin, an nginx
    /// `return 200`), a-demo, b-demo (the same to the demo origin).
    #[arg(long, value_delimiter = ',', default_value = "a,b,c,d,a-demo")]
    scenarios: Vec<String>,
    /// Load generators: `loadgen` (ours, tests/src/bin/waitroom-loadgen.rs)
    /// and `wrk` (Debian's; installed if missing). Fixed-rate latency always
    /// comes from `loadgen` (wrk has no fixed-rate mode).
    #[arg(long, value_delimiter = ',', default_value = "loadgen,wrk")]
    generators: Vec<String>,
    /// Worker counts, each against nginx with as many worker processes.
    /// 1: servers pinned to CPU 0, generator (one thread) to CPU 1.
    /// 2: nothing pinned; servers and generator (two threads) share both cores.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    workers: Vec<usize>,
    /// Skip `cargo xtask setup` (nginx and wrk must be installed).
    #[arg(long)]
    no_setup: bool,
    /// Skip the XDP runs (they need root).
    #[arg(long)]
    no_xdp: bool,
    /// Only the XDP runs (overhead through a veth pair, cost per packet).
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
        "one aggregation round: 100 / 1,000 / 10,000 node reports of 10 rooms through Cluster::apply; their frames read whole and as changes; and only reading them (the peer)",
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

/// Which origin a proxied scenario goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// nginx `return 200`: as cheap as an origin gets, so the proxy's own
    /// cost is what the ratio shows.
    Fast,
    /// The demo origin (hyper): slow enough to hide part of the proxy's cost.
    Demo,
}

struct Scenario {
    key: &'static str,
    /// The `--scenarios` name.
    flag: &'static str,
    title: &'static str,
    waitroom_path: &'static str,
    nginx_path: &'static str,
    /// `Some`: an admitted visitor's cookie of the room at this path is sent.
    cookie_from: Option<&'static str>,
    accept_json: bool,
    origin: Option<Origin>,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        key: "a_admitted_with_cookie",
        flag: "a",
        title: "(a) admitted, valid cookie, proxied",
        waitroom_path: "/product/1",
        nginx_path: "/product/1",
        cookie_from: Some("/"),
        accept_json: false,
        origin: Some(Origin::Fast),
    },
    Scenario {
        key: "b_new_visitor_admitted",
        flag: "b",
        title: "(b) new visitor admitted, proxied",
        waitroom_path: "/product/1",
        nginx_path: "/product/1",
        cookie_from: None,
        accept_json: false,
        origin: Some(Origin::Fast),
    },
    Scenario {
        key: "c_queue_page",
        flag: "c",
        title: "(c) queued, queue page",
        waitroom_path: "/queue/page",
        nginx_path: "/queue/page",
        cookie_from: None,
        accept_json: false,
        origin: None,
    },
    Scenario {
        key: "d_queue_json",
        flag: "d",
        title: "(d) queued app, JSON",
        waitroom_path: "/queue/page",
        nginx_path: "/queue/json",
        cookie_from: None,
        accept_json: true,
        origin: None,
    },
    Scenario {
        key: "a_demo_admitted_with_cookie",
        flag: "a-demo",
        title: "(a) admitted, valid cookie, proxied to the demo origin",
        waitroom_path: "/demo/product/1",
        nginx_path: "/demo/product/1",
        cookie_from: Some("/demo/"),
        accept_json: false,
        origin: Some(Origin::Demo),
    },
    Scenario {
        key: "b_demo_new_visitor_admitted",
        flag: "b-demo",
        title: "(b) new visitor admitted, proxied to the demo origin",
        waitroom_path: "/demo/product/1",
        nginx_path: "/demo/product/1",
        cookie_from: None,
        accept_json: false,
        origin: Some(Origin::Demo),
    },
];

/// The load generators `--generators` may name.
const GENERATORS: &[&str] = &["loadgen", "wrk"];

/// A target of issue 17: `scenario` (a key of [`SCENARIOS`]) at `workers`
/// must reach `min_ratio` waitroom ÷ nginx in requests per second with every
/// generator; `p99_not_above_nginx` adds p99 at half load ≤ nginx's.
struct Target {
    scenario: &'static str,
    min_ratio: f64,
    p99_not_above_nginx: bool,
    against: &'static str,
}

const TARGETS: &[Target] = &[
    Target {
        scenario: "a_admitted_with_cookie",
        min_ratio: 1.3,
        p99_not_above_nginx: true,
        against: "nginx proxy_pass",
    },
    Target {
        scenario: "b_new_visitor_admitted",
        min_ratio: 1.2,
        p99_not_above_nginx: false,
        against: "nginx proxy_pass",
    },
    Target {
        scenario: "c_queue_page",
        min_ratio: 1.2,
        p99_not_above_nginx: false,
        against: "nginx static file",
    },
    Target {
        scenario: "d_queue_json",
        min_ratio: 1.2,
        p99_not_above_nginx: false,
        against: "nginx static file",
    },
];

/// Where the servers and the load generator of one worker count run.
struct Placement {
    workers: usize,
    server_cpu: Option<&'static str>,
    load_cpu: Option<&'static str>,
    /// Threads of either load generator.
    threads: usize,
    description: String,
}

impl Placement {
    fn new(workers: usize, cores: usize) -> Self {
        if workers == 1 && cores >= 2 {
            Self {
                workers,
                server_cpu: Some("0"),
                load_cpu: Some("1"),
                threads: 1,
                description:
                    "servers and origins pinned to CPU 0, the load generator (1 thread) to CPU 1"
                        .into(),
            }
        } else {
            Self {
                workers,
                server_cpu: None,
                load_cpu: None,
                threads: workers,
                description: format!(
                    "nothing pinned: servers ({workers} workers each), origins and the load generator ({workers} threads) share all {cores} cores"
                ),
            }
        }
    }
}

pub fn run(args: &Args) -> Result<()> {
    if let Some(which) = &args.criterion {
        return criterion(which);
    }
    for g in &args.generators {
        if !GENERATORS.contains(&g.as_str()) {
            bail!("--generators: unknown {g:?}; there are {GENERATORS:?}");
        }
    }
    let scenarios: Vec<&Scenario> = args
        .scenarios
        .iter()
        .map(|f| {
            SCENARIOS.iter().find(|s| s.flag == f).with_context(|| {
                let names: Vec<&str> = SCENARIOS.iter().map(|s| s.flag).collect();
                format!("--scenarios: unknown {f:?}; there are {names:?}")
            })
        })
        .collect::<Result<_>>()?;
    if args.workers.contains(&0) {
        bail!("--workers: a worker count is at least 1");
    }
    if !args.no_setup {
        let mut extra = vec![(
            "nginx",
            "the reverse-proxy peer and the fast origin of cargo xtask bench",
        )];
        if args.generators.iter().any(|g| g == "wrk") {
            extra.push(("wrk", "the external load generator of cargo xtask bench"));
        }
        setup::ensure_all(&extra)?;
    }
    let root = cmd::workspace_root();
    cmd::run(
        "building release binaries (waitroom-edge, waitroom-loadgen, waitroom-xdp-cost, waitroom-demo-origin)",
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
            "waitroom-xdp-cost",
            "--bin",
            "waitroom-demo-origin",
        ]),
    )?;
    let bin = cmd::target_dir().join("release");
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("wrk-report.lua"), WRK_REPORT)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let started = Instant::now();

    let (xdp, xdp_cost) = if args.no_xdp {
        (None, None)
    } else if !cmd::is_root() {
        println!("    skipping the XDP runs: they need root (a veth pair in a namespace)");
        (None, None)
    } else {
        let origin_port = free_port()?;
        let _origin = start(
            "origin",
            Command::new(bin.join("waitroom-demo-origin"))
                .args(["--listen", &format!("127.0.0.1:{origin_port}")]),
        )?;
        wait_port(origin_port)?;
        let overhead = xdp_overhead(&bin, &out, origin_port, args)?;
        (Some(overhead), Some(xdp_cost(&bin)?))
    };

    let mut results = Vec::new();
    let mut access_log = None;
    let mut placements = Vec::new();
    if !args.xdp_only {
        for &workers in &args.workers {
            let placement = Placement::new(workers, cores);
            let set = run_set(&bin, &out, &placement, &scenarios, args)?;
            results.extend(set.results);
            access_log = access_log.or(set.access_log);
            placements.push(json!({"workers": workers, "placement": placement.description}));
        }
    }
    let targets = targets(&results, &args.workers);
    let machine = machine();
    let report = json!({
        "machine": machine,
        "connections": args.connections,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "generators": args.generators,
        "placements": placements,
        "wall_seconds": started.elapsed().as_secs_f64(),
        "results": results,
        "targets": targets,
        "xdp_overhead": xdp,
        "xdp_cost_per_packet": xdp_cost,
        "access_log_overhead": access_log,
    });
    let path = out.join("results.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    println!();
    println!("{}", markdown(&report));
    if let Some(x) = report.get("xdp_overhead").filter(|x| !x.is_null()) {
        println!("{}", xdp_markdown(x));
    }
    if let Some(x) = report.get("xdp_cost_per_packet").filter(|x| !x.is_null()) {
        println!("{}", xdp_cost_markdown(x));
    }
    if let Some(x) = report.get("access_log_overhead").filter(|x| !x.is_null()) {
        println!("{}", access_log_markdown(x));
    }
    println!("JSON: {}", path.display());
    list_criterion();
    Ok(())
}

/// What one worker count measured.
struct SetResults {
    results: Vec<Value>,
    access_log: Option<Value>,
}

/// Starts the origins, a node and an nginx with `placement.workers` workers
/// each, and runs `scenarios` against both with every generator.
fn run_set(
    bin: &Path,
    out: &Path,
    placement: &Placement,
    scenarios: &[&Scenario],
    args: &Args,
) -> Result<SetResults> {
    let workers = placement.workers;
    let server_cpu = placement.server_cpu;
    cmd::step(&format!(
        "{workers} worker{}: {}",
        if workers == 1 { "" } else { "s" },
        placement.description
    ));
    let demo_port = free_port()?;
    let fast_port = free_port()?;
    let edge_port = free_port()?;
    let nginx_port = free_port()?;
    let _demo = start(
        "demo origin",
        pinned(server_cpu, &bin.join("waitroom-demo-origin"))
            .args(["--listen", &format!("127.0.0.1:{demo_port}")]),
    )?;
    let fast_conf = out.join(format!("origin-nginx-{workers}.conf"));
    std::fs::write(&fast_conf, fast_origin_config(out, fast_port, workers))?;
    let _fast = start(
        "fast origin (nginx return 200)",
        pinned(server_cpu, Path::new("/usr/sbin/nginx"))
            .arg("-c")
            .arg(&fast_conf)
            .args(["-g", "daemon off;"]),
    )?;
    wait_port(demo_port)?;
    wait_port(fast_port)?;
    let edge_cfg = out.join(format!("edge-{workers}.toml"));
    let counters = format!("counters-{workers}.shm");
    std::fs::write(
        &edge_cfg,
        edge_config(out, edge_port, fast_port, demo_port, workers)
            .replace("counters.shm", &counters),
    )?;
    let _ = std::fs::remove_file(out.join(&counters));
    let _ = std::fs::remove_file(out.join(format!("{counters}.tickets")));
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
    let nginx_conf = out.join(format!("nginx-{workers}.conf"));
    std::fs::write(
        &nginx_conf,
        nginx_config(out, nginx_port, fast_port, demo_port, workers),
    )?;
    let _nginx = start(
        "nginx",
        pinned(server_cpu, Path::new("/usr/sbin/nginx"))
            .arg("-c")
            .arg(&nginx_conf)
            .args(["-g", "daemon off;"]),
    )?;
    wait_port(nginx_port)?;

    let mut results = Vec::new();
    for s in scenarios {
        cmd::step(&format!("{workers} worker(s), scenario {}", s.title));
        let mut headers = Vec::new();
        if let Some(room) = s.cookie_from {
            headers.push(format!("Cookie: {}", admitted_cookie(edge_port, room)?));
        }
        if s.accept_json {
            headers.push("Accept: application/json".into());
        }
        let w = Endpoint::new(edge_port, s.waitroom_path, &headers);
        let n = Endpoint::new(nginx_port, s.nginx_path, &headers);
        let mut saturation = serde_json::Map::new();
        for g in &args.generators {
            let mut rounds = Vec::new();
            for round in 0..args.rounds.max(1) {
                // Alternate who goes first, so a drift of the machine's load
                // during a round does not always favour the same server.
                let (ws, ns) = if round % 2 == 0 {
                    let ws = saturate(g, bin, placement, &w, args)?;
                    (ws, saturate(g, bin, placement, &n, args)?)
                } else {
                    let ns = saturate(g, bin, placement, &n, args)?;
                    (saturate(g, bin, placement, &w, args)?, ns)
                };
                rounds.push((ratio(rps(&ws), rps(&ns)), ws, ns));
            }
            let ratios: Vec<f64> = rounds.iter().map(|r| r.0).collect();
            rounds.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (median, ws, ns) = rounds.swap_remove(rounds.len() / 2);
            println!(
                "    {g}: waitroom ÷ nginx = {median:.2} (median of {})",
                ratios
                    .iter()
                    .map(|r| format!("{r:.2}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            saturation.insert(
                g.clone(),
                json!({"waitroom": ws, "nginx": ns, "ratio": median, "round_ratios": ratios}),
            );
        }
        // Half the slower server's saturation, as our generator measured it
        // (or wrk, when only wrk ran).
        let base = saturation
            .get("loadgen")
            .or_else(|| saturation.values().next())
            .map_or(0.0, |v| rps(&v["waitroom"]).min(rps(&v["nginx"])));
        let rate = (base * 0.5).max(1.0);
        let w_fixed = loadgen(bin, placement, &w, rate, args)?;
        let n_fixed = loadgen(bin, placement, &n, rate, args)?;
        let p99 = ratio(
            w_fixed["p99_us"].as_f64().unwrap_or(0.0),
            n_fixed["p99_us"].as_f64().unwrap_or(0.0),
        );
        results.push(json!({
            "scenario": s.key,
            "title": s.title,
            "workers": workers,
            "origin": match s.origin {
                Some(Origin::Fast) => "fast (nginx return 200)",
                Some(Origin::Demo) => "demo (hyper)",
                None => "none (answered by the server)",
            },
            "saturation": saturation,
            "fixed_rate_rps": rate,
            "fixed_rate": {"waitroom": w_fixed, "nginx": n_fixed, "p99_ratio": p99},
        }));
    }
    let access_log = match results
        .iter()
        .find(|r| workers == 1 && r["scenario"] == "a_admitted_with_cookie")
    {
        Some(off) => Some(access_log_overhead(
            bin, out, fast_port, demo_port, placement, off, args,
        )?),
        None => None,
    };
    Ok(SetResults {
        results,
        access_log,
    })
}

/// One side of a scenario: where to send which request.
struct Endpoint {
    port: u16,
    path: String,
    headers: Vec<String>,
}

impl Endpoint {
    fn new(port: u16, path: &str, headers: &[String]) -> Self {
        Self {
            port,
            path: path.to_owned(),
            headers: headers.to_vec(),
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}{}", self.port, self.path)
    }
}

fn rps(v: &Value) -> f64 {
    v["rps"].as_f64().unwrap_or(0.0)
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// Requests per second at saturation with generator `g`.
fn saturate(g: &str, bin: &Path, p: &Placement, t: &Endpoint, args: &Args) -> Result<Value> {
    match g {
        "wrk" => wrk(p, t, args),
        _ => loadgen(bin, p, t, 0.0, args),
    }
}

/// Our load generator; `rate` 0 = closed loop (saturation).
fn loadgen(bin: &Path, p: &Placement, t: &Endpoint, rate: f64, args: &Args) -> Result<Value> {
    let mut c = pinned(p.load_cpu, &bin.join("waitroom-loadgen"));
    c.args(["--url", &t.url()])
        .args(["--connections", &args.connections.to_string()])
        .args(["--threads", &p.threads.to_string()])
        .args(["--duration", &args.seconds.to_string()])
        .args(["--rate", &format!("{rate:.0}")]);
    for h in &t.headers {
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
    print_run("loadgen", t, &v);
    Ok(v)
}

/// The Lua hook that makes wrk print its summary as one JSON line.
const WRK_REPORT: &str = r#"-- cargo xtask bench: wrk's summary as one JSON line.
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_us":%d,"errors":%d,"non_2xx":%d,"p50_us":%d,"p99_us":%d,"p999_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.max))
end
"#;

/// wrk at saturation: a 1 s warm-up run (discarded), then the measured one.
fn wrk(p: &Placement, t: &Endpoint, args: &Args) -> Result<Value> {
    let out_dir = cmd::workspace_root().join("target/bench");
    let script = out_dir.join("wrk-report.lua");
    let run = |seconds: f64| -> Result<Value> {
        let mut c = pinned(p.load_cpu, Path::new("wrk"));
        c.args(["-t", &p.threads.to_string()])
            .args(["-c", &args.connections.to_string()])
            .args(["-d", &format!("{}s", seconds.ceil().max(1.0))])
            .args(["--timeout", "5s"])
            .arg("-s")
            .arg(&script);
        for h in &t.headers {
            c.args(["-H", h]);
        }
        c.arg(t.url());
        let out = c.stderr(Stdio::inherit()).output().context("running wrk")?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!("wrk failed ({}): {text}", out.status);
        }
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("WRK_JSON "))
            .with_context(|| format!("wrk printed no summary: {text}"))?;
        let mut v: Value = serde_json::from_str(line).context("wrk's summary")?;
        let secs = v["duration_us"].as_f64().unwrap_or(0.0) / 1e6;
        let requests = v["requests"].as_f64().unwrap_or(0.0);
        v["rps"] = json!(if secs > 0.0 { requests / secs } else { 0.0 });
        v["mode"] = json!("saturation");
        v["threads"] = json!(p.threads);
        Ok(v)
    };
    run(1.0)?;
    let v = run(args.seconds)?;
    print_run("wrk", t, &v);
    Ok(v)
}

fn print_run(generator: &str, t: &Endpoint, v: &Value) {
    println!(
        "    {generator:<7} port {} {}: {:>9.0} req/s  p50 {:>6} µs  p99 {:>6} µs  p99.9 {:>6} µs  ({}{})",
        t.port,
        t.path,
        rps(v),
        v["p50_us"],
        v["p99_us"],
        v["p999_us"],
        v["mode"].as_str().unwrap_or(""),
        if v["errors"].as_u64().unwrap_or(0) + v["non_2xx"].as_u64().unwrap_or(0) > 0 {
            format!(", {} errors, {} non-2xx", v["errors"], v["non_2xx"])
        } else {
            String::new()
        }
    );
}

/// Each target of [`TARGETS`] for each worker count: met, missed or not run.
fn targets(results: &[Value], workers: &[usize]) -> Vec<Value> {
    let mut out = Vec::new();
    for &w in workers {
        for t in TARGETS {
            let Some(r) = results
                .iter()
                .find(|r| r["scenario"] == t.scenario && r["workers"] == w)
            else {
                out.push(json!({"workers": w, "scenario": t.scenario, "verdict": "not run"}));
                continue;
            };
            let ratios: serde_json::Map<String, Value> = r["saturation"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(g, v)| (g.clone(), v["ratio"].clone()))
                .collect();
            let throughput_met = !ratios.is_empty()
                && ratios
                    .values()
                    .all(|v| v.as_f64().unwrap_or(0.0) >= t.min_ratio);
            let p99 = r["fixed_rate"]["p99_ratio"]
                .as_f64()
                .unwrap_or(f64::INFINITY);
            let p99_met = !t.p99_not_above_nginx || p99 <= 1.0;
            out.push(json!({
                "workers": w,
                "scenario": t.scenario,
                "title": r["title"],
                "against": t.against,
                "required_ratio": t.min_ratio,
                "ratios": ratios,
                "p99_required": t.p99_not_above_nginx,
                "p99_ratio": p99,
                "verdict": if throughput_met && p99_met { "met" } else { "missed" },
            }));
        }
    }
    out
}

fn markdown(report: &Value) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "Machine: {}. {} connections, {} s per run, saturation ratios the median of {} rounds \
         (req/s: that round's); wall time {:.0} s.\n\n",
        report["machine"]["description"].as_str().unwrap_or("?"),
        report["connections"],
        report["seconds"],
        report["rounds"],
        report["wall_seconds"].as_f64().unwrap_or(0.0),
    ));
    for p in report["placements"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "- {} worker(s): {}\n",
            p["workers"],
            p["placement"].as_str().unwrap_or("")
        ));
    }
    let generators: Vec<&str> = report["generators"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    s.push_str("\n| workers | scenario | origin |");
    for g in &generators {
        s.push_str(&format!(" {g}: waitroom / nginx req/s | {g} ratio |"));
    }
    s.push_str(" fixed rate | waitroom p50/p99/p99.9 µs | nginx p50/p99/p99.9 µs | p99 ratio |\n|---:|---|---|");
    for _ in &generators {
        s.push_str("---:|---:|");
    }
    s.push_str("---:|---|---|---:|\n");
    for r in report["results"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "| {} | {} | {} |",
            r["workers"],
            r["title"].as_str().unwrap_or(""),
            r["origin"].as_str().unwrap_or("")
        ));
        for g in &generators {
            let v = &r["saturation"][*g];
            s.push_str(&format!(
                " {:.0} / {:.0} | {:.2} |",
                rps(&v["waitroom"]),
                rps(&v["nginx"]),
                v["ratio"].as_f64().unwrap_or(0.0)
            ));
        }
        let (w, n) = (&r["fixed_rate"]["waitroom"], &r["fixed_rate"]["nginx"]);
        s.push_str(&format!(
            " {:.0}/s | {}/{}/{} | {}/{}/{} | {:.2} |\n",
            r["fixed_rate_rps"].as_f64().unwrap_or(0.0),
            w["p50_us"],
            w["p99_us"],
            w["p999_us"],
            n["p50_us"],
            n["p99_us"],
            n["p999_us"],
            r["fixed_rate"]["p99_ratio"].as_f64().unwrap_or(0.0),
        ));
    }
    s.push_str("\nTargets (issue 17; every generator must reach the ratio):\n\n");
    s.push_str("| workers | scenario | against | required |");
    for g in &generators {
        s.push_str(&format!(" {g} |"));
    }
    s.push_str(" p99 at half load ÷ nginx | verdict |\n|---:|---|---|---:|");
    for _ in &generators {
        s.push_str("---:|");
    }
    s.push_str("---:|---|\n");
    for t in report["targets"].as_array().into_iter().flatten() {
        if t["verdict"] == "not run" {
            s.push_str(&format!(
                "| {} | {} | | | {} **not run** |\n",
                t["workers"],
                t["scenario"].as_str().unwrap_or(""),
                "| ".repeat(generators.len() + 1)
            ));
            continue;
        }
        s.push_str(&format!(
            "| {} | {} | {} | ≥ {:.1}× |",
            t["workers"],
            t["title"].as_str().unwrap_or(""),
            t["against"].as_str().unwrap_or(""),
            t["required_ratio"].as_f64().unwrap_or(0.0)
        ));
        for g in &generators {
            s.push_str(&format!(
                " {:.2} |",
                t["ratios"][*g].as_f64().unwrap_or(0.0)
            ));
        }
        s.push_str(&format!(
            " {} | **{}** |\n",
            if t["p99_required"].as_bool().unwrap_or(false) {
                format!("{:.2} (≤ 1.00)", t["p99_ratio"].as_f64().unwrap_or(0.0))
            } else {
                "—".into()
            },
            t["verdict"].as_str().unwrap_or("")
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

/// A cookie (name=value) of a visitor admitted to the room at `path`.
fn admitted_cookie(port: u16, path: &str) -> Result<String> {
    let resp = agent()
        .get(&format!("http://127.0.0.1:{port}{path}"))
        .call()?;
    let set = resp
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .context("the admitted answer carried no cookie")?;
    Ok(set.split(';').next().unwrap_or_default().to_owned())
}

/// The node: room `admit` (everything) proxies to the fast origin, room
/// `demo` (`/demo`) to the demo origin, room `queue` (`/queue`) queues all.
fn edge_config(dir: &Path, port: u16, fast: u16, demo: u16, workers: usize) -> String {
    let counters: PathBuf = dir.join("counters.shm");
    format!(
        r#"# cargo xtask bench: {workers} worker(s), like nginx's {workers} worker process(es).
[node]
id = "bench"
listen = "127.0.0.1:{port}"
workers = {workers}
counters_path = "{counters}"
max_connections_per_worker = 100000
# The load comes from one address and keeps no cookie in (b)-(d): the
# per-address limit on new tickets would answer most of it with 429.
new_tickets_per_address_per_minute = 0

[[rooms]]
id = "admit"
path = "/"
origin = "127.0.0.1:{fast}"
total_active_users = 1000000000
new_users_per_minute = 1000000000
session_duration = 10
# (a) replays one admitted cookie on all 32 connections of one load
# generator: over the ticket's connection budget (16) most requests would be
# served as new visitors (`ticket_shared`), and (a) would measure (b).
ticket_connection_budget = 0

[[rooms]]
id = "demo"
path = "/demo"
origin = "127.0.0.1:{demo}"
total_active_users = 1000000000
new_users_per_minute = 1000000000
session_duration = 10
ticket_connection_budget = 0

[[rooms]]
id = "queue"
path = "/queue"
origin = "127.0.0.1:{fast}"
total_active_users = 1000
new_users_per_minute = 100
queue_all = true
"#,
        counters = counters.display()
    )
}

/// nginx's settings both nginx instances share: `workers` processes, no
/// access log, keep-alive without a request limit, temp files under `dir`
/// with `prefix` (each instance its own).
fn nginx_common(dir: &Path, prefix: &str, workers: usize) -> String {
    let d = dir.display();
    // As root, nginx's workers would run as `nobody`, which may not read
    // the bench's files; the bench's own processes stay with its user.
    let user = if cmd::is_root() { "user root;\n" } else { "" };
    format!(
        r#"{user}worker_processes {workers};
pid {d}/{prefix}.pid;
error_log {d}/{prefix}-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 10000000;
    client_body_temp_path {d}/{prefix}-body;
    proxy_temp_path {d}/{prefix}-proxy;
    fastcgi_temp_path {d}/{prefix}-fastcgi;
    uwsgi_temp_path {d}/{prefix}-uwsgi;
    scgi_temp_path {d}/{prefix}-scgi;
"#
    )
}

/// With several workers, nginx listens with `reuseport` as waitroom does
/// (one socket per worker, connections spread by the kernel). Without it the
/// workers share one socket and one of them may take most of the 32
/// connections, which would measure nginx with one busy worker.
fn reuseport(workers: usize) -> &'static str {
    if workers > 1 { " reuseport" } else { "" }
}

/// The fast origin: nginx answering every request with `200 ok`, nothing read.
fn fast_origin_config(dir: &Path, port: u16, workers: usize) -> String {
    format!(
        r#"# cargo xtask bench: the fast origin.
{common}    server {{
        listen 127.0.0.1:{port}{reuseport};
        location / {{ default_type text/plain; return 200 "ok\n"; }}
    }}
}}
"#,
        common = nginx_common(dir, "origin-nginx", workers),
        reuseport = reuseport(workers),
    )
}

/// The peer: nginx proxying to the same origins and serving the queue
/// answers' bytes as static files.
fn nginx_config(dir: &Path, port: u16, fast: u16, demo: u16, workers: usize) -> String {
    let d = dir.display();
    let proxy = "proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;";
    format!(
        r#"# cargo xtask bench: the peer, {workers} worker(s) like waitroom's.
{common}    upstream fast {{ server 127.0.0.1:{fast}; keepalive 256; }}
    upstream demo {{ server 127.0.0.1:{demo}; keepalive 256; }}
    server {{
        listen 127.0.0.1:{port}{reuseport};
        location / {{
            proxy_pass http://fast;
            {proxy}
        }}
        location /demo/ {{
            proxy_pass http://demo;
            {proxy}
        }}
        location = /queue/page {{ default_type "text/html; charset=utf-8"; alias {d}/queue.html; }}
        location = /queue/json {{ default_type application/json; alias {d}/queue.json; }}
    }}
}}
"#,
        common = nginx_common(dir, "nginx", workers),
        reuseport = reuseport(workers),
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
        let mut cfg = edge_config(out, port, origin_port, origin_port, 1).replace(
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
        // The node may accept connections before its program is verified
        // and attached (seconds on a busy machine): wait for the link to say so.
        let deadline = Instant::now() + Duration::from_secs(30);
        if attached {
            loop {
                let link = cmd::output(Command::new("ip").args(["link", "show", "dev", HOST_IF]))
                    .unwrap_or_default();
                if link.contains("xdp") {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("the node did not attach its XDP program to {HOST_IF} within 30 s");
                }
                std::thread::sleep(Duration::from_millis(100));
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
/// (a)'s figures for the node with it off (`off`, one entry of the results,
/// measured with our generator).
fn access_log_overhead(
    bin: &Path,
    out: &Path,
    fast_port: u16,
    demo_port: u16,
    placement: &Placement,
    off: &Value,
    args: &Args,
) -> Result<Value> {
    cmd::step("access log overhead: (a) with [node.access_log] on (JSON lines to a file)");
    let port = free_port()?;
    let log = out.join("access.log");
    let _ = std::fs::remove_file(&log);
    let mut cfg = edge_config(out, port, fast_port, demo_port, placement.workers)
        .replace("counters.shm", "counters-log.shm");
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
        pinned(placement.server_cpu, &bin.join("waitroom-edge"))
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", "warn"),
    )?;
    wait_port(port)?;
    let headers = vec![format!("Cookie: {}", admitted_cookie(port, "/")?)];
    let on = Endpoint::new(port, "/product/1", &headers);
    let sat = loadgen(bin, placement, &on, 0.0, args)?;
    let rate = off["fixed_rate_rps"].as_f64().unwrap_or(0.0);
    let fixed = loadgen(bin, placement, &on, rate, args)?;
    let lines = std::fs::read(&log).map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count());
    let off_sat = off["saturation"]["loadgen"]["waitroom"].clone();
    Ok(json!({
        "off": {"saturation": off_sat, "fixed_rate": off["fixed_rate"]["waitroom"]},
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

/// The program's cost per packet by kind of packet (`waitroom-xdp-cost`,
/// which makes its own namespace and veth pair).
fn xdp_cost(bin: &Path) -> Result<Value> {
    cmd::step("XDP cost per packet (BPF_ENABLE_STATS run time ÷ run count), skb and native mode");
    let out = Command::new(bin.join("waitroom-xdp-cost"))
        .stderr(Stdio::inherit())
        .output()
        .context("running waitroom-xdp-cost")?;
    if !out.status.success() {
        bail!("waitroom-xdp-cost failed: {}", out.status);
    }
    serde_json::from_slice(&out.stdout).context("waitroom-xdp-cost output")
}

/// Issue 17's per-packet targets (skb mode), nanoseconds.
const XDP_NON_SYN_TARGET_NS: f64 = 50.0;
const XDP_SYN_TARGET_NS: f64 = 100.0;

fn xdp_cost_markdown(x: &Value) -> String {
    const CASES: [(&str, &str); 6] = [
        ("pass", "peer: `XDP_PASS` only"),
        ("non_syn", "non-SYN (ACK)"),
        ("syn_no_budget", "SYN, no budget"),
        ("syn_budget_new_sources", "SYN, budget, new source"),
        (
            "syn_budget_known_sources",
            "SYN, budget, known source (4,096)",
        ),
        ("syn_budget_one_source", "SYN, budget, one source"),
    ];
    let mut s = format!(
        "XDP cost per packet, ns: on the veth pair, median of {} rounds of {} packets, run time ÷ run count \
         (in brackets: hot, one frame repeated in BPF_PROG_TEST_RUN). The peer is the object's \
         pass-only program measured the same way in the same run: the hook and the kernel's \
         accounting, which every case pays; a case's own cost is its figure minus the peer's.\n\n| mode |",
        x["rounds"], x["packets_per_round"]
    );
    for (_, title) in CASES {
        s.push_str(&format!(" {title} |"));
    }
    s.push_str("\n|---|");
    s.push_str(&"---:|".repeat(CASES.len()));
    s.push('\n');
    let modes = x["modes"].as_object().cloned().unwrap_or_default();
    for (mode, cases) in &modes {
        s.push_str(&format!("| {mode} |"));
        for (key, _) in CASES {
            s.push_str(&format!(
                " {:.1}{} |",
                cases[key]["ns_per_packet"].as_f64().unwrap_or(0.0),
                cases[key]["test_run_ns"]
                    .as_f64()
                    .map_or_else(String::new, |h| format!(" ({h:.0})"))
            ));
        }
        s.push('\n');
    }
    if let Some(skb) = modes.get("skb") {
        let ns = |k: &str| skb[k]["ns_per_packet"].as_f64().unwrap_or(f64::NAN);
        let hot = |k: &str| skb[k]["test_run_ns"].as_f64().unwrap_or(f64::NAN);
        // The program's own cost: the case minus the pass-only peer.
        let own = |k: &str| ns(k) - ns("pass");
        let own_hot = |k: &str| hot(k) - hot("pass");
        let verdict = |v: f64, t: f64| if v < t { "met" } else { "missed" };
        s.push_str(&format!(
            "\nThe program's own cost (skb mode, case − peer; hot in brackets), against the targets: \
             non-SYN {:.1} ({:.1}) ns < {XDP_NON_SYN_TARGET_NS} ns **{}**; \
             SYN without a budget {:.1} ({:.1}) ns < {XDP_SYN_TARGET_NS} ns **{}**; \
             SYN with a budget, new source {:.1} ns **{}**, known source {:.1} ({:.1}) ns **{}**. \
             With the peer's cost included (what the packet pays in all): non-SYN {:.1} ns, \
             SYN without a budget {:.1} ns.\n\
             A new source costs {:.1} ns more than a known one, {:.1} ns more than no budget.\n",
            own("non_syn"),
            own_hot("non_syn"),
            verdict(own("non_syn"), XDP_NON_SYN_TARGET_NS),
            own("syn_no_budget"),
            own_hot("syn_no_budget"),
            verdict(own("syn_no_budget"), XDP_SYN_TARGET_NS),
            own("syn_budget_new_sources"),
            verdict(own("syn_budget_new_sources"), XDP_SYN_TARGET_NS),
            own("syn_budget_known_sources"),
            own_hot("syn_budget_known_sources"),
            verdict(own("syn_budget_known_sources"), XDP_SYN_TARGET_NS),
            ns("non_syn"),
            ns("syn_no_budget"),
            ns("syn_budget_new_sources") - ns("syn_budget_known_sources"),
            ns("syn_budget_new_sources") - ns("syn_no_budget"),
        ));
    }
    s
}
