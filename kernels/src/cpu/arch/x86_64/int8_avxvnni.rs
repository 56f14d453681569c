//! AVX-VNNI integer-dot kernels for packed weights (see `cpu::int8`): the VEX-encoded
//! `vpdpbusd` of CPUs with AVX2 but no AVX-512, Intel's since Alder Lake.
//!
//! The AVX-512 VNNI kernels' arithmetic on 256-bit registers: a 64-byte line of a tile is two
//! registers (tile rows 0-7, then 8-15), and one `vpdpbusd` multiplies one of them by four
//! values of an activation row, lane `r` summing row `r`'s four products. Without AVX-512's
//! mask registers the high-bit lines are expanded to bytes as in `int8_avx2`. The integer sums
//! are exact and the f32 steps are `portable::tile_row`'s, so the results are the same bits as
//! on every other level. Against `int8_avx2`'s `vpmaddwd` (quants widened to 16 bits, one
//! instruction per 16 products and an add) this is one instruction per 32 products and digit.
//!
//! [`KERNELS`] is only handed out after [`supported`], which is what makes its calls sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::avx2::mask;
use super::int8_avx2::{Line2, Stash2, crumb_pair, nibble_line, radix_sum, stash_period};
use crate::cpu::int8::Int8Kernels;
use crate::cpu::int8::activations::{QuantizedRows, RADIX};
use crate::cpu::int8::packed::{PackedMatrix, QK, QuantLayout, ScaleLayout, TILE};
use crate::quant::QK_K;

/// Whether the CPU has what [`KERNELS`] uses: AVX2, FMA, F16C and AVX-VNNI.
pub(crate) fn supported() -> bool {
    super::int8_avx2::supported() && is_x86_feature_detected!("avxvnni")
}

pub(crate) static KERNELS: Int8Kernels = Int8Kernels {
    name: "avx-vnni",
    tiles,
    quantize: super::int8_avx2::quantize,
    combined: false,
};

/// `portable::tiles`, with AVX-VNNI.
///
/// # Safety
/// As `portable::tiles`; only reachable after [`supported`].
unsafe fn tiles(
    w: &PackedMatrix,
    t0: usize,
    nt: usize,
    x: &QuantizedRows,
    out: *mut f32,
    ldo: usize,
) {
    // SAFETY: the table is only handed out after detection; contract forwarded.
    unsafe {
        match w.kind().layout() {
            QuantLayout::Bytes => tiles_of::<false, 0, false, false>(w, t0, nt, x, out, ldo),
            QuantLayout::Nibbles { fifth_bit } => {
                match (fifth_bit, w.kind().scale_layout() == ScaleLayout::SuperMins) {
                    (false, false) => tiles_of::<true, 0, false, false>(w, t0, nt, x, out, ldo),
                    (false, true) => tiles_of::<true, 0, false, true>(w, t0, nt, x, out, ldo),
                    (true, false) => tiles_of::<true, 1, false, false>(w, t0, nt, x, out, ldo),
                    (true, true) => tiles_of::<true, 1, false, true>(w, t0, nt, x, out, ldo),
                }
            }
            QuantLayout::Table => tiles_of::<true, 0, true, false>(w, t0, nt, x, out, ldo),
            QuantLayout::Halves { crumbs: false } => tiles_halves::<false>(w, t0, nt, x, out, ldo),
            QuantLayout::Halves { crumbs: true } => tiles_halves::<true>(w, t0, nt, x, out, ldo),
        }
    }
}

