//! AVX-512 F dequantizers of f16, `Q4_0`, `Q5_0`, `Q5_1`, the K-quants (`Q2_K` to `Q6_K`) and
//! the IQ4 formats, for the level's `Dequant` table (see `avx512.rs`).
//!
//! Each writes the portable reference's values bit for bit: the products are exact (see
//! `cpu::weights`), so a fused `q·d − m` rounds like the reference's multiply-then-subtract,
//! and the K-quants' sub-block scales are widened and multiplied by the super-block scale
//! sixteen at a time, as the reference does one at a time. Only AVX-512 F instructions are
//! used (no BW), as that is all the level detects.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use half::f16;

use crate::quant::{
    BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4K, BlockQ5_0,
    BlockQ5_1, BlockQ5K, BlockQ6K, KVALUES_IQ4NL, KVALUES_MXFP4, QK_K, e8m0_to_f32_half,
    scales_mins_k4,
};

/// Sixteen bytes at `p`, zero-extended to 32-bit lanes.
///
/// # Safety
/// `p` must be readable for 16 bytes.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn u8x16(p: *const u8) -> __m512i {
    // SAFETY: the caller guarantees 16 readable bytes.
    unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast::<__m128i>())) }
}

#[target_feature(enable = "avx512f")]
fn f16_avx512(src: &[f16], out: &mut [f32]) {
    assert_eq!(out.len(), src.len(), "one value per f16");
    let n = src.len();
    let full = n - n % 16;
    let (sp, op) = (src.as_ptr(), out.as_mut_ptr());
    // SAFETY: every load reads 16 values below `full <= n` of `src`, every store 16 of `out`.
    unsafe {
        let mut i = 0;
        while i < full {
            let v = _mm512_cvtph_ps(_mm256_loadu_si256(sp.add(i).cast::<__m256i>()));
            _mm512_storeu_ps(op.add(i), v);
            i += 16;
        }
    }
    crate::cpu::weights::f16_to_f32_ref(&src[full..], &mut out[full..]);
}

pub(super) fn f16(src: &[f16], out: &mut [f32]) {
    // SAFETY: avx512f was detected (see avx512::KERNELS).
    unsafe { f16_avx512(src, out) }
}

#[target_feature(enable = "avx512f")]
fn q4_0_avx512(blocks: &[BlockQ4_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32, "32 values per block");
    let op = out.as_mut_ptr();
    let (low, eight) = (_mm512_set1_epi32(0x0F), _mm512_set1_epi32(8));
    for (i, b) in blocks.iter().enumerate() {
        let d = _mm512_set1_ps(b.d.to_f32());
        // SAFETY: `qs` holds 16 bytes; `out` holds 32 values at i * 32.
        unsafe {
            let q = u8x16(b.qs.as_ptr());
            let lo = _mm512_sub_epi32(_mm512_and_si512(q, low), eight);
            let hi = _mm512_sub_epi32(_mm512_srli_epi32::<4>(q), eight);
            _mm512_storeu_ps(op.add(i * 32), _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d));
            _mm512_storeu_ps(
                op.add(i * 32 + 16),
                _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d),
            );
        }
    }
}

pub(super) fn q4_0(blocks: &[BlockQ4_0], out: &mut [f32]) {
    // SAFETY: avx512f was detected (see avx512::KERNELS).
    unsafe { q4_0_avx512(blocks, out) }
}

/// A `Q5_0`/`Q5_1` block's unsigned 5-bit quants: values `0..16`, then `16..32`.
#[target_feature(enable = "avx512f")]
#[inline]
fn q5_quants(qs: &[u8; 16], qh: [u8; 4]) -> [__m512i; 2] {
    let high = u32::from_le_bytes(qh);
    let (low, sixteen) = (_mm512_set1_epi32(0x0F), _mm512_set1_epi32(16));
    // SAFETY: `qs` holds 16 bytes.
    let q = unsafe { u8x16(qs.as_ptr()) };
    let (lo, hi) = (_mm512_and_si512(q, low), _mm512_srli_epi32::<4>(q));
    [
        _mm512_mask_add_epi32(lo, high as u16, lo, sixteen),
        _mm512_mask_add_epi32(hi, (high >> 16) as u16, hi, sixteen),
    ]
}

