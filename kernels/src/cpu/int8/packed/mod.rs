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
//!   keeps `Q4_1`'s nibble lines, and per super-block and tile the file's scales: 16 f16 `d`,
//!   16 f16 `-dmin` and each row's 12 bytes of 6-bit codes (see [`kind`]'s `ScaleLayout`),
//!   18 bytes per 32 values as in the file. The kernels decode the codes (as ggml's
//!   `get_scale_min_k4`) once per super-block into f32 `d · sc_j` and `-dmin · m_j`, both
//!   exact (an 11-bit significand times a 6-bit integer), then run `Q4_1`'s epilogue.
//! - `Q5_K` (as `Q4_K` with 5-bit quants) is packed the same way, plus a fifth line per block
//!   with the quants' high bits: for nibble line `h`, a 64-bit mask of its low nibbles' values
//!   (bit `4 r + u`), then one of its high nibbles'. The kernels add 16 where a bit is set. 22
//!   bytes per 32 values, as in the file.
//! - `Q5_1` (`value = q · d + m`, 5-bit quants) is packed as `Q5_K`'s sub-blocks, with its own
//!   `d` and `m` (exact); `Q5_0` (`value = (q - 16) · d`) too, with `m = -16 d` (exact in f16
//!   for any `|d| ≤ 4094`). 24 bytes per 32 values against the files' 22 and 24.
//! - `Q3_K` (super-blocks of 256: `value = d · sc_s · (q - 4)`, a 6-bit scale per 16 values,
//!   3-bit quants) keeps its quants' two low bits in two "crumb" lines (line `c`, byte
//!   `4 r + u`: bits `2 k` are value `4 (4 c + k) + u`'s) and their third bit in a line of masks
//!   (for each group `g` of four values, a 64-bit mask, bit `4 r + u`), with scales as `Q6_K`'s.
//!   14.25 bytes per 32 values against the file's 13.75 (its scales widened to bytes).
//! - `IQ4_NL` and `IQ4_XS` (`value = d · table[q]`, 4-bit indices into a fixed table of 16
//!   values in -127..=113) keep their indices in the nibble lines and one scale per block
//!   (`IQ4_XS`: its sub-block's `d · (ls - 32)`, rounded to f16); the kernels look the values
//!   up in registers (`vpshufb`) as unsigned bytes `table[q] + 128`, and take the `128 · Σ x`
//!   off as for `Q8_0`. 18 bytes per 32 values, as `IQ4_NL`'s file, against `IQ4_XS`'s 17.
//! - `Q6_K` (super-blocks of 256: `value = d · sc_s · (q - 32)`, an 8-bit scale per 16 values,
//!   6-bit quants) is packed as `Q5_K` with a sixth line for the quants' bit 5. The low nibbles
//!   of a block are its first 16 values and the high nibbles its last 16, so the kernels keep
//!   one integer sum per half and scale each by its own `d · sc`, taking `32 · Σ x` of the half
//!   off in integers. Per super-block and tile: 16 f16 `d` and each row's 16 `i8` scales, 26.25
//!   bytes per 32 values as in the file; the kernels form the exact f32 `d · sc` once per
//!   super-block.
//!
//! Tiles come in groups of four (64 rows), which the decode kernel reads together. A group
//! is two lanes of two tiles; a lane stores period after period (a block, or a K-quant's
//! super-block of eight), and one period of a lane is one contiguous stretch: a block's two
//! tiles' lines, then their scales; or a super-block's two tiles' codes and scales, then
//! block after block the two tiles' lines. The matrix stores lane 0 of
//! every group, group after group, then lane 1 of every group. So a GEMV thread, which takes
//! consecutive groups, reads two sequential streams from its first group to its last: a core
//! keeps too few of its own loads in flight to reach the memory's bandwidth on one stream,
//! and the hardware prefetchers run ahead on each stream they see, but take a while to ramp
//! up on a new one.
//!
//! Rows past the matrix's end (the last group's padding) are zero. The bytes are those of
//! the GGUF blocks, rearranged: memory stays the file's size (but for `Q3_K`, `IQ4_XS` and
//! `Q5_0`/`Q5_1`, noted above), plus at most 63 padding rows.
//!
//! `kind` describes each format's layout, `pack` builds matrices from the file's blocks, and
//! `unpack` reads quants and rows back.

use half::f16;

use crate::quant::get_scale_min_k4;

mod kind;
mod pack;
#[cfg(test)]
mod tests;
mod unpack;

