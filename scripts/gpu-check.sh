#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU (target: < 8 minutes on an H200, cold build).
#
# What it checks, in order, and prints one summary at the end:
#   1. the libraries: driver (libcuda), NVRTC (system, else the PyPI wheel it installs into
#      ~/.cache/tessera/nvrtc-venv), cuBLASLt; the GPU's name and compute capability;
#   2. `cargo build --release --features cuda -p tessera-kernels` builds;
#   3. every .cu compiles to PTX for sm_80 and sm_90 (kernels/tests/cuda_ptx.rs);
#   4. every CUDA kernel matches the CPU reference (kernels/tests/cuda_kernels.rs): norms,
#      SiLU·mul, embedding, RoPE + cache write, flash-attention prefill (CUDA-core and
#      tensor-core kernels) and paged decode (GQA,
#      windows, prefix chunks, split contexts), Q8_0/Q4_0/Q4_1 GEMV and dequantization, sampling
#      helpers, cuBLASLt (bf16) and cuBLAS (f32) GEMM;
#   5. the engine on the GPU (shard/tests/shard/cuda_engine.rs): the fixtures' transformers
#      goldens in f32 and bf16, and results independent of batching and chunking;
#   6. the server on the GPU: tessera-launcher serves fixtures/tiny-llama in f32 with its shard on
#      the GPU (Warmup sizing the KV cache by --memory-fraction, CUDA graphs), /info reports
#      cuda, and /generate's greedy tokens are transformers' (fixtures' golden.json);
#   7. benchmarks: the attention kernels against the bf16 peak (kernels/benches/cuda_attention.rs;
#      both prefill kernels, to decide whether TESSERA_TC_ATTENTION=1 should become the default)
#      and the engine's prefill/decode tokens/s (shard/benches/gpu.rs).
# Every step sets TESSERA_REQUIRE_GPU=1: a test that finds no GPU fails instead of skipping.
# Release profile so the tests and the benchmarks share one build.
#
# A GPU machine without Rust or network (this project's lent H200s): build the executables
# here with scripts/gpu-pack.sh, carry .gpu, and run there
#     TESSERA_GPU_PREBUILT=.gpu/bin scripts/gpu-check.sh
# which runs them instead of cargo, and finds CUDA 13's pip libraries (libnvrtc.so.13…) under
# the names cudarc loads.
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

# Without network (prebuilt mode) nothing can be installed: the libraries are looked up below.
if [ -z "${TESSERA_GPU_PREBUILT:-}" ]; then
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
fi

export TESSERA_REQUIRE_GPU=1 TESSERA_REPO_ROOT="$PWD"
prebuilt=${TESSERA_GPU_PREBUILT:-}
# How each check runs: an executable of gpu-pack.sh, or cargo.
run_test() { # run_test CRATE TEST ARGS... (a test target, then its filter and options)
    local crate=$1 test=$2; shift 2
    if [ -n "$prebuilt" ]; then "$prebuilt/$test" "$@"
    else cargo test --release --locked --features cuda -p "$crate" --test "$test" -- "$@"; fi
}
run_bench() { # run_bench CRATE BENCH
    if [ -n "$prebuilt" ]; then "$prebuilt/$2" --bench
    else cargo bench --locked --features cuda -p "$1" --bench "$2"; fi
}

if [ -n "$prebuilt" ]; then
    echo "=== prebuilt executables of $(cat "$prebuilt/COMMIT" 2>/dev/null || echo '?')"
    # cudarc dlopens unversioned or CUDA 12 names; CUDA 13's wheels ship libX.so.13.
    links=$(mktemp -d)
    for lib in nvrtc cublas cublasLt nccl; do
        found=$(python3 - "$lib" <<'PY'
import glob, os, site, sys
name = sys.argv[1]
roots = site.getsitepackages() + [site.getusersitepackages(), "/usr/local/cuda/lib64", "/usr/lib/x86_64-linux-gnu"]
for root in roots:
    for path in sorted(glob.glob(os.path.join(root, "**", f"lib{name}.so*"), recursive=True)):
        if "builtins" not in path and not path.endswith(".alt"):
            print(path)
            sys.exit(0)
PY
        ) || true
        if [ -n "$found" ]; then
            ln -sf "$found" "$links/lib$lib.so"
            export LD_LIBRARY_PATH="$(dirname "$found"):${LD_LIBRARY_PATH:-}"
            echo "lib$lib.so -> $found"
        fi
    done
    export LD_LIBRARY_PATH="$links:${LD_LIBRARY_PATH:-}"
else
    step "build (--features cuda)" cargo build --release --locked --features cuda \
        -p tessera-kernels -p tessera-shard
fi
step "PTX for sm_80/sm_90" run_test tessera-kernels cuda_ptx --nocapture
# The kernel tests print "SKIPPED" when no GPU is usable; on this machine that is a failure.
kernel_log=$(mktemp)
step "kernels vs CPU" bash -c "$(declare -f run_test); prebuilt='$prebuilt'; \
    run_test tessera-kernels cuda_kernels --nocapture --test-threads=1 2>&1 | tee '$kernel_log'; \
    test \${PIPESTATUS[0]} -eq 0 && ! grep -q SKIPPED '$kernel_log'"
step "engine goldens on GPU" run_test tessera-shard shard cuda_engine:: --nocapture --test-threads=1
# The server end to end, from the launcher down to the shard on the GPU.
serve_check() { # serve_check BIN_DIR
    local bin=$1 port=18080 log rc
    log=$(mktemp)
    TESSERA_DEVICE=cuda "$bin/tessera-launcher" --model-id fixtures/tiny-llama --port $port \
        --dtype float32 --shard-uds-path /tmp/tessera-gpu-check >"$log" 2>&1 &
    local pid=$!
    for _ in $(seq 120); do
        python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health')" \
            2>/dev/null && break
        sleep 1
    done
    python3 - "$port" <<'PY'
import json, sys, urllib.request
port = sys.argv[1]
url = f"http://127.0.0.1:{port}"
info = json.load(urllib.request.urlopen(f"{url}/info"))
assert info["model_device_type"] == "cuda", f"/info: {info}"
for p in json.load(open("fixtures/tiny-llama/golden.json"))["prompts"]:
    params = {"max_new_tokens": len(p["greedy_ids"]), "details": True, "ignore_eos": True}
    body = json.dumps({"inputs": p["text"], "parameters": params}).encode()
    req = urllib.request.Request(f"{url}/generate", body, {"Content-Type": "application/json"})
    ids = [t["id"] for t in json.load(urllib.request.urlopen(req))["details"]["tokens"]]
    assert ids == p["greedy_ids"], f"{p['text']!r}: served {ids}, transformers {p['greedy_ids']}"
print("served on the GPU: /info says cuda; every golden prompt's greedy tokens are transformers'")
PY
    rc=$?
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    [ $rc -eq 0 ] || tail -40 "$log"
    return $rc
}
if [ -n "$prebuilt" ]; then
    step "server on GPU" serve_check "$prebuilt"
else
    step "server on GPU" bash -c "cargo build --release --locked --bins \
        --features tessera-shard/cuda && $(declare -f serve_check); serve_check target/release"
fi
step "attention kernels benchmark" run_bench tessera-kernels cuda_attention
step "engine prefill/decode benchmark" run_bench tessera-shard gpu

echo
echo "=== gpu-check summary ($(( $(date +%s) - start ))s)"
printf '%s\n' "${summary[@]}"
exit $status