#[target_feature(enable = "avx512f")]
fn q5_0_avx512(blocks: &[BlockQ5_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32, "32 values per block");
    let sixteen = _mm512_set1_epi32(16);
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let d = _mm512_set1_ps(b.d.to_f32());
        for (half, q) in q5_quants(&b.qs, b.qh).into_iter().enumerate() {
            let v = _mm512_cvtepi32_ps(_mm512_sub_epi32(q, sixteen));
            // SAFETY: values 16 · half.. (16 of the block's 32) of `y`.
            unsafe { _mm512_storeu_ps(y.as_mut_ptr().add(16 * half), _mm512_mul_ps(v, d)) };
        }
    }
}

pub(super) fn q5_0(blocks: &[BlockQ5_0], out: &mut [f32]) {
    // SAFETY: avx512f was detected (see avx512::KERNELS).
    unsafe { q5_0_avx512(blocks, out) }
}

#[target_feature(enable = "avx512f")]
fn q5_1_avx512(blocks: &[BlockQ5_1], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32, "32 values per block");
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let (d, m) = (_mm512_set1_ps(b.d.to_f32()), _mm512_set1_ps(b.m.to_f32()));
        for (half, q) in q5_quants(&b.qs, b.qh).into_iter().enumerate() {
            let v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), d, m);
            // SAFETY: values 16 · half.. (16 of the block's 32) of `y`.
            unsafe { _mm512_storeu_ps(y.as_mut_ptr().add(16 * half), v) };
        }
    }
}

pub(super) fn q5_1(blocks: &[BlockQ5_1], out: &mut [f32]) {
    // SAFETY: avx512f was detected (see avx512::KERNELS).
    unsafe { q5_1_avx512(blocks, out) }
}

/// The 2-bit quants of 16-value sub-block `j` of a `Q2_K`/`Q3_K` super-block's `qs`, one per
/// 32-bit lane.
#[target_feature(enable = "avx512f")]
#[inline]
fn crumbs(qs: &[u8; QK_K / 4], j: usize) -> __m512i {
    // Sub-block j: bytes 16 j.. of its 128-value half, bits 2 k of them (k = j % 8 / 2).
    let at = 32 * (j / 8) + 16 * (j % 2);
    let shift = _mm_cvtsi32_si128((2 * (j % 8 / 2)) as i32);
    // SAFETY: at + 16 <= 64 bytes of `qs`.
    let q = unsafe { u8x16(qs[at..at + 16].as_ptr()) };
    _mm512_and_si512(_mm512_srl_epi32(q, shift), _mm512_set1_epi32(3))
}

#[target_feature(enable = "avx512f")]
fn q2_k_avx512(blocks: &[BlockQ2K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "256 values per block");
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let (d, min) = (b.d.to_f32(), b.dmin.to_f32());
        for (j, y) in y.chunks_exact_mut(16).enumerate() {
            let sc = b.scales[j];
            let dl = _mm512_set1_ps(d * f32::from(sc & 0x0F));
            let ml = _mm512_set1_ps(min * f32::from(sc >> 4));
            let v = _mm512_sub_ps(_mm512_mul_ps(dl, _mm512_cvtepi32_ps(crumbs(&b.qs, j))), ml);
            // SAFETY: `y` holds 16 values.
            unsafe { _mm512_storeu_ps(y.as_mut_ptr(), v) };
        }
    }
}

pub(super) fn q2_k(blocks: &[BlockQ2K], out: &mut [f32]) {
    // SAFETY: avx512f was detected (see avx512::KERNELS).
    unsafe { q2_k_avx512(blocks, out) }
}

