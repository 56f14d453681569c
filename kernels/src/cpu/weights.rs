//! Weight matrices kept in their file's format, multiplied without an f32 copy of the model.
//!
//! [`WeightMatrix`] holds a `rows × cols` matrix in the PyTorch `Linear` layout as f32,
//! bfloat16, f16, or GGUF blocks (`Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, `IQ4_NL` of 32
//! values; `Q2_K`, `Q3_K`, `Q4_K`, `Q5_K`, `Q6_K`, `IQ4_XS` super-blocks of 256), each row a
//! whole number of blocks.
//! [`linear_weights`] computes `out = x · wᵀ + b` like [`super::matmul::linear`]: each rayon
//! task dequantizes a few weight rows at a time into a small per-thread buffer, with the
//! dispatched level's dequantizer, and hands them to the level's f32 kernel while they are
//! in cache. Every dequantizer is exact, so an output is bit-identical to
//! [`super::matmul::linear`] over the dequantized matrix at the same level, and keeps its
//! reduction order for any batch size. Exact because every product fits an f32's 24-bit
//! significand: an f16 scale (11 bits) times a quant of at most 8 bits, or times a 6-bit
//! sub-block scale and a 5-bit quant (`Q4_K`/`Q5_K`), or times an 8-bit sub-block scale and
//! a 6-bit quant (`Q6_K`, 11 + 7 + 5 bits of magnitude), or times a 6-bit sub-block scale and
//! a 7-bit table value (`IQ4_XS`). So `q·d − m` rounds once, fused or not, `d·s·q` never, and
//! f16 and bfloat16 widen exactly.
#![allow(unsafe_code)]

use std::cell::RefCell;

use half::{bf16, f16};
use rayon::prelude::*;

use super::dispatch::{Kernels, Level, kernels};
use super::int8::linear_int8_with;
use super::int8::packed::{PackedKind, PackedMatrix};
use super::matmul::{SharedOut, add_bias, check_shapes, linear_chunks, linear_with, rows_per_task};
use crate::quant::{
    BlockIQ4NL, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0,
    BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0, QK_K, QK8_0, QuantError, dequantize_row_iq4_nl,
    dequantize_row_iq4_xs, dequantize_row_q2_k, dequantize_row_q3_k, dequantize_row_q4_0,
    dequantize_row_q4_1, dequantize_row_q4_k, dequantize_row_q5_0, dequantize_row_q5_1,
    dequantize_row_q5_k, dequantize_row_q6_k, dequantize_row_q8_0,
};

/// How a [`WeightMatrix`] stores its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// Plain f32.
    F32,
    /// bfloat16 (the upper half of an f32).
    Bf16,
    /// IEEE half precision.
    F16,
    /// GGUF `Q8_0` blocks: 32 values, f16 scale, 8-bit quants.
    Q8_0,
    /// GGUF `Q4_0` blocks: 32 values, f16 scale, 4-bit quants offset by 8.
    Q4_0,
    /// GGUF `Q4_1` blocks: 32 values, f16 scale and minimum, 4-bit quants.
    Q4_1,
    /// GGUF `Q5_0` blocks: 32 values, f16 scale, 5-bit quants offset by 16.
    Q5_0,
    /// GGUF `Q5_1` blocks: 32 values, f16 scale and minimum, 5-bit quants.
    Q5_1,
    /// GGUF `Q4_K` super-blocks: 256 values, 6-bit sub-block scales and minimums, 4-bit
    /// quants.
    Q4K,
    /// GGUF `Q5_K` super-blocks: as `Q4_K` with 5-bit quants.
    Q5K,
    /// GGUF `Q6_K` super-blocks: 256 values, 8-bit sub-block scales, 6-bit quants.
    Q6K,
    /// GGUF `Q2_K` super-blocks: 256 values, 4-bit sub-block scales and minimums per 16,
    /// 2-bit quants.
    Q2K,
    /// GGUF `Q3_K` super-blocks: 256 values, 6-bit sub-block scales per 16, 3-bit quants.
    Q3K,
    /// GGUF `IQ4_NL` blocks: 32 values, f16 scale, 4-bit indices into a fixed table.
    IQ4NL,
    /// GGUF `IQ4_XS` super-blocks: 256 values, 6-bit sub-block scales, `IQ4_NL`'s indices.
    IQ4XS,
}

