//! The recordings: what the HTTP layer and the batcher call. Every `tessera_*` metric that has
//! vLLM twins is recorded through [`add`], [`set`] or [`observe`], which write the twins too.

use std::time::Instant;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use metrics::{counter, gauge, histogram};

use super::ratio::RunningRatio;
use super::{names, vllm};
use crate::error::ApiError;
use crate::infer::{GeneratedText, InferError};

fn add(name: &'static str, n: u64) {
    counter!(name).increment(n);
    for twin in vllm::twins_of(name) {
        counter!(twin).increment(n);
    }
}

fn set(name: &'static str, value: f64) {
    gauge!(name).set(value);
    for twin in vllm::twins_of(name) {
        gauge!(twin).set(value);
    }
}

fn observe(name: &'static str, value: f64) {
    histogram!(name).record(value);
    for twin in vllm::twins_of(name) {
        histogram!(twin).record(value);
    }
}

/// Generation routes: requests there that fail before anything is queued are counted by
/// [`track_requests`].
const GENERATION_PATHS: &[&str] = &[
    "/generate",
    "/generate_stream",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
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
            ApiError::Infer(e) => matches!(
                e,
                InferError::Overloaded | InferError::Unavailable | InferError::Draining
            ),
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
    observe(names::REQUEST_INPUT_TOKENS, input_length as f64);
    observe(names::REQUEST_MAX_NEW_TOKENS, f64::from(max_new_tokens));
}

/// Records a request refused by [`crate::Infer`] before it was queued, for a reason the HTTP
/// layer cannot tell from a running request's failure.
pub(crate) fn record_refused(error_type: &'static str) {
    counter!(names::REQUESTS).increment(1);
    record_failure(error_type);
}

/// Records how long validation took.
pub(crate) fn record_validation(started: Instant) {
    histogram!(names::REQUEST_VALIDATION_DURATION).record(started.elapsed().as_secs_f64());
}

/// Records a request leaving the queue for its first prefill (called by the batcher), and
/// its `queue` span.
pub(crate) fn record_dequeued(entry: &crate::infer::Entry) {
    observe(
        names::REQUEST_QUEUE_DURATION,
        entry.queued.elapsed().as_secs_f64(),
    );
    crate::telemetry::queue_span(&entry.span, entry.queued);
}

/// Records a generated token reaching its request's stream: the first one's time to first
/// token, the others' inter-token latency. Returns the time to pass as `last` next time.
pub(crate) fn record_token(queued: Instant, last: Option<Instant>) -> Instant {
    let now = Instant::now();
    match last {
        None => observe(
            names::TIME_TO_FIRST_TOKEN,
            now.saturating_duration_since(queued).as_secs_f64(),
        ),
        Some(last) => observe(
            names::INTER_TOKEN_LATENCY,
            now.saturating_duration_since(last).as_secs_f64(),
        ),
    }
    now
}

/// Records a finished request.
pub(crate) fn record_success(generated: &GeneratedText, queued: Instant, start: Instant) {
    let now = Instant::now();
    let inference = now.saturating_duration_since(start).as_secs_f64();
    counter!(names::REQUEST_SUCCESS).increment(1);
    let reason = generated.finish_reason.openai();
    counter!(vllm::REQUEST_SUCCESS, "finished_reason" => reason).increment(1);
    observe(
        names::REQUEST_DURATION,
        now.saturating_duration_since(queued).as_secs_f64(),
    );
    observe(names::REQUEST_INFERENCE_DURATION, inference);
    if generated.generated_tokens > 0 {
        observe(
            names::REQUEST_TIME_PER_OUTPUT_TOKEN,
            inference / f64::from(generated.generated_tokens),
        );
    }
    observe(
        names::REQUEST_GENERATED_TOKENS,
        f64::from(generated.generated_tokens),
    );
}

/// Records a pooling request (an embedding, a score) that got its result.
pub(crate) fn record_pooled(queued: Instant, start: Instant) {
    let now = Instant::now();
    counter!(names::REQUEST_SUCCESS).increment(1);
    counter!(vllm::REQUEST_SUCCESS, "finished_reason" => "stop").increment(1);
    observe(
        names::REQUEST_DURATION,
        now.saturating_duration_since(queued).as_secs_f64(),
    );
    observe(
        names::REQUEST_INFERENCE_DURATION,
        now.saturating_duration_since(start).as_secs_f64(),
    );
}