/// Tiles `t0..t0 + nt` for every row of `x`, for the kinds with one scale per block: a GEMV
/// takes tiles in pairs (eight independent integer chains); products of several rows take
/// one tile over two rows (sixteen registers leave no room for more), or [`kernel_rows`].
/// `SUPER`: scales per super-block (`Q4_K`, `Q5_K`).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn tiles_of<const Q4: bool, const HIGH: usize, const LUT: bool, const SUPER: bool>(
    w: &PackedMatrix,
    t0: usize,
    nt: usize,
    x: &QuantizedRows,
    out: *mut f32,
    ldo: usize,
) {
    // SAFETY (whole body): the kernels read tiles t0..t0 + nt of `w` and rows of `x` that
    // exist, and write the places the caller vouches for.
    unsafe {
        if x.m == 1 {
            let mut t = t0;
            while t < t0 + nt {
                let o = out.add((t - t0) * TILE);
                if t + 2 <= t0 + nt {
                    kernel::<Q4, HIGH, LUT, SUPER, 1, 2>(w, t, x, 0, o, ldo);
                    t += 2;
                } else {
                    kernel::<Q4, HIGH, LUT, SUPER, 1, 1>(w, t, x, 0, o, ldo);
                    t += 1;
                }
            }
            return;
        }
        let mut sums = RowSums::default();
        for t in t0..t0 + nt {
            let o = out.add((t - t0) * TILE);
            if Q4 && !LUT {
                kernel_rows::<false, HIGH, false, SUPER>(w, t, x, o, ldo, &mut sums);
                continue;
            }
            let mut i = 0;
            while i + 2 <= x.m {
                kernel::<Q4, HIGH, LUT, SUPER, 2, 1>(w, t, x, i, o.add(i * ldo), ldo);
                i += 2;
            }
            if i < x.m {
                kernel::<Q4, HIGH, LUT, SUPER, 1, 1>(w, t, x, i, o.add(i * ldo), ldo);
            }
        }
    }
}

/// `Q6_K` and `Q3_K` (`CRUMB`): a GEMV one tile at a time (eight integer sums: two digits
/// times two halves times two registers), products of several rows through [`kernel_rows`].
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn tiles_halves<const CRUMB: bool>(
    w: &PackedMatrix,
    t0: usize,
    nt: usize,
    x: &QuantizedRows,
    out: *mut f32,
    ldo: usize,
) {
    // SAFETY: as `tiles_of`.
    unsafe {
        if x.m == 1 {
            for t in t0..t0 + nt {
                kernel_halves::<CRUMB>(w, t, x, 0, out.add((t - t0) * TILE));
            }
            return;
        }
        let mut sums = RowSums::default();
        for t in t0..t0 + nt {
            let o = out.add((t - t0) * TILE);
            if CRUMB {
                kernel_rows::<true, 0, true, true>(w, t, x, o, ldo, &mut sums);
            } else {
                kernel_rows::<false, 2, true, true>(w, t, x, o, ldo, &mut sums);
            }
        }
    }
}

/// Writes `acc[r][c]` (lanes of tile rows 0-7, 8-15) at `out[r * ldo + c * 16 + lane]` for
/// tile `t + c`'s valid lanes.
///
/// # Safety
/// `out` is writable at those places.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn store_tiles<const R: usize, const C: usize>(
    w: &PackedMatrix,
    t: usize,
    acc: &[[[__m256; 2]; C]; R],
    out: *mut f32,
    ldo: usize,
) {
    for c in 0..C {
        let valid = (w.rows() - (t + c) * TILE).min(TILE);
        for (r, a) in acc.iter().enumerate() {
            for (k, v) in a[c].iter().enumerate() {
                let n = valid.saturating_sub(8 * k).min(8);
                // SAFETY: the caller vouches for these places (lanes below `n` only).
                unsafe {
                    let p = out.add(r * ldo + c * TILE + 8 * k);
                    if n == 8 {
                        _mm256_storeu_ps(p, *v);
                    } else if n > 0 {
                        _mm256_maskstore_ps(p, mask(n), *v);
                    }
                }
            }
        }
    }
}

/// Group `g` (four values) of the activation block at index `at` of `x`'s vectors, in every
/// lane.
///
/// # Safety
/// The block exists in `digits` (blocks of 32).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn group(digits: *const i8, at: usize, g: usize) -> __m256i {
    // SAFETY: the caller vouches for the block.
    _mm256_set1_epi32(unsafe { digits.add(at * QK + 4 * g).cast::<i32>().read_unaligned() })
}

