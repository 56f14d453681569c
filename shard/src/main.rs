//! `tessera-shard`: loads a model and serves the router's gRPC calls on a unix socket.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Parser;
use tessera_formats::ModelFiles;
use tessera_proto::v1::text_generation_service_server::TextGenerationServiceServer;
use tessera_shard::service::{ShardInfo, ShardService};
use tessera_shard::speculative::{SpeculationConfig, Speculator};
use tessera_shard::telemetry::{self, TelemetryConfig};
use tessera_shard::{Engine, Model};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

/// One shard process of a Tessera server (started by `tessera-launcher`).
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Hugging Face model directory or `.gguf` file.
    #[arg(long, env = "MODEL_ID")]
    model_id: PathBuf,
    /// Socket path prefix; this shard listens on `{uds_path}-{rank}`.
    #[arg(long, default_value = "/tmp/tessera-server")]
    uds_path: String,
    /// This shard's rank.
    #[arg(long, env = "RANK", default_value_t = 0)]
    rank: u32,
    /// Number of shards.
    #[arg(long, env = "WORLD_SIZE", default_value_t = 1)]
    world_size: u32,
    /// Rendezvous address for the collective communicator.
    #[arg(long, env = "MASTER_ADDR", default_value = "localhost")]
    master_addr: String,
    /// Rendezvous port for the collective communicator.
    #[arg(long, env = "MASTER_PORT", default_value_t = 29500)]
    master_port: u16,
    /// Compute and KV-cache dtype.
    #[arg(long, default_value = "float32")]
    dtype: String,
    /// Bytes the KV cache may use on CPU (suffixes K, M, G accepted).
    #[arg(long, default_value = "1G", value_parser = parse_bytes)]
    kv_cache_memory: u64,
    /// Fraction of device memory for weights and KV cache (GPU only).
    #[arg(long, default_value_t = 0.9)]
    memory_fraction: f32,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Tokens proposed per speculative step (0: no speculation).
    #[arg(long, default_value_t = 0)]
    speculate: u32,
    /// How tokens are proposed: `ngram` (prompt lookup).
    #[arg(long, default_value = "ngram")]
    speculator: String,
    /// A draft model sharing the tokenizer (for `--speculator draft`).
    #[arg(long)]
    draft_model_id: Option<PathBuf>,
    /// Log as JSON lines.
    #[arg(long)]
    json_output: bool,
    /// OpenTelemetry collector endpoint (OTLP over gRPC), e.g. `http://otel-collector:4317`.
    #[arg(long, env = "OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// Service name of this shard's spans.
    #[arg(long, default_value = "tessera-shard")]
    otlp_service_name: String,
}

/// Parses a byte count such as `1073741824`, `512M` or `2G`.
fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = s[i..].to_ascii_uppercase();
            let mult: u64 = match unit.trim_end_matches("IB").trim_end_matches('B') {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                _ => return Err(format!("unknown unit in {s:?}; use K, M, G or T")),
            };
            (&s[..i], mult)
        }
        None => (s, 1),
    };
    let n: f64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count"))?;
    if !(n.is_finite() && n >= 0.0) {
        return Err(format!("{s:?} is not a byte count"));
    }
    Ok((n * mult as f64) as u64)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _telemetry = telemetry::init(&TelemetryConfig {
        json: args.json_output,
        otlp_endpoint: args.otlp_endpoint.clone(),
        service_name: args.otlp_service_name.clone(),
        rank: args.rank,
    })?;
    if args.world_size != 1 {
        bail!(
            "--world-size {}: tensor parallelism across shards is not available yet; use one shard",
            args.world_size
        );
    }
    let speculator = Speculator::from_name(&args.speculator).with_context(|| {
        format!(
            "--speculator {:?}: unknown; use ngram or draft",
            args.speculator
        )
    })?;
    if speculator == Speculator::Draft && args.speculate > 0 && args.draft_model_id.is_none() {
        bail!("--speculator draft needs --draft-model-id (a model sharing this model's tokenizer)");
    }
    if args.dtype != "float32" {
        bail!(
            "--dtype {}: the CPU backend computes in float32 for now; use --dtype float32",
            args.dtype
        );
    }
    if args.block_size == 0 {
        bail!("--block-size must be at least 1");
    }
    let socket = format!("{}-{}", args.uds_path, args.rank);
    let files = ModelFiles::open(&args.model_id)?;
    tracing::info!(model = %args.model_id.display(), config = ?files.config, "loading weights");
    let model = Model::load(&files)?;
    // A minimal cache until Warmup sizes it from the memory budget.
    let mut engine = Engine::new(model, 2, args.block_size).with_speculation(SpeculationConfig {
        depth: args.speculate as usize,
        speculator,
    });
    if let (Speculator::Draft, Some(path)) = (speculator, &args.draft_model_id) {
        let draft = ModelFiles::open(path)?;
        tracing::info!(draft = %path.display(), "loading the draft model");
        engine = engine.with_draft(Model::load(&draft)?)?;
    }
    let info = ShardInfo {
        dtype: args.dtype.clone(),
        rank: args.rank,
        world_size: args.world_size,
        socket_paths: (0..args.world_size)
            .map(|r| format!("{}-{r}", args.uds_path))
            .collect(),
    };
    let service = ShardService::new(engine, info, args.kv_cache_memory);

    match std::fs::remove_file(&socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing stale socket {socket}")),
    }
    let listener = UnixListener::bind(&socket).with_context(|| format!("binding {socket}"))?;
    tracing::info!(%socket, "shard ready");
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing a SIGTERM handler cannot fail on unix");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
    };
    tonic::transport::Server::builder()
        .trace_fn(telemetry::grpc_span)
        .add_service(
            TextGenerationServiceServer::new(service)
                .max_decoding_message_size(256 << 20)
                .max_encoding_message_size(256 << 20),
        )
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await?;
    let _ = std::fs::remove_file(&socket);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert_eq!(parse_bytes("1.5KiB"), Ok(1536));
        assert!(parse_bytes("12Q").is_err());
        assert!(parse_bytes("-3").is_err());
    }
}
