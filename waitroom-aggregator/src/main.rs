//! `waitroom-aggregator`: merges every node's report into the global state.
//! Parses the command line, sets up logging, and hands over to the library.
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use waitroom_aggregator::{Aggregator, AggregatorConfig};
use waitroom_runtime::{devcerts, logging, signals, tls};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "waitroom aggregator: the global state of every room, gossiped to the nodes over QUIC"
)]
struct Cli {
    /// The aggregator's TOML configuration.
    #[arg(long, short, default_value = "/etc/waitroom/aggregator.toml")]
    config: PathBuf,
    /// Validate the configuration (and load the certificates) and exit.
    #[arg(long)]
    check: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the aggregator (the default).
    Run,
    /// Write a development CA, an aggregator certificate and node certificates.
    GenCerts {
        /// Directory to write into (created if missing).
        #[arg(long, default_value = "certs")]
        out: PathBuf,
        /// Node certificates `node-1` .. `node-N`.
        #[arg(long, default_value_t = 2)]
        nodes: usize,
        /// Explicit node names instead of `node-N` (repeatable).
        #[arg(long = "name")]
        names: Vec<String>,
    },
}

fn main() -> anyhow::Result<()> {
    logging::init();
    let cli = Cli::parse();
    match cli.command {
        Some(Command::GenCerts { out, nodes, names }) => {
            let names = if names.is_empty() {
                (1..=nodes).map(|i| format!("node-{i}")).collect()
            } else {
                names
            };
            let written = devcerts::write(&out, &names)?;
            println!("CA:         {}", written.ca.display());
            println!(
                "aggregator: {} {}",
                written.aggregator.cert.display(),
                written.aggregator.key.display()
            );
            for (name, files) in &written.nodes {
                println!("{name}: {} {}", files.cert.display(), files.key.display());
            }
            Ok(())
        }
        Some(Command::Run) | None => {
            let config = AggregatorConfig::load(&cli.config)?;
            if cli.check {
                waitroom_aggregator::check_admin_listen(config.admin_listen)
                    .with_context(|| cli.config.display().to_string())?;
                tls::check(&config.tls)
                    .with_context(|| format!("{}: ca/cert/key", cli.config.display()))?;
                println!(
                    "{}: ok ({} room{})",
                    cli.config.display(),
                    config.rooms.len(),
                    if config.rooms.len() == 1 { "" } else { "s" }
                );
                return Ok(());
            }
            run(config)
        }
    }
}

fn run(config: AggregatorConfig) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async {
        let aggregator = Aggregator::start(config).await?;
        // One machine-readable line that tests and scripts wait for.
        println!(
            "waitroom-aggregator ready: quic={} admin={}",
            aggregator.quic_addr(),
            aggregator
                .admin_addr()
                .map_or_else(|| "-".to_owned(), |a| a.to_string()),
        );
        signals::terminate().await;
        tracing::info!("stopping: closing node connections, writing a last snapshot");
        aggregator.stop().await;
        Ok(())
    })
}
