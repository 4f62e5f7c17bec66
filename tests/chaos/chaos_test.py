"""Bounded chaos test: starts the built `modserve` on free loopback ports and sends
500 requests from 32 concurrent clients (random prompt and output lengths, unary and streaming;
20% cancelled at a random moment, 10% with a deadline too short to finish, 5% invalid), then
checks that the server is SERVING, holds no KV pages and no running or waiting sequence, answered
every request with a complete response or the right status code, did not grow its resident memory
past a stated bound, and counted exactly the requests it saw. No network beyond 127.0.0.1; it
does not test drain or overload (RESOURCE_EXHAUSTED) behaviour.

    python3 tests/chaos/chaos_test.py BUILD/bin/modserve models/demo [--seed N] [--json_out F]

Exit status 0 when every check passes, 1 otherwise (each failed check is printed).
"""

import argparse
import collections
import concurrent.futures
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
from loopback import Server, is_sanitized  # noqa: E402
from modserve.v1 import modserve_pb2 as pb  # noqa: E402
from modserve.v1 import modserve_pb2_grpc  # noqa: E402
from modserve_client import Client  # noqa: E402

FINISH = {pb.FINISH_REASON_LENGTH: "length", pb.FINISH_REASON_STOP_TOKEN: "stop_token",
          pb.FINISH_REASON_STOP_STRING: "stop_string"}

# Server settings. The KV pool is kept small (32 MiB, ~11k tokens of the demo model): it is the
# one large buffer that fills lazily, and its free list is a ring, so every page is touched
# eventually. The warm-up (WARMUP_REQUESTS long requests) takes the ring round about twice before
# the first RSS reading, so what grows afterwards is not the pool. Measured on the demo model:
# +4-5 MiB over the 500 requests (allocator arenas of gRPC threads), and the same end RSS after
# 2000 requests, i.e. a plateau. RSS_BOUND_MIB = 16 leaves three times that and still catches a
# leak of 32 KiB per request (a unary response with its logprobs and routing, a stream's message
# queue, a KV slice); leaked pages themselves are caught exactly by the kv_cache_usage check.
KV_CACHE_BYTES = 32 << 20
RSS_BOUND_MIB = 16
WARMUP_REQUESTS = 64

