#!/usr/bin/env bash
# Runs the CPU test suite (CTest label `cpu`, not `slow`) once per CPU kernel table this machine
# can run besides its best one (MODSERVE_CPU_ISA: scalar, avx2, avx512, avx512vnni, amx), so that a
# test whose expectations hold on one table only fails here and not on the next machine. Tables
# differ in the order of their f32 additions (and where row counts switch kernels), nothing else.
# Needs a build (tools/test.sh makes it): MODSERVE_BUILD_DIR, default build/.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${MODSERVE_BUILD_DIR:-build}"
jobs="${MODSERVE_JOBS:-$(nproc)}"
probe() { MODSERVE_CPU_ISA="$1" "$build/bin/modserve-generate" --model models/demo --prompt_ids 1 \
  --max_new_tokens 1 >/dev/null 2>&1; }
best=""
for isa in scalar avx2 avx512 avx512vnni amx; do probe "$isa" && best="$isa"; done
for isa in scalar avx2 avx512 avx512vnni amx; do
  [[ "$isa" == "$best" ]] && continue
  if ! probe "$isa"; then
    echo "test_isas.sh: $isa: not on this CPU, skipped"
    continue
  fi
  echo "== CPU tests with MODSERVE_CPU_ISA=$isa (best here: $best)"
  MODSERVE_CPU_ISA="$isa" ctest --test-dir "$build" --output-on-failure -j "$jobs" -L cpu -LE slow
done
