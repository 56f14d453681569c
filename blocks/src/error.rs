//! What goes wrong when bytes and a format's blocks do not fit together.

/// Input and output lengths that do not fit together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuantError {
    /// The input is not a whole number of blocks (or of 2-byte values for f16/bf16).
    #[error("{format}: {bytes} bytes is not a whole number of {unit}-byte blocks")]
    PartialBlock {
        /// The format's name (`Q4_K`, `F16`).
        format: &'static str,
        /// Input length.
        bytes: usize,
        /// Bytes per block.
        unit: usize,
    },
    /// The output does not have room for exactly the values the input holds.
    #[error("{format}: the input holds {values} values but the output has {out} slots")]
    OutputLength {
        /// The format's name.
        format: &'static str,
        /// Values in the input.
        values: usize,
        /// Output length.
        out: usize,
    },
    /// A matrix shape that the bytes (or the format's blocks) do not fit.
    #[error(
        "{format}: a {rows}×{cols} matrix cannot be stored in {bytes} bytes (rows must be \
         whole blocks)"
    )]
    MatrixShape {
        /// The format's name.
        format: &'static str,
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
        /// Input length.
        bytes: usize,
    },
}
