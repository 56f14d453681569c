//! x86-64 levels: AVX-512 F and AVX2 + FMA.

mod attention_avx2;
mod attention_avx512;
pub(crate) mod avx2;
pub(crate) mod avx512;
pub(crate) mod bf16_dot;
mod dequant_avx2;
mod dequant_avx512;
pub(crate) mod int8;
pub(crate) mod int8_avx2;
pub(crate) mod int8_avxvnni;
mod silu;
