#!/usr/bin/env bash
# Installs lm-eval (PyPI) into its own virtual environment, .venv-lmeval (Debian's site packages
# visible), for tests/lmeval (label `slow`). Kept apart from .venv: lm-eval pulls in datasets,
# evaluate, scikit-learn, sacrebleu and more, which the shared environment must not change.
# The `api` extra brings what local-completions needs (aiohttp, tenacity). Idempotent: a second
# run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv-lmeval/bin/python ]; then
  /usr/bin/python3 -m venv --system-site-packages .venv-lmeval
fi
if ! .venv-lmeval/bin/python -c "import lm_eval, tenacity, aiohttp" 2>/dev/null; then
  .venv-lmeval/bin/python -m pip install -q --disable-pip-version-check -r tools/requirements-lmeval.txt
fi
echo "install_lm_eval.sh: ok ($(.venv-lmeval/bin/lm_eval --help >/dev/null 2>&1 && echo lm_eval))"
