//! EAGLE-style draft heads (Li et al. 2024): one decoder layer that reads, at position `j`, the
//! pair `fc([embed(t_j) ; f_{j-1}])`, where `f` is the target's final hidden state (what its LM
//! head reads), and guesses `f_j`; the target's own LM head turns the guess into the next
//! token's logits. Run again on its own guesses, it proposes a tree several tokens deep.
//!
//! Layout: EAGLE's (`config.json`, a Llama configuration of one layer; `fc.weight`, `fc.bias`
//! and `layers.0.*` in one safetensors file, optionally under `model.`). As in EAGLE, the layer
//! has no input norm unless the file carries `layers.0.input_layernorm.weight`. An optional
//! `draft_vocab.json` (a list of token ids) restricts its proposals to those tokens (FR-Spec),
//! so that each round scores its states against those rows of the LM head only.

use std::path::Path;

use serde::Deserialize;
use tessera_kernels::cpu::attention::KvLayout;
use tessera_kernels::cpu::{WeightFormat, WeightMatrix};
use tessera_model_files::{FormatError, ModelConfig, WeightSource, open_safetensors};

use crate::EngineError;
use crate::kv_cache::{KvCache, KvDtype};
use crate::model::WeightLayout;
use crate::speculative::weights_file::heads_file;

#[derive(Deserialize)]
struct HeadConfig {
    hidden_size: usize,
    intermediate_size: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(default = "one")]
    num_hidden_layers: usize,
    #[serde(default = "silu")]
    hidden_act: String,
    rms_norm_eps: Option<f32>,
}

fn one() -> usize {
    1
}

fn silu() -> String {
    "silu".into()
}

/// A loaded EAGLE-style draft layer, its weights in their file's format.
pub struct EagleHead {
    pub(super) hidden: usize,
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
    pub(super) head_dim: usize,
    pub(super) intermediate: usize,
    pub(super) eps: f32,
    /// `[hidden, 2 · hidden]` over `[embedding ; feature]`.
    pub(super) fc: WeightMatrix,
    pub(super) fc_bias: Option<Vec<f32>>,
    pub(super) input_norm: Option<Vec<f32>>,
    /// `[q | k | v]` rows.
    pub(super) qkv: WeightMatrix,
    pub(super) o: WeightMatrix,
    pub(super) post_attention_norm: Vec<f32>,
    /// `[gate | up]` rows.
    pub(super) gate_up: WeightMatrix,
    pub(super) down: WeightMatrix,
    /// The only tokens it proposes (`draft_vocab.json`, FR-Spec), or `None`: any.
    pub(super) draft_vocab: Option<Vec<u32>>,
}

impl EagleHead {
    /// Loads the head in `dir`, made for a target of configuration `target`, its matrices laid
    /// out as [`WeightLayout::from_env`] says.
    pub fn load(dir: &Path, target: &ModelConfig) -> Result<Self, EngineError> {
        Self::load_with(dir, target, WeightLayout::from_env())
    }

