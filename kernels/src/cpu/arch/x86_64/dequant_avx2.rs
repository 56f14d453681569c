//! AVX2 + FMA dequantizers of f16, `Q4_0`, `Q5_0`, `Q5_1`, the K-quants (`Q2_K` to `Q6_K`) and
//! the IQ4 formats, for the level's `Dequant` table (see `avx2.rs`).
//!
//! Each writes the portable reference's values bit for bit: the products are exact (see
//! `cpu::weights`), so a fused `q·d − m` rounds like the reference's multiply-then-subtract,
//! and the K-quants' sub-block scales are widened and multiplied by the super-block scale
//! eight at a time, as the reference does one at a time. f16 needs F16C, which the level
//! does not require, so it is detected here (and the reference used without it).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use half::f16;

use crate::quant::{
    BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4K, BlockQ5_0,
    BlockQ5_1, BlockQ5K, BlockQ6K, KVALUES_IQ4NL, KVALUES_MXFP4, QK_K, e8m0_to_f32_half,
    scales_mins_k4,
};

/// Eight bytes at `p`, zero-extended to 32-bit lanes.
///
/// # Safety
/// `p` must be readable for 8 bytes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn u8x8(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 8 readable bytes.
    unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast::<__m128i>())) }
}

#[target_feature(enable = "avx2,f16c")]
fn f16_f16c(src: &[f16], out: &mut [f32]) {
    assert_eq!(out.len(), src.len(), "one value per f16");
    let n = src.len();
    let full = n - n % 8;
    let (sp, op) = (src.as_ptr(), out.as_mut_ptr());
    // SAFETY: every load reads 8 values below `full <= n` of `src`, every store 8 of `out`.
    unsafe {
        let mut i = 0;
        while i < full {
            let v = _mm256_cvtph_ps(_mm_loadu_si128(sp.add(i).cast::<__m128i>()));
            _mm256_storeu_ps(op.add(i), v);
            i += 8;
        }
    }
    crate::cpu::weights::f16_to_f32_ref(&src[full..], &mut out[full..]);
}

pub(super) fn f16(src: &[f16], out: &mut [f32]) {
    if std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: avx2 was detected (see avx2::KERNELS) and f16c just now.
        unsafe { f16_f16c(src, out) }
    } else {
        crate::cpu::weights::f16_to_f32_ref(src, out)
    }
}

#[target_feature(enable = "avx2")]
fn q4_0_avx2(blocks: &[BlockQ4_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32, "32 values per block");
    let op = out.as_mut_ptr();
    let (low, eight) = (_mm256_set1_epi32(0x0F), _mm256_set1_epi32(8));
    for (i, b) in blocks.iter().enumerate() {
        let d = _mm256_set1_ps(b.d.to_f32());
        for h in 0..2 {
            // SAFETY: bytes 8h..8h + 8 of the 16 in `qs`; values i * 32 + 8h.. and
            // i * 32 + 16 + 8h.. (8 each) of `out`.
            unsafe {
                let q = u8x8(b.qs.as_ptr().add(8 * h));
                let lo = _mm256_sub_epi32(_mm256_and_si256(q, low), eight);
                let hi = _mm256_sub_epi32(_mm256_srli_epi32::<4>(q), eight);
                let (lo, hi) = (_mm256_cvtepi32_ps(lo), _mm256_cvtepi32_ps(hi));
                _mm256_storeu_ps(op.add(i * 32 + 8 * h), _mm256_mul_ps(lo, d));
                _mm256_storeu_ps(op.add(i * 32 + 16 + 8 * h), _mm256_mul_ps(hi, d));
            }
        }
    }
}

pub(super) fn q4_0(blocks: &[BlockQ4_0], out: &mut [f32]) {
    // SAFETY: avx2 was detected (see avx2::KERNELS).
    unsafe { q4_0_avx2(blocks, out) }
}

