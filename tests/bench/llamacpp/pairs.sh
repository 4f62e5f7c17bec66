#!/usr/bin/env bash
# pairs.sh: batch-1 decode of one GGUF file, modserve against llama.cpp, in N alternating pairs
# (llama-bench, then modserve-bench, N times), for machines whose speed drifts between runs.
# Prints every pair's tok/s and ratio, then the medians and the median of the pair ratios.
# Same settings as compare.sh: context CTX, TG tokens, THREADS threads, KV f16; llama-bench runs
# one repetition per pair.
#
#   tests/bench/llamacpp/pairs.sh models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf   # PAIRS=7
#
# Needs compare.sh's llama.cpp build ($LLAMACPP_DIR/build/bin/llama-bench) and a Release
# modserve-bench (MODSERVE_BIN_DIR, default build/bin).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
GGUF="${1:?usage: pairs.sh FILE.gguf}"
PAIRS="${PAIRS:-7}"
THREADS="${THREADS:-2}"
CTX="${CTX:-128}"
TG="${TG:-64}"
LLAMACPP_DIR="${LLAMACPP_DIR:-/tmp/llamacpp}"
MODSERVE_BIN_DIR="${MODSERVE_BIN_DIR:-$REPO/build/bin}"
REPACK="${LLAMA_REPACK:-1}"
for bin in "$LLAMACPP_DIR/build/bin/llama-bench" "$MODSERVE_BIN_DIR/modserve-bench"; do
  [[ -x "$bin" ]] || { echo "pairs.sh: no $bin (see compare.sh)" >&2; exit 1; }
done
name="$(basename "$GGUF")"
results=()
for ((i = 1; i <= PAIRS; ++i)); do
  llama=$("$LLAMACPP_DIR/build/bin/llama-bench" -m "$GGUF" -t "$THREADS" -r 1 -ctk f16 \
    -ctv f16 --repack "$REPACK" -p 0 -n "$TG" -d "$CTX" -o json |
    python3 -c 'import json, sys; print("%.2f" % json.load(sys.stdin)[0]["avg_ts"])')
  ours=$("$MODSERVE_BIN_DIR/modserve-bench" --model "$GGUF" --batches 1 --contexts "$CTX" \
    --steps "$TG" --threads "$THREADS" --kv_dtype f16 --prefill_tokens 16 --prefill_reps 1 |
    awk -F'|' -v n="$name" '$2 ~ n && $4 + 0 == 1 { gsub(/ /, "", $5); print $5; exit }')
  echo "pair $i: llama.cpp $llama tok/s, modserve $ours tok/s" >&2
  results+=("$llama $ours")
done
printf '%s\n' "${results[@]}" | python3 -c '
import statistics, sys
rows = [tuple(map(float, line.split())) for line in sys.stdin if line.strip()]
llama, ours = [r[0] for r in rows], [r[1] for r in rows]
ratios = [o / l for l, o in rows]
print(f"{sys.argv[1]}: {len(rows)} pairs, {sys.argv[2]} threads, ctx {sys.argv[3]}, {sys.argv[4]} tokens")
print(f"llama.cpp tok/s: median {statistics.median(llama):.1f} (min {min(llama):.1f}, max {max(llama):.1f})")
print(f"modserve tok/s:  median {statistics.median(ours):.1f} (min {min(ours):.1f}, max {max(ours):.1f})")
print(f"modserve / llama.cpp, pair by pair: median {statistics.median(ratios):.2f}x "
      f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x)")
' "$name" "$THREADS" "$CTX" "$TG"
