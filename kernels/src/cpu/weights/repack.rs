//! Repacking a matrix's blocks for integer dot products (`cpu::int8`).

use super::{Data, WeightMatrix};
use crate::cpu::int8::packed::PackedMatrix;

impl WeightMatrix {
    /// The matrix repacked for integer dot products with 8-bit-quantized activations
    /// (`cpu::int8`) when it is in a GGUF block format but `Q2_K` (whose per-16 minimums the
    /// int8 kernels do not take); that and the float formats are returned unchanged. Products
    /// are then faster, but no longer bit-identical to f32 over the dequantized matrix (and
    /// `IQ4_XS`'s sub-block scales are rounded to f16).
    pub fn into_int8(self) -> Self {
        let data = match self.data {
            Data::Q8_0(v) => Data::Packed(PackedMatrix::from_q8_0(self.rows, self.cols, &v)),
            Data::Q4_1(v) => Data::Packed(PackedMatrix::from_q4_1(self.rows, self.cols, &v)),
            Data::Q4_0(v) => Data::Packed(PackedMatrix::from_q4_0(self.rows, self.cols, &v)),
            Data::Q5_0(v) => match PackedMatrix::from_q5_0(self.rows, self.cols, &v) {
                Some(p) => Data::Packed(p),
                None => Data::Q5_0(v),
            },
            Data::Q5_1(v) => Data::Packed(PackedMatrix::from_q5_1(self.rows, self.cols, &v)),
            Data::Q4K(v) => match PackedMatrix::from_q4_k(self.rows, self.cols, &v) {
                Some(p) => Data::Packed(p),
                None => Data::Q4K(v),
            },
            Data::Q5K(v) => match PackedMatrix::from_q5_k(self.rows, self.cols, &v) {
                Some(p) => Data::Packed(p),
                None => Data::Q5K(v),
            },
            Data::Q6K(v) => match PackedMatrix::from_q6_k(self.rows, self.cols, &v) {
                Some(p) => Data::Packed(p),
                None => Data::Q6K(v),
            },
            Data::Q3K(v) => match PackedMatrix::from_q3_k(self.rows, self.cols, &v) {
                Some(p) => Data::Packed(p),
                None => Data::Q3K(v),
            },
            Data::IQ4NL(v) => Data::Packed(PackedMatrix::from_iq4_nl(self.rows, self.cols, &v)),
            Data::IQ4XS(v) => match PackedMatrix::from_iq4_xs(self.rows, self.cols, &v) {
                Some(p) => Data::Packed(p),
                None => Data::IQ4XS(v),
            },
            Data::MXFP4(v) => match PackedMatrix::from_mxfp4(self.rows, self.cols, &v) {
                Some(p) => Data::Packed(p),
                None => Data::MXFP4(v),
            },
            Data::Stack(parts) => Data::Stack(parts.into_iter().map(Self::into_int8).collect()),
            other => other,
        };
        Self { data, ..self }
    }
}
