#!/usr/bin/env bash
# The sanitizer stages. (1) quick (what CI runs, about 10 minutes on 2 cores): a clang-14
# ASan + UBSan + LeakSanitizer build of the memory-owning engine units (KV cache, prefix cache,
# scheduler, step loop, engine, speculative decoding, thread pool, the AMX Gemm's packing on its
# tile model), the in-process gRPC and HTTP
# server tests (request validation, streams, cancellation, TLS, tokens, limits, HTTP framing and
# the OpenAI endpoints) and the fuzz corpus replay, which runs every committed fuzz input
# through its target. (2) asan: the same build of
# everything, which runs the unit, integration and chaos suites and then every fuzz target under
# libFuzzer. (3) tsan: a gcc TSan build of the threaded units (thread pool, scheduler, step loop,
# and the in-process server and security tests) against Abseil and gRPC built from Debian's own
# sources with -fsanitize=thread (about 7 minutes the first time). asan and tsan together take
# about 50 minutes on 2 cores, too long for CI: run them before landing changes to threaded,
# parsing or memory-owning code.
# All build at -O1 with line tables only; the CMakePresets.json presets build the same code at
# -O2 with full debug info for local debugging.
#
#   bash tools/ci_sanitizers.sh [quick] [asan] [tsan]     (default: asan tsan)
#
# Environment: MODSERVE_FUZZ_SECONDS (per target, default 30), MODSERVE_JOBS (default nproc).
# Build folders: build-ci-asan (quick and asan), build-ci-tsan, build-ci-tsan-abseil,
# build-ci-tsan-grpc, build-ci-debian-src. Prints each stage's duration.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${MODSERVE_JOBS:-$(nproc)}"
fuzz_seconds="${MODSERVE_FUZZ_SECONDS:-30}"
fast="-O1 -g1"
stages=("$@")
((${#stages[@]})) || stages=(asan tsan)

stamp() { date +%s; }
report() { echo "== $1: $(( $(stamp) - $2 )) s"; }

asan_build=build-ci-asan
asan_env=(ASAN_OPTIONS="detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1"
          UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")

asan_configure() {
  # The flags tests/fuzz/run.sh configures with, so its own configure step changes nothing.
  local flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
  cmake -S . -B "$asan_build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMODSERVE_CUDA=OFF \
    -DMODSERVE_FUZZ=ON -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="$fast" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$fast" >/dev/null
}

# The units whose code owns memory across requests, the in-process gRPC and HTTP servers (where
# hostile input arrives), and every committed fuzz input.
quick_tests=(fuzz_regressions_test block_pool_test block_table_test kv_cache_manager_test
  prefix_cache_test scheduler_test backend_thread_pool_test backend_amx_gemm_test step_loop_test
  engine_test device_step_test
  prefix_cache_engine_test speculative_decoding_test request_validation_test server_test
  security_test http_parse_test http_server_test http_api_test)
# Left to tools/test.sh's release run: tests that take a minute or more at -O1 with ASan and add
# no code path the others miss (the two on SmolLM2-135M, the 1,200-seed sampling comparison).
declare -A quick_filters=(
  [speculative_decoding_test]="-*RealMoDModel*:*RowInvariantRange*:*EngineSamplesTheDistribution*")

quick() {
  local t0 build=$asan_build
  t0=$(stamp)
  asan_configure
  cmake --build "$build" -j "$jobs" --target "${quick_tests[@]}"
  report "asan+ubsan build (quick)" "$t0"
  t0=$(stamp)
  local failed=0 t
  for t in "${quick_tests[@]}"; do
    if ! env "${asan_env[@]}" "$build/tests/$t" --gtest_brief=1 \
        --gtest_filter="${quick_filters[$t]:-*}" >"$build/$t.log" 2>&1; then
      echo "ci_sanitizers.sh: $t failed under ASan/UBSan:" >&2
      tail -n 80 "$build/$t.log" >&2
      failed=1
    else
      echo "$t: $(grep -E '^\[  PASSED  \]' "$build/$t.log" || echo passed)"
    fi
  done
  report "asan+ubsan tests (quick)" "$t0"
  return "$failed"
}

asan() {
  local t0 build=$asan_build
  t0=$(stamp)
  asan_configure
  cmake --build "$build" -j "$jobs"
  report "asan+ubsan build" "$t0"

  t0=$(stamp)
  env "${asan_env[@]}" ctest --test-dir "$build" --output-on-failure -j "$jobs" -L "cpu|integration|chaos" \
      -LE "slow|cuda" --timeout 900
  # The pytest suites that drive built binaries (hostile checkpoints, deploy configs against a
  # live server) also run against the sanitized binaries.
  MODSERVE_BUILD_DIR="$build" .venv/bin/python -m pytest -q \
    tests/python/test_hostile_checkpoints.py tests/python/test_deploy.py
  report "asan+ubsan tests" "$t0"

  t0=$(stamp)
  MODSERVE_FUZZ_BUILD_DIR="$build" MODSERVE_FUZZ_JOBS="$jobs" \
    CC=clang-14 CXX=clang++-14 bash tests/fuzz/run.sh "$fuzz_seconds"
  report "fuzz (${fuzz_seconds} s per target)" "$t0"
}

# Unpacks Debian's source of the installed version of binary package $2 (source package $1) into
# $3/src, through a deb-src list kept in build-ci-debian-src (fetched once per build folder).
debian_source() {
  local source_pkg=$1 binary_pkg=$2 dir=$3 lists="$PWD/build-ci-debian-src"
  local apt=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$lists/sources"
             -o "Dir::State::Lists=$lists/lists")
  if [ ! -e "$lists/updated" ]; then
    mkdir -p "$lists/lists/partial" "$lists/sources"
    cat >"$lists/sources/debian-src.sources" <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    apt-get "${apt[@]}" update >/dev/null
    touch "$lists/updated"
  fi
  local version
  version=$(dpkg-query -W -f '${source:Version}' "$binary_pkg")
  mkdir -p "$dir"
  (cd "$dir" && apt-get "${apt[@]}" source --download-only "$source_pkg=$version" >/dev/null 2>&1 &&
     dpkg-source -x "${source_pkg}"_*.dsc src >/dev/null)
}

# Debian's Abseil is not instrumented, and TSan cannot see the happens-before edges of an
# uninstrumented absl::Mutex (every guarded field would look racy). So this stage builds Debian's
# own Abseil source (same version, same inline namespace) with -fsanitize=thread, about 1 minute,
# and runs the tests with it in LD_LIBRARY_PATH. Needs dpkg-dev (build-essential).
tsan_abseil() {
  local root=build-ci-tsan-abseil
  if compgen -G "$root/lib/libabsl_synchronization.so.*" >/dev/null; then return; fi
  debian_source abseil libabsl-dev "$root"
  cmake -S "$root/src" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON -DBUILD_TESTING=OFF \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$fast" >/dev/null
  cmake --build "$root/build" -j "$jobs"
  mkdir -p "$root/lib"
  find "$root/build" -name "libabsl_*.so*" -exec cp -P {} "$root/lib/" \;
}

# Debian's gRPC is not instrumented either: every operation that one thread starts and a gRPC
# thread completes (a StartWrite on the reply thread) would be reported as a race inside gRPC,
# and suppressing those by frame would hide races in our reactors too. So it is built from the
# source of the installed version as well (about 6 minutes).
tsan_grpc() {
  local root=build-ci-tsan-grpc
  if compgen -G "$root/lib/libgrpc++.so.*" >/dev/null; then return; fi
  debian_source grpc libgrpc++-dev "$root"
  local protoc_lib
  protoc_lib=$(ls /usr/lib/*/libprotoc.so.* | head -1)
  cmake -S "$root/src" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON -DgRPC_BUILD_TESTS=OFF \
    -DgRPC_ABSL_PROVIDER=package -DgRPC_CARES_PROVIDER=package -DgRPC_PROTOBUF_PROVIDER=package \
    -DgRPC_RE2_PROVIDER=package -DgRPC_SSL_PROVIDER=package -DgRPC_ZLIB_PROVIDER=package \
    -DgRPC_BACKWARDS_COMPATIBILITY_MODE=OFF -DProtobuf_PROTOC_LIBRARY="$protoc_lib" \
    -DCMAKE_C_FLAGS="-fsanitize=thread" -DCMAKE_CXX_FLAGS="-fsanitize=thread" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread -Wl,--as-needed" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="$fast" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$fast" >/dev/null
  # --as-needed: libgrpc++ uses no protobuf symbols, and a libprotobuf.so loaded beside our
  # static copy (proto/CMakeLists.txt says why it is static) crashes the process.
  cmake --build "$root/build" -j "$jobs" --target grpc grpc++ gpr
  if objdump -p "$root"/build/libgrpc++.so.* | grep -q "NEEDED.*libprotobuf"; then
    echo "ci_sanitizers.sh: the TSan libgrpc++ still needs libprotobuf.so" >&2
    exit 1
  fi
  mkdir -p "$root/lib"
  find "$root/build" -maxdepth 1 -name "lib*.so*" -exec cp -P {} "$root/lib/" \;
}

tsan() {
  local t0 build=build-ci-tsan
  t0=$(stamp)
  tsan_abseil
  tsan_grpc
  report "tsan abseil + grpc" "$t0"
  t0=$(stamp)
  cmake --preset tsan -B "$build" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="$fast" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$fast" >/dev/null
  cmake --build "$build" -j "$jobs" --target backend_thread_pool_test scheduler_test \
    step_loop_test server_test security_test http_server_test http_api_test
  report "tsan build" "$t0"
  t0=$(stamp)
  LD_LIBRARY_PATH="$PWD/build-ci-tsan-grpc/lib:$PWD/build-ci-tsan-abseil/lib" \
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp" \
    ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 900 \
      -R "^(ThreadPoolTest|SchedulerTest|StepLoopTest|ServerTest|ServerSecurityTest|HttpServerTest|HttpApiTest)\\."
  report "tsan tests" "$t0"
}

for stage in "${stages[@]}"; do
  case "$stage" in
    quick) quick ;;
    asan) asan ;;
    tsan) tsan ;;
    *) echo "ci_sanitizers.sh: unknown stage '$stage' (quick, asan, tsan)" >&2; exit 2 ;;
  esac
done
