//! A bfloat16 KV cache keeps the fixtures' logits close to the float32 cache's, and results
//! still do not depend on batching or chunking.

use crate::common;

use common::{Schedule, assert_same_under_schedules, load_fixture, max_abs_diff, run};
use tessera_shard::KvDtype;

const FIXTURES: [&str; 3] = ["tiny-llama", "tiny-qwen2", "tiny-mistral"];

/// Bound on max |logit(bf16 KV) - logit(f32 KV)| after each prompt, relative to the largest
/// |logit|: bf16 keeps 8 significant bits (0.4% per element). Run with --nocapture for the
/// observed values.
const BF16_RELATIVE_TOLERANCE: f32 = 2e-2;

#[test]
fn bf16_kv_logits_stay_close_to_f32_kv() {
    for name in FIXTURES {
        let (model, golden) = load_fixture(name);
        let prompts = golden.prompt_ids();
        let f32_kv = run(&model, &prompts, 20, usize::MAX, Schedule::OneAtATime);
        let model = model.with_kv_dtype(KvDtype::Bfloat16);
        let bf16_kv = run(&model, &prompts, 20, usize::MAX, Schedule::OneAtATime);
        let (mut worst, mut vs_golden, mut scale) = (0f32, 0f32, 0f32);
        let mut f32_vs_golden = 0f32;
        let mut same_tokens = 0;
        for ((a, b), p) in f32_kv.iter().zip(&bf16_kv).zip(&golden.prompts) {
            worst = worst.max(max_abs_diff(&a.prompt_logits, &b.prompt_logits));
            vs_golden = vs_golden.max(max_abs_diff(&b.prompt_logits, &p.last_logits));
            f32_vs_golden = f32_vs_golden.max(max_abs_diff(&a.prompt_logits, &p.last_logits));
            scale = scale.max(a.prompt_logits.iter().fold(0f32, |m, x| m.max(x.abs())));
            same_tokens += usize::from(a.tokens == b.tokens);
        }
        eprintln!(
            "{name}: bf16 KV max |logit diff| {worst:e} vs f32 KV, {vs_golden:e} vs goldens \
             (max |logit| {scale}; f32 KV vs goldens {f32_vs_golden:e}); greedy tokens identical \
             for {same_tokens}/{} prompts",
            prompts.len()
        );
        assert!(
            worst <= BF16_RELATIVE_TOLERANCE * scale,
            "{name}: {worst} (max |logit| {scale})"
        );
    }
}

#[test]
fn bf16_kv_results_do_not_depend_on_batching_or_chunking() {
    for name in FIXTURES {
        let (model, golden) = load_fixture(name);
        let model = model.with_kv_dtype(KvDtype::Bfloat16);
        let prompts = golden.prompt_ids();
        assert_same_under_schedules(
            name,
            &model,
            &prompts,
            20,
            &[
                (Schedule::Together, usize::MAX),
                (Schedule::Together, 1),
                (Schedule::Together, 7),
                (Schedule::Staggered, 7),
                (Schedule::OneAtATime, 64),
            ],
        );
    }
}

/// The memory budget buys twice the blocks with a bf16 cache.
#[test]
fn bf16_blocks_take_half_the_bytes() {
    use tessera_shard::Engine;
    let (model, _) = load_fixture("tiny-llama");
    let f32_bytes = Engine::new(model, 2, 16).unwrap().block_bytes();
    let (model, _) = load_fixture("tiny-llama");
    let engine = Engine::new(model.with_kv_dtype(KvDtype::Bfloat16), 2, 16).unwrap();
    assert_eq!(engine.block_bytes() * 2, f32_bytes);
}
