//! Products and conversions of every format at every level against the references.

use half::{bf16, f16};
use rand::{Rng, SeedableRng};

use super::*;
use crate::cpu::dispatch::{Kernels, Level};
use crate::cpu::matmul::linear_with;
use crate::cpu::test_util::{levels, random};
use crate::quant::QK_K;

/// Byte offsets of a block's f16 scales, and the range realistic values of each come
/// from (values near ±1 after dequantization).
fn scale_fields(format: WeightFormat) -> &'static [(usize, f32, f32)] {
    match format {
        WeightFormat::F32 | WeightFormat::Bf16 | WeightFormat::F16 => &[],
        WeightFormat::Q8_0 => &[(0, -0.02, 0.02)],
        WeightFormat::Q4_0 => &[(0, -0.15, 0.15)],
        WeightFormat::Q4_1 => &[(0, 0.0, 0.01), (2, -0.08, 0.0)],
        WeightFormat::Q5_0 => &[(0, -0.07, 0.07)],
        WeightFormat::Q5_1 => &[(0, 0.0, 0.005), (2, -0.08, 0.0)],
        WeightFormat::Q4K | WeightFormat::Q5K => &[(0, 0.0, 0.0005), (2, 0.0, 0.0005)],
        WeightFormat::Q6K => &[(208, -0.0002, 0.0002)],
        WeightFormat::Q2K => &[(80, 0.0, 0.02), (82, 0.0, 0.02)],
        WeightFormat::Q3K => &[(108, -0.01, 0.01)],
        WeightFormat::IQ4NL => &[(0, -0.01, 0.01)],
        WeightFormat::IQ4XS => &[(0, -0.0003, 0.0003)],
        // Its scale is a power of two, not an f16 (see `random_matrix`).
        WeightFormat::MXFP4 => &[],
    }
}

/// Random bytes of `blocks` blocks of `format`, each scale set by `scale(field)`.
fn blocks(
    rng: &mut impl Rng,
    format: WeightFormat,
    blocks: usize,
    mut scale: impl FnMut(&mut dyn rand::RngCore, (f32, f32)) -> f16,
) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..blocks * format.block_bytes())
        .map(|_| rng.random())
        .collect();
    for block in bytes.chunks_exact_mut(format.block_bytes()) {
        for &(at, lo, hi) in scale_fields(format) {
            let d = scale(rng, (lo, hi));
            block[at..at + 2].copy_from_slice(&d.to_le_bytes());
        }
    }
    bytes
}

/// A random matrix of `format` with realistic scales (and every quant value).
fn random_matrix(rng: &mut impl Rng, format: WeightFormat, n: usize, k: usize) -> WeightMatrix {
    let mut bytes: Vec<u8> = match format {
        WeightFormat::F32 => bytemuck::cast_slice(&random(rng, n * k)).to_vec(),
        WeightFormat::Bf16 => (0..n * k)
            .flat_map(|_| bf16::from_f32(rng.random_range(-1.0..1.0)).to_le_bytes())
            .collect(),
        WeightFormat::F16 => (0..n * k)
            .flat_map(|_| f16::from_f32(rng.random_range(-1.0..1.0)).to_le_bytes())
            .collect(),
        _ => blocks(
            rng,
            format,
            n * k / format.block_elements(),
            |r, (lo, hi)| f16::from_f32(r.random_range(lo..=hi)),
        ),
    };
    if format == WeightFormat::MXFP4 {
        // Scales 2^-12..2^-4: values up to 0.75.
        for block in bytes.chunks_exact_mut(format.block_bytes()) {
            block[0] = rng.random_range(116..=124);
        }
    }
    WeightMatrix::from_bytes(format, n, k, &bytes).unwrap()
}

