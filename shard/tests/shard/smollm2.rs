//! The engine reproduces transformers' greedy tokens on the real SmolLM2-135M-Instruct Q4_1 GGUF.
//!
//! The GGUF is not committed (`scripts/fetch_smollm2.sh` puts it in
//! `${TESSERA_CACHE:-~/.cache/tessera}`): without it the test prints why and passes, unless
//! `TESSERA_REQUIRE_SMOLLM2=1` asks for it to fail instead.

use crate::common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use common::{Schedule, repo_root, run, smollm2_gguf};
use half::f16;
use serde::Deserialize;
use tessera_kernels::cpu::WeightFormat;
use tessera_kernels::quant::{
    BlockIQ4NL, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ6K, KVALUES_IQ4NL,
    QK_K, dequantize_row_q4_1, dequantize_row_q4_k, dequantize_row_q6_k,
};
use tessera_model_files::{FormatError, HostTensor, ModelFiles, NativeTensor, WeightSource};
use tessera_shard::{HiddenStates, KvDtype, LogitsWanted, Model, SequenceChunk, WeightLayout};

#[derive(Deserialize)]
struct Golden {
    prompts: Vec<Prompt>,
    chat: Chat,
}

#[derive(Deserialize)]
struct Prompt {
    text: String,
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
}

#[derive(Deserialize)]
struct Chat {
    prompt_ids: Vec<u32>,
    /// Up to and including the first EOS.
    greedy_ids: Vec<u32>,
    greedy_text: String,
}

/// With both KV-cache element types: `--dtype auto` picks bfloat16 for this Q4_1 model.
#[test]
fn greedy_tokens_match_transformers() {
    let Some(path) = smollm2_gguf() else { return };
    let files = ModelFiles::open(&path).unwrap();
    assert_eq!(KvDtype::auto(&files), KvDtype::Bfloat16);
    // Exact f32 arithmetic on the dequantized weights, as transformers computed the goldens
    // (the default int8 products are compared with it below).
    let mut model = Model::load_with(&files, WeightLayout::Exact).unwrap();
    for kv_dtype in [KvDtype::Float32, KvDtype::Bfloat16] {
        model = model.with_kv_dtype(kv_dtype);
        greedy_tokens_match(&files, &model, kv_dtype);
    }
}

/// On a GPU (feature `cuda`): f32 reproduces transformers' greedy tokens like the CPU; bf16
/// (everything rounded to bf16, as PyTorch runs a bf16 model) must still answer the chat
/// prompt with Paris, and its first divergence from the goldens is printed.
#[cfg(feature = "cuda")]
#[test]
fn greedy_tokens_on_the_gpu() {
    let Some(path) = smollm2_gguf() else { return };
    let files = ModelFiles::open(&path).unwrap();
    let load = |dtype| {
        let model = Model::load_with(&files, WeightLayout::Exact)
            .unwrap()
            .with_kv_dtype(dtype);
        common::on_gpu(model)
    };
    let Some(f32_model) = load(KvDtype::Float32) else {
        return;
    };
    greedy_tokens_match(&files, &f32_model, KvDtype::Float32);
    drop(f32_model);
    let Some(bf16_model) = load(KvDtype::Bfloat16) else {
        return;
    };
    let golden = golden();
    let outcomes = run(
        &bf16_model,
        std::slice::from_ref(&golden.chat.prompt_ids),
        48,
        64,
        Schedule::Together,
    );
    let tokens = &outcomes[0].tokens;
    let same = tokens
        .iter()
        .zip(&golden.chat.greedy_ids)
        .take_while(|(a, b)| a == b)
        .count();
    let text = files.tokenizer().unwrap().decode(tokens, true).unwrap();
    println!(
        "SmolLM2 bf16 on the GPU: first {same} of {} chat tokens agree with transformers; {text:?}",
        golden.chat.greedy_ids.len()
    );
    assert!(
        text.contains("Paris"),
        "bf16 chat answer {text:?} lacks Paris"
    );
}

fn golden() -> Golden {
    serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("fixtures/smollm2/golden.json")).unwrap(),
    )
    .unwrap()
}

