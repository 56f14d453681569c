//! Greedy output through HTTP equals the engine's goldens (made with transformers), token
//! for token, for every tiny fixture; and 32 concurrent requests each get what they get
//! alone.

use std::time::Duration;

use serde_json::{Value, json};
use tessera_e2e::{Checks, Server, Sse, detail_ids, fixture, golden, u64s, within};

const TEST_LIMIT: Duration = Duration::from_secs(180);

/// The EOS ids of a fixture (`generation_config.json`'s `eos_token_id`, an int or a list).
fn eos_ids(model: &str) -> Vec<u64> {
    let path = fixture(model).join("generation_config.json");
    let config: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("read"))
        .expect("generation_config.json");
    match &config["eos_token_id"] {
        Value::Array(_) => u64s(&config["eos_token_id"]),
        v => vec![v.as_u64().expect("eos_token_id")],
    }
}

/// Token ids of a `/generate_stream` run, with the final event.
async fn stream_ids(server: &Server, body: &Value) -> (Vec<u64>, Value) {
    let sse: Sse = server.stream("/generate_stream", body).await;
    let (events, _) = sse.collect_json().await;
    let ids = events
        .iter()
        .map(|e| {
            e["token"]["id"]
                .as_u64()
                .unwrap_or_else(|| panic!("event without token id: {e}"))
        })
        .collect();
    let last = events.last().cloned().expect("at least one event");
    (ids, last)
}

