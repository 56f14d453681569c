//! `tessera-shard`: loads a model and serves the router's gRPC calls on a unix socket.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Parser;
use tessera_kernels::cpu::ActivationDtype;
use tessera_kernels::cpu::bf16_dot::hardware_bf16;
use tessera_model_files::{ModelFiles, Pooler};
use tessera_proto::v1::text_generation_service_server::TextGenerationServiceServer;
use tessera_shard::comm::{Communicator, LocalComm, Partition, ShmComm, ShmConfig};
use tessera_shard::sampling::TokenVocab;
use tessera_shard::service::{ShardInfo, ShardService};
use tessera_shard::speculative::{
    DEFAULT_TREE_WIDTH, DraftModel, EagleDraft, EagleHead, MedusaDraft, MedusaHeads, Proposer,
    Speculation, Speculator,
};
use tessera_shard::telemetry;
use tessera_shard::{Engine, KvDtype, Model, WeightLayout};
use tessera_telemetry::{Process, TelemetryConfig};
use tessera_text::{ModelTokenizer, TokenizerSource};
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
    /// Collective backend between shards: `shm` (shared memory, CPU shards on one host) or
    /// `nccl` (GPU shards; needs a build with `--features cuda`).
    #[arg(long, env = "TESSERA_COMM", default_value = "shm")]
    comm: String,
    /// Longest wait for a peer shard inside a collective, in seconds (a dead peer is noticed
    /// within milliseconds; this bounds a stuck one).
    #[arg(long, env = "TESSERA_COMM_TIMEOUT", default_value_t = 60)]
    comm_timeout: u64,
    /// Element type of the KV cache and of the activations: `float32`; `bfloat16` (half the
    /// KV memory per token, and the activations of products with bf16-stored weights rounded
    /// to bf16 and multiplied with `vdpbf16ps`, as PyTorch computes a bf16 model); or `auto`
    /// (a model declared bf16 computes as `bfloat16` does, as vLLM's `auto` computes in the
    /// model's dtype; GGUF-quantized weights get a bf16 KV cache and f32 activations; other
    /// models float32; on a GPU, `bfloat16`).
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// Bytes the KV cache may use on CPU (suffixes K, M, G accepted).
    #[arg(long, default_value = "1G", value_parser = parse_bytes)]
    kv_cache_memory: u64,
    /// Share of the GPU's free memory (after the weights and a worst-case pass's
    /// activations) the KV cache takes, in (0, 1] (GPU only; vLLM's gpu-memory-utilization).
    #[arg(long, default_value_t = 0.9)]
    memory_fraction: f32,
    /// Where the forward pass runs: `cpu`; `cuda` (GPU number `rank`, in bf16, or f32 with
    /// `--dtype float32`; needs a build with `--features cuda`); or `auto` (`cuda` when this
    /// build has it and the GPU is there, else `cpu`).
    #[arg(long, env = "TESSERA_DEVICE", default_value = "auto")]
    device: String,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Tokens proposed per speculative step (0: no speculation).
    #[arg(long, default_value_t = 0)]
    speculate: u32,
    /// How tokens are proposed: `ngram` (prompt lookup), `draft` (a draft model), `medusa`
    /// (draft heads over the model's hidden state) or `eagle` (an EAGLE-style draft layer over
    /// the model's hidden states); draft heads' proposals are verified as a tree.
    #[arg(long, default_value = "ngram")]
    speculator: String,
    /// A draft model sharing the tokenizer (`--speculator draft`), or the directory of the
    /// model's Medusa heads (`--speculator medusa`) or EAGLE head (`--speculator eagle`).
    #[arg(long)]
    draft_model_id: Option<PathBuf>,
    /// Candidate paths in a draft-head tree (`--speculator medusa`), or nodes kept per level of
    /// an EAGLE tree (`--speculator eagle`); 1: a chain.
    #[arg(long, default_value_t = DEFAULT_TREE_WIDTH)]
    speculative_tree_width: usize,
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
    let _telemetry = tessera_telemetry::init(
        &TelemetryConfig {
            json: args.json_output,
            otlp_endpoint: args.otlp_endpoint.clone(),
            service_name: args.otlp_service_name.clone(),
        },
        Process::Shard { rank: args.rank },
    )?;
    let speculator = check_args(&args)?;
    let socket = format!("{}-{}", args.uds_path, args.rank);
    let loaded = load_engine(&args, speculator)?;
    let info = ShardInfo {
        dtype: loaded.weights_dtype.into(),
        rank: args.rank,
        world_size: args.world_size,
        pooler: loaded.pooler,
        socket_paths: (0..args.world_size)
            .map(|r| format!("{}-{r}", args.uds_path))
            .collect(),
    };
    let service = ShardService::new(loaded.engine, info, args.kv_cache_memory)
        .with_memory_fraction(args.memory_fraction)
        .with_tokenizer_source(loaded.tokenizer);
    serve(&socket, service).await
}

