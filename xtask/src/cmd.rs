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

/// A `cargo` command for the toolchain xtask was started with.
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// True when this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}
