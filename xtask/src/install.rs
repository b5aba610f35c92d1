//! `cargo xtask install [--prefix DIR] [--root DIR]`: the binaries, the systemd
//! units, a commented example config, man pages and completions, the
//! `waitroom` user (sysusers.d) and who owns what (tmpfiles.d), and
//! development certificates where none exist: the same layout and owners as
//! the Debian packages (`cargo xtask package`), from the same `deploy/` files. Idempotent: binaries and units are replaced atomically, an operator's
//! own `edge.toml`/`aggregator.toml` and certificates are never overwritten.
//!
//! `--root` stages everything under a directory (for packaging, and for the
//! test that checks the result with `systemd-analyze verify`).
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::cmd;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where the binaries live on the target system.
    #[arg(long, default_value = "/usr/local")]
    prefix: PathBuf,
    /// Stage everything under this directory instead of `/`.
    #[arg(long, default_value = "/")]
    root: PathBuf,
    /// Skip building (use the binaries already in target/).
    #[arg(long)]
    no_build: bool,
    /// Install the debug binaries (for the test that checks a staged install).
    #[arg(long)]
    debug: bool,
}

/// A staged install of the debug binaries under `root`, checked with
/// `systemd-analyze verify` (what `cargo xtask test` runs).
pub fn staged_check(root: &Path) -> Result<()> {
    run(&Args {
        prefix: PathBuf::from("/usr/local"),
        root: root.to_owned(),
        no_build: true,
        debug: true,
    })
}

pub fn run(args: &Args) -> Result<()> {
    let ws = cmd::workspace_root();
    let profile = if args.debug { "debug" } else { "release" };
    if !args.no_build {
        let mut build = cmd::cargo();
        build.args([
            "build",
            "--package",
            "waitroom-edge",
            "--package",
            "waitroom-aggregator",
            "--bins",
        ]);
        if !args.debug {
            build.arg("--release");
        }
        cmd::run(&format!("building {profile} binaries"), &mut build)?;
    }
    let root = absolute(&args.root)?;
    let prefix = &args.prefix;
    let staged = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
    let bindir = prefix.join("bin");
    let docdir = prefix.join("share/doc/waitroom");
    let confdir = PathBuf::from("/etc/waitroom");
    let unitdir = PathBuf::from("/etc/systemd/system");
    let mandir = prefix.join("share/man/man1");
    for d in [&bindir, &docdir, &confdir, &unitdir, &mandir] {
        std::fs::create_dir_all(staged(d))
            .with_context(|| format!("creating {}", staged(d).display()))?;
    }

    cmd::step(&format!("installing into {}", root.display()));
    for bin in ["waitroom-edge", "waitroom-aggregator"] {
        let from = ws.join("target").join(profile).join(bin);
        if !from.exists() {
            bail!(
                "{} is missing: build with `cargo build{} -p waitroom-edge -p waitroom-aggregator --bins`",
                from.display(),
                if args.debug { "" } else { " --release" }
            );
        }
        replace(&staged(&bindir.join(bin)), &std::fs::read(&from)?, 0o755)?;
    }
    // sysusers.d and tmpfiles.d read /etc, not /usr/local: the local admin's place.
    for (from, to) in crate::package::SHARED {
        let to = Path::new("/etc").join(to.trim_start_matches("usr/lib/"));
        std::fs::create_dir_all(staged(to.parent().unwrap_or(&to)))?;
        replace(
            &staged(&to),
            &std::fs::read(ws.join("deploy").join(from))?,
            0o644,
        )?;
    }
    for bin in ["waitroom-edge", "waitroom-aggregator"] {
        let generated = tempdir(&format!("waitroom-docs-{bin}"))?;
        let ok = Command::new(staged(&bindir.join(bin)))
            .arg("generate-docs")
            .arg("--out")
            .arg(&generated)
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            for page in std::fs::read_dir(generated.join("man"))? {
                let page = page?.path();
                let name = page.file_name().unwrap_or_default().to_owned();
                replace(&staged(&mandir).join(name), &std::fs::read(&page)?, 0o644)?;
            }
            for (file, to) in [
                (
                    format!("{bin}.bash"),
                    format!("share/bash-completion/completions/{bin}"),
                ),
                (
                    format!("_{bin}"),
                    format!("share/zsh/vendor-completions/_{bin}"),
                ),
                (
                    format!("{bin}.fish"),
                    format!("share/fish/vendor_completions.d/{bin}.fish"),
                ),
            ] {
                let to = staged(&prefix.join(to));
                std::fs::create_dir_all(to.parent().unwrap_or(&to))?;
                replace(
                    &to,
                    &std::fs::read(generated.join("completions").join(file))?,
                    0o644,
                )?;
            }
        } else {
            println!("    {bin} generate-docs failed: no man pages or completions");
        }
        let _ = std::fs::remove_dir_all(&generated);
    }
    for unit in ["waitroom-edge.service", "waitroom-aggregator.service"] {
        let text = std::fs::read_to_string(ws.join("deploy/systemd").join(unit))?
            .replace("@BINDIR@", &bindir.display().to_string())
            .replace("@DOCDIR@", &docdir.display().to_string())
            .replace("@CONFDIR@", &confdir.display().to_string());
        replace(&staged(&unitdir.join(unit)), text.as_bytes(), 0o644)?;
    }
    for (example, live) in [
        ("edge.example.toml", "edge.toml"),
        ("aggregator.example.toml", "aggregator.toml"),
    ] {
        let text = std::fs::read(ws.join("deploy").join(example))?;
        replace(&staged(&confdir.join(example)), &text, 0o644)?;
        let live = staged(&confdir.join(live));
        if live.exists() {
            println!("    kept {} (yours)", live.display());
        } else {
            replace(&live, &text, 0o640)?;
        }
    }
    for doc in ["docs/OPERATIONS.md", "README.md"] {
        if let Ok(text) = std::fs::read(ws.join(doc)) {
            let name = Path::new(doc).file_name().unwrap_or_default();
            replace(&staged(&docdir).join(name), &text, 0o644)?;
        }
    }
    let certs = staged(&confdir.join("certs"));
    let made_certs = !certs.join("ca.pem").exists();
    if !made_certs {
        println!("    kept the certificates in {}", certs.display());
    } else {
        cmd::run(
            "making development certificates (replace them with your own CA's for production)",
            Command::new(staged(&bindir.join("waitroom-aggregator")))
                .args(["gen-certs", "--nodes", "2", "--out"])
                .arg(&certs),
        )?;
    }
    if root == Path::new("/") {
        ensure_user()?;
        set_owners(made_certs.then_some(certs.as_path()))?;
        println!(
            "    next: edit {}/edge.toml, then `systemctl daemon-reload && systemctl enable --now waitroom-edge`",
            confdir.display()
        );
    }
    if which("systemd-analyze") {
        verify_units(&root, &unitdir, &[&bindir, &confdir])?;
    }
    println!("==> installed");
    Ok(())
}

