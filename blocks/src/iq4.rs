//! `IQ4_NL` and `IQ4_XS`: 4-bit indices into one fixed table of 16 non-uniform values
//! ([`KVALUES_IQ4NL`]), scaled per 32 values. `IQ4_NL` has 32-value blocks with an f16
//! scale; `IQ4_XS` has 256-value super-blocks whose eight sub-blocks carry 6-bit scales
//! (and is llama.cpp's `IQ4_XS` file type; `IQ4_NL` its fallback for rows that are not a
//! multiple of 256).

use half::f16;

use crate::q4_k::QK_K;
use crate::{BlockFormat, QuantFormat};

/// Values per [`BlockIQ4NL`].
pub const QK4_NL: usize = 32;

/// The values a 4-bit index stands for (ggml's `kvalues_iq4nl`).
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// One `IQ4_NL` block as ggml stores it (`block_iq4_nl`).
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIQ4NL {
    /// Scale.
    pub d: f16,
    /// Indices: the low nibble of byte `j` is value `j`, the high nibble value `j + 16`.
    pub qs: [u8; QK4_NL / 2],
}

const _: () = assert!(std::mem::size_of::<BlockIQ4NL>() == 18);

/// One `IQ4_XS` super-block as ggml stores it (`block_iq4_xs`).
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIQ4XS {
    /// Super-block scale.
    pub d: f16,
    /// Bits 4-5 of sub-block `j`'s scale at bits `2 j`.
    pub scales_h: u16,
    /// Bits 0-3 of sub-block `j`'s scale in nibble `j % 2` of byte `j / 2`.
    pub scales_l: [u8; QK_K / 64],
    /// Indices, 16 bytes per 32-value sub-block laid out as an `IQ4_NL` block's.
    pub qs: [u8; QK_K / 2],
}

const _: () = assert!(std::mem::size_of::<BlockIQ4XS>() == 136);

impl BlockIQ4XS {
    /// Sub-block `j`'s scale `d · (ls - 32)` (exact in f32: 11 × 6 bits).
    pub fn sub_scale(&self, j: usize) -> f32 {
        let low = (self.scales_l[j / 2] >> (4 * (j % 2))) & 0x0F;
        let high = ((self.scales_h >> (2 * j)) & 3) as u8;
        self.d.to_f32() * (i32::from(low | high << 4) - 32) as f32
    }
}

/// Nibble `e` (0..32) of a 32-value stretch `qs` laid out as ggml's 32-value blocks: the low
/// nibble of byte `j` is value `j`, the high nibble value `j + 16`.
pub fn index4(qs: &[u8], e: usize) -> u8 {
    if e < 16 {
        qs[e] & 0x0F
    } else {
        qs[e - 16] >> 4
    }
}

impl BlockFormat for BlockIQ4NL {
    const FORMAT: QuantFormat = QuantFormat::IQ4NL;
    const NAME: &'static str = "IQ4_NL";
    const BLOCK_ELEMENTS: usize = QK4_NL;

    /// ggml's `dequantize_row_iq4_nl` for one block.
    #[inline]
    fn dequantize_block(&self, out: &mut [f32]) {
        debug_assert_eq!(out.len(), Self::BLOCK_ELEMENTS);
        let d = self.d.to_f32();
        for (e, v) in out.iter_mut().enumerate() {
            *v = d * f32::from(KVALUES_IQ4NL[usize::from(index4(&self.qs, e))]);
        }
    }
}

/// Scalar reference dequantizer, equal to ggml's `dequantize_row_iq4_nl`.
/// `out.len()` must be `blocks.len() * 32`.
pub fn dequantize_row_iq4_nl(blocks: &[BlockIQ4NL], out: &mut [f32]) {
    BlockIQ4NL::dequantize_row(blocks, out)
}

impl BlockFormat for BlockIQ4XS {
    const FORMAT: QuantFormat = QuantFormat::IQ4XS;
    const NAME: &'static str = "IQ4_XS";
    const BLOCK_ELEMENTS: usize = QK_K;

    /// ggml's `dequantize_row_iq4_xs` for one block.
    #[inline]
    fn dequantize_block(&self, out: &mut [f32]) {
        debug_assert_eq!(out.len(), Self::BLOCK_ELEMENTS);
        for (j, (y, qs)) in out
            .chunks_exact_mut(32)
            .zip(self.qs.chunks_exact(16))
            .enumerate()
        {
            let dl = self.sub_scale(j);
            for (e, v) in y.iter_mut().enumerate() {
                *v = dl * f32::from(KVALUES_IQ4NL[usize::from(index4(qs, e))]);
            }
        }
    }
}

/// Scalar reference dequantizer, equal to ggml's `dequantize_row_iq4_xs`.
/// `out.len()` must be `blocks.len() * 256`.
pub fn dequantize_row_iq4_xs(blocks: &[BlockIQ4XS], out: &mut [f32]) {
    BlockIQ4XS::dequantize_row(blocks, out)
}