/// Refuses flag values that cannot work; returns the speculator `--speculator` names.
fn check_args(args: &Args) -> anyhow::Result<Speculator> {
    let speculator = Speculator::from_name(&args.speculator).with_context(|| {
        format!(
            "--speculator {:?}: unknown; use ngram, draft, medusa or eagle",
            args.speculator
        )
    })?;
    if speculator == Speculator::Draft && args.speculate > 0 && args.draft_model_id.is_none() {
        bail!("--speculator draft needs --draft-model-id (a model sharing this model's tokenizer)");
    }
    if speculator == Speculator::Medusa && args.speculate > 0 && args.draft_model_id.is_none() {
        bail!("--speculator medusa needs --draft-model-id (the directory of the model's heads)");
    }
    if speculator == Speculator::Eagle && args.speculate > 0 && args.draft_model_id.is_none() {
        bail!(
            "--speculator eagle needs --draft-model-id (the directory of the model's EAGLE head)"
        );
    }
    if args.speculative_tree_width == 0 {
        bail!("--speculative-tree-width must be at least 1");
    }
    let dtype = args.dtype.trim();
    if dtype != "auto" && KvDtype::from_name(dtype).is_none() {
        bail!("--dtype {dtype:?}: unknown; use auto, float32 or bfloat16");
    }
    if !(args.memory_fraction > 0.0 && args.memory_fraction <= 1.0) {
        bail!(
            "--memory-fraction {}: must be in (0, 1]",
            args.memory_fraction
        );
    }
    if args.block_size == 0 {
        bail!("--block-size must be at least 1");
    }
    Ok(speculator)
}

/// The activations' element type for `--dtype` (already checked by [`check_args`]).
fn activation_dtype(dtype: &str, declared_bf16: bool, on_gpu: bool) -> ActivationDtype {
    // bf16 activations need `vdpbf16ps` to be fast: elsewhere its portable reference runs,
    // far slower than f32 activations over the same bf16 weights.
    let bf16_dot = hardware_bf16(tessera_kernels::cpu::kernels());
    match dtype {
        "bfloat16" => {
            if !bf16_dot && !on_gpu {
                tracing::warn!(
                    "--dtype bfloat16: this CPU has no AVX512_BF16, so bf16 products run a \
                     portable reference, much slower than --dtype auto or float32"
                );
            }
            ActivationDtype::Bfloat16
        }
        "auto" if declared_bf16 && (bf16_dot || on_gpu) => ActivationDtype::Bfloat16,
        _ => ActivationDtype::Float32,
    }
}

/// What [`load_engine`] produced.
struct LoadedEngine {
    engine: Engine,
    /// The weights' element type.
    weights_dtype: &'static str,
    /// What the model's tokenizer is built from, or why it could not be read.
    tokenizer: Result<TokenizerSource, String>,
    /// How the model pools embeddings, when it says.
    pooler: Option<Pooler>,
}

