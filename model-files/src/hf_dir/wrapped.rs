//! The language model inside a wrapped checkpoint (`Gemma3ForConditionalGeneration`,
//! `Mistral3ForConditionalGeneration`, LLaVA-style models): its tensors under the names its
//! own `*ForCausalLM` checkpoint gives them, and the other towers' tensors set aside.
//!
//! Transformers has saved such checkpoints in two layouts: `language_model.model.…` and
//! `language_model.lm_head.…` (before 4.52), and `model.language_model.…` beside a top-level
//! `lm_head.…` (since). Everything else in a wrapped checkpoint (the vision tower, the
//! projector) belongs to inputs Tessera does not take yet.

/// Where one stored tensor goes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// A decoder tensor, under its `*ForCausalLM` name.
    Decoder(String),
    /// Another tower's tensor.
    OtherTower,
}

/// Whether tensor names in `names` follow one of the wrapped layouts.
pub(crate) fn is_wrapped<'a>(mut names: impl Iterator<Item = &'a str>) -> bool {
    names.any(|n| n.starts_with("language_model.") || n.starts_with("model.language_model."))
}

/// The role of the tensor stored as `name` in a wrapped checkpoint.
pub(crate) fn role(name: &str) -> Role {
    if let Some(rest) = name.strip_prefix("language_model.model.") {
        Role::Decoder(format!("model.{rest}"))
    } else if let Some(rest) = name.strip_prefix("model.language_model.") {
        Role::Decoder(format!("model.{rest}"))
    } else if let Some(rest) = name.strip_prefix("language_model.lm_head.") {
        Role::Decoder(format!("lm_head.{rest}"))
    } else if name.starts_with("lm_head.") {
        Role::Decoder(name.to_string())
    } else {
        Role::OtherTower
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_layouts_map_to_decoder_names() {
        let decoder = |n: &str| Role::Decoder(n.to_string());
        assert_eq!(
            role("language_model.model.layers.0.self_attn.q_proj.weight"),
            decoder("model.layers.0.self_attn.q_proj.weight")
        );
        assert_eq!(
            role("language_model.lm_head.weight"),
            decoder("lm_head.weight")
        );
        assert_eq!(
            role("model.language_model.embed_tokens.weight"),
            decoder("model.embed_tokens.weight")
        );
        assert_eq!(role("lm_head.weight"), decoder("lm_head.weight"));
        for other in [
            "vision_tower.vision_model.embeddings.patch_embedding.weight",
            "model.vision_tower.vision_model.post_layernorm.weight",
            "multi_modal_projector.linear_1.weight",
            "model.multi_modal_projector.mm_input_projection_weight",
        ] {
            assert_eq!(role(other), Role::OtherTower, "{other}");
        }
    }

    #[test]
    fn plain_checkpoints_are_not_wrapped() {
        let plain = [
            "model.embed_tokens.weight",
            "model.layers.0.mlp.up_proj.weight",
            "lm_head.weight",
        ];
        assert!(!is_wrapped(plain.into_iter()));
        assert!(is_wrapped(["model.language_model.norm.weight"].into_iter()));
        assert!(is_wrapped(["language_model.model.norm.weight"].into_iter()));
    }
}