/// Records a failed request under its error class (one of [`names::FAILURE_CLASSES`]).
pub(crate) fn record_failure(error_type: &'static str) {
    debug_assert!(names::FAILURE_CLASSES.contains(&error_type), "{error_type}");
    counter!(names::REQUEST_FAILURE, "err" => error_type).increment(1);
}

/// Records the shape of one step (called by the batcher before it runs).
pub(crate) fn record_step(requests: usize, prefill_tokens: usize, decode_tokens: usize) {
    histogram!(names::BATCH_SIZE).record(requests as f64);
    histogram!(names::BATCH_PREFILL_TOKENS).record(prefill_tokens as f64);
    histogram!(names::BATCH_DECODE_TOKENS).record(decode_tokens as f64);
    observe(names::BATCH_TOKENS, (prefill_tokens + decode_tokens) as f64);
}

/// Records requests preempted by one step (called by the batcher).
pub(crate) fn record_preemptions(preempted: usize) {
    if preempted > 0 {
        add(names::PREEMPTIONS, preempted as u64);
    }
}

/// Records the scheduler's queue and batch after a step (called by the batcher).
pub(crate) fn record_scheduler(waiting: usize, running: usize, batch_kv_tokens: usize) {
    set(names::QUEUE_REQUESTS, waiting as f64);
    set(names::RUNNING_REQUESTS, running as f64);
    gauge!(names::BATCH_KV_TOKENS).set(batch_kv_tokens as f64);
}

/// Records the KV cache's shape once (called when the batcher starts).
pub(crate) fn record_cache_config(block_size: usize, num_blocks: usize) {
    let labels = [
        ("block_size", block_size.to_string()),
        ("num_gpu_blocks", num_blocks.to_string()),
    ];
    gauge!(vllm::CACHE_CONFIG_INFO, &labels).set(1.0);
}

/// Hit over queried prompt tokens since start.
static PREFIX_CACHE_HITS: RunningRatio = RunningRatio::new();

/// Records one step's prefix-cache lookups (called by the batcher).
pub(crate) fn record_prefix_cache(queried_tokens: usize, hit_tokens: usize) {
    if queried_tokens == 0 {
        return;
    }
    add(names::PREFIX_CACHE_QUERIED_TOKENS, queried_tokens as u64);
    add(names::PREFIX_CACHE_HIT_TOKENS, hit_tokens as u64);
    if let Some(ratio) = PREFIX_CACHE_HITS.add(hit_tokens as u64, queried_tokens as u64) {
        gauge!(names::PREFIX_CACHE_HIT_RATIO).set(ratio);
    }
}

/// Accepted over proposed draft tokens since start.
static SPECULATIVE_ACCEPTANCE: RunningRatio = RunningRatio::new();

/// The shards' proposer, as the speculation metrics label it (one of
/// [`names::SPECULATORS`]).
static SPECULATOR: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Names the shards' proposer (`InfoResponse.speculator`) for the speculation metrics; a name
/// outside [`names::SPECULATORS`] is ignored.
pub fn set_speculator(name: &str) {
    if let Some(&known) = names::SPECULATORS.iter().find(|&&s| s == name) {
        let _ = SPECULATOR.set(known);
    }
}

/// Records one request's speculative round (called by the batcher).
pub(crate) fn record_speculation(proposed_tokens: usize, accepted_tokens: usize) {
    if proposed_tokens == 0 {
        return;
    }
    let speculator = *SPECULATOR.get().unwrap_or(&names::SPECULATORS[0]);
    let labelled = |name: &'static str, n: usize| {
        counter!(name, "speculator" => speculator).increment(n as u64);
        for twin in vllm::twins_of(name) {
            counter!(twin).increment(n as u64);
        }
    };
    labelled(names::SPECULATIVE_PROPOSED_TOKENS, proposed_tokens);
    labelled(names::SPECULATIVE_ACCEPTED_TOKENS, accepted_tokens);
    if let Some(ratio) = SPECULATIVE_ACCEPTANCE.add(accepted_tokens as u64, proposed_tokens as u64)
    {
        gauge!(names::SPECULATIVE_ACCEPTANCE, "speculator" => speculator).set(ratio);
    }
}

/// Records the block pool's state (called by the batcher after every step).
pub(crate) fn record_kv_blocks(free: usize, used: usize, capacity: usize) {
    gauge!(names::KV_BLOCKS_FREE).set(free as f64);
    gauge!(names::KV_BLOCKS_USED).set(used as f64);
    gauge!(names::KV_BLOCKS_CAPACITY).set(capacity as f64);
    if capacity > 0 {
        set(names::KV_CACHE_USAGE, used as f64 / capacity as f64);
    }
}
