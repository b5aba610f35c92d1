//! `cargo xtask package [--out DIR] [--no-build] [--no-lintian]`: Debian
//! packages built with `dpkg-deb`, no other tool.
//!
//! - `waitroom-common` (all): the `waitroom` system user (sysusers.d), who
//!   owns `/etc/waitroom` and `/var/lib/waitroom` (tmpfiles.d), the docs.
//! - `waitroom-edge`, `waitroom-aggregator` (this machine's architecture):
//!   the release binary (the edge's with its eBPF object inside), the unit,
//!   the config as a conffile in `/etc/waitroom`, man pages and completions
//!   generated from the binary's own clap definition.
//!
//! As Debian's nginx and haproxy: the live config is a conffile (dpkg never
//! overwrites an edited one, and only purge deletes it), the service is
//! enabled and started on install and restarted on upgrade, the state and the
//! generated certificates go only on purge, the user is never removed.
//! `cargo xtask install` lays out the same files with the same owners from
//! the same `deploy/` sources (see [`SHARED`] and [`fix_cert_modes_sh`]).
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::cmd;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where the `.deb` files go (default: target/debian).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Use the release binaries already built.
    #[arg(long)]
    no_build: bool,
    /// Skip `lintian`.
    #[arg(long)]
    no_lintian: bool,
}

impl Args {
    /// What `cargo xtask test` and `boot-test` package with: lintian included.
    pub fn for_test(no_build: bool) -> Self {
        Self {
            out: None,
            no_build,
            no_lintian: false,
        }
    }
}

const MAINTAINER: &str = "waitroom maintainers <maintainers@example.invalid>";

/// Files from `deploy/` that both services share, and where they go.
pub const SHARED: [(&str, &str); 2] = [
    (
        "sysusers.d/waitroom.conf",
        "usr/lib/sysusers.d/waitroom.conf",
    ),
    (
        "tmpfiles.d/waitroom.conf",
        "usr/lib/tmpfiles.d/waitroom.conf",
    ),
];

/// Shell that gives the service group read access to the certificates a
/// service uses, and keeps the CA key root's alone. Run after `gen-certs`
/// by the aggregator's postinst and by `cargo xtask install`.
pub fn fix_cert_modes_sh(certs: &str) -> String {
    format!(
        "for f in {certs}/*.pem {certs}/*.key; do [ -e \"$f\" ] && chgrp waitroom \"$f\" && chmod 0640 \"$f\"; done\n\
         [ -e {certs}/ca.key ] && chgrp root {certs}/ca.key && chmod 0600 {certs}/ca.key\n\
         true\n"
    )
}

struct Binary {
    name: &'static str,
    config: &'static str,
    summary: &'static str,
    long: &'static str,
    /// Extra postinst lines (before the service starts).
    postinst_extra: String,
}

/// The release build of both services, as packaged (`cargo xtask test` and
/// `cargo xtask install` run the same command, so none rebuilds for another).
///
/// One build, not one per binary: built apart, the two resolve different
/// features for shared dependencies (the aggregator's etcd client turns on
/// rustls' `logging` and more of `syn` for its proc-macros), so the second
/// build compiled most of the graph again (234 s of a CI run). Built
/// together the node gains rustls' `log` calls; waitroom-runtime's
/// `devcerts` (the aggregator's certificate generator) is compiled but never
/// called by the node, so the linker drops it (`nm` finds no rcgen symbol in
/// the node).
pub fn build_release_binaries() -> Command {
    let mut c = cmd::cargo();
    c.args([
        "build",
        "--release",
        "--package",
        "waitroom-edge",
        "--package",
        "waitroom-aggregator",
        "--bins",
    ]);
    c
}

