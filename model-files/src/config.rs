//! The model hyper-parameters the engine needs, read from `config.json` or GGUF metadata.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;
use tessera_params::LengthDependentRope;

use crate::FormatError;
pub use crate::config::quantization::Quantization;
use crate::family::{ExpertActivation, ExpertNames, Family, FamilyKeys, Moe};

/// Model families Tessera implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 1/2/3, SmolLM, TinyLlama and other Llama-shaped models.
    Llama,
    /// Mistral (Llama with optional sliding-window attention).
    Mistral,
    /// Qwen2 (Llama with q/k/v bias).
    Qwen2,
    /// Qwen3 (dense): per-head q/k RMSNorm before RoPE, no bias.
    Qwen3,
    /// Qwen3-MoE: Qwen3's attention, sparse MoE MLPs.
    Qwen3Moe,
    /// Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention, sparse MoE MLPs beside a
    /// gated shared expert.
    Qwen2Moe,
    /// Mixtral: Mistral's attention, sparse MoE MLPs (GGUF: `llama` with experts).
    Mixtral,
    /// Phi-3, Phi-3.5 and Phi-4 (`Phi3ForCausalLM`): Llama's layer with fused `qkv_proj` and
    /// `gate_up_proj`, partial rotary, LongRoPE.
    Phi3,
    /// Gemma 2: `(1 + w)` sandwich norms, GeGLU, scaled embeddings, soft-capping, alternating
    /// sliding and global layers.
    Gemma2,
    /// Gemma 3 text (`Gemma3ForCausalLM`): Gemma 2's layers with q/k norms instead of
    /// soft-capping, and a separate RoPE base for the sliding layers.
    Gemma3,
    /// SmolLM3: Llama's layers, some of them without RoPE (`no_rope_layers`; every fourth by
    /// default, as llama.cpp's `smollm3` always has it).
    SmolLM3,
    /// gpt-oss (`GptOssForCausalLM`): biased attention with a learned sink logit per head,
    /// alternating sliding and full layers, sparse MoE MLPs of biased experts with a clamped
    /// SwiGLU.
    GptOss,
}

impl Architecture {
    /// The architectures as users name them, for error messages.
    pub const SUPPORTED: &'static str = "LlamaForCausalLM (llama), MistralForCausalLM (mistral), \
        Qwen2ForCausalLM (qwen2), Qwen3ForCausalLM (qwen3), Qwen3MoeForCausalLM (qwen3_moe; \
        GGUF qwen3moe), Qwen2MoeForCausalLM (qwen2_moe; GGUF qwen2moe), \
        MixtralForCausalLM (mixtral; GGUF llama with experts), \
        Phi3ForCausalLM (phi3), \
        Gemma2ForCausalLM (gemma2), \
        Gemma3ForCausalLM (gemma3_text; GGUF gemma3), \
        SmolLM3ForCausalLM (smollm3), \
        GptOssForCausalLM (gpt_oss; GGUF gpt-oss); and the \
        language model of \
        Gemma3ForConditionalGeneration, Mistral3ForConditionalGeneration and other \
        checkpoints that nest one of these under text_config";

    /// Parses a GGUF `general.architecture` value: the names [`Self::from_name`] knows, and
    /// `mistral3`, which llama.cpp's converter writes for Mistral 3 checkpoints (a wrapper's
    /// `model_type` in Hugging Face configs, so not one of those names), and `gpt-oss`.
    pub fn from_gguf_name(name: &str) -> Option<Self> {
        match name {
            "mistral3" => Some(Self::Mistral),
            "gpt-oss" => Some(Self::GptOss),
            _ => Self::from_name(name),
        }
    }

