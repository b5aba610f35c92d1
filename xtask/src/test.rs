//! `cargo xtask test`: everything CI checks, in the order that fails fastest.
//!
//! setup → `cargo fmt --check` → clippy `-D warnings` on every host target →
//! clippy on the eBPF crate for the BPF target → build the binaries the
//! integration tests start → every unit, integration and privileged test →
//! each fuzz target for a bounded time (`xtask fuzz`), failing on a crash.
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
    if !cmd::is_root() {
        println!(
            "    note: not root, so the privileged tests (XDP, network namespaces) will skip and say why"
        );
    }
    let (passed, failed, ignored) = cargo_test(&args.test_args)?;
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
fn cargo_test(extra: &[String]) -> Result<(u64, u64, u64)> {
    use std::io::{BufRead as _, BufReader};
    cmd::step("cargo test (unit, integration and privileged tests)");
    let mut child = cmd::cargo()
        .args(["test", "--workspace", "--no-fail-fast", "--"])
        .args(extra)
        .current_dir(cmd::workspace_root())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
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
