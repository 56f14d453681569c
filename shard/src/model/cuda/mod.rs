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

mod backend;
mod graph;
mod kv;
mod weights;

use half::bf16;
use tessera_kernels::cpu::attention::KvLayout;
use tessera_kernels::cuda::{CudaError, GpuDevice};

use super::backend::Backend;
use super::batch::FlatBatch;
use super::cpu::CpuBackend;
use super::forward::HostOutput;
use crate::EngineError;
use crate::kv_cache::{CachePages, KvCache, KvDtype};
pub(crate) use backend::{CudaBackend, GpuBatch};
pub(crate) use kv::{CudaKv, CudaPages, DeviceElem};

/// Where [`super::Model::into_cuda`] puts a model, and how it runs there.
#[derive(Debug, Clone, Copy)]
pub struct CudaOptions {
    /// CUDA device ordinal (after `CUDA_VISIBLE_DEVICES`); a shard uses its rank's.
    pub device: usize,
    /// Replay decode steps of common batch sizes as CUDA graphs (see `cuda::graph`).
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

pub(super) fn device_error(e: impl Into<CudaError>) -> EngineError {
    EngineError::Device(e.into().to_string())
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
            pages: CachePages::Cuda(kv),
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
        kv: &mut CudaKv,
    ) -> Result<HostOutput, EngineError> {
        if batch.tokens() == 0 {
            return Ok(HostOutput {
                logits: Vec::new(),
                hidden: Vec::new(),
            });
        }
        match (self, kv) {
            (CudaModel::F32(b), CudaKv::F32(pages)) => b.forward(layers, batch, pages),
            (CudaModel::Bf16(b), CudaKv::Bf16(pages)) => b.forward(layers, batch, pages),
            _ => Err(EngineError::InvalidBatch(
                "the KV cache's element type is not the model's".into(),
            )),
        }
    }

    /// This rank's vocabulary slice of the LM head over `rows` host hidden states, on the host.
    pub(crate) fn vocab_logits(
        &self,
        hidden: &[f32],
        rows: usize,
    ) -> Result<Vec<f32>, EngineError> {
        fn run<T: DeviceElem>(
            b: &CudaBackend<T>,
            hidden: &[f32],
            rows: usize,
        ) -> Result<Vec<f32>, EngineError> {
            let x = b.upload_values(hidden)?;
            let logits = b.lm_head(&x, rows)?;
            b.to_host(logits, rows * b.local_vocab())
        }
        match self {
            CudaModel::F32(b) => run(b, hidden, rows),
            CudaModel::Bf16(b) => run(b, hidden, rows),
        }
    }
}
