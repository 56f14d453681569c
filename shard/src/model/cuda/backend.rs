//! The CUDA backend's state and its [`Backend`] operations: the kernels of `kernels/cuda/` for
//! everything but products, which `weights` multiplies.

use std::sync::Arc;

use tessera_kernels::cuda::cudarc::driver::{CudaSlice, CudaStream};
use tessera_kernels::cuda::{
    CacheView, DecodeArgs, Gemm, GpuDevice, GpuKernels, PrefillArgs, RopeCacheArgs,
};
use tessera_model_files::Activation;

use super::super::backend::{Backend, Dims, Norm, Proj};
use super::super::batch::FlatBatch;
use super::super::forward::HostOutput;
use super::graph::DecodeGraphs;
use super::weights::{GpuLayer, GpuLinear, to_elems};
use super::*;
use crate::EngineError;
use crate::comm::Communicator;

pub(crate) struct CudaBackend<T> {
    pub(super) device: GpuDevice,
    pub(super) kernels: GpuKernels,
    pub(super) gemm: Gemm,
    pub(super) layers: Vec<GpuLayer<T>>,
    /// This rank's vocabulary rows, `[local vocab, hidden]`.
    pub(super) embed: CudaSlice<T>,
    /// `None` when tied to `embed`.
    pub(super) lm_head: Option<GpuLinear<T>>,
    /// Values of the largest quantized matrix: the dequantization scratch a prefill needs.
    pub(super) largest_quant: usize,
    pub(super) final_norm: CudaSlice<T>,
    pub(super) vocab_start: usize,
    pub(super) local_vocab: usize,
    pub(super) inv_freq: CudaSlice<f32>,
    pub(crate) dims: Dims,
    pub(super) eps: f32,
    /// Each layer's attention window.
    pub(super) windows: Vec<Option<usize>>,
    pub(super) attention_scale: f32,
    pub(super) rotary_dim: usize,
    pub(super) comm: Arc<dyn Communicator>,
    pub(super) world_size: usize,
    pub(super) graphs: DecodeGraphs<T>,
    /// Prefill attention through the tensor-core kernel (when it has an instance).
    pub(super) tensor_core_attention: bool,
}

/// Copies `values` to the device; an empty slice becomes one zero (no zero-byte allocation).
fn upload_i32(stream: &Arc<CudaStream>, values: &[i32]) -> Result<CudaSlice<i32>, EngineError> {
    let padded: &[i32] = if values.is_empty() { &[0] } else { values };
    stream.clone_htod(padded).map_err(device_error)
}

impl<T: DeviceElem> CudaBackend<T> {
    pub(super) fn stream(&self) -> &Arc<CudaStream> {
        self.device.stream()
    }

    pub(super) fn local_vocab(&self) -> usize {
        self.local_vocab
    }

    pub(super) fn world_size(&self) -> usize {
        self.world_size
    }

    pub(super) fn graphs(&self) -> &DecodeGraphs<T> {
        &self.graphs
    }

    /// One pass: a decode step of a common batch size replays its CUDA graph; anything else
    /// runs kernel by kernel.
    pub(super) fn forward(
        &self,
        layers: usize,
        batch: &FlatBatch<'_>,
        kv: &mut CudaPages<T>,
    ) -> Result<HostOutput, EngineError> {
        if batch
            .seqs
            .iter()
            .any(|s| s.tree.is_some_and(|t| !t.is_chain()))
        {
            return Err(EngineError::InvalidBatch(
                "token trees are verified on the CPU backend only; on a GPU speculate with a \
                 tree width of 1 (a chain)"
                    .into(),
            ));
        }
        if !batch.hidden_only_rows.is_empty() {
            return Err(EngineError::Device(
                "EAGLE draft layers run on the CPU backend only".into(),
            ));
        }
        if !batch.keep_hidden
            && let Some(logits) = self.graphed_decode(layers, batch, kv)?
        {
            return Ok(HostOutput {
                logits,
                hidden: Vec::new(),
            });
        }
        super::super::forward::forward(self, self.dims, layers, batch, kv, self.local_vocab)
    }
}

/// A pass's index arrays on the device.
pub(crate) struct GpuBatch {
    pub(super) ids: CudaSlice<i32>,
    pub(super) positions: CudaSlice<i32>,
    pub(super) slots: CudaSlice<i32>,
    /// `[num_seqs, max_blocks]`, unused entries 0.
    pub(super) block_tables: CudaSlice<i32>,
    pub(super) max_blocks: usize,
    pub(super) num_seqs: usize,
    pub(super) tokens: usize,
    pub(super) block_size: usize,
    /// Every sequence has exactly one new row: the paged decode kernel runs.
    pub(super) decode: bool,
    /// Decode: each sequence's context length, its new token included.
    pub(super) context_lens: CudaSlice<i32>,
    pub(super) max_context: usize,
    /// Prefill: first row of each sequence, then the total.
    pub(super) cu_seqlens: CudaSlice<i32>,
    /// Prefill: position of each sequence's first row.
    pub(super) first_pos: CudaSlice<i32>,
    pub(super) max_rows: usize,
    /// Rows that go through the LM head, as runs `(first row, rows)`.
    pub(super) logit_runs: Vec<(usize, usize)>,
}

