//! Soak test: about two thousand mixed requests against one tiny-llama server on 127.0.0.1,
//! bounded in time (the whole test stops by itself within 4 minutes).
//!
//! Traffic, from a seeded generator (a refused worker backs off 10–40 ms), with more workers (`WORKERS`) than
//! `--max-concurrent-requests` (`LIMIT`): non-streaming `/generate` and
//! `/v1/chat/completions`, streaming `/generate_stream` and `/v1/chat/completions` read to
//! the end, streams the client drops after a few events, non-streaming requests the client
//! abandons after a few milliseconds, and invalid requests (malformed JSON, out-of-range
//! parameters, unknown model) interleaved.
//!
//! Checks:
//! - every request ends in a success or a typed error: a 4xx with a JSON body naming its
//!   kind (`error_type` on native routes, `error.type` on `/v1`), or a 429 `overloaded`;
//!   never a 5xx, a transport error or a malformed stream;
//! - the 429s are exactly the excess: with the shard paused, `LIMIT + EXCESS` concurrent
//!   requests get exactly `EXCESS` 429s, and the `LIMIT` others all complete once it runs;
//! - when idle, `tessera_kv_blocks_used` returns to 0 and `tessera_queue_size` to 0;
//! - the router's and the shard's RSS stop growing after warm-up: the RSS after the second
//!   half of the traffic is within 10% (+24 MiB) of the RSS after the first half;
//! - the router's live heap (`tessera_router_heap_bytes`) comes back, idle, to within 2%
//!   (+256 KiB) of where it was after the first half: per-request state is all freed.
//!
//! It prints the counts: requests, successes, each error class, cancellations, and the
//! peak RSS of both processes after warm-up and at the end.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use tessera_e2e::{Paused, Server, TestRng, client, rss_kib, within};

/// `--max-concurrent-requests`.
const LIMIT: usize = 8;
/// Concurrent workers in the random phase (above `LIMIT`, so 429s happen).
const WORKERS: usize = 12;
/// Requests of the random phase (each half).
const HALF: usize = 1000;
/// Requests beyond the limit in the exact-excess phase.
const EXCESS: usize = 5;

/// How one request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    Success,
    /// A typed 4xx other than 429 (validation, unknown model, bad JSON).
    Invalid(u16),
    Overloaded,
    /// The client went away on purpose.
    Cancelled,
}

#[derive(Default)]
struct Tally {
    counts: BTreeMap<Outcome, usize>,
    failures: Vec<String>,
}

impl Tally {
    fn add(&mut self, r: Result<Outcome, String>) {
        match r {
            Ok(o) => *self.counts.entry(o).or_default() += 1,
            Err(e) => self.failures.push(e),
        }
    }
}

/// Classifies a non-200 answer: must be a typed error.
fn typed_error(path: &str, status: u16, body: &Value) -> Result<Outcome, String> {
    let kind = if path.starts_with("/v1") {
        body["error"]["type"].as_str()
    } else {
        body["error_type"].as_str()
    };
    match (status, kind) {
        (429, Some(_)) => Ok(Outcome::Overloaded),
        (400..=499, Some(_)) => Ok(Outcome::Invalid(status)),
        _ => Err(format!(
            "POST {path}: untyped or server error {status}: {body}"
        )),
    }
}