/// Joins the shard group, loads this rank's slices of the model (and the draft model) on
/// its device, builds the engine, and reads the tokenizer's sources.
fn load_engine(args: &Args, speculator: Speculator) -> anyhow::Result<LoadedEngine> {
    let dtype = args.dtype.trim();
    let files = ModelFiles::open(&args.model_id)?;
    tracing::info!(model = %args.model_id.display(), config = ?files.config, "loading weights");
    if files.other_tower_tensors() > 0 {
        tracing::info!(
            tensors = files.other_tower_tensors(),
            "the checkpoint's other towers (vision encoder, projector) are not loaded: \
             its language model serves text input"
        );
    }
    let partition = Partition::new(args.rank as usize, args.world_size as usize);
    if let Err(e) = partition.check(&files.config) {
        bail!("--num-shard {}: {e}", args.world_size);
    }
    let on_gpu = use_gpu(&args.device, args.rank as usize)?;
    if !on_gpu {
        tracing::info!(kernels = %tessera_kernels::cpu::describe(), "CPU kernels");
    }
    // A GPU computes in bf16 unless asked for f32, whatever the weights' format.
    let kv_dtype = match KvDtype::from_name(dtype) {
        Some(d) => d,
        None if on_gpu => KvDtype::Bfloat16,
        None => KvDtype::auto(&files),
    };
    tracing::info!(kv_dtype = kv_dtype.name(), "KV cache element type");
    let comm = communicator(args)?;
    let declared_bf16 = files.config.dtype == Some(tessera_model_files::DType::BF16);
    let activations = activation_dtype(dtype, declared_bf16, on_gpu);
    tracing::info!(activations = ?activations, "activation element type");
    let layout = if on_gpu {
        // Dequantized once on the way to the GPU: no int8 repacking first.
        WeightLayout::Exact
    } else {
        WeightLayout::from_env()
    };
    let model = Model::load_sharded_with(&files, comm, layout)?
        .with_kv_dtype(kv_dtype)
        .with_activation_dtype(activations);
    let model = place(model, on_gpu, args.rank as usize)?;
    let weights_dtype = model.weights_dtype();
    let tokenizer = files.tokenizer_source().map_err(|e| e.to_string());
    let vocab = token_vocab(&tokenizer);
    let pooler = files.pooler()?;
    // Unmap the model files: this rank keeps only its slices.
    drop(files);
    tracing::info!(device = %model.device(), "model loaded");
    let speculation = load_speculation(args, speculator, &model, |draft| {
        let draft = Model::load_with(draft, layout)?
            .with_kv_dtype(kv_dtype)
            .with_activation_dtype(activations);
        place(draft, on_gpu, args.rank as usize)
    })?;
    // A minimal cache until Warmup sizes it from the memory budget.
    let mut engine = Engine::new(model, 2, args.block_size)?;
    if let Some(speculation) = speculation {
        engine = engine.with_speculation(speculation)?;
    }
    if let Some(vocab) = vocab {
        engine = engine.with_vocabulary(vocab);
    }
    Ok(LoadedEngine {
        engine,
        weights_dtype,
        tokenizer,
        pooler,
    })
}

