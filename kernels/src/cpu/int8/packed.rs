//! Quantized weights repacked for integer dot products: 16 rows interleaved per tile.
//!
//! A tile holds 16 consecutive weight rows. For each 32-value block of the rows, the quants
//! are laid out in 64-byte lines where byte `4 r + u` belongs to row `r`: one line feeds one
//! `vpdpbusd`, which then yields the partial sums of 16 rows at once (lane `r` = row `r`),
//! and the 16 rows' scales sit next to each other so one load converts all of them. This is
//! what makes a GEMV touch every weight byte once with a handful of instructions per line.
//!
//! - `Q8_0`: 8 lines per block; line `g` holds values `4 g .. 4 g + 4` of each row as
//!   unsigned bytes (`q + 128`), because `vpdpbusd` multiplies unsigned by signed bytes (the
//!   `128 · Σ x` this adds is taken off exactly in integers). Scales: 16 `d`.
//! - `Q4_1`: 4 lines per block; line `h` holds values `4 h ..` in the low nibbles and
//!   `4 (h + 4) ..` in the high ones. Scales: 16 `d`, then 16 `m`.
//! - `Q4_0` (`value = (q - 8) · d`) keeps its nibbles and one scale per block, 18 bytes as in the
//!   file; its values `q - 8` are a table of 16 like the IQ4 formats' (below), and go through
//!   their kernels.
//! - `Q4_K` (super-blocks of 256: `value = q · d · sc_j - dmin · m_j` in sub-block `j` of 32)
//!   is packed as `Q4_1` blocks with `d = d · sc_j` and `m = -dmin · m_j` rounded to f16 (a
//!   relative change of at most 2⁻¹¹ per sub-block scale, far below the 4-bit quants' own
//!   rounding), so it shares those kernels too; 20 bytes per 32 values against the file's 18.
//! - `Q5_K` (as `Q4_K` with 5-bit quants) is packed the same way, plus a fifth line per block
//!   with the quants' high bits: for nibble line `h`, a 64-bit mask of its low nibbles' values
//!   (bit `4 r + u`), then one of its high nibbles'. The kernels add 16 where a bit is set. 24
//!   bytes per 32 values against the file's 22.
//! - `Q5_1` (`value = q · d + m`, 5-bit quants) is packed as `Q5_K`'s sub-blocks, with its own
//!   `d` and `m` (exact); `Q5_0` (`value = (q - 16) · d`) too, with `m = -16 d` (exact in f16
//!   for any `|d| ≤ 4094`). 24 bytes per 32 values against the files' 22 and 24.
//! - `Q3_K` (super-blocks of 256: `value = d · sc_s · (q - 4)`, a 6-bit scale per 16 values,
//!   3-bit quants) keeps its quants' two low bits in two "crumb" lines (line `c`, byte
//!   `4 r + u`: bits `2 k` are value `4 (4 c + k) + u`'s) and their third bit in a line of masks
//!   (for each group `g` of four values, a 64-bit mask, bit `4 r + u`), with a scale per 16-value
//!   half as `Q6_K`. 16 bytes per 32 values against the file's 13.75.
//! - `IQ4_NL` and `IQ4_XS` (`value = d · table[q]`, 4-bit indices into a fixed table of 16
//!   values in -127..=113) keep their indices in the nibble lines and one scale per block
//!   (`IQ4_XS`: its sub-block's `d · (ls - 32)`, rounded to f16); the kernels look the values
//!   up in registers (`vpshufb`) as unsigned bytes `table[q] + 128`, and take the `128 · Σ x`
//!   off as for `Q8_0`. 18 bytes per 32 values, as `IQ4_NL`'s file, against `IQ4_XS`'s 17.
//! - `Q6_K` (super-blocks of 256: `value = d · sc_s · (q - 32)`, an 8-bit scale per 16 values,
//!   6-bit quants) is packed as `Q5_K` with a sixth line for the quants' bit 5. The low nibbles
//!   of a block are its first 16 values and the high nibbles its last 16, so the kernels keep
//!   one integer sum per half and scale each by its own `d · sc` (rounded to f16; stored where
//!   the other formats keep `d` and `m`), taking `32 · Σ x` of the half off in integers. 28
//!   bytes per 32 values against the file's 26.25.
//!
//! Tiles come in groups of four (64 rows), which the decode kernel reads together. A group
//! stores block after block, and one block of a group is one contiguous stretch: the four
//! tiles' lines, then their scales. So a GEMV reads each thread's share of the matrix as one
//! sequential stream. (With each tile's quants and scales in streams of their own, a decode
//! task read eight at once, and only ~60% of the memory bandwidth reached the kernel.)
//!
//! Rows past the matrix's end (the last group's padding) are zero. The bytes are those of
//! the GGUF blocks, rearranged: memory stays the file's size, plus at most 63 padding rows.

