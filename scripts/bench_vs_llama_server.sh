#!/usr/bin/env bash
# Served speed of Tessera against llama.cpp's llama-server on the same GGUF, side by side: the
# two servers take turns (ROUNDS times), each measured by the same client (tessera-bench) with
# streamed greedy completions of INPUT_LEN-token prompts and exactly OUTPUT_LEN tokens, one
# stream at a time and CONCURRENCY at once. Both use THREADS compute threads, on 127.0.0.1.
#
#   scripts/bench_vs_llama_server.sh MODEL.gguf BIN_DIR
#     BIN_DIR: Tessera's release binaries (tessera-launcher, -router, -shard, tessera-bench)
#   env: LLAMA_BIN (folder of llama-server; default: build it with the shared anchor script),
#        ROUNDS (2), THREADS (2), INPUT_LEN (128), OUTPUT_LEN (65), CONCURRENCY (8),
#        REQUESTS_ONE (6), REQUESTS_MANY (16), PORT (39317), OUT_DIR (kept JSON and logs)
set -euo pipefail
[[ $# -eq 2 ]] || { echo "usage: $0 MODEL.gguf BIN_DIR" >&2; exit 2; }
MODEL=$(realpath "$1")
BIN=$(cd "$2" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LLAMA_BIN=${LLAMA_BIN:-$(bash "${TESSERA_ANCHOR_TOOLS:-$ROOT/../shared/anchors}/build-llama-cpp.sh" | tail -n1)/bin}
ROUNDS=${ROUNDS:-2} THREADS=${THREADS:-2} INPUT_LEN=${INPUT_LEN:-128} OUTPUT_LEN=${OUTPUT_LEN:-65}
CONCURRENCY=${CONCURRENCY:-8} REQUESTS_ONE=${REQUESTS_ONE:-6} REQUESTS_MANY=${REQUESTS_MANY:-16}
PORT=${PORT:-39317}
OUT_DIR=${OUT_DIR:-/tmp/tessera-vs-llama-$(date +%Y%m%d-%H%M%S)}
URL=http://127.0.0.1:$PORT
mkdir -p "$OUT_DIR"

SERVER=
stop() {
  [[ -n $SERVER ]] || return 0
  kill -TERM "$SERVER" 2>/dev/null || true
  for _ in $(seq 60); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.5; done
  kill -KILL "$SERVER" 2>/dev/null || true
  wait "$SERVER" 2>/dev/null || true
  SERVER=
}
trap stop EXIT

wait_healthy() {
  for _ in $(seq 600); do
    kill -0 "$SERVER" 2>/dev/null || { echo "server exited; see $1" >&2; tail -n 20 "$1" >&2; exit 1; }
    curl -sf --noproxy '*' -o /dev/null "$URL/health" && return 0
    sleep 0.5
  done
  echo "no healthy /health in 300 s; see $1" >&2
  exit 1
}

# One client run: NAME, CONCURRENCY, REQUESTS.
client() {
  "$BIN/tessera-bench" --url "$URL" --tokenizer "$MODEL" --endpoint completions \
    --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --ignore-eos --temperature 0 \
    --num-requests "$3" --concurrency "$2" --warmup 1 --seed 0 --no-progress \
    --json "$OUT_DIR/$1.json" >"$OUT_DIR/$1.txt" 2>&1
  python3 - "$OUT_DIR/$1.json" "$1" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))["runs"][0]["metrics"]
itl = m["itl_ms"] or {"median": float("nan")}
ttft = m["ttft_ms"] or {"median": float("nan")}
print(f"{sys.argv[2]:<28} ok {m['completed']:>3} failed {m['failed']:>2}  output {m['output_throughput']:8.1f} tok/s"
      f"  ITL median {itl['median']:7.2f} ms  TTFT median {ttft['median']:8.1f} ms")
EOF
}

for round in $(seq "$ROUNDS"); do
  for server in llama tessera; do
    log=$OUT_DIR/$server-$round.log
    if [[ $server == llama ]]; then
      "$LLAMA_BIN/llama-server" -m "$MODEL" -t "$THREADS" -tb "$THREADS" -c $((CONCURRENCY * (INPUT_LEN + OUTPUT_LEN + 16))) \
        -np "$CONCURRENCY" --host 127.0.0.1 --port "$PORT" >"$log" 2>&1 &
    else
      "$BIN/tessera-launcher" --model-id "$MODEL" --hostname 127.0.0.1 --port "$PORT" \
        --shard-uds-path "/tmp/tessera-vs-llama-$$" --master-port $((PORT + 1)) >"$log" 2>&1 &
    fi
    SERVER=$!
    wait_healthy "$log"
    client "$server-$round-c1" 1 "$REQUESTS_ONE"
    client "$server-$round-c$CONCURRENCY" "$CONCURRENCY" "$REQUESTS_MANY"
    stop
  done
done
echo "files: $OUT_DIR"
