"""The same streamed workload on one `modserve`, over gRPC (modserve-loadgen) and over the
OpenAI-compatible HTTP API (guidellm, when its environment exists, and the openai SDK's async
client): time to first token, inter-token latency and output tokens per second at N concurrent
streams, as a markdown table with the CPU model. Rounds alternate the clients so that a noisy
machine hurts them alike; the table gives each client's median round.

    .venv/bin/python tests/bench/http_vs_grpc.py --model models/demo --concurrency 8 \\
        --requests 64 --max_tokens 64 --rounds 3 [--guidellm .venv-bench/bin/guidellm]

guidellm comes from tools/install_bench.sh (.venv-bench); it counts tokens with the model's own
tokenizer (--processor, a local directory: nothing is downloaded).
"""

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "common"))
from loopback import Server  # noqa: E402

PROMPTS = [
    "Once upon a time there was a little computer that",
    "Q: What is the best way to learn a new language?\nA:",
    "The trouble with computers is that",
    "In the beginning the universe was created. This has made a lot of people",
    "A penny saved is a penny earned, but",
    "The quick brown fox jumps over the lazy dog because",
    "Never put off until tomorrow what you can do today, unless",
    "To be or not to be, that is the question. Whether",
]


def cpu_model():
    info = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    name = info.get("model name") or platform.processor()
    if "cpu family" in info:
        name += f" (family {info['cpu family']} model {info.get('model', '?')})"
    return name


def percentile(values, p):
    """modserve-loadgen's percentile (the value at index floor(p * n), sorted)."""
    if not values:
        return 0.0
    v = sorted(values)
    return v[min(len(v) - 1, int(p / 100.0 * len(v)))]


def run_loadgen(loadgen, server, prompts_file, args, http=False):
    """modserve-loadgen over gRPC, or with --http the same C++ client over the HTTP API."""
    target = (["--http", f"127.0.0.1:{server.http_port}"] if http
              else ["--server", server.address])
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([loadgen, *target, "--prompts", prompts_file,
                        "--concurrency", str(args.concurrency), "--num_requests",
                        str(args.requests), "--max_new_tokens", str(args.max_tokens),
                        "--json_out", out.name], check=True, capture_output=True)
        j = json.load(open(out.name))
    assert j["requests_ok"] == args.requests, j
    return {"ttft_p50": j["ttft_seconds"]["p50"], "ttft_p90": j["ttft_seconds"]["p90"],
            "itl_p50": j["itl_seconds"]["p50"], "itl_p90": j["itl_seconds"]["p90"],
            "tok_s": j["tokens_per_second"], "tokens": j["tokens"]}


async def openai_round(base, args):
    import openai
    client = openai.AsyncOpenAI(base_url=base, api_key="x", max_retries=0, timeout=600)
    ttfts, itls, tokens = [], [], 0
    sem = asyncio.Semaphore(args.concurrency)

    async def one(i):
        nonlocal tokens
        async with sem:
            start = time.perf_counter()
            last, n = None, 0
            stream = await client.completions.create(
                model="demo", prompt=PROMPTS[i % len(PROMPTS)], max_tokens=args.max_tokens,
                temperature=0, stream=True, extra_body={"ignore_eos": True})
            async for chunk in stream:
                now = time.perf_counter()
                if not chunk.choices or chunk.choices[0].finish_reason is not None:
                    continue
                if last is None:
                    ttfts.append(now - start)
                else:
                    itls.append(now - last)
                last, n = now, n + 1
            tokens += n

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(args.requests)))
    wall = time.perf_counter() - t0
    await client.close()
    assert tokens == args.requests * args.max_tokens, tokens
    return {"ttft_p50": percentile(ttfts, 50), "ttft_p90": percentile(ttfts, 90),
            "itl_p50": percentile(itls, 50), "itl_p90": percentile(itls, 90),
            "tok_s": tokens / wall, "tokens": tokens}


