//! Weight matrices kept in their file's format, multiplied without an f32 copy of the model.
//!
//! [`WeightMatrix`] holds a `rows × cols` matrix in the PyTorch `Linear` layout as f32,
//! bfloat16, or GGUF `Q8_0` / `Q4_1` blocks (each row a whole number of blocks).
//! [`linear_weights`] computes `out = x · wᵀ + b` like [`super::matmul::linear`]: each rayon
//! task dequantizes a few weight rows at a time into a small per-thread buffer, with the
//! dispatched level's dequantizer, and hands them to the level's f32 kernel while they are
//! in cache. Every dequantizer is exact (a 4- or 8-bit quant times an f16 scale fits in an
//! f32, so `q·d + m` rounds once, fused or not; bfloat16 widens exactly), so an output is
//! bit-identical to [`super::matmul::linear`] over the dequantized matrix at the same
//! level, and keeps its reduction order for any batch size.
#![allow(unsafe_code)]

use std::cell::RefCell;

use half::bf16;
use rayon::prelude::*;

use super::dispatch::{Kernels, kernels};
use super::int8::linear_int8_with;
use super::int8::packed::{PackedKind, PackedMatrix};
use super::matmul::{SharedOut, linear_with, rows_per_task};
use crate::quant::{
    BlockQ4_1, BlockQ8_0, QK8_0, QuantError, dequantize_row_q4_1, dequantize_row_q8_0,
};

/// How a [`WeightMatrix`] stores its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// Plain f32.
    F32,
    /// bfloat16 (the upper half of an f32).
    Bf16,
    /// GGUF `Q8_0` blocks: 32 values, f16 scale, 8-bit quants.
    Q8_0,
    /// GGUF `Q4_1` blocks: 32 values, f16 scale and minimum, 4-bit quants.
    Q4_1,
}

impl WeightFormat {
    /// Values per block (1 for the float formats).
    pub const fn block_elements(self) -> usize {
        match self {
            Self::F32 | Self::Bf16 => 1,
            Self::Q8_0 | Self::Q4_1 => QK8_0,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 => 2,
            Self::Q8_0 => size_of::<BlockQ8_0>(),
            Self::Q4_1 => size_of::<BlockQ4_1>(),
        }
    }

    /// The name GGUF uses (`Q4_1`, `BF16`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::Bf16 => "BF16",
            Self::Q8_0 => "Q8_0",
            Self::Q4_1 => "Q4_1",
        }
    }
}

/// Dequantizers of one level, one per stored format. Each writes exactly the values of the
/// portable `quant::dequantize_row_*` (bit for bit).
pub(crate) struct Dequant {
    /// `out.len() == blocks.len() * 32`.
    pub(crate) q8_0: fn(&[BlockQ8_0], &mut [f32]),
    /// `out.len() == blocks.len() * 32`.
    pub(crate) q4_1: fn(&[BlockQ4_1], &mut [f32]),
    /// `out.len() == src.len()`.
    pub(crate) bf16: fn(&[bf16], &mut [f32]),
}

/// bfloat16 to f32, the portable level's (and the reference).
pub(crate) fn bf16_to_f32_ref(src: &[bf16], out: &mut [f32]) {
    for (o, v) in out.iter_mut().zip(src) {
        *o = v.to_f32();
    }
}

/// The portable level's dequantizers: the scalar references.
pub(crate) const PORTABLE_DEQUANT: Dequant = Dequant {
    q8_0: dequantize_row_q8_0,
    q4_1: dequantize_row_q4_1,
    bf16: bf16_to_f32_ref,
};

#[derive(Clone)]
enum Data {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    Q8_0(Vec<BlockQ8_0>),
    Q4_1(Vec<BlockQ4_1>),
    /// `Q8_0` or `Q4_1` repacked for integer dot products (see `cpu::int8`).
    Packed(PackedMatrix),
}

/// A `rows × cols` weight matrix (PyTorch `Linear` layout: one row per output) in its
/// storage format.
#[derive(Clone)]
pub struct WeightMatrix {
    rows: usize,
    cols: usize,
    data: Data,
}

impl std::fmt::Debug for WeightMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightMatrix")
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("format", &self.format())
            .finish()
    }
}

impl WeightMatrix {
    /// An f32 matrix; `data.len()` must be `rows * cols`.
    pub fn from_f32(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        assert_eq!(data.len(), rows * cols, "f32 weights must be rows × cols");
        Self {
            rows,
            cols,
            data: Data::F32(data),
        }
    }

