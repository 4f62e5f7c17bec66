#!/usr/bin/env bash
# compare.sh: head-to-head CPU benchmark of modserve against llama.cpp on the same synthetic dense
# checkpoints (modserve-bench's 110m and TinyLlama shapes): batch-1 decode and 512-token prefill.
# It does not check correctness (check_same_tokens.sh does) and downloads nothing.
#
# Steps: (a) builds llama.cpp (llama-bench + libllama, Release, GGML_NATIVE) from the
# llama-cpp-python sdist into $LLAMACPP_DIR/build unless llama-bench is there; (b) runs
# modserve-bench per shape (dense + MoD, batch 1; it also writes the checkpoints when missing);
# (c) converts each dense checkpoint to GGUF per weight type ($WTYPES, default "bf16 f16");
# (d) runs llama-bench: pp$PP from an empty context, and tg$TG after a $CTX-token context
# (-d $CTX), matching modserve-bench's "--contexts $CTX --steps $TG"; (e) prints one table last.
# Both engines use $THREADS threads and an F16 KV cache.
# (f) GGUF rows ($GGUF_ROWS, default "smollm2 tinyllama:q8_0 tinyllama:q4_k"): both engines run
# the very same GGUF file: the real SmolLM2-135M Q4_1 (tools/fetch_models.sh) and the TinyLlama
# shape's dense checkpoint quantized by modserve-quantize (--type q8_0 / q4_k / q5_k; it is written
# by modserve-bench first when missing), or by llama.cpp's own quantizer for the mixes
# (tinyllama:q4_k_m, tinyllama:q5_k_m; llama_quantize.cc), and SmolLM2's file requantized by it
# (smollm2:q4_k_m, smollm2:q5_0, ...). modserve-bench --model and llama-bench
# take the same context, steps, threads and KV type as above. SHAPES= runs only these rows:
#   SHAPES= tests/bench/llamacpp/compare.sh
#
# Needs: cmake, ninja, a C/C++ compiler; the sdist (arg 1 or LLAMACPP_SDIST, default
# /tmp/lcp/llama_cpp_python-0.3.36.tar.gz, which vendors llama.cpp; fetch it from PyPI with
# `pip download llama-cpp-python==0.3.36 --no-deps --no-binary :all: -d /tmp/lcp`); a Release
# modserve build with modserve-bench
# (MODSERVE_BIN_DIR, default build-bench/bin: `ninja -C build-bench modserve-bench`); a python with
# numpy + gguf (GGUF_PY, default /tmp/gguf-venv/bin/python:
# `python3 -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf numpy`);
# ~5 GB free under $LLAMACPP_DIR for the TinyLlama GGUFs. Run it on a quiet machine.
#
#   tests/bench/llamacpp/compare.sh [SDIST]
#   SHAPES="110m tinyllama" WTYPES="bf16 f16 q8_0" THREADS=2 CTX=128 TG=64 PP=512 REPS=3
#   MATMUL_PRECISION=highest (modserve-bench's --matmul_precision: medium rounds x to bf16 for BF16
#   weights, the arithmetic of llama.cpp's BF16 matmul)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
LLAMACPP_SDIST="${1:-${LLAMACPP_SDIST:-/tmp/lcp/llama_cpp_python-0.3.36.tar.gz}}"
LLAMACPP_DIR="${LLAMACPP_DIR:-/tmp/llamacpp}"
MODSERVE_BIN_DIR="${MODSERVE_BIN_DIR:-$REPO/build-bench/bin}"
GGUF_PY="${GGUF_PY:-/tmp/gguf-venv/bin/python}"
WORKDIR="${WORKDIR:-/tmp/modserve-bench}"
SHAPES="${SHAPES-110m tinyllama}"
WTYPES="${WTYPES:-bf16 f16}"
THREADS="${THREADS:-2}"
CTX="${CTX:-128}"
TG="${TG:-64}"
PP="${PP:-512}"
REPS="${REPS:-3}"
MATMUL_PRECISION="${MATMUL_PRECISION:-highest}"
JOBS="${JOBS:-2}"
GGUF_ROWS="${GGUF_ROWS-smollm2 tinyllama:q8_0 tinyllama:q4_k}"
SMOLLM2="${SMOLLM2:-$REPO/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}"
BUILD="$LLAMACPP_DIR/build"
OUT="$LLAMACPP_DIR/results"
mkdir -p "$LLAMACPP_DIR/gguf" "$OUT"
RESULTS="$OUT/results.tsv"
: > "$RESULTS"
log() { echo "compare.sh: $*" >&2; }
# llama-bench's --repack for a weight type. With 1, llama.cpp moves quantized weights into its
# extra buffers, AMX ones where the CPU reports amx_int8 (Q4_0, Q4_1, Q8_0 and the K-quants). On
# the 2-vCPU Xeon VMs here that path dies in its worker threads (SIGILL, or SIGSEGV at ldtilecfg
# under gdb: the tile configuration and the per-thread tile permission, llama.cpp PR 26954), so
# there every quantized file runs unrepacked; elsewhere only Q8_0 does (its repack is the AMX one
# too). LLAMA_REPACK overrides both.
default_repack() {  # WTYPE
  case "$1" in
    bf16 | f16 | f32) echo 1 ;;
    q8_0) echo 0 ;;
    *) if grep -qw amx_int8 /proc/cpuinfo; then echo 0; else echo 1; fi ;;
  esac
}

