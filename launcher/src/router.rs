//! The router process: its command line.

use std::path::{Path, PathBuf};

use crate::args::Secret;
use crate::process::CommandSpec;
use crate::shard::socket_path;

/// Environment variable through which the router receives the API key (kept off its argv so
/// it does not show in `ps`).
pub(crate) const API_KEY_ENV: &str = "TESSERA_API_KEY";

/// Request and batching limits handed to the router. `None` lets the router derive the value
/// from the model and the shards' memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RouterLimits {
    /// `--max-concurrent-requests`.
    pub(crate) max_concurrent_requests: u32,
    /// `--max-stop-sequences`.
    pub(crate) max_stop_sequences: u32,
    /// `--max-top-n-tokens`.
    pub(crate) max_top_n_tokens: u32,
    /// `--max-input-tokens`.
    pub(crate) max_input_tokens: Option<u32>,
    /// `--max-total-tokens`.
    pub(crate) max_total_tokens: Option<u32>,
    /// `--max-batch-prefill-tokens`.
    pub(crate) max_batch_prefill_tokens: Option<u32>,
    /// `--max-batch-total-tokens`.
    pub(crate) max_batch_total_tokens: Option<u32>,
    /// `--max-batch-size`.
    pub(crate) max_batch_size: Option<u32>,
    /// `--max-waiting-tokens`.
    pub(crate) max_waiting_tokens: u32,
    /// `--payload-limit`, in bytes.
    pub(crate) payload_limit: u64,
}

/// The router's configuration; [`RouterConfig::command`] turns it into a command line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RouterConfig {
    /// The model, resolved to a local directory or `.gguf` file (for tokenizer and config).
    pub(crate) model: PathBuf,
    /// The name clients use for the model.
    pub(crate) served_model_name: String,
    /// Number of shards.
    pub(crate) num_shard: u32,
    /// Socket prefix of the shards.
    pub(crate) shard_uds_path: PathBuf,
    /// HTTP bind address.
    pub(crate) hostname: String,
    /// HTTP port.
    pub(crate) port: u16,
    /// Request and batching limits.
    pub(crate) limits: RouterLimits,
    /// API key, handed over in the environment.
    pub(crate) api_key: Option<Secret>,
    /// Log as JSON lines.
    pub(crate) json_output: bool,
    /// Whether the prefix cache is on.
    pub(crate) prefix_caching: bool,
    /// OTLP traces endpoint.
    pub(crate) otlp_endpoint: Option<String>,
    /// Service name in traces.
    pub(crate) otlp_service_name: Option<String>,
    /// `--request-timeout`, in seconds.
    pub(crate) request_timeout: Option<f64>,
    /// `--cors-allow-origin`.
    pub(crate) cors_allow_origin: Vec<String>,
    /// How conversations are rendered and answers read.
    pub(crate) chat: ChatOptions,
    /// `--task`.
    pub(crate) task: Option<String>,
    /// `--score-labels`.
    pub(crate) score_labels: Option<String>,
}

/// The chat template and the parsers of the model's output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ChatOptions {
    /// `--chat-template`.
    pub(crate) chat_template: Option<PathBuf>,
    /// `--tool-call-parser`.
    pub(crate) tool_call_parser: Option<String>,
    /// `--reasoning-parser`.
    pub(crate) reasoning_parser: Option<String>,
}

