#!/usr/bin/env bash
# Installs what modserve needs, builds it, and starts it on the demo MoD checkpoint.
#   PORT=50051 bash tools/serve_demo.sh
# Until the gRPC server binary exists in this tree, it runs the PyTorch reference generator on the
# demo checkpoint instead, so the checkpoint and the toolchain can still be tried end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMODSERVE_CUDA="${MODSERVE_CUDA:-AUTO}"
cmake --build build -j "$(nproc)"
if [ -x build/bin/modserve ]; then
  exec build/bin/modserve --model models/demo --port "${PORT:-50051}" "$@"
fi
echo "serve_demo.sh: build/bin/modserve is not part of this tree yet; generating with the" \
     "PyTorch reference on models/demo instead." >&2
exec .venv/bin/python tools/generate.py --model models/demo "$@"
