//! Builds the XDP program (`waitroom-ebpf`) with nightly for `bpfel-unknown-none` and
//! leaves the object in `OUT_DIR/waitroom`, where `src/xdp` embeds it.
//!
//! `AYA_BUILD_SKIP=1` skips the eBPF build (for lint-only runs); the node then
//! embeds an empty object and runs with userspace telemetry only.
use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = metadata
        .packages
        .into_iter()
        .find(|p| p.name.as_str() == "waitroom-ebpf")
        .ok_or_else(|| anyhow!("waitroom-ebpf package not found in the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("waitroom-ebpf manifest has no parent directory"))?
        .as_str()
        .to_owned();

    let skip =
        std::env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        let out_dir = std::env::var("OUT_DIR").context("OUT_DIR not set")?;
        std::fs::write(std::path::Path::new(&out_dir).join("waitroom"), [])
            .context("writing the empty eBPF placeholder")?;
    }
    aya_build::build_ebpf(
        [Package {
            name: "waitroom-ebpf",
            root_dir: &root_dir,
            ..Default::default()
        }],
        Toolchain::default(),
    )
    .context("building the eBPF program (run `cargo xtask setup` first: it installs nightly rust-src and bpf-linker 0.10.0)")
}
