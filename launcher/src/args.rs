//! Command-line interface of `tessera-launcher`.
//!
//! Every flag can also be given through an environment variable (shown in `--help`); flags on
//! the command line win over the environment. The names follow TGI's launcher where a TGI flag
//! exists.

use std::convert::Infallible;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::{ArgAction, Parser, ValueEnum};

use crate::router::{ChatOptions, RouterConfig, RouterLimits};
use crate::shard::{ShardConfig, Speculation};

/// Start a Tessera cluster: N shard processes and one router, supervised together.
#[derive(Debug, Clone, Parser)]
#[command(name = "tessera-launcher", version, about, long_about = None)]
pub(crate) struct Args {
    /// Model to serve: a local Hugging Face directory (config.json, tokenizer.json,
    /// *.safetensors) or `.gguf` file, or a Hugging Face Hub id: `ORG/NAME` (a safetensors
    /// checkpoint) or `ORG/NAME-GGUF:QUANT` (one GGUF file; Q4_K_M when no quant is named),
    /// fetched into the Hugging Face cache (`HF_HOME`, `HF_HUB_CACHE`; `HF_TOKEN`,
    /// `HF_ENDPOINT`, `HF_HUB_OFFLINE=1` as for `huggingface_hub`). When omitted,
    /// SmolLM2-135M-Instruct (Q4_1 GGUF) is downloaded once into
    /// `${TESSERA_CACHE:-$HOME/.cache/tessera}` and reused.
    #[arg(long, env = "MODEL_ID")]
    pub(crate) model_id: Option<PathBuf>,

    /// The revision of a Hub `--model-id`: a branch, tag or commit.
    #[arg(long, env = "REVISION")]
    pub(crate) revision: Option<String>,

    /// Name under which the model is served (the `model` field of the OpenAI API). Defaults to
    /// the Hub id as given, the model's folder name, or its file name without `.gguf`.
    #[arg(long, env = "SERVED_MODEL_NAME")]
    pub(crate) served_model_name: Option<String>,

    /// Number of shard processes (tensor-parallel ranks) to start.
    #[arg(long, env = "NUM_SHARD", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) num_shard: u32,

    /// Address the router's HTTP server binds to. (Read from `TESSERA_HOSTNAME`, not
    /// `HOSTNAME`, which shells and containers set to the machine's name.)
    #[arg(long, env = "TESSERA_HOSTNAME", default_value = "0.0.0.0")]
    pub(crate) hostname: String,

    /// Port of the router's HTTP server.
    #[arg(long, short, env = "PORT", default_value_t = 3000)]
    pub(crate) port: u16,

    /// Prefix of the shards' unix sockets: shard `i` listens on `{shard_uds_path}-{i}`.
    #[arg(long, env = "SHARD_UDS_PATH", default_value = "/tmp/tessera-server")]
    pub(crate) shard_uds_path: PathBuf,

    /// Address of rank 0 for the shards' collective rendezvous.
    #[arg(long, env = "MASTER_ADDR", default_value = "localhost")]
    pub(crate) master_addr: String,

    /// Port of rank 0 for the shards' collective rendezvous.
    #[arg(long, env = "MASTER_PORT", default_value_t = 29500)]
    pub(crate) master_port: u16,

    /// Element type of the KV cache and activations: `auto` (a model declared bf16 computes
    /// as `bfloat16`; GGUF-quantized weights get a bf16 KV cache and f32 activations; others
    /// float32; GPU shards bfloat16), `float32`, or
    /// `bfloat16` (half the KV memory per token, and products with bf16-stored weights take
    /// bf16 activations, as PyTorch computes a bf16 model). When omitted, the shard picks
    /// `auto`.
    #[arg(long, env = "DTYPE", value_enum)]
    pub(crate) dtype: Option<Dtype>,

    /// Bytes of memory for the KV cache on CPU. Accepts suffixes: K, M, G, T (and KiB, MiB,
    /// GiB, TiB) are powers of 1024; KB, MB, GB, TB are powers of 1000. Example: `512M`, `2G`.
    #[arg(long, env = "KV_CACHE_MEMORY", default_value = "1G", value_parser = parse_size)]
    pub(crate) kv_cache_memory: u64,

