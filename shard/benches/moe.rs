//! Decode throughput of a sparse mixture-of-experts model next to a dense model with the same
//! active parameters, and the bandwidth bound of the bytes each reads per token.
//!
//! Run with `cargo bench -p tessera-shard --bench moe`. Both models are random, in memory,
//! every matrix `Q8_0` (as a `Q8_0` GGUF would load): 4 layers, hidden 1024, 16 query heads
//! over 4 KV heads of 64, vocabulary 4096. The MoE model has 8 experts of width 1024 per
//! layer, 2 per token; the dense one an MLP of width 2048 (the same parameters per token).
//! Decode runs at batch 1 and 16 after prompts of 64 tokens; the median of
//! `TESSERA_BENCH_REPS` (default 3) repetitions of 16 steps is reported, with the weight
//! bytes a batch-1 token reads (attention, router, the picked experts or the MLP, LM head)
//! and the read bandwidth measured on this machine divided by them.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use half::f16;
use tessera_kernels::cpu::WeightFormat;
use tessera_kernels::quant::{QuantFormat, dequantize};
use tessera_model_files::{
    FormatError, HostTensor, ModelConfig, ModelFiles, NativeTensor, WeightSource,
};
use tessera_shard::Model;

#[path = "../../kernels/benches/machine.rs"]
mod machine;
mod support;

use support::{decode, prefill, tokens};

const BLOCK: usize = 16;
const CTX: usize = 64;
const STEPS: usize = 16;
const HIDDEN: usize = 1024;
const LAYERS: usize = 4;
const VOCAB: usize = 4096;
const EXPERTS: usize = 8;
const TOP_K: usize = 2;
const EXPERT_WIDTH: usize = 1024;

/// Random `Q8_0` matrices and f32 norms, made on demand from each name.
struct Synthetic {
    shapes: HashMap<String, Vec<usize>>,
}

impl Synthetic {
    fn new(config: &ModelConfig) -> Self {
        let (h, hd) = (config.hidden_size, config.head_dim);
        let (q, kv) = (config.num_heads * hd, config.num_kv_heads * hd);
        let mut shapes: HashMap<String, Vec<usize>> = HashMap::new();
        let mut put = |name: String, shape: &[usize]| {
            shapes.insert(name, shape.to_vec());
        };
        put("model.embed_tokens.weight".into(), &[config.vocab_size, h]);
        put("lm_head.weight".into(), &[config.vocab_size, h]);
        put("model.norm.weight".into(), &[h]);
        for i in 0..config.num_layers {
            let p = format!("model.layers.{i}");
            for (n, s) in [
                ("input_layernorm", vec![h]),
                ("post_attention_layernorm", vec![h]),
                ("self_attn.q_proj", vec![q, h]),
                ("self_attn.k_proj", vec![kv, h]),
                ("self_attn.v_proj", vec![kv, h]),
                ("self_attn.o_proj", vec![h, q]),
                ("self_attn.q_norm", vec![hd]),
                ("self_attn.k_norm", vec![hd]),
            ] {
                put(format!("{p}.{n}.weight"), &s);
            }
            match config.family.moe {
                Some(m) => {
                    put(format!("{p}.mlp.gate.weight"), &[m.experts, h]);
                    for e in 0..m.experts {
                        let x = format!("{p}.mlp.experts.{e}");
                        let w = m.expert_intermediate;
                        put(format!("{x}.gate_proj.weight"), &[w, h]);
                        put(format!("{x}.up_proj.weight"), &[w, h]);
                        put(format!("{x}.down_proj.weight"), &[h, w]);
                    }
                }
                None => {
                    let w = config.intermediate_size;
                    put(format!("{p}.mlp.gate_proj.weight"), &[w, h]);
                    put(format!("{p}.mlp.up_proj.weight"), &[w, h]);
                    put(format!("{p}.mlp.down_proj.weight"), &[h, w]);
                }
            }
        }
        Self { shapes }
    }

    fn get(&self, name: &str) -> Result<&Vec<usize>, FormatError> {
        self.shapes
            .get(name)
            .ok_or_else(|| FormatError::tensor("synthetic", name, "not in the model"))
    }

    /// `rows` rows of `cols` values as `Q8_0` blocks, from a generator seeded by `name`.
    fn blocks(name: &str, rows: usize, cols: usize) -> Vec<u8> {
        let mut seed = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        let mut bytes = Vec::with_capacity(rows * cols / 32 * 34);
        for _ in 0..rows * cols / 32 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            bytes.extend(f16::from_f32(0.002).to_le_bytes());
            bytes.extend((0..32u64).map(|j| (seed >> (j % 56)) as u8));
        }
        bytes
    }
}

impl WeightSource for Synthetic {
    fn contains(&self, name: &str) -> bool {
        self.shapes.contains_key(name)
    }

    fn shape(&self, name: &str) -> Result<Vec<usize>, FormatError> {
        self.get(name).cloned()
    }

    fn load_f32(&self, name: &str) -> Result<HostTensor, FormatError> {
        let shape = self.get(name)?.clone();
        let data = match shape.as_slice() {
            &[rows, cols] => {
                let mut data = vec![0f32; rows * cols];
                dequantize(
                    QuantFormat::Q8_0,
                    &Self::blocks(name, rows, cols),
                    &mut data,
                )
                .map_err(|e| FormatError::tensor("synthetic", name, e.to_string()))?;
                data
            }
            _ => vec![1.0; shape.iter().product()],
        };
        Ok(HostTensor { shape, data })
    }

