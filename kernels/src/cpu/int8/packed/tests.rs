//! Packed rows against the GGUF dequantizers.

use half::f16;
use rand::{Rng, SeedableRng};

use super::{PackedMatrix, QK};
use crate::quant::{
    BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0,
    BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0, QK_K, dequantize_row_iq4_nl, dequantize_row_mxfp4,
    dequantize_row_q4_0, dequantize_row_q4_1, dequantize_row_q5_0, dequantize_row_q5_1,
    dequantize_row_q8_0,
};

#[test]
fn rows_unpack_to_the_gguf_dequantization() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    for (rows, cols) in [(1, 32), (16, 64), (17, 96), (40, 32)] {
        let nb = rows * cols / QK;
        let q8: Vec<BlockQ8_0> = (0..nb)
            .map(|_| BlockQ8_0 {
                d: f16::from_f32(rng.random_range(-0.1..0.1)),
                qs: std::array::from_fn(|_| rng.random()),
            })
            .collect();
        let q4: Vec<BlockQ4_1> = (0..nb)
            .map(|_| BlockQ4_1 {
                d: f16::from_f32(rng.random_range(0.0..0.1)),
                m: f16::from_f32(rng.random_range(-1.0..0.0)),
                qs: std::array::from_fn(|_| rng.random()),
            })
            .collect();
        let q0: Vec<BlockQ4_0> = (0..nb)
            .map(|_| BlockQ4_0 {
                d: f16::from_f32(rng.random_range(-0.1..0.1)),
                qs: std::array::from_fn(|_| rng.random()),
            })
            .collect();
        let q51: Vec<BlockQ5_1> = (0..nb)
            .map(|_| BlockQ5_1 {
                d: f16::from_f32(rng.random_range(0.0..0.05)),
                m: f16::from_f32(rng.random_range(-1.0..0.0)),
                qh: rng.random(),
                qs: std::array::from_fn(|_| rng.random()),
            })
            .collect();
        let q50: Vec<BlockQ5_0> = (0..nb)
            .map(|_| BlockQ5_0 {
                d: f16::from_f32(rng.random_range(-0.05..0.05)),
                qh: rng.random(),
                qs: std::array::from_fn(|_| rng.random()),
            })
            .collect();
        let p0 = PackedMatrix::from_q4_0(rows, cols, &q0);
        assert_eq!(p0.storage_bytes(), nb * 18);
        let nl: Vec<BlockIQ4NL> = (0..nb)
            .map(|_| BlockIQ4NL {
                d: f16::from_f32(rng.random_range(-0.01..0.01)),
                qs: std::array::from_fn(|_| rng.random()),
            })
            .collect();
        let pnl = PackedMatrix::from_iq4_nl(rows, cols, &nl);
        assert_eq!(pnl.storage_bytes(), nb * 18);
        let p51 = PackedMatrix::from_q5_1(rows, cols, &q51);
        assert_eq!(p51.storage_bytes(), nb * 24);
        let p50 = PackedMatrix::from_q5_0(rows, cols, &q50).unwrap();
        assert_eq!(p50.storage_bytes(), nb * 22);
        let p8 = PackedMatrix::from_q8_0(rows, cols, &q8);
        let p4 = PackedMatrix::from_q4_1(rows, cols, &q4);
        assert_eq!(p8.storage_bytes(), nb * 34);
        assert_eq!(p4.storage_bytes(), nb * 20);
        for row in 0..rows {
            let blocks = cols / QK;
            let mut want = vec![0f32; cols];
            let mut got = vec![f32::NAN; cols];
            dequantize_row_q8_0(&q8[row * blocks..(row + 1) * blocks], &mut want);
            p8.row_f32(row, &mut got);
            assert_eq!(got, want, "Q8_0 row {row} of {rows}x{cols}");
            dequantize_row_q4_1(&q4[row * blocks..(row + 1) * blocks], &mut want);
            p4.row_f32(row, &mut got);
            assert_eq!(got, want, "Q4_1 row {row} of {rows}x{cols}");
            dequantize_row_q4_0(&q0[row * blocks..(row + 1) * blocks], &mut want);
            p0.row_f32(row, &mut got);
            assert_eq!(got, want, "Q4_0 row {row} of {rows}x{cols}");
            dequantize_row_q5_1(&q51[row * blocks..(row + 1) * blocks], &mut want);
            p51.row_f32(row, &mut got);
            assert_eq!(got, want, "Q5_1 row {row} of {rows}x{cols}");
            dequantize_row_q5_0(&q50[row * blocks..(row + 1) * blocks], &mut want);
            p50.row_f32(row, &mut got);
            assert_eq!(got, want, "Q5_0 row {row} of {rows}x{cols}");
            dequantize_row_iq4_nl(&nl[row * blocks..(row + 1) * blocks], &mut want);
            pnl.row_f32(row, &mut got);
            assert_eq!(got, want, "IQ4_NL row {row} of {rows}x{cols}");
        }
    }
}

