#!/usr/bin/env bash
# Served per-token overhead of Tessera: ITL of ONE streamed greedy request at a time against
# the server, next to the engine's batch-1 decode step at the same context.
#
# Usage: measure-served.sh BIN_DIR LABEL
#   BIN_DIR holds tessera-launcher, tessera-router, tessera-shard, tessera-bench, engine-bench
#   (release builds). The launcher finds router and shard next to itself (then on PATH).
#
# Context match: the engine bench decodes batch 1 for 64 steps at positions 128..191 after a
# 128-token prompt ("decode batch 1, ctx 128, 64 steps"). The served run sends completions
# prompts of exactly INPUT_LEN=128 tokens (BOS included) with OUTPUT_LEN=65 and ignore_eos:
# token 1 comes from the prefill, tokens 2..65 from 64 decode steps at positions 128..191, so
# each request gives 64 ITL gaps, each one decode step plus the serving path around it.
#
# Environment overrides: PORT (default 39217), NUM_REQUESTS (10), WARMUP (2), INPUT_LEN (128),
# OUTPUT_LEN (65), ENGINE_REPS (5), MODEL (the SmolLM2 Q4_1 GGUF), OUT_DIR (kept JSON/logs),
# SKIP_ENGINE=1 (served part only).
set -euo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: $0 BIN_DIR LABEL" >&2
    exit 2
fi
BIN_DIR=$(cd "$1" && pwd)
LABEL=$2
MODEL=${MODEL:-$HOME/.cache/tessera/SmolLM2-135M-Instruct.Q4_1.gguf}
PORT=${PORT:-39217}
NUM_REQUESTS=${NUM_REQUESTS:-10}
WARMUP=${WARMUP:-2}
INPUT_LEN=${INPUT_LEN:-128}
OUTPUT_LEN=${OUTPUT_LEN:-65}
ENGINE_REPS=${ENGINE_REPS:-5}
OUT_DIR=${OUT_DIR:-/tmp/tessera-meas-$LABEL-$(date +%Y%m%d-%H%M%S)}
UDS=/tmp/tessera-meas-$LABEL-$$
URL=http://127.0.0.1:$PORT

bins="tessera-launcher tessera-router tessera-shard tessera-bench"
[[ ${SKIP_ENGINE:-0} == 1 ]] || bins="$bins engine-bench"
for b in $bins; do
    [[ -x $BIN_DIR/$b ]] || { echo "[$LABEL] missing $BIN_DIR/$b" >&2; exit 2; }
done
[[ -f $MODEL ]] || { echo "[$LABEL] missing model $MODEL" >&2; exit 2; }
if curl -s --noproxy '*' -o /dev/null "$URL/health"; then
    echo "[$LABEL] something already answers on $URL; set PORT" >&2
    exit 2
fi
mkdir -p "$OUT_DIR"
# Only BIN_DIR's binaries, whatever the caller's PATH holds.
export PATH=$BIN_DIR:$PATH

LAUNCHER_PID=
stop_server() {
    [[ -n $LAUNCHER_PID ]] || return 0
    if kill -0 "$LAUNCHER_PID" 2>/dev/null; then
        kill -TERM "$LAUNCHER_PID" 2>/dev/null || true
        # Router then shards, each with --shutdown-grace-period 5: 30 s is ample.
        for _ in $(seq 60); do
            kill -0 "$LAUNCHER_PID" 2>/dev/null || break
            sleep 0.5
        done
        if kill -0 "$LAUNCHER_PID" 2>/dev/null; then
            echo "[$LABEL] launcher $LAUNCHER_PID did not stop in 30 s: SIGKILL" >&2
            kill -KILL "$LAUNCHER_PID" 2>/dev/null || true
        fi
    fi
    wait "$LAUNCHER_PID" 2>/dev/null || true
    LAUNCHER_PID=
    rm -f "$UDS"-*
}
trap stop_server EXIT

# ---- served ----
"$BIN_DIR/tessera-launcher" \
    --model-id "$MODEL" \
    --hostname 127.0.0.1 --port "$PORT" \
    --shard-uds-path "$UDS" --master-port $((PORT + 1)) \
    --shutdown-grace-period 5 \
    >"$OUT_DIR/server.log" 2>&1 &
