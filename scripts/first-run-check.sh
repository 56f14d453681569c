#!/usr/bin/env bash
# Proves that scripts/test.sh passes on a first run: a fresh clone of HEAD, with every cache the
# project uses pointed at an empty folder. Nothing of the user's is removed: HOME
# (so ~/.cache/tessera: the model, the NVRTC venv, the PTX cache; pip's cache), XDG_CACHE_HOME
# and TESSERA_CACHE all point into a new temporary folder, and the clone has its own target/
# (so target/helm-check and target/schemathesis start empty too). Cargo and rustup keep the
# user's installation (CARGO_HOME, RUSTUP_HOME), which are not caches of the project.
#
# Usage:
#   scripts/first-run-check.sh          the steps that fetch or install on first use, in the
#                                       fresh clone: the model, the CUDA PTX test (NVRTC wheel),
#                                       the Helm check and the Schemathesis run; compiled code
#                                       comes from this checkout's target/ (CARGO_TARGET_DIR),
#                                       while the clone's own target/ holds the tools' venvs
#   scripts/first-run-check.sh --full   the whole scripts/test.sh in the fresh clone: a cold
#                                       build, unless CARGO_TARGET_DIR names a target folder
#                                       to compile into (the binaries are then taken from it)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
export CARGO_HOME="${CARGO_HOME:-$HOME/.cargo}"
export RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}"
export PATH="$CARGO_HOME/bin:$PATH"

empty="$(mktemp -d "${TMPDIR:-/tmp}/tessera-first-run-XXXXXX")"
trap 'rm -rf "$empty"' EXIT
export HOME="$empty/home"
export XDG_CACHE_HOME="$HOME/.cache"
unset TESSERA_CACHE TESSERA_PTX_CACHE TESSERA_NVRTC_LIB_DIR PIP_CACHE_DIR
mkdir -p "$HOME"
[[ -z "$(ls -A "$HOME")" ]] || { echo "first-run-check: $HOME is not empty" >&2; exit 1; }

git clone --quiet --no-hardlinks "$root" "$empty/clone"
cd "$empty/clone"
echo "first-run-check: fresh clone of $(git rev-parse --short HEAD) in $PWD, HOME=$HOME" >&2

if [[ "${1:-}" == "--full" ]]; then
  if [[ -n "${CARGO_TARGET_DIR:-}" ]]; then
    export TESSERA_BIN_DIR="$CARGO_TARGET_DIR/debug"
  fi
  bash scripts/test.sh
else
  export CARGO_INCREMENTAL=0
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
  export TESSERA_BIN_DIR="$CARGO_TARGET_DIR/debug"
  scripts/fetch_smollm2.sh >/dev/null
  test -s "$HOME/.cache/tessera/SmolLM2-135M-Instruct.Q4_1.gguf"
  cargo test -p tessera-kernels --features cuda --locked --test cuda_ptx
  bash scripts/check-helm.sh
  cargo build --workspace --bins --locked
  bash scripts/schemathesis.sh
fi
echo "first-run-check: passed with empty caches" >&2
