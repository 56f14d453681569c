//! The one trait every ggml block layout implements.

use crate::QuantFormat;

/// A `#[repr(C)]` ggml block: `BLOCK_ELEMENTS` values stored in `BLOCK_BYTES` bytes, and
/// ggml's scalar reference dequantizer for it. [`QuantFormat`]'s facts (values and bytes per
/// block, name, dequantization) are this trait's, looked up for the format's block type.
///
/// ```
/// use tessera_blocks::{BlockFormat, BlockQ8_0, QuantFormat};
/// assert_eq!(BlockQ8_0::FORMAT, QuantFormat::Q8_0);
/// assert_eq!((BlockQ8_0::BLOCK_ELEMENTS, BlockQ8_0::BLOCK_BYTES), (32, 34));
/// ```
pub trait BlockFormat: bytemuck::Pod + Send + Sync {
    /// The format whose blocks these are.
    const FORMAT: QuantFormat;
    /// The name ggml and GGUF use (`Q4_K`).
    const NAME: &'static str;
    /// Values per block.
    const BLOCK_ELEMENTS: usize;
    /// Bytes per block: the struct's size, which each format's file asserts equals ggml's.
    const BLOCK_BYTES: usize = size_of::<Self>();

    /// Writes the block's values into `out` (`out.len() == BLOCK_ELEMENTS`), as ggml's
    /// reference dequantizer does.
    fn dequantize_block(&self, out: &mut [f32]);

    /// Writes the values of `blocks` into `out` (`out.len() == blocks.len() *
    /// BLOCK_ELEMENTS`): ggml's `dequantize_row_*`.
    #[inline]
    fn dequantize_row(blocks: &[Self], out: &mut [f32]) {
        debug_assert_eq!(out.len(), blocks.len() * Self::BLOCK_ELEMENTS);
        for (block, y) in blocks
            .iter()
            .zip(out.chunks_exact_mut(Self::BLOCK_ELEMENTS))
        {
            block.dequantize_block(y);
        }
    }
}
