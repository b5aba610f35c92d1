//! `cargo xtask fuzz [NAME] [--seconds N]`: the cargo-fuzz targets in `fuzz/`.
//!
//! The targets are the parsers that read what others wrote: a visitor's
//! cookie, a peer's gossip frame, an operator's config, a request's host and
//! path. `cargo xtask test` runs each for [`CI_SECONDS`] and fails on a
//! crash; this verb runs one (or all) for longer.
//!
//! The committed seeds (`fuzz/corpus/NAME`) are read, never written: new
//! inputs libFuzzer finds go to `target/fuzz/corpus/NAME` and crashes to
//! `target/fuzz/artifacts/NAME/`, so a run leaves the tree clean. Fold good
//! finds back with `cargo fuzz cmin NAME` and commit the few that matter.
//! Builds use nightly and `AYA_BUILD_SKIP=1` (no target needs the eBPF
//! object), without a sanitizer: the targets are safe Rust, where a bug shows
//! as a panic that libFuzzer catches, and an AddressSanitizer build of the
//! node's dependencies took most of half an hour on this machine kind, more
//! than CI's share for fuzzing.
use std::{path::PathBuf, process::Command};

use anyhow::{Result, bail};

use crate::cmd;

/// The targets, each with what it feeds.
pub const TARGETS: &[(&str, &str)] = &[
    ("cookie_open", "cookie values a visitor sends"),
    ("wire_decode", "gossip frames from a peer"),
    ("config_parse", "the node's TOML configuration"),
    // The router normalizes the target first (`waitroom_edge::target`).
    (
        "room_find",
        "request host and path, normalized and routed to a room",
    ),
    (
        "xdp_parse",
        "frames the XDP program parses (its parser, run in userspace)",
    ),
    (
        "h1_plain",
        "request heads the node's own HTTP/1 exchange serves or hands to hyper",
    ),
    (
        "origin_answer",
        "a plain-HTTP origin's answer heads, as lines to the visitor and as a map",
    ),
];

/// Seconds each target runs in `cargo xtask test` (7 targets: about 3 min).
pub const CI_SECONDS: u64 = 25;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The target to run (all of them when absent): cookie_open, wire_decode,
    /// config_parse, room_find, xdp_parse, h1_plain, origin_answer.
    name: Option<String>,
    /// How long each target runs.
    #[arg(long, default_value_t = 300)]
    seconds: u64,
}

pub fn run(args: &Args) -> Result<()> {
    let names: Vec<&str> = match &args.name {
        Some(name) => {
            let Some((known, _)) = TARGETS.iter().find(|(t, _)| t == name) else {
                bail!(
                    "no fuzz target {name}; the targets are: {}",
                    TARGETS
                        .iter()
                        .map(|(t, _)| *t)
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            };
            vec![known]
        }
        None => TARGETS.iter().map(|(t, _)| *t).collect(),
    };
    run_targets(&names, args.seconds, Build::Optimized)
}

/// Every target for [`CI_SECONDS`] (the `cargo xtask test` step).
pub fn run_all_bounded() -> Result<()> {
    let names: Vec<&str> = TARGETS.iter().map(|(t, _)| *t).collect();
    run_targets(&names, CI_SECONDS, Build::Quick)
}

/// How the targets are built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Build {
    /// Optimized (cargo-fuzz's release build, 16 codegen units): the most
    /// executions per second, for runs of minutes (`cargo xtask fuzz`).
    Optimized,
    /// Unoptimized (`--dev`): the whole node's dependency tree, instrumented,
    /// in about half the time of the optimized build (which took 7 of CI's
    /// 40 minutes with one codegen unit or sixteen alike: two cores are busy
    /// either way). Fewer executions per second, which CI's 25 s per target
    /// can spare: they are a smoke check of every parser, not a search.
    Quick,
}

fn run_targets(names: &[&str], seconds: u64, build: Build) -> Result<()> {
    let root = cmd::workspace_root();
    let fuzz_dir = root.join("fuzz");
    cmd::run(
        "cargo fmt --check (fuzz crate)",
        Command::new("cargo")
            .current_dir(&fuzz_dir)
            .args(["fmt", "--", "--check"]),
    )?;
    cmd::run(
        "building the fuzz targets (nightly, no sanitizer)",
        &mut cargo_fuzz(&root, &["build"], build),
    )?;
    let mut failed = Vec::new();
    for name in names {
        let scratch = root.join("target/fuzz/corpus").join(name);
        let artifacts = root.join("target/fuzz/artifacts").join(name);
        std::fs::create_dir_all(&scratch)?;
        std::fs::create_dir_all(&artifacts)?;
        let seeds = fuzz_dir.join("corpus").join(name);
        let mut artifact_prefix = artifacts.into_os_string();
        artifact_prefix.push("/");
        let mut fuzz = cargo_fuzz(&root, &["run", name], build);
        fuzz.arg(&scratch).arg(&seeds).arg("--").args([
            format!("-max_total_time={seconds}"),
            // One input taking seconds is a bug too (a quadratic parser).
            "-timeout=10".to_owned(),
            "-rss_limit_mb=2048".to_owned(),
            "-print_final_stats=1".to_owned(),
        ]);
        fuzz.arg(format!(
            "-artifact_prefix={}",
            PathBuf::from(artifact_prefix).display()
        ));
        if let Err(err) = cmd::run(&format!("fuzzing {name} for {seconds} s"), &mut fuzz) {
            println!("    {name}: {err:#}");
            failed.push(*name);
        }
    }
    if !failed.is_empty() {
        bail!(
            "fuzz targets failed: {} (the crashing inputs are in target/fuzz/artifacts/NAME/; replay one with `cargo +nightly fuzz run NAME FILE` in fuzz/)",
            failed.join(", ")
        );
    }
    Ok(())
}

/// `cargo +nightly fuzz SUBCOMMAND` in `fuzz/`, built in `fuzz/target`
/// (cargo-fuzz's own default, whatever `CARGO_TARGET_DIR` the caller has:
/// other flags and another toolchain than the workspace's build).
fn cargo_fuzz(root: &std::path::Path, args: &[&str], build: Build) -> Command {
    let mut c = Command::new("cargo");
    crate::cmd::without_run_env(&mut c);
    c.current_dir(root.join("fuzz"))
        .arg("+nightly")
        .arg("fuzz")
        .args(args)
        // `run` must pass the same build flags as `build`, or it builds
        // everything again.
        .args(["--sanitizer", "none"])
        .args(match build {
            Build::Optimized => ["--codegen-units", "16"].as_slice(),
            Build::Quick => ["--dev"].as_slice(),
        })
        .env("AYA_BUILD_SKIP", "1")
        .env("CARGO_TARGET_DIR", root.join("fuzz/target"));
    c
}
