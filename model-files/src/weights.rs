//! The one interface the engine uses to read weights, whatever the file format.

use std::ops::Range;

use tessera_blocks::WeightFormat;

use crate::FormatError;

/// A dense f32 tensor in host memory, row-major, shaped as in Hugging Face transformers.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Dimensions, outermost first (a linear weight is `[out_features, in_features]`).
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values.
    pub data: Vec<f32>,
}

impl HostTensor {
    /// The part `range` of dimension `dim` (0: rows, 1: columns of a matrix), or `None` when
    /// the tensor has fewer dimensions or the range does not fit.
    pub fn slice(&self, dim: usize, range: Range<usize>) -> Option<HostTensor> {
        let (outer, len, inner) = split_at_dim(&self.shape, dim, &range)?;
        let mut data = Vec::with_capacity(outer * range.len() * inner);
        for o in 0..outer {
            let base = o * len * inner;
            data.extend_from_slice(
                &self.data[base + range.start * inner..base + range.end * inner],
            );
        }
        let mut shape = self.shape.clone();
        shape[dim] = range.len();
        Some(HostTensor { shape, data })
    }
}

/// A matrix in its file's storage format, for kernels that multiply it directly
/// (`tessera_kernels::cpu::WeightMatrix::from_bytes`).
#[derive(Debug, Clone, PartialEq)]
pub struct NativeTensor {
    /// How `bytes` encode the values.
    pub format: WeightFormat,
    /// `[rows, cols]` in Hugging Face layout; rows are whole blocks of `format`.
    pub shape: [usize; 2],
    /// Little-endian values (or blocks), row after row, in Hugging Face row order.
    pub bytes: Vec<u8>,
}

/// `(outer, shape[dim], inner)` element counts around `dim`, if `range` fits in it.
pub(crate) fn split_at_dim(
    shape: &[usize],
    dim: usize,
    range: &Range<usize>,
) -> Option<(usize, usize, usize)> {
    let len = *shape.get(dim)?;
    if range.start > range.end || range.end > len {
        return None;
    }
    Some((
        shape[..dim].iter().product(),
        len,
        shape[dim + 1..].iter().product(),
    ))
}

/// The error for a slice that does not fit a tensor.
pub(crate) fn bad_slice(
    path: impl Into<std::path::PathBuf>,
    name: &str,
    shape: &[usize],
    dim: usize,
    range: &Range<usize>,
) -> FormatError {
    FormatError::tensor(
        path,
        name,
        format!("cannot take {range:?} of dimension {dim} of a tensor shaped {shape:?}"),
    )
}

/// Weights addressed by their Hugging Face name (`model.layers.0.self_attn.q_proj.weight`).
///
/// Implementations translate names and layouts of their format (GGUF's `blk.0.attn_q.weight`
/// with llama.cpp's q/k row permutation) so that the engine sees one convention.
pub trait WeightSource: Send + Sync {
    /// Whether a tensor of this name exists.
    fn contains(&self, name: &str) -> bool;
    /// The tensor's Hugging Face shape.
    fn shape(&self, name: &str) -> Result<Vec<usize>, FormatError>;
    /// The tensor converted (or dequantized) to f32.
    fn load_f32(&self, name: &str) -> Result<HostTensor, FormatError>;
    /// Only `range` of dimension `dim` (0: rows, 1: columns, in Hugging Face layout),
    /// converted to f32: what one tensor-parallel rank holds. The result's shape has
    /// `range.len()` in `dim`. Formats read only the bytes they need where their layout
    /// allows it; this default loads the whole tensor and cuts it.
    fn load_f32_slice(
        &self,
        name: &str,
        dim: usize,
        range: Range<usize>,
    ) -> Result<HostTensor, FormatError> {
        let t = self.load_f32(name)?;
        t.slice(dim, range.clone())
            .ok_or_else(|| bad_slice("", name, &t.shape, dim, &range))
    }
    /// The whole matrix in its storage format, when that format is one the kernels
    /// multiply directly and not plain f32 (`Ok(None)` otherwise: use [`Self::load_f32`]).
    /// Rows come in Hugging Face order, like [`Self::load_f32`]'s. This default has none.
    fn load_native(&self, name: &str) -> Result<Option<NativeTensor>, FormatError> {
        let _ = name;
        Ok(None)
    }
    /// Only `range` of dimension `dim` of the matrix, in its storage format: what one
    /// tensor-parallel rank holds (see [`Self::load_f32_slice`]). `Ok(None)` when the source
    /// cannot cut it natively (not a native format, or columns that split blocks): use
    /// [`Self::load_f32_slice`]. This default has none.
    fn load_native_slice(
        &self,
        name: &str,
        dim: usize,
        range: Range<usize>,
    ) -> Result<Option<NativeTensor>, FormatError> {
        let _ = (name, dim, range);
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_rows_and_columns() {
        let t = HostTensor {
            shape: vec![3, 4],
            data: (0..12).map(|v| v as f32).collect(),
        };
        let rows = t.slice(0, 1..3).unwrap();
        assert_eq!(rows.shape, [2, 4]);
        assert_eq!(rows.data, [4., 5., 6., 7., 8., 9., 10., 11.]);
        let cols = t.slice(1, 1..3).unwrap();
        assert_eq!(cols.shape, [3, 2]);
        assert_eq!(cols.data, [1., 2., 5., 6., 9., 10.]);
        assert!(t.slice(1, 2..5).is_none());
        assert!(t.slice(2, 0..1).is_none());
    }
}
