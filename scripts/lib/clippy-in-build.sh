# Sourced by scripts/test.sh and scripts/check.sh: cargo's builds that follow lint the
# workspace's crates with clippy while compiling them, and deny warnings, as
# `cargo clippy -- -D warnings` would.
#
# `cargo clippy` is a check build (no code generation) with clippy-driver as the rustc of the
# workspace's crates; the tests then need a real build, which compiled every crate, the
# dependencies included, a second time. clippy-driver generates code as rustc does, so setting
# it up the way cargo-clippy does (RUSTC_WORKSPACE_WRAPPER, and CLIPPY_ARGS in its
# `__CLIPPY_HACKERY__`-separated form) gives the lints and the binaries from one compilation.
# Dependencies are compiled by plain rustc either way. Cargo keeps these artifacts apart from
# a plain `cargo build`'s, since the wrapper is part of each workspace crate's fingerprint.
clippy_driver="$(command -v clippy-driver || true)"
if [ -z "$clippy_driver" ]; then
    echo "clippy-driver not found: install clippy (rustup component add clippy)" >&2
    exit 1
fi
export RUSTC_WORKSPACE_WRAPPER="$clippy_driver"
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
unset clippy_driver
