#!/usr/bin/env bash
# Installs everything modserve needs to build, test and run: Debian packages first, and a Python
# virtual environment (.venv, with Debian's site packages visible) for the few PyPI-only packages.
# Idempotent: a second run changes nothing. Used by README.md, .ci/run and the Dockerfile.
#   MODSERVE_DEPS=runtime  only what the built server needs at run time (container image)
#   MODSERVE_DEPS=build    compilers and -dev packages, no Python reference
#   MODSERVE_DEPS=all      (default) also the Python reference, Prometheus and the sanitizer
#                          toolchain of tools/ci_sanitizers.sh
set -euo pipefail
cd "$(dirname "$0")/.."

want="${MODSERVE_DEPS:-all}"
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

runtime_pkgs=(libgrpc++1.51 libprotobuf32 libabsl20220623 libprometheus-cpp-core1.0
  libprometheus-cpp-pull1.0 libsentencepiece0 libpcre2-8-0 libicu72 ca-certificates)
# libboost-dev: Boost.Beast (header-only) for the HTTP port.
build_pkgs=(build-essential cmake ninja-build pkg-config git
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libabsl-dev libboost-dev
  prometheus-cpp-dev libsentencepiece-dev libpcre2-dev libicu-dev nlohmann-json3-dev
  zlib1g-dev libgtest-dev libgmock-dev libbenchmark-dev)
# libopenblas0-pthread: Debian's torch calls the generic libblas, 25x slower than OpenBLAS.
python_pkgs=(python3 python3-venv python3-pip python3-torch libopenblas0-pthread python3-numpy python3-pytest
  python3-sentencepiece python3-grpcio python3-protobuf python3-yaml python3-jinja2 fortunes fortunes-min
  prometheus)

# tools/ci_sanitizers.sh: clang for the ASan/UBSan/libFuzzer build; dpkg-dev unpacks Debian's
# Abseil source for the TSan stage.
sanitizer_pkgs=(clang-14 libclang-rt-14-dev dpkg-dev)

pkgs=("${runtime_pkgs[@]}")
case "$want" in
  runtime) ;;
  build) pkgs+=("${build_pkgs[@]}") ;;
  all) pkgs+=("${build_pkgs[@]}" "${python_pkgs[@]}" "${sanitizer_pkgs[@]}") ;;
  *) echo "install_deps.sh: MODSERVE_DEPS must be runtime, build or all, got '$want'" >&2; exit 2 ;;
esac

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install_deps.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ "$want" = all ]; then
  # PyPI only for what Debian lacks: Hugging Face tokenizers (the reference BPE), safetensors
  # (an independent reader the tests check our own writer against), gguf (llama.cpp's own
  # GGUF reader and dequantizers, the same check for GGUF files and block layouts) and openai
  # (the OpenAI SDK, a third-party client of the HTTP API).
  # grpcio-tools for the Python client stubs comes with a protoc matching Debian's
  # python3-protobuf.
  if [ ! -x .venv/bin/python ]; then
    /usr/bin/python3 -m venv --system-site-packages .venv
  fi
  if ! .venv/bin/python -c "import tokenizers, safetensors, gguf, openai" 2>/dev/null; then
    .venv/bin/python -m pip install -q --disable-pip-version-check -r tools/requirements.txt
  fi
fi
echo "install_deps.sh: ok ($want)"
