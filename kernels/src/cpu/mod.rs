//! CPU kernels on f32 activations. Every kernel is deterministic and computes each output
//! element with a reduction order that does not depend on the batch it is part of, so a
//! sequence gets bit-identical results alone, batched, or with its prefill chunked.

pub mod activation;
pub mod attention;
pub mod matmul;
pub mod norm;
pub mod rope;
