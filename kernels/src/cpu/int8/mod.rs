//! Quantized weights times 8-bit-quantized activations, with integer dot products.
//!
//! Decoding reads every weight once per token, so its speed is set by how few instructions
//! each weight byte costs. Unpacking a 4-bit weight to f32 costs several per value; a
//! `vpdpbusd` multiplies 64 byte pairs at once. So, much as llama.cpp does, the activations
//! are quantized per 32-value block ([`activations`]: two 8-bit digits, about 15 bits, where
//! llama.cpp keeps one) and multiplied against the weights' quants in integers, and the block
//! scales are applied in f32 ([`portable`] gives the exact sequence of operations). The
//! weights are repacked once at load ([`packed`]) so that one instruction serves 16 rows.
//!
//! This is not bit-identical to f32 over the dequantized weights (the activations keep about
//! 15 bits per block), but it is bit-identical on every level and for any batch: a row's
//! outputs depend only on that row.
#![allow(unsafe_code)]

pub mod activations;
pub mod packed;
pub(crate) mod portable;

use std::cell::RefCell;

use self::activations::{Extras, QuantizeBlockFn, QuantizedRows, quantize_block_ref};
use self::packed::{GROUP, PackedMatrix, TILE};
use super::dispatch::{Kernels, Level, kernels};
use super::matmul::{SharedOut, add_bias, check_shapes};

/// A level's tile kernel, with [`portable::tiles`]'s contract.
pub(crate) type TilesFn =
    unsafe fn(w: &PackedMatrix, t0: usize, nt: usize, x: &QuantizedRows, out: *mut f32, ldo: usize);

/// The integer-dot kernels of one level.
pub(crate) struct Int8Kernels {
    /// What the tests and messages call them.
    pub(crate) name: &'static str,
    pub(crate) tiles: TilesFn,
    pub(crate) quantize: QuantizeBlockFn,
    /// Whether `tiles` reads [`QuantizedRows::combined`].
    pub(crate) combined: bool,
}

/// The portable level's: the references.
const PORTABLE: Int8Kernels = Int8Kernels {
    name: "portable",
    tiles: portable::tiles,
    quantize: quantize_block_ref,
    combined: false,
};

impl Int8Kernels {
    /// The kernels to use at `level` (AVX-512 needs VNNI and BW as well).
    pub(crate) fn for_level(level: Level) -> &'static Int8Kernels {
        #[cfg(target_arch = "x86_64")]
        {
            use super::arch::x86_64::{int8, int8_avx2, int8_avxvnni};
            match level {
                Level::Avx512 if int8::avx512_vnni_supported() => &int8::AVX512_VNNI,
                Level::Avx512 | Level::Avx2 if int8_avxvnni::supported() => &int8_avxvnni::KERNELS,
                Level::Avx512 | Level::Avx2 if int8_avx2::supported() => &int8::AVX2,
                Level::Avx512 | Level::Avx2 => &PORTABLE,
                Level::Portable => &PORTABLE,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = level;
            &PORTABLE
        }
    }
}

/// Every table this CPU runs, the reference first (one level may have several: AVX2 with or
/// without AVX-VNNI).
#[cfg(test)]
fn int8_tables() -> Vec<&'static Int8Kernels> {
    let mut tables = vec![&PORTABLE];
    #[cfg(target_arch = "x86_64")]
    {
        use super::arch::x86_64::{int8, int8_avx2, int8_avxvnni};
        if int8_avx2::supported() {
            tables.push(&int8::AVX2);
        }
        if int8_avxvnni::supported() {
            tables.push(&int8_avxvnni::KERNELS);
        }
        if int8::avx512_vnni_supported() {
            tables.push(&int8::AVX512_VNNI);
        }
    }
    tables
}

thread_local! {
    /// The quantized activations of the current call.
    static QUANTIZED: RefCell<QuantizedRows> = RefCell::new(QuantizedRows::default());
}