impl RouterConfig {
    /// The router's command line and environment, running `program`.
    pub(crate) fn command(&self, program: &Path) -> CommandSpec {
        let limits = &self.limits;
        let mut spec = CommandSpec::new(program);
        spec.flag("--model-id", &self.model)
            .flag("--served-model-name", &self.served_model_name)
            .flag(
                "--master-shard-uds-path",
                socket_path(&self.shard_uds_path, 0),
            )
            .flag("--num-shard", self.num_shard.to_string())
            .flag("--shard-uds-path", &self.shard_uds_path)
            .flag("--hostname", &self.hostname)
            .flag("--port", self.port.to_string())
            .flag(
                "--max-concurrent-requests",
                limits.max_concurrent_requests.to_string(),
            )
            .flag(
                "--max-stop-sequences",
                limits.max_stop_sequences.to_string(),
            )
            .flag("--max-top-n-tokens", limits.max_top_n_tokens.to_string())
            .opt_flag(
                "--max-input-tokens",
                limits.max_input_tokens.map(|v| v.to_string()),
            )
            .opt_flag(
                "--max-total-tokens",
                limits.max_total_tokens.map(|v| v.to_string()),
            )
            .opt_flag(
                "--max-batch-prefill-tokens",
                limits.max_batch_prefill_tokens.map(|v| v.to_string()),
            )
            .opt_flag(
                "--max-batch-total-tokens",
                limits.max_batch_total_tokens.map(|v| v.to_string()),
            )
            .opt_flag(
                "--max-batch-size",
                limits.max_batch_size.map(|v| v.to_string()),
            )
            .flag(
                "--max-waiting-tokens",
                limits.max_waiting_tokens.to_string(),
            )
            .flag("--payload-limit", limits.payload_limit.to_string());
        if self.json_output {
            spec.arg("--json-output");
        }
        if !self.prefix_caching {
            spec.flag("--prefix-caching", "false");
        }
        spec.opt_flag("--otlp-endpoint", self.otlp_endpoint.as_deref())
            .opt_flag("--otlp-service-name", self.otlp_service_name.as_deref())
            .opt_flag("--chat-template", self.chat.chat_template.as_deref())
            .opt_flag("--tool-call-parser", self.chat.tool_call_parser.as_deref())
            .opt_flag("--reasoning-parser", self.chat.reasoning_parser.as_deref())
            .opt_flag("--task", self.task.as_deref())
            .opt_flag("--score-labels", self.score_labels.as_deref())
            .opt_flag(
                "--request-timeout",
                self.request_timeout.map(|s| s.to_string()),
            );
        if !self.cors_allow_origin.is_empty() {
            spec.flag("--cors-allow-origin", self.cors_allow_origin.join(","));
        }
        // The launcher's own API_KEY variable must not reach the router under its old name.
        spec.env_remove.push("API_KEY".into());
        if let Some(key) = &self.api_key {
            spec.secret_env
                .push((API_KEY_ENV.into(), key.expose().into()));
        } else {
            spec.env_remove.push(API_KEY_ENV.into());
        }
        spec
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    fn config() -> RouterConfig {
        RouterConfig {
            model: PathBuf::from("/models/smol"),
            served_model_name: "smol".into(),
            num_shard: 2,
            shard_uds_path: PathBuf::from("/tmp/tessera-server"),
            hostname: "0.0.0.0".into(),
            port: 3000,
            limits: RouterLimits {
                max_concurrent_requests: 128,
                max_stop_sequences: 4,
                max_top_n_tokens: 5,
                max_input_tokens: None,
                max_total_tokens: None,
                max_batch_prefill_tokens: None,
                max_batch_total_tokens: None,
                max_batch_size: None,
                max_waiting_tokens: 20,
                payload_limit: 2_000_000,
            },
            api_key: None,
            json_output: false,
            prefix_caching: true,
            otlp_endpoint: None,
            otlp_service_name: None,
            chat: ChatOptions::default(),
            task: None,
            score_labels: None,
            request_timeout: None,
            cors_allow_origin: Vec::new(),
        }
    }

    #[test]
    fn default_command_line() {
        let spec = config().command(Path::new("/bin/tessera-router"));
        assert_eq!(spec.program, PathBuf::from("/bin/tessera-router"));
        assert_eq!(
            spec.args_lossy().join(" "),
            "--model-id /models/smol --served-model-name smol \
             --master-shard-uds-path /tmp/tessera-server-0 --num-shard 2 \
             --shard-uds-path /tmp/tessera-server --hostname 0.0.0.0 --port 3000 \
             --max-concurrent-requests 128 --max-stop-sequences 4 --max-top-n-tokens 5 \
             --max-waiting-tokens 20 --payload-limit 2000000"
        );
        assert!(spec.secret_env.is_empty());
        assert!(spec.env_remove.contains(&API_KEY_ENV.into()));
    }

    #[test]
    fn full_command_line_and_api_key_in_env() {
        let mut config = config();
        config.limits.max_input_tokens = Some(1000);
        config.limits.max_total_tokens = Some(2000);
        config.limits.max_batch_prefill_tokens = Some(4096);
        config.limits.max_batch_total_tokens = Some(100_000);
        config.limits.max_batch_size = Some(32);
        config.json_output = true;
        config.prefix_caching = false;
        config.otlp_endpoint = Some("http://otel:4317".into());
        config.otlp_service_name = Some("tessera".into());
        config.request_timeout = Some(2.5);
        config.cors_allow_origin = vec!["https://a.example".into(), "https://b.example".into()];
        config.api_key = Secret::from_str("hunter2").ok();
        let spec = config.command(Path::new("tessera-router"));
        let line = spec.args_lossy().join(" ");
        assert_eq!(
            line,
            "--model-id /models/smol --served-model-name smol \
             --master-shard-uds-path /tmp/tessera-server-0 --num-shard 2 \
             --shard-uds-path /tmp/tessera-server --hostname 0.0.0.0 --port 3000 \
             --max-concurrent-requests 128 --max-stop-sequences 4 --max-top-n-tokens 5 \
             --max-input-tokens 1000 --max-total-tokens 2000 --max-batch-prefill-tokens 4096 \
             --max-batch-total-tokens 100000 --max-batch-size 32 --max-waiting-tokens 20 \
             --payload-limit 2000000 --json-output --prefix-caching false \
             --otlp-endpoint http://otel:4317 --otlp-service-name tessera \
             --request-timeout 2.5 --cors-allow-origin https://a.example,https://b.example"
        );
        assert!(!line.contains("hunter2"));
        assert_eq!(
            spec.secret_env,
            vec![(API_KEY_ENV.into(), "hunter2".into())]
        );
        assert!(spec.env_remove.contains(&"API_KEY".into()));
    }
}
