//! Packing a matrix from the file's blocks: each format's quants and scales laid out in
//! tiles of 16 interleaved rows.

use half::f16;
use rayon::prelude::*;

use super::{GROUP, LANE_TILES, LINE, Line, PackedKind, PackedMatrix, QK, TILE};
use crate::quant::{
    BlockIQ4NL, BlockIQ4XS, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1,
    BlockQ5K, BlockQ6K, BlockQ8_0, get_scale_min_k4, index4, quant5,
};

/// `x` as an f16, when it is finite there.
fn finite_f16(x: f32) -> Option<f16> {
    let h = f16::from_f32(x);
    h.is_finite().then_some(h)
}

/// Sub-block `j`'s `d · sc` and `-dmin · m` of a `Q4_K`/`Q5_K` super-block, as f16.
fn k4_scale_min(d: f16, dmin: f16, scales: &[u8; 12], j: usize) -> Option<(f16, f16)> {
    let (sc, m) = get_scale_min_k4(j, scales);
    Some((
        finite_f16(d.to_f32() * f32::from(sc))?,
        finite_f16(-(dmin.to_f32() * f32::from(m)))?,
    ))
}

/// Quant `e` (0..256) of a `Q6_K` super-block, unsigned (`q`, the value being `q - 32`).
fn q6_k_quant(b: &BlockQ6K, e: usize) -> u8 {
    let (half, group, l) = (e / 128, e % 128 / 32, e % 32);
    let low = b.ql[64 * half + l + 32 * (group % 2)] >> (4 * (group / 2)) & 0x0F;
    let high = (b.qh[32 * half + l] >> (2 * group)) & 3;
    low | (high << 4)
}

/// Writes row `r`'s quants `q` of one block into a tile's lines: the nibble lines (line `h`:
/// values `4 h ..` low, `4 (h + 4) ..` high), then, for 5- and 6-bit quants, one line per bit
/// above the nibble: for nibble line `h`, the 64-bit mask of its low nibbles' values (bit
/// `4 r + u`), then of its high nibbles'.
fn set_nibbles_and_high_bits(lines: &mut [Line], r: usize, q: &[u8; QK]) {
    let (head, high) = lines.split_at_mut(QK / 8);
    for (h, line) in head.iter_mut().enumerate() {
        for u in 0..4 {
            line.0[4 * r + u] = (q[4 * h + u] & 0x0F) | (q[4 * (h + QK / 8) + u] << 4);
        }
    }
    // Row r's four bits of a mask are nibble r % 2 of its byte r / 2.
    let shift = 4 * (r % 2);
    for (level, plane) in high.iter_mut().enumerate() {
        for word in 0..QK / 4 {
            let first = 4 * (word / 2 + (word % 2) * QK / 8);
            let bits = (0..4).fold(0u8, |m, u| m | ((q[first + u] >> (4 + level)) & 1) << u);
            let byte = &mut plane.0[8 * word + r / 2];
            *byte = (*byte & !(0x0F << shift)) | (bits << shift);
        }
    }
}

/// Writes row `r`'s 3-bit quants `q` of one block into a tile's lines: two crumb lines (line
/// `c`, byte `4 r + u`, bits `2 k`: value `4 (4 c + k) + u`'s low two bits), then the masks of
/// their third bits (group `g`'s 64-bit mask, bit `4 r + u`).
fn set_crumbs_and_high_bit(lines: &mut [Line], r: usize, q: &[u8; QK]) {
    let (crumbs, high) = lines.split_at_mut(2);
    for (c, line) in crumbs.iter_mut().enumerate() {
        for u in 0..4 {
            line.0[4 * r + u] =
                (0..4).fold(0u8, |b, k| b | (q[4 * (4 * c + k) + u] & 3) << (2 * k));
        }
    }
    let shift = 4 * (r % 2);
    for g in 0..QK / 4 {
        let bits = (0..4).fold(0u8, |m, u| m | ((q[4 * g + u] >> 2) & 1) << u);
        let byte = &mut high[0].0[8 * g + r / 2];
        *byte = (*byte & !(0x0F << shift)) | (bits << shift);
    }
}

impl PackedMatrix {
    /// Packs `rows × cols` `Q8_0` blocks (row after row; `cols` a multiple of 32).
    pub fn from_q8_0(rows: usize, cols: usize, blocks: &[BlockQ8_0]) -> Self {
        let mut p = Self::empty(PackedKind::Q8_0, rows, cols);
        assert_eq!(
            blocks.len(),
            rows * p.blocks(),
            "Q8_0 blocks must be rows × cols/32"
        );
        let zero = BlockQ8_0 {
            d: f16::ZERO,
            qs: [0; QK],
        };
        p.fill(|row, b, lines, scales| {
            let blk = if row < rows {
                &blocks[row * (cols / QK) + b]
            } else {
                &zero
            };
            let r = row % TILE;
            scales[r] = blk.d.to_bits();
            for (g, line) in lines.iter_mut().enumerate() {
                for u in 0..4 {
                    line.0[4 * r + u] = (blk.qs[4 * g + u] as u8) ^ 0x80;
                }
            }
        });
        p
    }