    /// Parses an HF `architectures[0]` / `model_type` or a GGUF `general.architecture` value.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "LlamaForCausalLM" | "llama" => Some(Self::Llama),
            "MistralForCausalLM" | "mistral" => Some(Self::Mistral),
            "Qwen2ForCausalLM" | "qwen2" => Some(Self::Qwen2),
            "Qwen3ForCausalLM" | "qwen3" => Some(Self::Qwen3),
            "Phi3ForCausalLM" | "phi3" => Some(Self::Phi3),
            "Qwen3MoeForCausalLM" | "qwen3_moe" | "qwen3moe" => Some(Self::Qwen3Moe),
            "Qwen2MoeForCausalLM" | "qwen2_moe" | "qwen2moe" => Some(Self::Qwen2Moe),
            "MixtralForCausalLM" | "mixtral" => Some(Self::Mixtral),
            "Gemma2ForCausalLM" | "gemma2" => Some(Self::Gemma2),
            "Gemma3ForCausalLM" | "gemma3_text" | "gemma3" => Some(Self::Gemma3),
            "SmolLM3ForCausalLM" | "smollm3" => Some(Self::SmolLM3),
            "GptOssForCausalLM" | "gpt_oss" => Some(Self::GptOss),
            _ => None,
        }
    }
}

/// How rotary position frequencies are adjusted for long contexts.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Positions divided by `factor`.
    Linear {
        /// Position divisor.
        factor: f32,
    },
    /// Llama 3.1's wavelength-dependent frequency scaling.
    Llama3 {
        /// Scaling of the lowest frequencies.
        factor: f32,
        /// Wavelength ratio below which frequencies are scaled fully.
        low_freq_factor: f32,
        /// Wavelength ratio above which frequencies are left alone.
        high_freq_factor: f32,
        /// The context length the model was pre-trained with.
        original_max_position_embeddings: f32,
    },
    /// YaRN: frequencies between two wavelength bounds blended from interpolated (÷ `factor`)
    /// to extrapolated, cos/sin scaled by `attention_factor`.
    Yarn {
        /// Interpolation factor.
        factor: f32,
        /// The context length the model was pre-trained with.
        original_max_position_embeddings: f32,
        /// Rotations at which frequencies stop being extrapolated.
        beta_fast: f32,
        /// Rotations at which frequencies are fully interpolated.
        beta_slow: f32,
        /// Factor of cos and sin.
        attention_factor: f32,
        /// Whether the blend's bounds are rounded outwards to whole dimensions.
        truncate: bool,
    },
    /// LongRoPE (Phi-3): each frequency divided by its `short_factor` while a sequence is at
    /// most `original_max_position_embeddings` long, by its `long_factor` past that; cos/sin
    /// scaled by `attention_factor`.
    LongRope {
        /// Divisors for sequences within the original context.
        short_factor: Vec<f32>,
        /// Divisors for longer sequences.
        long_factor: Vec<f32>,
        /// The context length the model was pre-trained with.
        original_max_position_embeddings: usize,
        /// Factor of cos and sin.
        attention_factor: f32,
    },
    /// Dynamic NTK: past `original_max_position_embeddings`, the base grows with the
    /// sequence's length `L` to `θ · (factor · L / original - (factor - 1))^(d / (d - 2))`.
    DynamicNtk {
        /// Scaling factor.
        factor: f32,
        /// The context length the model was pre-trained with.
        original_max_position_embeddings: usize,
    },
}

/// Storage dtype declared by the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
}

impl DType {
    /// Parses `float32`, `float16`, `bfloat16` (and the short forms).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "float32" | "f32" | "F32" => Some(Self::F32),
            "float16" | "f16" | "F16" | "half" => Some(Self::F16),
            "bfloat16" | "bf16" | "BF16" => Some(Self::BF16),
            _ => None,
        }
    }
}

/// Why a well-formed `config.json` describes a model Tessera does not serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotServed {
    /// The declared architecture, none of [`Architecture::SUPPORTED`].
    Architecture(String),
    /// Weights written by a quantization library.
    Quantized(Quantization),
}