#[target_feature(enable = "avx512f")]
fn q3_k_avx512(blocks: &[BlockQ3K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "256 values per block");
    let (one, four) = (_mm512_set1_epi32(1), _mm512_set1_epi32(4));
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        for (j, y) in y.chunks_exact_mut(16).enumerate() {
            let dl = _mm512_set1_ps(d * b.scale(j) as f32);
            // The high bits: bit j / 2 of bytes 16 (j % 2)..; set, the offset 4 is not taken.
            let at = 16 * (j % 2);
            // SAFETY: at + 16 <= 32 bytes of `hmask`; `y` holds 16 values.
            unsafe {
                let h = u8x16(b.hmask[at..at + 16].as_ptr());
                let shift = _mm_cvtsi32_si128((j / 2) as i32);
                let bit = _mm512_and_si512(_mm512_srl_epi32(h, shift), one);
                let q = _mm512_sub_epi32(
                    _mm512_add_epi32(crumbs(&b.qs, j), _mm512_slli_epi32::<2>(bit)),
                    four,
                );
                _mm512_storeu_ps(y.as_mut_ptr(), _mm512_mul_ps(dl, _mm512_cvtepi32_ps(q)));
            }
        }
    }
}

pub(super) fn q3_k(blocks: &[BlockQ3K], out: &mut [f32]) {
    // SAFETY: avx512f was detected (see avx512::KERNELS).
    unsafe { q3_k_avx512(blocks, out) }
}

/// `scale · kvalues[q]` for the 32 indices of `qs` (an `IQ4_NL` block's layout) into `y`.
#[target_feature(enable = "avx512f")]
#[inline]
fn iq4_values(qs: &[u8], kvalues: &[i8; 16], scale: f32, y: &mut [f32]) {
    assert!(qs.len() >= 16 && y.len() >= 32);
    let table = kvalues.map(f32::from);
    let low = _mm512_set1_epi32(0x0F);
    let d = _mm512_set1_ps(scale);
    // SAFETY: `table` holds 16 values, `qs` at least 16 bytes, `y` at least 32 values.
    unsafe {
        let table = _mm512_loadu_ps(table.as_ptr());
        let q = u8x16(qs.as_ptr());
        for (half, idx) in [_mm512_and_si512(q, low), _mm512_srli_epi32::<4>(q)]
            .into_iter()
            .enumerate()
        {
            let v = _mm512_permutexvar_ps(idx, table);
            _mm512_storeu_ps(y.as_mut_ptr().add(16 * half), _mm512_mul_ps(d, v));
        }
    }
}

#[target_feature(enable = "avx512f")]
fn iq4_nl_avx512(blocks: &[BlockIQ4NL], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32, "32 values per block");
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        iq4_values(&b.qs, &KVALUES_IQ4NL, b.d.to_f32(), y);
    }
}

pub(super) fn iq4_nl(blocks: &[BlockIQ4NL], out: &mut [f32]) {
    // SAFETY: avx512f was detected (see avx512::KERNELS).
    unsafe { iq4_nl_avx512(blocks, out) }
}

#[target_feature(enable = "avx512f")]
fn iq4_xs_avx512(blocks: &[BlockIQ4XS], out: &mut [f32]) {
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
    // SAFETY: avx512f was detected (see avx512::KERNELS).
    unsafe { iq4_xs_avx512(blocks, out) }
}

#[target_feature(enable = "avx512f")]
fn mxfp4_avx512(blocks: &[BlockMXFP4], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32, "32 values per block");
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        iq4_values(&b.qs, &KVALUES_MXFP4, e8m0_to_f32_half(b.e), y);
    }
}

pub(super) fn mxfp4(blocks: &[BlockMXFP4], out: &mut [f32]) {
    // SAFETY: avx512f was detected (see avx512::KERNELS).
    unsafe { mxfp4_avx512(blocks, out) }
}

