//! Memory-aware scheduling end to end: 64 concurrent greedy requests get exactly what they
//! get alone — with prefix caching on and off, with a KV pool so small that requests are
//! preempted, with prompts long enough to be prefilled in chunks, and with speculative
//! decoding (n-gram chains, Medusa trees).

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
                .metric("tessera_speculative_proposed_tokens_total{speculator=\"ngram\"}")
                .await
                > 0.0
        );
        drop(server);

        // Medusa heads (zero blocks: each guesses the model's own next token) verified as
        // trees of 4 paths, on a small pool: the trees' lookahead is in the block accounting.
        let heads = tempfile::tempdir().expect("temp dir");
        write_zero_medusa_heads(heads.path(), 64, 3);
        let dir = heads.path().to_str().expect("utf-8 path");
        let server = Server::start(
            "tiny-llama",
            &[
                "--kv-cache-memory",
                "400K",
                "--speculator",
                "medusa",
                "--draft-model-id",
                dir,
                "--speculate",
                "3",
                "--speculative-tree-width",
                "4",
                "--max-batch-prefill-tokens",
                "64",
            ],
        )
        .await;
        assert_eq!(
            alone_vs_together(&server, &prompts).await,
            reference,
            "Medusa trees"
        );
        let accepted = server
            .metric("tessera_speculative_accepted_tokens_total{speculator=\"medusa\"}")
            .await;
        assert!(accepted > 0.0, "no Medusa candidate was accepted");
        let (status, v) = server.post("/generate", &body(&prompts[0])).await;
        assert_eq!(status, 200, "{v}");
        let steps = v["details"]["accepted_tokens_per_step"]
            .as_array()
            .unwrap_or_else(|| panic!("no accepted_tokens_per_step in {v}"));
        let produced: u64 = steps.iter().map(|a| a.as_u64().unwrap_or(0) + 1).sum();
        assert!(
            produced <= 24,
            "the steps produced more than the 24 tokens: {v}"
        );
    })
    .await;
}

/// Writes `heads` Medusa heads with zero residual blocks for a model of `hidden` wide states
/// (Medusa's layout, read through the model's own LM head) into `dir`.
fn write_zero_medusa_heads(dir: &std::path::Path, hidden: usize, heads: usize) {
    let mut header = serde_json::Map::new();
    let mut offset = 0;
    for k in 0..heads {
        for (name, shape) in [
            (format!("{k}.0.linear.weight"), vec![hidden, hidden]),
            (format!("{k}.0.linear.bias"), vec![hidden]),
        ] {
            let bytes = shape.iter().product::<usize>() * 4;
            header.insert(
                name,
                json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + bytes]}),
            );
            offset += bytes;
        }
    }
    let header = serde_json::to_vec(&header).expect("header");
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend(header);
    file.resize(file.len() + offset, 0);
    std::fs::write(dir.join("medusa_lm_head.safetensors"), file).expect("write heads");
    let config = json!({"medusa_num_heads": heads, "medusa_num_layers": 1});
    std::fs::write(dir.join("config.json"), config.to_string()).expect("write config");
}
