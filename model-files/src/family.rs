//! What sets one decoder family apart from another, as data: how RMSNorm applies its weight
//! and where norms sit, the attention's options (q/k norms, score scale, soft-capping, window
//! and rotary table per layer), the MLP's activation, the embedding scale. The shard's one
//! forward pass follows a [`Family`]; nothing in it names an architecture.

use crate::Architecture;

/// The gate's activation of a gated MLP (`act(gate) · up`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) · up` (Llama, Mistral, Qwen).
    Silu,
    /// `gelu_tanh(gate) · up`, GELU's tanh approximation (Gemma's GeGLU).
    GeluTanh,
}

/// How a model names its experts' tensors (in Hugging Face files; GGUF names are the same
/// for both).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertNames {
    /// `mlp.gate`, `mlp.experts.E.{gate,up,down}_proj` (Qwen MoE).
    Qwen,
    /// `block_sparse_moe.gate`, `block_sparse_moe.experts.E.{w1,w3,w2}` (Mixtral).
    Mixtral,
    /// `mlp.router` (with a bias), the experts stacked: `mlp.experts.gate_up_proj`
    /// (`[experts, hidden, 2 · inner]`, gate and up columns interleaved), `down_proj`
    /// (`[experts, inner, hidden]`) and their biases (gpt-oss).
    GptOss,
}

/// What an expert applies between its `[gate | up]` and down products.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpertActivation {
    /// `silu(gate) · up`.
    Silu,
    /// gpt-oss's: `(clamp(up, ±limit) + 1) · g · sigmoid(alpha · g)`, `g = min(gate, limit)`.
    ClampedSwiglu {
        /// The sigmoid's gain.
        alpha: f32,
        /// The clamp.
        limit: f32,
    },
}

/// A sparse mixture-of-experts MLP: a router's softmax picks `top_k` of `experts` gated
/// MLPs per token, whose outputs are summed with the picked probabilities as weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Moe {
    /// Experts per sparse layer.
    pub experts: usize,
    /// Experts each token goes through.
    pub top_k: usize,
    /// Inner width of one expert.
    pub expert_intermediate: usize,
    /// Whether the picked probabilities are renormalised to sum to 1.
    pub norm_topk_prob: bool,
    /// Tensor names in Hugging Face files.
    pub names: ExpertNames,
    /// Inner width of the shared expert every token also goes through, its output scaled by
    /// `sigmoid(x · shared_expert_gate)` (Qwen2-MoE); `None`: no shared expert.
    pub shared_expert_intermediate: Option<usize>,
    /// The experts' activation.
    pub activation: ExpertActivation,
}

/// One decoder layer's attention options, and whether its MLP is sparse.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerSpec {
    /// How many positions back a query sees, itself included; `None`: all of them.
    pub window: Option<usize>,
    /// Whether the layer rotates with [`Family::local_rope_theta`] instead of the model's RoPE
    /// (Gemma 3's sliding layers).
    pub local_rope: bool,
    /// Whether the layer's MLP is [`Family::moe`] (else the dense MLP).
    pub sparse: bool,
    /// Whether the layer rotates q and k (SmolLM3 has layers without position encoding).
    pub rope: bool,
}

/// The layer structure of a model, read from its config (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// Added to every RMSNorm weight as it is loaded: 0 for `x̂ · w`, 1 for Gemma's
    /// `x̂ · (1 + w)` (0 again for Gemma GGUF files, whose converter stored `1 + w`).
    pub norm_weight_offset: f32,
    /// Norms on the attention and MLP outputs before their residual adds, next to the usual
    /// pre-norms (Gemma 2 and 3: `post_attention_layernorm`, `post_feedforward_layernorm`).
    pub sandwich_norms: bool,
    /// A per-head RMSNorm of q and of k (weights of `head_dim`) before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// The MLP's gate activation.
    pub activation: Activation,
    /// Factor of the embedding rows (Gemma: `√hidden`).
    pub embedding_scale: Option<f32>,
    /// Factor of every attention score (`1 / √head_dim`, or `query_pre_attn_scalar^-½`).
    pub attention_scale: f32,
    /// `cap · tanh(score / cap)` on the attention scores (Gemma 2).
    pub attention_softcap: Option<f32>,
    /// `cap · tanh(logit / cap)` on the final logits (Gemma 2).
    pub final_softcap: Option<f32>,
    /// Leading dimensions of each head that rotate (fewer than `head_dim`: partial rotary).
    pub rotary_dim: usize,
    /// The unscaled RoPE base of layers with [`LayerSpec::local_rope`] (Gemma 3's 10 000).
    pub local_rope_theta: Option<f32>,
    /// The sparse MLP of the layers with [`LayerSpec::sparse`], if the model has one.
    pub moe: Option<Moe>,
    /// Per layer, in order.
    pub layers: Vec<LayerSpec>,
}