    /// GPU shards: the share of the GPU's free memory, once the weights are loaded and a
    /// worst-case step's activations set aside, that the KV cache takes, in (0, 1] (vLLM's
    /// `--gpu-memory-utilization`; TGI's name `--cuda-memory-fraction` is accepted too).
    #[arg(long, visible_alias = "cuda-memory-fraction", env = "MEMORY_FRACTION",
          default_value_t = 0.9, value_parser = parse_fraction)]
    pub(crate) memory_fraction: f32,

    /// Tokens per KV-cache block.
    #[arg(long, env = "BLOCK_SIZE", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) block_size: u32,

    /// Most requests handled at once; more are rejected with 429.
    #[arg(long, env = "MAX_CONCURRENT_REQUESTS", default_value_t = 128)]
    pub(crate) max_concurrent_requests: u32,

    /// Most stop sequences per request.
    #[arg(long, env = "MAX_STOP_SEQUENCES", default_value_t = 4)]
    pub(crate) max_stop_sequences: u32,

    /// Most top-n tokens (logprobs) per generated token a request may ask for.
    #[arg(long, env = "MAX_TOP_N_TOKENS", default_value_t = 5)]
    pub(crate) max_top_n_tokens: u32,

    /// Most prompt tokens per request. The router derives a default from the model.
    #[arg(long, env = "MAX_INPUT_TOKENS")]
    pub(crate) max_input_tokens: Option<u32>,

    /// Most prompt plus generated tokens per request. The router derives a default from the
    /// model.
    #[arg(long, env = "MAX_TOTAL_TOKENS")]
    pub(crate) max_total_tokens: Option<u32>,

    /// Tokens computed in one step (prompt chunks and decodes together); longer prompts are
    /// prefilled in chunks. The router derives a default.
    #[arg(long, env = "MAX_BATCH_PREFILL_TOKENS")]
    pub(crate) max_batch_prefill_tokens: Option<u32>,

    /// Most tokens (prompt plus generated) held by one batch. By default the router uses what
    /// the shards report fits in the KV cache.
    #[arg(long, env = "MAX_BATCH_TOTAL_TOKENS")]
    pub(crate) max_batch_total_tokens: Option<u32>,

    /// Most requests in one batch. The router derives a default.
    #[arg(long, env = "MAX_BATCH_SIZE")]
    pub(crate) max_batch_size: Option<u32>,

    /// Accepted for TGI compatibility and unused: prompt chunks and decodes share every step,
    /// so a waiting request joins at the next step whenever it fits.
    #[arg(long, env = "MAX_WAITING_TOKENS", default_value_t = 20)]
    pub(crate) max_waiting_tokens: u32,

    /// Largest HTTP request body in bytes.
    #[arg(long, env = "PAYLOAD_LIMIT", default_value_t = 2_000_000)]
    pub(crate) payload_limit: u64,

    /// API key clients must send as `Authorization: Bearer <key>`. Handed to the router through
    /// its environment, never on a command line, and never printed.
    #[arg(long, env = "API_KEY", hide_env_values = true)]
    pub(crate) api_key: Option<Secret>,

    /// Log as JSON lines (launcher and children). Children's lines get a `source` field.
    #[arg(long, env = "JSON_OUTPUT")]
    pub(crate) json_output: bool,

    /// Reuse the KV cache of shared prompt prefixes across requests (`--prefix-caching false`
    /// turns it off).
    #[arg(long, env = "PREFIX_CACHING", default_value_t = true, action = ArgAction::Set)]
    pub(crate) prefix_caching: bool,

    /// Speculative decoding: how many tokens to propose per step.
    #[arg(long, env = "SPECULATE")]
    pub(crate) speculate: Option<u32>,

    /// Speculative decoding: the proposer (`ngram`, `draft`, `medusa` or `eagle`).
    #[arg(long, env = "SPECULATOR")]
    pub(crate) speculator: Option<String>,

    /// Speculative decoding: the draft model (a local directory or `.gguf` file, or a Hub id
    /// as for `--model-id`, at its main revision), or the local directory of the model's
    /// Medusa heads or EAGLE head.
    #[arg(long, env = "DRAFT_MODEL_ID")]
    pub(crate) draft_model_id: Option<PathBuf>,

    /// Speculative decoding with draft heads: candidate paths per token tree (Medusa), nodes
    /// kept per tree level (EAGLE); 1: a chain.
    #[arg(long, env = "SPECULATIVE_TREE_WIDTH")]
    pub(crate) speculative_tree_width: Option<u32>,

    /// OpenTelemetry collector endpoint (OTLP over gRPC) for traces.
    #[arg(long, env = "OTLP_ENDPOINT")]
    pub(crate) otlp_endpoint: Option<String>,

    /// Service name reported in traces.
    #[arg(long, env = "OTLP_SERVICE_NAME")]
    pub(crate) otlp_service_name: Option<String>,

    /// A Jinja chat template file to use instead of the model's.
    #[arg(long, env = "CHAT_TEMPLATE")]
    pub(crate) chat_template: Option<PathBuf>,

    /// How the model writes tool calls: hermes, llama3_json or mistral (default: what the chat
    /// template shows; hermes for templates that render no tools).
    #[arg(long, env = "TOOL_CALL_PARSER")]
    pub(crate) tool_call_parser: Option<String>,

    /// Read the model's reasoning into `reasoning_content`: qwen3 or deepseek_r1.
    #[arg(long, env = "REASONING_PARSER")]
    pub(crate) reasoning_parser: Option<String>,

    /// What the server does: `generate`, `embed` (`/v1/embeddings`) or `score` (`/v1/rerank`,
    /// `/v1/score`); default: what the model declares (a classification head scores, a
    /// sentence-transformers pooling config embeds, anything else generates).
    #[arg(long, env = "TASK")]
    pub(crate) task: Option<String>,

    /// With `--task score` on a model without a classification head (Qwen3-Reranker): the
    /// tokens whose logits are the labels, comma-separated, the last one's probability the
    /// score (default `no,yes`).
    #[arg(long, env = "SCORE_LABELS")]
    pub(crate) score_labels: Option<String>,

    /// Longest a request may take, in seconds from its arrival (504 `deadline_exceeded` past
    /// it); a request's `X-Request-Timeout` header can shorten it. None: no limit.
    #[arg(long, env = "REQUEST_TIMEOUT")]
    pub(crate) request_timeout: Option<f64>,

    /// Origins browsers may call the API from (CORS); `*` allows any. Comma-separated.
    #[arg(long, env = "CORS_ALLOW_ORIGIN", value_delimiter = ',')]
    pub(crate) cors_allow_origin: Vec<String>,

    /// Seconds each stage of shutdown waits (router, then shards) before moving on; what is
    /// still running after both stages is killed.
    #[arg(long, env = "SHUTDOWN_GRACE_PERIOD", default_value_t = 10)]
    pub(crate) shutdown_grace_period: u64,

    /// Seconds to wait for every shard's socket to appear (model loading and warmup included).
    #[arg(long, env = "SHARD_STARTUP_TIMEOUT", default_value_t = 120)]
    pub(crate) shard_startup_timeout: u64,
}

