# Sourced by the scripts that test a served model (schemathesis.sh, agent-clients.sh): starts
# the real launcher on a free port of 127.0.0.1, stops it (and removes its folder) on exit,
# and waits for /health. Callable more than once: every server started stops on exit.
#
#   start_test_server NAME WORK BIN LAUNCHER_ARGS...
#
# NAME names the caller in messages; WORK is a fresh folder for the socket and the log; BIN
# holds tessera-launcher. Sets `base` (http://127.0.0.1:PORT) and `server` (the launcher's pid)
# of the server it started.
test_servers=()
test_server_works=()
start_test_server() {
  local name="$1" work="$2" bin="$3"
  shift 3
  local port
  port="$("${PYTHON:-python3}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  "$bin/tessera-launcher" --hostname 127.0.0.1 --port "$port" --shard-uds-path "$work/shard" \
    --shutdown-grace-period 5 "$@" >"$work/server.log" 2>&1 &
  server=$!
  test_servers+=("$server")
  test_server_works+=("$work")
  trap stop_test_server EXIT
  base="http://127.0.0.1:$port"
  for _ in $(seq 1 1200); do
    if curl -fsS "$base/health" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$server" 2>/dev/null; then
      echo "$name: the server exited before it was ready:" >&2
      tail -n 40 "$work/server.log" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "$name: the server was not ready within 120 s:" >&2
  tail -n 40 "$work/server.log" >&2
  exit 1
}

stop_test_server() {
  local pid
  for pid in "${test_servers[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${test_servers[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "${test_server_works[@]}"
}