/// Rows `i0..i0 + R` of `x` times tiles `t..t + C`, as the AVX-512 `kernel`: nibbles (`Q4`,
/// with `HIGH` lines of high bits) are quants with a minimum, or with `LUT` indices into the
/// kind's table (then bytes offset by 128, as `Q8_0`'s quants).
///
/// # Safety
/// The rows and tiles exist; `out` is writable at those places.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[inline]
unsafe fn kernel<
    const Q4: bool,
    const HIGH: usize,
    const LUT: bool,
    const SUPER: bool,
    const R: usize,
    const C: usize,
>(
    w: &PackedMatrix,
    t: usize,
    x: &QuantizedRows,
    i0: usize,
    out: *mut f32,
    ldo: usize,
) {
    let (period, step) = (w.period_stride(), w.block_step());
    let per = if SUPER { QK_K / QK } else { 1 };
    let starts: [(*const u8, *const u16); C] = std::array::from_fn(|c| w.tile_start(t + c));
    let codes: [*const u8; C] = std::array::from_fn(|c| {
        if SUPER {
            w.tile_codes(t + c)
        } else {
            std::ptr::null()
        }
    });
    let mut stash: [Stash2; C] = [[[_mm256_setzero_ps(); 2]; 2 * QK_K / QK]; C];
    let xs: [usize; R] = std::array::from_fn(|r| x.at(i0 + r, 0));
    let (xq, xl) = (x.q.as_ptr(), x.q_lo.as_ptr());
    let radix = _mm256_set1_epi32(RADIX);
    let table = *w.kind().table().unwrap_or(&[0; 16]);
    // SAFETY: `table` holds 16 bytes.
    let table = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(table.as_ptr().cast()) });
    let mut acc = [[[_mm256_setzero_ps(); 2]; C]; R];
    // SAFETY (whole body): tile c's block b = p · per + jb lies at starts[c] + p · period +
    // jb · step bytes, its period's scales and codes p · period bytes from theirs, inside
    // `w`; row r's block b is entry xs[r] + b of `x`'s vectors.
    unsafe {
        for p in 0..w.blocks() / per {
            if SUPER {
                for c in 0..C {
                    stash[c] = stash_period::<false>(codes[c], starts[c].1, p * period);
                }
            }
            for jb in 0..per {
                let b = p * per + jb;
                let lines: [*const u8; C] =
                    std::array::from_fn(|c| starts[c].0.add(p * period + jb * step));
                let scales: [*const u16; C] =
                    std::array::from_fn(|c| starts[c].1.byte_add(p * period));
                // Per (row, tile, register): against the high digits, and against the low ones
                // (which start from the offset of unsigned quants, where there is one).
                let mut sa = [[[_mm256_setzero_si256(); 2]; C]; R];
                let mut sb = sa;
                if !Q4 || LUT {
                    for (r, s) in sb.iter_mut().enumerate() {
                        *s = [[_mm256_set1_epi32(x.s128[xs[r] + b]); 2]; C];
                    }
                }
                let mut add = |c: usize, v: Line2, g: usize| {
                    for r in 0..R {
                        let (hg, lg) = (group(xq, xs[r] + b, g), group(xl, xs[r] + b, g));
                        for k in 0..2 {
                            sa[r][c][k] = _mm256_dpbusd_avx_epi32(sa[r][c][k], v[k], hg);
                            sb[r][c][k] = _mm256_dpbusd_avx_epi32(sb[r][c][k], v[k], lg);
                        }
                    }
                };
                if Q4 {
                    for h in 0..QK / 8 {
                        for (c, &l) in lines.iter().enumerate() {
                            let (mut lo, mut hi) = nibble_line::<HIGH>(l, h);
                            if LUT {
                                lo = lo.map(|v| _mm256_shuffle_epi8(table, v));
                                hi = hi.map(|v| _mm256_shuffle_epi8(table, v));
                            }
                            add(c, lo, h);
                            add(c, hi, h + QK / 8);
                        }
                    }
                } else {
                    for g in 0..QK / 4 {
                        for (c, &l) in lines.iter().enumerate() {
                            let p: Line2 =
                                [0, 32].map(|o| _mm256_loadu_si256(l.add(64 * g + o).cast()));
                            add(c, p, g);
                        }
                    }
                }
                for r in 0..R {
                    let j = xs[r] + b;
                    let dx = _mm256_set1_ps(x.d[j]);
                    for c in 0..C {
                        for k in 0..2 {
                            let d = if SUPER {
                                stash[c][2 * jb][k]
                            } else {
                                _mm256_cvtph_ps(_mm_loadu_si128(scales[c].add(8 * k).cast()))
                            };
                            let isum = if Q4 && !LUT {
                                // No offset: both sums are below 2²⁴.
                                radix_sum(sa[r][c][k], sb[r][c][k])
                            } else {
                                let combined = _mm256_add_epi32(
                                    _mm256_mullo_epi32(sa[r][c][k], radix),
                                    sb[r][c][k],
                                );
                                _mm256_cvtepi32_ps(combined)
                            };
                            let a = &mut acc[r][c][k];
                            *a = _mm256_fmadd_ps(isum, _mm256_mul_ps(d, dx), *a);
                            if Q4 && !LUT {
                                let m = if SUPER {
                                    stash[c][2 * jb + 1][k]
                                } else {
                                    let m = scales[c].add(TILE + 8 * k);
                                    _mm256_cvtph_ps(_mm_loadu_si128(m.cast()))
                                };
                                *a = _mm256_fmadd_ps(m, _mm256_set1_ps(x.sd[j]), *a);
                            }
                        }
                    }
                }
            }
        }
        store_tiles(w, t, &acc, out, ldo);
    }
}

