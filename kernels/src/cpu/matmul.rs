//! Dense products in the PyTorch `Linear` layout: `out[m, n] = x[m, k] · w[n, k]ᵀ (+ bias)`.

use rayon::prelude::*;

const LANES: usize = 16;
/// Rows of `x` that share one pass over a weight row.
const X_TILE: usize = 4;
/// Weight rows handed to one rayon task.
const W_CHUNK: usize = 16;

/// Dot product with a fixed reduction order: `LANES` partial sums, then a fixed tree.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; LANES];
    let split = a.len() - a.len() % LANES;
    for (ca, cb) in a[..split]
        .chunks_exact(LANES)
        .zip(b[..split].chunks_exact(LANES))
    {
        for l in 0..LANES {
            acc[l] += ca[l] * cb[l];
        }
    }
    for (l, (x, y)) in a[split..].iter().zip(&b[split..]).enumerate() {
        acc[l] += x * y;
    }
    reduce(acc)
}

#[inline(always)]
fn reduce(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    acc[0]
}

/// `X_TILE` dot products against one weight row, each with exactly [`dot`]'s reduction order.
#[inline(always)]
fn dot_tile(xs: [&[f32]; X_TILE], w: &[f32]) -> [f32; X_TILE] {
    let k = w.len();
    let split = k - k % LANES;
    let mut acc = [[0f32; LANES]; X_TILE];
    let mut c = 0;
    while c < split {
        let wc = &w[c..c + LANES];
        for (t, x) in xs.iter().enumerate() {
            let xc = &x[c..c + LANES];
            for l in 0..LANES {
                acc[t][l] += xc[l] * wc[l];
            }
        }
        c += LANES;
    }
    let mut out = [0f32; X_TILE];
    for (t, x) in xs.iter().enumerate() {
        for (l, (a, b)) in x[split..].iter().zip(&w[split..]).enumerate() {
            acc[t][l] += a * b;
        }
        out[t] = reduce(acc[t]);
    }
    out
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ + bias[n]`, parallel over weight rows.
///
/// Each output element is [`dot`] of its two rows (plus the bias), whatever `m` is.
pub fn linear(x: &[f32], w: &[f32], bias: Option<&[f32]>, m: usize, k: usize, out: &mut [f32]) {
    assert_eq!(x.len(), m * k, "x must be m×k");
    assert_eq!(w.len() % k, 0, "w must be n×k");
    let n = w.len() / k;
    assert_eq!(out.len(), m * n, "out must be m×n");
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "bias must have n values");
    }
    if m == 0 || n == 0 {
        return;
    }
    // Results are produced transposed per chunk ([rows of w] × m) and scattered afterwards,
    // so that tasks own disjoint memory.
    let chunks: Vec<(usize, Vec<f32>)> = w
        .par_chunks(W_CHUNK * k)
        .enumerate()
        .map(|(ci, wchunk)| {
            let rows = wchunk.len() / k;
            let mut local = vec![0f32; rows * m];
            let mut i = 0;
            while i + X_TILE <= m {
                let xs: [&[f32]; X_TILE] =
                    std::array::from_fn(|t| &x[(i + t) * k..(i + t + 1) * k]);
                for r in 0..rows {
                    let d = dot_tile(xs, &wchunk[r * k..(r + 1) * k]);
                    local[r * m + i..r * m + i + X_TILE].copy_from_slice(&d);
                }
                i += X_TILE;
            }
            for ii in i..m {
                let xr = &x[ii * k..(ii + 1) * k];
                for r in 0..rows {
                    local[r * m + ii] = dot(xr, &wchunk[r * k..(r + 1) * k]);
                }
            }
            (ci * W_CHUNK, local)
        })
        .collect();
    for (row0, local) in chunks {
        let rows = local.len() / m;
        for r in 0..rows {
            let j = row0 + r;
            let b = bias.map_or(0.0, |b| b[j]);
            for i in 0..m {
                out[i * n + j] = local[r * m + i] + b;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn naive(x: &[f32], w: &[f32], bias: Option<&[f32]>, m: usize, k: usize) -> Vec<f32> {
        let n = w.len() / k;
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0f64;
                for t in 0..k {
                    s += x[i * k + t] as f64 * w[j * k + t] as f64;
                }
                out[i * n + j] = s as f32 + bias.map_or(0.0, |b| b[j]);
            }
        }
        out
    }

    #[test]
    fn matches_naive_on_odd_shapes() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for &(m, k, n) in &[
            (1, 1, 1),
            (1, 17, 3),
            (3, 33, 19),
            (5, 64, 40),
            (9, 100, 33),
            (4, 16, 16),
        ] {
            let x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
            let w: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0..1.0)).collect();
            let b: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut out = vec![0f32; m * n];
            linear(&x, &w, Some(&b), m, k, &mut out);
            let want = naive(&x, &w, Some(&b), m, k);
            for (a, e) in out.iter().zip(&want) {
                assert!((a - e).abs() < 1e-4, "{m}x{k}x{n}: {a} vs {e}");
            }
        }
    }

    #[test]
    fn rows_do_not_depend_on_batch() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(8);
        let (m, k, n) = (7, 70, 23);
        let x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
        let w: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut all = vec![0f32; m * n];
        linear(&x, &w, None, m, k, &mut all);
        for i in 0..m {
            let mut one = vec![0f32; n];
            linear(&x[i * k..(i + 1) * k], &w, None, 1, k, &mut one);
            assert_eq!(&all[i * n..(i + 1) * n], &one[..], "row {i}");
        }
    }
}