    /// Packs `rows × cols` `Q4_0` blocks (row after row; `cols` a multiple of 32).
    pub fn from_q4_0(rows: usize, cols: usize, blocks: &[BlockQ4_0]) -> Self {
        Self::from_blocks(
            PackedKind::Q4_0,
            rows,
            cols,
            blocks,
            |b, _| Some((b.d, f16::ZERO)),
            |b, e| index4(&b.qs, e),
        )
        .expect("Q4_0 scales are stored as they are")
    }

    /// Packs `rows × cols` `Q4_K` super-blocks (row after row; `cols` a multiple of 256) as
    /// `Q4_1` sub-blocks, or `None` when a sub-block's scale or minimum is too large for f16.
    pub fn from_q4_k(rows: usize, cols: usize, blocks: &[BlockQ4K]) -> Option<Self> {
        let quant = |b: &BlockQ4K, e: usize| {
            let (j, l) = (e / QK, e % QK);
            (b.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F
        };
        Self::from_blocks(
            PackedKind::Q4K,
            rows,
            cols,
            blocks,
            |b, j| k4_scale_min(b.d, b.dmin, &b.scales, j),
            quant,
        )
    }

    /// Packs `rows × cols` `Q5_K` super-blocks (row after row; `cols` a multiple of 256), or
    /// `None` when a sub-block's scale or minimum is too large for f16.
    pub fn from_q5_k(rows: usize, cols: usize, blocks: &[BlockQ5K]) -> Option<Self> {
        // Value l of sub-block j: a nibble of its 64-value group, and bit j of qh[l].
        let quant = |b: &BlockQ5K, e: usize| {
            let (j, l) = (e / QK, e % QK);
            let low = (b.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
            low | (((b.qh[l] >> j) & 1) << 4)
        };
        Self::from_blocks(
            PackedKind::Q5K,
            rows,
            cols,
            blocks,
            |b, j| k4_scale_min(b.d, b.dmin, &b.scales, j),
            quant,
        )
    }

    /// Packs `rows × cols` `Q6_K` super-blocks (row after row; `cols` a multiple of 256), or
    /// `None` when a sub-block's scale is too large for f16.
    pub fn from_q6_k(rows: usize, cols: usize, blocks: &[BlockQ6K]) -> Option<Self> {
        // The two 16-value halves' `d · sc`, where the other kinds keep `d` and `m`.
        let scales = |b: &BlockQ6K, j: usize| {
            let half = |sc: i8| finite_f16(b.d.to_f32() * f32::from(sc));
            Some((half(b.scales[2 * j])?, half(b.scales[2 * j + 1])?))
        };
        Self::from_blocks(PackedKind::Q6K, rows, cols, blocks, scales, q6_k_quant)
    }

    /// Packs `rows × cols` `Q3_K` super-blocks (row after row; `cols` a multiple of 256), or
    /// `None` when a sub-block's scale is too large for f16.
    pub fn from_q3_k(rows: usize, cols: usize, blocks: &[BlockQ3K]) -> Option<Self> {
        // The two 16-value halves' `d · sc`, where the nibble kinds keep `d` and `m`.
        let scales = |b: &BlockQ3K, j: usize| {
            let half = |s: usize| finite_f16(b.d.to_f32() * b.scale(s) as f32);
            Some((half(2 * j)?, half(2 * j + 1)?))
        };
        let quant = |b: &BlockQ3K, e: usize| (b.quant(e) + 4) as u8;
        Self::from_blocks(PackedKind::Q3K, rows, cols, blocks, scales, quant)
    }

    /// Packs `rows × cols` `IQ4_NL` blocks (row after row; `cols` a multiple of 32).
    pub fn from_iq4_nl(rows: usize, cols: usize, blocks: &[BlockIQ4NL]) -> Self {
        Self::from_blocks(
            PackedKind::IQ4NL,
            rows,
            cols,
            blocks,
            |b, _| Some((b.d, f16::ZERO)),
            |b, e| index4(&b.qs, e),
        )
        .expect("IQ4_NL scales are stored as they are")
    }

    /// Packs `rows × cols` `IQ4_XS` super-blocks (row after row; `cols` a multiple of 256),
    /// or `None` when a sub-block's scale is too large for f16.
    pub fn from_iq4_xs(rows: usize, cols: usize, blocks: &[BlockIQ4XS]) -> Option<Self> {
        Self::from_blocks(
            PackedKind::IQ4XS,
            rows,
            cols,
            blocks,
            |b, j| Some((finite_f16(b.sub_scale(j))?, f16::ZERO)),
            |b, e| index4(&b.qs[16 * (e / QK)..], e % QK),
        )
    }

    /// Packs `rows × cols` `Q5_1` blocks (row after row; `cols` a multiple of 32).
    pub fn from_q5_1(rows: usize, cols: usize, blocks: &[BlockQ5_1]) -> Self {
        Self::from_blocks(
            PackedKind::Q5_1,
            rows,
            cols,
            blocks,
            |b, _| Some((b.d, b.m)),
            |b, e| quant5(&b.qs, b.qh, e),
        )
        .expect("Q5_1 scales are stored as they are")
    }

    /// Packs `rows × cols` `Q5_0` blocks with `m = -16 d`, or `None` when a scale is too large
    /// for `-16 d` to be an f16.
    pub fn from_q5_0(rows: usize, cols: usize, blocks: &[BlockQ5_0]) -> Option<Self> {
        Self::from_blocks(
            PackedKind::Q5_0,
            rows,
            cols,
            blocks,
            |b, _| Some((b.d, finite_f16(-16.0 * b.d.to_f32())?)),
            |b, e| quant5(&b.qs, b.qh, e),
        )
    }

    /// Packs file blocks of `kind.file_block()` values (32, or the K-quants' 256) as 32-value
    /// blocks: `scales(block, j)` gives sub-block `j`'s two f16 scales (`None`: not
    /// representable; the second is dropped for kinds with one scale per block),
    /// `quant(block, e)` value `e`'s unsigned quant.
    fn from_blocks<B: Sync>(
        kind: PackedKind,
        rows: usize,
        cols: usize,
        blocks: &[B],
        scales: impl Fn(&B, usize) -> Option<(f16, f16)> + Sync,
        quant: impl Fn(&B, usize) -> u8 + Sync,
    ) -> Option<Self> {
        let subs = kind.file_block().1 / QK;
        let pairs: Vec<(f16, f16)> = blocks
            .par_iter()
            .flat_map_iter(|b| (0..subs).map(move |j| (b, j)))
            .map(|(b, j)| scales(b, j))
            .collect::<Option<_>>()?;
        let mut p = Self::empty(kind, rows, cols);
        assert_eq!(
            blocks.len() * subs,
            rows * p.blocks(),
            "{kind:?} blocks must be rows × cols/{}",
            QK * subs
        );
        let per_row = cols / QK;
        p.fill(|row, b, lines, sc| {
            let r = row % TILE;
            let two = sc.len() > TILE;
            if row >= rows {
                // Padding: its quants stay the zeros `empty` starts from.
                sc[r] = 0;
                if two {
                    sc[TILE + r] = 0;
                }
                return;
            }
            let (first, second) = pairs[row * per_row + b];
            sc[r] = first.to_bits();
            if two {
                sc[TILE + r] = second.to_bits();
            }
            let blk = &blocks[(row * per_row + b) / subs];
            let first = QK * (b % subs);
            let q = std::array::from_fn(|l| quant(blk, first + l));
            if kind.crumbs() {
                set_crumbs_and_high_bit(lines, r, &q);
            } else {
                set_nibbles_and_high_bits(lines, r, &q);
            }
        });
        Some(p)
    }

    /// Packs `rows × cols` `Q4_1` blocks (row after row; `cols` a multiple of 32).
    pub fn from_q4_1(rows: usize, cols: usize, blocks: &[BlockQ4_1]) -> Self {
        Self::from_blocks(
            PackedKind::Q4_1,
            rows,
            cols,
            blocks,
            |b, _| Some((b.d, b.m)),
            |b, e| index4(&b.qs, e),
        )
        .expect("Q4_1 scales are stored as they are")
    }

    fn empty(kind: PackedKind, rows: usize, cols: usize) -> Self {
        assert!(cols.is_multiple_of(QK), "packed matrices need whole blocks");
        let groups = rows.div_ceil(TILE * GROUP);
        let blocks = cols / QK;
        Self {
            kind,
            rows,
            cols,
            // Zeroed by the allocator (lazily, page by page, as the threads of `fill` write).
            data: bytemuck::zeroed_vec(groups * blocks * kind.group_block_bytes() / LINE),
        }
    }

    /// Calls `f(row, block, lines, scales)` for every row of every tile (padding included)
    /// with the tile's lines and scales of that block; stretches (one group's lane) in
    /// parallel.
    fn fill(&mut self, f: impl Fn(usize, usize, &mut [Line], &mut [u16]) + Sync) {
        let kind = self.kind;
        let (lq, blocks, groups) = (kind.quant_bytes() / LINE, self.blocks(), self.groups());
        let stretch_lines = blocks * kind.lane_block_bytes() / LINE;
        if stretch_lines == 0 {
            return;
        }
        self.data
            .par_chunks_mut(stretch_lines)
            .enumerate()
            .for_each(|(i, stretch)| {
                let (lane, g) = (i / groups, i % groups);
                let mut scales = vec![0u16; kind.scales()];
                for c in 0..LANE_TILES {
                    let t = g * GROUP + lane * LANE_TILES + c;
                    for b in 0..blocks {
                        let (q, s) = Self::offsets_in_stretch(kind, c, b);
                        for r in 0..TILE {
                            f(
                                t * TILE + r,
                                b,
                                &mut stretch[q / LINE..q / LINE + lq],
                                &mut scales,
                            );
                        }
                        let bytes: &mut [u8] = bytemuck::cast_slice_mut(stretch);
                        bytes[s..s + 2 * scales.len()]
                            .copy_from_slice(bytemuck::cast_slice(&scales));
                    }
                }
            });
    }
}
