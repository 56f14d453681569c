//! AVX2 integer-dot kernel for packed weights (see `cpu::int8`), for CPUs without AVX-512
//! VNNI.
//!
//! AVX2 has no `vpdpbusd`. `vpmaddubsw` would saturate on `Q8_0`'s unsigned quants. So quants
//! are widened to 16 bits and multiplied with `vpmaddwd`, whose 16-bit operand also holds an
//! activation's two digits at once: `254 h + l` is at most 32385. One instruction takes 16
//! products, pairs of them summed into 32-bit lanes. A line's 16 rows × 4 values become four
//! registers of 4 rows each, with two lanes per row; the two lanes are added once per block.
//! The integer sums are exact (at most 255 · 32385 · 32 per block), and the f32 steps are
//! `portable::tile_row`'s, so the results are the same bits.
//!
//! [`tiles`] is only handed out after [`supported`], which is what makes its calls sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use crate::cpu::int8::activations::{QuantizedRows, RADIX};
use crate::cpu::int8::packed::{PackedMatrix, QK, QuantLayout, ScaleLayout, TILE};
use crate::quant::QK_K;

/// Whether the CPU runs [`tiles`] (AVX2, FMA and F16C).
pub(crate) fn supported() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// `activations::quantize_block_ref`'s operations, 8 lanes at a time (the same bits: the
/// rounding is nearest-even in both, and the clamps never bind).
pub(crate) fn quantize(x: &[f32], h: &mut [i8], l: &mut [i8]) -> (f32, i32) {
    assert!(x.len() == QK && h.len() == QK && l.len() == QK);
    // SAFETY: only reachable through the AVX2 table, handed out after `supported`; the
    // slices hold 32 values (checked above).
    unsafe { quantize_block(x, h, l) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_block(x: &[f32], h: &mut [i8], l: &mut [i8]) -> (f32, i32) {
    const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    // SAFETY: x holds 32 values (checked by the caller).
    let v: [__m256; 4] = std::array::from_fn(|q| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * q)) });
    let sign = _mm256_set1_ps(-0.0);
    let abs = |v: __m256| _mm256_andnot_ps(sign, v);
    let m = _mm256_max_ps(
        _mm256_max_ps(abs(v[0]), abs(v[1])),
        _mm256_max_ps(abs(v[2]), abs(v[3])),
    );
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
    let s = amax / 127.0;
    let is = _mm256_set1_ps(if amax != 0.0 { 1.0 / s } else { 0.0 });
    let radix = _mm256_set1_ps(RADIX as f32);
    let mut sum = _mm256_setzero_si256();
    for (q, v) in v.into_iter().enumerate() {
        let t = _mm256_mul_ps(v, is);
        let hi = _mm256_round_ps::<NEAREST>(t);
        let lo = _mm256_round_ps::<NEAREST>(_mm256_mul_ps(_mm256_sub_ps(t, hi), radix));
        let (hi, lo) = (_mm256_cvtps_epi32(hi), _mm256_cvtps_epi32(lo));
        let (mut hs, mut ls) = ([0i32; 8], [0i32; 8]);
        // SAFETY: 8 lanes into 8-value arrays.
        unsafe {
            _mm256_storeu_si256(hs.as_mut_ptr().cast(), hi);
            _mm256_storeu_si256(ls.as_mut_ptr().cast(), lo);
        }
        for e in 0..8 {
            h[8 * q + e] = hs[e] as i8;
            l[8 * q + e] = ls[e] as i8;
        }
        sum = _mm256_add_epi32(
            sum,
            _mm256_add_epi32(_mm256_mullo_epi32(hi, _mm256_set1_epi32(RADIX)), lo),
        );
    }
    let mut lanes = [0i32; 8];
    // SAFETY: 8 lanes into an 8-value array.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), sum) };
    (s / RADIX as f32, lanes.iter().sum())
}