/// Row `i` of `x` times tile `t`, for `Q6_K` (the nibble lines plus two lines of high bits,
/// offset 32) or `Q3_K` (`CRUMB`: two crumb lines and a line of masks, offset 4): per half of
/// each block its own integer sums and scale; see `portable::tile_row`.
///
/// # Safety
/// The row and tile exist; `out` is writable for the tile's valid columns.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[inline]
unsafe fn kernel_halves<const CRUMB: bool>(
    w: &PackedMatrix,
    t: usize,
    x: &QuantizedRows,
    i: usize,
    out: *mut f32,
) {
    let (period, step, per) = (w.period_stride(), w.block_step(), QK_K / QK);
    let (lines0, scales0) = w.tile_start(t);
    let codes0 = w.tile_codes(t);
    let at = x.at(i, 0);
    let (xq, xl) = (x.q.as_ptr(), x.q_lo.as_ptr());
    let shift = w.kind().half_shift();
    let mut acc = [[_mm256_setzero_ps(); 2]; 1];
    // SAFETY (whole body): as `kernel` (with super-blocks); `x` has the halves' sums
    // (quantized for a matrix with halves).
    unsafe {
        for p in 0..w.blocks() / per {
            let stash: Stash2 = stash_period::<true>(codes0, scales0, p * period);
            for jb in 0..per {
                let b = p * per + jb;
                let lines = lines0.add(p * period + jb * step);
                // [half][register]: against the high digits, and against the low ones.
                let mut sa = [[_mm256_setzero_si256(); 2]; 2];
                let mut sb = sa;
                for h in 0..QK / 8 {
                    let (lo, hi) = if CRUMB {
                        crumb_pair(lines, h)
                    } else {
                        nibble_line::<2>(lines, h)
                    };
                    for (half, v, g) in [(0, lo, h), (1, hi, h + QK / 8)] {
                        let (hg, lg) = (group(xq, at + b, g), group(xl, at + b, g));
                        for k in 0..2 {
                            sa[half][k] = _mm256_dpbusd_avx_epi32(sa[half][k], v[k], hg);
                            sb[half][k] = _mm256_dpbusd_avx_epi32(sb[half][k], v[k], lg);
                        }
                    }
                }
                let dx = _mm256_set1_ps(x.d[at + b]);
                let s32 = x.s32_halves[at + b].map(|s| s >> shift);
                for (k, a) in acc[0].iter_mut().enumerate() {
                    for half in 0..2 {
                        let d = stash[2 * jb + half][k];
                        // |sb + s32| ≤ 63 · 127 · 16 + 32 · 32385 · 16 < 2²⁴.
                        let low = _mm256_add_epi32(sb[half][k], _mm256_set1_epi32(s32[half]));
                        let isum = radix_sum(sa[half][k], low);
                        *a = _mm256_fmadd_ps(isum, _mm256_mul_ps(d, dx), *a);
                    }
                }
            }
        }
        store_tiles(w, t, &[acc], out, 0);
    }
}

