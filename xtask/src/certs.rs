//! `cargo xtask certs`: a development CA, the aggregator's server certificate
//! (SANs `localhost`, `127.0.0.1`, `::1`, `aggregator.waitroom.internal`) and
//! client certificates `node-1` .. `node-N` (or the names given with
//! `--name`), for gossip over mutual TLS. The aggregator takes a node's id from
//! its certificate, so each node's `node.id` must be one of these names.
//!
//! The certificates are made by `waitroom-aggregator gen-certs` (rcgen, in
//! `waitroom_runtime::devcerts`), so xtask, the tests and operators trying the
//! aggregator by hand all get the same kind of certificate from one place.
use std::path::PathBuf;

use anyhow::Result;

use crate::cmd;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory for the PEM files (default: target/certs).
    #[arg(long)]
    out: Option<PathBuf>,
    /// How many node certificates to make.
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// Node names (each node's `node.id`) instead of `node-1` .. `node-N`; repeatable.
    #[arg(long = "name")]
    names: Vec<String>,
}

pub fn run(args: &Args) -> Result<()> {
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| cmd::workspace_root().join("target/certs"));
    let out = if out.is_absolute() {
        out
    } else {
        std::env::current_dir()?.join(out)
    };
    cmd::run(
        "making development certificates",
        cmd::cargo()
            .args([
                "run",
                "--quiet",
                "--package",
                "waitroom-aggregator",
                "--bin",
                "waitroom-aggregator",
                "--",
            ])
            .arg("gen-certs")
            .arg("--out")
            .arg(&out)
            .arg("--nodes")
            .arg(args.nodes.to_string())
            .args(args.names.iter().flat_map(|n| ["--name", n.as_str()])),
    )?;
    println!("certificates in {}", out.display());
    Ok(())
}
