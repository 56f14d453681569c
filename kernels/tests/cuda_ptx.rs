//! Every `.cu` file compiles to PTX for sm_80 (A100) and sm_90 (H100/H200) through NVRTC, and
//! the PTX assembles for those GPUs with `ptxas` (which checks inline PTX such as the
//! tensor-core `mma` instructions, which NVRTC passes through unread).
//!
//! Needs no GPU. When the system has no libnvrtc, the test installs the PyPI wheels
//! `nvidia-cuda-nvrtc-cu12` and `nvidia-cuda-runtime-cu12` into `~/.cache/tessera/nvrtc-venv`
//! (once; later runs reuse it) and loads NVRTC from there; `ptxas` comes from the system or the
//! wheel `nvidia-cuda-nvcc-cu12`, installed the same way. It skips, printing why, only when
//! those installs are impossible (no python3 / no network).
#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tessera_kernels::cuda::{KernelSource, SOURCES, compile_ptx, nvrtc_version, preload_nvrtc};

/// The venv the kernels' `preload_nvrtc` looks in.
fn venv() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tessera/nvrtc-venv"))
}

/// `ptxas` from the PATH, else from the venv (installing `nvidia-cuda-nvcc-cu12` there once).
fn ptxas() -> Result<PathBuf, String> {
    if Command::new("ptxas").arg("--version").output().is_ok() {
        return Ok(PathBuf::from("ptxas"));
    }
    let find = || -> Option<PathBuf> {
        let lib = venv()?.join("lib");
        std::fs::read_dir(lib).ok()?.flatten().find_map(|e| {
            let p = e.path().join("site-packages/nvidia/cuda_nvcc/bin/ptxas");
            p.exists().then_some(p)
        })
    };
    if let Some(p) = find() {
        return Ok(p);
    }
    pip_install(&["nvidia-cuda-nvcc-cu12"])?;
    find().ok_or_else(|| "nvidia-cuda-nvcc-cu12 installed no ptxas".into())
}

/// Assembles `ptx` for `arch` with `ptxas`, or says what it rejected.
fn assemble(ptxas: &Path, ptx: &str, arch: &str, name: &str) -> Result<(), String> {
    // A folder per job: jobs run side by side and each removes its own.
    let dir = std::env::temp_dir().join(format!(
        "tessera-ptxas-{}-{name}-{arch}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let file = dir.join(format!("{name}.{arch}.ptx"));
    std::fs::write(&file, ptx).map_err(|e| e.to_string())?;
    let out = Command::new(ptxas)
        .args(["--gpu-name", arch, "-o"])
        .arg(dir.join(format!("{name}.{arch}.cubin")))
        .arg(&file)
        .output()
        .map_err(|e| format!("running {}: {e}", ptxas.display()))?;
    let _ = std::fs::remove_dir_all(&dir);
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// What compiling one source for one arch (and assembling it, with a `ptxas`) gave.
struct Compiled {
    arch: &'static str,
    source: &'static KernelSource,
    ptx: Result<String, String>,
    assembled: Option<Result<(), String>>,
    took: Duration,
}

/// Every `(arch, source)` job compiled, and assembled with `ptxas`, on as many threads as the
/// machine has; returned in `jobs`' order. Each job is one single-threaded NVRTC program
/// (NVRTC allows separate programs on separate threads) and one `ptxas` run, so the jobs go
/// side by side.
fn compile_all(
    jobs: &[(&'static str, &'static KernelSource)],
    ptxas: Option<&Path>,
) -> Vec<Compiled> {
    let next = AtomicUsize::new(0);
    let work = || {
        let mut mine = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&(arch, source)) = jobs.get(i) else {
                return mine;
            };
            let start = Instant::now();
            let ptx = compile_ptx(source, arch).map_err(|e| e.to_string());
            let assembled = match (&ptx, ptxas) {
                (Ok(ptx), Some(ptxas)) => Some(assemble(ptxas, ptx, arch, source.name)),
                _ => None,
            };
            let took = start.elapsed();
            mine.push((
                i,
                Compiled {
                    arch,
                    source,
                    ptx,
                    assembled,
                    took,
                },
            ));
        }
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut done: Vec<(usize, Compiled)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.min(jobs.len()))
            .map(|_| scope.spawn(work))
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a compile thread panicked"))
            .collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, c)| c).collect()
}

