//! The paged KV cache: per layer, K and V pages of `[num_blocks, block_size, kv_heads, head_dim]`.

use tessera_kernels::cpu::attention::KvLayout;

/// K and V pages for every layer. Which blocks belong to which sequence is decided by the
/// caller (the router's block allocator); the cache only stores.
pub struct KvCache {
    pub(crate) layout: KvLayout,
    pub(crate) num_blocks: usize,
    pub(crate) layers: Vec<(Vec<f32>, Vec<f32>)>,
}

impl KvCache {
    /// Allocates `num_blocks` zeroed blocks for each of `num_layers` layers.
    pub fn new(num_layers: usize, num_blocks: usize, layout: KvLayout) -> Self {
        let len = num_blocks * layout.block_size * layout.slot_width();
        Self {
            layout,
            num_blocks,
            layers: (0..num_layers)
                .map(|_| (vec![0.0; len], vec![0.0; len]))
                .collect(),
        }
    }

    /// Bytes one block takes across all layers (K and V).
    pub fn block_bytes(num_layers: usize, layout: KvLayout) -> usize {
        2 * num_layers * layout.block_size * layout.slot_width() * std::mem::size_of::<f32>()
    }

    /// Number of blocks.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.layout.block_size
    }
}