fn greedy_tokens_match(files: &ModelFiles, model: &Model, kv_dtype: KvDtype) {
    let golden = golden();

    // Every prompt and the chat prompt in one batched run (the driver ignores EOS).
    let mut prompts: Vec<Vec<u32>> = golden
        .prompts
        .iter()
        .map(|p| p.prompt_ids.clone())
        .collect();
    prompts.push(golden.chat.prompt_ids.clone());
    let steps = golden
        .prompts
        .iter()
        .map(|p| p.greedy_ids.len())
        .chain([golden.chat.greedy_ids.len()])
        .max()
        .unwrap();
    let outcomes = run(model, &prompts, steps, 64, Schedule::Together);

    for (p, o) in golden.prompts.iter().zip(&outcomes) {
        assert_eq!(
            &o.tokens[..p.greedy_ids.len()],
            &p.greedy_ids[..],
            "{kv_dtype:?} KV {:?}: greedy tokens differ from transformers'",
            p.text
        );
    }

    let chat = &outcomes[golden.prompts.len()];
    let n = golden.chat.greedy_ids.len();
    assert_eq!(
        &chat.tokens[..n],
        &golden.chat.greedy_ids[..],
        "{kv_dtype:?} KV chat: greedy tokens differ from transformers'"
    );
    let text = files
        .tokenizer()
        .unwrap()
        .decode(&chat.tokens[..n], true)
        .unwrap();
    assert_eq!(text, golden.chat.greedy_text);
    assert!(text.contains("Paris"), "chat answer {text:?} lacks Paris");
}

/// Speculative decoding on the real model gives transformers' greedy tokens too: n-gram
/// proposals at two depths, and the model drafting for itself (every proposal right).
#[test]
fn speculative_greedy_tokens_match_transformers() {
    use tessera_shard::Engine;
    use tessera_shard::sampling::SamplingParams;
    use tessera_shard::speculative::{DraftModel, Proposer, Speculation, Speculator};

    let Some(path) = smollm2_gguf() else { return };
    let files = ModelFiles::open(&path).unwrap();
    let golden = golden();
    let prompts: Vec<Vec<u32>> = golden
        .prompts
        .iter()
        .map(|p| p.prompt_ids.clone())
        .collect();
    let params = vec![SamplingParams::default(); prompts.len()];
    // The KV-cache element type the server picks for this model (`--dtype auto`).
    let kv_dtype = KvDtype::auto(&files);
    let load = || {
        Model::load_with(&files, WeightLayout::Exact)
            .unwrap()
            .with_kv_dtype(kv_dtype)
    };
    for (speculator, depth) in [
        (Speculator::Ngram, 2),
        (Speculator::Ngram, 5),
        (Speculator::Draft, 3),
    ] {
        let model = load();
        let proposer = match speculator {
            Speculator::Draft => Proposer::Draft(DraftModel::new(load(), &model).unwrap()),
            _ => Proposer::Ngram,
        };
        let mut engine = Engine::new(model, 1 + 16 * 64, 16)
            .unwrap()
            .with_speculation(Speculation::new(depth, proposer))
            .unwrap();
        let (out, (proposed, accepted)) = common::generate(&mut engine, &prompts, &params, 32);
        for (p, o) in golden.prompts.iter().zip(&out) {
            assert_eq!(
                o, &p.greedy_ids,
                "{speculator:?} depth {depth}: {:?}",
                p.text
            );
        }
        assert!(proposed > 0, "{speculator:?}: nothing proposed");
        if speculator == Speculator::Draft {
            assert_eq!(
                accepted, proposed,
                "the model drafting for itself is always right"
            );
        }
    }
}

/// The default int8 products (activations as two 8-bit digits per value) against exact f32
/// on the same Q4_1 weights, teacher-forced along transformers' greedy continuations: at
/// every position both pick the same token unless exact f32 itself has a near tie (top-2
/// margin under 0.05), and the logits stay within hundredths. Prints the first divergence
/// of free-running greedy decoding, if any.
#[test]
fn int8_products_agree_with_exact_f32() {
    let Some(path) = smollm2_gguf() else { return };
    // Most of SmolLM2's bytes are Q4_1 blocks (the tied embedding is Q8_0).
    let [exact, int8] = int8_agrees_with_exact(&ModelFiles::open(&path).unwrap(), "Q4_1", "Q4_1");
    print_greedy_divergence(&exact, &int8, "Q4_1");
}

