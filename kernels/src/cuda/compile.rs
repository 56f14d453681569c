//! NVRTC compilation of the embedded `.cu` sources, with an on-disk PTX cache.
//!
//! The sources are compiled into the binary (`include_str!`), so a deployed shard needs only
//! the driver and libnvrtc. `common.cuh` is inlined in place of its `#include` line, so NVRTC
//! needs no include path and no CUDA headers at all (see the comment at the top of the header).
//! PTX is cached under `~/.cache/tessera/ptx` keyed by a hash of the expanded source, the
//! options, the target architecture and the NVRTC version: a second start loads in milliseconds.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::CudaError;

/// One `.cu` file of `kernels/cuda/`.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// File name, e.g. `norm.cu`; also the module name.
    pub name: &'static str,
    /// The file's text as written (before `common.cuh` is inlined).
    pub source: &'static str,
}

macro_rules! source {
    ($file:literal) => {
        KernelSource {
            name: $file,
            source: include_str!(concat!("../../cuda/", $file)),
        }
    };
}

/// Every kernel source, one concern per file.
pub const SOURCES: &[KernelSource] = &[
    source!("norm.cu"),
    source!("activation.cu"),
    source!("embedding.cu"),
    source!("rope_cache.cu"),
    source!("paged_attention.cu"),
    source!("flash_attention.cu"),
    source!("flash_attention_mma.cu"),
    source!("gemv_quant.cu"),
    source!("sampling.cu"),
];

const COMMON: &str = include_str!("../../cuda/common.cuh");

/// Options for every source: C++17, precise math (the tests compare with the CPU at 1e-5).
const OPTIONS: &[&str] = &["--std=c++17"];

/// `source` with `#include "common.cuh"` replaced by the header's text.
pub fn expand_source(source: &str) -> String {
    let common = COMMON.replace("#pragma once", "");
    source
        .lines()
        .map(|line| {
            if line.trim() == "#include \"common.cuh\"" {
                common.as_str()
            } else {
                line
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// NVRTC's target for a compute capability: `(9, 0)` → `sm_90`.
pub fn arch_for(compute_capability: (i32, i32)) -> String {
    format!("sm_{}{}", compute_capability.0, compute_capability.1)
}

/// Where a pip-installed NVRTC may live when the system has none: `$TESSERA_NVRTC_LIB_DIR`, then
/// the venv that the PTX test and `scripts/gpu-check.sh` create.
fn nvrtc_candidate_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = std::env::var_os("TESSERA_NVRTC_LIB_DIR") {
        dirs.push(PathBuf::from(dir));
    }
    if let Some(home) = std::env::var_os("HOME") {
        let lib = Path::new(&home).join(".cache/tessera/nvrtc-venv/lib");
        if let Ok(entries) = std::fs::read_dir(&lib) {
            for entry in entries.flatten() {
                dirs.push(entry.path().join("site-packages/nvidia/cuda_nvrtc/lib"));
            }
        }
    }
    dirs
}

/// Makes libnvrtc loadable. If the loader cannot find it by name, loads it by full path from a
/// [candidate folder](nvrtc_candidate_dirs) and keeps it loaded: cudarc's later `dlopen` of
/// `libnvrtc.so.12` then resolves to the already-loaded library by its soname (and NVRTC finds
/// its `libnvrtc-builtins` beside it through its `$ORIGIN` runpath).
pub fn preload_nvrtc() -> Result<(), CudaError> {
    // Only a library that loaded is kept: a miss is looked for again on the next call, since
    // the caller may install NVRTC in between (the PTX test does, in the same process).
    static PRELOADED: OnceLock<libloading::Library> = OnceLock::new();
    // SAFETY: only dlopens candidate names (see `CudaLibs::probe`).
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Ok(());
    }
    if PRELOADED.get().is_none() {
        let found = nvrtc_candidate_dirs().into_iter().find_map(|dir| {
            let path = dir.join("libnvrtc.so.12");
            // SAFETY: libnvrtc's initialisers are the loader's; nothing is called yet.
            path.exists()
                .then(|| unsafe { libloading::Library::new(&path) }.ok())
                .flatten()
        });
        if let Some(lib) = found {
            let _ = PRELOADED.set(lib);
        }
    }
    // SAFETY: as above.
    if PRELOADED.get().is_some() && unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::MissingLibrary {
            lib: "NVRTC (libnvrtc.so.12)",
            hint: "install the CUDA 12 toolkit, or `pip install nvidia-cuda-nvrtc-cu12` into \
                   ~/.cache/tessera/nvrtc-venv or set TESSERA_NVRTC_LIB_DIR to its lib folder",
        })
    }
}

