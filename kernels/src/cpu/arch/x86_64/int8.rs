//! Integer-dot kernels for packed weights (see `cpu::int8`): AVX-512 VNNI here, AVX-VNNI in
//! `int8_avxvnni`, AVX2 without VNNI in `int8_avx2`.
//!
//! [`AVX512_VNNI`] is only handed out after [`avx512_vnni_supported`], and [`AVX2`] after
//! `int8_avx2::supported`, which is what makes their safe wrappers sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::int8_avx2::{BYTE_OF_LANE, MAGIC, MAGIC_BITS};
use crate::cpu::int8::Int8Kernels;
use crate::cpu::int8::activations::{QuantizedRows, RADIX};
use crate::cpu::int8::packed::{
    GROUP, LANE_TILES, PackedMatrix, QK, QuantLayout, ScaleLayout, TILE,
};
use crate::quant::QK_K;

/// Whether the CPU has what [`AVX512_VNNI`] uses.
pub(crate) fn avx512_vnni_supported() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
}

pub(crate) static AVX512_VNNI: Int8Kernels = Int8Kernels {
    name: "avx512-vnni",
    tiles: tiles_avx512,
    quantize: quantize_avx512,
    combined: false,
};

pub(crate) static AVX2: Int8Kernels = Int8Kernels {
    name: "avx2",
    tiles: super::int8_avx2::tiles,
    quantize: super::int8_avx2::quantize,
    combined: true,
};

fn quantize_avx512(x: &[f32], h: &mut [i8], l: &mut [i8]) -> (f32, i32) {
    assert!(x.len() == QK && h.len() == QK && l.len() == QK);
    // SAFETY: this function is only reachable through AVX512_VNNI, handed out after
    // detection; the slices have 32 values (checked above).
    unsafe { quantize_block(x, h, l) }
}

/// The reference quantizer's operations, 16 lanes at a time.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_block(x: &[f32], h: &mut [i8], l: &mut [i8]) -> (f32, i32) {
    const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    // SAFETY: x, h and l hold 32 values (checked by the caller).
    unsafe {
        let v0 = _mm512_loadu_ps(x.as_ptr());
        let v1 = _mm512_loadu_ps(x.as_ptr().add(16));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        let s = amax / 127.0;
        let is = _mm512_set1_ps(if amax != 0.0 { 1.0 / s } else { 0.0 });
        let radix = _mm512_set1_ps(RADIX as f32);
        let mut sum = _mm512_setzero_si512();
        for (half, v) in [v0, v1].into_iter().enumerate() {
            // Nearest-even, as `round_ties_even`; |t| ≤ 127 and |t - hi| · 254 ≤ 127.
            let t = _mm512_mul_ps(v, is);
            let hi = _mm512_roundscale_ps::<NEAREST>(t);
            let lo = _mm512_roundscale_ps::<NEAREST>(_mm512_mul_ps(_mm512_sub_ps(t, hi), radix));
            let (hi, lo) = (_mm512_cvtps_epi32(hi), _mm512_cvtps_epi32(lo));
            _mm_storeu_si128(
                h.as_mut_ptr().add(16 * half).cast(),
                _mm512_cvtepi32_epi8(hi),
            );
            _mm_storeu_si128(
                l.as_mut_ptr().add(16 * half).cast(),
                _mm512_cvtepi32_epi8(lo),
            );
            let combined = _mm512_add_epi32(_mm512_mullo_epi32(hi, _mm512_set1_epi32(RADIX)), lo);
            sum = _mm512_add_epi32(sum, combined);
        }
        (s / RADIX as f32, _mm512_reduce_add_epi32(sum))
    }
}

