//! The block formats as one enum, whose facts are their block types' [`BlockFormat`]s.

use crate::BlockFormat;

/// The quantized block formats Tessera can dequantize.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// 32 values, f16 scale, 8-bit quants (34 bytes).
    Q8_0,
    /// 32 values, f16 scale, 4-bit quants (18 bytes).
    Q4_0,
    /// 32 values, f16 scale and minimum, 4-bit quants (20 bytes).
    Q4_1,
    /// 32 values, f16 scale, 5-bit quants (22 bytes).
    Q5_0,
    /// 32 values, f16 scale and minimum, 5-bit quants (24 bytes).
    Q5_1,
    /// 256 values, 4-bit quants with 6-bit sub-block scales and minimums (144 bytes).
    Q4K,
    /// 256 values, 5-bit quants with 6-bit sub-block scales and minimums (176 bytes).
    Q5K,
    /// 256 values, 6-bit quants with 8-bit sub-block scales (210 bytes).
    Q6K,
    /// 256 values, 2-bit quants with 4-bit sub-block scales and minimums (84 bytes).
    Q2K,
    /// 256 values, 3-bit quants with 6-bit sub-block scales (110 bytes).
    Q3K,
    /// 32 values, f16 scale, 4-bit indices into a table of 16 values (18 bytes).
    IQ4NL,
    /// 256 values, 6-bit sub-block scales, 4-bit indices as `IQ4_NL`'s (136 bytes).
    IQ4XS,
    /// 32 values, a power-of-two scale, 4-bit E2M1 floats (17 bytes).
    MXFP4,
}

/// Evaluates `$body` with the type `$B` standing for the block type of `$format` (a
/// [`QuantFormat`]): the one place that pairs each format with its block.
macro_rules! with_block {
    ($format:expr, $B:ident => $body:expr) => {
        match $format {
            $crate::QuantFormat::Q8_0 => {
                type $B = $crate::BlockQ8_0;
                $body
            }
            $crate::QuantFormat::Q4_0 => {
                type $B = $crate::BlockQ4_0;
                $body
            }
            $crate::QuantFormat::Q4_1 => {
                type $B = $crate::BlockQ4_1;
                $body
            }
            $crate::QuantFormat::Q5_0 => {
                type $B = $crate::BlockQ5_0;
                $body
            }
            $crate::QuantFormat::Q5_1 => {
                type $B = $crate::BlockQ5_1;
                $body
            }
            $crate::QuantFormat::Q4K => {
                type $B = $crate::BlockQ4K;
                $body
            }
            $crate::QuantFormat::Q5K => {
                type $B = $crate::BlockQ5K;
                $body
            }
            $crate::QuantFormat::Q6K => {
                type $B = $crate::BlockQ6K;
                $body
            }
            $crate::QuantFormat::Q2K => {
                type $B = $crate::BlockQ2K;
                $body
            }
            $crate::QuantFormat::Q3K => {
                type $B = $crate::BlockQ3K;
                $body
            }
            $crate::QuantFormat::IQ4NL => {
                type $B = $crate::BlockIQ4NL;
                $body
            }
            $crate::QuantFormat::IQ4XS => {
                type $B = $crate::BlockIQ4XS;
                $body
            }
            $crate::QuantFormat::MXFP4 => {
                type $B = $crate::BlockMXFP4;
                $body
            }
        }
    };
}
pub(crate) use with_block;

impl QuantFormat {
    /// Every format, for tests and tables.
    pub const ALL: [QuantFormat; 13] = [
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

    /// Values per block.
    pub const fn block_elements(self) -> usize {
        with_block!(self, B => B::BLOCK_ELEMENTS)
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        with_block!(self, B => B::BLOCK_BYTES)
    }

    /// The name ggml and GGUF use (`Q4_K`).
    pub const fn name(self) -> &'static str {
        with_block!(self, B => B::NAME)
    }

    /// The inverse of [`QuantFormat::name`].
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }
}

impl std::fmt::Display for QuantFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