impl WeightFormat {
    /// Every format, for tests and tables.
    pub const ALL: [WeightFormat; 15] = [
        Self::F32,
        Self::Bf16,
        Self::F16,
        Self::Q8_0,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
        Self::IQ4NL,
        Self::IQ4XS,
        Self::Q2K,
        Self::Q3K,
    ];

    /// Values per block (1 for the float formats).
    pub const fn block_elements(self) -> usize {
        match self {
            Self::F32 | Self::Bf16 | Self::F16 => 1,
            Self::Q8_0 | Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::IQ4NL => QK8_0,
            Self::Q2K | Self::Q3K | Self::Q4K | Self::Q5K | Self::Q6K | Self::IQ4XS => QK_K,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 | Self::F16 => 2,
            Self::Q8_0 => size_of::<BlockQ8_0>(),
            Self::Q4_0 => size_of::<BlockQ4_0>(),
            Self::Q4_1 => size_of::<BlockQ4_1>(),
            Self::Q5_0 => size_of::<BlockQ5_0>(),
            Self::Q5_1 => size_of::<BlockQ5_1>(),
            Self::Q4K => size_of::<BlockQ4K>(),
            Self::Q5K => size_of::<BlockQ5K>(),
            Self::Q6K => size_of::<BlockQ6K>(),
            Self::IQ4NL => size_of::<BlockIQ4NL>(),
            Self::IQ4XS => size_of::<BlockIQ4XS>(),
            Self::Q2K => size_of::<BlockQ2K>(),
            Self::Q3K => size_of::<BlockQ3K>(),
        }
    }

    /// The name GGUF uses (`Q4_K`, `BF16`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::Bf16 => "BF16",
            Self::F16 => "F16",
            Self::Q8_0 => "Q8_0",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
            Self::IQ4NL => "IQ4_NL",
            Self::IQ4XS => "IQ4_XS",
            Self::Q2K => "Q2_K",
            Self::Q3K => "Q3_K",
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
    /// `out.len() == src.len()`.
    pub(crate) f16: fn(&[f16], &mut [f32]),
    /// `out.len() == blocks.len() * 32`.
    pub(crate) q4_0: fn(&[BlockQ4_0], &mut [f32]),
    /// `out.len() == blocks.len() * 32`.
    pub(crate) q5_0: fn(&[BlockQ5_0], &mut [f32]),
    /// `out.len() == blocks.len() * 32`.
    pub(crate) q5_1: fn(&[BlockQ5_1], &mut [f32]),
    /// `out.len() == blocks.len() * 256`.
    pub(crate) q4_k: fn(&[BlockQ4K], &mut [f32]),
    /// `out.len() == blocks.len() * 256`.
    pub(crate) q5_k: fn(&[BlockQ5K], &mut [f32]),
    /// `out.len() == blocks.len() * 256`.
    pub(crate) q6_k: fn(&[BlockQ6K], &mut [f32]),
    /// `out.len() == blocks.len() * 256`.
    pub(crate) q2_k: fn(&[BlockQ2K], &mut [f32]),
    /// `out.len() == blocks.len() * 256`.
    pub(crate) q3_k: fn(&[BlockQ3K], &mut [f32]),
    /// `out.len() == blocks.len() * 32`.
    pub(crate) iq4_nl: fn(&[BlockIQ4NL], &mut [f32]),
    /// `out.len() == blocks.len() * 256`.
    pub(crate) iq4_xs: fn(&[BlockIQ4XS], &mut [f32]),
}

/// bfloat16 to f32, the portable level's (and the reference).
pub(crate) fn bf16_to_f32_ref(src: &[bf16], out: &mut [f32]) {
    for (o, v) in out.iter_mut().zip(src) {
        *o = v.to_f32();
    }
}

/// f16 to f32, the portable level's (and the reference).
pub(crate) fn f16_to_f32_ref(src: &[f16], out: &mut [f32]) {
    for (o, v) in out.iter_mut().zip(src) {
        *o = v.to_f32();
    }
}

