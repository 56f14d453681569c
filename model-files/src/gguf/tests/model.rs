//! Model configs, tokenizer specs and RoPE scaling from metadata; llama q/k unpermuted.

use super::*;
use crate::{Architecture, ModelConfig, RopeScaling};

#[test]
fn llama_q_and_k_are_unpermuted_to_hf_layout() {
    for arch in ["llama", "mistral", "qwen2"] {
        let (w, q, k) = tiny_model(arch, true, true);
        let file = open_bytes(&w.bytes().0).unwrap();
        let lq = file
            .load_f32("model.layers.0.self_attn.q_proj.weight")
            .unwrap();
        assert_eq!(lq.shape, [8, 8]);
        assert_eq!(lq.data, q, "{arch} q");
        let lk = file
            .load_f32("model.layers.0.self_attn.k_proj.weight")
            .unwrap();
        assert_eq!(lk.shape, [4, 8]);
        assert_eq!(lk.data, k, "{arch} k");
        let qb = file
            .load_f32("model.layers.0.self_attn.q_proj.bias")
            .unwrap();
        assert_eq!(
            qb.data,
            (0..8).map(|i| i as f32).collect::<Vec<_>>(),
            "{arch} q bias"
        );
        let kb = file
            .load_f32("model.layers.0.self_attn.k_proj.bias")
            .unwrap();
        assert_eq!(kb.data, [0.0, 1.0, 2.0, 3.0], "{arch} k bias");
    }
}

#[test]
fn model_config_from_metadata() {
    let (w, _, _) = tiny_model("llama", false, true);
    let file = open_bytes(&w.bytes().0).unwrap();
    let c = file.model_config().unwrap();
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(
        (
            c.vocab_size,
            c.hidden_size,
            c.intermediate_size,
            c.num_layers
        ),
        (5, 8, 16, 2)
    );
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (2, 1, 4));
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert_eq!(c.rope_theta, 500_000.0);
    assert_eq!(c.rope_scaling, None);
    assert_eq!(c.max_position_embeddings, 128);
    assert!(c.tie_word_embeddings);
    assert!(!c.attention_bias);
    assert_eq!(c.sliding_window, None);
    assert_eq!(c.dtype, Some(crate::DType::F32));
    assert_eq!(c.bos_token_id, Some(1));
    assert_eq!(c.eos_token_ids, [2]);

    let (w, _, _) = tiny_model("qwen2", true, false);
    let w = w
        .kv("qwen2.vocab_size", V::U32(7))
        .kv("qwen2.attention.sliding_window", V::U32(64))
        .kv("qwen2.rope.scaling.type", V::String("linear".into()))
        .kv("qwen2.rope.scaling.factor", V::F32(2.0));
    let file = open_bytes(&w.bytes().0).unwrap();
    let c = file.model_config().unwrap();
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert_eq!(c.vocab_size, 7);
    assert!(!c.tie_word_embeddings);
    assert!(c.attention_bias);
    assert_eq!(c.sliding_window, Some(64));
    assert_eq!(c.rope_scaling, Some(RopeScaling::Linear { factor: 2.0 }));
}