/// What a family's config says beyond the shared hyper-parameters, as its parser read it.
#[derive(Debug, Clone, Default)]
pub(crate) struct FamilyKeys {
    /// Which layers slide, when the config lists them (`layer_types`, or a GGUF pattern).
    pub(crate) sliding_layers: Option<Vec<bool>>,
    pub(crate) query_pre_attn_scalar: Option<f64>,
    /// A score factor given directly (GGUF `attention.scale`).
    pub(crate) attention_scale: Option<f32>,
    pub(crate) attention_softcap: Option<f32>,
    pub(crate) final_softcap: Option<f32>,
    pub(crate) rotary_dim: Option<usize>,
    pub(crate) local_rope_theta: Option<f32>,
    /// Whether norm weights are stored as `1 + w` already (llama.cpp's Gemma converter).
    pub(crate) norms_stored_plus_one: bool,
    pub(crate) moe: Option<Moe>,
    /// Which layers are sparse when not all are (`decoder_sparse_step`, `mlp_only_layers`).
    pub(crate) sparse_layers: Option<Vec<bool>>,
    /// Which layers rotate q and k, when the config lists them (SmolLM3's `no_rope_layers`).
    pub(crate) rope_layers: Option<Vec<bool>>,
}

impl Architecture {
    /// Whether this family's layers are Gemma's: `(1 + w)` norms, sandwich norms, GeGLU,
    /// `√hidden` embedding scale.
    fn is_gemma(self) -> bool {
        matches!(self, Self::Gemma2 | Self::Gemma3)
    }

    /// Layer `i`'s default sliding, when a config does not list its layers: every layer
    /// under a window (Llama, Mistral, Qwen), Gemma 2's and gpt-oss's even layers, Gemma 3's
    /// layers but every sixth.
    fn slides_by_default(self, i: usize) -> bool {
        match self {
            Self::Gemma2 | Self::GptOss => !(i + 1).is_multiple_of(2),
            Self::Gemma3 => !(i + 1).is_multiple_of(6),
            _ => true,
        }
    }

    /// Whether layer `i` rotates q and k, when a config does not list its layers: every layer
    /// but SmolLM3's every fourth.
    fn rotates_by_default(self, i: usize) -> bool {
        match self {
            Self::SmolLM3 => !(i + 1).is_multiple_of(4),
            _ => true,
        }
    }
}

impl Family {
    /// The description of a model of `arch` with `num_layers` layers of `head_dim`, a window
    /// of `window` where its layers slide, and the family-specific `keys`.
    pub(crate) fn new(
        arch: Architecture,
        num_layers: usize,
        head_dim: usize,
        hidden_size: usize,
        window: Option<usize>,
        keys: FamilyKeys,
    ) -> Self {
        let gemma = arch.is_gemma();
        let layers = (0..num_layers)
            .map(|i| {
                let slides = match &keys.sliding_layers {
                    Some(listed) => listed.get(i).copied().unwrap_or(false),
                    None => arch.slides_by_default(i),
                };
                let sparse = match &keys.sparse_layers {
                    Some(listed) => listed.get(i).copied().unwrap_or(false),
                    None => true,
                };
                let rope = match &keys.rope_layers {
                    Some(listed) => listed.get(i).copied().unwrap_or(true),
                    None => arch.rotates_by_default(i),
                };
                LayerSpec {
                    window: window.filter(|_| slides),
                    local_rope: slides && keys.local_rope_theta.is_some(),
                    sparse: sparse && keys.moe.is_some(),
                    rope,
                }
            })
            .collect();
        let attention_scale = match (keys.attention_scale, keys.query_pre_attn_scalar) {
            (Some(scale), _) => scale,
            (None, Some(s)) => s.powf(-0.5) as f32,
            (None, None) => 1.0 / (head_dim as f32).sqrt(),
        };
        Self {
            norm_weight_offset: if gemma && !keys.norms_stored_plus_one {
                1.0
            } else {
                0.0
            },
            sandwich_norms: gemma,
            qk_norm: matches!(
                arch,
                Architecture::Qwen3 | Architecture::Qwen3Moe | Architecture::Gemma3
            ),
            activation: if gemma {
                Activation::GeluTanh
            } else {
                Activation::Silu
            },
            embedding_scale: gemma.then(|| (hidden_size as f64).sqrt() as f32),
            attention_scale,
            attention_softcap: keys.attention_softcap,
            final_softcap: keys.final_softcap,
            rotary_dim: keys.rotary_dim.unwrap_or(head_dim),
            local_rope_theta: keys.local_rope_theta,
            moe: keys.moe,
            layers,
        }
    }

    /// Llama's layers (what Llama, Mistral and Qwen2 share), every one under `window`.
    pub fn llama(num_layers: usize, head_dim: usize, window: Option<usize>) -> Self {
        Self::new(
            Architecture::Llama,
            num_layers,
            head_dim,
            0,
            window,
            FamilyKeys::default(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma_layers_alternate_and_llama_layers_all_slide() {
        let g = Family::new(
            Architecture::Gemma2,
            4,
            16,
            64,
            Some(8),
            FamilyKeys::default(),
        );
        let windows: Vec<_> = g.layers.iter().map(|l| l.window).collect();
        assert_eq!(windows, [Some(8), None, Some(8), None]);
        assert_eq!(g.embedding_scale, Some(8.0));
        assert_eq!(g.norm_weight_offset, 1.0);
        let l = Family::llama(2, 16, Some(4));
        assert!(
            l.layers
                .iter()
                .all(|s| s.window == Some(4) && !s.local_rope)
        );
        assert_eq!((l.attention_scale, l.rotary_dim), (0.25, 16));
    }
}
