//! `waitroom-edge`: the node binary. Parses the command line, sets up logging,
//! and hands over to the library.
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{CommandFactory as _, Parser, Subcommand};

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
    /// Ask the running node to re-read its configuration (sends it SIGHUP).
    /// The unit's `ExecReload` uses this, so reloading needs no `kill` from
    /// procps (absent on a minimal Debian).
    Reload {
        /// The node's process id (`$MAINPID` in the unit).
        #[arg(long)]
        pid: i32,
    },
    /// Write the man pages and shell completions into a directory (packaging).
    #[command(hide = true)]
    GenerateDocs {
        #[arg(long)]
        out: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    waitroom_runtime::logging::init();
    let cli = Cli::parse();
    match cli.command {
        Some(Command::GenerateDocs { out }) => {
            for file in waitroom_runtime::docs::write(Cli::command(), &out)? {
                println!("{}", file.display());
            }
            Ok(())
        }
        Some(Command::Reload { pid }) => Ok(waitroom_runtime::signals::send_hangup(pid)?),
        Some(Command::Stats) => {
            let config = waitroom_edge::config::load(&cli.config)?;
            print!("{}", waitroom_edge::stats::render(&config)?);
            Ok(())
        }
        Some(Command::Run) | None => {
            let config = waitroom_edge::config::load(&cli.config)?;
            if cli.check {
                // The files the config names must load too, not just parse.
                waitroom_edge::admin::AdminAuth::load(&config.node)
                    .with_context(|| cli.config.display().to_string())?;
                waitroom_edge::state_dir::check(&config.node.state_dir())
                    .with_context(|| format!("{}: node.state_dir", cli.config.display()))?;
                if let Some(gossip) = &config.aggregator {
                    waitroom_runtime::tls::check(&gossip.tls_files())
                        .with_context(|| format!("{}: [aggregator]", cli.config.display()))?;
                }
                if let Some(tls) = &config.node.tls {
                    waitroom_runtime::tls::https_server_config(&tls.cert, &tls.key)
                        .map(drop)
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
            waitroom_edge::start::run(config, &cli.config)
        }
    }
}
