//! Prometheus metrics: the recorder, the `tessera_*` metric names, and the recordings the
//! HTTP layer and the batcher make.
//!
//! Every name carries its unit (`_seconds`, `_tokens`, `_requests`, `_blocks`, `_ratio`) and
//! counters end in `_total`. [`names::ALL`] lists every metric with its kind; `deploy/README.md`
//! documents them and `tests/tests/metrics_*.rs` checks that the two agree.
//!
//! Request-level metrics count *sequences*: an OpenAI request with `n = 3` is three
//! requests. `tessera_requests_total` = success + failure + in flight: sequences are counted
//! when queued, and an HTTP request refused before anything was queued (invalid, overloaded,
//! unauthorized) counts as one request that failed ([`track_requests`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{
    BuildError, Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

use crate::error::ApiError;
use crate::infer::{GeneratedText, InferError};

/// Metric names. Durations are in seconds.
pub mod names {
    /// Counter: generation requests (sequences queued, plus HTTP requests refused before
    /// queueing).
    pub const REQUESTS: &str = "tessera_requests_total";
    /// Counter: requests that finished.
    pub const REQUEST_SUCCESS: &str = "tessera_request_success_total";
    /// Counter with label `err` (error class): requests that failed.
    pub const REQUEST_FAILURE: &str = "tessera_request_failure_total";
    /// Histogram: from queueing to the last token.
    pub const REQUEST_DURATION: &str = "tessera_request_duration_seconds";
    /// Histogram: tokenization, chat template and parameter checks.
    pub const REQUEST_VALIDATION_DURATION: &str = "tessera_request_validation_duration_seconds";
    /// Histogram: from queueing to the start of the first prefill (batcher).
    pub const REQUEST_QUEUE_DURATION: &str = "tessera_request_queue_duration_seconds";
    /// Histogram: from the start of the first prefill to the last token.
    pub const REQUEST_INFERENCE_DURATION: &str = "tessera_request_inference_duration_seconds";
    /// Histogram: from queueing to the first generated token.
    pub const TIME_TO_FIRST_TOKEN: &str = "tessera_time_to_first_token_seconds";
    /// Histogram: between consecutive generated tokens of a request.
    pub const INTER_TOKEN_LATENCY: &str = "tessera_inter_token_latency_seconds";
    /// Histogram: inference duration divided by generated tokens, per request.
    pub const REQUEST_TIME_PER_OUTPUT_TOKEN: &str = "tessera_request_time_per_output_token_seconds";
    /// Histogram: prompt lengths.
    pub const REQUEST_INPUT_TOKENS: &str = "tessera_request_input_tokens";
    /// Histogram: `max_new_tokens` of requests.
    pub const REQUEST_MAX_NEW_TOKENS: &str = "tessera_request_max_new_tokens";
    /// Histogram: generated tokens per finished request.
    pub const REQUEST_GENERATED_TOKENS: &str = "tessera_request_generated_tokens";
    /// Gauge: requests waiting for their first prefill (batcher).
    pub const QUEUE_REQUESTS: &str = "tessera_queue_requests";
    /// Gauge: requests in the running batch (batcher).
    pub const RUNNING_REQUESTS: &str = "tessera_running_requests";
    /// Gauge: KV slots (tokens) the running batch holds (batcher).
    pub const BATCH_KV_TOKENS: &str = "tessera_batch_kv_tokens";
    /// Histogram: requests computed in one step (batcher).
    pub const BATCH_SIZE: &str = "tessera_batch_size_requests";
    /// Histogram: prompt tokens computed in one step (batcher).
    pub const BATCH_PREFILL_TOKENS: &str = "tessera_batch_prefill_tokens";
    /// Histogram: decode tokens computed in one step (batcher).
    pub const BATCH_DECODE_TOKENS: &str = "tessera_batch_decode_tokens";
    /// Histogram with label `method` (`prefill`/`decode`): one step as the router sees it.
    pub const BATCH_INFERENCE_DURATION: &str = "tessera_batch_inference_duration_seconds";
    /// Histogram with label `method`: the shards' forward pass of a step.
    pub const BATCH_FORWARD_DURATION: &str = "tessera_batch_forward_duration_seconds";
    /// Histogram with label `method`: the shards' sampling of a step.
    pub const BATCH_SAMPLING_DURATION: &str = "tessera_batch_sampling_duration_seconds";
    /// Counter with label `method`: steps run.
    pub const BATCH_INFERENCE: &str = "tessera_batch_inference_total";
    /// Counter with label `method`: steps that failed.
    pub const BATCH_INFERENCE_FAILURE: &str = "tessera_batch_inference_failure_total";
    /// Gauge: free KV blocks (batcher).
    pub const KV_BLOCKS_FREE: &str = "tessera_kv_blocks_free";
    /// Gauge: KV blocks in use (batcher).
    pub const KV_BLOCKS_USED: &str = "tessera_kv_blocks_used";
    /// Gauge: usable KV blocks (batcher).
    pub const KV_BLOCKS_CAPACITY: &str = "tessera_kv_blocks_capacity";
    /// Gauge: used / capacity KV blocks (batcher).
    pub const KV_CACHE_USAGE: &str = "tessera_kv_cache_usage_ratio";
    /// Counter: requests preempted (blocks freed, recomputed later) (batcher).
    pub const PREEMPTIONS: &str = "tessera_preemptions_total";
    /// Counter: prompt tokens looked up in the prefix cache (batcher).
    pub const PREFIX_CACHE_QUERIED_TOKENS: &str = "tessera_prefix_cache_queried_tokens_total";
    /// Counter: prompt tokens served from the prefix cache (batcher).
    pub const PREFIX_CACHE_HIT_TOKENS: &str = "tessera_prefix_cache_hit_tokens_total";
    /// Gauge: hit tokens / queried tokens since start (batcher).
    pub const PREFIX_CACHE_HIT_RATIO: &str = "tessera_prefix_cache_hit_ratio";
    /// Counter: draft tokens proposed by speculative decoding.
    pub const SPECULATIVE_PROPOSED_TOKENS: &str = "tessera_speculative_proposed_tokens_total";
    /// Counter: draft tokens the target model accepted.
    pub const SPECULATIVE_ACCEPTED_TOKENS: &str = "tessera_speculative_accepted_tokens_total";
    /// Gauge: accepted / proposed draft tokens since start.
    pub const SPECULATIVE_ACCEPTANCE: &str = "tessera_speculative_acceptance_ratio";

