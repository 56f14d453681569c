//! Weight rows as f32: each level's dequantizers, one per stored format, and the row ranges
//! they convert.

use half::{bf16, f16};
use rayon::prelude::*;

use super::{Data, WeightMatrix};
use crate::quant::{
    BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K,
    BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0, dequantize_row_iq4_nl,
    dequantize_row_iq4_xs, dequantize_row_mxfp4, dequantize_row_q2_k, dequantize_row_q3_k,
    dequantize_row_q4_0, dequantize_row_q4_1, dequantize_row_q4_k, dequantize_row_q5_0,
    dequantize_row_q5_1, dequantize_row_q5_k, dequantize_row_q6_k, dequantize_row_q8_0,
};

/// Dequantizers of one level, one per stored format. Each writes exactly the values of the
/// portable `quant::dequantize_row_*` (bit for bit).
pub(crate) struct Dequant {
    /// `out.len() == blocks.len() * 32`.
    pub(crate) q8_0: fn(&[BlockQ8_0], &mut [f32]),
    /// `out.len() == blocks.len() * 32`.
    pub(crate) q4_1: fn(&[BlockQ4_1], &mut [f32]),
    /// `out.len() == src.len()`.
    pub(crate) bf16: fn(&[bf16], &mut [f32]),
    /// `out.len() == src.len()`.
    pub(crate) f16: fn(&[f16], &mut [f32]),
    /// `out.len() == blocks.len() * 32`.
    pub(crate) q4_0: fn(&[BlockQ4_0], &mut [f32]),
    /// `out.len() == blocks.len() * 32`.
    pub(crate) q5_0: fn(&[BlockQ5_0], &mut [f32]),
    /// `out.len() == blocks.len() * 32`.
    pub(crate) q5_1: fn(&[BlockQ5_1], &mut [f32]),
    /// `out.len() == blocks.len() * 256`.
    pub(crate) q4_k: fn(&[BlockQ4K], &mut [f32]),
    /// `out.len() == blocks.len() * 256`.
    pub(crate) q5_k: fn(&[BlockQ5K], &mut [f32]),
    /// `out.len() == blocks.len() * 256`.
    pub(crate) q6_k: fn(&[BlockQ6K], &mut [f32]),
    /// `out.len() == blocks.len() * 256`.
    pub(crate) q2_k: fn(&[BlockQ2K], &mut [f32]),
    /// `out.len() == blocks.len() * 256`.
    pub(crate) q3_k: fn(&[BlockQ3K], &mut [f32]),
    /// `out.len() == blocks.len() * 32`.
    pub(crate) iq4_nl: fn(&[BlockIQ4NL], &mut [f32]),
    /// `out.len() == blocks.len() * 256`.
    pub(crate) iq4_xs: fn(&[BlockIQ4XS], &mut [f32]),
    /// `out.len() == blocks.len() * 32`.
    pub(crate) mxfp4: fn(&[BlockMXFP4], &mut [f32]),
}

/// bfloat16 to f32, the portable level's (and the reference).
pub(crate) fn bf16_to_f32_ref(src: &[bf16], out: &mut [f32]) {
    for (o, v) in out.iter_mut().zip(src) {
        *o = v.to_f32();
    }
}

/// f16 to f32, the portable level's (and the reference).
pub(crate) fn f16_to_f32_ref(src: &[f16], out: &mut [f32]) {
    for (o, v) in out.iter_mut().zip(src) {
        *o = v.to_f32();
    }
}

/// The portable level's dequantizers: the scalar references.
pub(crate) const PORTABLE_DEQUANT: Dequant = Dequant {
    q8_0: dequantize_row_q8_0,
    q4_1: dequantize_row_q4_1,
    bf16: bf16_to_f32_ref,
    f16: f16_to_f32_ref,
    q4_0: dequantize_row_q4_0,
    q5_0: dequantize_row_q5_0,
    q5_1: dequantize_row_q5_1,
    q4_k: dequantize_row_q4_k,
    q5_k: dequantize_row_q5_k,
    q6_k: dequantize_row_q6_k,
    q2_k: dequantize_row_q2_k,
    q3_k: dequantize_row_q3_k,
    iq4_nl: dequantize_row_iq4_nl,
    iq4_xs: dequantize_row_iq4_xs,
    mxfp4: dequantize_row_mxfp4,
};

