//! `cargo xtask setup`: make this machine able to build and test waitroom.
//!
//! Idempotent: every step checks first and only installs what is missing, so a
//! second run finishes in seconds. Versions come from `shared/docs/TOOLCHAIN.md`:
//! the eBPF crate needs the image's `nightly` with `rust-src`, and `bpf-linker`
//! 0.10.0 (newer releases link a system libLLVM that Debian 12 lacks).
use std::process::Command;

use anyhow::{Result, bail};

use crate::cmd::{self, output, step};

/// The bpf-linker release that works with the image's nightly (LLVM 22 inside rustc).
const BPF_LINKER_VERSION: &str = "0.10.0";
/// The cargo-fuzz release `cargo xtask fuzz` and `test` drive.
const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// Debian packages the tests and the demo use; `(package, why)`.
pub const TEST_PACKAGES: &[(&str, &str)] = &[
    ("iproute2", "ip netns / veth for the XDP tests"),
    ("chromium", "the real-browser test of the queue page"),
    ("ca-certificates", "TLS roots for apt and cargo"),
    (
        "curl",
        "HTTP/2 over TLS checks of the node's TLS listener, requests in the boot test",
    ),
    ("binutils", "strip and objdump for `cargo xtask package`"),
    (
        "lintian",
        "checks the .deb files `cargo xtask package` builds",
    ),
    ("debootstrap", "the minimal Debian root the boot test boots"),
    (
        "systemd-container",
        "systemd-nspawn, which boots that root under a real systemd",
    ),
    (
        "prometheus",
        "promtool, which checks deploy/prometheus/waitroom-alerts.yml",
    ),
    (
        "etcd-server",
        "a real 3-member etcd for the replicated lease ledger's tests (issue 20)",
    ),
];

pub fn run() -> Result<()> {
    ensure_all(&[])
}

/// Runs every setup step, also installing `extra` Debian packages (used by `bench`).
pub fn ensure_all(extra: &[(&str, &str)]) -> Result<()> {
    let started = std::time::Instant::now();
    ensure_nightly()?;
    ensure_rust_src()?;
    ensure_bpf_linker()?;
    ensure_cargo_fuzz()?;
    let mut packages: Vec<(&str, &str)> = TEST_PACKAGES.to_vec();
    packages.extend_from_slice(extra);
    ensure_debian_packages(&packages)?;
    println!(
        "==> setup complete in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn ensure_nightly() -> Result<()> {
    step("checking for the nightly toolchain (builds the eBPF crate)");
    let toolchains = output(Command::new("rustup").args(["toolchain", "list"])).unwrap_or_default();
    if toolchains.lines().any(|l| l.starts_with("nightly")) {
        println!("    nightly present");
        return Ok(());
    }
    cmd::run(
        "installing the nightly toolchain (minimal profile)",
        Command::new("rustup").args(["toolchain", "install", "nightly", "--profile", "minimal"]),
    )
    .map_err(|e| e.context("step 'nightly toolchain' failed: install it with `rustup toolchain install nightly` and run setup again"))
}

fn ensure_rust_src() -> Result<()> {
    step("checking for rust-src on nightly (needed by -Z build-std=core)");
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]))
    .unwrap_or_default();
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        println!("    rust-src present");
        return Ok(());
    }
    cmd::run(
        "installing rust-src for nightly",
        Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]),
    )
    .map_err(|e| e.context("step 'rust-src' failed: check that crates.io/rustup are reachable, or run `rustup component add rust-src --toolchain nightly` by hand"))
}

fn ensure_bpf_linker() -> Result<()> {
    step(&format!("checking for bpf-linker {BPF_LINKER_VERSION}"));
    let version = output(Command::new("bpf-linker").arg("--version")).unwrap_or_default();
    if version.contains(BPF_LINKER_VERSION) {
        println!("    {}", version.trim());
        return Ok(());
    }
    if !version.is_empty() {
        println!(
            "    found {}, replacing it with {BPF_LINKER_VERSION}",
            version.trim()
        );
    }
    cmd::run(
        &format!("installing bpf-linker {BPF_LINKER_VERSION} (about 80 s)"),
        cmd::cargo().args([
            "install",
            &format!("bpf-linker@{BPF_LINKER_VERSION}"),
            "--locked",
            "--force",
        ]),
    )
    .map_err(|e| {
        e.context(format!(
            "step 'bpf-linker' failed: run `cargo install bpf-linker@{BPF_LINKER_VERSION} --locked` by hand and read its error (newer versions need a system libLLVM that Debian 12 does not ship)"
        ))
    })
}

fn ensure_cargo_fuzz() -> Result<()> {
    step(&format!(
        "checking for cargo-fuzz {CARGO_FUZZ_VERSION} (the fuzz targets in fuzz/)"
    ));
    let version = output(Command::new("cargo").args(["fuzz", "--version"])).unwrap_or_default();
    if version.contains(CARGO_FUZZ_VERSION) {
        println!("    {}", version.trim());
        return Ok(());
    }
    cmd::run(
        &format!("installing cargo-fuzz {CARGO_FUZZ_VERSION} from crates.io (about 2 min)"),
        cmd::cargo().args([
            "install",
            &format!("cargo-fuzz@{CARGO_FUZZ_VERSION}"),
            "--locked",
            "--force",
        ]),
    )
    .map_err(|e| {
        e.context(format!(
            "step 'cargo-fuzz' failed: run `cargo install cargo-fuzz@{CARGO_FUZZ_VERSION} --locked` by hand and read its error"
        ))
    })
}

fn ensure_debian_packages(packages: &[(&str, &str)]) -> Result<()> {
    step("checking Debian packages");
    let missing: Vec<&str> = packages
        .iter()
        .filter(|(name, why)| {
            let status = output(Command::new("dpkg-query").args(["-W", "-f=${Status}", name]))
                .unwrap_or_default();
            let present = status.contains("install ok installed");
            println!(
                "    {name:<16} {} ({why})",
                if present { "present" } else { "missing" }
            );
            !present
        })
        .map(|(name, _)| *name)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !cmd::is_root() {
        bail!(
            "step 'Debian packages' needs root to install {}: run `sudo apt-get install -y {}` or run setup as root",
            missing.join(", "),
            missing.join(" ")
        );
    }
    cmd::run(
        "apt-get update",
        Command::new("apt-get").args(["update", "-q"]),
    )
    .map_err(|e| {
        e.context("step 'apt-get update' failed: check that the Debian mirrors are reachable")
    })?;
    cmd::run(
        &format!("apt-get install {}", missing.join(" ")),
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing),
    )
    .map_err(|e| {
        e.context(format!(
            "step 'apt-get install' failed: try `apt-get install -y {}` by hand and read its error",
            missing.join(" ")
        ))
    })
}