#[test]
fn model_config_errors_name_the_problem() {
    let (w, _, _) = tiny_model("llama", false, true);
    let mut w2 = Writer::new();
    w2.kvs = w
        .kvs
        .iter()
        .filter(|(k, _)| k != "llama.block_count")
        .cloned()
        .collect();
    let file = open_bytes(&w2.bytes().0).unwrap();
    let err = file.model_config().unwrap_err().to_string();
    assert!(
        err.contains("missing metadata key llama.block_count"),
        "{err}"
    );

    let w3 = Writer::new().kv("general.architecture", V::String("gptneox".into()));
    let f = write_file(&w3.bytes().0);
    let err = GgufFile::open(&f.path).unwrap().model_config().unwrap_err();
    assert!(
        matches!(&err, FormatError::UnsupportedArchitecture { found, .. } if found == "gptneox"),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("gptneox")
            && text.contains("llama")
            && text.contains(&f.path.display().to_string())
    );

    let w4 = Writer::new();
    let err = open_bytes(&w4.bytes().0)
        .unwrap()
        .architecture()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("missing metadata key general.architecture"),
        "{err}"
    );

    let (w, _, _) = tiny_model("llama", false, true);
    let w = w.kv("llama.rope.scaling.type", V::String("dynamic".into()));
    let err = open_bytes(&w.bytes().0)
        .unwrap()
        .model_config()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unsupported rope scaling \"dynamic\""),
        "{err}"
    );

    let (w, _, _) = tiny_model("llama", false, true);
    let w = w.kv("llama.rope.scaling.type", V::String("yarn".into()));
    let err = open_bytes(&w.bytes().0)
        .unwrap()
        .model_config()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("yarn rope scaling needs llama.rope.scaling.factor"),
        "{err}"
    );

    let (w, _, _) = tiny_model("llama", false, true);
    let mut w = w;
    for (k, v) in &mut w.kvs {
        if k == "llama.attention.head_count" {
            *v = V::String("nine".into());
        }
    }
    let err = open_bytes(&w.bytes().0)
        .unwrap()
        .model_config()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "metadata llama.attention.head_count must be a non-negative integer, found string"
        ),
        "{err}"
    );
}

#[test]
fn tokenizer_spec_from_metadata() {
    let (w, _, _) = tiny_model("llama", false, true);
    let file = open_bytes(&w.bytes().0).unwrap();
    let spec = file.tokenizer_spec().unwrap();
    assert_eq!(spec.model, "gpt2");
    assert_eq!(spec.pre.as_deref(), Some("smollm"));
    assert_eq!(spec.tokens, ["<unk>", "<s>", "</s>", "a", "b"]);
    assert_eq!(spec.token_types, Some(vec![2, 3, 3, 1, 1]));
    assert_eq!(spec.merges, Some(vec!["a b".to_string()]));
    assert_eq!(spec.scores, None);
    assert_eq!(
        (spec.bos_id, spec.eos_id, spec.unk_id, spec.pad_id),
        (Some(1), Some(2), None, None)
    );
    assert_eq!((spec.add_bos, spec.add_eos), (Some(false), None));
    assert_eq!(spec.chat_template.as_deref(), Some("{{ messages }}"));

    let w = Writer::new()
        .kv("tokenizer.ggml.model", V::String("llama".into()))
        .kv("tokenizer.ggml.tokens", V::Array(vec![V::U32(3)]));
    let err = open_bytes(&w.bytes().0)
        .unwrap()
        .tokenizer_spec()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tokenizer.ggml.tokens[0] must be an array of strings, found u32"),
        "{err}"
    );
}

/// Llama 3's divisors as llama.cpp's converter computes them (`generate_extra_tensors`).
fn llama3_divisors(
    head_dim: usize,
    theta: f64,
    factor: f64,
    low: f64,
    high: f64,
    orig: f64,
) -> Vec<f32> {
    let (low_wavelen, high_wavelen) = (orig / low, orig / high);
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor as f32
            } else {
                let smooth = (orig / wavelen - low) / (high - low);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect()
}

#[test]
fn llama3_rope_scaling_is_recovered_from_rope_freqs() {
    let (w, _, _) = tiny_model("llama", false, true);
    let mut w = w;
    // head_dim 128 like Llama 3.1 8B.
    for (k, v) in &mut w.kvs {
        if k == "llama.embedding_length" {
            *v = V::U32(256);
        }
    }
    let divisors = llama3_divisors(128, 500_000.0, 8.0, 1.0, 4.0, 8192.0);
    let w = w.f32_tensor("rope_freqs.weight", &[64], &divisors);
    let c = open_bytes(&w.bytes().0).unwrap().model_config().unwrap();
    let Some(RopeScaling::Llama3 {
        factor,
        low_freq_factor,
        high_freq_factor,
        original_max_position_embeddings,
    }) = c.rope_scaling
    else {
        panic!("expected llama3 scaling, got {:?}", c.rope_scaling);
    };
    assert_eq!(factor, 8.0);
    let refit = llama3_divisors(
        128,
        500_000.0,
        factor.into(),
        low_freq_factor.into(),
        high_freq_factor.into(),
        original_max_position_embeddings.into(),
    );
    for (a, b) in refit.iter().zip(&divisors) {
        assert!((a - b).abs() <= 1e-4 * b, "{a} vs {b}");
    }

    // Divisors that are not Llama 3's shape are refused with a reason.
    let (w, _, _) = tiny_model("llama", false, true);
    let w = w.f32_tensor("rope_freqs.weight", &[2], &[1.0, 3.0]);
    let err = open_bytes(&w.bytes().0)
        .unwrap()
        .model_config()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("rope_freqs.weight is not Llama 3 rope scaling"),
        "{err}"
    );
}