    /// [`Self::load`] in `layout`: with [`WeightLayout::Int8`] the float matrices are
    /// quantized to `Q8_0` and multiplied in integers (the layer runs several times a step;
    /// its proposals are verified, so its rounding never reaches the output).
    pub fn load_with(
        dir: &Path,
        target: &ModelConfig,
        layout: WeightLayout,
    ) -> Result<Self, EngineError> {
        let bad = |message: String| EngineError::Weights {
            path: dir.display().to_string(),
            message,
        };
        let config_path = dir.join("config.json");
        let text =
            std::fs::read_to_string(&config_path).map_err(|e| FormatError::io(&config_path, e))?;
        let c: HeadConfig = serde_json::from_str(&text).map_err(|e| {
            bad(format!(
                "config.json is not an EAGLE head's configuration: {e}"
            ))
        })?;
        let heads = c.num_attention_heads;
        let head_dim = c.head_dim.unwrap_or(c.hidden_size / heads.max(1));
        if c.num_hidden_layers != 1 || c.hidden_act != "silu" {
            return Err(bad(format!(
                "an EAGLE head is one SiLU decoder layer; this one has {} layers of {}",
                c.num_hidden_layers, c.hidden_act
            )));
        }
        if c.hidden_size != target.hidden_size || head_dim != target.head_dim {
            return Err(bad(format!(
                "the head is {} wide with heads of {head_dim}; the model is {} wide with heads \
                 of {}: a head must be made for its model",
                c.hidden_size, target.hidden_size, target.head_dim
            )));
        }
        let kv_heads = c.num_key_value_heads.unwrap_or(heads);
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(bad(format!(
                "{heads} query heads cannot share {kv_heads} KV heads"
            )));
        }
        let file = heads_file(dir, "model.safetensors")?;
        let source = open_safetensors(&file)?;
        let prefix = if source.contains("model.fc.weight") {
            "model."
        } else {
            ""
        };
        let w = Tensors {
            source: source.as_ref(),
            prefix,
            dir,
            int8: layout == WeightLayout::Int8,
        };
        let (h, inter) = (c.hidden_size, c.intermediate_size);
        let (q, kv) = (heads * head_dim, kv_heads * head_dim);
        let layer = |name: &str| format!("layers.0.{name}");
        Ok(Self {
            hidden: h,
            heads,
            kv_heads,
            head_dim,
            intermediate: inter,
            eps: c.rms_norm_eps.unwrap_or(target.rms_norm_eps),
            fc: w.matrix("fc.weight", h, 2 * h)?,
            fc_bias: w.optional_vector("fc.bias", h)?,
            input_norm: w.optional_vector(&layer("input_layernorm.weight"), h)?,
            qkv: WeightMatrix::concat_rows(vec![
                w.matrix(&layer("self_attn.q_proj.weight"), q, h)?,
                w.matrix(&layer("self_attn.k_proj.weight"), kv, h)?,
                w.matrix(&layer("self_attn.v_proj.weight"), kv, h)?,
            ]),
            o: w.matrix(&layer("self_attn.o_proj.weight"), h, q)?,
            post_attention_norm: w
                .optional_vector(&layer("post_attention_layernorm.weight"), h)?
                .ok_or_else(|| bad("layers.0.post_attention_layernorm.weight is missing".into()))?,
            gate_up: WeightMatrix::concat_rows(vec![
                w.matrix(&layer("mlp.gate_proj.weight"), inter, h)?,
                w.matrix(&layer("mlp.up_proj.weight"), inter, h)?,
            ]),
            down: w.matrix(&layer("mlp.down_proj.weight"), h, inter)?,
            draft_vocab: draft_vocab(dir, target.vocab_size)?,
        })
    }

    /// Its cache's layout for blocks of `block_size` tokens (all its KV heads: under tensor
    /// parallelism every rank runs the whole layer).
    pub fn kv_layout(&self, block_size: usize) -> KvLayout {
        KvLayout {
            block_size,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
        }
    }

    /// A cache of `num_blocks` blocks for the layer (in f32, on the host).
    pub fn new_cache(&self, num_blocks: usize, block_size: usize) -> KvCache {
        KvCache::with_dtype(1, num_blocks, self.kv_layout(block_size), KvDtype::Float32)
    }

    /// Bytes one block of its cache takes.
    pub fn block_bytes(&self, block_size: usize) -> usize {
        KvCache::block_bytes(1, self.kv_layout(block_size), KvDtype::Float32)
    }
}