/// A `Q4_K`/`Q5_K` block's eight effective scales `d·sc[j]` (lanes 0..8) and minimums
/// `dmin·m[j]` (lanes 8..16).
#[target_feature(enable = "avx512f")]
#[inline]
fn k4_scales(d: f16, dmin: f16, scales: &[u8; 12]) -> [f32; 16] {
    let packed = scales_mins_k4(scales);
    let supers = _mm512_mask_blend_ps(
        0xFF00,
        _mm512_set1_ps(d.to_f32()),
        _mm512_set1_ps(dmin.to_f32()),
    );
    let mut out = [0f32; 16];
    // SAFETY: `packed` holds 16 bytes, `out` 16 values.
    unsafe {
        let v = _mm512_cvtepi32_ps(u8x16(packed.as_ptr()));
        _mm512_storeu_ps(out.as_mut_ptr(), _mm512_mul_ps(v, supers));
    }
    out
}

#[target_feature(enable = "avx512f")]
fn q4_k_avx512(blocks: &[BlockQ4K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "256 values per block");
    let low = _mm512_set1_epi32(0x0F);
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let s = k4_scales(b.d, b.dmin, &b.scales);
        let yp = y.as_mut_ptr();
        // Group g: bytes 32g.. of `qs`; low nibbles are sub-block 2g, high ones 2g + 1.
        for g in 0..4 {
            let (d1, m1) = (_mm512_set1_ps(s[2 * g]), _mm512_set1_ps(s[8 + 2 * g]));
            let (d2, m2) = (_mm512_set1_ps(s[2 * g + 1]), _mm512_set1_ps(s[9 + 2 * g]));
            for h in 0..2 {
                // SAFETY: bytes 32g + 16h.. (16 of the 128 in `qs`); values 64g + 16h.. and
                // 64g + 32 + 16h.. (16 each) of this block's 256 in `y`.
                unsafe {
                    let q = u8x16(b.qs.as_ptr().add(32 * g + 16 * h));
                    let lo = _mm512_cvtepi32_ps(_mm512_and_si512(q, low));
                    let hi = _mm512_cvtepi32_ps(_mm512_srli_epi32::<4>(q));
                    _mm512_storeu_ps(yp.add(64 * g + 16 * h), _mm512_fmsub_ps(lo, d1, m1));
                    _mm512_storeu_ps(yp.add(64 * g + 32 + 16 * h), _mm512_fmsub_ps(hi, d2, m2));
                }
            }
        }
    }
}

pub(super) fn q4_k(blocks: &[BlockQ4K], out: &mut [f32]) {
    // SAFETY: avx512f was detected (see avx512::KERNELS).
    unsafe { q4_k_avx512(blocks, out) }
}

#[target_feature(enable = "avx512f")]
fn q5_k_avx512(blocks: &[BlockQ5K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "256 values per block");
    let (low, one) = (_mm512_set1_epi32(0x0F), _mm512_set1_epi32(1));
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let s = k4_scales(b.d, b.dmin, &b.scales);
        let yp = y.as_mut_ptr();
        // SAFETY: `qh` holds 32 bytes.
        let qh = unsafe { [u8x16(b.qh.as_ptr()), u8x16(b.qh.as_ptr().add(16))] };
        for g in 0..4 {
            let (d1, m1) = (_mm512_set1_ps(s[2 * g]), _mm512_set1_ps(s[8 + 2 * g]));
            let (d2, m2) = (_mm512_set1_ps(s[2 * g + 1]), _mm512_set1_ps(s[9 + 2 * g]));
            // Bit 2g of `qh[l]` is the fifth bit of value 64g + l, bit 2g + 1 of 64g + 32 + l.
            let (sh1, sh2) = (
                _mm_cvtsi32_si128(2 * g as i32),
                _mm_cvtsi32_si128(2 * g as i32 + 1),
            );
            for (h, qh) in qh.iter().enumerate() {
                let h1 = _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srl_epi32(*qh, sh1), one));
                let h2 = _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srl_epi32(*qh, sh2), one));
                // SAFETY: bytes 32g + 16h.. (16 of the 128 in `qs`); values 64g + 16h.. and
                // 64g + 32 + 16h.. (16 each) of this block's 256 in `y`.
                unsafe {
                    let q = u8x16(b.qs.as_ptr().add(32 * g + 16 * h));
                    let lo = _mm512_or_si512(_mm512_and_si512(q, low), h1);
                    let hi = _mm512_or_si512(_mm512_srli_epi32::<4>(q), h2);
                    let (lo, hi) = (_mm512_cvtepi32_ps(lo), _mm512_cvtepi32_ps(hi));
                    _mm512_storeu_ps(yp.add(64 * g + 16 * h), _mm512_fmsub_ps(lo, d1, m1));
                    _mm512_storeu_ps(yp.add(64 * g + 32 + 16 * h), _mm512_fmsub_ps(hi, d2, m2));
                }
            }
        }
    }
}