/// The portable level's dequantizers: the scalar references.
pub(crate) const PORTABLE_DEQUANT: Dequant = Dequant {
    q8_0: dequantize_row_q8_0,
    q4_1: dequantize_row_q4_1,
    bf16: bf16_to_f32_ref,
    f16: f16_to_f32_ref,
    q4_0: dequantize_row_q4_0,
    q5_0: dequantize_row_q5_0,
    q5_1: dequantize_row_q5_1,
    q4_k: dequantize_row_q4_k,
    q5_k: dequantize_row_q5_k,
    q6_k: dequantize_row_q6_k,
    q2_k: dequantize_row_q2_k,
    q3_k: dequantize_row_q3_k,
    iq4_nl: dequantize_row_iq4_nl,
    iq4_xs: dequantize_row_iq4_xs,
};

#[derive(Clone)]
enum Data {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
    Q8_0(Vec<BlockQ8_0>),
    Q4_0(Vec<BlockQ4_0>),
    Q4_1(Vec<BlockQ4_1>),
    Q5_0(Vec<BlockQ5_0>),
    Q5_1(Vec<BlockQ5_1>),
    Q4K(Vec<BlockQ4K>),
    Q5K(Vec<BlockQ5K>),
    Q6K(Vec<BlockQ6K>),
    /// Not repacked for int8 (see [`WeightMatrix::into_int8`]).
    Q2K(Vec<BlockQ2K>),
    Q3K(Vec<BlockQ3K>),
    IQ4NL(Vec<BlockIQ4NL>),
    IQ4XS(Vec<BlockIQ4XS>),
    /// A block format repacked for integer dot products (see `cpu::int8`).
    Packed(PackedMatrix),
    /// Matrices of different formats stacked row-wise, each kept (and multiplied) in its own:
    /// llama.cpp's mixes give v another format than q and k, and their fused projection
    /// would otherwise be f32. Never nested, never fewer than two.
    Stack(Vec<WeightMatrix>),
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
    /// block format needs `cols` to be a whole number of blocks (of 256 values for the
    /// K-quants).
    pub fn from_bytes(
        format: WeightFormat,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Self, QuantError> {
        let per = format.block_elements();
        let expected = rows
            .checked_mul(cols / per)
            .and_then(|b| b.checked_mul(format.block_bytes()));
        if !cols.is_multiple_of(per) || expected != Some(bytes.len()) {
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
            WeightFormat::F16 => Data::F16(collect(bytes)),
            WeightFormat::Q8_0 => Data::Q8_0(collect(bytes)),
            WeightFormat::Q4_0 => Data::Q4_0(collect(bytes)),
            WeightFormat::Q4_1 => Data::Q4_1(collect(bytes)),
            WeightFormat::Q5_0 => Data::Q5_0(collect(bytes)),
            WeightFormat::Q5_1 => Data::Q5_1(collect(bytes)),
            WeightFormat::Q4K => Data::Q4K(collect(bytes)),
            WeightFormat::Q5K => Data::Q5K(collect(bytes)),
            WeightFormat::Q6K => Data::Q6K(collect(bytes)),
            WeightFormat::Q2K => Data::Q2K(collect(bytes)),
            WeightFormat::Q3K => Data::Q3K(collect(bytes)),
            WeightFormat::IQ4NL => Data::IQ4NL(collect(bytes)),
            WeightFormat::IQ4XS => Data::IQ4XS(collect(bytes)),
        };
        Ok(Self { rows, cols, data })
    }

    /// The GGUF blocks of a `Q8_0`, `Q4_0` or `Q4_1` matrix as they are in the file (row after
    /// row), for a device that multiplies them itself; `None` for other formats and for
    /// matrices repacked for integer dot products.
    pub fn ggml_blocks(&self) -> Option<(WeightFormat, &[u8])> {
        match &self.data {
            Data::Q8_0(v) => Some((WeightFormat::Q8_0, bytemuck::cast_slice(v))),
            Data::Q4_0(v) => Some((WeightFormat::Q4_0, bytemuck::cast_slice(v))),
            Data::Q4_1(v) => Some((WeightFormat::Q4_1, bytemuck::cast_slice(v))),
            _ => None,
        }
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The storage format (of most of the bytes, for a stack of matrices in several formats:
    /// see [`Self::concat_rows`]).
    pub fn format(&self) -> WeightFormat {
        match &self.data {
            Data::Stack(parts) => parts
                .iter()
                .max_by_key(|p| p.storage_bytes())
                .map_or(WeightFormat::F32, |p| p.format()),
            Data::F32(_) => WeightFormat::F32,
            Data::Bf16(_) => WeightFormat::Bf16,
            Data::F16(_) => WeightFormat::F16,
            Data::Q8_0(_) => WeightFormat::Q8_0,
            Data::Q4_0(_) => WeightFormat::Q4_0,
            Data::Q4_1(_) => WeightFormat::Q4_1,
            Data::Q5_0(_) => WeightFormat::Q5_0,
            Data::Q5_1(_) => WeightFormat::Q5_1,
            Data::Packed(p) => match p.kind() {
                PackedKind::Q8_0 => WeightFormat::Q8_0,
                PackedKind::Q4_1 => WeightFormat::Q4_1,
                PackedKind::Q4_0 => WeightFormat::Q4_0,
                PackedKind::Q5_0 => WeightFormat::Q5_0,
                PackedKind::Q5_1 => WeightFormat::Q5_1,
                PackedKind::Q4K => WeightFormat::Q4K,
                PackedKind::Q5K => WeightFormat::Q5K,
                PackedKind::Q6K => WeightFormat::Q6K,
                PackedKind::Q3K => WeightFormat::Q3K,
                PackedKind::IQ4NL => WeightFormat::IQ4NL,
                PackedKind::IQ4XS => WeightFormat::IQ4XS,
            },
            Data::Q4K(_) => WeightFormat::Q4K,
            Data::Q5K(_) => WeightFormat::Q5K,
            Data::Q6K(_) => WeightFormat::Q6K,
            Data::Q2K(_) => WeightFormat::Q2K,
            Data::Q3K(_) => WeightFormat::Q3K,
            Data::IQ4NL(_) => WeightFormat::IQ4NL,
            Data::IQ4XS(_) => WeightFormat::IQ4XS,
        }
    }

    /// Whether products use 8-bit activations and integer dot products (see
    /// [`Self::into_int8`]).
    pub fn is_int8(&self) -> bool {
        match &self.data {
            Data::Packed(_) => true,
            Data::Stack(parts) => parts.iter().all(|p| p.is_int8()),
            _ => false,
        }
    }

    /// The matrices a stack of several formats keeps (see [`Self::concat_rows`]), top to
    /// bottom; just this matrix otherwise.
    pub fn parts(&self) -> &[WeightMatrix] {
        match &self.data {
            Data::Stack(parts) => parts,
            _ => std::slice::from_ref(self),
        }
    }

    /// The matrix repacked for integer dot products with 8-bit-quantized activations
    /// (`cpu::int8`) when it is in a GGUF block format but `Q2_K` (whose per-16 minimums the
    /// int8 kernels do not take); that and the float formats are returned unchanged. Products
    /// are then faster, but no longer bit-identical to f32 over the dequantized matrix (and
    /// the K-quants' and `IQ4_XS`'s sub-block scales are rounded to f16).
    pub fn into_int8(self) -> Self {
        let data = match self.data {
            Data::Q8_0(v) => Data::Packed(PackedMatrix::from_q8_0(self.rows, self.cols, &v)),
            Data::Q4_1(v) => Data::Packed(PackedMatrix::from_q4_1(self.rows, self.cols, &v)),
            Data::Q4_0(v) => Data::Packed(PackedMatrix::from_q4_0(self.rows, self.cols, &v)),
            Data::Q5_0(v) => match PackedMatrix::from_q5_0(self.rows, self.cols, &v) {
                Some(p) => Data::Packed(p),
                None => Data::Q5_0(v),
            },
            Data::Q5_1(v) => Data::Packed(PackedMatrix::from_q5_1(self.rows, self.cols, &v)),
            Data::Q4K(v) => match PackedMatrix::from_q4_k(self.rows, self.cols, &v) {
                Some(p) => Data::Packed(p),
                None => Data::Q4K(v),
            },
            Data::Q5K(v) => match PackedMatrix::from_q5_k(self.rows, self.cols, &v) {
                Some(p) => Data::Packed(p),
                None => Data::Q5K(v),
            },
            Data::Q6K(v) => match PackedMatrix::from_q6_k(self.rows, self.cols, &v) {
                Some(p) => Data::Packed(p),
                None => Data::Q6K(v),
            },
            Data::Q3K(v) => match PackedMatrix::from_q3_k(self.rows, self.cols, &v) {
                Some(p) => Data::Packed(p),
                None => Data::Q3K(v),
            },
            Data::IQ4NL(v) => Data::Packed(PackedMatrix::from_iq4_nl(self.rows, self.cols, &v)),
            Data::IQ4XS(v) => match PackedMatrix::from_iq4_xs(self.rows, self.cols, &v) {
                Some(p) => Data::Packed(p),
                None => Data::IQ4XS(v),
            },
            Data::Stack(parts) => Data::Stack(parts.into_iter().map(Self::into_int8).collect()),
            other => other,
        };
        Self { data, ..self }
    }

    /// Bytes the values occupy in memory.
    pub fn storage_bytes(&self) -> usize {
        if let Data::Stack(parts) = &self.data {
            return parts.iter().map(Self::storage_bytes).sum();
        }
        self.rows * (self.cols / self.format().block_elements()) * self.format().block_bytes()
    }

    /// Writes rows `start..start + out.len() / cols` as f32 with `dequant`. Rows are whole
    /// blocks (checked by [`Self::from_bytes`]), so any row range is a block range.
    fn rows_f32_with(&self, dequant: &Dequant, start: usize, out: &mut [f32]) {
        let (cols, n) = (self.cols, out.len() / self.cols);
        debug_assert!(start + n <= self.rows && out.len() == n * cols);
        if let Data::Stack(parts) = &self.data {
            // Each part's rows that fall in start..start + n.
            let mut first = 0;
            for p in parts {
                let (lo, hi) = (start.max(first), (start + n).min(first + p.rows));
                if lo < hi {
                    let dst = &mut out[(lo - start) * cols..(hi - start) * cols];
                    p.rows_f32_with(dequant, lo - first, dst);
                }
                first += p.rows;
            }
            return;
        }
        let per = self.format().block_elements();
        let (b0, b1) = (start * cols / per, (start + n) * cols / per);
        match &self.data {
            Data::F32(v) => out.copy_from_slice(&v[b0..b1]),
            Data::Bf16(v) => (dequant.bf16)(&v[b0..b1], out),
            Data::F16(v) => (dequant.f16)(&v[b0..b1], out),
            Data::Q8_0(v) => (dequant.q8_0)(&v[b0..b1], out),
            Data::Q4_0(v) => (dequant.q4_0)(&v[b0..b1], out),
            Data::Q4_1(v) => (dequant.q4_1)(&v[b0..b1], out),
            Data::Q5_0(v) => (dequant.q5_0)(&v[b0..b1], out),
            Data::Q5_1(v) => (dequant.q5_1)(&v[b0..b1], out),
            Data::Packed(p) => {
                for (r, row) in out.chunks_exact_mut(cols).enumerate() {
                    p.row_f32(start + r, row);
                }
            }
            Data::Q4K(v) => (dequant.q4_k)(&v[b0..b1], out),
            Data::Q5K(v) => (dequant.q5_k)(&v[b0..b1], out),
            Data::Q6K(v) => (dequant.q6_k)(&v[b0..b1], out),
            Data::Q2K(v) => (dequant.q2_k)(&v[b0..b1], out),
            Data::Q3K(v) => (dequant.q3_k)(&v[b0..b1], out),
            Data::IQ4NL(v) => (dequant.iq4_nl)(&v[b0..b1], out),
            Data::IQ4XS(v) => (dequant.iq4_xs)(&v[b0..b1], out),
            Data::Stack(_) => unreachable!("stacks are handled above"),
        }
    }

    /// Row `r` as f32 (`out.len() == cols`), e.g. an embedding lookup. Exact, so the same
    /// on every level.
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows, "row {r} of a {}-row matrix", self.rows);
        assert_eq!(out.len(), self.cols, "a row has cols values");
        self.rows_f32_with(&PORTABLE_DEQUANT, r, out);
    }

    /// The whole matrix as f32 (exact), converted on rayon's threads in groups of rows.
    pub fn to_f32(&self) -> Vec<f32> {
        const ROWS: usize = 64;
        let mut out = vec![0f32; self.rows * self.cols];
        if self.rows > 0 && self.cols > 0 {
            out.par_chunks_mut(ROWS * self.cols)
                .enumerate()
                .for_each(|(i, rows)| self.rows_f32_with(&PORTABLE_DEQUANT, i * ROWS, rows));
        }
        out
    }

    /// The values of a bf16 matrix as stored (row after row); `None` for other formats.
    pub fn as_bf16(&self) -> Option<&[bf16]> {
        match &self.data {
            Data::Bf16(v) => Some(v),
            _ => None,
        }
    }

    /// The values of an f32 matrix as stored (row after row); `None` for other formats.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The matrices' rows stacked (their widths must agree): in their common format, or as a
    /// stack of the parts, each in its own format, when their formats differ (or any is
    /// already repacked for int8). A product with a stack multiplies each part in turn.
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
        if !parts.iter().all(|p| {
            Some(p.format()) == format && !matches!(p.data, Data::Packed(_) | Data::Stack(_))
        }) {
            let flat = parts
                .into_iter()
                .flat_map(|p| match p.data {
                    Data::Stack(inner) => inner,
                    _ => vec![p],
                })
                .collect();
            return WeightMatrix {
                rows,
                cols,
                data: Data::Stack(flat),
            };
        }
        let mut it = parts.into_iter().map(|p| p.data);
        // Appends the rest's storage to the first's; every part has the first's variant.
        macro_rules! stack {
            ($($variant:ident),*) => {
                match it.next() {
                    $(Some(Data::$variant(mut v)) => {
                        for d in it {
                            if let Data::$variant(w) = d {
                                v.extend(w);
                            }
                        }
                        Data::$variant(v)
                    })*
                    Some(Data::Packed(_) | Data::Stack(_)) => {
                        unreachable!("repacked matrices and stacks are stacked as parts")
                    }
                    None => Data::F32(Vec::new()),
                }
            };
        }
        let data = stack!(
            F32, Bf16, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4K, Q5K, Q6K, Q2K, Q3K, IQ4NL, IQ4XS
        );
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

/// Dequantized weights per buffer fill: about 64 KiB of f32, whole register tiles, 8..=64
/// rows. Any row count is whole blocks: a row is `k / 32` blocks, or `k / 256` super-blocks
/// for the K-quants (`from_bytes` checks that `k` divides).
/// Rows of `x` from which a task dequantizes all its weight rows at once (see `linear_weights_with`).
const SMALL_BATCH: usize = 8;

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

/// What a product rounds its activations to before multiplying.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ActivationDtype {
    /// Kept in f32: every product as [`linear_weights`] computes it.
    #[default]
    Float32,
    /// Rounded to bf16 when the weights are stored in bf16, and multiplied with
    /// `vdpbf16ps` (see [`super::bf16_dot`]), as a bf16 model computes in PyTorch; products
    /// with weights in other formats are unchanged.
    Bfloat16,
}

/// [`linear_weights`] with the activations in `dtype`.
pub fn linear_weights_as(
    x: &[f32],
    w: &WeightMatrix,
    bias: Option<&[f32]>,
    m: usize,
    out: &mut [f32],
    dtype: ActivationDtype,
) {
    match (&w.data, dtype) {
        (Data::Bf16(v), ActivationDtype::Bfloat16) => {
            super::bf16_dot::linear_bf16_dot(x, v, bias, m, w.cols, out)
        }
        (Data::Stack(parts), _) => linear_parts(parts, bias, m, out, |p, b, o| {
            linear_weights_as(x, p, b, m, o, dtype)
        }),
        _ => linear_weights(x, w, bias, m, out),
    }
}

/// A stack's product: `product(part, its bias, its m × part.rows outputs)` for each part in
/// turn, each written into its columns of `out` (`m × Σ rows`).
fn linear_parts(
    parts: &[WeightMatrix],
    bias: Option<&[f32]>,
    m: usize,
    out: &mut [f32],
    product: impl Fn(&WeightMatrix, Option<&[f32]>, &mut [f32]),
) {
    let n: usize = parts.iter().map(|p| p.rows).sum();
    assert_eq!(out.len(), m * n, "out must be m × rows");
    assert!(bias.is_none_or(|b| b.len() == n), "a bias per output row");
    // Taken out of the thread-local for the call (a part's product may run another stack's
    // product on this thread while it waits), and put back: no allocation per decode step.
    let mut part_out = PART_OUT.take();
    let mut first = 0;
    for p in parts {
        part_out.resize(m * p.rows, 0.0);
        product(p, bias.map(|b| &b[first..first + p.rows]), &mut part_out);
        for (row, part_row) in out.chunks_exact_mut(n).zip(part_out.chunks_exact(p.rows)) {
            row[first..first + p.rows].copy_from_slice(part_row);
        }
        first += p.rows;
    }
    PART_OUT.set(part_out);
}

thread_local! {
    /// One part's outputs in [`linear_parts`].
    static PART_OUT: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
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
        Data::Stack(parts) => {
            return linear_parts(parts, bias, m, out, |p, b, o| {
                linear_weights_with(kernels, x, p, b, m, o)
            });
        }
        _ => {}
    }
    if check_shapes(x, n * k, bias, m, k, out).is_none() {
        return;
    }
    // Small batches widen bf16 in registers: half the bytes of f32 and no scratch buffer,
    // with the same bits as dequantizing first. From `SMALL_BATCH` rows on, each weight
    // vector would be widened again for every 4 rows of x, and dequantizing the task's rows
    // once is faster (measured at 16 rows: 250 → 290 GFLOP/s).
    #[cfg(target_arch = "x86_64")]
    if let Data::Bf16(v) = &w.data
        && m < SMALL_BATCH
        && kernels.level == Level::Avx512
    {
        use super::arch::x86_64::avx512::gemm_bf16;
        // SAFETY: the AVX-512 table is only handed out when avx512f was detected;
        // `linear_chunks` gives `gemm_bf16` the chunk's own columns of `out`.
        return linear_chunks(v, k, m, bias, out, |wc, base| unsafe {
            gemm_bf16(x, wc, k, base, n)
        });
    }
    let (gemm, dequant) = (kernels.gemm, &kernels.dequant);
    let chunk = rows_per_task(n);
    // Single rows and small batches dequantize a few rows at a time so they stay in L1;
    // larger ones (batched decode, prefill) dequantize the task's rows at once, so `x` is
    // read once per task as in the f32 path. Either way every output element is computed the same way.
    let fill = if m >= SMALL_BATCH {
        chunk
    } else {
        rows_per_fill(k)
    };
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
                    add_bias(base, bias, j..j + rows, m, n);
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
    use crate::cpu::test_util::{levels, random};
    use rand::{Rng, SeedableRng};

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
        let bytes: Vec<u8> = match format {
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
                                if unit == 2
                                    && (v & 0x7F80) == 0x7F80
                                    && format == WeightFormat::Bf16
                                {
                                    v &= !0x007F;
                                }
                                if unit == 2
                                    && (v & 0x7C00) == 0x7C00
                                    && format == WeightFormat::F16
                                {
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
    fn k_quants_repack_for_int8_products_close_to_exact_ones() {
        // The K-quants take the integer path (sub-block scales rounded to f16, activations to
        // two 8-bit digits: well under 1e-3 of the products' magnitude).
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(15);
        for format in [WeightFormat::Q4K, WeightFormat::Q5K, WeightFormat::Q6K] {
            for &(m, k, n) in shapes(format) {
                let exact = random_matrix(&mut rng, format, n, k);
                let int8 = exact.clone().into_int8();
                assert_eq!(int8.format(), format);
                assert!(int8.is_int8(), "{format:?}");
                assert_eq!(int8.storage_bytes(), exact.storage_bytes());
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
}
