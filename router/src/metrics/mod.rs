//! Prometheus metrics: the recorder, the metric names, and the recordings the HTTP layer and
//! the batcher make.
//!
//! Every `tessera_*` name carries its unit (`_seconds`, `_tokens`, `_requests`, `_blocks`,
//! `_ratio`, `_bytes`) and counters end in `_total`. [`names::ALL`] lists every metric with its kind,
//! [`vllm::ALL`] the vLLM-named twins the gateways read; `deploy/README.md` documents both and
//! `tests/tests/e2e/metrics_*.rs` checks that they agree.
//!
//! Request-level metrics count *sequences*: an OpenAI request with `n = 3` is three
//! requests. `tessera_requests_total` = success + failure + in flight: sequences are counted
//! when queued, and an HTTP request refused before anything was queued (invalid, overloaded,
//! unauthorized) counts as one request that failed ([`track_requests`]).

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{
    BuildError, Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

pub mod names;
mod ratio;
mod record;
pub mod vllm;

pub use record::set_speculator;
pub(crate) use record::*;

/// Latency buckets (seconds).
const DURATION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0,
];
/// Token-count buckets.
const TOKEN_BUCKETS: &[f64] = &[
    1.0, 8.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0,
];
/// Requests-per-step buckets.
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

fn builder() -> Result<PrometheusBuilder, BuildError> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), DURATION_BUCKETS)?
        .set_buckets_for_metric(Matcher::Suffix("_tokens".into()), TOKEN_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(vllm::ITERATION_TOKENS.into()), TOKEN_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(names::BATCH_SIZE.into()), BATCH_BUCKETS)
}

/// Builds the Prometheus recorder and installs it as the process-wide `metrics` recorder,
/// with every metric described and registered (so each is exported from the start). Call
/// once at startup; the handle renders `/metrics`.
pub fn install_recorder() -> Result<PrometheusHandle, BuildError> {
    let handle = builder()?.install_recorder()?;
    describe();
    register();
    Ok(handle)
}

/// Builds a recorder without installing it (tests, or composing recorders).
pub fn build_recorder() -> PrometheusRecorder {
    builder()
        .map(PrometheusBuilder::build_recorder)
        .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder())
}

fn describe() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram};
    use names::*;
    describe_counter!(REQUESTS, "Generation requests");
    describe_counter!(REQUEST_SUCCESS, "Requests that finished");
    describe_counter!(REQUEST_FAILURE, "Requests that failed, by error class");
    describe_histogram!(REQUEST_DURATION, "From queueing to the last token (s)");
    describe_histogram!(REQUEST_VALIDATION_DURATION, "Validation (s)");
    describe_histogram!(
        REQUEST_QUEUE_DURATION,
        "Time waiting for the first prefill (s)"
    );
    describe_histogram!(
        REQUEST_INFERENCE_DURATION,
        "From first prefill to last token (s)"
    );
    describe_histogram!(TIME_TO_FIRST_TOKEN, "Time to first token (s)");
    describe_histogram!(INTER_TOKEN_LATENCY, "Time between tokens of a request (s)");
    describe_histogram!(
        REQUEST_TIME_PER_OUTPUT_TOKEN,
        "Mean time per output token (s)"
    );
    describe_histogram!(REQUEST_INPUT_TOKENS, "Prompt length (tokens)");
    describe_histogram!(REQUEST_MAX_NEW_TOKENS, "Requested max_new_tokens (tokens)");
    describe_histogram!(REQUEST_GENERATED_TOKENS, "Generated tokens per request");
    describe_gauge!(QUEUE_REQUESTS, "Requests waiting for their first prefill");
    describe_gauge!(RUNNING_REQUESTS, "Requests in the running batch");
    describe_gauge!(
        BATCH_KV_TOKENS,
        "KV slots (tokens) held by the running batch"
    );
    describe_histogram!(BATCH_SIZE, "Requests computed per step");
    describe_histogram!(BATCH_PREFILL_TOKENS, "Prompt tokens computed per step");
    describe_histogram!(BATCH_DECODE_TOKENS, "Decode tokens computed per step");
    describe_histogram!(BATCH_TOKENS, "Tokens computed per step");
    describe_histogram!(BATCH_INFERENCE_DURATION, "Step as the router sees it (s)");
    describe_histogram!(BATCH_FORWARD_DURATION, "Shard forward pass of a step (s)");
    describe_histogram!(BATCH_SAMPLING_DURATION, "Shard sampling of a step (s)");
    describe_counter!(BATCH_INFERENCE, "Steps run");
    describe_counter!(BATCH_INFERENCE_FAILURE, "Steps that failed");
    describe_gauge!(KV_BLOCKS_FREE, "Free KV blocks");
    describe_gauge!(KV_BLOCKS_USED, "KV blocks in use");
    describe_gauge!(KV_BLOCKS_CAPACITY, "Usable KV blocks");
    describe_gauge!(KV_CACHE_USAGE, "KV blocks used / capacity");
    describe_counter!(PREEMPTIONS, "Requests preempted");
    describe_counter!(PREFIX_CACHE_QUERIED_TOKENS, "Prompt tokens looked up");
    describe_counter!(
        PREFIX_CACHE_HIT_TOKENS,
        "Prompt tokens served from the cache"
    );
    describe_gauge!(
        PREFIX_CACHE_HIT_RATIO,
        "Prefix-cache hit tokens / queried tokens"
    );
    describe_counter!(SPECULATIVE_PROPOSED_TOKENS, "Draft tokens proposed");
    describe_counter!(SPECULATIVE_ACCEPTED_TOKENS, "Draft tokens accepted");
    describe_gauge!(SPECULATIVE_ACCEPTANCE, "Accepted / proposed draft tokens");
    describe_vllm();
}

fn describe_vllm() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram};
    for &(name, kind, _) in vllm::ALL {
        let twin = vllm::TWINS.iter().find(|t| t.0 == name).map(|t| t.1);
        let text = match twin {
            Some(twin) => format!("vLLM name of {twin}"),
            None => "KV cache shape (labels block_size, num_gpu_blocks)".into(),
        };
        match kind {
            names::Kind::Counter => describe_counter!(name, text),
            names::Kind::Gauge => describe_gauge!(name, text),
            names::Kind::Histogram => describe_histogram!(name, text),
        }
    }
}

/// Registers every metric with each label value known in advance (`method`, `err`,
/// `finished_reason`), so that a scrape shows all of them, at zero, before the first request.
/// `vllm:cache_config_info` appears once the batcher knows the cache's shape.
fn register() {
    let names = names::ALL.iter();
    let vllm = vllm::ALL.iter().filter(|m| m.0 != vllm::CACHE_CONFIG_INFO);
    for &(name, kind, label) in names.chain(vllm) {
        let values: &[&'static str] = match label {
            Some("method") => &["prefill", "decode"],
            Some("err") => names::FAILURE_CLASSES,
            Some("finished_reason") => vllm::FINISHED_REASONS,
            Some("speculator") => names::SPECULATORS,
            Some(other) => unreachable!("no values known for label {other}"),
            None => &[""],
        };
        for &value in values {
            let labels: Vec<(&'static str, &'static str)> = match label {
                Some(l) => vec![(l, value)],
                None => vec![],
            };
            match kind {
                names::Kind::Counter => counter!(name, &labels).increment(0),
                names::Kind::Gauge => gauge!(name, &labels).increment(0.0),
                names::Kind::Histogram => {
                    let _ = histogram!(name, &labels);
                }
            }
        }
    }
}
