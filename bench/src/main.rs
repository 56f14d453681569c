//! `tessera-bench`: load generator for OpenAI-compatible servers. See `bench/README.md`.

mod app;
mod args;

use clap::Parser;

fn main() -> anyhow::Result<()> {
    let args = args::Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(app::run(args))
}
