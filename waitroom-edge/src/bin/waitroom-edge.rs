//! `waitroom-edge`: the node binary. Parses the command line, sets up logging,
//! and hands over to the library.
use std::path::PathBuf;

use clap::{CommandFactory as _, Parser, Subcommand};
use waitroom_runtime::systemd::EX_CONFIG;

/// mimalloc instead of glibc's malloc: a request makes about ten small
/// allocations (header values, the cookie, the page's body), each freed by the
/// same worker thread, which mimalloc's per-thread free lists serve in a few
/// dozen instructions (docs/BENCHMARKS.md, "The allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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

fn main() -> std::process::ExitCode {
    waitroom_runtime::logging::init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(Failure::Config(err)) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::from(EX_CONFIG)
        }
        Err(Failure::Other(err)) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A failure, sorted by whose it is: the configuration's (exit 78) or not.
enum Failure {
    Config(anyhow::Error),
    Other(anyhow::Error),
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(err: E) -> Self {
        Self::Other(err.into())
    }
}

fn config_error(err: impl Into<anyhow::Error>) -> Failure {
    Failure::Config(err.into())
}

fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Some(Command::GenerateDocs { out }) => {
            for file in waitroom_runtime::docs::write(Cli::command(), &out)? {
                println!("{}", file.display());
            }
            Ok(())
        }
        Some(Command::Reload { pid }) => Ok(waitroom_runtime::signals::send_hangup(pid)?),
        Some(Command::Stats) => {
            let config = waitroom_edge::config::load(&cli.config).map_err(config_error)?;
            print!("{}", waitroom_edge::stats::render(&config)?);
            Ok(())
        }
        Some(Command::Run) | None => {
            let config = waitroom_edge::config::load(&cli.config).map_err(config_error)?;
            // The files the config names must load too, not just parse; a
            // start runs the same checks first, so a bad file exits 78 there.
            waitroom_edge::check::check(&config, &cli.config).map_err(config_error)?;
            if cli.check {
                println!(
                    "{}: ok ({} room{})",
                    cli.config.display(),
                    config.rooms.len(),
                    if config.rooms.len() == 1 { "" } else { "s" }
                );
                return Ok(());
            }
            Ok(waitroom_edge::start::run(config, &cli.config)?)
        }
    }
}
