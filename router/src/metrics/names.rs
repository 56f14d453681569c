//! The `tessera_*` metric names. Durations are in seconds.

/// Counter: generation requests (sequences queued, plus HTTP requests refused before
/// queueing).
pub const REQUESTS: &str = "tessera_requests_total";
/// Counter: requests that finished.
pub const REQUEST_SUCCESS: &str = "tessera_request_success_total";
/// Counter with label `err` (error class): requests that failed.
pub const REQUEST_FAILURE: &str = "tessera_request_failure_total";
/// The `speculator` values of the speculative-decoding metrics: the shards' proposers.
pub const SPECULATORS: &[&str] = &["ngram", "draft", "medusa", "eagle"];
/// Every `err` class of [`REQUEST_FAILURE`]: the `error_type` of each error the router
/// answers with (`crate::error` checks that the two agree), exported at zero from the start.
pub const FAILURE_CLASSES: &[&str] = &[
    "validation",
    "json",
    "unsupported_media_type",
    "payload_too_large",
    "bad_request",
    "unauthorized",
    "not_found",
    "method_not_allowed",
    "unhealthy",
    "internal",
    "overloaded",
    "shard_failure",
    "cancelled",
    "generation",
    "incomplete_generation",
    "unavailable",
    "draining",
    "deadline_exceeded",
];
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
/// Histogram: tokens computed in one step, prompt and decode together (batcher).
pub const BATCH_TOKENS: &str = "tessera_batch_tokens";
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
/// Counter with label `speculator`: draft tokens proposed by speculative decoding (a tree's
/// nodes count one each).
pub const SPECULATIVE_PROPOSED_TOKENS: &str = "tessera_speculative_proposed_tokens_total";
/// Counter with label `speculator`: draft tokens the target model accepted.
pub const SPECULATIVE_ACCEPTED_TOKENS: &str = "tessera_speculative_accepted_tokens_total";
/// Gauge with label `speculator`: accepted / proposed draft tokens since start.
pub const SPECULATIVE_ACCEPTANCE: &str = "tessera_speculative_acceptance_ratio";

/// Gauge: bytes the router's allocator has handed out and not had back (its live heap), as
/// of the scrape.
pub const ROUTER_HEAP_BYTES: &str = "tessera_router_heap_bytes";

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
    (BATCH_TOKENS, Kind::Histogram, None),
    (BATCH_INFERENCE_DURATION, Kind::Histogram, Some("method")),
    (BATCH_FORWARD_DURATION, Kind::Histogram, Some("method")),
    (BATCH_SAMPLING_DURATION, Kind::Histogram, Some("method")),
    (BATCH_INFERENCE, Kind::Counter, Some("method")),
    (BATCH_INFERENCE_FAILURE, Kind::Counter, Some("method")),
    (KV_BLOCKS_FREE, Kind::Gauge, None),
    (ROUTER_HEAP_BYTES, Kind::Gauge, None),
    (KV_BLOCKS_USED, Kind::Gauge, None),
    (KV_BLOCKS_CAPACITY, Kind::Gauge, None),
    (KV_CACHE_USAGE, Kind::Gauge, None),
    (PREEMPTIONS, Kind::Counter, None),
    (PREFIX_CACHE_QUERIED_TOKENS, Kind::Counter, None),
    (PREFIX_CACHE_HIT_TOKENS, Kind::Counter, None),
    (PREFIX_CACHE_HIT_RATIO, Kind::Gauge, None),
    (
        SPECULATIVE_PROPOSED_TOKENS,
        Kind::Counter,
        Some("speculator"),
    ),
    (
        SPECULATIVE_ACCEPTED_TOKENS,
        Kind::Counter,
        Some("speculator"),
    ),
    (SPECULATIVE_ACCEPTANCE, Kind::Gauge, Some("speculator")),
];

#[cfg(test)]
mod tests {
    use super::{ALL, Kind};

    #[test]
    fn names_carry_units_and_counters_end_in_total() {
        let units = [
            "_seconds",
            "_tokens",
            "_requests",
            "_blocks",
            "_ratio",
            "_bytes",
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