/// `portable::tiles`, with AVX2.
///
/// # Safety
/// As `portable::tiles`; only reachable after [`supported`].
pub(crate) unsafe fn tiles(
    w: &PackedMatrix,
    t0: usize,
    nt: usize,
    x: &QuantizedRows,
    out: *mut f32,
    ldo: usize,
) {
    // SAFETY: forwarded contract; the CPU features were detected.
    unsafe {
        match w.kind().layout() {
            QuantLayout::Bytes => tiles_of::<false, 0, false, false, false>(w, t0, nt, x, out, ldo),
            QuantLayout::Nibbles { fifth_bit } => {
                match (fifth_bit, w.kind().scale_layout() == ScaleLayout::SuperMins) {
                    (false, false) => {
                        tiles_of::<true, 0, false, false, false>(w, t0, nt, x, out, ldo)
                    }
                    (false, true) => {
                        tiles_of::<true, 0, false, false, true>(w, t0, nt, x, out, ldo)
                    }
                    (true, false) => {
                        tiles_of::<true, 1, false, false, false>(w, t0, nt, x, out, ldo)
                    }
                    (true, true) => tiles_of::<true, 1, false, false, true>(w, t0, nt, x, out, ldo),
                }
            }
            QuantLayout::Table => tiles_of::<true, 0, false, true, false>(w, t0, nt, x, out, ldo),
            QuantLayout::Halves { crumbs: false } => {
                tiles_of::<true, 2, true, false, true>(w, t0, nt, x, out, ldo)
            }
            // Crumb lines and one mask line (HIGH = 1).
            QuantLayout::Halves { crumbs: true } => {
                tiles_of::<false, 1, true, false, true>(w, t0, nt, x, out, ldo)
            }
        }
    }
}

/// Tiles `t0..t0 + nt` for every row of `x`, for quants in nibbles (`NIB`, with `HIGH` lines
/// of high bits; with `LUT`, indices into the IQ4 table), in crumbs (`!NIB && SPLIT`: `Q3_K`,
/// its third bits in one mask line) or bytes, and per-half sums and scales (`SPLIT`, `Q6_K`
/// and `Q3_K`); `SUPER`: scales per super-block (the K-quants).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tiles_of<
    const NIB: bool,
    const HIGH: usize,
    const SPLIT: bool,
    const LUT: bool,
    const SUPER: bool,
>(
    w: &PackedMatrix,
    t0: usize,
    nt: usize,
    x: &QuantizedRows,
    out: *mut f32,
    ldo: usize,
) {
    let x16 = &x.combined[..];
    for t in t0..t0 + nt {
        let valid = (w.rows() - t * TILE).min(TILE);
        let store = |i: usize, acc: [__m256; 2]| {
            let mut row = [0f32; TILE];
            // SAFETY: the caller vouches for row i's outputs of the tile's valid columns.
            unsafe {
                _mm256_storeu_ps(row.as_mut_ptr(), acc[0]);
                _mm256_storeu_ps(row.as_mut_ptr().add(8), acc[1]);
                for (r, v) in row[..valid].iter().enumerate() {
                    *out.add(i * ldo + (t - t0) * TILE + r) = *v;
                }
            }
        };
        let mut i = 0;
        // Two rows share each unpacked line (four sums per row and half: the two halves
        // leave no registers for a second row).
        while !SPLIT && i + 2 <= x.m {
            // SAFETY: the tile and the rows exist.
            let [a, b] = unsafe { tile_rows::<NIB, HIGH, SPLIT, LUT, SUPER, 2>(w, t, x, x16, i) };
            store(i, a);
            store(i + 1, b);
            i += 2;
        }
        while i < x.m {
            // SAFETY: as above.
            let [a] = unsafe { tile_rows::<NIB, HIGH, SPLIT, LUT, SUPER, 1>(w, t, x, x16, i) };
            store(i, a);
            i += 1;
        }
    }
}

/// Bytes `0xFF` where bit `j` of `mask` is set, for the 32 bytes `j` of a register.
#[target_feature(enable = "avx2")]
#[inline]
fn expand_bits(mask: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(mask as i32),
        _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        ),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit)
}

/// A 64-byte line as two registers: tile rows 0-7, then 8-15.
pub(crate) type Line2 = [__m256i; 2];

/// `vpshufb` controls that move byte `i` of each 32-bit lane to the lane's bottom and zero
/// the rest (64 bytes; 256-bit registers take the first 32).
pub(crate) const BYTE_OF_LANE: [[u8; 64]; 4] = {
    let mut c = [[0x80; 64]; 4];
    let mut i = 0;
    while i < 4 {
        let mut lane = 0;
        while lane < 16 {
            c[i][4 * lane] = (4 * (lane % 4) + i) as u8;
            lane += 1;
        }
        i += 1;
    }
    c
};

/// `254 · a + b` as f32, for sums below 2²⁴ in magnitude: both convert exactly, and one FMA
/// rounds the exact value as the conversion of the integer `254 · a + b` does.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn radix_sum(a: __m256i, b: __m256i) -> __m256 {
    _mm256_fmadd_ps(
        _mm256_cvtepi32_ps(a),
        _mm256_set1_ps(RADIX as f32),
        _mm256_cvtepi32_ps(b),
    )
}

/// 2²³ as an f32, and its bits: with a byte below them, `2²³ + byte`.
pub(crate) const MAGIC: f32 = 8_388_608.0;
pub(crate) const MAGIC_BITS: u32 = 0x4B00_0000;