/// # Safety
/// As `portable::tiles`; only reachable after [`avx512_vnni_supported`].
unsafe fn tiles_avx512(
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
            QuantLayout::Bytes => tiles_vnni::<false, 0, false, false>(w, t0, nt, x, out, ldo),
            QuantLayout::Nibbles { fifth_bit } => {
                match (fifth_bit, w.kind().scale_layout() == ScaleLayout::SuperMins) {
                    (false, false) => tiles_vnni::<true, 0, false, false>(w, t0, nt, x, out, ldo),
                    (false, true) => tiles_vnni::<true, 0, false, true>(w, t0, nt, x, out, ldo),
                    (true, false) => tiles_vnni::<true, 1, false, false>(w, t0, nt, x, out, ldo),
                    (true, true) => tiles_vnni::<true, 1, false, true>(w, t0, nt, x, out, ldo),
                }
            }
            QuantLayout::Table => tiles_vnni::<true, 0, true, false>(w, t0, nt, x, out, ldo),
            QuantLayout::Halves { crumbs: false } => tiles_q6::<false>(w, t0, nt, x, out, ldo),
            QuantLayout::Halves { crumbs: true } => tiles_q6::<true>(w, t0, nt, x, out, ldo),
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tiles_vnni<const Q4: bool, const HIGH: usize, const LUT: bool, const SUPER: bool>(
    w: &PackedMatrix,
    t0: usize,
    nt: usize,
    x: &QuantizedRows,
    out: *mut f32,
    ldo: usize,
) {
    let m = x.m;
    let mut t = t0;
    // SAFETY (whole body): the kernels read tiles t0..t0 + nt of `w` and rows of `x` that
    // exist, and write the places the caller vouches for.
    unsafe {
        if m == 1 {
            // Decode: a group's four tiles at a time (its lanes' streams at once; four
            // independent chains hide latency), single tiles up to the first group and after
            // the last.
            while t < t0 + nt && !t.is_multiple_of(GROUP) {
                kernel::<Q4, HIGH, LUT, SUPER, 1, 1>(w, t, x, 0, out.add((t - t0) * TILE), ldo);
                t += 1;
            }
            while t + GROUP <= t0 + nt {
                kernel::<Q4, HIGH, LUT, SUPER, 1, GROUP>(w, t, x, 0, out.add((t - t0) * TILE), ldo);
                t += GROUP;
            }
            while t < t0 + nt {
                kernel::<Q4, HIGH, LUT, SUPER, 1, 1>(w, t, x, 0, out.add((t - t0) * TILE), ldo);
                t += 1;
            }
        } else {
            // Prefill and batched decode: two tiles' unpacked lines serve four rows of x (the
            // rows' broadcasts serve both tiles).
            while t < t0 + nt {
                let o = out.add((t - t0) * TILE);
                let pair = t + 2 <= t0 + nt;
                let mut i = 0;
                while i + 4 <= m {
                    if pair {
                        kernel::<Q4, HIGH, LUT, SUPER, 4, 2>(w, t, x, i, o.add(i * ldo), ldo);
                    } else {
                        kernel::<Q4, HIGH, LUT, SUPER, 4, 1>(w, t, x, i, o.add(i * ldo), ldo);
                    }
                    i += 4;
                }
                while i < m {
                    if pair {
                        kernel::<Q4, HIGH, LUT, SUPER, 1, 2>(w, t, x, i, o.add(i * ldo), ldo);
                    } else {
                        kernel::<Q4, HIGH, LUT, SUPER, 1, 1>(w, t, x, i, o.add(i * ldo), ldo);
                    }
                    i += 1;
                }
                t += if pair { 2 } else { 1 };
            }
        }
    }
}

/// Nibble line `h` of a tile's block (`lines`: the block's quant lines) as the values of its
/// low nibbles and of its high ones, each plus `16 << level` where bit `level` of the `HIGH`
/// high-bit lines after the four nibble lines is set (`Q5_K`: one, `Q6_K`: two).
///
/// # Safety
/// `lines` points at a block of a tile of a matrix whose kind has `HIGH` high-bit lines.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn nibble_line<const HIGH: usize>(lines: *const u8, h: usize) -> (__m512i, __m512i) {
    let low = _mm512_set1_epi8(0x0F);
    // SAFETY: the caller vouches for the block's `4 + HIGH` lines.
    unsafe {
        let p = _mm512_load_si512(lines.add(64 * h).cast());
        let mut lo = _mm512_and_si512(p, low);
        let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(p), low);
        for level in 0..HIGH {
            let bits = lines.add(64 * (QK / 8 + level) + 16 * h).cast::<u64>();
            let step = _mm512_set1_epi8(16 << level);
            let (kl, kh) = (
                _cvtu64_mask64(bits.read_unaligned()),
                _cvtu64_mask64(bits.add(1).read_unaligned()),
            );
            lo = _mm512_mask_add_epi8(lo, kl, lo, step);
            hi = _mm512_mask_add_epi8(hi, kh, hi, step);
        }
        (lo, hi)
    }
}