/// Everything about a model's shape that the forward pass depends on.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The family.
    pub architecture: Architecture,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (GQA when fewer than `num_heads`).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// RoPE base.
    pub rope_theta: f32,
    /// RoPE frequency scaling, if any.
    pub rope_scaling: Option<RopeScaling>,
    /// Longest context the model supports.
    pub max_position_embeddings: usize,
    /// Whether `lm_head` reuses the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Attention window of the layers that slide (all of Mistral's; which ones:
    /// [`Family::layers`]); `None`: no layer does.
    pub sliding_window: Option<usize>,
    /// Whether q/k/v projections carry a bias (Qwen2).
    pub attention_bias: bool,
    /// Declared storage dtype, if any.
    pub dtype: Option<DType>,
    /// `bos_token_id` from the config.
    pub bos_token_id: Option<u32>,
    /// `eos_token_id` from the config (one or several).
    pub eos_token_ids: Vec<u32>,
    /// How the family's layers are made (norms, attention options, activation).
    pub family: Family,
    /// Labels of a sequence-classification head (`*ForSequenceClassification`: `score.weight`
    /// over the last token's final hidden state) in place of the LM head; `None`: none.
    pub score_labels: Option<usize>,
}

#[derive(Deserialize)]
struct RawConfig {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f32>,
    rope_theta: Option<f32>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    sliding_window: Option<Value>,
    use_sliding_window: Option<bool>,
    attention_bias: Option<bool>,
    qkv_bias: Option<bool>,
    dtype: Option<String>,
    torch_dtype: Option<String>,
    bos_token_id: Option<Value>,
    eos_token_id: Option<Value>,
    hidden_act: Option<String>,
    hidden_activation: Option<String>,
    layer_types: Option<Vec<String>>,
    sliding_window_pattern: Option<usize>,
    query_pre_attn_scalar: Option<f64>,
    attn_logit_softcapping: Option<f32>,
    final_logit_softcapping: Option<f32>,
    rope_local_base_freq: Option<f32>,
    partial_rotary_factor: Option<f64>,
    original_max_position_embeddings: Option<usize>,
    num_experts: Option<usize>,
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    experts_per_token: Option<usize>,
    swiglu_alpha: Option<f32>,
    swiglu_limit: Option<f32>,
    moe_intermediate_size: Option<usize>,
    shared_expert_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    no_rope_layers: Option<Vec<u8>>,
    no_rope_layer_interval: Option<usize>,
    num_labels: Option<usize>,
    id2label: Option<serde_json::Map<String, Value>>,
}

/// Reads token ids given as a number, a list of numbers, or null.
pub(crate) fn token_ids(value: Option<&Value>) -> Vec<u32> {
    match value {
        Some(Value::Number(n)) => n.as_u64().map(|id| vec![id as u32]).unwrap_or_default(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|v| v.as_u64().map(|id| id as u32))
            .collect(),
        _ => Vec::new(),
    }
}