/// A `Q5_0`/`Q5_1` block's unsigned 5-bit quants, eight at a time: values `8 j..8 j + 8`
/// in entry `j`.
#[target_feature(enable = "avx2")]
#[inline]
fn q5_quants(qs: &[u8; 16], qh: [u8; 4]) -> [__m256i; 4] {
    let high = _mm256_set1_epi32(u32::from_le_bytes(qh) as i32);
    let (low, one) = (_mm256_set1_epi32(0x0F), _mm256_set1_epi32(1));
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    std::array::from_fn(|j| {
        // SAFETY: bytes 8 (j % 2).. (8 of the 16 in `qs`).
        let q = unsafe { u8x8(qs.as_ptr().add(8 * (j % 2))) };
        let nibbles = if j < 2 {
            _mm256_and_si256(q, low)
        } else {
            _mm256_srli_epi32::<4>(q)
        };
        // Bit `e` of the high bits, for the lanes' values e = 8 j..8 j + 8.
        let at = _mm256_add_epi32(_mm256_set1_epi32(8 * j as i32), lanes);
        let bit = _mm256_and_si256(_mm256_srlv_epi32(high, at), one);
        _mm256_or_si256(nibbles, _mm256_slli_epi32::<4>(bit))
    })
}

#[target_feature(enable = "avx2")]
fn q5_0_avx2(blocks: &[BlockQ5_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32, "32 values per block");
    let sixteen = _mm256_set1_epi32(16);
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let d = _mm256_set1_ps(b.d.to_f32());
        for (j, q) in q5_quants(&b.qs, b.qh).into_iter().enumerate() {
            let v = _mm256_cvtepi32_ps(_mm256_sub_epi32(q, sixteen));
            // SAFETY: values 8 j.. (8 of the block's 32) of `y`.
            unsafe { _mm256_storeu_ps(y.as_mut_ptr().add(8 * j), _mm256_mul_ps(v, d)) };
        }
    }
}

pub(super) fn q5_0(blocks: &[BlockQ5_0], out: &mut [f32]) {
    // SAFETY: avx2 was detected (see avx2::KERNELS).
    unsafe { q5_0_avx2(blocks, out) }
}

#[target_feature(enable = "avx2,fma")]
fn q5_1_avx2(blocks: &[BlockQ5_1], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32, "32 values per block");
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let (d, m) = (_mm256_set1_ps(b.d.to_f32()), _mm256_set1_ps(b.m.to_f32()));
        for (j, q) in q5_quants(&b.qs, b.qh).into_iter().enumerate() {
            let v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), d, m);
            // SAFETY: values 8 j.. (8 of the block's 32) of `y`.
            unsafe { _mm256_storeu_ps(y.as_mut_ptr().add(8 * j), v) };
        }
    }
}

pub(super) fn q5_1(blocks: &[BlockQ5_1], out: &mut [f32]) {
    // SAFETY: avx2 and fma were detected (see avx2::KERNELS).
    unsafe { q5_1_avx2(blocks, out) }
}

/// A `Q4_K`/`Q5_K` block's eight effective scales `d·sc[j]` (`0..8`) and minimums
/// `dmin·m[j]` (`8..16`).
#[target_feature(enable = "avx2")]
#[inline]
fn k4_scales(d: f16, dmin: f16, scales: &[u8; 12]) -> [f32; 16] {
    let packed = scales_mins_k4(scales);
    let mut out = [0f32; 16];
    // SAFETY: `packed` holds 16 bytes, `out` 16 values.
    unsafe {
        let sc = _mm256_cvtepi32_ps(u8x8(packed.as_ptr()));
        let mn = _mm256_cvtepi32_ps(u8x8(packed.as_ptr().add(8)));
        let op = out.as_mut_ptr();
        _mm256_storeu_ps(op, _mm256_mul_ps(sc, _mm256_set1_ps(d.to_f32())));
        _mm256_storeu_ps(op.add(8), _mm256_mul_ps(mn, _mm256_set1_ps(dmin.to_f32())));
    }
    out
}

#[target_feature(enable = "avx2,fma")]
fn q4_k_avx2(blocks: &[BlockQ4K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "256 values per block");
    let low = _mm256_set1_epi32(0x0F);
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let s = k4_scales(b.d, b.dmin, &b.scales);
        let yp = y.as_mut_ptr();
        // Group g: bytes 32g.. of `qs`; low nibbles are sub-block 2g, high ones 2g + 1.
        for g in 0..4 {
            let (d1, m1) = (_mm256_set1_ps(s[2 * g]), _mm256_set1_ps(s[8 + 2 * g]));
            let (d2, m2) = (_mm256_set1_ps(s[2 * g + 1]), _mm256_set1_ps(s[9 + 2 * g]));
            for h in 0..4 {
                // SAFETY: bytes 32g + 8h.. (8 of the 128 in `qs`); values 64g + 8h.. and
                // 64g + 32 + 8h.. (8 each) of this block's 256 in `y`.
                unsafe {
                    let q = u8x8(b.qs.as_ptr().add(32 * g + 8 * h));
                    let lo = _mm256_cvtepi32_ps(_mm256_and_si256(q, low));
                    let hi = _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(q));
                    _mm256_storeu_ps(yp.add(64 * g + 8 * h), _mm256_fmsub_ps(lo, d1, m1));
                    _mm256_storeu_ps(yp.add(64 * g + 32 + 8 * h), _mm256_fmsub_ps(hi, d2, m2));
                }
            }
        }
    }
}

