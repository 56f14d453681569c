//! Medusa heads never change what the model produces: greedy tokens are identical to decoding
//! without speculation for every tiny fixture and tree width, alone and batched (up to 32
//! sequences), and sampled tokens keep the model's distribution.

use crate::common;

use std::path::Path;

use common::{
    FIXTURES, assert_sampling_keeps_the_distribution, batch_size, full_batch, generate,
    load_fixture,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::{Dtype, tensor::TensorView};
use tessera_shard::sampling::SamplingParams;
use tessera_shard::speculative::{MedusaDraft, MedusaHeads, Proposer, Speculation};
use tessera_shard::{Engine, Model};

const BLOCK: usize = 16;

/// How a test head's residual blocks are made.
#[derive(Clone, Copy, Debug)]
enum Blocks {
    /// Zero: each head guesses the model's own next token (often right on a tiny model).
    Zero,
    /// Random: guesses mostly wrong, spread over the vocabulary.
    Random,
}

/// Writes `heads` Medusa heads for `model` into `dir`, with their own vocabulary projection
/// (a copy of nothing: random) when `own_lm_head`.
fn write_heads(dir: &Path, model: &Model, heads: usize, blocks: Blocks, own_lm_head: bool) {
    let (h, v) = (model.config().hidden_size, model.config().vocab_size);
    let mut rng = ChaCha8Rng::seed_from_u64(heads as u64);
    let mut random =
        |n: usize, amp: f32| -> Vec<f32> { (0..n).map(|_| rng.random_range(-amp..amp)).collect() };
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for k in 0..heads {
        let (w, b) = match blocks {
            Blocks::Zero => (vec![0.0; h * h], vec![0.0; h]),
            Blocks::Random => (random(h * h, 2.0 / (h as f32).sqrt()), random(h, 0.1)),
        };
        tensors.push((format!("{k}.0.linear.weight"), vec![h, h], w));
        tensors.push((format!("{k}.0.linear.bias"), vec![h], b));
        if own_lm_head {
            tensors.push((format!("{k}.1.weight"), vec![v, h], random(v * h, 0.5)));
        }
    }
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, data)| data.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), b)| {
            let view = TensorView::new(Dtype::F32, shape.clone(), b).expect("tensor shape");
            (name.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("medusa_lm_head.safetensors"))
        .expect("write heads");
    let config = format!(r#"{{"medusa_num_heads": {heads}, "medusa_num_layers": 1}}"#);
    std::fs::write(dir.join("config.json"), config).expect("write config");
}

/// An engine speculating with `depth` Medusa heads (from `dir`) in trees of `width` paths.
fn medusa_engine(model: Model, dir: &Path, depth: usize, width: usize) -> Engine {
    let (h, v) = (model.config().hidden_size, model.config().vocab_size);
    let heads = MedusaHeads::load(dir, h, v).unwrap();
    let medusa = MedusaDraft::new(heads, width).unwrap();
    Engine::new(model, 1 + 16 * 64, BLOCK)
        .unwrap()
        .with_speculation(Speculation::new(depth, Proposer::Medusa(medusa)))
        .unwrap()
}

fn plain_engine(model: Model) -> Engine {
    Engine::new(model, 1 + 16 * 64, BLOCK).unwrap()
}

#[test]
fn greedy_tokens_are_identical_for_every_tree_width() {
    let steps = 24;
    for name in FIXTURES {
        let (model, golden) = load_fixture(name);
        let dir = tempfile::tempdir().unwrap();
        let prompts: Vec<Vec<u32>> = golden
            .prompts
            .iter()
            .map(|p| p.prompt_ids.clone())
            .filter(|p| p.len() + steps + 64 <= 256)
            .collect();
        let batch = full_batch(&prompts);
        let greedy = vec![SamplingParams::default(); batch.len()];
        let (reference, _) = generate(&mut plain_engine(model), &batch, &greedy, steps);
        for blocks in [Blocks::Zero, Blocks::Random] {
            let (model, _) = load_fixture(name);
            write_heads(dir.path(), &model, 3, blocks, false);
            let mut accepted_total = 0;
            for width in [1, 4, 16] {
                let (model, _) = load_fixture(name);
                let mut e = medusa_engine(model, dir.path(), 3, width);
                let n = batch_size(matches!(blocks, Blocks::Zero), width, prompts.len());
                let (batched, (proposed, accepted)) =
                    generate(&mut e, &batch[..n], &greedy[..n], steps);
                assert_eq!(
                    batched,
                    reference[..n],
                    "{name} {blocks:?} width {width}: batch of {n}"
                );
                assert!(proposed > 0, "{name}: the heads proposed nothing");
                accepted_total += accepted;
                // Every prompt alone at the default width; the first elsewhere.
                let alone_prompts = if width == 4 { prompts.len() } else { 1 };
                for (i, p) in prompts.iter().enumerate().take(alone_prompts) {
                    let (alone, _) = generate(&mut e, std::slice::from_ref(p), &greedy[..1], steps);
                    assert_eq!(
                        alone[0], reference[i],
                        "{name} {blocks:?} width {width}: prompt {i} alone"
                    );
                }
            }
            if matches!(blocks, Blocks::Zero) {
                assert!(
                    accepted_total > 0,
                    "{name}: no candidate was ever accepted, the test proves nothing"
                );
            }
        }
    }
}

/// Heads with their own vocabulary projection (Medusa's published layout) load and keep the
/// output unchanged.
#[test]
fn heads_with_their_own_lm_head_keep_the_output() {
    let (model, golden) = load_fixture("tiny-llama");
    let prompts = golden.prompt_ids();
    let greedy = vec![SamplingParams::default(); prompts.len()];
    let (reference, _) = generate(&mut plain_engine(model), &prompts, &greedy, 16);
    let dir = tempfile::tempdir().unwrap();
    let (model, _) = load_fixture("tiny-llama");
    write_heads(dir.path(), &model, 2, Blocks::Random, true);
    let mut e = medusa_engine(model, dir.path(), 2, 4);
    let (out, (proposed, _)) = generate(&mut e, &prompts, &greedy, 16);
    assert_eq!(out, reference);
    assert!(proposed > 0);
}

/// Heads made for another model are refused with a message that names the tensor.
#[test]
fn heads_of_another_shape_are_refused() {
    let (model, _) = load_fixture("tiny-llama");
    let dir = tempfile::tempdir().unwrap();
    write_heads(dir.path(), &model, 2, Blocks::Zero, false);
    let h = model.config().hidden_size;
    let err = MedusaHeads::load(dir.path(), h + 8, model.config().vocab_size)
        .err()
        .expect("a wider model must refuse these heads")
        .to_string();
    assert!(err.contains("0.0.linear.weight"), "{err}");
    std::fs::write(dir.path().join("config.json"), "{}").unwrap();
    assert!(MedusaHeads::load(dir.path(), h, model.config().vocab_size).is_err());
}

/// The second and third generated tokens (the ones tree steps produce) have the same joint
/// distribution with and without heads: a two-sample chi-square over many seeds.
#[test]
fn sampling_through_trees_keeps_the_model_distribution() {
    let (_, golden) = load_fixture("tiny-llama");
    let prompt = golden.prompts[1].prompt_ids.clone();
    let seeds = 1500u64;
    let dir = tempfile::tempdir().unwrap();
    let (model, _) = load_fixture("tiny-llama");
    write_heads(dir.path(), &model, 3, Blocks::Zero, false);
    let (plain, _) = load_fixture("tiny-llama");
    let (model, _) = load_fixture("tiny-llama");
    assert_sampling_keeps_the_distribution(
        plain_engine(plain),
        medusa_engine(model, dir.path(), 3, 16),
        &prompt,
        seeds,
    );
}