impl ModelConfig {
    /// The longest sequence the model serves, as vLLM derives `max_model_len`: a scaling that
    /// stretches positions (linear, dynamic NTK) multiplies `max_position_embeddings` by its
    /// factor, YaRN reaches `original · factor`; Llama 3 and LongRoPE configs already declare
    /// the stretched length, as does Gemma 3, whose linear scaling is its global layers' only.
    /// Never shorter than what the config declares.
    pub fn context_length(&self) -> usize {
        let declared = self.max_position_embeddings;
        let stretched = match &self.rope_scaling {
            Some(RopeScaling::Linear { factor }) if self.family.local_rope_theta.is_none() => {
                declared as f64 * f64::from(*factor)
            }
            Some(RopeScaling::DynamicNtk { factor, .. }) => declared as f64 * f64::from(*factor),
            Some(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                ..
            }) => f64::from(*original_max_position_embeddings) * f64::from(*factor),
            _ => 0.0,
        };
        // Saturating float-to-int cast: an absurd factor cannot wrap.
        declared.max(stretched as usize)
    }

    /// How a sequence's length changes its rotary frequencies, if it does (LongRoPE, dynamic
    /// NTK): what a cache that shares keys between sequences must tell apart.
    pub fn length_dependent_rope(&self) -> Option<LengthDependentRope> {
        match &self.rope_scaling {
            Some(RopeScaling::LongRope {
                original_max_position_embeddings,
                ..
            }) => Some(LengthDependentRope::Switches {
                threshold: *original_max_position_embeddings,
            }),
            Some(RopeScaling::DynamicNtk {
                original_max_position_embeddings,
                ..
            }) => Some(LengthDependentRope::Grows {
                threshold: *original_max_position_embeddings,
            }),
            _ => None,
        }
    }

    /// Reads a Hugging Face `config.json` (transformers 4 and 5 key styles).
    pub fn from_hf_file(path: &Path) -> Result<Self, FormatError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                FormatError::Missing {
                    path: path.to_path_buf(),
                    hint: "a Hugging Face model directory needs config.json".into(),
                }
            } else {
                FormatError::io(path, e)
            }
        })?;
        Self::from_hf_json(&text)
            .map_err(|message| FormatError::invalid(path, message))
            .and_then(|c| {
                c.map_err(|not_served| match not_served {
                    NotServed::Architecture(found) => FormatError::UnsupportedArchitecture {
                        path: path.to_path_buf(),
                        found,
                        supported: Architecture::SUPPORTED.into(),
                    },
                    NotServed::Quantized(q) => FormatError::QuantizedCheckpoint {
                        path: path.to_path_buf(),
                        method: q.method,
                        quant_method: q.quant_method,
                    },
                })
            })
    }

    /// Parses `config.json` text, a decoder's own or a wrapper's that nests one under
    /// `text_config`. The outer error is malformed JSON or a bad value; the inner one says
    /// why a well-formed config is not served.
    pub fn from_hf_json(text: &str) -> Result<Result<Self, NotServed>, String> {
        let config: Value =
            serde_json::from_str(text).map_err(|e| format!("invalid config: {e}"))?;
        let quantization = quantization::declared(&config);
        if let Some(q) = quantization::unread(quantization.clone(), None) {
            return Ok(Err(NotServed::Quantized(q)));
        }
        // A wrapper's `model_type` can be its language model's GGUF name (`gemma3`), so the
        // nested config decides unless `architectures` names a decoder.
        let by_name = declared_architecture(&config, false);
        let (config, architecture) = match (by_name, wrapped::language_model(&config)) {
            (Ok(a), _) => (config, a),
            (Err(_), Some((wrapper, text))) => match declared_architecture(&text, true) {
                Ok(a) => (text, a),
                Err(inner) => {
                    return Ok(Err(NotServed::Architecture(format!(
                        "{wrapper} (language model {inner})"
                    ))));
                }
            },
            (Err(_), None) => match declared_architecture(&config, true) {
                Ok(a) => (config, a),
                Err(declared) => return Ok(Err(NotServed::Architecture(declared))),
            },
        };
        if let Some(q) = quantization::unread(quantization, Some(architecture)) {
            return Ok(Err(NotServed::Quantized(q)));
        }
        let classifies = config
            .get("architectures")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .any(|a| a.ends_with("ForSequenceClassification"));
        let raw: RawConfig = serde_json::from_value(class_defaults::filled(config))
            .map_err(|e| format!("invalid config: {e}"))?;
        if raw.num_attention_heads == 0 || raw.hidden_size == 0 {
            return Err("num_attention_heads and hidden_size must be positive".into());
        }
        let num_kv_heads = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        if num_kv_heads == 0 || !raw.num_attention_heads.is_multiple_of(num_kv_heads) {
            return Err(format!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({num_kv_heads})",
                raw.num_attention_heads
            ));
        }
        let head_dim = raw
            .head_dim
            .unwrap_or(raw.hidden_size / raw.num_attention_heads);
        if !head_dim.is_multiple_of(2) {
            return Err(format!(
                "head_dim ({head_dim}) must be even for rotary embeddings"
            ));
        }
        let Layers {
            rope_theta,
            rope_scaling,
            sliding_window,
            family,
        } = layers(&raw, architecture, head_dim)?;
        let max_position_embeddings = raw.max_position_embeddings.unwrap_or(4096);
        let dtype_name = raw.dtype.as_deref().or(raw.torch_dtype.as_deref());
        let dtype = match dtype_name {
            None => None,
            Some(name) => Some(DType::from_name(name).ok_or_else(|| {
                format!("unsupported dtype {name:?}; supported: float32, float16, bfloat16")
            })?),
        };
        Ok(Ok(Self {
            architecture,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_layers: raw.num_hidden_layers,
            num_heads: raw.num_attention_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            max_position_embeddings,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            sliding_window,
            attention_bias: raw.attention_bias.or(raw.qkv_bias).unwrap_or(matches!(
                architecture,
                Architecture::Qwen2 | Architecture::Qwen2Moe
            )),
            dtype,
            bos_token_id: token_ids(raw.bos_token_id.as_ref()).first().copied(),
            eos_token_ids: token_ids(raw.eos_token_id.as_ref()),
            family,
            // transformers' default is two labels.
            score_labels: classifies.then(|| {
                raw.num_labels
                    .or(raw.id2label.as_ref().map(|m| m.len()))
                    .unwrap_or(2)
            }),
        }))
    }
}

