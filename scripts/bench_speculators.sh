#!/usr/bin/env bash
# Served greedy decode on SmolLM2-135M-Instruct with each speculator, on held-out chat prompts
# (scripts/bench_draft_heads.py), at concurrency 1 and 8. Servers run one after another on
# loopback, every configuration once per round, so that rounds interleave:
#
#   cargo build --release --bins && scripts/bench_speculators.sh [ROUNDS] [CONFIG ...]
#
# CONFIG names one of the configurations below (default: all).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
gguf="${TESSERA_CACHE:-$HOME/.cache/tessera}/SmolLM2-135M-Instruct.Q4_1.gguf"
launcher="$root/target/release/tessera-launcher"
port=3927
rounds="${1:-2}"
shift || true

declare -A flags=(
  [none]="--speculate 0"
  [ngram]="--speculate 3 --speculator ngram"
  [medusa]="--speculate 3 --speculator medusa --draft-model-id $root/fixtures/smollm2/medusa --speculative-tree-width 4"
  [eagle-d2-w1]="--speculate 2 --speculator eagle --draft-model-id $root/fixtures/smollm2/eagle --speculative-tree-width 1"
  [eagle-w1]="--speculate 4 --speculator eagle --draft-model-id $root/fixtures/smollm2/eagle --speculative-tree-width 1"
  [eagle-w2]="--speculate 4 --speculator eagle --draft-model-id $root/fixtures/smollm2/eagle --speculative-tree-width 2"
  [eagle-w4]="--speculate 4 --speculator eagle --draft-model-id $root/fixtures/smollm2/eagle --speculative-tree-width 4"
)
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(none ngram medusa eagle-w1 eagle-w2 eagle-w4)

for round in $(seq "$rounds"); do
  for name in "${configs[@]}"; do
    # shellcheck disable=SC2086
    "$launcher" --model-id "$gguf" --hostname 127.0.0.1 --port "$port" ${flags[$name]} \
      >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 300); do
      curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
      sleep 1
    done
    python3 "$root/scripts/bench_draft_heads.py" "$port" 1 8 | sed "s/^/round $round $name: /"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
  done
done
