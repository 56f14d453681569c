//! Round-trip and error tests; exact agreement with gguf-py is in `tests/quant_goldens.rs`.

use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

fn random_values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect()
}

fn nearest(x: f32, lo: i32, hi: i32) -> i32 {
    (x.round() as i32).clamp(lo, hi)
}

/// The index of the table value nearest to `x / d`.
fn nearest_iq4(x: f32, d: f32) -> u8 {
    let err = |i: usize| (f32::from(KVALUES_IQ4NL[i]) * d - x).abs();
    (0..16)
        .min_by(|&a, &b| err(a).total_cmp(&err(b)))
        .unwrap_or(0) as u8
}

/// Simple (not ggml's optimal) quantizers, enough to check that dequantization inverts
/// quantization within half a quantization step.
fn quantize(format: QuantFormat, x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in x.chunks_exact(format.block_elements()) {
        match format {
            QuantFormat::Q8_0 => quantize_q8_0(b, &mut out),
            QuantFormat::Q4_0 => quantize_q4_0(b, &mut out),
            QuantFormat::Q4_1 => quantize_q4_1(b, &mut out),
            QuantFormat::Q5_0 | QuantFormat::Q5_1 => quantize_q5(format, b, &mut out),
            QuantFormat::Q4K | QuantFormat::Q5K => quantize_q4_k_q5_k(format, b, &mut out),
            QuantFormat::Q2K => quantize_q2_k(b, &mut out),
            QuantFormat::Q3K => quantize_q3_k(b, &mut out),
            QuantFormat::IQ4NL => quantize_iq4_nl(b, &mut out),
            QuantFormat::IQ4XS => quantize_iq4_xs(b, &mut out),
            QuantFormat::MXFP4 => quantize_mxfp4(b, &mut out),
            QuantFormat::Q6K => quantize_q6_k(b, &mut out),
        }
    }
    out
}

/// Appends one `Q8_0` block of the values `b`.
fn quantize_q8_0(b: &[f32], out: &mut Vec<u8>) {
    let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = f16::from_f32(amax / 127.0);
    let id = 1.0 / d.to_f32();
    let block = BlockQ8_0 {
        d,
        qs: std::array::from_fn(|i| nearest(b[i] * id, -127, 127) as i8),
    };
    out.extend_from_slice(bytemuck::bytes_of(&block));
}

/// Appends one `Q4_0` block of the values `b`.
fn quantize_q4_0(b: &[f32], out: &mut Vec<u8>) {
    let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = f16::from_f32(amax / 7.0);
    let id = 1.0 / d.to_f32();
    let q = |v: f32| (nearest(v * id, -8, 7) + 8) as u8;
    let block = BlockQ4_0 {
        d,
        qs: std::array::from_fn(|j| q(b[j]) | q(b[j + 16]) << 4),
    };
    out.extend_from_slice(bytemuck::bytes_of(&block));
}

/// Appends one `Q4_1` block of the values `b`.
fn quantize_q4_1(b: &[f32], out: &mut Vec<u8>) {
    let min = b.iter().copied().fold(f32::INFINITY, f32::min);
    let max = b.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let (d, m) = (f16::from_f32((max - min) / 15.0), f16::from_f32(min));
    let id = 1.0 / d.to_f32();
    let q = |v: f32| nearest((v - m.to_f32()) * id, 0, 15) as u8;
    let block = BlockQ4_1 {
        d,
        m,
        qs: std::array::from_fn(|j| q(b[j]) | q(b[j + 16]) << 4),
    };
    out.extend_from_slice(bytemuck::bytes_of(&block));
}

