#!/usr/bin/env bash
# Property-based API tests: Schemathesis (PyPI) generates requests from the server's own
# /openapi.json, valid and invalid, and checks every answer: no 5xx, a documented status, the
# documented content type, and a body that conforms to the documented schema.
#
# The server is the real launcher, shard and router on the tiny Llama fixture (built binaries
# from target/debug, or TESSERA_BIN_DIR), on a free port of 127.0.0.1. Schemathesis installs
# into a venv under target/schemathesis/ (reused on later runs). Bounded: a fixed number of
# examples per operation and a time limit on the whole run.
#
# Usage: scripts/schemathesis.sh [MAX_EXAMPLES]   (default 25)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="$root/target/schemathesis"
venv="$cache/venv"
bin="${TESSERA_BIN_DIR:-$root/target/debug}"
examples="${1:-25}"
python="${PYTHON:-python3}"

mkdir -p "$cache"
if ! "$venv/bin/schemathesis" --version >/dev/null 2>&1; then
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check 'schemathesis==4.*'
fi
[[ "${TESSERA_INSTALL_ONLY:-}" == 1 ]] && exit 0

work="$(mktemp -d "$cache/run-XXXXXX")"
# shellcheck source=lib/test-server.sh
source "$root/scripts/lib/test-server.sh"
start_test_server schemathesis.sh "$work" "$bin" --model-id "$root/fixtures/tiny-llama" \
  --kv-cache-memory 64M --max-concurrent-requests 64

# `positive` and `negative` data: schema-conforming requests must succeed or fail with a
# documented 4xx; invalid ones must be refused with a documented 4xx, never a 5xx.
status=0
cd "$cache"  # Schemathesis keeps its own cache in the working folder.
timeout 600 "$venv/bin/schemathesis" run "$base/openapi.json" \
  --url "$base" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
  --mode all \
  --max-examples "$examples" \
  --request-timeout 60 \
  --seed 27 \
  --exclude-path /docs \
  --no-color || status=$?
if [[ $status -ne 0 ]]; then
  echo "schemathesis.sh: failed ($status); the server's last lines:" >&2
  tail -n 20 "$work/server.log" >&2
fi
exit $status
