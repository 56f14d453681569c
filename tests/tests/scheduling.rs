//! Memory-aware scheduling end to end: 64 concurrent greedy requests get exactly what they
//! get alone — with prefix caching on and off, with a KV pool so small that requests are
//! preempted, with prompts long enough to be prefilled in chunks, and with speculative
//! decoding.

use std::time::Duration;

use futures::future::join_all;
use serde_json::{Value, json};
use tessera_e2e::{Server, detail_ids, within};

const TEST_LIMIT: Duration = Duration::from_secs(300);
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at",
    "from", "his", "her", "an", "were", "which",
];

/// 64 prompts sharing a long prefix in groups (prefix-cache hits), of 10 to ~120 tokens.
fn prompts() -> Vec<String> {
    let system: Vec<String> = (0..4)
        .map(|g| {
            (0..40)
                .map(|j| WORDS[(g * 5 + j * 3) % WORDS.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    (0..64)
        .map(|i| {
            let tail: Vec<&str> = (0..5 + (i * 13) % 50)
                .map(|j| WORDS[(i * 7 + j * 3) % WORDS.len()])
                .collect();
            if i % 2 == 0 {
                format!("{} {}", system[i % 4], tail.join(" "))
            } else {
                tail.join(" ")
            }
        })
        .collect()
}

fn body(prompt: &str) -> Value {
    json!({"inputs": prompt, "parameters": {"max_new_tokens": 24, "details": true, "ignore_eos": true}})
}

async fn generate(server: &Server, prompt: &str) -> Vec<u64> {
    let (status, v) = server.post("/generate", &body(prompt)).await;
    assert_eq!(status, 200, "{v}");
    detail_ids(&v)
}

/// Every prompt alone, then all at once; the outputs must be identical.
async fn alone_vs_together(server: &Server, prompts: &[String]) -> Vec<Vec<u64>> {
    let mut alone = Vec::new();
    for p in prompts {
        alone.push(generate(server, p).await);
    }
    let together = join_all(prompts.iter().map(|p| generate(server, p))).await;
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(
            a, t,
            "prompt {i}: concurrent output differs from the output alone"
        );
    }
    let (ok, _) = (
        server
            .wait_metric("tessera_kv_blocks_used", Duration::from_secs(5), |v| {
                v == 0.0
            })
            .await
            .1,
        (),
    );
    assert!(ok, "KV blocks were not all released");
    alone
}

#[tokio::test]
async fn concurrent_outputs_equal_alone_under_every_scheduling_mode() {
    within("scheduling", TEST_LIMIT, async {
        let prompts = prompts();
        // Reference: roomy pool, no prefix caching, prefill in one piece.
        let reference = {
            let server = Server::start(
                "tiny-llama",
                &[
                    "--kv-cache-memory",
                    "64M",
                    "--prefix-caching",
                    "false",
                    "--max-batch-prefill-tokens",
                    "512",
                ],
            )
            .await;
            alone_vs_together(&server, &prompts).await
        };

        // Prefix caching on, prompts chunked by a 32-token step budget.
        let server = Server::start(
            "tiny-llama",
            &[
                "--kv-cache-memory",
                "64M",
                "--max-batch-prefill-tokens",
                "32",
            ],
        )
        .await;
        assert_eq!(
            alone_vs_together(&server, &prompts).await,
            reference,
            "prefix caching + chunking"
        );
        assert!(
            server.metric("tessera_prefix_cache_hit_tokens_total").await > 0.0,
            "no prefix-cache hit"
        );
        drop(server);

        // A pool of ~25 blocks (400 tokens) for 64 requests of up to ~150 tokens: preemption.
        let server = Server::start(
            "tiny-llama",
            &[
                "--kv-cache-memory",
                "300K",
                "--max-batch-prefill-tokens",
                "48",
                "--max-total-tokens",
                "200",
                "--max-input-tokens",
                "170",
            ],
        )
        .await;
        assert_eq!(
            alone_vs_together(&server, &prompts).await,
            reference,
            "tiny pool"
        );
        assert!(
            server.metric("tessera_preemptions_total").await > 0.0,
            "no preemption happened"
        );
        drop(server);

        // Speculative decoding with n-gram proposals, on a small pool too.
        let server = Server::start(
            "tiny-llama",
            &[
                "--kv-cache-memory",
                "400K",
                "--speculate",
                "3",
                "--max-batch-prefill-tokens",
                "64",
            ],
        )
        .await;
        assert_eq!(
            alone_vs_together(&server, &prompts).await,
            reference,
            "speculation"
        );
        assert!(
            server
                .metric("tessera_speculative_proposed_tokens_total")
                .await
                > 0.0
        );
    })
    .await;
}
