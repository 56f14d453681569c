//! Dense GEMM through cuBLASLt in bf16/f16 (f32 accumulation) or f32 (TF32).

use std::sync::Arc;

use cudarc::cublaslt::{CudaBlasLT, Matmul, MatmulConfig};
use cudarc::driver::{CudaSlice, CudaStream};

use super::{CudaError, CudaLibs};

/// A cuBLASLt handle with its workspace, bound to one stream.
#[derive(Debug)]
pub struct Gemm {
    lt: CudaBlasLT,
}

impl Gemm {
    /// Creates the handle, or says that cuBLASLt is missing.
    pub fn new(stream: Arc<CudaStream>) -> Result<Self, CudaError> {
        CudaLibs::probe().require_cublaslt()?;
        Ok(Gemm {
            lt: CudaBlasLT::new(stream)?,
        })
    }

    /// `out[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n])`, all row-major: the layout of a
    /// Hugging Face `Linear` weight, so no transposed copy of the weights is ever made.
    ///
    /// cuBLASLt is column-major; a row-major `[r, c]` matrix is a column-major `[c, r]` one, so
    /// this computes `outᵀ[n, m] = w[n, k] · xᵀ[k, m]` with `w` transposed from its stored
    /// `[k, n]` column-major view. The bias (length `n`) is fused as the epilogue.
    #[allow(clippy::too_many_arguments)]
    pub fn linear<T>(
        &self,
        x: &CudaSlice<T>,
        w: &CudaSlice<T>,
        bias: Option<&CudaSlice<T>>,
        out: &mut CudaSlice<T>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), CudaError>
    where
        CudaBlasLT: Matmul<T>,
    {
        if x.len() < m * k || w.len() < n * k || out.len() < m * n {
            return Err(CudaError::Shape(format!(
                "linear m={m} n={n} k={k}: x {}, w {}, out {}",
                x.len(),
                w.len(),
                out.len()
            )));
        }
        if bias.is_some_and(|b| b.len() < n) {
            return Err(CudaError::Shape(format!("linear bias shorter than n={n}")));
        }
        let cfg = MatmulConfig {
            transa: true,
            transb: false,
            transc: false,
            m: n as u64,
            n: m as u64,
            k: k as u64,
            alpha: 1.0,
            lda: k as i64,
            ldb: k as i64,
            beta: 0.0,
            ldc: n as i64,
            stride_a: None,
            stride_b: None,
            stride_c: None,
            stride_bias: None,
            batch_size: None,
        };
        // SAFETY: the shapes were checked against the buffer lengths above, and every buffer
        // lives on this handle's context; cudarc orders the call on the handle's stream.
        unsafe { self.lt.matmul(cfg, w, x, out, bias, None) }?;
        Ok(())
    }
}