/// Whether `kernels`' level has a vector kernel for packed matrices: AVX-512 VNNI's
/// `vpdpbusd`, AVX-VNNI's 256-bit one, or AVX2's `vpmaddwd` (each faster than dequantizing
/// to f32). The portable level runs the reference, far slower than dequantizing, so callers
/// should keep quantized weights on the exact path there.
pub fn hardware_int8(kernels: &Kernels) -> bool {
    !std::ptr::eq(Int8Kernels::for_level(kernels.level), &PORTABLE)
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ + bias[n]` with the dispatched kernels.
pub fn linear_int8(x: &[f32], w: &PackedMatrix, bias: Option<&[f32]>, m: usize, out: &mut [f32]) {
    linear_int8_with(kernels(), x, w, bias, m, out)
}

/// [`linear_int8`] at an explicit level.
pub fn linear_int8_with(
    kernels: &Kernels,
    x: &[f32],
    w: &PackedMatrix,
    bias: Option<&[f32]>,
    m: usize,
    out: &mut [f32],
) {
    linear_int8_using(Int8Kernels::for_level(kernels.level), x, w, bias, m, out)
}

/// [`linear_int8`] with one table of kernels.
fn linear_int8_using(
    int8: &Int8Kernels,
    x: &[f32],
    w: &PackedMatrix,
    bias: Option<&[f32]>,
    m: usize,
    out: &mut [f32],
) {
    if check_shapes(x, w.rows() * w.cols(), bias, m, w.cols(), out).is_none() {
        return;
    }
    linear_int8_parts_using(int8, x, &[(w, bias)], m, out);
}

/// The product with the rows of several packed matrices stacked (`out` is `m × Σ rows`, each
/// part's outputs in its own columns, in order), in one parallel region: the input is
/// quantized once, and every part's rows are shared out together.
pub fn linear_int8_parts_with(
    kernels: &Kernels,
    x: &[f32],
    parts: &[(&PackedMatrix, Option<&[f32]>)],
    m: usize,
    out: &mut [f32],
) {
    linear_int8_parts_using(Int8Kernels::for_level(kernels.level), x, parts, m, out)
}

/// Bytes of packed weights per work item of a product: enough that taking an item costs
/// nothing against streaming it, small enough that the last items even the members out.
const ITEM_BYTES: usize = 128 * 1024;

/// One work item: tiles `t0..t0 + nt` of part `part`, whose outputs start at column `column`.
#[derive(Clone, Copy)]
struct Item {
    part: usize,
    column: usize,
    t0: usize,
    nt: usize,
}

/// The work items of the parts: whole groups of tiles (the decode kernel's width), about
/// [`ITEM_BYTES`] each, or fewer for a batch of rows (each byte then costs `m` products).
fn items(parts: &[(&PackedMatrix, Option<&[f32]>)], m: usize) -> Vec<Item> {
    let mut items = Vec::new();
    let mut column = 0;
    for (part, (w, _)) in parts.iter().enumerate() {
        let tiles = w.tiles();
        let tile_bytes = (w.packed_bytes() / tiles.next_multiple_of(GROUP)).max(1);
        let per_item = (ITEM_BYTES / tile_bytes / m.max(1))
            .max(1)
            .next_multiple_of(GROUP);
        items.extend((0..tiles).step_by(per_item).map(|t0| Item {
            part,
            column,
            t0,
            nt: per_item.min(tiles - t0),
        }));
        column += w.rows();
    }
    items
}

/// [`linear_int8_parts_with`] with one table of kernels.
fn linear_int8_parts_using(
    int8: &Int8Kernels,
    x: &[f32],
    parts: &[(&PackedMatrix, Option<&[f32]>)],
    m: usize,
    out: &mut [f32],
) {
    let Some(&(first, _)) = parts.first() else {
        return;
    };
    let k = first.cols();
    let n: usize = parts.iter().map(|(w, _)| w.rows()).sum();
    assert!(
        parts.iter().all(|(w, _)| w.cols() == k),
        "parts of equal widths"
    );
    assert!(
        parts
            .iter()
            .all(|(w, b)| b.is_none_or(|b| b.len() == w.rows())),
        "a bias per output row"
    );
    assert_eq!(x.len(), m * k, "x must be m × k");
    assert_eq!(out.len(), m * n, "out must be m × rows");
    if m == 0 || n == 0 {
        return;
    }
    // Taken out of the thread-local for the call, not borrowed: a caller that falls back to
    // rayon's pool may run another product's task while it waits, which needs a buffer too.
    let mut quantized = QUANTIZED.take();
    let extras = Extras {
        halves: parts.iter().any(|(w, _)| w.kind().halves()),
        combined: int8.combined,
    };
    quantized.quantize(x, m, k, int8.quantize, extras);
    let q = &quantized;
    let items = items(parts, m);
    let ptr = SharedOut(out.as_mut_ptr());
    super::team::run(items.len(), &|i| {
        let Item {
            part,
            column,
            t0,
            nt,
        } = items[i];
        let (w, bias) = parts[part];
        let j0 = t0 * TILE;
        // SAFETY: this item writes out[r * n + column + c] for r < m and c in
        // j0..min(j0 + nt * 16, rows of the part) only: inside `out` and disjoint from every
        // other item's columns. `out` is borrowed mutably for the whole region.
        unsafe {
            let base = ptr.get().add(column + j0);
            (int8.tiles)(w, t0, nt, q, base, n);
            add_bias(base, bias, j0..(j0 + nt * TILE).min(w.rows()), m, n);
        }
    });
    QUANTIZED.set(quantized);
}

#[cfg(test)]
mod tests {
    use super::packed::PackedKind;
    use super::*;
    use crate::cpu::test_util::random;
    use crate::quant::{
        BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0,
        BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0, QK_K, dequantize_row_iq4_nl,
        dequantize_row_mxfp4, dequantize_row_q4_0, dequantize_row_q4_1, dequantize_row_q5_0,
        dequantize_row_q5_1, dequantize_row_q8_0,
    };
    use half::f16;
    use rand::{Rng, SeedableRng};

    /// A random packed matrix and its dequantized f32 values.
    fn random_packed(
        rng: &mut impl Rng,
        kind: PackedKind,
        n: usize,
        k: usize,
    ) -> (PackedMatrix, Vec<f32>) {
        match kind {
            PackedKind::Q4_1
            | PackedKind::Q4_0
            | PackedKind::Q5_1
            | PackedKind::Q5_0
            | PackedKind::IQ4NL
            | PackedKind::MXFP4
            | PackedKind::Q8_0 => random_packed_blocks_of_32(rng, kind, n, k),
            PackedKind::Q3K
            | PackedKind::IQ4XS
            | PackedKind::Q4K
            | PackedKind::Q5K
            | PackedKind::Q6K => {
                let p = random_packed_super_blocks(rng, kind, n, k);
                let mut dense = vec![0f32; n * k];
                for (j, row) in dense.chunks_exact_mut(k).enumerate() {
                    p.row_f32(j, row);
                }
                (p, dense)
            }
        }
    }

    /// [`random_packed`] for the formats of 32-value blocks, dequantized by the reference
    /// row functions.
    fn random_packed_blocks_of_32(
        rng: &mut impl Rng,
        kind: PackedKind,
        n: usize,
        k: usize,
    ) -> (PackedMatrix, Vec<f32>) {
        let nb = n * k / 32;
        let mut dense = vec![0f32; n * k];
        match kind {
            PackedKind::Q4_1 => {
                let blocks: Vec<BlockQ4_1> = (0..nb)
                    .map(|_| BlockQ4_1 {
                        d: f16::from_f32(rng.random_range(0.0..0.01)),
                        m: f16::from_f32(rng.random_range(-0.08..0.0)),
                        qs: std::array::from_fn(|_| rng.random()),
                    })
                    .collect();
                dequantize_row_q4_1(&blocks, &mut dense);
                (PackedMatrix::from_q4_1(n, k, &blocks), dense)
            }
            PackedKind::Q4_0 => {
                let blocks: Vec<BlockQ4_0> = (0..nb)
                    .map(|_| BlockQ4_0 {
                        d: f16::from_f32(rng.random_range(-0.01..0.01)),
                        qs: std::array::from_fn(|_| rng.random()),
                    })
                    .collect();
                dequantize_row_q4_0(&blocks, &mut dense);
                let p = PackedMatrix::from_q4_0(n, k, &blocks);
                (p, dense)
            }
            PackedKind::Q5_1 => {
                let blocks: Vec<BlockQ5_1> = (0..nb)
                    .map(|_| BlockQ5_1 {
                        d: f16::from_f32(rng.random_range(0.0..0.005)),
                        m: f16::from_f32(rng.random_range(-0.08..0.0)),
                        qh: rng.random(),
                        qs: std::array::from_fn(|_| rng.random()),
                    })
                    .collect();
                dequantize_row_q5_1(&blocks, &mut dense);
                (PackedMatrix::from_q5_1(n, k, &blocks), dense)
            }
            PackedKind::Q5_0 => {
                let blocks: Vec<BlockQ5_0> = (0..nb)
                    .map(|_| BlockQ5_0 {
                        d: f16::from_f32(rng.random_range(-0.005..0.005)),
                        qh: rng.random(),
                        qs: std::array::from_fn(|_| rng.random()),
                    })
                    .collect();
                dequantize_row_q5_0(&blocks, &mut dense);
                let p = PackedMatrix::from_q5_0(n, k, &blocks).expect("small scales");
                (p, dense)
            }
            PackedKind::IQ4NL => {
                let blocks: Vec<BlockIQ4NL> = (0..nb)
                    .map(|_| BlockIQ4NL {
                        d: f16::from_f32(rng.random_range(-0.0003..0.0003)),
                        qs: std::array::from_fn(|_| rng.random()),
                    })
                    .collect();
                dequantize_row_iq4_nl(&blocks, &mut dense);
                (PackedMatrix::from_iq4_nl(n, k, &blocks), dense)
            }
            PackedKind::MXFP4 => {
                let blocks: Vec<BlockMXFP4> = (0..nb)
                    .map(|_| BlockMXFP4 {
                        e: rng.random_range(112..=120),
                        qs: std::array::from_fn(|_| rng.random()),
                    })
                    .collect();
                dequantize_row_mxfp4(&blocks, &mut dense);
                let p = PackedMatrix::from_mxfp4(n, k, &blocks).expect("f16 scales");
                (p, dense)
            }
            PackedKind::Q8_0 => {
                let blocks: Vec<BlockQ8_0> = (0..nb)
                    .map(|_| BlockQ8_0 {
                        d: f16::from_f32(rng.random_range(-0.002..0.002)),
                        // Include the extremes: -128 and 127.
                        qs: std::array::from_fn(|_| rng.random()),
                    })
                    .collect();
                dequantize_row_q8_0(&blocks, &mut dense);
                (PackedMatrix::from_q8_0(n, k, &blocks), dense)
            }
            other => unreachable!("{other:?} is not a format of 32-value blocks"),
        }
    }

    /// A random packed matrix of a format of 256-value super-blocks.
    fn random_packed_super_blocks(
        rng: &mut impl Rng,
        kind: PackedKind,
        n: usize,
        k: usize,
    ) -> PackedMatrix {
        match kind {
            PackedKind::Q3K => {
                let blocks: Vec<BlockQ3K> = (0..n * k / QK_K)
                    .map(|_| BlockQ3K {
                        hmask: std::array::from_fn(|_| rng.random()),
                        qs: std::array::from_fn(|_| rng.random()),
                        scales: std::array::from_fn(|_| rng.random()),
                        d: f16::from_f32(rng.random_range(-0.0002..0.0002)),
                    })
                    .collect();
                PackedMatrix::from_q3_k(n, k, &blocks).expect("small scales")
            }
            PackedKind::IQ4XS => {
                let blocks: Vec<BlockIQ4XS> = (0..n * k / QK_K)
                    .map(|_| BlockIQ4XS {
                        d: f16::from_f32(rng.random_range(-0.00001..0.00001)),
                        scales_h: rng.random(),
                        scales_l: rng.random(),
                        qs: std::array::from_fn(|_| rng.random()),
                    })
                    .collect();
                PackedMatrix::from_iq4_xs(n, k, &blocks).expect("small scales")
            }
            PackedKind::Q4K => {
                let blocks: Vec<BlockQ4K> = (0..n * k / QK_K)
                    .map(|_| BlockQ4K {
                        d: f16::from_f32(rng.random_range(0.0..0.0003)),
                        dmin: f16::from_f32(rng.random_range(0.0..0.002)),
                        scales: std::array::from_fn(|_| rng.random()),
                        qs: std::array::from_fn(|_| rng.random()),
                    })
                    .collect();
                PackedMatrix::from_q4_k(n, k, &blocks).expect("small scales")
            }
            PackedKind::Q5K => {
                let blocks: Vec<BlockQ5K> = (0..n * k / QK_K)
                    .map(|_| BlockQ5K {
                        d: f16::from_f32(rng.random_range(0.0..0.00015)),
                        dmin: f16::from_f32(rng.random_range(0.0..0.002)),
                        scales: std::array::from_fn(|_| rng.random()),
                        qh: std::array::from_fn(|_| rng.random()),
                        qs: std::array::from_fn(|_| rng.random()),
                    })
                    .collect();
                PackedMatrix::from_q5_k(n, k, &blocks).expect("small scales")
            }
            PackedKind::Q6K => {
                let blocks: Vec<BlockQ6K> = (0..n * k / QK_K)
                    .map(|_| BlockQ6K {
                        ql: std::array::from_fn(|_| rng.random()),
                        qh: std::array::from_fn(|_| rng.random()),
                        // Include the extremes: -128 and 127.
                        scales: std::array::from_fn(|_| rng.random()),
                        d: f16::from_f32(rng.random_range(-0.00005..0.00005)),
                    })
                    .collect();
                PackedMatrix::from_q6_k(n, k, &blocks).expect("small scales")
            }
            other => unreachable!("{other:?} is not a format of super-blocks"),
        }
    }

    const KINDS: [PackedKind; 12] = [
        PackedKind::Q8_0,
        PackedKind::Q4_1,
        PackedKind::Q4_0,
        PackedKind::Q5_1,
        PackedKind::Q5_0,
        PackedKind::Q4K,
        PackedKind::Q5K,
        PackedKind::Q6K,
        PackedKind::IQ4NL,
        PackedKind::IQ4XS,
        PackedKind::Q3K,
        PackedKind::MXFP4,
    ];

    /// `shape` for `kind`: K-quant rows are whole super-blocks of 256.
    fn shape_for(kind: PackedKind, (m, k, n): (usize, usize, usize)) -> (usize, usize, usize) {
        match kind {
            PackedKind::Q3K
            | PackedKind::Q4K
            | PackedKind::Q5K
            | PackedKind::Q6K
            | PackedKind::IQ4XS => (m, k.next_multiple_of(QK_K), n),
            _ => (m, k, n),
        }
    }

    /// (m, k, n): n not a multiple of 16 or 64, m with tails of the 4-row kernel.
    const SHAPES: [(usize, usize, usize); 10] = [
        (1, 32, 1),
        (1, 64, 16),
        (1, 576, 67),
        // Decode over whole groups and eight K-quant super-blocks.
        (1, 2048, 130),
        (2, 96, 300),
        (3, 160, 17),
        (5, 576, 129),
        (9, 1536, 48),
        (1, 32, 1000),
        // More rows than one pass of the AVX-VNNI kernel takes.
        (37, 256, 33),
    ];

    #[test]
    fn every_level_quantizes_to_the_reference_digits() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(24);
        let mut blocks: Vec<Vec<f32>> = (0..200).map(|_| random(&mut rng, 32)).collect();
        // Zeros, a single value, halves that tie, and wide magnitudes.
        blocks.push(vec![0.0; 32]);
        blocks.push((0..32).map(|i| if i == 7 { -3.0 } else { 0.0 }).collect());
        blocks.push((0..32).map(|i| (i as f32 - 15.5) * 0.5).collect());
        blocks.push(
            (0..32)
                .map(|i| 10f32.powi(i % 9 - 4) * if i % 2 == 0 { 1.0 } else { -1.0 })
                .collect(),
        );
        for kern in int8_tables() {
            let quantize = kern.quantize;
            for x in &blocks {
                let (mut h0, mut l0, mut h1, mut l1) = ([0i8; 32], [0i8; 32], [0i8; 32], [0i8; 32]);
                let want = quantize_block_ref(x, &mut h0, &mut l0);
                let got = quantize(x, &mut h1, &mut l1);
                assert_eq!(
                    (got.0.to_bits(), got.1),
                    (want.0.to_bits(), want.1),
                    "{}",
                    kern.name
                );
                assert_eq!((h1, l1), (h0, l0), "{} {x:?}", kern.name);
            }
        }
    }

    #[test]
    fn every_level_is_bit_identical_to_the_reference() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(21);
        for q4 in KINDS {
            for shape in SHAPES {
                let (m, k, n) = shape_for(q4, shape);
                let (w, _) = random_packed(&mut rng, q4, n, k);
                let x = random(&mut rng, m * k);
                let b = random(&mut rng, n);
                let mut want = vec![0f32; m * n];
                linear_int8_using(&PORTABLE, &x, &w, Some(&b), m, &mut want);
                for kern in int8_tables() {
                    let mut got = vec![f32::NAN; m * n];
                    linear_int8_using(kern, &x, &w, Some(&b), m, &mut got);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{} {q4:?} {m}x{k}x{n}", kern.name);
                }
            }
        }
    }

    #[test]
    fn error_is_that_of_two_digit_activations() {
        // Against the f64 product over the dequantized weights: the activations' rounding is
        // half a step of the low digit, max|x| / (127 · 254 · 2), per value; plus f32 sums.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(22);
        for q4 in KINDS {
            for shape in SHAPES {
                let (m, k, n) = shape_for(q4, shape);
                let (w, dense) = random_packed(&mut rng, q4, n, k);
                let x = random(&mut rng, m * k);
                let mut got = vec![0f32; m * n];
                linear_int8(&x, &w, None, m, &mut got);
                for i in 0..m {
                    for j in 0..n {
                        let xr = &x[i * k..(i + 1) * k];
                        let wr = &dense[j * k..(j + 1) * k];
                        let exact: f64 =
                            xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                        let magnitude: f64 = xr
                            .iter()
                            .zip(wr)
                            .map(|(a, b)| (*a as f64 * *b as f64).abs())
                            .sum();
                        let rounding: f64 = xr
                            .chunks(32)
                            .zip(wr.chunks(32))
                            .map(|(xb, wb)| {
                                let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
                                let step = amax / 127.0 / 254.0;
                                wb.iter().map(|v| v.abs() as f64).sum::<f64>() * step / 2.0
                            })
                            .sum();
                        let bound = rounding * 1.01 + 4e-6 * magnitude + 1e-6;
                        let e = (got[i * n + j] as f64 - exact).abs();
                        assert!(
                            e <= bound,
                            "{q4:?} {m}x{k}x{n} ({i},{j}): err {e} > {bound}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn rows_do_not_depend_on_the_batch() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(23);
        for q4 in KINDS {
            let (m, k, n) = shape_for(q4, (11, 576, 77));
            let (w, _) = random_packed(&mut rng, q4, n, k);
            let x = random(&mut rng, m * k);
            for kern in int8_tables() {
                let mut all = vec![0f32; m * n];
                linear_int8_using(kern, &x, &w, None, m, &mut all);
                for i in 0..m {
                    let mut one = vec![0f32; n];
                    linear_int8_using(kern, &x[i * k..(i + 1) * k], &w, None, 1, &mut one);
                    assert_eq!(
                        &all[i * n..(i + 1) * n],
                        &one[..],
                        "{} {q4:?} row {i}",
                        kern.name
                    );
                }
            }
        }
    }
}