/// One random request; returns how it ended.
async fn one(http: &reqwest::Client, base: &str, rng: &mut TestRng) -> Result<Outcome, String> {
    let kind = rng.below(10);
    let tokens = 1 + rng.below(12);
    let prompt = ["The", "Once upon a time", "1, 2, 3,", "Hello é€😀"][rng.below(4) as usize];
    let (path, body, stream, cancel_after): (&str, Value, bool, Option<u64>) = match kind {
        0 | 1 => (
            "/generate",
            json!({"inputs": prompt, "parameters": {"max_new_tokens": tokens, "do_sample": rng.below(2) == 0, "seed": rng.below(100)}}),
            false,
            None,
        ),
        2 => (
            "/v1/chat/completions",
            json!({"model": "tiny-llama", "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens}),
            false,
            None,
        ),
        3 | 4 => (
            "/generate_stream",
            json!({"inputs": prompt, "parameters": {"max_new_tokens": tokens}}),
            true,
            None,
        ),
        5 => (
            "/v1/chat/completions",
            json!({"model": "tiny-llama", "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "stream": true}),
            true,
            None,
        ),
        6 => (
            "/generate_stream",
            json!({"inputs": prompt, "parameters": {"max_new_tokens": 200, "ignore_eos": true}}),
            true,
            Some(1 + rng.below(3)),
        ),
        7 => (
            "/generate",
            json!({"inputs": prompt, "parameters": {"max_new_tokens": 200, "ignore_eos": true}}),
            false,
            Some(rng.below(20)),
        ),
        _ => match rng.below(4) {
            0 => ("/generate", json!("{not json"), false, None),
            1 => (
                "/generate",
                json!({"inputs": prompt, "parameters": {"max_new_tokens": 100000}}),
                false,
                None,
            ),
            2 => (
                "/v1/chat/completions",
                json!({"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}),
                false,
                None,
            ),
            _ => (
                "/v1/completions",
                json!({"model": "tiny-llama", "prompt": "x", "temperature": -1}),
                false,
                None,
            ),
        },
    };
    let url = format!("{base}{path}");
    let request = if let Value::String(raw) = &body {
        http.post(&url)
            .header("content-type", "application/json")
            .body(raw.clone())
    } else {
        http.post(&url).json(&body)
    };
    // A non-streaming request abandoned after a few milliseconds.
    if !stream && let Some(ms) = cancel_after {
        return match tokio::time::timeout(Duration::from_millis(ms), request.send()).await {
            Err(_) => Ok(Outcome::Cancelled),
            Ok(Err(e)) => Err(format!("POST {path}: {e}")),
            Ok(Ok(r)) => {
                let (status, v) = tessera_e2e::read_json(r).await;
                if status == 200 {
                    Ok(Outcome::Success)
                } else {
                    typed_error(path, status, &v)
                }
            }
        };
    }
    let r = request
        .send()
        .await
        .map_err(|e| format!("POST {path}: {e}"))?;
    let status = r.status().as_u16();
    if status != 200 {
        let (status, v) = tessera_e2e::read_json(r).await;
        return typed_error(path, status, &v);
    }
    if !stream {
        let (_, v) = tessera_e2e::read_json(r).await;
        let ok = v["generated_text"].is_string() || v["choices"][0]["message"].is_object();
        return if ok {
            Ok(Outcome::Success)
        } else {
            Err(format!("POST {path}: 200 without output: {v}"))
        };
    }
    // Streams: count events; drop after `cancel_after` of them.
    let mut body = r.bytes_stream();
    let mut text = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| format!("POST {path}: stream broke: {e}"))?;
        text.extend_from_slice(&chunk);
        let events = text.windows(6).filter(|w| w == b"data: ").count() as u64;
        if cancel_after.is_some_and(|n| events >= n) {
            return Ok(Outcome::Cancelled);
        }
    }
    let text = String::from_utf8_lossy(&text);
    let last = text
        .split("\n\n")
        .filter_map(|e| e.trim().strip_prefix("data:"))
        .map(str::trim)
        .last()
        .unwrap_or_default()
        .to_owned();
    let complete = last == "[DONE]"
        || serde_json::from_str::<Value>(&last).is_ok_and(|v| v["generated_text"].is_string());
    if complete {
        Ok(Outcome::Success)
    } else if text.contains("\"error\"") {
        Err(format!("POST {path}: stream ended with an error: {last}"))
    } else {
        Err(format!("POST {path}: stream ended early: {last:?}"))
    }
}

/// Runs `n` random requests over `WORKERS` workers.
async fn traffic(base: &str, n: usize, seed: u64) -> Tally {
    let tally = Arc::new(Mutex::new(Tally::default()));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let (tally, next, base) = (tally.clone(), next.clone(), base.to_owned());
        tasks.push(tokio::spawn(async move {
            let http = client();
            let mut rng = TestRng::new(seed * 1000 + w as u64 + 1);
            let mut refusals = 0u32;
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < n {
                let r = one(&http, &base, &mut rng).await;
                let refused = r == Ok(Outcome::Overloaded);
                tally.lock().expect("tally").add(r);
                if refused {
                    // Back off exponentially, as a client should, so the traffic stays mostly
                    // served however fast this machine serves it.
                    refusals = (refusals + 1).min(6);
                    let ms = (10 + rng.below(30)) << (refusals - 1);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                } else {
                    refusals = 0;
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("worker panicked");
    }
    Arc::try_unwrap(tally)
        .ok()
        .expect("workers done")
        .into_inner()
        .expect("tally")
}

/// Waits until the server is idle: no KV blocks used, nothing queued.
async fn assert_idle(s: &Server) {
    let (used, ok) = s
        .wait_metric("tessera_kv_blocks_used", Duration::from_secs(10), |v| {
            v == 0.0
        })
        .await;
    assert!(
        ok,
        "tessera_kv_blocks_used is {used} 10 s after the traffic"
    );
    let (queued, ok) = s
        .wait_metric("tessera_queue_size", Duration::from_secs(5), |v| v == 0.0)
        .await;
    assert!(ok, "tessera_queue_size is {queued} when idle");
}

/// The exact-excess phase: with the shard paused, `LIMIT + EXCESS` requests at once.
async fn exact_excess(s: &Server) -> (usize, usize) {
    let shard = s.child_pid("tessera-shard");
    let paused = Paused::new(shard);
    let base = s.url("");
    let mut tasks = Vec::new();
    for i in 0..LIMIT + EXCESS {
        let base = base.clone();
        tasks.push(tokio::spawn(async move {
            let r = client()
                .post(format!("{base}/generate"))
                .json(&json!({"inputs": "The", "parameters": {"max_new_tokens": 2 + i % 3}}))
                .send()
                .await
                .expect("POST /generate");
            tessera_e2e::read_json(r).await
        }));
    }
    // The LIMIT admitted ones wait on the paused shard; the excess are refused at once.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    paused.resume();
    let (mut ok, mut refused) = (0, 0);
    for t in tasks {
        let (status, body) = t.await.expect("task");
        match status {
            200 => ok += 1,
            429 => {
                assert_eq!(body["error_type"], "overloaded", "{body}");
                refused += 1;
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    (ok, refused)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn soak() {
    within("the soak test", Duration::from_secs(240), async {
        let started = Instant::now();
        let limit = LIMIT.to_string();
        let s = Server::start(
            "tiny-llama",
            &[
                "--max-concurrent-requests",
                &limit,
                "--max-batch-size",
                &limit,
            ],
        )
        .await;
        let router = s.child_pid("tessera-router");
        let shard = s.child_pid("tessera-shard");
        let base = s.url("");

        // Warm-up.
        let warm = traffic(&base, 100, 1).await;
        assert!(warm.failures.is_empty(), "warm-up: {:?}", warm.failures);
        assert_idle(&s).await;
        let rss_warm = (rss_kib(router).unwrap_or(0), rss_kib(shard).unwrap_or(0));

        let first = traffic(&base, HALF, 2).await;
        assert_idle(&s).await;
        let rss_half = (rss_kib(router).unwrap_or(0), rss_kib(shard).unwrap_or(0));
        let heap_half = s.metric("tessera_router_heap_bytes").await;
        let second = traffic(&base, HALF, 3).await;
        assert_idle(&s).await;
        let rss_end = (rss_kib(router).unwrap_or(0), rss_kib(shard).unwrap_or(0));
        let heap_end = s.metric("tessera_router_heap_bytes").await;

        let (admitted, refused) = exact_excess(&s).await;
        assert_idle(&s).await;

        let mut total = Tally::default();
        for t in [warm, first, second] {
            for (k, v) in t.counts {
                *total.counts.entry(k).or_default() += v;
            }
            total.failures.extend(t.failures);
        }
        let requests: usize =
            total.counts.values().sum::<usize>() + total.failures.len() + LIMIT + EXCESS;
        eprintln!("soak: {requests} requests in {:.1?}", started.elapsed());
        for (k, v) in &total.counts {
            eprintln!("soak:   {k:?}: {v}");
        }
        eprintln!("soak:   failures: {}", total.failures.len());
        eprintln!("soak: exact excess: {admitted} admitted, {refused} refused (429)");
        eprintln!(
            "soak: RSS router {:.1} MiB after warm-up, {:.1} after half, {:.1} at the end; \
             shard {:.1} / {:.1} / {:.1} MiB",
            mib(rss_warm.0),
            mib(rss_half.0),
            mib(rss_end.0),
            mib(rss_warm.1),
            mib(rss_half.1),
            mib(rss_end.1),
        );
        eprintln!(
            "soak: router live heap {:.2} MiB after half, {:.2} MiB at the end",
            heap_half / 1048576.0,
            heap_end / 1048576.0
        );
        assert!(
            heap_half > 0.0 && heap_end <= heap_half * 1.02 + 256.0 * 1024.0,
            "the router's live heap grew from {heap_half} to {heap_end} bytes over the second half"
        );
        assert!(
            total.failures.is_empty(),
            "{} requests did not end in a success or a typed error:\n{}",
            total.failures.len(),
            total.failures[..total.failures.len().min(20)].join("\n")
        );
        // Of the requests meant to succeed, most must (the rest were refused with 429s).
        let count = |o: Outcome| total.counts.get(&o).copied().unwrap_or(0);
        assert!(
            count(Outcome::Success) > count(Outcome::Overloaded),
            "too few successes: {:?}",
            total.counts
        );
        assert_eq!(
            (admitted, refused),
            (LIMIT, EXCESS),
            "the 429s are not exactly the excess"
        );
        for (name, half, end) in [
            ("router", rss_half.0, rss_end.0),
            ("shard", rss_half.1, rss_end.1),
        ] {
            assert!(
                end as f64 <= half as f64 * 1.10 + 24.0 * 1024.0,
                "the {name}'s RSS grew from {:.1} MiB to {:.1} MiB over the second half",
                mib(half),
                mib(end)
            );
        }
        // Still serving.
        let v = s
            .generate(&json!({"inputs": "The", "parameters": {"max_new_tokens": 2}}))
            .await;
        assert!(v["generated_text"].is_string());
    })
    .await;
}