pub(super) fn q5_k(blocks: &[BlockQ5K], out: &mut [f32]) {
    // SAFETY: avx512f was detected (see avx512::KERNELS).
    unsafe { q5_k_avx512(blocks, out) }
}

/// A `Q6_K` quant: 4 low bits `ql` and the 2 high bits `(qh >> shift) & 3`, minus 32.
#[target_feature(enable = "avx512f")]
#[inline]
fn q6_quant(ql: __m512i, qh: __m512i, shift: i32) -> __m512 {
    let bits = _mm512_and_si512(
        _mm512_srl_epi32(qh, _mm_cvtsi32_si128(shift)),
        _mm512_set1_epi32(3),
    );
    let q = _mm512_or_si512(ql, _mm512_slli_epi32::<4>(bits));
    _mm512_cvtepi32_ps(_mm512_sub_epi32(q, _mm512_set1_epi32(32)))
}

#[target_feature(enable = "avx512f")]
fn q6_k_avx512(blocks: &[BlockQ6K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "256 values per block");
    let low = _mm512_set1_epi32(0x0F);
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        // Effective sub-block scales d·sc[j], sixteen at once.
        let mut s = [0f32; 16];
        // SAFETY: `scales` holds 16 bytes, `s` 16 values.
        unsafe {
            let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.scales.as_ptr().cast::<__m128i>()));
            let v = _mm512_mul_ps(_mm512_set1_ps(b.d.to_f32()), _mm512_cvtepi32_ps(sc));
            _mm512_storeu_ps(s.as_mut_ptr(), v);
        }
        let yp = y.as_mut_ptr();
        // Halves of 128 values; in each, the 16-value chunk c (l = 16c..) feeds values l,
        // l + 32, l + 64 and l + 96, with scales c, c + 2, c + 4 and c + 6 of the half's 8.
        for half in 0..2 {
            for c in 0..2 {
                let l = 16 * c;
                // SAFETY: bytes 64·half + l.. and 64·half + l + 32.. (16 each) of the 128 in
                // `ql`, 32·half + l.. of the 64 in `qh`; values 128·half + l + 32t.. (16 each,
                // t < 4) of this block's 256 in `y`.
                unsafe {
                    let a = u8x16(b.ql.as_ptr().add(64 * half + l));
                    let a32 = u8x16(b.ql.as_ptr().add(64 * half + l + 32));
                    let qh = u8x16(b.qh.as_ptr().add(32 * half + l));
                    let q = [
                        q6_quant(_mm512_and_si512(a, low), qh, 0),
                        q6_quant(_mm512_and_si512(a32, low), qh, 2),
                        q6_quant(_mm512_srli_epi32::<4>(a), qh, 4),
                        q6_quant(_mm512_srli_epi32::<4>(a32), qh, 6),
                    ];
                    for (t, q) in q.into_iter().enumerate() {
                        let d = _mm512_set1_ps(s[8 * half + c + 2 * t]);
                        _mm512_storeu_ps(yp.add(128 * half + l + 32 * t), _mm512_mul_ps(d, q));
                    }
                }
            }
        }
    }
}

pub(super) fn q6_k(blocks: &[BlockQ6K], out: &mut [f32]) {
    // SAFETY: avx512f was detected (see avx512::KERNELS).
    unsafe { q6_k_avx512(blocks, out) }
}
