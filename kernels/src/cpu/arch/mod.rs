//! SIMD implementations per architecture, reached only through [`super::dispatch`] tables.

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_64;
