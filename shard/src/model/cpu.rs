//! The CPU backend: weights in host memory in their file's format, activations in f32, the
//! SIMD kernels of `tessera_kernels::cpu`, and the communicator's host all-reduce.

use std::sync::Arc;

use tessera_kernels::cpu::attention::{
    self, AttentionSeq, KvElem, KvLayout, NewKv, PagedAttention, PagedKv, PagedKvMut, softcap,
};
use tessera_kernels::cpu::{
    ActivationDtype, activation, linear_weights_as, norm, rope as rope_kernel,
};
use tessera_model_files::{Activation, Family};

use super::backend::{Backend, Dims, Norm, Proj};
use super::batch::FlatBatch;
use super::op_times::{Op, OpTimes};
use super::rope::Rope;
use super::weights::{Linear, Mlp, ModelWeights};
use crate::EngineError;
use crate::comm::Communicator;
use crate::kv_cache::HostPages;

pub(crate) struct CpuBackend {
    pub(crate) weights: ModelWeights,
    pub(crate) dims: Dims,
    pub(crate) rope: Rope,
    /// The rotary frequencies of layers with their own (local) RoPE, if any layer has one.
    pub(crate) local_rope: Option<Rope>,
    pub(crate) eps: f32,
    /// The layers' structure and attention options.
    pub(crate) family: Family,
    pub(crate) activations: ActivationDtype,
    pub(crate) comm: Arc<dyn Communicator>,
    pub(crate) world_size: usize,
    pub(crate) op_times: Option<Arc<OpTimes>>,
}

/// A pass on the CPU: the flattened batch and its tokens' rotary cosines and sines (and those
/// of the local RoPE, when some layers have one).
pub(crate) struct CpuBatch<'a> {
    pub(crate) flat: &'a FlatBatch<'a>,
    pub(crate) cos: Vec<f32>,
    pub(crate) sin: Vec<f32>,
    local: Option<(Vec<f32>, Vec<f32>)>,
}

impl CpuBackend {
    /// Runs `f`, counting its time against `op` when someone is measuring.
    fn timed<R>(&self, op: Op, f: impl FnOnce() -> R) -> R {
        match &self.op_times {
            Some(times) => times.time(op, f),
            None => f(),
        }
    }

    /// RoPE on the queries, the cache write and attention of `layer`.
    fn attend(
        &self,
        layer: usize,
        batch: &CpuBatch<'_>,
        qkv: &mut [f32],
        kv: &mut HostPages,
        out: &mut [f32],
    ) {
        let d = self.dims;
        let qkv_width = d.qkv_width();
        let spec = self.family.layers[layer];
        let (cos, sin) = match (&batch.local, spec.local_rope) {
            (Some((cos, sin)), true) => (cos, sin),
            _ => (&batch.cos, &batch.sin),
        };
        if let Some((q_norm, k_norm)) = &self.weights.layers[layer].qk_norm {
            let k_offset = d.heads * d.head_dim;
            norm::rms_norm_heads(qkv, qkv_width, 0, d.heads, q_norm, self.eps);
            norm::rms_norm_heads(qkv, qkv_width, k_offset, d.kv_heads, k_norm, self.eps);
        }
        // Queries rotate in place; keys rotate as they are written into the cache.
        if spec.rope {
            rope_kernel::apply_rope(qkv, qkv_width, 0, d.heads, d.head_dim, cos, sin);
        }
        let step = AttentionStep {
            layout: KvLayout {
                block_size: batch.flat.block_size,
                kv_heads: d.kv_heads,
                head_dim: d.head_dim,
            },
            new: NewKv {
                rows: qkv,
                row_stride: qkv_width,
                k_offset: d.heads * d.head_dim,
                v_offset: (d.heads + d.kv_heads) * d.head_dim,
                slots: &batch.flat.slots,
                rope: spec.rope.then_some((cos, sin)),
            },
            heads: d.heads,
            seqs: &batch.flat.seqs,
            scale: self.family.attention_scale,
            window: spec.window,
            softcap: self.family.attention_softcap,
            sinks: self.weights.layers[layer].sinks.as_deref(),
        };
        match kv {
            HostPages::F32(layers) => step.run(&mut layers[layer], out),
            HostPages::Bf16(layers) => step.run(&mut layers[layer], out),
        }
    }

