//! `--dtype bfloat16` on bf16 weights: products take bf16 activations (`vdpbf16ps`). The
//! fixtures, converted to bf16 at load, keep their logits within bf16 rounding of the f32
//! activations' and of the transformers goldens, and results still do not depend on batching
//! or chunking.

use crate::common;

use common::{
    Golden, Schedule, assert_same_under_schedules, converted_fixture, golden, max_abs_diff, run,
};
use half::bf16;
use tessera_kernels::cpu::{ActivationDtype, WeightFormat, WeightMatrix};
use tessera_shard::{KvDtype, Model};

const FIXTURES: [&str; 3] = ["tiny-llama", "tiny-qwen2", "tiny-mistral"];

/// Bound on max |logit difference| relative to the largest |logit|: activations and weights
/// keep 8 significant bits (0.4% per element). Run with --nocapture for the observed values.
const RELATIVE_TOLERANCE: f32 = 3e-2;

/// bf16 bytes of a matrix (rounded to nearest-even).
fn bf16_bytes(values: &[f32], _cols: usize) -> Option<Vec<u8>> {
    Some(
        values
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_bits().to_le_bytes())
            .collect(),
    )
}

/// The fixture with its matrices handed to the loader as bf16.
fn load_bf16(name: &str) -> (Model, Golden) {
    let files = converted_fixture(name, WeightFormat::Bf16, bf16_bytes);
    (Model::load(&files).unwrap(), golden(name))
}

#[test]
fn the_loader_keeps_the_converted_matrices_in_bf16() {
    // Guards the test set-up: without bf16 matrices the flag would change nothing.
    let files = converted_fixture("tiny-llama", WeightFormat::Bf16, bf16_bytes);
    let t = files
        .weights
        .load_native("model.layers.0.mlp.down_proj.weight")
        .unwrap()
        .unwrap();
    let m = WeightMatrix::from_bytes(t.format, t.shape[0], t.shape[1], &t.bytes).unwrap();
    assert_eq!(m.format(), WeightFormat::Bf16);
    // And `/info` reports them as such.
    assert_eq!(load_bf16("tiny-llama").0.weights_dtype(), "bfloat16");
    assert_eq!(
        common::load_fixture("tiny-llama").0.weights_dtype(),
        "float32"
    );
}

#[test]
fn bf16_activations_stay_close_to_f32_activations_and_goldens() {
    for name in FIXTURES {
        let (model, golden) = load_bf16(name);
        let prompts = golden.prompt_ids();
        let f32_act = run(&model, &prompts, 20, usize::MAX, Schedule::OneAtATime);
        let model = model
            .with_kv_dtype(KvDtype::Bfloat16)
            .with_activation_dtype(ActivationDtype::Bfloat16);
        let bf16_act = run(&model, &prompts, 20, usize::MAX, Schedule::OneAtATime);
        let (mut worst, mut vs_golden, mut scale, mut changed) = (0f32, 0f32, 0f32, 0f32);
        let mut same_tokens = 0;
        for ((a, b), p) in f32_act.iter().zip(&bf16_act).zip(&golden.prompts) {
            worst = worst.max(max_abs_diff(&a.prompt_logits, &b.prompt_logits));
            vs_golden = vs_golden.max(max_abs_diff(&b.prompt_logits, &p.last_logits));
            scale = scale.max(a.prompt_logits.iter().fold(0f32, |m, x| m.max(x.abs())));
            changed = changed.max(worst);
            same_tokens += usize::from(a.tokens == b.tokens);
        }
        eprintln!(
            "{name}: bf16 activations max |logit diff| {worst:e} vs f32 activations (bf16 \
             weights), {vs_golden:e} vs goldens (max |logit| {scale}); greedy tokens identical \
             for {same_tokens}/{} prompts",
            prompts.len()
        );
        assert!(changed > 0.0, "{name}: bf16 activations changed nothing");
        assert!(
            worst <= RELATIVE_TOLERANCE * scale,
            "{name}: {worst} (max |logit| {scale})"
        );
        assert!(
            vs_golden <= 2.0 * RELATIVE_TOLERANCE * scale,
            "{name}: {vs_golden} vs goldens (max |logit| {scale})"
        );
    }
}

#[test]
fn bf16_activation_results_do_not_depend_on_batching_or_chunking() {
    for name in FIXTURES {
        let (model, golden) = load_bf16(name);
        let model = model
            .with_kv_dtype(KvDtype::Bfloat16)
            .with_activation_dtype(ActivationDtype::Bfloat16);
        let prompts = golden.prompt_ids();
        assert_same_under_schedules(
            name,
            &model,
            &prompts,
            12,
            &[
                (Schedule::Together, usize::MAX),
                (Schedule::Together, 5),
                (Schedule::Staggered, 7),
            ],
        );
    }
}
