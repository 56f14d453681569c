//! Command-line flags.

use std::path::PathBuf;

use clap::Parser;
use tessera_bench::Endpoint;

/// Measures the speed and latency of an OpenAI-compatible server (Tessera, TGI, vLLM,
/// SGLang, llama.cpp's server) with streaming requests.
#[derive(Debug, Parser)]
#[command(name = "tessera-bench", version)]
pub(crate) struct Args {
    /// Server base URL (plain http).
    #[arg(long, default_value = "http://127.0.0.1:3000")]
    pub(crate) url: String,

    /// The `model` field; by default the first model `GET /v1/models` lists.
    #[arg(long)]
    pub(crate) model: Option<String>,

    /// Route: `completions` sends the prompt as is; `chat` sends it as one user message
    /// (the server's chat template adds tokens).
    #[arg(long, value_enum, default_value = "completions")]
    pub(crate) endpoint: Endpoint,

    /// Requests per run (per sweep level).
    #[arg(long, short = 'n', default_value_t = 64)]
    pub(crate) num_requests: usize,

    /// At most this many requests in flight (default: no cap).
    #[arg(long, conflicts_with = "sweep")]
    pub(crate) concurrency: Option<usize>,

    /// Mean request arrivals per second (default: all at once).
    #[arg(long)]
    pub(crate) request_rate: Option<f64>,

    /// Gamma shape of inter-arrival times with --request-rate: 1 is Poisson, <1 burstier.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) burstiness: f64,

    /// Run once per concurrency level, e.g. `1,4,16`, for a throughput-vs-latency curve.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub(crate) sweep: Vec<usize>,

    /// Synthetic prompt length in tokens (needs --tokenizer).
    #[arg(long, default_value_t = 256)]
    pub(crate) input_len: usize,

    /// `max_tokens` per request (default 128; with --dataset, the dataset's lengths unless
    /// this is given).
    #[arg(long)]
    pub(crate) output_len: Option<u32>,

    /// Spread synthetic lengths uniformly over [len (1 - r), len (1 + r)].
    #[arg(long, default_value_t = 0.0)]
    pub(crate) range_ratio: f64,

    /// Prompts from a JSONL file (`{"prompt": ...}`) or a ShareGPT file instead of
    /// synthetic ones.
    #[arg(long)]
    pub(crate) dataset: Option<PathBuf>,

    /// The model's tokenizer: a Hugging Face directory, a `tokenizer.json`'s folder, or a
    /// `.gguf` file.
    #[arg(long)]
    pub(crate) tokenizer: Option<PathBuf>,

    /// Seed of prompts, sampling order and arrivals.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,

    /// Requests sent (at the run's concurrency) before measuring, not counted.
    #[arg(long, default_value_t = 0)]
    pub(crate) warmup: usize,

    /// Sent as `Authorization: Bearer <key>`.
    #[arg(long)]
    pub(crate) api_key: Option<String>,

    /// Send `ignore_eos: true` so every request generates exactly `max_tokens` (Tessera,
    /// vLLM, SGLang; other servers may ignore or reject it).
    #[arg(long)]
    pub(crate) ignore_eos: bool,

    /// Sampling temperature.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) temperature: f32,

    /// A JSON object merged into every request body, e.g. '{"min_tokens": 64}'.
    #[arg(long)]
    pub(crate) extra_body: Option<String>,

    /// Per-request limit in seconds, stream included.
    #[arg(long, default_value_t = 600.0)]
    pub(crate) timeout: f64,

    /// Write everything (settings, statistics, every request) as JSON.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,

    /// Write an SVG of latency distributions and throughput.
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,

    /// Compare two `--json` results side by side (B/A ratios) and exit.
    #[arg(long, num_args = 2, value_names = ["A", "B"])]
    pub(crate) compare: Vec<PathBuf>,

    /// No progress bar.
    #[arg(long)]
    pub(crate) no_progress: bool,
}
