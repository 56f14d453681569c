//! The per-level inner kernels of tiled attention, and their portable reference.
//!
//! The driver (`flash`) hands them one key tile of [`KEY_TILE`] consecutive positions at a
//! time. Every output element is computed by a fixed sequence of operations that depends only
//! on the query vector and the absolute key positions, never on how many other query vectors
//! share the call: that is what keeps a row's result independent of batching.
//!
//! Scores live in the log2 domain (the driver folds `log2(e)` into the scaled query), so the
//! softmax uses `exp2`.

/// Key positions per tile; tiles are aligned to multiples of it. One AVX-512 register of
/// scores (two AVX2 ones).
pub(crate) const KEY_TILE: usize = 16;

/// One level's tile kernels.
#[derive(Clone, Copy)]
pub(crate) struct TileOps {
    /// `out[i * KEY_TILE + j] = Σ_d q[i * hd + d] · kt[d * KEY_TILE + j]`, `d` ascending from
    /// zero, for every query vector `i` of `q` (`out.len() / KEY_TILE` of them). `kt` is the
    /// key tile transposed (`[hd][KEY_TILE]`).
    pub(crate) scores: fn(q: &[f32], kt: &[f32], hd: usize, out: &mut [f32]),
    /// `scores` for several key tiles at once, read where they lie: tile `t` is `keys[t]`, its
    /// `hd` rows (row `d`: element `d` of the tile's keys) of `KEY_TILE` values, `stride` apart
    /// (a cache block's, or `KEY_TILE` when staged). `out` gets `[tiles][vectors][KEY_TILE]`,
    /// every score computed exactly as `scores` computes it over the tile transposed.
    pub(crate) scores_tiles: ScoresTilesFn,
    /// `scores_tiles` over bf16 keys, widened in registers (the same bits as over the widened
    /// keys): a decode step's keys straight from a bf16 cache, with no staging copy.
    pub(crate) scores_tiles_bf16: ScoresTilesBf16Fn,
    /// Online-softmax step of one row's heads (`m.len()` of them): lanes `lo..=hi` of each
    /// head's scores `s[g * KEY_TILE..]` are valid, the others masked. Updates the running
    /// max `m[g]` and sum `l[g]`, replaces the scores by `p = exp2(s - m_new)` (0 when
    /// masked) and stores the factor `corr[g] = exp2(m_old - m_new)` the accumulator needs.
    pub(crate) softmax: SoftmaxFn,
    /// `o[g] = o[g] · corr[g] + Σ_{j = lo..=hi} p[g * KEY_TILE + j] · v.row(j)`, `j`
    /// ascending, for each head `g` of one row (`corr.len()` of them); `o` is
    /// `[heads][v.width]`.
    pub(crate) pv: PvFn,
    /// `pv` reading bf16 rows (widened in registers, so the same bits as `pv` over the
    /// widened rows): values straight from a bf16 cache, with no staging copy.
    pub(crate) pv_bf16: PvBf16Fn,
    /// Widens `rows` rows of `width` bf16 values, `stride` apart in `src`, into consecutive
    /// rows of `dst` (exact).
    pub(crate) widen_bf16: WidenFn,
}