    /// What kind of metric a name is.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Kind {
        /// Only goes up.
        Counter,
        /// Goes up and down.
        Gauge,
        /// Observations in buckets (`_bucket`, `_sum`, `_count` series).
        Histogram,
    }

    /// Every metric the router exports, with its kind and its label (if any).
    pub const ALL: &[(&str, Kind, Option<&str>)] = &[
        (REQUESTS, Kind::Counter, None),
        (REQUEST_SUCCESS, Kind::Counter, None),
        (REQUEST_FAILURE, Kind::Counter, Some("err")),
        (REQUEST_DURATION, Kind::Histogram, None),
        (REQUEST_VALIDATION_DURATION, Kind::Histogram, None),
        (REQUEST_QUEUE_DURATION, Kind::Histogram, None),
        (REQUEST_INFERENCE_DURATION, Kind::Histogram, None),
        (TIME_TO_FIRST_TOKEN, Kind::Histogram, None),
        (INTER_TOKEN_LATENCY, Kind::Histogram, None),
        (REQUEST_TIME_PER_OUTPUT_TOKEN, Kind::Histogram, None),
        (REQUEST_INPUT_TOKENS, Kind::Histogram, None),
        (REQUEST_MAX_NEW_TOKENS, Kind::Histogram, None),
        (REQUEST_GENERATED_TOKENS, Kind::Histogram, None),
        (QUEUE_REQUESTS, Kind::Gauge, None),
        (RUNNING_REQUESTS, Kind::Gauge, None),
        (BATCH_KV_TOKENS, Kind::Gauge, None),
        (BATCH_SIZE, Kind::Histogram, None),
        (BATCH_PREFILL_TOKENS, Kind::Histogram, None),
        (BATCH_DECODE_TOKENS, Kind::Histogram, None),
        (BATCH_INFERENCE_DURATION, Kind::Histogram, Some("method")),
        (BATCH_FORWARD_DURATION, Kind::Histogram, Some("method")),
        (BATCH_SAMPLING_DURATION, Kind::Histogram, Some("method")),
        (BATCH_INFERENCE, Kind::Counter, Some("method")),
        (BATCH_INFERENCE_FAILURE, Kind::Counter, Some("method")),
        (KV_BLOCKS_FREE, Kind::Gauge, None),
        (KV_BLOCKS_USED, Kind::Gauge, None),
        (KV_BLOCKS_CAPACITY, Kind::Gauge, None),
        (KV_CACHE_USAGE, Kind::Gauge, None),
        (PREEMPTIONS, Kind::Counter, None),
        (PREFIX_CACHE_QUERIED_TOKENS, Kind::Counter, None),
        (PREFIX_CACHE_HIT_TOKENS, Kind::Counter, None),
        (PREFIX_CACHE_HIT_RATIO, Kind::Gauge, None),
        (SPECULATIVE_PROPOSED_TOKENS, Kind::Counter, None),
        (SPECULATIVE_ACCEPTED_TOKENS, Kind::Counter, None),
        (SPECULATIVE_ACCEPTANCE, Kind::Gauge, None),
    ];
}

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
}

