//! `waitroom-aggregator`: merges every node's report into the global state.
//! Parses the command line, sets up logging, and hands over to the library.
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{CommandFactory as _, Parser, Subcommand};
use waitroom_aggregator::{Aggregator, AggregatorConfig};
use waitroom_runtime::{clock::Clock, devcerts, logging, signals, systemd, tls};

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
    /// Ask the running aggregator to re-read its room limits (sends it
    /// SIGHUP). The unit's `ExecReload` uses this: no `kill` from procps.
    Reload {
        /// The aggregator's process id (`$MAINPID` in the unit).
        #[arg(long)]
        pid: i32,
    },
    /// Read and change the room settings through the running aggregator's
    /// control API (see docs/OPERATIONS.md, "Control API").
    Ctl(waitroom_aggregator::ctl::CtlArgs),
    /// Write the man pages and shell completions into a directory (packaging).
    #[command(hide = true)]
    GenerateDocs {
        #[arg(long)]
        out: PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    logging::init();
    let cli = Cli::parse();
    let mut config_fault = false;
    match run_cli(cli, &mut config_fault) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            if config_fault {
                std::process::ExitCode::from(systemd::EX_CONFIG)
            } else {
                std::process::ExitCode::FAILURE
            }
        }
    }
}

/// The command line's work; `config_fault` is set when an error is the
/// configuration's (so the exit status says so).
fn run_cli(cli: Cli, config_fault: &mut bool) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::GenerateDocs { out }) => {
            for file in waitroom_runtime::docs::write(Cli::command(), &out)? {
                println!("{}", file.display());
            }
            Ok(())
        }
        Some(Command::Reload { pid }) => Ok(signals::send_hangup(pid)?),
        Some(Command::Ctl(args)) => {
            // The config only fills in what the options leave out.
            let config = if !args.url.is_empty() && args.token_file.is_some() {
                None
            } else {
                Some(AggregatorConfig::load(&cli.config)?)
            };
            let (ok, text) = waitroom_aggregator::ctl::run(&args, config.as_ref())?;
            if ok {
                print!("{text}");
                Ok(())
            } else {
                eprint!("{text}");
                anyhow::bail!("the control API refused the request")
            }
        }
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
            *config_fault = true;
            let config = AggregatorConfig::load(&cli.config)?;
            waitroom_aggregator::check_admin_listen(config.admin_listen)
                .with_context(|| cli.config.display().to_string())?;
            tls::server_config(&config.tls)
                .with_context(|| format!("{}: ca/cert/key", cli.config.display()))?;
            if let Some(tokens) = &config.control.token_file {
                waitroom_runtime::control::Tokens::load(tokens)
                    .with_context(|| format!("{}: control_token_file", cli.config.display()))?;
            }
            *config_fault = false;
            if cli.check {
                println!(
                    "{}: ok ({} room{})",
                    cli.config.display(),
                    config.rooms.len(),
                    if config.rooms.len() == 1 { "" } else { "s" }
                );
                return Ok(());
            }
            run(config, &cli.config)
        }
    }
}

fn run(config: AggregatorConfig, path: &std::path::Path) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async {
        // Listening before READY=1, so a stop right after it is not missed.
        let mut terminate = signals::Terminate::listen().context("listening for SIGTERM")?;
        let aggregator = Aggregator::start(config, Clock::system()).await?;
        // One machine-readable line that tests and scripts wait for.
        println!(
            "waitroom-aggregator ready: quic={} admin={}",
            aggregator.quic_addr(),
            aggregator
                .admin_addr()
                .map_or_else(|| "-".to_owned(), |a| a.to_string()),
        );
        // Listeners bound and the snapshot restored: systemd may start what
        // waits for us. Keep-alives come from the housekeeping loop.
        systemd::notify_ready();
        let mut hangups = signals::hangups();
        loop {
            let hangup = async {
                match &mut hangups {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = terminate.recv() => break,
                _ = hangup => match aggregator.reload_file(path) {
                    Ok(()) => tracing::info!(file = %path.display(), "configuration reloaded: room limits applied"),
                    Err(err) => tracing::error!("reload refused, the old configuration stays in force: {err}"),
                },
            }
        }
        tracing::info!("stopping: closing node connections, writing a last snapshot");
        systemd::stopping();
        aggregator.stop().await;
        Ok(())
    })
}
