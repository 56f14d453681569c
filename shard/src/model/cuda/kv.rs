//! The KV pages in GPU memory, the element types the backend runs in, and how much memory the
//! cache may take.

use std::sync::atomic::{AtomicU64, Ordering};

use half::bf16;
use tessera_kernels::cpu::WeightMatrix;
use tessera_kernels::cpu::attention::KvLayout;
use tessera_kernels::cuda::GemmElem;
use tessera_kernels::cuda::cudarc::driver::CudaSlice;

use super::*;
use crate::EngineError;
use crate::kv_cache::{KvDtype, PageStore};

/// An element type the backend runs in, and how its pages sit in a [`CudaKv`].
pub(crate) trait DeviceElem: GemmElem {
    /// The cache's element type this is.
    const DTYPE: KvDtype;
    /// `m`'s values when it stores them in this type already (uploaded as they are).
    fn stored(m: &WeightMatrix) -> Option<&[Self]>;
    fn wrap(pages: CudaPages<Self>) -> CudaKv;
}

impl DeviceElem for f32 {
    const DTYPE: KvDtype = KvDtype::Float32;
    fn stored(m: &WeightMatrix) -> Option<&[f32]> {
        m.as_f32()
    }
    fn wrap(pages: CudaPages<f32>) -> CudaKv {
        CudaKv::F32(pages)
    }
}

impl DeviceElem for bf16 {
    const DTYPE: KvDtype = KvDtype::Bfloat16;
    fn stored(m: &WeightMatrix) -> Option<&[bf16]> {
        m.as_bf16()
    }
    fn wrap(pages: CudaPages<bf16>) -> CudaKv {
        CudaKv::Bf16(pages)
    }
}

/// Every layer's K and V pages in GPU memory, `[num_blocks · block_size, kv_heads, head_dim]`
/// in `T`: a [`CudaBackend<T>`]'s pages. The id is one no other cache of this process has
/// (CUDA graphs hold the pages' addresses, so a graph is only ever replayed on the cache it
/// was captured with).
pub(crate) struct CudaPages<T> {
    pub(crate) id: u64,
    pub(crate) layers: Vec<(CudaSlice<T>, CudaSlice<T>)>,
}

impl<T> CudaPages<T> {
    fn new(layers: Vec<(CudaSlice<T>, CudaSlice<T>)>) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        CudaPages {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            layers,
        }
    }
}

impl<T: DeviceElem> PageStore for CudaPages<T> {
    fn dtype(&self) -> KvDtype {
        T::DTYPE
    }

    fn num_layers(&self) -> usize {
        self.layers.len()
    }
}

/// A cache's pages in GPU memory, in the element type of the model that made them.
pub(crate) enum CudaKv {
    F32(CudaPages<f32>),
    Bf16(CudaPages<bf16>),
}

impl PageStore for CudaKv {
    fn dtype(&self) -> KvDtype {
        match self {
            CudaKv::F32(p) => p.dtype(),
            CudaKv::Bf16(p) => p.dtype(),
        }
    }

    fn num_layers(&self) -> usize {
        match self {
            CudaKv::F32(p) => p.num_layers(),
            CudaKv::Bf16(p) => p.num_layers(),
        }
    }
}

impl<T: DeviceElem> CudaBackend<T> {
    pub(super) fn new_pages(
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
        Ok(T::wrap(CudaPages::new(pages)))
    }

    /// Device bytes one pass of `tokens` tokens allocates (activations, logits, the
    /// dequantization scratch), with a margin for cuBLASLt's workspace.
    pub(super) fn activation_bytes(&self, tokens: usize) -> u64 {
        let d = self.dims;
        let values = tokens
            * (3 * d.hidden
                + d.qkv_width()
                + d.heads * d.head_dim
                + 3 * d.intermediate
                + self.local_vocab);
        ((values + self.largest_quant) * std::mem::size_of::<T>()) as u64 * 5 / 4 + (256 << 20)
    }

    pub(super) fn kv_budget(&self, fraction: f32, max_tokens: usize) -> Result<u64, EngineError> {
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
}
