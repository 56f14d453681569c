//! Tensor parallelism through the real launcher: `--num-shard 2` gives the same greedy tokens
//! (and logprobs within 1e-4) as `--num-shard 1` for every fixture under 16 concurrent
//! requests; a shard count that does not split the model is refused at start naming the
//! dimension and the allowed counts; killing one of two shards mid-request fails the clients
//! and the launcher promptly, leaving nothing running.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::future::join_all;
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tessera_e2e::{
    Paused, Server, SseItem, binary, fixture, golden, read_json, signal, wait_all_dead, within,
};

/// 16 different prompts: the fixture's golden texts, each also with a suffix.
fn prompts(model: &str) -> Vec<String> {
    let g = golden(model);
    let texts: Vec<String> = g["prompts"]
        .as_array()
        .expect("golden prompts")
        .iter()
        .map(|p| p["text"].as_str().unwrap_or_default().to_string())
        .filter(|t| !t.is_empty())
        .collect();
    (0..16)
        .map(|i| {
            let t = &texts[i % texts.len()];
            match i / texts.len() {
                0 => t.clone(),
                k => format!("{t} {k}"),
            }
        })
        .collect()
}

/// `(token ids, logprobs)` of a greedy generation for every prompt, all sent at once.
async fn greedy(
    server: &Server,
    prompts: &[String],
    max_new_tokens: u32,
) -> Vec<(Vec<u64>, Vec<f64>)> {
    let calls = prompts.iter().map(|p| {
        let body = json!({
            "inputs": p,
            "parameters": {"max_new_tokens": max_new_tokens, "details": true, "ignore_eos": true}
        });
        async move {
            let (status, answer) = server.post("/generate", &body).await;
            assert_eq!(status, 200, "{body}: {answer}");
            let tokens = answer["details"]["tokens"]
                .as_array()
                .expect("details.tokens")
                .clone();
            (
                tokens
                    .iter()
                    .map(|t| t["id"].as_u64().expect("id"))
                    .collect(),
                tokens
                    .iter()
                    .map(|t| t["logprob"].as_f64().expect("logprob"))
                    .collect(),
            )
        }
    });
    join_all(calls).await
}

#[tokio::test]
async fn two_shards_match_one_shard_on_every_fixture() {
    within(
        "two_shards_match_one_shard",
        Duration::from_secs(900),
        async {
            for model in [
                "tiny-llama",
                "tiny-qwen2",
                "tiny-mistral",
                "tiny-qwen3",
                "tiny-gemma2",
                "tiny-gemma3",
                "tiny-phi3",
                "tiny-llama-yarn",
                "tiny-llama-dynamic",
                "tiny-qwen3-moe",
                "tiny-mixtral",
                "tiny-qwen2-moe",
                "tiny-gemma3-vision",
                "tiny-mistral3",
                "tiny-smollm3",
                "tiny-gpt-oss",
                "tiny-gpt-oss-mxfp4",
            ] {
                let prompts = prompts(model);
                // Exact products: a rank's slice that splits a block of a block-format matrix
                // (MXFP4 experts here) is kept as f32, where one shard multiplies in int8.
                let exact = [("TESSERA_INT8", "0")];
                let (one, two) = tokio::join!(
                    Server::start_with_env(model, &exact, &["--num-shard", "1"]),
                    Server::start_with_env(model, &exact, &["--num-shard", "2"]),
                );
                assert_eq!(
                    two.child_pids("tessera-shard").len(),
                    2,
                    "{model}: two shards"
                );
                // 10 new tokens: the longest prompt (117 tokens) still fits tiny-llama-dynamic's
                // context of 128.
                let (a, b) = tokio::join!(greedy(&one, &prompts, 10), greedy(&two, &prompts, 10));
                let mut worst = 0f64;
                for (i, ((ids1, lp1), (ids2, lp2))) in a.iter().zip(&b).enumerate() {
                    assert_eq!(
                        ids1, ids2,
                        "{model}: prompt {i} {:?}: greedy tokens differ",
                        prompts[i]
                    );
                    for (x, y) in lp1.iter().zip(lp2) {
                        worst = worst.max((x - y).abs());
                    }
                }
                eprintln!(
                    "{model}: 16 concurrent requests, max |logprob diff| 1 vs 2 shards = {worst:e}"
                );
                assert!(worst <= 1e-4, "{model}: logprobs differ by {worst}");
            }
        },
    )
    .await;
}

