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
        "rustdoc -D warnings (host crates, their own docs: every intra-doc link resolves)",
        cmd::cargo()
            .args([
                "doc",
                "--workspace",
                "--exclude",
                "waitroom-ebpf",
                "--no-deps",
            ])
            .env("RUSTDOCFLAGS", "-D warnings"),
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
        // origin comes from the debug build, and the test binary is the one
        // the workspace's run built (`run_test_binary`).
        cmd::run(
            "building the release node and aggregator for the connection deadlines test",
            &mut crate::package::build_release_binaries(),
        )?;
        let dirs = std::env::join_paths([
            cmd::target_dir().join("release"),
            cmd::target_dir().join("debug"),
        ])?;
        let (p, f, i) = run_test_binary(
            "connection deadlines against the optimized node (p99 < 500 ms)",
            "connections",
            &dirs,
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
fn cargo_test(what: &str, select: &[&str], extra: &[String]) -> Result<(u64, u64, u64)> {
    cmd::step(what);
    let mut command = cmd::cargo();
    command
        .arg("test")
        .args(select)
        .args(["--no-fail-fast", "--"])
        .args(extra)
        .current_dir(cmd::workspace_root());
    count_results(command, "cargo test")
}

/// Runs the integration test binary `name` that the workspace's
/// `cargo test` built, with `bin_dirs` (a `:`-separated list) as
/// `WAITROOM_BIN_DIR`: the test starts the binaries found there first.
///
/// Directly, not through `cargo test --test NAME`: cargo resolves that
/// selection's features apart from the workspace's and built the node and
/// the test crate once more for it (25-38 s of every CI run). The
/// executable's path comes from `cargo test --no-run` with the workspace's
/// own selection, which builds nothing.
fn run_test_binary(what: &str, name: &str, bin_dirs: &std::ffi::OsStr) -> Result<(u64, u64, u64)> {
    cmd::step(what);
    let listing = cmd::output(
        cmd::cargo()
            .args(["test", "--workspace", "--no-run", "--message-format=json"])
            .current_dir(cmd::workspace_root()),
    )
    .ok_or_else(|| anyhow::anyhow!("cargo test --no-run failed"))?;
    let (executable, manifest) = test_executable(&listing, name)
        .ok_or_else(|| anyhow::anyhow!("no test binary named {name} in the workspace's build"))?;
    let mut command = Command::new(&executable);
    // As cargo runs it: in its package's directory.
    if let Some(dir) = std::path::Path::new(&manifest).parent() {
        command.current_dir(dir);
    }
    command.env("WAITROOM_BIN_DIR", bin_dirs);
    count_results(command, &executable)
}

/// The executable and manifest of the test target `name` in cargo's JSON
/// messages (`--message-format=json`), read as `waitroom-edge/build.rs`
/// reads the nested eBPF build's.
fn test_executable(messages: &str, name: &str) -> Option<(String, String)> {
    use cargo_metadata::{Artifact, Message, TargetKind};
    Message::parse_stream(messages.as_bytes()).find_map(|message| match message.ok()? {
        Message::CompilerArtifact(Artifact {
            target,
            executable: Some(executable),
            manifest_path,
            ..
        }) if target.name == name && target.is_kind(TargetKind::Test) => {
            Some((executable.into_string(), manifest_path.into_string()))
        }
        _ => None,
    })
}

/// Runs `command`, echoing its standard output, and adds up its `test
/// result:` lines (passed, failed, ignored).
fn count_results(mut command: Command, what: &str) -> Result<(u64, u64, u64)> {
    use std::io::{BufRead as _, BufReader};
    let mut child = command.stdout(std::process::Stdio::piped()).spawn()?;
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
        anyhow::bail!("{what} failed ({status}) before any test failed: see above");
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

#[cfg(test)]
mod tests {
    use super::test_executable;

    #[test]
    fn the_named_test_binary_is_found_among_cargos_messages() {
        // Messages as cargo 1.95 prints them (paths shortened): a library
        // and a test of other names, a progress line, the test, the end.
        let artifact = |name: &str, kind: &str, exe: Option<&str>| {
            let file = exe.unwrap_or("/w/target/debug/deps/libconnections.rlib");
            let exe = exe.map_or("null".to_owned(), |e| format!("\"{e}\""));
            format!(
                r#"{{"reason":"compiler-artifact","package_id":"path+file:///w/tests#waitroom-tests@0.1.0","manifest_path":"/w/tests/Cargo.toml","target":{{"kind":["{kind}"],"crate_types":["bin"],"name":"{name}","src_path":"/w/tests/tests/{name}.rs","edition":"2024","doc":false,"doctest":false,"test":true}},"profile":{{"opt_level":"0","debuginfo":"line-tables-only","debug_assertions":true,"overflow_checks":true,"test":true}},"features":[],"filenames":["{file}"],"executable":{exe},"fresh":true}}"#
            )
        };
        let messages = [
            artifact("connections", "lib", None),
            "not json: cargo's own progress line".to_owned(),
            artifact("edge", "test", Some("/w/target/debug/deps/edge-1")),
            artifact(
                "connections",
                "test",
                Some("/w/target/debug/deps/connections-2"),
            ),
            r#"{"reason":"build-finished","success":true}"#.to_owned(),
        ]
        .join("\n");
        assert_eq!(
            test_executable(&messages, "connections"),
            Some((
                "/w/target/debug/deps/connections-2".to_owned(),
                "/w/tests/Cargo.toml".to_owned()
            ))
        );
        assert_eq!(test_executable(&messages, "absent"), None);
    }
}
