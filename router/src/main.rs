//! `tessera-router`: the HTTP front of a Tessera server (started by `tessera-launcher`).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use axum::http::HeaderValue;
use clap::Parser;
use tessera_params::LengthDependentRope;
use tessera_router::batcher::{self, BatcherConfig, SchedulerLimits};
use tessera_router::client::WarmupRequest;
use tessera_router::client::{ShardFacts, ShardedClient};
use tessera_router::{
    AppState, Infer, ModelFacts, ModelInfo, PoolingModel, ReasoningFormat, Task, ToolCallFormat,
    ValidationConfig, fix_malloc_thresholds, install_recorder, serve, set_speculator,
    spawn_trimmer,
};
use tessera_telemetry::{Process, TelemetryConfig};
use tessera_text::ModelTokenizer;

/// Counts the live heap for `/metrics` (`tessera_router_heap_bytes`).
#[global_allocator]
static ALLOCATOR: tessera_router::CountingAllocator = tessera_router::CountingAllocator;

/// The router of a Tessera server.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The model the shards serve, a Hugging Face directory or a `.gguf` file: its name is
    /// the served model name. The router opens no model file; the tokenizer and chat template
    /// come from the shards.
    #[arg(long, env = "MODEL_ID")]
    model_id: PathBuf,
    /// The model name `/v1/models` lists and answers carry.
    #[arg(long)]
    served_model_name: Option<String>,
    /// Socket of shard 0.
    #[arg(long, default_value = "/tmp/tessera-server-0")]
    master_shard_uds_path: String,
    /// Number of shards (checked against the shards' own answer).
    #[arg(long, default_value_t = 1)]
    num_shard: u32,
    /// Socket prefix of the shards.
    #[arg(long, default_value = "/tmp/tessera-server")]
    shard_uds_path: String,
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    hostname: IpAddr,
    /// Port to listen on.
    #[arg(long, short, default_value_t = 3000)]
    port: u16,
    /// Requests in flight at once; more get 429.
    #[arg(long, default_value_t = 128)]
    max_concurrent_requests: usize,
    /// Stop sequences per request.
    #[arg(long, default_value_t = 4)]
    max_stop_sequences: usize,
    /// Alternatives reported per token.
    #[arg(long, default_value_t = 5)]
    max_top_n_tokens: u32,
    /// Longest prompt (default: min(context − 1, 4095)).
    #[arg(long)]
    max_input_tokens: Option<usize>,
    /// Longest prompt + generation (default: min(context, 4096)).
    #[arg(long)]
    max_total_tokens: Option<usize>,
    /// Tokens computed in one step, prompt chunks and decodes together (default:
    /// max_input_tokens clamped to 512..=4096); longer prompts are prefilled in chunks.
    #[arg(long)]
    max_batch_prefill_tokens: Option<usize>,
    /// Tokens the running batch may hold (default: what the KV cache holds).
    #[arg(long)]
    max_batch_total_tokens: Option<usize>,
    /// Requests in the running batch.
    #[arg(long)]
    max_batch_size: Option<usize>,
    /// Accepted for TGI compatibility and ignored: prompt chunks and decodes share every
    /// step, so a waiting request joins at the next step whenever it fits.
    #[arg(long, default_value_t = 20)]
    max_waiting_tokens: usize,
    /// Largest request body in bytes; larger gets 413.
    #[arg(long, default_value_t = 2_000_000)]
    payload_limit: usize,
    /// Log as JSON lines.
    #[arg(long)]
    json_output: bool,
    /// Reuse KV blocks of shared prompt prefixes.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    prefix_caching: bool,
    /// OpenTelemetry collector endpoint.
    #[arg(long)]
    otlp_endpoint: Option<String>,
    /// Service name in traces.
    #[arg(long, default_value = "tessera-router")]
    otlp_service_name: String,
    /// Longest a request may take, in seconds from its arrival; past it the request ends
    /// with a 504 `deadline_exceeded`. A request's `X-Request-Timeout` header can shorten it.
    #[arg(long)]
    request_timeout: Option<f64>,
    /// Origins browsers may call the API from (CORS), e.g. `https://app.example.com`; `*`
    /// allows any. Repeat or comma-separate. None: no CORS headers.
    #[arg(long, value_delimiter = ',')]
    cors_allow_origin: Vec<String>,
    /// A Jinja chat template file to use instead of the model's.
    #[arg(long)]
    chat_template: Option<PathBuf>,
    /// How the model writes tool calls: hermes, llama3_json or mistral (default: what the chat
    /// template shows; hermes for templates that render no tools).
    #[arg(long, value_parser = parse_tool_call_format)]
    tool_call_parser: Option<ToolCallFormat>,
    /// Read the model's reasoning into `reasoning` (and `reasoning_content`): qwen3 or deepseek_r1.
    #[arg(long, value_parser = parse_reasoning_format)]
    reasoning_parser: Option<ReasoningFormat>,
    /// What the server does: `generate`, `embed` (`/v1/embeddings`) or `score` (`/v1/rerank`,
    /// `/v1/score`); `auto`: what the model declares (a classification head scores, a
    /// sentence-transformers pooling config embeds, anything else generates).
    #[arg(long, default_value = "auto", value_parser = parse_task)]
    task: TaskChoice,
    /// With `--task score` on a model without a classification head: the tokens whose logits
    /// are the labels, the last one's probability among them the score (Qwen3-Reranker's
    /// `no,yes`).
    #[arg(long, value_delimiter = ',', default_value = "no,yes")]
    score_labels: Vec<String>,
}

