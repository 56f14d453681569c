//! RMSNorm, alone and fused with the residual add that precedes it in a decoder layer.

use rayon::prelude::*;

/// `out[t] = x[t] / sqrt(mean(x[t]²) + eps) * weight` for each row `t` of width `weight.len()`.
///
/// Rounding follows transformers' `LlamaRMSNorm`: normalise first, then scale.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    assert_eq!(x.len(), out.len());
    assert_eq!(x.len() % d, 0);
    if x.len() < PARALLEL_MIN {
        for (o, xr) in out.chunks_mut(d).zip(x.chunks(d)) {
            norm_row(xr, weight, eps, o);
        }
        return;
    }
    out.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .for_each(|(o, xr)| norm_row(xr, weight, eps, o));
}

/// Below this many values a norm stays on the calling thread: a batched decode step's rows
/// are done sooner than another thread could take half of them.
const PARALLEL_MIN: usize = 1 << 16;

/// Fused `residual += x; out = rms_norm(residual)`: one pass over the rows instead of two.
pub fn add_rms_norm(residual: &mut [f32], x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    assert_eq!(x.len(), residual.len());
    assert_eq!(x.len(), out.len());
    let row = |((o, r), xr): ((&mut [f32], &mut [f32]), &[f32])| {
        for (ri, xi) in r.iter_mut().zip(xr) {
            *ri += xi;
        }
        norm_row(r, weight, eps, o);
    };
    if x.len() < PARALLEL_MIN {
        out.chunks_mut(d)
            .zip(residual.chunks_mut(d))
            .zip(x.chunks(d))
            .for_each(row);
        return;
    }
    out.par_chunks_mut(d)
        .zip(residual.par_chunks_mut(d))
        .zip(x.par_chunks(d))
        .for_each(row);
}

/// RMSNorm in place of every head of every row: `x` is rows of `row_stride` values whose
/// `heads` heads of `weight.len()` start at `offset` (q or k inside a fused qkv buffer), each
/// head normalised on its own (Qwen3's and Gemma 3's q/k norms).
pub fn rms_norm_heads(
    x: &mut [f32],
    row_stride: usize,
    offset: usize,
    heads: usize,
    weight: &[f32],
    eps: f32,
) {
    let d = weight.len();
    let mut head = vec![0f32; d];
    for row in x.chunks_exact_mut(row_stride) {
        for h in row[offset..offset + heads * d].chunks_exact_mut(d) {
            head.copy_from_slice(h);
            norm_row(&head, weight, eps, h);
        }
    }
}

#[inline]
fn norm_row(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let sum_sq = super::matmul::dot(x, x);
    let inv = 1.0 / (sum_sq / x.len() as f32 + eps).sqrt();
    for ((o, xi), w) in out.iter_mut().zip(x).zip(weight) {
        *o = w * (xi * inv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_the_same_on_one_thread_and_many() {
        let d = 576;
        let rows = PARALLEL_MIN / d + 2;
        let x: Vec<f32> = (0..rows * d)
            .map(|i| (i as f32 * 0.37).sin() * 3.0)
            .collect();
        let w: Vec<f32> = (0..d).map(|i| 0.5 + (i as f32 * 0.11).cos()).collect();
        let mut many = vec![0.0; x.len()];
        rms_norm(&x, &w, 1e-5, &mut many);
        for (r, row) in x.chunks(d).enumerate().step_by(7) {
            let mut one = vec![0.0; d];
            rms_norm(row, &w, 1e-5, &mut one);
            assert_eq!(one, many[r * d..(r + 1) * d], "row {r}");
        }
    }

    #[test]
    fn normalises_each_row() {
        let x = [1.0, 2.0, 3.0, 4.0, -1.0, 0.0, 1.0, 0.5];
        let w = [1.0, 0.5, 2.0, 1.0];
        let mut out = [0.0; 8];
        rms_norm(&x, &w, 1e-6, &mut out);
        let rms = ((1.0 + 4.0 + 9.0 + 16.0) / 4.0f32 + 1e-6).sqrt();
        assert!((out[2] - 3.0 / rms * 2.0).abs() < 1e-6);
        let rms2 = ((1.0 + 0.0 + 1.0 + 0.25) / 4.0f32 + 1e-6).sqrt();
        assert!((out[7] - 0.5 / rms2).abs() < 1e-6);
    }

    #[test]
    fn fused_add_equals_separate() {
        let mut r = vec![0.5f32, -1.0, 2.0, 0.25, 3.0, 1.0];
        let x = vec![1.0f32, 1.0, -1.0, 0.5, 0.0, 2.0];
        let w = vec![1.5f32, 0.5, 1.0];
        let mut fused = vec![0.0; 6];
        let mut r2 = r.clone();
        add_rms_norm(&mut r, &x, &w, 1e-5, &mut fused);
        for (a, b) in r2.iter_mut().zip(&x) {
            *a += b;
        }
        let mut sep = vec![0.0; 6];
        rms_norm(&r2, &w, 1e-5, &mut sep);
        assert_eq!(r, r2);
        assert_eq!(fused, sep);
    }

    #[test]
    fn head_norms_normalise_each_head_in_place_and_leave_the_rest() {
        let (hd, heads, stride, offset) = (8, 3, 40, 5);
        let x: Vec<f32> = (0..2 * stride)
            .map(|i| (i as f32 * 0.7).cos() * 2.0)
            .collect();
        let w: Vec<f32> = (0..hd).map(|i| 0.5 + i as f32 * 0.1).collect();
        let mut got = x.clone();
        rms_norm_heads(&mut got, stride, offset, heads, &w, 1e-6);
        for (row, (g, x)) in got.chunks(stride).zip(x.chunks(stride)).enumerate() {
            let span = offset..offset + heads * hd;
            let mut want = vec![0f32; heads * hd];
            rms_norm(&x[span.clone()], &w, 1e-6, &mut want);
            assert_eq!(&g[span.clone()], &want[..], "row {row}");
            assert_eq!(&g[..offset], &x[..offset]);
            assert_eq!(&g[span.end..], &x[span.end..]);
        }
    }
}