#[tokio::test]
async fn a_shard_count_that_does_not_split_is_refused_at_start() {
    within("bad_shard_count", Duration::from_secs(60), async {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = tessera_e2e::free_port();
        let start = Instant::now();
        let output = tokio::task::spawn_blocking(move || {
            Command::new(binary("tessera-launcher"))
                .env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .arg("--model-id")
                .arg(fixture("tiny-llama"))
                .args(["--num-shard", "3", "--hostname", "127.0.0.1", "--port"])
                .arg(port.to_string())
                .arg("--shard-uds-path")
                .arg(dir.path().join("shard"))
                .args(["--kv-cache-memory", "64M", "--shutdown-grace-period", "5"])
                .stdin(Stdio::null())
                .output()
                .expect("run the launcher")
        })
        .await
        .expect("task");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(!output.status.success(), "the launcher must refuse: {text}");
        assert!(
            text.contains("num_key_value_heads = 2") && text.contains("1, 2, 4"),
            "the error names the dimension and the allowed shard counts:\n{text}"
        );
        eprintln!("refused after {:?}", start.elapsed());
    })
    .await;
}

/// One of two shards SIGKILLed while a stream and a plain request are in flight (the other
/// shard is then waiting for it inside a collective): both clients get an error promptly,
/// the launcher exits non-zero, and no process is left.
#[tokio::test]
async fn killing_one_of_two_shards_mid_request_fails_everything_promptly() {
    within("kill_one_of_two_shards", Duration::from_secs(120), async {
        let mut s = Server::start("tiny-llama", &["--num-shard", "2"]).await;
        let shards = s.child_pids("tessera-shard");
        assert_eq!(shards.len(), 2, "{:?}", s.children());
        let router = s.child_pid("tessera-router");
        let victim = shards[1];
        let body =
            json!({"inputs": "The", "parameters": {"max_new_tokens": 250, "ignore_eos": true}});
        let mut sse = s.stream("/generate_stream", &body).await;
        assert!(matches!(
            sse.next_item(Duration::from_secs(10)).await,
            SseItem::Data(_)
        ));
        // Freeze one shard: the other blocks in a collective waiting for it.
        let paused = Paused::new(victim);
        let plain = {
            let r = s.client().post(s.url("/generate")).json(&body).send();
            tokio::spawn(async move { read_json(r.await.expect("POST /generate")).await })
        };
        let (n, ok) = s
            .wait_metric("tessera_requests_total", Duration::from_secs(5), |v| {
                v >= 2.0
            })
            .await;
        assert!(ok, "both requests queued (tessera_requests_total {n})");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let killed = Instant::now();
        signal(victim, Signal::SIGKILL);
        drop(paused);

        let bound = Duration::from_secs(10);
        let outcome = within("the stream's outcome", bound, async {
            loop {
                match sse.next_item(bound).await {
                    SseItem::Data(d) => {
                        let v: Value = serde_json::from_str(&d).unwrap_or(Value::String(d));
                        if v.get("error").is_some() {
                            return Ok(v);
                        }
                        assert!(v["details"].is_null(), "the stream finished normally: {v}");
                    }
                    other => return Err(other),
                }
            }
        })
        .await;
        match outcome {
            Ok(e) => {
                eprintln!("stream error after {:?}: {e}", killed.elapsed());
                assert!(e["error"].is_string() && e["error_type"].is_string(), "{e}");
            }
            Err(other) => panic!("the stream ended without an error event: {other:?}"),
        }
        let (status, answer) = within("the plain request's answer", bound, plain)
            .await
            .expect("task");
        eprintln!(
            "plain request after {:?}: {status} {answer}",
            killed.elapsed()
        );
        assert!(
            (500..600).contains(&status),
            "plain request: {status} {answer}"
        );
        let status = s
            .wait_exit(Duration::from_secs(15))
            .await
            .expect("the launcher exits after a shard died");
        eprintln!("launcher exited after {:?} with {status}", killed.elapsed());
        assert!(
            !status.success(),
            "a dead shard must fail the launcher ({status})"
        );
        assert!(killed.elapsed() < Duration::from_secs(15));
        wait_all_dead(&[shards[0], shards[1], router], Duration::from_secs(2)).await;
    })
    .await;
}
