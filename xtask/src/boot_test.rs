//! The packages under a real systemd: a minimal Debian root (debootstrap,
//! made once and cached as `target/boot-test/bookworm-minbase.tar`) booted
//! with `systemd-nspawn --boot`, the `.deb` files installed with apt, and the
//! units driven with `systemctl` inside. Run by `cargo xtask test` as root.
//!
//! This machine's PID 1 need not be systemd, so the container is not
//! registered with machined (`--register=no --keep-unit`) and commands run in
//! it through `nsenter` into its PID 1. HTTP requests are made by the host's
//! `curl` inside the container's network namespace only (the minimal root
//! has no HTTP client), and the veth XDP attaches to is made by the host's
//! `ip` in the container's network namespace (the root has no iproute2).
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::cmd;

/// The configs the test runs with: one room of one visitor, so the second
/// visitor queues and a restart that lost the counters would admit them.
const EDGE_TOML: &str = r#"# boot-test
[node]
id = "node-1"   # the name in its certificate
colo = "test"
listen = "127.0.0.1:80"
admin_listen = "127.0.0.1:9090"
workers = 1
shutdown_grace_ms = 2000

[aggregator]
address = "127.0.0.1:7000"
server_name = "aggregator.waitroom.internal"
ca = "/etc/waitroom/certs/ca.pem"
cert = "/etc/waitroom/certs/node-1.pem"
key = "/etc/waitroom/certs/node-1.key"
interval_ms = 500

[xdp]
interface = "wr0"
mode = "skb"
ports = [80]

[[rooms]]
id = "shop"
host = "*"
path = "/"
origin = "127.0.0.1:8081"
total_active_users = 1
new_users_per_minute = 1
session_duration = 5
"#;

const AGGREGATOR_TOML: &str = r#"listen = "127.0.0.1:7000"
admin_listen = "127.0.0.1:9091"
ca = "/etc/waitroom/certs/ca.pem"
cert = "/etc/waitroom/certs/aggregator.pem"
key = "/etc/waitroom/certs/aggregator.key"
snapshot_path = "/var/lib/waitroom/aggregator.snapshot"
snapshot_interval_ms = 1000

[[rooms]]
id = "shop"
total_active_users = 1
new_users_per_minute = 1
session_duration = 5
"#;

const SITE: &str = "Demo Shop";
const QUEUE: &str = "You are in line";
const UNITS: [&str; 2] = ["waitroom-aggregator", "waitroom-edge"];

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Use the release binaries already built (packaging still runs).
    #[arg(long)]
    no_build: bool,
}

/// `cargo xtask boot-test`: package, then boot and check.
pub fn verb(args: &Args) -> Result<()> {
    let debs = crate::package::run(&crate::package::Args::for_test(args.no_build))?;
    if !args.no_build {
        cmd::run(
            "building the demo origin",
            cmd::cargo().args([
                "build",
                "-p",
                "waitroom-tests",
                "--bin",
                "waitroom-demo-origin",
            ]),
        )?;
    }
    run(&debs, &cmd::target_dir().join("debug/waitroom-demo-origin")).map(drop)
}

/// Runs the boot test, or says why it cannot run here and returns `Ok(false)`.
pub fn run(debs: &[PathBuf], demo_origin: &Path) -> Result<bool> {
    let started = Instant::now();
    if !cmd::is_root() {
        println!("    skipping the boot test: needs root (debootstrap, systemd-nspawn)");
        return Ok(false);
    }
    for tool in ["debootstrap", "systemd-nspawn", "nsenter", "curl"] {
        if cmd::output(Command::new("sh").args(["-c", &format!("command -v {tool}")])).is_none() {
            println!(
                "    skipping the boot test: {tool} is missing (cargo xtask setup installs it)"
            );
            return Ok(false);
        }
    }
    let dir = cmd::target_dir().join("boot-test");
    let tarball = ensure_rootfs(&dir)?;
    let root = dir.join("root");
    cmd::step("boot test: unpacking a fresh root");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root)?;
    cmd::run(
        "tar -x (the cached minimal Debian root)",
        Command::new("tar")
            .arg("-C")
            .arg(&root)
            .arg("-xf")
            .arg(&tarball),
    )?;
    let pkgs = root.join("root/debs");
    std::fs::create_dir_all(&pkgs)?;
    for deb in debs {
        std::fs::copy(deb, pkgs.join(deb.file_name().context("deb name")?))?;
    }
    std::fs::copy(demo_origin, root.join("usr/local/bin/waitroom-demo-origin"))?;

    let c = Container::boot(&root)?;
    let result = checks(&c);
    drop(c);
    result?;
    println!(
        "==> boot test passed in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    Ok(true)
}

