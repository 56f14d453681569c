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

mod common;

use common::{
    Schedule, assert_close_under_schedules, assert_goldens, load_fixture, max_abs_diff,
    on_gpu_with, run,
};
use tessera_formats::ModelFiles;
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
    let (_, golden) = load_fixture(name);
    let dir = common::repo_root().join("fixtures").join(name);
    let files = ModelFiles::open(&dir).unwrap();
    let model = Model::load_with(&files, WeightLayout::Exact)
        .unwrap()
        .with_kv_dtype(dtype);
    Some((on_gpu_with(model, options)?, golden))
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