/// One half of [`nibble_line`]: the low nibbles (`half` 0, the block's first 16 values) or
/// the high ones (`half` 1), with their high bits.
///
/// # Safety
/// As [`nibble_line`].
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn nibble_half<const HIGH: usize>(lines: *const u8, h: usize, half: usize) -> __m512i {
    let low = _mm512_set1_epi8(0x0F);
    // SAFETY: the caller vouches for the block's `4 + HIGH` lines.
    unsafe {
        let p = _mm512_load_si512(lines.add(64 * h).cast());
        let p = if half == 0 {
            p
        } else {
            _mm512_srli_epi16::<4>(p)
        };
        let mut v = _mm512_and_si512(p, low);
        for level in 0..HIGH {
            let bits = lines.add(64 * (QK / 8 + level) + 16 * h).cast::<u64>();
            let k = _cvtu64_mask64(bits.add(half).read_unaligned());
            v = _mm512_mask_add_epi8(v, k, v, _mm512_set1_epi8(16 << level));
        }
        v
    }
}

/// `Q3_K`'s group `h` (`half` 0) or `h + 4` (`half` 1) of a tile's block (`lines`: the block's
/// quant lines) as unsigned 3-bit values: crumb `h` of crumb line `half`, plus 4 where the
/// group's mask in the third line has the bit set.
///
/// # Safety
/// `lines` points at a block of a tile of a `Q3_K` matrix.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn crumb_half(lines: *const u8, h: usize, half: usize) -> __m512i {
    let shift = _mm_cvtsi32_si128((2 * h) as i32);
    // SAFETY: the caller vouches for the block's three lines.
    unsafe {
        let p = _mm512_load_si512(lines.add(64 * half).cast());
        let v = _mm512_and_si512(_mm512_srl_epi16(p, shift), _mm512_set1_epi8(3));
        let k = _cvtu64_mask64(
            lines
                .add(2 * 64)
                .cast::<u64>()
                .add(h + 4 * half)
                .read_unaligned(),
        );
        _mm512_mask_add_epi8(v, k, v, _mm512_set1_epi8(4))
    }
}

/// A K-quant tile's f32 scales of one super-block, as `PackedMatrix::block_scales` gives
/// them: block `j`'s two at `2 j` and `2 j + 1`.
type Stash = [__m512; 2 * QK_K / QK];

/// `Q4_K`/`Q5_K`'s stash from a tile's period (`codes`, `scales`: its codes and f16 scales):
/// ggml's `scales_mins_k4` masks on every row's words at once, then each code times `d` or
/// `-dmin` (exact; a zero as +0).
///
/// # Safety
/// `codes` and `scales` point at a period of a tile of such a matrix.
#[target_feature(enable = "avx512f,avx512bw,fma")]
#[inline]
unsafe fn stash_mins(codes: *const u8, scales: *const u16) -> Stash {
    let (low6, low4, bits45) = (
        _mm512_set1_epi8(0x3F),
        _mm512_set1_epi8(0x0F),
        _mm512_set1_epi8(0x30),
    );
    // SAFETY: the caller vouches for the three lines of codes and the 32 scales.
    let (w, d, nm) = unsafe {
        let w: [__m512i; 3] = std::array::from_fn(|k| _mm512_load_si512(codes.add(64 * k).cast()));
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(scales.cast()));
        let nm = _mm512_cvtph_ps(_mm256_loadu_si256(scales.add(TILE).cast()));
        (w, d, nm)
    };
    let high = |v: __m512i| _mm512_and_si512(_mm512_srli_epi32::<2>(v), bits45);
    // Bytes i of each lane: sub-block i's (i + 4's) scale, and minimum.
    let sc = [
        _mm512_and_si512(w[0], low6),
        _mm512_or_si512(_mm512_and_si512(w[2], low4), high(w[0])),
    ];
    let m = [
        _mm512_and_si512(w[1], low6),
        _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi32::<4>(w[2]), low4),
            high(w[1]),
        ),
    ];
    // A code into the bottom byte of 2²³'s bits is the f32 `2²³ + code`; times `d`, plus the
    // exact `-2²³ · d`, it is `code · d` exactly (a zero as +0), in one shuffle and one FMA.
    let magic = _mm512_set1_epi32(MAGIC_BITS as i32);
    let bottom = _cvtu64_mask64(0x1111_1111_1111_1111);
    let less = |s: __m512| _mm512_mul_ps(s, _mm512_set1_ps(-MAGIC));
    let (dl, nml) = (less(d), less(nm));
    let mut out = [_mm512_setzero_ps(); 2 * QK_K / QK];
    for (i, control) in BYTE_OF_LANE.iter().enumerate() {
        // SAFETY: the control holds 64 bytes.
        let pick = unsafe { _mm512_loadu_si512(control.as_ptr().cast()) };
        let code =
            |v: __m512i| _mm512_castsi512_ps(_mm512_mask_shuffle_epi8(magic, bottom, v, pick));
        for half in 0..2 {
            let j = i + 4 * half;
            out[2 * j] = _mm512_fmadd_ps(code(sc[half]), d, dl);
            out[2 * j + 1] = _mm512_fmadd_ps(code(m[half]), nm, nml);
        }
    }
    out
}