/// Appends one `Q5_0` or `Q5_1` (`format`) block of the values `b`.
fn quantize_q5(format: QuantFormat, b: &[f32], out: &mut Vec<u8>) {
    let (d, m, q) = if format == QuantFormat::Q5_0 {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = f16::from_f32(amax / 15.0);
        let id = 1.0 / d.to_f32();
        let q: Vec<u8> = b
            .iter()
            .map(|&v| (nearest(v * id, -16, 15) + 16) as u8)
            .collect();
        (d, None, q)
    } else {
        let min = b.iter().copied().fold(f32::INFINITY, f32::min);
        let max = b.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let (d, m) = (f16::from_f32((max - min) / 31.0), f16::from_f32(min));
        let id = 1.0 / d.to_f32();
        let q: Vec<u8> = b
            .iter()
            .map(|&v| nearest((v - m.to_f32()) * id, 0, 31) as u8)
            .collect();
        (d, Some(m), q)
    };
    let qs = std::array::from_fn(|j| (q[j] & 0x0F) | (q[j + 16] & 0x0F) << 4);
    let qh = q
        .iter()
        .enumerate()
        .fold(0u32, |h, (e, &v)| h | u32::from(v >> 4) << e)
        .to_le_bytes();
    match m {
        None => out.extend_from_slice(bytemuck::bytes_of(&BlockQ5_0 { d, qh, qs })),
        Some(m) => out.extend_from_slice(bytemuck::bytes_of(&BlockQ5_1 { d, m, qh, qs })),
    }
}

/// Appends one `Q4_K` or `Q5_K` (`format`) block of the values `b`.
fn quantize_q4_k_q5_k(format: QuantFormat, b: &[f32], out: &mut Vec<u8>) {
    let levels = if format == QuantFormat::Q4K { 15 } else { 31 };
    // Per 32-value sub-block: scale and (negated) minimum, quantized to 6 bits
    // against super-block scales.
    let subs: Vec<(f32, f32)> = b
        .chunks_exact(32)
        .map(|s| {
            let min = s.iter().copied().fold(f32::INFINITY, f32::min).min(0.0);
            let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            ((max - min) / levels as f32, -min)
        })
        .collect();
    let max_scale = subs.iter().fold(0f32, |m, s| m.max(s.0));
    let max_min = subs.iter().fold(0f32, |m, s| m.max(s.1));
    let d = f16::from_f32(max_scale / 63.0);
    let dmin = f16::from_f32(max_min / 63.0);
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for (j, &(s, m)) in subs.iter().enumerate() {
        sc[j] = nearest(s / d.to_f32(), 0, 63) as u8;
        mn[j] = nearest(m / dmin.to_f32(), 0, 63) as u8;
    }
    let mut scales = [0u8; 12];
    for j in 0..4 {
        scales[j] = sc[j] | (sc[j + 4] >> 4) << 6;
        scales[j + 4] = mn[j] | (mn[j + 4] >> 4) << 6;
        scales[j + 8] = (sc[j + 4] & 0x0F) | (mn[j + 4] & 0x0F) << 4;
    }
    let mut q = [0u8; QK_K];
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, &scales);
        let (d1, m1) = (d.to_f32() * f32::from(sc), dmin.to_f32() * f32::from(m));
        for l in 0..32 {
            let v = b[32 * j + l];
            q[32 * j + l] = if d1 > 0.0 {
                nearest((v + m1) / d1, 0, levels) as u8
            } else {
                0
            };
        }
    }
    let mut qs = [0u8; QK_K / 2];
    let mut qh = [0u8; QK_K / 8];
    for g in 0..4 {
        for l in 0..32 {
            let (a, c) = (q[64 * g + l], q[64 * g + 32 + l]);
            qs[32 * g + l] = (a & 0x0F) | (c & 0x0F) << 4;
            qh[l] |= (a >> 4) << (2 * g) | (c >> 4) << (2 * g + 1);
        }
    }
    if format == QuantFormat::Q4K {
        let block = BlockQ4K {
            d,
            dmin,
            scales,
            qs,
        };
        out.extend_from_slice(bytemuck::bytes_of(&block));
    } else {
        let block = BlockQ5K {
            d,
            dmin,
            scales,
            qh,
            qs,
        };
        out.extend_from_slice(bytemuck::bytes_of(&block));
    }
}

