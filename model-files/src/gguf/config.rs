//! [`ModelConfig`] and [`GgufTokenizerSpec`] from GGUF metadata.

use super::{GgufFile, MetadataValue};
use crate::family::{ExpertNames, Family, FamilyKeys, Moe};
use tessera_text::GgufTokenizerSpec;

use crate::{Architecture, DType, FormatError, ModelConfig, RopeScaling};

/// The attention head layout of a model, as [`GgufFile::attention_shape`] reads it.
struct AttentionShape {
    hidden_size: usize,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    /// Leading dimensions of each head that rotate.
    rotary_dim: usize,
}

impl GgufFile {
    fn invalid(&self, message: impl Into<String>) -> FormatError {
        FormatError::invalid(&self.path, message)
    }

    fn wrong_type(&self, key: &str, expected: &str, found: &MetadataValue) -> FormatError {
        self.invalid(format!(
            "metadata {key} must be {expected}, found {} {}",
            found.type_name(),
            short(found)
        ))
    }

    pub(super) fn required_str(&self, key: &str) -> Result<&str, FormatError> {
        let value = self
            .metadata(key)
            .ok_or_else(|| self.invalid(format!("missing metadata key {key}")))?;
        value
            .as_str()
            .ok_or_else(|| self.wrong_type(key, "a string", value))
    }

    fn optional_str(&self, key: &str) -> Result<Option<String>, FormatError> {
        match self.metadata(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(|s| Some(s.to_owned()))
                .ok_or_else(|| self.wrong_type(key, "a string", v)),
        }
    }

