//! The CUDA backend (feature `cuda`): activations and the paged KV cache in GPU memory in one
//! element type (bf16, or f32 for checking against the CPU), the kernels of `kernels/cuda/`
//! for everything but dense products, and cuBLAS(Lt) for those.
//!
//! GGUF `Q8_0`, `Q4_0` and `Q4_1` matrices stay the file's blocks in GPU memory: products with
//! up to 64 activation rows (decode) run the weight-only GEMV kernels, which read each block
//! once per 8 rows; larger ones (prefill) dequantize the matrix into scratch and go through
//! cuBLASLt. Other formats are dequantized into the element type at load. Under tensor
//! parallelism each all-reduce goes through the host (the communicator's), which is correct
//! with any communicator but not fast; NCCL on device buffers is the next step.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use half::bf16;
use rayon::prelude::*;
use tessera_kernels::cpu::attention::KvLayout;
use tessera_kernels::cpu::{WeightFormat, WeightMatrix};
use tessera_kernels::cuda::cudarc::driver::{CudaSlice, CudaStream};
use tessera_kernels::cuda::{
    CacheView, CudaError, DecodeArgs, Gemm, GemmElem, GpuDevice, GpuFloat, GpuKernels, GpuQuant,
    PrefillArgs, PtxCache, RopeCacheArgs,
};

use super::backend::{Backend, Dims, Norm, Proj};
use super::batch::FlatBatch;
use super::cpu::CpuBackend;
use super::cuda_graph::DecodeGraphs;
use super::weights::Linear;
use crate::EngineError;
use crate::comm::Communicator;
use crate::kv_cache::{KvCache, KvDtype, KvPages};

/// Where [`super::Model::into_cuda`] puts a model, and how it runs there.
#[derive(Debug, Clone, Copy)]
pub struct CudaOptions {
    /// CUDA device ordinal (after `CUDA_VISIBLE_DEVICES`); a shard uses its rank's.
    pub device: usize,
    /// Replay decode steps of common batch sizes as CUDA graphs (see `cuda_graph`).
    pub graphs: bool,
    /// Keep `Q8_0`, `Q4_0` and `Q4_1` matrices as the file's blocks in GPU memory (weight-only
    /// GEMV for decode, dequantized into scratch for prefill) instead of dequantizing them at
    /// load. Other formats are always dequantized.
    pub quantized: bool,
    /// Prefill attention on tensor cores (`flash_attention_mma.cu`: bf16/f16, head_dim 64 or
    /// 128) instead of the CUDA-core kernel. Off until a GPU run has checked it (see
    /// `scripts/gpu-check.sh`).
    pub tensor_core_attention: bool,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            device: 0,
            graphs: true,
            quantized: true,
            tensor_core_attention: false,
        }
    }
}

fn device_error(e: impl Into<CudaError>) -> EngineError {
    EngineError::Device(e.into().to_string())
}

/// An element type the backend runs in, and how it finds its pages in a [`CudaKv`].
pub(crate) trait DeviceElem: GemmElem {
    /// `m`'s values when it stores them in this type already (uploaded as they are).
    fn stored(m: &WeightMatrix) -> Option<&[Self]>;
    fn pages(kv: &mut CudaKv) -> Option<&mut Vec<(CudaSlice<Self>, CudaSlice<Self>)>>;
    fn wrap(pages: Vec<(CudaSlice<Self>, CudaSlice<Self>)>) -> DevicePages;
}

impl DeviceElem for f32 {
    fn stored(m: &WeightMatrix) -> Option<&[f32]> {
        m.as_f32()
    }
    fn pages(kv: &mut CudaKv) -> Option<&mut Vec<(CudaSlice<f32>, CudaSlice<f32>)>> {
        match &mut kv.pages {
            DevicePages::F32(p) => Some(p),
            DevicePages::Bf16(_) => None,
        }
    }
    fn wrap(pages: Vec<(CudaSlice<f32>, CudaSlice<f32>)>) -> DevicePages {
        DevicePages::F32(pages)
    }
}