# (a) llama.cpp
if [[ ! -x "$BUILD/bin/llama-bench" ]]; then
  SRC="$(ls -d "$LLAMACPP_DIR"/*/vendor/llama.cpp 2>/dev/null | head -1 || true)"
  if [[ -z "$SRC" ]]; then
    [[ -f "$LLAMACPP_SDIST" ]] || { log "no llama.cpp sdist at $LLAMACPP_SDIST"; exit 1; }
    tar -xzf "$LLAMACPP_SDIST" -C "$LLAMACPP_DIR"
    SRC="$(ls -d "$LLAMACPP_DIR"/*/vendor/llama.cpp | head -1)"
  fi
  log "building llama.cpp from $SRC"
  t0=$(date +%s)
  nice -n 19 cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_TOOLS=ON \
    > "$OUT/cmake.log"
  nice -n 19 ninja -C "$BUILD" -j"$JOBS" llama-bench llama > "$OUT/ninja.log"
  log "llama.cpp built in $(( $(date +%s) - t0 )) s"
fi
[[ -x "$MODSERVE_BIN_DIR/modserve-bench" ]] || {
  log "no $MODSERVE_BIN_DIR/modserve-bench"; exit 1; }
[[ -z "$SHAPES" || -x "$GGUF_PY" ]] || {
  log "no python with gguf at $GGUF_PY (see the header)"; exit 1; }

for shape in $SHAPES; do
  # (b) modserve: dense and MoD, batch 1, the same context, steps, threads and KV dtype.
  log "modserve-bench $shape"
  "$MODSERVE_BIN_DIR/modserve-bench" --workdir "$WORKDIR" --shapes "$shape" --batches 1 \
    --contexts "$CTX" --steps "$TG" --threads "$THREADS" --kv_dtype f16 \
    --prefill_tokens "$PP" --prefill_reps "$REPS" --variants dense,mod \
    --matmul_precision "$MATMUL_PRECISION" \
    | tee "$OUT/modserve-$shape.txt" >&2
  python3 - "$OUT/modserve-$shape.txt" "$shape" "$CTX" >> "$RESULTS" <<'EOF'
import re, sys
text, shape, ctx = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
for v in ("dense", "mod"):
    d = re.search(rf"\[{shape} {v}\s*\] ctx\s+{ctx} batch\s+1:\s+([\d.]+) tok/s\s+([\d.]+) GB/s",
                  text)
    p = re.search(rf"\[{shape} {v}\s*\] prefill \d+ tokens: ([\d.]+) tok/s", text)
    print("\t".join([shape, "modserve" + ("" if v == "dense" else " MoD"), "bf16",
                     d.group(1) if d else "?", p.group(1) if p else "?",
                     f"decode {d.group(2)} GB/s (weights+KV)" if d else "-"]))
bw = re.search(r"read bandwidth at the end: ([\d.]+) GB/s \(start ([\d.]+) GB/s", text)
if bw:
    print("\t".join([shape, "(machine)", "-", "-", "-",
                     f"read bw {bw.group(2)} -> {bw.group(1)} GB/s during modserve-bench"]))