pub use kind::PackedKind;
pub(crate) use kind::{QuantLayout, ScaleLayout};

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
    /// Lane after lane; in a lane, group after group; in a group's lane, period after
    /// period: `kind.lane_period_bytes()` each.
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
    /// Byte offsets in `data` of tile `t`'s quants of block `b`, and of its period's scales
    /// and codes.
    fn offsets(&self, t: usize, b: usize) -> Offsets {
        let (g, c) = (t / GROUP, t % GROUP);
        let (lane, c) = (c / LANE_TILES, c % LANE_TILES);
        let stretch = lane * self.groups() + g;
        let o = Self::offsets_in_stretch(self.kind, c, b);
        let base = stretch * self.periods() * self.kind.lane_period_bytes();
        Offsets {
            quants: base + o.quants,
            scales: base + o.scales,
            codes: base + o.codes,
        }
    }

    /// [`Self::offsets`] from the start of a stretch (one group's lane), for the lane's tile
    /// `c`.
    fn offsets_in_stretch(kind: PackedKind, c: usize, b: usize) -> Offsets {
        let (period, in_period) = (b / kind.period_blocks(), b % kind.period_blocks());
        let base = period * kind.lane_period_bytes();
        let quants = LANE_TILES * kind.quant_bytes();
        // A block's scales follow its quants; a super-block's header leads its blocks.
        let (header, blocks) = match kind.scale_layout() {
            ScaleLayout::Blocks => (base + quants, base),
            _ => (base, base + kind.lane_header_bytes() + in_period * quants),
        };
        Offsets {
            quants: blocks + c * kind.quant_bytes(),
            scales: header + LANE_TILES * kind.code_bytes() + c * 2 * kind.scales(),
            codes: header + c * kind.code_bytes(),
        }
    }

    /// Scale periods per row.
    fn periods(&self) -> usize {
        self.blocks() / self.kind.period_blocks()
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

    /// Bytes the packed tiles take in memory (the last group's padding rows included): what
    /// a product reads.
    pub fn packed_bytes(&self) -> usize {
        self.data.len() * LINE
    }

    /// The quant lines of block `b` of tile `t`.
    pub(crate) fn lines(&self, t: usize, b: usize) -> &[Line] {
        let q = self.offsets(t, b).quants / LINE;
        &self.data[q..q + self.kind.quant_bytes() / LINE]
    }

    /// Where tile `t`'s quants and scales of block 0 start; block `b`'s quants are
    /// `b / period_blocks` periods (`period_stride()` bytes each) and `b % period_blocks`
    /// steps (`block_step()` bytes each) further, its period's scales and codes (see
    /// [`Self::tile_codes`]) the periods only (for kernels that walk them with raw pointers).
    pub(crate) fn tile_start(&self, t: usize) -> (*const u8, *const u16) {
        assert!(t < self.tiles(), "tile {t} of {}", self.tiles());
        let o = self.offsets(t, 0);
        let bytes: &[u8] = bytemuck::cast_slice(&self.data);
        (
            bytes[o.quants..].as_ptr(),
            bytes[o.scales..].as_ptr().cast(),
        )
    }

    /// Where tile `t`'s codes of its first period start (K-quants; see `ScaleLayout`).
    pub(crate) fn tile_codes(&self, t: usize) -> *const u8 {
        assert!(t < self.tiles(), "tile {t} of {}", self.tiles());
        let bytes: &[u8] = bytemuck::cast_slice(&self.data);
        bytes[self.offsets(t, 0).codes..].as_ptr()
    }

    /// Bytes from one period of a tile to its next (for the kinds with a scale per block,
    /// from one block to the next).
    pub(crate) fn period_stride(&self) -> usize {
        self.kind.lane_period_bytes()
    }

    /// Bytes from one block's quants of a tile to the next block's in the same period.
    pub(crate) fn block_step(&self) -> usize {
        LANE_TILES * self.kind.quant_bytes()
    }

    /// The f16 scales of block `b`'s period of tile `t`.
    pub(crate) fn period_scales(&self, t: usize, b: usize) -> &[u16] {
        let s = self.offsets(t, b).scales;
        let bytes: &[u8] = bytemuck::cast_slice(&self.data);
        // Scales start at even offsets of 64-byte-aligned lines: always u16-aligned.
        bytemuck::cast_slice(&bytes[s..s + 2 * self.kind.scales()])
    }

    /// The codes of block `b`'s period of tile `t` (empty for kinds without codes).
    pub(crate) fn period_codes(&self, t: usize, b: usize) -> &[u8] {
        let c = self.offsets(t, b).codes;
        let bytes: &[u8] = bytemuck::cast_slice(&self.data);
        &bytes[c..c + self.kind.code_bytes()]
    }

    /// Block `b`'s two f32 scales of each row of tile `t`, as every kernel multiplies them:
    /// `d` and `m` (the second half's `d` for the kinds with halves; `0` for the kinds with
    /// one scale). The K-quants' are the exact products of the super-block's f16 scale and the
    /// row's code for the block (see `ScaleLayout`; `Q4_K`'s and `Q5_K`'s zeros as +0).
    pub(crate) fn block_scales(&self, t: usize, b: usize) -> [[f32; TILE]; 2] {
        let s = self.period_scales(t, b);
        let f = |i: usize| f16::from_bits(s[i]).to_f32();
        let codes = self.period_codes(t, b);
        let j = b % self.kind.period_blocks();
        let mut out = [[0f32; TILE]; 2];
        for r in 0..TILE {
            let pair = match self.kind.scale_layout() {
                ScaleLayout::Blocks => {
                    let second = if s.len() > TILE { f(TILE + r) } else { 0.0 };
                    [f(r), second]
                }
                ScaleLayout::SuperMins => {
                    let q = std::array::from_fn(|i| codes[LINE * (i / 4) + 4 * r + i % 4]);
                    let (sc, m) = get_scale_min_k4(j, &q);
                    // The kernels' `(2²³ + code) · scale - 2²³ · scale` gives zeros as +0.
                    let exact = |v: f32| if v == 0.0 { 0.0 } else { v };
                    [
                        exact(f(r) * f32::from(sc)),
                        exact(f(TILE + r) * f32::from(m)),
                    ]
                }
                ScaleLayout::SuperHalves => {
                    let sc = |half: usize| f32::from(codes[TILE * (2 * j + half) + r] as i8);
                    [f(r) * sc(0), f(r) * sc(1)]
                }
            };
            (out[0][r], out[1][r]) = (pair[0], pair[1]);
        }
        out
    }
}

/// Byte offsets of a tile's quants of one block, and of its period's scales and codes.
struct Offsets {
    quants: usize,
    scales: usize,
    codes: usize,
}