impl DeviceElem for bf16 {
    fn stored(m: &WeightMatrix) -> Option<&[bf16]> {
        m.as_bf16()
    }
    fn pages(kv: &mut CudaKv) -> Option<&mut Vec<(CudaSlice<bf16>, CudaSlice<bf16>)>> {
        match &mut kv.pages {
            DevicePages::Bf16(p) => Some(p),
            DevicePages::F32(_) => None,
        }
    }
    fn wrap(pages: Vec<(CudaSlice<bf16>, CudaSlice<bf16>)>) -> DevicePages {
        DevicePages::Bf16(pages)
    }
}

/// Every layer's K and V pages in GPU memory, `[num_blocks · block_size, kv_heads, head_dim]`,
/// and an id no other cache of this process has (CUDA graphs hold the pages' addresses, so a
/// graph is only ever replayed on the cache it was captured with).
pub(crate) struct CudaKv {
    pub(crate) id: u64,
    pages: DevicePages,
}

pub(crate) enum DevicePages {
    F32(Vec<(CudaSlice<f32>, CudaSlice<f32>)>),
    Bf16(Vec<(CudaSlice<bf16>, CudaSlice<bf16>)>),
}

impl CudaKv {
    fn new(pages: DevicePages) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        CudaKv {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            pages,
        }
    }

    pub(crate) fn dtype(&self) -> KvDtype {
        match self.pages {
            DevicePages::F32(_) => KvDtype::Float32,
            DevicePages::Bf16(_) => KvDtype::Bfloat16,
        }
    }

    pub(crate) fn num_layers(&self) -> usize {
        match &self.pages {
            DevicePages::F32(p) => p.len(),
            DevicePages::Bf16(p) => p.len(),
        }
    }
}

/// A model on a GPU, in one of the element types.
pub(crate) enum CudaModel {
    F32(CudaBackend<f32>),
    Bf16(CudaBackend<bf16>),
}

impl CudaModel {
    /// Opens the device and uploads `cpu`'s weights in `dtype` (consuming the host copy).
    pub(crate) fn upload(
        cpu: CpuBackend,
        dtype: KvDtype,
        options: &CudaOptions,
    ) -> Result<Self, EngineError> {
        let device = GpuDevice::open(options.device).map_err(device_error)?;
        tracing::info!(
            gpu = device.name(),
            capability = ?device.compute_capability(),
            dtype = dtype.name(),
            "uploading weights to the GPU"
        );
        Ok(match dtype {
            KvDtype::Float32 => CudaModel::F32(CudaBackend::upload(cpu, device, options)?),
            KvDtype::Bfloat16 => CudaModel::Bf16(CudaBackend::upload(cpu, device, options)?),
        })
    }

    pub(crate) fn graph_replays(&self) -> u64 {
        match self {
            CudaModel::F32(b) => b.graphs().replays(),
            CudaModel::Bf16(b) => b.graphs().replays(),
        }
    }

    pub(crate) fn device_name(&self) -> String {
        match self {
            CudaModel::F32(b) => b.device.name().to_string(),
            CudaModel::Bf16(b) => b.device.name().to_string(),
        }
    }

    pub(crate) fn new_cache(
        &self,
        num_layers: usize,
        num_blocks: usize,
        layout: KvLayout,
    ) -> Result<KvCache, EngineError> {
        let kv = match self {
            CudaModel::F32(b) => b.new_pages(num_layers, num_blocks, layout)?,
            CudaModel::Bf16(b) => b.new_pages(num_layers, num_blocks, layout)?,
        };
        Ok(KvCache {
            layout,
            num_blocks,
            pages: KvPages::Cuda(kv),
        })
    }

    pub(crate) fn kv_budget(&self, fraction: f32, max_tokens: usize) -> Result<u64, EngineError> {
        match self {
            CudaModel::F32(b) => b.kv_budget(fraction, max_tokens),
            CudaModel::Bf16(b) => b.kv_budget(fraction, max_tokens),
        }
    }

    pub(crate) fn forward(
        &self,
        layers: usize,
        batch: &FlatBatch<'_>,
        pages: &mut KvPages,
    ) -> Result<Vec<f32>, EngineError> {
        let KvPages::Cuda(kv) = pages else {
            return Err(EngineError::InvalidBatch(
                "a GPU model was given a KV cache in host memory".into(),
            ));
        };
        if batch.tokens() == 0 {
            return Ok(Vec::new());
        }
        match self {
            CudaModel::F32(b) => b.forward(layers, batch, kv),
            CudaModel::Bf16(b) => b.forward(layers, batch, kv),
        }
    }
}