/// Registers every metric (each label value known in advance: `method`), so that a scrape
/// shows all of them before the first request. `err` series appear with their first failure.
fn register() {
    use names::Kind;
    for &(name, kind, label) in names::ALL {
        let methods: &[&'static str] = match label {
            Some("method") => &["prefill", "decode"],
            Some(_) => continue,
            None => &[""],
        };
        for &method in methods {
            let labels: Vec<(&'static str, &'static str)> = match label {
                Some(l) => vec![(l, method)],
                None => vec![],
            };
            match kind {
                Kind::Counter => {
                    counter!(name, &labels).increment(0);
                }
                Kind::Gauge => {
                    gauge!(name, &labels).increment(0.0);
                }
                Kind::Histogram => {
                    let _ = histogram!(name, &labels);
                }
            }
        }
    }
}

/// Generation routes: requests there that fail before anything is queued are counted by
/// [`track_requests`].
const GENERATION_PATHS: &[&str] = &[
    "/generate",
    "/generate_stream",
    "/v1/chat/completions",
    "/v1/completions",
];

/// Middleware: a generation request answered with an error before any sequence was queued
/// (invalid, overloaded, unauthorized, engine unavailable) counts as one request that
/// failed. Errors that come out of a running request's event stream are counted where the
/// stream sees them ([`crate::infer::InferStream`]), not here.
pub(crate) async fn track_requests(req: Request, next: Next) -> Response {
    let generation = GENERATION_PATHS.contains(&req.uri().path());
    let response = next.run(req).await;
    if !generation {
        return response;
    }
    if let Some(error) = response.extensions().get::<ApiError>() {
        let before_queueing = match error {
            ApiError::Infer(e) => matches!(e, InferError::Overloaded | InferError::Unavailable),
            _ => true,
        };
        if before_queueing {
            counter!(names::REQUESTS).increment(1);
            record_failure(error.error_type());
        }
    }
    response
}

/// Records a queued request (one sequence).
pub(crate) fn record_request(input_length: usize, max_new_tokens: u32) {
    counter!(names::REQUESTS).increment(1);
    histogram!(names::REQUEST_INPUT_TOKENS).record(input_length as f64);
    histogram!(names::REQUEST_MAX_NEW_TOKENS).record(f64::from(max_new_tokens));
}

/// Records how long validation took.
pub(crate) fn record_validation(started: Instant) {
    histogram!(names::REQUEST_VALIDATION_DURATION).record(started.elapsed().as_secs_f64());
}

/// Records a request leaving the queue for its first prefill (called by the batcher), and
/// its `queue` span.
pub(crate) fn record_dequeued(entry: &crate::infer::Entry) {
    histogram!(names::REQUEST_QUEUE_DURATION).record(entry.queued.elapsed().as_secs_f64());
    crate::telemetry::queue_span(&entry.span, entry.queued);
}

/// Records a generated token reaching its request's stream: the first one's time to first
/// token, the others' inter-token latency. Returns the time to pass as `last` next time.
pub(crate) fn record_token(queued: Instant, last: Option<Instant>) -> Instant {
    let now = Instant::now();
    match last {
        None => histogram!(names::TIME_TO_FIRST_TOKEN)
            .record(now.saturating_duration_since(queued).as_secs_f64()),
        Some(last) => histogram!(names::INTER_TOKEN_LATENCY)
            .record(now.saturating_duration_since(last).as_secs_f64()),
    }
    now
}