fn checks(c: &Container) -> Result<()> {
    cmd::step("boot test: apt install ./*.deb");
    c.sh("cd /root/debs && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends ./*.deb")?;
    for unit in UNITS {
        c.wait_active(unit)?;
    }
    println!(
        "    both units active right after install (example configs, development certificates)"
    );
    let owners = c.sh(
        "stat -c '%n %U:%G %a' /etc/waitroom /etc/waitroom/edge.toml /etc/waitroom/aggregator.toml \
         /etc/waitroom/certs /etc/waitroom/certs/node-1.key /etc/waitroom/certs/ca.key /var/lib/waitroom",
    )?;
    print!("{}", indent(&owners));
    for want in [
        "/etc/waitroom/edge.toml root:waitroom 640",
        "/etc/waitroom/aggregator.toml root:waitroom 640",
        "/etc/waitroom/certs root:waitroom 750",
        "/etc/waitroom/certs/node-1.key root:waitroom 640",
        "/etc/waitroom/certs/ca.key root:root 600",
        "/var/lib/waitroom waitroom:waitroom 700",
    ] {
        if !owners.contains(want) {
            bail!("expected `{want}`");
        }
    }

    cmd::step("boot test: a veth for XDP (made by the host's ip in the container's network)");
    let leader = c.leader.to_string();
    for args in [
        "link add wr0 type veth peer name wr1",
        "link set wr0 up",
        "link set wr1 up",
    ] {
        cmd::run(
            &format!("ip {args}"),
            Command::new("nsenter")
                .args(["-t", &leader, "-n", "--", "ip"])
                .args(args.split(' ')),
        )?;
    }
    cmd::step("boot test: test configs, WatchdogSec=2 drop-ins, the demo origin");
    c.write("/etc/waitroom/edge.toml", EDGE_TOML)?;
    c.write("/etc/waitroom/aggregator.toml", AGGREGATOR_TOML)?;
    for unit in UNITS {
        c.write(
            &format!("/etc/systemd/system/{unit}.service.d/boot-test.conf"),
            "[Service]\nWatchdogSec=2\n",
        )?;
    }
    c.sh("systemctl daemon-reload && systemd-run --quiet --unit=demo-origin /usr/local/bin/waitroom-demo-origin --listen 127.0.0.1:8081")?;
    c.sh("systemctl restart waitroom-aggregator && systemctl restart waitroom-edge")?;
    for unit in UNITS {
        c.wait_active(unit)?;
    }
    let pids: Vec<String> = UNITS.iter().map(|u| c.main_pid(u)).collect::<Result<_>>()?;
    std::thread::sleep(Duration::from_secs(7));
    for (unit, pid) in UNITS.iter().zip(&pids) {
        let state = c.sh(&format!(
            "systemctl show -p ActiveState -p SubState -p NRestarts -p MainPID {unit}"
        ))?;
        if !state.contains("ActiveState=active")
            || !state.contains("NRestarts=0")
            || c.main_pid(unit)? != *pid
        {
            bail!(
                "{unit} did not stay up past 3 watchdog periods:\n{state}\n{}",
                c.journal(unit)?
            );
        }
    }
    println!("    both units active, same PIDs, no restarts after 7 s with WatchdogSec=2");
    let edge_log = c.journal("waitroom-edge")?;
    let uid = c.sh(&format!("stat -c %U /proc/{}", pids[1]))?;
    if !edge_log.contains("XDP program attached") {
        bail!("XDP did not attach under the unit (as {uid}):\n{edge_log}");
    }
    println!(
        "    XDP program attached on wr0 by the unit running as user {}",
        uid.trim()
    );
    // Once attached, the node keeps at most CAP_BPF (old kernels) and
    // CAP_NET_ADMIN (a netlink attachment), in every thread.
    let sets = c.sh(&format!(
        "grep -h -e '^CapEff' -e '^CapPrm' -e '^CapAmb' /proc/{}/task/*/status | sort -u",
        pids[1]
    ))?;
    let allowed: u64 = (1 << 39) | (1 << 12);
    let too_much: Vec<&str> = sets
        .lines()
        .filter(|line| {
            let (name, hex) = line.split_once(':').unwrap_or((line, "?"));
            u64::from_str_radix(hex.trim(), 16)
                .map_or(true, |m| m & !allowed != 0 || (name == "CapAmb" && m != 0))
        })
        .collect();
    if !too_much.is_empty() || !edge_log.contains("capabilities dropped after start") {
        bail!("the node kept capabilities it does not need: {too_much:?}\n{sets}\n{edge_log}");
    }
    println!(
        "    the node dropped its capabilities after attaching: {}",
        sets.split_whitespace().collect::<Vec<_>>().join(" ")
    );

    cmd::step("boot test: a visitor through the node to the demo origin; the node gossips");
    let first = c.curl("first", "http://127.0.0.1/")?;
    ensure_has(&first, SITE, "the first visitor sees the site")?;
    let second = c.curl("second", "http://127.0.0.1/")?;
    ensure_has(&second, QUEUE, "the second visitor queues (one place)")?;
    let status = c
        .wait_for("the aggregator hears from the node", || {
            let s = c.curl("admin", "http://127.0.0.1:9091/status")?;
            Ok(s.replace(' ', "")
                .contains("\"nodes_reporting\":1")
                .then_some(s))
        })
        .with_context(|| {
            format!(
                "aggregator /status: {}\nnode log:\n{}\naggregator log:\n{}",
                c.curl("admin", "http://127.0.0.1:9091/status")
                    .unwrap_or_default(),
                c.journal("waitroom-edge").unwrap_or_default(),
                c.journal("waitroom-aggregator").unwrap_or_default()
            )
        })?;
    println!(
        "    aggregator /status: {}",
        status.chars().take(160).collect::<String>()
    );

    cmd::step("boot test: systemctl reload, good then bad config");
    let pid = c.main_pid("waitroom-edge")?;
    c.write(
        "/etc/waitroom/edge.toml",
        &EDGE_TOML.replace("total_active_users = 1", "total_active_users = 2"),
    )?;
    c.sh("systemctl reload waitroom-edge")?;
    c.wait_for("the node logs the reload", || {
        Ok(c.journal("waitroom-edge")?
            .contains("configuration reloaded")
            .then_some(()))
    })?;
    c.write("/etc/waitroom/edge.toml", "this is [not toml\n")?;
    if c.sh("systemctl reload waitroom-edge").is_ok() {
        bail!("reload with a broken config succeeded");
    }
    if c.main_pid("waitroom-edge")? != pid || !c.is_active("waitroom-edge")? {
        bail!("the node did not survive a bad reload");
    }
    println!(
        "    good config reloaded; bad one refused by systemctl reload, node still serving as pid {pid}"
    );
    c.write("/etc/waitroom/edge.toml", EDGE_TOML)?;
    let pid = c.main_pid("waitroom-aggregator")?;
    c.write(
        "/etc/waitroom/aggregator.toml",
        &AGGREGATOR_TOML.replace("total_active_users = 1", "total_active_users = 3"),
    )?;
    c.sh("systemctl reload waitroom-aggregator")?;
    c.wait_for("the aggregator applies the new limit", || {
        let s = c.curl("admin", "http://127.0.0.1:9091/status")?;
        Ok(s.replace(' ', "")
            .contains("\"total_active_users\":3")
            .then_some(()))
    })?;
    c.write(
        "/etc/waitroom/aggregator.toml",
        &AGGREGATOR_TOML.replace("127.0.0.1:7000", "127.0.0.1:7001"),
    )?;
    c.sh("systemctl reload waitroom-aggregator")?;
    c.wait_for(
        "the aggregator refuses a listener change, naming it",
        || {
            Ok(c.journal("waitroom-aggregator")?
                .contains("listen: changed")
                .then_some(()))
        },
    )?;
    c.write("/etc/waitroom/aggregator.toml", AGGREGATOR_TOML)?;
    c.sh("systemctl reload waitroom-aggregator")?;
    if c.main_pid("waitroom-aggregator")? != pid {
        bail!("the aggregator restarted during reloads");
    }
    println!("    aggregator: new room limit applied on reload, a listener change refused by name");

    cmd::step("boot test: systemctl restart keeps counters and cookies");
    c.sh("systemctl restart waitroom-edge")?;
    c.wait_active("waitroom-edge")?;
    let again = c.curl("first", "http://127.0.0.1/")?;
    ensure_has(
        &again,
        SITE,
        "the first visitor's cookie still admits after a restart",
    )?;
    let third = c.curl("third", "http://127.0.0.1/")?;
    ensure_has(
        &third,
        QUEUE,
        "a new visitor still queues: the counters survived",
    )?;
    println!("    first visitor still in, a new one still queued");

    cmd::step("boot test: systemctl stop drains");
    for unit in ["waitroom-edge", "waitroom-aggregator"] {
        c.sh(&format!("systemctl stop {unit}"))?;
        let result = c.sh(&format!("systemctl show -p Result -p ActiveState {unit}"))?;
        if !result.contains("Result=success") || !result.contains("ActiveState=inactive") {
            bail!(
                "{unit} did not stop cleanly: {result}\n{}",
                c.journal(unit)?
            );
        }
    }
    let edge_log = c.journal("waitroom-edge")?;
    ensure_has(
        &edge_log,
        "draining in-flight requests",
        "the node drains on stop",
    )?;
    ensure_has(
        &edge_log,
        "XDP program detached",
        "the node detaches XDP on stop, without the capabilities it dropped",
    )?;
    ensure_has(
        &c.journal("waitroom-aggregator")?,
        "aggregator stopped",
        "the aggregator stops cleanly",
    )?;
    println!("    both stopped with Result=success after draining");

    cmd::step("boot test: reinstall, remove and purge keep or delete the right files");
    c.sh("cd /root/debs && DEBIAN_FRONTEND=noninteractive timeout 120 apt-get install -y -q --reinstall ./waitroom-edge_*.deb </dev/null")?;
    let kept = c.sh("cat /etc/waitroom/edge.toml")?;
    ensure_has(&kept, "boot-test", "a reinstall keeps the edited edge.toml")?;
    c.sh("DEBIAN_FRONTEND=noninteractive apt-get remove -y -q waitroom-edge waitroom-aggregator </dev/null")?;
    let left = c.sh("ls /etc/waitroom /etc/waitroom/certs /var/lib/waitroom")?;
    for file in [
        "edge.toml",
        "aggregator.toml",
        "node-1.key",
        "aggregator.snapshot",
    ] {
        ensure_has(&left, file, "remove keeps configs, certificates and state")?;
    }
    c.sh("DEBIAN_FRONTEND=noninteractive apt-get purge -y -q waitroom-edge waitroom-aggregator waitroom-common </dev/null")?;
    let gone = c.sh("ls -d /etc/waitroom /var/lib/waitroom 2>&1 || true")?;
    if gone.matches("No such file").count() != 2 {
        bail!("purge left files: {gone}");
    }
    println!(
        "    reinstall kept the edited config; remove kept configs, certificates, state; purge removed them"
    );
    Ok(())
}