/// Appends one `Q2_K` block of the values `b`.
fn quantize_q2_k(b: &[f32], out: &mut Vec<u8>) {
    // Per 16 values: a scale and a (negated) minimum, as 4-bit multiples of d, dmin.
    let subs: Vec<(f32, f32)> = b
        .chunks_exact(16)
        .map(|s| {
            let min = s.iter().copied().fold(0f32, f32::min);
            let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            ((max - min) / 3.0, -min)
        })
        .collect();
    let d = f16::from_f32(subs.iter().fold(0f32, |m, s| m.max(s.0)) / 15.0);
    let dmin = f16::from_f32(subs.iter().fold(0f32, |m, s| m.max(s.1)) / 15.0);
    let mut block = BlockQ2K {
        scales: [0; 16],
        qs: [0; QK_K / 4],
        d,
        dmin,
    };
    for (j, (&(sd, sm), x)) in subs.iter().zip(b.chunks_exact(16)).enumerate() {
        let sc = nearest(sd / d.to_f32(), 0, 15);
        let m = nearest(sm / dmin.to_f32(), 0, 15);
        block.scales[j] = (sc | m << 4) as u8;
        let (dl, ml) = (d.to_f32() * sc as f32, dmin.to_f32() * m as f32);
        for (l, &v) in x.iter().enumerate() {
            let q = if dl > 0.0 {
                nearest((v + ml) / dl, 0, 3)
            } else {
                0
            };
            let e = 16 * j + l;
            block.qs[32 * (e / 128) + e % 32] |= (q as u8) << (2 * (e % 128 / 32));
        }
    }
    out.extend_from_slice(bytemuck::bytes_of(&block));
}

/// Appends one `Q3_K` block of the values `b`.
fn quantize_q3_k(b: &[f32], out: &mut Vec<u8>) {
    // Per 16 values: a signed 6-bit multiple of d.
    let subs: Vec<f32> = b
        .chunks_exact(16)
        .map(|s| s.iter().fold(0f32, |m, v| m.max(v.abs())) / 4.0)
        .collect();
    let d = f16::from_f32(subs.iter().fold(0f32, |m, &v| m.max(v)) / 31.0);
    let mut block = BlockQ3K {
        hmask: [0; QK_K / 8],
        qs: [0; QK_K / 4],
        scales: [0; 12],
        d,
    };
    for (j, (&s, x)) in subs.iter().zip(b.chunks_exact(16)).enumerate() {
        let sc = nearest(s / d.to_f32(), -32, 31);
        let v = (sc + 32) as u8;
        block.scales[j % 8] |= (v & 0x0F) << (4 * (j / 8));
        block.scales[8 + j % 4] |= (v >> 4) << (2 * (j / 4));
        let dl = d.to_f32() * sc as f32;
        for (l, &x) in x.iter().enumerate() {
            let q = if dl != 0.0 { nearest(x / dl, -4, 3) } else { 0 };
            let (u, e) = ((q + 4) as u8, 16 * j + l);
            block.qs[32 * (e / 128) + e % 32] |= (u & 3) << (2 * (e % 128 / 32));
            block.hmask[e % 32] |= (u >> 2) << (e / 32);
        }
    }
    out.extend_from_slice(bytemuck::bytes_of(&block));
}

/// Appends one `IQ4_NL` block of the values `b`.
fn quantize_iq4_nl(b: &[f32], out: &mut Vec<u8>) {
    let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = f16::from_f32(amax / 127.0);
    let block = BlockIQ4NL {
        d,
        qs: std::array::from_fn(|j| {
            nearest_iq4(b[j], d.to_f32()) | nearest_iq4(b[j + 16], d.to_f32()) << 4
        }),
    };
    out.extend_from_slice(bytemuck::bytes_of(&block));
}

/// Appends one `IQ4_XS` block of the values `b`.
fn quantize_iq4_xs(b: &[f32], out: &mut Vec<u8>) {
    let subs: Vec<f32> = b
        .chunks_exact(32)
        .map(|s| s.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0)
        .collect();
    let d = f16::from_f32(subs.iter().fold(0f32, |m, &v| m.max(v)) / 31.0);
    let mut block = BlockIQ4XS {
        d,
        scales_h: 0,
        scales_l: [0; 4],
        qs: [0; QK_K / 2],
    };
    for (j, (&s, x)) in subs.iter().zip(b.chunks_exact(32)).enumerate() {
        let ls = nearest(s / d.to_f32(), -32, 31) + 32;
        block.scales_l[j / 2] |= ((ls & 0x0F) as u8) << (4 * (j % 2));
        block.scales_h |= ((ls >> 4) as u16) << (2 * j);
        let dl = block.sub_scale(j);
        for l in 0..16 {
            block.qs[16 * j + l] = nearest_iq4(x[l], dl) | nearest_iq4(x[l + 16], dl) << 4;
        }
    }
    out.extend_from_slice(bytemuck::bytes_of(&block));
}