def run_guidellm(guidellm, server, args):
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "prompts.jsonl")
        with open(data, "w") as f:
            for i in range(args.requests):
                f.write(json.dumps({"prompt": PROMPTS[i % len(PROMPTS)],
                                    "output_tokens_count": args.max_tokens}) + "\n")
        out = os.path.join(tmp, "benchmarks.json")
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   HF_DATASETS_OFFLINE="1", HF_HOME=os.path.join(tmp, "hf"),
                   GUIDELLM__LOGGING__CONSOLE_LOG_LEVEL="ERROR")
        subprocess.run([guidellm, "benchmark", "run", "--target",
                        f"http://127.0.0.1:{server.http_port}", "--model", "demo",
                        "--processor", os.path.abspath(args.model), "--data", data,
                        "--rate-type", "concurrent", "--rate", str(args.concurrency),
                        "--max-requests", str(args.requests), "--output-path", out,
                        "--disable-progress", "--disable-console-outputs"],
                       check=True, env=env, capture_output=True)
        b = json.load(open(out))["benchmarks"][0]["metrics"]

    def stat(name, key):
        s = b[name]["successful"]
        return s["median"] if key == "p50" else s["percentiles"][key]

    return {"ttft_p50": stat("time_to_first_token_ms", "p50") / 1e3,
            "ttft_p90": stat("time_to_first_token_ms", "p90") / 1e3,
            "itl_p50": stat("inter_token_latency_ms", "p50") / 1e3,
            "itl_p90": stat("inter_token_latency_ms", "p90") / 1e3,
            "tok_s": b["output_tokens_per_second"]["successful"]["mean"],
            "tokens": b["output_token_count"]["successful"]["total_sum"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "demo"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max_tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="engine threads (0 = every core)")
    ap.add_argument("--guidellm", default=os.path.join(ROOT, ".venv-bench", "bin", "guidellm"))
    ap.add_argument("--json_out")
    args = ap.parse_args()
    binary = os.path.join(args.build, "bin", "modserve")
    loadgen = os.path.join(args.build, "bin", "modserve-loadgen")
    clients = ["grpc (modserve-loadgen)", "http (modserve-loadgen --http)",
               "http (openai SDK, async)"]
    # guidellm counts tokens with a Hugging Face tokenizer directory: a checkpoint directory, not
    # a .gguf file.
    if os.path.exists(args.guidellm) and os.path.isdir(args.model):
        clients.append("http (guidellm)")
    rounds = {c: [] for c in clients}
    # The clients ask for model "demo", whatever the checkpoint.
    with Server(binary, args.model, "--threads", str(args.threads), "--http_port", "0",
                "--served_model_name", "demo") as server, \
            tempfile.NamedTemporaryFile("w", suffix=".txt") as prompts:
        prompts.write("\n".join(PROMPTS) + "\n")
        prompts.flush()
        base = f"http://127.0.0.1:{server.http_port}/v1"
        # Warm-up: one short round each.
        warm = argparse.Namespace(**{**vars(args), "requests": args.concurrency, "max_tokens": 8})
        run_loadgen(loadgen, server, prompts.name, warm)
        run_loadgen(loadgen, server, prompts.name, warm, http=True)
        asyncio.run(openai_round(base, warm))
        for r in range(args.rounds):
            order = clients[r % len(clients):] + clients[:r % len(clients)]
            for c in order:
                if "modserve-loadgen" in c:
                    rounds[c].append(run_loadgen(loadgen, server, prompts.name, args,
                                                 http="--http" in c))
                elif "guidellm" in c:
                    rounds[c].append(run_guidellm(args.guidellm, server, args))
                else:
                    rounds[c].append(asyncio.run(openai_round(base, args)))
                print(f"round {r + 1} {c}: {rounds[c][-1]['tok_s']:.0f} tok/s", file=sys.stderr)
    median = {c: sorted(v, key=lambda x: x["tok_s"])[len(v) // 2] for c, v in rounds.items()}
    grpc = median[clients[0]]["tok_s"]
    print(f"\n{cpu_model()}; {os.cpu_count()} cores; model {os.path.basename(args.model)}; "
          f"{args.concurrency} concurrent streams, {args.requests} requests x {args.max_tokens} "
          f"tokens; median of {args.rounds} rounds\n")
    print("| client | TTFT p50 | TTFT p90 | ITL p50 | ITL p90 | output tok/s | vs gRPC |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for c in clients:
        m = median[c]
        print(f"| {c} | {m['ttft_p50'] * 1e3:.1f} ms | {m['ttft_p90'] * 1e3:.1f} ms | "
              f"{m['itl_p50'] * 1e3:.2f} ms | {m['itl_p90'] * 1e3:.2f} ms | {m['tok_s']:.0f} | "
              f"{100 * m['tok_s'] / grpc:.0f}% |")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"rounds": rounds, "median": median}, f, indent=1)


if __name__ == "__main__":
    main()
