"""Served throughput at many concurrent streams: modserve-loadgen against a real `modserve`.

For each checkpoint and each --concurrency value, starts the built `modserve` on loopback
(--max_num_seqs = the largest concurrency, so every stream of a run is in the running batch),
sends --waves x concurrency greedy requests of --prompt_tokens random token ids and
--max_new_tokens generated tokens each (ignore_eos), and prints one Markdown table: generated
tokens per second over the run's wall time (prefill included, as a client sees it), TTFT and
inter-token latency percentiles, generated tokens per step that decoded (decode and mixed steps,
from the server's /metrics: the batch the engine ran), and for MoD checkpoints the fraction of
block computations skipped (modserve_layer_tokens_total). The CPU model is printed with the table.

    python3 tests/bench/served_throughput.py build \\
        /tmp/modserve-bench/110m-dense,/tmp/modserve-bench/110m-mod --concurrency 16,64

The checkpoints are the synthetic ones `modserve-bench --shapes 110m,tinyllama` writes (random
weights, no tokenizer; the prompts are `ids:` lines below --vocab).
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from loopback import Server, cpu_model, metric_sum  # noqa: E402


def skipped_fraction(samples):
    computed = metric_sum(samples, "modserve_layer_tokens_total", decision="computed")
    skipped = metric_sum(samples, "modserve_layer_tokens_total", decision="skipped")
    total = computed + skipped
    return skipped / total if total else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("models", help="comma-separated checkpoint directories or .gguf files")
    ap.add_argument("--concurrency", default="16,64")
    ap.add_argument("--waves", type=int, default=2, help="requests per stream")
    ap.add_argument("--prompt_tokens", type=int, default=64)
    ap.add_argument("--max_new_tokens", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=32000, help="token ids are drawn in [3, vocab)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv_cache_bytes", type=int, default=1 << 30)
    ap.add_argument("--json", help="also write every run's loadgen results here")
    ap.add_argument("--server_args", default="",
                    help="more modserve flags, space separated (e.g. '--matmul_precision medium')")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    rng = random.Random(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        prompts = os.path.join(tmp, "prompts.txt")
        with open(prompts, "w") as f:
            for _ in range(max(levels) * args.waves):
                ids = [rng.randrange(3, args.vocab) for _ in range(args.prompt_tokens)]
                f.write("ids:" + ",".join(map(str, ids)) + "\n")
        for model in args.models.split(","):
            for c in levels:
                with Server(os.path.join(args.build, "bin", "modserve"), model,
                            "--max_num_seqs", str(max(levels)), "--threads", str(args.threads),
                            "--kv_cache_bytes", str(args.kv_cache_bytes),
                            *args.server_args.split()) as srv:
                    out = os.path.join(tmp, "run.json")
                    t0 = time.time()
                    subprocess.run([os.path.join(args.build, "bin", "modserve-loadgen"),
                                    "--server", srv.address, "--prompts", prompts,
                                    "--num_requests", str(c * args.waves),
                                    "--concurrency", str(c),
                                    "--max_new_tokens", str(args.max_new_tokens),
                                    "--json_out", out], check=True, stdout=subprocess.DEVNULL)
                    with open(out) as f:
                        r = json.load(f)
                    m = srv.metrics()
                    steps = sum(metric_sum(m, "modserve_step_duration_seconds_count", phase=ph)
                                for ph in ("decode", "mixed"))
                    r["model"] = os.path.basename(model.rstrip("/"))
                    r["skipped_fraction"] = skipped_fraction(m)
                    r["decode_steps"] = steps
                    rows.append(r)
                    print(f"{r['model']} x{c}: {r['tokens_per_second']:.1f} tok/s "
                          f"({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    print(f"served_throughput: {cpu_model()}; --threads {args.threads} {args.server_args}; "
          f"{args.waves} requests per stream, {args.prompt_tokens}-token prompts, "
          f"{args.max_new_tokens} new tokens, greedy\n")
    print("| checkpoint | streams | tokens/s | TTFT p50 (ms) | ITL p50 / p99 (ms) | "
          "tokens per step | block compute skipped | requests ok |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        per_step = r["tokens"] / r["decode_steps"] if r["decode_steps"] else 0.0
        print(f"| {r['model']} | {r['concurrency']} | {r['tokens_per_second']:.1f} | "
              f"{1e3 * r['ttft_seconds']['p50']:.0f} | {1e3 * r['itl_seconds']['p50']:.1f} / "
              f"{1e3 * r['itl_seconds']['p99']:.1f} | {per_step:.1f} | "
              f"{100 * r['skipped_fraction']:.1f}% | {r['requests_ok']}/{r['requests_total']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
