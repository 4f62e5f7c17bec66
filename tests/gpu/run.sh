#!/usr/bin/env bash
# One-shot GPU check of the CUDA backend, meant for a single H200 in under 8 minutes:
#   1. build with CUDA (sm_90 only, to save time; CI builds 80;90)
#   2. backend conformance suite (RouteSelect included) + CUDA-only tests on the cuda backend
#   3. engine goldens on the cuda backend (engine_golden_test with MODSERVE_TEST_BACKEND=cuda)
#   4. batch invariance on cuda (EngineTest.BatchCompositionDoesNotChangeTokens)
#   5. compute-sanitizer memcheck on the conformance suite (cuda only) and on a short decode
#   6. benchmark: modserve-bench --backend cuda (the engine's one Transformer; device step and
#      decode graphs, then the same without graphs), table printed last
# Every stage prints PASS / FAIL / SKIP(reason); the script exits non-zero when any stage FAILs.
# Results (logs, summary.txt, bench.md) go to $OUT when it is set, else <build-dir>/gpu-run-out.
# Usage: tests/gpu/run.sh [build-dir]
#   env: JOBS, CUDA_ARCH, SKIP_BENCH=1, BENCH_ARGS (replaces the default benchmark flags below)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:-$ROOT/build-gpu}"
JOBS="${JOBS:-$(nproc)}"
CUDA_ARCH="${CUDA_ARCH:-90}"
RESULTS="${OUT:-$BUILD/gpu-run-out}"
LOG="$RESULTS/logs"
# Benchmark runs, one modserve-bench each (in this order, each under its own timeout): tinyllama
# dense + MoD at batch 1 / 8 / 64 with decode graphs (the default on cuda), the same with eager
# launches (--graphs off: graphs vs eager step time), then the 8B shape dense + MoD at batch 1 /
# 64. The synthetic
# checkpoints are written first (16 GB each for 8B, kept in the build dir), so a first run is the
# slowest. BENCH_ARGS, when set, replaces both with one run of those flags.
COMMON_BENCH="--contexts 1024 --steps 32 --prefill_reps 1 --kv_dtype bf16 --workdir $BUILD/bench-ckpts"
BENCH_RUNS=("--shapes tinyllama --variants dense,mod --batches 1,8,64 $COMMON_BENCH"
            "--shapes tinyllama --variants dense,mod --batches 1,8,64 --graphs off $COMMON_BENCH"
            "--shapes 8b --variants dense,mod --batches 1,64 $COMMON_BENCH")
[[ -n "${BENCH_ARGS:-}" ]] && BENCH_RUNS=("$BENCH_ARGS")
START=$(date +%s)
declare -a SUMMARY=()
FAILED=0
NO_DEVICE=0

stage() { echo; echo "=== [$(( $(date +%s) - START ))s] $*"; }
record() {  # record STAGE STATUS DETAIL
  SUMMARY+=("$(printf '%-28s %-5s %s' "$1" "$2" "$3")")
  echo "--> $1: $2 $3"
  [[ "$2" == FAIL ]] && FAILED=1
  return 0
}

stage "device"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "no GPU visible (nvidia-smi missing or failing); the CUDA tests would only skip"
  record device SKIP "no GPU visible"
  NO_DEVICE=1
else
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv
  record device PASS "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
fi
export PATH="/usr/local/cuda/bin:$PATH"

stage "build (CMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH, $JOBS jobs)"
mkdir -p "$BUILD" "$LOG"
TARGETS=(backend_conformance_test backend_cuda_test engine_golden_test modserve-generate
         modserve-bench modserve_backend_cuda_plugin)
if cmake -S "$ROOT" -B "$BUILD" -G Ninja -DMODSERVE_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" >"$BUILD/cmake.log" 2>&1 &&
   ninja -C "$BUILD" -j"$JOBS" "${TARGETS[@]}" >"$BUILD/ninja.log" 2>&1; then
  record build PASS "$(( $(date +%s) - START ))s"
else
  tail -40 "$BUILD/cmake.log" "$BUILD/ninja.log" 2>/dev/null
  record build FAIL "see $BUILD/ninja.log"
  printf '\n%s\n' "${SUMMARY[@]}" | tee "$RESULTS/summary.txt"
  exit 1
fi
T="$BUILD/tests"; B="$BUILD/bin"

