#!/usr/bin/env bash
# One-shot GPU check of the CUDA backend, meant for a single H200 in under 8 minutes:
#   1. build with CUDA (sm_90 only, to save time; CI builds 80;90), or unpack a prebuilt tarball
#      (MODSERVE_GPU_PREBUILT, made by tests/gpu/pack.sh) on a machine without the build's
#      libraries
#   2. smoke: modserve-generate on models/demo, cuda against cpu
#   3. backend conformance suite (RouteSelect included), again with the older attention kernel
#      (MODSERVE_CUDA_ATTENTION=warp), + CUDA-only tests on the cuda backend
#   4. engine goldens on the cuda backend (engine_golden_test with MODSERVE_TEST_BACKEND=cuda)
#   5. batch invariance on cuda (EngineTest.BatchCompositionDoesNotChangeTokens)
#   6. benchmark: modserve-cuda-gemv-bench (the decode GEMV's launch shapes against the copy
#      bandwidth), then modserve-bench --backend cuda (the engine's one Transformer; device step
#      and decode graphs, then the same without graphs), table printed last
#   7. with OP_TIMES_ARGS set: modserve-bench $OP_TIMES_ARGS with MODSERVE_CUDA_OP_TIMES=1 (GPU
#      time per op and shape, op_times.md)
#   8. with NCU_KERNELS set: an Nsight Compute profile of those kernels' decode launches (ncu.txt)
#   9. compute-sanitizer memcheck on the conformance suite (cuda only) and on a short decode
# Every stage prints PASS / FAIL / SKIP(reason); the script exits non-zero when any stage FAILs.
# Stages that would not fit in what is left of BUDGET_S (default 470 s) are skipped, so the
# summary and the table always come back.
# Results go to $OUT when it is set, else <build-dir>/gpu-run-out: summary.txt, bench.md,
# gemv_bench.md, op_times.md, ncu.txt and logs.tar.gz (every stage's log; rewritten after each
# stage): at most 8 files, what a lent device machine returns.
# Usage: tests/gpu/run.sh [build-dir]
#   env: JOBS, CUDA_ARCH, SKIP_BENCH=1, BENCH_ARGS (replaces the default benchmark flags below),
#        MODSERVE_GPU_PREBUILT (tarball from tests/gpu/pack.sh), BUDGET_S, OP_TIMES_ARGS,
#        NCU_KERNELS (+ NCU_SKIP, NCU_COUNT)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:-$ROOT/build-gpu}"
JOBS="${JOBS:-$(nproc)}"
CUDA_ARCH="${CUDA_ARCH:-90}"
RESULTS="${OUT:-$BUILD/gpu-run-out}"
LOG="$BUILD/gpu-run-logs"
BUDGET_S="${BUDGET_S:-470}"
# Benchmark runs, one modserve-bench each (in this order, each under its own timeout): tinyllama
# dense + MoD at batch 1 / 8 / 64 with decode graphs (the default on cuda), the same with eager
# launches (--graphs off: graphs vs eager step time), then the 8B shape dense + MoD at batch 1 /
# 64. The synthetic
# checkpoints are written first (16 GB each for 8B, kept in the build dir), so a first run is the
# slowest. BENCH_ARGS, when set, replaces both with one run of those flags.
# The checkpoints (36 GB in all) go to /dev/shm when it has room: writing and mapping them there
# costs seconds, not the minutes of a disk.
CKPTS="$BUILD/bench-ckpts"
if [[ "$(df -k --output=avail /dev/shm 2>/dev/null | tail -1)" -gt 42000000 ]] 2>/dev/null; then
  CKPTS=/dev/shm/modserve-bench-ckpts
fi
COMMON_BENCH="--contexts 1024 --steps 32 --prefill_reps 1 --kv_dtype bf16 --workdir $CKPTS"
BENCH_RUNS=("--shapes tinyllama --variants dense,mod --batches 1,8,64 $COMMON_BENCH"
            "--shapes 8b --variants dense,mod --batches 1,64 $COMMON_BENCH"
            "--shapes tinyllama --variants dense,mod --batches 1,8,64 --graphs off $COMMON_BENCH")
BENCH_LIMITS=(150 200 100)
[[ -n "${BENCH_ARGS:-}" ]] && BENCH_RUNS=("$BENCH_ARGS") && BENCH_LIMITS=(300)
START=$(date +%s)
declare -a SUMMARY=()
FAILED=0
NO_DEVICE=0

