//! Dense products in the PyTorch `Linear` layout: `out[m, n] = x[m, k] · w[n, k]ᵀ (+ bias)`.
//!
//! [`linear`] splits the weight rows into chunks on rayon's pool and hands each chunk to the
//! dispatched level's tiled kernel (see [`super::dispatch`]); this file also holds the portable
//! level, the reference the SIMD levels are tested against.
#![allow(unsafe_code)]

use rayon::prelude::*;

use super::dispatch::{Kernels, Level, kernels};

/// Lane accumulators of every level's dot product.
pub const LANES: usize = 16;

/// Dot product with the fixed reduction order of the portable level: `LANES` partial sums,
/// then a fixed tree.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
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
const X_TILE: usize = 4;

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

/// The portable level's [`super::dispatch::GemmFn`].
///
/// # Safety
/// As [`super::dispatch::GemmFn`].
unsafe fn gemm_portable(x: &[f32], w: &[f32], k: usize, out: *mut f32, ldo: usize) {
    let (m, n) = (x.len() / k, w.len() / k);
    let row = |i: usize| &x[i * k..(i + 1) * k];
    let mut i = 0;
    while i + X_TILE <= m {
        let xs: [&[f32]; X_TILE] = std::array::from_fn(|t| row(i + t));
        for j in 0..n {
            let d = dot_tile(xs, &w[j * k..(j + 1) * k]);
            for (t, v) in d.into_iter().enumerate() {
                // SAFETY: (i + t, j) is inside m × n; the caller vouches for those elements.
                unsafe { *out.add((i + t) * ldo + j) = v };
            }
        }
        i += X_TILE;
    }
    for i in i..m {
        for j in 0..n {
            let d = dot(row(i), &w[j * k..(j + 1) * k]);
            // SAFETY: (i, j) is inside m × n; the caller vouches for those elements.
            unsafe { *out.add(i * ldo + j) = d };
        }
    }
}

fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    dot(a, b)
}

fn axpy_portable(a: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

/// The portable level's table.
pub(crate) static PORTABLE: Kernels = Kernels {
    level: Level::Portable,
    gemm: gemm_portable,
    gemm_bf16: None,
    dot: dot_portable,
    axpy: axpy_portable,
    attend: attend_portable,
    silu_mul: super::activation::silu_mul_portable,
    attention: super::attention::tile::PORTABLE,
    dequant: super::weights::PORTABLE_DEQUANT,
};

fn attend_portable(
    hq: &super::attention::HeadQuery<'_>,
    cache_k: &[f32],
    cache_v: &[f32],
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    super::attention::attend_head(hq, cache_k, cache_v, scores, out, dot, axpy_portable)
}

/// A raw output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
pub(crate) struct SharedOut(pub(crate) *mut f32);
// SAFETY: tasks only write disjoint elements through it (see `linear_with`), and the buffer
// outlives the parallel loop that uses it.
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// The pointer (a method, so that closures capture the whole `Send` wrapper).
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}

