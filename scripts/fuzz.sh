#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ (cargo-fuzz + libFuzzer) for a bounded time each, on the
# stable toolchain: cargo-fuzz needs a few -Z flags, which RUSTC_BOOTSTRAP=1 unlocks.
#
#   scripts/fuzz.sh                 # every target, 60 s each
#   scripts/fuzz.sh 600             # every target, 10 min each
#   scripts/fuzz.sh 3600 gguf       # one target, one hour
#   FUZZ_JOBS=4 scripts/fuzz.sh 600 # 4 parallel libFuzzer jobs per target
#   FUZZ_SANITIZER=address scripts/fuzz.sh   # with AddressSanitizer (slower; default none)
#
# Each target starts from its committed corpus in fuzz/corpus/<target>/, which it only
# reads: new finds go to fuzz/target/corpus/<target>/ (FUZZ_GROW_CORPUS=1 writes them to
# fuzz/corpus/ instead; then `cargo fuzz cmin` before committing). It first replays
# fuzz/regressions/<target>/ (inputs of crashes fixed since). A crash stops the script with
# a non-zero status and leaves its input in fuzz/artifacts/<target>/; reproduce it with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run -s none <target> fuzz/artifacts/<target>/<file>
# and add the input to fuzz/regressions/<target>/ with the fix.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET="${1:-60}"
shift || true
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
    TARGETS=(gguf safetensors_config http_bodies chat_template tokenizer_roundtrip detokenizer)
fi
SANITIZER="${FUZZ_SANITIZER:-none}"
JOBS=()
if [ "${FUZZ_JOBS:-1}" -gt 1 ]; then
    # Parallel jobs log to fuzz-<n>.log in the current folder.
    JOBS=(-jobs="$FUZZ_JOBS" -workers="$FUZZ_JOBS")
fi

export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz from crates.io" >&2
    cargo install cargo-fuzz --locked --version '^0.13'
fi

# One build for all targets (release with debug assertions, cargo-fuzz's default).
cargo fuzz build -s "$SANITIZER" -O

for target in "${TARGETS[@]}"; do
    corpus="fuzz/corpus/$target"
    scratch="fuzz/target/corpus/$target"
    mkdir -p "$corpus" "$scratch"
    dirs=("$scratch" "$corpus")
    if [ "${FUZZ_GROW_CORPUS:-0}" = 1 ]; then
        dirs=("$corpus")
    fi
    if [ -d "fuzz/regressions/$target" ] && [ -n "$(ls -A "fuzz/regressions/$target")" ]; then
        echo "== $target: replaying fuzz/regressions/$target" >&2
        cargo fuzz run -s "$SANITIZER" -O "$target" "fuzz/regressions/$target" -- -runs=0
    fi
    echo "== $target: fuzzing for ${SECONDS_PER_TARGET}s" >&2
    # -max_len 65536: bodies and model files larger than libFuzzer's 4 KiB default;
    # -rss_limit_mb: a target allocating without bound is a crash.
    cargo fuzz run -s "$SANITIZER" -O "$target" "${dirs[@]}" -- \
        -max_total_time="$SECONDS_PER_TARGET" -max_len=65536 -rss_limit_mb=2048 \
        -timeout=20 -print_final_stats=1 "${JOBS[@]}"
done
echo "fuzz: ${#TARGETS[@]} targets, ${SECONDS_PER_TARGET}s each, no crash" >&2