    pub(super) fn optional_usize(&self, key: &str) -> Result<Option<usize>, FormatError> {
        match self.metadata(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, "a non-negative integer", v)),
        }
    }

    pub(super) fn required_usize(&self, key: &str) -> Result<usize, FormatError> {
        self.optional_usize(key)?
            .ok_or_else(|| self.invalid(format!("missing metadata key {key}")))
    }

    fn optional_u32(&self, key: &str) -> Result<Option<u32>, FormatError> {
        match self.metadata(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, "a token id (u32)", v)),
        }
    }

    fn optional_f32(&self, key: &str) -> Result<Option<f32>, FormatError> {
        match self.metadata(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| self.wrong_type(key, "a number", v)),
        }
    }

    fn optional_bool(&self, key: &str) -> Result<Option<bool>, FormatError> {
        match self.metadata(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, "a bool", v)),
        }
    }

    fn optional_array<T>(
        &self,
        key: &str,
        expected: &str,
        item: impl Fn(&MetadataValue) -> Option<T>,
    ) -> Result<Option<Vec<T>>, FormatError> {
        let Some(value) = self.metadata(key) else {
            return Ok(None);
        };
        let items = value
            .as_array()
            .ok_or_else(|| self.wrong_type(key, expected, value))?;
        items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                item(v).ok_or_else(|| self.wrong_type(&format!("{key}[{i}]"), expected, v))
            })
            .collect::<Result<Vec<T>, _>>()
            .map(Some)
    }

    /// The model's hyper-parameters from `general.architecture` and the `{arch}.*` keys.
    pub fn model_config(&self) -> Result<ModelConfig, FormatError> {
        let arch = self.architecture()?;
        let architecture = Architecture::from_gguf_name(arch).ok_or_else(|| {
            FormatError::UnsupportedArchitecture {
                path: self.path.clone(),
                found: arch.to_owned(),
                supported: Architecture::SUPPORTED.into(),
            }
        })?;
        let key = |k: &str| format!("{arch}.{k}");
        // Ministral 3's attention temperature (llama.cpp's `mistral3` with this key) is not
        // implemented; Mistral Small 3.x files do not have it.
        if self.metadata(&key("attention.temperature_scale")).is_some() {
            return Err(FormatError::UnsupportedArchitecture {
                path: self.path.clone(),
                found: format!("{arch} with attention.temperature_scale (Ministral 3)"),
                supported: Architecture::SUPPORTED.into(),
            });
        }
        let AttentionShape {
            hidden_size,
            num_heads,
            num_kv_heads,
            head_dim,
            rotary_dim,
        } = self.attention_shape(arch)?;
        let rope_theta = self
            .optional_f32(&key("rope.freq_base"))?
            .unwrap_or(10_000.0);
        let rope_scaling = match self.long_rope(arch, rotary_dim)? {
            Some(long) => Some(long),
            None => self.rope_scaling(arch, head_dim, rope_theta)?,
        };
        let vocab_size = self.vocab_size(arch)?;
        let dtype = self.file_dtype()?;
        let eos_token_ids = self.eos_token_ids()?;
        let num_layers = self.required_usize(&key("block_count"))?;
        if num_layers > crate::config::MAX_LAYERS {
            return Err(self.invalid(format!(
                "{} is {num_layers}: more than the {} layers supported",
                key("block_count"),
                crate::config::MAX_LAYERS
            )));
        }
        let sliding_window = self
            .optional_usize(&key("attention.sliding_window"))?
            .filter(|&w| w > 0);
        let keys = FamilyKeys {
            rotary_dim: Some(rotary_dim),
            ..self.family_keys(arch, architecture, num_layers)?
        };
        let family = Family::new(
            architecture,
            num_layers,
            head_dim,
            hidden_size,
            sliding_window,
            keys,
        );
        Ok(ModelConfig {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size: self.required_usize(&key("feed_forward_length"))?,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: self
                .optional_f32(&key("attention.layer_norm_rms_epsilon"))?
                .ok_or_else(|| {
                    self.invalid(format!(
                        "missing metadata key {}",
                        key("attention.layer_norm_rms_epsilon")
                    ))
                })?,
            rope_theta,
            rope_scaling,
            max_position_embeddings: self.required_usize(&key("context_length"))?,
            tie_word_embeddings: self.tensor_info("output.weight").is_none(),
            sliding_window,
            attention_bias: self.tensor_info("blk.0.attn_q.bias").is_some(),
            dtype,
            bos_token_id: self.optional_u32("tokenizer.ggml.bos_token_id")?,
            eos_token_ids,
            family,
            score_labels: None,
        })
    }

    /// The family-specific keys llama.cpp writes: the sliding-layer pattern, the score scale,
    /// soft-capping, Gemma 3's local RoPE base.
    fn family_keys(
        &self,
        arch: &str,
        architecture: Architecture,
        num_layers: usize,
    ) -> Result<FamilyKeys, FormatError> {
        let key = |k: &str| format!("{arch}.{k}");
        let pattern_key = key("attention.sliding_window_pattern");
        let sliding_layers = match self.metadata(&pattern_key) {
            None => None,
            Some(MetadataValue::Array(items)) => Some(
                items
                    .iter()
                    .map(|v| v.as_bool())
                    .collect::<Option<Vec<bool>>>()
                    .ok_or_else(|| self.invalid(format!("{pattern_key} must hold bools")))?,
            ),
            // llama.cpp's `set_swa_pattern(n)`: every n-th layer is global.
            Some(_) => self
                .optional_usize(&pattern_key)?
                .filter(|&n| n > 0)
                .map(|n| (0..num_layers).map(|i| i % n < n - 1).collect()),
        };
        let gemma = matches!(architecture, Architecture::Gemma2 | Architecture::Gemma3);
        let moe = match self.optional_usize(&key("expert_count"))? {
            None | Some(0) => None,
            Some(experts) => {
                let top_k = self.required_usize(&key("expert_used_count"))?;
                if top_k == 0 || top_k > experts {
                    return Err(self.invalid(format!(
                        "{} ({top_k}) must be between 1 and the experts ({experts})",
                        key("expert_used_count")
                    )));
                }
                let expert_intermediate =
                    match self.optional_usize(&key("expert_feed_forward_length"))? {
                        Some(n) => n,
                        None => self.required_usize(&key("feed_forward_length"))?,
                    };
                Some(Moe {
                    experts,
                    top_k,
                    expert_intermediate,
                    // llama.cpp renormalises every family's picks but Qwen2-MoE's.
                    norm_topk_prob: self
                        .optional_bool(&key("expert_weights_norm"))?
                        .unwrap_or(architecture != Architecture::Qwen2Moe),
                    names: match architecture {
                        Architecture::Llama | Architecture::Mixtral => ExpertNames::Mixtral,
                        Architecture::GptOss => ExpertNames::GptOss,
                        _ => ExpertNames::Qwen,
                    },
                    shared_expert_intermediate: self
                        .optional_usize(&key("expert_shared_feed_forward_length"))?
                        .filter(|&n| n > 0),
                    activation: match architecture {
                        // llama.cpp's constants for gpt-oss, which its files do not state.
                        Architecture::GptOss => crate::family::ExpertActivation::ClampedSwiglu {
                            alpha: 1.702,
                            limit: 7.0,
                        },
                        _ => crate::family::ExpertActivation::Silu,
                    },
                })
            }
        };
        // A layer is sparse where the file has its router (dense layers among sparse ones, as
        // Qwen's `mlp_only_layers` makes them, have none).
        let sparse_layers = moe.map(|_| {
            (0..num_layers)
                .map(|i| {
                    self.tensor_info(&format!("blk.{i}.ffn_gate_inp.weight"))
                        .is_some()
                })
                .collect()
        });
        Ok(FamilyKeys {
            moe,
            sparse_layers,
            sliding_layers,
            attention_scale: self.optional_f32(&key("attention.scale"))?,
            query_pre_attn_scalar: if gemma {
                self.gemma_query_scalar(arch, architecture, num_layers)?
            } else {
                None
            },
            attention_softcap: self.optional_f32(&key("attn_logit_softcapping"))?,
            final_softcap: self.optional_f32(&key("final_logit_softcapping"))?,
            local_rope_theta: match architecture {
                Architecture::Gemma3 => Some(
                    self.optional_f32(&key("rope.freq_base_swa"))?
                        .unwrap_or(10_000.0),
                ),
                _ => None,
            },
            norms_stored_plus_one: gemma,
            ..FamilyKeys::default()
        })
    }

    /// The score scalar of a Gemma file that does not write `attention.scale` (llama.cpp's
    /// converter does not): llama.cpp takes `hidden / heads` for the 27B models, which it
    /// knows by their layer count, and the head size for every other size.
    fn gemma_query_scalar(
        &self,
        arch: &str,
        architecture: Architecture,
        num_layers: usize,
    ) -> Result<Option<f64>, FormatError> {
        let layers_27b = match architecture {
            Architecture::Gemma2 => 46,
            _ => 62,
        };
        let shape = self.attention_shape(arch)?;
        Ok(Some(if num_layers == layers_27b {
            (shape.hidden_size / shape.num_heads) as f64
        } else {
            shape.head_dim as f64
        }))
    }

    /// The attention head layout from the `{arch}.attention.*` keys, checked for what the
    /// model code needs (whole KV groups, equal key and value sizes, full even rotary).
    fn attention_shape(&self, arch: &str) -> Result<AttentionShape, FormatError> {
        let key = |k: &str| format!("{arch}.{k}");
        let hidden_size = self.required_usize(&key("embedding_length"))?;
        let num_heads = self.required_usize(&key("attention.head_count"))?;
        let num_kv_heads = self
            .optional_usize(&key("attention.head_count_kv"))?
            .unwrap_or(num_heads);
        if num_heads == 0 || hidden_size == 0 {
            return Err(self.invalid(format!(
                "{} and {} must be positive",
                key("embedding_length"),
                key("attention.head_count")
            )));
        }
        if num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(self.invalid(format!(
                "{} ({num_heads}) must be a multiple of {} ({num_kv_heads})",
                key("attention.head_count"),
                key("attention.head_count_kv")
            )));
        }
        let head_dim = self
            .optional_usize(&key("attention.key_length"))?
            .unwrap_or(hidden_size / num_heads);
        if let Some(v) = self.optional_usize(&key("attention.value_length"))?
            && v != head_dim
        {
            return Err(self.invalid(format!(
                "{} ({v}) differs from the key length ({head_dim}); Tessera needs equal key and \
                 value head sizes",
                key("attention.value_length")
            )));
        }
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(self.invalid(format!(
                "head size {head_dim} must be positive and even for rotary embeddings"
            )));
        }
        let rotary_dim = self
            .optional_usize(&key("rope.dimension_count"))?
            .unwrap_or(head_dim);
        if rotary_dim == 0 || rotary_dim > head_dim || !rotary_dim.is_multiple_of(2) {
            return Err(self.invalid(format!(
                "{} ({rotary_dim}) must be even and at most the head size ({head_dim})",
                key("rope.dimension_count")
            )));
        }
        Ok(AttentionShape {
            hidden_size,
            num_heads,
            num_kv_heads,
            head_dim,
            rotary_dim,
        })
    }

    /// `{arch}.vocab_size`, else the tokenizer's token count, else the embedding's rows.
    fn vocab_size(&self, arch: &str) -> Result<usize, FormatError> {
        let key = format!("{arch}.vocab_size");
        let spec_vocab = match self
            .metadata("tokenizer.ggml.tokens")
            .and_then(|v| v.as_array())
        {
            Some(tokens) => Some(tokens.len()),
            None => self
                .tensor_info("token_embd.weight")
                .and_then(|t| t.dims.get(1).copied()),
        };
        match self.optional_usize(&key)? {
            Some(v) => Ok(v),
            None => spec_vocab.ok_or_else(|| {
                self.invalid(format!(
                    "cannot tell the vocabulary size: no {key}, tokenizer.ggml.tokens or \
                     token_embd.weight"
                ))
            }),
        }
    }

    /// The weights' dtype from `general.file_type`, where the whole file is one float type.
    fn file_dtype(&self) -> Result<Option<DType>, FormatError> {
        Ok(match self.optional_usize("general.file_type")? {
            Some(0) => Some(DType::F32),
            Some(1) => Some(DType::F16),
            Some(32) => Some(DType::BF16),
            _ => None,
        })
    }

    /// The end-of-sequence, end-of-turn and end-of-message token ids, deduplicated, in that
    /// order.
    fn eos_token_ids(&self) -> Result<Vec<u32>, FormatError> {
        let mut eos_token_ids = Vec::new();
        for k in [
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        ] {
            if let Some(id) = self.optional_u32(k)?
                && !eos_token_ids.contains(&id)
            {
                eos_token_ids.push(id);
            }
        }
        Ok(eos_token_ids)
    }

    /// LongRoPE as llama.cpp's Phi-3 converter writes it: `rope_factors_short.weight` and
    /// `rope_factors_long.weight` tensors, the original context and the attention factor.
    fn long_rope(&self, arch: &str, rotary_dim: usize) -> Result<Option<RopeScaling>, FormatError> {
        let (Some(_), Some(_)) = (
            self.tensor_info("rope_factors_short.weight"),
            self.tensor_info("rope_factors_long.weight"),
        ) else {
            return Ok(None);
        };
        let key = |k: &str| format!("{arch}.rope.scaling.{k}");
        let original = self
            .optional_usize(&key("original_context_length"))?
            .ok_or_else(|| {
                self.invalid(format!(
                    "LongRoPE factors need {}",
                    key("original_context_length")
                ))
            })?;
        let factors = |name: &str| -> Result<Vec<f32>, FormatError> {
            let f = self.load_gguf_f32(name)?;
            match f.len() == rotary_dim / 2 {
                true => Ok(f),
                false => Err(self.invalid(format!(
                    "{name} has {} values; the rotary dimensions need {}",
                    f.len(),
                    rotary_dim / 2
                ))),
            }
        };
        let context = self.required_usize(&format!("{arch}.context_length"))?;
        let attention_factor = match self.optional_f32(&key("attn_factor"))? {
            Some(f) => f,
            None => {
                crate::config::longrope_attention_factor(context as f64 / original as f64, original)
                    as f32
            }
        };
        Ok(Some(RopeScaling::LongRope {
            short_factor: factors("rope_factors_short.weight")?,
            long_factor: factors("rope_factors_long.weight")?,
            original_max_position_embeddings: original,
            attention_factor,
        }))
    }

    /// `{arch}.rope.scaling.*`, or Llama 3 scaling recovered from a `rope_freqs.weight`
    /// tensor (llama.cpp bakes Llama 3.1 scaling into per-frequency divisors).
    fn rope_scaling(
        &self,
        arch: &str,
        head_dim: usize,
        theta: f32,
    ) -> Result<Option<RopeScaling>, FormatError> {
        let kind = self.optional_str(&format!("{arch}.rope.scaling.type"))?;
        let factor_key = format!("{arch}.rope.scaling.factor");
        let declared = match kind.as_deref() {
            None | Some("none") => None,
            Some("linear") => {
                let factor = self.optional_f32(&factor_key)?.ok_or_else(|| {
                    self.invalid(format!("linear rope scaling needs {factor_key}"))
                })?;
                Some(RopeScaling::Linear { factor })
            }
            Some("yarn") => {
                let key = |k: &str| format!("{arch}.rope.scaling.{k}");
                let factor = self
                    .optional_f32(&factor_key)?
                    .ok_or_else(|| self.invalid(format!("yarn rope scaling needs {factor_key}")))?;
                let original = self
                    .optional_usize(&key("original_context_length"))?
                    .ok_or_else(|| {
                        self.invalid(format!(
                            "yarn rope scaling needs {}",
                            key("original_context_length")
                        ))
                    })?;
                let attention_factor = match self.optional_f32(&key("attn_factor"))? {
                    Some(f) => f,
                    None => crate::config::yarn_mscale(factor as f64, 1.0) as f32,
                };
                Some(RopeScaling::Yarn {
                    factor,
                    original_max_position_embeddings: original as f32,
                    beta_fast: self.optional_f32(&key("yarn_beta_fast"))?.unwrap_or(32.0),
                    beta_slow: self.optional_f32(&key("yarn_beta_slow"))?.unwrap_or(1.0),
                    attention_factor,
                    // llama.cpp always rounds the blended range; gpt-oss is trained (and
                    // transformers runs it) without rounding.
                    truncate: self.architecture()? != "gpt-oss",
                })
            }
            Some(other) => {
                return Err(self.invalid(format!(
                    "unsupported rope scaling {other:?}; supported: none, linear, yarn, Llama 3 \
                     scaling given as a rope_freqs.weight tensor, and LongRoPE as \
                     rope_factors_short/long tensors"
                )));
            }
        };
        if self.tensor_info("rope_freqs.weight").is_none() {
            return Ok(declared);
        }
        if declared.is_some() {
            return Err(self.invalid(
                "the file has both rope scaling metadata and a rope_freqs.weight tensor; \
                 Tessera supports one or the other",
            ));
        }
        let divisors = self.load_gguf_f32("rope_freqs.weight")?;
        fit_llama3(&divisors, head_dim, theta).map_err(|why| {
            self.invalid(format!(
                "rope_freqs.weight is not Llama 3 rope scaling Tessera can represent: {why}"
            ))
        })
    }

    /// The tokenizer as `tokenizer.ggml.*` and `tokenizer.chat_template` describe it.
    pub fn tokenizer_spec(&self) -> Result<GgufTokenizerSpec, FormatError> {
        let tokens = self
            .optional_array("tokenizer.ggml.tokens", "an array of strings", |v| {
                v.as_str().map(str::to_owned)
            })?
            .ok_or_else(|| self.invalid("missing metadata key tokenizer.ggml.tokens"))?;
        Ok(GgufTokenizerSpec {
            model: self.required_str("tokenizer.ggml.model")?.to_owned(),
            pre: self.optional_str("tokenizer.ggml.pre")?,
            tokens,
            token_types: self.optional_array(
                "tokenizer.ggml.token_type",
                "an array of i32",
                |v| v.as_i64().and_then(|x| i32::try_from(x).ok()),
            )?,
            scores: self.optional_array("tokenizer.ggml.scores", "an array of numbers", |v| {
                v.as_f64().map(|x| x as f32)
            })?,
            merges: self.optional_array("tokenizer.ggml.merges", "an array of strings", |v| {
                v.as_str().map(str::to_owned)
            })?,
            bos_id: self.optional_u32("tokenizer.ggml.bos_token_id")?,
            eos_id: self.optional_u32("tokenizer.ggml.eos_token_id")?,
            unk_id: self.optional_u32("tokenizer.ggml.unknown_token_id")?,
            pad_id: self.optional_u32("tokenizer.ggml.padding_token_id")?,
            add_bos: self.optional_bool("tokenizer.ggml.add_bos_token")?,
            add_eos: self.optional_bool("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: self.optional_bool("tokenizer.ggml.add_space_prefix")?,
            chat_template: self.optional_str("tokenizer.chat_template")?,
        })
    }
}

