//! Packing a matrix from the file's blocks: each format's quants and scales laid out in
//! tiles of 16 interleaved rows.

use half::f16;
use rayon::prelude::*;

use super::{GROUP, LANE_TILES, LINE, Line, PackedKind, PackedMatrix, QK, ScaleLayout, TILE};
use crate::quant::{
    BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0,
    BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0, e8m0_to_f32_half, index4, quant5,
};

/// `x` as an f16, when it is finite there.
fn finite_f16(x: f32) -> Option<f16> {
    let h = f16::from_f32(x);
    h.is_finite().then_some(h)
}

/// What one row holds at the start of each scale period: its f16 scales (`d`, then `m` or
/// `-dmin`; the second is dropped for kinds with one) and its codes (K-quants).
#[derive(Clone, Copy)]
struct RowHeader {
    scales: [f16; 2],
    codes: [u8; 16],
}

impl RowHeader {
    /// A block's two scales, without codes.
    fn scales(first: f16, second: f16) -> Self {
        Self {
            scales: [first, second],
            codes: [0; 16],
        }
    }

    /// A `Q4_K`/`Q5_K` super-block's `d`, `-dmin` and 12 bytes of codes, or `None` when a
    /// scale is not finite.
    fn k4(d: f16, dmin: f16, scales: &[u8; 12]) -> Option<Self> {
        (d.is_finite() && dmin.is_finite()).then(|| {
            let mut codes = [0; 16];
            codes[..12].copy_from_slice(scales);
            Self {
                scales: [d, -dmin],
                codes,
            }
        })
    }

    /// A super-block's `d` and sixteen signed scales of 16 values, or `None` when `d` is not
    /// finite.
    fn halves(d: f16, scales: [i8; 16]) -> Option<Self> {
        d.is_finite().then(|| Self {
            scales: [d, f16::ZERO],
            codes: scales.map(|s| s as u8),
        })
    }
}

