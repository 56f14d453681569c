//! `Q8_0`: 32 values per block, one f16 scale, signed 8-bit quants.

use half::f16;

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

/// Scalar reference dequantizer, equal to ggml's `dequantize_row_q8_0`.
/// `out.len()` must be `blocks.len() * 32`.
pub fn dequantize_row_q8_0(blocks: &[BlockQ8_0], out: &mut [f32]) {
    debug_assert_eq!(out.len(), blocks.len() * QK8_0);
    for (block, y) in blocks.iter().zip(out.chunks_exact_mut(QK8_0)) {
        let d = block.d.to_f32();
        for (y, &q) in y.iter_mut().zip(block.qs.iter()) {
            *y = f32::from(q) * d;
        }
    }
}
