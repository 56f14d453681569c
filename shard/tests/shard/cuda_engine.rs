//! The CUDA backend on a real GPU (feature `cuda`): the transformers goldens, and results that
//! do not depend on batching or chunking. Without a GPU each test says why and passes, unless
//! `TESSERA_REQUIRE_GPU=1`.
//!
//! Tolerances:
//! - f32 on the GPU (products in full FP32 through cuBLAS, kernels in f32): logits within
//!   2e-4 of transformers (the CPU meets 1e-4; the GPU sums in other orders) and identical
//!   greedy tokens;
//! - bf16 on the GPU (weights, activations, residual stream and KV cache in bf16, sums in
//!   f32, as PyTorch runs a bf16 model): logits within 5% of the largest golden logit
//!   (bf16 keeps 8 bits of mantissa; every layer rounds the residual stream once more).
#![cfg(feature = "cuda")]

use crate::common;

use common::{
    Schedule, assert_close_under_schedules, assert_goldens, max_abs_diff, on_gpu_with, run,
};
use tessera_kernels::cpu::WeightFormat;
use tessera_shard::{CudaOptions, KvDtype, Model, WeightLayout};

const FIXTURES: [&str; 3] = ["tiny-llama", "tiny-qwen2", "tiny-mistral"];

fn gpu_fixture(name: &str, dtype: KvDtype) -> Option<(Model, common::Golden)> {
    gpu_fixture_with(name, dtype, CudaOptions::default())
}

fn gpu_fixture_with(
    name: &str,
    dtype: KvDtype,
    options: CudaOptions,
) -> Option<(Model, common::Golden)> {
    let model = Model::load_with(&common::fixture_files(name), WeightLayout::Exact)
        .unwrap()
        .with_kv_dtype(dtype);
    Some((on_gpu_with(model, options)?, common::golden(name)))
}

/// Decode steps replayed from CUDA graphs (padded to a bucket size, tables to a power-of-two
/// width) give the tokens the kernels give one by one, and graphs are replayed at all.
#[test]
fn cuda_graphs_replay_what_the_kernels_compute() {
    for name in FIXTURES {
        let Some((graphs, golden)) = gpu_fixture(name, KvDtype::Float32) else {
            return;
        };
        let eager_options = CudaOptions {
            graphs: false,
            ..CudaOptions::default()
        };
        let (eager, _) = gpu_fixture_with(name, KvDtype::Float32, eager_options).unwrap();
        let prompts = golden.prompt_ids();
        for schedule in [
            Schedule::OneAtATime,
            Schedule::Together,
            Schedule::Staggered,
        ] {
            let a = run(&graphs, &prompts, 24, 5, schedule);
            let b = run(&eager, &prompts, 24, 5, schedule);
            for (i, (a, b)) in a.iter().zip(&b).enumerate() {
                assert_eq!(a.tokens, b.tokens, "{name} prompt {i} {schedule:?}");
            }
        }
        assert_eq!(eager.cuda_graph_replays(), 0, "{name}: graphs were off");
        let replays = graphs.cuda_graph_replays();
        println!("{name}: {replays} decode steps replayed from CUDA graphs");
        assert!(
            replays > 0,
            "{name}: no decode step was replayed from a graph"
        );
    }
}

#[test]
fn f32_logits_and_greedy_tokens_match_transformers() {
    for name in FIXTURES {
        let Some((model, golden)) = gpu_fixture(name, KvDtype::Float32) else {
            return;
        };
        assert_eq!(model.kv_dtype(), KvDtype::Float32);
        assert_goldens(name, &model, &golden, 2e-4);
    }
}

#[test]
fn bf16_logits_are_close_to_transformers() {
    for name in FIXTURES {
        let Some((model, golden)) = gpu_fixture(name, KvDtype::Bfloat16) else {
            return;
        };
        let outcomes = run(
            &model,
            &golden.prompt_ids(),
            20,
            usize::MAX,
            Schedule::OneAtATime,
        );
        for (p, o) in golden.prompts.iter().zip(&outcomes) {
            let diff = max_abs_diff(&o.prompt_logits, &p.last_logits);
            let scale = p.last_logits.iter().fold(0f32, |m, v| m.max(v.abs()));
            let same = o
                .tokens
                .iter()
                .zip(&p.greedy_ids)
                .take_while(|(a, b)| a == b)
                .count();
            println!(
                "{name} bf16 {:?}: max |logit - golden| = {diff:.3} (max |logit| {scale:.2}); \
                 first {same} of {} greedy tokens agree",
                p.text,
                p.greedy_ids.len()
            );
            assert!(
                diff <= 0.05 * scale,
                "{name} {:?}: max |logit - golden| = {diff} > 5% of {scale}",
                p.text
            );
        }
    }
}