LAUNCHER_PID=$!

ready=0
for _ in $(seq 360); do
    if ! kill -0 "$LAUNCHER_PID" 2>/dev/null; then
        echo "[$LABEL] launcher exited before /health; last log lines:" >&2
        tail -n 30 "$OUT_DIR/server.log" >&2
        exit 1
    fi
    if curl -sf --noproxy '*' -o /dev/null "$URL/health"; then
        ready=1
        break
    fi
    sleep 0.5
done
if [[ $ready != 1 ]]; then
    echo "[$LABEL] no healthy /health within 180 s" >&2
    tail -n 30 "$OUT_DIR/server.log" >&2
    exit 1
fi

"$BIN_DIR/tessera-bench" --url "$URL" \
    --tokenizer "$MODEL" --endpoint completions \
    --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --ignore-eos --temperature 0 \
    --num-requests "$NUM_REQUESTS" --concurrency 1 --warmup "$WARMUP" --seed 0 \
    --no-progress --json "$OUT_DIR/served.json" >"$OUT_DIR/bench.txt" 2>&1 || {
    echo "[$LABEL] tessera-bench failed:" >&2
    cat "$OUT_DIR/bench.txt" >&2
    exit 1
}
stop_server

python3 - "$OUT_DIR/served.json" "$LABEL" "$NUM_REQUESTS" "$OUTPUT_LEN" <<'EOF'
import json, sys
path, label, n, out_len = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
m = json.load(open(path))["runs"][0]["metrics"]
itl, tpot = m["itl_ms"], m["tpot_ms"]
want_tokens = n * out_len
want_gaps = n * (out_len - 1)
print(f"[{label}] served: {m['completed']}/{n} ok, output tokens {m['total_output_tokens']} "
      f"(want {want_tokens}), ITL gaps {itl['count']} (want {want_gaps})")
print(f"[{label}] served ITL ms: mean {itl['mean']:.3f} median {itl['median']:.3f} "
      f"p90 {itl['p90']:.3f} p99 {itl['p99']:.3f} std {itl['std']:.3f}")
print(f"[{label}] served TPOT ms: mean {tpot['mean']:.3f} median {tpot['median']:.3f}")
if m["failed"] or m["total_output_tokens"] != want_tokens or itl["count"] != want_gaps:
    print(f"[{label}] WARNING: failures or token/gap counts differ from the plan")
EOF

# ---- engine ----
if [[ ${SKIP_ENGINE:-0} != 1 ]]; then
    TESSERA_BENCH_GGUF=$MODEL TESSERA_BENCH_WEIGHTS=native \
        TESSERA_BENCH_REPS=$ENGINE_REPS "$BIN_DIR/engine-bench" --bench \
        >"$OUT_DIR/engine.txt" 2>&1 || {
        echo "[$LABEL] engine-bench failed:" >&2
        tail -n 30 "$OUT_DIR/engine.txt" >&2
        exit 1
    }
    row=$(grep -m1 'decode batch 1, ctx' "$OUT_DIR/engine.txt" || true)
    [[ -n $row ]] || { echo "[$LABEL] no batch-1 decode row in engine.txt" >&2; exit 1; }
    echo "[$LABEL] engine: $(echo "$row" | tr -s ' ')"
    step=$(echo "$row" | awk '{print $(NF-1)}')
    whole=$(awk '/^whole step/ {print $3; exit}' "$OUT_DIR/engine.txt")
    echo "[$LABEL] engine decode batch 1 ms/step: $step (op-timed whole step: ${whole:-?})"
    python3 - "$OUT_DIR/served.json" "$step" "$LABEL" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))["runs"][0]["metrics"]
step, label = float(sys.argv[2]), sys.argv[3]
print(f"[{label}] overhead ms/token (served ITL - engine step): "
      f"mean {m['itl_ms']['mean'] - step:.3f} median {m['itl_ms']['median'] - step:.3f}")
EOF
fi
echo "[$LABEL] files: $OUT_DIR"