pub(super) fn q4_k(blocks: &[BlockQ4K], out: &mut [f32]) {
    // SAFETY: avx2 and fma were detected (see avx2::KERNELS).
    unsafe { q4_k_avx2(blocks, out) }
}

#[target_feature(enable = "avx2,fma")]
fn q5_k_avx2(blocks: &[BlockQ5K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "256 values per block");
    let (low, one) = (_mm256_set1_epi32(0x0F), _mm256_set1_epi32(1));
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let s = k4_scales(b.d, b.dmin, &b.scales);
        let yp = y.as_mut_ptr();
        let q = b.qh.as_ptr();
        // SAFETY: `qh` holds 32 bytes.
        let qh = unsafe { [u8x8(q), u8x8(q.add(8)), u8x8(q.add(16)), u8x8(q.add(24))] };
        for g in 0..4 {
            let (d1, m1) = (_mm256_set1_ps(s[2 * g]), _mm256_set1_ps(s[8 + 2 * g]));
            let (d2, m2) = (_mm256_set1_ps(s[2 * g + 1]), _mm256_set1_ps(s[9 + 2 * g]));
            // Bit 2g of `qh[l]` is the fifth bit of value 64g + l, bit 2g + 1 of 64g + 32 + l.
            let (sh1, sh2) = (
                _mm_cvtsi32_si128(2 * g as i32),
                _mm_cvtsi32_si128(2 * g as i32 + 1),
            );
            for (h, qh) in qh.iter().enumerate() {
                let h1 = _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srl_epi32(*qh, sh1), one));
                let h2 = _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srl_epi32(*qh, sh2), one));
                // SAFETY: bytes 32g + 8h.. (8 of the 128 in `qs`); values 64g + 8h.. and
                // 64g + 32 + 8h.. (8 each) of this block's 256 in `y`.
                unsafe {
                    let q = u8x8(b.qs.as_ptr().add(32 * g + 8 * h));
                    let lo = _mm256_or_si256(_mm256_and_si256(q, low), h1);
                    let hi = _mm256_or_si256(_mm256_srli_epi32::<4>(q), h2);
                    let (lo, hi) = (_mm256_cvtepi32_ps(lo), _mm256_cvtepi32_ps(hi));
                    _mm256_storeu_ps(yp.add(64 * g + 8 * h), _mm256_fmsub_ps(lo, d1, m1));
                    _mm256_storeu_ps(yp.add(64 * g + 32 + 8 * h), _mm256_fmsub_ps(hi, d2, m2));
                }
            }
        }
    }
}

pub(super) fn q5_k(blocks: &[BlockQ5K], out: &mut [f32]) {
    // SAFETY: avx2 and fma were detected (see avx2::KERNELS).
    unsafe { q5_k_avx2(blocks, out) }
}

/// A `Q6_K` quant: 4 low bits `ql` and the 2 high bits `(qh >> shift) & 3`, minus 32.
#[target_feature(enable = "avx2")]
#[inline]
fn q6_quant(ql: __m256i, qh: __m256i, shift: i32) -> __m256 {
    let bits = _mm256_and_si256(
        _mm256_srl_epi32(qh, _mm_cvtsi32_si128(shift)),
        _mm256_set1_epi32(3),
    );
    let q = _mm256_or_si256(ql, _mm256_slli_epi32::<4>(bits));
    _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(32)))
}