stage() { echo; echo "=== [$(( $(date +%s) - START ))s] $*"; }
save_logs() { tar -C "$LOG" -czf "$RESULTS/logs.tar.gz" . 2>/dev/null; }
record() {  # record STAGE STATUS DETAIL
  SUMMARY+=("$(printf '%-28s %-5s %s' "$1" "$2" "$3")")
  echo "--> $1: $2 $3"
  [[ "$2" == FAIL ]] && FAILED=1
  save_logs
  return 0
}
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
# fits NAME SECONDS: true when SECONDS fit in what is left; else records NAME as skipped.
fits() {
  if (( $(left) < $2 )); then record "$1" SKIP "needs ${2}s, $(left)s of BUDGET_S left"; return 1; fi
}
# limit SECONDS: the timeout of a stage, cut to what is left (at least 10 s).
limit() { local l=$(( $(left) - 5 )); (( l > $1 )) && l=$1; (( l < 10 )) && l=10; echo "$l"; }
mkdir -p "$RESULTS" "$LOG"

stage "device"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "no GPU visible (nvidia-smi missing or failing); the CUDA tests would only skip"
  record device SKIP "no GPU visible"
  NO_DEVICE=1
else
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv
  nvidia-smi | tee "$LOG/nvidia-smi.txt" | head -12
  record device PASS "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), \
$(nvidia-smi | grep -o 'CUDA Version: [0-9.]*' | head -1)"
fi
export PATH="/usr/local/cuda/bin:$PATH"

TARGETS=(backend_conformance_test backend_cuda_test engine_golden_test modserve-generate
         modserve-bench modserve-cuda-gemv-bench modserve_backend_cuda_plugin)
if [[ -n "${MODSERVE_GPU_PREBUILT:-}" ]]; then
  stage "unpack $MODSERVE_GPU_PREBUILT"
  mkdir -p "$BUILD"
  if tar -C "$BUILD" -xJf "$MODSERVE_GPU_PREBUILT" 2>"$LOG/unpack.log" ||
     python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
       "$MODSERVE_GPU_PREBUILT" "$BUILD" 2>>"$LOG/unpack.log"; then
    # The tests read testdata through the source and build paths they were compiled with.
    for pair in "source_dir.txt:$ROOT" "binary_dir.txt:$BUILD"; do
      baked="$(cat "$BUILD/${pair%%:*}")"; here="${pair#*:}"
      if [[ "$baked" != "$here" && ! -e "$baked" ]]; then
        mkdir -p "$(dirname "$baked")" && ln -s "$here" "$baked"
      fi
    done
    # cuBLAS (and the driver) come from the machine: the toolkit's lib dirs, or pip's wheels.
    CUDA_LIBS=""
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
             $(python3 -c 'import nvidia, os; [print(os.path.join(p, q, "lib")) for p in
                 nvidia.__path__ for q in os.listdir(p)]' 2>/dev/null); do
      [[ -e "$d/libcublas.so.13" ]] && CUDA_LIBS="$CUDA_LIBS:$d"
    done
    export LD_LIBRARY_PATH="$BUILD/deps$CUDA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    for p in "$BUILD"/bin/* "$BUILD"/tests/* "$BUILD"/lib/*.so; do
      echo "== $p"; ldd "$p"
    done >"$LOG/ldd.log" 2>&1
    if ! grep -q "not found" "$LOG/ldd.log"; then
      record build PASS "prebuilt $(basename "$MODSERVE_GPU_PREBUILT"), $(( $(date +%s) - START ))s"
    else
      grep -E "^==|not found" "$LOG/ldd.log"
      record build FAIL "prebuilt programs miss libraries (see ldd.log)"
    fi
  else
    cat "$LOG/unpack.log"
    record build FAIL "cannot unpack $MODSERVE_GPU_PREBUILT"
  fi
else
  stage "build (CMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH, $JOBS jobs)"
  mkdir -p "$BUILD"
  if cmake -S "$ROOT" -B "$BUILD" -G Ninja -DMODSERVE_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" >"$LOG/cmake.log" 2>&1 &&
     ninja -C "$BUILD" -j"$JOBS" "${TARGETS[@]}" >"$LOG/ninja.log" 2>&1; then
    record build PASS "$(( $(date +%s) - START ))s"
  else
    tail -40 "$LOG/cmake.log" "$LOG/ninja.log" 2>/dev/null
    record build FAIL "see ninja.log"
  fi