    /// A matrix from little-endian bytes of `format` (any alignment), row after row; a
    /// block format needs `cols` to be a whole number of blocks.
    pub fn from_bytes(
        format: WeightFormat,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Self, QuantError> {
        let per = format.block_elements();
        let expected = rows * (cols / per) * format.block_bytes();
        if !cols.is_multiple_of(per) || bytes.len() != expected {
            return Err(QuantError::MatrixShape {
                format: format.name(),
                rows,
                cols,
                bytes: bytes.len(),
            });
        }
        let data = match format {
            WeightFormat::F32 => Data::F32(collect(bytes)),
            WeightFormat::Bf16 => Data::Bf16(collect(bytes)),
            WeightFormat::Q8_0 => Data::Q8_0(collect(bytes)),
            WeightFormat::Q4_1 => Data::Q4_1(collect(bytes)),
        };
        Ok(Self { rows, cols, data })
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The storage format.
    pub fn format(&self) -> WeightFormat {
        match &self.data {
            Data::F32(_) => WeightFormat::F32,
            Data::Bf16(_) => WeightFormat::Bf16,
            Data::Q8_0(_) => WeightFormat::Q8_0,
            Data::Q4_1(_) => WeightFormat::Q4_1,
            Data::Packed(p) => match p.kind() {
                PackedKind::Q8_0 => WeightFormat::Q8_0,
                PackedKind::Q4_1 => WeightFormat::Q4_1,
            },
        }
    }

    /// Whether products use 8-bit activations and integer dot products (see
    /// [`Self::into_int8`]).
    pub fn is_int8(&self) -> bool {
        matches!(self.data, Data::Packed(_))
    }

    /// The matrix repacked for integer dot products with 8-bit-quantized activations
    /// (`cpu::int8`) when it is `Q8_0` or `Q4_1`; other formats are returned unchanged. Products
    /// are then faster, but no longer bit-identical to f32 over the dequantized matrix.
    pub fn into_int8(self) -> Self {
        let data = match self.data {
            Data::Q8_0(v) => Data::Packed(PackedMatrix::from_q8_0(self.rows, self.cols, &v)),
            Data::Q4_1(v) => Data::Packed(PackedMatrix::from_q4_1(self.rows, self.cols, &v)),
            other => other,
        };
        Self { data, ..self }
    }

    /// Bytes the values occupy in memory.
    pub fn storage_bytes(&self) -> usize {
        self.rows * (self.cols / self.format().block_elements()) * self.format().block_bytes()
    }

    /// Writes rows `start..start + out.len() / cols` as f32 with `dequant`.
    fn rows_f32_with(&self, dequant: &Dequant, start: usize, out: &mut [f32]) {
        let (cols, n) = (self.cols, out.len() / self.cols);
        debug_assert!(start + n <= self.rows && out.len() == n * cols);
        let per = self.format().block_elements();
        let (b0, b1) = (start * cols / per, (start + n) * cols / per);
        match &self.data {
            Data::F32(v) => out.copy_from_slice(&v[b0..b1]),
            Data::Bf16(v) => (dequant.bf16)(&v[b0..b1], out),
            Data::Q8_0(v) => (dequant.q8_0)(&v[b0..b1], out),
            Data::Q4_1(v) => (dequant.q4_1)(&v[b0..b1], out),
            Data::Packed(p) => {
                for (r, row) in out.chunks_exact_mut(cols).enumerate() {
                    p.row_f32(start + r, row);
                }
            }
        }
    }

    /// Row `r` as f32 (`out.len() == cols`), e.g. an embedding lookup. Exact, so the same
    /// on every level.
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows, "row {r} of a {}-row matrix", self.rows);
        assert_eq!(out.len(), self.cols, "a row has cols values");
        self.rows_f32_with(&PORTABLE_DEQUANT, r, out);
    }

