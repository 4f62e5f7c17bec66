#!/usr/bin/env bash
# check_same_tokens.sh: proves to_gguf.py is faithful. Converts a dense modserve checkpoint to
# GGUF, greedy-decodes N tokens from the same prompt ids with llama.cpp (greedy_ids.cc against
# libllama) and with modserve-generate, and compares the ids step by step, printing the top-1/top-2
# logit margin of each side so a late disagreement can be told apart from a conversion bug (a
# bug shows in the margins, usually within a few tokens). It measures no speed. Exit 0 when
# every token agrees and the top-1/top-2 margins agree within MARGIN_TOL (default 0.03; 0.1 for
# q8_0, whose rounding alone moved them by 0.032 on 110m).
#
# Needs: a llama.cpp build with libllama (LLAMACPP_BUILD, default /tmp/llamacpp/build; compare.sh
# makes it), its source (LLAMACPP_SRC, for llama.h), modserve-generate (MODSERVE_BIN_DIR, default
# build-bench/bin), python with numpy + gguf (GGUF_PY, default /tmp/gguf-venv/bin/python).
#
#   tests/bench/llamacpp/check_same_tokens.sh [CKPT_DIR] [N_NEW] [OUTTYPE]
#   CONVERTER=quantize tests/bench/llamacpp/check_same_tokens.sh models/demo-dense 32 q4_k
#   CONVERTER=llama tests/bench/llamacpp/check_same_tokens.sh /tmp/modserve-bench/110m-dense 16 q5_k_m
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
CKPT="${1:-/tmp/modserve-bench/110m-dense}"
N_NEW="${2:-16}"
OUTTYPE="${3:-bf16}"
PROMPT="${PROMPT_IDS:-1,450,4996,17354,1701,432,3262,975,278,17366,11203,29889}"
THREADS="${THREADS:-2}"
LLAMACPP_BUILD="${LLAMACPP_BUILD:-/tmp/llamacpp/build}"
LLAMACPP_SRC="${LLAMACPP_SRC:-/tmp/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp}"
MODSERVE_BIN_DIR="${MODSERVE_BIN_DIR:-$REPO/build-bench/bin}"
GGUF_PY="${GGUF_PY:-/tmp/gguf-venv/bin/python}"
WORK="${WORK:-/tmp/llamacpp/gguf}"
mkdir -p "$WORK"

source "$HERE/llama_tool.sh"
GREEDY="$(llama_tool greedy_ids "$LLAMACPP_SRC" "$LLAMACPP_BUILD")"

# CONVERTER=quantize makes the GGUF with modserve-quantize (any of its --type values, the
# tokenizer.json included) instead of to_gguf.py, and modserve runs that same GGUF file: the
# check then proves the quantizer's output and modserve's GGUF loading against llama.cpp.
# CONVERTER=llama has llama.cpp's own quantizer write it (llama_quantize.cc, from an F16 file of
# modserve-quantize; OUTTYPE q4_k_m, q5_k_m, ...): modserve's kernels on blocks and tensor mixes
# it did not write. CKPT may then be a GGUF file, which llama.cpp requantizes:
#   CONVERTER=llama PROMPT_IDS=504,3575,282,4649,314 tests/bench/llamacpp/check_same_tokens.sh \
#     models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf 64 q4_k_m
# (SmolLM2's 576-wide rows take Q5_0 there, where the K-quants need multiples of 256).
# CONVERTER=none runs both engines on CKPT, a GGUF file, as it is (OUTTYPE unused).
CONVERTER="${CONVERTER:-to_gguf}"
GGUF="$WORK/$(basename "$CKPT" .gguf)-$OUTTYPE-$CONVERTER.gguf"
if [[ "$CONVERTER" == none ]]; then
  GGUF="$CKPT"
elif [[ "$CONVERTER" == quantize ]]; then
  "$MODSERVE_BIN_DIR/modserve-quantize" --model "$CKPT" --out "$GGUF" --type "$OUTTYPE" \
    --allow_no_tokenizer