fi
if [[ "$FAILED" == 1 ]]; then
  printf '\n%s\n' "${SUMMARY[@]}" | tee "$RESULTS/summary.txt"
  exit 1
fi
T="$BUILD/tests"; B="$BUILD/bin"

# gtest_result LOG: "N passed, M skipped" of a gtest run.
gtest_result() {
  echo "$(grep -c '^\[       OK \]' "$1") passed, $(grep -c '^\[  SKIPPED \] .* (' "$1") skipped"
}

stage "smoke: modserve-generate on models/demo, cuda against cpu"
SMOKE=(--model "$ROOT/models/demo" --prompt "Once upon a time" --max_new_tokens 24 --ignore_eos --json)
if [[ "$NO_DEVICE" == 1 ]]; then
  record smoke SKIP "no GPU visible"
elif timeout "$(limit 60)" "$B/modserve-generate" --backend cuda "${SMOKE[@]}" >"$LOG/smoke_cuda.json" \
     2>"$LOG/smoke.log" &&
   timeout "$(limit 60)" "$B/modserve-generate" --backend cpu "${SMOKE[@]}" >"$LOG/smoke_cpu.json" \
     2>>"$LOG/smoke.log"; then
  if python3 - "$LOG/smoke_cuda.json" "$LOG/smoke_cpu.json" >>"$LOG/smoke.log" 2>&1 <<'PY'; then
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
print("cuda", a["token_ids"]); print("cpu ", b["token_ids"])
print("routing equal:", a.get("routing") == b.get("routing"))
print("max |logprob diff|:", max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"])))
sys.exit(0 if a["token_ids"] == b["token_ids"] else 1)
PY
    record smoke PASS "$(tail -1 "$LOG/smoke.log")"
  else
    cat "$LOG/smoke.log"
    record smoke FAIL "cuda tokens differ from cpu (see smoke.log)"
  fi
else
  tail -20 "$LOG/smoke.log"
  record smoke FAIL "modserve-generate --backend cuda failed (see smoke.log)"
fi

stage "conformance suite on cuda"
if timeout "$(limit 120)" "$T/backend_conformance_test" --gtest_filter='AllBackends/*/Cuda' \
     >"$LOG/conformance.log" 2>&1; then
  if ! grep -q '^\[       OK \]' "$LOG/conformance.log"; then
    record conformance SKIP "$(grep -m1 -A1 'SKIPPED\|Skipped' "$LOG/conformance.log" | tail -1)"
  else
    record conformance PASS "$(gtest_result "$LOG/conformance.log")"
  fi
else
  grep -E "Failure|FAILED|Expected|Which is|worst|error" "$LOG/conformance.log" | head -40
  record conformance FAIL "$(gtest_result "$LOG/conformance.log") (see conformance.log)"
fi

stage "conformance suite on cuda, the warp-per-entry attention kernel (MODSERVE_CUDA_ATTENTION=warp)"
if MODSERVE_CUDA_ATTENTION=warp timeout "$(limit 120)" "$T/backend_conformance_test" \
     --gtest_filter='AllBackends/*/Cuda' >"$LOG/conformance_warp.log" 2>&1; then
  record conformance_warp PASS "$(gtest_result "$LOG/conformance_warp.log")"
else
  grep -E "Failure|FAILED|Expected|Which is|worst|error" "$LOG/conformance_warp.log" | head -20
  record conformance_warp FAIL "$(gtest_result "$LOG/conformance_warp.log") (see conformance_warp.log)"
fi

stage "CUDA-only tests"
if timeout "$(limit 120)" "$T/backend_cuda_test" >"$LOG/cuda_test.log" 2>&1; then
  record cuda_test PASS "$(gtest_result "$LOG/cuda_test.log")"
else
  grep -E "Failure|FAILED|Expected|Which is|worst|error" "$LOG/cuda_test.log" | head -40
  record cuda_test FAIL "$(gtest_result "$LOG/cuda_test.log") (see cuda_test.log)"
fi

stage "engine goldens on cuda"
if grep -q MODSERVE_TEST_BACKEND "$ROOT/tests/engine/engine_golden_test.cc"; then
  if MODSERVE_TEST_BACKEND=cuda timeout "$(limit 120)" "$T/engine_golden_test" \
       --gtest_filter='-EngineTest.BatchCompositionDoesNotChangeTokens' >"$LOG/goldens.log" 2>&1; then
    if grep -q 'unavailable' "$LOG/goldens.log"; then
      record goldens SKIP "backend cuda unavailable (see goldens.log)"
    else
      record goldens PASS "engine_golden_test with MODSERVE_TEST_BACKEND=cuda, $(grep -c \
        '\[  SKIPPED \]' "$LOG/goldens.log") skipped"
    fi
  else
    grep -E "Failure|FAILED" "$LOG/goldens.log" | head -20
    record goldens FAIL "see goldens.log"
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
    record goldens FAIL "see goldens.log"
  fi
fi

stage "batch invariance on cuda"
if MODSERVE_TEST_BACKEND=cuda timeout "$(limit 120)" "$T/engine_golden_test" \
     --gtest_filter='EngineTest.BatchCompositionDoesNotChangeTokens' >"$LOG/batch_invariance.log" 2>&1; then
  if grep -q '\[  SKIPPED \]' "$LOG/batch_invariance.log"; then
    record batch_invariance SKIP "$(grep -m1 -A1 'Skipped' "$LOG/batch_invariance.log" | tail -1)"
  else
    record batch_invariance PASS "8 requests alone vs together, tokens and routing equal"
  fi
else
  grep -E "Failure|FAILED|Expected|Which is" "$LOG/batch_invariance.log" | head -20
  record batch_invariance FAIL "see batch_invariance.log"
fi

stage "decode GEMV launch shapes"
if [[ "${SKIP_BENCH:-0}" == 1 ]]; then
  record gemv_bench SKIP "SKIP_BENCH=1"
elif [[ "$NO_DEVICE" == 1 ]]; then
  record gemv_bench SKIP "no GPU visible"
elif fits gemv_bench 30; then
  if timeout "$(limit 90)" "$B/modserve-cuda-gemv-bench" >"$LOG/gemv_bench.md" 2>&1; then
    cp "$LOG/gemv_bench.md" "$RESULTS/gemv_bench.md"
    record gemv_bench PASS "gemv_bench.md"
  else
    tail -5 "$LOG/gemv_bench.md"
    record gemv_bench FAIL "see gemv_bench.md"
  fi
fi

stage "benchmarks (checkpoints in $CKPTS)"
BENCH_TABLE=""
if [[ "${SKIP_BENCH:-0}" == 1 ]]; then
  record bench SKIP "SKIP_BENCH=1"
else
  : >"$LOG/bench.log"
  BENCH_OK=1
  for i in "${!BENCH_RUNS[@]}"; do
    args="${BENCH_RUNS[$i]}"
    fits "bench run $((i + 1))" 45 || continue
    echo "[$(( $(date +%s) - START ))s] modserve-bench --backend cuda $args" | tee -a "$LOG/bench.err"
    # shellcheck disable=SC2086  # the flags are meant to split
    timeout "$(limit "${BENCH_LIMITS[$i]}")" "$B/modserve-bench" --backend cuda $args \
      >>"$LOG/bench.log" 2>>"$LOG/bench.err"
    rc=$?
    if [[ $rc != 0 ]]; then
      BENCH_OK=0
      echo "modserve-bench $args: exit $rc" | tee -a "$LOG/bench.err"
    fi
    cp "$LOG/bench.log" "$RESULTS/bench.md"
    save_logs
  done
  BENCH_TABLE="$(cat "$LOG/bench.log")"
  if [[ "$NO_DEVICE" == 1 ]]; then
    record bench SKIP "$(grep -m1 'modserve-bench:' "$LOG/bench.err")"
  elif [[ "$BENCH_OK" == 1 ]]; then
    record bench PASS "$(( $(date +%s) - START ))s elapsed"
  else
    tail -20 "$LOG/bench.err"
    record bench FAIL "see bench.err"
  fi
fi

if [[ -n "${OP_TIMES_ARGS:-}" ]] && fits op_times 40; then
  stage "op times: modserve-bench --backend cuda $OP_TIMES_ARGS"
  # shellcheck disable=SC2086  # the flags are meant to split
  if MODSERVE_CUDA_OP_TIMES=1 timeout "$(limit 150)" "$B/modserve-bench" --backend cuda \
       $OP_TIMES_ARGS >"$LOG/op_times.md" 2>&1; then
    record op_times PASS "op_times.md"
  else
    tail -5 "$LOG/op_times.md"
    record op_times FAIL "see op_times.md"
  fi
  cp "$LOG/op_times.md" "$RESULTS/op_times.md"
fi

# NCU_KERNELS=<regex> profiles NCU_COUNT (default 4) launches of the matching kernels with Nsight
# Compute (counters; it works on Firecracker machines, not gVisor) in an 8b dense batch-64 run at
# context 1024: speed of light, occupancy, warp stall reasons and memory workload, into ncu.txt.
# NCU_SKIP (default 4128) skips the prefill's launches of a once-per-layer kernel (128 chunks of
# 512 rows x 32 layers) and the first decode step's, so the default lands on decode launches.
if [[ -n "${NCU_KERNELS:-}" ]] && fits ncu 60; then
  stage "ncu: kernels matching ${NCU_KERNELS}"
  NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true)"
  if [[ -z "$NCU" ]]; then
    record ncu SKIP "ncu not found"
  elif timeout "$(limit 240)" "$NCU" --clock-control none -k "regex:${NCU_KERNELS}" \
         --launch-skip "${NCU_SKIP:-4128}" --launch-count "${NCU_COUNT:-4}" \
         --section SpeedOfLight --section Occupancy --section WarpStateStats \
         --section MemoryWorkloadAnalysis --section LaunchStats \
         "$B/modserve-bench" --backend cuda --shapes 8b --variants dense --batches 64 \
         --contexts 1024 --steps 2 --prefill_reps 1 --graphs off --kv_dtype bf16 \
         --workdir "$CKPTS" >"$LOG/ncu.txt" 2>&1; then
    record ncu PASS "ncu.txt"
  else
    tail -5 "$LOG/ncu.txt"
    record ncu FAIL "see ncu.txt"
  fi
  cp "$LOG/ncu.txt" "$RESULTS/ncu.txt" 2>/dev/null