/// `systemd-analyze verify` on the installed units, with their absolute paths
/// mapped into the staging root so the binaries they name are found.
fn verify_units(root: &Path, unitdir: &Path, dirs: &[&Path]) -> Result<()> {
    let check = tempdir("waitroom-unit-check")?;
    let mut files = Vec::new();
    for unit in ["waitroom-edge.service", "waitroom-aggregator.service"] {
        let mut text = std::fs::read_to_string(root.join(unitdir.strip_prefix("/")?).join(unit))?;
        if root != Path::new("/") {
            for d in dirs {
                let mapped = root.join(d.strip_prefix("/")?);
                text = text.replace(
                    &format!("{}/", d.display()),
                    &format!("{}/", mapped.display()),
                );
            }
        }
        let path = check.join(unit);
        std::fs::write(&path, text)?;
        files.push(path);
    }
    let result = cmd::run(
        "systemd-analyze verify (the installed units)",
        Command::new("systemd-analyze").arg("verify").args(&files),
    );
    let _ = std::fs::remove_dir_all(&check);
    result
}

/// What the package scripts do: tmpfiles.d gives the config files and the
/// certificate directory to the group `waitroom`; freshly made certificates
/// are made readable by it (the CA key stays root's).
fn set_owners(new_certs: Option<&Path>) -> Result<()> {
    if !cmd::is_root() {
        println!(
            "    not root: run `systemd-tmpfiles --create waitroom.conf` as root so the services can read their config"
        );
        return Ok(());
    }
    if which("systemd-tmpfiles") {
        cmd::run(
            "systemd-tmpfiles --create waitroom.conf (owners and modes of /etc/waitroom, /var/lib/waitroom)",
            Command::new("systemd-tmpfiles").args(["--create", "waitroom.conf"]),
        )?;
    } else {
        println!("    no systemd-tmpfiles: apply /etc/tmpfiles.d/waitroom.conf by hand");
    }
    if let Some(certs) = new_certs {
        cmd::run(
            "certificates readable by the group waitroom (the CA key root's alone)",
            Command::new("sh")
                .arg("-c")
                .arg(crate::package::fix_cert_modes_sh(
                    &certs.display().to_string(),
                )),
        )?;
    }
    Ok(())
}

fn ensure_user() -> Result<()> {
    if !cmd::is_root() {
        println!("    not root: create the system user yourself: systemd-sysusers waitroom.conf");
        return Ok(());
    }
    if which("systemd-sysusers") {
        return cmd::run(
            "systemd-sysusers waitroom.conf (the system user waitroom)",
            Command::new("systemd-sysusers").arg("waitroom.conf"),
        );
    }
    if Command::new("id")
        .arg("waitroom")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok(());
    }
    cmd::run(
        "creating the system user waitroom",
        Command::new("useradd").args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            "waitroom",
        ]),
    )
}

/// Writes `bytes` to `path` via a temporary file and a rename (atomic replace,
/// so a running binary is never half-written).
fn replace(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let tmp = path.with_extension("installing");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
    std::fs::rename(&tmp, path).with_context(|| format!("installing {}", path.display()))?;
    println!("    {}", path.display());
    Ok(())
}

fn absolute(p: &Path) -> Result<PathBuf> {
    Ok(if p.is_absolute() {
        p.to_owned()
    } else {
        std::env::current_dir()?.join(p)
    })
}

fn tempdir(tag: &str) -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

fn which(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}