/// Appends one `MXFP4` block of the values `b`: the scale puts the largest magnitude at or
/// below the table's largest value, 6.
fn quantize_mxfp4(b: &[f32], out: &mut Vec<u8>) {
    let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let e = if amax > 0.0 {
        (amax / 6.0).log2().ceil() as i32 + 127
    } else {
        0
    };
    let d = e8m0_to_f32_half(e.clamp(0, 254) as u8);
    let nearest = |x: f32| {
        let err = |i: usize| (f32::from(KVALUES_MXFP4[i]) * d - x).abs();
        (0..16)
            .min_by(|&a, &b| err(a).total_cmp(&err(b)))
            .unwrap_or(0) as u8
    };
    let block = BlockMXFP4 {
        e: e.clamp(0, 254) as u8,
        qs: std::array::from_fn(|j| nearest(b[j]) | nearest(b[j + 16]) << 4),
    };
    out.extend_from_slice(bytemuck::bytes_of(&block));
}

/// Appends one `Q6_K` block of the values `b`.
fn quantize_q6_k(b: &[f32], out: &mut Vec<u8>) {
    let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = f16::from_f32(amax / 31.0 / 127.0);
    let mut scales = [0i8; 16];
    let mut q = [0u8; QK_K];
    for (s, sub) in b.chunks_exact(16).enumerate() {
        let samax = sub.iter().fold(0f32, |m, v| m.max(v.abs()));
        scales[s] = nearest(samax / 31.0 / d.to_f32(), -128, 127) as i8;
        let step = d.to_f32() * f32::from(scales[s]);
        for (l, &v) in sub.iter().enumerate() {
            let qv = if step > 0.0 {
                nearest(v / step, -32, 31)
            } else {
                0
            };
            q[16 * s + l] = (qv + 32) as u8;
        }
    }
    let mut ql = [0u8; QK_K / 2];
    let mut qh = [0u8; QK_K / 4];
    for h in 0..2 {
        for l in 0..32 {
            let at = |k: usize| q[128 * h + 32 * k + l];
            ql[64 * h + l] = (at(0) & 0x0F) | (at(2) & 0x0F) << 4;
            ql[64 * h + l + 32] = (at(1) & 0x0F) | (at(3) & 0x0F) << 4;
            qh[32 * h + l] = at(0) >> 4 | (at(1) >> 4) << 2 | (at(2) >> 4) << 4 | (at(3) >> 4) << 6;
        }
    }
    let block = BlockQ6K { ql, qh, scales, d };
    out.extend_from_slice(bytemuck::bytes_of(&block));
}

#[test]
fn quantize_then_dequantize_round_trips() {
    // Worst-case error relative to the block's range, per format (a loose bound on half a
    // step plus scale rounding for these simple quantizers).
    let tolerance = |f: QuantFormat| match f {
        QuantFormat::Q8_0 => 0.01,
        QuantFormat::Q6K => 0.04,
        QuantFormat::Q3K => 0.15,
        QuantFormat::Q2K => 0.25,
        // The table's widest gap is 24 of 240.
        QuantFormat::IQ4NL | QuantFormat::IQ4XS => 0.12,
        // E2M1's widest gap is 2 of 6, against the block's range up to 2 · 6.
        QuantFormat::MXFP4 => 0.17,
        QuantFormat::Q5K | QuantFormat::Q5_0 | QuantFormat::Q5_1 => 0.05,
        QuantFormat::Q4_0 | QuantFormat::Q4_1 | QuantFormat::Q4K => 0.1,
    };
    for format in QuantFormat::ALL {
        let x = random_values(format.block_elements() * 8, 7);
        let bytes = quantize(format, &x);
        assert_eq!(bytes.len(), 8 * format.block_bytes());
        let mut y = vec![0.0; x.len()];
        dequantize(format, &bytes, &mut y).unwrap();
        let worst = x
            .iter()
            .zip(&y)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            worst <= tolerance(format) * 4.0,
            "{format}: worst error {worst}"
        );
    }
}

