//! The reference tile kernel: the arithmetic every level reproduces bit for bit.
//!
//! For output `(i, r)`, block by block in order: the exact integer `isum = Σ w_q · (254 h + l)`
//! (`h`, `l`: the activations' digits, see `activations`), then `acc = fma(isum, d_w · d_x,
//! acc)` and, for the nibble formats with a minimum (`Q4_*`, `Q5_*`), `acc = fma(m_w, d_x · Σ
//! (254 h + l), acc)`. `Q8_0` and the IQ4 tables multiply unsigned bytes `value + 128` and take
//! `128 · Σ (254 h + l)` off `isum`.
//! `Q6_K` instead takes each 16-value half of the block in turn: `isum` over the half, less
//! `32 · Σ (254 h + l)` of the half (`Q3_K`: `4 ·`), then `acc = fma(isum, d_half · d_x, acc)`.
//! `d_w` and `m_w` are `PackedMatrix::block_scales`: f16 scales widened, or for the K-quants
//! the exact f32 products of the super-block's f16 scale and a row's code.
//! Integer sums are exact whatever order a SIMD level adds them in, so only this sequence
//! of f32 operations matters, and it does not depend on the batch.
#![allow(unsafe_code)]

use super::activations::{QuantizedRows, RADIX};
use super::packed::{PackedKind, PackedMatrix, QK, TILE};

/// The 16 outputs of tile `t` for row `i` of `x`.
#[inline(always)]
pub(crate) fn tile_row(w: &PackedMatrix, t: usize, x: &QuantizedRows, i: usize) -> [f32; TILE] {
    let mut acc = [0f32; TILE];
    for b in 0..w.blocks() {
        let (xh, xl) = (x.block(i, b), x.block_lo(i, b));
        let j = x.at(i, b);
        let lines = w.lines(t, b);
        let scales = w.block_scales(t, b);
        // Σ w·h and Σ w·l per row (per half of the block for Q6_K and Q3_K), then 254 · the
        // first + the second: all exact integers.
        let split = w.kind().halves();
        let mut sh = [[0i32; TILE]; 2];
        let mut sl = [[0i32; TILE]; 2];
        let mut add = |r: usize, q: u8, e: usize| {
            let half = usize::from(split && e >= QK / 2);
            sh[half][r] += i32::from(q) * i32::from(xh[e]);
            sl[half][r] += i32::from(q) * i32::from(xl[e]);
        };
        match w.kind() {
            PackedKind::Q3K => {
                for r in 0..TILE {
                    for e in 0..QK {
                        add(r, w.quant(t * TILE + r, b, e), e);
                    }
                }
            }
            PackedKind::Q8_0 => {
                for (g, line) in lines.iter().enumerate() {
                    for r in 0..TILE {
                        for u in 0..4 {
                            add(r, line.0[4 * r + u], 4 * g + u);
                        }
                    }
                }
            }
            _ => {
                // K-quants' extra lines: per nibble line, a bit of its low nibbles' values,
                // then of its high nibbles'.
                let high = |word: usize, bit: usize| {
                    (0..w.kind().high_lines()).fold(0u8, |q, level| {
                        let plane = &lines[QK / 8 + level].0;
                        q | (((plane[8 * word + bit / 8] >> (bit % 8)) & 1) << (4 + level))
                    })
                };
                // Table kinds: the table's value of the index, as an unsigned byte.
                let table = w.kind().table();
                let value = |q: u8| table.map_or(q, |t| t[usize::from(q)]);
                for (h, line) in lines[..QK / 8].iter().enumerate() {
                    for r in 0..TILE {
                        for u in 0..4 {
                            let byte = line.0[4 * r + u];
                            add(r, value((byte & 0x0F) | high(2 * h, 4 * r + u)), 4 * h + u);
                            add(
                                r,
                                value((byte >> 4) | high(2 * h + 1, 4 * r + u)),
                                4 * (h + QK / 8) + u,
                            );
                        }
                    }
                }
            }
        }
        if split {
            // Q6_K, Q3_K: each half's `Σ (q - 32) · x` (`Σ (q - 4) · x`) in integers, times its
            // own scale.
            let shift = w.kind().half_shift();
            for r in 0..TILE {
                for (half, &s32) in x.s32_halves[j].iter().enumerate() {
                    let isum = RADIX * sh[half][r] + sl[half][r] + (s32 >> shift);
                    let scale = scales[half][r] * x.d[j];
                    acc[r] = (isum as f32).mul_add(scale, acc[r]);
                }
            }
            continue;
        }
        let offset = if w.kind().offset_128() { x.s128[j] } else { 0 };
        let isum: [i32; TILE] = std::array::from_fn(|r| RADIX * sh[0][r] + sl[0][r] + offset);
        for r in 0..TILE {
            let scale = scales[0][r] * x.d[j];
            acc[r] = (isum[r] as f32).mul_add(scale, acc[r]);
            if w.kind().has_min() {
                acc[r] = scales[1][r].mul_add(x.sd[j], acc[r]);
            }
        }
    }
    acc
}

/// Tiles `t0..t0 + nt` for every row of `x`: writes `out[i * ldo + c]` for the tiles' valid
/// columns `c < n - t0 * 16`.
///
/// # Safety
/// `out` must be writable at every such place, and nothing else may access them meanwhile.
pub(crate) unsafe fn tiles(
    w: &PackedMatrix,
    t0: usize,
    nt: usize,
    x: &QuantizedRows,
    out: *mut f32,
    ldo: usize,
) {
    for t in t0..t0 + nt {
        let valid = (w.rows() - t * TILE).min(TILE);
        for i in 0..x.m {
            let acc = tile_row(w, t, x, i);
            for (r, v) in acc[..valid].iter().enumerate() {
                // SAFETY: the caller vouches for (i, (t - t0) * 16 + r), r < valid.
                unsafe { *out.add(i * ldo + (t - t0) * TILE + r) = *v };
            }
        }
    }
}