/// A K-quant tile's f32 scales of one super-block (tile rows 0-7, 8-15), as
/// `PackedMatrix::block_scales` gives them: block `j`'s two at `2 j` and `2 j + 1`.
pub(crate) type Stash2 = [[__m256; 2]; 2 * QK_K / QK];

/// `Q4_K`/`Q5_K`'s stash from a tile's period (`codes`, `scales`: its codes and f16 scales):
/// ggml's `scales_mins_k4` masks on every row's words at once, then each code times `d` or
/// `-dmin` (exact; a zero as +0).
///
/// # Safety
/// `codes` and `scales` point at a period of a tile of such a matrix.
#[target_feature(enable = "avx2,f16c,fma")]
#[inline]
pub(crate) unsafe fn stash_mins(codes: *const u8, scales: *const u16) -> Stash2 {
    let (low6, low4, bits45) = (
        _mm256_set1_epi8(0x3F),
        _mm256_set1_epi8(0x0F),
        _mm256_set1_epi8(0x30),
    );
    let high = |v: __m256i| _mm256_and_si256(_mm256_srli_epi32::<2>(v), bits45);
    // Register k: tile rows 8 k ..
    let register = |k: usize| {
        // SAFETY: the caller vouches for the three lines of codes and the 32 scales.
        let (w, d, nm) = unsafe {
            let w: [__m256i; 3] =
                std::array::from_fn(|i| _mm256_loadu_si256(codes.add(64 * i + 32 * k).cast()));
            let d = _mm256_cvtph_ps(_mm_loadu_si128(scales.add(8 * k).cast()));
            let nm = _mm256_cvtph_ps(_mm_loadu_si128(scales.add(TILE + 8 * k).cast()));
            (w, d, nm)
        };
        let sc = [
            _mm256_and_si256(w[0], low6),
            _mm256_or_si256(_mm256_and_si256(w[2], low4), high(w[0])),
        ];
        let m = [
            _mm256_and_si256(w[1], low6),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi32::<4>(w[2]), low4),
                high(w[1]),
            ),
        ];
        // As the AVX-512 stash: `2²³ + code` times the scale, less `2²³` times it (a zero
        // as +0, the same bits on every level).
        let magic = _mm256_set1_epi32(MAGIC_BITS as i32);
        let less = |s: __m256| _mm256_mul_ps(s, _mm256_set1_ps(-MAGIC));
        let (dl, nml) = (less(d), less(nm));
        let mut out = [_mm256_setzero_ps(); 2 * QK_K / QK];
        for (i, control) in BYTE_OF_LANE.iter().enumerate() {
            // SAFETY: the control holds 64 bytes.
            let pick = unsafe { _mm256_loadu_si256(control.as_ptr().cast()) };
            let code = |v: __m256i| {
                _mm256_castsi256_ps(_mm256_or_si256(_mm256_shuffle_epi8(v, pick), magic))
            };
            for half in 0..2 {
                let j = i + 4 * half;
                out[2 * j] = _mm256_fmadd_ps(code(sc[half]), d, dl);
                out[2 * j + 1] = _mm256_fmadd_ps(code(m[half]), nm, nml);
            }
        }
        out
    };
    let (lo, hi) = (register(0), register(1));
    std::array::from_fn(|s| [lo[s], hi[s]])
}

/// `Q6_K`/`Q3_K`'s stash from a tile's period: each signed scale times `d` (exact).
///
/// # Safety
/// `codes` and `scales` point at a period of a tile of such a matrix.
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(crate) unsafe fn stash_halves(codes: *const u8, scales: *const u16) -> Stash2 {
    // SAFETY: the caller vouches for the four lines of codes and the 16 scales.
    unsafe {
        let d: [__m256; 2] =
            std::array::from_fn(|k| _mm256_cvtph_ps(_mm_loadu_si128(scales.add(8 * k).cast())));
        std::array::from_fn(|s| {
            std::array::from_fn(|k| {
                let sc = _mm_loadl_epi64(codes.add(TILE * s + 8 * k).cast());
                _mm256_mul_ps(d[k], _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)))
            })
        })
    }
}

/// A tile's stash of period `p` (`codes0`, `scales0`: its first period's), for the kinds
/// with halves (`SPLIT`) or with minimums.
///
/// # Safety
/// As [`stash_mins`] and [`stash_halves`].
#[target_feature(enable = "avx2,f16c,fma")]
#[inline]
pub(crate) unsafe fn stash_period<const SPLIT: bool>(
    codes0: *const u8,
    scales0: *const u16,
    period_bytes: usize,
) -> Stash2 {
    // SAFETY: forwarded.
    unsafe {
        let (codes, scales) = (codes0.add(period_bytes), scales0.byte_add(period_bytes));
        if SPLIT {
            stash_halves(codes, scales)
        } else {
            stash_mins(codes, scales)
        }
    }
}

