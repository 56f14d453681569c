//! The GGUF reader against a real model: SmolLM2-135M-Instruct quantized to Q4_1 by
//! llama.cpp, compared with transformers' GGUF loader (`model-files/tests/data/
//! smollm2_gguf_slices.json`, written by `scripts/make_quant_goldens.py --smollm2`).
//!
//! The model is read from `${TESSERA_CACHE:-$HOME/.cache/tessera}/SmolLM2-135M-Instruct.Q4_1.gguf`.
//! When it is absent the tests print a note and pass, unless `TESSERA_REQUIRE_SMOLLM2=1`.

use std::path::PathBuf;

use serde_json::Value;
use tessera_model_files::gguf::{GgmlType, GgufFile};
use tessera_model_files::{Architecture, WeightSource};

const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn model() -> Option<GgufFile> {
    let cache = std::env::var_os("TESSERA_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tessera")))
        .unwrap_or_default();
    let path = cache.join(FILE);
    if !path.exists() {
        if std::env::var("TESSERA_REQUIRE_SMOLLM2").as_deref() == Ok("1") {
            panic!(
                "{} is missing and TESSERA_REQUIRE_SMOLLM2=1",
                path.display()
            );
        }
        eprintln!(
            "skipping: {} not found (set TESSERA_CACHE or copy it there)",
            path.display()
        );
        return None;
    }
    Some(GgufFile::open(&path).expect("SmolLM2 GGUF opens"))
}

#[test]
fn smollm2_metadata_and_config() {
    let Some(file) = model() else { return };
    assert_eq!(file.version(), 3);
    assert_eq!(file.architecture().unwrap(), "llama");
    let c = file.model_config().unwrap();
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(c.num_layers, 30);
    assert_eq!(c.hidden_size, 576);
    assert_eq!(c.intermediate_size, 1536);
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (9, 3, 64));
    assert_eq!(c.vocab_size, 49152);
    assert!(c.tie_word_embeddings);
    assert!(!c.attention_bias);
    assert_eq!(c.rope_theta, 100_000.0);
    assert_eq!(c.rope_scaling, None);
    assert_eq!(c.max_position_embeddings, 8192);
    assert!((c.rms_norm_eps - 1e-5).abs() < 1e-9);
    assert_eq!(c.sliding_window, None);
    assert_eq!(c.bos_token_id, Some(1));
    assert_eq!(c.eos_token_ids, [2]);

    let spec = file.tokenizer_spec().unwrap();
    assert_eq!(spec.model, "gpt2");
    assert_eq!(spec.pre.as_deref(), Some("smollm"));
    assert_eq!(spec.tokens.len(), 49152);
    assert_eq!(spec.token_types.as_ref().map(Vec::len), Some(49152));
    assert_eq!(spec.merges.as_ref().map(Vec::len), Some(48900));
    assert_eq!(spec.tokens[2], "<|im_end|>");
    assert_eq!(
        (spec.bos_id, spec.eos_id, spec.pad_id),
        (Some(1), Some(2), Some(2))
    );
    assert!(
        spec.chat_template
            .as_deref()
            .unwrap_or("")
            .contains("<|im_start|>")
    );
}

#[test]
fn smollm2_every_tensor_loads() {
    let Some(file) = model() else { return };
    assert_eq!(file.tensors().len(), 272);
    for t in file.tensors() {
        assert!(
            matches!(t.ggml_type, GgmlType::F32 | GgmlType::Q4_1 | GgmlType::Q8_0),
            "{}: {}",
            t.name,
            t.ggml_type
        );
        let data = file.load_gguf_f32(&t.name).unwrap();
        assert_eq!(data.len(), t.elements());
        assert!(data.iter().all(|v| v.is_finite()), "{}", t.name);
    }
    let c = file.model_config().unwrap();
    let (h, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    let mut expected = vec![
        (
            "model.embed_tokens.weight".to_string(),
            vec![c.vocab_size, c.hidden_size],
        ),
        ("model.norm.weight".to_string(), vec![c.hidden_size]),
    ];
    for i in 0..c.num_layers {
        let l = |s: &str| format!("model.layers.{i}.{s}");
        expected.extend([
            (l("input_layernorm.weight"), vec![c.hidden_size]),
            (l("post_attention_layernorm.weight"), vec![c.hidden_size]),
            (l("self_attn.q_proj.weight"), vec![h, c.hidden_size]),
            (l("self_attn.k_proj.weight"), vec![kv, c.hidden_size]),
            (l("self_attn.v_proj.weight"), vec![kv, c.hidden_size]),
            (l("self_attn.o_proj.weight"), vec![c.hidden_size, h]),
            (
                l("mlp.gate_proj.weight"),
                vec![c.intermediate_size, c.hidden_size],
            ),
            (
                l("mlp.up_proj.weight"),
                vec![c.intermediate_size, c.hidden_size],
            ),
            (
                l("mlp.down_proj.weight"),
                vec![c.hidden_size, c.intermediate_size],
            ),
        ]);
    }
    assert_eq!(expected.len(), 2 + 9 * 30);
    for (name, shape) in &expected {
        assert_eq!(&file.shape(name).unwrap(), shape, "{name}");
    }
    assert!(!file.contains("lm_head.weight"));
}

#[test]
fn smollm2_matches_transformers_gguf_loading() {
    let Some(file) = model() else { return };
    let golden: Value = serde_json::from_str(include_str!("../data/smollm2_gguf_slices.json"))
        .expect("golden json");
    let tensors = golden["tensors"].as_array().expect("tensors");
    for g in tensors {
        let name = g["name"].as_str().expect("name");
        let t = file.load_f32(name).unwrap();
        let shape: Vec<usize> = g["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .map(|v| v.as_u64().expect("dim") as usize)
            .collect();
        assert_eq!(t.shape, shape, "{name}");
        let cols = if shape.len() > 1 { shape[1] } else { shape[0] };
        let rows: Vec<usize> = g["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .map(|v| v.as_u64().expect("row") as usize)
            .collect();
        let first_row = &t.data[rows[0] * cols..(rows[0] + 1) * cols];
        for (i, want) in g["first"].as_array().expect("first").iter().enumerate() {
            let want = want.as_f64().expect("value") as f32;
            assert!(
                (first_row[i] - want).abs() <= 1e-6,
                "{name}[{}][{i}]: {} vs {want}",
                rows[0],
                first_row[i]
            );
        }
        for (r, want) in rows.iter().zip(g["sums"].as_array().expect("sums")) {
            let want = want.as_f64().expect("sum");
            let got: f64 = t.data[r * cols..(r + 1) * cols]
                .iter()
                .map(|&v| f64::from(v))
                .sum();
            assert!(
                (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                "{name} row {r}: sum {got} vs transformers {want}"
            );
        }
    }
}
