//! The products `out = x · wᵀ + b` with a stored matrix: one entry point,
//! [`linear_weights_with`], with one path per kind of storage, each taken from the level's
//! dispatch table.
#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};

use half::bf16;
use rayon::prelude::*;

use super::{Data, WeightMatrix};
use crate::cpu::dispatch::{GemmBf16Fn, Kernels, kernels};
use crate::cpu::int8::packed::PackedMatrix;
use crate::cpu::int8::{linear_int8_parts_with, linear_int8_with};
use crate::cpu::matmul::{
    SharedOut, add_bias, check_shapes, linear_chunks, linear_with, rows_per_task,
};

/// Rows of `x` from which a task dequantizes all its weight rows at once, and from which bf16
/// weights are no longer widened in registers (see [`linear_weights_with`]).
const SMALL_BATCH: usize = 8;

/// Dequantized weights per buffer fill: about 64 KiB of f32, whole register tiles, 8..=64
/// rows. Any row count is whole blocks: a row is `k / 32` blocks, or `k / 256` super-blocks
/// for the K-quants (`from_bytes` checks that `k` divides).
fn rows_per_fill(k: usize) -> usize {
    ((16 * 1024) / k).clamp(8, 64) / 8 * 8
}

thread_local! {
    /// Dequantized rows of the current fill.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// One part's outputs in [`linear_parts`].
    static PART_OUT: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ + bias[n]` for a stored matrix (`k = w.cols()`), with
/// the dispatched kernels; f32 matrices go straight to [`crate::cpu::matmul::linear`].
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
    /// `vdpbf16ps` (see [`crate::cpu::bf16_dot`]), as a bf16 model computes in PyTorch;
    /// products with weights in other formats are unchanged.
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
            crate::cpu::bf16_dot::linear_bf16_dot(x, v, bias, m, w.cols, out)
        }
        (Data::Stack(parts), _) if !all_packed(parts) => {
            linear_parts(parts, bias, m, out, |p, b, o| {
                linear_weights_as(x, p, b, m, o, dtype)
            })
        }
        _ => linear_weights(x, w, bias, m, out),
    }
}

/// [`linear_weights`] with an explicit level's kernels: f32 matrices take the level's f32
/// product, repacked ones its int8 product, stacks each part's product in turn; small
/// batches of bf16 matrices take the level's bf16 product where it has one (half the bytes
/// of f32 and no scratch buffer, the same bits as dequantizing first); everything else is
/// dequantized a few rows at a time into the f32 product.
pub fn linear_weights_with(
    kernels: &Kernels,
    x: &[f32],
    w: &WeightMatrix,
    bias: Option<&[f32]>,
    m: usize,
    out: &mut [f32],
) {
    match &w.data {
        Data::F32(v) => linear_with(kernels, x, v, bias, m, w.cols, out),
        Data::Packed(p) => linear_int8_with(kernels, x, p, bias, m, out),
        Data::Stack(parts) if all_packed(parts) => {
            if check_shapes(x, w.rows * w.cols, bias, m, w.cols, out).is_some() {
                linear_int8_parts_with(kernels, x, &packed_parts(parts, bias), m, out);
            }
        }
        Data::Stack(parts) => linear_parts(parts, bias, m, out, |p, b, o| {
            linear_weights_with(kernels, x, p, b, m, o)
        }),
        Data::Bf16(v) => match kernels.gemm_bf16 {
            Some(gemm_bf16) if m < SMALL_BATCH => {
                linear_bf16_widened(gemm_bf16, x, v, bias, m, w.cols, out)
            }
            _ => linear_dequantized(kernels, x, w, bias, m, out),
        },
        _ => linear_dequantized(kernels, x, w, bias, m, out),
    }
}

/// Whether every part of a stack is repacked for int8: then one region multiplies them all.
fn all_packed(parts: &[WeightMatrix]) -> bool {
    parts.iter().all(|p| matches!(p.data, Data::Packed(_)))
}

/// The packed parts of a stack, each with its share of the stack's bias.
fn packed_parts<'a>(
    parts: &'a [WeightMatrix],
    bias: Option<&'a [f32]>,
) -> Vec<(&'a PackedMatrix, Option<&'a [f32]>)> {
    let mut first = 0;
    parts
        .iter()
        .filter_map(|p| {
            let Data::Packed(w) = &p.data else {
                return None;
            };
            let b = bias.map(|b| &b[first..first + p.rows]);
            first += p.rows;
            Some((w, b))
        })
        .collect()
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

/// A bf16 matrix's product with `gemm_bf16`, which widens each weight vector in registers.
fn linear_bf16_widened(
    gemm_bf16: GemmBf16Fn,
    x: &[f32],
    w: &[bf16],
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    out: &mut [f32],
) {
    let Some(n) = check_shapes(x, w.len(), bias, m, k, out) else {
        return;
    };
    // SAFETY: a level's table holds a `gemm_bf16` only when the level's features were
    // detected (see `Kernels::for_level`), and `linear_chunks` gives it the chunk's own
    // columns of `out`, as `GemmBf16Fn` requires.
    linear_chunks(w, k, m, bias, out, |wc, base| unsafe {
        gemm_bf16(x, wc, k, base, n)
    });
}

/// The product through the level's dequantizers and f32 kernel: single rows and small
/// batches dequantize a few rows at a time so they stay in L1; larger ones (batched decode,
/// prefill) dequantize the task's rows at once, so `x` is read once per task as in the f32
/// path. Either way every output element is computed the same way.
fn linear_dequantized(
    kernels: &Kernels,
    x: &[f32],
    w: &WeightMatrix,
    bias: Option<&[f32]>,
    m: usize,
    out: &mut [f32],
) {
    let (n, k) = (w.rows, w.cols);
    if check_shapes(x, n * k, bias, m, k, out).is_none() {
        return;
    }
    let (gemm, dequant) = (kernels.gemm, &kernels.dequant);
    let chunk = rows_per_task(n);
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
