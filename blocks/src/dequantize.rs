//! Byte-level dequantization: any alignment, large inputs split across the rayon pool.

use half::{bf16, f16};
use rayon::prelude::*;

use crate::quant_format::with_block;
use crate::{BlockFormat, QuantError, QuantFormat};

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

/// [`run_blocks`] over blocks of `B` with their reference dequantizer.
fn run_format<B: BlockFormat>(bytes: &[u8], out: &mut [f32]) {
    run_blocks::<B>(bytes, out, B::BLOCK_ELEMENTS, B::dequantize_row);
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
    with_block!(format, B => run_format::<B>(bytes, out));
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
