#!/usr/bin/env bash
# Installs guidellm (PyPI), a third-party load generator for OpenAI-compatible servers, into its
# own virtual environment, .venv-bench (Debian's site packages visible), for
# tests/bench/http_vs_grpc.py. guidellm 0.3.0 because later releases require torch and numpy 2
# (from PyPI: a multi-gigabyte CUDA build of torch, which also breaks Debian's python3-torch);
# 0.3.0 needs neither, and counts tokens with the served model's own tokenizer directory (no
# download). Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv-bench/bin/python ]; then
  /usr/bin/python3 -m venv --system-site-packages .venv-bench
fi
if ! .venv-bench/bin/python -c "import guidellm" 2>/dev/null; then
  .venv-bench/bin/python -m pip install -q --disable-pip-version-check -r tools/requirements-bench.txt
fi
echo "install_bench.sh: ok"