/// llama.cpp's K-quant files keep the rows that are not a multiple of 256 (all of SmolLM2's)
/// in `Q5_0` or `Q5_1` (its `IQ4_XS` files in `IQ4_NL`), and give v another format than q and
/// k. The GGUF's `Q4_1` matrices
/// handed to the loader as `Q5_1` blocks (the same scales, minimums and quants, high bits 0)
/// give the `Q4_1` model's logits bit for bit: all of them, or only v (each fused q/k/v
/// projection then a stack of two formats, still native); requantized to `Q5_0` (every quant
/// bit used), `Q4_0` or `IQ4_NL`, int8 products agree with exact f32 as they do for `Q4_1`.
#[test]
fn other_block_formats_and_mixes_run_end_to_end() {
    let Some(path) = smollm2_gguf() else { return };
    let files = ModelFiles::open(&path).unwrap();
    let every = |_: &str| true;
    let as_q5_1 = reencoded(&path, every, WeightFormat::Q5_1, q4_1_as_q5_1);
    let v_as_q5_1 = reencoded(
        &path,
        |n| n.contains("v_proj"),
        WeightFormat::Q5_1,
        q4_1_as_q5_1,
    );
    let golden = golden();
    let tokens = [&golden.chat.prompt_ids[..], &golden.chat.greedy_ids[..]].concat();
    for layout in [WeightLayout::Int8, WeightLayout::Exact] {
        let q4 = all_logits(&Model::load_with(&files, layout).unwrap(), &tokens);
        for (files, dtype) in [(&as_q5_1, "Q5_1"), (&v_as_q5_1, "Q4_1")] {
            // A fused projection stacked as f32 would make most of the bytes f32.
            let model = Model::load_with(files, layout).unwrap();
            assert_eq!(model.weights_dtype(), dtype);
            assert!(
                all_logits(&model, &tokens) == q4,
                "{layout:?}, {dtype}: logits differ from the same values' Q4_1 logits"
            );
        }
    }
    let as_q5_0 = reencoded(&path, every, WeightFormat::Q5_0, q4_1_as_q5_0);
    int8_agrees_with_exact(&as_q5_0, "Q5_0", "Q5_0");
    let as_q4_0 = reencoded(&path, every, WeightFormat::Q4_0, q4_1_as_q4_0);
    int8_agrees_with_exact(&as_q4_0, "Q4_0", "Q4_0");
    let as_iq4_nl = reencoded(&path, every, WeightFormat::IQ4NL, q4_1_as_iq4_nl);
    int8_agrees_with_exact(&as_iq4_nl, "IQ4_NL", "IQ4_NL");
}

/// SmolLM2's `down_proj` rows (1536 values) are whole super-blocks of 256, so they can be
/// K-quants, as in llama.cpp's `Q4_K_M` files (`Q4_K`, and `Q6_K` in half the layers): the
/// loaded model then multiplies those through the K-quant kernels, which hold the file's
/// scales and apply them exactly. (The encoders' rounding is checked against the
/// dequantizers first.)
#[test]
fn k_quant_down_projections_run_end_to_end() {
    let Some(path) = smollm2_gguf() else { return };
    let down = |n: &str| n.contains("down_proj");
    for (format, encode, label) in [
        (
            WeightFormat::Q4K,
            q4_1_as_q4_k as fn(&[u8]) -> Vec<u8>,
            "Q4_1, down_proj Q4_K",
        ),
        (WeightFormat::Q6K, q4_1_as_q6_k, "Q4_1, down_proj Q6_K"),
    ] {
        int8_agrees_with_exact(&reencoded(&path, down, format, encode), "Q4_1", label);
    }
}

/// The GGUF with the `Q4_1` matrices whose names `which` accepts handed to the loader as
/// `format`, re-encoded by `encode`.
fn reencoded(
    path: &Path,
    which: fn(&str) -> bool,
    format: WeightFormat,
    encode: fn(&[u8]) -> Vec<u8>,
) -> ModelFiles {
    let mut files = ModelFiles::open(path).unwrap();
    files.weights = Arc::new(Reencoded {
        inner: files.weights.clone(),
        which,
        format,
        encode,
        encoded: Mutex::default(),
    });
    files
}

