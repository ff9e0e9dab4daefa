#!/usr/bin/env bash
# Builds the release wheel of the udfchain Python package and proves that it
# installs and runs without a Rust toolchain:
#  1. `maturin build --release` -> an abi3 manylinux wheel (CPython >= 3.10)
#     in $WHEEL_DIR (default $CARGO_TARGET_DIR/wheels); maturin comes from a
#     small build venv (~/.cache/udfchain-wheel-venv, made if missing);
#  2. a fresh venv in a temp dir, the wheel installed with pip (pyarrow from
#     the index), with a PATH that has no cargo or rustc on it;
#  3. python/wheel_smoke.py run there from outside the repository.
# Reuses $CARGO_TARGET_DIR (default ~/.cache/udfchain-target, as .ci/run): a
# release build from a cold target dir takes 15-25 min on 2 cores. Not part
# of .ci/run (its time budget); the release workflow runs the same smoke test.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/udfchain-target}"
out="${WHEEL_DIR:-$CARGO_TARGET_DIR/wheels}"
build_venv="${UDFCHAIN_WHEEL_VENV:-$HOME/.cache/udfchain-wheel-venv}"

echo "== maturin build --release (into $out)"
[ -x "$build_venv/bin/maturin" ] || {
    python3 -m venv "$build_venv"
    "$build_venv/bin/pip" install -q --disable-pip-version-check "maturin>=1.9,<2"
}
mkdir -p "$out"
rm -f "$out"/udfchain-*.whl
"$build_venv/bin/maturin" build --release -m python/Cargo.toml --out "$out"
wheel="$(ls "$out"/udfchain-*.whl)"
case "$(basename "$wheel")" in
    *-cp310-abi3-manylinux*.whl) ;;
    *) echo "wheel-smoke.sh: $wheel is not an abi3 manylinux wheel" >&2; exit 1 ;;
esac
echo "wheel: $wheel ($(du -h "$wheel" | cut -f1))"

echo "== a fresh venv without a Rust toolchain"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
clean_path="$tmp/venv/bin:/usr/local/bin:/usr/bin:/bin"
for tool in cargo rustc maturin; do
    if PATH="$clean_path" command -v "$tool" >/dev/null 2>&1; then
        echo "wheel-smoke.sh: $tool is on the clean PATH ($clean_path)" >&2
        exit 1
    fi
done
# The caller's environment (pip's index settings) but no Rust: PATH without
# ~/.cargo/bin, and no cargo or rustup variables.
clean() { env -u CARGO_HOME -u RUSTUP_HOME -u CARGO_TARGET_DIR -u RUSTUP_TOOLCHAIN PATH="$clean_path" "$@"; }
clean pip install -q --disable-pip-version-check "$wheel"

echo "== smoke test"
cp "$repo/python/wheel_smoke.py" "$tmp/"
(cd "$tmp" && clean python wheel_smoke.py)
