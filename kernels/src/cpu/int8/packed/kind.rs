//! The block formats a [`PackedMatrix`](super::PackedMatrix) is packed from, and what each
//! one's tiles hold.

use crate::quant::{
    BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0,
    BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0, KVALUES_IQ4NL, KVALUES_MXFP4, QK_K,
};

use super::{LANE_TILES, LANES, LINE, QK, TILE};

/// A table of signed values as the kernels multiply them: unsigned bytes `value + 128`.
const fn unsigned(values: [i8; 16]) -> [u8; 16] {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (values[i] as u8) ^ 0x80;
        i += 1;
    }
    t
}

/// The IQ4 table's values as the kernels multiply them.
const IQ4_UNSIGNED: [u8; 16] = unsigned(KVALUES_IQ4NL);

/// `MXFP4`'s doubled E2M1 values as the kernels multiply them.
const MXFP4_UNSIGNED: [u8; 16] = unsigned(KVALUES_MXFP4);

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

/// The block format a [`PackedMatrix`](super::PackedMatrix) was packed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PackedKind {
    /// GGUF `Q8_0`: `value = q · d`.
    Q8_0,
    /// GGUF `Q4_1`: `value = q · d + m`.
    Q4_1,
    /// GGUF `Q4_0`: `value = (q - 8) · d`, laid out as `IQ4NL` with the table `q - 8`.
    Q4_0,
    /// GGUF `Q4_K`: nibble lines as `Q4_1`, the super-block's `d`, `-dmin` and 6-bit codes
    /// per 256 values.
    Q4K,
    /// GGUF `Q5_K`: as `Q4K`, with a line of high bits per block.
    Q5K,
    /// GGUF `Q5_1`: `value = q · d + m`, laid out as `Q5K`.
    Q5_1,
    /// GGUF `Q5_0`: `value = (q - 16) · d`, laid out as `Q5K` with `m = -16 d`.
    Q5_0,
    /// GGUF `Q6_K`: as `Q5K` with two lines of high bits, a scale per 16-value half, and
    /// the super-block's `d` per 256 values.
    Q6K,
    /// GGUF `Q3_K`: 3-bit quants in two crumb lines and a mask line, scales as `Q6K`'s.
    Q3K,
    /// GGUF `IQ4_NL`: `value = d · table[q]`, indices in nibble lines, one scale per block.
    IQ4NL,
    /// GGUF `IQ4_XS`: as `IQ4NL`, with each sub-block's `d · (ls - 32)` (rounded to f16).
    IQ4XS,
    /// `MXFP4`: as `IQ4NL` with the doubled E2M1 values as the table and the block's
    /// `2^(e - 128)` as its f16 scale.
    MXFP4,
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

/// Where a kind's scales sit: what the kernels' epilogues read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScaleLayout {
    /// Per block of 32 values and tile: [`PackedKind::scales`] f16, 16 `d` (then 16 `m`, or
    /// the second half's `d`).
    Blocks,
    /// Per super-block of 256 and tile (`Q4_K`, `Q5_K`): 16 f16 `d`, then 16 f16 `-dmin`,
    /// and each row's 12 bytes of 6-bit scale and minimum codes as in the file, in three
    /// lines (line `w`, bytes `4 r ..`: row `r`'s `w`-th four bytes), so a 32-bit lane holds
    /// one row's word as ggml's masks take it.
    SuperMins,
    /// Per super-block of 256 and tile (`Q6_K`, `Q3_K`): 16 f16 `d`, and each row's sixteen
    /// `i8` scales of 16 values in four lines, scale `s` of row `r` at byte `16 s + r` (the
    /// sixteen rows' bytes sign-extend to a register's lanes in one load).
    SuperHalves,
}

impl PackedKind {
    /// The layout of the kind's quants.
    pub(crate) const fn layout(self) -> QuantLayout {
        match self {
            Self::Q8_0 => QuantLayout::Bytes,
            Self::Q4_1 | Self::Q4K => QuantLayout::Nibbles { fifth_bit: false },
            Self::Q5K | Self::Q5_1 | Self::Q5_0 => QuantLayout::Nibbles { fifth_bit: true },
            Self::Q4_0 | Self::IQ4NL | Self::IQ4XS | Self::MXFP4 => QuantLayout::Table,
            Self::Q6K => QuantLayout::Halves { crumbs: false },
            Self::Q3K => QuantLayout::Halves { crumbs: true },
        }
    }

    /// Where the kind's scales sit.
    pub(crate) const fn scale_layout(self) -> ScaleLayout {
        match self {
            Self::Q4K | Self::Q5K => ScaleLayout::SuperMins,
            Self::Q6K | Self::Q3K => ScaleLayout::SuperHalves,
            _ => ScaleLayout::Blocks,
        }
    }

    /// Blocks per scale period: one, or a super-block's eight.
    pub(crate) const fn period_blocks(self) -> usize {
        match self.scale_layout() {
            ScaleLayout::Blocks => 1,
            ScaleLayout::SuperMins | ScaleLayout::SuperHalves => QK_K / QK,
        }
    }

    /// Bytes of one tile's codes per period (whole lines).
    pub(crate) const fn code_bytes(self) -> usize {
        match self.scale_layout() {
            ScaleLayout::Blocks => 0,
            ScaleLayout::SuperMins => 3 * LINE,
            ScaleLayout::SuperHalves => 4 * LINE,
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

    /// Bytes of one period of one lane's codes, then its f16 scales (a whole number of
    /// lines, so every quant line stays aligned): after a block's quants, before a
    /// super-block's.
    pub(crate) const fn lane_header_bytes(self) -> usize {
        LANE_TILES * (self.code_bytes() + 2 * self.scales())
    }

    /// Bytes of one period of one lane: the header, then block after block its tiles' quants.
    pub(crate) const fn lane_period_bytes(self) -> usize {
        self.lane_header_bytes() + self.period_blocks() * LANE_TILES * self.quant_bytes()
    }

    /// Bytes of one period of one group (all its lanes).
    pub(crate) const fn group_period_bytes(self) -> usize {
        LANES * self.lane_period_bytes()
    }

    /// f16 scales of one period of one tile: `d`, then `m` (or the second half's `d`, or the
    /// super-block's `-dmin`).
    pub(crate) const fn scales(self) -> usize {
        match (self.scale_layout(), self.layout()) {
            (ScaleLayout::SuperHalves, _) => TILE,
            (ScaleLayout::SuperMins, _) => 2 * TILE,
            (_, QuantLayout::Bytes | QuantLayout::Table) => TILE,
            (_, QuantLayout::Nibbles { .. } | QuantLayout::Halves { .. }) => 2 * TILE,
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
            Self::MXFP4 => (size_of::<BlockMXFP4>(), QK),
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

    /// For nibbles that index a table of 16 values (the IQ4 kinds, `MXFP4`, and `Q4_0` whose values
    /// `q - 8` make one too), the values as the kernels multiply them: unsigned bytes
    /// `value + 128`.
    pub(crate) const fn table(self) -> Option<&'static [u8; 16]> {
        match self {
            Self::IQ4NL | Self::IQ4XS => Some(&IQ4_UNSIGNED),
            Self::MXFP4 => Some(&MXFP4_UNSIGNED),
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