#[test]
fn mxfp4_rows_unpack_to_the_reference_dequantization() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
    for (rows, cols) in [(1, 32), (17, 64), (40, 96)] {
        let nb = rows * cols / QK;
        // Every scale f16 holds exactly (2^-24..2^15), and a block of zeros with a scale
        // it does not.
        let mut mx: Vec<BlockMXFP4> = (0..nb)
            .map(|_| BlockMXFP4 {
                e: rng.random_range(104..=143),
                qs: std::array::from_fn(|_| rng.random()),
            })
            .collect();
        mx[nb / 2] = BlockMXFP4 {
            e: 0,
            qs: [0x80; 16],
        };
        let packed = PackedMatrix::from_mxfp4(rows, cols, &mx).expect("f16 scales");
        assert_eq!(packed.storage_bytes(), nb * 17);
        let blocks = cols / QK;
        for row in 0..rows {
            let mut want = vec![0f32; cols];
            let mut got = vec![f32::NAN; cols];
            dequantize_row_mxfp4(&mx[row * blocks..(row + 1) * blocks], &mut want);
            packed.row_f32(row, &mut got);
            assert_eq!(got, want, "MXFP4 row {row} of {rows}x{cols}");
        }
        // A nonzero value under a scale f16 cannot hold stays unpacked.
        mx[0].e = 103;
        mx[0].qs[0] = 1;
        assert!(PackedMatrix::from_mxfp4(rows, cols, &mx).is_none());
    }
}

/// Packs random super-blocks of every shape with `pack` and checks each row of the result
/// against `dequantize`, within `bound(block, value index in the super-block)` (for
/// `IQ4_XS`, the f16 rounding of the sub-block scales; zero for the others), and its packed
/// size against `packed_per_32` bytes per 32 values.
fn k_quant_rows_unpack<B>(
    seed: u64,
    block_bytes: usize,
    packed_per_32: f64,
    random_block: impl Fn(&mut rand_chacha::ChaCha8Rng) -> B,
    pack: fn(usize, usize, &[B]) -> Option<PackedMatrix>,
    dequantize: fn(&[B], &mut [f32]),
    bound: impl Fn(&B, usize) -> f32,
) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    for (rows, cols) in [(1, 256), (17, 512), (40, 256)] {
        let nb = rows * cols / QK_K;
        let blocks: Vec<B> = (0..nb).map(|_| random_block(&mut rng)).collect();
        let p = pack(rows, cols, &blocks).expect("small scales");
        assert_eq!(p.storage_bytes(), nb * block_bytes);
        let padded = rows.next_multiple_of(64) * cols / QK;
        assert_eq!(p.packed_bytes() as f64, padded as f64 * packed_per_32);
        let per_row = cols / QK_K;
        for row in 0..rows {
            let mut want = vec![0f32; cols];
            let mut got = vec![f32::NAN; cols];
            dequantize(&blocks[row * per_row..(row + 1) * per_row], &mut want);
            p.row_f32(row, &mut got);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let b = bound(&blocks[row * per_row + i / QK_K], i % QK_K);
                assert!((g - w).abs() <= b, "row {row} value {i}: {g} vs {w}");
            }
        }
    }
}