impl Args {
    /// How long each shutdown stage waits.
    pub(crate) fn grace_period(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_period)
    }

    /// How long to wait for all shards to be ready.
    pub(crate) fn startup_timeout(&self) -> Duration {
        Duration::from_secs(self.shard_startup_timeout)
    }

    /// The shards' configuration, for a model and draft model already resolved to local paths.
    pub(crate) fn shard_config(&self, model: PathBuf, draft_model: Option<PathBuf>) -> ShardConfig {
        ShardConfig {
            model,
            uds_path: self.shard_uds_path.clone(),
            world_size: self.num_shard,
            master_addr: self.master_addr.clone(),
            master_port: self.master_port,
            dtype: self.dtype,
            kv_cache_memory: self.kv_cache_memory,
            memory_fraction: self.memory_fraction,
            block_size: self.block_size,
            json_output: self.json_output,
            otlp_endpoint: self.otlp_endpoint.clone(),
            speculation: Speculation {
                speculate: self.speculate,
                speculator: self.speculator.clone(),
                draft_model,
                tree_width: self.speculative_tree_width,
            },
        }
    }

    /// The router's configuration, for a model already resolved to a local path.
    pub(crate) fn router_config(&self, model: PathBuf, served_model_name: String) -> RouterConfig {
        RouterConfig {
            model,
            served_model_name,
            num_shard: self.num_shard,
            shard_uds_path: self.shard_uds_path.clone(),
            hostname: self.hostname.clone(),
            port: self.port,
            limits: RouterLimits {
                max_concurrent_requests: self.max_concurrent_requests,
                max_stop_sequences: self.max_stop_sequences,
                max_top_n_tokens: self.max_top_n_tokens,
                max_input_tokens: self.max_input_tokens,
                max_total_tokens: self.max_total_tokens,
                max_batch_prefill_tokens: self.max_batch_prefill_tokens,
                max_batch_total_tokens: self.max_batch_total_tokens,
                max_batch_size: self.max_batch_size,
                max_waiting_tokens: self.max_waiting_tokens,
                payload_limit: self.payload_limit,
            },
            api_key: self.api_key.clone(),
            json_output: self.json_output,
            prefix_caching: self.prefix_caching,
            otlp_endpoint: self.otlp_endpoint.clone(),
            otlp_service_name: self.otlp_service_name.clone(),
            chat: ChatOptions {
                chat_template: self.chat_template.clone(),
                tool_call_parser: self.tool_call_parser.clone(),
                reasoning_parser: self.reasoning_parser.clone(),
            },
            request_timeout: self.request_timeout,
            cors_allow_origin: self.cors_allow_origin.clone(),
            task: self.task.clone(),
            score_labels: self.score_labels.clone(),
        }
    }
}