impl WeightMatrix {
    /// Writes rows `start..start + out.len() / cols` as f32 with `dequant`. Rows are whole
    /// blocks (checked by [`Self::from_bytes`]), so any row range is a block range.
    pub(super) fn rows_f32_with(&self, dequant: &Dequant, start: usize, out: &mut [f32]) {
        let (cols, n) = (self.cols, out.len() / self.cols);
        assert!(start + n <= self.rows && out.len() == n * cols);
        if let Data::Stack(parts) = &self.data {
            // Each part's rows that fall in start..start + n.
            let mut first = 0;
            for p in parts {
                let (lo, hi) = (start.max(first), (start + n).min(first + p.rows));
                if lo < hi {
                    let dst = &mut out[(lo - start) * cols..(hi - start) * cols];
                    p.rows_f32_with(dequant, lo - first, dst);
                }
                first += p.rows;
            }
            return;
        }
        let per = self.format().block_elements();
        let (b0, b1) = (start * cols / per, (start + n) * cols / per);
        match &self.data {
            Data::F32(v) => out.copy_from_slice(&v[b0..b1]),
            Data::Bf16(v) => (dequant.bf16)(&v[b0..b1], out),
            Data::F16(v) => (dequant.f16)(&v[b0..b1], out),
            Data::Q8_0(v) => (dequant.q8_0)(&v[b0..b1], out),
            Data::Q4_0(v) => (dequant.q4_0)(&v[b0..b1], out),
            Data::Q4_1(v) => (dequant.q4_1)(&v[b0..b1], out),
            Data::Q5_0(v) => (dequant.q5_0)(&v[b0..b1], out),
            Data::Q5_1(v) => (dequant.q5_1)(&v[b0..b1], out),
            Data::Packed(p) => {
                for (r, row) in out.chunks_exact_mut(cols).enumerate() {
                    p.row_f32(start + r, row);
                }
            }
            Data::Q4K(v) => (dequant.q4_k)(&v[b0..b1], out),
            Data::Q5K(v) => (dequant.q5_k)(&v[b0..b1], out),
            Data::Q6K(v) => (dequant.q6_k)(&v[b0..b1], out),
            Data::Q2K(v) => (dequant.q2_k)(&v[b0..b1], out),
            Data::Q3K(v) => (dequant.q3_k)(&v[b0..b1], out),
            Data::IQ4NL(v) => (dequant.iq4_nl)(&v[b0..b1], out),
            Data::IQ4XS(v) => (dequant.iq4_xs)(&v[b0..b1], out),
            Data::MXFP4(v) => (dequant.mxfp4)(&v[b0..b1], out),
            Data::Stack(_) => unreachable!("stacks are handled above"),
        }
    }

    /// Row `r` as f32 (`out.len() == cols`), e.g. an embedding lookup. Exact, so the same
    /// on every level.
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows, "row {r} of a {}-row matrix", self.rows);
        assert_eq!(out.len(), self.cols, "a row has cols values");
        self.rows_f32_with(&PORTABLE_DEQUANT, r, out);
    }

    /// The whole matrix as f32 (exact), converted on rayon's threads in groups of rows.
    pub fn to_f32(&self) -> Vec<f32> {
        const ROWS: usize = 64;
        let mut out = vec![0f32; self.rows * self.cols];
        if self.rows > 0 && self.cols > 0 {
            out.par_chunks_mut(ROWS * self.cols)
                .enumerate()
                .for_each(|(i, rows)| self.rows_f32_with(&PORTABLE_DEQUANT, i * ROWS, rows));
        }
        out
    }
}
