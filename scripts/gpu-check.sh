#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU (target: < 8 minutes on an H200, cold build).
#
# What it checks, in order, and prints one summary at the end:
#   1. the libraries: driver (libcuda), NVRTC (system, else the PyPI wheel it installs into
#      ~/.cache/tessera/nvrtc-venv), cuBLASLt; the GPU's name and compute capability;
#   2. `cargo build --release --features cuda -p tessera-kernels` builds;
#   3. every .cu compiles to PTX for sm_80 and sm_90 (kernels/tests/cuda_ptx.rs);
#   4. every CUDA kernel matches the CPU reference (kernels/tests/cuda_kernels.rs): norms,
#      SiLU·mul, embedding, RoPE + cache write, flash-attention prefill and paged decode (GQA,
#      windows, prefix chunks, split contexts), Q8_0/Q4_0 GEMV, sampling helpers, cuBLASLt GEMM;
#   5. the engine goldens on the GPU and a decode/prefill benchmark — only once the shard has
#      a CUDA backend (TESSERA_GPU_ENGINE_TESTS / TESSERA_GPU_BENCH name the commands); until
#      then they are reported as "not yet wired", not as passed.
# Release profile so the tests and a later benchmark share one build.
set -euo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
declare -a summary=()
status=0
step() { # step NAME COMMAND...: runs, records PASS/FAIL with seconds
    local name=$1; shift
    local t0; t0=$(date +%s)
    echo "=== $name: $*"
    if "$@"; then
        summary+=("PASS  $name ($(( $(date +%s) - t0 ))s)")
    else
        summary+=("FAIL  $name ($(( $(date +%s) - t0 ))s)")
        status=1
    fi
}

echo "=== GPU"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader
else
    echo "nvidia-smi not found: the kernel tests will report the missing driver"
fi

# NVRTC: use the system's when the loader finds it, else the pip wheel (also what CI uses).
if ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc.so'; then
    venv="$HOME/.cache/tessera/nvrtc-venv"
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12
fi
# cuBLASLt: a driver-only image has none; the wheel is a fallback.
if ! ldconfig -p 2>/dev/null | grep -q 'libcublasLt.so'; then
    venv="$HOME/.cache/tessera/nvrtc-venv"
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check nvidia-cublas-cu12
    cublas_lib=$(echo "$venv"/lib/python3*/site-packages/nvidia/cublas/lib)
    export LD_LIBRARY_PATH="$cublas_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

step "build (--features cuda)" cargo build --release --locked --features cuda -p tessera-kernels
step "PTX for sm_80/sm_90" cargo test --release --locked --features cuda -p tessera-kernels \
    --test cuda_ptx -- --nocapture
# The kernel tests print "SKIPPED" when no GPU is usable; on this machine that is a failure.
kernel_log=$(mktemp)
step "kernels vs CPU" bash -c "cargo test --release --locked --features cuda -p tessera-kernels \
    --test cuda_kernels -- --nocapture --test-threads=1 2>&1 | tee '$kernel_log'; \
    test \${PIPESTATUS[0]} -eq 0 && ! grep -q SKIPPED '$kernel_log'"

if [ -n "${TESSERA_GPU_ENGINE_TESTS:-}" ]; then
    step "engine goldens on GPU" bash -c "$TESSERA_GPU_ENGINE_TESTS"
else
    summary+=("----  engine goldens on GPU: not yet wired (no CUDA backend in the shard)")
fi
if [ -n "${TESSERA_GPU_BENCH:-}" ]; then
    step "decode/prefill benchmark" bash -c "$TESSERA_GPU_BENCH"
else
    summary+=("----  decode/prefill benchmark: not yet wired (no CUDA backend in the shard)")
fi

echo
echo "=== gpu-check summary ($(( $(date +%s) - start ))s)"
printf '%s\n' "${summary[@]}"
exit $status
