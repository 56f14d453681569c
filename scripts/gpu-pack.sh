#!/usr/bin/env bash
# Builds the GPU checks' executables here, for a GPU machine that has no Rust toolchain or
# network (this project's lent H200s): the CUDA tests and benchmarks of kernels/ and shard/, and
# the three server binaries built with `--features tessera-shard/cuda`, release profile,
# stripped into .gpu/bin (git-ignored; about 45 MB). Then, on the GPU machine, from a checkout
# of the same commit:
#
#     TESSERA_GPU_PREBUILT=.gpu/bin scripts/gpu-check.sh
#
# The executables are x86-64 Linux, linked against this machine's glibc (2.36; newer ones
# run them); the CUDA libraries are loaded at run time there.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu/bin
rm -rf "$out" && mkdir -p "$out"

# name=path pairs from cargo's JSON messages: one executable per test or bench target.
build() {
    cargo "$@" --locked --features cuda --no-run --message-format=json \
        | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    kinds = m.get("target", {}).get("kind", [])
    if m.get("reason") == "compiler-artifact" and m.get("executable") and ("test" in kinds or "bench" in kinds):
        print(m["target"]["name"] + "=" + m["executable"])
'
}
{
    build test --release -p tessera-kernels --test cuda_ptx --test cuda_kernels
    build test --release -p tessera-shard --test shard
    build bench -p tessera-kernels --bench cuda_attention
    build bench -p tessera-shard --bench gpu
} | while IFS='=' read -r name path; do
    # Without debug info: a tenth of the size, so that .gpu travels.
    strip --strip-debug -o "$out/$name" "$path"
    echo "packed $out/$name ($(du -h "$out/$name" | cut -f1))"
done
cargo build --release --locked --bins --features tessera-shard/cuda
for bin in tessera-launcher tessera-router tessera-shard; do
    strip --strip-debug -o "$out/$bin" "target/release/$bin"
    echo "packed $out/$bin ($(du -h "$out/$bin" | cut -f1))"
done
git rev-parse HEAD > "$out/COMMIT"
