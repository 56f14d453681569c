//! vLLM's metric names, exported next to their `tessera_*` twins.
//!
//! Kubernetes inference gateways pick a replica by reading vLLM's names (the Gateway API
//! Inference Extension's endpoint picker: queue length and KV-cache usage; llm-d's scheduler
//! the same, plus the cache configuration for prefix-aware scoring), so a server that
//! exports them needs no relabelling. Each twin is recorded by the same call as its
//! `tessera_*` metric ([`TWINS`]), so the two always hold the same value; the only
//! difference is that `vllm:request_success_total` splits by `finished_reason`.

use super::names::{self, Kind};

/// Gauge: requests waiting for their first prefill.
pub const NUM_REQUESTS_WAITING: &str = "vllm:num_requests_waiting";
/// Gauge: requests in the running batch.
pub const NUM_REQUESTS_RUNNING: &str = "vllm:num_requests_running";
/// Gauge: used / capacity KV blocks, 0 to 1.
pub const KV_CACHE_USAGE_PERC: &str = "vllm:kv_cache_usage_perc";
/// Counter: prompt tokens looked up in the prefix cache.
pub const PREFIX_CACHE_QUERIES: &str = "vllm:prefix_cache_queries_total";
/// Counter: prompt tokens served from the prefix cache.
pub const PREFIX_CACHE_HITS: &str = "vllm:prefix_cache_hits_total";
/// Counter: requests preempted.
pub const NUM_PREEMPTIONS: &str = "vllm:num_preemptions_total";
/// Counter with label `finished_reason` (`stop`, `length`): requests that finished.
pub const REQUEST_SUCCESS: &str = "vllm:request_success_total";
/// Histogram: from queueing to the first generated token.
pub const TIME_TO_FIRST_TOKEN: &str = "vllm:time_to_first_token_seconds";
/// Histogram: between consecutive generated tokens of a request.
pub const INTER_TOKEN_LATENCY: &str = "vllm:inter_token_latency_seconds";
/// Histogram: vLLM's older name of the inter-token latency, still read by dashboards.
pub const TIME_PER_OUTPUT_TOKEN: &str = "vllm:time_per_output_token_seconds";
/// Histogram: inference duration divided by generated tokens, per request.
pub const REQUEST_TIME_PER_OUTPUT_TOKEN: &str = "vllm:request_time_per_output_token_seconds";
/// Histogram: from queueing to the last token.
pub const E2E_REQUEST_LATENCY: &str = "vllm:e2e_request_latency_seconds";
/// Histogram: from queueing to the first prefill.
pub const REQUEST_QUEUE_TIME: &str = "vllm:request_queue_time_seconds";
/// Histogram: from the first prefill to the last token.
pub const REQUEST_INFERENCE_TIME: &str = "vllm:request_inference_time_seconds";
/// Histogram: prompt lengths.
pub const REQUEST_PROMPT_TOKENS: &str = "vllm:request_prompt_tokens";
/// Histogram: generated tokens per finished request.
pub const REQUEST_GENERATION_TOKENS: &str = "vllm:request_generation_tokens";
/// Histogram: `max_tokens` asked for.
pub const REQUEST_PARAMS_MAX_TOKENS: &str = "vllm:request_params_max_tokens";
/// Histogram: tokens computed in one step.
pub const ITERATION_TOKENS: &str = "vllm:iteration_tokens_total";
/// Counter: draft tokens proposed by speculative decoding.
pub const SPEC_DECODE_NUM_DRAFT_TOKENS: &str = "vllm:spec_decode_num_draft_tokens_total";
/// Counter: draft tokens the target model accepted.
pub const SPEC_DECODE_NUM_ACCEPTED_TOKENS: &str = "vllm:spec_decode_num_accepted_tokens_total";
/// Gauge, always 1, with labels `block_size` and `num_gpu_blocks`: the KV cache's shape,
/// which prefix-aware schedulers read to map prompt tokens to blocks.
pub const CACHE_CONFIG_INFO: &str = "vllm:cache_config_info";

/// The `finished_reason` values of [`REQUEST_SUCCESS`].
pub const FINISHED_REASONS: &[&str] = &["stop", "length"];

