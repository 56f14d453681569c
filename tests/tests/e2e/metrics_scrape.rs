//! `/metrics` after real traffic: the router (HTTP server, batcher, sharded client) in this
//! process against an in-process shard serving the tiny Llama fixture. Checks that the
//! metric table of `deploy/README.md` is exactly what the server exports, and that each
//! metric moved as its row says.

use crate::metrics_support;

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use metrics_support::{
    Scrape, documented, documented_vllm, exported, exported_vllm, fixture, start_shard,
};
use serde_json::{Value, json};
use tessera_model_files::ModelFiles;
use tessera_router::batcher::{self, BatcherConfig, SchedulerLimits};
use tessera_router::client::ShardedClient;
use tessera_router::client::WarmupRequest;
use tessera_router::{AppState, Infer, ValidationConfig, app, install_recorder};

const MAX_NEW: u32 = 6;
const STREAM_NEW: u32 = 5;
const COMPLETION_NEW: u32 = 4;
/// Long enough for two full KV blocks of 16 tokens, so a repeat hits the prefix cache.
const LONG_PROMPT: &str = "The quick brown fox jumps over the lazy dog while the cat \
    watches from the warm windowsill and the birds sing in the tall green trees outside";

struct Server {
    base: String,
    http: reqwest::Client,
}

async fn start(dir: &std::path::Path) -> Server {
    let socket = start_shard(&dir.join("shard"), None).await;
    let client = ShardedClient::connect(&socket).await.expect("connect");
    let warmup = client
        .warmup(WarmupRequest {
            max_input_tokens: 200,
            max_batch_prefill_tokens: 256,
            max_total_tokens: 256,
            max_batch_size: 8,
        })
        .await
        .expect("warmup");
    let prometheus = install_recorder().expect("recorder");
    let tokenizer = Arc::new(
        ModelFiles::open(&fixture())
            .and_then(|f| f.tokenizer())
            .expect("tokenizer"),
    );
    let limits = SchedulerLimits {
        max_batch_prefill_tokens: 256,
        max_batch_size: 8,
        prefix_caching: true,
        speculate: 0,
        rope: None,
    };
    let (queue, health) = batcher::spawn(BatcherConfig {
        client,
        tokenizer: tokenizer.clone(),
        num_blocks: warmup.num_blocks as usize,
        block_size: warmup.block_size as usize,
        limits,
        queue_capacity: 16,
    });
    let state = AppState::builder(Infer::new(queue, 8), tokenizer, "tiny")
        .validation(ValidationConfig {
            max_input_tokens: 200,
            max_total_tokens: 256,
            ..Default::default()
        })
        .health_check(health)
        .prometheus(prometheus)
        .build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app(state)).await });
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client");
    Server { base, http }
}

impl Server {
    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .expect("post");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Generated tokens of a `/generate` with `details`.
    async fn generate(&self) -> u64 {
        let body = json!({"inputs": LONG_PROMPT, "parameters": {
            "max_new_tokens": MAX_NEW, "details": true, "ignore_eos": true}});
        let (status, v) = self.post("/generate", body).await;
        assert_eq!(status, 200, "{v}");
        v["details"]["generated_tokens"].as_u64().expect("details")
    }

    /// Token events of a `/generate_stream`.
    async fn stream(&self) -> u64 {
        let body = json!({"inputs": "Once upon a time", "parameters": {
            "max_new_tokens": STREAM_NEW, "ignore_eos": true}});
        let text = self
            .http
            .post(format!("{}/generate_stream", self.base))
            .json(&body)
            .send()
            .await
            .expect("stream")
            .text()
            .await
            .expect("stream body");
        text.lines()
            .filter(|l| l.starts_with("data:") && l.contains("\"token\""))
            .count() as u64
    }

    /// Completion tokens of a `/v1/completions` with `n = 2`.
    async fn completions(&self) -> u64 {
        let body =
            json!({"model": "tiny", "prompt": "Hello there", "max_tokens": COMPLETION_NEW, "n": 2});
        let (status, v) = self.post("/v1/completions", body).await;
        assert_eq!(status, 200, "{v}");
        v["usage"]["completion_tokens"].as_u64().expect("usage")
    }

