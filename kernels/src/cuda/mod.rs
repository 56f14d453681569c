//! CUDA kernels behind the `cuda` feature: the `.cu` sources of `kernels/cuda/`, compiled at
//! start by NVRTC for the device's architecture and cached on disk, typed launchers for each of
//! them, and GEMM through cuBLASLt (bf16/f16) and cuBLAS (f32).
//!
//! Every CUDA library is loaded at run time (cudarc's `dynamic-loading`): a binary built with
//! `cuda` starts on a machine without a GPU, and [`CudaLibs::probe`] / [`GpuDevice::open`]
//! answer a typed [`CudaError`] where cudarc would otherwise panic on the first call.
//!
//! ```no_run
//! use tessera_kernels::cuda::{GpuDevice, GpuKernels, PtxCache};
//! let device = GpuDevice::open(0)?; // rank 0 → device 0
//! let kernels = GpuKernels::load(&device, &PtxCache::default_location())?;
//! # Ok::<(), tessera_kernels::cuda::CudaError>(())
//! ```
#![allow(unsafe_code)]

mod blas;
mod compile;
mod device;
mod ops;

pub use blas::{Gemm, GemmElem, Product};
pub use compile::{
    KernelSource, PtxCache, SOURCES, arch_for, compile_ptx, expand_source, nvrtc_version,
    preload_nvrtc,
};
pub use device::{CudaLibs, GpuDevice};
pub use ops::{
    CacheView, DecodeArgs, GpuFloat, GpuKernels, GpuQuant, MAX_TOP_K, PREFILL_HEAD_DIMS,
    PrefillArgs, RopeCacheArgs, TC_PREFILL_HEAD_DIMS,
};

/// The cudarc version this module is written against, re-exported so that the engine's CUDA
/// backend uses the same types (`CudaSlice`, `CudaStream`, …).
pub use cudarc;

/// What can go wrong before or while running a kernel.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// A CUDA library could not be loaded.
    #[error("no {lib} found: {hint}")]
    MissingLibrary {
        /// The library, e.g. `CUDA driver (libcuda.so)`.
        lib: &'static str,
        /// What to install or set.
        hint: &'static str,
    },
    /// The driver loads but reports no device (or fewer than the rank needs).
    #[error("no CUDA device {ordinal}: the driver sees {count} device(s)")]
    NoDevice {
        /// The device asked for.
        ordinal: usize,
        /// Devices visible (after `CUDA_VISIBLE_DEVICES`).
        count: usize,
    },
    /// A driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    /// A cuBLASLt call failed.
    #[error("cuBLASLt: {0:?}")]
    Blas(cudarc::cublaslt::result::CublasError),
    /// A cuBLAS call failed.
    #[error("cuBLAS: {0:?}")]
    Cublas(cudarc::cublas::result::CublasError),
    /// NVRTC rejected a source.
    #[error("NVRTC could not compile {file} for {arch}: {log}")]
    Compile {
        /// The `.cu` file.
        file: &'static str,
        /// The target, e.g. `sm_90`.
        arch: String,
        /// The compiler's log.
        log: String,
    },
    /// The PTX cache could not be read or written.
    #[error("PTX cache {path}: {source}")]
    Cache {
        /// The file or folder.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A launcher was called with inconsistent shapes.
    #[error("invalid kernel arguments: {0}")]
    Shape(String),
}

impl From<cudarc::cublaslt::result::CublasError> for CudaError {
    fn from(e: cudarc::cublaslt::result::CublasError) -> Self {
        CudaError::Blas(e)
    }
}
