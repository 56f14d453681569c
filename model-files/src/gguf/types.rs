//! ggml tensor types as GGUF numbers them.

use tessera_blocks::{QuantFormat, WeightFormat};

/// A ggml tensor type (`ggml_type`), with the ids GGUF files store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)] // the variants are ggml's names
#[non_exhaustive]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    IQ2XXS,
    IQ2XS,
    IQ3XXS,
    IQ1S,
    IQ4NL,
    IQ3S,
    IQ2S,
    IQ4XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

/// (type, id, name, values per block, bytes per block), from ggml's `type_traits`.
const TABLE: [(GgmlType, u32, &str, usize, usize); 32] = [
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 40),
    (GgmlType::Q2K, 10, "Q2_K", 256, 84),
    (GgmlType::Q3K, 11, "Q3_K", 256, 110),
    (GgmlType::Q4K, 12, "Q4_K", 256, 144),
    (GgmlType::Q5K, 13, "Q5_K", 256, 176),
    (GgmlType::Q6K, 14, "Q6_K", 256, 210),
    (GgmlType::Q8K, 15, "Q8_K", 256, 292),
    (GgmlType::IQ2XXS, 16, "IQ2_XXS", 256, 66),
    (GgmlType::IQ2XS, 17, "IQ2_XS", 256, 74),
    (GgmlType::IQ3XXS, 18, "IQ3_XXS", 256, 98),
    (GgmlType::IQ1S, 19, "IQ1_S", 256, 50),
    (GgmlType::IQ4NL, 20, "IQ4_NL", 32, 18),
    (GgmlType::IQ3S, 21, "IQ3_S", 256, 110),
    (GgmlType::IQ2S, 22, "IQ2_S", 256, 82),
    (GgmlType::IQ4XS, 23, "IQ4_XS", 256, 136),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::IQ1M, 29, "IQ1_M", 256, 56),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (GgmlType::TQ1_0, 34, "TQ1_0", 256, 54),
    (GgmlType::TQ2_0, 35, "TQ2_0", 256, 66),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 17),
];

impl GgmlType {
    /// The types Tessera can convert to f32, for error messages.
    pub const SUPPORTED: &'static str = concat!(
        "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, ",
        "Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4"
    );

    fn row(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        // Every variant has a row; the fallback is unreachable but keeps this panic-free.
        TABLE.iter().find(|r| r.0 == self).unwrap_or(&TABLE[0])
    }

    /// The type with this GGUF id, if ggml defines one.
    pub fn from_id(id: u32) -> Option<Self> {
        TABLE.iter().find(|r| r.1 == id).map(|r| r.0)
    }

    /// The GGUF id.
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// ggml's name (`Q4_K`).
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Values per block (1 for plain number types).
    pub fn block_elements(self) -> usize {
        self.row().3
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.row().4
    }

    /// The kernels' block format, for the quantized types Tessera dequantizes.
    pub fn quant_format(self) -> Option<QuantFormat> {
        match self {
            Self::Q8_0 => Some(QuantFormat::Q8_0),
            Self::Q4_0 => Some(QuantFormat::Q4_0),
            Self::Q4_1 => Some(QuantFormat::Q4_1),
            Self::Q5_0 => Some(QuantFormat::Q5_0),
            Self::Q5_1 => Some(QuantFormat::Q5_1),
            Self::Q4K => Some(QuantFormat::Q4K),
            Self::Q5K => Some(QuantFormat::Q5K),
            Self::Q6K => Some(QuantFormat::Q6K),
            Self::Q2K => Some(QuantFormat::Q2K),
            Self::Q3K => Some(QuantFormat::Q3K),
            Self::IQ4NL => Some(QuantFormat::IQ4NL),
            Self::IQ4XS => Some(QuantFormat::IQ4XS),
            Self::MXFP4 => Some(QuantFormat::MXFP4),
            _ => None,
        }
    }

    /// The kernels' storage format, for the types whose matrices stay as they are in the
    /// file (everything Tessera reads except F32, which needs no conversion anyway).
    pub fn weight_format(self) -> Option<WeightFormat> {
        match self {
            Self::F16 => Some(WeightFormat::F16),
            Self::BF16 => Some(WeightFormat::Bf16),
            _ => self.quant_format().map(WeightFormat::from),
        }
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