/// A weight matrix in GPU memory: dense in the element type, or the file's ggml blocks.
enum GpuWeight<T> {
    Dense(CudaSlice<T>),
    Quant {
        quant: GpuQuant,
        blocks: CudaSlice<u8>,
    },
}

/// Activation rows up to which a quantized product runs as a GEMV straight from the blocks
/// (the kernel re-reads them per 8 rows, still less traffic than a dequantized copy); above,
/// the matrix is dequantized into scratch and multiplied by cuBLASLt.
const GEMV_MAX_ROWS: usize = 64;

struct GpuLinear<T> {
    weight: GpuWeight<T>,
    bias: Option<CudaSlice<T>>,
    out_features: usize,
    in_features: usize,
}

struct GpuLayer<T> {
    input_norm: CudaSlice<T>,
    post_attention_norm: CudaSlice<T>,
    qkv: GpuLinear<T>,
    o: GpuLinear<T>,
    gate_up: GpuLinear<T>,
    down: GpuLinear<T>,
}

pub(crate) struct CudaBackend<T> {
    device: GpuDevice,
    kernels: GpuKernels,
    gemm: Gemm,
    layers: Vec<GpuLayer<T>>,
    /// This rank's vocabulary rows, `[local vocab, hidden]`.
    embed: CudaSlice<T>,
    /// `None` when tied to `embed`.
    lm_head: Option<GpuLinear<T>>,
    /// Values of the largest quantized matrix: the dequantization scratch a prefill needs.
    largest_quant: usize,
    final_norm: CudaSlice<T>,
    vocab_start: usize,
    local_vocab: usize,
    inv_freq: CudaSlice<f32>,
    pub(crate) dims: Dims,
    eps: f32,
    window: Option<usize>,
    comm: Arc<dyn Communicator>,
    world_size: usize,
    graphs: DecodeGraphs<T>,
    /// Prefill attention through the tensor-core kernel (when it has an instance).
    tensor_core_attention: bool,
}

fn to_elems<T: GpuFloat>(values: &[f32]) -> Vec<T> {
    values.par_iter().map(|&v| T::from_f32(v)).collect()
}

/// Copies `values` to the device; an empty slice becomes one zero (no zero-byte allocation).
fn upload_i32(stream: &Arc<CudaStream>, values: &[i32]) -> Result<CudaSlice<i32>, EngineError> {
    let padded: &[i32] = if values.is_empty() { &[0] } else { values };
    stream.clone_htod(padded).map_err(device_error)
}