#[test]
fn block_sizes_match_ggml() {
    let expected = [
        (32, 34),
        (32, 18),
        (32, 20),
        (32, 22),
        (32, 24),
        (256, 144),
        (256, 176),
        (256, 210),
        (32, 18),
        (256, 136),
        (256, 84),
        (256, 110),
    ];
    for (format, (elements, bytes)) in QuantFormat::ALL.into_iter().zip(expected) {
        assert_eq!(format.block_elements(), elements, "{format}");
        assert_eq!(format.block_bytes(), bytes, "{format}");
        assert_eq!(QuantFormat::from_name(format.name()), Some(format));
    }
}

#[test]
fn length_mismatches_are_errors() {
    let mut out = vec![0.0; 32];
    let err = dequantize(QuantFormat::Q4_0, &[0u8; 17], &mut out).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Q4_0: 17 bytes is not a whole number of 18-byte blocks"
    );
    let err = dequantize(QuantFormat::Q4_0, &[0u8; 36], &mut out).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Q4_0: the input holds 64 values but the output has 32 slots"
    );
    assert!(f16_bytes_to_f32(&[0u8; 3], &mut out).is_err());
    assert!(bf16_bytes_to_f32(&[0u8; 4], &mut out).is_err());
    assert!(f32_bytes_to_f32(&[0u8; 4], &mut out).is_err());
    let mut empty: [f32; 0] = [];
    assert!(dequantize(QuantFormat::Q6K, &[], &mut empty).is_ok());
}

#[test]
fn half_and_float_rows_convert_at_any_alignment() {
    let x = random_values(1000, 3);
    let halves: Vec<u8> = x
        .iter()
        .flat_map(|v| f16::from_f32(*v).to_le_bytes())
        .collect();
    let brains: Vec<u8> = x
        .iter()
        .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
        .collect();
    let floats: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    for shift in 0..2 {
        let mut out = vec![0.0; x.len()];
        let buf = [vec![0u8; shift], halves.clone()].concat();
        f16_bytes_to_f32(&buf[shift..], &mut out).unwrap();
        assert!(
            out.iter()
                .zip(&x)
                .all(|(a, b)| *a == f16::from_f32(*b).to_f32())
        );
        let buf = [vec![0u8; shift], brains.clone()].concat();
        bf16_bytes_to_f32(&buf[shift..], &mut out).unwrap();
        assert!(
            out.iter()
                .zip(&x)
                .all(|(a, b)| *a == bf16::from_f32(*b).to_f32())
        );
        let buf = [vec![0u8; shift], floats.clone()].concat();
        f32_bytes_to_f32(&buf[shift..], &mut out).unwrap();
        assert_eq!(out, x);
    }
}

#[test]
fn packed_k4_scales_equal_get_scale_min_k4() {
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    let mut cases: Vec<[u8; K_SCALE_SIZE]> = vec![[0; 12], [0xFF; 12]];
    cases.extend((0..1000).map(|_| std::array::from_fn(|_| rng.random())));
    for q in cases {
        let packed = scales_mins_k4(&q);
        for j in 0..8 {
            assert_eq!(
                (packed[j], packed[8 + j]),
                get_scale_min_k4(j, &q),
                "{q:?} {j}"
            );
        }
    }
}

#[test]
fn every_block_type_is_its_formats() {
    for format in QuantFormat::ALL {
        let (tag, elements, bytes) = crate::quant_format::with_block!(
            format,
            B => (B::FORMAT, B::BLOCK_ELEMENTS, size_of::<B>())
        );
        assert_eq!(tag, format);
        assert_eq!(
            (elements, bytes),
            (format.block_elements(), format.block_bytes())
        );
    }
}

#[test]
fn weight_formats_convert_to_and_from_quant_formats() {
    for q in QuantFormat::ALL {
        let w = WeightFormat::from(q);
        assert_eq!(w.quant(), Some(q));
        assert_eq!(
            (w.name(), w.block_elements(), w.block_bytes()),
            (q.name(), q.block_elements(), q.block_bytes())
        );
    }
    let floats: Vec<_> = WeightFormat::ALL
        .into_iter()
        .filter(|w| w.quant().is_none())
        .map(|w| (w.name(), w.block_elements(), w.block_bytes()))
        .collect();
    assert_eq!(floats, [("F32", 1, 4), ("BF16", 1, 2), ("F16", 1, 2)]);
    assert_eq!(WeightFormat::ALL.len(), QuantFormat::ALL.len() + 3);
}