EOF

  # (c) + (d) llama.cpp, per weight type.
  for wt in $WTYPES; do
    gguf="$LLAMACPP_DIR/gguf/$shape-dense-$wt.gguf"
    if [[ ! -f "$gguf" || "$WORKDIR/$shape-dense/model.safetensors" -nt "$gguf" ]]; then
      log "converting $shape-dense to $wt"
      nice -n 10 "$GGUF_PY" "$HERE/to_gguf.py" "$WORKDIR/$shape-dense" "$gguf.tmp" --outtype "$wt"
      mv "$gguf.tmp" "$gguf"
    fi
    repack="${LLAMA_REPACK:-$(default_repack "$wt")}"
    log "llama-bench $shape $wt (repack $repack)"
    "$BUILD/bin/llama-bench" -m "$gguf" -t "$THREADS" -r "$REPS" -ctk f16 -ctv f16 \
      --repack "$repack" -p "$PP" -n 0 -o json > "$OUT/llama-$shape-$wt-pp.json"
    "$BUILD/bin/llama-bench" -m "$gguf" -t "$THREADS" -r "$REPS" -ctk f16 -ctv f16 \
      --repack "$repack" -p 0 -n "$TG" -d "$CTX" -o json > "$OUT/llama-$shape-$wt-tg.json"
    python3 - "$OUT/llama-$shape-$wt-pp.json" "$OUT/llama-$shape-$wt-tg.json" "$shape" "$wt" \
      >> "$RESULTS" <<'EOF'
import json, sys
pp, tg = (json.load(open(p))[0] for p in sys.argv[1:3])
print("\t".join([sys.argv[3], "llama.cpp", sys.argv[4],
                 f"{tg['avg_ts']:.2f} ±{tg['stddev_ts']:.2f}",
                 f"{pp['avg_ts']:.1f} ±{pp['stddev_ts']:.1f}",
                 f"decode {tg['model_size'] * tg['avg_ts'] / 1e9:.1f} GB/s (weights); "
                 f"fa {tg.get('flash_attn')} (-1 = auto), repack {tg.get('repack')}"]))
EOF
  done
done

# llama-bench on one GGUF file: pp$PP from empty and tg$TG after $CTX tokens, one results row.
llama_rows() {  # GGUF SHAPE WTYPE
  local gguf="$1" shape="$2" wt="$3" tag
  tag="$(basename "$gguf" .gguf)"
  local repack="${LLAMA_REPACK:-$(default_repack "$wt")}"
  log "llama-bench $tag (repack $repack)"
  "$BUILD/bin/llama-bench" -m "$gguf" -t "$THREADS" -r "$REPS" -ctk f16 -ctv f16 \
    --repack "$repack" -p "$PP" -n 0 -o json > "$OUT/llama-$tag-pp.json"
  "$BUILD/bin/llama-bench" -m "$gguf" -t "$THREADS" -r "$REPS" -ctk f16 -ctv f16 \
    --repack "$repack" -p 0 -n "$TG" -d "$CTX" -o json > "$OUT/llama-$tag-tg.json"
  python3 - "$OUT/llama-$tag-pp.json" "$OUT/llama-$tag-tg.json" "$shape" "$wt" \
    >> "$RESULTS" <<'EOF2'
import json, sys
pp, tg = (json.load(open(p))[0] for p in sys.argv[1:3])
print("\t".join([sys.argv[3], "llama.cpp", sys.argv[4],
                 f"{tg['avg_ts']:.2f} ±{tg['stddev_ts']:.2f}",
                 f"{pp['avg_ts']:.1f} ±{pp['stddev_ts']:.1f}",
                 f"decode {tg['model_size'] * tg['avg_ts'] / 1e9:.1f} GB/s (weights); "
                 f"fa {tg.get('flash_attn')} (-1 = auto), repack {tg.get('repack')}"]))
EOF2
}

