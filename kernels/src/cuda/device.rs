//! Library checks and device selection.
//!
//! cudarc panics on its first call into a library it cannot load; everything here checks with
//! `is_culib_present` first and turns absence into [`CudaError::MissingLibrary`].

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};

use super::CudaError;

/// Which CUDA libraries this process can load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaLibs {
    /// `libcuda.so` (the driver; comes with the NVIDIA kernel driver, not the toolkit).
    pub driver: bool,
    /// `libnvrtc.so` (runtime compilation; see [`super::preload_nvrtc`] for the pip wheel).
    pub nvrtc: bool,
    /// `libcublas.so`.
    pub cublas: bool,
    /// `libcublasLt.so`.
    pub cublaslt: bool,
    /// `libnccl.so` (cudarc looks for the unversioned name: a `libnccl.so.2` alone needs a link).
    pub nccl: bool,
}

impl CudaLibs {
    /// Tries to load each library (and preloads NVRTC from a known wheel folder first).
    pub fn probe() -> Self {
        let _ = super::compile::preload_nvrtc();
        // SAFETY: each `is_culib_present` only dlopens candidate names and drops the handle;
        // it runs no library code beyond the loader's initialisers.
        unsafe {
            CudaLibs {
                driver: cudarc::driver::sys::is_culib_present(),
                nvrtc: cudarc::nvrtc::sys::is_culib_present(),
                cublas: cudarc::cublas::sys::is_culib_present(),
                cublaslt: cudarc::cublaslt::sys::is_culib_present(),
                nccl: cudarc::nccl::sys::is_culib_present(),
            }
        }
    }

    /// The driver, or a clear error.
    pub fn require_driver(&self) -> Result<(), CudaError> {
        if self.driver {
            Ok(())
        } else {
            Err(CudaError::MissingLibrary {
                lib: "CUDA driver (libcuda.so)",
                hint: "install the NVIDIA driver (or run the CPU backend); \
                       a build with `--features cuda` needs it only at run time",
            })
        }
    }

    /// cuBLAS (for [`super::Gemm`]'s f32 products), or a clear error.
    pub fn require_cublas(&self) -> Result<(), CudaError> {
        if self.cublas {
            Ok(())
        } else {
            Err(CudaError::MissingLibrary {
                lib: "cuBLAS (libcublas.so)",
                hint: "install the CUDA 12 toolkit libraries or \
                       `pip install nvidia-cublas-cu12` and add its lib folder to LD_LIBRARY_PATH",
            })
        }
    }

    /// cuBLASLt (for [`super::Gemm`]), or a clear error.
    pub fn require_cublaslt(&self) -> Result<(), CudaError> {
        if self.cublaslt {
            Ok(())
        } else {
            Err(CudaError::MissingLibrary {
                lib: "cuBLASLt (libcublasLt.so)",
                hint: "install the CUDA 12 toolkit libraries or \
                       `pip install nvidia-cublas-cu12` and add its lib folder to LD_LIBRARY_PATH",
            })
        }
    }
}

/// One GPU with its primary context and the stream every launcher uses.
#[derive(Debug, Clone)]
pub struct GpuDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    compute_capability: (i32, i32),
    name: String,
}

impl GpuDevice {
    /// Opens the device of a shard: rank r uses device r (after `CUDA_VISIBLE_DEVICES`). Two
    /// ranks on one device would each reserve the memory fraction, so that is an error.
    pub fn open(rank: usize) -> Result<Self, CudaError> {
        CudaLibs::probe().require_driver()?;
        let count = CudaContext::device_count()? as usize;
        if rank >= count {
            return Err(CudaError::NoDevice {
                ordinal: rank,
                count,
            });
        }
        let ctx = CudaContext::new(rank)?;
        let compute_capability = ctx.compute_capability()?;
        let name = ctx.name()?;
        let stream = ctx.default_stream();
        Ok(GpuDevice {
            ctx,
            stream,
            compute_capability,
            name,
        })
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream kernels are launched on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// `(major, minor)`, e.g. `(9, 0)` on an H100/H200.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// The device's marketing name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `(free, total)` bytes of device memory.
    pub fn memory(&self) -> Result<(usize, usize), CudaError> {
        Ok(self.ctx.mem_get_info()?)
    }
}