/// `Q6_K`/`Q3_K`'s stash from a tile's period: each signed scale times `d` (exact).
///
/// # Safety
/// `codes` and `scales` point at a period of a tile of such a matrix.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn stash_halves(codes: *const u8, scales: *const u16) -> Stash {
    // SAFETY: the caller vouches for the four lines of codes and the 16 scales.
    unsafe {
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(scales.cast()));
        std::array::from_fn(|s| {
            let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(codes.add(TILE * s).cast()));
            _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc))
        })
    }
}

/// Writes `acc[r][c]` at `out[r * ldo + c * 16 + lane]` for tile `t + c`'s valid lanes.
///
/// # Safety
/// `out` is writable at those places.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn store_tiles<const R: usize, const C: usize>(
    w: &PackedMatrix,
    t: usize,
    acc: &[[__m512; C]; R],
    out: *mut f32,
    ldo: usize,
) {
    for c in 0..C {
        let valid = (w.rows() - (t + c) * TILE).min(TILE);
        let mask = if valid == TILE {
            !0
        } else {
            ((1u32 << valid) - 1) as __mmask16
        };
        for (r, a) in acc.iter().enumerate() {
            // SAFETY: the caller vouches for these places.
            unsafe { _mm512_mask_storeu_ps(out.add(r * ldo + c * TILE), mask, a[c]) };
        }
    }
}

