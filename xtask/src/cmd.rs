//! Running commands with the step printed first and failures named.
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

/// The workspace root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// Cargo's target directory (`CARGO_TARGET_DIR`, else `target/` in the workspace).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from)
}

/// Prints a step heading in the same shape everywhere.
pub fn step(what: &str) {
    println!("==> {what}");
}

/// Runs `cmd` in the workspace root, inheriting stdio; fails naming `what`.
pub fn run(what: &str, cmd: &mut Command) -> Result<()> {
    step(what);
    let started = Instant::now();
    let status = cmd
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("{what}: could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{what} failed ({status}); command: {cmd:?}");
    }
    println!("    done in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Runs `cmd` quietly and returns its stdout, or `None` when it could not run or failed.
pub fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A `cargo` command for the toolchain xtask was started with, without the
/// variables `cargo run` set for xtask itself (see [`without_run_env`]).
pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    without_run_env(&mut c);
    c
}

/// Removes from `c`'s environment what `cargo run` (the `cargo xtask` alias)
/// set for the xtask binary: `CARGO_MANIFEST_DIR=…/xtask`,
/// `CARGO_PKG_NAME=xtask` and the like. A cargo started by xtask must not
/// inherit them: build scripts such as ring's declare
/// `rerun-if-env-changed` on exactly these names, so a build run from xtask
/// and one run from a shell, or by the outer `cargo run` that builds xtask,
/// found each other's build-script output stale and rebuilt ring and every
/// crate above it (14 crates, 80 s here, on every switch between
/// `cargo xtask demo` and `cargo xtask test`).
pub fn without_run_env(c: &mut Command) -> &mut Command {
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(is_run_variable) {
            c.env_remove(key);
        }
    }
    c
}

/// Whether `name` is one of the variables cargo sets for a binary it runs
/// (not one a user sets to configure cargo, such as `CARGO_TARGET_DIR`).
fn is_run_variable(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_RUSTC_CURRENT_DIR"
        )
}

/// True when this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_cargo_does_not_inherit_what_cargo_run_set_for_xtask() {
        assert!(is_run_variable("CARGO_PKG_NAME") && is_run_variable("CARGO_MANIFEST_DIR"));
        for configuring in [
            "CARGO_TARGET_DIR",
            "CARGO_HOME",
            "CARGO",
            "CARGO_INCREMENTAL",
        ] {
            assert!(!is_run_variable(configuring), "{configuring}");
        }
        // `cargo test` sets CARGO_MANIFEST_DIR and CARGO_PKG_* for this
        // process as `cargo run` does for xtask.
        assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
        let c = cargo();
        let removed: Vec<&std::ffi::OsStr> = c
            .get_envs()
            .filter_map(|(key, value)| value.is_none().then_some(key))
            .collect();
        for (key, _) in std::env::vars_os() {
            if key.to_str().is_some_and(is_run_variable) {
                assert!(removed.contains(&key.as_os_str()), "{key:?} inherited");
            }
        }
        assert!(removed.contains(&std::ffi::OsStr::new("CARGO_MANIFEST_DIR")));
    }
}