/// See [`TileOps::scores_tiles`].
pub(crate) type ScoresTilesFn = fn(q: &[f32], hd: usize, keys: &[Rows<'_>], out: &mut [f32]);

/// See [`TileOps::scores_tiles_bf16`].
pub(crate) type ScoresTilesBf16Fn =
    fn(q: &[f32], hd: usize, keys: &[Rows<'_, half::bf16>], out: &mut [f32]);

/// Checks what [`TileOps::scores_tiles`] reads and writes; returns the number of vectors.
pub(crate) fn check_scores_tiles<E>(
    q: &[f32],
    hd: usize,
    keys: &[Rows<'_, E>],
    out: &[f32],
) -> usize {
    let n = q.len() / hd.max(1);
    assert!(hd > 0 && out.len() >= keys.len() * n * KEY_TILE);
    for k in keys {
        assert!(
            k.width == KEY_TILE && k.holds(hd - 1),
            "a key tile is hd rows of 16 keys"
        );
    }
    n
}

/// See [`TileOps::widen_bf16`].
pub(crate) type WidenFn =
    fn(src: &[half::bf16], stride: usize, width: usize, rows: usize, dst: &mut [f32]);

/// See [`TileOps::softmax`].
pub(crate) type SoftmaxFn =
    fn(s: &mut [f32], lo: usize, hi: usize, m: &mut [f32], l: &mut [f32], corr: &mut [f32]);

/// See [`TileOps::pv`].
pub(crate) type PvFn =
    fn(p: &[f32], corr: &[f32], v: Rows<'_>, lo: usize, hi: usize, o: &mut [f32]);

/// See [`TileOps::pv_bf16`].
pub(crate) type PvBf16Fn =
    fn(p: &[f32], corr: &[f32], v: Rows<'_, half::bf16>, lo: usize, hi: usize, o: &mut [f32]);

/// Rows of `width` values, `stride` apart: a tile read in place from the cache or from a
/// staging buffer (stride: `width`). Values: up to `KEY_TILE` rows (a slot apart) of `hd`;
/// keys: `hd` rows (a block apart) of `KEY_TILE`.
#[derive(Clone, Copy)]
pub(crate) struct Rows<'a, E = f32> {
    pub(crate) data: &'a [E],
    pub(crate) stride: usize,
    pub(crate) width: usize,
}

impl<E> Rows<'_, E> {
    /// Row `j`.
    #[inline]
    pub(crate) fn row(&self, j: usize) -> &[E] {
        &self.data[j * self.stride..j * self.stride + self.width]
    }

    /// Whether rows `0..=last` are all inside `data` (what the SIMD kernels check).
    #[inline]
    pub(crate) fn holds(&self, last: usize) -> bool {
        self.width <= self.stride && self.data.len() >= last * self.stride + self.width
    }
}

/// The portable level: plain Rust, multiply then add (no fused multiply-add).
pub(crate) const PORTABLE: TileOps = TileOps {
    scores: scores_portable,
    scores_tiles: |q, hd, keys, out| scores_rows_portable(q, hd, keys, out, |x| x),
    scores_tiles_bf16: |q, hd, keys, out| {
        scores_rows_portable(q, hd, keys, out, half::bf16::to_f32)
    },
    softmax: softmax_portable,
    pv: pv_portable,
    pv_bf16: |p, corr, v, lo, hi, o| pv_elems(p, corr, v, lo, hi, o, half::bf16::to_f32),
    widen_bf16: widen_bf16_portable,
};

/// Taylor coefficients of `2^f = e^(f ln 2)`, degree 7: below 1e-8 relative error on
/// `[-0.5, 0.5]`, under the f32 rounding the evaluation adds.
pub(crate) const EXP2_COEFFS: [f32; 8] = [
    1.0,
    std::f32::consts::LN_2,
    0.240_226_5,
    0.055_504_11,
    0.009_618_129,
    0.001_333_355_8,
    0.000_154_035_3,
    0.000_015_252_734,
];

/// Below this, `exp2` returns 0 (the result would be subnormal; next to the row maximum,
/// whose weight is 1, it is negligible). `-inf`, the masked score, lands here too.
pub(crate) const EXP2_MIN: f32 = -126.0;

/// `2^x` for `x <= 0` by range reduction `x = n + f` (`n` the nearest integer) and the
/// polynomial; `exp2(0)` is exactly 1.
#[inline]
pub(crate) fn exp2_portable(x: f32) -> f32 {
    // Also catches NaN (never produced by the driver).
    if x.is_nan() || x < EXP2_MIN {
        return 0.0;
    }
    let n = x.round_ties_even();
    let f = x - n;
    let mut p = EXP2_COEFFS[7];
    for c in EXP2_COEFFS[..7].iter().rev() {
        p = p * f + c;
    }
    // `n` is in -126..=0 here (or small and positive for callers outside the contract), so
    // `n + 127` is a valid biased exponent.
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// Sum of 16 lanes in the tree order the SIMD levels use: `l + 8`, `l + 4`, `l + 2`, `l + 1`.
#[inline]
pub(crate) fn sum16_portable(v: &[f32; KEY_TILE]) -> f32 {
    let mut a = *v;
    let mut w = KEY_TILE / 2;
    while w > 0 {
        for i in 0..w {
            a[i] += a[i + w];
        }
        w /= 2;
    }
    a[0]
}

fn scores_portable(q: &[f32], kt: &[f32], hd: usize, out: &mut [f32]) {
    let tile = Rows {
        data: kt,
        stride: KEY_TILE,
        width: KEY_TILE,
    };
    scores_rows_portable(q, hd, &[tile], out, |x| x);
}

/// [`TileOps::scores_tiles`] portably: multiply then add, `d` ascending from zero.
fn scores_rows_portable<E: Copy>(
    q: &[f32],
    hd: usize,
    keys: &[Rows<'_, E>],
    out: &mut [f32],
    widen: impl Fn(E) -> f32,
) {
    let n = check_scores_tiles(q, hd, keys, out);
    for (t, k) in keys.iter().enumerate() {
        for (i, qi) in q.chunks_exact(hd).take(n).enumerate() {
            let mut acc = [0f32; KEY_TILE];
            for (d, &qd) in qi.iter().enumerate() {
                for (a, &kd) in acc.iter_mut().zip(k.row(d)) {
                    *a += qd * widen(kd);
                }
            }
            out[(t * n + i) * KEY_TILE..][..KEY_TILE].copy_from_slice(&acc);
        }
    }
}

fn softmax_portable(
    s: &mut [f32],
    lo: usize,
    hi: usize,
    m: &mut [f32],
    l: &mut [f32],
    corr: &mut [f32],
) {
    for (g, sg) in s.chunks_exact_mut(KEY_TILE).enumerate().take(m.len()) {
        let mut v = [f32::NEG_INFINITY; KEY_TILE];
        v[lo..=hi].copy_from_slice(&sg[lo..=hi]);
        let tile_max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let m_new = m[g].max(tile_max);
        let mut p = [0f32; KEY_TILE];
        for (pj, &sj) in p.iter_mut().zip(&v) {
            *pj = exp2_portable(sj - m_new);
        }
        let c = exp2_portable(m[g] - m_new);
        l[g] = l[g] * c + sum16_portable(&p);
        m[g] = m_new;
        corr[g] = c;
        sg.copy_from_slice(&p);
    }
}

fn pv_portable(p: &[f32], corr: &[f32], v: Rows<'_>, lo: usize, hi: usize, o: &mut [f32]) {
    pv_elems(p, corr, v, lo, hi, o, |x| x)
}

fn pv_elems<E: Copy>(
    p: &[f32],
    corr: &[f32],
    v: Rows<'_, E>,
    lo: usize,
    hi: usize,
    o: &mut [f32],
    widen: impl Fn(E) -> f32,
) {
    for ((og, &c), pg) in o
        .chunks_exact_mut(v.width)
        .zip(corr)
        .zip(p.chunks_exact(KEY_TILE))
    {
        for x in og.iter_mut() {
            *x *= c;
        }
        for (j, &pj) in pg.iter().enumerate().take(hi + 1).skip(lo) {
            for (x, &vd) in og.iter_mut().zip(v.row(j)) {
                *x += pj * widen(vd);
            }
        }
    }
}

pub(crate) fn widen_bf16_portable(
    src: &[half::bf16],
    stride: usize,
    width: usize,
    rows: usize,
    dst: &mut [f32],
) {
    for j in 0..rows {
        let (s, d) = (
            &src[j * stride..j * stride + width],
            &mut dst[j * width..(j + 1) * width],
        );
        for (o, v) in d.iter_mut().zip(s) {
            *o = v.to_f32();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp2_is_accurate_and_exact_at_the_ends() {
        assert_eq!(exp2_portable(0.0), 1.0);
        assert_eq!(exp2_portable(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp2_portable(-200.0), 0.0);
        let mut worst = 0f64;
        let mut x = -125.0f32;
        while x <= 0.0 {
            let want = (x as f64).exp2();
            let rel = ((exp2_portable(x) as f64 - want) / want).abs();
            worst = worst.max(rel);
            x += 0.0137;
        }
        assert!(worst < 3e-7, "max relative error {worst}");
    }

    #[test]
    fn scores_of_several_tiles_in_place_equal_each_tile_alone() {
        for level in crate::cpu::Level::available() {
            let ops = crate::cpu::Kernels::for_level(level).unwrap().attention;
            for (vectors, hd, tiles, stride) in [
                (1usize, 64usize, 4usize, 16usize),
                (3, 64, 4, 32),
                (3, 20, 2, 16),
                (4, 8, 3, 48),
                (5, 16, 4, 16),
                (9, 12, 1, 32),
                (2, 1, 1, 16),
            ] {
                let q: Vec<f32> = (0..vectors * hd)
                    .map(|i| (i as f32 * 0.731).sin())
                    .collect();
                // Tile t's rows start at t·(hd·stride + 5): tiles apart, as blocks are.
                let at = |t: usize| t * (hd * stride + 5);
                let kb: Vec<half::bf16> = (0..at(tiles))
                    .map(|i| half::bf16::from_f32((i as f32 * 0.377).cos()))
                    .collect();
                let kf: Vec<f32> = kb.iter().map(|k| k.to_f32()).collect();
                let mut want = vec![0f32; tiles * vectors * KEY_TILE];
                for (t, w) in want.chunks_exact_mut(vectors * KEY_TILE).enumerate() {
                    let kt: Vec<f32> = (0..hd)
                        .flat_map(|d| kf[at(t) + d * stride..][..KEY_TILE].to_vec())
                        .collect();
                    (ops.scores)(&q, &kt, hd, w);
                }
                let rows = |t: usize| (at(t), at(t) + (hd - 1) * stride + KEY_TILE);
                let fkeys: Vec<Rows<'_>> = (0..tiles)
                    .map(|t| Rows {
                        data: &kf[rows(t).0..rows(t).1],
                        stride,
                        width: KEY_TILE,
                    })
                    .collect();
                let bkeys: Vec<Rows<'_, half::bf16>> = (0..tiles)
                    .map(|t| Rows {
                        data: &kb[rows(t).0..rows(t).1],
                        stride,
                        width: KEY_TILE,
                    })
                    .collect();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let mut got = vec![f32::NAN; tiles * vectors * KEY_TILE];
                (ops.scores_tiles)(&q, hd, &fkeys, &mut got);
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{level:?} f32 {vectors}x{hd}x{tiles}"
                );
                let mut got = vec![f32::NAN; tiles * vectors * KEY_TILE];
                (ops.scores_tiles_bf16)(&q, hd, &bkeys, &mut got);
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{level:?} bf16 {vectors}x{hd}x{tiles}"
                );
            }
        }
    }

    #[test]
    fn every_level_multiplies_bf16_values_as_their_widening() {
        for level in crate::cpu::Level::available() {
            let ops = crate::cpu::Kernels::for_level(level).unwrap().attention;
            for (heads, hd, stride, lo, hi) in [
                (3usize, 64usize, 192usize, 0usize, 15usize),
                (1, 20, 20, 3, 9),
                (4, 80, 85, 5, 5),
                (2, 7, 9, 0, 12),
            ] {
                let p: Vec<f32> = (0..heads * KEY_TILE)
                    .map(|i| (i as f32 * 0.37).sin().abs())
                    .collect();
                let corr: Vec<f32> = (0..heads).map(|g| 0.5 + g as f32 * 0.1).collect();
                let vb: Vec<half::bf16> = (0..KEY_TILE * stride)
                    .map(|i| half::bf16::from_f32((i as f32 * 0.731).cos() * 3.0))
                    .collect();
                let vf: Vec<f32> = vb.iter().map(|v| v.to_f32()).collect();
                let o0: Vec<f32> = (0..heads * hd).map(|i| (i as f32 * 0.11).sin()).collect();
                let len = (KEY_TILE - 1) * stride + hd;
                let mut want = o0.clone();
                (ops.pv)(
                    &p,
                    &corr,
                    Rows {
                        data: &vf[..len],
                        stride,
                        width: hd,
                    },
                    lo,
                    hi,
                    &mut want,
                );
                let mut got = o0.clone();
                (ops.pv_bf16)(
                    &p,
                    &corr,
                    Rows {
                        data: &vb[..len],
                        stride,
                        width: hd,
                    },
                    lo,
                    hi,
                    &mut got,
                );
                assert!(
                    got.iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{level:?} heads {heads} hd {hd}"
                );
            }
        }
    }

    #[test]
    fn every_level_widens_bf16_rows() {
        for (width, stride, rows) in [
            (8usize, 8usize, 3usize),
            (20, 60, 16),
            (64, 192, 5),
            (80, 80, 1),
        ] {
            let src: Vec<half::bf16> = (0..rows * stride)
                .map(|i| half::bf16::from_f32(i as f32 * 0.37 - 100.0))
                .collect();
            let src = &src[..(rows - 1) * stride + width];
            let mut want = vec![0f32; rows * width];
            widen_bf16_portable(src, stride, width, rows, &mut want);
            for level in crate::cpu::Level::available() {
                let ops = crate::cpu::Kernels::for_level(level).unwrap().attention;
                let mut got = vec![f32::NAN; rows * width];
                (ops.widen_bf16)(src, stride, width, rows, &mut got);
                assert_eq!(got, want, "{level:?} width {width}");
            }
        }
    }
}