/// Rows of `x` per pass of [`kernel_rows`].
const ROWS: usize = 32;

/// The f32 sums of [`kernel_rows`]'s rows, on the stack of the task that calls it for its tiles
/// (one per call would zero 2 KB per tile).
struct RowSums([[[__m256; 2]; 1]; ROWS]);

impl Default for RowSums {
    fn default() -> Self {
        // SAFETY: an all-zero `__m256` is eight zeros, a valid value.
        Self(unsafe { std::mem::zeroed() })
    }
}

/// Block `b` of a tile (`lines`: its quant lines) as its eight groups of four values per row,
/// in order: nibbles with `HIGH` high-bit lines, or (`CRUMB`) `Q3_K`'s crumbs and masks.
///
/// # Safety
/// `lines` points at a block of a tile of a matrix of that layout.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn unpack<const CRUMB: bool, const HIGH: usize>(lines: *const u8) -> [Line2; QK / 4] {
    let mut v = [[_mm256_setzero_si256(); 2]; QK / 4];
    for h in 0..QK / 8 {
        // SAFETY: the caller vouches for the block's lines.
        (v[h], v[h + QK / 8]) = unsafe {
            if CRUMB {
                crumb_pair(lines, h)
            } else {
                nibble_line::<HIGH>(lines, h)
            }
        };
    }
    v
}

/// Every row of `x` (`x.m > 1`) times tile `t`, for the layouts whose unpacking costs most:
/// nibbles with a minimum (`!SPLIT`: `Q4_1`, `Q4_K`; with a high-bit line `Q5_K`, `Q5_0`,
/// `Q5_1`), and the halves (`SPLIT`: `Q6_K`, `Q3_K` with `CRUMB`), whose sums also leave no
/// registers for a second row. Each block is unpacked once (see [`unpack`]); every row then
/// multiplies it from the stack. (`Q8_0` and the tables unpack cheaply enough that two rows
/// over registers are faster.) `SUPER`: scales per super-block (the K-quants; all with
/// `SPLIT`).
///
/// # Safety
/// The tile and rows exist; `out` is writable for the tile's valid columns of every row.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn kernel_rows<
    const CRUMB: bool,
    const HIGH: usize,
    const SPLIT: bool,
    const SUPER: bool,
