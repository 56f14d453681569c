#!/usr/bin/env bash
# Builds the real-size CPU bench models: random-weight Llama GGUFs of TinyLlama-1.1B's and a 3B
# shape (SmolLM2's tokenizer), quantized by llama.cpp's llama-quantize, and the anchor binaries
# they are measured against. Everything lands outside the repository; never commit it.
#
#   scripts/make_bench_models.sh [SHAPE:TYPE ...]
#     default: tinyllama-1.1b:Q4_K_M tinyllama-1.1b:Q8_0 tinyllama-1.1b:Q4_0 llama-3b:Q4_K_M
#     also: gpt-oss-20b:MXFP4 (written directly as ggml-org's file is laid out, about 12 GB:
#     scripts/make_gpt_oss_bench.py)
#   prints one line per model: its path
#
# Needs python3 with venv, a C++ compiler, the anchors folder of the shared tools
# (TESSERA_ANCHOR_TOOLS, default ../shared/anchors beside the repository) and about 25 minutes
# and 12 GB of disk the first time (the F16 sources are deleted once quantized). Models:
# ${TESSERA_ANCHORS:-~/.cache/tessera-anchors}/models/SHAPE-TYPE.gguf; a model already there
# is kept.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TOOLS=${TESSERA_ANCHOR_TOOLS:-$ROOT/../shared/anchors}
CACHE=${TESSERA_ANCHORS:-$HOME/.cache/tessera-anchors}
MODELS=$CACHE/models
die() { echo "make_bench_models: error: $*" >&2; exit 1; }
[[ -f $TOOLS/make-bench-gguf.py && -f $TOOLS/build-llama-cpp.sh ]] ||
  die "no make-bench-gguf.py and build-llama-cpp.sh in $TOOLS (set TESSERA_ANCHOR_TOOLS)"

WANTED=("$@")
[[ ${#WANTED[@]} -gt 0 ]] ||
  WANTED=(tinyllama-1.1b:Q4_K_M tinyllama-1.1b:Q8_0 tinyllama-1.1b:Q4_0 llama-3b:Q4_K_M)

BUILD=$(TESSERA_ANCHORS=$CACHE bash "$TOOLS/build-llama-cpp.sh" | tail -n1)
QUANTIZE=$BUILD/bin/llama-quantize
SOURCE=$("$ROOT/scripts/fetch_smollm2.sh" | tail -n1)
VENV=$CACHE/gguf-venv
[[ -x $VENV/bin/python ]] || python3 -m venv "$VENV"
"$VENV/bin/python" -c "import gguf, numpy" 2>/dev/null || "$VENV/bin/pip" install -q numpy gguf >&2
mkdir -p "$MODELS"

for want in "${WANTED[@]}"; do
  shape=${want%%:*} type=${want#*:}
  out=$MODELS/$shape-$type.gguf
  if [[ $want == gpt-oss-20b:MXFP4 && ! -s $out ]]; then
    "$VENV/bin/python" "$ROOT/scripts/make_gpt_oss_bench.py" "$SOURCE" "$out.part" >&2
    mv "$out.part" "$out"
  elif [[ ! -s $out ]]; then
    f16=$MODELS/$shape-F16.gguf
    [[ -s $f16 ]] || "$VENV/bin/python" "$TOOLS/make-bench-gguf.py" "$SOURCE" "$f16.part" --shape "$shape" >&2
    [[ -s $f16 ]] || mv "$f16.part" "$f16"
    "$QUANTIZE" "$f16" "$out.part" "$type" "$(nproc)" >&2
    mv "$out.part" "$out"
  fi
  echo "$out"
done
# The F16 sources are only inputs: drop those no wanted model still needs.
for want in "${WANTED[@]}"; do rm -f "$MODELS/${want%%:*}-F16.gguf"; done
