"""The MoD admission promise, end to end: with the same --kv_cache_bytes, the built `modserve`
on the MoD demo holds at least 1.7 times as many concurrent running sequences as on its dense
twin under a saturating load, without a preemption storm.

Each server first serves WARMUP requests (a server in steady state has measured its routed
fractions; a fresh one admits by the checkpoint's training capacity plus a wide margin), then
gets more requests than fit at once (prompts of fortunes text cut to PROMPT_TOKENS
tokens, MAX_NEW_TOKENS generated, EOS ignored), so admission is what limits the running batch;
modserve_num_requests_running is sampled from /metrics while requests wait. Expected on the demo
(3 of 6 layers routed at ~12.5%): dense 6 layers x 63 pages per 1000-token sequence, MoD
3 x 63 + 3 x ~9, i.e. ~1.75x; the ideal bytes ratio is 6 / 3.375 = 1.78x.

    python3 tests/server/mod_admission_test.py BUILD/bin/modserve models/demo models/demo-dense

Prints one table row per model (docs/PERFORMANCE.md quotes them) and exits 0 when the ratio
holds and preemptions stay under PREEMPTION_BOUND per request.
"""

import argparse
import concurrent.futures
import glob
import os
import statistics
import sys
import threading
import time

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
from loopback import Server, metric_sum  # noqa: E402
from modserve.v1 import modserve_pb2 as pb  # noqa: E402
from modserve.v1 import modserve_pb2_grpc  # noqa: E402
from modserve_client import Client  # noqa: E402

PROMPT_TOKENS = 800
MAX_NEW_TOKENS = 200
DENSE_SEQUENCES = 40  # the cache holds this many dense sequences of 1000 tokens
PAGE_BYTES = 2 * 2 * 16 * 32 * 4  # K and V x 2 KV heads x 16 tokens x head_dim 32 x f32
KV_CACHE_BYTES = DENSE_SEQUENCES * 6 * 63 * PAGE_BYTES
REQUESTS = 100  # more than either server admits at once
WARMUP = 8
MIN_RATIO = 1.7
PREEMPTION_BOUND = 0.25  # preemptions per request


def fortune_texts():
    files = sorted(glob.glob("/usr/share/games/fortunes/*"))
    texts = []
    for path in files:
        if path.endswith((".dat", ".u8")) or os.path.isdir(path):
            continue
        with open(path, errors="replace") as f:
            texts.append(f.read())
    if not texts:
        raise SystemExit("no fortunes under /usr/share/games/fortunes (Debian's fortunes package)")
    return "\n%\n".join(texts)


def run(binary, model, text):
    server = Server(binary, model, "--threads", "2", "--kv_cache_bytes", str(KV_CACHE_BYTES),
                    "--kv_cache_dtype", "f32", "--max_num_seqs", "128", "--max_queue", "256",
                    "--max_batch_tokens", "512")
    try:
        client = Client(server.address, timeout=60)
        ids = client.tokenize(text, add_special_tokens=True)
        # Distinct prompts: consecutive windows of the corpus.
        prompts = [ids[i * 997:i * 997 + PROMPT_TOKENS] for i in range(WARMUP + REQUESTS)]
        assert all(len(p) == PROMPT_TOKENS for p in prompts), "corpus too short"
        warmup, prompts = prompts[:WARMUP], prompts[WARMUP:]
        channel = grpc.insecure_channel(server.address)
        stub = modserve_pb2_grpc.ModServeStub(channel)

        def one(prompt):
            req = pb.GenerateRequest()
            req.prompt_token_ids.ids.extend(prompt)
            req.stopping.max_new_tokens = MAX_NEW_TOKENS
            req.stopping.ignore_eos = True
            return stub.Generate(req, timeout=600).usage.completion_tokens

        with concurrent.futures.ThreadPoolExecutor(WARMUP) as pool:
            list(pool.map(one, warmup))
        before = metric_sum(server.metrics(), "modserve_num_preemptions_total")
        samples = []
        done = threading.Event()

        def sample():
            while not done.is_set():
                m = server.metrics()
                if metric_sum(m, "modserve_num_requests_waiting") > 0:
                    samples.append(metric_sum(m, "modserve_num_requests_running"))
                done.wait(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(REQUESTS) as pool:
            generated = list(pool.map(one, prompts))
        seconds = time.monotonic() - started
        done.set()
        sampler.join()
        m = server.metrics()
        preemptions = metric_sum(m, "modserve_num_preemptions_total") - before
        channel.close()
        client.close()
        assert all(g == MAX_NEW_TOKENS for g in generated)
        if not samples:
            raise SystemExit(f"{model}: no request ever waited; the load does not saturate")
        return {"running": statistics.median(samples), "max_running": max(samples),
                "preemptions": preemptions, "seconds": seconds, "samples": len(samples)}
    finally:
        server.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary")
    ap.add_argument("mod")
    ap.add_argument("dense")
    args = ap.parse_args()
    text = fortune_texts()
    mod = run(args.binary, args.mod, text)
    dense = run(args.binary, args.dense, text)
    ratio = mod["running"] / dense["running"]
    print(f"| model | --kv_cache_bytes | running (median while others wait) | max | "
          f"preemptions | wall s |")
    for name, r in (("demo (MoD)", mod), ("demo-dense", dense)):
        print(f"| {name} | {KV_CACHE_BYTES} | {r['running']:g} | {r['max_running']:g} | "
              f"{r['preemptions']:g} | {r['seconds']:.1f} |")
    print(f"MoD / dense running sequences: {ratio:.2f}x (bound {MIN_RATIO}x)")
    problems = []
    if ratio < MIN_RATIO:
        problems.append(f"ratio {ratio:.2f} < {MIN_RATIO}")
    for name, r in (("mod", mod), ("dense", dense)):
        if r["preemptions"] > PREEMPTION_BOUND * REQUESTS:
            problems.append(f"{name}: {r['preemptions']:g} preemptions for {REQUESTS} requests")
    for p in problems:
        print(f"FAIL: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