pub fn run(args: &Args) -> Result<Vec<PathBuf>> {
    let ws = cmd::workspace_root();
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| ws.join("target"), PathBuf::from);
    let out = args.out.clone().unwrap_or_else(|| target.join("debian"));
    if !args.no_build {
        cmd::run(
            "building the release node (with its eBPF object) and aggregator",
            &mut build_release_binaries(),
        )?;
    }
    let version = workspace_version(&ws)?;
    let arch = cmd::output(Command::new("dpkg").arg("--print-architecture"))
        .context("dpkg --print-architecture: is this Debian?")?
        .trim()
        .to_owned();
    let date =
        cmd::output(
            Command::new("git")
                .args(["-C"])
                .arg(&ws)
                .args(["log", "-1", "--format=%cD"]),
        )
        .map_or_else(
            || "Thu, 01 Jan 1970 00:00:00 +0000".to_owned(),
            |d| d.trim().to_owned(),
        );
    let stage = target.join("debian-stage");
    let _ = std::fs::remove_dir_all(&stage);
    std::fs::create_dir_all(&out)?;
    let mut debs = Vec::new();

    cmd::step("staging waitroom-common");
    let dir = stage.join("waitroom-common");
    for (from, to) in SHARED {
        put(
            &dir,
            to,
            &std::fs::read(ws.join("deploy").join(from))?,
            0o644,
        )?;
    }
    if let Ok(text) = std::fs::read(ws.join("docs/OPERATIONS.md")) {
        put(
            &dir,
            "usr/share/doc/waitroom-common/OPERATIONS.md.gz",
            &gzip(&text)?,
            0o644,
        )?;
    }
    common_docs(&dir, "waitroom-common", &version, &date)?;
    let control = Control {
        package: "waitroom-common",
        version: &version,
        arch: "all",
        depends: "systemd".to_owned(),
        summary: "virtual waiting room - shared system user and directories",
        long: "The waitroom system user (sysusers.d) and the ownership of\n /etc/waitroom and /var/lib/waitroom (tmpfiles.d), shared by the\n waitroom-edge and waitroom-aggregator packages, and the operations guide.",
    };
    let scripts = [
        (
            "postinst",
            "if [ \"$1\" = configure ]; then\n\
             \tsystemd-sysusers waitroom.conf\n\
             \tsystemd-tmpfiles --create waitroom.conf || true\n\
             fi\n"
                .to_owned(),
        ),
        (
            "postrm",
            "if [ \"$1\" = purge ]; then\n\
             \t# The state and the generated certificates; dpkg removes the conffiles.\n\
             \trm -rf /var/lib/waitroom /etc/waitroom/certs\n\
             \trmdir --ignore-fail-on-non-empty /etc/waitroom 2>/dev/null || true\n\
             fi\n"
                .to_owned(),
        ),
    ];
    debs.push(build(&dir, &control, &scripts, &[], &out)?);

    let aggregator_extra = format!(
        "\t# First install without certificates: development ones so the service\n\
         \t# starts; replace them with your cluster CA's (see OPERATIONS.md).\n\
         \tif [ ! -e /etc/waitroom/certs/ca.pem ]; then\n\
         \t\twaitroom-aggregator gen-certs --nodes 2 --out /etc/waitroom/certs >/dev/null\n\
         \t\t{}\
         \tfi\n",
        fix_cert_modes_sh("/etc/waitroom/certs").replace('\n', "\n\t\t")
    );
    for bin in [
        Binary {
            name: "waitroom-edge",
            config: "edge",
            summary: "virtual waiting room - edge node",
            long: "Queues visitors in front of a web site when it is full and lets them in\n fairly, with an XDP program that sheds abusive clients in the kernel.",
            postinst_extra: String::new(),
        },
        Binary {
            name: "waitroom-aggregator",
            config: "aggregator",
            summary: "virtual waiting room - cluster aggregator",
            long: "Merges the reports of the waitroom edge nodes into the global state of\n every room and answers each node over QUIC with mutual TLS.",
            postinst_extra: aggregator_extra.clone(),
        },
    ] {
        cmd::step(&format!("staging {}", bin.name));
        let dir = stage.join(bin.name);
        let built = target.join("release").join(bin.name);
        if !built.exists() {
            bail!("{} is missing: run without --no-build", built.display());
        }
        let so_deps = shared_libraries(&built)?;
        let binary = dir.join("usr/bin").join(bin.name);
        put(
            &dir,
            &format!("usr/bin/{}", bin.name),
            &std::fs::read(&built)?,
            0o755,
        )?;
        // As dh_strip: debug info out (the eBPF object is data and stays).
        cmd::run(
            &format!("stripping {}", bin.name),
            Command::new("strip")
                .args([
                    "--remove-section=.comment",
                    "--remove-section=.note",
                    "--strip-unneeded",
                ])
                .arg(&binary),
        )?;
        let unit = std::fs::read_to_string(
            ws.join("deploy/systemd")
                .join(format!("{}.service", bin.name)),
        )?
        .replace("@BINDIR@", "/usr/bin")
        .replace("@DOCDIR@", "/usr/share/doc/waitroom-common")
        .replace("@CONFDIR@", "/etc/waitroom");
        put(
            &dir,
            &format!("lib/systemd/system/{}.service", bin.name),
            unit.as_bytes(),
            0o644,
        )?;
        let example = std::fs::read(
            ws.join("deploy")
                .join(format!("{}.example.toml", bin.config)),
        )?;
        let conffile = format!("/etc/waitroom/{}.toml", bin.config);
        put(&dir, &conffile[1..], &example, 0o644)?;
        let gen_dir = stage.join(format!("{}-docs", bin.name));
        cmd::run(
            &format!("generating {}'s man pages and completions", bin.name),
            Command::new(&built)
                .arg("generate-docs")
                .arg("--out")
                .arg(&gen_dir),
        )?;
        for page in std::fs::read_dir(gen_dir.join("man"))? {
            let page = page?.path();
            let name = page
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            put(
                &dir,
                &format!("usr/share/man/man1/{name}.gz"),
                &gzip(&std::fs::read(&page)?)?,
                0o644,
            )?;
        }
        for (file, to) in [
            (
                format!("{}.bash", bin.name),
                format!("usr/share/bash-completion/completions/{}", bin.name),
            ),
            (
                format!("_{}", bin.name),
                format!("usr/share/zsh/vendor-completions/_{}", bin.name),
            ),
            (
                format!("{}.fish", bin.name),
                format!("usr/share/fish/vendor_completions.d/{}.fish", bin.name),
            ),
        ] {
            put(
                &dir,
                &to,
                &std::fs::read(gen_dir.join("completions").join(file))?,
                0o644,
            )?;
        }
        common_docs(&dir, bin.name, &version, &date)?;
        let unit_name = format!("{}.service", bin.name);
        let postinst = format!(
            "if [ \"$1\" = configure ] || [ \"$1\" = abort-upgrade ] || [ \"$1\" = abort-deconfigure ] || [ \"$1\" = abort-remove ]; then\n\
             \t# The config file's group (tmpfiles.d/waitroom.conf).\n\
             \tsystemd-tmpfiles --create waitroom.conf || true\n\
             {extra}\
             \t# As dh_installsystemd: enable on first install, start, restart on upgrade.\n\
             \tif deb-systemd-helper --quiet was-enabled '{unit_name}'; then\n\
             \t\tdeb-systemd-helper enable '{unit_name}' >/dev/null || true\n\
             \telse\n\
             \t\tdeb-systemd-helper update-state '{unit_name}' >/dev/null || true\n\
             \tfi\n\
             \tif [ -d /run/systemd/system ]; then\n\
             \t\tsystemctl --system daemon-reload >/dev/null || true\n\
             \t\tif [ -n \"$2\" ]; then _action=restart; else _action=start; fi\n\
             \t\tdeb-systemd-invoke $_action '{unit_name}' >/dev/null || true\n\
             \tfi\n\
             fi\n",
            extra = bin.postinst_extra,
        );
        let prerm = format!(
            "if [ -d /run/systemd/system ] && [ \"$1\" = remove ]; then\n\
             \tdeb-systemd-invoke stop '{unit_name}' >/dev/null || true\n\
             fi\n"
        );
        let postrm = format!(
            "if [ \"$1\" = remove ] && [ -d /run/systemd/system ]; then\n\
             \tsystemctl --system daemon-reload >/dev/null || true\n\
             fi\n\
             if [ \"$1\" = purge ]; then\n\
             \tdeb-systemd-helper purge '{unit_name}' >/dev/null || true\n\
             fi\n"
        );
        let mut depends = vec![format!("waitroom-common (= {version})")];
        depends.extend(so_deps);
        let control = Control {
            package: bin.name,
            version: &version,
            arch: &arch,
            depends: depends.join(", "),
            summary: bin.summary,
            long: bin.long,
        };
        debs.push(build(
            &dir,
            &control,
            &[("postinst", postinst), ("prerm", prerm), ("postrm", postrm)],
            &[&conffile],
            &out,
        )?);
    }
    if !args.no_lintian {
        lintian(&debs)?;
    }
    println!("==> packages in {}", out.display());
    for deb in &debs {
        println!("    {}", deb.display());
    }
    Ok(debs)
}