    async fn scrape(&self) -> Scrape {
        let text = self
            .http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics body");
        Scrape::parse(&text)
    }
}

#[test]
fn documented_table_is_what_the_router_exports() {
    let mut docs = documented();
    let mut ours = exported();
    docs.sort_by(|a, b| a.name.cmp(&b.name));
    ours.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(
        docs, ours,
        "deploy/README.md metric table vs metrics::names::ALL"
    );
}

#[test]
fn documented_vllm_table_is_what_the_router_exports() {
    let mut docs = documented_vllm();
    let mut ours = exported_vllm();
    docs.sort_by(|a, b| a.metric.name.cmp(&b.metric.name));
    ours.sort_by(|a, b| a.metric.name.cmp(&b.metric.name));
    assert_eq!(docs, ours, "deploy/README.md vLLM table vs metrics::vllm");
}

/// What the traffic of [`send_traffic`] produced.
#[derive(Debug, Clone, Copy)]
struct Traffic {
    /// Generated tokens over every request.
    generated: f64,
    /// Successful sequences.
    sequences: f64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_traffic() {
    let _router = crate::IN_PROCESS_ROUTER.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start(dir.path()).await;
    check_exported_before_traffic(&s.scrape().await);
    let traffic = send_traffic(&s).await;
    let m = settled_scrape(&s).await;
    check_request_metrics(&m, traffic);
    let input = check_batch_metrics(&m, traffic);
    check_cache_and_rest(&m, input);
    check_vllm_twins(&m);
}

fn check_exported_before_traffic(idle: &Scrape) {
    // Before any traffic every documented metric is already exported, at zero.
    let vllm = documented_vllm().into_iter().map(|d| d.metric);
    for d in documented().into_iter().chain(vllm) {
        let series = if d.kind == "histogram" {
            format!("{}_count", d.name)
        } else {
            d.name.clone()
        };
        assert!(idle.has(&series), "{series} is not exported before traffic");
        if d.kind != "gauge" {
            assert_eq!(idle.sum(&series, &[]), 0.0, "{series} before traffic");
        }
    }
    // Every failure class, so that a panel of failures by class shows 0, not "No data".
    for &class in tessera_router::metric_names::FAILURE_CLASSES {
        let l = [("err", class)];
        let s = idle.series("tessera_request_failure_total");
        assert!(
            s.iter()
                .any(|s| s.labels.get("err").map(String::as_str) == Some(class)),
            "err=\"{class}\" is not exported before traffic"
        );
        assert_eq!(idle.sum("tessera_request_failure_total", &l), 0.0);
    }
    for reason in ["stop", "length"] {
        let l = [("finished_reason", reason)];
        assert!(
            idle.matching_any("vllm:request_success_total", &l),
            "{reason}"
        );
    }
    let info = idle.series("vllm:cache_config_info");
    assert_eq!(info.len(), 1, "one vllm:cache_config_info series");
    assert_eq!(info[0].labels["block_size"], "16");
    assert_eq!(info[0].value, 1.0);
}

async fn send_traffic(s: &Server) -> Traffic {
    // Traffic: one long prompt alone (fills the prefix cache), then two repeats, two
    // streams, an OpenAI request with n = 2 and an invalid request, concurrently.
    let mut generated = s.generate().await;
    let invalid = async {
        let body = json!({"inputs": "hi", "parameters": {"max_new_tokens": 100_000}});
        let (status, v) = s.post("/generate", body).await;
        assert_eq!(status, 422, "{v}");
    };
    let (repeats, streams, completions, ()) = tokio::join!(
        join_all([s.generate(), s.generate()]),
        join_all([s.stream(), s.stream()]),
        s.completions(),
        invalid,
    );
    generated += repeats.iter().sum::<u64>() + streams.iter().sum::<u64>() + completions;
    assert_eq!(streams, [u64::from(STREAM_NEW); 2], "stream token events");
    let sequences = 3.0 + 2.0 + 2.0;
    let generated = generated as f64;
    Traffic {
        generated,
        sequences,
    }
}

async fn settled_scrape(s: &Server) -> Scrape {
    // The batcher updates its gauges right after the step that finished the last request.
    let mut m = s.scrape().await;
    for _ in 0..50 {
        if m.sum("tessera_running_requests", &[]) == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        m = s.scrape().await;
    }
    m
}

fn check_request_metrics(m: &Scrape, traffic: Traffic) {
    let Traffic {
        generated,
        sequences,
    } = traffic;
    // Every documented metric is exported with its documented type.
    for d in documented() {
        assert_eq!(
            m.types.get(&d.name).map(String::as_str),
            Some(d.kind.as_str()),
            "# TYPE of {}",
            d.name
        );
    }

    // Requests.
    assert_eq!(m.sum("tessera_requests_total", &[]), sequences + 1.0);
    assert_eq!(m.sum("tessera_request_success_total", &[]), sequences);
    assert_eq!(m.sum("tessera_request_failure_total", &[]), 1.0);
    assert_eq!(
        m.sum("tessera_request_failure_total", &[("err", "validation")]),
        1.0
    );
    for h in [
        "tessera_time_to_first_token_seconds",
        "tessera_request_duration_seconds",
        "tessera_request_queue_duration_seconds",
        "tessera_request_inference_duration_seconds",
        "tessera_request_time_per_output_token_seconds",
        "tessera_request_input_tokens",
        "tessera_request_max_new_tokens",
        "tessera_request_generated_tokens",
    ] {
        assert_eq!(m.sum(&format!("{h}_count"), &[]), sequences, "{h}_count");
    }
    assert_eq!(
        m.sum("tessera_inter_token_latency_seconds_count", &[]),
        generated - sequences,
        "one inter-token latency per token after the first"
    );
    assert_eq!(
        m.sum("tessera_request_generated_tokens_sum", &[]),
        generated
    );
    assert_eq!(
        m.sum("tessera_request_max_new_tokens_sum", &[]),
        f64::from(3 * MAX_NEW + 2 * STREAM_NEW + 2 * COMPLETION_NEW)
    );
    assert!(m.sum("tessera_request_validation_duration_seconds_count", &[]) >= 5.0);
    let ttft = m.sum("tessera_time_to_first_token_seconds_sum", &[]);
    let e2e = m.sum("tessera_request_duration_seconds_sum", &[]);
    assert!(
        ttft > 0.0 && ttft <= e2e,
        "TTFT {ttft} within end to end {e2e}"
    );
}

/// Returns the prompt tokens of every request.
fn check_batch_metrics(m: &Scrape, traffic: Traffic) -> f64 {
    let Traffic {
        generated,
        sequences,
    } = traffic;
    // Batches.
    let mut steps = 0.0;
    for method in ["prefill", "decode"] {
        let l = [("method", method)];
        let n = m.sum("tessera_batch_inference_total", &l);
        assert!(n >= 1.0, "{method} steps");
        steps += n;
        for h in [
            "tessera_batch_inference_duration_seconds_count",
            "tessera_batch_forward_duration_seconds_count",
            "tessera_batch_sampling_duration_seconds_count",
        ] {
            assert_eq!(m.sum(h, &l), n, "{h} of {method} steps");
        }
        assert_eq!(m.sum("tessera_batch_inference_failure_total", &l), 0.0);
    }
    assert_eq!(m.sum("tessera_batch_size_requests_count", &[]), steps);
    assert!(
        m.sum("tessera_batch_size_requests_sum", &[]) >= generated,
        "every generated token needs its request in a step"
    );
    assert_eq!(
        m.sum("tessera_batch_decode_tokens_sum", &[]),
        generated - sequences,
        "one decode token per token after the first"
    );
    let input = m.sum("tessera_request_input_tokens_sum", &[]);
    let hits = m.sum("tessera_prefix_cache_hit_tokens_total", &[]);
    assert_eq!(
        m.sum("tessera_batch_prefill_tokens_sum", &[]) + hits,
        input,
        "prompt tokens are computed or served from the prefix cache"
    );
    input
}

fn check_cache_and_rest(m: &Scrape, input: f64) {
    let hits = m.sum("tessera_prefix_cache_hit_tokens_total", &[]);
    // Prefix cache: the repeats of the long prompt hit.
    let queried = m.sum("tessera_prefix_cache_queried_tokens_total", &[]);
    assert!(hits >= 16.0, "prefix-cache hit tokens {hits}");
    assert!(queried >= input - hits, "queried {queried}");
    let ratio = m.sum("tessera_prefix_cache_hit_ratio", &[]);
    assert!((ratio - hits / queried).abs() < 1e-9, "hit ratio {ratio}");

    // Gauges back at rest.
    assert_eq!(m.sum("tessera_queue_requests", &[]), 0.0);
    assert_eq!(m.sum("tessera_running_requests", &[]), 0.0);
    assert_eq!(m.sum("tessera_batch_kv_tokens", &[]), 0.0);
    assert_eq!(m.sum("tessera_kv_blocks_used", &[]), 0.0);
    assert_eq!(m.sum("tessera_kv_cache_usage_ratio", &[]), 0.0);
    let capacity = m.sum("tessera_kv_blocks_capacity", &[]);
    assert!(capacity > 0.0);
    assert_eq!(m.sum("tessera_kv_blocks_free", &[]), capacity);

    // Nothing was preempted and nothing speculated.
    for z in [
        "tessera_preemptions_total",
        "tessera_speculative_proposed_tokens_total",
        "tessera_speculative_accepted_tokens_total",
        "tessera_speculative_acceptance_ratio",
    ] {
        assert_eq!(m.sum(z, &[]), 0.0, "{z}");
    }
}

/// Every vLLM name holds exactly its twin's value: each series of a histogram (buckets, sum,
/// count), a counter or a gauge.
fn check_vllm_twins(m: &Scrape) {
    use tessera_router::metric_names::Kind;
    use tessera_router::vllm_metric_names::TWINS;
    for &(theirs, ours, kind) in TWINS {
        let suffixes: &[&str] = match kind {
            Kind::Histogram => &["_bucket", "_sum", "_count"],
            Kind::Counter | Kind::Gauge => &[""],
        };
        for suffix in suffixes {
            let mut a: Vec<_> = m
                .series(&format!("{theirs}{suffix}"))
                .into_iter()
                .map(|s| (s.labels.get("le").cloned(), s.value))
                .collect();
            let mut b: Vec<_> = m
                .series(&format!("{ours}{suffix}"))
                .into_iter()
                .map(|s| (s.labels.get("le").cloned(), s.value))
                .collect();
            if theirs == "vllm:request_success_total" {
                // Split by finish reason: the sum is the twin.
                let total: f64 = a.iter().map(|s| s.1).sum();
                a = vec![(None, total)];
            }
            if ours.starts_with("tessera_speculative_") {
                // Split by speculator: the sum is the twin.
                let total: f64 = b.iter().map(|s| s.1).sum();
                b = vec![(None, total)];
            }
            a.sort_by(|x, y| x.partial_cmp(y).expect("no NaN"));
            b.sort_by(|x, y| x.partial_cmp(y).expect("no NaN"));
            assert!(!b.is_empty(), "{ours}{suffix} has no series");
            assert_eq!(a, b, "{theirs}{suffix} vs {ours}{suffix}");
        }
    }
    // The traffic moved them: the comparison above is not between zeros.
    assert!(m.sum("vllm:time_to_first_token_seconds_count", &[]) > 0.0);
    assert!(m.sum("vllm:prefix_cache_hits_total", &[]) > 0.0);
    assert!(m.sum("vllm:iteration_tokens_total_count", &[]) > 0.0);
    let success = m.sum(
        "vllm:request_success_total",
        &[("finished_reason", "length")],
    );
    assert!(
        success > 0.0,
        "max_tokens-bounded requests finish by length"
    );
}
