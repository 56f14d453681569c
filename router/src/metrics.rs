//! Prometheus metrics: the recorder, the `tessera_*` metric names, and the request-level
//! recordings the HTTP layer makes. The batcher records batch-level metrics under the
//! names in [`names`] with the `metrics` macros.

use std::time::Instant;

use metrics_exporter_prometheus::{
    BuildError, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

use crate::infer::GeneratedText;

/// Metric names. Durations are in seconds, histograms unless said otherwise.
pub mod names {
    /// Counter: requests queued.
    pub const REQUEST_COUNT: &str = "tessera_request_count";
    /// Counter: requests that finished.
    pub const REQUEST_SUCCESS: &str = "tessera_request_success";
    /// Counter with label `err`: requests that failed.
    pub const REQUEST_FAILURE: &str = "tessera_request_failure";
    /// Histogram: time from queueing to the end of the request.
    pub const REQUEST_DURATION: &str = "tessera_request_duration";
    /// Histogram: time spent validating (tokenizing, chat template).
    pub const REQUEST_VALIDATION_DURATION: &str = "tessera_request_validation_duration";
    /// Histogram: time from queueing to the start of prefill.
    pub const REQUEST_QUEUE_DURATION: &str = "tessera_request_queue_duration";
    /// Histogram: time from the start of prefill to the end.
    pub const REQUEST_INFERENCE_DURATION: &str = "tessera_request_inference_duration";
    /// Histogram: inference time divided by generated tokens.
    pub const REQUEST_MEAN_TIME_PER_TOKEN: &str = "tessera_request_mean_time_per_token_duration";
    /// Histogram: prompt lengths in tokens.
    pub const REQUEST_INPUT_LENGTH: &str = "tessera_request_input_length";
    /// Histogram: `max_new_tokens` of requests.
    pub const REQUEST_MAX_NEW_TOKENS: &str = "tessera_request_max_new_tokens";
    /// Histogram: generated tokens per request.
    pub const REQUEST_GENERATED_TOKENS: &str = "tessera_request_generated_tokens";
    /// Gauge: requests waiting in the queue (batcher).
    pub const QUEUE_SIZE: &str = "tessera_queue_size";
    /// Gauge: requests in the running batch (batcher).
    pub const BATCH_CURRENT_SIZE: &str = "tessera_batch_current_size";
    /// Gauge: tokens (KV slots) the running batch holds (batcher).
    pub const BATCH_CURRENT_MAX_TOKENS: &str = "tessera_batch_current_max_tokens";
    /// Histogram with label `method` (`prefill`/`decode`): one batch step end to end (batcher).
    pub const BATCH_INFERENCE_DURATION: &str = "tessera_batch_inference_duration";
    /// Histogram with label `method`: the shards' forward time of a step (batcher).
    pub const BATCH_FORWARD_DURATION: &str = "tessera_batch_forward_duration";
    /// Histogram with label `method`: the shards' sampling/decoding time of a step (batcher).
    pub const BATCH_DECODE_DURATION: &str = "tessera_batch_decode_duration";
    /// Counter with label `method`: batch steps run (batcher).
    pub const BATCH_INFERENCE_COUNT: &str = "tessera_batch_inference_count";
    /// Counter with label `method`: batch steps that failed (batcher).
    pub const BATCH_INFERENCE_FAILURE: &str = "tessera_batch_inference_failure";
    /// Gauge: free KV blocks (batcher).
    pub const KV_BLOCKS_FREE: &str = "tessera_kv_blocks_free";
    /// Counter: prompt tokens served from the prefix cache (batcher).
    pub const PREFIX_CACHE_HIT_TOKENS: &str = "tessera_prefix_cache_hit_tokens";
}

/// Latency buckets (seconds) for the duration histograms.
const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Token-count buckets for the length histograms.
const TOKEN_BUCKETS: &[f64] = &[
    1.0, 8.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0,
];

fn builder() -> Result<PrometheusBuilder, BuildError> {
    use metrics_exporter_prometheus::Matcher;
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("duration".into()), DURATION_BUCKETS)?
        .set_buckets_for_metric(Matcher::Suffix("length".into()), TOKEN_BUCKETS)?
        .set_buckets_for_metric(Matcher::Suffix("tokens".into()), TOKEN_BUCKETS)
}

