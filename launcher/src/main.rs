//! `tessera-launcher`: the command users start.
//!
//! It resolves the model (downloading the default SmolLM2-135M-Instruct when none is given),
//! starts `--num-shard` `tessera-shard` processes, waits until each has created its unix
//! socket, starts `tessera-router`, and supervises them all:
//!
//! * SIGINT/SIGTERM: SIGTERM to the router, wait up to `--shutdown-grace-period`; SIGTERM to
//!   the shards, wait again; SIGKILL what is left; exit 0.
//! * A child dies: report it with its exit status and last output lines, stop the others the
//!   same way, exit 1. Startup failures also exit 1.
//!
//! Children cannot outlive the launcher, even a SIGKILLed one: see [`process`].
//!
//! ```text
//! tessera-launcher --model-id ./SmolLM2-135M-Instruct --num-shard 2 --port 3000
//! ```

mod args;
mod download;
mod hub;
mod process;
mod router;
mod sha256;
mod shard;
mod supervisor;

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};

use crate::args::Args;
use crate::process::OutputMode;
use crate::supervisor::{LaunchPlan, ShardLaunch};

fn main() -> ExitCode {
    let args = Args::parse();
    init_tracing(args.json_output);
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs to stdout, as text or JSON lines, filtered by `RUST_LOG` (default `info`). Children
/// inherit `RUST_LOG` with the rest of the launcher's environment.
fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Everything after argument parsing. Errors are startup failures or a child's death.
fn run(args: &Args) -> anyhow::Result<()> {
    let plan = prepare(args)?;
    // One thread: children are spawned from the main thread, which lives as long as the
    // launcher, so their parent-death signal fires only when the launcher itself dies.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let shutdown = shutdown_signal().context("cannot install signal handlers")?;
        supervisor::run(plan, shutdown).await?;
        tracing::info!("shutdown complete");
        Ok(())
    })
}

/// Resolves paths and binaries and builds the children's command lines. Starts nothing, so
/// every user error is reported before any process exists.
fn prepare(args: &Args) -> anyhow::Result<LaunchPlan> {
    let shard_bin = process::find_binary("tessera-shard")?;
    let router_bin = process::find_binary("tessera-router")?;
    let draft_model = args
        .draft_model_id
        .as_deref()
        .map(|draft| download::resolve_model(Some(draft), None).map(|d| d.path))
        .transpose()
        .context("--draft-model-id")?;
    let resolved = download::resolve_model(args.model_id.as_deref(), args.revision.as_deref())?;
    let served_model_name = args
        .served_model_name
        .clone()
        .or(resolved.hub_id)
        .unwrap_or_else(|| download::served_model_name(&resolved.path));
    let model = resolved.path;
    tracing::info!(
        model = %model.display(),
        served_model_name,
        num_shard = args.num_shard,
        "launching"
    );

    let shard_config = args.shard_config(model.clone(), draft_model);
    let router_config = args.router_config(model, served_model_name);
    let shards = (0..args.num_shard)
        .map(|rank| ShardLaunch {
            command: shard_config.command(&shard_bin, rank),
            socket: shard_config.socket_path(rank),
        })
        .collect();
    Ok(LaunchPlan {
        shards,
        router: router_config.command(&router_bin),
        startup_timeout: args.startup_timeout(),
        grace_period: args.grace_period(),
        output: if args.json_output {
            OutputMode::Json
        } else {
            OutputMode::Prefixed
        },
    })
}

/// Completes on the first SIGINT or SIGTERM. Installed before any child starts, so a signal
/// during startup is also a clean shutdown.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => tracing::info!("received SIGINT; shutting down"),
            _ = terminate.recv() => tracing::info!("received SIGTERM; shutting down"),
        }
    })
}