impl GpuBatch {
    /// Rows that go through the LM head.
    fn logit_rows(&self) -> usize {
        self.logit_runs.iter().map(|&(_, n)| n).sum()
    }
}

impl<T: DeviceElem> Backend for CudaBackend<T> {
    type Act = CudaSlice<T>;
    type Pages = CudaPages<T>;
    type Batch<'a> = GpuBatch;

    fn upload<'a>(&'a self, b: &'a FlatBatch<'a>) -> Result<GpuBatch, EngineError> {
        let s = self.stream();
        let k = b.kernel_index()?;
        Ok(GpuBatch {
            ids: upload_i32(s, &k.ids)?,
            positions: upload_i32(s, &k.positions)?,
            slots: upload_i32(s, &k.slots)?,
            block_tables: upload_i32(s, &k.block_tables)?,
            max_blocks: k.max_blocks,
            num_seqs: b.seqs.len(),
            tokens: b.tokens(),
            block_size: b.block_size,
            decode: k.decode,
            context_lens: upload_i32(s, &k.context_lens)?,
            max_context: k.max_context,
            cu_seqlens: upload_i32(s, &k.cu_seqlens)?,
            first_pos: upload_i32(s, &k.first_pos)?,
            max_rows: k.max_rows,
            logit_runs: k.logit_runs,
        })
    }

    fn zeros(&self, len: usize) -> Result<CudaSlice<T>, EngineError> {
        self.stream()
            .alloc_zeros::<T>(len.max(1))
            .map_err(device_error)
    }

    fn embed(&self, batch: &GpuBatch, out: &mut CudaSlice<T>) -> Result<(), EngineError> {
        // `ids` holds exactly the batch's tokens (a pass has at least one).
        debug_assert_eq!(batch.ids.len(), batch.tokens);
        self.kernels
            .embedding(
                &batch.ids,
                &self.embed,
                out,
                self.dims.hidden,
                self.vocab_start,
            )
            .map_err(device_error)
    }

    fn rms_norm(
        &self,
        norm: Norm,
        x: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
        rows: usize,
    ) -> Result<(), EngineError> {
        self.kernels
            .rms_norm(x, self.norm_weight(norm)?, out, rows, self.eps)
            .map_err(device_error)
    }

    fn add_rms_norm(
        &self,
        norm: Norm,
        residual: &mut CudaSlice<T>,
        x: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
        rows: usize,
    ) -> Result<(), EngineError> {
        self.kernels
            .add_rms_norm(residual, x, self.norm_weight(norm)?, out, rows, self.eps)
            .map_err(device_error)
    }

    fn linear(
        &self,
        layer: usize,
        proj: Proj,
        x: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
        rows: usize,
    ) -> Result<(), EngineError> {
        self.multiply(self.projection(layer, proj), x, out, rows)
    }

    fn attention(
        &self,
        layer: usize,
        batch: &GpuBatch,
        qkv: &mut CudaSlice<T>,
        kv: &mut CudaPages<T>,
        out: &mut CudaSlice<T>,
    ) -> Result<(), EngineError> {
        let d = self.dims;
        let (cache_k, cache_v) = &mut kv.layers[layer];
        let qkv_width = d.qkv_width();
        self.kernels
            .rope_and_cache(RopeCacheArgs {
                qkv: &mut *qkv,
                tokens: batch.tokens,
                row_stride: qkv_width,
                q_offset: 0,
                k_offset: d.heads * d.head_dim,
                v_offset: (d.heads + d.kv_heads) * d.head_dim,
                num_heads: d.heads,
                kv_heads: d.kv_heads,
                head_dim: d.head_dim,
                rot_dim: self.rotary_dim,
                positions: &batch.positions,
                inv_freq: &self.inv_freq,
                slot_mapping: &batch.slots,
                cache_k: &mut *cache_k,
                cache_v: &mut *cache_v,
            })
            .map_err(device_error)?;
        let cache = CacheView {
            k: cache_k,
            v: cache_v,
            block_size: batch.block_size,
            kv_heads: d.kv_heads,
            head_dim: d.head_dim,
            block_tables: &batch.block_tables,
            max_blocks: batch.max_blocks,
        };
        let (scale, window) = (self.attention_scale, self.windows[layer]);
        let result = if batch.decode {
            self.kernels.paged_attention_decode(DecodeArgs {
                out,
                q: &*qkv,
                q_stride: qkv_width,
                cache,
                context_lens: &batch.context_lens,
                max_context: batch.max_context,
                num_seqs: batch.num_seqs,
                num_heads: d.heads,
                scale,
                window,
            })
        } else {
            let args = PrefillArgs {
                out,
                q: &*qkv,
                q_stride: qkv_width,
                cache,
                cu_seqlens: &batch.cu_seqlens,
                first_pos: &batch.first_pos,
                num_seqs: batch.num_seqs,
                max_rows: batch.max_rows,
                num_heads: d.heads,
                scale,
                window,
            };
            if self.tensor_core_attention {
                self.kernels.flash_attention_prefill_tc(args)
            } else {
                self.kernels.flash_attention_prefill(args)
            }
        };
        result.map_err(device_error)
    }

    fn gated(
        &self,
        act: Activation,
        gate_up: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
        rows: usize,
        width: usize,
    ) -> Result<(), EngineError> {
        match act {
            Activation::Silu => self
                .kernels
                .silu_mul(gate_up, out, rows, width)
                .map_err(device_error),
            // `upload` refuses such models.
            Activation::GeluTanh => Err(EngineError::Device(
                "the CUDA backend has no GeGLU kernel".into(),
            )),
        }
    }

    fn sparse_mlp(&self, _layer: usize) -> bool {
        // `upload` refuses sparse models.
        false
    }

    fn moe(
        &self,
        _layer: usize,
        _x: &CudaSlice<T>,
        _out: &mut CudaSlice<T>,
        _rows: usize,
    ) -> Result<(), EngineError> {
        Err(EngineError::Device(
            "the CUDA backend has no mixture-of-experts MLP".into(),
        ))
    }

    fn all_reduce(&self, x: &mut CudaSlice<T>) -> Result<(), EngineError> {
        if self.world_size == 1 {
            return Ok(());
        }
        let s = self.stream();
        let host: Vec<T> = s.clone_dtoh(&*x).map_err(device_error)?;
        let mut sums: Vec<f32> = host.iter().map(|v| v.to_f32()).collect();
        self.comm.all_reduce_f32(&mut sums)?;
        s.memcpy_htod(&to_elems::<T>(&sums), x)
            .map_err(device_error)
    }

    fn final_norm(
        &self,
        batch: &GpuBatch,
        residual: &CudaSlice<T>,
        proj: &CudaSlice<T>,
    ) -> Result<CudaSlice<T>, EngineError> {
        let rows = batch.logit_rows();
        if rows == 0 {
            return self.zeros(0);
        }
        let h = self.dims.hidden;
        let s = self.stream();
        // Gather the rows that need logits, then the final norm of residual + proj.
        let mut last = self.zeros(rows * h)?;
        let mut last_proj = self.zeros(rows * h)?;
        let mut at = 0;
        for &(first, n) in &batch.logit_runs {
            let src = first * h..(first + n) * h;
            let dst = at * h..(at + n) * h;
            s.memcpy_dtod(
                &residual.slice(src.clone()),
                &mut last.slice_mut(dst.clone()),
            )
            .map_err(device_error)?;
            s.memcpy_dtod(&proj.slice(src), &mut last_proj.slice_mut(dst))
                .map_err(device_error)?;
            at += n;
        }
        let mut normed = self.zeros(rows * h)?;
        self.kernels
            .add_rms_norm(
                &mut last,
                &last_proj,
                &self.final_norm,
                &mut normed,
                rows,
                self.eps,
            )
            .map_err(device_error)?;
        Ok(normed)
    }

    fn lm_head(&self, normed: &CudaSlice<T>, rows: usize) -> Result<CudaSlice<T>, EngineError> {
        if rows == 0 {
            return self.zeros(0);
        }
        let h = self.dims.hidden;
        let mut logits = self.zeros(rows * self.local_vocab)?;
        match &self.lm_head {
            Some(head) => self.multiply(head, normed, &mut logits, rows)?,
            None => self
                .gemm
                .linear(
                    normed,
                    &self.embed,
                    None,
                    &mut logits,
                    rows,
                    self.local_vocab,
                    h,
                )
                .map_err(device_error)?,
        }
        Ok(logits)
    }

    fn to_host(&self, x: CudaSlice<T>, len: usize) -> Result<Vec<f32>, EngineError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let host: Vec<T> = self
            .stream()
            .clone_dtoh(&x.slice(..len))
            .map_err(device_error)?;
        Ok(host.into_iter().map(|v| v.to_f32()).collect())
    }

    fn upload_values(&self, x: &[f32]) -> Result<CudaSlice<T>, EngineError> {
        let padded: &[f32] = if x.is_empty() { &[0.0] } else { x };
        self.stream()
            .clone_htod(&to_elems::<T>(padded))
            .map_err(device_error)
    }
}
