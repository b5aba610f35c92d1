//! `cargo xtask test`: everything CI checks, in the order that fails fastest.
//!
//! setup → `cargo fmt --check` → clippy `-D warnings` on every host target →
//! clippy on the eBPF crate for the BPF target → build the binaries the
//! integration tests start → every unit, integration and privileged test.
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
    if !cmd::is_root() {
        println!(
            "    note: not root, so the privileged tests (XDP, network namespaces) will skip and say why"
        );
    }
    cmd::run(
        "cargo test (unit, integration and privileged tests)",
        cmd::cargo()
            .args(["test", "--workspace", "--no-fail-fast"])
            .arg("--")
            .args(&args.test_args),
    )?;
    println!(
        "==> all checks passed in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
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
