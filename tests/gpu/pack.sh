#!/usr/bin/env bash
# Packs a CUDA build of the GPU check's programs into one tarball that tests/gpu/run.sh can run on
# a GPU machine which has the NVIDIA driver and CUDA 13 (cuBLAS) but none of the build's Debian
# libraries (Abseil, sentencepiece, PCRE2, ICU) and no way to install them.
#   tests/gpu/pack.sh [build-dir] [tarball]
#     build-dir: configured and built here if its programs are missing (default <repo>/build-gpu)
#     tarball:   default <build-dir>/modserve-gpu-prebuilt.tar.xz
# On the GPU machine: MODSERVE_GPU_PREBUILT=<tarball> tests/gpu/run.sh
# The tarball holds bin/, tests/ and lib/ as in the build tree, deps/ (every shared library the
# programs load except glibc, libstdc++, libgcc_s and the CUDA driver / cuBLAS), and source_dir.txt
# (the source path the tests were compiled with; run.sh links it to the checkout there).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:-$ROOT/build-gpu}"
TARBALL="${2:-$BUILD/modserve-gpu-prebuilt.tar.xz}"
CUDA_ARCH="${CUDA_ARCH:-90}"
PROGRAMS=(bin/modserve-bench bin/modserve-generate bin/modserve-cuda-gemv-bench
          tests/backend_conformance_test tests/backend_cuda_test tests/engine_golden_test
          lib/libmodserve_backend_cuda_plugin.so)
TARGETS=(modserve-bench modserve-generate modserve-cuda-gemv-bench backend_conformance_test
         backend_cuda_test engine_golden_test modserve_backend_cuda_plugin)

export PATH="/usr/local/cuda/bin:$PATH"
if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DMODSERVE_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH"
fi
# Without CUDA in the build the plugin target does not exist and ninja says so.
ninja -C "$BUILD" "${TARGETS[@]}"

STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/tests" "$STAGE/lib" "$STAGE/deps"
for p in "${PROGRAMS[@]}"; do cp "$BUILD/$p" "$STAGE/$p"; done

# Shared libraries: everything ldd resolves, less what every Linux with a CUDA driver has (or must
# provide itself: the driver, cuBLAS), less the C/C++ runtimes (the GPU machine's are newer).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libgcc_s|libstdc\+\+|libcuda\.so|libcublas|libcublasLt)'
for p in "${PROGRAMS[@]}"; do
  ldd "$BUILD/$p" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $skip ]] && continue
  cp -L "$path" "$STAGE/deps/$name"
done
echo "$ROOT" >"$STAGE/source_dir.txt"
echo "$BUILD" >"$STAGE/binary_dir.txt"
tar -C "$STAGE" -cJf "$TARBALL" .
echo "pack.sh: $TARBALL ($(du -h "$TARBALL" | cut -f1)): ${PROGRAMS[*]}, $(ls "$STAGE/deps" | wc -l) libraries"