struct Reencoded {
    inner: Arc<dyn WeightSource>,
    which: fn(&str) -> bool,
    format: WeightFormat,
    encode: fn(&[u8]) -> Vec<u8>,
    /// Each matrix's bytes once encoded: the exact and the int8 model load the same files.
    encoded: Mutex<HashMap<String, Vec<u8>>>,
}

impl WeightSource for Reencoded {
    fn contains(&self, name: &str) -> bool {
        self.inner.contains(name)
    }

    fn shape(&self, name: &str) -> Result<Vec<usize>, FormatError> {
        self.inner.shape(name)
    }

    fn load_f32(&self, name: &str) -> Result<HostTensor, FormatError> {
        self.inner.load_f32(name)
    }

    fn load_native(&self, name: &str) -> Result<Option<NativeTensor>, FormatError> {
        Ok(self.inner.load_native(name)?.map(|t| {
            if t.format == WeightFormat::Q4_1 && (self.which)(name) {
                let known = self.encoded.lock().unwrap().get(name).cloned();
                // Encoded outside the lock: the loader may ask for matrices side by side.
                let bytes = known.unwrap_or_else(|| {
                    let bytes = (self.encode)(&t.bytes);
                    let mut encoded = self.encoded.lock().unwrap();
                    encoded.insert(name.to_string(), bytes.clone());
                    bytes
                });
                NativeTensor {
                    format: self.format,
                    shape: t.shape,
                    bytes,
                }
            } else {
                t
            }
        }))
    }
}

fn q4_1_blocks(bytes: &[u8]) -> impl Iterator<Item = BlockQ4_1> + '_ {
    bytes
        .chunks_exact(size_of::<BlockQ4_1>())
        .map(bytemuck::pod_read_unaligned)
}

/// The same values: `Q4_1`'s quants are `Q5_1`'s with the high bit 0.
fn q4_1_as_q5_1(bytes: &[u8]) -> Vec<u8> {
    q4_1_blocks(bytes)
        .flat_map(|b| {
            let q5 = BlockQ5_1 {
                d: b.d,
                m: b.m,
                qh: [0; 4],
                qs: b.qs,
            };
            bytemuck::bytes_of(&q5).to_vec()
        })
        .collect()
}

/// The `Q4_1` values, `N` at a time (one block, or a row's eight for a K-quant super-block),
/// re-encoded by `encode`.
fn requantized<const N: usize>(bytes: &[u8], encode: impl Fn(&[f32; N]) -> Vec<u8>) -> Vec<u8> {
    let blocks: Vec<BlockQ4_1> = q4_1_blocks(bytes).collect();
    blocks
        .chunks_exact(N / 32)
        .flat_map(|b| {
            let mut x = [0f32; N];
            dequantize_row_q4_1(b, &mut x);
            encode(&x)
        })
        .collect()
}

/// The value of largest magnitude.
fn largest(x: &[f32]) -> f32 {
    x.iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m })
}

/// The values requantized as ggml's `quantize_row_q5_0_ref` does: `max` maps to -16.
fn q4_1_as_q5_0(bytes: &[u8]) -> Vec<u8> {
    requantized(bytes, |x: &[f32; 32]| {
        let max = largest(x);
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q: Vec<u8> = x
            .iter()
            .map(|&v| ((v * id + 16.5) as i8).min(31) as u8)
            .collect();
        let block = BlockQ5_0 {
            d: f16::from_f32(d),
            qh: q
                .iter()
                .enumerate()
                .fold(0u32, |h, (e, &v)| h | u32::from(v >> 4) << e)
                .to_le_bytes(),
            qs: std::array::from_fn(|j| (q[j] & 0x0F) | (q[j + 16] & 0x0F) << 4),
        };
        bytemuck::bytes_of(&block).to_vec()
    })
}