/// The speculation `--speculate` and `--speculator` ask for (`None` for a depth of 0), its
/// proposer loaded for `target` from `--draft-model-id` (a draft model through `load_draft`,
/// placed as the target is).
fn load_speculation(
    args: &Args,
    speculator: Speculator,
    target: &Model,
    load_draft: impl FnOnce(&ModelFiles) -> anyhow::Result<Model>,
) -> anyhow::Result<Option<Speculation>> {
    let depth = args.speculate as usize;
    if depth == 0 {
        return Ok(None);
    }
    let width = args.speculative_tree_width;
    let dir = || {
        args.draft_model_id
            .as_deref()
            .with_context(|| format!("--speculator {} needs --draft-model-id", speculator.name()))
    };
    let proposer = match speculator {
        Speculator::Ngram => Proposer::Ngram,
        Speculator::Draft => {
            let path = dir()?;
            let files = ModelFiles::open(path)?;
            tracing::info!(draft = %path.display(), "loading the draft model");
            Proposer::Draft(DraftModel::new(load_draft(&files)?, target)?)
        }
        Speculator::Medusa => {
            let dir = dir()?;
            if target.on_gpu() && width > 1 {
                bail!(
                    "--speculative-tree-width {width}: token trees are verified on the CPU \
                     backend only; use 1 on a GPU"
                );
            }
            let config = target.config();
            let heads = MedusaHeads::load(dir, config.hidden_size, config.vocab_size)
                .with_context(|| format!("loading Medusa heads from {}", dir.display()))?;
            if depth > heads.num_heads() {
                bail!(
                    "--speculate {depth}: {} has {} Medusa heads",
                    dir.display(),
                    heads.num_heads()
                );
            }
            tracing::info!(heads = heads.num_heads(), width, "Medusa heads");
            Proposer::Medusa(MedusaDraft::new(heads, width)?)
        }
        Speculator::Eagle => {
            let dir = dir()?;
            if target.on_gpu() {
                bail!("--speculator eagle: EAGLE draft layers run on the CPU backend only");
            }
            let head = EagleHead::load(dir, target.config())
                .with_context(|| format!("loading the EAGLE head from {}", dir.display()))?;
            tracing::info!(width, "EAGLE draft head");
            Proposer::Eagle(EagleDraft::new(head, width, target)?)
        }
    };
    Ok(Some(Speculation::new(depth, proposer)))
}

/// Serves the router's calls on the unix socket `socket` (replacing a stale one) until
/// Ctrl-C or SIGTERM, then removes the socket.
async fn serve(socket: &str, service: ShardService) -> anyhow::Result<()> {
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing stale socket {socket}")),
    }
    let listener = UnixListener::bind(socket).with_context(|| format!("binding {socket}"))?;
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
    let _ = std::fs::remove_file(socket);
    Ok(())
}

/// The shared-memory segment of a shard group: named after the rendezvous port and the
/// socket prefix, which together identify one server on this host.
fn segment_path(master_port: u16, uds_path: &str) -> PathBuf {
    // FNV-1a: stable across runs and processes.
    let hash = uds_path.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    });
    let dir = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("tessera-{master_port}-{hash:016x}"))
}

/// Joins the shard group (a no-op communicator for a single shard).
fn communicator(args: &Args) -> anyhow::Result<Arc<dyn Communicator>> {
    let (rank, world) = (args.rank as usize, args.world_size as usize);
    let timeout = std::time::Duration::from_secs(args.comm_timeout.max(1));
    match args.comm.as_str() {
        "shm" | "nccl" if world == 1 => Ok(Arc::new(LocalComm)),
        "shm" => {
            let path = segment_path(args.master_port, &args.uds_path);
            tracing::info!(rank, world, segment = %path.display(), "joining the shard group");
            let comm = ShmComm::join(
                &path,
                rank,
                world,
                ShmConfig {
                    timeout,
                    ..ShmConfig::default()
                },
            )
            .with_context(|| format!("rank {rank} of {world}: joining {}", path.display()))?;
            Ok(Arc::new(comm))
        }
        "nccl" => nccl(args, rank, world, timeout),
        other => bail!("--comm {other:?}: unknown; use shm or nccl"),
    }
}

#[cfg(feature = "cuda")]
fn nccl(
    args: &Args,
    rank: usize,
    world: usize,
    timeout: std::time::Duration,
) -> anyhow::Result<Arc<dyn Communicator>> {
    let id_path = PathBuf::from(format!("{}-nccl-id", args.uds_path));
    // One device per shard process: rank r drives device r (of those CUDA_VISIBLE_DEVICES shows).
    let comm = tessera_shard::comm::NcclComm::join(&id_path, rank, world, rank, timeout)
        .with_context(|| format!("rank {rank} of {world}: starting NCCL"))?;
    Ok(Arc::new(comm))
}