    /// The final norm of the rows that want logits (only they go on to the LM head), then of
    /// the other rows whose states the batch keeps.
    fn final_hidden(&self, batch: &CpuBatch<'_>, residual: &[f32], proj: &[f32]) -> Vec<f32> {
        let h = self.dims.hidden;
        let rows = batch.flat.logit_rows.len() + batch.flat.hidden_only_rows.len();
        let mut last = Vec::with_capacity(rows * h);
        for r in batch.flat.hidden_rows() {
            let res = &residual[r * h..(r + 1) * h];
            last.extend(
                res.iter()
                    .zip(&proj[r * h..(r + 1) * h])
                    .map(|(a, b)| a + b),
            );
        }
        let mut last_normed = vec![0f32; rows * h];
        norm::rms_norm(&last, &self.weights.final_norm, self.eps, &mut last_normed);
        last_normed
    }

    /// This rank's vocabulary slice of the LM head over `rows` final hidden states.
    fn vocab_logits(&self, hidden: &[f32], rows: usize) -> Vec<f32> {
        let w = &self.weights;
        let head = w.lm_head.as_ref().unwrap_or(&w.embed);
        debug_assert_eq!(head.cols(), self.dims.hidden);
        let mut logits = vec![0f32; rows * w.vocab.len()];
        let hidden = &hidden[..rows * self.dims.hidden];
        linear_weights_as(hidden, head, None, rows, &mut logits, self.activations);
        if let Some(cap) = self.family.final_softcap {
            logits.iter_mut().for_each(|x| *x = softcap(*x, cap));
        }
        logits
    }

    fn norm_weight(&self, norm: Norm) -> Result<&[f32], EngineError> {
        let layers = &self.weights.layers;
        let out_norms = |l: usize| {
            layers[l]
                .out_norms
                .as_ref()
                .ok_or_else(|| EngineError::InvalidBatch(format!("layer {l} has no output norms")))
        };
        Ok(match norm {
            Norm::Input(l) => &layers[l].input_norm,
            Norm::PreMlp(l) => &layers[l].pre_mlp_norm,
            Norm::AttentionOut(l) => &out_norms(l)?.0,
            Norm::MlpOut(l) => &out_norms(l)?.1,
        })
    }

    fn projection(&self, layer: usize, proj: Proj) -> Result<&Linear, EngineError> {
        let l = &self.weights.layers[layer];
        let dense = || {
            l.mlp.dense().ok_or_else(|| {
                EngineError::InvalidBatch(format!("layer {layer}'s MLP is not dense"))
            })
        };
        Ok(match proj {
            Proj::Qkv => &l.qkv,
            Proj::O => &l.o,
            Proj::GateUp => dense()?.0,
            Proj::Down => dense()?.1,
        })
    }
}

impl Backend for CpuBackend {
    type Act = Vec<f32>;
    type Pages = HostPages;
    type Batch<'a> = CpuBatch<'a>;