fn pip_install(packages: &[&str]) -> Result<(), String> {
    let venv = venv().ok_or("HOME is not set")?;
    let python = venv.join("bin/python");
    if !python.exists() {
        let status = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .map_err(|e| format!("python3 -m venv: {e}"))?;
        if !status.success() {
            return Err(format!("python3 -m venv {} failed", venv.display()));
        }
    }
    let status = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(packages)
        .status()
        .map_err(|e| format!("pip: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("pip install {} failed", packages.join(" ")))
    }
}

fn install_nvrtc_wheel() -> Result<(), String> {
    pip_install(&["nvidia-cuda-nvrtc-cu12", "nvidia-cuda-runtime-cu12"])
}

/// The kernels each source must define (before the dtype suffix); `GpuKernels` launches these.
fn entry_points(file: &str) -> Vec<String> {
    let names: &[&str] = match file {
        "norm.cu" => &["rms_norm", "add_rms_norm"],
        "activation.cu" => &["silu_mul", "add_bias"],
        "embedding.cu" => &["embedding"],
        "rope_cache.cu" => &["rope_and_cache"],
        "paged_attention.cu" => &["paged_attention_decode", "paged_attention_reduce"],
        "flash_attention.cu" | "flash_attention_mma.cu" => &[],
        "gemv_quant.cu" => &[
            "gemv_q8_0",
            "gemv_q4_0",
            "gemv_q4_1",
            "dequant_q8_0",
            "dequant_q4_0",
            "dequant_q4_1",
        ],
        "sampling.cu" => &["argmax", "log_softmax", "topk"],
        other => panic!("{other} has no entry list in this test"),
    };
    let mut names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    if file == "flash_attention.cu" {
        // `_<dtype>_hd<d>`: checked below through the suffix order.
        names.clear();
    }
    names
}

fn check_prefill_entries(ptx: &str) {
    for dtype in ["f32", "f16", "bf16"] {
        for hd in tessera_kernels::cuda::PREFILL_HEAD_DIMS {
            let name = format!(".entry flash_attention_prefill_{dtype}_hd{hd}");
            assert!(
                ptx.contains(&name),
                "{name} missing from flash_attention.cu"
            );
        }
    }
}

#[test]
fn every_kernel_compiles_to_ptx_for_sm80_and_sm90() {
    if preload_nvrtc().is_err() {
        if let Err(why) = install_nvrtc_wheel() {
            println!(
                "SKIPPED: no libnvrtc on this machine and the PyPI wheel cannot be installed: {why}"
            );
            return;
        }
        preload_nvrtc().expect("NVRTC from the freshly installed wheel loads");
    }
    let (major, minor) = nvrtc_version().unwrap();
    println!("NVRTC {major}.{minor}");
    let ptxas = ptxas()
        .map_err(|why| println!("SKIPPED assembling with ptxas: {why}"))
        .ok();
    // Both archs of a source next to each other: the longest compiles then start together.
    let jobs: Vec<(&'static str, &'static KernelSource)> = SOURCES
        .iter()
        .flat_map(|source| ["sm_80", "sm_90"].map(|arch| (arch, source)))
        .collect();
    for c in compile_all(&jobs, ptxas.as_deref()) {
        let (arch, source) = (c.arch, c.source);
        let ptx = c.ptx.unwrap_or_else(|e| panic!("{e}"));
        assert!(
            ptx.contains(&format!(".target {arch}")),
            "{} for {arch}",
            source.name
        );
        // Each C entry point of the source is in the PTX, for every storage type.
        for stem in entry_points(source.name) {
            for dtype in ["f32", "f16", "bf16"] {
                let name = format!(".entry {stem}_{dtype}");
                assert!(ptx.contains(&name), "{name} missing from {}", source.name);
            }
        }
        if source.name == "flash_attention.cu" {
            check_prefill_entries(&ptx);
        }
        if source.name == "flash_attention_mma.cu" {
            for dtype in ["f16", "bf16"] {
                for hd in tessera_kernels::cuda::TC_PREFILL_HEAD_DIMS {
                    let name = format!(".entry flash_attention_prefill_mma_{dtype}_hd{hd}");
                    assert!(ptx.contains(&name), "{name} missing from {}", source.name);
                }
            }
        }
        if let Some(assembled) = c.assembled {
            assembled
                .unwrap_or_else(|log| panic!("ptxas rejects {} for {arch}:\n{log}", source.name));
        }
        println!(
            "{arch} {:<22} {:>7} bytes of PTX, compiled{} in {:?}",
            source.name,
            ptx.len(),
            if ptxas.is_some() {
                " and assembled"
            } else {
                ""
            },
            c.took
        );
    }
}
