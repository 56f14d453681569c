//! `Q4_0`: 32 values per block, one f16 scale, 4-bit quants offset by 8.

use half::f16;

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

/// Scalar reference dequantizer, equal to ggml's `dequantize_row_q4_0`.
/// `out.len()` must be `blocks.len() * 32`.
pub fn dequantize_row_q4_0(blocks: &[BlockQ4_0], out: &mut [f32]) {
    debug_assert_eq!(out.len(), blocks.len() * QK4_0);
    for (block, y) in blocks.iter().zip(out.chunks_exact_mut(QK4_0)) {
        let d = block.d.to_f32();
        let (lo, hi) = y.split_at_mut(QK4_0 / 2);
        for (j, &q) in block.qs.iter().enumerate() {
            lo[j] = (i32::from(q & 0x0F) - 8) as f32 * d;
            hi[j] = (i32::from(q >> 4) - 8) as f32 * d;
        }
    }
}
