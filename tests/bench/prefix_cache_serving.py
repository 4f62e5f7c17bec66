"""Served throughput and TTFT with a shared system prompt, prefix caching on vs off.

Starts the built `modserve` twice on the same checkpoint (--prefix_caching true, then false),
drives each with modserve-loadgen over loopback gRPC using the same prompts (one shared system
prompt of --system_tokens token ids, then a different --user_tokens-token tail per request), and
prints a markdown table with the CPU model.

    python3 tests/bench/prefix_cache_serving.py BUILD MODEL [--system_tokens 1000]
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from loopback import Server, cpu_model, metric_sum  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("model")
    ap.add_argument("--system_tokens", type=int, default=1000)
    ap.add_argument("--user_tokens", type=int, default=24)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max_new_tokens", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=2000, help="token ids are drawn in [3, vocab)")
    args = ap.parse_args()
    rng = random.Random(1)
    system = [rng.randrange(3, args.vocab) for _ in range(args.system_tokens)]
    with tempfile.TemporaryDirectory() as tmp:
        prompts = os.path.join(tmp, "prompts.txt")
        with open(prompts, "w") as f:
            for _ in range(args.requests):
                user = [rng.randrange(3, args.vocab) for _ in range(args.user_tokens)]
                f.write("ids:" + ",".join(map(str, system + user)) + "\n")
        rows = []
        for caching in ("true", "false"):
            with Server(os.path.join(args.build, "bin", "modserve"), args.model,
                        "--prefix_caching", caching) as srv:
                out = os.path.join(tmp, f"{caching}.json")
                subprocess.run([os.path.join(args.build, "bin", "modserve-loadgen"),
                                "--server", srv.address, "--prompts", prompts,
                                "--num_requests", str(args.requests),
                                "--concurrency", str(args.concurrency),
                                "--max_new_tokens", str(args.max_new_tokens),
                                "--json_out", out], check=True, stdout=subprocess.DEVNULL)
                with open(out) as f:
                    r = json.load(f)
                m = srv.metrics()
                q = metric_sum(m, "modserve_prefix_cache_queries_total")
                h = metric_sum(m, "modserve_prefix_cache_hits_total")
                rows.append((caching, r, h / q if q else 0.0))
    print(f"prefix_cache_serving: {cpu_model()}; {os.path.basename(args.model.rstrip('/'))}; "
          f"{args.requests} requests, {args.concurrency} streams, prompt {args.system_tokens} "
          f"shared + {args.user_tokens} own tokens, {args.max_new_tokens} new tokens\n")
    print("| --prefix_caching | tokens/s | TTFT p50 (ms) | TTFT p90 (ms) | requests ok | "
          "prompt tokens hit |")
    print("|---|---|---|---|---|---|")
    for caching, r, rate in rows:
        print(f"| {caching} | {r['tokens_per_second']:.1f} | {1e3 * r['ttft_seconds']['p50']:.0f} | "
              f"{1e3 * r['ttft_seconds']['p90']:.0f} | {r['requests_ok']}/{r['requests_total']} | "
              f"{100 * rate:.0f}% |")


if __name__ == "__main__":
    main()