/// The architecture a config declares (its first known `architectures` entry, else, where
/// `or_model_type`, its `model_type`), or what it declares when that is none Tessera
/// implements.
fn declared_architecture(config: &Value, or_model_type: bool) -> Result<Architecture, String> {
    let names: Vec<&str> = config
        .get("architectures")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let model_type = config.get("model_type").and_then(Value::as_str);
    names
        .iter()
        .find_map(|a| Architecture::from_name(a))
        .or_else(|| {
            model_type
                .filter(|_| or_model_type)
                .and_then(Architecture::from_name)
        })
        .ok_or_else(|| {
            names
                .first()
                .copied()
                .or(model_type)
                .unwrap_or("<none declared>")
                .to_string()
        })
}

/// What a config says about RoPE and the layers.
struct Layers {
    rope_theta: f32,
    rope_scaling: Option<RopeScaling>,
    sliding_window: Option<usize>,
    family: Family,
}

/// Decoder layers a configuration may declare: far above any released model, and small enough
/// that the per-layer tables a hostile file asks for stay small.
pub(crate) const MAX_LAYERS: usize = 1024;

fn layers(raw: &RawConfig, architecture: Architecture, head_dim: usize) -> Result<Layers, String> {
    if raw.num_hidden_layers > MAX_LAYERS {
        return Err(format!(
            "num_hidden_layers {} is more than the {MAX_LAYERS} supported",
            raw.num_hidden_layers
        ));
    }
    let rope = RopeKeys::parse(raw, architecture)?;
    let max_position_embeddings = raw.max_position_embeddings.unwrap_or(4096);
    let rotary_factor = raw
        .partial_rotary_factor
        .or_else(|| rope.global?.get("partial_rotary_factor")?.as_f64())
        .unwrap_or(1.0);
    let rotary_dim = (head_dim as f64 * rotary_factor) as usize;
    if rotary_dim == 0 || rotary_dim > head_dim || !rotary_dim.is_multiple_of(2) {
        return Err(format!(
            "partial_rotary_factor {rotary_factor} gives {rotary_dim} rotary dimensions of \
             {head_dim}; they must be even and at least 2"
        ));
    }
    let context = ContextLengths {
        max: max_position_embeddings,
        original: raw.original_max_position_embeddings,
    };
    let phi3 = architecture == Architecture::Phi3;
    let rope_scaling = parse_rope_scaling(rope.global, context, rotary_dim, phi3)?;
    let sliding_window = match (&raw.sliding_window, raw.use_sliding_window) {
        (_, Some(false))
            if matches!(
                architecture,
                Architecture::Qwen2
                    | Architecture::Qwen3
                    | Architecture::Qwen3Moe
                    | Architecture::Qwen2Moe
                    | Architecture::SmolLM3
            ) =>
        {
            None
        }
        (Some(Value::Number(n)), _) => n.as_u64().map(|w| w as usize),
        _ => None,
    };
    check_activation(raw, architecture)?;
    let keys = FamilyKeys {
        sliding_layers: sliding_layers(raw)?,
        query_pre_attn_scalar: raw.query_pre_attn_scalar,
        attention_softcap: raw.attn_logit_softcapping,
        final_softcap: raw.final_logit_softcapping,
        local_rope_theta: rope.local_theta,
        rotary_dim: Some(rotary_dim),
        moe: moe(raw, architecture)?,
        sparse_layers: sparse_layers(raw),
        rope_layers: rope_layers(raw)?,
        ..FamilyKeys::default()
    };
    let family = Family::new(
        architecture,
        raw.num_hidden_layers,
        head_dim,
        raw.hidden_size,
        sliding_window,
        keys,
    );
    Ok(Layers {
        rope_theta: rope.theta,
        rope_scaling,
        sliding_window,
        family,
    })
}

