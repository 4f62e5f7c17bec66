#!/usr/bin/env bash
# Installs what modserve needs, builds it, and starts the gRPC server on the demo MoD checkpoint.
#   PORT=50051 bash tools/serve_demo.sh [more modserve flags, e.g. --metrics_port 9400]
set -euo pipefail
cd "$(dirname "$0")/.."
# Build dependencies only (no PyTorch reference or sanitizer toolchain); tools/test.sh needs
# the full set (MODSERVE_DEPS=all, install_deps.sh's default).
MODSERVE_DEPS="${MODSERVE_DEPS:-build}" bash tools/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMODSERVE_CUDA="${MODSERVE_CUDA:-AUTO}"
cmake --build build -j "$(nproc)"
exec build/bin/modserve --model models/demo --port "${PORT:-50051}" "$@"