/// (m, k, n) for a format: `k` whole blocks, odd `m` (33 takes the whole-task fill
/// path) and `n` not a multiple of tiles.
fn shapes(format: WeightFormat) -> &'static [(usize, usize, usize)] {
    if format.block_elements() == QK_K {
        &[
            (1, 256, 1),
            (3, 256, 19),
            (1, 1536, 41),
            (33, 512, 67),
            (3, 768, 300),
            (33, 256, 257),
            (7, 512, 13),
        ]
    } else {
        &[
            (1, 32, 1),
            (1, 64, 13),
            (3, 96, 19),
            (7, 576, 67),
            (5, 160, 300),
            (13, 1536, 41),
            (2, 32, 257),
            (33, 256, 45),
        ]
    }
}

#[test]
fn every_level_equals_f32_linear_over_the_dequantized_matrix() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    for format in WeightFormat::ALL {
        for &(m, k, n) in shapes(format) {
            let w = random_matrix(&mut rng, format, n, k);
            let dense = w.to_f32();
            let x = random(&mut rng, m * k);
            let b = random(&mut rng, n);
            let mut portable = vec![0f32; m * n];
            linear_with(
                Kernels::for_level(Level::Portable).unwrap(),
                &x,
                &dense,
                Some(&b),
                m,
                k,
                &mut portable,
            );
            for kern in levels() {
                let mut want = vec![0f32; m * n];
                linear_with(kern, &x, &dense, Some(&b), m, k, &mut want);
                let mut got = vec![f32::NAN; m * n];
                linear_weights_with(kern, &x, &w, Some(&b), m, &mut got);
                // Exact dequantization: bit-identical to the f32 path at this level.
                assert_eq!(got, want, "{kern:?} {format:?} {m}x{k}x{n}");
                // And within rounding of the portable level.
                let tol = 2e-6 * (k as f32).sqrt() * 8.0;
                for (a, r) in got.iter().zip(&portable) {
                    assert!((a - r).abs() <= tol, "{kern:?} {format:?}: {a} vs {r}");
                }
            }
        }
    }
}

/// Scales that stress exactness: zeros of both signs, the largest f16, normal and
/// subnormal minima, and ordinary values of both signs.
fn extreme_scale(rng: &mut dyn rand::RngCore) -> f16 {
    let edge = [
        f16::ZERO,
        f16::NEG_ZERO,
        f16::MAX,
        f16::MIN,
        f16::MIN_POSITIVE,
        f16::from_bits(1),
        f16::from_bits(0x83FF),
        f16::ONE,
    ];
    match rng.random_range(0..16) {
        i @ 0..8 => edge[i],
        _ => f16::from_f32(rng.random_range(-2.0..2.0)),
    }
}

/// Asserts equal bit patterns, naming the first difference (not megabytes of values).
fn same_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}: value {i} is {:e}, the reference {:e}",
            got[i], want[i]
        );
    }
}

#[test]
fn bf16_rows_with_a_tail_equal_the_f32_path() {
    // k not a multiple of 16: the widened loads' tail.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(15);
    for (m, k, n) in [(1, 23, 9), (3, 23, 17), (5, 41, 33)] {
        let w = random_matrix(&mut rng, WeightFormat::Bf16, n, k);
        let dense = w.to_f32();
        let x = random(&mut rng, m * k);
        for kern in levels() {
            let mut want = vec![0f32; m * n];
            linear_with(kern, &x, &dense, None, m, k, &mut want);
            let mut got = vec![f32::NAN; m * n];
            linear_weights_with(kern, &x, &w, None, m, &mut got);
            assert_eq!(got, want, "{kern:?} {m}x{k}x{n}");
        }
    }
}