stage "conformance suite on cuda"
if timeout 300 "$T/backend_conformance_test" --gtest_filter='AllBackends/*/Cuda' \
     >"$LOG/conformance.log" 2>&1; then
  if grep -q "SKIPPED" "$LOG/conformance.log"; then
    record conformance SKIP "$(grep -m1 -A1 'SKIPPED\|Skipped' "$LOG/conformance.log" | tail -1)"
  else
    record conformance PASS "$(grep -m1 'PASSED' "$LOG/conformance.log")"
  fi
else
  grep -E "Failure|FAILED|Expected|worst" "$LOG/conformance.log" | head -30
  record conformance FAIL "see $LOG/conformance.log"
fi

stage "CUDA-only tests"
if timeout 240 "$T/backend_cuda_test" >"$LOG/cuda_test.log" 2>&1; then
  record cuda_test PASS "$(grep -m1 'PASSED' "$LOG/cuda_test.log") $(grep -c '\[  SKIPPED \]' \
    "$LOG/cuda_test.log") skipped"
else
  grep -E "Failure|FAILED|Expected|worst" "$LOG/cuda_test.log" | head -30
  record cuda_test FAIL "see $LOG/cuda_test.log"
fi

stage "engine goldens on cuda"
if grep -q MODSERVE_TEST_BACKEND "$ROOT/tests/engine/engine_golden_test.cc"; then
  if MODSERVE_TEST_BACKEND=cuda timeout 300 "$T/engine_golden_test" \
       --gtest_filter='-EngineTest.BatchCompositionDoesNotChangeTokens' >"$LOG/goldens.log" 2>&1; then
    if grep -q 'unavailable' "$LOG/goldens.log"; then
      record goldens SKIP "backend cuda unavailable (see $LOG/goldens.log)"
    else
      record goldens PASS "engine_golden_test with MODSERVE_TEST_BACKEND=cuda, $(grep -c \
        '\[  SKIPPED \]' "$LOG/goldens.log") skipped"
    fi
  else
    grep -E "Failure|FAILED" "$LOG/goldens.log" | head -20
    record goldens FAIL "see $LOG/goldens.log"
  fi
else
  echo "SKIP engine_golden_test: it hard-codes the cpu backend (no MODSERVE_TEST_BACKEND);"
  echo "     comparing modserve-generate --backend cuda/cpu with the goldens' reference tokens"
  if ! command -v python3 >/dev/null 2>&1; then
    record goldens SKIP "engine_golden_test is cpu-only and python3 is missing for the fallback"
  elif python3 - "$ROOT" "$B/modserve-generate" >"$LOG/goldens.log" 2>&1 <<'PY'; then
import json, pathlib, subprocess, sys
root, gen = pathlib.Path(sys.argv[1]), sys.argv[2]
BACKEND = sys.argv[3] if len(sys.argv) > 3 else "cuda"
def run(backend, ckpt, case, n):
    cmd = [gen, "--model", str(root / ckpt), "--backend", backend, "--json", "--ignore_eos",
           "--max_new_tokens", str(n), "--threshold", str(case.get("threshold", -1)),
           "--prompt_ids", ",".join(map(str, case["prompt_ids"]))]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {out.stderr.strip()}")
    return json.loads(out.stdout)["token_ids"]
def prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
bad = 0; total = 0
for g in sorted((root / "tests/testdata/goldens").glob("*.json")):
    data = json.loads(g.read_text())
    if not (root / data["checkpoint"]).exists():
        print(f"SKIP {g.name}: {data['checkpoint']} not present"); continue
    n = int(data.get("new_tokens", 16))
    for case in data["cases"]:
        if "greedy_ids" not in case:
            continue
        total += 1
        want = case["greedy_ids"][:n]
        cuda = run(BACKEND, data["checkpoint"], case, n)
        pc = prefix(cuda, want)
        # A near-tie may legitimately diverge from the float64 reference; cuda must then agree
        # with the cpu backend at least as far as the cpu backend agrees with the reference.
        cpu = want if pc == len(want) else run("cpu", data["checkpoint"], case, n)
        pp = prefix(cpu, want)
        ok = pc == len(want) or prefix(cuda, cpu) >= pp
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {g.name}:{case.get('name')} cuda={pc}/{len(want)} "
              f"cpu={pp}/{len(want)} cuda~cpu={prefix(cuda, cpu)}")
print(f"{total - bad}/{total} golden cases agree")
sys.exit(1 if bad or total == 0 else 0)
PY
    record goldens PASS "$(tail -1 "$LOG/goldens.log") (modserve-generate fallback)"
  else
    grep -E "FAIL|Error|error" "$LOG/goldens.log" | head -20
    record goldens FAIL "see $LOG/goldens.log"
  fi