>(
    w: &PackedMatrix,
    t: usize,
    x: &QuantizedRows,
    out: *mut f32,
    ldo: usize,
    sums: &mut RowSums,
) {
    let (period, step) = (w.period_stride(), w.block_step());
    let per = if SUPER { QK_K / QK } else { 1 };
    let (lines0, scales0) = w.tile_start(t);
    let codes0 = if SUPER {
        w.tile_codes(t)
    } else {
        std::ptr::null()
    };
    let mut stash: Stash2 = [[_mm256_setzero_ps(); 2]; 2 * QK_K / QK];
    let shift = w.kind().half_shift();
    let acc = &mut sums.0;
    for i0 in (0..x.m).step_by(ROWS) {
        let rows = (x.m - i0).min(ROWS);
        acc[..rows].fill([[_mm256_setzero_ps(); 2]; 1]);
        // SAFETY (loop): as `kernel`.
        unsafe {
            for p in 0..w.blocks() / per {
                if SUPER {
                    stash = stash_period::<SPLIT>(codes0, scales0, p * period);
                }
                for jb in 0..per {
                    let b = p * per + jb;
                    let lines = lines0.add(p * period + jb * step);
                    let scales = scales0.byte_add(p * period);
                    let v = unpack::<CRUMB, HIGH>(lines);
                    // The two halves' scales, or the block's scale and minimum.
                    let ds: [[__m256; 2]; 2] = if SUPER {
                        [stash[2 * jb], stash[2 * jb + 1]]
                    } else {
                        std::array::from_fn(|s| {
                            std::array::from_fn(|k| {
                                _mm256_cvtph_ps(_mm_loadu_si128(
                                    scales.add(s * TILE + 8 * k).cast(),
                                ))
                            })
                        })
                    };
                    for (r, a) in acc[..rows].iter_mut().enumerate() {
                        row_block::<SPLIT>(a, x, x.at(i0 + r, b), &v, &ds, shift);
                    }
                }
            }
            for (r, a) in acc[..rows].iter().enumerate() {
                store_tiles(w, t, &[*a], out.add((i0 + r) * ldo), 0);
            }
        }
    }
}

/// One row of `x` times one unpacked block of a tile (`v`; `ds`: its scales per half, or its
/// scale and minimum), added to the row's sums `acc`; `j`: the row's block's index in `x`.
///
/// # Safety
/// The block exists in `x`; with `SPLIT`, `x` has the halves' sums.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[inline]
unsafe fn row_block<const SPLIT: bool>(
    acc: &mut [[__m256; 2]; 1],
    x: &QuantizedRows,
    j: usize,
    v: &[Line2; QK / 4],
    ds: &[[__m256; 2]; 2],
    shift: u32,
) {
    // [half][register]: against the high digits, and against the low ones. Without `SPLIT`
    // the halves' sums are added at the end: eight chains of four instead of four of eight.
    let mut sa = [[_mm256_setzero_si256(); 2]; 2];
    let mut sb = sa;
    // SAFETY: the caller vouches for the block.
    unsafe {
        for (g, vg) in v.iter().enumerate() {
            let half = g / (QK / 8);
            let (hg, lg) = (group(x.q.as_ptr(), j, g), group(x.q_lo.as_ptr(), j, g));
            for k in 0..2 {
                sa[half][k] = _mm256_dpbusd_avx_epi32(sa[half][k], vg[k], hg);
                sb[half][k] = _mm256_dpbusd_avx_epi32(sb[half][k], vg[k], lg);
            }
        }
    }
    let dx = _mm256_set1_ps(x.d[j]);
    for (k, a) in acc[0].iter_mut().enumerate() {
        if SPLIT {
            let s32 = x.s32_halves[j].map(|s| s >> shift);
            for half in 0..2 {
                let low = _mm256_add_epi32(sb[half][k], _mm256_set1_epi32(s32[half]));
                let scale = _mm256_mul_ps(ds[half][k], dx);
                *a = _mm256_fmadd_ps(radix_sum(sa[half][k], low), scale, *a);
            }
        } else {
            let (a0, b0) = (
                _mm256_add_epi32(sa[0][k], sa[1][k]),
                _mm256_add_epi32(sb[0][k], sb[1][k]),
            );
            let scale = _mm256_mul_ps(ds[0][k], dx);
            *a = _mm256_fmadd_ps(radix_sum(a0, b0), scale, *a);
            *a = _mm256_fmadd_ps(ds[1][k], _mm256_set1_ps(x.sd[j]), *a);
        }
    }
}
