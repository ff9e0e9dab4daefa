#!/usr/bin/env bash
# Every test of udfchain, Rust and Python: the README's test command (.ci/run
# runs it too).
#  1. `cargo test --workspace`: the unit, integration and doc tests (they
#     start their own S3 server on 127.0.0.1);
#  2. `cargo build --workspace --bins`: the `udfchain` binary the Python
#     browser test drives;
#  3. `bash python/test.sh`: the Python package built into a venv (python3
#     and pip needed), its pytest suite and `mypy --strict`.
# Each part runs even when one before it failed; the exit status is 1 when
# any failed, and the last line names them. Both parts share one target dir,
# $CARGO_TARGET_DIR (default ~/.cache/udfchain-target, as .ci/run), so the
# Python build reuses the Rust tests' build of DataFusion.
set -uo pipefail
cd "$(dirname "$0")"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/udfchain-target}"
failed=()

echo "== cargo test --workspace"
cargo test --workspace || failed+=("cargo test --workspace")
echo "== cargo build --workspace --bins"
cargo build --workspace --bins || failed+=("cargo build --workspace --bins")
echo "== bash python/test.sh"
bash python/test.sh || failed+=("python/test.sh")

if (( ${#failed[@]} )); then
    printf 'test.sh: failed: %s\n' "$(IFS=,; echo "${failed[*]}" | sed 's/,/, /g')" >&2
    exit 1
fi
echo "test.sh: every test passed"
