"""Prefix caching through the built `modserve` on models/demo, with real gRPC clients.

  exact    a server with --prefix_caching true and one with false answer the same requests
           (greedy and seeded, three shared system prompts, two thresholds, sent one by one and
           then 8 at a time): identical tokens and routing decisions, logprobs within 1e-5; the
           cached server's hit counters (metrics and GetModelInfo) show the reuse
  chaos    16 clients, 240 requests over the shared prompts on a small KV cache (evictions and
           preemptions), a quarter of them cancelled mid-stream or given short deadlines: every
           request ends, the server stays SERVING, and afterwards no sequence holds a KV page
           (pages only the cache references count as free), nothing runs or waits

    python3 tests/chaos/prefix_cache_test.py BUILD/bin/modserve models/demo [--seed N]

Exit status 0 when every check passes, 1 otherwise (each failed check is printed).
"""

import argparse
import concurrent.futures
import os
import random
import sys
import time

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
from loopback import Server, metric_sum, wait_for  # noqa: E402
from modserve.v1 import modserve_pb2 as pb  # noqa: E402
from modserve.v1 import modserve_pb2_grpc  # noqa: E402

FAILURES = []


def check(ok, what):
    if not ok:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)


def request(prompt, max_new, seed, threshold, request_id):
    r = pb.GenerateRequest(request_id=request_id, top_logprobs=2)
    r.prompt_token_ids.ids.extend(prompt)
    r.stopping.max_new_tokens = max_new
    r.stopping.ignore_eos = True
    if seed is None:
        r.sampling.temperature = 0.0
    else:
        r.sampling.temperature = 0.9
        r.sampling.seed = seed
    if threshold is not None:
        r.routing.threshold = threshold
    r.routing.return_decisions = True
    return r


def same(a, b, what):
    check(list(a.token_ids) == list(b.token_ids), f"{what}: tokens differ")
    check([l.decisions for l in a.routing.layers] == [l.decisions for l in b.routing.layers],
          f"{what}: routing decisions differ")
    worst = max([abs(x.logprob - y.logprob) for x, y in zip(a.logprobs, b.logprobs)] + [0.0])
    check(worst <= 1e-5, f"{what}: logprobs differ by {worst}")


def exact_phase(binary, model, rng):
    prompts = [[rng.randrange(3, 2000) for _ in range(n)] for n in (90, 150, 260)]
    cases = []
    for i in range(24):
        base = prompts[i % 3]
        suffix = [rng.randrange(3, 2000) for _ in range(rng.randrange(0, 12))]
        cases.append(request(base + suffix, rng.randrange(1, 12),
                             None if i % 2 == 0 else 1000 + i,
                             None if i % 4 < 2 else 0.3, f"exact-{i}"))
    # F32 KV: a 16-bit KV cache rounds each entry, so an entry computed in another batch (or
    # chunk) can differ by one rounding, with or without the cache; F32 keeps the comparison to
    # what the cache itself does.
    with Server(binary, model, "--prefix_caching", "true", "--kv_cache_dtype", "f32") as on, \
            Server(binary, model, "--prefix_caching=false", "--kv_cache_dtype", "f32") as off:
        stubs = [modserve_pb2_grpc.ModServeStub(grpc.insecure_channel(s.address))
                 for s in (on, off)]
        # One by one, then 8 at a time (batched with each other on the cached server).
        for r in cases[:12]:
            a, b = (s.Generate(r, timeout=60) for s in stubs)
            same(a, b, r.request_id)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda r: stubs[0].Generate(r, timeout=120), cases[12:]))
        for r, a in zip(cases[12:], got):
            same(a, stubs[1].Generate(r, timeout=60), r.request_id + " (concurrent)")
        m_on, m_off = on.metrics(), off.metrics()
        hits = metric_sum(m_on, "modserve_prefix_cache_hits_total")
        queries = metric_sum(m_on, "modserve_prefix_cache_queries_total")
        prompt_tokens = sum(len(r.prompt_token_ids.ids) for r in cases)
        check(queries == prompt_tokens, f"queries {queries} != prompt tokens {prompt_tokens}")
        check(hits >= 0.5 * queries, f"hit {hits} of {queries} prompt tokens")
        check(metric_sum(m_off, "modserve_prefix_cache_hits_total") == 0, "the off server hit")
        info = stubs[0].GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        check(info.prefix_caching and info.prefix_cache_hits == hits and
              info.prefix_cache_queries == queries and info.prefix_cache_blocks > 0,
              f"GetModelInfo prefix cache fields: {info}")
        info_off = stubs[1].GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        check(not info_off.prefix_caching, "the off server says it caches")
        print(f"exact: {len(cases)} requests identical; hit {int(hits)} of {int(queries)} "
              f"prompt tokens", flush=True)