fn ensure_has(text: &str, needle: &str, what: &str) -> Result<()> {
    if !text.contains(needle) {
        bail!(
            "{what}: no {needle:?} in:\n{}",
            text.chars().take(2000).collect::<String>()
        );
    }
    Ok(())
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}

/// The cached root, made with debootstrap the first time (65–150 s).
fn ensure_rootfs(dir: &Path) -> Result<PathBuf> {
    let tarball = dir.join("bookworm-minbase.tar");
    if tarball.exists() {
        println!("    using the cached root {}", tarball.display());
        return Ok(tarball);
    }
    std::fs::create_dir_all(dir)?;
    let build = dir.join("rootfs-build");
    let _ = std::fs::remove_dir_all(&build);
    let mirror = apt_mirror();
    cmd::run(
        &format!("debootstrap a minimal Debian 12 root from {mirror} (once; cached)"),
        Command::new("debootstrap")
            .args([
                "--variant=minbase",
                "--include=systemd,systemd-sysv,dbus",
                "bookworm",
            ])
            .arg(&build)
            .arg(&mirror),
    )?;
    let partial = dir.join("bookworm-minbase.tar.partial");
    cmd::run(
        "caching the root as a tarball",
        Command::new("tar")
            .arg("-C")
            .arg(&build)
            .arg("-cf")
            .arg(&partial)
            .arg("."),
    )?;
    std::fs::rename(&partial, &tarball)?;
    let _ = std::fs::remove_dir_all(&build);
    Ok(tarball)
}

