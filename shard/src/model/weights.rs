//! Weights of a Llama-family decoder, loaded once and laid out for the forward pass:
//! q/k/v fused into one projection, gate/up fused into another.

use tessera_formats::{ModelConfig, WeightSource};

use crate::EngineError;

/// A linear layer in the PyTorch layout: `weight` is `[out, in]`.
pub(crate) struct Linear {
    pub(crate) weight: Vec<f32>,
    pub(crate) bias: Option<Vec<f32>>,
    pub(crate) in_features: usize,
}

impl Linear {
    pub(crate) fn out_features(&self) -> usize {
        self.weight.len() / self.in_features
    }
}

pub(crate) struct LayerWeights {
    pub(crate) input_norm: Vec<f32>,
    /// `[q | k | v]` rows.
    pub(crate) qkv: Linear,
    pub(crate) o: Linear,
    pub(crate) post_attention_norm: Vec<f32>,
    /// `[gate | up]` rows.
    pub(crate) gate_up: Linear,
    pub(crate) down: Linear,
}

pub(crate) struct ModelWeights {
    pub(crate) embed: Vec<f32>,
    pub(crate) layers: Vec<LayerWeights>,
    pub(crate) final_norm: Vec<f32>,
    /// `None` when tied to `embed`.
    pub(crate) lm_head: Option<Vec<f32>>,
}

struct Loader<'a> {
    source: &'a dyn WeightSource,
    model: &'a str,
}

impl Loader<'_> {
    fn error(&self, message: String) -> EngineError {
        EngineError::Weights {
            path: self.model.to_string(),
            message,
        }
    }

    fn tensor(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, EngineError> {
        let t = self.source.load_f32(name)?;
        if t.shape != shape {
            return Err(self.error(format!(
                "tensor {name:?} has shape {:?}, the config implies {shape:?}",
                t.shape
            )));
        }
        Ok(t.data)
    }

    fn optional(&self, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>, EngineError> {
        if self.source.contains(name) {
            self.tensor(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Several projections of the same input stacked into one; biases stacked when any has one.
    fn fused(
        &self,
        prefix: &str,
        parts: &[(&str, usize)],
        in_features: usize,
    ) -> Result<Linear, EngineError> {
        let mut weight = Vec::new();
        let mut biases = Vec::new();
        for (name, out) in parts {
            weight.extend(self.tensor(&format!("{prefix}.{name}.weight"), &[*out, in_features])?);
            biases.push((
                self.optional(&format!("{prefix}.{name}.bias"), &[*out])?,
                *out,
            ));
        }
        let bias = biases.iter().any(|(b, _)| b.is_some()).then(|| {
            biases
                .into_iter()
                .flat_map(|(b, out)| b.unwrap_or_else(|| vec![0.0; out]))
                .collect()
        });
        Ok(Linear {
            weight,
            bias,
            in_features,
        })
    }
}

impl ModelWeights {
    pub(crate) fn load(
        config: &ModelConfig,
        source: &dyn WeightSource,
        model: &str,
    ) -> Result<Self, EngineError> {
        let l = Loader { source, model };
        let (h, hd) = (config.hidden_size, config.head_dim);
        let (q_out, kv_out) = (config.num_heads * hd, config.num_kv_heads * hd);
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = format!("model.layers.{i}");
            layers.push(LayerWeights {
                input_norm: l.tensor(&format!("{p}.input_layernorm.weight"), &[h])?,
                qkv: l.fused(
                    &format!("{p}.self_attn"),
                    &[("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)],
                    h,
                )?,
                o: l.fused(&format!("{p}.self_attn"), &[("o_proj", h)], q_out)?,
                post_attention_norm: l
                    .tensor(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                gate_up: l.fused(
                    &format!("{p}.mlp"),
                    &[
                        ("gate_proj", config.intermediate_size),
                        ("up_proj", config.intermediate_size),
                    ],
                    h,
                )?,
                down: l.fused(
                    &format!("{p}.mlp"),
                    &[("down_proj", h)],
                    config.intermediate_size,
                )?,
            });
        }
        let vocab = config.vocab_size;
        let lm_head = if config.tie_word_embeddings {
            None
        } else {
            l.optional("lm_head.weight", &[vocab, h])?
        };
        Ok(Self {
            embed: l.tensor("model.embed_tokens.weight", &[vocab, h])?,
            layers,
            final_norm: l.tensor("model.norm.weight", &[h])?,
            lm_head,
        })
    }
}