def chaos_phase(binary, model, rng):
    prompts = [[rng.randrange(3, 2000) for _ in range(n)] for n in (64, 200, 333)]
    # 160 pages of 16 tokens (F32 KV of the demo: 8 KiB a page); the longest request may need
    # 6 x 22 = 132 of them.
    with Server(binary, model, "--kv_cache_bytes", str(160 * 8192), "--kv_cache_dtype", "f32",
                "--max_num_seqs", "16") as srv:
        channel = grpc.insecure_channel(srv.address)
        stub = modserve_pb2_grpc.ModServeStub(channel)
        outcomes = {}

        def one(i):
            lr = random.Random(i)  # per request: the same requests whatever the thread order
            r = request(prompts[i % 3] + [lr.randrange(3, 2000) for _ in range(i % 17)],
                        1 + i % 20, None if i % 3 else i, 0.3 if i % 5 == 0 else None,
                        f"chaos-{i}")
            kind = i % 8
            try:
                if kind == 0:  # cancelled after the first streamed message
                    stream = stub.GenerateStream(r, timeout=120)
                    next(stream)
                    stream.cancel()
                    return "cancelled"
                if kind == 1:  # a deadline that may or may not be met
                    stub.Generate(r, timeout=lr.choice([0.05, 0.2, 1.0]))
                    return "ok"
                for _ in stub.GenerateStream(r, timeout=120):
                    pass
                return "ok"
            except grpc.RpcError as e:
                return e.code().name
            except StopIteration:
                return "ended early"

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            for i, outcome in enumerate(pool.map(one, range(240))):
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
        allowed = {"ok", "cancelled", "CANCELLED", "DEADLINE_EXCEEDED"}
        check(set(outcomes) <= allowed, f"outcomes {outcomes}")
        check(outcomes.get("ok", 0) >= 150, f"only {outcomes.get('ok', 0)} requests completed")

        def idle():
            m = srv.metrics()
            return (metric_sum(m, "modserve_num_requests_running") == 0 and
                    metric_sum(m, "modserve_num_requests_waiting") == 0 and
                    metric_sum(m, "modserve_kv_cache_usage_ratio") == 0)
        wait_for(idle, 30, "no request running or waiting and no KV page held")
        m = srv.metrics()
        check(idle(), "KV pages still held after every request ended")
        hits = metric_sum(m, "modserve_prefix_cache_hits_total")
        check(hits > 0, "no prefix cache hit under load")
        health = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        check(health.prefix_cache_blocks >= 0, "GetModelInfo failed")
        # Still serving, and still right: one more request matches a fresh server's answer.
        r = request(prompts[2] + [5, 6, 7], 8, None, None, "after")
        after = stub.Generate(r, timeout=60)
        with Server(binary, model, "--prefix_caching=false", "--kv_cache_dtype", "f32") as fresh:
            ref = modserve_pb2_grpc.ModServeStub(grpc.insecure_channel(fresh.address))
            same(after, ref.Generate(r, timeout=60), "after the chaos")
        print(f"chaos: outcomes {outcomes}; preemptions "
              f"{int(metric_sum(m, 'modserve_num_preemptions_total'))}; hit {int(hits)} of "
              f"{int(metric_sum(m, 'modserve_prefix_cache_queries_total'))} prompt tokens",
              flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binary")
    ap.add_argument("model")
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    t0 = time.time()
    exact_phase(args.binary, args.model, rng)
    chaos_phase(args.binary, args.model, rng)
    print(f"prefix_cache_test: {len(FAILURES)} failure(s) in {time.time() - t0:.0f} s")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