    /// The whole matrix as f32 (exact).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        if self.rows > 0 && self.cols > 0 {
            self.rows_f32_with(&PORTABLE_DEQUANT, 0, &mut out);
        }
        out
    }

    /// The matrices' rows stacked (their widths must agree): in their common format, or
    /// as f32 when their formats differ.
    pub fn concat_rows(parts: Vec<WeightMatrix>) -> WeightMatrix {
        let cols = parts.first().map_or(0, |p| p.cols);
        assert!(
            parts.iter().all(|p| p.cols == cols),
            "stacked matrices must have equal widths"
        );
        let rows = parts.iter().map(|p| p.rows).sum();
        let format = parts.first().map(|p| p.format());
        if parts.len() == 1 {
            return parts.into_iter().next().expect("one part");
        }
        let data = if parts
            .iter()
            .all(|p| Some(p.format()) == format && !p.is_int8())
        {
            let mut it = parts.into_iter().map(|p| p.data);
            let first = it.next();
            match first {
                Some(Data::F32(mut v)) => {
                    it.for_each(|d| v.extend(as_f32(d)));
                    Data::F32(v)
                }
                Some(Data::Bf16(mut v)) => {
                    it.for_each(|d| {
                        if let Data::Bf16(w) = d {
                            v.extend(w)
                        }
                    });
                    Data::Bf16(v)
                }
                Some(Data::Q8_0(mut v)) => {
                    it.for_each(|d| {
                        if let Data::Q8_0(w) = d {
                            v.extend(w)
                        }
                    });
                    Data::Q8_0(v)
                }
                Some(Data::Q4_1(mut v)) => {
                    it.for_each(|d| {
                        if let Data::Q4_1(w) = d {
                            v.extend(w)
                        }
                    });
                    Data::Q4_1(v)
                }
                Some(Data::Packed(_)) => unreachable!("int8 matrices are stacked as f32"),
                None => Data::F32(Vec::new()),
            }
        } else {
            Data::F32(parts.iter().flat_map(|p| p.to_f32()).collect())
        };
        WeightMatrix { rows, cols, data }
    }
}

/// `bytes` (any alignment) as values of `B`.
fn collect<B: bytemuck::Pod>(bytes: &[u8]) -> Vec<B> {
    bytes
        .chunks_exact(size_of::<B>())
        .map(bytemuck::pod_read_unaligned)
        .collect()
}

fn as_f32(d: Data) -> Vec<f32> {
    match d {
        Data::F32(v) => v,
        _ => unreachable!("formats were checked equal"),
    }
}

/// Dequantized weights per buffer fill: about 64 KiB of f32, whole register tiles, 8..=64
/// rows.
fn rows_per_fill(k: usize) -> usize {
    ((16 * 1024) / k).clamp(8, 64) / 8 * 8
}