/// Where a config keeps its RoPE parameters: top-level keys (transformers 4), one
/// `rope_parameters` object (5), or one per layer type (Gemma 3 under 5).
struct RopeKeys<'a> {
    theta: f32,
    /// The scaling object of the global layers, if any.
    global: Option<&'a Value>,
    /// The base of the sliding layers, when they have their own (Gemma 3).
    local_theta: Option<f32>,
}

impl<'a> RopeKeys<'a> {
    fn parse(raw: &'a RawConfig, arch: Architecture) -> Result<Self, String> {
        let params = raw.rope_parameters.as_ref();
        let theta_of = |v: &Value| v.get("rope_theta")?.as_f64().map(|t| t as f32);
        let (global, local) = match params.and_then(|p| p.get("full_attention")) {
            Some(full) => {
                let local = params.and_then(|p| p.get("sliding_attention"));
                if let Some(kind) = local.and_then(|l| l.get("rope_type")?.as_str())
                    && kind != "default"
                {
                    return Err(format!(
                        "unsupported rope scaling {kind:?} of the sliding layers; supported: \
                         default"
                    ));
                }
                (Some(full), local.and_then(theta_of))
            }
            None => (
                raw.rope_scaling.as_ref().or(params),
                raw.rope_local_base_freq,
            ),
        };
        let gemma3 = arch == Architecture::Gemma3;
        let default_theta = if gemma3 { 1_000_000.0 } else { 10_000.0 };
        Ok(Self {
            theta: raw
                .rope_theta
                .or_else(|| global.and_then(theta_of))
                .unwrap_or(default_theta),
            global,
            local_theta: gemma3.then(|| local.unwrap_or(10_000.0)),
        })
    }
}

/// Which layers rotate q and k, when the config lists them (SmolLM3's `no_rope_layers`: 1
/// for a layer with RoPE, 0 for one without; or `no_rope_layer_interval`: every n-th layer
/// without).
fn rope_layers(raw: &RawConfig) -> Result<Option<Vec<bool>>, String> {
    if let Some(listed) = &raw.no_rope_layers {
        if listed.len() != raw.num_hidden_layers {
            return Err(format!(
                "no_rope_layers lists {} layers of {}",
                listed.len(),
                raw.num_hidden_layers
            ));
        }
        return Ok(Some(listed.iter().map(|&r| r != 0).collect()));
    }
    Ok(raw.no_rope_layer_interval.filter(|&n| n > 0).map(|n| {
        (0..raw.num_hidden_layers)
            .map(|i| !(i + 1).is_multiple_of(n))
            .collect()
    }))
}

