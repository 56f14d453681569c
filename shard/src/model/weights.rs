//! Weights of a Llama-family decoder, loaded once and laid out for the forward pass:
//! q/k/v fused into one projection, gate/up fused into another.
//!
//! Under tensor parallelism each rank reads only its part from the (memory-mapped) files:
//! the rows of its heads of q/k/v, of its intermediate slice of gate/up and of its
//! vocabulary slice of the embedding and LM head (column-parallel), and the matching
//! columns of o_proj and down_proj (row-parallel: their partial products are summed across
//! ranks, and their biases are added by rank 0 only).
//!
//! Matrices stay in their file's format (GGUF `F16`, `BF16`, `Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`,
//! `Q5_1`, `Q4_K`, `Q5_K`, `Q6_K`, `IQ4_NL`, `IQ4_XS`; see [`WeightSource::load_native`]) and
//! are multiplied directly by `tessera_kernels::cpu::weights`. Under tensor parallelism so
//! are a rank's rows (a byte range of whole blocks, [`WeightSource::load_native_slice`]) and
//! its columns when they start and end on block boundaries; other slices, and every other
//! format, are loaded as f32. A fused projection whose parts differ in format (llama.cpp's
//! mixes often quantize v differently from q and k) keeps each part in its own (a stack,
//! multiplied part by part). [`WeightLayout`] chooses how they are multiplied: by default the
//! GGUF block formats (all of the above but `F16` and `BF16`) are repacked for integer dot
//! products with 8-bit activations (`tessera_kernels::cpu::int8`, as llama.cpp computes them).

use std::ops::Range;

use tessera_kernels::cpu::int8::hardware_int8;
use tessera_kernels::cpu::{WeightFormat, WeightMatrix, kernels};
use tessera_model_files::{ModelConfig, NativeTensor, WeightSource};

use crate::EngineError;
use crate::comm::{HeadSplit, Partition};

mod experts;

pub(crate) use experts::{Expert, MoeWeights};

/// How a model's matrices are kept in memory and multiplied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightLayout {
    /// In the file's format; the GGUF block formats repacked and multiplied with 8-bit
    /// activations in integers (as llama.cpp does): the fastest decode with AVX-512 VNNI or
    /// AVX2, not bit-identical to f32.
    #[default]
    Int8,
    /// In the file's format, dequantized on the fly and multiplied in f32: bit-identical to
    /// [`Self::F32`] in a third of its memory.
    Exact,
    /// Converted to f32 at load (the layout before native weights, for comparisons).
    F32,
}