fi

stage "compute-sanitizer memcheck on a short decode"
SAN="$(command -v compute-sanitizer || true)"
CKPT="$ROOT/tests/testdata/checkpoints/router_sigmoid_blockout_ln_bias"
if [[ -z "$SAN" ]]; then
  record memcheck SKIP "compute-sanitizer not found"
elif [[ ! -d "$CKPT" ]]; then
  record memcheck SKIP "$CKPT not present"
elif fits memcheck 30; then
  if timeout "$(limit 90)" "$SAN" --tool memcheck --error-exitcode 3 --leak-check full \
       "$B/modserve-generate" --model "$CKPT" --backend cuda --prompt_ids 1,5,9,14,3,7 \
       --max_new_tokens 8 --ignore_eos --json >"$LOG/memcheck.log" 2>&1; then
    record memcheck PASS "$(grep -m1 'ERROR SUMMARY' "$LOG/memcheck.log")"
  else
    tail -30 "$LOG/memcheck.log"
    record memcheck FAIL "see memcheck.log"
  fi
fi

stage "compute-sanitizer memcheck on the conformance suite (cuda)"
if [[ -z "$SAN" ]]; then
  record memcheck_conformance SKIP "compute-sanitizer not found"
elif fits memcheck_conformance 40; then
  if timeout "$(limit 240)" "$SAN" --tool memcheck --report-api-errors no --error-exitcode 3 \
       "$T/backend_conformance_test" --gtest_filter='AllBackends/*/Cuda' \
       >"$LOG/memcheck_conformance.log" 2>&1; then
    record memcheck_conformance PASS "$(grep -m1 'ERROR SUMMARY' "$LOG/memcheck_conformance.log")"
  else
    rc=$?
    grep -E "Invalid|ERROR SUMMARY|FAILED" "$LOG/memcheck_conformance.log" | head -20
    if [[ $rc == 124 ]]; then
      record memcheck_conformance SKIP "ran out of time ($(grep -c '^\[       OK \]' \
        "$LOG/memcheck_conformance.log") cases clean before that)"
    else
      record memcheck_conformance FAIL "see memcheck_conformance.log"
    fi
  fi
fi

nvidia-smi >"$LOG/nvidia-smi-after.txt" 2>&1
save_logs
{
  echo "=== summary ($(( $(date +%s) - START ))s, $(date -u +%Y-%m-%dT%H:%MZ))"
  printf '%s\n' "${SUMMARY[@]}"
} | tee "$RESULTS/summary.txt"
if [[ -n "$BENCH_TABLE" ]]; then
  echo "$BENCH_TABLE"
fi
exit $FAILED