use half::f16;
use rayon::prelude::*;

use crate::quant::{
    BlockIQ4NL, BlockIQ4XS, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1,
    BlockQ5K, BlockQ6K, BlockQ8_0, KVALUES_IQ4NL, QK_K, dequantize_row_q4_0, dequantize_row_q4_1,
    dequantize_row_q8_0, get_scale_min_k4, index4, quant5,
};

/// Weight rows per tile (one `zmm` of 32-bit lanes).
pub const TILE: usize = 16;
/// Tiles per group: the decode kernel's width.
pub const GROUP: usize = 4;
/// Values per quantization block.
pub const QK: usize = 32;
/// Bytes of one line (one `vpdpbusd` operand).
pub(crate) const LINE: usize = 64;

/// The IQ4 table's values as the kernels multiply them: unsigned bytes `value + 128`.
const IQ4_UNSIGNED: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (KVALUES_IQ4NL[i] as u8) ^ 0x80;
        i += 1;
    }
    t
};

/// `Q4_0`'s values `q - 8` as the kernels multiply them: `q + 120`.
const Q4_0_UNSIGNED: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = i as u8 + 120;
        i += 1;
    }
    t
};

/// The block format a [`PackedMatrix`] was packed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PackedKind {
    /// GGUF `Q8_0`: `value = q · d`.
    Q8_0,
    /// GGUF `Q4_1`: `value = q · d + m`.
    Q4_1,
    /// GGUF `Q4_0`: `value = (q - 8) · d`, laid out as `IQ4NL` with the table `q - 8`.
    Q4_0,
    /// GGUF `Q4_K`: each 32-value sub-block laid out as `Q4_1` with `d = d · sc`,
    /// `m = -dmin · m` (rounded to f16).
    Q4K,
    /// GGUF `Q5_K`: as `Q4K`, with a line of high bits per block.
    Q5K,
    /// GGUF `Q5_1`: `value = q · d + m`, laid out as `Q5K`.
    Q5_1,
    /// GGUF `Q5_0`: `value = (q - 16) · d`, laid out as `Q5K` with `m = -16 d`.
    Q5_0,
    /// GGUF `Q6_K`: as `Q5K` with two lines of high bits, and a scale per 16-value half.
    Q6K,
    /// GGUF `Q3_K`: 3-bit quants in two crumb lines and a mask line, a scale per 16-value half.
    Q3K,
    /// GGUF `IQ4_NL`: `value = d · table[q]`, indices in nibble lines, one scale per block.
    IQ4NL,
    /// GGUF `IQ4_XS`: as `IQ4NL`, with each sub-block's `d · (ls - 32)` (rounded to f16).
    IQ4XS,
}

/// How a kind's quants sit in a tile's lines: what decides which kernel multiplies them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QuantLayout {
    /// One byte per quant, unsigned `q + 128` (`Q8_0`).
    Bytes,
    /// Nibble lines with a minimum per block, and with `fifth_bit` a line of high-bit masks.
    Nibbles { fifth_bit: bool },
    /// Nibble lines of indices into [`PackedKind::table`], one scale per block.
    Table,
    /// A scale and integer sums per 16-value half: `Q6_K`'s nibbles and two mask lines, or
    /// with `crumbs` `Q3_K`'s two crumb lines and one mask line.
    Halves { crumbs: bool },
}

