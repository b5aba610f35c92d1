//! `cargo xtask VERB`: the project's automation, one file per verb.
//!
//! - `setup`: installs what a fresh machine lacks (idempotent).
//! - `package`: Debian packages of both services, checked by lintian.
//! - `boot-test`: the packages under a real systemd (also run by `test` as root).
//! - `test`: setup, fmt, clippy, every test (privileged ones too when root).
//! - `demo`: a waitroom node in front of a demo origin, on loopback.
//! - `certs`: a development CA and gossip certificates for the aggregator and nodes.
//! - `simulate`: the real engine in seeded virtual time (accuracy, fairness).
//! - `fuzz`: the cargo-fuzz targets, for longer than `test` runs them.
use anyhow::Result;
use clap::{Parser, Subcommand};

mod bench;
mod boot_test;
mod certs;
mod cmd;
mod demo;
mod demo_traffic;
mod fuzz;
mod install;
mod package;
mod setup;
mod simulate;
mod test;

#[derive(Debug, Parser)]
#[command(about = "waitroom project automation")]
struct Cli {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Debug, Subcommand)]
enum Verb {
    /// Install the binaries, systemd units, example configs and dev certificates.
    Install(install::Args),
    /// Build the Debian packages (waitroom-common, waitroom-edge, waitroom-aggregator) and run lintian.
    Package(package::Args),
    /// Package, boot a minimal Debian with systemd-nspawn, install and drive the units (root).
    BootTest(boot_test::Args),
    /// Admission latency and throughput under load, side by side with nginx.
    ///
    /// The default run is a subset of the full matrix: scenarios a, b, c, d
    /// (fast origin) and a-demo, both generators (loadgen, wrk), 1 and 2
    /// workers, the XDP runs as root and the access log's cost: about 11
    /// minutes. Add `--scenarios a,b,c,d,a-demo,b-demo` for the full matrix;
    /// narrow it with `--workers 1`, `--generators loadgen`, `--no-xdp`.
    Bench(bench::Args),
    /// Install the toolchain pieces and Debian packages the build and tests need.
    Setup,
    /// Run setup, formatting and lint checks, and every test.
    Test(test::Args),
    /// Start a demo: a waitroom node in front of a small built-in origin.
    Demo(demo::Args),
    /// Make a development CA and certificates for the aggregator and the nodes.
    Certs(certs::Args),
    /// Drive the real engine in seeded virtual time: accuracy scenarios and the fairness heatmaps.
    Simulate(simulate::Args),
    Fuzz(fuzz::Args),
}

fn main() -> Result<()> {
    match Cli::parse().verb {
        Verb::Setup => setup::run(),
        Verb::Install(args) => install::run(&args),
        Verb::Package(args) => package::run(&args).map(drop),
        Verb::BootTest(args) => boot_test::verb(&args),
        Verb::Bench(args) => bench::run(&args),
        Verb::Test(args) => test::run(&args),
        Verb::Demo(args) => demo::run(&args),
        Verb::Certs(args) => certs::run(&args),
        Verb::Simulate(args) => simulate::run(&args),
        Verb::Fuzz(args) => fuzz::run(&args),
    }
}
