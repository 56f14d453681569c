//! The paged KV cache: per layer, K and V pages of `num_blocks × block_size` slots (laid out as
//! `tessera_kernels::cpu::attention` describes), in f32 or bf16.

use half::bf16;
use tessera_kernels::cpu::attention::KvLayout;
use tessera_model_files::{DType, ModelFiles};

/// Element type of the KV cache. Activations stay f32 either way; bf16 halves the cache's
/// memory (keys and values are rounded to nearest-even when written).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDtype {
    /// 32-bit float: exactly the values the model computed.
    #[default]
    Float32,
    /// bfloat16.
    Bfloat16,
}

impl KvDtype {
    /// Parses `float32` or `bfloat16` (`auto` is resolved by [`KvDtype::auto`]).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "float32" => Some(Self::Float32),
            "bfloat16" => Some(Self::Bfloat16),
            _ => None,
        }
    }

    /// The name `--dtype` spells.
    pub fn name(self) -> &'static str {
        match self {
            Self::Float32 => "float32",
            Self::Bfloat16 => "bfloat16",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::Float32 => std::mem::size_of::<f32>(),
            Self::Bfloat16 => std::mem::size_of::<bf16>(),
        }
    }

    /// The default for a model: bf16 when its weights are bf16 or GGUF-quantized (they already
    /// carry less precision than the cache would lose), f32 for f32/f16 weights.
    pub fn auto(files: &ModelFiles) -> Self {
        match files.config.dtype {
            Some(DType::BF16) => Self::Bfloat16,
            None if files.is_gguf() => Self::Bfloat16,
            _ => Self::Float32,
        }
    }
}

/// What a cache needs to know of a backend's pages.
pub(crate) trait PageStore {
    /// Element type.
    fn dtype(&self) -> KvDtype;
    /// Number of layers.
    fn num_layers(&self) -> usize;
}

/// Every layer's K and V pages in host memory, in one element type: the CPU backend's pages.
pub(crate) enum HostPages {
    F32(Vec<(Vec<f32>, Vec<f32>)>),
    Bf16(Vec<(Vec<bf16>, Vec<bf16>)>),
}

impl HostPages {
    /// `num_layers` layers of zeroed K and V pages of `len` elements each, every page resident.
    fn zeroed(num_layers: usize, len: usize, dtype: KvDtype) -> Self {
        match dtype {
            KvDtype::Float32 => HostPages::F32(
                (0..num_layers)
                    .map(|_| (resident_zeros(len, 0.0), resident_zeros(len, 0.0)))
                    .collect(),
            ),
            KvDtype::Bfloat16 => HostPages::Bf16(
                (0..num_layers)
                    .map(|_| {
                        (
                            resident_zeros(len, bf16::ZERO),
                            resident_zeros(len, bf16::ZERO),
                        )
                    })
                    .collect(),
            ),
        }
    }
}

/// `len` zeros whose memory pages are all faulted in. The pool is the server's memory
/// reservation: taken whole at start-up, a machine without that memory fails then rather than
/// hours into serving, and the process's RSS says what it holds instead of creeping up as
/// blocks are first used.
fn resident_zeros<T: Copy>(len: usize, zero: T) -> Vec<T> {
    let mut v = vec![zero; len];
    // A zeroed allocation may be fresh anonymous memory, which the kernel maps on first write.
    // Hidden from the optimiser, the vector's contents are unknown, so the writes of one
    // element per page stay and fault every page in.
    let per_page = (4096 / std::mem::size_of::<T>().max(1)).max(1);
    let pages = std::hint::black_box(&mut v);
    for i in (0..len).step_by(per_page) {
        pages[i] = zero;
    }
    v
}

impl PageStore for HostPages {
    fn dtype(&self) -> KvDtype {
        match self {
            HostPages::F32(_) => KvDtype::Float32,
            HostPages::Bf16(_) => KvDtype::Bfloat16,
        }
    }

    fn num_layers(&self) -> usize {
        match self {
            HostPages::F32(l) => l.len(),
            HostPages::Bf16(l) => l.len(),
        }
    }
}

