#!/usr/bin/env bash
# Builds the udfchain Python package into a venv and runs its pytest suite.
# The venv is $UDFCHAIN_VENV (default ~/.cache/udfchain-venv), made if missing;
# the build reuses $CARGO_TARGET_DIR (default ~/.cache/udfchain-target, as
# .ci/run), so after `cargo test --workspace` it compiles only the bindings.
# Then `mypy --strict` over the package, its tests and examples/python
# (python/pyproject.toml's [tool.mypy]); a type error fails the script too.
# Exit status: pytest's (or mypy's when pytest passed), except that "no tests
# ran" (5) is a failure.
# The model and image tests use Pillow, numpy, onnx and onnxruntime (CPU) from PyPI;
# the browser test (test_ui_browser.py) the `playwright` package, driving the
# system Chromium (`apt-get install chromium`; no browser is downloaded).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/udfchain-target}"
venv="${UDFCHAIN_VENV:-$HOME/.cache/udfchain-venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check maturin pytest pyarrow pandas "moto[server]" \
    pillow numpy onnx onnxruntime playwright mypy cloudpickle
export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
maturin develop -q -m python/Cargo.toml
status=0
python -m pytest -q python/tests "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "python/test.sh: pytest collected no tests" >&2
    exit 1
fi
echo "== mypy --strict (python/udfchain, python/tests, examples/python)"
(cd python && python -m mypy --strict) || { [ "$status" -ne 0 ] || status=1; }
exit "$status"