/// The values requantized as ggml's `quantize_row_q4_0_ref` does: `max` maps to -8.
fn q4_1_as_q4_0(bytes: &[u8]) -> Vec<u8> {
    requantized(bytes, |x: &[f32; 32]| {
        let max = largest(x);
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
        let block = BlockQ4_0 {
            d: f16::from_f32(d),
            qs: std::array::from_fn(|j| q(x[j]) | q(x[j + 16]) << 4),
        };
        bytemuck::bytes_of(&block).to_vec()
    })
}

/// The values requantized to `IQ4_NL`: `max` maps to the table's -127, every value to its
/// nearest table entry (ggml also searches nearby scales).
fn q4_1_as_iq4_nl(bytes: &[u8]) -> Vec<u8> {
    requantized(bytes, |x: &[f32; 32]| {
        let max = largest(x);
        let d = f16::from_f32(max / -127.0);
        let id = if d.to_f32() != 0.0 {
            1.0 / d.to_f32()
        } else {
            0.0
        };
        // The nearest table value (the lower on a tie): the table is sorted, so it is one of
        // the two around `v * id`.
        let index = |v: f32| {
            let t = v * id;
            let err = |i: usize| (f32::from(KVALUES_IQ4NL[i]) - t).abs();
            let above = KVALUES_IQ4NL
                .partition_point(|&k| f32::from(k) < t)
                .clamp(1, 15);
            (if err(above) < err(above - 1) {
                above
            } else {
                above - 1
            }) as u8
        };
        let block = BlockIQ4NL {
            d,
            qs: std::array::from_fn(|j| index(x[j]) | index(x[j + 16]) << 4),
        };
        bytemuck::bytes_of(&block).to_vec()
    })
}

/// Logits at every position of `tokens`, run as one prompt.
fn all_logits(model: &Model, tokens: &[u32]) -> Vec<Vec<f32>> {
    sequences_logits(model, &[tokens.to_vec()]).remove(0)
}

/// [`all_logits`] of each sequence, all in one pass (each sequence's logits do not depend on
/// the others in its pass).
fn sequences_logits(model: &Model, sequences: &[Vec<u32>]) -> Vec<Vec<Vec<f32>>> {
    let mut tables: Vec<Vec<u32>> = Vec::new();
    let mut next = 1u32; // block 0 stays unused, like the router's null block
    for seq in sequences {
        let n = seq.len().div_ceil(16) as u32;
        tables.push((next..next + n).collect());
        next += n;
    }
    let mut cache = model.new_cache(next as usize, 16).unwrap();
    let chunks: Vec<SequenceChunk<'_>> = sequences
        .iter()
        .zip(&tables)
        .map(|(tokens, blocks)| SequenceChunk {
            tokens,
            start_position: 0,
            block_table: blocks,
            logits: LogitsWanted::All,
            tree: None,
            prompt_len: tokens.len(),
        })
        .collect();
    let out = model
        .forward(&chunks, &mut cache, HiddenStates::None)
        .unwrap();
    sequences
        .iter()
        .enumerate()
        .map(|(s, tokens)| (0..tokens.len()).map(|i| out.row(s, i).to_vec()).collect())
        .collect()
}