impl WeightLayout {
    /// [`Self::Int8`] where the CPU has a vector kernel for it (AVX-512 VNNI or AVX2), else
    /// [`Self::Exact`]: without one the integer path runs its portable reference, an order
    /// of magnitude slower than dequantizing to f32. `TESSERA_NATIVE_WEIGHTS=0` (→
    /// [`Self::F32`]) and `TESSERA_INT8=0` or `1` (→ [`Self::Exact`] or [`Self::Int8`]) choose
    /// instead.
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok();
        Self::choose(
            var("TESSERA_NATIVE_WEIGHTS").as_deref(),
            var("TESSERA_INT8").as_deref(),
            hardware_int8(kernels()),
        )
    }

    /// [`Self::from_env`] for given variables and hardware.
    fn choose(native_weights: Option<&str>, int8: Option<&str>, hardware_int8: bool) -> Self {
        if native_weights.map(str::trim) == Some("0") {
            return Self::F32;
        }
        match int8.map(str::trim) {
            Some("0") => Self::Exact,
            Some("1") => Self::Int8,
            _ if hardware_int8 => Self::Int8,
            _ => Self::Exact,
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
    /// Per-head norms of q and k (`head_dim` each), with [`tessera_model_files::Family::qk_norm`].
    pub(crate) qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    pub(crate) o: Linear,
    /// Norms of the attention's and the MLP's outputs, with [`tessera_model_files::Family::sandwich_norms`].
    pub(crate) out_norms: Option<(Vec<f32>, Vec<f32>)>,
    /// The MLP's input norm.
    pub(crate) pre_mlp_norm: Vec<f32>,
    pub(crate) mlp: Mlp,
    /// This rank's query heads' attention sink logits (gpt-oss), if the layer has them.
    pub(crate) sinks: Option<Vec<f32>>,
}

/// A layer's MLP.
pub(crate) enum Mlp {
    /// `[gate | up]` rows, and the output projection.
    Dense { gate_up: Linear, down: Linear },
    /// A mixture of experts ([`tessera_model_files::Moe`]).
    Sparse(MoeWeights),
}

impl Mlp {
    /// The dense MLP's `[gate | up]` and down projections, if it is dense.
    pub(crate) fn dense(&self) -> Option<(&Linear, &Linear)> {
        match self {
            Self::Dense { gate_up, down } => Some((gate_up, down)),
            Self::Sparse(_) => None,
        }
    }

    /// Every matrix of the MLP.
    fn matrices(&self) -> Vec<&WeightMatrix> {
        match self {
            Self::Dense { gate_up, down } => vec![&gate_up.weight, &down.weight],
            Self::Sparse(m) => std::iter::once(&m.router)
                .chain(
                    m.experts
                        .iter()
                        .chain(m.shared.as_ref().map(|s| &s.mlp))
                        .flat_map(|e| [&e.gate_up.weight, &e.down.weight]),
                )
                .collect(),
        }
    }
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

impl ModelWeights {
    /// The storage format of most weight bytes: `float32`, `bfloat16`, `float16`, or the
    /// GGUF block type (`Q4_1`, `Q4_K`…).
    pub(crate) fn storage_dtype(&self) -> &'static str {
        let matrices = self
            .layers
            .iter()
            .flat_map(|l| {
                let mut m = vec![&l.qkv.weight, &l.o.weight];
                m.extend(l.mlp.matrices());
                m
            })
            .chain(std::iter::once(&self.embed))
            .chain(self.lm_head.as_ref())
            .flat_map(WeightMatrix::parts);
        let mut bytes: Vec<(WeightFormat, usize)> = Vec::new();
        for m in matrices {
            match bytes.iter_mut().find(|(f, _)| *f == m.format()) {
                Some((_, b)) => *b += m.storage_bytes(),
                None => bytes.push((m.format(), m.storage_bytes())),
            }
        }
        match bytes.iter().max_by_key(|(_, b)| *b).map(|(f, _)| *f) {
            Some(WeightFormat::F32) | None => "float32",
            Some(WeightFormat::Bf16) => "bfloat16",
            Some(WeightFormat::F16) => "float16",
            Some(f) => f.name(),
        }
    }
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

    /// An RMSNorm weight as the kernels multiply by it: `offset + w` (Gemma's `1 + w`).
    fn norm(&self, name: &str, width: usize, offset: f32) -> Result<Vec<f32>, EngineError> {
        let mut w = self.tensor(name, &[width])?;
        if offset != 0.0 {
            w.iter_mut().for_each(|x| *x += offset);
        }
        Ok(w)
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

    /// The matrix `name` (full shape `shape`): `part` of it in its file's format when the
    /// source can cut it so, otherwise as f32.
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
            && let Some(t) = self.native_part(name, shape, &part)?
        {
            if t.shape != [rows, cols] {
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

    /// `part` of the matrix `name` in its storage format, if the source has one for it.
    fn native_part(
        &self,
        name: &str,
        shape: [usize; 2],
        part: &Part,
    ) -> Result<Option<NativeTensor>, EngineError> {
        let (dim, range) = match part {
            Part::Rows(r) if r.len() != shape[0] => (0, r.clone()),
            Part::Columns(c) if c.len() != shape[1] => (1, c.clone()),
            _ => return Ok(self.source.load_native(name)?),
        };
        let found = self.source.shape(name)?;
        if found != shape {
            return Err(self.error(format!(
                "tensor {name:?} has shape {found:?}, the config implies {shape:?}"
            )));
        }
        Ok(self.source.load_native_slice(name, dim, range)?)
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

/// `r` moved up by `by` rows.
fn shift(r: &Range<usize>, by: usize) -> Range<usize> {
    r.start + by..r.end + by
}

impl Loader<'_> {
    /// Layer `p`'s q, k and v (rank rows `q_rows`, `kv_rows` of widths `q_out`, `kv_out`): from
    /// their own tensors, or this rank's rows of each part of one fused tensor (Phi-3's
    /// `qkv_proj`).
    fn qkv(
        &self,
        p: &str,
        hidden: usize,
        (q_out, kv_out): (usize, usize),
        (q_rows, kv_rows): (&Range<usize>, &Range<usize>),
    ) -> Result<Linear, EngineError> {
        let attn = format!("{p}.self_attn");
        if self.source.contains(&format!("{attn}.q_proj.weight")) {
            let parts = [
                ("q_proj", q_out, q_rows.clone()),
                ("k_proj", kv_out, kv_rows.clone()),
                ("v_proj", kv_out, kv_rows.clone()),
            ];
            return self.fused(&attn, &parts, hidden);
        }
        let all = q_out + 2 * kv_out;
        let parts = [
            ("qkv_proj", all, q_rows.clone()),
            ("qkv_proj", all, shift(kv_rows, q_out)),
            ("qkv_proj", all, shift(kv_rows, q_out + kv_out)),
        ];
        self.fused(&attn, &parts, hidden)
    }

    /// Layer `p`'s dense MLP (this rank's `rows` of the inner width `inter`): gate and up from
    /// their own tensors or from Phi-3's fused `gate_up_proj`.
    fn dense_mlp(
        &self,
        p: &str,
        hidden: usize,
        inter: usize,
        rows: &Range<usize>,
    ) -> Result<Mlp, EngineError> {
        let mlp = format!("{p}.mlp");
        let gate_up = if self.source.contains(&format!("{mlp}.gate_proj.weight")) {
            let parts = [
                ("gate_proj", inter, rows.clone()),
                ("up_proj", inter, rows.clone()),
            ];
            self.fused(&mlp, &parts, hidden)?
        } else {
            let parts = [
                ("gate_up_proj", 2 * inter, rows.clone()),
                ("gate_up_proj", 2 * inter, shift(rows, inter)),
            ];
            self.fused(&mlp, &parts, hidden)?
        };
        let down = self.row_parallel(&format!("{mlp}.down_proj"), hidden, inter, rows.clone())?;
        Ok(Mlp::Dense { gate_up, down })
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
            native: layout != WeightLayout::F32,
            int8: layout == WeightLayout::Int8,
        };
        let (h, hd) = (config.hidden_size, config.head_dim);
        let (q_out, kv_out) = (config.num_heads * hd, config.num_kv_heads * hd);
        let q_rows = heads.q.start * hd..heads.q.end * hd;
        let kv_rows = heads.kv.start * hd..heads.kv.end * hd;
        let inter = config.intermediate_size;
        let inter_rows = partition.split(inter);
        let family = &config.family;
        let off = family.norm_weight_offset;
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = format!("model.layers.{i}");
            let norm = |name: &str, width: usize| l.norm(&format!("{p}.{name}.weight"), width, off);
            let qk_norm = match family.qk_norm {
                true => Some((norm("self_attn.q_norm", hd)?, norm("self_attn.k_norm", hd)?)),
                false => None,
            };
            // Gemma's `post_attention_layernorm` is the attention output's norm; Llama's is
            // the MLP's input norm.
            let (out_norms, pre_mlp_norm) = match family.sandwich_norms {
                true => (
                    Some((
                        norm("post_attention_layernorm", h)?,
                        norm("post_feedforward_layernorm", h)?,
                    )),
                    norm("pre_feedforward_layernorm", h)?,
                ),
                false => (None, norm("post_attention_layernorm", h)?),
            };
            layers.push(LayerWeights {
                input_norm: norm("input_layernorm", h)?,
                qkv: l.qkv(&p, h, (q_out, kv_out), (&q_rows, &kv_rows))?,
                qk_norm,
                o: l.row_parallel(&format!("{p}.self_attn.o_proj"), h, q_out, q_rows.clone())?,
                out_norms,
                pre_mlp_norm,
                mlp: match (family.layers[i].sparse, family.moe) {
                    (true, Some(moe)) => Mlp::Sparse(l.experts(&p, &moe, h)?),
                    _ => l.dense_mlp(&p, h, inter, &inter_rows)?,
                },
                sinks: l.optional(
                    &format!("{p}.self_attn.sinks"),
                    &[config.num_heads],
                    Part::Rows(heads.q.clone()),
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
            final_norm: l.norm("model.norm.weight", h, off)?,
            lm_head,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use half::f16;
    use tessera_kernels::cpu::WeightFormat;
    use tessera_kernels::quant::{QuantFormat, dequantize};
    use tessera_model_files::{Architecture, FormatError, HostTensor};

    use super::*;

    /// Matrices as blocks of one format and vectors as f32, cut natively like a GGUF file:
    /// rows as byte ranges, columns on block boundaries only.
    struct Blocks {
        quant: QuantFormat,
        tensors: HashMap<String, (Vec<usize>, Vec<u8>)>,
    }

    impl Blocks {
        fn get(&self, name: &str) -> Result<&(Vec<usize>, Vec<u8>), FormatError> {
            self.tensors
                .get(name)
                .ok_or_else(|| FormatError::tensor("mem", name, "missing"))
        }

        fn format(&self) -> WeightFormat {
            match self.quant {
                QuantFormat::Q8_0 => WeightFormat::Q8_0,
                QuantFormat::Q4K => WeightFormat::Q4K,
                QuantFormat::Q6K => WeightFormat::Q6K,
                other => unimplemented!("no test blocks for {other:?}"),
            }
        }
    }

    impl WeightSource for Blocks {
        fn contains(&self, name: &str) -> bool {
            self.tensors.contains_key(name)
        }

        fn shape(&self, name: &str) -> Result<Vec<usize>, FormatError> {
            Ok(self.get(name)?.0.clone())
        }

        fn load_f32(&self, name: &str) -> Result<HostTensor, FormatError> {
            let (shape, bytes) = self.get(name)?;
            let mut data = vec![0f32; shape.iter().product()];
            if shape.len() == 2 {
                dequantize(self.quant, bytes, &mut data).expect("whole blocks");
            } else {
                data = bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
            }
            Ok(HostTensor {
                shape: shape.clone(),
                data,
            })
        }

        fn load_native(&self, name: &str) -> Result<Option<NativeTensor>, FormatError> {
            let rows = self.get(name)?.0[0];
            self.load_native_slice(name, 0, 0..rows)
        }

        fn load_native_slice(
            &self,
            name: &str,
            dim: usize,
            range: Range<usize>,
        ) -> Result<Option<NativeTensor>, FormatError> {
            let (shape, bytes) = self.get(name)?;
            let &[rows, cols] = shape.as_slice() else {
                return Ok(None);
            };
            let (per, block) = (self.quant.block_elements(), self.quant.block_bytes());
            let row_bytes = cols / per * block;
            let (shape, bytes) = match dim {
                0 => (
                    [range.len(), cols],
                    bytes[range.start * row_bytes..range.end * row_bytes].to_vec(),
                ),
                _ if range.start.is_multiple_of(per) && range.end.is_multiple_of(per) => {
                    let (b0, b1) = (range.start / per * block, range.end / per * block);
                    let cut = bytes
                        .chunks_exact(row_bytes)
                        .flat_map(|r| r[b0..b1].to_vec())
                        .collect();
                    ([rows, range.len()], cut)
                }
                _ => return Ok(None),
            };
            Ok(Some(NativeTensor {
                format: self.format(),
                shape,
                bytes,
            }))
        }
    }

    fn config() -> ModelConfig {
        ModelConfig {
            architecture: Architecture::Llama,
            vocab_size: 96,
            hidden_size: 64,
            intermediate_size: 128,
            num_layers: 1,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            rms_norm_eps: 1e-5,
            rope_theta: 1e4,
            rope_scaling: None,
            max_position_embeddings: 64,
            tie_word_embeddings: false,
            sliding_window: None,
            attention_bias: false,
            dtype: None,
            bos_token_id: None,
            eos_token_ids: Vec::new(),
            family: tessera_model_files::Family::llama(1, 16, None),
            score_labels: None,
        }
    }

    /// One block of `quant` with small scales and varied quants, in GGUF's byte order.
    fn block(quant: QuantFormat, seed: u32) -> Vec<u8> {
        let scale = |s: f32| f16::from_f32(s + (seed >> 20) as f32 * 1e-6).to_le_bytes();
        let bytes = |n: u32, mul: u32| (0..n).map(move |j| (seed >> 8).wrapping_add(j * mul) as u8);
        match quant {
            QuantFormat::Q8_0 => scale(0.01).into_iter().chain(bytes(32, 37)).collect(),
            // d, dmin, 12 bytes of 6-bit sub-block scales and minimums, 128 of nibbles.
            QuantFormat::Q4K => [scale(0.001), scale(0.002)]
                .into_iter()
                .flatten()
                .chain(bytes(12, 29))
                .chain(bytes(128, 37))
                .collect(),
            // 128 bytes of low nibbles, 64 of high bits, 16 signed 8-bit scales, d.
            QuantFormat::Q6K => bytes(192, 37)
                .chain(bytes(16, 53))
                .chain(scale(0.0002))
                .collect(),
            other => unimplemented!("no test blocks for {other:?}"),
        }
    }

    fn source(c: &ModelConfig, quant: QuantFormat) -> Blocks {
        let (h, i, v) = (c.hidden_size, c.intermediate_size, c.vocab_size);
        let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let mut seed = 1u32;
        let mut matrix = |rows: usize, cols: usize| {
            let mut bytes = Vec::new();
            for _ in 0..rows * cols / quant.block_elements() {
                seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                bytes.extend(block(quant, seed));
            }
            (vec![rows, cols], bytes)
        };
        let p = "model.layers.0";
        let mut t: HashMap<String, (Vec<usize>, Vec<u8>)> = [
            (format!("{p}.self_attn.q_proj.weight"), matrix(q, h)),
            (format!("{p}.self_attn.k_proj.weight"), matrix(kv, h)),
            (format!("{p}.self_attn.v_proj.weight"), matrix(kv, h)),
            (format!("{p}.self_attn.o_proj.weight"), matrix(h, q)),
            (format!("{p}.mlp.gate_proj.weight"), matrix(i, h)),
            (format!("{p}.mlp.up_proj.weight"), matrix(i, h)),
            (format!("{p}.mlp.down_proj.weight"), matrix(h, i)),
            ("model.embed_tokens.weight".into(), matrix(v, h)),
            ("lm_head.weight".into(), matrix(v, h)),
        ]
        .into_iter()
        .collect();
        let ones: Vec<u8> = (0..h).flat_map(|_| 1f32.to_le_bytes()).collect();
        for norm in [
            format!("{p}.input_layernorm.weight"),
            format!("{p}.post_attention_layernorm.weight"),
            "model.norm.weight".into(),
        ] {
            t.insert(norm, (vec![h], ones.clone()));
        }
        Blocks { quant, tensors: t }
    }

    #[test]
    fn ranks_keep_block_aligned_parts_native_and_equal_to_f32_slices() {
        let c = config();
        let src = source(&c, QuantFormat::Q8_0);
        for (world, layout) in [1, 2, 4]
            .into_iter()
            .flat_map(|w| [(w, WeightLayout::Exact), (w, WeightLayout::Int8)])
        {
            for rank in 0..world {
                let part = Partition::new(rank, world);
                let heads = part.heads(&c);
                let w = ModelWeights::load(&c, &src, "mem", part, &heads, layout).unwrap();
                let l = &w.layers[0];
                // Columns of o (16 per head) cut Q8_0 blocks on 4 ranks: f32 there.
                let o_native = (c.num_heads * c.head_dim / world).is_multiple_of(32);
                for (what, m, native) in [
                    ("qkv", &l.qkv.weight, true),
                    ("gate_up", &l.mlp.dense().unwrap().0.weight, true),
                    ("o", &l.o.weight, o_native),
                    ("down", &l.mlp.dense().unwrap().1.weight, true),
                    ("embed", &w.embed, true),
                    ("lm_head", w.lm_head.as_ref().unwrap(), true),
                ] {
                    let want = if native {
                        WeightFormat::Q8_0
                    } else {
                        WeightFormat::F32
                    };
                    assert_eq!(m.format(), want, "{what} rank {rank} of {world}");
                }
                // Values: as the f32 slices of the dequantized matrices.
                let full = |n: &str| src.load_f32(n).unwrap();
                let p = "model.layers.0";
                let hd = c.head_dim;
                let q_rows = heads.q.start * hd..heads.q.end * hd;
                let kv_rows = heads.kv.start * hd..heads.kv.end * hd;
                let qkv: Vec<f32> = [
                    ("q_proj", q_rows.clone()),
                    ("k_proj", kv_rows.clone()),
                    ("v_proj", kv_rows),
                ]
                .into_iter()
                .flat_map(|(n, r)| {
                    full(&format!("{p}.self_attn.{n}.weight"))
                        .slice(0, r)
                        .unwrap()
                        .data
                })
                .collect();
                assert_eq!(l.qkv.weight.to_f32(), qkv, "rank {rank} of {world}");
                let o = full(&format!("{p}.self_attn.o_proj.weight"));
                assert_eq!(l.o.weight.to_f32(), o.slice(1, q_rows).unwrap().data);
                let inter = part.split(c.intermediate_size);
                let down = full(&format!("{p}.mlp.down_proj.weight"));
                let got = l.mlp.dense().unwrap().1.weight.to_f32();
                assert_eq!(got, down.slice(1, inter).unwrap().data);
                let embed = full("model.embed_tokens.weight");
                assert_eq!(
                    w.embed.to_f32(),
                    embed.slice(0, w.vocab.clone()).unwrap().data
                );
            }
        }
    }

    /// K-quant matrices (rows of whole 256-value super-blocks) load natively on every rank
    /// where their columns are cut on super-block boundaries, and go to the integer path under
    /// the default layout, whose rows read back as the file's.
    #[test]
    fn k_quant_ranks_load_natively_and_pack_for_int8() {
        let c = ModelConfig {
            hidden_size: 256,
            intermediate_size: 512,
            head_dim: 64,
            ..config()
        };
        for quant in [QuantFormat::Q4K, QuantFormat::Q6K] {
            let src = source(&c, quant);
            for (world, layout) in [1, 2, 4]
                .into_iter()
                .flat_map(|w| [(w, WeightLayout::Exact), (w, WeightLayout::Int8)])
            {
                for rank in 0..world {
                    let part = Partition::new(rank, world);
                    let heads = part.heads(&c);
                    let w = ModelWeights::load(&c, &src, "mem", part, &heads, layout).unwrap();
                    let l = &w.layers[0];
                    let whole = |cols: usize| cols.is_multiple_of(256);
                    let q_cols = c.num_heads * c.head_dim / world;
                    let inter = part.split(c.intermediate_size);
                    for (what, m, native) in [
                        ("qkv", &l.qkv.weight, true),
                        ("gate_up", &l.mlp.dense().unwrap().0.weight, true),
                        ("o", &l.o.weight, whole(q_cols)),
                        ("down", &l.mlp.dense().unwrap().1.weight, whole(inter.len())),
                        ("lm_head", w.lm_head.as_ref().unwrap(), true),
                    ] {
                        let at = format!("{quant:?} {what} rank {rank} of {world} {layout:?}");
                        let want = if native {
                            src.format()
                        } else {
                            WeightFormat::F32
                        };
                        assert_eq!(m.format(), want, "{at}");
                        assert_eq!(m.is_int8(), native && layout == WeightLayout::Int8, "{at}");
                    }
                    let down = src.load_f32("model.layers.0.mlp.down_proj.weight").unwrap();
                    let want = down.slice(1, inter).unwrap().data;
                    let got = l.mlp.dense().unwrap().1.weight.to_f32();
                    assert_eq!(got, want, "{quant:?} down");
                }
            }
        }
    }

    #[test]
    fn integer_products_are_the_default_only_with_hardware_for_them() {
        use WeightLayout::{Exact, F32, Int8};
        for (native, int8, hardware, want) in [
            (None, None, true, Int8),
            (None, None, false, Exact),
            (None, Some("0"), true, Exact),
            (None, Some(" 1 "), false, Int8),
            (Some("0"), Some("1"), true, F32),
            (Some("1"), None, true, Int8),
        ] {
            assert_eq!(
                WeightLayout::choose(native, int8, hardware),
                want,
                "{native:?} {int8:?} {hardware}"
            );
        }
    }
}
