//! The committed draft heads for SmolLM2-135M-Instruct (Medusa heads from
//! `scripts/train_draft_heads.py`, the EAGLE head from `scripts/train_eagle_head.py`) keep
//! transformers' greedy tokens and get some of their candidates accepted; the engine's EAGLE
//! pass computes what the training script's layer computes.
//!
//! Needs the GGUF like `smollm2.rs` (skipped without it unless `TESSERA_REQUIRE_SMOLLM2=1`).

use crate::common;

use std::path::PathBuf;

use common::{Golden, repo_root, smollm2_gguf};
use serde::Deserialize;
use tessera_model_files::ModelFiles;
use tessera_shard::sampling::SamplingParams;
use tessera_shard::speculative::{
    EagleDraft, EagleHead, MedusaDraft, MedusaHeads, Proposer, Speculation,
};
use tessera_shard::{Engine, KvDtype, LogitsWanted, Model, SequenceChunk, WeightLayout};

fn golden() -> Golden {
    let path = repo_root().join("fixtures/smollm2/golden.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn heads_dir(name: &str) -> PathBuf {
    repo_root().join("fixtures/smollm2").join(name)
}

/// Greedy tokens with the engine `speculating(model, width)` makes, for trees of width 1, 4
/// and 16, alone and batched (at widths 1 and 4 every golden prompt once and the first one
/// twice, so that equal prompts share a batch; at width 16 the first two), are transformers'
/// own.
fn greedy_tokens_match(label: &str, speculating: impl Fn(Model, usize) -> Engine) {
    let Some(path) = smollm2_gguf() else { return };
    let files = ModelFiles::open(&path).unwrap();
    let golden = golden();
    // One equal pair is what sharing a batch needs; more pairs would only repeat it.
    let batch: Vec<Vec<u32>> = golden
        .prompts
        .iter()
        .map(|p| p.prompt_ids.clone())
        .cycle()
        .take(golden.prompts.len() + 1)
        .collect();
    let params = vec![SamplingParams::default(); batch.len()];
    let kv_dtype = KvDtype::auto(&files);
    for width in [1, 4, 16] {
        let model = Model::load_with(&files, WeightLayout::Exact)
            .unwrap()
            .with_kv_dtype(kv_dtype);
        let mut engine = speculating(model, width);
        // The widest trees are most of the time: two prompts batch them.
        let n = if width == 16 { 2 } else { batch.len() };
        let (out, (proposed, accepted)) =
            common::generate(&mut engine, &batch[..n], &params[..n], 32);
        for (p, o) in golden.prompts.iter().cycle().zip(&out) {
            assert_eq!(
                o, &p.greedy_ids,
                "{label} width {width}, batched: {:?}",
                p.text
            );
        }
        let (alone, _) = common::generate(&mut engine, &batch[..1], &params[..1], 32);
        assert_eq!(
            alone[0], golden.prompts[0].greedy_ids,
            "{label} width {width} alone"
        );
        assert!(
            proposed > 0 && accepted > 0,
            "{label} width {width}: {accepted} of {proposed} accepted"
        );
        eprintln!(
            "{label} width {width}: {accepted} of {proposed} candidates accepted ({n} prompts of \
             32 tokens)"
        );
    }
}

#[test]
fn medusa_greedy_tokens_match_transformers() {
    greedy_tokens_match("Medusa", |model, width| {
        let (h, v) = (model.config().hidden_size, model.config().vocab_size);
        let heads = MedusaHeads::load(&heads_dir("medusa"), h, v).unwrap();
        let depth = heads.num_heads();
        let medusa = MedusaDraft::new(heads, width).unwrap();
        Engine::new(model, 1 + 16 * 64, 16)
            .unwrap()
            .with_speculation(Speculation::new(depth, Proposer::Medusa(medusa)))
            .unwrap()
    });
}

#[test]
fn eagle_greedy_tokens_match_transformers() {
    greedy_tokens_match("EAGLE", |model, width| {
        let head = EagleHead::load(&heads_dir("eagle"), model.config()).unwrap();
        let eagle = EagleDraft::new(head, width, &model).unwrap();
        Engine::new(model, 1 + 16 * 64, 16)
            .unwrap()
            .with_speculation(Speculation::new(4, Proposer::Eagle(eagle)))
            .unwrap()
    });
}

/// `parity.json`: the training script's inputs and outputs of the saved layer.
#[derive(Deserialize)]
struct Parity {
    tokens: Vec<u32>,
    features: Vec<Vec<f32>>,
    outputs: Vec<Vec<f32>>,
}

/// The engine's pass of the committed EAGLE layer, given the training script's features,
/// gives its outputs (to float rounding).
#[test]
fn eagle_pass_matches_its_training_script() {
    let Some(path) = smollm2_gguf() else { return };
    let files = ModelFiles::open(&path).unwrap();
    let model = Model::load_with(&files, WeightLayout::Exact).unwrap();
    let dir = heads_dir("eagle");
    let head = EagleHead::load_with(&dir, model.config(), WeightLayout::Exact).unwrap();
    let parity: Parity =
        serde_json::from_str(&std::fs::read_to_string(dir.join("parity.json")).unwrap()).unwrap();
    let n = parity.tokens.len();
    let blocks: Vec<u32> = (1..=n.div_ceil(16) as u32).collect();
    let mut cache = head.new_cache(blocks.len() + 1, 16);
    let chunk = SequenceChunk {
        tokens: &parity.tokens,
        start_position: 0,
        block_table: &blocks,
        logits: LogitsWanted::None,
        tree: None,
        prompt_len: n,
    };
    let features: Vec<f32> = parity.features.concat();
    let out = head
        .forward(&model, &[chunk], &features, &mut cache)
        .unwrap();
    let expected = parity.outputs.concat();
    let scale = expected.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = out
        .iter()
        .zip(&expected)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        worst <= 2e-3 * scale,
        "the engine's EAGLE pass is {worst} from the script's (outputs up to {scale})"
    );
}