/// `(vLLM name, its tessera_* twin, kind)`: every vLLM metric with a twin.
pub const TWINS: &[(&str, &str, Kind)] = &[
    (NUM_REQUESTS_WAITING, names::QUEUE_REQUESTS, Kind::Gauge),
    (NUM_REQUESTS_RUNNING, names::RUNNING_REQUESTS, Kind::Gauge),
    (KV_CACHE_USAGE_PERC, names::KV_CACHE_USAGE, Kind::Gauge),
    (
        PREFIX_CACHE_QUERIES,
        names::PREFIX_CACHE_QUERIED_TOKENS,
        Kind::Counter,
    ),
    (
        PREFIX_CACHE_HITS,
        names::PREFIX_CACHE_HIT_TOKENS,
        Kind::Counter,
    ),
    (NUM_PREEMPTIONS, names::PREEMPTIONS, Kind::Counter),
    (REQUEST_SUCCESS, names::REQUEST_SUCCESS, Kind::Counter),
    (
        TIME_TO_FIRST_TOKEN,
        names::TIME_TO_FIRST_TOKEN,
        Kind::Histogram,
    ),
    (
        INTER_TOKEN_LATENCY,
        names::INTER_TOKEN_LATENCY,
        Kind::Histogram,
    ),
    (
        TIME_PER_OUTPUT_TOKEN,
        names::INTER_TOKEN_LATENCY,
        Kind::Histogram,
    ),
    (
        REQUEST_TIME_PER_OUTPUT_TOKEN,
        names::REQUEST_TIME_PER_OUTPUT_TOKEN,
        Kind::Histogram,
    ),
    (
        E2E_REQUEST_LATENCY,
        names::REQUEST_DURATION,
        Kind::Histogram,
    ),
    (
        REQUEST_QUEUE_TIME,
        names::REQUEST_QUEUE_DURATION,
        Kind::Histogram,
    ),
    (
        REQUEST_INFERENCE_TIME,
        names::REQUEST_INFERENCE_DURATION,
        Kind::Histogram,
    ),
    (
        REQUEST_PROMPT_TOKENS,
        names::REQUEST_INPUT_TOKENS,
        Kind::Histogram,
    ),
    (
        REQUEST_GENERATION_TOKENS,
        names::REQUEST_GENERATED_TOKENS,
        Kind::Histogram,
    ),
    (
        REQUEST_PARAMS_MAX_TOKENS,
        names::REQUEST_MAX_NEW_TOKENS,
        Kind::Histogram,
    ),
    (ITERATION_TOKENS, names::BATCH_TOKENS, Kind::Histogram),
    (
        SPEC_DECODE_NUM_DRAFT_TOKENS,
        names::SPECULATIVE_PROPOSED_TOKENS,
        Kind::Counter,
    ),
    (
        SPEC_DECODE_NUM_ACCEPTED_TOKENS,
        names::SPECULATIVE_ACCEPTED_TOKENS,
        Kind::Counter,
    ),
];

/// Every vLLM-named metric the router exports, with its kind and its label (if any).
pub const ALL: &[(&str, Kind, Option<&str>)] = &[
    (NUM_REQUESTS_WAITING, Kind::Gauge, None),
    (NUM_REQUESTS_RUNNING, Kind::Gauge, None),
    (KV_CACHE_USAGE_PERC, Kind::Gauge, None),
    (PREFIX_CACHE_QUERIES, Kind::Counter, None),
    (PREFIX_CACHE_HITS, Kind::Counter, None),
    (NUM_PREEMPTIONS, Kind::Counter, None),
    (REQUEST_SUCCESS, Kind::Counter, Some("finished_reason")),
    (TIME_TO_FIRST_TOKEN, Kind::Histogram, None),
    (INTER_TOKEN_LATENCY, Kind::Histogram, None),
    (TIME_PER_OUTPUT_TOKEN, Kind::Histogram, None),
    (REQUEST_TIME_PER_OUTPUT_TOKEN, Kind::Histogram, None),
    (E2E_REQUEST_LATENCY, Kind::Histogram, None),
    (REQUEST_QUEUE_TIME, Kind::Histogram, None),
    (REQUEST_INFERENCE_TIME, Kind::Histogram, None),
    (REQUEST_PROMPT_TOKENS, Kind::Histogram, None),
    (REQUEST_GENERATION_TOKENS, Kind::Histogram, None),
    (REQUEST_PARAMS_MAX_TOKENS, Kind::Histogram, None),
    (ITERATION_TOKENS, Kind::Histogram, None),
    (SPEC_DECODE_NUM_DRAFT_TOKENS, Kind::Counter, None),
    (SPEC_DECODE_NUM_ACCEPTED_TOKENS, Kind::Counter, None),
    (
        CACHE_CONFIG_INFO,
        Kind::Gauge,
        Some("block_size,num_gpu_blocks"),
    ),
];

/// The vLLM names a `tessera_*` metric is recorded under as well.
pub(super) fn twins_of(name: &str) -> impl Iterator<Item = &'static str> + '_ {
    TWINS
        .iter()
        .filter(move |t| t.1 == name && t.0 != REQUEST_SUCCESS)
        .map(|t| t.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_twin_is_exported_with_its_kind_and_its_twins_kind() {
        for &(ours, theirs, kind) in TWINS {
            let exported = ALL.iter().find(|a| a.0 == ours);
            assert_eq!(exported.map(|a| a.1), Some(kind), "{ours}");
            let twin = names::ALL.iter().find(|a| a.0 == theirs);
            assert_eq!(twin.map(|a| a.1), Some(kind), "{ours}'s twin {theirs}");
        }
        for &(name, kind, _) in ALL {
            assert!(name.starts_with("vllm:"), "{name}");
            let twinned = TWINS.iter().any(|t| t.0 == name);
            assert!(twinned || name == CACHE_CONFIG_INFO, "{name} has no twin");
            if kind == Kind::Counter {
                assert!(name.ends_with("_total"), "{name}");
            }
        }
    }
}