/// The Debian mirror apt uses here (deb822 `URIs:` or one-line `deb`), else deb.debian.org.
fn apt_mirror() -> String {
    let mut texts = vec![std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default()];
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        texts.extend(dir.filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok()));
    }
    texts
        .iter()
        .flat_map(|t| t.lines())
        .filter_map(|l| {
            let l = l.trim();
            l.strip_prefix("URIs:").map(str::trim).or_else(|| {
                l.strip_prefix("deb ")
                    .and_then(|r| r.split_whitespace().find(|w| w.contains("://")))
            })
        })
        .find(|u| u.ends_with("/debian") || u.ends_with("/debian/"))
        .map_or_else(|| "http://deb.debian.org/debian".to_owned(), str::to_owned)
}

/// A booted container: commands run in it through `nsenter`.
struct Container {
    nspawn: Child,
    leader: u32,
    scratch: PathBuf,
}

impl Container {
    fn boot(root: &Path) -> Result<Self> {
        cmd::step("boot test: systemd-nspawn --boot");
        let log = std::fs::File::create(root.with_file_name("nspawn.log"))?;
        let nspawn = Command::new("systemd-nspawn")
            .args([
                "--boot",
                "--private-network",
                "--register=no",
                "--keep-unit",
                "--capability=CAP_BPF,CAP_PERFMON",
                "--system-call-filter=bpf perf_event_open",
                "--console=read-only",
                "-D",
            ])
            .arg(root)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting systemd-nspawn")?;
        let scratch = root.with_file_name("scratch");
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(&scratch)?;
        let mut c = Self {
            leader: 0,
            nspawn,
            scratch,
        };
        let id = c.nspawn.id();
        c.leader = c.wait_for("the container's PID 1", || {
            let children = std::fs::read_to_string(format!("/proc/{id}/task/{id}/children"))
                .unwrap_or_default();
            Ok(children
                .split_whitespace()
                .next()
                .and_then(|p| p.parse().ok()))
        })?;
        let state = c.wait_for("the container to finish booting", || {
            Ok(c.sh("timeout 20 systemctl is-system-running --wait")
                .ok()
                .or_else(|| {
                    c.sh("systemctl is-system-running || true")
                        .ok()
                        .filter(|s| s.contains("degraded"))
                }))
        })?;
        println!("    booted (leader pid {}): {}", c.leader, state.trim());
        Ok(c)
    }

