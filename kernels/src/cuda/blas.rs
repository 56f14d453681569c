//! Dense GEMM: bf16/f16 through cuBLASLt (f32 accumulation, bias fused as the epilogue), f32
//! through cuBLAS `sgemm` in full FP32. cuBLASLt's f32 path computes in TF32 (10-bit
//! mantissas), which would put an f32 model 1e-3 away from the CPU and transformers; f32 is
//! the mode for checking a GPU against them, so it stays exact.

use std::sync::Arc;

use cudarc::cublas::{CudaBlas, GemmConfig, sys::cublasOperation_t};
use cudarc::cublaslt::{CudaBlasLT, Matmul, MatmulConfig};
use cudarc::driver::{CudaSlice, CudaStream};
use half::{bf16, f16};

use super::{CudaError, CudaLibs, GpuFloat};

/// cuBLAS and cuBLASLt handles (with cuBLASLt's workspace), bound to one stream.
#[derive(Debug)]
pub struct Gemm {
    lt: CudaBlasLT,
    blas: CudaBlas,
    stream: Arc<CudaStream>,
}

/// An element type [`Gemm::linear`] multiplies.
pub trait GemmElem: GpuFloat {
    /// `out = x · wᵀ (+ bias)` with shapes already checked.
    #[doc(hidden)]
    fn linear(gemm: &Gemm, p: Product<'_, Self>) -> Result<(), CudaError>;
}

/// The operands of one product, shapes checked.
#[doc(hidden)]
#[derive(Debug)]
pub struct Product<'a, T> {
    x: &'a CudaSlice<T>,
    w: &'a CudaSlice<T>,
    bias: Option<&'a CudaSlice<T>>,
    out: &'a mut CudaSlice<T>,
    m: usize,
    n: usize,
    k: usize,
}

/// Row-major `out[m, n] = x[m, k] · w[n, k]ᵀ` in cuBLASLt's column-major terms: a row-major
/// `[r, c]` matrix is a column-major `[c, r]` one, so this is `outᵀ[n, m] = w[n, k] · xᵀ[k, m]`
/// with `w` transposed from its stored `[k, n]` column-major view.
fn lt_linear<T>(gemm: &Gemm, p: Product<'_, T>) -> Result<(), CudaError>
where
    CudaBlasLT: Matmul<T>,
{
    let cfg = MatmulConfig {
        transa: true,
        transb: false,
        transc: false,
        m: p.n as u64,
        n: p.m as u64,
        k: p.k as u64,
        alpha: 1.0,
        lda: p.k as i64,
        ldb: p.k as i64,
        beta: 0.0,
        ldc: p.n as i64,
        stride_a: None,
        stride_b: None,
        stride_c: None,
        stride_bias: None,
        batch_size: None,
    };
    // SAFETY: the shapes were checked against the buffer lengths by `Gemm::linear`, and every
    // buffer lives on this handle's context; cudarc orders the call on the handle's stream.
    unsafe { gemm.lt.matmul(cfg, p.w, p.x, p.out, p.bias, None) }?;
    Ok(())
}

impl GemmElem for bf16 {
    fn linear(gemm: &Gemm, p: Product<'_, Self>) -> Result<(), CudaError> {
        lt_linear(gemm, p)
    }
}

impl GemmElem for f16 {
    fn linear(gemm: &Gemm, p: Product<'_, Self>) -> Result<(), CudaError> {
        lt_linear(gemm, p)
    }
}

impl GemmElem for f32 {
    fn linear(gemm: &Gemm, p: Product<'_, Self>) -> Result<(), CudaError> {
        use cudarc::cublas::Gemm as _;
        let i32_of = |v: usize| {
            i32::try_from(v).map_err(|_| CudaError::Shape(format!("sgemm dimension {v}")))
        };
        let (m, n, k) = (i32_of(p.m)?, i32_of(p.n)?, i32_of(p.k)?);
        // sgemm has no bias epilogue: start every output row from the bias, then add.
        let beta = match p.bias {
            Some(bias) => {
                for r in 0..p.m {
                    gemm.stream.memcpy_dtod(
                        &bias.slice(..p.n),
                        &mut p.out.slice_mut(r * p.n..(r + 1) * p.n),
                    )?;
                }
                1.0
            }
            None => 0.0,
        };
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_T,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: n,
            n: m,
            k,
            alpha: 1.0f32,
            lda: k,
            ldb: k,
            beta,
            ldc: n,
        };
        // SAFETY: as in `lt_linear`; the same column-major reading of the row-major buffers.
        unsafe { gemm.blas.gemm(cfg, p.w, p.x, p.out) }.map_err(CudaError::Cublas)?;
        Ok(())
    }
}

impl Gemm {
    /// Creates the handles, or says which library is missing.
    pub fn new(stream: Arc<CudaStream>) -> Result<Self, CudaError> {
        let libs = CudaLibs::probe();
        libs.require_cublaslt()?;
        libs.require_cublas()?;
        Ok(Gemm {
            lt: CudaBlasLT::new(stream.clone())?,
            blas: CudaBlas::new(stream.clone()).map_err(CudaError::Cublas)?,
            stream,
        })
    }

    /// `out[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n])`, all row-major: the layout of a
    /// Hugging Face `Linear` weight, so no transposed copy of the weights is ever made.
    #[allow(clippy::too_many_arguments)]
    pub fn linear<T: GemmElem>(
        &self,
        x: &CudaSlice<T>,
        w: &CudaSlice<T>,
        bias: Option<&CudaSlice<T>>,
        out: &mut CudaSlice<T>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), CudaError> {
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
        if m == 0 || n == 0 {
            return Ok(());
        }
        T::linear(
            self,
            Product {
                x,
                w,
                bias,
                out,
                m,
                n,
                k,
            },
        )
    }
}