elif [[ "$CONVERTER" == llama ]]; then
  QUANTIZE="$(llama_tool llama_quantize "$LLAMACPP_SRC" "$LLAMACPP_BUILD")"
  SRC="$CKPT"
  if [[ "$CKPT" != *.gguf ]]; then
    SRC="$WORK/f16.gguf"
    "$MODSERVE_BIN_DIR/modserve-quantize" --model "$CKPT" --out "$SRC" --type f16 \
      --allow_no_tokenizer
  fi
  "$QUANTIZE" "$SRC" "$GGUF" "$OUTTYPE" "$THREADS" > /dev/null
elif [[ ! -f "$GGUF" || "$CKPT/config.json" -nt "$GGUF" || "$HERE/to_gguf.py" -nt "$GGUF" ]]; then
  nice -n 19 "$GGUF_PY" "$HERE/to_gguf.py" "$CKPT" "$GGUF" --outtype "$OUTTYPE"
fi

LC_OUT="$WORK/check.llamacpp.txt"
MS_OUT="$WORK/check.modserve.json"
"$GREEDY" "$GGUF" "$PROMPT" "$N_NEW" "$THREADS" > "$LC_OUT"
MS_MODEL="$CKPT"
[[ "$CONVERTER" != to_gguf ]] && MS_MODEL="$GGUF"
"$MODSERVE_BIN_DIR/modserve-generate" --model "$MS_MODEL" --prompt_ids "$PROMPT" \
  --max_new_tokens "$N_NEW" --temperature 0 --ignore_eos --top_logprobs 2 --json \
  --threads "$THREADS" > "$MS_OUT"

TOL="${MARGIN_TOL:-$([[ $OUTTYPE == q8_0 ]] && echo 0.1 || echo 0.03)}"
python3 - "$LC_OUT" "$MS_OUT" "$PROMPT" "$GGUF" "$TOL" <<'EOF'
# Random N(0, 0.02) weights give near-uniform attention, so even a wrong q/k layout can keep the
# first greedy tokens (measured: without the RoPE row permutation token 1 still agreed and the
# ids split at step 4). The top-1/top-2 margins are the sharper test: they must agree to
# MARGIN_TOL (modserve reports logprobs, whose differences are logit differences).
import json, math, sys
lc_path, ms_path, prompt, gguf, tol = sys.argv[1:]
tol = float(tol)
lc = [l.split() for l in open(lc_path) if l[0].isdigit()]
ms = json.load(open(ms_path))
ms_ids = ms["token_ids"]
print(f"checkpoint GGUF {gguf}\nprompt ids {prompt}")
print("step  llama.cpp (2nd)   modserve (2nd)   lc top1-top2 logit  ms top1-top2 logprob")
first_diff, worst = None, 0.0
for k, (row, mid) in enumerate(zip(lc, ms_ids)):
    tops = ms["top_logprobs"][k]
    ms2 = tops[1]["id"] if len(tops) > 1 else -1
    ms_margin = tops[0]["logprob"] - tops[1]["logprob"] if len(tops) > 1 else math.nan
    same = int(row[1]) == mid
    if same:
        worst = max(worst, abs(float(row[3]) - ms_margin))
    elif first_diff is None:
        first_diff = k
    print(f"{k:4d}  {row[1]:>9} ({row[2]:>5})  {mid:>8} ({ms2:>5})  {float(row[3]):17.4f}"
          f"  {ms_margin:19.4f}{'' if same else '  <-- differs'}")
print("llama.cpp ids:", ",".join(r[1] for r in lc))
print("modserve  ids:", ",".join(map(str, ms_ids)))
print(f"largest margin difference over agreeing steps: {worst:.4f} (tolerance {tol})")
if len(lc) != len(ms_ids):
    print(f"FAIL: llama.cpp gave {len(lc)} tokens, modserve {len(ms_ids)}"); sys.exit(1)
if first_diff is not None:
    print(f"FAIL: first disagreement at step {first_diff}"
          + (" (from token 1: the conversion is wrong)" if first_diff == 0 else
             " (look at the margins: a near-tie may flip on rounding)"))
    sys.exit(1)
if worst > tol:
    print("FAIL: the ids agree but the margins do not: the conversion is wrong"); sys.exit(1)
print(f"PASS: all {len(lc)} greedy tokens agree and the margins agree within {tol}")
EOF
