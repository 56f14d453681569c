//! Activations quantized to 8 bits per 32-value block, the other operand of the integer
//! dot products (llama.cpp's `Q8_1`: a scale `d = max|x| / 127` and `q = round(x / d)`).
//!
//! Every level quantizes with the same f32 operations (`max|x|`, `/ 127`, `1 / d`, `x · (1/d)`
//! rounded to nearest-even), so the quants are identical on every level and a row's quants
//! never depend on the other rows of the batch.

use super::packed::QK;

/// `m` rows of `k` values, quantized per block of 32.
#[derive(Debug, Default, Clone)]
pub struct QuantizedRows {
    pub(crate) m: usize,
    pub(crate) blocks: usize,
    /// `m × blocks × 32` quants.
    pub(crate) q: Vec<i8>,
    /// Scale per block.
    pub(crate) d: Vec<f32>,
    /// `d · Σ q` per block (the `m · Σ x` term of `Q4_1`).
    pub(crate) sd: Vec<f32>,
    /// `-128 · Σ q` per block (takes off what the unsigned `Q8_0` quants add).
    pub(crate) s128: Vec<i32>,
}

/// One block's input and outputs, as the zipped iterators of [`QuantizedRows::quantize`]
/// hand them out.
type BlockOut<'a> = (
    ((&'a [f32], &'a mut [i8]), &'a mut f32),
    (&'a mut f32, &'a mut i32),
);

/// Quantizes one block: writes `q`, returns `(d, Σ q)`.
pub(crate) type QuantizeBlockFn = fn(x: &[f32], q: &mut [i8]) -> (f32, i32);

/// The reference block quantizer.
pub(crate) fn quantize_block_ref(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    debug_assert!(x.len() == QK && q.len() == QK);
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (q, v) in q.iter_mut().zip(x) {
        let r = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
        *q = r;
        sum += i32::from(r);
    }
    (d, sum)
}

impl QuantizedRows {
    /// Quantizes `x` (`m × k`, `k` a multiple of 32) with `quantize`, reusing the buffers.
    pub(crate) fn quantize(&mut self, x: &[f32], m: usize, k: usize, quantize: QuantizeBlockFn) {
        assert!(k.is_multiple_of(QK), "int8 rows need whole blocks");
        assert_eq!(x.len(), m * k, "x must be m×k");
        let blocks = m * k / QK;
        self.m = m;
        self.blocks = k / QK;
        self.q.resize(blocks * QK, 0);
        self.d.resize(blocks, 0.0);
        self.sd.resize(blocks, 0.0);
        self.s128.resize(blocks, 0);
        let per = |(((xb, qb), d), (sd, s)): BlockOut<'_>| {
            let (scale, sum) = quantize(xb, qb);
            *d = scale;
            *sd = scale * sum as f32;
            *s = -128 * sum;
        };
        let it = x
            .chunks_exact(QK)
            .zip(self.q.chunks_exact_mut(QK))
            .zip(self.d.iter_mut())
            .zip(self.sd.iter_mut().zip(self.s128.iter_mut()));
        if blocks >= 2048 {
            use rayon::prelude::*;
            x.par_chunks_exact(QK)
                .zip(self.q.par_chunks_exact_mut(QK))
                .zip(self.d.par_iter_mut())
                .zip(self.sd.par_iter_mut().zip(self.s128.par_iter_mut()))
                .for_each(per);
        } else {
            it.for_each(per);
        }
    }

    /// Quants of block `b` of row `i`.
    pub(crate) fn block(&self, i: usize, b: usize) -> &[i8] {
        let j = i * self.blocks + b;
        &self.q[j * QK..(j + 1) * QK]
    }

    /// Index of block `b` of row `i` in the per-block vectors.
    pub(crate) fn at(&self, i: usize, b: usize) -> usize {
        i * self.blocks + b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_quantizes_like_llama_cpp() {
        let mut x = [0f32; QK];
        x[0] = 1.27;
        x[1] = -0.635;
        x[2] = 0.005;
        let mut q = [0i8; QK];
        let (d, s) = quantize_block_ref(&x, &mut q);
        assert_eq!(d, 1.27 / 127.0);
        assert_eq!((q[0], q[1], q[2], q[3]), (127, -64, 0, 0));
        assert_eq!(s, 127 - 64);
        let (d, s) = quantize_block_ref(&[0.0; QK], &mut q);
        assert_eq!((d, s), (0.0, 0));
        assert!(q.iter().all(|&v| v == 0));
    }
}
