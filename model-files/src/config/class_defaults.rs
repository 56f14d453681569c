//! What transformers assumes for the keys a `config.json` leaves out.
//!
//! Transformers builds a config from its class's defaults and the file's keys, and it writes
//! a nested config (a wrapper's `text_config`) with only the values that differ from those
//! defaults: Gemma 3 4B's `text_config` has no `vocab_size` or head counts. The defaults of
//! the classes Tessera reads (`class_defaults.json`, written by
//! `scripts/make_class_defaults.py` from transformers' own classes) fill in what a config
//! leaves out, so a key means what it means to transformers whether written or not.

use serde_json::{Map, Value};

/// Transformers' defaults per `model_type`.
const CLASS_DEFAULTS: &str = include_str!("class_defaults.json");

/// `config` with the keys it leaves out taken from its `model_type`'s class defaults.
pub(crate) fn filled(config: Value) -> Value {
    let Value::Object(keys) = config else {
        return config;
    };
    let Some(mut merged) = keys
        .get("model_type")
        .and_then(Value::as_str)
        .and_then(defaults_of)
    else {
        return Value::Object(keys);
    };
    // A default base must not override the RoPE a transformers 5 config describes.
    if keys.contains_key("rope_parameters") {
        merged.remove("rope_theta");
    }
    merged.extend(keys);
    Value::Object(merged)
}

fn defaults_of(model_type: &str) -> Option<Map<String, Value>> {
    let all: Value = serde_json::from_str(CLASS_DEFAULTS).ok()?;
    all.get(model_type)?.as_object().cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_has_its_shape() {
        let all: Value = serde_json::from_str(CLASS_DEFAULTS).unwrap();
        let all = all.as_object().unwrap();
        assert!(all.len() >= 10);
        for (model_type, d) in all {
            assert!(d.get("vocab_size").is_some(), "{model_type}");
        }
    }

    #[test]
    fn written_keys_win() {
        let config: Value = serde_json::from_str(
            r#"{"model_type":"gemma3_text","hidden_size":2560,"sliding_window":null}"#,
        )
        .unwrap();
        let filled = filled(config);
        assert_eq!(filled["hidden_size"], 2560);
        assert_eq!(filled["sliding_window"], Value::Null);
        assert_eq!(filled["vocab_size"], 262_208);
        assert_eq!(filled["head_dim"], 256);
    }

    #[test]
    fn rope_parameters_keep_their_base() {
        let config: Value = serde_json::from_str(
            r#"{"model_type":"smollm3","rope_parameters":{"rope_type":"default","rope_theta":5e6}}"#,
        )
        .unwrap();
        assert!(filled(config).get("rope_theta").is_none());
        let config: Value = serde_json::from_str(r#"{"model_type":"smollm3"}"#).unwrap();
        assert_eq!(filled(config)["rope_theta"], 2e6);
    }

    #[test]
    fn unknown_types_are_left_alone() {
        let config: Value = serde_json::from_str(r#"{"model_type":"gpt_neox"}"#).unwrap();
        assert_eq!(filled(config.clone()), config);
    }
}