/// `dir/draft_vocab.json`, the model's token ids the head proposes (a JSON list), if present.
fn draft_vocab(dir: &Path, vocab: usize) -> Result<Option<Vec<u32>>, EngineError> {
    let path = dir.join("draft_vocab.json");
    if !path.exists() {
        return Ok(None);
    }
    let bad = |message: String| EngineError::Weights {
        path: path.display().to_string(),
        message,
    };
    let text = std::fs::read_to_string(&path).map_err(|e| FormatError::io(&path, e))?;
    let ids: Vec<u32> = serde_json::from_str(&text)
        .map_err(|e| bad(format!("not a JSON list of token ids: {e}")))?;
    if ids.is_empty() {
        return Err(bad("the draft vocabulary is empty".into()));
    }
    if let Some(&t) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(bad(format!(
            "token {t} is outside the model's vocabulary of {vocab}"
        )));
    }
    Ok(Some(ids))
}

/// The head file's tensors, checked against the shapes the layer needs.
struct Tensors<'a> {
    source: &'a dyn WeightSource,
    prefix: &'a str,
    dir: &'a Path,
    /// Float matrices become `Q8_0`, repacked for integer products.
    int8: bool,
}

impl Tensors<'_> {
    fn bad(&self, message: String) -> EngineError {
        EngineError::Weights {
            path: self.dir.display().to_string(),
            message,
        }
    }

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<WeightMatrix, EngineError> {
        let full = format!("{}{name}", self.prefix);
        if !self.source.contains(&full) {
            return Err(self.bad(format!("{full} is missing")));
        }
        let shape = self.source.shape(&full)?;
        if shape != [rows, cols] {
            return Err(self.bad(format!(
                "{full} is shaped {shape:?}; the layer needs [{rows}, {cols}]"
            )));
        }
        if self.int8 && cols.is_multiple_of(32) {
            let values = self.source.load_f32(&full)?.data;
            return WeightMatrix::from_bytes(WeightFormat::Q8_0, rows, cols, &q8_0(&values))
                .map(WeightMatrix::into_int8)
                .map_err(|e| self.bad(format!("{full}: {e}")));
        }
        if let Some(native) = self.source.load_native(&full)? {
            return WeightMatrix::from_bytes(native.format, rows, cols, &native.bytes)
                .map_err(|e| self.bad(format!("{full}: {e}")));
        }
        Ok(WeightMatrix::from_f32(
            rows,
            cols,
            self.source.load_f32(&full)?.data,
        ))
    }

    fn optional_vector(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>, EngineError> {
        let full = format!("{}{name}", self.prefix);
        if !self.source.contains(&full) {
            return Ok(None);
        }
        let t = self.source.load_f32(&full)?;
        if t.shape != [len] {
            return Err(self.bad(format!(
                "{full} is shaped {:?}; the layer needs [{len}]",
                t.shape
            )));
        }
        Ok(Some(t.data))
    }
}

/// `values` (whole blocks of 32) as GGUF `Q8_0` blocks: an f16 scale `max|x| / 127`, then 32
/// signed bytes rounded to nearest.
fn q8_0(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / 32 * 34);
    for block in values.chunks_exact(32) {
        let max = block.iter().fold(0f32, |m, x| m.max(x.abs()));
        let d = max / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        out.extend(
            block
                .iter()
                .map(|&x| (x * inv).round().clamp(-127.0, 127.0) as i8 as u8),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use tessera_kernels::cpu::linear_weights;

    use super::*;

    #[test]
    fn q8_0_blocks_multiply_close_to_the_floats() {
        let (rows, cols) = (8, 64);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.3).sin()).collect();
        let exact = WeightMatrix::from_f32(rows, cols, w.clone());
        let q = WeightMatrix::from_bytes(WeightFormat::Q8_0, rows, cols, &q8_0(&w)).unwrap();
        let (mut a, mut b) = (vec![0f32; rows], vec![0f32; rows]);
        linear_weights(&x, &exact, None, 1, &mut a);
        linear_weights(&x, &q.into_int8(), None, 1, &mut b);
        for (a, b) in a.iter().zip(&b) {
            assert!((a - b).abs() < 0.05, "{a} vs {b}");
        }
    }
}
