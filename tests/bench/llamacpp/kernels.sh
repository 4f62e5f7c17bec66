#!/usr/bin/env bash
# kernels.sh: the quantized matrix kernels of modserve (kernel_bench) and of llama.cpp (ggml
# MUL_MAT through its CPU backend, ggml_matmul_bench.cc) on the same shapes, same threads, one
# after the other: decode GEMV (n = 1, 4, 16, weights streamed from DRAM) and prefill GEMM
# (n = 512) for Q8_0, Q4_0, Q4_1, Q4_K, Q6_K at TinyLlama-1.1B shapes plus SmolLM2-135M's Q4_1
# layers and Q8_0 LM head; and, with MODE=compute, one core's throughput in CPU time with the
# weights in L2 (a measure that other processes on the machine barely disturb).
# It checks no correctness (tests/engine/backend/conformance_test.cc does) and downloads nothing.
#
# Needs a llama.cpp build with libggml (compare.sh makes one in $LLAMACPP_DIR/build; this script
# builds the ggml targets there itself when they are missing, from the sdist compare.sh names)
# and a Release modserve build with kernel_bench (MODSERVE_BIN_DIR, default build/bin).
#
#   tests/bench/llamacpp/kernels.sh          # THREADS=2 MODE=all|decode|prefill|compute
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
LLAMACPP_SDIST="${LLAMACPP_SDIST:-/tmp/lcp/llama_cpp_python-0.3.36.tar.gz}"
LLAMACPP_DIR="${LLAMACPP_DIR:-/tmp/llamacpp}"
MODSERVE_BIN_DIR="${MODSERVE_BIN_DIR:-$REPO/build/bin}"
THREADS="${THREADS:-2}"
MODE="${MODE:-all}"
BUILD="$LLAMACPP_DIR/build"
log() { echo "kernels.sh: $*" >&2; }

SRC="$(ls -d "$LLAMACPP_DIR"/*/vendor/llama.cpp 2>/dev/null | head -1 || true)"
if [[ -z "$SRC" ]]; then
  [[ -f "$LLAMACPP_SDIST" ]] || { log "no llama.cpp sdist at $LLAMACPP_SDIST"; exit 1; }
  mkdir -p "$LLAMACPP_DIR"
  tar -xzf "$LLAMACPP_SDIST" -C "$LLAMACPP_DIR"
  SRC="$(ls -d "$LLAMACPP_DIR"/*/vendor/llama.cpp | head -1)"
fi
if [[ ! -e "$BUILD/bin/libggml-cpu.so" ]]; then
  log "building ggml from $SRC"
  [[ -f "$BUILD/build.ninja" ]] || nice -n 19 cmake -S "$SRC" -B "$BUILD" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
  nice -n 19 ninja -C "$BUILD" ggml ggml-cpu >/dev/null
fi
BENCH="$LLAMACPP_DIR/ggml_matmul_bench"
if [[ ! -x "$BENCH" || "$HERE/ggml_matmul_bench.cc" -nt "$BENCH" ]]; then
  log "compiling $BENCH"
  c++ -O2 -std=c++17 -I"$SRC/ggml/include" "$HERE/ggml_matmul_bench.cc" -L"$BUILD/bin" \
    -lggml -lggml-base -lggml-cpu -Wl,-rpath,"$BUILD/bin" -o "$BENCH"
fi
[[ -x "$MODSERVE_BIN_DIR/kernel_bench" ]] || { log "no $MODSERVE_BIN_DIR/kernel_bench"; exit 1; }

threads="$THREADS"
ours="quant"
theirs="all"
case "$MODE" in
  decode) ours="quant-decode"; theirs="decode" ;;
  prefill) ours="quant-prefill"; theirs="prefill" ;;
  compute) ours="quant-compute"; theirs="compute"; threads=1 ;;
esac
echo "== modserve kernel_bench ($threads threads)"
"$MODSERVE_BIN_DIR/kernel_bench" "$threads" "" "$ours"
echo "== llama.cpp ggml MUL_MAT ($threads threads, weights repacked where ggml repacks them)"
"$BENCH" "$threads" 1 "$theirs"