# Invalid requests: (mutation, expected gRPC code, field the message must name).
INVALID = [
    ("top_p", grpc.StatusCode.INVALID_ARGUMENT, "sampling.top_p"),
    ("temperature", grpc.StatusCode.INVALID_ARGUMENT, "sampling.temperature"),
    ("token_id", grpc.StatusCode.INVALID_ARGUMENT, "prompt_token_ids"),
    ("max_new_tokens", grpc.StatusCode.INVALID_ARGUMENT, "stopping.max_new_tokens"),
    ("top_logprobs", grpc.StatusCode.INVALID_ARGUMENT, "top_logprobs"),
    ("threshold", grpc.StatusCode.INVALID_ARGUMENT, "routing.threshold"),
    ("empty_prompt", grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
    ("request_id", grpc.StatusCode.INVALID_ARGUMENT, "request_id"),
    ("stop_count", grpc.StatusCode.INVALID_ARGUMENT, "stopping.stop"),
    ("too_long", grpc.StatusCode.OUT_OF_RANGE, "max_seq_len"),
]

TEXT_PROMPTS = [
    "Once upon a time",
    "Q: What is a computer?\nA:",
    "The trouble with computers is",
    "In the beginning there was a small village by the river, and",
    "List three colours:\n1.",
]


class Plan:
    """One request: what is sent and what the client does with it."""

    def __init__(self, index, kind, api, request, prompt_len, cancel_after=None,
                 cancel_seconds=None, deadline=None, expect=None):
        self.index = index
        self.kind = kind  # normal | cancel | deadline | invalid
        self.api = api  # unary | stream
        self.request = request
        self.prompt_len = prompt_len  # tokens the server should report (None for invalid)
        self.cancel_after = cancel_after  # stream: cancel after this many messages
        self.cancel_seconds = cancel_seconds  # unary: cancel after this long without a response
        self.deadline = deadline  # seconds
        self.expect = expect  # invalid: (code, field)
        # Filled in by the run.
        self.code = None
        self.details = ""
        self.token_ids = []
        self.text = ""
        self.finish = None
        self.usage = None
        self.messages = 0
        self.final_seen = 0  # messages with a finish_reason (streams)


def make_plans(rng, n, info, text_prompt_lens):
    vocab, ctx = info.vocab_size, info.max_seq_len
    counts = {"cancel": n * 20 // 100, "deadline": n * 10 // 100, "invalid": n * 5 // 100}
    kinds = [k for k, c in counts.items() for _ in range(c)]
    kinds += ["normal"] * (n - len(kinds))
    rng.shuffle(kinds)
    plans = []
    for i, kind in enumerate(kinds):
        api = rng.choice(["unary", "stream"])
        req = pb.GenerateRequest(request_id=f"chaos-{i}")
        if kind == "normal" and rng.random() < 0.25:
            text = rng.choice(TEXT_PROMPTS)
            req.prompt = text
            prompt_len = text_prompt_lens[text]
            if rng.random() < 0.5:
                req.stopping.stop.append(rng.choice(["\n", ".", " the"]))
        else:
            prompt_len = rng.randint(1, 256)
            req.prompt_token_ids.ids.extend([1] + [rng.randrange(3, vocab)
                                                   for _ in range(prompt_len - 1)])
        # Long outputs for the requests that must still be running when they are cut short.
        if kind in ("cancel", "deadline"):
            max_new = rng.randint(256, min(1024, ctx - prompt_len))
            req.stopping.ignore_eos = True
        else:
            max_new = rng.randint(1, 128)
            req.stopping.ignore_eos = rng.random() < 0.5
        req.stopping.max_new_tokens = max_new
        if rng.random() < 0.5:
            req.sampling.temperature = rng.choice([0.7, 1.0])
            req.sampling.top_p = rng.choice([0.9, 1.0])
            req.sampling.seed = rng.randrange(2 ** 32)
        if rng.random() < 0.2:
            req.stopping.stop_token_ids.append(rng.randrange(3, vocab))
        if rng.random() < 0.2:
            req.top_logprobs = rng.randint(1, 5)
        if rng.random() < 0.2:
            req.routing.threshold = rng.choice([0.3, 0.5, 0.7])
            req.routing.return_decisions = rng.random() < 0.5
        plan = Plan(i, kind, api, req, prompt_len)
        if kind == "cancel":
            # A random moment after the server has the request: a stream after its k-th message,
            # a unary call after 50-500 ms without its response (loopback delivers in well under
            # a millisecond, so the server has seen the call by then).
            plan.cancel_after = rng.randint(1, 32)
            plan.cancel_seconds = rng.uniform(0.05, 0.5)
        elif kind == "deadline":
            plan.deadline = rng.uniform(0.1, 0.4)
        elif kind == "invalid":
            mutation, code, field = INVALID[rng.randrange(len(INVALID))]
            plan.expect = (code, field)
            plan.prompt_len = None
            if mutation == "top_p":
                req.sampling.top_p = 1.5
            elif mutation == "temperature":
                req.sampling.temperature = -1.0
            elif mutation == "token_id":
                req.prompt_token_ids.ids.append(vocab)
            elif mutation == "max_new_tokens":
                req.stopping.max_new_tokens = 0
            elif mutation == "top_logprobs":
                req.top_logprobs = 21
            elif mutation == "threshold":
                req.routing.threshold = 1.5
            elif mutation == "empty_prompt":
                req.prompt = ""
            elif mutation == "request_id":
                req.request_id = "r" * 200
            elif mutation == "stop_count":
                req.stopping.stop.extend(["x"] * 17)
            elif mutation == "too_long":
                req.stopping.max_new_tokens = ctx
        plans.append(plan)
    return plans


def make_warmup(rng, n, info):
    plans = []
    for i in range(n):
        prompt_len = rng.randint(200, 300)
        req = pb.GenerateRequest(request_id=f"warm-{i}")
        req.prompt_token_ids.ids.extend([1] + [rng.randrange(3, info.vocab_size)
                                               for _ in range(prompt_len - 1)])
        req.stopping.max_new_tokens = rng.randint(64, 160)
        req.stopping.ignore_eos = True
        plans.append(Plan(i, "normal", "unary" if i % 2 else "stream", req, prompt_len))
    return plans


def run_one(stub, plan, default_timeout):
    timeout = plan.deadline if plan.deadline is not None else default_timeout
    try:
        if plan.api == "unary":
            fut = stub.Generate.future(plan.request, timeout=timeout)
            if plan.kind == "cancel":
                try:
                    fut.result(timeout=plan.cancel_seconds)
                except grpc.FutureTimeoutError:
                    fut.cancel()
            resp = fut.result()
            plan.messages = 1
            plan.final_seen = 1
            plan.token_ids = list(resp.token_ids)
            plan.text = resp.text
            plan.finish = resp.finish_reason
            plan.usage = (resp.usage.prompt_tokens, resp.usage.completion_tokens)
        else:
            call = stub.GenerateStream(plan.request, timeout=timeout)
            for msg in call:
                plan.messages += 1
                plan.token_ids.extend(msg.token_ids)
                plan.text += msg.text
                if msg.finish_reason != pb.FINISH_REASON_UNSPECIFIED:
                    plan.final_seen += 1
                    plan.finish = msg.finish_reason
                    plan.usage = (msg.usage.prompt_tokens, msg.usage.completion_tokens)
                if plan.kind == "cancel" and plan.messages == plan.cancel_after:
                    call.cancel()
        plan.code = grpc.StatusCode.OK
    except grpc.FutureCancelledError:
        plan.code = grpc.StatusCode.CANCELLED
    except grpc.RpcError as e:
        plan.code = e.code()
        plan.details = e.details() or ""


def check_plan(plan, info, eos):
    """Returns a list of problems with this request's outcome (empty when it is as expected)."""
    where = f"request {plan.index} ({plan.kind}, {plan.api})"
    if plan.kind == "invalid":
        code, field = plan.expect
        if plan.code != code or field not in plan.details:
            return [f"{where}: expected {code.name} naming {field!r}, got {plan.code} "
                    f"{plan.details!r}"]
        return []
    allowed = {"normal": {grpc.StatusCode.OK},
               "cancel": {grpc.StatusCode.OK, grpc.StatusCode.CANCELLED},
               "deadline": {grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED}}[plan.kind]
    if plan.code not in allowed:
        return [f"{where}: got {plan.code} {plan.details!r}, expected one of "
                f"{sorted(c.name for c in allowed)}"]
    if plan.code != grpc.StatusCode.OK:
        return []
    # Completed: a finish reason and usage that match what was generated.
    problems = []
    max_new = plan.request.stopping.max_new_tokens
    n = len(plan.token_ids)
    if plan.final_seen != 1 or plan.finish not in FINISH:
        problems.append(f"{where}: {plan.final_seen} final messages, finish_reason {plan.finish}")
    if plan.usage != (plan.prompt_len, n):
        problems.append(f"{where}: usage {plan.usage} != (prompt {plan.prompt_len}, "
                        f"generated {n})")
    if not 1 <= n <= max_new:
        problems.append(f"{where}: {n} tokens for max_new_tokens {max_new}")
    reason = FINISH.get(plan.finish)
    if reason == "length" and n != max_new:
        problems.append(f"{where}: finish length after {n} of {max_new} tokens")
    if reason == "stop_token":
        stops = set(plan.request.stopping.stop_token_ids)
        if not plan.request.stopping.ignore_eos:
            stops |= eos
        if plan.token_ids[-1] not in stops:
            problems.append(f"{where}: finish stop_token on token {plan.token_ids[-1]}, "
                            f"stop ids {sorted(stops)}")
    if reason == "stop_string" and not plan.request.stopping.stop:
        problems.append(f"{where}: finish stop_string without stop strings")
    if any(not 0 <= t < info.vocab_size for t in plan.token_ids):
        problems.append(f"{where}: token outside the vocabulary")
    return problems


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        body = resp.read().decode()
    values = collections.defaultdict(float)
    for line in body.splitlines():
        m = re.match(r"^(modserve_[a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+|NaN)$", line)
        if m:
            values[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return values


def metric(values, name):
    """Sum over every label set of `name`."""
    return sum(v for (n, _), v in values.items() if n == name)


def by_label(values, name, label):
    out = {}
    for (n, labels), v in values.items():
        if n == name:
            m = re.search(rf'{label}="([^"]*)"', labels)
            out[m.group(1) if m else ""] = v
    return out


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def wait_for(predicate, timeout):
    """Polls `predicate` (which scrapes the server) until it holds or `timeout` passes; the
    gauges are refreshed on the server's health timer and cancellations are reaped one engine
    iteration after they arrive, so the settled state is reached shortly after the last call."""
    give_up = time.monotonic() + timeout
    event = threading.Event()
    while True:
        result = predicate()
        if result[0] or time.monotonic() > give_up:
            return result
        event.wait(0.05)


def run_phase(stub, plans, concurrency, default_timeout):
    work = queue.Queue()
    for p in plans:
        work.put(p)

    def worker():
        while True:
            try:
                p = work.get_nowait()
            except queue.Empty:
                return
            run_one(stub, p, default_timeout)

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        for f in [pool.submit(worker) for _ in range(concurrency)]:
            f.result()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary")
    ap.add_argument("checkpoint")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="server CPU backend threads")
    ap.add_argument("--json_out", default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2 ** 31)
    print(f"chaos: seed {seed} (rerun with --seed {seed})", flush=True)
    rng = random.Random(seed)
    started = time.monotonic()
    sanitized = is_sanitized(args.binary)

    log = tempfile.TemporaryFile(mode="w+")
    try:
        server = Server(args.binary, args.checkpoint, "--threads", str(args.threads),
                        "--kv_cache_bytes", str(KV_CACHE_BYTES), "--max_num_seqs", "16",
                        "--max_queue", "256", "--seed", str(seed), "--drain_timeout", "10s",
                        stderr=log)
    except RuntimeError as e:
        log.seek(0)
        print(f"chaos: the server did not start ({e}):\n{log.read()[-4000:]}")
        return 1
    proc = server.proc
    problems = []
    summary = {}
    try:
        port, metrics_port = server.port, server.metrics_port
        target = f"127.0.0.1:{port}"
        channel = grpc.insecure_channel(target)
        stub = modserve_pb2_grpc.ModServeStub(channel)
        client = Client(target, timeout=60)
        info = client.info()
        eos = set(info.eos_token_ids)
        text_lens = {t: len(client.tokenize(t, add_special_tokens=True)) for t in TEXT_PROMPTS}

        # Warm-up: long plain requests, unary and streamed, at full concurrency, so that the
        # allocator arenas and gRPC buffers exist and the KV page ring has gone round (about
        # 64 x 400 tokens, twice the pool) before the first RSS reading.
        warm = make_warmup(random.Random(seed + 1), WARMUP_REQUESTS, info)
        run_phase(stub, warm, args.concurrency, 120)
        for p in warm:
            problems += check_plan(p, info, eos)
        base = scrape(metrics_port)
        rss_before = rss_kib(proc.pid)
        warm_seen = metric(base, "modserve_request_success_total") + \
            metric(base, "modserve_request_failure_total")
        if warm_seen != len(warm):
            problems.append(f"after warm-up the counters hold {warm_seen} requests, "
                            f"{len(warm)} were sent")

        plans = make_plans(rng, args.requests, info, text_lens)
        chaos_started = time.monotonic()
        run_phase(stub, plans, args.concurrency, 120)
        chaos_seconds = time.monotonic() - chaos_started
        for p in plans:
            problems += check_plan(p, info, eos)

        # Settled state: nothing running or waiting, no page in use, every request counted.
        sent = len(plans)

        def settled():
            v = scrape(metrics_port)
            seen = (metric(v, "modserve_request_success_total") +
                    metric(v, "modserve_request_failure_total") - warm_seen)
            idle = (metric(v, "modserve_kv_cache_usage_ratio") == 0 and
                    metric(v, "modserve_num_requests_running") == 0 and
                    metric(v, "modserve_num_requests_waiting") == 0)
            return (idle and seen == sent, v, seen)

        _, after, seen = wait_for(settled, 10.0)
        rss_after = rss_kib(proc.pid)
        health = client.health()
        health_svc = client.health("modserve.v1.ModServe")
        if health != "SERVING" or health_svc != "SERVING":
            problems.append(f"health after the run: '' {health}, modserve.v1.ModServe "
                            f"{health_svc}")
        kv = metric(after, "modserve_kv_cache_usage_ratio")
        running = metric(after, "modserve_num_requests_running")
        waiting = metric(after, "modserve_num_requests_waiting")
        if kv != 0 or running != 0 or waiting != 0:
            problems.append(f"not idle 10 s after the last response: kv_cache_usage_ratio {kv}, "
                            f"running {running}, waiting {waiting}")
        if proc.poll() is not None:
            problems.append(f"the server exited with {proc.returncode}")

        # Counters: the server counts every request it receives once, as a success (by finish
        # reason) or a failure (by code). Client-side outcomes bound the split.
        success = {k: v - by_label(base, "modserve_request_success_total", "finish_reason")
                   .get(k, 0) for k, v in
                   by_label(after, "modserve_request_success_total", "finish_reason").items()}
        failure = {k: v - by_label(base, "modserve_request_failure_total", "code").get(k, 0)
                   for k, v in by_label(after, "modserve_request_failure_total", "code").items()}
        outcome = collections.Counter()
        for p in plans:
            if p.kind == "invalid":
                outcome["rejected"] += 1
            elif p.code == grpc.StatusCode.OK:
                outcome["completed"] += 1
            elif p.code == grpc.StatusCode.CANCELLED:
                outcome["cancelled"] += 1
            elif p.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                outcome["expired"] += 1
            else:
                outcome["other"] += 1
        n_success = sum(success.values())
        n_failure = sum(failure.values())
        if n_success + n_failure != sent:
            problems.append(f"counters: success {n_success:g} + failure {n_failure:g} = "
                            f"{n_success + n_failure:g}, but {sent} requests were sent "
                            f"(success {success}, failure {failure})")
        # Every completed response is a server success; the server may also have finished a
        # cancelled or expired request whose client had already given up.
        given_up = outcome["cancelled"] + outcome["expired"]
        if not outcome["completed"] <= n_success <= outcome["completed"] + given_up:
            problems.append(f"counters: {n_success:g} successes for {outcome['completed']} "
                            f"completed responses and {given_up} given up")
        rejected = failure.get("INVALID_ARGUMENT", 0) + failure.get("OUT_OF_RANGE", 0)
        if rejected != outcome["rejected"]:
            problems.append(f"counters: {rejected:g} INVALID_ARGUMENT/OUT_OF_RANGE for "
                            f"{outcome['rejected']} invalid requests")
        # DEADLINE_EXCEEDED only for requests whose deadline passed. (The converse is looser: a
        # client whose own timer fires first cancels the call a few milliseconds before the
        # server's copy of the deadline, and that request is counted CANCELLED.)
        if failure.get("DEADLINE_EXCEEDED", 0) > outcome["expired"]:
            problems.append(f"counters: {failure.get('DEADLINE_EXCEEDED', 0):g} "
                            f"DEADLINE_EXCEEDED for {outcome['expired']} expired requests")
        if failure.get("CANCELLED", 0) + failure.get("DEADLINE_EXCEEDED", 0) > given_up:
            problems.append(f"counters: more CANCELLED + DEADLINE_EXCEEDED than the {given_up} "
                            f"requests the clients gave up")
        unexpected = {k: v for k, v in failure.items()
                      if v and k not in ("INVALID_ARGUMENT", "OUT_OF_RANGE", "CANCELLED",
                                         "DEADLINE_EXCEEDED")}
        if unexpected:
            problems.append(f"counters: unexpected failures {unexpected}")
        completed_by_reason = collections.Counter(
            FINISH[p.finish] for p in plans if p.code == grpc.StatusCode.OK and p.finish in FINISH)
        for reason, count in completed_by_reason.items():
            if success.get(reason, 0) < count:
                problems.append(f"counters: {success.get(reason, 0):g} successes '{reason}' "
                                f"for {count} such responses")

        growth_mib = (rss_after - rss_before) / 1024
        # A sanitizer build keeps freed memory in quarantine (ASan: up to 256 MiB), so its RSS
        # says nothing about leaks; LeakSanitizer checks them at exit instead (below).
        if growth_mib > RSS_BOUND_MIB and not sanitized:
            problems.append(f"RSS grew {growth_mib:.1f} MiB (from {rss_before // 1024} to "
                            f"{rss_after // 1024} MiB), bound {RSS_BOUND_MIB} MiB")
        # SIGTERM drains and exits 0; in a sanitizer build a leak report makes the exit non-zero.
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=120)
            if code != 0:
                problems.append(f"the server exited with {code} after SIGTERM")
        except subprocess.TimeoutExpired:
            problems.append("the server did not exit within 120 s of SIGTERM")
        summary = {
            "seed": seed,
            "sent": sent,
            "concurrency": args.concurrency,
            "planned": dict(collections.Counter(p.kind for p in plans)),
            "completed": outcome["completed"],
            "cancelled": outcome["cancelled"],
            "expired": outcome["expired"],
            "rejected": outcome["rejected"],
            "other": outcome["other"],
            "server_success": success,
            "server_failure": {k: v for k, v in failure.items() if v},
            "server_counted": n_success + n_failure,
            "kv_cache_usage_ratio": kv,
            "rss_before_mib": round(rss_before / 1024, 1),
            "rss_after_mib": round(rss_after / 1024, 1),
            "rss_bound_mib": None if sanitized else RSS_BOUND_MIB,
            "preemptions": metric(after, "modserve_num_preemptions_total"),
            "chaos_seconds": round(chaos_seconds, 1),
            "total_seconds": round(time.monotonic() - started, 1),
            "problems": len(problems),
        }
        client.close()
        channel.close()
    finally:
        if proc.poll() is None:
            try:
                server.terminate(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        server.stop()
    if summary:
        rows = [("seed", summary["seed"]), ("sent", summary["sent"]),
                ("planned", summary["planned"]),
                ("completed", summary["completed"]), ("cancelled", summary["cancelled"]),
                ("expired (DEADLINE_EXCEEDED)", summary["expired"]),
                ("rejected (invalid)", summary["rejected"]), ("other", summary["other"]),
                ("server successes", summary["server_success"]),
                ("server failures", summary["server_failure"]),
                ("server counted", f"{summary['server_counted']:g}"),
                ("KV pages in use after (ratio)", summary["kv_cache_usage_ratio"]),
                ("preemptions", f"{summary['preemptions']:g}"),
                ("RSS after warm-up / end", f"{summary['rss_before_mib']} / "
                                            f"{summary['rss_after_mib']} MiB "
                                            + ("(sanitizer build: no bound)" if sanitized
                                               else f"(bound +{RSS_BOUND_MIB} MiB)")),
                ("chaos phase / total", f"{summary['chaos_seconds']} s / "
                                        f"{summary['total_seconds']} s")]
        for k, v in rows:
            print(f"  {k:<30} {v}")
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(summary, f, indent=2, sort_keys=True)
    for p in problems:
        print(f"FAIL: {p}")
    if problems:
        log.seek(0)
        print("server log (tail):\n" + log.read()[-3000:])
    print(f"chaos: {'FAILED' if problems else 'passed'} ({len(problems)} problems)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