/// Nibble line `h` of a tile's block (`lines`: the block's quant lines) as the values of its
/// low nibbles and of its high ones, each plus `16 << level` where bit `level` of the `HIGH`
/// high-bit lines after the four nibble lines is set (`Q5_K`: one, `Q6_K`: two).
///
/// # Safety
/// `lines` points at a block of a tile of a matrix whose kind has `HIGH` high-bit lines.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn nibble_line<const HIGH: usize>(lines: *const u8, h: usize) -> (Line2, Line2) {
    let low = _mm256_set1_epi8(0x0F);
    // SAFETY: the caller vouches for the block's `4 + HIGH` lines.
    unsafe {
        let p: Line2 = [0, 32].map(|o| _mm256_loadu_si256(lines.add(64 * h + o).cast()));
        let mut lo = p.map(|v| _mm256_and_si256(v, low));
        let mut hi = p.map(|v| _mm256_and_si256(_mm256_srli_epi16::<4>(v), low));
        for level in 0..HIGH {
            let bits = lines.add(64 * (QK / 8 + level) + 16 * h).cast::<u64>();
            let (ml, mh) = (bits.read_unaligned(), bits.add(1).read_unaligned());
            let step = _mm256_set1_epi8(16 << level);
            for k in 0..2 {
                let (bl, bh) = ((ml >> (32 * k)) as u32, (mh >> (32 * k)) as u32);
                lo[k] = _mm256_add_epi8(lo[k], _mm256_and_si256(expand_bits(bl), step));
                hi[k] = _mm256_add_epi8(hi[k], _mm256_and_si256(expand_bits(bh), step));
            }
        }
        (lo, hi)
    }
}

/// `Q3_K`'s groups `h` and `h + 4` of a tile's block (`lines`: the block's quant lines) as
/// unsigned 3-bit values: crumb `h` of crumb lines 0 and 1, plus 4 where group `h`'s (`h + 4`'s)
/// mask in the third line has the bit set.
///
/// # Safety
/// `lines` points at a block of a tile of a `Q3_K` matrix.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn crumb_pair(lines: *const u8, h: usize) -> (Line2, Line2) {
    let (three, four) = (_mm256_set1_epi8(3), _mm256_set1_epi8(4));
    let shift = _mm_cvtsi32_si128((2 * h) as i32);
    // SAFETY: the caller vouches for the block's three lines.
    unsafe {
        let masks = lines.add(2 * 64).cast::<u64>();
        let [lo, hi] = [0, 1].map(|c| {
            let m = masks.add(h + 4 * c).read_unaligned();
            std::array::from_fn(|k| {
                let p = _mm256_loadu_si256(lines.add(64 * c + 32 * k).cast());
                let v = _mm256_and_si256(_mm256_srl_epi16(p, shift), three);
                let bits = expand_bits((m >> (32 * k)) as u32);
                _mm256_add_epi8(v, _mm256_and_si256(bits, four))
            })
        });
        (lo, hi)
    }
}

/// The 16 outputs of tile `t` (columns 0-7, 8-15) for rows `i0..i0 + R` of `x`, each as
/// `portable::tile_row`.
///
/// # Safety
/// The tile and the rows exist; `x16` is `x.combined` (the AVX2 table asks for it); for
/// `Q6_K` and `Q3_K`, `x` carries its halves' sums.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn tile_rows<
    const NIB: bool,
    const HIGH: usize,
    const SPLIT: bool,
    const LUT: bool,
    const SUPER: bool,
    const R: usize,