/// Builds the Prometheus recorder and installs it as the process-wide `metrics` recorder.
/// Call once at startup; the handle renders `/metrics`.
pub fn install_recorder() -> Result<PrometheusHandle, BuildError> {
    let handle = builder()?.install_recorder()?;
    describe();
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
    describe_counter!(REQUEST_COUNT, "Requests queued");
    describe_counter!(REQUEST_SUCCESS, "Requests that finished");
    describe_counter!(REQUEST_FAILURE, "Requests that failed, by error type");
    describe_histogram!(REQUEST_DURATION, "Request duration (s)");
    describe_histogram!(REQUEST_VALIDATION_DURATION, "Validation duration (s)");
    describe_histogram!(REQUEST_QUEUE_DURATION, "Time in queue (s)");
    describe_histogram!(REQUEST_INFERENCE_DURATION, "Inference duration (s)");
    describe_histogram!(REQUEST_MEAN_TIME_PER_TOKEN, "Mean time per token (s)");
    describe_histogram!(REQUEST_INPUT_LENGTH, "Prompt length (tokens)");
    describe_histogram!(REQUEST_MAX_NEW_TOKENS, "Requested max_new_tokens");
    describe_histogram!(REQUEST_GENERATED_TOKENS, "Generated tokens per request");
    describe_gauge!(QUEUE_SIZE, "Requests waiting");
    describe_gauge!(BATCH_CURRENT_SIZE, "Requests in the running batch");
    describe_gauge!(BATCH_CURRENT_MAX_TOKENS, "Tokens held by the running batch");
    describe_histogram!(BATCH_INFERENCE_DURATION, "Batch step duration (s)");
    describe_histogram!(BATCH_FORWARD_DURATION, "Shard forward duration (s)");
    describe_histogram!(BATCH_DECODE_DURATION, "Shard decode duration (s)");
    describe_counter!(BATCH_INFERENCE_COUNT, "Batch steps");
    describe_counter!(BATCH_INFERENCE_FAILURE, "Failed batch steps");
    describe_gauge!(KV_BLOCKS_FREE, "Free KV blocks");
    describe_counter!(
        PREFIX_CACHE_HIT_TOKENS,
        "Prompt tokens served from the prefix cache"
    );
}

/// Records a queued request.
pub(crate) fn record_request(input_length: usize, max_new_tokens: u32) {
    ::metrics::counter!(names::REQUEST_COUNT).increment(1);
    ::metrics::histogram!(names::REQUEST_INPUT_LENGTH).record(input_length as f64);
    ::metrics::histogram!(names::REQUEST_MAX_NEW_TOKENS).record(f64::from(max_new_tokens));
}

/// Records how long validation took.
pub(crate) fn record_validation(started: Instant) {
    ::metrics::histogram!(names::REQUEST_VALIDATION_DURATION)
        .record(started.elapsed().as_secs_f64());
}

/// Records a finished request.
pub(crate) fn record_success(generated: &GeneratedText, queued: Instant, start: Instant) {
    let now = Instant::now();
    let inference = now.saturating_duration_since(start).as_secs_f64();
    ::metrics::counter!(names::REQUEST_SUCCESS).increment(1);
    ::metrics::histogram!(names::REQUEST_DURATION)
        .record(now.saturating_duration_since(queued).as_secs_f64());
    ::metrics::histogram!(names::REQUEST_QUEUE_DURATION)
        .record(start.saturating_duration_since(queued).as_secs_f64());
    ::metrics::histogram!(names::REQUEST_INFERENCE_DURATION).record(inference);
    if generated.generated_tokens > 0 {
        ::metrics::histogram!(names::REQUEST_MEAN_TIME_PER_TOKEN)
            .record(inference / f64::from(generated.generated_tokens));
    }
    ::metrics::histogram!(names::REQUEST_GENERATED_TOKENS)
        .record(f64::from(generated.generated_tokens));
}

/// Records a failed request under its error type.
pub(crate) fn record_failure(error_type: &'static str) {
    ::metrics::counter!(names::REQUEST_FAILURE, "err" => error_type).increment(1);
}
