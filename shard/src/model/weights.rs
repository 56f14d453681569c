//! Weights of a Llama-family decoder, loaded once and laid out for the forward pass:
//! q/k/v fused into one projection, gate/up fused into another.
//!
//! Under tensor parallelism each rank reads only its part from the (memory-mapped) files:
//! the rows of its heads of q/k/v, of its intermediate slice of gate/up and of its
//! vocabulary slice of the embedding and LM head (column-parallel), and the matching
//! columns of o_proj and down_proj (row-parallel: their partial products are summed across
//! ranks, and their biases are added by rank 0 only).
//!
//! Matrices stay in their file's format (GGUF `Q8_0`, `Q4_1`, `BF16`; see
//! [`WeightSource::load_native`]) when a rank loads them whole, that is with one rank, and
//! are multiplied directly by `tessera_kernels::cpu::weights`. Sliced matrices (tensor
//! parallelism) and every other format are loaded as f32. [`WeightLayout`] chooses how:
//! by default `Q8_0` and `Q4_1` matrices are repacked for integer dot products with 8-bit
//! activations (`tessera_kernels::cpu::int8`, as llama.cpp computes them).

use std::ops::Range;

use tessera_formats::{ModelConfig, WeightSource};
use tessera_kernels::cpu::WeightMatrix;

use crate::EngineError;
use crate::comm::{HeadSplit, Partition};

/// How a model's matrices are kept in memory and multiplied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightLayout {
    /// In the file's format; `Q8_0`/`Q4_1` repacked and multiplied with 8-bit activations in
    /// integers (as llama.cpp does): the fastest, not bit-identical to f32.
    #[default]
    Int8,
    /// In the file's format, dequantized on the fly and multiplied in f32: bit-identical to
    /// [`Self::F32`] in a third of its memory.
    Exact,
    /// Converted to f32 at load (the layout before native weights, for comparisons).
    F32,
}

impl WeightLayout {
    /// The default, unless `TESSERA_NATIVE_WEIGHTS=0` (→ [`Self::F32`]) or `TESSERA_INT8=0`
    /// (→ [`Self::Exact`]) asks for another.
    pub fn from_env() -> Self {
        let off = |name: &str| std::env::var(name).is_ok_and(|v| v.trim() == "0");
        if off("TESSERA_NATIVE_WEIGHTS") {
            Self::F32
        } else if off("TESSERA_INT8") {
            Self::Exact
        } else {
            Self::Int8
        }
    }
}

/// A linear layer in the PyTorch layout: `weight` is `[out, in]`.
pub(crate) struct Linear {
    pub(crate) weight: WeightMatrix,
    pub(crate) bias: Option<Vec<f32>>,
}

impl Linear {
    pub(crate) fn in_features(&self) -> usize {
        self.weight.cols()
    }

    pub(crate) fn out_features(&self) -> usize {
        self.weight.rows()
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
    /// This rank's rows (`vocab`) of the embedding.
    pub(crate) embed: WeightMatrix,
    /// The vocabulary rows this rank holds of the embedding and the LM head.
    pub(crate) vocab: Range<usize>,
    pub(crate) layers: Vec<LayerWeights>,
    pub(crate) final_norm: Vec<f32>,
    /// `None` when tied to `embed`; this rank's `vocab` rows.
    pub(crate) lm_head: Option<WeightMatrix>,
}

/// Which part of a tensor a rank loads.
#[derive(Clone)]
enum Part {
    Whole,
    Rows(Range<usize>),
    Columns(Range<usize>),
}

struct Loader<'a> {
    source: &'a dyn WeightSource,
    model: &'a str,
    partition: Partition,
    /// Whether whole matrices may stay in their file's format.
    native: bool,
    /// Whether `Q8_0`/`Q4_1` matrices are multiplied with 8-bit activations and integer dot
    /// products (`tessera_kernels::cpu::int8`) instead of exactly in f32.
    int8: bool,
}

