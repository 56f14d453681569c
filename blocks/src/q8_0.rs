//! `Q8_0`: 32 values per block, one f16 scale, signed 8-bit quants.

use half::f16;

use crate::{BlockFormat, QuantFormat};

/// Values per [`BlockQ8_0`].
pub const QK8_0: usize = 32;

/// One `Q8_0` block as ggml stores it (`block_q8_0`).
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Quants; value = `qs[i] * d`.
    pub qs: [i8; QK8_0],
}

const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

impl BlockFormat for BlockQ8_0 {
    const FORMAT: QuantFormat = QuantFormat::Q8_0;
    const NAME: &'static str = "Q8_0";
    const BLOCK_ELEMENTS: usize = QK8_0;

    /// ggml's `dequantize_row_q8_0` for one block.
    #[inline]
    fn dequantize_block(&self, out: &mut [f32]) {
        debug_assert_eq!(out.len(), Self::BLOCK_ELEMENTS);
        let d = self.d.to_f32();
        for (y, &q) in out.iter_mut().zip(self.qs.iter()) {
            *y = f32::from(q) * d;
        }
    }
}

/// Scalar reference dequantizer, equal to ggml's `dequantize_row_q8_0`.
/// `out.len()` must be `blocks.len() * 32`.
pub fn dequantize_row_q8_0(blocks: &[BlockQ8_0], out: &mut [f32]) {
    BlockQ8_0::dequantize_row(blocks, out)
}