/// See `int8_products_agree_with_exact_f32`; `dtype` is what both models report.
/// `label`: what the figures printed are of (the model's dominant format `dtype`, or which of its
/// matrices were re-encoded). Returns the exact and the int8 model.
fn int8_agrees_with_exact(files: &ModelFiles, dtype: &str, label: &str) -> [Model; 2] {
    let golden = golden();
    let exact = Model::load_with(files, WeightLayout::Exact).unwrap();
    let int8 = Model::load_with(files, WeightLayout::Int8).unwrap();
    assert_eq!(exact.weights_dtype(), dtype);
    assert_eq!(int8.weights_dtype(), dtype);
    let mut sequences: Vec<Vec<u32>> = golden
        .prompts
        .iter()
        .map(|p| [&p.prompt_ids[..], &p.greedy_ids[..]].concat())
        .collect();
    sequences.push([&golden.chat.prompt_ids[..], &golden.chat.greedy_ids[..]].concat());
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i)
            .unwrap()
    };
    let (mut worst, mut positions, mut ties) = (0f32, 0, 0);
    let (mut top_worst, mut sum_abs, mut count) = (0f32, 0f64, 0usize);
    let (e, q) = (
        sequences_logits(&exact, &sequences),
        sequences_logits(&int8, &sequences),
    );
    for (e, q) in e.iter().zip(&q) {
        for (le, lq) in e.iter().zip(q) {
            positions += 1;
            worst = worst.max(common::max_abs_diff(le, lq));
            let top = argmax(le);
            top_worst = top_worst.max((le[top] - lq[top]).abs());
            sum_abs += le
                .iter()
                .zip(lq)
                .map(|(a, b)| (a - b).abs() as f64)
                .sum::<f64>();
            count += le.len();
            let second = le
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != top)
                .map(|(_, v)| *v)
                .fold(f32::NEG_INFINITY, f32::max);
            if argmax(lq) != top {
                ties += 1;
                assert!(
                    le[top] - second < 0.05,
                    "int8 picks {} where exact f32 picks {top} by a margin of {}",
                    argmax(lq),
                    le[top] - second
                );
            }
        }
    }
    eprintln!(
        "mean |Δlogit| {:.4}, max |Δ| of exact's top logit {top_worst:.4}",
        sum_abs / count as f64
    );
    eprintln!(
        "{label}: int8 vs exact f32, teacher-forced over {positions} positions: max |Δlogit| \
         {worst:.4}, {ties} argmax differences (all at near ties)"
    );
    // Two-digit activations move logits by a fraction of one; activations of one digit, or a
    // broken kernel, move them by whole units.
    assert!(
        worst < 0.5,
        "int8 logits differ from exact f32 by up to {worst}"
    );
    assert!(
        sum_abs / (count as f64) < 0.03,
        "int8 logits differ from exact f32 by {} on average",
        sum_abs / count as f64
    );
    [exact, int8]
}

/// Free-running greedy decoding of the golden prompts by `exact` and `int8`: prints where the
/// two first part ways (a diagnostic; nothing is asserted).
fn print_greedy_divergence(exact: &Model, int8: &Model, dtype: &str) {
    let golden = golden();
    let prompts: Vec<Vec<u32>> = golden
        .prompts
        .iter()
        .map(|p| p.prompt_ids.clone())
        .collect();
    let a = run(exact, &prompts, 32, 64, Schedule::Together);
    let b = run(int8, &prompts, 32, 64, Schedule::Together);
    for ((p, x), y) in golden.prompts.iter().zip(&a).zip(&b) {
        match x.tokens.iter().zip(&y.tokens).position(|(s, t)| s != t) {
            None => eprintln!(
                "{dtype} {:?}: int8 and exact agree on 32 greedy tokens",
                p.text
            ),
            Some(i) => eprintln!(
                "{dtype} {:?}: first greedy divergence at token {i} (exact {}, int8 {})",
                p.text, x.tokens[i], y.tokens[i]
            ),
        }
    }
}

/// Every value `x[i]` decodes (`y[i]`) within `bound(i)`.
fn check_roundtrip(x: &[f32], y: &[f32], bound: impl Fn(usize) -> f32) {
    for (i, (a, b)) in x.iter().zip(y).enumerate() {
        assert!(
            (a - b).abs() <= bound(i) + 1e-6,
            "value {i}: {a} decoded as {b} (bound {})",
            bound(i)
        );
    }
}

