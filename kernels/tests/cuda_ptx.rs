//! Every `.cu` file compiles to PTX for sm_80 (A100) and sm_90 (H100/H200) through NVRTC.
//!
//! Needs no GPU. When the system has no libnvrtc, the test installs the PyPI wheels
//! `nvidia-cuda-nvrtc-cu12` and `nvidia-cuda-runtime-cu12` into `~/.cache/tessera/nvrtc-venv`
//! (once; later runs reuse it) and loads NVRTC from there. It skips, printing why, only when that
//! install is impossible (no python3 / no network).
#![cfg(feature = "cuda")]

use std::path::PathBuf;
use std::process::Command;

use tessera_kernels::cuda::{SOURCES, compile_ptx, nvrtc_version, preload_nvrtc};

/// The venv the kernels' `preload_nvrtc` looks in.
fn venv() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tessera/nvrtc-venv"))
}

fn install_nvrtc_wheel() -> Result<(), String> {
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
        .args(["nvidia-cuda-nvrtc-cu12", "nvidia-cuda-runtime-cu12"])
        .status()
        .map_err(|e| format!("pip: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err("pip install nvidia-cuda-nvrtc-cu12 failed".into())
    }
}

/// The kernels each source must define (before the dtype suffix); `GpuKernels` launches these.
fn entry_points(file: &str) -> Vec<String> {
    let names: &[&str] = match file {
        "norm.cu" => &["rms_norm", "add_rms_norm"],
        "activation.cu" => &["silu_mul", "add_bias"],
        "embedding.cu" => &["embedding"],
        "rope_cache.cu" => &["rope_and_cache"],
        "paged_attention.cu" => &["paged_attention_decode", "paged_attention_reduce"],
        "flash_attention.cu" => &[],
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
    for arch in ["sm_80", "sm_90"] {
        for source in SOURCES {
            let start = std::time::Instant::now();
            let ptx = compile_ptx(source, arch).unwrap_or_else(|e| panic!("{e}"));
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
            println!(
                "{arch} {:<22} {:>7} bytes of PTX in {:?}",
                source.name,
                ptx.len(),
                start.elapsed()
            );
        }
    }
}