impl<T: DeviceElem> CudaBackend<T> {
    fn upload(
        cpu: CpuBackend,
        device: GpuDevice,
        options: &CudaOptions,
    ) -> Result<Self, EngineError> {
        let kernels =
            GpuKernels::load(&device, &PtxCache::default_location()).map_err(device_error)?;
        let gemm = Gemm::new(device.stream().clone()).map_err(device_error)?;
        let stream = device.stream().clone();
        let put = |values: &[f32]| -> Result<CudaSlice<T>, EngineError> {
            stream
                .clone_htod(&to_elems::<T>(values))
                .map_err(device_error)
        };
        // A matrix already in the element type goes up as it is; others are converted on
        // rayon's threads (a bf16 checkpoint on a bf16 GPU is copied, never widened).
        let dense = |m: &WeightMatrix| -> Result<CudaSlice<T>, EngineError> {
            match T::stored(m) {
                Some(values) => stream.clone_htod(values).map_err(device_error),
                None => put(&m.to_f32()),
            }
        };
        let weight = |m: &WeightMatrix| -> Result<GpuWeight<T>, EngineError> {
            let quant = match m.ggml_blocks() {
                Some((WeightFormat::Q8_0, b)) => Some((GpuQuant::Q8_0, b)),
                Some((WeightFormat::Q4_0, b)) => Some((GpuQuant::Q4_0, b)),
                Some((WeightFormat::Q4_1, b)) => Some((GpuQuant::Q4_1, b)),
                _ => None,
            };
            Ok(match quant {
                Some((quant, bytes)) if options.quantized => GpuWeight::Quant {
                    quant,
                    blocks: stream.clone_htod(bytes).map_err(device_error)?,
                },
                _ => GpuWeight::Dense(dense(m)?),
            })
        };
        let linear = |l: &Linear| -> Result<GpuLinear<T>, EngineError> {
            Ok(GpuLinear {
                weight: weight(&l.weight)?,
                bias: l.bias.as_deref().map(put).transpose()?,
                out_features: l.out_features(),
                in_features: l.in_features(),
            })
        };
        let w = cpu.weights;
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            layers.push(GpuLayer {
                input_norm: put(&l.input_norm)?,
                post_attention_norm: put(&l.post_attention_norm)?,
                qkv: linear(&l.qkv)?,
                o: linear(&l.o)?,
                gate_up: linear(&l.gate_up)?,
                down: linear(&l.down)?,
            });
        }
        // The lookup kernel reads dense rows.
        let embed = dense(&w.embed)?;
        let lm_head = w
            .lm_head
            .as_ref()
            .map(|m| {
                Ok::<_, EngineError>(GpuLinear {
                    weight: weight(m)?,
                    bias: None,
                    out_features: m.rows(),
                    in_features: m.cols(),
                })
            })
            .transpose()?;
        let largest_quant = layers
            .iter()
            .flat_map(|l| [&l.qkv, &l.o, &l.gate_up, &l.down])
            .chain(lm_head.as_ref())
            .filter(|l| matches!(l.weight, GpuWeight::Quant { .. }))
            .map(|l| l.out_features * l.in_features)
            .max()
            .unwrap_or(0);
        let final_norm = put(&w.final_norm)?;
        let inv_freq = stream.clone_htod(&cpu.inv_freq).map_err(device_error)?;
        stream.synchronize().map_err(device_error)?;
        Ok(CudaBackend {
            kernels,
            gemm,
            layers,
            embed,
            lm_head,
            largest_quant,
            final_norm,
            vocab_start: w.vocab.start,
            local_vocab: w.vocab.len(),
            inv_freq,
            dims: cpu.dims,
            eps: cpu.eps,
            window: cpu.window,
            comm: cpu.comm,
            world_size: cpu.world_size,
            graphs: DecodeGraphs::new(options.graphs),
            tensor_core_attention: options.tensor_core_attention
                && GpuKernels::tensor_core_prefill_supported::<T>(cpu.dims.head_dim),
            device,
        })
    }

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
    fn forward(
        &self,
        layers: usize,
        batch: &FlatBatch<'_>,
        kv: &mut CudaKv,
    ) -> Result<Vec<f32>, EngineError> {
        if let Some(logits) = self.graphed_decode(layers, batch, kv)? {
            return Ok(logits);
        }
        super::forward::forward(self, self.dims, layers, batch, kv, self.local_vocab)
    }

    fn new_pages(
        &self,
        num_layers: usize,
        num_blocks: usize,
        layout: KvLayout,
    ) -> Result<CudaKv, EngineError> {
        // At least one slot per layer: a zero-block cache (between resizes) allocates nothing
        // real, and the kernels never see it.
        let len = (num_blocks * layout.block_size * layout.slot_width()).max(1);
        let mut pages = Vec::with_capacity(num_layers);
        for _ in 0..num_layers {
            let k = self.stream().alloc_zeros::<T>(len);
            let v = self.stream().alloc_zeros::<T>(len);
            match (k, v) {
                (Ok(k), Ok(v)) => pages.push((k, v)),
                (Err(e), _) | (_, Err(e)) => {
                    return Err(EngineError::Device(format!(
                        "allocating {num_blocks} KV blocks of {} tokens: {e}; lower \
                         --memory-fraction's share for the cache or --max-total-tokens",
                        layout.block_size
                    )));
                }
            }
        }
        Ok(CudaKv::new(T::wrap(pages)))
    }

    /// Device bytes one pass of `tokens` tokens allocates (activations, logits, the
    /// dequantization scratch), with a margin for cuBLASLt's workspace.
    fn activation_bytes(&self, tokens: usize) -> u64 {
        let d = self.dims;
        let values = tokens
            * (3 * d.hidden
                + d.qkv_width()
                + d.heads * d.head_dim
                + 3 * d.intermediate
                + self.local_vocab);
        ((values + self.largest_quant) * std::mem::size_of::<T>()) as u64 * 5 / 4 + (256 << 20)
    }

    fn kv_budget(&self, fraction: f32, max_tokens: usize) -> Result<u64, EngineError> {
        let (free, total) = self.device.memory().map_err(device_error)?;
        let usable = (free as f64 * f64::from(fraction)) as u64;
        let budget = usable.saturating_sub(self.activation_bytes(max_tokens));
        tracing::info!(
            free_mib = free >> 20,
            total_mib = total >> 20,
            kv_mib = budget >> 20,
            fraction,
            "GPU memory for the KV cache"
        );
        Ok(budget)
    }

    /// `out = x · Wᵀ (+ bias)` for `rows` rows, in whichever form `l` keeps its weights.
    fn multiply(
        &self,
        l: &GpuLinear<T>,
        x: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
        rows: usize,
    ) -> Result<(), EngineError> {
        let (n, k) = (l.out_features, l.in_features);
        match &l.weight {
            GpuWeight::Dense(w) => self.gemm.linear(x, w, l.bias.as_ref(), out, rows, n, k),
            GpuWeight::Quant { quant, blocks } if rows <= GEMV_MAX_ROWS => {
                self.kernels
                    .gemv(*quant, blocks, x, out, (rows, n, k))
                    .map_err(device_error)?;
                match &l.bias {
                    Some(bias) => self.kernels.add_bias(out, bias, rows),
                    None => Ok(()),
                }
            }
            GpuWeight::Quant { quant, blocks } => {
                let mut dense = self.zeros(n * k)?;
                self.kernels
                    .dequantize(*quant, blocks, &mut dense, n, k)
                    .map_err(device_error)?;
                self.gemm
                    .linear(x, &dense, l.bias.as_ref(), out, rows, n, k)
            }
        }
        .map_err(device_error)
    }

    fn projection(&self, layer: usize, proj: Proj) -> &GpuLinear<T> {
        let l = &self.layers[layer];
        match proj {
            Proj::Qkv => &l.qkv,
            Proj::O => &l.o,
            Proj::GateUp => &l.gate_up,
            Proj::Down => &l.down,
        }
    }

    fn norm_weight(&self, norm: Norm) -> &CudaSlice<T> {
        match norm {
            Norm::Input(l) => &self.layers[l].input_norm,
            Norm::PostAttention(l) => &self.layers[l].post_attention_norm,
        }
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
    pub(super) logit_rows: usize,
}

