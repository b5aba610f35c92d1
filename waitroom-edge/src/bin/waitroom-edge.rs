//! `waitroom-edge`: the node binary. Parses the command line, sets up logging,
//! and hands over to the library.
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "waitroom edge node: a virtual waiting room in front of your site"
)]
struct Cli {
    /// The node's TOML configuration.
    #[arg(long, short, global = true, default_value = "/etc/waitroom/edge.toml")]
    config: PathBuf,
    /// Validate the configuration and exit.
    #[arg(long)]
    check: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node (the default).
    Run,
    /// Print this node's counters (from shared memory; the node need not run).
    Stats,
    /// Serve the built-in demo origin (a small shop) for demos and tests.
    DemoOrigin {
        #[arg(long, default_value = "127.0.0.1:8081")]
        listen: std::net::SocketAddr,
        /// Delay every response by this many milliseconds (a slow origin for tests).
        #[arg(long, default_value_t = 0)]
        delay_ms: u64,
    },
}

fn main() -> anyhow::Result<()> {
    waitroom_edge::init_logging();
    let cli = Cli::parse();
    match cli.command {
        Some(Command::DemoOrigin { listen, delay_ms }) => {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("starting the runtime")?
                .block_on(waitroom_edge::demo_origin::serve_with(
                    listen,
                    std::time::Duration::from_millis(delay_ms),
                ))
                .context("demo origin")
        }
        Some(Command::Stats) => {
            let config = waitroom_edge::config::load(&cli.config)?;
            print!("{}", waitroom_edge::stats::render(&config)?);
            Ok(())
        }
        Some(Command::Run) | None => {
            let config = waitroom_edge::config::load(&cli.config)?;
            if cli.check {
                // The files the config names must load too, not just parse.
                if let Some(gossip) = &config.aggregator {
                    waitroom_edge::tls::check(&gossip.tls_files())
                        .with_context(|| format!("{}: [aggregator]", cli.config.display()))?;
                }
                if let Some(tls) = &config.node.tls {
                    waitroom_edge::tls::https_server_config(&tls.cert, &tls.key)
                        .with_context(|| format!("{}: node.tls", cli.config.display()))?;
                }
                println!(
                    "{}: ok ({} room{})",
                    cli.config.display(),
                    config.rooms.len(),
                    if config.rooms.len() == 1 { "" } else { "s" }
                );
                return Ok(());
            }
            waitroom_edge::run(config, &cli.config)
        }
    }
}