thread_local! {
    /// Dequantized rows of the current fill.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ + bias[n]` for a stored matrix (`k = w.cols()`), with
/// the dispatched kernels; f32 matrices go straight to [`super::matmul::linear`].
pub fn linear_weights(
    x: &[f32],
    w: &WeightMatrix,
    bias: Option<&[f32]>,
    m: usize,
    out: &mut [f32],
) {
    linear_weights_with(kernels(), x, w, bias, m, out)
}

/// [`linear_weights`] with an explicit level's kernels.
pub fn linear_weights_with(
    kernels: &Kernels,
    x: &[f32],
    w: &WeightMatrix,
    bias: Option<&[f32]>,
    m: usize,
    out: &mut [f32],
) {
    let (n, k) = (w.rows, w.cols);
    match &w.data {
        Data::F32(v) => return linear_with(kernels, x, v, bias, m, k, out),
        Data::Packed(p) => return linear_int8_with(kernels, x, p, bias, m, out),
        _ => {}
    }
    assert!(k > 0, "k must be positive");
    assert_eq!(x.len(), m * k, "x must be m×k");
    assert_eq!(out.len(), m * n, "out must be m×n");
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "bias must have n values");
    }
    if m == 0 || n == 0 {
        return;
    }
    let (gemm, dequant) = (kernels.gemm, &kernels.dequant);
    let chunk = rows_per_task(n);
    // Small batches (decode) dequantize a few rows at a time so they stay in L1; large ones
    // (prefill) dequantize the task's rows at once, so `x` is read once per task as in the
    // f32 path. Either way every output element is computed the same way.
    let fill = if m >= 32 { chunk } else { rows_per_fill(k) };
    let ptr = SharedOut(out.as_mut_ptr());
    (0..n.div_ceil(chunk)).into_par_iter().for_each(|ci| {
        let (j0, j1) = (ci * chunk, ((ci + 1) * chunk).min(n));
        SCRATCH.with_borrow_mut(|buf| {
            let mut j = j0;
            while j < j1 {
                let rows = fill.min(j1 - j);
                buf.resize(rows * k, 0.0);
                let wc = &mut buf[..rows * k];
                w.rows_f32_with(dequant, j, wc);
                // SAFETY: this task writes out[i * n + c] for i < m and c in j..j + rows
                // only: inside `out` (m × n) and disjoint from every other task's columns
                // (tasks own disjoint j0..j1). `out` is borrowed mutably for the whole loop.
                unsafe {
                    let base = ptr.get().add(j);
                    gemm(x, wc, k, base, n);
                    if let Some(b) = bias {
                        for i in 0..m {
                            for (r, bv) in b[j..j + rows].iter().enumerate() {
                                *base.add(i * n + r) += bv;
                            }
                        }
                    }
                }
                j += rows;
            }
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::dispatch::Level;
    use half::f16;
    use rand::{Rng, SeedableRng};

    fn random(rng: &mut impl Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
    }

    fn levels() -> Vec<&'static Kernels> {
        Level::available()
            .into_iter()
            .map(|l| Kernels::for_level(l).unwrap())
            .collect()
    }

    /// A random matrix of `format` with realistic scales (and a few edge quants).
    fn random_matrix(rng: &mut impl Rng, format: WeightFormat, n: usize, k: usize) -> WeightMatrix {
        let blocks = n * k / format.block_elements();
        let bytes: Vec<u8> = match format {
            WeightFormat::F32 => bytemuck::cast_slice(&random(rng, n * k)).to_vec(),
            WeightFormat::Bf16 => {
                let v: Vec<bf16> = (0..n * k)
                    .map(|_| bf16::from_f32(rng.random_range(-1.0..1.0)))
                    .collect();
                bytemuck::cast_slice(&v).to_vec()
            }
            WeightFormat::Q8_0 => {
                let v: Vec<BlockQ8_0> = (0..blocks)
                    .map(|_| BlockQ8_0 {
                        d: f16::from_f32(rng.random_range(-0.02..0.02)),
                        qs: std::array::from_fn(|_| rng.random()),
                    })
                    .collect();
                bytemuck::cast_slice(&v).to_vec()
            }
            WeightFormat::Q4_1 => {
                let v: Vec<BlockQ4_1> = (0..blocks)
                    .map(|_| BlockQ4_1 {
                        d: f16::from_f32(rng.random_range(0.0..0.01)),
                        m: f16::from_f32(rng.random_range(-0.08..0.0)),
                        qs: std::array::from_fn(|_| rng.random()),
                    })
                    .collect();
                bytemuck::cast_slice(&v).to_vec()
            }
        };
        WeightMatrix::from_bytes(format, n, k, &bytes).unwrap()
    }

    const FORMATS: [WeightFormat; 4] = [
        WeightFormat::F32,
        WeightFormat::Bf16,
        WeightFormat::Q8_0,
        WeightFormat::Q4_1,
    ];

    /// (m, k, n): k a multiple of 32 for the block formats; n and m not multiples of tiles.
    const SHAPES: [(usize, usize, usize); 7] = [
        (1, 32, 1),
        (1, 64, 13),
        (3, 96, 19),
        (7, 576, 67),
        (5, 160, 300),
        (13, 1536, 41),
        (2, 32, 257),
    ];

    #[test]
    fn every_level_equals_f32_linear_over_the_dequantized_matrix() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for format in FORMATS {
            for (m, k, n) in SHAPES {
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

    #[test]
    fn every_level_dequantizer_equals_the_reference() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
        for format in [WeightFormat::Bf16, WeightFormat::Q8_0, WeightFormat::Q4_1] {
            for (rows, cols) in [(1, 32), (3, 64), (5, 576), (2, 96)] {
                let w = random_matrix(&mut rng, format, rows, cols);
                let want = w.to_f32();
                for kern in levels() {
                    let mut got = vec![f32::NAN; rows * cols];
                    w.rows_f32_with(&kern.dequant, 0, &mut got);
                    assert_eq!(
                        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{kern:?} {format:?} {rows}x{cols}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_level_gives_rows_that_do_not_depend_on_batch() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(13);
        for format in FORMATS {
            let (m, k, n) = (7, 576, 45);
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
    fn concat_keeps_a_common_format_and_falls_back_to_f32() {
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
        assert_eq!(ac.format(), WeightFormat::F32);
        assert_eq!(ac.to_f32(), [a.to_f32(), c.to_f32()].concat());
        let mut row = vec![0f32; 64];
        ac.row_f32(4, &mut row);
        assert_eq!(row, c.to_f32()[64..]);
        assert!(WeightMatrix::from_bytes(WeightFormat::Q8_0, 1, 48, &[0; 34]).is_err());
    }
}