#[target_feature(enable = "avx2")]
fn q6_k_avx2(blocks: &[BlockQ6K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "256 values per block");
    let low = _mm256_set1_epi32(0x0F);
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        // Effective sub-block scales d·sc[j], eight at a time.
        let mut s = [0f32; 16];
        let d = _mm256_set1_ps(b.d.to_f32());
        for h in 0..2 {
            // SAFETY: bytes 8h.. (8 of the 16) of `scales`; values 8h.. (8 of the 16) of `s`.
            unsafe {
                let p = b.scales.as_ptr().add(8 * h).cast::<__m128i>();
                let sc = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p)));
                _mm256_storeu_ps(s.as_mut_ptr().add(8 * h), _mm256_mul_ps(d, sc));
            }
        }
        let yp = y.as_mut_ptr();
        // Halves of 128 values; in each, the 8-value chunk c (l = 8c..) feeds values l,
        // l + 32, l + 64 and l + 96, with scales l/16, +2, +4 and +6 of the half's 8.
        for half in 0..2 {
            for c in 0..4 {
                let l = 8 * c;
                // SAFETY: bytes 64·half + l.. and 64·half + l + 32.. (8 each) of the 128 in
                // `ql`, 32·half + l.. of the 64 in `qh`; values 128·half + l + 32t.. (8 each,
                // t < 4) of this block's 256 in `y`.
                unsafe {
                    let a = u8x8(b.ql.as_ptr().add(64 * half + l));
                    let a32 = u8x8(b.ql.as_ptr().add(64 * half + l + 32));
                    let qh = u8x8(b.qh.as_ptr().add(32 * half + l));
                    let q = [
                        q6_quant(_mm256_and_si256(a, low), qh, 0),
                        q6_quant(_mm256_and_si256(a32, low), qh, 2),
                        q6_quant(_mm256_srli_epi32::<4>(a), qh, 4),
                        q6_quant(_mm256_srli_epi32::<4>(a32), qh, 6),
                    ];
                    for (t, q) in q.into_iter().enumerate() {
                        let d = _mm256_set1_ps(s[8 * half + c / 2 + 2 * t]);
                        _mm256_storeu_ps(yp.add(128 * half + l + 32 * t), _mm256_mul_ps(d, q));
                    }
                }
            }
        }
    }
}

pub(super) fn q6_k(blocks: &[BlockQ6K], out: &mut [f32]) {
    // SAFETY: avx2 was detected (see avx2::KERNELS).
    unsafe { q6_k_avx2(blocks, out) }
}

/// The 2-bit quants of 16-value sub-block `j` of a `Q2_K`/`Q3_K` super-block's `qs`, eight per
/// register (values `16 j..16 j + 8`, then the next eight).
#[target_feature(enable = "avx2")]
#[inline]
fn crumbs(qs: &[u8; QK_K / 4], j: usize) -> [__m256i; 2] {
    // Sub-block j: bytes 16 (j % 2).. of its 128-value half, bits 2 k of them (k = j % 8 / 2).
    let at = 32 * (j / 8) + 16 * (j % 2);
    let shift = _mm_cvtsi32_si128((2 * (j % 8 / 2)) as i32);
    let three = _mm256_set1_epi32(3);
    std::array::from_fn(|h| {
        // SAFETY: at + 8 h + 8 <= 64 bytes of `qs`.
        let q = unsafe { u8x8(qs[at + 8 * h..at + 8 * h + 8].as_ptr()) };
        _mm256_and_si256(_mm256_srl_epi32(q, shift), three)
    })
}

#[target_feature(enable = "avx2")]
fn q2_k_avx2(blocks: &[BlockQ2K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "256 values per block");
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let (d, min) = (b.d.to_f32(), b.dmin.to_f32());
        for (j, y) in y.chunks_exact_mut(16).enumerate() {
            let sc = b.scales[j];
            let dl = _mm256_set1_ps(d * f32::from(sc & 0x0F));
            let ml = _mm256_set1_ps(min * f32::from(sc >> 4));
            for (h, q) in crumbs(&b.qs, j).into_iter().enumerate() {
                let v = _mm256_sub_ps(_mm256_mul_ps(dl, _mm256_cvtepi32_ps(q)), ml);
                // SAFETY: values 8 h.. (8 of the sub-block's 16) of `y`.
                unsafe { _mm256_storeu_ps(y.as_mut_ptr().add(8 * h), v) };
            }
        }
    }
}

pub(super) fn q2_k(blocks: &[BlockQ2K], out: &mut [f32]) {
    // SAFETY: avx2 was detected (see avx2::KERNELS).
    unsafe { q2_k_avx2(blocks, out) }
}