fi

stage "batch invariance on cuda"
if MODSERVE_TEST_BACKEND=cuda timeout 240 "$T/engine_golden_test" \
     --gtest_filter='EngineTest.BatchCompositionDoesNotChangeTokens' >"$LOG/batch_invariance.log" 2>&1; then
  if grep -q '\[  SKIPPED \]' "$LOG/batch_invariance.log"; then
    record batch_invariance SKIP "$(grep -m1 -A1 'Skipped' "$LOG/batch_invariance.log" | tail -1)"
  else
    record batch_invariance PASS "8 requests alone vs together, tokens and routing equal"
  fi
else
  grep -E "Failure|FAILED|Expected|Which is" "$LOG/batch_invariance.log" | head -20
  record batch_invariance FAIL "see $LOG/batch_invariance.log"
fi

stage "compute-sanitizer memcheck on the conformance suite (cuda)"
SAN="$(command -v compute-sanitizer || true)"
if [[ -z "$SAN" ]]; then
  record memcheck_conformance SKIP "compute-sanitizer not found"
elif timeout 300 "$SAN" --tool memcheck --error-exitcode 3 \
       "$T/backend_conformance_test" --gtest_filter='AllBackends/*/Cuda' \
       >"$LOG/memcheck_conformance.log" 2>&1; then
  record memcheck_conformance PASS "$(grep -m1 'ERROR SUMMARY' "$LOG/memcheck_conformance.log")"
else
  grep -E "Invalid|ERROR SUMMARY|FAILED" "$LOG/memcheck_conformance.log" | head -20
  record memcheck_conformance FAIL "see $LOG/memcheck_conformance.log"
fi

stage "compute-sanitizer memcheck on a short decode"
CKPT="$ROOT/tests/testdata/checkpoints/router_sigmoid_blockout_ln_bias"
if [[ -z "$SAN" ]]; then
  record memcheck SKIP "compute-sanitizer not found"
elif [[ ! -d "$CKPT" ]]; then
  record memcheck SKIP "$CKPT not present"
elif timeout 240 "$SAN" --tool memcheck --error-exitcode 3 --leak-check full \
       "$B/modserve-generate" --model "$CKPT" --backend cuda --prompt_ids 1,5,9,14,3,7 \
       --max_new_tokens 8 --ignore_eos --json >"$LOG/memcheck.log" 2>&1; then
  record memcheck PASS "$(grep -m1 'ERROR SUMMARY' "$LOG/memcheck.log")"
else
  tail -30 "$LOG/memcheck.log"
  record memcheck FAIL "see $LOG/memcheck.log"
fi

stage "benchmarks"
BENCH_TABLE=""
if [[ "${SKIP_BENCH:-0}" == 1 ]]; then
  record bench SKIP "SKIP_BENCH=1"
else
  : >"$RESULTS/bench.md"
  BENCH_OK=1
  for args in "${BENCH_RUNS[@]}"; do
    echo "modserve-bench --backend cuda $args"
    # shellcheck disable=SC2086  # the flags are meant to split
    timeout 240 "$B/modserve-bench" --backend cuda $args >>"$LOG/bench.log" 2>>"$LOG/bench.err"
    rc=$?
    if [[ $rc != 0 ]]; then
      BENCH_OK=0
      echo "modserve-bench $args: exit $rc" >>"$LOG/bench.err"
    fi
  done
  cp "$LOG/bench.log" "$RESULTS/bench.md"
  BENCH_TABLE="$(cat "$LOG/bench.log")"
fi
if [[ "${SKIP_BENCH:-0}" == 1 ]]; then
  :
elif [[ "$NO_DEVICE" == 1 ]]; then
  record bench SKIP "$(grep -m1 'modserve-bench:' "$LOG/bench.err")"
elif [[ "$BENCH_OK" == 1 ]]; then
  record bench PASS "$(( $(date +%s) - START ))s elapsed"
else
  tail -20 "$LOG/bench.err"
  record bench FAIL "see $LOG/bench.err"
fi

{
  echo "=== summary ($(( $(date +%s) - START ))s, $(date -u +%Y-%m-%dT%H:%MZ))"
  printf '%s\n' "${SUMMARY[@]}"
} | tee "$RESULTS/summary.txt"
if [[ -n "$BENCH_TABLE" ]]; then
  echo "$BENCH_TABLE"
fi
exit $FAILED