/// Rows `i0..i0 + R` of `x` times tiles `t..t + C`, written at `out[r * ldo + c * 16 + lane]`
/// for the tiles' valid lanes. Nibbles (`Q4`, with `HIGH` lines of high bits) are quants with a
/// minimum, or with `LUT` indices into the kind's table (then, as bytes, offset by 128). Each
/// lane is prefetched a little ahead (see [`prefetch_lanes`]).
///
/// # Safety
/// The rows and tiles exist; `out` is writable at those places.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
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
    let blocks = w.blocks();
    let (period, step) = (w.period_stride(), w.block_step());
    let per = if SUPER { QK_K / QK } else { 1 };
    let pf = prefetch_distance();
    let starts: [(*const u8, *const u16); C] = std::array::from_fn(|c| w.tile_start(t + c));
    let codes: [*const u8; C] = std::array::from_fn(|c| {
        if SUPER {
            w.tile_codes(t + c)
        } else {
            std::ptr::null()
        }
    });
    let mut stash = [[_mm512_setzero_ps(); 2 * QK_K / QK]; C];
    let xs: [usize; R] = std::array::from_fn(|r| x.at(i0 + r, 0));
    let (xq, xl) = (x.q.as_ptr(), x.q_lo.as_ptr());
    let (xd, xsd, x128) = (x.d.as_ptr(), x.sd.as_ptr(), x.s128.as_ptr());
    let radix = _mm512_set1_epi32(RADIX);
    let table = *w.kind().table().unwrap_or(&[0; 16]);
    // SAFETY: `table` holds 16 bytes.
    let table = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(table.as_ptr().cast()) });
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    // SAFETY (whole body): tile c's block b = p · per + jb lies at starts[c] + p · period +
    // jb · step bytes, its period's scales and codes p · period bytes from theirs, inside `w`
    // for b < blocks; row r's block b is entry xs[r] + b of `x`'s vectors (and 32 quants
    // from 32 · that).
    unsafe {
        for p in 0..blocks / per {
            let scales: [*const u16; C] = std::array::from_fn(|c| starts[c].1.byte_add(p * period));
            if SUPER {
                for c in 0..C {
                    stash[c] = stash_mins(codes[c].add(p * period), scales[c]);
                }
            }
            for jb in 0..per {
                let b = p * per + jb;
                let lines: [*const u8; C] =
                    std::array::from_fn(|c| starts[c].0.add(p * period + jb * step));
                prefetch_lanes::<C>(&lines, step, pf);
                // Two integer chains per (row, tile): against the high and the low digits.
                let mut sa = [[_mm512_setzero_si512(); C]; R];
                let mut sb_ = [[_mm512_setzero_si512(); C]; R];
                if !Q4 || LUT {
                    for (r, s) in sb_.iter_mut().enumerate() {
                        *s = [_mm512_set1_epi32(*x128.add(xs[r] + b)); C];
                    }
                }
                let xg = |digits: *const i8, r: usize, g: usize| {
                    _mm512_set1_epi32(
                        digits
                            .add((xs[r] + b) * QK + 4 * g)
                            .cast::<i32>()
                            .read_unaligned(),
                    )
                };
                if Q4 {
                    for h in 0..QK / 8 {
                        let mut lo = [_mm512_setzero_si512(); C];
                        let mut hi = [_mm512_setzero_si512(); C];
                        for c in 0..C {
                            (lo[c], hi[c]) = nibble_line::<HIGH>(lines[c], h);
                            if LUT {
                                lo[c] = _mm512_shuffle_epi8(table, lo[c]);
                                hi[c] = _mm512_shuffle_epi8(table, hi[c]);
                            }
                        }
                        for r in 0..R {
                            let (h0, h1) = (xg(xq, r, h), xg(xq, r, h + QK / 8));
                            let (l0, l1) = (xg(xl, r, h), xg(xl, r, h + QK / 8));
                            for c in 0..C {
                                sa[r][c] = _mm512_dpbusd_epi32(sa[r][c], lo[c], h0);
                                sb_[r][c] = _mm512_dpbusd_epi32(sb_[r][c], lo[c], l0);
                                sa[r][c] = _mm512_dpbusd_epi32(sa[r][c], hi[c], h1);
                                sb_[r][c] = _mm512_dpbusd_epi32(sb_[r][c], hi[c], l1);
                            }
                        }
                    }
                } else {
                    for g in 0..QK / 4 {
                        let p: [__m512i; C] =
                            std::array::from_fn(|c| _mm512_load_si512(lines[c].add(64 * g).cast()));
                        for r in 0..R {
                            let (hg, lg) = (xg(xq, r, g), xg(xl, r, g));
                            for c in 0..C {
                                sa[r][c] = _mm512_dpbusd_epi32(sa[r][c], p[c], hg);
                                sb_[r][c] = _mm512_dpbusd_epi32(sb_[r][c], p[c], lg);
                            }
                        }
                    }
                }
                let dw: [__m512; C] = std::array::from_fn(|c| {
                    if SUPER {
                        stash[c][2 * jb]
                    } else {
                        _mm512_cvtph_ps(_mm256_loadu_si256(scales[c].cast()))
                    }
                });
                let mw: [__m512; C] = std::array::from_fn(|c| {
                    if SUPER {
                        stash[c][2 * jb + 1]
                    } else if Q4 && !LUT {
                        _mm512_cvtph_ps(_mm256_loadu_si256(scales[c].add(TILE).cast()))
                    } else {
                        _mm512_setzero_ps()
                    }
                });
                for r in 0..R {
                    let dx = _mm512_set1_ps(*xd.add(xs[r] + b));
                    let sdx = _mm512_set1_ps(*xsd.add(xs[r] + b));
                    for c in 0..C {
                        let isum = if Q4 && !LUT {
                            // Both sums are below 2²⁴ (no offset): exact in f32, and one FMA
                            // rounds `254 · sa + sb` as its conversion does.
                            _mm512_fmadd_ps(
                                _mm512_cvtepi32_ps(sa[r][c]),
                                _mm512_set1_ps(RADIX as f32),
                                _mm512_cvtepi32_ps(sb_[r][c]),
                            )
                        } else {
                            let combined =
                                _mm512_add_epi32(_mm512_mullo_epi32(sa[r][c], radix), sb_[r][c]);
                            _mm512_cvtepi32_ps(combined)
                        };
                        let scale = _mm512_mul_ps(dw[c], dx);
                        acc[r][c] = _mm512_fmadd_ps(isum, scale, acc[r][c]);
                        if Q4 && !LUT {
                            acc[r][c] = _mm512_fmadd_ps(mw[c], sdx, acc[r][c]);
                        }
                    }
                }
            }
        }
        store_tiles(w, t, &acc, out, ldo);
    }
}