# (f) the same GGUF file in both engines.
for row in $GGUF_ROWS; do
  case "$row" in
    smollm2) gguf="$SMOLLM2"; shape="smollm2-135m"; wt="q4_1"
      [[ -f "$gguf" ]] || { log "no $gguf (bash tools/fetch_models.sh)"; exit 1; } ;;
    smollm2:*)
      # SmolLM2's file requantized by llama.cpp's quantizer (q4_k_m: mostly Q5_0, its 576-wide
      # rows not being multiples of 256; q5_0, q5_1, q4_0, ...).
      wt="${row#smollm2:}"; shape="smollm2-135m"
      [[ -f "$SMOLLM2" ]] || { log "no $SMOLLM2 (bash tools/fetch_models.sh)"; exit 1; }
      gguf="$LLAMACPP_DIR/gguf/smollm2-$wt.gguf"
      if [[ ! -f "$gguf" || "$SMOLLM2" -nt "$gguf" ]]; then
        source "$HERE/llama_tool.sh"
        QUANTIZE="$(llama_tool llama_quantize \
          "$(ls -d "$LLAMACPP_DIR"/*/vendor/llama.cpp | head -1)" "$BUILD")"
        log "llama.cpp's quantizer: smollm2 $wt"
        "$QUANTIZE" "$SMOLLM2" "$gguf.tmp" "$wt" "$THREADS" > /dev/null
        mv "$gguf.tmp" "$gguf"
      fi ;;
    tinyllama:*)
      wt="${row#tinyllama:}"; shape="tinyllama"
      ckpt="$WORKDIR/tinyllama-dense"
      if [[ ! -f "$ckpt/config.json" ]]; then
        log "writing the tinyllama checkpoint"
        "$MODSERVE_BIN_DIR/modserve-bench" --workdir "$WORKDIR" --shapes tinyllama \
          --variants dense --batches 1 --contexts 16 --steps 1 --prefill_tokens 16 \
          --prefill_reps 1 --threads "$THREADS" > /dev/null
      fi
      gguf="$LLAMACPP_DIR/gguf/tinyllama-dense-$wt.gguf"
      if [[ ! -f "$gguf" || "$ckpt/config.json" -nt "$gguf" ]]; then
        case "$wt" in
          *_k_m|*_k_s)
            # The mixes (q4_k_m, q5_k_m, ...) come from llama.cpp's own quantizer, from an F16 file.
            source "$HERE/llama_tool.sh"
            QUANTIZE="$(llama_tool llama_quantize \
              "$(ls -d "$LLAMACPP_DIR"/*/vendor/llama.cpp | head -1)" "$BUILD")"
            f16="$LLAMACPP_DIR/gguf/tinyllama-dense-f16.gguf"
            if [[ ! -f "$f16" || "$ckpt/config.json" -nt "$f16" ]]; then
              nice -n 10 "$MODSERVE_BIN_DIR/modserve-quantize" --model "$ckpt" --out "$f16" \
                --type f16 --allow_no_tokenizer
            fi
            log "llama.cpp's quantizer: tinyllama $wt"
            "$QUANTIZE" "$f16" "$gguf.tmp" "$wt" "$THREADS" > /dev/null ;;
          *)
            log "modserve-quantize tinyllama --type $wt"
            nice -n 10 "$MODSERVE_BIN_DIR/modserve-quantize" --model "$ckpt" --out "$gguf.tmp" \
              --type "$wt" --allow_no_tokenizer ;;
        esac
        mv "$gguf.tmp" "$gguf"
      fi ;;
    *) log "GGUF_ROWS: unknown row '$row' (smollm2, smollm2:TYPE, tinyllama:TYPE)"; exit 1 ;;
  esac
  log "modserve-bench --model $(basename "$gguf")"
  "$MODSERVE_BIN_DIR/modserve-bench" --model "$gguf" --batches 1 --contexts "$CTX" \
    --steps "$TG" --threads "$THREADS" --kv_dtype f16 --prefill_tokens "$PP" \
    --prefill_reps "$REPS" --matmul_precision "$MATMUL_PRECISION" \
    | tee "$OUT/modserve-$shape-$wt.txt" >&2
  python3 - "$OUT/modserve-$shape-$wt.txt" "$shape" "$wt" "$CTX" >> "$RESULTS" <<'EOF2'
import re, sys
text, shape, wt, ctx = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3], sys.argv[4]
d = re.search(rf"^\| [^|]+ \| {ctx} \| 1 \| ([\d.]+) \| [\d.]+ \| ([\d.]+) \| ([\d.]+) \| "
              r"(\d+)% \|", text, re.M)
p = re.search(r"^Prefill \(one \d+-token prompt, chunk \d+\): ([\d.]+) tok/s", text, re.M)
bw = re.search(r"measured read bandwidth[^:]*: ([\d.]+) GB/s", text)
print("\t".join([shape, "modserve", wt, d.group(1) if d else "?", p.group(1) if p else "?",
                 f"decode {d.group(2)} MB read/step, {d.group(3)} GB/s = {d.group(4)}% of "
                 f"read bw ({bw.group(1) if bw else '?'} GB/s)" if d else "-"]))
EOF2
  llama_rows "$gguf" "$shape" "$wt"
done

# (e)
echo
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
echo "batch-1 decode: ctx $CTX -> $((CTX + TG)), $TG tokens; prefill: $PP tokens from empty;" \
     "$THREADS threads; KV f16; llama.cpp = mean ± sd of $REPS reps, modserve = its own timing"
printf '| %s | %s | %s | %s | %s | %s |\n' shape engine weights "decode tok/s" "prefill tok/s" notes
printf '|---|---|---|---:|---:|---|\n'
while IFS=$'\t' read -r a b c d e f; do
  printf '| %s | %s | %s | %s | %s | %s |\n' "$a" "$b" "$c" "$d" "$e" "$f"
done < "$RESULTS"
