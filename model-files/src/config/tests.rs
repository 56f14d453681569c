use super::*;

fn parse(text: &str) -> ModelConfig {
    ModelConfig::from_hf_json(text).unwrap().unwrap()
}

#[test]
fn transformers_5_keys() {
    let c = parse(
        r#"{"architectures":["LlamaForCausalLM"],"vocab_size":10,"hidden_size":8,
        "intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,
        "num_key_value_heads":1,"dtype":"bfloat16","tie_word_embeddings":true,
        "rope_parameters":{"rope_theta":500000.0,"rope_type":"llama3","factor":8.0,
        "low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192},
        "eos_token_id":[1,2]}"#,
    );
    assert_eq!(c.rope_theta, 500_000.0);
    assert!(matches!(c.rope_scaling, Some(RopeScaling::Llama3 { factor, .. }) if factor == 8.0));
    assert_eq!(c.dtype, Some(DType::BF16));
    assert_eq!(c.eos_token_ids, vec![1, 2]);
    assert_eq!(c.head_dim, 4);
    assert!(c.tie_word_embeddings);
}

#[test]
fn context_length_follows_the_rope_scaling() {
    let with = |arch: &str, scaling: &str| {
        parse(&format!(
            r#"{{"architectures":["{arch}"],"vocab_size":10,"hidden_size":8,
            "intermediate_size":16,"num_hidden_layers":2,"num_attention_heads":2,
            "max_position_embeddings":32768,"rope_scaling":{scaling}}}"#
        ))
        .context_length()
    };
    let llama = "LlamaForCausalLM";
    assert_eq!(with(llama, "null"), 32768);
    assert_eq!(
        with(
            "Qwen2ForCausalLM",
            r#"{"type":"yarn","factor":4.0,"original_max_position_embeddings":32768}"#
        ),
        131072
    );
    assert_eq!(
        with(
            llama,
            r#"{"type":"yarn","factor":2.0,"original_max_position_embeddings":4096}"#
        ),
        32768,
        "never below the declared length"
    );
    assert_eq!(with(llama, r#"{"type":"dynamic","factor":2.0}"#), 65536);
    assert_eq!(with(llama, r#"{"type":"linear","factor":4.0}"#), 131072);
    assert_eq!(
        with(
            llama,
            r#"{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,
            "high_freq_factor":4.0,"original_max_position_embeddings":8192}"#
        ),
        32768
    );
    assert_eq!(
        with(
            "Gemma3ForCausalLM",
            r#"{"rope_type":"linear","factor":8.0}"#
        ),
        32768,
        "Gemma 3 declares the length its global layers' scaling reaches"
    );
}

#[test]
fn transformers_4_keys() {
    let c = parse(
        r#"{"architectures":["Qwen2ForCausalLM"],"vocab_size":10,"hidden_size":8,
        "intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,
        "torch_dtype":"float32","rope_theta":1000000.0,"rope_scaling":null,
        "sliding_window":4096,"use_sliding_window":false,"eos_token_id":7}"#,
    );
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert_eq!(c.rope_theta, 1_000_000.0);
    assert_eq!(c.rope_scaling, None);
    assert_eq!(c.sliding_window, None);
    assert!(c.attention_bias);
    assert_eq!(c.eos_token_ids, vec![7]);
}

#[test]
fn unknown_architecture_is_named() {
    let r = ModelConfig::from_hf_json(
        r#"{"architectures":["GPTNeoXForCausalLM"],"vocab_size":10,"hidden_size":8,
        "intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2}"#,
    )
    .unwrap();
    assert_eq!(
        r,
        Err(NotServed::Architecture("GPTNeoXForCausalLM".to_string()))
    );
}

#[test]
fn wrong_dtype_is_rejected() {
    let r = ModelConfig::from_hf_json(
        r#"{"architectures":["LlamaForCausalLM"],"vocab_size":10,"hidden_size":8,
        "intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"dtype":"int3"}"#,
    );
    assert!(r.unwrap_err().contains("int3"));
}

fn fixture(name: &str) -> ModelConfig {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures")
        .join(name)
        .join("config.json");
    ModelConfig::from_hf_file(&path).unwrap()
}

#[test]
fn family_descriptions_of_the_fixtures() {
    let g = fixture("tiny-gemma3").family;
    let windows: Vec<_> = g.layers.iter().map(|l| (l.window, l.local_rope)).collect();
    assert_eq!(windows, [(Some(8), true), (None, false), (Some(8), true)]);
    assert_eq!(
        (g.norm_weight_offset, g.qk_norm, g.sandwich_norms),
        (1.0, true, true)
    );
    assert_eq!(g.local_rope_theta, Some(10_000.0));
    assert_eq!(g.attention_scale, (24f64).powf(-0.5) as f32);
    let g2 = fixture("tiny-gemma2");
    assert_eq!(
        (g2.family.attention_softcap, g2.family.final_softcap),
        (Some(5.0), Some(8.0))
    );
    let phi = fixture("tiny-phi3");
    assert_eq!(phi.family.rotary_dim, 8);
    assert!(matches!(
        phi.rope_scaling,
        Some(RopeScaling::LongRope { original_max_position_embeddings: 64, ref long_factor, .. })
            if long_factor.len() == 4
    ));
    let moe = fixture("tiny-qwen3-moe").family;
    let sparse: Vec<_> = moe.layers.iter().map(|l| l.sparse).collect();
    assert_eq!(sparse, [true, false, true]);
    assert_eq!(
        moe.moe.map(|m| (m.experts, m.top_k, m.norm_topk_prob)),
        Some((4, 2, true))
    );
    assert!(
        fixture("tiny-llama")
            .family
            .layers
            .iter()
            .all(|l| !l.sparse)
    );
}

#[test]
fn wrapped_gemma3_reads_its_language_model_with_class_defaults() {
    // Gemma 3 4B's config.json as the Hub has it: text_config written as a diff.
    let c = parse(
        r#"{"architectures":["Gemma3ForConditionalGeneration"],"model_type":"gemma3",
        "boi_token_index":255999,"eos_token_id":[1,106],"torch_dtype":"bfloat16",
        "text_config":{"hidden_size":2560,"intermediate_size":10240,"model_type":"gemma3_text",
        "num_hidden_layers":34,"rope_scaling":{"factor":8.0,"rope_type":"linear"},
        "sliding_window":1024},
        "vision_config":{"hidden_size":1152,"model_type":"siglip_vision_model"}}"#,
    );
    assert_eq!(c.architecture, Architecture::Gemma3);
    assert_eq!(
        (c.vocab_size, c.hidden_size, c.num_layers),
        (262_208, 2560, 34)
    );
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (8, 4, 256));
    assert_eq!(c.eos_token_ids, vec![1, 106]);
    assert_eq!(c.dtype, Some(DType::BF16));
    assert_eq!(c.sliding_window, Some(1024));
    assert_eq!(c.rope_theta, 1_000_000.0);
    assert_eq!(c.rope_scaling, Some(RopeScaling::Linear { factor: 8.0 }));
    assert_eq!(c.family.local_rope_theta, Some(10_000.0));
    assert!(c.tie_word_embeddings);
}

