//! Builds the XDP program (`waitroom-ebpf`) with nightly for `bpfel-unknown-none` and
//! leaves the object in `OUT_DIR/waitroom`, where `src/xdp` embeds it.
//!
//! `AYA_BUILD_SKIP=1` skips the eBPF build (for lint-only runs); the node then
//! embeds an empty object and runs with userspace telemetry only.
//!
//! The nested cargo (`rustup run nightly cargo build -Z build-std=core`) always
//! builds in the same directory, `<target dir>/ebpf`. This used to be
//! `aya_build::build_ebpf`, which builds under `OUT_DIR`; but cargo gives every
//! distinct build of this crate its own `OUT_DIR` (debug and release, `check`
//! and clippy, the feature sets of `cargo build -p …`, `--workspace` and
//! `cargo test`, each change to the dependency graph), so each of those started
//! from an empty target dir and compiled `core` and aya-ebpf again: 45–60 s,
//! several times per CI run. In one shared directory the nested cargo finds its
//! own fingerprints and does nothing (about a second) unless the program changed.
use std::{
    io::BufReader,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, anyhow, bail};
use cargo_metadata::{Artifact, Message};

const EBPF_PACKAGE: &str = "waitroom-ebpf";
/// The bin target of `waitroom-ebpf`, and the file name in `OUT_DIR`.
const EBPF_BIN: &str = "waitroom";

fn main() -> anyhow::Result<()> {
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").context("OUT_DIR not set")?);

    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    let skip =
        std::env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        println!("cargo:warning=AYA_BUILD_SKIP is set: the node embeds no XDP program");
        std::fs::write(out_dir.join(EBPF_BIN), []).context("writing the empty eBPF placeholder")?;
        return Ok(());
    }

    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = metadata
        .packages
        .iter()
        .find(|p| p.name.as_str() == EBPF_PACKAGE)
        .ok_or_else(|| anyhow!("{EBPF_PACKAGE} package not found in the workspace"))?;
    let ebpf_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("{EBPF_PACKAGE} manifest has no parent directory"))?;

    // What the object is built from, named one by one rather than the crate's
    // whole directory, so that nothing else written there makes every build
    // stale. The crate's library and what it uses (waitroom-common, the locked
    // aya-ebpf) reach this script through the build-dependency on
    // waitroom-ebpf; its binary, the XDP program, only through these lines.
    // The workspace manifest holds the eBPF crate's release profile.
    for path in [
        ebpf_dir.join("src"),
        ebpf_dir.join("Cargo.toml"),
        ebpf_dir.join("build.rs"),
        metadata.workspace_root.join("Cargo.toml"),
    ] {
        println!("cargo:rerun-if-changed={path}");
    }

    let target_dir = metadata
        .build_directory
        .as_ref()
        .unwrap_or(&metadata.target_directory)
        .join("ebpf");
    let object = build(
        metadata.workspace_root.as_std_path(),
        target_dir.as_std_path(),
    )?;
    let dst = out_dir.join(EBPF_BIN);
    std::fs::copy(&object, &dst)
        .with_context(|| format!("copying {} to {}", object.display(), dst.display()))?;
    Ok(())
}

/// Runs the nested cargo in `target_dir` and returns the path of the built object.
fn build(workspace_root: &Path, target_dir: &Path) -> anyhow::Result<PathBuf> {
    let endian = std::env::var("CARGO_CFG_TARGET_ENDIAN").context("CARGO_CFG_TARGET_ENDIAN")?;
    let target = match endian.as_str() {
        "little" => "bpfel-unknown-none",
        "big" => "bpfeb-unknown-none",
        other => bail!("unsupported target endianness {other}"),
    };
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").context("CARGO_CFG_TARGET_ARCH")?;
    // aya-ebpf's bpf_target_arch (the architecture whose kernel structures the
    // program reads); aya calls riscv64gc and the like riscv64.
    let arch = if arch.starts_with("riscv64") {
        "riscv64"
    } else {
        &arch
    };

    let mut cmd = Command::new("rustup");
    cmd.args(["run", "nightly", "cargo", "build"])
        .args(["--package", EBPF_PACKAGE, "--bins", "--release"])
        .args(["--target", target, "-Z", "build-std=core"])
        .arg("--target-dir")
        .arg(target_dir)
        .arg("--message-format=json-render-diagnostics")
        .current_dir(workspace_root);
    // What cargo set for this script describes this crate's build (its
    // profile, target cfgs, OUT_DIR, the stable rustc and clippy's wrapper).
    // Passed on, it would differ between a debug and a release build or a
    // build and a clippy run, and could make the nested build think its own
    // outputs stale; the nested cargo sets its own.
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(set_by_cargo_for_this_script) {
            cmd.env_remove(&key);
        }
    }
    cmd.env(
        "CARGO_ENCODED_RUSTFLAGS",
        [
            format!("--cfg=bpf_target_arch=\"{arch}\""),
            "-Cdebuginfo=2".to_owned(),
            "-Clink-arg=--btf".to_owned(),
        ]
        .join("\x1f"),
    );
    // The nested cargo's progress and diagnostics go to this script's stderr:
    // cargo shows it when the build fails (and with -vv), and does not replay
    // it as warnings on every later build.
    cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());

    let mut child = cmd.spawn().with_context(|| {
        format!(
            "starting {cmd:?} (run `cargo xtask setup` first: it installs nightly rust-src and bpf-linker 0.10.0)"
        )
    })?;
    let stdout = child.stdout.take().context("nested cargo's stdout")?;
    let mut object = None;
    for message in Message::parse_stream(BufReader::new(stdout)) {
        match message.context("reading the nested cargo's JSON messages")? {
            Message::CompilerArtifact(Artifact {
                target,
                executable: Some(executable),
                ..
            }) if target.name == EBPF_BIN => object = Some(executable.into_std_path_buf()),
            Message::TextLine(line) => eprintln!("{line}"),
            _ => {}
        }
    }
    let status = child
        .wait()
        .with_context(|| format!("waiting for {cmd:?}"))?;
    if !status.success() {
        bail!(
            "building the eBPF program failed ({status}): {cmd:?} \
             (run `cargo xtask setup` first: it installs nightly rust-src and bpf-linker 0.10.0)"
        );
    }
    object.ok_or_else(|| anyhow!("{cmd:?} reported no `{EBPF_BIN}` executable"))
}

/// Whether cargo set `name` for this build script (it describes the outer
/// build, not the nested one). `CARGO_MAKEFLAGS` stays: it hands the outer
/// build's jobserver to the nested cargo.
fn set_by_cargo_for_this_script(name: &str) -> bool {
    const PREFIXES: [&str; 4] = ["CARGO_CFG_", "CARGO_FEATURE_", "CARGO_PKG_", "DEP_"];
    PREFIXES.iter().any(|p| name.starts_with(p))
        || matches!(
            name,
            "OUT_DIR"
                | "TARGET"
                | "HOST"
                | "NUM_JOBS"
                | "OPT_LEVEL"
                | "DEBUG"
                | "PROFILE"
                | "RUSTC"
                | "RUSTDOC"
                | "RUSTC_LINKER"
                | "RUSTC_WORKSPACE_WRAPPER"
                | "CARGO_ENCODED_RUSTFLAGS"
                | "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_PRIMARY_PACKAGE"
        )
}
