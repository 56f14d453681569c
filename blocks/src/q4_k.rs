//! `Q4_K`: 256-value super-blocks of eight 32-value sub-blocks, each with a 6-bit scale and
//! a 6-bit minimum, unsigned 4-bit quants.

use half::f16;

use crate::{BlockFormat, QuantFormat};

/// Values per K-quant super-block.
pub const QK_K: usize = 256;

/// Bytes of packed 6-bit scales and minimums in `Q4_K` and `Q5_K` blocks.
pub const K_SCALE_SIZE: usize = 12;

/// One `Q4_K` block as ggml stores it (`block_q4_K`).
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4K {
    /// Super-block scale for the sub-block scales.
    pub d: f16,
    /// Super-block scale for the sub-block minimums.
    pub dmin: f16,
    /// Eight 6-bit scales and eight 6-bit minimums, packed (see [`get_scale_min_k4`]).
    pub scales: [u8; K_SCALE_SIZE],
    /// Nibbles: 64 values per 32 bytes, low nibbles first.
    pub qs: [u8; QK_K / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

/// Unpacks sub-block `j`'s 6-bit (scale, minimum) pair, as ggml's `get_scale_min_k4`.
#[inline]
pub fn get_scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// All eight (scale, minimum) pairs at once: bytes `0..8` are the scales, `8..16` the
/// minimums, equal to [`get_scale_min_k4`] for `j` in `0..8`. The SIMD dequantizers widen
/// these 16 bytes in one go; ggml's x86 kernels unpack them with the same 32-bit masks.
#[inline]
pub fn scales_mins_k4(q: &[u8; K_SCALE_SIZE]) -> [u8; 16] {
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let scales_lo = w0 & LOW6;
    let scales_hi = (w2 & LOW4) | (((w0 >> 6) & LOW2) << 4);
    let mins_lo = w1 & LOW6;
    let mins_hi = ((w2 >> 4) & LOW4) | (((w1 >> 6) & LOW2) << 4);
    let mut out = [0u8; 16];
    for (i, w) in [scales_lo, scales_hi, mins_lo, mins_hi]
        .into_iter()
        .enumerate()
    {
        out[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
    }
    out
}

impl BlockFormat for BlockQ4K {
    const FORMAT: QuantFormat = QuantFormat::Q4K;
    const NAME: &'static str = "Q4_K";
    const BLOCK_ELEMENTS: usize = QK_K;

    /// ggml's `dequantize_row_q4_K` for one block.
    #[inline]
    fn dequantize_block(&self, out: &mut [f32]) {
        debug_assert_eq!(out.len(), Self::BLOCK_ELEMENTS);
        let d = self.d.to_f32();
        let min = self.dmin.to_f32();
        // Four groups of 64 values; each uses 32 bytes of `qs` and two sub-block scales.
        for (g, (q, y)) in self
            .qs
            .chunks_exact(32)
            .zip(out.chunks_exact_mut(64))
            .enumerate()
        {
            let (sc, m) = get_scale_min_k4(2 * g, &self.scales);
            let (d1, m1) = (d * f32::from(sc), min * f32::from(m));
            let (sc, m) = get_scale_min_k4(2 * g + 1, &self.scales);
            let (d2, m2) = (d * f32::from(sc), min * f32::from(m));
            let (lo, hi) = y.split_at_mut(32);
            for l in 0..32 {
                lo[l] = d1 * f32::from(q[l] & 0x0F) - m1;
                hi[l] = d2 * f32::from(q[l] >> 4) - m2;
            }
        }
    }
}

/// Scalar reference dequantizer, equal to ggml's `dequantize_row_q4_K`.
/// `out.len()` must be `blocks.len() * 256`.
pub fn dequantize_row_q4_k(blocks: &[BlockQ4K], out: &mut [f32]) {
    BlockQ4K::dequantize_row(blocks, out)
}