/// A short rendering of a value for error messages (arrays by length only).
fn short(value: &MetadataValue) -> String {
    match value {
        MetadataValue::Array(items) => format!("of {} items", items.len()),
        MetadataValue::String(s) if s.len() > 40 => {
            format!("{:?}…", &s[..s.floor_char_boundary(40)])
        }
        other => format!("{other:?}"),
    }
}

/// Recovers [`RopeScaling::Llama3`] from llama.cpp's per-frequency divisors.
///
/// Llama 3 scaling divides frequency `i` by 1 (short wavelengths), by `factor` (long ones), or
/// by `1 / ((1 - s) / factor + s)` with `s = (orig / wavelen - low) / (high - low)` in between.
/// Only `low / orig` and `high / orig` matter, so `low_freq_factor` is fixed at 1 and `orig`
/// and `high` are fitted to the in-between divisors; the result is checked against every
/// divisor.
fn fit_llama3(
    divisors: &[f32],
    head_dim: usize,
    theta: f32,
) -> Result<Option<RopeScaling>, String> {
    if divisors.len() != head_dim / 2 {
        return Err(format!(
            "it has {} values but the head size {head_dim} needs {}",
            divisors.len(),
            head_dim / 2
        ));
    }
    if divisors.iter().any(|d| !d.is_finite() || *d <= 0.0) {
        return Err("it holds a non-positive or non-finite divisor".into());
    }
    let factor = divisors.iter().copied().fold(1.0f32, f32::max) as f64;
    if factor <= 1.0 + 1e-6 {
        return Ok(None);
    }
    let inv_wavelen = |i: usize| {
        let freq = (theta as f64).powf(-((2 * i) as f64) / head_dim as f64);
        freq / (2.0 * std::f64::consts::PI)
    };
    // (1 / wavelen, s) for the in-between divisors.
    let points: Vec<(f64, f64)> = divisors
        .iter()
        .enumerate()
        .filter(|(_, d)| {
            (**d as f64 - 1.0).abs() > 1e-4 && (**d as f64 - factor).abs() > 1e-4 * factor
        })
        .map(|(i, &d)| (inv_wavelen(i), (factor / d as f64 - 1.0) / (factor - 1.0)))
        .collect();
    if points.len() < 2 {
        return Err(format!(
            "only {} divisors lie between 1 and the factor {factor}; at least 2 are needed to \
             recover the frequency bounds",
            points.len()
        ));
    }
    // Least squares s = a x + b, where a = orig / (high - 1) and b = -1 / (high - 1).
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(sx, sy), (x, y)| (sx + x, sy + y));
    let (mx, my) = (sx / n, sy / n);
    let (sxy, sxx) = points.iter().fold((0.0, 0.0), |(sxy, sxx), (x, y)| {
        (sxy + (x - mx) * (y - my), sxx + (x - mx) * (x - mx))
    });
    let a = sxy / sxx;
    let b = my - a * mx;
    if !(a.is_finite() && b < 0.0) {
        return Err("the in-between divisors do not follow Llama 3's smooth interpolation".into());
    }
    let high = 1.0 - 1.0 / b;
    let orig = a * (high - 1.0);
    let scaling = RopeScaling::Llama3 {
        factor: factor as f32,
        low_freq_factor: 1.0,
        high_freq_factor: high as f32,
        original_max_position_embeddings: orig as f32,
    };
    for (i, &d) in divisors.iter().enumerate() {
        let wavelen = 1.0 / inv_wavelen(i);
        let (low_wavelen, high_wavelen) = (orig, orig / high);
        let expected = if wavelen < high_wavelen {
            1.0
        } else if wavelen > low_wavelen {
            factor
        } else {
            let s = (orig / wavelen - 1.0) / (high - 1.0);
            1.0 / ((1.0 - s) / factor + s)
        };
        if (expected - d as f64).abs() > 1e-3 * expected {
            return Err(format!(
                "divisor {i} is {d} but the fitted Llama 3 scaling gives {expected}"
            ));
        }
    }
    Ok(Some(scaling))
}