/// KV-cache element type, as the shard spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Dtype {
    /// The shard decides from the model's weights.
    #[value(name = "auto")]
    Auto,
    /// 32-bit IEEE float.
    #[value(name = "float32")]
    Float32,
    /// bfloat16.
    #[value(name = "bfloat16")]
    Bfloat16,
}

impl Dtype {
    /// The flag value passed to the shard.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Dtype::Auto => "auto",
            Dtype::Float32 => "float32",
            Dtype::Bfloat16 => "bfloat16",
        }
    }
}

/// A string that must never be printed (an API key). `Debug` and `Display` show `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(String);

impl Secret {
    /// The secret itself, for handing to a child through its environment.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl FromStr for Secret {
    type Err = Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Parses a byte size such as `1073741824`, `512M`, `2GiB`, `1.5G` or `500MB`.
///
/// `K`/`M`/`G`/`T` (optionally followed by `iB`) are powers of 1024; `KB`/`MB`/`GB`/`TB` are
/// powers of 1000; a bare number or a `B` suffix is bytes. Case does not matter. Zero is
/// rejected.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let number = number.trim();
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "t" | "ti" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "unknown size unit `{other}` in `{text}` (use K, M, G, T, KB, MB, GB, TB or none)"
            ));
        }
    };
    let bytes = if let Ok(whole) = number.parse::<u64>() {
        whole
            .checked_mul(multiplier)
            .ok_or_else(|| format!("size `{text}` is too large"))?
    } else {
        let value: f64 = number.parse().map_err(|_| {
            format!(
                "invalid size `{text}`: expected a number with an optional unit such as 512M or 2G"
            )
        })?;
        let bytes = value * multiplier as f64;
        if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
            return Err(format!("size `{text}` is out of range"));
        }
        bytes.round() as u64
    };
    if bytes == 0 {
        return Err(format!("size `{text}` must be greater than zero"));
    }
    Ok(bytes)
}

