//! End-to-end engine throughput on the GPU (feature `cuda`), in bf16 through the CUDA backend:
//! `cargo bench -p tessera-shard --features cuda --bench gpu`.
//!
//! Models (`TESSERA_GPU_BENCH_MODELS`, default `smollm2,llama-1b`):
//! - `smollm2`: SmolLM2-135M-Instruct from the Q4_1 GGUF (`scripts/fetch_smollm2.sh`),
//!   dequantized to bf16; where the GGUF is missing (a GPU machine without network), a model
//!   of the same shapes with random bf16 weights;
//! - `llama-1b`: Llama-3.2-1B's shapes (16 layers, hidden 2048, 32/8 heads of 64, vocabulary
//!   128256), random bf16 weights: a size where the GPU, not the launches, sets the pace.
//!
//! Random weights are written as a Hugging Face directory (config + safetensors) under the
//! system's temporary folder and loaded like any model; speed does not depend on the values.
//! Times (median of `TESSERA_BENCH_REPS`, default 5, after one warm-up) prefill of one
//! 512-token prompt and of 8 at once, and greedy decode at batch 1, 16 and 64 after 128-token
//! prompts (logits copied back to the host and sampled there, as the server does); then the
//! prefills again with the tensor-core attention kernel (`TESSERA_TC_ATTENTION`). Without a
//! GPU it says why and exits 0, unless `TESSERA_REQUIRE_GPU=1`. `TESSERA_GPU_BENCH_DEVICE=cpu`
//! runs the same passes on the CPU backend (to check the bench itself on a machine without a
//! GPU; with `TESSERA_GPU_BENCH_MODELS=smollm2` it takes about a minute).

use std::path::{Path, PathBuf};
use std::time::Instant;

use safetensors::{Dtype, tensor::TensorView};

use tessera_model_files::ModelFiles;
use tessera_shard::{CudaOptions, KvDtype, Model, WeightLayout};

mod support;

use support::{decode, prefill, tokens};

const GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const BLOCK: usize = 16;
const CTX: usize = 128;
const SEQ_CAPACITY: usize = 1024;
const MAX_BATCH: usize = 64;

fn skip(why: &str) -> ! {
    let required = std::env::var("TESSERA_REQUIRE_GPU").is_ok_and(|v| v == "1");
    eprintln!("skipping the GPU engine benchmark: {why}");
    std::process::exit(if required { 1 } else { 0 });
}

fn median(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut v: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A Llama-family shape to synthesize.
struct Shape {
    name: &'static str,
    hidden: usize,
    intermediate: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
    rope_theta: f64,
}

const SMOLLM2: Shape = Shape {
    name: "SmolLM2-135M-shaped",
    hidden: 576,
    intermediate: 1536,
    layers: 30,
    heads: 9,
    kv_heads: 3,
    head_dim: 64,
    vocab: 49152,
    rope_theta: 100_000.0,
};

const LLAMA_1B: Shape = Shape {
    name: "Llama-3.2-1B-shaped",
    hidden: 2048,
    intermediate: 8192,
    layers: 16,
    heads: 32,
    kv_heads: 8,
    head_dim: 64,
    vocab: 128_256,
    rope_theta: 500_000.0,
};

/// Writes `shape` with random bf16 weights (tied embedding) as a Hugging Face directory.
fn synthesize(shape: &Shape, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "dtype": "bfloat16",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": shape.rope_theta,
        "tie_word_embeddings": true,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
    });
    std::fs::write(dir.join("config.json"), config.to_string())?;
    let (h, kv) = (shape.hidden, shape.kv_heads * shape.head_dim);
    let mut tensors: Vec<(String, Vec<usize>, bool)> = vec![(
        "model.embed_tokens.weight".into(),
        vec![shape.vocab, h],
        false,
    )];
    for l in 0..shape.layers {
        let p = format!("model.layers.{l}");
        let q = shape.heads * shape.head_dim;
        tensors.extend([
            (format!("{p}.input_layernorm.weight"), vec![h], true),
            (
                format!("{p}.post_attention_layernorm.weight"),
                vec![h],
                true,
            ),
            (format!("{p}.self_attn.q_proj.weight"), vec![q, h], false),
            (format!("{p}.self_attn.k_proj.weight"), vec![kv, h], false),
            (format!("{p}.self_attn.v_proj.weight"), vec![kv, h], false),
            (format!("{p}.self_attn.o_proj.weight"), vec![h, q], false),
            (
                format!("{p}.mlp.gate_proj.weight"),
                vec![shape.intermediate, h],
                false,
            ),
            (
                format!("{p}.mlp.up_proj.weight"),
                vec![shape.intermediate, h],
                false,
            ),
            (
                format!("{p}.mlp.down_proj.weight"),
                vec![h, shape.intermediate],
                false,
            ),
        ]);
    }
    tensors.push(("model.norm.weight".into(), vec![h], true));
    // Uniform in ±0.04 (a std of about 0.023), norms at 1: activations stay well scaled.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, dims, is_norm)| {
            let n: usize = dims.iter().product();
            let mut out = Vec::with_capacity(2 * n);
            for _ in 0..n {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let v = if *is_norm {
                    1.0
                } else {
                    ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.08
                };
                out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes());
            }
            out
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, dims, _), b)| {
            let view = TensorView::new(Dtype::BF16, dims.clone(), b).expect("tensor shape");
            (name.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors"))
        .map_err(std::io::Error::other)
}

fn gguf() -> Option<PathBuf> {
    let dir = std::env::var_os("TESSERA_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tessera")));
    dir.map(|d| d.join(GGUF)).filter(|p| p.is_file())
}

