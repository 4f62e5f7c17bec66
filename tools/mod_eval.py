"""Evaluates a MoD adapter against its dense base model on held-out text, as the engine serves it.

  .venv/bin/python tools/mod_eval.py --adapter models/smollm2-mod --build build \\
      --thresholds 0.3,0.4,0.5,0.6,0.7 --json /tmp/eval.json

1. Held-out windows: --windows windows of --len tokens spread over The Jargon File (Debian's
   jargon-text, tools/fetch_eval_text.sh), which no training or calibration stage reads.
2. Perplexity and routing with the engine (build/bin/modserve-perplexity, CPU backend): the
   dense base file, then the adapter at each request threshold; the fraction of block
   computations skipped is over all layers (dense layers skip none).
3. Causal-routing accuracy per routed layer with the PyTorch reference (tools/modref) on the
   first --accuracy_windows windows at --accuracy_threshold (default: the adapter's default
   threshold; 0.9 is the calibrated capacities of models/smollm2-mod): how often the causal
   decision sigmoid(s) > tau_l agrees with the top-k of the same scores over the window at the
   layer's capacity (the non-causal routing the capacity stands for).
4. Decode throughput, dense vs MoD, batch 1 and 8 (build/bin/modserve-bench --model), unless
   --no_bench.
Prints a Markdown table (the model card's) and writes every number to --json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TOOLS)
import mod_tune  # noqa: E402
from modref import checkpoint  # noqa: E402
from modref.model import topk_select  # noqa: E402


def engine_runs(binary: str, model: str, windows_file: str, thresholds: list, threads: int):
    cmd = [binary, "--model", model, "--windows", windows_file, "--threads", str(threads)]
    if thresholds:
        cmd += ["--thresholds", ",".join(str(t) for t in thresholds)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def routing_accuracy(adapter: str, windows: torch.Tensor, threshold=None) -> dict:
    model = checkpoint.load(adapter, dtype=torch.float32)
    mod = model.cfg.mod
    agree = {l: 0 for l in mod.routed_layers}
    with torch.no_grad():
        for b in range(windows.shape[0]):
            wb = windows[b:b + 1]
            _, info = model(wb, mode="causal", threshold=threshold)
            for l in mod.routed_layers:
                sel = info[l]["selected"]
                top = torch.zeros_like(sel)
                top.scatter_(1, topk_select(info[l]["z"], model.capacity_k(wb.shape[1], l)), True)
                agree[l] += int((top == sel).sum())
    return {str(l): agree[l] / windows.numel() for l in mod.routed_layers}


def bench(binary: str, base: str, adapter: str, threads: int, steps: int) -> str:
    cmd = [binary, "--model", f"{base},{adapter}", "--batches", "1,8", "--contexts", "128",
           "--steps", str(steps), "--threads", str(threads), "--prefill_reps", "1"]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--adapter", default=os.path.join(mod_tune.ROOT, "models", "smollm2-mod"))
    ap.add_argument("--build", default=os.path.join(mod_tune.ROOT, "build"))
    ap.add_argument("--thresholds", default="0.3,0.5,0.7")
    ap.add_argument("--windows", type=int, default=40)
    ap.add_argument("--len", type=int, default=512)
    ap.add_argument("--accuracy_windows", type=int, default=4)
    ap.add_argument("--accuracy_threshold", type=float,
                    help="request threshold of the accuracy column (default: the model's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bench_steps", type=int, default=16)
    ap.add_argument("--no_bench", action="store_true")
    ap.add_argument("--json", help="write every number here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    raw = checkpoint.read_adapter_config(args.adapter)
    if raw is None:
        raise SystemExit(f"{args.adapter} is not a MoD adapter directory")
    base = checkpoint.adapter_base_path(args.adapter, raw)
    tok = mod_tune.load_tokenizer(base)
    windows = mod_tune.eval_windows(tok, args.len, args.windows)
    result = {"eval_text": os.path.relpath(mod_tune.EVAL_TEXT, mod_tune.ROOT),
              "windows": args.windows, "window_tokens": args.len,
              "predicted_tokens": args.windows * (args.len - 1), "cpu": mod_tune.cpu_model()}
    thresholds = [float(t) for t in args.thresholds.split(",")]
    perplexity = os.path.join(args.build, "bin", "modserve-perplexity")
    with tempfile.TemporaryDirectory() as tmp:
        wfile = os.path.join(tmp, "windows.json")
        with open(wfile, "w") as f:
            json.dump({"windows": windows.tolist()}, f)
        t0 = time.time()
        result["dense"] = engine_runs(perplexity, base, wfile, [], args.threads)[0]
        print(f"dense: ppl {result['dense']['ppl']:.3f} ({time.time() - t0:.0f} s)", flush=True)
        result["mod"] = []
        for t in thresholds:
            t0 = time.time()
            run = engine_runs(perplexity, args.adapter, wfile, [t], args.threads)[0]
            result["mod"].append(run)
            print(f"tau {t}: ppl {run['ppl']:.3f}, skipped {100 * run['skipped_fraction']:.1f}% "
                  f"({time.time() - t0:.0f} s)", flush=True)
    if args.accuracy_windows > 0:
        t0 = time.time()
        result["accuracy_windows"] = args.accuracy_windows
        result["accuracy_threshold"] = args.accuracy_threshold
        result["routing_accuracy"] = routing_accuracy(args.adapter,
                                                      windows[:args.accuracy_windows],
                                                      args.accuracy_threshold)
        print(f"routing accuracy ({time.time() - t0:.0f} s): {result['routing_accuracy']}",
              flush=True)
    if not args.no_bench:
        result["bench"] = bench(os.path.join(args.build, "bin", "modserve-bench"), base,
                                args.adapter, args.threads, args.bench_steps)
        print(result["bench"], flush=True)
    dense_ppl = result["dense"]["ppl"]
    print(f"\n{result['predicted_tokens']} held-out tokens ({result['eval_text']}), "
          f"{result['cpu']}\n")
    print("| model | request threshold | perplexity | vs dense | block compute skipped |")
    print("|---|---:|---:|---:|---:|")
    print(f"| dense | - | {dense_ppl:.3f} | - | 0% |")
    for run in result["mod"]:
        print(f"| MoD | {run['threshold']} | {run['ppl']:.3f} | "
              f"{100 * (run['ppl'] / dense_ppl - 1):+.1f}% | "
              f"{100 * run['skipped_fraction']:.1f}% |")
    if "routing_accuracy" in result:
        at = args.accuracy_threshold
        print(f"\n| layer | capacity | routed (threshold {at or 'default'}) | causal-routing "
              f"accuracy |")
        print("|---:|---:|---:|---:|")
        cfg = checkpoint.read_adapter_config(args.adapter)["mod"]
        routed_layers = sorted(cfg["routed_layers"])
        caps = cfg["capacity"] if isinstance(cfg["capacity"], list) else \
            [cfg["capacity"]] * len(routed_layers)
        want = cfg["threshold"] if at is None else at
        default = next((r for r in result["mod"] if r["threshold"] == want), None)
        for l, c in zip(routed_layers, caps):
            routed = f"{default['routed_fraction'][str(l)]:.3f}" if default else "-"
            print(f"| {l} | {c:.3f} | {routed} | {result['routing_accuracy'][str(l)]:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