#[test]
fn every_level_dequantizer_equals_the_reference() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
    for format in WeightFormat::ALL {
        let per = format.block_elements().max(32);
        for (rows, blocks_per_row) in [(1, 1), (3, 2), (5, 18), (2, 3), (40, 4)] {
            let cols = per * blocks_per_row;
            let n_blocks = rows * cols / format.block_elements();
            let mut bytes = match format {
                // Random bit patterns, infinities and subnormals included. Not NaNs:
                // the bfloat16 reference (`half`) quiets signalling NaNs, the SIMD
                // levels keep them as they are (f16 NaNs are covered below).
                WeightFormat::F32 | WeightFormat::Bf16 | WeightFormat::F16 => {
                    let unit = format.block_bytes();
                    (0..rows * cols)
                        .flat_map(|_| {
                            let mut v: u32 = rng.random();
                            if (v & 0x7F80_0000) == 0x7F80_0000 && unit == 4 {
                                v &= !0x007F_FFFF;
                            }
                            if unit == 2 && (v & 0x7F80) == 0x7F80 && format == WeightFormat::Bf16 {
                                v &= !0x007F;
                            }
                            if unit == 2 && (v & 0x7C00) == 0x7C00 && format == WeightFormat::F16 {
                                v &= !0x03FF;
                            }
                            v.to_le_bytes().into_iter().take(unit)
                        })
                        .collect()
                }
                _ => blocks(&mut rng, format, n_blocks, |r, _| extreme_scale(r)),
            };
            if scale_fields(format).is_empty() {
                // Exactly one block per element; nothing more to pin.
            } else {
                // A block of all-zero and one of all-one quant bits (scales kept).
                let bb = format.block_bytes();
                let fields = scale_fields(format);
                for (b, fill) in [(0, 0x00u8), (n_blocks - 1, 0xFF)] {
                    for (i, byte) in bytes[b * bb..(b + 1) * bb].iter_mut().enumerate() {
                        if !fields.iter().any(|&(at, ..)| (at..at + 2).contains(&i)) {
                            *byte = fill;
                        }
                    }
                }
            }
            let w = WeightMatrix::from_bytes(format, rows, cols, &bytes).unwrap();
            let mut want = vec![f32::NAN; rows * cols];
            w.rows_f32_with(&PORTABLE_DEQUANT, 0, &mut want);
            for kern in levels() {
                let mut got = vec![f32::NAN; rows * cols];
                w.rows_f32_with(&kern.dequant, 0, &mut got);
                same_bits(&got, &want, &format!("{kern:?} {format:?} {rows}x{cols}"));
            }
        }
    }
}

#[test]
fn every_level_converts_every_f16_exactly() {
    let all: Vec<u8> = (0..=u16::MAX).flat_map(|v| v.to_le_bytes()).collect();
    // 65536 values as 256 rows; then a ragged tail (not a multiple of any vector).
    for (rows, cols, bytes) in [(256, 256, &all[..]), (1, 13, &all[1000..1026])] {
        let w = WeightMatrix::from_bytes(WeightFormat::F16, rows, cols, bytes).unwrap();
        let want: Vec<f32> = bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect();
        for kern in levels() {
            let mut got = vec![0f32; rows * cols];
            w.rows_f32_with(&kern.dequant, 0, &mut got);
            same_bits(&got, &want, &format!("{kern:?}"));
        }
    }
}

#[test]
fn every_level_gives_rows_that_do_not_depend_on_batch() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(13);
    for format in WeightFormat::ALL {
        let (m, k, n) = (7, 768, 45);
        let w = random_matrix(&mut rng, format, n, k);
        let x = random(&mut rng, m * k);
        for kern in levels() {
            let mut all = vec![0f32; m * n];
            linear_weights_with(kern, &x, &w, None, m, &mut all);
            for i in 0..m {
                let mut one = vec![0f32; n];
                linear_weights_with(kern, &x[i * k..(i + 1) * k], &w, None, 1, &mut one);
                assert_eq!(
                    &all[i * n..(i + 1) * n],
                    &one[..],
                    "{kern:?} {format:?} {i}"
                );
            }
        }
    }
}

