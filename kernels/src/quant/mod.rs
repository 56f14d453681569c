//! GGUF/ggml quantized blocks: block layouts and scalar reference dequantizers.
//!
//! One file per format (`q8_0.rs`, `q4_0.rs`, …), each with a `#[repr(C)]` block, a size
//! assertion and a `dequantize_row_*` function equal to ggml's (`ggml-quants.c`).
//! [`dequantize`] is the byte-level entry point: it accepts unaligned bytes (a slice of a
//! memory-mapped file) and splits large inputs across threads.
//!
//! ```
//! use tessera_kernels::quant::{dequantize, QuantFormat};
//! // One Q8_0 block: f16 scale 0.5 (0x3800), then 32 signed quants.
//! let mut bytes = vec![0x00, 0x38];
//! bytes.extend((0..32).map(|i| i as u8));
//! let mut out = vec![0.0; 32];
//! dequantize(QuantFormat::Q8_0, &bytes, &mut out)?;
//! assert_eq!(out[3], 1.5);
//! # Ok::<(), tessera_kernels::quant::QuantError>(())
//! ```

mod iq4;
mod q2_k;
mod q3_k;
mod q4_0;
mod q4_1;
mod q4_k;
mod q5_0;
mod q5_1;
mod q5_k;
mod q6_k;
mod q8_0;

use half::{bf16, f16};
use rayon::prelude::*;

pub(crate) use iq4::index4;
pub use iq4::{
    BlockIQ4NL, BlockIQ4XS, KVALUES_IQ4NL, QK4_NL, dequantize_row_iq4_nl, dequantize_row_iq4_xs,
};
pub use q2_k::{BlockQ2K, dequantize_row_q2_k};
pub use q3_k::{BlockQ3K, dequantize_row_q3_k};
pub use q4_0::{BlockQ4_0, QK4_0, dequantize_row_q4_0};
pub use q4_1::{BlockQ4_1, QK4_1, dequantize_row_q4_1};
pub(crate) use q4_k::scales_mins_k4;
pub use q4_k::{BlockQ4K, K_SCALE_SIZE, QK_K, dequantize_row_q4_k, get_scale_min_k4};
pub(crate) use q5_0::quant5;
pub use q5_0::{BlockQ5_0, QK5_0, dequantize_row_q5_0};
pub use q5_1::{BlockQ5_1, QK5_1, dequantize_row_q5_1};
pub use q5_k::{BlockQ5K, dequantize_row_q5_k};
pub use q6_k::{BlockQ6K, dequantize_row_q6_k};
pub use q8_0::{BlockQ8_0, QK8_0, dequantize_row_q8_0};

/// The quantized block formats Tessera can dequantize.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// 32 values, f16 scale, 8-bit quants (34 bytes).
    Q8_0,
    /// 32 values, f16 scale, 4-bit quants (18 bytes).
    Q4_0,
    /// 32 values, f16 scale and minimum, 4-bit quants (20 bytes).
    Q4_1,
    /// 32 values, f16 scale, 5-bit quants (22 bytes).
    Q5_0,
    /// 32 values, f16 scale and minimum, 5-bit quants (24 bytes).
    Q5_1,
    /// 256 values, 4-bit quants with 6-bit sub-block scales and minimums (144 bytes).
    Q4K,
    /// 256 values, 5-bit quants with 6-bit sub-block scales and minimums (176 bytes).
    Q5K,
    /// 256 values, 6-bit quants with 8-bit sub-block scales (210 bytes).
    Q6K,
    /// 256 values, 2-bit quants with 4-bit sub-block scales and minimums (84 bytes).
    Q2K,
    /// 256 values, 3-bit quants with 6-bit sub-block scales (110 bytes).
    Q3K,
    /// 32 values, f16 scale, 4-bit indices into a table of 16 values (18 bytes).
    IQ4NL,
    /// 256 values, 6-bit sub-block scales, 4-bit indices as `IQ4_NL`'s (136 bytes).
    IQ4XS,
}

