//! Weight matrices kept in their file's format, multiplied without an f32 copy of the model.
//!
//! [`WeightMatrix`] holds a `rows × cols` matrix in the PyTorch `Linear` layout as f32,
//! bfloat16, f16, or GGUF blocks (`Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, `IQ4_NL`, `MXFP4` of 32
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

mod concat;
mod dequant_rows;
mod linear;
mod repack;
#[cfg(test)]
mod tests;

use half::{bf16, f16};

use super::int8::packed::{PackedKind, PackedMatrix};
use crate::quant::{
    BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K,
    BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0, QuantError,
};

pub(crate) use dequant_rows::{Dequant, PORTABLE_DEQUANT, bf16_to_f32_ref, f16_to_f32_ref};
pub use linear::{ActivationDtype, linear_weights, linear_weights_as, linear_weights_with};
pub use tessera_blocks::WeightFormat;

/// A matrix's values in their storage format.
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
    MXFP4(Vec<BlockMXFP4>),
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
            WeightFormat::MXFP4 => Data::MXFP4(collect(bytes)),
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
                PackedKind::MXFP4 => WeightFormat::MXFP4,
            },
            Data::Q4K(_) => WeightFormat::Q4K,
            Data::Q5K(_) => WeightFormat::Q5K,
            Data::Q6K(_) => WeightFormat::Q6K,
            Data::Q2K(_) => WeightFormat::Q2K,
            Data::Q3K(_) => WeightFormat::Q3K,
            Data::IQ4NL(_) => WeightFormat::IQ4NL,
            Data::IQ4XS(_) => WeightFormat::IQ4XS,
            Data::MXFP4(_) => WeightFormat::MXFP4,
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

    /// Bytes the values occupy in the file's format (the format's bytes per block).
    pub fn storage_bytes(&self) -> usize {
        if let Data::Stack(parts) = &self.data {
            return parts.iter().map(Self::storage_bytes).sum();
        }
        self.rows * (self.cols / self.format().block_elements()) * self.format().block_bytes()
    }

    /// Bytes the values take in memory as held, which a product reads: those of
    /// [`Self::storage_bytes`], but for matrices repacked for int8 products, whose tiles
    /// (padding rows included) may differ from the file.
    pub fn resident_bytes(&self) -> usize {
        match &self.data {
            Data::Stack(parts) => parts.iter().map(Self::resident_bytes).sum(),
            Data::Packed(p) => p.packed_bytes(),
            _ => self.storage_bytes(),
        }
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
}

/// `bytes` (any alignment) as values of `B`.
fn collect<B: bytemuck::Pod>(bytes: &[u8]) -> Vec<B> {
    bytes
        .chunks_exact(size_of::<B>())
        .map(bytemuck::pod_read_unaligned)
        .collect()
}
