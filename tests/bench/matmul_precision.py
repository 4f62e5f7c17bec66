#!/usr/bin/env python3
"""What --matmul_precision (highest, high, medium) costs in accuracy and gives in speed, on one
model file with BF16 weights, the same run and machine.

  .venv/bin/python tests/bench/llamacpp/gguf_to_f32.py \\
      models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smollm2-bf16.gguf bf16
  .venv/bin/python tests/bench/matmul_precision.py --model /tmp/smollm2-bf16.gguf --build build

Only the CPU backend's AMX BF16 tile Gemm (Gemms of more than kAmxSmallNMax = 8 rows on a CPU
with usable AMX) rounds x by the precision; elsewhere the three runs are the same bits, and the
script says so. Accuracy, against `highest` (x kept to f32 precision):
1. Teacher-forced log-probabilities over --windows windows of --len tokens of held-out text (The
   Jargon File, tools/fetch_eval_text.sh) with build/bin/modserve-perplexity: perplexity, and the
   mean and largest |difference| of a token's log-probability.
2. Greedy continuations of --gen_tokens tokens after prompts of --prompt_len tokens (windows of
   the same text, so the prompt's prefill runs on the tiles; one-row decode steps do not):
   tokens generated before the first difference.
Speed: build/bin/modserve-bench --model FILE at each precision (prefill of 512 tokens, decode at
--batches, context 128), alternating the precisions --rounds times.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import mod_tune  # noqa: E402

PRECISIONS = ["highest", "high", "medium"]


def perplexity(binary, model, windows_file, precision, threads, out_file):
    cmd = [binary, "--model", model, "--windows", windows_file, "--threads", str(threads),
           "--matmul_precision", precision, "--logprobs_out", out_file]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    with open(out_file) as f:
        summary["logprobs"] = json.load(f)["logprobs"]
    return summary


def greedy(binary, model, prompt_ids, precision, threads, new_tokens):
    out = []
    for ids in prompt_ids:
        cmd = [binary, "--model", model, "--prompt_ids", ",".join(map(str, ids)), "--json",
               "--ignore_eos", "--max_new_tokens", str(new_tokens), "--threads", str(threads),
               "--matmul_precision", precision]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out.append(json.loads(res.stdout)["token_ids"])
    return out


def bench(binary, model, precision, threads, batches, steps):
    cmd = [binary, "--model", model, "--batches", batches, "--contexts", "128", "--steps",
           str(steps), "--threads", str(threads), "--prefill_reps", "2", "--matmul_precision",
           precision]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    decode, prefill = {}, None
    for line in res.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        # Decode rows: | model | ctx | batch | tok/s | ...
        if len(cells) > 4 and cells[1] == "128" and cells[2].isdigit():
            decode[int(cells[2])] = float(cells[3])
        m = re.search(r"Prefill \(one 512-token prompt[^)]*\):\s*([0-9.]+) tok/s", line)
        if m and prefill is None:
            prefill = float(m.group(1))
    return {"prefill": prefill, "decode": decode, "stdout": res.stdout}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a model file or directory with BF16 weights")
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--len", type=int, default=512)
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--prompt_len", type=int, default=200)
    ap.add_argument("--gen_tokens", type=int, default=64)
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no_bench", action="store_true")
    ap.add_argument("--json", help="write every number here")
    args = ap.parse_args()
    bindir = os.path.join(args.build, "bin")
    tok = mod_tune.load_tokenizer(args.model)
    windows = mod_tune.eval_windows(tok, args.len, args.windows).tolist()
    prompts = [w[:args.prompt_len] for w in
               mod_tune.eval_windows(tok, args.prompt_len, args.prompts + args.windows).tolist()
               [args.windows:]]
    result = {"model": args.model, "cpu": mod_tune.cpu_model(), "windows": args.windows,
              "window_tokens": args.len, "eval_text": os.path.relpath(mod_tune.EVAL_TEXT, ROOT)}
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        wfile = os.path.join(tmp, "windows.json")
        with open(wfile, "w") as f:
            json.dump({"windows": windows}, f)
        for p in PRECISIONS:
            runs[p] = perplexity(os.path.join(bindir, "modserve-perplexity"), args.model, wfile, p,
                                 args.threads, os.path.join(tmp, p + ".json"))
            runs[p]["greedy"] = greedy(os.path.join(bindir, "modserve-generate"), args.model,
                                       prompts, p, args.threads, args.gen_tokens)
            print(f"{p}: ppl {runs[p]['ppl']:.4f} ({runs[p]['seconds']:.1f} s)", flush=True)
    base = runs["highest"]
    rows = []
    for p in PRECISIONS:
        r = runs[p]
        diffs = [abs(a - b) for wa, wb in zip(r["logprobs"], base["logprobs"])
                 for a, b in zip(wa, wb)]
        agree = []
        for ga, gb in zip(r["greedy"], base["greedy"]):
            n = 0
            while n < min(len(ga), len(gb)) and ga[n] == gb[n]:
                n += 1
            agree.append(n)
        rows.append({"precision": p, "ppl": r["ppl"], "nll": r["nll"],
                     "ppl_vs_highest": r["ppl"] / base["ppl"] - 1,
                     "mean_abs_dlogprob": sum(diffs) / len(diffs), "max_abs_dlogprob": max(diffs),
                     "greedy_agree": agree, "perplexity_seconds": r["seconds"]})
    result["accuracy"] = rows
    if all(r["max_abs_dlogprob"] == 0 for r in rows):
        print("all three precisions gave the same bits: this CPU's kernels have no AMX BF16 Gemm "
              "(or the model no BF16 weights), so --matmul_precision changes nothing here")
    print(f"\n{result['cpu']}; {args.model}; {args.windows} windows x {args.len} tokens of "
          f"{result['eval_text']}, {args.prompts} greedy prompts of {args.prompt_len} tokens\n")
    print("| precision | perplexity | vs highest | mean / max abs d logprob | greedy tokens equal "
          f"to highest (of {args.gen_tokens}) |")
    print("|---|---:|---:|---|---|")
    for r in rows:
        print(f"| {r['precision']} | {r['ppl']:.4f} | {100 * r['ppl_vs_highest']:+.4f}% | "
              f"{r['mean_abs_dlogprob']:.2e} / {r['max_abs_dlogprob']:.2e} | "
              f"{', '.join(map(str, r['greedy_agree']))} |")
    if not args.no_bench:
        speed = {p: [] for p in PRECISIONS}
        for _ in range(args.rounds):
            for p in PRECISIONS:
                speed[p].append(bench(os.path.join(bindir, "modserve-bench"), args.model, p,
                                      args.threads, args.batches, args.steps))
        result["speed"] = {p: [{"prefill": s["prefill"], "decode": s["decode"]} for s in runs_]
                           for p, runs_ in speed.items()}
        batches = sorted(speed["highest"][0]["decode"])
        print(f"\nmodserve-bench --model, {args.rounds} alternating rounds, tok/s (prefill: 512 "
              "tokens; decode: context 128)\n")
        print("| precision | prefill | " + " | ".join(f"decode batch {b}" for b in batches) + " |")
        print("|---|---|" + "---|" * len(batches))
        for p in PRECISIONS:
            pre = ", ".join(f"{s['prefill']:.1f}" if s["prefill"] else "-" for s in speed[p])
            dec = " | ".join(", ".join(f"{s['decode'].get(b, 0):.1f}" for s in speed[p])
                             for b in batches)
            print(f"| {p} | {pre} | {dec} |")
        result["bench_stdout"] = speed["highest"][0]["stdout"]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