#[test]
fn k_quants_and_mxfp4_repack_for_int8_products_close_to_exact_ones() {
    // The K-quants and MXFP4 take the integer path (activations rounded to two 8-bit digits:
    // well under 1e-3 of the products' magnitude).
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(15);
    for format in [
        WeightFormat::Q4K,
        WeightFormat::Q5K,
        WeightFormat::Q6K,
        WeightFormat::MXFP4,
    ] {
        for &(m, k, n) in shapes(format) {
            let exact = random_matrix(&mut rng, format, n, k);
            let int8 = exact.clone().into_int8();
            assert_eq!(int8.format(), format);
            assert!(int8.is_int8(), "{format:?}");
            assert_eq!(int8.storage_bytes(), exact.storage_bytes());
            if format != WeightFormat::MXFP4 {
                // K-quants keep the file's bytes per row, for every row of the padded tiles
                // (MXFP4's scale byte widens to an f16).
                let padded = exact.storage_bytes() / n * n.next_multiple_of(64);
                assert_eq!(int8.resident_bytes(), padded, "{format:?}");
            }
            let x = random(&mut rng, m * k);
            let (mut want, mut got) = (vec![0f32; m * n], vec![0f32; m * n]);
            linear_weights(&x, &exact, None, m, &mut want);
            linear_weights(&x, &int8, None, m, &mut got);
            let dense = exact.to_f32();
            for i in 0..m {
                for j in 0..n {
                    let magnitude: f32 = x[i * k..(i + 1) * k]
                        .iter()
                        .zip(&dense[j * k..(j + 1) * k])
                        .map(|(a, b)| (a * b).abs())
                        .sum();
                    let e = (got[i * n + j] - want[i * n + j]).abs();
                    assert!(
                        e <= 1e-3 * magnitude + 1e-6,
                        "{format:?} {m}x{k}x{n} ({i},{j}): {e} of {magnitude}"
                    );
                }
            }
        }
    }
}

/// A stack's products are its parts' products side by side (with their biases): on the
/// exact path the bits of f32 over the whole dequantized matrix, on the int8 path those
/// of each part's own product; with bf16 activations, bf16 parts take `vdpbf16ps`.
#[test]
fn stacked_parts_multiply_like_their_concatenation() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(15);
    let k = 512;
    let parts = [
        random_matrix(&mut rng, WeightFormat::Q4K, 20, k),
        random_matrix(&mut rng, WeightFormat::Q5_0, 7, k),
        random_matrix(&mut rng, WeightFormat::Q6K, 9, k),
        random_matrix(&mut rng, WeightFormat::Bf16, 5, k),
    ];
    let n: usize = parts.iter().map(|p| p.rows()).sum();
    let bias = random(&mut rng, n);
    let stack = WeightMatrix::concat_rows(parts.to_vec());
    let dense = stack.to_f32();
    // Each part's `m` output rows (from `product(part, its bias)`) side by side.
    let side_by_side = |m: usize, product: &dyn Fn(&WeightMatrix, &[f32]) -> Vec<f32>| {
        let mut out = vec![0f32; m * n];
        let mut first = 0;
        for p in &parts {
            let o = product(p, &bias[first..first + p.rows()]);
            for (row, part) in out.chunks_exact_mut(n).zip(o.chunks_exact(p.rows())) {
                row[first..first + p.rows()].copy_from_slice(part);
            }
            first += p.rows();
        }
        out
    };
    for kern in levels() {
        for m in [1, 3, 17] {
            let x = random(&mut rng, m * k);
            let mut got = vec![f32::NAN; m * n];
            linear_weights_with(kern, &x, &stack, Some(&bias), m, &mut got);
            let mut want = vec![0f32; m * n];
            linear_with(kern, &x, &dense, Some(&bias), m, k, &mut want);
            assert_eq!(got, want, "{:?} m={m}: exact", kern.level);
            let int8 = stack.clone().into_int8();
            assert!(!int8.is_int8(), "the bf16 part stays bf16");
            linear_weights_with(kern, &x, &int8, Some(&bias), m, &mut got);
            let want = side_by_side(m, &|p, b| {
                let mut o = vec![0f32; m * p.rows()];
                linear_weights_with(kern, &x, &p.clone().into_int8(), Some(b), m, &mut o);
                o
            });
            assert_eq!(got, want, "{:?} m={m}: int8", kern.level);
        }
    }
    let (m, x) = (2, random(&mut rng, 2 * k));
    let mut got = vec![f32::NAN; m * n];
    linear_weights_as(
        &x,
        &stack,
        Some(&bias),
        m,
        &mut got,
        ActivationDtype::Bfloat16,
    );
    let want = side_by_side(m, &|p, b| {
        let mut o = vec![0f32; m * p.rows()];
        linear_weights_as(&x, p, Some(b), m, &mut o, ActivationDtype::Bfloat16);
        o
    });
    assert_eq!(got, want, "bf16 activations");
}

