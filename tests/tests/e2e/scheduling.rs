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
        drop(server);

        // An EAGLE head growing trees 3 levels deep, 4 nodes a level, on the same small pool.
        let head = tempfile::tempdir().expect("temp dir");
        write_passthrough_eagle_head(head.path(), "tiny-llama");
        let dir = head.path().to_str().expect("utf-8 path");
        let server = Server::start(
            "tiny-llama",
            &[
                "--kv-cache-memory",
                "400K",
                "--speculator",
                "eagle",
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
            "EAGLE trees"
        );
        let accepted = server
            .metric("tessera_speculative_accepted_tokens_total{speculator=\"eagle\"}")
            .await;
        assert!(accepted > 0.0, "no EAGLE candidate was accepted");
    })
    .await;
}

/// Writes `heads` Medusa heads with zero residual blocks for a model of `hidden` wide states
/// (Medusa's layout, read through the model's own LM head) into `dir`.
fn write_zero_medusa_heads(dir: &std::path::Path, hidden: usize, heads: usize) {
    let tensors: Vec<(String, Vec<usize>, Vec<f32>)> = (0..heads)
        .flat_map(|k| {
            [
                (format!("{k}.0.linear.weight"), vec![hidden, hidden]),
                (format!("{k}.0.linear.bias"), vec![hidden]),
            ]
        })
        .map(|(name, shape)| {
            let zeros = vec![0.0; shape.iter().product()];
            (name, shape, zeros)
        })
        .collect();
    write_safetensors(&dir.join("medusa_lm_head.safetensors"), &tensors);
    let config = json!({"medusa_num_heads": heads, "medusa_num_layers": 1});
    std::fs::write(dir.join("config.json"), config.to_string()).expect("write config");
}

/// Writes an EAGLE head for the fixture `model` into `dir` whose layer adds nothing and whose
/// `fc` passes the model's state through: it guesses that the token after next is the model's
/// guess for the next one (often right on a tiny model).
fn write_passthrough_eagle_head(dir: &std::path::Path, model: &str) {
    let config_path = tessera_e2e::fixture(model).join("config.json");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(config_path).expect("config")).expect("json");
    let n = |key: &str| config[key].as_u64().expect("a size") as usize;
    let (h, inter) = (n("hidden_size"), n("intermediate_size"));
    let (q, kv) = (
        n("num_attention_heads") * n("head_dim"),
        n("num_key_value_heads") * n("head_dim"),
    );
    let mut fc = vec![0f32; h * 2 * h];
    (0..h).for_each(|i| fc[i * 2 * h + h + i] = 1.0);
    let zeros = |rows: usize, cols: usize| vec![0f32; rows * cols];
    let layer = |name: &str| format!("layers.0.{name}");
    let tensors = vec![
        ("fc.weight".to_string(), vec![h, 2 * h], fc),
        (layer("self_attn.q_proj.weight"), vec![q, h], zeros(q, h)),
        (layer("self_attn.k_proj.weight"), vec![kv, h], zeros(kv, h)),
        (layer("self_attn.v_proj.weight"), vec![kv, h], zeros(kv, h)),
        (layer("self_attn.o_proj.weight"), vec![h, q], zeros(h, q)),
        (
            layer("post_attention_layernorm.weight"),
            vec![h],
            vec![1.0; h],
        ),
        (
            layer("mlp.gate_proj.weight"),
            vec![inter, h],
            zeros(inter, h),
        ),
        (layer("mlp.up_proj.weight"), vec![inter, h], zeros(inter, h)),
        (
            layer("mlp.down_proj.weight"),
            vec![h, inter],
            zeros(h, inter),
        ),
    ];
    write_safetensors(&dir.join("model.safetensors"), &tensors);
    let head = json!({
        "hidden_size": h,
        "intermediate_size": inter,
        "num_attention_heads": n("num_attention_heads"),
        "num_key_value_heads": n("num_key_value_heads"),
        "head_dim": n("head_dim"),
        "num_hidden_layers": 1,
    });
    std::fs::write(dir.join("config.json"), head.to_string()).expect("write config");
}

/// Writes f32 `tensors` (name, shape, values) as a safetensors file.
fn write_safetensors(path: &std::path::Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, shape, values) in tensors {
        let start = data.len();
        data.extend(values.iter().flat_map(|x| x.to_le_bytes()));
        header.insert(
            name.clone(),
            json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let header = serde_json::to_vec(&header).expect("header");
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend(header);
    file.extend(data);
    std::fs::write(path, file).expect("write safetensors");
}