/// Which layers slide, from `layer_types` (transformers 5) or `sliding_window_pattern`.
fn sliding_layers(raw: &RawConfig) -> Result<Option<Vec<bool>>, String> {
    if let Some(types) = &raw.layer_types {
        return types
            .iter()
            .map(|t| match t.as_str() {
                "sliding_attention" => Ok(true),
                "full_attention" => Ok(false),
                other => Err(format!(
                    "unsupported layer type {other:?}; supported: full_attention, \
                     sliding_attention"
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some);
    }
    Ok(raw.sliding_window_pattern.filter(|&p| p > 0).map(|p| {
        (0..raw.num_hidden_layers)
            .map(|i| !(i + 1).is_multiple_of(p))
            .collect()
    }))
}

/// The sparse MLP of a Qwen2-MoE, Qwen3-MoE or Mixtral config.
fn moe(raw: &RawConfig, arch: Architecture) -> Result<Option<Moe>, String> {
    let (experts, intermediate, norm, names) = match arch {
        Architecture::Qwen3Moe | Architecture::Qwen2Moe => (
            raw.num_experts.or(raw.num_local_experts),
            raw.moe_intermediate_size,
            raw.norm_topk_prob.unwrap_or(false),
            ExpertNames::Qwen,
        ),
        Architecture::Mixtral => (
            raw.num_local_experts.or(raw.num_experts),
            Some(raw.intermediate_size),
            true,
            ExpertNames::Mixtral,
        ),
        // The softmax over the picked logits is the renormalised one over all of them.
        Architecture::GptOss => (
            raw.num_local_experts.or(raw.num_experts),
            Some(raw.intermediate_size),
            true,
            ExpertNames::GptOss,
        ),
        _ => return Ok(None),
    };
    let activation = match arch {
        // transformers' defaults; the released configs state the limit only.
        Architecture::GptOss => ExpertActivation::ClampedSwiglu {
            alpha: raw.swiglu_alpha.unwrap_or(1.702),
            limit: raw.swiglu_limit.unwrap_or(7.0),
        },
        _ => ExpertActivation::Silu,
    };
    let top_k = raw.num_experts_per_tok.or(raw.experts_per_token);
    let (Some(experts), Some(top_k), Some(expert_intermediate)) = (experts, top_k, intermediate)
    else {
        return Err(
            "a mixture-of-experts config needs num_experts (num_local_experts), \
             num_experts_per_tok and moe_intermediate_size"
                .into(),
        );
    };
    if top_k == 0 || top_k > experts {
        return Err(format!(
            "num_experts_per_tok ({top_k}) must be between 1 and the experts ({experts})"
        ));
    }
    let shared_expert_intermediate = match arch {
        Architecture::Qwen2Moe => raw.shared_expert_intermediate_size.filter(|&n| n > 0),
        _ => None,
    };
    Ok(Some(Moe {
        experts,
        top_k,
        expert_intermediate,
        norm_topk_prob: norm,
        names,
        shared_expert_intermediate,
        activation,
    }))
}

/// Which layers are sparse under `decoder_sparse_step` and `mlp_only_layers` (Qwen MoE).
fn sparse_layers(raw: &RawConfig) -> Option<Vec<bool>> {
    if raw.decoder_sparse_step.is_none() && raw.mlp_only_layers.is_none() {
        return None;
    }
    let step = raw.decoder_sparse_step.unwrap_or(1).max(1);
    let dense = raw.mlp_only_layers.clone().unwrap_or_default();
    Some(
        (0..raw.num_hidden_layers)
            .map(|i| !dense.contains(&i) && (i + 1).is_multiple_of(step))
            .collect(),
    )
}

/// The MLP activation the config names must be the one the family's layers compute.
fn check_activation(raw: &RawConfig, arch: Architecture) -> Result<(), String> {
    let gemma = matches!(arch, Architecture::Gemma2 | Architecture::Gemma3);
    let (name, expected): (Option<&str>, &[&str]) = if gemma {
        (
            raw.hidden_activation
                .as_deref()
                .or(raw.hidden_act.as_deref()),
            &["gelu_pytorch_tanh", "gelu_tanh"],
        )
    } else {
        (raw.hidden_act.as_deref(), &["silu", "swish"])
    };
    match name {
        Some(n) if !expected.contains(&n) => Err(format!(
            "unsupported activation {n:?} for this architecture; supported: {}",
            expected.join(", ")
        )),
        _ => Ok(()),
    }
}

/// The context lengths a RoPE scaling falls back on when its object omits them.
#[derive(Clone, Copy)]
struct ContextLengths {
    max: usize,
    /// A top-level `original_max_position_embeddings` (Phi-3 keeps it there).
    original: Option<usize>,
}

/// `value`'s scaling; with `phi3`, the older names of LongRoPE (`su`, `yarn`) are LongRoPE,
/// as transformers reads Phi-3 configs.
fn parse_rope_scaling(
    value: Option<&Value>,
    context: ContextLengths,
    rotary_dim: usize,
    phi3: bool,
) -> Result<Option<RopeScaling>, String> {
    let Some(v) = value.filter(|v| v.is_object()) else {
        return Ok(None);
    };
    let kind = match v
        .get("rope_type")
        .or_else(|| v.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default")
    {
        "su" | "yarn" if phi3 => "longrope",
        kind => kind,
    };
    let opt = |key: &str| v.get(key).and_then(Value::as_f64);
    let num = |key: &str| -> Result<f32, String> {
        opt(key)
            .map(|x| x as f32)
            .ok_or_else(|| format!("rope scaling {kind:?} needs a numeric {key:?}"))
    };
    let original = context
        .original
        .or_else(|| opt("original_max_position_embeddings").map(|x| x as usize));
    match kind {
        "default" => Ok(None),
        "linear" => Ok(Some(RopeScaling::Linear {
            factor: num("factor")?,
        })),
        "llama3" => Ok(Some(RopeScaling::Llama3 {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_max_position_embeddings: num("original_max_position_embeddings")?,
        })),
        "yarn" => {
            let original = original.unwrap_or(context.max);
            let factor = opt("factor").unwrap_or(context.max as f64 / original as f64);
            let attention_factor = opt("attention_factor").unwrap_or_else(|| {
                match (opt("mscale"), opt("mscale_all_dim")) {
                    (Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                        yarn_mscale(factor, m) / yarn_mscale(factor, all)
                    }
                    _ => yarn_mscale(factor, 1.0),
                }
            });
            Ok(Some(RopeScaling::Yarn {
                factor: factor as f32,
                original_max_position_embeddings: original as f32,
                beta_fast: opt("beta_fast").unwrap_or(32.0) as f32,
                beta_slow: opt("beta_slow").unwrap_or(1.0) as f32,
                attention_factor: attention_factor as f32,
                truncate: v.get("truncate").and_then(Value::as_bool).unwrap_or(true),
            }))
        }
        "longrope" => {
            let original =
                original.ok_or("longrope scaling needs original_max_position_embeddings")?;
            let factors = |key: &str| -> Result<Vec<f32>, String> {
                let list = v.get(key).and_then(Value::as_array);
                let values: Option<Vec<f32>> = list
                    .map(|l| l.iter().map(|x| x.as_f64().map(|x| x as f32)).collect())
                    .unwrap_or(None);
                match values {
                    Some(f) if f.len() == rotary_dim / 2 => Ok(f),
                    _ => Err(format!(
                        "longrope scaling needs {key:?}: {} numbers (one per rotary frequency)",
                        rotary_dim / 2
                    )),
                }
            };
            let factor = opt("factor").unwrap_or(context.max as f64 / original as f64);
            Ok(Some(RopeScaling::LongRope {
                short_factor: factors("short_factor")?,
                long_factor: factors("long_factor")?,
                original_max_position_embeddings: original,
                attention_factor: opt("attention_factor")
                    .unwrap_or_else(|| longrope_attention_factor(factor, original))
                    as f32,
            }))
        }
        "dynamic" => Ok(Some(RopeScaling::DynamicNtk {
            factor: num("factor")?,
            original_max_position_embeddings: context.max,
        })),
        other => Err(format!(
            "unsupported rope scaling {other:?}; supported: default, linear, llama3, yarn, \
             longrope, dynamic"
        )),
    }
}

/// YaRN's attention factor for `factor` (transformers' `get_mscale`).
pub(crate) fn yarn_mscale(factor: f64, mscale: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * mscale * factor.ln() + 1.0
    }
}

/// LongRoPE's default attention factor: `√(1 + ln(factor) / ln(original))`.
pub(crate) fn longrope_attention_factor(factor: f64, original: usize) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        (1.0 + factor.ln() / (original as f64).ln()).sqrt()
    }
}

mod class_defaults;
mod quantization;
mod wrapped;

#[cfg(test)]
mod tests;