>(
    w: &PackedMatrix,
    t: usize,
    x: &QuantizedRows,
    x16: &[i16],
    i0: usize,
) -> [[__m256; 2]; R] {
    let (lines0, scales0) = w.tile_start(t);
    let codes0 = if SUPER {
        w.tile_codes(t)
    } else {
        std::ptr::null()
    };
    let (period, step) = (w.period_stride(), w.block_step());
    let per = if SUPER { QK_K / QK } else { 1 };
    let mut stash = [[_mm256_setzero_ps(); 2]; 2 * QK_K / QK];
    let table = *w.kind().table().unwrap_or(&[0; 16]);
    // SAFETY: `table` holds 16 bytes.
    let table = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(table.as_ptr().cast()) });
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    // SAFETY (whole body): block b = p · per + jb's lines lie `p · period + jb · step` bytes
    // from the tile's start, its period's scales and codes `p · period` from theirs, inside
    // `w`; row i's block b is entry `x.at(i, b)` of `x`'s vectors.
    unsafe {
        for p in 0..w.blocks() / per {
            if SUPER {
                stash = stash_period::<SPLIT>(codes0, scales0, p * period);
            }
            for jb in 0..per {
                let b = p * per + jb;
                let lines = lines0.add(p * period + jb * step);
                let scales = scales0.byte_add(p * period);
                let js: [usize; R] = std::array::from_fn(|r| x.at(i0 + r, b));
                // [row][half][4-row group of the tile]: two lanes per tile row.
                let mut sums = [[[_mm256_setzero_si256(); 4]; 2]; R];
                // Adds 16 tile rows × 4 values (`v`: rows 0-7, 8-15) times values 4 g.. of x's
                // rows (each as one 16-bit `254 h + l`).
                let mut add = |v: [__m256i; 2], g: usize, half: usize| {
                    let x16: [__m256i; R] = std::array::from_fn(|r| {
                        let at = x16.as_ptr().add(js[r] * QK + 4 * g).cast::<i64>();
                        _mm256_set1_epi64x(at.read_unaligned())
                    });
                    for (k, vk) in v.iter().enumerate() {
                        let quads = [
                            _mm256_cvtepu8_epi16(_mm256_castsi256_si128(*vk)),
                            _mm256_cvtepu8_epi16(_mm256_extracti128_si256::<1>(*vk)),
                        ];
                        for (q, w16) in quads.into_iter().enumerate() {
                            for (s, xr) in sums.iter_mut().zip(&x16) {
                                let s = &mut s[half][2 * k + q];
                                *s = _mm256_add_epi32(*s, _mm256_madd_epi16(w16, *xr));
                            }
                        }
                    }
                };
                if !NIB && SPLIT {
                    for h in 0..QK / 8 {
                        let (lo, hi) = crumb_pair(lines, h);
                        add(lo, h, 0);
                        add(hi, h + QK / 8, 1);
                    }
                } else if NIB {
                    for h in 0..QK / 8 {
                        let (mut lo, mut hi) = nibble_line::<HIGH>(lines, h);
                        if LUT {
                            lo = lo.map(|v| _mm256_shuffle_epi8(table, v));
                            hi = hi.map(|v| _mm256_shuffle_epi8(table, v));
                        }
                        add(lo, h, 0);
                        add(hi, h + QK / 8, usize::from(SPLIT));
                    }
                } else {
                    for g in 0..QK / 4 {
                        let p = [
                            _mm256_loadu_si256(lines.add(64 * g).cast()),
                            _mm256_loadu_si256(lines.add(64 * g + 32).cast()),
                        ];
                        add(p, g, 0);
                    }
                }
                // Per row: the two lanes added, rows in order (hadd interleaves 128-bit halves).
                let rows = |s: &[__m256i; 4], k: usize| {
                    let pairs = _mm256_hadd_epi32(s[2 * k], s[2 * k + 1]);
                    _mm256_permute4x64_epi64::<0b11_01_10_00>(pairs)
                };
                let halves = if SPLIT { 2 } else { 1 };
                for ((sums, acc), &j) in sums.iter().zip(acc.iter_mut()).zip(&js) {
                    let dx = _mm256_set1_ps(x.d[j]);
                    for (half, s) in sums.iter().enumerate().take(halves) {
                        let offset = if SPLIT {
                            x.s32_halves[j][half] >> w.kind().half_shift()
                        } else if NIB && !LUT {
                            0
                        } else {
                            x.s128[j]
                        };
                        for (k, a) in acc.iter_mut().enumerate() {
                            let isum = _mm256_add_epi32(rows(s, k), _mm256_set1_epi32(offset));
                            let d = if SUPER {
                                stash[2 * jb + half][k]
                            } else {
                                _mm256_cvtph_ps(_mm_loadu_si128(
                                    scales.add(half * TILE + 8 * k).cast(),
                                ))
                            };
                            *a =
                                _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, dx), *a);
                            if NIB && !SPLIT && !LUT {
                                let m = if SUPER {
                                    stash[2 * jb + 1][k]
                                } else {
                                    _mm256_cvtph_ps(_mm_loadu_si128(
                                        scales.add(TILE + 8 * k).cast(),
                                    ))
                                };
                                *a = _mm256_fmadd_ps(m, _mm256_set1_ps(x.sd[j]), *a);
                            }
                        }
                    }
                }
            }
        }
    }
    acc
}
