//! CPU kernels on f32 activations. Every kernel is deterministic and computes each output
//! element with a reduction order that does not depend on the batch it is part of, so a
//! sequence gets bit-identical results alone, batched, or with its prefill chunked.
//!
//! The hot kernels come in several instruction-set levels (portable, AVX2 + FMA, AVX-512),
//! chosen once at startup from the CPU's features; see [`dispatch`].

pub mod activation;
mod arch;
pub mod attention;
pub mod bf16_dot;
pub mod dispatch;
pub mod int8;
pub mod matmul;
pub mod norm;
pub mod rope;
pub mod team;
#[cfg(test)]
mod test_util;
pub mod weights;

pub use dispatch::{Kernels, Level, describe, kernels};
pub use weights::{ActivationDtype, WeightFormat, WeightMatrix, linear_weights, linear_weights_as};
