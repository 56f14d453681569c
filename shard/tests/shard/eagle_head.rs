//! An EAGLE-style draft layer never changes what the model produces: greedy tokens are
//! identical to decoding without speculation for every tiny fixture and tree width, alone and
//! batched (up to 32 sequences), and sampled tokens keep the model's distribution.

use crate::common;

use std::path::Path;

use common::{
    FIXTURES, assert_sampling_keeps_the_distribution, batch_size, full_batch, generate,
    load_fixture,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::{Dtype, tensor::TensorView};
use serde_json::json;
use tessera_shard::sampling::SamplingParams;
use tessera_shard::speculative::{EagleDraft, EagleHead, Proposer, Speculation};
use tessera_shard::{Engine, Model};

const BLOCK: usize = 16;

/// How a test head is made.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// `fc` passes the feature through and the layer adds nothing: the head guesses that the
    /// token after next is the model's guess for the next one (often right on a tiny model).
    Passthrough,
    /// Random weights: guesses mostly wrong, spread over the vocabulary.
    Random,
    /// [`Kind::Passthrough`], proposing only the even token ids (a draft vocabulary).
    EvenTokens,
}

/// Writes an EAGLE head for `model` into `dir` in EAGLE's layout.
fn write_head(dir: &Path, model: &Model, kind: Kind) {
    let c = model.config();
    let (h, hd, inter) = (c.hidden_size, c.head_dim, 2 * c.hidden_size);
    let (q, kv) = (c.num_heads * hd, c.num_kv_heads * hd);
    let mut rng = ChaCha8Rng::seed_from_u64(h as u64);
    let mut random = |n: usize, fan_in: usize| -> Vec<f32> {
        let amp = 1.0 / (fan_in as f32).sqrt();
        (0..n).map(|_| rng.random_range(-amp..amp)).collect()
    };
    let fc = match kind {
        Kind::Passthrough | Kind::EvenTokens => {
            let mut fc = vec![0f32; h * 2 * h];
            (0..h).for_each(|i| fc[i * 2 * h + h + i] = 1.0);
            fc
        }
        Kind::Random => random(h * 2 * h, 2 * h),
    };
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut matrix = |name: &str, rows: usize, cols: usize| -> Vec<f32> {
        let data = match kind {
            Kind::Passthrough | Kind::EvenTokens => vec![0.0; rows * cols],
            Kind::Random => random(rows * cols, cols),
        };
        tensors.push((format!("layers.0.{name}"), vec![rows, cols], data.clone()));
        data
    };
    matrix("self_attn.q_proj.weight", q, h);
    matrix("self_attn.k_proj.weight", kv, h);
    matrix("self_attn.v_proj.weight", kv, h);
    matrix("self_attn.o_proj.weight", h, q);
    matrix("mlp.gate_proj.weight", inter, h);
    matrix("mlp.up_proj.weight", inter, h);
    matrix("mlp.down_proj.weight", h, inter);
    tensors.push(("fc.weight".into(), vec![h, 2 * h], fc));
    tensors.push(("fc.bias".into(), vec![h], vec![0.0; h]));
    tensors.push((
        "layers.0.post_attention_layernorm.weight".into(),
        vec![h],
        vec![1.0; h],
    ));
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
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors"))
        .expect("write head");
    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": h,
        "intermediate_size": inter,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": hd,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-6,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).expect("write config");
    let vocab = dir.join("draft_vocab.json");
    match kind {
        Kind::EvenTokens => {
            let even: Vec<usize> = (0..c.vocab_size).step_by(2).collect();
            std::fs::write(vocab, serde_json::to_string(&even).unwrap()).expect("write vocab");
        }
        _ if vocab.exists() => std::fs::remove_file(vocab).expect("remove vocab"),
        _ => {}
    }
}

/// An engine speculating `depth` levels deep with the EAGLE head in `dir`, `width` nodes a
/// level.
fn eagle_engine(model: Model, dir: &Path, depth: usize, width: usize) -> Engine {
    let head = EagleHead::load(dir, model.config()).unwrap();
    let eagle = EagleDraft::new(head, width, &model).unwrap();
    Engine::new(model, 1 + 16 * 64, BLOCK)
        .unwrap()
        .with_speculation(Speculation::new(depth, Proposer::Eagle(eagle)))
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
        for kind in [Kind::Passthrough, Kind::Random, Kind::EvenTokens] {
            let (model, _) = load_fixture(name);
            write_head(dir.path(), &model, kind);
            let mut accepted_total = 0;
            for width in [1, 4, 16] {
                let (model, _) = load_fixture(name);
                let mut e = eagle_engine(model, dir.path(), 3, width);
                let n = batch_size(matches!(kind, Kind::Passthrough), width, prompts.len());
                let (batched, (proposed, accepted)) =
                    generate(&mut e, &batch[..n], &greedy[..n], steps);
                assert_eq!(
                    batched,
                    reference[..n],
                    "{name} {kind:?} width {width}: batch of {n}"
                );
                assert!(proposed > 0, "{name}: the head proposed nothing");
                accepted_total += accepted;
                // Every prompt alone at the default width; the first elsewhere.
                let alone_prompts = if width == 4 { prompts.len() } else { 1 };
                for (i, p) in prompts.iter().enumerate().take(alone_prompts) {
                    let (alone, _) = generate(&mut e, std::slice::from_ref(p), &greedy[..1], steps);
                    assert_eq!(
                        alone[0], reference[i],
                        "{name} {kind:?} width {width}: prompt {i} alone"
                    );
                }
            }
            if !matches!(kind, Kind::Random) {
                assert!(
                    accepted_total > 0,
                    "{name}: no candidate was ever accepted, the test proves nothing"
                );
            }
        }
    }
}

/// A head made for another model is refused with a message that says why.
#[test]
fn a_head_of_another_shape_is_refused() {
    let (model, _) = load_fixture("tiny-llama");
    let (other, _) = load_fixture("tiny-qwen3");
    let dir = tempfile::tempdir().unwrap();
    write_head(dir.path(), &other, Kind::Passthrough);
    if other.config().hidden_size != model.config().hidden_size {
        let err = EagleHead::load(dir.path(), model.config())
            .err()
            .expect("a head of another width must be refused")
            .to_string();
        assert!(err.contains("a head must be made for its model"), "{err}");
    }
    write_head(dir.path(), &model, Kind::Passthrough);
    let config = dir.path().join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    c["intermediate_size"] = json!(3);
    std::fs::write(&config, c.to_string()).unwrap();
    let err = EagleHead::load(dir.path(), model.config())
        .err()
        .expect("a head whose tensors do not fit its configuration must be refused")
        .to_string();
    assert!(err.contains("gate_proj"), "{err}");
    std::fs::write(&config, "{}").unwrap();
    assert!(EagleHead::load(dir.path(), model.config()).is_err());
}

/// The second and third generated tokens (the ones tree steps produce) have the same joint
/// distribution with and without the head: a two-sample chi-square over many seeds.
#[test]
fn sampling_through_trees_keeps_the_model_distribution() {
    let (_, golden) = load_fixture("tiny-llama");
    let prompt = golden.prompts[1].prompt_ids.clone();
    let seeds = 1500u64;
    let dir = tempfile::tempdir().unwrap();
    let (model, _) = load_fixture("tiny-llama");
    write_head(dir.path(), &model, Kind::Passthrough);
    let (plain, _) = load_fixture("tiny-llama");
    let (model, _) = load_fixture("tiny-llama");
    assert_sampling_keeps_the_distribution(
        plain_engine(plain),
        eagle_engine(model, dir.path(), 3, 16),
        &prompt,
        seeds,
    );
}