/// `Q6_K` (and `Q3_K`, `CRUMB`): decode over whole groups, otherwise tiles in pairs, each unpacked
/// line shared by up to four rows.
///
/// # Safety
/// As `portable::tiles`; only reachable after [`avx512_vnni_supported`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tiles_q6<const CRUMB: bool>(
    w: &PackedMatrix,
    t0: usize,
    nt: usize,
    x: &QuantizedRows,
    out: *mut f32,
    ldo: usize,
) {
    let m = x.m;
    let mut t = t0;
    // SAFETY (whole body): as `tiles_vnni`.
    unsafe {
        if m == 1 {
            // Decode: whole groups, as `tiles_vnni`.
            while t < t0 + nt && !t.is_multiple_of(GROUP) {
                kernel_q6::<CRUMB, 1, 1>(w, t, x, 0, out.add((t - t0) * TILE), ldo);
                t += 1;
            }
            while t + GROUP <= t0 + nt {
                kernel_q6::<CRUMB, 1, GROUP>(w, t, x, 0, out.add((t - t0) * TILE), ldo);
                t += GROUP;
            }
        }
        while t < t0 + nt {
            let o = out.add((t - t0) * TILE);
            let pair = t + 2 <= t0 + nt;
            let mut i = 0;
            while i < m {
                let o = o.add(i * ldo);
                match (m - i, pair) {
                    (1, true) => kernel_q6::<CRUMB, 1, 2>(w, t, x, i, o, ldo),
                    (2, true) => kernel_q6::<CRUMB, 2, 2>(w, t, x, i, o, ldo),
                    (3, true) => kernel_q6::<CRUMB, 3, 2>(w, t, x, i, o, ldo),
                    (_, true) => kernel_q6::<CRUMB, 4, 2>(w, t, x, i, o, ldo),
                    (1, false) => kernel_q6::<CRUMB, 1, 1>(w, t, x, i, o, ldo),
                    (2, false) => kernel_q6::<CRUMB, 2, 1>(w, t, x, i, o, ldo),
                    (3, false) => kernel_q6::<CRUMB, 3, 1>(w, t, x, i, o, ldo),
                    (_, false) => kernel_q6::<CRUMB, 4, 1>(w, t, x, i, o, ldo),
                }
                i += 4;
            }
            t += if pair { 2 } else { 1 };
        }
    }
}

