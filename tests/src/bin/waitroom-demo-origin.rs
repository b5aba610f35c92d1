//! `waitroom-demo-origin`: the demo shop as a real HTTP origin, for
//! `cargo xtask demo`, `cargo xtask bench` and the integration tests.
use anyhow::Context as _;
use clap::Parser;

#[derive(Debug, Parser)]
#[command(about = "waitroom's demo origin: a small shop behind the waiting room")]
struct Cli {
    #[arg(long, default_value = "127.0.0.1:8081")]
    listen: std::net::SocketAddr,
    /// Delay every response by this many milliseconds (a slow origin for tests).
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
}

fn main() -> anyhow::Result<()> {
    waitroom_runtime::logging::init();
    let cli = Cli::parse();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(waitroom_tests::demo_origin::serve_with(
            cli.listen,
            std::time::Duration::from_millis(cli.delay_ms),
        ))
        .context("demo origin")
}