impl PackedKind {
    /// The layout of the kind's quants.
    pub(crate) const fn layout(self) -> QuantLayout {
        match self {
            Self::Q8_0 => QuantLayout::Bytes,
            Self::Q4_1 | Self::Q4K => QuantLayout::Nibbles { fifth_bit: false },
            Self::Q5K | Self::Q5_1 | Self::Q5_0 => QuantLayout::Nibbles { fifth_bit: true },
            Self::Q4_0 | Self::IQ4NL | Self::IQ4XS => QuantLayout::Table,
            Self::Q6K => QuantLayout::Halves { crumbs: false },
            Self::Q3K => QuantLayout::Halves { crumbs: true },
        }
    }

    /// Quant bytes of one block of one tile.
    pub(crate) const fn quant_bytes(self) -> usize {
        match self.layout() {
            QuantLayout::Bytes => TILE * QK,
            QuantLayout::Halves { crumbs: true } => 3 * LINE,
            _ => TILE * QK / 2 + self.high_lines() * LINE,
        }
    }

    /// Bytes of one block of one group: its tiles' quants, then their scales (a whole
    /// number of lines, so every quant line stays aligned).
    pub(crate) const fn group_block_bytes(self) -> usize {
        GROUP * (self.quant_bytes() + 2 * self.scales())
    }

    /// f16 scales of one block of one tile: `d`, then `m` (or the second half's `d`).
    pub(crate) const fn scales(self) -> usize {
        match self.layout() {
            QuantLayout::Bytes | QuantLayout::Table => TILE,
            QuantLayout::Nibbles { .. } | QuantLayout::Halves { .. } => 2 * TILE,
        }
    }

    /// Bytes one GGUF block takes in the file, and the values it holds.
    pub(crate) const fn file_block(self) -> (usize, usize) {
        match self {
            Self::Q8_0 => (size_of::<BlockQ8_0>(), QK),
            Self::Q4_1 => (size_of::<BlockQ4_1>(), QK),
            Self::Q4_0 => (size_of::<BlockQ4_0>(), QK),
            Self::Q4K => (size_of::<BlockQ4K>(), QK_K),
            Self::Q5K => (size_of::<BlockQ5K>(), QK_K),
            Self::Q5_1 => (size_of::<BlockQ5_1>(), QK),
            Self::Q5_0 => (size_of::<BlockQ5_0>(), QK),
            Self::Q6K => (size_of::<BlockQ6K>(), QK_K),
            Self::Q3K => (size_of::<BlockQ3K>(), QK_K),
            Self::IQ4NL => (size_of::<BlockIQ4NL>(), QK),
            Self::IQ4XS => (size_of::<BlockIQ4XS>(), QK_K),
        }
    }

    /// Lines of quants' high bits per block of a tile (after the four nibble lines).
    pub(crate) const fn high_lines(self) -> usize {
        match self.layout() {
            QuantLayout::Nibbles { fifth_bit: true } => 1,
            QuantLayout::Halves { crumbs: false } => 2,
            _ => 0,
        }
    }

    /// For nibbles that index a table of 16 values (the IQ4 kinds, and `Q4_0` whose values
    /// `q - 8` make one too), the values as the kernels multiply them: unsigned bytes
    /// `value + 128`.
    pub(crate) const fn table(self) -> Option<&'static [u8; 16]> {
        match self {
            Self::IQ4NL | Self::IQ4XS => Some(&IQ4_UNSIGNED),
            Self::Q4_0 => Some(&Q4_0_UNSIGNED),
            _ => None,
        }
    }

    /// Whether the products see unsigned bytes `value + 128` (`Q8_0`'s quants, the tables'
    /// values), whose `128 · Σ x` is taken off in integers.
    pub(crate) const fn offset_128(self) -> bool {
        matches!(self.layout(), QuantLayout::Bytes | QuantLayout::Table)
    }

    /// Whether blocks have a minimum `m` after their scales (`value = q · d + m`).
    pub(crate) const fn has_min(self) -> bool {
        matches!(self.layout(), QuantLayout::Nibbles { .. })
    }

    /// Whether each 16-value half of a block has its own scale and integer sums (`Q6_K`,
    /// `Q3_K`), its quants offset by `32 >> half_shift()`.
    pub(crate) const fn halves(self) -> bool {
        matches!(self.layout(), QuantLayout::Halves { .. })
    }

    /// How far `QuantizedRows::s32_halves` (`-32 · Σx`) is shifted right for this kind's offset.
    pub(crate) const fn half_shift(self) -> u32 {
        if self.crumbs() { 3 } else { 0 }
    }

    /// Whether quants are in crumb lines (`Q3_K`) rather than nibble lines or bytes.
    pub(crate) const fn crumbs(self) -> bool {
        matches!(self.layout(), QuantLayout::Halves { crumbs: true })
    }
}