/// [`kernel`] for `Q6_K`: quants of six bits (the nibble lines plus two lines of high bits),
/// and per half of each block its own integer sums and scale; see `portable::tile_row`. With
/// `CRUMB`, `Q3_K`'s: three bits (two crumb lines and a line of masks), offset 4 instead of 32.
/// The halves run one after the other, so that each (row, tile) needs two integer sums at a
/// time, not four, and four rows fit over two tiles.
///
/// # Safety
/// The rows and tiles exist; `out` is writable at those places.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn kernel_q6<const CRUMB: bool, const R: usize, const C: usize>(
    w: &PackedMatrix,
    t: usize,
    x: &QuantizedRows,
    i0: usize,
    out: *mut f32,
    ldo: usize,
) {
    let blocks = w.blocks();
    let (period, step, per) = (w.period_stride(), w.block_step(), QK_K / QK);
    let pf = prefetch_distance();
    let starts: [(*const u8, *const u16); C] = std::array::from_fn(|c| w.tile_start(t + c));
    let codes: [*const u8; C] = std::array::from_fn(|c| w.tile_codes(t + c));
    let mut stash = [[_mm512_setzero_ps(); 2 * QK_K / QK]; C];
    let xs: [usize; R] = std::array::from_fn(|r| x.at(i0 + r, 0));
    let (xq, xl, xd) = (x.q.as_ptr(), x.q_lo.as_ptr(), x.d.as_ptr());
    let halves = x.s32_halves.as_ptr();
    let shift = w.kind().half_shift();
    let radix = _mm512_set1_ps(RADIX as f32);
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    // SAFETY (whole body): as `kernel` (with super-blocks); the high-bit lines are the tile's
    // quant lines 4 and 5 (`Q3_K`: the crumb lines 0 and 1, the masks 2), and `x` has the
    // halves' sums (quantized for a matrix with halves).
    unsafe {
        for p in 0..blocks / per {
            for c in 0..C {
                let scales = starts[c].1.byte_add(p * period);
                stash[c] = stash_halves(codes[c].add(p * period), scales);
            }
            for jb in 0..per {
                let b = p * per + jb;
                let lines: [*const u8; C] =
                    std::array::from_fn(|c| starts[c].0.add(p * period + jb * step));
                prefetch_lanes::<C>(&lines, step, pf);
                let xg = |digits: *const i8, r: usize, g: usize| {
                    _mm512_set1_epi32(
                        digits
                            .add((xs[r] + b) * QK + 4 * g)
                            .cast::<i32>()
                            .read_unaligned(),
                    )
                };
                // The halves as constants: each pass unrolls fully.
                macro_rules! half_pass {
                    ($half:literal) => {{
                        let half: usize = $half;
                        // [row][tile]: against the high digits, and against the low ones.
                        let mut sa = [[_mm512_setzero_si512(); C]; R];
                        // The halves' offset sums start the low chains (exact: integers).
                        let mut sb: [[__m512i; C]; R] = std::array::from_fn(|r| {
                            [_mm512_set1_epi32((*halves.add(xs[r] + b))[half] >> shift); C]
                        });
                        for h in 0..QK / 8 {
                            let v: [__m512i; C] = std::array::from_fn(|c| {
                                if CRUMB {
                                    crumb_half(lines[c], h, half)
                                } else {
                                    nibble_half::<2>(lines[c], h, half)
                                }
                            });
                            let g = h + half * QK / 8;
                            for r in 0..R {
                                let (hg, lg) = (xg(xq, r, g), xg(xl, r, g));
                                for c in 0..C {
                                    sa[r][c] = _mm512_dpbusd_epi32(sa[r][c], v[c], hg);
                                    sb[r][c] = _mm512_dpbusd_epi32(sb[r][c], v[c], lg);
                                }
                            }
                        }
                        let dw: [__m512; C] = std::array::from_fn(|c| stash[c][2 * jb + half]);
                        for r in 0..R {
                            let dx = _mm512_set1_ps(*xd.add(xs[r] + b));
                            for c in 0..C {
                                // |sb| ≤ 32 · 32385 · 16 + 63 · 127 · 16 < 2²⁴: as `kernel`.
                                let isum = _mm512_fmadd_ps(
                                    _mm512_cvtepi32_ps(sa[r][c]),
                                    radix,
                                    _mm512_cvtepi32_ps(sb[r][c]),
                                );
                                let scale = _mm512_mul_ps(dw[c], dx);
                                acc[r][c] = _mm512_fmadd_ps(isum, scale, acc[r][c]);
                            }
                        }
                    }};
                }
                half_pass!(0);
                half_pass!(1);
            }
        }
        store_tiles(w, t, &acc, out, ldo);
    }
}

/// How far ahead of its current block a lane is prefetched: [`PREFETCH_AHEAD`] bytes, or
/// `TESSERA_PREFETCH_BYTES` (0: none) for machines where another distance streams better.
fn prefetch_distance() -> usize {
    static D: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *D.get_or_init(|| {
        std::env::var("TESSERA_PREFETCH_BYTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(PREFETCH_AHEAD)
    })
}

/// A core's hardware prefetchers keep too few lines of a decode stream in flight while the
/// kernel computes on it (a cold GEMV runs at half its speed from the caches), and they
/// restart at every 4 KiB page. Asking for the lines a block or two ahead keeps the stream
/// moving; much further ahead, the lines arrive too early and crowd the L1.
const PREFETCH_AHEAD: usize = 1024;

/// Prefetches, for each lane of the tiles, the `step` bytes that lie `distance` bytes ahead of
/// its current block.
#[inline(always)]
fn prefetch_lanes<const C: usize>(lines: &[*const u8; C], step: usize, distance: usize) {
    if distance == 0 {
        return;
    }
    let mut c = 0;
    while c < C {
        let ahead = lines[c].wrapping_add(distance);
        let mut j = 0;
        while j < step {
            // SAFETY: a prefetch never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(j).cast()) };
            j += 64;
        }
        c += LANE_TILES;
    }
}