/// Records a finished request.
pub(crate) fn record_success(generated: &GeneratedText, queued: Instant, start: Instant) {
    let now = Instant::now();
    let inference = now.saturating_duration_since(start).as_secs_f64();
    counter!(names::REQUEST_SUCCESS).increment(1);
    histogram!(names::REQUEST_DURATION).record(now.saturating_duration_since(queued).as_secs_f64());
    histogram!(names::REQUEST_INFERENCE_DURATION).record(inference);
    if generated.generated_tokens > 0 {
        histogram!(names::REQUEST_TIME_PER_OUTPUT_TOKEN)
            .record(inference / f64::from(generated.generated_tokens));
    }
    histogram!(names::REQUEST_GENERATED_TOKENS).record(f64::from(generated.generated_tokens));
}

/// Records a failed request under its error class.
pub(crate) fn record_failure(error_type: &'static str) {
    counter!(names::REQUEST_FAILURE, "err" => error_type).increment(1);
}

/// Records the shape of one step (called by the batcher before it runs).
pub(crate) fn record_step(requests: usize, prefill_tokens: usize, decode_tokens: usize) {
    histogram!(names::BATCH_SIZE).record(requests as f64);
    histogram!(names::BATCH_PREFILL_TOKENS).record(prefill_tokens as f64);
    histogram!(names::BATCH_DECODE_TOKENS).record(decode_tokens as f64);
}

/// Hit and queried tokens since start, for the hit ratio.
static PREFIX_CACHE: (AtomicU64, AtomicU64) = (AtomicU64::new(0), AtomicU64::new(0));

/// Records one step's prefix-cache lookups (called by the batcher).
pub(crate) fn record_prefix_cache(queried_tokens: usize, hit_tokens: usize) {
    if queried_tokens == 0 {
        return;
    }
    counter!(names::PREFIX_CACHE_QUERIED_TOKENS).increment(queried_tokens as u64);
    counter!(names::PREFIX_CACHE_HIT_TOKENS).increment(hit_tokens as u64);
    let hit = PREFIX_CACHE
        .0
        .fetch_add(hit_tokens as u64, Ordering::Relaxed)
        + hit_tokens as u64;
    let queried = PREFIX_CACHE
        .1
        .fetch_add(queried_tokens as u64, Ordering::Relaxed)
        + queried_tokens as u64;
    gauge!(names::PREFIX_CACHE_HIT_RATIO).set(hit as f64 / queried as f64);
}

/// Proposed and accepted draft tokens since start, for the acceptance ratio.
static SPECULATION: (AtomicU64, AtomicU64) = (AtomicU64::new(0), AtomicU64::new(0));

/// Records one request's speculative round (called by the batcher).
pub(crate) fn record_speculation(proposed_tokens: usize, accepted_tokens: usize) {
    if proposed_tokens == 0 {
        return;
    }
    counter!(names::SPECULATIVE_PROPOSED_TOKENS).increment(proposed_tokens as u64);
    counter!(names::SPECULATIVE_ACCEPTED_TOKENS).increment(accepted_tokens as u64);
    let proposed = SPECULATION
        .0
        .fetch_add(proposed_tokens as u64, Ordering::Relaxed)
        + proposed_tokens as u64;
    let accepted = SPECULATION
        .1
        .fetch_add(accepted_tokens as u64, Ordering::Relaxed)
        + accepted_tokens as u64;
    gauge!(names::SPECULATIVE_ACCEPTANCE).set(accepted as f64 / proposed as f64);
}

/// Records the block pool's state (called by the batcher after every step).
pub(crate) fn record_kv_blocks(free: usize, used: usize, capacity: usize) {
    gauge!(names::KV_BLOCKS_FREE).set(free as f64);
    gauge!(names::KV_BLOCKS_USED).set(used as f64);
    gauge!(names::KV_BLOCKS_CAPACITY).set(capacity as f64);
    if capacity > 0 {
        gauge!(names::KV_CACHE_USAGE).set(used as f64 / capacity as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::names::{ALL, Kind};

    #[test]
    fn names_carry_units_and_counters_end_in_total() {
        let units = [
            "_seconds",
            "_tokens",
            "_requests",
            "_blocks",
            "_ratio",
            "_total",
        ];
        for &(name, kind, _) in ALL {
            assert!(name.starts_with("tessera_"), "{name}");
            assert_eq!(
                name.ends_with("_total"),
                kind == Kind::Counter,
                "{name}: `_total` is for counters only"
            );
            let unit_ok = units.iter().any(|u| name.ends_with(u)) || name.contains("_blocks_");
            assert!(unit_ok, "{name} has no unit suffix");
        }
        let mut sorted: Vec<&str> = ALL.iter().map(|a| a.0).collect();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ALL.len(), "duplicate names");
    }
}
