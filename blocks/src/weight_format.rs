//! How a weight matrix stores its values: plain floats, or the blocks of a [`QuantFormat`].
//! The conversions between the two enums are here and nowhere else.

use crate::QuantFormat;

/// How a weight matrix (`tessera_kernels::cpu::WeightMatrix`) stores its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// Plain f32.
    F32,
    /// bfloat16 (the upper half of an f32).
    Bf16,
    /// IEEE half precision.
    F16,
    /// GGUF `Q8_0` blocks: 32 values, f16 scale, 8-bit quants.
    Q8_0,
    /// GGUF `Q4_0` blocks: 32 values, f16 scale, 4-bit quants offset by 8.
    Q4_0,
    /// GGUF `Q4_1` blocks: 32 values, f16 scale and minimum, 4-bit quants.
    Q4_1,
    /// GGUF `Q5_0` blocks: 32 values, f16 scale, 5-bit quants offset by 16.
    Q5_0,
    /// GGUF `Q5_1` blocks: 32 values, f16 scale and minimum, 5-bit quants.
    Q5_1,
    /// GGUF `Q4_K` super-blocks: 256 values, 6-bit sub-block scales and minimums, 4-bit
    /// quants.
    Q4K,
    /// GGUF `Q5_K` super-blocks: as `Q4_K` with 5-bit quants.
    Q5K,
    /// GGUF `Q6_K` super-blocks: 256 values, 8-bit sub-block scales, 6-bit quants.
    Q6K,
    /// GGUF `Q2_K` super-blocks: 256 values, 4-bit sub-block scales and minimums per 16,
    /// 2-bit quants.
    Q2K,
    /// GGUF `Q3_K` super-blocks: 256 values, 6-bit sub-block scales per 16, 3-bit quants.
    Q3K,
    /// GGUF `IQ4_NL` blocks: 32 values, f16 scale, 4-bit indices into a fixed table.
    IQ4NL,
    /// GGUF `IQ4_XS` super-blocks: 256 values, 6-bit sub-block scales, `IQ4_NL`'s indices.
    IQ4XS,
    /// `MXFP4` blocks: 32 values, a power-of-two scale, 4-bit E2M1 floats (GGUF's and
    /// gpt-oss checkpoints' expert format).
    MXFP4,
}

/// What a [`WeightFormat`]'s values are.
enum Layout {
    /// One float of `bytes` bytes per value, named as GGUF names it.
    Float { name: &'static str, bytes: usize },
    /// Blocks of a quantized format.
    Blocks(QuantFormat),
}

impl WeightFormat {
    /// Every format, for tests and tables.
    pub const ALL: [WeightFormat; 16] = [
        Self::F32,
        Self::Bf16,
        Self::F16,
        Self::Q8_0,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
        Self::IQ4NL,
        Self::IQ4XS,
        Self::Q2K,
        Self::Q3K,
        Self::MXFP4,
    ];

    const fn layout(self) -> Layout {
        match self {
            Self::F32 => Layout::Float {
                name: "F32",
                bytes: 4,
            },
            Self::Bf16 => Layout::Float {
                name: "BF16",
                bytes: 2,
            },
            Self::F16 => Layout::Float {
                name: "F16",
                bytes: 2,
            },
            Self::Q8_0 => Layout::Blocks(QuantFormat::Q8_0),
            Self::Q4_0 => Layout::Blocks(QuantFormat::Q4_0),
            Self::Q4_1 => Layout::Blocks(QuantFormat::Q4_1),
            Self::Q5_0 => Layout::Blocks(QuantFormat::Q5_0),
            Self::Q5_1 => Layout::Blocks(QuantFormat::Q5_1),
            Self::Q4K => Layout::Blocks(QuantFormat::Q4K),
            Self::Q5K => Layout::Blocks(QuantFormat::Q5K),
            Self::Q6K => Layout::Blocks(QuantFormat::Q6K),
            Self::Q2K => Layout::Blocks(QuantFormat::Q2K),
            Self::Q3K => Layout::Blocks(QuantFormat::Q3K),
            Self::IQ4NL => Layout::Blocks(QuantFormat::IQ4NL),
            Self::IQ4XS => Layout::Blocks(QuantFormat::IQ4XS),
            Self::MXFP4 => Layout::Blocks(QuantFormat::MXFP4),
        }
    }

    /// The block format of a GGUF block format; `None` for the float formats.
    pub const fn quant(self) -> Option<QuantFormat> {
        match self.layout() {
            Layout::Blocks(q) => Some(q),
            Layout::Float { .. } => None,
        }
    }

    /// Values per block (1 for the float formats).
    pub const fn block_elements(self) -> usize {
        match self.layout() {
            Layout::Blocks(q) => q.block_elements(),
            Layout::Float { .. } => 1,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self.layout() {
            Layout::Blocks(q) => q.block_bytes(),
            Layout::Float { bytes, .. } => bytes,
        }
    }

    /// The name GGUF uses (`Q4_K`, `BF16`).
    pub const fn name(self) -> &'static str {
        match self.layout() {
            Layout::Blocks(q) => q.name(),
            Layout::Float { name, .. } => name,
        }
    }
}

impl From<QuantFormat> for WeightFormat {
    fn from(q: QuantFormat) -> Self {
        match q {
            QuantFormat::Q8_0 => Self::Q8_0,
            QuantFormat::Q4_0 => Self::Q4_0,
            QuantFormat::Q4_1 => Self::Q4_1,
            QuantFormat::Q5_0 => Self::Q5_0,
            QuantFormat::Q5_1 => Self::Q5_1,
            QuantFormat::Q4K => Self::Q4K,
            QuantFormat::Q5K => Self::Q5K,
            QuantFormat::Q6K => Self::Q6K,
            QuantFormat::Q2K => Self::Q2K,
            QuantFormat::Q3K => Self::Q3K,
            QuantFormat::IQ4NL => Self::IQ4NL,
            QuantFormat::IQ4XS => Self::IQ4XS,
            QuantFormat::MXFP4 => Self::MXFP4,
        }
    }
}
