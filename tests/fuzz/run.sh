#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan, no recovery) in their own build folder
# and runs each for a fixed time over its committed seed corpus; fails if any target crashes,
# leaks, times out or runs out of memory. It does not minimize corpora or commit anything.
#
#   tests/fuzz/run.sh [SECONDS_PER_TARGET (default 60)] [TARGET[=SECONDS] ...]
#
# A TARGET=SECONDS argument overrides the default for that target (tests/fuzz/run.sh 60
# request=120 checkpoint); with no TARGET every target runs for SECONDS_PER_TARGET. The planned
# total is printed before fuzzing starts.
#
# Environment: MODSERVE_FUZZ_BUILD_DIR (default build-fuzz), MODSERVE_FUZZ_JOBS (default nproc),
# MODSERVE_FUZZ_OUT (new corpus entries and crash files; default $build/fuzz-out).
# A crash leaves $out/<target>/crash-<sha1>; reproduce it with $build/bin/<target>_fuzzer FILE,
# then copy it to tests/fuzz/regressions/<target>/ so the replay test keeps it fixed.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds="${1:-60}"
shift || true
all=(checkpoint gguf config bpe_json tokenizer_encode tokenizer_decode detokenizer request
     openai_request jinja http_request)
if (($#)); then specs=("$@"); else specs=("${all[@]}"); fi
targets=()
declare -A secs
total=0
for spec in "${specs[@]}"; do
  t="${spec%%=*}"
  s="$seconds"
  [[ "$spec" == *=* ]] && s="${spec#*=}"
  if [[ ! " ${all[*]} " == *" $t "* ]] || [[ ! "$s" =~ ^[0-9]+$ ]]; then
    echo "run.sh: bad target '$spec' (targets: ${all[*]}; TARGET=SECONDS)" >&2
    exit 2
  fi
  targets+=("$t")
  secs[$t]="$s"
  total=$((total + s))
done
build="${MODSERVE_FUZZ_BUILD_DIR:-build-fuzz}"
jobs="${MODSERVE_FUZZ_JOBS:-$(nproc)}"
out="${MODSERVE_FUZZ_OUT:-$build/fuzz-out}"
cc="${CC:-clang-14}"
cxx="${CXX:-clang++-14}"
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMODSERVE_CUDA=OFF \
  -DMODSERVE_FUZZ=ON -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$build" -j "$jobs" --target modserve_fuzzers fuzz_regressions_test

# The committed inputs first: a regression here needs no fuzzing to show.
"$build/tests/fuzz_regressions_test" --gtest_brief=1

echo "== fuzzing ${#targets[@]} target(s), ${total}s in all"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=()
summary=()
for t in "${targets[@]}"; do
  mkdir -p "$out/$t/corpus"
  args=(-max_total_time="${secs[$t]}" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048
        -print_final_stats=1 -artifact_prefix="$out/$t/")
  case "$t" in
    config|bpe_json|checkpoint) args+=(-dict=tests/fuzz/dict/json.dict) ;;
    gguf) args+=(-dict=tests/fuzz/dict/gguf.dict) ;;
    request) args+=(-dict=tests/fuzz/dict/request.dict) ;;
    openai_request) args+=(-dict=tests/fuzz/dict/openai.dict) ;;
    jinja) args+=(-dict=tests/fuzz/dict/jinja.dict) ;;
    http_request) args+=(-dict=tests/fuzz/dict/http.dict) ;;
  esac
  case "$t" in
    bpe_json) args+=(-max_len=16384) ;;
    *) args+=(-max_len=4096) ;;
  esac
  echo "== $t (${secs[$t]}s)"
  log="$out/$t/fuzz.log"
  if "$build/bin/${t}_fuzzer" "${args[@]}" "$out/$t/corpus" "tests/fuzz/corpus/$t" >"$log" 2>&1; then
    status=ok
  else
    status=FAILED
    failed+=("$t")
    grep -E "ERROR|FUZZ_CHECK|SUMMARY|Test unit written" "$log" | head -20 || true
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E "^#[0-9]+" "$log" | tail -1 | grep -oE "cov: [0-9]+ ft: [0-9]+ corp: [0-9]+" || true)
  summary+=("$(printf '%-17s %-6s execs=%-9s exec/s=%-6s %s' "$t" "$status" "${execs:-?}" \
                "${rate:-?}" "$last")")
done
echo "== summary (log and crash files under $out/<target>/)"
printf '%s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
