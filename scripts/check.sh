#!/usr/bin/env bash
# The inner loop: formatting, clippy and the tests of the crates you touched (or named), with
# incremental builds. The full test command (what CI runs) is scripts/test.sh.
#
#   scripts/check.sh                 # the crates with changes against HEAD (and untracked files)
#   scripts/check.sh router shard    # these crates (folder or package names)
#   scripts/check.sh router -- chat  # and pass the rest to the test binaries (a name filter)
#
# The end-to-end tests (tests/) start the binaries; when tests/ is among the crates, the
# binaries are built first.
set -euo pipefail
cd "$(dirname "$0")/.."

folders=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    folders+=("${1#tessera-}")
    shift
done
[ "${1:-}" = "--" ] && shift
if [ ${#folders[@]} -eq 0 ]; then
    mapfile -t folders < <(
        { git diff --name-only HEAD; git ls-files --others --exclude-standard; } |
            cut -d/ -f1 | sort -u
    )
fi

packages=()
e2e=0
for folder in "${folders[@]}"; do
    case "$folder" in
        blocks | kernels | text | model-files | proto | params | telemetry | shard | router | launcher | bench)
            packages+=(-p "tessera-$folder")
            ;;
        tests | e2e)
            packages+=(-p tessera-e2e)
            e2e=1
            ;;
    esac
done
if [ ${#packages[@]} -eq 0 ]; then
    echo "check.sh: no crate touched (name some: scripts/check.sh router shard)" >&2
    exit 0
fi

echo "check.sh: ${packages[*]}" >&2
cargo fmt --all -- --check
# Clippy lints the crates while they compile (scripts/lib/clippy-rustc, as in scripts/test.sh), so
# a touched crate compiles once rather than once for `cargo clippy` and again for its tests.
export RUSTC_WORKSPACE_WRAPPER="$PWD/scripts/lib/clippy-rustc"
cargo build "${packages[@]}" --all-targets
if [ "$e2e" = 1 ]; then
    cargo build --workspace --bins
fi
cargo test "${packages[@]}" -- "$@"
