//! The language model's config inside a wrapped one (`Gemma3ForConditionalGeneration`,
//! `Mistral3ForConditionalGeneration`, LLaVA-style models), which nests it under
//! `text_config` (written as a diff against its class's defaults: see `class_defaults.rs`).

use serde_json::{Map, Value};

/// Keys a wrapper keeps at its top level that describe its language model too.
const SHARED_KEYS: [&str; 5] = [
    "dtype",
    "torch_dtype",
    "bos_token_id",
    "eos_token_id",
    "tie_word_embeddings",
];

/// The wrapper's name and its language model's config, if `config` nests one: the
/// language model's own keys over the wrapper's shared keys.
pub(crate) fn language_model(config: &Value) -> Option<(String, Value)> {
    let text = config.get("text_config")?.as_object()?;
    let wrapper = config
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .or_else(|| config.get("model_type").and_then(Value::as_str))
        .unwrap_or("<none declared>")
        .to_string();
    let mut merged = Map::new();
    for key in SHARED_KEYS {
        if let Some(v) = config.get(key).filter(|v| !v.is_null()) {
            merged.insert(key.to_string(), v.clone());
        }
    }
    merged.extend(text.clone());
    merged.remove("architectures");
    Some((wrapper, Value::Object(merged)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_keys_over_shared_keys() {
        let config: Value = serde_json::from_str(
            r#"{"architectures":["Gemma3ForConditionalGeneration"],"model_type":"gemma3",
            "torch_dtype":"bfloat16","eos_token_id":[1,106],
            "text_config":{"model_type":"gemma3_text","hidden_size":2560,"eos_token_id":106},
            "vision_config":{"model_type":"siglip_vision_model"}}"#,
        )
        .unwrap();
        let (wrapper, text) = language_model(&config).unwrap();
        assert_eq!(wrapper, "Gemma3ForConditionalGeneration");
        assert_eq!(text["hidden_size"], 2560);
        assert_eq!(text["eos_token_id"], 106);
        assert_eq!(text["torch_dtype"], "bfloat16");
        assert_eq!(text["model_type"], "gemma3_text");
        assert!(text.get("vision_config").is_none());
    }

    #[test]
    fn plain_configs_nest_nothing() {
        let config: Value =
            serde_json::from_str(r#"{"architectures":["LlamaForCausalLM"]}"#).unwrap();
        assert!(language_model(&config).is_none());
    }
}
