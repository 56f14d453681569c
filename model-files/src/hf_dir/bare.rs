//! A base model saved without a head (`Qwen3Model`, `LlamaModel`: what sentence-transformers
//! saves of an embedding model): its tensors are named as inside `*ForCausalLM`'s `model.`,
//! without that prefix.

/// Whether tensor names in `names` are a bare base model's.
pub(crate) fn is_bare(names: &[&str]) -> bool {
    names
        .iter()
        .any(|n| *n == "embed_tokens.weight" || n.starts_with("layers."))
        && !names.iter().any(|n| n.starts_with("model."))
}

/// The `*ForCausalLM` name of a bare model's tensor `name`.
pub(crate) fn decoder_name(name: &str) -> String {
    format!("model.{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_names_are_recognised_and_prefixed() {
        assert!(is_bare(&[
            "embed_tokens.weight",
            "layers.0.mlp.up_proj.weight",
            "norm.weight"
        ]));
        assert!(!is_bare(&["model.embed_tokens.weight", "lm_head.weight"]));
        assert!(!is_bare(&[
            "model.layers.0.mlp.up_proj.weight",
            "score.weight"
        ]));
        assert_eq!(decoder_name("norm.weight"), "model.norm.weight");
    }
}
