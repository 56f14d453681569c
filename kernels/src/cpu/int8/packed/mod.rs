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
//! is two lanes of two tiles; a lane stores block after block, and one block of a lane is one
//! contiguous stretch: its two tiles' lines, then their scales. The matrix stores lane 0 of
//! every group, group after group, then lane 1 of every group. So a GEMV thread, which takes
//! consecutive groups, reads two sequential streams from its first group to its last: a core
//! keeps too few of its own loads in flight to reach the memory's bandwidth on one stream,
//! and the hardware prefetchers run ahead on each stream they see, but take a while to ramp
//! up on a new one.
//!
//! Rows past the matrix's end (the last group's padding) are zero. The bytes are those of
//! the GGUF blocks, rearranged: memory stays the file's size, plus at most 63 padding rows.
//!
//! `kind` describes each format's layout, `pack` builds matrices from the file's blocks, and
//! `unpack` reads quants and rows back.

mod kind;
mod pack;
#[cfg(test)]
mod tests;
mod unpack;

pub use kind::PackedKind;
pub(crate) use kind::QuantLayout;

/// Weight rows per tile (one `zmm` of 32-bit lanes).
pub const TILE: usize = 16;
/// Tiles per group: the decode kernel's width.
pub const GROUP: usize = 4;
/// Sequential streams per group: tiles `LANE_TILES · l ..` of a group are lane `l`.
pub(crate) const LANES: usize = 2;
/// Tiles per lane.
pub(crate) const LANE_TILES: usize = GROUP / LANES;
/// Values per quantization block.
pub const QK: usize = 32;
/// Bytes of one line (one `vpdpbusd` operand).
pub(crate) const LINE: usize = 64;

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
    /// Lane after lane; in a lane, group after group; in a group's lane, block after block:
    /// `kind.lane_block_bytes()` each.
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

impl PackedMatrix {
    /// Byte offsets in `data` of tile `t`'s quants and scales of block `b`.
    fn offsets(&self, t: usize, b: usize) -> (usize, usize) {
        let (g, c) = (t / GROUP, t % GROUP);
        let (lane, c) = (c / LANE_TILES, c % LANE_TILES);
        let stretch = lane * self.groups() + g;
        let (quants, scales) = Self::offsets_in_stretch(self.kind, c, b);
        let base = stretch * self.blocks() * self.kind.lane_block_bytes();
        (base + quants, base + scales)
    }

    /// Byte offsets, from the start of its stretch (one group's lane), of the quants and
    /// scales of block `b` of the lane's tile `c`.
    fn offsets_in_stretch(kind: PackedKind, c: usize, b: usize) -> (usize, usize) {
        let base = b * kind.lane_block_bytes();
        let quants = base + c * kind.quant_bytes();
        let scales = base + LANE_TILES * kind.quant_bytes() + c * 2 * kind.scales();
        (quants, scales)
    }

    /// Groups of tiles (the last one padded).
    fn groups(&self) -> usize {
        self.rows.div_ceil(TILE * GROUP)
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
        self.kind.lane_block_bytes()
    }

    /// The f16 scales of block `b` of tile `t`.
    pub(crate) fn block_scales(&self, t: usize, b: usize) -> &[u16] {
        let s = self.offsets(t, b).1;
        let bytes: &[u8] = bytemuck::cast_slice(&self.data);
        // Scales start at even offsets of 64-byte-aligned lines: always u16-aligned.
        bytemuck::cast_slice(&bytes[s..s + 2 * self.kind.scales()])
    }
}