/// A cache's pages, in the memory of the backend that made them: a pass hands each backend
/// only its own kind (see `Model::forward`).
pub(crate) enum CachePages {
    /// In host memory (`crate::model::cpu`).
    Host(HostPages),
    /// In GPU memory (`crate::model::cuda`).
    #[cfg(feature = "cuda")]
    Cuda(crate::model::CudaKv),
}

impl CachePages {
    fn store(&self) -> &dyn PageStore {
        match self {
            CachePages::Host(p) => p,
            #[cfg(feature = "cuda")]
            CachePages::Cuda(p) => p,
        }
    }
}

/// K and V pages for every layer. Which blocks belong to which sequence is decided by the
/// caller (the router's block allocator); the cache only stores.
pub struct KvCache {
    pub(crate) layout: KvLayout,
    pub(crate) num_blocks: usize,
    pub(crate) pages: CachePages,
}

impl KvCache {
    /// Allocates `num_blocks` zeroed f32 blocks for each of `num_layers` layers.
    pub fn new(num_layers: usize, num_blocks: usize, layout: KvLayout) -> Self {
        Self::with_dtype(num_layers, num_blocks, layout, KvDtype::Float32)
    }

    /// Allocates `num_blocks` zeroed blocks of `dtype` in host memory for each of
    /// `num_layers` layers.
    pub fn with_dtype(
        num_layers: usize,
        num_blocks: usize,
        layout: KvLayout,
        dtype: KvDtype,
    ) -> Self {
        let len = num_blocks * layout.block_size * layout.slot_width();
        Self {
            layout,
            num_blocks,
            pages: CachePages::Host(HostPages::zeroed(num_layers, len, dtype)),
        }
    }

    /// Bytes one block takes across all layers (K and V).
    pub fn block_bytes(num_layers: usize, layout: KvLayout, dtype: KvDtype) -> usize {
        2 * num_layers * layout.block_size * layout.slot_width() * dtype.size()
    }

    /// Element type.
    pub fn dtype(&self) -> KvDtype {
        self.pages.store().dtype()
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.pages.store().num_layers()
    }

    /// Number of blocks.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.layout.block_size
    }

    /// Copies every layer's K and V of slot `from` into slot `to`, for each `(from, to)` in
    /// order: how the accepted path of a token tree moves to the positions it stands at.
    pub(crate) fn copy_slots(
        &mut self,
        moves: &[(usize, usize)],
    ) -> Result<(), crate::EngineError> {
        let slots = self.num_blocks * self.layout.block_size;
        if let Some(&(a, b)) = moves.iter().find(|&&(a, b)| a >= slots || b >= slots) {
            return Err(crate::EngineError::InvalidBatch(format!(
                "cannot copy slot {a} to {b}: the cache has {slots}"
            )));
        }
        match &mut self.pages {
            CachePages::Host(HostPages::F32(layers)) => copy_host_slots(self.layout, layers, moves),
            CachePages::Host(HostPages::Bf16(layers)) => {
                copy_host_slots(self.layout, layers, moves)
            }
            #[cfg(feature = "cuda")]
            CachePages::Cuda(_) => {
                return Err(crate::EngineError::Device(
                    "token trees are verified on the CPU backend only".into(),
                ));
            }
        }
        Ok(())
    }
}

