//! `Q4_1`: 32 values per block, an f16 scale and an f16 minimum, unsigned 4-bit quants.

use half::f16;

use crate::{BlockFormat, QuantFormat};

/// Values per [`BlockQ4_1`].
pub const QK4_1: usize = 32;

/// One `Q4_1` block as ggml stores it (`block_q4_1`).
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: f16,
    /// Minimum; value = `q * d + m`.
    pub m: f16,
    /// Nibbles: the low nibble of byte `j` is value `j`, the high nibble value `j + 16`.
    pub qs: [u8; QK4_1 / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

impl BlockFormat for BlockQ4_1 {
    const FORMAT: QuantFormat = QuantFormat::Q4_1;
    const NAME: &'static str = "Q4_1";
    const BLOCK_ELEMENTS: usize = QK4_1;

    /// ggml's `dequantize_row_q4_1` for one block.
    #[inline]
    fn dequantize_block(&self, out: &mut [f32]) {
        debug_assert_eq!(out.len(), Self::BLOCK_ELEMENTS);
        let d = self.d.to_f32();
        let m = self.m.to_f32();
        let (lo, hi) = out.split_at_mut(QK4_1 / 2);
        for (j, &q) in self.qs.iter().enumerate() {
            lo[j] = f32::from(q & 0x0F) * d + m;
            hi[j] = f32::from(q >> 4) * d + m;
        }
    }
}

/// Scalar reference dequantizer, equal to ggml's `dequantize_row_q4_1`.
/// `out.len()` must be `blocks.len() * 32`.
pub fn dequantize_row_q4_1(blocks: &[BlockQ4_1], out: &mut [f32]) {
    BlockQ4_1::dequantize_row(blocks, out)
}