/// Every golden prompt of `model`: `/tokenize` gives the golden prompt ids; greedy
/// `/generate` (EOS ignored) and `/generate_stream` give the golden 20 tokens; without
/// `ignore_eos` the output stops at the first EOS of the golden sequence.
async fn goldens(server: &Server, model: &str) {
    let golden = golden(model);
    let eos = eos_ids(model);
    let mut mismatches = Vec::new();
    for (i, p) in golden["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .enumerate()
    {
        let text = p["text"].as_str().expect("text");
        let prompt_ids = u64s(&p["prompt_ids"]);
        let greedy = u64s(&p["greedy_ids"]);
        let tokenized = server.tokenize(text).await;
        if tokenized != prompt_ids {
            mismatches.push(format!(
                "prompt {i}: /tokenize gave {tokenized:?}, golden prompt_ids {prompt_ids:?}"
            ));
            continue;
        }
        let n = greedy.len();
        let params = json!({"max_new_tokens": n, "details": true, "ignore_eos": true});
        let body = server
            .generate(&json!({"inputs": text, "parameters": params}))
            .await;
        let got = detail_ids(&body);
        if got != greedy {
            mismatches.push(format!(
                "prompt {i} ({} tokens): /generate gave {got:?}\n  golden greedy_ids     {greedy:?}",
                prompt_ids.len()
            ));
        }
        assert_eq!(body["details"]["finish_reason"], "length", "prompt {i}");
        assert_eq!(body["details"]["generated_tokens"], n, "prompt {i}");

        let (streamed, last) =
            stream_ids(server, &json!({"inputs": text, "parameters": params})).await;
        if streamed != greedy {
            mismatches.push(format!(
                "prompt {i}: /generate_stream gave {streamed:?}\n  golden greedy_ids     {greedy:?}"
            ));
        }
        assert_eq!(
            last["details"]["input_length"],
            prompt_ids.len(),
            "prompt {i}"
        );

        // EOS honoured: the golden sequence up to and including its first EOS.
        let cut = greedy.iter().position(|t| eos.contains(t));
        let expected: Vec<u64> = greedy[..cut.map_or(n, |c| c + 1)].to_vec();
        let body = server
            .generate(
                &json!({"inputs": text, "parameters": {"max_new_tokens": n, "details": true}}),
            )
            .await;
        let got = detail_ids(&body);
        let reason = if cut.is_some() { "eos_token" } else { "length" };
        if got != expected || body["details"]["finish_reason"] != reason {
            mismatches.push(format!(
                "prompt {i} without ignore_eos: got {got:?} ({}), expected {expected:?} ({reason})",
                body["details"]["finish_reason"]
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{model}: HTTP output differs from the goldens:\n{}",
        mismatches.join("\n")
    );
}

/// 32 different prompts of different lengths and budgets: sent one at a time, then all at
/// once; each must get the same tokens both ways.
async fn concurrent_equals_alone(server: &Server, model: &str) {
    let golden = golden(model);
    let texts: Vec<String> = golden["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| p["text"].as_str().expect("text").to_owned())
        .collect();
    let mut prompts = Vec::new();
    let variants: [fn(&str) -> String; 7] = [
        |t| t.to_owned(),
        |t| format!("{t} and then"),
        |t| format!("Q: {t}"),
        |t| t.chars().take(t.chars().count() / 2 + 1).collect(),
        |t| t.to_uppercase(),
        |t| format!("{t}\n{t}"),
        |t| t.split_whitespace().rev().collect::<Vec<_>>().join(" "),
    ];
    'outer: for variant in variants {
        for t in &texts {
            // At most 160 bytes, so at most 160 tokens: prompt + budget fit in 256.
            let p: String = variant(t).chars().take(160).collect();
            if !prompts.contains(&p) {
                prompts.push(p);
            }
            if prompts.len() == 32 {
                break 'outer;
            }
        }
    }
    assert_eq!(prompts.len(), 32);
    let budget = |i: usize| 6 + (i % 7) as u32 * 5;
    let mut alone = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        alone.push(server.greedy_ids(p, budget(i)).await);
    }
    let together = futures::future::join_all(
        prompts
            .iter()
            .enumerate()
            .map(|(i, p)| server.greedy_ids(p, budget(i))),
    )
    .await;
    let differ: Vec<String> = alone
        .iter()
        .zip(&together)
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(i, (a, b))| {
            format!(
                "request {i} ({:?}):\n  alone    {a:?}\n  together {b:?}",
                prompts[i]
            )
        })
        .collect();
    assert!(
        differ.is_empty(),
        "{model}: {} of 32 concurrent requests differ from their output alone:\n{}",
        differ.len(),
        differ.join("\n")
    );
    // Every block is back.
    let (used, ok) = server
        .wait_metric("tessera_kv_blocks_used", Duration::from_secs(5), |v| {
            v == 0.0
        })
        .await;
    assert!(
        ok,
        "tessera_kv_blocks_used is {used} after all requests finished"
    );
}

/// [`goldens`] and [`concurrent_equals_alone`], both reported if both fail.
async fn goldens_and_concurrency(server: &Server, model: &str) {
    let mut checks = Checks::new();
    checks
        .run("goldens", TEST_LIMIT, goldens(server, model))
        .await;
    checks
        .run(
            "32 concurrent = alone",
            TEST_LIMIT,
            concurrent_equals_alone(server, model),
        )
        .await;
    checks.finish();
}

#[tokio::test]
async fn tiny_llama_goldens_and_concurrency() {
    within("tiny-llama goldens", TEST_LIMIT, async {
        let server = Server::start("tiny-llama", &["--dtype", "float32"]).await;
        goldens_and_concurrency(&server, "tiny-llama").await;
    })
    .await;
}

#[tokio::test]
async fn tiny_qwen2_goldens() {
    within("tiny-qwen2 goldens", TEST_LIMIT, async {
        let server = Server::start("tiny-qwen2", &["--dtype", "float32"]).await;
        goldens(&server, "tiny-qwen2").await;
    })
    .await;
}

#[tokio::test]
async fn tiny_mistral_goldens_and_concurrency() {
    within("tiny-mistral goldens", TEST_LIMIT, async {
        let server = Server::start("tiny-mistral", &["--dtype", "float32"]).await;
        // Sliding window 8 with long prompts in one batch.
        goldens_and_concurrency(&server, "tiny-mistral").await;
    })
    .await;
}

/// LongRoPE rotates a prompt by its length: a shorter prompt's cached prefix does not fit a
/// prompt past the original context (but does fit another such prompt), and chunked, batched
/// prefill changes nothing.
#[tokio::test]
async fn tiny_phi3_goldens_after_a_shared_prefix_and_concurrency() {
    within("tiny-phi3 goldens", TEST_LIMIT, async {
        let server = Server::start("tiny-phi3", &["--dtype", "float32"]).await;
        let golden = golden("tiny-phi3");
        let longest = golden["prompts"]
            .as_array()
            .expect("prompts")
            .iter()
            .max_by_key(|p| p["prompt_ids"].as_array().map_or(0, Vec::len))
            .and_then(|p| p["text"].as_str())
            .expect("a golden prompt");
        // Its first 20 words: more than a cache block, within the original 64 tokens.
        let prefix = longest.split(' ').take(20).collect::<Vec<_>>().join(" ");
        let n = server.tokenize(&prefix).await.len();
        assert!((16..64).contains(&n), "the prefix is {n} tokens");
        server.greedy_ids(&prefix, 1).await;
        let hits = "tessera_prefix_cache_hit_tokens_total";
        let before = server.metric(hits).await;
        let long_again = format!("{longest} Again.");
        let alone = server.greedy_ids(&long_again, 4).await;
        let after_first = server.metric(hits).await;
        assert_eq!(
            after_first, before,
            "the shorter prompt's cached blocks were reused past the original context"
        );
        assert_eq!(server.greedy_ids(&long_again, 4).await, alone);
        let reused = server.metric(hits).await - after_first;
        assert!(
            reused >= 64.0,
            "a prompt past the original context reused {reused} cached tokens of the same \
             prompt (before: {before}, after the first: {after_first})"
        );
        goldens_and_concurrency(&server, "tiny-phi3").await;
    })
    .await;
}
