#!/usr/bin/env bash
# One-shot GPU check of the CUDA backend, meant for a single H200 in under 8 minutes:
#   1. build with CUDA (sm_90 only, to save time; CI builds 80;90)
#   2. backend conformance suite + CUDA-only tests on the cuda backend
#   3. engine goldens on the cuda backend (the golden test when it honours MODSERVE_TEST_BACKEND,
#      otherwise modserve-generate --backend cuda against the goldens' reference tokens)
#   4. compute-sanitizer memcheck on a short decode
#   5. benchmarks (modserve-cuda-bench), whose table is printed last
# Every stage prints PASS / FAIL / SKIP(reason); the script exits non-zero when any stage FAILs.
# Usage: tests/gpu/run.sh [build-dir]   (env: JOBS, CUDA_ARCH, BENCH_ARGS, SKIP_BENCH=1)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:-$ROOT/build-gpu}"
JOBS="${JOBS:-$(nproc)}"
CUDA_ARCH="${CUDA_ARCH:-90}"
LOG="$BUILD/gpu-run-logs"
START=$(date +%s)
declare -a SUMMARY=()
FAILED=0

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
else
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv
  record device PASS "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
fi
export PATH="/usr/local/cuda/bin:$PATH"

stage "build (CMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH, $JOBS jobs)"
mkdir -p "$BUILD"
TARGETS=(backend_conformance_test backend_cuda_test engine_golden_test modserve-generate
         modserve-cuda-bench)
if cmake -S "$ROOT" -B "$BUILD" -G Ninja -DMODSERVE_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" >"$BUILD/cmake.log" 2>&1 &&
   ninja -C "$BUILD" -j"$JOBS" "${TARGETS[@]}" >"$BUILD/ninja.log" 2>&1; then
  record build PASS "$(( $(date +%s) - START ))s"
else
  tail -40 "$BUILD/cmake.log" "$BUILD/ninja.log" 2>/dev/null
  record build FAIL "see $BUILD/ninja.log"
  printf '\n%s\n' "${SUMMARY[@]}"
  exit 1
fi
mkdir -p "$LOG"
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
  if MODSERVE_TEST_BACKEND=cuda timeout 300 "$T/engine_golden_test" >"$LOG/goldens.log" 2>&1; then
    record goldens PASS "engine_golden_test with MODSERVE_TEST_BACKEND=cuda"
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

stage "compute-sanitizer memcheck on a short decode"
SAN="$(command -v compute-sanitizer || true)"
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
elif timeout 300 "$B/modserve-cuda-bench" ${BENCH_ARGS:-} >"$LOG/bench.log" 2>"$LOG/bench.err"; then
  BENCH_TABLE="$(cat "$LOG/bench.log")"
  record bench PASS "$(( $(date +%s) - START ))s elapsed"
else
  tail -20 "$LOG/bench.err"
  record bench FAIL "see $LOG/bench.err"
fi

echo
echo "=== summary ($(( $(date +%s) - START ))s, $(date -u +%Y-%m-%dT%H:%MZ))"
printf '%s\n' "${SUMMARY[@]}"
if [[ -n "$BENCH_TABLE" ]]; then
  echo "$BENCH_TABLE"
fi
exit $FAILED