/// Decode steps run the paged decode kernel and prompts the flash prefill kernel, so a
/// sequence's rows go through different kernels under different schedules: equal to 1e-4,
/// with identical greedy tokens.
#[test]
fn results_do_not_depend_on_batching_or_chunking() {
    for name in FIXTURES {
        let Some((model, golden)) = gpu_fixture(name, KvDtype::Float32) else {
            return;
        };
        assert_close_under_schedules(
            name,
            &model,
            &golden.prompt_ids(),
            &[
                (Schedule::Together, usize::MAX),
                (Schedule::Together, 1),
                (Schedule::Together, 7),
                (Schedule::Staggered, 7),
            ],
            1e-4,
        );
    }
}

fn f16_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

/// A matrix as ggml `Q8_0` blocks (`None` when its rows are not whole blocks).
fn q8_0_blocks(values: &[f32], cols: usize) -> Option<Vec<u8>> {
    if !cols.is_multiple_of(32) {
        return None;
    }
    let mut out = Vec::new();
    for x in values.chunks_exact(32) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = half::f16::from_f32(amax / 127.0).to_f32();
        out.extend(f16_bytes(d));
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend(
            x.iter()
                .map(|v| (v * inv).round().clamp(-127.0, 127.0) as i8 as u8),
        );
    }
    Some(out)
}

/// A matrix as ggml `Q4_1` blocks (`None` when its rows are not whole blocks).
fn q4_1_blocks(values: &[f32], cols: usize) -> Option<Vec<u8>> {
    if !cols.is_multiple_of(32) {
        return None;
    }
    let mut out = Vec::new();
    for x in values.chunks_exact(32) {
        let lo = x.iter().fold(f32::INFINITY, |m, &v| m.min(v));
        let hi = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let d = half::f16::from_f32((hi - lo) / 15.0).to_f32();
        let m = half::f16::from_f32(lo).to_f32();
        out.extend(f16_bytes(d));
        out.extend(f16_bytes(m));
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        let q = |v: f32| ((v - m) * inv).round().clamp(0.0, 15.0) as u8;
        out.extend((0..16).map(|j| q(x[j]) | (q(x[j + 16]) << 4)));
    }
    Some(out)
}

/// Matrices kept as `Q8_0` / `Q4_1` blocks on the GPU (weight-only GEMV for decode batches,
/// dequantized into scratch for a prefill of more than 64 rows) give, in f32, what the CPU
/// computes exactly on the same blocks: logits to 1e-4 and the same greedy tokens.
#[test]
fn quantized_weights_match_the_cpu_on_the_same_blocks() {
    for name in FIXTURES {
        for (format, encode) in [
            (
                WeightFormat::Q8_0,
                q8_0_blocks as fn(&[f32], usize) -> Option<Vec<u8>>,
            ),
            (WeightFormat::Q4_1, q4_1_blocks),
        ] {
            let files = common::converted_fixture(name, format, encode);
            let load = || {
                Model::load_with(&files, WeightLayout::Exact)
                    .unwrap()
                    .with_kv_dtype(KvDtype::Float32)
            };
            let cpu = load();
            assert_eq!(cpu.weights_dtype(), format.name());
            // The golden prompts, and one longer than 64 tokens for the dequantized path.
            let mut prompts = common::golden(name).prompt_ids();
            let long: Vec<u32> = prompts.iter().flatten().copied().cycle().take(80).collect();
            prompts.push(long);
            let want = run(&cpu, &prompts, 12, usize::MAX, Schedule::Together);
            let Some(gpu) = on_gpu_with(load(), CudaOptions::default()) else {
                return;
            };
            let got = run(&gpu, &prompts, 12, usize::MAX, Schedule::Together);
            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                let diff = max_abs_diff(&a.prompt_logits, &b.prompt_logits);
                assert!(
                    diff <= 1e-4,
                    "{name} {format:?} prompt {i}: logits differ by {diff}"
                );
                assert_eq!(
                    a.tokens, b.tokens,
                    "{name} {format:?} prompt {i}: greedy tokens"
                );
            }
        }
    }
}
