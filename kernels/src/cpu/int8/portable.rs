//! The reference tile kernel: the arithmetic every level reproduces bit for bit.
//!
//! For output `(i, r)`, block by block in order: the exact integer `isum = Σ w_q · (254 h + l)`
//! (`h`, `l`: the activations' digits, see `activations`), then `acc = fma(isum, d_w · d_x,
//! acc)` and, for the nibble formats (`Q4_*`, `Q5_K`), `acc = fma(m_w, d_x · Σ (254 h + l), acc)`.
//! Integer sums are exact whatever order a SIMD level adds them in, so only this sequence
//! of f32 operations matters, and it does not depend on the batch.
#![allow(unsafe_code)]

use half::f16;

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
        // Σ w·h and Σ w·l per row, then 254 · the first + the second: all exact integers.
        let mut sh = [0i32; TILE];
        let mut sl = [0i32; TILE];
        let mut add = |r: usize, q: u8, e: usize| {
            sh[r] += i32::from(q) * i32::from(xh[e]);
            sl[r] += i32::from(q) * i32::from(xl[e]);
        };
        match w.kind() {
            PackedKind::Q8_0 => {
                for (g, line) in lines.iter().enumerate() {
                    for r in 0..TILE {
                        for u in 0..4 {
                            add(r, line.0[4 * r + u], 4 * g + u);
                        }
                    }
                }
            }
            PackedKind::Q4_1 | PackedKind::Q4_0 | PackedKind::Q4K | PackedKind::Q5K => {
                // Q5_K's fifth line: per nibble line, the high bits of its low nibbles' values,
                // then of its high nibbles'.
                let high = |word: usize, bit: usize| match lines.get(QK / 8) {
                    Some(l) if w.kind() == PackedKind::Q5K => {
                        ((l.0[8 * word + bit / 8] >> (bit % 8)) & 1) << 4
                    }
                    _ => 0,
                };
                for (h, line) in lines[..QK / 8].iter().enumerate() {
                    for r in 0..TILE {
                        for u in 0..4 {
                            let byte = line.0[4 * r + u];
                            add(r, (byte & 0x0F) | high(2 * h, 4 * r + u), 4 * h + u);
                            add(
                                r,
                                (byte >> 4) | high(2 * h + 1, 4 * r + u),
                                4 * (h + QK / 8) + u,
                            );
                        }
                    }
                }
            }
        }
        let offset = if w.kind().nibbles() { 0 } else { x.s128[j] };
        let isum: [i32; TILE] = std::array::from_fn(|r| RADIX * sh[r] + sl[r] + offset);
        for r in 0..TILE {
            let scale = f16::from_bits(scales[r]).to_f32() * x.d[j];
            acc[r] = (isum[r] as f32).mul_add(scale, acc[r]);
            if w.kind() != PackedKind::Q8_0 {
                acc[r] = f16::from_bits(scales[TILE + r])
                    .to_f32()
                    .mul_add(x.sd[j], acc[r]);
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