#[test]
fn wrapped_language_model_of_an_unknown_family_is_named() {
    let r = ModelConfig::from_hf_json(
        r#"{"architectures":["Qwen3VLForConditionalGeneration"],
        "text_config":{"model_type":"qwen3_vl_text","vocab_size":10}}"#,
    )
    .unwrap();
    assert_eq!(
        r,
        Err(NotServed::Architecture(
            "Qwen3VLForConditionalGeneration (language model qwen3_vl_text)".into()
        ))
    );
}

#[test]
fn quantized_checkpoints_are_refused_by_method() {
    let r = ModelConfig::from_hf_json(
        r#"{"architectures":["LlamaForCausalLM"],"vocab_size":10,"hidden_size":8,
        "intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,
        "quantization_config":{"quant_method":"awq","bits":4,"group_size":128}}"#,
    )
    .unwrap();
    assert!(matches!(r, Err(NotServed::Quantized(q)) if q.method == "AWQ"));
    // MXFP4 is read for gpt-oss (its experts' own format) and refused elsewhere.
    let mxfp4 = r#""quantization_config":{"quant_method":"mxfp4"},"vocab_size":10,
        "hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2"#;
    let r = ModelConfig::from_hf_json(&format!(
        r#"{{"architectures":["LlamaForCausalLM"],{mxfp4}}}"#
    ))
    .unwrap();
    assert!(matches!(r, Err(NotServed::Quantized(q)) if q.method == "MXFP4"));
    let r = ModelConfig::from_hf_json(&format!(
        r#"{{"architectures":["GptOssForCausalLM"],"num_local_experts":4,"num_experts_per_tok":2,{mxfp4}}}"#
    ))
    .unwrap();
    assert!(r.is_ok(), "{:?}", r.err());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(
        &path,
        r#"{"architectures":["Qwen2ForCausalLM"],"quantization_config":{"quant_method":"gptq"}}"#,
    )
    .unwrap();
    let message = ModelConfig::from_hf_file(&path).unwrap_err().to_string();
    assert!(
        message.contains("GPTQ") && message.contains("GGUF"),
        "{message}"
    );
}

#[test]
fn smollm3_layers_without_rope() {
    let c = parse(
        r#"{"architectures":["SmolLM3ForCausalLM"],"model_type":"smollm3","vocab_size":10,
        "hidden_size":8,"intermediate_size":16,"num_hidden_layers":8,"num_attention_heads":2,"num_key_value_heads":1,
        "no_rope_layers":[1,1,1,0,1,1,1,0],"rope_theta":5000000.0}"#,
    );
    assert_eq!(c.architecture, Architecture::SmolLM3);
    let rope: Vec<bool> = c.family.layers.iter().map(|l| l.rope).collect();
    assert_eq!(rope, [true, true, true, false, true, true, true, false]);
    assert_eq!(c.rope_theta, 5_000_000.0);
    assert!(c.tie_word_embeddings, "SmolLM3's class default");
    let c = parse(
        r#"{"architectures":["SmolLM3ForCausalLM"],"model_type":"smollm3","vocab_size":10,
        "hidden_size":8,"intermediate_size":16,"num_hidden_layers":4,"num_attention_heads":2,"num_key_value_heads":2,
        "no_rope_layer_interval":2}"#,
    );
    let rope: Vec<bool> = c.family.layers.iter().map(|l| l.rope).collect();
    assert_eq!(rope, [true, false, true, false]);
}

#[test]
fn gpt_oss_family_from_its_config() {
    let c = fixture("tiny-gpt-oss");
    assert_eq!(c.architecture, Architecture::GptOss);
    let windows: Vec<_> = c.family.layers.iter().map(|l| l.window).collect();
    assert_eq!(windows, [Some(8), None, Some(8), None]);
    let moe = c.family.moe.expect("gpt-oss's MLPs are sparse");
    assert_eq!(
        (moe.experts, moe.top_k, moe.expert_intermediate),
        (4, 2, 32)
    );
    assert_eq!(moe.names, crate::ExpertNames::GptOss);
    assert_eq!(
        moe.activation,
        crate::ExpertActivation::ClampedSwiglu {
            alpha: 1.702,
            limit: 7.0
        }
    );
    assert!(c.attention_bias);
}