/// `(major, minor)` of the loaded NVRTC.
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    preload_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loadable (checked above); the call writes two ints.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| CudaError::Compile {
            file: "-",
            arch: String::new(),
            log: format!("nvrtcVersion: {e:?}"),
        })?;
    Ok((major, minor))
}

/// Compiles one source to PTX for `arch` (e.g. `sm_90`).
pub fn compile_ptx(source: &KernelSource, arch: &str) -> Result<String, CudaError> {
    preload_nvrtc()?;
    let mut options: Vec<String> = OPTIONS.iter().map(|o| o.to_string()).collect();
    options.push(format!("--gpu-architecture={arch}"));
    let opts = cudarc::nvrtc::CompileOptions {
        options,
        name: Some(source.name.to_string()),
        ..Default::default()
    };
    let ptx =
        cudarc::nvrtc::compile_ptx_with_opts(expand_source(source.source), opts).map_err(|e| {
            CudaError::Compile {
                file: source.name,
                arch: arch.to_string(),
                log: match e {
                    cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                        log.to_string_lossy().into_owned()
                    }
                    other => format!("{other:?}"),
                },
            }
        })?;
    Ok(ptx.to_src())
}

/// 64-bit FNV-1a, enough to tell a handful of sources apart.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff; // separator, so that ("ab", "c") ≠ ("a", "bc")
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// PTX files on disk, one per (source, arch, compiler, options) combination.
#[derive(Debug, Clone)]
pub struct PtxCache {
    dir: Option<PathBuf>,
}

impl PtxCache {
    /// `$TESSERA_PTX_CACHE`, else `~/.cache/tessera/ptx`; no caching without either.
    pub fn default_location() -> Self {
        let dir = std::env::var_os("TESSERA_PTX_CACHE")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/tessera/ptx")));
        PtxCache { dir }
    }

    /// A cache in `dir`.
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        PtxCache {
            dir: Some(dir.into()),
        }
    }

    /// Compiles every time.
    pub fn disabled() -> Self {
        PtxCache { dir: None }
    }

    /// The file a source would be cached in.
    fn path_for(&self, source: &KernelSource, arch: &str) -> Result<Option<PathBuf>, CudaError> {
        let Some(dir) = &self.dir else {
            return Ok(None);
        };
        let (major, minor) = nvrtc_version()?;
        let version = format!("{major}.{minor}");
        let expanded = expand_source(source.source);
        let key = fnv1a(&[
            expanded.as_bytes(),
            arch.as_bytes(),
            version.as_bytes(),
            OPTIONS.join(" ").as_bytes(),
        ]);
        let stem = source.name.trim_end_matches(".cu");
        Ok(Some(dir.join(format!("{stem}-{arch}-{key:016x}.ptx"))))
    }

    /// The PTX of `source` for `arch`, from the cache or freshly compiled (and then stored).
    pub fn get_or_compile(&self, source: &KernelSource, arch: &str) -> Result<String, CudaError> {
        let path = self.path_for(source, arch)?;
        if let Some(path) = &path
            && let Ok(ptx) = std::fs::read_to_string(path)
        {
            return Ok(ptx);
        }
        let ptx = compile_ptx(source, arch)?;
        if let Some(path) = &path {
            store(path, &ptx)?;
        }
        Ok(ptx)
    }
}

/// Writes through a temporary file and a rename, so that concurrent shards starting on one
/// machine never read a half-written PTX file.
fn store(path: &Path, ptx: &str) -> Result<(), CudaError> {
    let err = |source| CudaError::Cache {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, ptx).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_header_is_inlined_once_per_source() {
        for s in SOURCES {
            let e = expand_source(s.source);
            assert!(
                !e.lines().any(|l| l.trim_start().starts_with("#include")),
                "{} still includes a header",
                s.name
            );
            assert_eq!(e.matches("block_sum(float v").count(), 1, "{}", s.name);
        }
    }

    #[test]
    fn arch_names() {
        assert_eq!(arch_for((9, 0)), "sm_90");
        assert_eq!(arch_for((8, 6)), "sm_86");
    }

    #[test]
    fn hash_separates_parts() {
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
    }
}