/// Parses a fraction in `(0, 1]`.
fn parse_fraction(text: &str) -> Result<f32, String> {
    let value: f32 = text
        .trim()
        .parse()
        .map_err(|_| format!("invalid fraction `{text}`: expected a number in (0, 1]"))?;
    if value > 0.0 && value <= 1.0 {
        Ok(value)
    } else {
        Err(format!("fraction `{text}` must be in (0, 1]"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses a command line without looking at the process environment.
    fn parse(argv: &[&str]) -> Result<Args, clap::Error> {
        parse_with_env(argv, &[])
    }

    /// Parses a command line as if `env` were the whole process environment.
    ///
    /// Mutating the real environment is `unsafe` in edition 2024 and racy across test threads,
    /// so the command's env lookups are rewritten instead (see [`isolate_env`]).
    fn parse_with_env(argv: &[&str], env: &[(&str, &str)]) -> Result<Args, clap::Error> {
        let mut full: Vec<String> = vec!["tessera-launcher".to_owned()];
        full.extend(argv.iter().map(|s| (*s).to_owned()));
        let command = isolate_env(<Args as clap::CommandFactory>::command(), env);
        let matches = command.try_get_matches_from(full)?;
        <Args as clap::FromArgMatches>::from_arg_matches(&matches)
    }

    /// Replaces every argument's env lookup: an argument whose env name is in `env` gets that
    /// value as its default (so flags still win, like a real env var); all other env lookups are
    /// removed, so the tests do not depend on the environment they run in.
    fn isolate_env(command: clap::Command, env: &[(&str, &str)]) -> clap::Command {
        let ids: Vec<(String, Option<String>)> = command
            .get_arguments()
            .map(|arg| {
                (
                    arg.get_id().to_string(),
                    arg.get_env().map(|e| e.to_string_lossy().into_owned()),
                )
            })
            .collect();
        let mut command = command;
        for (id, env_name) in ids {
            let value = env_name.and_then(|name| {
                env.iter()
                    .find(|(key, _)| *key == name)
                    .map(|(_, value)| -> &'static str {
                        Box::leak((*value).to_owned().into_boxed_str())
                    })
            });
            command = command.mut_arg(id, move |arg| {
                let arg = arg.env(None::<&'static str>);
                match value {
                    Some(v) => arg.default_value(v),
                    None => arg,
                }
            });
        }
        command
    }

    #[test]
    fn defaults() {
        let args = parse(&[]).expect("defaults parse");
        assert_eq!(args.model_id, None);
        assert_eq!(args.num_shard, 1);
        assert_eq!(args.hostname, "0.0.0.0");
        assert_eq!(args.port, 3000);
        assert_eq!(args.shard_uds_path, PathBuf::from("/tmp/tessera-server"));
        assert_eq!(args.master_addr, "localhost");
        assert_eq!(args.master_port, 29500);
        assert_eq!(args.dtype, None);
        assert_eq!(args.kv_cache_memory, 1 << 30);
        assert!((args.memory_fraction - 0.9).abs() < 1e-6);
        assert_eq!(args.block_size, 16);
        assert_eq!(args.max_concurrent_requests, 128);
        assert_eq!(args.max_stop_sequences, 4);
        assert_eq!(args.max_top_n_tokens, 5);
        assert_eq!(args.max_input_tokens, None);
        assert_eq!(args.max_total_tokens, None);
        assert_eq!(args.max_waiting_tokens, 20);
        assert_eq!(args.payload_limit, 2_000_000);
        assert_eq!(args.api_key, None);
        assert!(!args.json_output);
        assert!(args.prefix_caching);
        assert_eq!(args.grace_period(), Duration::from_secs(10));
        assert_eq!(args.startup_timeout(), Duration::from_secs(120));
    }

    #[test]
    fn flags() {
        let args = parse(&[
            "--model-id",
            "/models/x.gguf",
            "--num-shard",
            "2",
            "--dtype",
            "float32",
            "--kv-cache-memory",
            "512M",
            "--prefix-caching",
            "false",
            "--json-output",
            "--max-input-tokens",
            "1000",
            "-p",
            "8080",
        ])
        .expect("flags parse");
        assert_eq!(args.model_id, Some(PathBuf::from("/models/x.gguf")));
        assert_eq!(args.num_shard, 2);
        assert_eq!(args.dtype, Some(Dtype::Float32));
        assert_eq!(args.kv_cache_memory, 512 << 20);
        assert!(!args.prefix_caching);
        assert!(args.json_output);
        assert_eq!(args.max_input_tokens, Some(1000));
        assert_eq!(args.port, 8080);
    }

    #[test]
    fn env_vars_and_flag_precedence() {
        let env = [
            ("MODEL_ID", "/m"),
            ("PORT", "9000"),
            ("NUM_SHARD", "4"),
            ("KV_CACHE_MEMORY", "2G"),
            ("API_KEY", "sekret"),
            ("PREFIX_CACHING", "false"),
            ("TESSERA_HOSTNAME", "127.0.0.1"),
            ("DTYPE", "bfloat16"),
        ];
        let args = parse_with_env(&[], &env).expect("env parse");
        assert_eq!(args.model_id, Some(PathBuf::from("/m")));
        assert_eq!(args.port, 9000);
        assert_eq!(args.num_shard, 4);
        assert_eq!(args.kv_cache_memory, 2 << 30);
        assert_eq!(args.api_key.as_ref().map(Secret::expose), Some("sekret"));
        assert!(!args.prefix_caching);
        assert_eq!(args.hostname, "127.0.0.1");
        assert_eq!(args.dtype, Some(Dtype::Bfloat16));

        let args = parse_with_env(&["--port", "1234"], &env).expect("env parse");
        assert_eq!(args.port, 1234, "a flag wins over the environment");
    }

    #[test]
    fn env_names_are_the_documented_ones() {
        let command = <Args as clap::CommandFactory>::command();
        let env_of = |id: &str| {
            command
                .get_arguments()
                .find(|arg| arg.get_id() == id)
                .and_then(|arg| arg.get_env())
                .map(|e| e.to_string_lossy().into_owned())
        };
        assert_eq!(env_of("model_id").as_deref(), Some("MODEL_ID"));
        assert_eq!(env_of("port").as_deref(), Some("PORT"));
        assert_eq!(env_of("api_key").as_deref(), Some("API_KEY"));
        assert_eq!(env_of("hostname").as_deref(), Some("TESSERA_HOSTNAME"));
        // Every argument is readable from the environment.
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            assert!(arg.get_env().is_some(), "--{id} has no env var");
        }
    }

    #[test]
    fn tgi_name_of_the_memory_fraction_is_accepted() {
        let args = parse(&["--cuda-memory-fraction", "0.5"]).unwrap();
        assert!((args.memory_fraction - 0.5).abs() < 1e-6);
    }

    #[test]
    fn invalid_values_are_rejected() {
        assert!(parse(&["--num-shard", "0"]).is_err());
        assert!(parse(&["--memory-fraction", "1.5"]).is_err());
        assert!(parse(&["--memory-fraction", "0"]).is_err());
        assert!(parse(&["--dtype", "int8"]).is_err());
        // The CPU shard stores the KV cache in float32 or bfloat16 only.
        assert!(parse(&["--dtype", "float16"]).is_err());
        assert_eq!(
            parse(&["--dtype", "auto"]).unwrap().dtype,
            Some(Dtype::Auto)
        );
        assert!(parse(&["--kv-cache-memory", "lots"]).is_err());
        assert!(parse(&["--block-size", "0"]).is_err());
    }

    #[test]
    fn size_suffixes() {
        assert_eq!(parse_size("1073741824"), Ok(1 << 30));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("2 GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("500MB"), Ok(500_000_000));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("100B"), Ok(100));
        assert!(parse_size("0").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn secret_is_not_printed() {
        let args = parse_with_env(&[], &[("API_KEY", "hunter2")]).expect("parse");
        let debug = format!("{args:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(debug.contains("<redacted>"));
    }
}