impl QuantFormat {
    /// Every format, for tests and tables.
    pub const ALL: [QuantFormat; 12] = [
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

    /// Values per block.
    pub const fn block_elements(self) -> usize {
        match self {
            Self::Q8_0 | Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::IQ4NL => 32,
            Self::Q2K | Self::Q3K | Self::Q4K | Self::Q5K | Self::Q6K | Self::IQ4XS => QK_K,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
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

    /// The name ggml and GGUF use (`Q4_K`).
    pub const fn name(self) -> &'static str {
        match self {
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

    /// The inverse of [`QuantFormat::name`].
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }
}

impl std::fmt::Display for QuantFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

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

/// Outputs at least this many values long are split across the rayon pool.
const PARALLEL_VALUES: usize = 1 << 18;
/// Values per parallel task (rounded to whole blocks).
const TASK_VALUES: usize = 1 << 16;

fn check_lengths(
    format: &'static str,
    bytes: usize,
    unit: usize,
    per_unit: usize,
    out: usize,
) -> Result<(), QuantError> {
    if !bytes.is_multiple_of(unit) {
        return Err(QuantError::PartialBlock {
            format,
            bytes,
            unit,
        });
    }
    let values = bytes / unit * per_unit;
    if values != out {
        return Err(QuantError::OutputLength {
            format,
            values,
            out,
        });
    }
    Ok(())
}

/// Runs `row` over `bytes` reinterpreted as blocks of `B`, in parallel for large inputs.
/// Aligned input is reinterpreted in place; unaligned input is copied block by block.
fn run_blocks<B: bytemuck::Pod + Send + Sync>(
    bytes: &[u8],
    out: &mut [f32],
    per_block: usize,
    row: fn(&[B], &mut [f32]),
) {
    let block_bytes = size_of::<B>();
    let one_task = |bytes: &[u8], out: &mut [f32]| match bytemuck::try_cast_slice::<u8, B>(bytes) {
        Ok(blocks) => row(blocks, out),
        Err(_) => {
            const STAGE: usize = 64;
            let mut stage = [B::zeroed(); STAGE];
            for (chunk, out) in bytes
                .chunks(STAGE * block_bytes)
                .zip(out.chunks_mut(STAGE * per_block))
            {
                let n = chunk.len() / block_bytes;
                for (dst, src) in stage.iter_mut().zip(chunk.chunks_exact(block_bytes)) {
                    *dst = bytemuck::pod_read_unaligned(src);
                }
                row(&stage[..n], out);
            }
        }
    };
    if out.len() >= PARALLEL_VALUES {
        let task_blocks = (TASK_VALUES / per_block).max(1);
        bytes
            .par_chunks(task_blocks * block_bytes)
            .zip(out.par_chunks_mut(task_blocks * per_block))
            .for_each(|(bytes, out)| one_task(bytes, out));
    } else {
        one_task(bytes, out);
    }
}

/// Dequantizes `bytes` (whole blocks of `format`, any alignment) into `out`, which must hold
/// exactly `bytes.len() / block_bytes * block_elements` values.
pub fn dequantize(format: QuantFormat, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    check_lengths(
        format.name(),
        bytes.len(),
        format.block_bytes(),
        format.block_elements(),
        out.len(),
    )?;
    let per = format.block_elements();
    match format {
        QuantFormat::Q8_0 => run_blocks::<BlockQ8_0>(bytes, out, per, dequantize_row_q8_0),
        QuantFormat::Q4_0 => run_blocks::<BlockQ4_0>(bytes, out, per, dequantize_row_q4_0),
        QuantFormat::Q4_1 => run_blocks::<BlockQ4_1>(bytes, out, per, dequantize_row_q4_1),
        QuantFormat::Q5_0 => run_blocks::<BlockQ5_0>(bytes, out, per, dequantize_row_q5_0),
        QuantFormat::Q5_1 => run_blocks::<BlockQ5_1>(bytes, out, per, dequantize_row_q5_1),
        QuantFormat::Q4K => run_blocks::<BlockQ4K>(bytes, out, per, dequantize_row_q4_k),
        QuantFormat::Q5K => run_blocks::<BlockQ5K>(bytes, out, per, dequantize_row_q5_k),
        QuantFormat::Q6K => run_blocks::<BlockQ6K>(bytes, out, per, dequantize_row_q6_k),
        QuantFormat::IQ4NL => run_blocks::<BlockIQ4NL>(bytes, out, per, dequantize_row_iq4_nl),
        QuantFormat::IQ4XS => run_blocks::<BlockIQ4XS>(bytes, out, per, dequantize_row_iq4_xs),
        QuantFormat::Q2K => run_blocks::<BlockQ2K>(bytes, out, per, dequantize_row_q2_k),
        QuantFormat::Q3K => run_blocks::<BlockQ3K>(bytes, out, per, dequantize_row_q3_k),
    }
    Ok(())
}

fn f16_row(src: &[f16], out: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    src.convert_to_f32_slice(out);
}

fn bf16_row(src: &[bf16], out: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    src.convert_to_f32_slice(out);
}

/// Converts little-endian IEEE half values (any alignment) to f32.
/// `out.len()` must be `bytes.len() / 2`.
pub fn f16_bytes_to_f32(bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    check_lengths("F16", bytes.len(), 2, 1, out.len())?;
    run_blocks::<f16>(bytes, out, 1, f16_row);
    Ok(())
}

/// Converts little-endian bfloat16 values (any alignment) to f32.
/// `out.len()` must be `bytes.len() / 2`.
pub fn bf16_bytes_to_f32(bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    check_lengths("BF16", bytes.len(), 2, 1, out.len())?;
    run_blocks::<bf16>(bytes, out, 1, bf16_row);
    Ok(())
}

/// Copies little-endian f32 values (any alignment) into `out`.
/// `out.len()` must be `bytes.len() / 4`.
pub fn f32_bytes_to_f32(bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    check_lengths("F32", bytes.len(), 4, 1, out.len())?;
    match bytemuck::try_cast_slice::<u8, f32>(bytes) {
        Ok(src) => out.copy_from_slice(src),
        Err(_) => bytemuck::cast_slice_mut::<f32, u8>(out).copy_from_slice(bytes),
    }
    Ok(())
}

#[cfg(test)]
mod tests;