fn parse_tool_call_format(name: &str) -> Result<ToolCallFormat, String> {
    ToolCallFormat::from_name(name).ok_or_else(|| {
        format!(
            "unknown tool-call parser; expected one of {}",
            ToolCallFormat::NAMES
        )
    })
}

/// `--task`: one task, or `auto` (`None`).
#[derive(Debug, Clone, Copy)]
struct TaskChoice(Option<Task>);

fn parse_task(name: &str) -> Result<TaskChoice, String> {
    Ok(TaskChoice(match name {
        "auto" => None,
        "generate" => Some(Task::Generate),
        "embed" | "embedding" => Some(Task::Embed),
        "score" | "rerank" | "classify" => Some(Task::Score),
        other => {
            return Err(format!(
                "unknown task {other:?}; use auto, generate, embed or score"
            ));
        }
    }))
}

fn parse_reasoning_format(name: &str) -> Result<ReasoningFormat, String> {
    ReasoningFormat::from_name(name).ok_or_else(|| {
        format!(
            "unknown reasoning parser; expected one of {}",
            ReasoningFormat::NAMES
        )
    })
}

/// The shards' sockets exist before the router starts, but a shard may still be binding.
async fn connect(path: &str) -> anyhow::Result<ShardedClient> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match ShardedClient::connect(path).await {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() > deadline => {
                return Err(e).context("connecting to the shards");
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The name `/v1/models` lists unless `--served-model-name` gives one: the model directory's
/// name, or the model file's without its extension.
fn model_name(model_id: &Path) -> String {
    let stem = if model_id.is_dir() {
        model_id.file_name()
    } else {
        model_id.file_stem()
    };
    stem.map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
}

/// The model's tokenizer, built from the sources rank 0 read from the model's files, with
/// `--chat-template` in place of the model's template when given.
async fn load_tokenizer(client: &ShardedClient, args: &Args) -> anyhow::Result<ModelTokenizer> {
    let source = client
        .tokenizer_source()
        .await
        .context("asking the shards for the model's tokenizer")?;
    let mut tokenizer = ModelTokenizer::from_source(&source)?;
    if let Some(path) = &args.chat_template {
        let template = std::fs::read_to_string(path)
            .with_context(|| format!("reading --chat-template {}", path.display()))?;
        tokenizer
            .replace_chat_template(template)
            .with_context(|| format!("--chat-template {}", path.display()))?;
    }
    Ok(tokenizer)
}

/// The task `--task` chooses (or the model declares) and what its routes need.
fn pooling_model(
    args: &Args,
    info: &ShardFacts,
    tokenizer: &ModelTokenizer,
) -> anyhow::Result<PoolingModel> {
    let facts = ModelFacts::from(info);
    let pooling = PoolingModel::resolve(args.task.0, &facts, &args.score_labels, tokenizer)?;
    tracing::info!(task = pooling.task().name(), "serving");
    Ok(pooling)
}

/// How the model's rotary frequencies depend on a prompt's length, as the shards report it.
fn rope_rule(info: &ShardFacts) -> Option<LengthDependentRope> {
    let threshold = info.rope_length_threshold as usize;
    match (threshold, info.rope_grows_with_length) {
        (0, _) => None,
        (_, false) => Some(LengthDependentRope::Switches { threshold }),
        (_, true) => Some(LengthDependentRope::Grows { threshold }),
    }
}

/// Limits derived from the flags and the model.
struct Limits {
    max_input_tokens: usize,
    max_total_tokens: usize,
    max_batch_prefill_tokens: usize,
}

fn limits(args: &Args, context: usize) -> anyhow::Result<Limits> {
    let max_total_tokens = args.max_total_tokens.unwrap_or(context.min(4096));
    let max_input_tokens = args
        .max_input_tokens
        .unwrap_or(max_total_tokens.saturating_sub(1).min(4095));
    if max_input_tokens >= max_total_tokens {
        bail!(
            "--max-input-tokens ({max_input_tokens}) must be below --max-total-tokens ({max_total_tokens})"
        );
    }
    if max_total_tokens > context {
        bail!(
            "--max-total-tokens ({max_total_tokens}) exceeds the model's context of {context} tokens"
        );
    }
    // Long prompts are chunked, so the step budget may be smaller than the longest prompt.
    let max_batch_prefill_tokens = args
        .max_batch_prefill_tokens
        .unwrap_or(max_input_tokens.clamp(512, 4096));
    if max_batch_prefill_tokens == 0 {
        bail!("--max-batch-prefill-tokens must be at least 1");
    }
    Ok(Limits {
        max_input_tokens,
        max_total_tokens,
        max_batch_prefill_tokens,
    })
}

fn request_timeout(args: &Args) -> anyhow::Result<Option<Duration>> {
    args.request_timeout
        .map(|s| {
            Duration::try_from_secs_f64(s)
                .ok()
                .filter(|d| !d.is_zero())
                .with_context(|| {
                    format!("--request-timeout {s}: give a positive number of seconds")
                })
        })
        .transpose()
}

fn cors_origins(args: &Args) -> anyhow::Result<Vec<HeaderValue>> {
    args.cors_allow_origin
        .iter()
        .map(|o| {
            HeaderValue::from_str(o.trim())
                .with_context(|| format!("--cors-allow-origin {o:?} is not a valid origin"))
        })
        .collect()
}

/// The KV cache the shards allocated, capped by `--max-batch-total-tokens`.
struct KvCache {
    num_blocks: usize,
    block_size: usize,
    max_batch_total_tokens: usize,
}

/// Warms the shards up for the largest batch `limits` allow and sizes the KV cache from
/// what they report.
async fn warm_up(
    client: &ShardedClient,
    args: &Args,
    limits: &Limits,
    max_batch_size: usize,
) -> anyhow::Result<KvCache> {
    let warmup = client
        .warmup(WarmupRequest {
            max_input_tokens: limits.max_input_tokens as u32,
            max_batch_prefill_tokens: limits.max_batch_prefill_tokens as u32,
            max_total_tokens: limits.max_total_tokens as u32,
            max_batch_size: max_batch_size as u32,
        })
        .await
        .context("warming up the shards")?;
    let block_size = warmup.block_size as usize;
    let mut num_blocks = warmup.num_blocks as usize;
    if let Some(cap) = args.max_batch_total_tokens {
        if cap < limits.max_total_tokens {
            bail!(
                "--max-batch-total-tokens ({cap}) must be at least --max-total-tokens ({})",
                limits.max_total_tokens
            );
        }
        num_blocks = num_blocks.min(cap.div_ceil(block_size) + 1);
    }
    let max_batch_total_tokens = (num_blocks - 1) * block_size;
    tracing::info!(
        num_blocks,
        block_size,
        max_batch_total_tokens,
        "KV cache sized"
    );
    Ok(KvCache {
        num_blocks,
        block_size,
        max_batch_total_tokens,
    })
}

/// Resolves once the server should stop listening: on Ctrl-C or SIGTERM it starts draining
/// (`/health` answers 503 and new requests are refused, while the listener stays open so
/// load balancers see it), then resolves when the requests in flight are done or at a second
/// signal. Axum then finishes the connections still open.
async fn drain_on_signal(infer: Infer) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
    infer.start_draining();
    tracing::info!(
        in_flight = infer.in_flight(),
        "draining: no new requests, finishing those in flight"
    );
    tokio::select! {
        _ = infer.drained() => tracing::info!("drained; shutting down"),
        _ = int.recv() => tracing::warn!("second signal; shutting down without waiting"),
        _ = term.recv() => tracing::warn!("second signal; shutting down without waiting"),
    }
    Ok(())
}

/// Threads for the router's blocking work (tokenizing, rendering templates, checking grammars):
/// a few per core. Tokio's default (512, each leaving after 10 s idle) lets a burst of requests
/// start dozens of threads on a small machine, each with its own tokenizer regex caches, and
/// every new burst starts them again, so the heap grows and fragments with each one; a small
/// pool that stays keeps those caches few and reused.
fn blocking_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (4 * cores).max(8)
}