/// The model files to benchmark as `name`, and how to call them.
fn model_files(name: &str, scratch: &Path) -> (String, ModelFiles) {
    let shape = match name {
        "smollm2" => {
            if let Some(path) = gguf() {
                let files = ModelFiles::open(&path).expect("opening the GGUF");
                return ("SmolLM2-135M-Instruct (Q4_1 GGUF as bf16)".into(), files);
            }
            &SMOLLM2
        }
        "llama-1b" => &LLAMA_1B,
        other => panic!("TESSERA_GPU_BENCH_MODELS: unknown model {other:?}; use smollm2, llama-1b"),
    };
    let dir = scratch.join(shape.name);
    let t = Instant::now();
    synthesize(shape, &dir).expect("writing the random model");
    println!(
        "wrote {} with random bf16 weights in {:.1} s",
        shape.name,
        t.elapsed().as_secs_f64()
    );
    (
        format!("{} (random bf16)", shape.name),
        ModelFiles::open(&dir).expect("opening the random model"),
    )
}

/// Times prefill and decode of the model in `files`; with `tensor_cores`, prefill only, with
/// the tensor-core attention kernel.
fn bench(title: &str, files: &ModelFiles, reps: usize, on_cpu: bool, tensor_cores: bool) {
    let t = Instant::now();
    let model = Model::load_with(files, WeightLayout::Exact)
        .expect("loading")
        .with_kv_dtype(KvDtype::Bfloat16);
    let model = if on_cpu {
        model
    } else {
        let options = CudaOptions {
            tensor_core_attention: tensor_cores,
            ..CudaOptions::default()
        };
        model
            .into_cuda(&options)
            .expect("moving the model to GPU 0")
    };
    let attention = if tensor_cores {
        ", tensor-core prefill attention"
    } else {
        ""
    };
    println!(
        "\n{title} on {}{attention}: loaded in {:.2} s",
        model.device(),
        t.elapsed().as_secs_f64()
    );
    let vocab = model.config().vocab_size;
    let per_seq = SEQ_CAPACITY / BLOCK;
    let mut cache = model
        .new_cache(MAX_BATCH * per_seq, BLOCK)
        .expect("KV cache");
    let tables: Vec<Vec<u32>> = (0..MAX_BATCH)
        .map(|b| (0..per_seq).map(|i| (b * per_seq + i) as u32).collect())
        .collect();

    println!("{:<40} {:>10} {:>12}", "benchmark", "ms", "tokens/s");
    for seqs in [1, 8] {
        let prompts: Vec<Vec<u32>> = (0..seqs).map(|s| tokens(512, s, vocab)).collect();
        let secs = median(reps, || {
            prefill(&model, &mut cache, &prompts, &tables[..seqs]);
        });
        println!(
            "{:<40} {:>10.2} {:>12.0}",
            format!("prefill {seqs} x 512"),
            secs * 1e3,
            (seqs * 512) as f64 / secs
        );
    }
    if tensor_cores {
        return;
    }
    let prompts: Vec<Vec<u32>> = (0..MAX_BATCH).map(|s| tokens(CTX, s, vocab)).collect();
    prefill(&model, &mut cache, &prompts, &tables);
    let steps = 32;
    for batch in [1, 16, 64] {
        let secs = median(reps, || {
            decode(&model, &mut cache, CTX, steps, &tables[..batch])
        });
        println!(
            "{:<40} {:>10.2} {:>12.0}",
            format!("decode batch {batch} ({steps} steps, ms/step)"),
            secs * 1e3 / steps as f64,
            (batch * steps) as f64 / secs
        );
    }
}

fn main() {
    let reps: usize = std::env::var("TESSERA_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let on_cpu = std::env::var("TESSERA_GPU_BENCH_DEVICE").is_ok_and(|d| d == "cpu");
    if !on_cpu && let Err(e) = tessera_kernels::cuda::GpuDevice::open(0) {
        skip(&e.to_string());
    }
    let scratch = std::env::temp_dir().join("tessera-gpu-bench");
    let names =
        std::env::var("TESSERA_GPU_BENCH_MODELS").unwrap_or_else(|_| "smollm2,llama-1b".into());
    for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let (title, files) = model_files(name, &scratch);
        bench(&title, &files, reps, on_cpu, false);
        if !on_cpu {
            bench(&title, &files, reps, on_cpu, true);
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
}