    fn upload<'a>(&'a self, flat: &'a FlatBatch<'a>) -> Result<CpuBatch<'a>, EngineError> {
        let (cos, sin, local) = self.timed(Op::Embed, || {
            let (cos, sin) = self.rope.cos_sin(&flat.rope_lens, &flat.positions);
            let local = self
                .local_rope
                .as_ref()
                .map(|r| r.cos_sin(&flat.rope_lens, &flat.positions));
            (cos, sin, local)
        });
        Ok(CpuBatch {
            flat,
            cos,
            sin,
            local,
        })
    }

    fn zeros(&self, len: usize) -> Result<Vec<f32>, EngineError> {
        Ok(vec![0f32; len])
    }

    fn embed(&self, batch: &CpuBatch<'_>, out: &mut Vec<f32>) -> Result<(), EngineError> {
        // Vocabulary-parallel lookup: rows of other ranks' tokens stay zero here, and the
        // all-reduce adds exact zeros, so every rank ends with the exact embedding rows.
        let vocab = &self.weights.vocab;
        let h = self.dims.hidden;
        self.timed(Op::Embed, || {
            for (row, &id) in out.chunks_exact_mut(h).zip(&batch.flat.input_ids) {
                if vocab.contains(&(id as usize)) {
                    self.weights.embed.row_f32(id as usize - vocab.start, row);
                    if let Some(scale) = self.family.embedding_scale {
                        row.iter_mut().for_each(|x| *x *= scale);
                    }
                }
            }
        });
        Ok(())
    }

    fn rms_norm(
        &self,
        which: Norm,
        x: &Vec<f32>,
        out: &mut Vec<f32>,
        _rows: usize,
    ) -> Result<(), EngineError> {
        let weight = self.norm_weight(which)?;
        self.timed(Op::Norm, || norm::rms_norm(x, weight, self.eps, out));
        Ok(())
    }

    fn add_rms_norm(
        &self,
        which: Norm,
        residual: &mut Vec<f32>,
        x: &Vec<f32>,
        out: &mut Vec<f32>,
        _rows: usize,
    ) -> Result<(), EngineError> {
        let weight = self.norm_weight(which)?;
        self.timed(Op::Norm, || {
            norm::add_rms_norm(residual, x, weight, self.eps, out)
        });
        Ok(())
    }

    fn linear(
        &self,
        layer: usize,
        proj: Proj,
        x: &Vec<f32>,
        out: &mut Vec<f32>,
        rows: usize,
    ) -> Result<(), EngineError> {
        let l = self.projection(layer, proj)?;
        debug_assert_eq!(out.len(), rows * l.out_features());
        let op = match proj {
            Proj::Qkv => Op::Qkv,
            Proj::O => Op::O,
            Proj::GateUp => Op::GateUp,
            Proj::Down => Op::Down,
        };
        self.timed(op, || {
            linear_weights_as(x, &l.weight, l.bias.as_deref(), rows, out, self.activations)
        });
        Ok(())
    }

    fn attention(
        &self,
        layer: usize,
        batch: &CpuBatch<'_>,
        qkv: &mut Vec<f32>,
        kv: &mut HostPages,
        out: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        self.timed(Op::Attention, || self.attend(layer, batch, qkv, kv, out));
        Ok(())
    }

    fn gated(
        &self,
        act: Activation,
        gate_up: &Vec<f32>,
        out: &mut Vec<f32>,
        _rows: usize,
        width: usize,
    ) -> Result<(), EngineError> {
        self.timed(Op::SiluMul, || match act {
            Activation::Silu => activation::silu_mul(gate_up, width, out),
            Activation::GeluTanh => activation::gelu_tanh_mul(gate_up, width, out),
        });
        Ok(())
    }

    fn sparse_mlp(&self, layer: usize) -> bool {
        matches!(self.weights.layers[layer].mlp, Mlp::Sparse(_))
    }

    fn moe(
        &self,
        layer: usize,
        x: &Vec<f32>,
        out: &mut Vec<f32>,
        rows: usize,
    ) -> Result<(), EngineError> {
        let (Mlp::Sparse(weights), Some(moe)) = (&self.weights.layers[layer].mlp, &self.family.moe)
        else {
            return Err(EngineError::InvalidBatch(format!(
                "layer {layer}'s MLP is not sparse"
            )));
        };
        self.timed(Op::GateUp, || {
            super::moe::forward(weights, moe, x, rows, self.activations, out)
        });
        Ok(())
    }

    fn all_reduce(&self, x: &mut Vec<f32>) -> Result<(), EngineError> {
        if self.world_size > 1 {
            self.timed(Op::AllReduce, || self.comm.all_reduce_f32(x))?;
        }
        Ok(())
    }

    fn final_norm(
        &self,
        batch: &CpuBatch<'_>,
        residual: &Vec<f32>,
        proj: &Vec<f32>,
    ) -> Result<Vec<f32>, EngineError> {
        Ok(self.timed(Op::Logits, || self.final_hidden(batch, residual, proj)))
    }

    fn lm_head(&self, hidden: &Vec<f32>, rows: usize) -> Result<Vec<f32>, EngineError> {
        Ok(self.timed(Op::Logits, || self.vocab_logits(hidden, rows)))
    }

    fn to_host(&self, x: Vec<f32>, _len: usize) -> Result<Vec<f32>, EngineError> {
        Ok(x)
    }

    fn upload_values(&self, x: &[f32]) -> Result<Vec<f32>, EngineError> {
        Ok(x.to_vec())
    }
}

/// One layer's cache write and attention, for either cache element type.
pub(crate) struct AttentionStep<'a> {
    pub(crate) layout: KvLayout,
    /// The new tokens' keys and values in the qkv rows, whose queries attend.
    pub(crate) new: NewKv<'a>,
    pub(crate) heads: usize,
    pub(crate) seqs: &'a [AttentionSeq<'a>],
    pub(crate) scale: f32,
    pub(crate) window: Option<usize>,
    pub(crate) softcap: Option<f32>,
    pub(crate) sinks: Option<&'a [f32]>,
}

impl AttentionStep<'_> {
    /// Writes the new tokens' K/V (keys rotated, converted to `T`) and attends over the cache.
    pub(crate) fn run<T: KvElem>(&self, (k, v): &mut (Vec<T>, Vec<T>), out: &mut [f32]) {
        let layout = self.layout;
        attention::write_kv(PagedKvMut { layout, k, v }, &self.new);
        let problem = PagedAttention {
            kv: PagedKv { layout, k, v },
            q: self.new.rows,
            q_stride: self.new.row_stride,
            num_heads: self.heads,
            seqs: self.seqs,
            scale: self.scale,
            window: self.window,
            softcap: self.softcap,
            sinks: self.sinks,
        };
        attention::paged_attention(&problem, out);
    }
}