#[target_feature(enable = "avx2")]
fn q3_k_avx2(blocks: &[BlockQ3K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "256 values per block");
    let (one, four) = (_mm256_set1_epi32(1), _mm256_set1_epi32(4));
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        for (j, y) in y.chunks_exact_mut(16).enumerate() {
            let dl = _mm256_set1_ps(d * b.scale(j) as f32);
            // The high bits: bit j / 2 of bytes 16 (j % 2)..; set, the offset 4 is not taken.
            let shift = _mm_cvtsi32_si128((j / 2) as i32);
            for (h, low) in crumbs(&b.qs, j).into_iter().enumerate() {
                let at = 16 * (j % 2) + 8 * h;
                // SAFETY: at + 8 <= 32 bytes of `hmask`; values 8 h.. (8 of 16) of `y`.
                unsafe {
                    let bits = u8x8(b.hmask[at..at + 8].as_ptr());
                    let bit = _mm256_and_si256(_mm256_srl_epi32(bits, shift), one);
                    let q =
                        _mm256_sub_epi32(_mm256_add_epi32(low, _mm256_slli_epi32::<2>(bit)), four);
                    let v = _mm256_mul_ps(dl, _mm256_cvtepi32_ps(q));
                    _mm256_storeu_ps(y.as_mut_ptr().add(8 * h), v);
                }
            }
        }
    }
}

pub(super) fn q3_k(blocks: &[BlockQ3K], out: &mut [f32]) {
    // SAFETY: avx2 was detected (see avx2::KERNELS).
    unsafe { q3_k_avx2(blocks, out) }
}

/// `scale · kvalues[q]` for the 32 indices of `qs` (an `IQ4_NL` block's layout) into `y`: the
/// table's halves looked up with `vpermps` each, the index's bit 3 choosing between them.
#[target_feature(enable = "avx2")]
#[inline]
fn iq4_values(qs: &[u8], kvalues: &[i8; 16], scale: f32, y: &mut [f32]) {
    assert!(qs.len() >= 16 && y.len() >= 32);
    let table = kvalues.map(f32::from);
    let (low, seven) = (_mm256_set1_epi32(0x0F), _mm256_set1_epi32(7));
    let d = _mm256_set1_ps(scale);
    // SAFETY: `table` holds 16 values, `qs` at least 16 bytes, `y` at least 32 values.
    unsafe {
        let (lo_half, hi_half) = (
            _mm256_loadu_ps(table.as_ptr()),
            _mm256_loadu_ps(table.as_ptr().add(8)),
        );
        for h in 0..2 {
            let q = u8x8(qs.as_ptr().add(8 * h));
            for (nib, idx) in [_mm256_and_si256(q, low), _mm256_srli_epi32::<4>(q)]
                .into_iter()
                .enumerate()
            {
                let i = _mm256_and_si256(idx, seven);
                let upper = _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx, seven));
                let v = _mm256_blendv_ps(
                    _mm256_permutevar8x32_ps(lo_half, i),
                    _mm256_permutevar8x32_ps(hi_half, i),
                    upper,
                );
                _mm256_storeu_ps(y.as_mut_ptr().add(16 * nib + 8 * h), _mm256_mul_ps(d, v));
            }
        }
    }
}

#[target_feature(enable = "avx2")]
fn iq4_nl_avx2(blocks: &[BlockIQ4NL], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32, "32 values per block");
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        iq4_values(&b.qs, &KVALUES_IQ4NL, b.d.to_f32(), y);
    }
}

pub(super) fn iq4_nl(blocks: &[BlockIQ4NL], out: &mut [f32]) {
    // SAFETY: avx2 was detected (see avx2::KERNELS).
    unsafe { iq4_nl_avx2(blocks, out) }
}

#[target_feature(enable = "avx2")]
fn iq4_xs_avx2(blocks: &[BlockIQ4XS], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "256 values per block");
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        for (j, (y, qs)) in y
            .chunks_exact_mut(32)
            .zip(b.qs.chunks_exact(16))
            .enumerate()
        {
            iq4_values(qs, &KVALUES_IQ4NL, b.sub_scale(j), y);
        }
    }
}

pub(super) fn iq4_xs(blocks: &[BlockIQ4XS], out: &mut [f32]) {
    // SAFETY: avx2 was detected (see avx2::KERNELS).
    unsafe { iq4_xs_avx2(blocks, out) }
}

#[target_feature(enable = "avx2")]
fn mxfp4_avx2(blocks: &[BlockMXFP4], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32, "32 values per block");
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        iq4_values(&b.qs, &KVALUES_MXFP4, e8m0_to_f32_half(b.e), y);
    }
}

pub(super) fn mxfp4(blocks: &[BlockMXFP4], out: &mut [f32]) {
    // SAFETY: avx2 was detected (see avx2::KERNELS).
    unsafe { mxfp4_avx2(blocks, out) }
}
