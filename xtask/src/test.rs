//! `cargo xtask test`: everything CI checks, in the order that fails fastest.
//!
//! setup → `cargo fmt --check` → clippy `-D warnings` on every host target →
//! clippy on the eBPF crate for the BPF target → build the binaries the
//! integration tests start → staged install → as root: the Debian packages
//! booted under systemd-nspawn (`boot_test`) → every unit, integration and
//! privileged test → each fuzz target for a bounded time (`xtask fuzz`),
//! failing on a crash.
//! Privileged tests (XDP, network namespaces) run when this runs as root and
//! print why they skip otherwise.
use std::process::Command;

use anyhow::Result;

use crate::{cmd, setup};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Skip `cargo xtask setup` (when you know the machine is ready).
    #[arg(long)]
    no_setup: bool,
    /// Skip the bounded fuzzing runs (about 2 minutes plus their build).
    #[arg(long)]
    no_fuzz: bool,
    /// Extra arguments for `cargo test` (e.g. a test name filter).
    #[arg(last = true)]
    test_args: Vec<String>,
}

pub fn run(args: &Args) -> Result<()> {
    let started = std::time::Instant::now();
    if !args.no_setup {
        setup::run()?;
    }
    cmd::run(
        "cargo fmt --check",
        cmd::cargo().args(["fmt", "--all", "--", "--check"]),
    )?;
    cmd::run(
        "clippy -D warnings (host crates, every target)",
        cmd::cargo().args([
            "clippy",
            "--workspace",
            "--exclude",
            "waitroom-ebpf",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    cmd::run(
        "clippy -D warnings (eBPF crate, bpfel-unknown-none)",
        &mut ebpf_clippy(),
    )?;
    cmd::run(
        "building the binaries the integration tests start",
        cmd::cargo().args(["build", "--workspace", "--bins"]),
    )?;
    let staged = cmd::workspace_root().join("target/install-check");
    let _ = std::fs::remove_dir_all(&staged);
    cmd::step("staged install (target/install-check) and systemd-analyze verify of the units");
    crate::install::staged_check(&staged)?;
    if cmd::is_root() {
        cmd::step("the packages under a real systemd (cargo xtask boot-test)");
        let debs = crate::package::run(&crate::package::Args::for_test(false))?;
        crate::boot_test::run(&debs, &cmd::target_dir().join("debug/waitroom-demo-origin"))?;
    } else {
        println!("    skipping the boot test: needs root (debootstrap, systemd-nspawn)");
        println!(
            "    note: not root, so the privileged tests (XDP, network namespaces) will skip and say why"
        );
    }
    let (mut passed, mut failed, mut ignored) = cargo_test(
        "cargo test (unit, integration and privileged tests)",
        &["--workspace"],
        &args.test_args,
        None,
    )?;
    if args.test_args.is_empty() {
        // The hostile-connections test holds visitors' p99 to half the
        // header deadline (500 ms) only against an optimized node (debug
        // builds are several times slower per request, so they get the whole
        // deadline): run it once more against the release node. As root
        // the package step has just built it, so this build does nothing;
        // the services alone, as the package builds them, because with the
        // tests' crate beside them cargo would unify features and build every
        // dependency again (it once took 9 of CI's 47 minutes). The demo
        // origin comes from the debug build. `--workspace` keeps the test
        // build's feature set, so the test binary is not rebuilt either.
        cmd::run(
            "building the release node for the connection deadlines test",
            &mut crate::package::build_release_binaries(),
        )?;
        let dirs = std::env::join_paths([
            cmd::target_dir().join("release"),
            cmd::target_dir().join("debug"),
        ])?;
        let (p, f, i) = cargo_test(
            "connection deadlines against the optimized node (p99 < 500 ms)",
            &["--workspace", "--test", "connections"],
            &[],
            Some(&dirs),
        )?;
        (passed, failed, ignored) = (passed + p, failed + f, ignored + i);
    }
    if failed == 0 && !args.no_fuzz {
        crate::fuzz::run_all_bounded()?;
    }
    if failed == 0 {
        println!(
            "==> all checks passed in {:.0}s",
            started.elapsed().as_secs_f64()
        );
    }
    // One plain closing line, last, for whoever reads the end of the log.
    println!("tests: {passed} passed, {failed} failed, {ignored} skipped");
    if failed > 0 {
        anyhow::bail!("{failed} tests failed");
    }
    Ok(())
}

/// Runs `cargo test` over the workspace, echoing its output, and adds up the
/// `test result:` lines of every test binary.
/// With `bin_dirs` (a `:`-separated list), the integration tests start the
/// binaries found there first (`WAITROOM_BIN_DIR`) instead of the debug ones.
fn cargo_test(
    what: &str,
    select: &[&str],
    extra: &[String],
    bin_dirs: Option<&std::ffi::OsStr>,
) -> Result<(u64, u64, u64)> {
    use std::io::{BufRead as _, BufReader};
    cmd::step(what);
    let mut command = cmd::cargo();
    command
        .arg("test")
        .args(select)
        .args(["--no-fail-fast", "--"])
        .args(extra)
        .current_dir(cmd::workspace_root())
        .stdout(std::process::Stdio::piped());
    if let Some(dirs) = bin_dirs {
        command.env("WAITROOM_BIN_DIR", dirs);
    }
    let mut child = command.spawn()?;
    let (mut passed, mut failed, mut ignored) = (0, 0, 0);
    let stdout = child.stdout.take().expect("piped stdout");
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            let count = |word: &str| {
                rest.split(';')
                    .find_map(|part| part.trim().strip_suffix(word))
                    .and_then(|n| n.trim().rsplit(' ').next()?.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            passed += count(" passed");
            failed += count(" failed");
            ignored += count(" ignored");
        }
    }
    let status = child.wait()?;
    if !status.success() && failed == 0 {
        anyhow::bail!("cargo test failed ({status}) before any test failed: see above");
    }
    Ok((passed, failed, ignored))
}

/// Clippy for the eBPF crate needs nightly and `-Z build-std=core`, like its build.
fn ebpf_clippy() -> Command {
    let mut c = Command::new("rustup");
    cmd::without_run_env(&mut c);
    c.args([
        "run",
        "nightly",
        "cargo",
        "clippy",
        "--package",
        "waitroom-ebpf",
        "--release",
        "--target",
        "bpfel-unknown-none",
        "-Z",
        "build-std=core",
        "--target-dir",
        "target/ebpf-clippy",
        "--",
        "-D",
        "warnings",
    ]);
    // The stable toolchain's variables would override `rustup run nightly`.
    for key in [
        "RUSTC",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTUP_TOOLCHAIN",
        "CARGO",
    ] {
        c.env_remove(key);
    }
    c.env(
        "CARGO_ENCODED_RUSTFLAGS",
        "--cfg=bpf_target_arch=\"x86_64\"",
    );
    c
}