struct Control<'a> {
    package: &'a str,
    version: &'a str,
    arch: &'a str,
    depends: String,
    summary: &'a str,
    long: &'a str,
}

/// Writes DEBIAN/ (control, md5sums, conffiles, scripts) and runs `dpkg-deb`.
fn build(
    dir: &Path,
    control: &Control<'_>,
    scripts: &[(&str, String)],
    conffiles: &[&str],
    out: &Path,
) -> Result<PathBuf> {
    let debian = dir.join("DEBIAN");
    std::fs::create_dir_all(&debian)?;
    let (size_kib, md5sums) = sizes_and_sums(dir)?;
    let text = format!(
        "Package: {}\nSource: waitroom\nVersion: {}\nArchitecture: {}\nMaintainer: {MAINTAINER}\n\
         Installed-Size: {size_kib}\nDepends: {}\nSection: net\nPriority: optional\n\
         Description: {}\n {}\n",
        control.package,
        control.version,
        control.arch,
        control.depends,
        control.summary,
        control.long
    );
    write_mode(&debian.join("control"), text.as_bytes(), 0o644)?;
    write_mode(&debian.join("md5sums"), md5sums.as_bytes(), 0o644)?;
    if !conffiles.is_empty() {
        write_mode(
            &debian.join("conffiles"),
            format!("{}\n", conffiles.join("\n")).as_bytes(),
            0o644,
        )?;
    }
    for (name, body) in scripts {
        write_mode(
            &debian.join(name),
            format!("#!/bin/sh\nset -e\n{body}").as_bytes(),
            0o755,
        )?;
    }
    let deb = out.join(format!(
        "{}_{}_{}.deb",
        control.package, control.version, control.arch
    ));
    cmd::run(
        &format!("dpkg-deb --build {}", deb.display()),
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zxz", "--build"])
            .arg(dir)
            .arg(&deb),
    )?;
    Ok(deb)
}