/// `Q4_K`: per 32 values a 6-bit scale and minimum (`value = d · sc · q - dmin · m`), as ggml's
/// format lays them out; each sub-block spans its values' range.
fn q4_1_as_q4_k(bytes: &[u8]) -> Vec<u8> {
    requantized(bytes, |x: &[f32; QK_K]| {
        let sub = |j: usize| &x[32 * j..32 * (j + 1)];
        let lo: [f32; 8] = std::array::from_fn(|j| sub(j).iter().fold(0f32, |m, &v| m.min(v)));
        let hi: [f32; 8] = std::array::from_fn(|j| sub(j).iter().fold(lo[j], |m, &v| m.max(v)));
        let scale: [f32; 8] = std::array::from_fn(|j| (hi[j] - lo[j]) / 15.0);
        let d = f16::from_f32(scale.iter().fold(0f32, |m, &v| m.max(v)) / 63.0);
        let dmin = f16::from_f32(lo.iter().fold(0f32, |m, &v| m.max(-v)) / 63.0);
        // Rounded up: the scale then spans the sub-block, the minimum reaches its lowest value.
        let level = |v: f32, unit: f32| {
            if unit > 0.0 {
                ((v / unit).ceil() as u8).min(63)
            } else {
                0
            }
        };
        let sc: [u8; 8] = std::array::from_fn(|j| level(scale[j], d.to_f32()).max(1));
        let mn: [u8; 8] = std::array::from_fn(|j| level(-lo[j], dmin.to_f32()));
        let mut scales = [0u8; 12];
        for j in 0..4 {
            scales[j] = sc[j] | (sc[j + 4] >> 4) << 6;
            scales[j + 4] = mn[j] | (mn[j + 4] >> 4) << 6;
            scales[j + 8] = (sc[j + 4] & 0xF) | (mn[j + 4] & 0xF) << 4;
        }
        let q: Vec<u8> = (0..QK_K)
            .map(|i| {
                let j = i / 32;
                let unit = d.to_f32() * f32::from(sc[j]);
                let m = dmin.to_f32() * f32::from(mn[j]);
                if unit > 0.0 {
                    ((x[i] + m) / unit).round().clamp(0.0, 15.0) as u8
                } else {
                    0
                }
            })
            .collect();
        let block = BlockQ4K {
            d,
            dmin,
            scales,
            qs: std::array::from_fn(|b| {
                let (c, l) = (b / 32, b % 32);
                q[64 * c + l] | q[64 * c + 32 + l] << 4
            }),
        };
        let mut y = [0f32; QK_K];
        dequantize_row_q4_k(std::slice::from_ref(&block), &mut y);
        let unit = |i: usize| d.to_f32() * f32::from(sc[i / 32]);
        // Half a step, plus what the minimum's rounding up can push past the top level.
        check_roundtrip(x, &y, |i| 0.51 * unit(i) + dmin.to_f32());
        bytemuck::bytes_of(&block).to_vec()
    })
}

/// `Q6_K`: per 16 values an 8-bit scale (`value = d · sc · (q - 32)`), as ggml's format lays
/// them out (low nibbles in `ql`, two high bits each in `qh`).
fn q4_1_as_q6_k(bytes: &[u8]) -> Vec<u8> {
    requantized(bytes, |x: &[f32; QK_K]| {
        let amax: [f32; 16] = std::array::from_fn(|s| {
            x[16 * s..16 * (s + 1)]
                .iter()
                .fold(0f32, |m, &v| m.max(v.abs()))
        });
        let scale: [f32; 16] = std::array::from_fn(|s| amax[s] / 31.0);
        let d = f16::from_f32(scale.iter().fold(0f32, |m, &v| m.max(v)) / 127.0);
        let sc: [i8; 16] = std::array::from_fn(|s| {
            if d.to_f32() > 0.0 {
                ((scale[s] / d.to_f32()).ceil() as i8).max(1)
            } else {
                1
            }
        });
        let q: Vec<u8> = (0..QK_K)
            .map(|i| {
                let unit = d.to_f32() * f32::from(sc[i / 16]);
                if unit > 0.0 {
                    ((x[i] / unit).round() + 32.0).clamp(0.0, 63.0) as u8
                } else {
                    32
                }
            })
            .collect();
        let mut block = BlockQ6K {
            ql: [0; QK_K / 2],
            qh: [0; QK_K / 4],
            scales: sc,
            d,
        };
        for n in 0..2 {
            for l in 0..32 {
                let [q1, q2, q3, q4] = [0, 32, 64, 96].map(|o| q[128 * n + o + l]);
                block.ql[64 * n + l] = (q1 & 0xF) | (q3 & 0xF) << 4;
                block.ql[64 * n + l + 32] = (q2 & 0xF) | (q4 & 0xF) << 4;
                block.qh[32 * n + l] = q1 >> 4 | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6;
            }
        }
        let mut y = [0f32; QK_K];
        dequantize_row_q6_k(std::slice::from_ref(&block), &mut y);
        check_roundtrip(x, &y, |i| 0.51 * d.to_f32() * f32::from(sc[i / 16]));
        bytemuck::bytes_of(&block).to_vec()
    })
}