#[test]
fn k_quant_rows_unpack_to_the_dequantization() {
    use crate::quant::{
        dequantize_row_iq4_xs, dequantize_row_q3_k, dequantize_row_q4_k, dequantize_row_q5_k,
        dequantize_row_q6_k,
    };
    k_quant_rows_unpack(
        2,
        144,
        18.0,
        |rng| BlockQ4K {
            d: f16::from_f32(rng.random_range(0.0..0.002)),
            dmin: f16::from_f32(rng.random_range(0.0..0.004)),
            scales: std::array::from_fn(|_| rng.random()),
            qs: std::array::from_fn(|_| rng.random()),
        },
        PackedMatrix::from_q4_k,
        dequantize_row_q4_k,
        |_, _| 0.0,
    );
    k_quant_rows_unpack(
        3,
        176,
        22.0,
        |rng| BlockQ5K {
            d: f16::from_f32(rng.random_range(0.0..0.002)),
            dmin: f16::from_f32(rng.random_range(0.0..0.004)),
            scales: std::array::from_fn(|_| rng.random()),
            qh: std::array::from_fn(|_| rng.random()),
            qs: std::array::from_fn(|_| rng.random()),
        },
        PackedMatrix::from_q5_k,
        dequantize_row_q5_k,
        |_, _| 0.0,
    );
    k_quant_rows_unpack(
        4,
        210,
        26.25,
        |rng| BlockQ6K {
            ql: std::array::from_fn(|_| rng.random()),
            qh: std::array::from_fn(|_| rng.random()),
            scales: std::array::from_fn(|_| rng.random()),
            d: f16::from_f32(rng.random_range(-0.0005..0.0005)),
        },
        PackedMatrix::from_q6_k,
        dequantize_row_q6_k,
        |_, _| 0.0,
    );
    k_quant_rows_unpack(
        6,
        110,
        14.25,
        |rng| BlockQ3K {
            hmask: std::array::from_fn(|_| rng.random()),
            qs: std::array::from_fn(|_| rng.random()),
            scales: std::array::from_fn(|_| rng.random()),
            d: f16::from_f32(rng.random_range(-0.0005..0.0005)),
        },
        PackedMatrix::from_q3_k,
        dequantize_row_q3_k,
        |_, _| 0.0,
    );
    // Each term moves by at most half an f16 step (2^-11 relative, 2^-25 when subnormal).
    let half_step = 2f32.powi(-11);
    k_quant_rows_unpack(
        5,
        136,
        18.0,
        |rng| BlockIQ4XS {
            d: f16::from_f32(rng.random_range(-0.0005..0.0005)),
            scales_h: rng.random(),
            scales_l: rng.random(),
            qs: std::array::from_fn(|_| rng.random()),
        },
        PackedMatrix::from_iq4_xs,
        dequantize_row_iq4_xs,
        |b, e| b.sub_scale(e / QK).abs() * 127.0 * half_step + 2f32.powi(-24) * 127.0,
    );
}

#[test]
fn k_quant_scales_are_refused_only_when_not_finite() {
    // Exact in f32 whatever their size.
    let mut huge = BlockQ4K {
        d: f16::from_f32(60000.0),
        dmin: f16::ZERO,
        scales: [63; 12],
        qs: [0; QK_K / 2],
    };
    assert!(PackedMatrix::from_q4_k(1, QK_K, &[huge]).is_some());
    huge.dmin = f16::INFINITY;
    assert!(PackedMatrix::from_q4_k(1, QK_K, &[huge]).is_none());
    let nan = BlockQ6K {
        ql: [0; QK_K / 2],
        qh: [0; QK_K / 4],
        scales: [1; QK_K / 16],
        d: f16::NAN,
    };
    assert!(PackedMatrix::from_q6_k(1, QK_K, &[nan]).is_none());
    let huge = BlockQ5_0 {
        d: f16::from_f32(5000.0),
        qh: [0; 4],
        qs: [0; QK / 2],
    };
    assert!(PackedMatrix::from_q5_0(1, QK, &[huge]).is_none());
}