/// Weight rows per rayon task: a few tasks per thread, whole kernel tiles, at least 32 rows
/// and at most 256 (a 256 × 576 f32 chunk is 576 KiB, within L2 while x streams past it).
pub(crate) fn rows_per_task(n: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    (n.div_ceil(threads * 4)).clamp(32, 256).next_multiple_of(8)
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ + bias[n]`, parallel over weight rows, with the
/// dispatched kernels.
///
/// Each output element is the level's dot of its two rows (plus the bias), whatever `m` is.
pub fn linear(x: &[f32], w: &[f32], bias: Option<&[f32]>, m: usize, k: usize, out: &mut [f32]) {
    linear_with(kernels(), x, w, bias, m, k, out)
}

/// [`linear`] with an explicit level's kernels.
pub fn linear_with(
    kernels: &Kernels,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    out: &mut [f32],
) {
    let Some(n) = check_shapes(x, w.len(), bias, m, k, out) else {
        return;
    };
    let gemm = kernels.gemm;
    // SAFETY: `gemm` writes the rows × chunk block it is given, as `GemmFn` promises.
    linear_chunks(w, k, m, bias, out, |wc, base| unsafe {
        gemm(x, wc, k, base, n)
    });
}

/// Checks the shapes of `out[m, n] = x[m, k] · w[n, k]ᵀ + bias[n]` for a `w` of `w_len`
/// values (panicking with what is wrong), and gives `n` when there is anything to compute.
pub(crate) fn check_shapes(
    x: &[f32],
    w_len: usize,
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    out: &[f32],
) -> Option<usize> {
    assert!(k > 0, "k must be positive");
    assert_eq!(w_len % k, 0, "w must be n×k");
    let n = w_len / k;
    assert_eq!(x.len(), m * k, "x must be m×k");
    assert_eq!(out.len(), m * n, "out must be m×n");
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "bias must have n values");
    }
    (m > 0 && n > 0).then_some(n)
}

/// Runs `gemm(w_chunk, base)` on rayon's pool for chunks of [`rows_per_task`] weight rows
/// (`w` is `n × k`), then adds the chunk's bias. `gemm` must write `out[i * n + r]` relative
/// to `base` (the chunk's first column) for every row `i < m` and chunk row `r`, and nothing
/// else.
pub(crate) fn linear_chunks<T: Sync>(
    w: &[T],
    k: usize,
    m: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
    gemm: impl Fn(&[T], *mut f32) + Sync,
) {
    let n = w.len() / k;
    let chunk = rows_per_task(n);
    let ptr = SharedOut(out.as_mut_ptr());
    w.par_chunks(chunk * k).enumerate().for_each(|(ci, wc)| {
        let j0 = ci * chunk;
        // SAFETY: this task writes out[i * n + j] for i < m and j in j0..j0 + rows only: inside
        // `out` (m × n) and disjoint from every other task's columns. `out` is borrowed mutably
        // for the whole loop, so nothing else reads or writes it meanwhile.
        unsafe {
            let base = ptr.get().add(j0);
            gemm(wc, base);
            add_bias(base, bias, j0..j0 + wc.len() / k, m, n);
        }
    });
}

/// Adds `bias[cols]` to rows `0..m` (`ldo` apart) of the block starting at `base`.
///
/// # Safety
/// `base` must be writable at every `i * ldo + c` for `i < m` and `c < cols.len()`, and
/// nothing else may access those places meanwhile.
pub(crate) unsafe fn add_bias(
    base: *mut f32,
    bias: Option<&[f32]>,
    cols: std::ops::Range<usize>,
    m: usize,
    ldo: usize,
) {
    let Some(b) = bias else { return };
    for i in 0..m {
        for (c, bv) in b[cols.clone()].iter().enumerate() {
            // SAFETY: inside the block the caller vouches for.
            unsafe { *base.add(i * ldo + c) += bv };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::test_util::{levels, random};
    use rand::{Rng, SeedableRng};

    /// Per-level tolerance against the f64 product, relative to `sqrt(k)` (inputs in ±1).
    fn tolerance(level: Level) -> f32 {
        match level {
            Level::Portable => 2e-6,
            Level::Avx2 | Level::Avx512 => 2e-6,
        }
    }

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

    const SHAPES: [(usize, usize, usize); 12] = [
        (1, 1, 1),
        (1, 17, 3),
        (3, 33, 19),
        (5, 64, 40),
        (9, 100, 33),
        (4, 16, 16),
        (1, 15, 9),
        (2, 31, 7),
        (6, 7, 5),
        (13, 129, 70),
        (8, 576, 67),
        (1, 1000, 300),
    ];

    #[test]
    fn every_level_matches_naive_and_portable_on_odd_shapes() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for (m, k, n) in SHAPES {
            let x = random(&mut rng, m * k);
            let w = random(&mut rng, n * k);
            let b = random(&mut rng, n);
            let want = naive(&x, &w, Some(&b), m, k);
            let mut reference = vec![0f32; m * n];
            linear_with(&PORTABLE, &x, &w, Some(&b), m, k, &mut reference);
            for kern in levels() {
                let mut out = vec![f32::NAN; m * n];
                linear_with(kern, &x, &w, Some(&b), m, k, &mut out);
                let tol = tolerance(kern.level) * (k as f32).sqrt() * 4.0;
                for ((a, e), r) in out.iter().zip(&want).zip(&reference) {
                    assert!((a - e).abs() <= tol, "{kern:?} {m}x{k}x{n}: {a} vs {e}");
                    assert!(
                        (a - r).abs() <= tol,
                        "{kern:?} {m}x{k}x{n}: {a} vs portable {r}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_level_gives_rows_that_do_not_depend_on_batch() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(8);
        for (m, k, n) in [(7, 70, 23), (9, 576, 45), (5, 17, 300)] {
            let x = random(&mut rng, m * k);
            let w = random(&mut rng, n * k);
            for kern in levels() {
                let mut all = vec![0f32; m * n];
                linear_with(kern, &x, &w, None, m, k, &mut all);
                // Every prefix of the batch, and every row alone.
                for rows in 1..m {
                    let mut part = vec![0f32; rows * n];
                    linear_with(kern, &x[..rows * k], &w, None, rows, k, &mut part);
                    assert_eq!(&all[..rows * n], &part[..], "{kern:?} first {rows} rows");
                }
                for i in 0..m {
                    let mut one = vec![0f32; n];
                    linear_with(kern, &x[i * k..(i + 1) * k], &w, None, 1, k, &mut one);
                    assert_eq!(&all[i * n..(i + 1) * n], &one[..], "{kern:?} row {i}");
                    // The single-pair dot is the same computation.
                    for j in [0, n / 2, n - 1] {
                        let d = kern.dot(&x[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]);
                        assert_eq!(d, one[j], "{kern:?} dot ({i}, {j})");
                    }
                }
            }
        }
    }

    #[test]
    fn every_level_dot_and_axpy_match_portable() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        for len in [0, 1, 5, 8, 9, 15, 16, 17, 31, 33, 64, 100, 577] {
            let a = random(&mut rng, len);
            let b = random(&mut rng, len);
            let y0 = random(&mut rng, len);
            let s = rng.random_range(-2.0..2.0);
            let want_dot = dot(&a, &b);
            let mut want_y = y0.clone();
            PORTABLE.axpy(s, &a, &mut want_y);
            for kern in levels() {
                let d = kern.dot(&a, &b);
                let tol = 1e-6 * (len as f32 + 1.0);
                assert!(
                    (d - want_dot).abs() <= tol,
                    "{kern:?} dot len {len}: {d} vs {want_dot}"
                );
                let mut y = y0.clone();
                kern.axpy(s, &a, &mut y);
                for (u, v) in y.iter().zip(&want_y) {
                    assert!((u - v).abs() <= 1e-6, "{kern:?} axpy len {len}: {u} vs {v}");
                }
            }
        }
    }

    #[test]
    fn dispatched_level_is_the_best_available() {
        if std::env::var_os("TESSERA_CPU_KERNELS").is_none() {
            assert_eq!(Some(&kernels().level), Level::available().last());
        }
    }
}
