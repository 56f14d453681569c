#!/usr/bin/env bash
# End-to-end protocol tests with the real agent clients from PyPI: openai, anthropic, LangChain,
# the OpenAI Agents SDK, Pydantic AI and instructor each talk to the real launcher, shard and
# router serving SmolLM2-135M-Instruct (scripts/fetch_smollm2.sh) on a free port of 127.0.0.1, and
# the openai SDK's embeddings against a second server of the tiny embedding fixture, and its
# chat, streams and Responses against a third of tiny gpt-oss in the harmony format.
# The tests (tests/clients/) check the protocol — parsed objects, tool calls, streams, usage —
# never the tiny model's answers.
#
# Built binaries come from target/debug, or TESSERA_BIN_DIR. The clients install, at pinned
# versions, into a venv under target/agent-clients/ (reused on later runs). Bounded: a timeout on
# each test and on the whole run. Telemetry of the SDKs is off; the only traffic is loopback.
#
# Usage: scripts/agent-clients.sh [PYTEST_ARGS...]   e.g. tests/clients/test_openai.py, -m anthropic
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="$root/target/agent-clients"
venv="$cache/venv"
bin="${TESSERA_BIN_DIR:-$root/target/debug}"
python="${PYTHON:-python3}"

# Pinned clients. instructor 1.17.0 asks for jiter<0.15 while every openai>=3.5 asks for
# jiter>=0.16, so instructor goes in without its dependencies, and they are listed here instead
# (its own ranges, jiter aside).
pins=(
  openai==3.63.0 anthropic==2.17.0 langchain-openai==1.8.1 langchain-core==1.8.3
  openai-agents==0.24.0 'pydantic-ai-slim[openai]==2.78.0' pytest==9.2.0 pytest-timeout==2.4.0
  jsonschema==4.26.0
)
instructor=instructor==1.17.0
instructor_deps=(
  'aiohttp>=3.14.3,<4' 'click>=8.3.3' 'docstring-parser>=0.16,<1' 'jinja2>=3.1.4,<4' 'idna>=3.15'
  'regex>=2023,<2027' 'requests>=2.33,<3' 'rich>=13.7,<15' 'tenacity>=8.2.3,<10' 'typer>=0.9,<1'
  'urllib3>=2.7,<3'
)
stamp="$cache/installed"
want="${pins[*]} $instructor ${instructor_deps[*]}"
mkdir -p "$cache"
if [[ ! -x "$venv/bin/python" || "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  "$python" -m venv "$venv"
  pip=("$venv/bin/pip" install --quiet --disable-pip-version-check)
  timeout 900 "${pip[@]}" "${pins[@]}" "${instructor_deps[@]}"
  timeout 300 "${pip[@]}" --no-deps "$instructor"
  echo "$want" >"$stamp"
fi
[[ "${TESSERA_INSTALL_ONLY:-}" == 1 ]] && exit 0

model="$(TESSERA_CACHE="${TESSERA_CACHE:-$HOME/.cache/tessera}" "$root/scripts/fetch_smollm2.sh" | tail -n1)"
work="$(mktemp -d "$cache/run-XXXXXX")"
# shellcheck source=lib/test-server.sh
source "$root/scripts/lib/test-server.sh"
start_test_server agent-clients.sh "$work" "$bin" --model-id "$model" \
  --served-model-name SmolLM2-135M-Instruct --kv-cache-memory 256M --max-concurrent-requests 16
generation_base="$base"
# The embeddings client talks to the tiny embedding fixture, whose vectors the test knows.
mkdir -p "$work/embed"
start_test_server agent-clients.sh "$work/embed" "$bin" \
  --model-id "$root/fixtures/tiny-qwen3-embedding" --kv-cache-memory 64M
export TESSERA_EMBEDDING_BASE_URL="$base"
# The harmony client talks to tiny gpt-oss with gpt-oss's template and tokens.
mkdir -p "$work/harmony"
start_test_server agent-clients.sh "$work/harmony" "$bin" \
  --model-id "$root/fixtures/tiny-gpt-oss-harmony" --kv-cache-memory 64M
export TESSERA_HARMONY_BASE_URL="$base"
base="$generation_base"

# Loopback only, no telemetry: the Agents SDK would export traces to OpenAI, LangChain to
# LangSmith, Pydantic AI to Logfire; proxies could catch loopback traffic.
export TESSERA_BASE_URL="$base" TESSERA_MODEL=SmolLM2-135M-Instruct
export OPENAI_BASE_URL="$base/v1" OPENAI_API_KEY=dummy
export ANTHROPIC_BASE_URL="$base" ANTHROPIC_API_KEY=dummy
export OPENAI_AGENTS_DISABLE_TRACING=1 LANGCHAIN_TRACING_V2=false LANGSMITH_TRACING=false
export LOGFIRE_SEND_TO_LOGFIRE=false DO_NOT_TRACK=1 NO_PROXY='*' no_proxy='*'
unset HTTP_PROXY HTTPS_PROXY ALL_PROXY http_proxy https_proxy all_proxy

# Arguments go to pytest; without a test path among them, it runs all of tests/clients.
args=("$@")
cd "$root"
for arg in "$@"; do [[ -e "${arg%%::*}" ]] && has_path=1; done
[[ -n "${has_path:-}" ]] || args=(tests/clients "${args[@]}")
status=0
timeout "${AGENT_CLIENTS_TIMEOUT:-600}" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  --timeout 120 -rfEs "${args[@]}" || status=$?
if [[ $status -ne 0 ]]; then
  echo "agent-clients.sh: failed ($status); the server's last lines:" >&2
  tail -n 20 "$work/server.log" "$work/embed/server.log" "$work/harmony/server.log" >&2
fi
exit $status
