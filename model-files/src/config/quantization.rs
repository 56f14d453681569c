//! Checkpoints whose weights a quantization library wrote (`quantization_config` in
//! `config.json`): Tessera reads quantized models from GGUF files only, and says so by name.

use serde_json::Value;

use crate::Architecture;

/// A quantization method named by a config: as people call it, and as the config spells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantization {
    /// GPTQ, AWQ, FP8, …
    pub method: String,
    /// `quantization_config.quant_method`, or what stands in for it.
    pub quant_method: String,
}

/// The quantization `config` (a whole `config.json`) declares, at the top or in its
/// `text_config`, if any.
pub(crate) fn declared(config: &Value) -> Option<Quantization> {
    let q = config
        .get("quantization_config")
        .or_else(|| config.get("text_config")?.get("quantization_config"))
        .filter(|q| q.is_object())?;
    let quant_method = match q.get("quant_method").and_then(Value::as_str) {
        Some(m) => m.to_string(),
        // bitsandbytes configs written before `quant_method` existed.
        None if q.get("load_in_4bit").is_some() || q.get("load_in_8bit").is_some() => {
            "bitsandbytes".to_string()
        }
        None => "unnamed".to_string(),
    };
    let method = match quant_method.to_ascii_lowercase().as_str() {
        "gptq" => "GPTQ".to_string(),
        "awq" => "AWQ".to_string(),
        "fp8" | "fbgemm_fp8" => "FP8".to_string(),
        "compressed-tensors" | "compressed_tensors" => "compressed-tensors".to_string(),
        "bitsandbytes" => {
            let set = |key| q.get(key).and_then(Value::as_bool) == Some(true);
            match (set("load_in_4bit"), set("load_in_8bit")) {
                (true, _) => "bitsandbytes 4-bit",
                (_, true) => "bitsandbytes 8-bit",
                _ => "bitsandbytes",
            }
            .to_string()
        }
        "mxfp4" => "MXFP4".to_string(),
        "hqq" => "HQQ".to_string(),
        "aqlm" => "AQLM".to_string(),
        "eetq" => "EETQ".to_string(),
        "auto-round" | "autoround" => "AutoRound".to_string(),
        _ => format!("{quant_method}-quantized"),
    };
    Some(Quantization {
        method,
        quant_method,
    })
}

/// `declared` when Tessera does not read it: every method but MXFP4, gpt-oss's own expert
/// format (read by `hf_dir::mxfp4`); MXFP4 too once the `architecture` is known and is not
/// gpt-oss.
pub(crate) fn unread(
    declared: Option<Quantization>,
    architecture: Option<Architecture>,
) -> Option<Quantization> {
    declared.filter(|q| {
        !q.quant_method.eq_ignore_ascii_case("mxfp4")
            || architecture.is_some_and(|a| a != Architecture::GptOss)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn method(json: &str) -> Option<String> {
        declared(&serde_json::from_str(json).unwrap()).map(|q| q.method)
    }

    #[test]
    fn names_the_common_methods() {
        let cases = [
            (
                r#"{"quantization_config":{"quant_method":"gptq","bits":4}}"#,
                "GPTQ",
            ),
            (
                r#"{"quantization_config":{"quant_method":"awq","bits":4}}"#,
                "AWQ",
            ),
            (
                r#"{"quantization_config":{"quant_method":"fp8","weight_block_size":[128,128]}}"#,
                "FP8",
            ),
            (
                r#"{"quantization_config":{"quant_method":"compressed-tensors"}}"#,
                "compressed-tensors",
            ),
            (
                r#"{"quantization_config":{"quant_method":"bitsandbytes","load_in_4bit":true}}"#,
                "bitsandbytes 4-bit",
            ),
            (
                r#"{"quantization_config":{"load_in_8bit":true}}"#,
                "bitsandbytes 8-bit",
            ),
            (
                r#"{"text_config":{"quantization_config":{"quant_method":"awq"}}}"#,
                "AWQ",
            ),
            (
                r#"{"quantization_config":{"quant_method":"vptq"}}"#,
                "vptq-quantized",
            ),
        ];
        for (json, expected) in cases {
            assert_eq!(method(json).as_deref(), Some(expected), "{json}");
        }
    }

    #[test]
    fn plain_configs_declare_none() {
        assert_eq!(method(r#"{"architectures":["LlamaForCausalLM"]}"#), None);
        assert_eq!(method(r#"{"quantization_config":null}"#), None);
    }
}