/// One cache line, so that every line of the quants is 64-byte aligned.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
pub(crate) struct Line(pub(crate) [u8; LINE]);

/// A `rows × cols` matrix of quantized blocks in tiles of 16 interleaved rows.
#[derive(Clone)]
pub struct PackedMatrix {
    kind: PackedKind,
    rows: usize,
    cols: usize,
    /// Group after group, block after block: `kind.group_block_bytes()` each.
    data: Vec<Line>,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedMatrix")
            .field("kind", &self.kind)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish()
    }
}

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
    /// with the tile's lines and scales of that block; groups of tiles in parallel (each is
    /// its own stretch of `data`).
    fn fill(&mut self, f: impl Fn(usize, usize, &mut [Line], &mut [u16]) + Sync) {
        let kind = self.kind;
        let (lq, blocks) = (kind.quant_bytes() / LINE, self.blocks());
        let group_lines = blocks * kind.group_block_bytes() / LINE;
        if group_lines == 0 {
            return;
        }
        self.data
            .par_chunks_mut(group_lines)
            .enumerate()
            .for_each(|(g, group)| {
                let mut scales = vec![0u16; kind.scales()];
                for c in 0..GROUP {
                    let t = g * GROUP + c;
                    for b in 0..blocks {
                        let (q, s) = Self::offsets_in_group(kind, c, b);
                        for r in 0..TILE {
                            f(
                                t * TILE + r,
                                b,
                                &mut group[q / LINE..q / LINE + lq],
                                &mut scales,
                            );
                        }
                        let bytes: &mut [u8] = bytemuck::cast_slice_mut(group);
                        bytes[s..s + 2 * scales.len()]
                            .copy_from_slice(bytemuck::cast_slice(&scales));
                    }
                }
            });
    }

    /// Byte offsets in `data` of tile `t`'s quants and scales of block `b`.
    fn offsets(&self, t: usize, b: usize) -> (usize, usize) {
        let (g, c) = (t / GROUP, t % GROUP);
        let base = g * self.blocks() * self.kind.group_block_bytes();
        let (quants, scales) = Self::offsets_in_group(self.kind, c, b);
        (base + quants, base + scales)
    }

    /// Byte offsets, from the start of its group, of the quants and scales of block `b` of the
    /// group's tile `c`.
    fn offsets_in_group(kind: PackedKind, c: usize, b: usize) -> (usize, usize) {
        let base = b * kind.group_block_bytes();
        let quants = base + c * kind.quant_bytes();
        let scales = base + GROUP * kind.quant_bytes() + c * 2 * kind.scales();
        (quants, scales)
    }

    /// The format it was packed from.
    pub fn kind(&self) -> PackedKind {
        self.kind
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Tiles of 16 rows (the last one padded).
    pub fn tiles(&self) -> usize {
        self.rows.div_ceil(TILE)
    }

    /// Blocks per row.
    pub fn blocks(&self) -> usize {
        self.cols / QK
    }

    /// Bytes the rows hold in the file's format (padding not counted).
    pub fn storage_bytes(&self) -> usize {
        let (bytes, values) = self.kind.file_block();
        self.rows * self.cols / values * bytes
    }

    /// The quant lines of block `b` of tile `t`.
    pub(crate) fn lines(&self, t: usize, b: usize) -> &[Line] {
        let q = self.offsets(t, b).0 / LINE;
        &self.data[q..q + self.kind.quant_bytes() / LINE]
    }

    /// Where tile `t`'s quants and scales of block 0 start; block `b`'s are
    /// `b · block_stride()` bytes further (for kernels that walk them with raw pointers).
    pub(crate) fn tile_start(&self, t: usize) -> (*const u8, *const u16) {
        assert!(t < self.tiles(), "tile {t} of {}", self.tiles());
        let (q, s) = self.offsets(t, 0);
        let bytes: &[u8] = bytemuck::cast_slice(&self.data);
        (bytes[q..].as_ptr(), bytes[s..].as_ptr().cast())
    }

    /// Bytes from one block of a tile to its next.
    pub(crate) fn block_stride(&self) -> usize {
        self.kind.group_block_bytes()
    }

    /// The f16 scales of block `b` of tile `t`.
    pub(crate) fn block_scales(&self, t: usize, b: usize) -> &[u16] {
        let s = self.offsets(t, b).1;
        let bytes: &[u8] = bytemuck::cast_slice(&self.data);
        // Scales start at even offsets of 64-byte-aligned lines: always u16-aligned.
        bytemuck::cast_slice(&bytes[s..s + 2 * self.kind.scales()])
    }

    /// Quant `e` of block `b` of row `row`: unsigned (`Q8_0`: `q + 128`).
    pub(crate) fn quant(&self, row: usize, b: usize, e: usize) -> u8 {
        let (t, r) = (row / TILE, row % TILE);
        let lines = self.lines(t, b);
        let u = e % 4;
        match self.kind {
            PackedKind::Q8_0 => lines[e / 4].0[4 * r + u],
            PackedKind::Q3K => {
                let (g, bit) = (e / 4, 4 * r + u);
                let crumb = (lines[g / 4].0[bit] >> (2 * (g % 4))) & 3;
                crumb | ((lines[2].0[8 * g + bit / 8] >> (bit % 8)) & 1) << 2
            }
            _ => {
                let h = e / 4;
                let (nibble, word) = if h < QK / 8 {
                    (lines[h].0[4 * r + u] & 0x0F, 2 * h)
                } else {
                    (lines[h - QK / 8].0[4 * r + u] >> 4, 2 * (h - QK / 8) + 1)
                };
                let bit = 4 * r + u;
                (0..self.kind.high_lines()).fold(nibble, |q, level| {
                    let plane = &lines[QK / 8 + level].0;
                    q | (((plane[8 * word + bit / 8] >> (bit % 8)) & 1) << (4 + level))
                })
            }
        }
    }

    /// Row `row` as f32, exactly as the GGUF dequantizer writes it (for `Q4_K`, with the
    /// sub-block scales as packed).
    pub fn row_f32(&self, row: usize, out: &mut [f32]) {
        assert!(row < self.rows, "row {row} of a {}-row matrix", self.rows);
        assert_eq!(out.len(), self.cols, "a row has cols values");
        let (t, r) = (row / TILE, row % TILE);
        for (b, y) in out.chunks_exact_mut(QK).enumerate() {
            let s = self.block_scales(t, b);
            match self.kind {
                PackedKind::Q8_0 => {
                    let blk = BlockQ8_0 {
                        d: f16::from_bits(s[r]),
                        qs: std::array::from_fn(|e| (self.quant(row, b, e) ^ 0x80) as i8),
                    };
                    dequantize_row_q8_0(std::slice::from_ref(&blk), y);
                }
                PackedKind::Q4_1 | PackedKind::Q4K => {
                    let blk = BlockQ4_1 {
                        d: f16::from_bits(s[r]),
                        m: f16::from_bits(s[TILE + r]),
                        qs: std::array::from_fn(|j| {
                            self.quant(row, b, j) | (self.quant(row, b, j + QK / 2) << 4)
                        }),
                    };
                    dequantize_row_q4_1(std::slice::from_ref(&blk), y);
                }
                PackedKind::Q6K | PackedKind::Q3K => {
                    let offset = (32 >> self.kind.half_shift()) as f32;
                    for (e, v) in y.iter_mut().enumerate() {
                        let d = f16::from_bits(s[r + TILE * (e / (QK / 2))]).to_f32();
                        *v = d * (f32::from(self.quant(row, b, e)) - offset);
                    }
                }
                PackedKind::Q5K | PackedKind::Q5_1 => {
                    let (d, m) = (f16::from_bits(s[r]).to_f32(), f16::from_bits(s[TILE + r]));
                    for (e, v) in y.iter_mut().enumerate() {
                        *v = d * f32::from(self.quant(row, b, e)) + m.to_f32();
                    }
                }
                PackedKind::IQ4NL | PackedKind::IQ4XS => {
                    let d = f16::from_bits(s[r]).to_f32();
                    for (e, v) in y.iter_mut().enumerate() {
                        let q = usize::from(self.quant(row, b, e));
                        *v = d * f32::from(KVALUES_IQ4NL[q]);
                    }
                }
                PackedKind::Q5_0 => {
                    let d = f16::from_bits(s[r]).to_f32();
                    for (e, v) in y.iter_mut().enumerate() {
                        *v = (i32::from(self.quant(row, b, e)) - 16) as f32 * d;
                    }
                }
                PackedKind::Q4_0 => {
                    let blk = BlockQ4_0 {
                        d: f16::from_bits(s[r]),
                        qs: std::array::from_fn(|j| {
                            self.quant(row, b, j) | (self.quant(row, b, j + QK / 2) << 4)
                        }),
                    };
                    dequantize_row_q4_0(std::slice::from_ref(&blk), y);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize_row_iq4_nl, dequantize_row_q5_0, dequantize_row_q5_1};
    use rand::{Rng, SeedableRng};

    #[test]
    fn rows_unpack_to_the_gguf_dequantization() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        for (rows, cols) in [(1, 32), (16, 64), (17, 96), (40, 32)] {
            let nb = rows * cols / QK;
            let q8: Vec<BlockQ8_0> = (0..nb)
                .map(|_| BlockQ8_0 {
                    d: f16::from_f32(rng.random_range(-0.1..0.1)),
                    qs: std::array::from_fn(|_| rng.random()),
                })
                .collect();
            let q4: Vec<BlockQ4_1> = (0..nb)
                .map(|_| BlockQ4_1 {
                    d: f16::from_f32(rng.random_range(0.0..0.1)),
                    m: f16::from_f32(rng.random_range(-1.0..0.0)),
                    qs: std::array::from_fn(|_| rng.random()),
                })
                .collect();
            let q0: Vec<BlockQ4_0> = (0..nb)
                .map(|_| BlockQ4_0 {
                    d: f16::from_f32(rng.random_range(-0.1..0.1)),
                    qs: std::array::from_fn(|_| rng.random()),
                })
                .collect();
            let q51: Vec<BlockQ5_1> = (0..nb)
                .map(|_| BlockQ5_1 {
                    d: f16::from_f32(rng.random_range(0.0..0.05)),
                    m: f16::from_f32(rng.random_range(-1.0..0.0)),
                    qh: rng.random(),
                    qs: std::array::from_fn(|_| rng.random()),
                })
                .collect();
            let q50: Vec<BlockQ5_0> = (0..nb)
                .map(|_| BlockQ5_0 {
                    d: f16::from_f32(rng.random_range(-0.05..0.05)),
                    qh: rng.random(),
                    qs: std::array::from_fn(|_| rng.random()),
                })
                .collect();
            let p0 = PackedMatrix::from_q4_0(rows, cols, &q0);
            assert_eq!(p0.storage_bytes(), nb * 18);
            let nl: Vec<BlockIQ4NL> = (0..nb)
                .map(|_| BlockIQ4NL {
                    d: f16::from_f32(rng.random_range(-0.01..0.01)),
                    qs: std::array::from_fn(|_| rng.random()),
                })
                .collect();
            let pnl = PackedMatrix::from_iq4_nl(rows, cols, &nl);
            assert_eq!(pnl.storage_bytes(), nb * 18);
            let p51 = PackedMatrix::from_q5_1(rows, cols, &q51);
            assert_eq!(p51.storage_bytes(), nb * 24);
            let p50 = PackedMatrix::from_q5_0(rows, cols, &q50).unwrap();
            assert_eq!(p50.storage_bytes(), nb * 22);
            let p8 = PackedMatrix::from_q8_0(rows, cols, &q8);
            let p4 = PackedMatrix::from_q4_1(rows, cols, &q4);
            assert_eq!(p8.storage_bytes(), nb * 34);
            assert_eq!(p4.storage_bytes(), nb * 20);
            for row in 0..rows {
                let blocks = cols / QK;
                let mut want = vec![0f32; cols];
                let mut got = vec![f32::NAN; cols];
                dequantize_row_q8_0(&q8[row * blocks..(row + 1) * blocks], &mut want);
                p8.row_f32(row, &mut got);
                assert_eq!(got, want, "Q8_0 row {row} of {rows}x{cols}");
                dequantize_row_q4_1(&q4[row * blocks..(row + 1) * blocks], &mut want);
                p4.row_f32(row, &mut got);
                assert_eq!(got, want, "Q4_1 row {row} of {rows}x{cols}");
                dequantize_row_q4_0(&q0[row * blocks..(row + 1) * blocks], &mut want);
                p0.row_f32(row, &mut got);
                assert_eq!(got, want, "Q4_0 row {row} of {rows}x{cols}");
                dequantize_row_q5_1(&q51[row * blocks..(row + 1) * blocks], &mut want);
                p51.row_f32(row, &mut got);
                assert_eq!(got, want, "Q5_1 row {row} of {rows}x{cols}");
                dequantize_row_q5_0(&q50[row * blocks..(row + 1) * blocks], &mut want);
                p50.row_f32(row, &mut got);
                assert_eq!(got, want, "Q5_0 row {row} of {rows}x{cols}");
                dequantize_row_iq4_nl(&nl[row * blocks..(row + 1) * blocks], &mut want);
                pnl.row_f32(row, &mut got);
                assert_eq!(got, want, "IQ4_NL row {row} of {rows}x{cols}");
            }
        }
    }

    /// Packs random super-blocks of every shape with `pack` and checks each row of the result
    /// against `dequantize`, within `bound(block, value index in the super-block)`: the f16
    /// rounding of the sub-block scales.
    fn k_quant_rows_unpack<B>(
        seed: u64,
        block_bytes: usize,
        random_block: impl Fn(&mut rand_chacha::ChaCha8Rng) -> B,
        pack: fn(usize, usize, &[B]) -> Option<PackedMatrix>,
        dequantize: fn(&[B], &mut [f32]),
        bound: impl Fn(&B, usize) -> f32,
    ) {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        for (rows, cols) in [(1, 256), (17, 512), (40, 256)] {
            let nb = rows * cols / QK_K;
            let blocks: Vec<B> = (0..nb).map(|_| random_block(&mut rng)).collect();
            let p = pack(rows, cols, &blocks).expect("small scales");
            assert_eq!(p.storage_bytes(), nb * block_bytes);
            let per_row = cols / QK_K;
            for row in 0..rows {
                let mut want = vec![0f32; cols];
                let mut got = vec![f32::NAN; cols];
                dequantize(&blocks[row * per_row..(row + 1) * per_row], &mut want);
                p.row_f32(row, &mut got);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let b = bound(&blocks[row * per_row + i / QK_K], i % QK_K);
                    assert!((g - w).abs() <= b, "row {row} value {i}: {g} vs {w}");
                }
            }
        }
    }

    /// `d · sc` and `dmin · m` of the sub-block of value `e` of a Q4_K/Q5_K super-block.
    fn scale_and_min(d: f16, dmin: f16, scales: &[u8; 12], e: usize) -> (f32, f32) {
        let (sc, m) = get_scale_min_k4(e / QK, scales);
        (d.to_f32() * f32::from(sc), dmin.to_f32() * f32::from(m))
    }

    #[test]
    fn k_quant_rows_unpack_to_the_dequantization_within_f16_scales() {
        use crate::quant::{
            dequantize_row_iq4_xs, dequantize_row_q3_k, dequantize_row_q4_k, dequantize_row_q5_k,
            dequantize_row_q6_k,
        };
        // Each term moves by at most half an f16 step (2^-11 relative, 2^-25 when subnormal).
        let half_step = 2f32.powi(-11);
        k_quant_rows_unpack(
            2,
            144,
            |rng| BlockQ4K {
                d: f16::from_f32(rng.random_range(0.0..0.002)),
                dmin: f16::from_f32(rng.random_range(0.0..0.004)),
                scales: std::array::from_fn(|_| rng.random()),
                qs: std::array::from_fn(|_| rng.random()),
            },
            PackedMatrix::from_q4_k,
            dequantize_row_q4_k,
            |b, e| {
                let (d, m) = scale_and_min(b.d, b.dmin, &b.scales, e);
                (d * 15.0 + m) * half_step + 2f32.powi(-24) * 16.0
            },
        );
        k_quant_rows_unpack(
            3,
            176,
            |rng| BlockQ5K {
                d: f16::from_f32(rng.random_range(0.0..0.002)),
                dmin: f16::from_f32(rng.random_range(0.0..0.004)),
                scales: std::array::from_fn(|_| rng.random()),
                qh: std::array::from_fn(|_| rng.random()),
                qs: std::array::from_fn(|_| rng.random()),
            },
            PackedMatrix::from_q5_k,
            dequantize_row_q5_k,
            |b, e| {
                let (d, m) = scale_and_min(b.d, b.dmin, &b.scales, e);
                (d * 31.0 + m) * 2.0 * half_step + 2f32.powi(-24) * 32.0
            },
        );
        k_quant_rows_unpack(
            4,
            210,
            |rng| BlockQ6K {
                ql: std::array::from_fn(|_| rng.random()),
                qh: std::array::from_fn(|_| rng.random()),
                scales: std::array::from_fn(|_| rng.random()),
                d: f16::from_f32(rng.random_range(-0.0005..0.0005)),
            },
            PackedMatrix::from_q6_k,
            dequantize_row_q6_k,
            |b, e| {
                let d = (b.d.to_f32() * f32::from(b.scales[e / 16])).abs();
                d * 32.0 * 2.0 * half_step + 2f32.powi(-24) * 32.0
            },
        );
        k_quant_rows_unpack(
            6,
            110,
            |rng| BlockQ3K {
                hmask: std::array::from_fn(|_| rng.random()),
                qs: std::array::from_fn(|_| rng.random()),
                scales: std::array::from_fn(|_| rng.random()),
                d: f16::from_f32(rng.random_range(-0.0005..0.0005)),
            },
            PackedMatrix::from_q3_k,
            dequantize_row_q3_k,
            |b, e| {
                let d = (b.d.to_f32() * b.scale(e / 16) as f32).abs();
                d * 4.0 * half_step + 2f32.powi(-24) * 4.0
            },
        );
        k_quant_rows_unpack(
            5,
            136,
            |rng| BlockIQ4XS {
                d: f16::from_f32(rng.random_range(-0.0005..0.0005)),
                scales_h: rng.random(),
                scales_l: rng.random(),
                qs: std::array::from_fn(|_| rng.random()),
            },
            PackedMatrix::from_iq4_xs,
            dequantize_row_iq4_xs,
            |b, e| b.sub_scale(e / QK).abs() * 127.0 * half_step + 2f32.powi(-24) * 127.0,
        );
        let huge = BlockQ4K {
            d: f16::from_f32(60000.0),
            dmin: f16::ZERO,
            scales: [63; 12],
            qs: [0; QK_K / 2],
        };
        assert!(PackedMatrix::from_q4_k(1, QK_K, &[huge]).is_none());
        let huge = BlockQ5_0 {
            d: f16::from_f32(5000.0),
            qh: [0; 4],
            qs: [0; QK / 2],
        };
        assert!(PackedMatrix::from_q5_0(1, QK, &[huge]).is_none());
    }
}