impl Loader<'_> {
    /// `w` as the forward pass multiplies it.
    fn for_compute(&self, w: WeightMatrix) -> WeightMatrix {
        if self.int8 { w.into_int8() } else { w }
    }

    fn error(&self, message: String) -> EngineError {
        EngineError::Weights {
            path: self.model.to_string(),
            message,
        }
    }

    fn tensor(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, EngineError> {
        self.part(name, shape, Part::Whole)
    }

    /// `part` of the tensor `name`, whose full shape must be `shape`.
    fn part(&self, name: &str, shape: &[usize], part: Part) -> Result<Vec<f32>, EngineError> {
        let (dim, range) = match part {
            Part::Rows(r) if r.len() != shape[0] => (0, r),
            Part::Columns(r) if shape.len() > 1 && r.len() != shape[1] => (1, r),
            _ => {
                let t = self.source.load_f32(name)?;
                if t.shape != shape {
                    return Err(self.error(format!(
                        "tensor {name:?} has shape {:?}, the config implies {shape:?}",
                        t.shape
                    )));
                }
                return Ok(t.data);
            }
        };
        let found = self.source.shape(name)?;
        if found != shape {
            return Err(self.error(format!(
                "tensor {name:?} has shape {found:?}, the config implies {shape:?}"
            )));
        }
        Ok(self.source.load_f32_slice(name, dim, range)?.data)
    }

    /// The matrix `name` (full shape `shape`): in its file's format when this rank loads
    /// all of it and the source has it natively, otherwise `part` of it as f32.
    fn matrix(
        &self,
        name: &str,
        shape: [usize; 2],
        part: Part,
    ) -> Result<WeightMatrix, EngineError> {
        let (rows, cols) = match &part {
            Part::Whole => (shape[0], shape[1]),
            Part::Rows(r) => (r.len(), shape[1]),
            Part::Columns(c) => (shape[0], c.len()),
        };
        if self.native
            && (rows, cols) == (shape[0], shape[1])
            && let Some(t) = self.source.load_native(name)?
        {
            if t.shape != shape {
                return Err(self.error(format!(
                    "tensor {name:?} has shape {:?}, the config implies {shape:?}",
                    t.shape
                )));
            }
            return WeightMatrix::from_bytes(t.format, rows, cols, &t.bytes)
                .map_err(|e| self.error(format!("tensor {name:?}: {e}")));
        }
        Ok(WeightMatrix::from_f32(
            rows,
            cols,
            self.part(name, &shape, part)?,
        ))
    }

    fn optional(
        &self,
        name: &str,
        shape: &[usize],
        part: Part,
    ) -> Result<Option<Vec<f32>>, EngineError> {
        if self.source.contains(name) {
            self.part(name, shape, part).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Several column-parallel projections of the same input stacked into one (each given as
    /// its name, full output width and this rank's rows); biases stacked when any has one.
    fn fused(
        &self,
        prefix: &str,
        parts: &[(&str, usize, Range<usize>)],
        in_features: usize,
    ) -> Result<Linear, EngineError> {
        let mut weights = Vec::new();
        let mut biases = Vec::new();
        for (name, out, rows) in parts {
            let part = Part::Rows(rows.clone());
            weights.push(self.matrix(
                &format!("{prefix}.{name}.weight"),
                [*out, in_features],
                part.clone(),
            )?);
            biases.push((
                self.optional(&format!("{prefix}.{name}.bias"), &[*out], part)?,
                rows.len(),
            ));
        }
        let bias = biases.iter().any(|(b, _)| b.is_some()).then(|| {
            biases
                .into_iter()
                .flat_map(|(b, out)| b.unwrap_or_else(|| vec![0.0; out]))
                .collect()
        });
        Ok(Linear {
            weight: self.for_compute(WeightMatrix::concat_rows(weights)),
            bias,
        })
    }

    /// A row-parallel projection: this rank's `columns` of the input; the bias (added once
    /// after the sum over ranks) only on rank 0.
    fn row_parallel(
        &self,
        name: &str,
        out: usize,
        in_features: usize,
        columns: Range<usize>,
    ) -> Result<Linear, EngineError> {
        let weight = self.matrix(
            &format!("{name}.weight"),
            [out, in_features],
            Part::Columns(columns),
        )?;
        let bias = match self.partition.rank {
            0 => self.optional(&format!("{name}.bias"), &[out], Part::Whole)?,
            _ => None,
        };
        Ok(Linear {
            weight: self.for_compute(weight),
            bias,
        })
    }
}

impl ModelWeights {
    pub(crate) fn load(
        config: &ModelConfig,
        source: &dyn WeightSource,
        model: &str,
        partition: Partition,
        heads: &HeadSplit,
        layout: WeightLayout,
    ) -> Result<Self, EngineError> {
        let l = Loader {
            source,
            model,
            partition,
            native: partition.world_size == 1 && layout != WeightLayout::F32,
            int8: layout == WeightLayout::Int8,
        };
        let (h, hd) = (config.hidden_size, config.head_dim);
        let (q_out, kv_out) = (config.num_heads * hd, config.num_kv_heads * hd);
        let q_rows = heads.q.start * hd..heads.q.end * hd;
        let kv_rows = heads.kv.start * hd..heads.kv.end * hd;
        let inter = config.intermediate_size;
        let inter_rows = partition.split(inter);
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = format!("model.layers.{i}");
            layers.push(LayerWeights {
                input_norm: l.tensor(&format!("{p}.input_layernorm.weight"), &[h])?,
                qkv: l.fused(
                    &format!("{p}.self_attn"),
                    &[
                        ("q_proj", q_out, q_rows.clone()),
                        ("k_proj", kv_out, kv_rows.clone()),
                        ("v_proj", kv_out, kv_rows.clone()),
                    ],
                    h,
                )?,
                o: l.row_parallel(&format!("{p}.self_attn.o_proj"), h, q_out, q_rows.clone())?,
                post_attention_norm: l
                    .tensor(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                gate_up: l.fused(
                    &format!("{p}.mlp"),
                    &[
                        ("gate_proj", inter, inter_rows.clone()),
                        ("up_proj", inter, inter_rows.clone()),
                    ],
                    h,
                )?,
                down: l.row_parallel(
                    &format!("{p}.mlp.down_proj"),
                    h,
                    inter,
                    inter_rows.clone(),
                )?,
            });
        }
        let vocab_size = config.vocab_size;
        let vocab = partition.split(vocab_size);
        let rows = Part::Rows(vocab.clone());
        let lm_head = if config.tie_word_embeddings || !source.contains("lm_head.weight") {
            None
        } else {
            Some(l.for_compute(l.matrix("lm_head.weight", [vocab_size, h], rows.clone())?))
        };
        Ok(Self {
            embed: l.for_compute(l.matrix("model.embed_tokens.weight", [vocab_size, h], rows)?),
            vocab,
            layers,
            final_norm: l.tensor("model.norm.weight", &[h])?,
            lm_head,
        })
    }
}