    fn load_native(&self, name: &str) -> Result<Option<NativeTensor>, FormatError> {
        match self.get(name)?.as_slice() {
            &[rows, _] => self.load_native_slice(name, 0, 0..rows),
            _ => Ok(None),
        }
    }

    fn load_native_slice(
        &self,
        name: &str,
        dim: usize,
        range: Range<usize>,
    ) -> Result<Option<NativeTensor>, FormatError> {
        let &[rows, cols] = self.get(name)?.as_slice() else {
            return Ok(None);
        };
        if dim != 0 {
            return Ok(None);
        }
        let row_bytes = cols / 32 * 34;
        let bytes =
            Self::blocks(name, rows, cols)[range.start * row_bytes..range.end * row_bytes].to_vec();
        Ok(Some(NativeTensor {
            format: WeightFormat::Q8_0,
            shape: [range.len(), cols],
            bytes,
        }))
    }
}

fn config(moe: bool) -> ModelConfig {
    let mlp = match moe {
        true => format!(
            r#""architectures":["Qwen3MoeForCausalLM"],"num_experts":{EXPERTS},
            "num_experts_per_tok":{TOP_K},"moe_intermediate_size":{EXPERT_WIDTH},
            "norm_topk_prob":true,"intermediate_size":{}"#,
            TOP_K * EXPERT_WIDTH
        ),
        false => format!(
            r#""architectures":["Qwen3ForCausalLM"],"intermediate_size":{}"#,
            TOP_K * EXPERT_WIDTH
        ),
    };
    let json = format!(
        r#"{{{mlp},"vocab_size":{VOCAB},"hidden_size":{HIDDEN},"num_hidden_layers":{LAYERS},
        "num_attention_heads":16,"num_key_value_heads":4,"head_dim":64,"rms_norm_eps":1e-6,
        "max_position_embeddings":4096,"tie_word_embeddings":false}}"#
    );
    ModelConfig::from_hf_json(&json)
        .expect("valid config")
        .expect("supported architecture")
}

/// Weight bytes a batch-1 decode token reads: attention, router, `TOP_K` experts (or the
/// dense MLP), the LM head and one embedding row, all `Q8_0` (34 bytes per 32 values).
fn bytes_per_token(moe: bool) -> f64 {
    let (h, q, kv) = (HIDDEN, 16 * 64, 4 * 64);
    let attention = h * q * 2 + h * kv * 2;
    let mlp = match moe {
        true => EXPERTS * h + TOP_K * 3 * h * EXPERT_WIDTH,
        false => 3 * h * TOP_K * EXPERT_WIDTH,
    };
    let values = LAYERS * (attention + mlp) + VOCAB * h + h;
    values as f64 * 34.0 / 32.0
}

fn main() {
    let reps: usize = std::env::var("TESSERA_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let limits = machine::Limits::measure();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny-qwen3-moe");
    let mut lines = Vec::new();
    for moe in [true, false] {
        let mut files = ModelFiles::open(&fixture).expect("fixture");
        files.config = config(moe);
        files.weights = Arc::new(Synthetic::new(&files.config));
        let model = Model::load(&files).expect("load");
        let what = if moe {
            "MoE 8x top-2"
        } else {
            "dense, same active"
        };
        let bytes = bytes_per_token(moe);
        let bound = limits.bandwidth.all / bytes;
        for batch in [1usize, 16] {
            let per_seq = (CTX + STEPS * (reps + 1)).div_ceil(BLOCK);
            let mut cache = model.new_cache(batch * per_seq, BLOCK).expect("cache");
            let tables: Vec<Vec<u32>> = (0..batch)
                .map(|b| ((b * per_seq) as u32..((b + 1) * per_seq) as u32).collect())
                .collect();
            let prompts: Vec<Vec<u32>> = (0..batch).map(|b| tokens(CTX, b, VOCAB)).collect();
            prefill(&model, &mut cache, &prompts, &tables);
            let mut times = Vec::new();
            for r in 0..=reps {
                let start = Instant::now();
                decode(&model, &mut cache, CTX + r * STEPS, STEPS, &tables);
                if r > 0 {
                    times.push(start.elapsed().as_secs_f64());
                }
            }
            times.sort_by(f64::total_cmp);
            let tps = (batch * STEPS) as f64 / times[times.len() / 2];
            let share = match batch {
                1 => format!(", batch 1 at {:.0}% of it", 100.0 * tps / bound),
                _ => String::new(),
            };
            lines.push(format!(
                "{what:<20} batch {batch:>2}: {tps:>8.1} tokens/s  ({:.1} MB/token at batch 1, \
                 bandwidth bound {bound:.0} tokens/s{share})",
                bytes / 1e6,
            ));
        }
    }
    println!(
        "read bandwidth {:.1} GB/s ({} threads)",
        limits.bandwidth.all / 1e9,
        rayon::current_num_threads()
    );
    for l in lines {
        println!("{l}");
    }
}