impl<T: DeviceElem> Backend for CudaBackend<T> {
    type Act = CudaSlice<T>;
    type Kv = CudaKv;
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
            logit_rows: b.logit_rows.len(),
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
            .rms_norm(x, self.norm_weight(norm), out, rows, self.eps)
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
            .add_rms_norm(residual, x, self.norm_weight(norm), out, rows, self.eps)
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
        kv: &mut CudaKv,
        out: &mut CudaSlice<T>,
    ) -> Result<(), EngineError> {
        let d = self.dims;
        let pages = T::pages(kv).ok_or_else(|| {
            EngineError::InvalidBatch("the KV cache's element type is not the model's".into())
        })?;
        let (cache_k, cache_v) = &mut pages[layer];
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
                rot_dim: d.head_dim,
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
        let scale = 1.0 / (d.head_dim as f32).sqrt();
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
                window: self.window,
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
                window: self.window,
            };
            if self.tensor_core_attention {
                self.kernels.flash_attention_prefill_tc(args)
            } else {
                self.kernels.flash_attention_prefill(args)
            }
        };
        result.map_err(device_error)
    }

    fn silu_mul(
        &self,
        gate_up: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
        rows: usize,
        width: usize,
    ) -> Result<(), EngineError> {
        self.kernels
            .silu_mul(gate_up, out, rows, width)
            .map_err(device_error)
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

    fn logits(
        &self,
        batch: &GpuBatch,
        residual: &CudaSlice<T>,
        proj: &CudaSlice<T>,
    ) -> Result<CudaSlice<T>, EngineError> {
        let rows = batch.logit_rows;
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
        let mut logits = self.zeros(rows * self.local_vocab)?;
        match &self.lm_head {
            Some(head) => self.multiply(head, &normed, &mut logits, rows)?,
            None => self
                .gemm
                .linear(
                    &normed,
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
}