/// [`KvCache::copy_slots`] over host pages (keys transposed within their block).
fn copy_host_slots<T: Copy>(
    layout: KvLayout,
    layers: &mut [(Vec<T>, Vec<T>)],
    moves: &[(usize, usize)],
) {
    let (w, hd, bs) = (layout.slot_width(), layout.head_dim, layout.block_size);
    for (k, v) in layers.iter_mut() {
        for &(from, to) in moves {
            v.copy_within(from * w..(from + 1) * w, to * w);
            for h in 0..layout.kv_heads {
                let (a, b) = (layout.key_at(from, h), layout.key_at(to, h));
                for d in 0..hd {
                    k[b + d * bs] = k[a + d * bs];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_pages_are_resident_from_the_start() {
        let layout = KvLayout {
            block_size: 16,
            kv_heads: 4,
            head_dim: 64,
        };
        // 4 MiB per page vector: large enough to be fresh anonymous memory.
        let c = KvCache::new(1, 1024, layout);
        let CachePages::Host(HostPages::F32(layers)) = &c.pages else {
            panic!("host f32 pages expected");
        };
        for v in [&layers[0].0, &layers[0].1] {
            let (resident, whole) = resident_pages(v);
            assert!(whole > 1000);
            assert_eq!(resident, whole);
        }
    }

    /// How many of the whole 4 KiB pages inside `v` are in memory (by `mincore`), of how many.
    #[allow(unsafe_code)]
    fn resident_pages(v: &[f32]) -> (usize, usize) {
        let start = v.as_ptr() as usize;
        let first = start.div_ceil(4096) * 4096;
        let end = (start + v.len() * 4) / 4096 * 4096;
        let mut map = vec![0u8; (end - first) / 4096];
        // SAFETY: the range lies inside `v`'s allocation and `map` has one byte per page.
        let rc =
            unsafe { libc::mincore(first as *mut libc::c_void, end - first, map.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore failed");
        (map.iter().filter(|b| *b & 1 == 1).count(), map.len())
    }

    #[test]
    fn block_bytes_follow_the_element_size() {
        let layout = KvLayout {
            block_size: 16,
            kv_heads: 3,
            head_dim: 64,
        };
        let f32_bytes = KvCache::block_bytes(30, layout, KvDtype::Float32);
        assert_eq!(f32_bytes, 2 * 30 * 16 * 3 * 64 * 4);
        assert_eq!(
            KvCache::block_bytes(30, layout, KvDtype::Bfloat16) * 2,
            f32_bytes
        );
        let c = KvCache::with_dtype(2, 5, layout, KvDtype::Bfloat16);
        assert_eq!(
            (c.dtype(), c.num_layers(), c.num_blocks()),
            (KvDtype::Bfloat16, 2, 5)
        );
    }

    #[test]
    fn copied_slots_hold_the_source_keys_and_values() {
        let layout = KvLayout {
            block_size: 4,
            kv_heads: 2,
            head_dim: 3,
        };
        let mut c = KvCache::new(2, 3, layout);
        let CachePages::Host(HostPages::F32(layers)) = &mut c.pages else {
            unreachable!("a host cache")
        };
        for (l, (k, v)) in layers.iter_mut().enumerate() {
            for (i, x) in k.iter_mut().enumerate() {
                *x = (l * 1000 + i) as f32;
            }
            for (i, x) in v.iter_mut().enumerate() {
                *x = -((l * 1000 + i) as f32);
            }
        }
        let before = match &c.pages {
            CachePages::Host(HostPages::F32(layers)) => layers.clone(),
            _ => unreachable!("a host cache"),
        };
        c.copy_slots(&[(9, 5), (2, 3)]).unwrap();
        let CachePages::Host(HostPages::F32(after)) = &c.pages else {
            unreachable!("a host cache")
        };
        for (l, (k, v)) in after.iter().enumerate() {
            let (k0, v0) = &before[l];
            for (from, to) in [(9, 5), (2, 3)] {
                for h in 0..2 {
                    for d in 0..3 {
                        let (a, b) = (layout.key_at(from, h) + d * 4, layout.key_at(to, h) + d * 4);
                        assert_eq!(k[b], k0[a]);
                    }
                }
                assert_eq!(v[to * 6..to * 6 + 6], v0[from * 6..from * 6 + 6]);
            }
            // Untouched slots keep their values.
            assert_eq!(v[0..6], v0[0..6]);
        }
        assert!(c.copy_slots(&[(12, 0)]).is_err());
    }

    #[test]
    fn names_round_trip() {
        for d in [KvDtype::Float32, KvDtype::Bfloat16] {
            assert_eq!(KvDtype::from_name(d.name()), Some(d));
        }
        assert_eq!(KvDtype::from_name("float16"), None);
    }
}