#[test]
fn concat_keeps_a_common_format_and_stacks_mixed_ones() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(14);
    let a = random_matrix(&mut rng, WeightFormat::Q4_1, 3, 64);
    let b = random_matrix(&mut rng, WeightFormat::Q4_1, 2, 64);
    let c = random_matrix(&mut rng, WeightFormat::Q8_0, 2, 64);
    let ab = WeightMatrix::concat_rows(vec![a.clone(), b.clone()]);
    assert_eq!(
        (ab.format(), ab.rows(), ab.storage_bytes()),
        (WeightFormat::Q4_1, 5, 200)
    );
    let want: Vec<f32> = [a.to_f32(), b.to_f32()].concat();
    assert_eq!(ab.to_f32(), want);
    let ac = WeightMatrix::concat_rows(vec![a.clone(), c.clone()]);
    // Mixed: each part keeps its format; the larger part's is reported.
    assert_eq!(
        (ac.format(), ac.parts().len(), ac.storage_bytes()),
        (WeightFormat::Q8_0, 2, 3 * 40 + 2 * 68)
    );
    assert_eq!(ac.to_f32(), [a.to_f32(), c.to_f32()].concat());
    let mut row = vec![0f32; 64];
    ac.row_f32(4, &mut row);
    assert_eq!(row, c.to_f32()[64..]);
    assert!(WeightMatrix::from_bytes(WeightFormat::Q8_0, 1, 48, &[0; 34]).is_err());
    // K-quants: q, k, v of one format stay in it; a Q6_K v (as llama.cpp's mixes
    // often have) makes a stack of parts.
    for format in [
        WeightFormat::F16,
        WeightFormat::Q4_0,
        WeightFormat::Q4K,
        WeightFormat::Q5K,
        WeightFormat::Q6K,
    ] {
        let q = random_matrix(&mut rng, format, 4, 512);
        let k = random_matrix(&mut rng, format, 2, 512);
        let v = random_matrix(&mut rng, WeightFormat::Q6K, 2, 512);
        let qk = WeightMatrix::concat_rows(vec![q.clone(), k.clone(), k.clone()]);
        let per_row = 512 / format.block_elements() * format.block_bytes();
        assert_eq!(
            (qk.format(), qk.rows(), qk.storage_bytes()),
            (format, 8, 8 * per_row)
        );
        assert_eq!(qk.to_f32(), [q.to_f32(), k.to_f32(), k.to_f32()].concat());
        let qkv = WeightMatrix::concat_rows(vec![q.clone(), k.clone(), v.clone()]);
        let mixed = format != WeightFormat::Q6K;
        assert_eq!(qkv.parts().len() == 3, mixed, "{format:?}");
        assert_eq!(qkv.to_f32(), [q.to_f32(), k.to_f32(), v.to_f32()].concat());
        let mut row = vec![0f32; 512];
        qkv.row_f32(7, &mut row);
        assert_eq!(row, v.to_f32()[512..]);
    }
    // A stack of a stack is flat.
    let ac_a = WeightMatrix::concat_rows(vec![ac.clone(), a.clone()]);
    assert_eq!(ac_a.parts().len(), 3);
    assert_eq!(ac_a.to_f32(), [a.to_f32(), c.to_f32(), a.to_f32()].concat());
    // Rows of a K-quant must be whole 256-value super-blocks.
    let err = WeightMatrix::from_bytes(WeightFormat::Q4K, 1, 96, &[0; 54]).unwrap_err();
    assert!(err.to_string().contains("Q4_K"), "{err}");
}