#[test]
fn gemma_files_without_a_score_scale_take_llama_cpps() {
    // Heads of 6 in a hidden size of 8 over 2 heads: the two rules differ (6 and 4).
    let config = |arch: &str, layers: u32, scale: Option<f32>| {
        let (mut w, _, _) = tiny_model(arch, false, true);
        let replaced = [
            format!("{arch}.block_count"),
            format!("{arch}.attention.key_length"),
            format!("{arch}.attention.value_length"),
        ];
        w.kvs.retain(|(k, _)| !replaced.contains(k));
        let mut w = w
            .kv(&replaced[0], V::U32(layers))
            .kv(&replaced[1], V::U32(6))
            .kv(&replaced[2], V::U32(6));
        if let Some(s) = scale {
            w = w.kv(&format!("{arch}.attention.scale"), V::F32(s));
        }
        let file = open_bytes(&w.bytes().0).unwrap();
        file.model_config().unwrap().family.attention_scale
    };
    let by_head = (6f64).powf(-0.5) as f32;
    let by_hidden = (4f64).powf(-0.5) as f32;
    assert_eq!(config("gemma2", 2, None), by_head);
    assert_eq!(config("gemma2", 46, None), by_hidden);
    assert_eq!(config("gemma3", 62, None), by_hidden);
    assert_eq!(config("gemma3", 46, None), by_head);
    assert_eq!(config("gemma3", 62, Some(0.125)), 0.125);
}

#[test]
fn pooling_type_of_an_embedding_gguf() {
    use crate::{Pooler, Pooling};
    let pooler = |pooling_type: Option<u32>| {
        let (w, _, _) = tiny_model("qwen2", false, true);
        let w = match pooling_type {
            Some(t) => w.kv("qwen2.pooling_type", V::U32(t)),
            None => w,
        };
        let file = open_bytes(&w.bytes().0).unwrap();
        crate::pooling::from_gguf(&file)
    };
    assert_eq!(pooler(None).unwrap(), None);
    assert_eq!(pooler(Some(0)).unwrap(), None);
    let last = Pooler {
        pooling: Pooling::LastToken,
        normalize: true,
    };
    assert_eq!(pooler(Some(3)).unwrap(), Some(last));
    assert_eq!(
        pooler(Some(1)).unwrap().map(|p| p.pooling),
        Some(Pooling::Mean)
    );
    let rank = pooler(Some(4)).unwrap_err().to_string();
    assert!(rank.contains("pooling_type 4 is not served"), "{rank}");
}

/// llama.cpp's gpt-oss files state less than the checkpoint's config: the sliding layers, the
/// clamped SwiGLU and YaRN's unrounded range are the family's, and the configs agree.
#[test]
fn gpt_oss_gguf_reads_as_its_checkpoint_config() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    for name in ["tiny-gpt-oss", "tiny-gpt-oss-mxfp4"] {
        let hf = ModelConfig::from_hf_file(&fixtures.join(name).join("config.json")).unwrap();
        let gguf = GgufFile::open(&fixtures.join(name).join("model.gguf"))
            .and_then(|f| f.model_config())
            .unwrap();
        assert_eq!(gguf.family, hf.family, "{name}");
        assert_eq!(gguf.rope_scaling, hf.rope_scaling, "{name}");
        assert_eq!(
            (gguf.architecture, gguf.sliding_window, gguf.attention_bias),
            (Architecture::GptOss, hf.sliding_window, true),
            "{name}"
        );
        assert!(
            matches!(
                gguf.rope_scaling,
                Some(RopeScaling::Yarn {
                    truncate: false,
                    ..
                })
            ),
            "{name}"
        );
    }
}