/// How long an idle blocking thread stays.
const BLOCKING_KEEP_ALIVE: Duration = Duration::from_secs(600);

fn main() -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(blocking_threads())
        .thread_keep_alive(BLOCKING_KEEP_ALIVE)
        .build()
        .context("starting the async runtime")?
        .block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    let _telemetry = tessera_telemetry::init(
        &TelemetryConfig {
            json: args.json_output,
            otlp_endpoint: args.otlp_endpoint.clone(),
            service_name: args.otlp_service_name.clone(),
        },
        Process::Router,
    )?;
    let api_key = std::env::var("TESSERA_API_KEY")
        .ok()
        .filter(|k| !k.is_empty());
    let prometheus = install_recorder().context("installing the metrics recorder")?;
    fix_malloc_thresholds();
    spawn_trimmer(std::time::Duration::from_secs(10)).context("starting the heap trimmer")?;

    let served_model_name = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| model_name(&args.model_id));

    let client = connect(&args.master_shard_uds_path).await?;
    if client.len() != args.num_shard as usize {
        bail!(
            "expected {} shards, the shards report {}",
            args.num_shard,
            client.len()
        );
    }
    let tokenizer = Arc::new(load_tokenizer(&client, &args).await?);
    let info = client.info().await?;
    let limits = limits(&args, info.max_position_embeddings as usize)?;
    let max_batch_size = args
        .max_batch_size
        .unwrap_or(args.max_concurrent_requests)
        .max(1);
    let kv = warm_up(&client, &args, &limits, max_batch_size).await?;

    let pooling = pooling_model(&args, &info, &tokenizer)?;
    set_speculator(&info.speculator);
    let (queue, health) = batcher::spawn(BatcherConfig {
        client,
        tokenizer: tokenizer.clone(),
        num_blocks: kv.num_blocks,
        block_size: kv.block_size,
        limits: SchedulerLimits {
            max_batch_prefill_tokens: limits.max_batch_prefill_tokens,
            max_batch_size,
            prefix_caching: args.prefix_caching,
            speculate: info.speculate as usize,
            rope: rope_rule(&info),
        },
        queue_capacity: args.max_concurrent_requests,
    });
    let infer = Infer::new(queue, args.max_concurrent_requests);
    let drained = drain_on_signal(infer.clone());
    let state = AppState::builder(infer, tokenizer, served_model_name)
        .validation(ValidationConfig {
            max_input_tokens: limits.max_input_tokens,
            max_total_tokens: limits.max_total_tokens,
            max_stop_sequences: args.max_stop_sequences,
            max_top_n_tokens: args.max_top_n_tokens,
            tool_call_format: args.tool_call_parser,
            reasoning: args.reasoning_parser,
            ..Default::default()
        })
        .info(ModelInfo {
            model_id: args.model_id.display().to_string(),
            model_dtype: info.dtype,
            model_device_type: info.device_type,
            max_batch_total_tokens: Some(kv.max_batch_total_tokens as u32),
            max_batch_prefill_tokens: limits.max_batch_prefill_tokens as u32,
            ..Default::default()
        })
        .pooling(pooling)
        .api_key(api_key)
        .payload_limit(args.payload_limit)
        .health_check(health)
        .prometheus(prometheus)
        .request_timeout(request_timeout(&args)?)
        .cors_allow_origin(cors_origins(&args)?)
        .build();
    state.warm_grammars();
    let (drain_result_tx, drain_result_rx) = tokio::sync::oneshot::channel();
    let shutdown = async move {
        let _ = drain_result_tx.send(drained.await);
    };
    serve(state, SocketAddr::new(args.hostname, args.port), shutdown).await?;
    drain_result_rx
        .await
        .context("the drain task ended without a result")?
}