/// Copyright and changelog, which every Debian package carries.
fn common_docs(dir: &Path, package: &str, version: &str, date: &str) -> Result<()> {
    let copyright = "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
                     Upstream-Name: waitroom\n\n\
                     Files: *\nCopyright: 2026 the waitroom authors\nLicense: Apache-2.0\n \
                     On Debian systems, the full text of the Apache License 2.0 is in\n \
                     /usr/share/common-licenses/Apache-2.0.\n";
    put(
        dir,
        &format!("usr/share/doc/{package}/copyright"),
        copyright.as_bytes(),
        0o644,
    )?;
    let changelog = format!(
        "waitroom ({version}) unstable; urgency=medium\n\n  * Built by `cargo xtask package`.\n\n -- {MAINTAINER}  {date}\n"
    );
    put(
        dir,
        &format!("usr/share/doc/{package}/changelog.gz"),
        &gzip(changelog.as_bytes())?,
        0o644,
    )
}

/// Installed-Size in KiB and the md5sums file, over everything but DEBIAN/.
fn sizes_and_sums(dir: &Path) -> Result<(u64, String)> {
    let mut files = Vec::new();
    walk(dir, &mut files)?;
    files.sort();
    let mut size = 0;
    let mut sums = String::new();
    for f in files {
        let rel = f.strip_prefix(dir)?;
        if rel.starts_with("DEBIAN") {
            continue;
        }
        size += std::fs::metadata(&f)?.len().div_ceil(1024);
        let sum = cmd::output(Command::new("md5sum").arg(&f)).context("md5sum")?;
        let sum = sum.split_whitespace().next().unwrap_or_default();
        sums.push_str(&format!("{sum}  {}\n", rel.display()));
    }
    Ok((size, sums))
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            walk(&path, files)?;
        } else {
            files.push(path);
        }
    }
    Ok(())
}

/// The Debian packages providing the binary's shared libraries. Rust links
/// only glibc and libgcc_s; anything else is a surprise worth failing on.
fn shared_libraries(binary: &Path) -> Result<Vec<String>> {
    let dump = cmd::output(Command::new("objdump").arg("-p").arg(binary)).context("objdump -p")?;
    let mut deps = vec!["libc6 (>= 2.34)".to_owned()];
    for lib in dump.lines().filter_map(|l| l.trim().strip_prefix("NEEDED")) {
        match lib.trim() {
            "libc.so.6"
            | "libm.so.6"
            | "libpthread.so.0"
            | "libdl.so.2"
            | "librt.so.1"
            | "ld-linux-x86-64.so.2" => {}
            "libgcc_s.so.1" => deps.push("libgcc-s1".to_owned()),
            other => bail!(
                "{} links {other}: add its Debian package to package.rs",
                binary.display()
            ),
        }
    }
    Ok(deps)
}

fn lintian(debs: &[PathBuf]) -> Result<()> {
    cmd::step("lintian (any tag left is explained in docs/OPERATIONS.md, Packaging notes)");
    let out = Command::new("lintian")
        .args(["--tag-display-limit", "0"])
        .args(debs)
        .output()
        .context("running lintian: install it with `cargo xtask setup`")?;
    let text = String::from_utf8_lossy(&out.stdout);
    print!("{text}");
    let errors = text.lines().filter(|l| l.starts_with("E:")).count();
    if errors > 0 {
        bail!("lintian: {errors} errors");
    }
    Ok(())
}

fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    use std::io::Write as _;
    let mut child = Command::new("gzip")
        .args(["-9", "-n", "-c"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("gzip")?;
    child.stdin.take().context("gzip stdin")?.write_all(bytes)?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("gzip failed");
    }
    Ok(out.stdout)
}

/// Writes `bytes` at `rel` under `root`, creating directories (0755).
fn put(root: &Path, rel: &str, bytes: &[u8], mode: u32) -> Result<()> {
    let path = root.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    write_mode(&path, bytes, mode)
}

fn write_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn workspace_version(ws: &Path) -> Result<String> {
    let text = std::fs::read_to_string(ws.join("Cargo.toml"))?;
    text.lines()
        .skip_while(|l| l.trim() != "[workspace.package]")
        .find_map(|l| {
            l.strip_prefix("version = ")
                .map(|v| v.trim_matches('"').to_owned())
        })
        .context("no version in [workspace.package]")
}