/// Where code byte `i` of row `r` sits in a tile's codes (see `ScaleLayout`).
fn code_offset(layout: ScaleLayout, r: usize, i: usize) -> usize {
    match layout {
        ScaleLayout::SuperMins => LINE * (i / 4) + 4 * r + i % 4,
        ScaleLayout::SuperHalves | ScaleLayout::Blocks => TILE * i + r,
    }
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
        let per_row = cols / QK;
        let filled = p.fill(
            |row, b| Some(RowHeader::scales(blocks[row * per_row + b].d, f16::ZERO)),
            |row, b, lines| {
                let (blk, r) = (&blocks[row * per_row + b], row % TILE);
                for (g, line) in lines.iter_mut().enumerate() {
                    for u in 0..4 {
                        line.0[4 * r + u] = (blk.qs[4 * g + u] as u8) ^ 0x80;
                    }
                }
            },
        );
        filled
            .map(|()| p)
            .expect("Q8_0 scales are stored as they are")
    }

    /// Packs `rows × cols` `Q4_0` blocks (row after row; `cols` a multiple of 32).
    pub fn from_q4_0(rows: usize, cols: usize, blocks: &[BlockQ4_0]) -> Self {
        Self::from_blocks(
            PackedKind::Q4_0,
            rows,
            cols,
            blocks,
            |b, _| Some(RowHeader::scales(b.d, f16::ZERO)),
            |b, e| index4(&b.qs, e),
        )
        .expect("Q4_0 scales are stored as they are")
    }

    /// Packs `rows × cols` `Q4_K` super-blocks (row after row; `cols` a multiple of 256), or
    /// `None` when a super-block's `d` or `dmin` is not finite.
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
            |b, _| RowHeader::k4(b.d, b.dmin, &b.scales),
            quant,
        )
    }

    /// Packs `rows × cols` `Q5_K` super-blocks (row after row; `cols` a multiple of 256), or
    /// `None` when a super-block's `d` or `dmin` is not finite.
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
            |b, _| RowHeader::k4(b.d, b.dmin, &b.scales),
            quant,
        )
    }

    /// Packs `rows × cols` `Q6_K` super-blocks (row after row; `cols` a multiple of 256), or
    /// `None` when a super-block's `d` is not finite.
    pub fn from_q6_k(rows: usize, cols: usize, blocks: &[BlockQ6K]) -> Option<Self> {
        let header = |b: &BlockQ6K, _| RowHeader::halves(b.d, b.scales);
        Self::from_blocks(PackedKind::Q6K, rows, cols, blocks, header, q6_k_quant)
    }

    /// Packs `rows × cols` `Q3_K` super-blocks (row after row; `cols` a multiple of 256), or
    /// `None` when a super-block's `d` is not finite.
    pub fn from_q3_k(rows: usize, cols: usize, blocks: &[BlockQ3K]) -> Option<Self> {
        // Scales are -32..=31.
        let header =
            |b: &BlockQ3K, _| RowHeader::halves(b.d, std::array::from_fn(|s| b.scale(s) as i8));
        let quant = |b: &BlockQ3K, e: usize| (b.quant(e) + 4) as u8;
        Self::from_blocks(PackedKind::Q3K, rows, cols, blocks, header, quant)
    }

    /// Packs `rows × cols` `IQ4_NL` blocks (row after row; `cols` a multiple of 32).
    pub fn from_iq4_nl(rows: usize, cols: usize, blocks: &[BlockIQ4NL]) -> Self {
        Self::from_blocks(
            PackedKind::IQ4NL,
            rows,
            cols,
            blocks,
            |b, _| Some(RowHeader::scales(b.d, f16::ZERO)),
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
            |b, j| Some(RowHeader::scales(finite_f16(b.sub_scale(j))?, f16::ZERO)),
            |b, e| index4(&b.qs[16 * (e / QK)..], e % QK),
        )
    }

    /// Packs `rows × cols` `MXFP4` blocks (row after row; `cols` a multiple of 32), or `None`
    /// when a block with a nonzero value has a scale `2^(e - 128)` outside f16's range.
    pub fn from_mxfp4(rows: usize, cols: usize, blocks: &[BlockMXFP4]) -> Option<Self> {
        let zero = |b: &BlockMXFP4| b.qs.iter().all(|q| q & 0x77 == 0);
        Self::from_blocks(
            PackedKind::MXFP4,
            rows,
            cols,
            blocks,
            |b, _| {
                let d = e8m0_to_f32_half(b.e);
                let h = f16::from_f32(d);
                // A block of zeros keeps any scale; others only an exact one.
                let d = if zero(b) {
                    f16::ZERO
                } else {
                    (h.to_f32() == d).then_some(h)?
                };
                Some(RowHeader::scales(d, f16::ZERO))
            },
            |b, e| index4(&b.qs, e),
        )
    }

    /// Packs `rows × cols` `Q5_1` blocks (row after row; `cols` a multiple of 32).
    pub fn from_q5_1(rows: usize, cols: usize, blocks: &[BlockQ5_1]) -> Self {
        Self::from_blocks(
            PackedKind::Q5_1,
            rows,
            cols,
            blocks,
            |b, _| Some(RowHeader::scales(b.d, b.m)),
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
            |b, _| {
                let m = finite_f16(-16.0 * b.d.to_f32())?;
                Some(RowHeader::scales(b.d, m))
            },
            |b, e| quant5(&b.qs, b.qh, e),
        )
    }

    /// Packs file blocks of `kind.file_block()` values (32, or the K-quants' 256) as 32-value
    /// blocks: `header(block, j)` gives the row's header of period `j` of the file block
    /// (`None`: not representable), `quant(block, e)` value `e`'s unsigned quant.
    fn from_blocks<B: Sync>(
        kind: PackedKind,
        rows: usize,
        cols: usize,
        blocks: &[B],
        header: impl Fn(&B, usize) -> Option<RowHeader> + Sync,
        quant: impl Fn(&B, usize) -> u8 + Sync,
    ) -> Option<Self> {
        let subs = kind.file_block().1 / QK;
        let mut p = Self::empty(kind, rows, cols);
        assert_eq!(
            blocks.len() * subs,
            rows * p.blocks(),
            "{kind:?} blocks must be rows × cols/{}",
            QK * subs
        );
        let per_row = cols / QK;
        // Block `b` of a row is sub-block `b % subs` of its file block.
        let file_block = |row: usize, b: usize| &blocks[(row * per_row + b) / subs];
        p.fill(
            |row, b| header(file_block(row, b), b % subs / kind.period_blocks()),
            |row, b, lines| {
                let first = QK * (b % subs);
                let q = std::array::from_fn(|l| quant(file_block(row, b), first + l));
                if kind.crumbs() {
                    set_crumbs_and_high_bit(lines, row % TILE, &q);
                } else {
                    set_nibbles_and_high_bits(lines, row % TILE, &q);
                }
            },
        )?;
        Some(p)
    }

    /// Packs `rows × cols` `Q4_1` blocks (row after row; `cols` a multiple of 32).
    pub fn from_q4_1(rows: usize, cols: usize, blocks: &[BlockQ4_1]) -> Self {
        Self::from_blocks(
            PackedKind::Q4_1,
            rows,
            cols,
            blocks,
            |b, _| Some(RowHeader::scales(b.d, b.m)),
            |b, e| index4(&b.qs, e),
        )
        .expect("Q4_1 scales are stored as they are")
    }

    fn empty(kind: PackedKind, rows: usize, cols: usize) -> Self {
        assert!(cols.is_multiple_of(QK), "packed matrices need whole blocks");
        let groups = rows.div_ceil(TILE * GROUP);
        let blocks = cols / QK;
        assert!(
            blocks.is_multiple_of(kind.period_blocks()),
            "{kind:?} matrices need whole super-blocks"
        );
        let periods = blocks / kind.period_blocks();
        Self {
            kind,
            rows,
            cols,
            // Zeroed by the allocator (lazily, page by page, as the threads of `fill` write).
            data: bytemuck::zeroed_vec(groups * periods * kind.group_period_bytes() / LINE),
        }
    }

    /// Writes every row of every tile: `header(row, b)` (for the first block `b` of each
    /// period) into the period's scales and codes, `quants(row, b, lines)` into the tile's
    /// lines of each block. Padding rows stay zero. Stretches (one group's lane) in parallel;
    /// `None` as soon as a header is.
    fn fill(
        &mut self,
        header: impl Fn(usize, usize) -> Option<RowHeader> + Sync,
        quants: impl Fn(usize, usize, &mut [Line]) + Sync,
    ) -> Option<()> {
        let (kind, rows) = (self.kind, self.rows);
        let (lq, blocks, groups) = (kind.quant_bytes() / LINE, self.blocks(), self.groups());
        let stretch_lines = self.periods() * kind.lane_period_bytes() / LINE;
        if stretch_lines == 0 {
            return Some(());
        }
        let layout = kind.scale_layout();
        self.data
            .par_chunks_mut(stretch_lines)
            .enumerate()
            .try_for_each(|(i, stretch)| {
                let (lane, g) = (i / groups, i % groups);
                for c in 0..LANE_TILES {
                    // Padding rows' scales stay zero.
                    let mut scales = vec![0u16; kind.scales()];
                    let t = g * GROUP + lane * LANE_TILES + c;
                    let valid = rows.saturating_sub(t * TILE).min(TILE);
                    for b in 0..blocks {
                        let o = Self::offsets_in_stretch(kind, c, b);
                        if b % kind.period_blocks() == 0 {
                            let bytes: &mut [u8] = bytemuck::cast_slice_mut(stretch);
                            for r in 0..valid {
                                let h = header(t * TILE + r, b)?;
                                scales[r] = h.scales[0].to_bits();
                                if scales.len() > TILE {
                                    scales[TILE + r] = h.scales[1].to_bits();
                                }
                                for (k, &code) in
                                    h.codes[..kind.code_bytes() / TILE].iter().enumerate()
                                {
                                    bytes[o.codes + code_offset(layout, r, k)] = code;
                                }
                            }
                            bytes[o.scales..o.scales + 2 * scales.len()]
                                .copy_from_slice(bytemuck::cast_slice(&scales));
                        }
                        for r in 0..valid {
                            quants(
                                t * TILE + r,
                                b,
                                &mut stretch[o.quants / LINE..o.quants / LINE + lq],
                            );
                        }
                    }
                }
                Some(())
            })
    }
}