    /// Runs `script` with /bin/sh inside; fails with its output.
    fn sh(&self, script: &str) -> Result<String> {
        let out = Command::new("nsenter")
            .args([
                "-t",
                &self.leader.to_string(),
                "-a",
                "--",
                "/bin/sh",
                "-c",
                script,
            ])
            .output()
            .context("nsenter")?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!(
                "in the container `{script}` failed ({}):\n{text}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(text)
    }

    /// Writes a file inside (creating its directory).
    fn write(&self, path: &str, text: &str) -> Result<()> {
        let local = self.scratch.join("upload");
        std::fs::write(&local, text)?;
        let out = Command::new("nsenter")
            .args(["-t", &self.leader.to_string(), "-a", "--", "/bin/sh", "-c"])
            .arg(format!("mkdir -p \"$(dirname {path})\" && cat > {path}"))
            .stdin(std::fs::File::open(&local)?)
            .output()?;
        if !out.status.success() {
            bail!("writing {path}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// `curl` from the host in the container's network only; `jar` names the
    /// visitor (their cookie jar).
    fn curl(&self, jar: &str, url: &str) -> Result<String> {
        let jar = self.scratch.join(format!("{jar}.cookies"));
        let out = Command::new("nsenter")
            .args([
                "-t",
                &self.leader.to_string(),
                "-n",
                "--",
                "curl",
                "-sS",
                "--max-time",
                "5",
                "-b",
            ])
            .arg(&jar)
            .arg("-c")
            .arg(&jar)
            .arg(url)
            .output()?;
        if !out.status.success() {
            bail!("curl {url}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn journal(&self, unit: &str) -> Result<String> {
        self.sh(&format!("journalctl -q --no-pager -u {unit} | tail -n 60"))
    }

    fn main_pid(&self, unit: &str) -> Result<String> {
        Ok(self
            .sh(&format!("systemctl show -p MainPID --value {unit}"))?
            .trim()
            .to_owned())
    }

    fn is_active(&self, unit: &str) -> Result<bool> {
        Ok(self
            .sh(&format!("systemctl is-active {unit} || true"))?
            .trim()
            == "active")
    }

    fn wait_active(&self, unit: &str) -> Result<()> {
        let waited = self.wait_for(&format!("{unit} to be active"), || {
            Ok(self.is_active(unit)?.then_some(()))
        });
        if waited.is_err() {
            bail!(
                "{unit} is not active:\n{}\n{}",
                self.sh(&format!("systemctl status --no-pager {unit} || true"))?,
                self.journal(unit)?
            );
        }
        Ok(())
    }

    /// Polls `probe` every 200 ms for at most 30 s.
    fn wait_for<T>(&self, what: &str, mut probe: impl FnMut() -> Result<Option<T>>) -> Result<T> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(value)) = probe() {
                return Ok(value);
            }
            if Instant::now() > deadline {
                bail!("waited 30 s for {what}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Container {
    /// Powers the container off (SIGTERM to nspawn), killing it after 20 s.
    fn drop(&mut self) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
        unsafe {
            libc::kill(self.nspawn.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.nspawn.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.nspawn.kill();
        let _ = self.nspawn.wait();
    }
}
