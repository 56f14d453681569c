//! `Q4_0`: 32 values per block, one f16 scale, 4-bit quants offset by 8.

use half::f16;

use crate::{BlockFormat, QuantFormat};

/// Values per [`BlockQ4_0`].
pub const QK4_0: usize = 32;

/// One `Q4_0` block as ggml stores it (`block_q4_0`).
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: f16,
    /// Nibbles: the low nibble of byte `j` is value `j`, the high nibble value `j + 16`.
    pub qs: [u8; QK4_0 / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

impl BlockFormat for BlockQ4_0 {
    const FORMAT: QuantFormat = QuantFormat::Q4_0;
    const NAME: &'static str = "Q4_0";
    const BLOCK_ELEMENTS: usize = QK4_0;

    /// ggml's `dequantize_row_q4_0` for one block.
    #[inline]
    fn dequantize_block(&self, out: &mut [f32]) {
        debug_assert_eq!(out.len(), Self::BLOCK_ELEMENTS);
        let d = self.d.to_f32();
        let (lo, hi) = out.split_at_mut(QK4_0 / 2);
        for (j, &q) in self.qs.iter().enumerate() {
            lo[j] = (i32::from(q & 0x0F) - 8) as f32 * d;
            hi[j] = (i32::from(q >> 4) - 8) as f32 * d;
        }
    }
}

/// Scalar reference dequantizer, equal to ggml's `dequantize_row_q4_0`.
/// `out.len()` must be `blocks.len() * 32`.
pub fn dequantize_row_q4_0(blocks: &[BlockQ4_0], out: &mut [f32]) {
    BlockQ4_0::dequantize_row(blocks, out)
}