#[cfg(not(feature = "cuda"))]
fn nccl(
    _: &Args,
    _: usize,
    _: usize,
    _: std::time::Duration,
) -> anyhow::Result<Arc<dyn Communicator>> {
    bail!(
        "--comm nccl: this tessera-shard was built without GPU support; rebuild with \
         `cargo build --features cuda`, or use --comm shm for CPU shards"
    )
}

/// Whether `--device` puts this rank's pass on its GPU.
#[cfg(feature = "cuda")]
fn use_gpu(device: &str, rank: usize) -> anyhow::Result<bool> {
    use tessera_kernels::cuda::{CudaLibs, cudarc::driver::CudaContext};
    match device {
        "cpu" => Ok(false),
        "cuda" => Ok(true),
        "auto" => {
            let present = CudaLibs::probe().driver
                && CudaContext::device_count().is_ok_and(|n| rank < n.max(0) as usize);
            if !present {
                tracing::info!(
                    "--device auto: no GPU {rank} (or no CUDA driver); running on the CPU"
                );
            }
            Ok(present)
        }
        other => bail!("--device {other:?}: unknown; use auto, cpu or cuda"),
    }
}

#[cfg(not(feature = "cuda"))]
fn use_gpu(device: &str, _rank: usize) -> anyhow::Result<bool> {
    match device {
        "cpu" | "auto" => Ok(false),
        "cuda" => bail!(
            "--device cuda: this tessera-shard was built without GPU support; rebuild with \
             `cargo build --release --features cuda`, or use --device cpu"
        ),
        other => bail!("--device {other:?}: unknown; use auto, cpu or cuda"),
    }
}

/// Moves `model` to GPU `rank` when `on_gpu`.
#[cfg(feature = "cuda")]
fn place(model: Model, on_gpu: bool, rank: usize) -> anyhow::Result<Model> {
    if !on_gpu {
        return Ok(model);
    }
    let on = |name: &str| std::env::var(name).map_or(true, |v| v.trim() != "0");
    let options = tessera_shard::CudaOptions {
        device: rank,
        // Decode steps as CUDA graphs unless TESSERA_CUDA_GRAPHS=0.
        graphs: on("TESSERA_CUDA_GRAPHS"),
        // GGUF Q8_0/Q4_0/Q4_1 blocks stay quantized unless TESSERA_GPU_QUANTIZED=0.
        quantized: on("TESSERA_GPU_QUANTIZED"),
        // Tensor-core prefill attention only when TESSERA_TC_ATTENTION=1.
        tensor_core_attention: std::env::var("TESSERA_TC_ATTENTION").is_ok_and(|v| v.trim() == "1"),
    };
    model
        .into_cuda(&options)
        .with_context(|| format!("moving the model to GPU {rank}"))
}

#[cfg(not(feature = "cuda"))]
fn place(model: Model, _on_gpu: bool, _rank: usize) -> anyhow::Result<Model> {
    Ok(model)
}

/// The token bytes JSON mode masks with. A model without a loadable tokenizer still serves;
/// its JSON-mode requests are refused.
fn token_vocab(source: &Result<TokenizerSource, String>) -> Option<Arc<TokenVocab>> {
    let tokenizer = source
        .as_ref()
        .map_err(String::clone)
        .and_then(|source| ModelTokenizer::from_source(source).map_err(|e| e.to_string()));
    match tokenizer {
        Ok(tok) => {
            let vocab = Arc::new(TokenVocab::new(&tok.token_bytes(), &tok.eos_token_ids));
            // Grammar requests wait for this instead of building the trie mid-step.
            let warming = vocab.clone();
            std::thread::spawn(move || {
                if let Err(e) = warming.grammars() {
                    tracing::warn!("{e}: grammar-constrained requests will be refused");
                }
            });
            Some(vocab)
        }
        Err(e) => {
            tracing::warn!("no tokenizer ({e}): JSON-mode requests will be refused");
            None
        }
    }
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
