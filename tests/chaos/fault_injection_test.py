"""Fault-injection chaos test: the built `modserve` on models/demo and variants of it, under load,
with faults that must stay inside the request that caused them. Phases (each its own server):

  faults     per-request sampler and detokenizer faults (--inject_faults): the requests they hit
             end with INTERNAL, every other one completes, health stays SERVING
  padded     an embedding padded past the tokenizer (2048 -> 2112 ids): padded ids in prompts and
             stop lists are INVALID_ARGUMENT, high-temperature sampling never returns one
  hostile    hostile stop lists (too many ids, padded ids, huge lists near the message limit)
  burst      128 requests at routing threshold 0.01 (nearly dense) on a tiny KV cache with
             --max_num_seqs 128: all complete, with a bounded number of preemptions
  backend    a backend fault at a given step under load: every accepted request ends (INTERNAL
             or UNAVAILABLE), health turns NOT_SERVING, later requests get UNAVAILABLE
  stop       SIGTERM with a short drain under load: every request ends (OK, UNAVAILABLE, or
             CANCELLED by gRPC's own shutdown), exit status 0

After each phase: KV pages 0, nothing running or waiting, every request answered, and the idle
server burns under 5% of a core over 2 s (no spinning thread).

    python3 tests/chaos/fault_injection_test.py BUILD/bin/modserve models/demo [--seed N]

Exit status 0 when every check passes, 1 otherwise (each failed check is printed).
"""

import argparse
import concurrent.futures
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
from loopback import Server, metric_sum, wait_for  # noqa: E402
from modserve.v1 import modserve_pb2 as pb  # noqa: E402
from modserve.v1 import modserve_pb2_grpc  # noqa: E402
from modserve_client import Client  # noqa: E402

IDLE_CPU_LIMIT = 0.05  # of one core, over IDLE_SECONDS
IDLE_SECONDS = 2.0
PADDED_VOCAB = 2112


def pad_vocab(src, dst, vocab):
    """Copies checkpoint `src` to `dst` with embed_tokens and lm_head padded with zero rows to
    `vocab` rows (the tokenizer is unchanged: the new ids name no token)."""
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(src, "model.safetensors"), "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    out_header, chunks, offset = {}, [], 0
    for name in sorted(header, key=lambda k: header[k]["data_offsets"][0]):
        t = header[name]
        begin, end = t["data_offsets"]
        blob = data[begin:end]
        shape = list(t["shape"])
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            row = len(blob) // shape[0]
            blob += b"\0" * (row * (vocab - shape[0]))
            shape[0] = vocab
        out_header[name] = {"dtype": t["dtype"], "shape": shape,
                            "data_offsets": [offset, offset + len(blob)]}
        chunks.append(blob)
        offset += len(blob)
    if meta is not None:
        out_header["__metadata__"] = meta
    text = json.dumps(out_header).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(os.path.join(dst, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for c in chunks:
            f.write(c)
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config["vocab_size"] = vocab
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    shutil.copy(os.path.join(src, "tokenizer.json"), dst)


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


def token_request(rng, vocab, max_new, request_id, threshold=None, temperature=None):
    req = pb.GenerateRequest(request_id=request_id)
    n = rng.randint(2, 96)
    req.prompt_token_ids.ids.extend([1] + [rng.randrange(3, vocab) for _ in range(n - 1)])
    req.stopping.max_new_tokens = max_new
    req.stopping.ignore_eos = True
    if threshold is not None:
        req.routing.threshold = threshold
    if temperature is not None:
        req.sampling.temperature = temperature
        req.sampling.seed = rng.randrange(2 ** 32)
    return req


def call(stub, req, api, timeout=120):
    """(code, details, tokens) of one request, unary or streamed."""
    try:
        if api == "unary":
            resp = stub.Generate(req, timeout=timeout)
            return grpc.StatusCode.OK, "", list(resp.token_ids)
        tokens = []
        for msg in stub.GenerateStream(req, timeout=timeout):
            tokens.extend(msg.token_ids)
        return grpc.StatusCode.OK, "", tokens
    except grpc.RpcError as e:
        return e.code(), e.details() or "", []


def run_all(stub, reqs, concurrency=16):
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        futures = [pool.submit(call, stub, r, "unary" if i % 2 else "stream")
                   for i, r in enumerate(reqs)]
        return [f.result() for f in futures]


class Phase:
    def __init__(self, name, binary, model, *flags, log):
        self.name = name
        self.problems = []
        self.server = Server(binary, model, "--threads", "2", *flags, stderr=log)
        self.channel = grpc.insecure_channel(self.server.address)
        self.stub = modserve_pb2_grpc.ModServeStub(self.channel)
        self.client = Client(self.server.address, timeout=10)

    def fail(self, what):
        self.problems.append(f"{self.name}: {what}")

    def health_status(self):
        return self.client.health()

    def check_settled(self, want_health="SERVING"):
        """KV pages free, nothing running or waiting, health as expected, no spinning."""
        def idle():
            m = self.server.metrics()
            return (metric_sum(m, "modserve_kv_cache_usage_ratio") == 0 and
                    metric_sum(m, "modserve_num_requests_running") == 0 and
                    metric_sum(m, "modserve_num_requests_waiting") == 0)
        try:
            wait_for(idle, 10, "idle")
        except TimeoutError:
            m = self.server.metrics()
            self.fail("not idle 10 s after the last response: kv "
                      f"{metric_sum(m, 'modserve_kv_cache_usage_ratio')}, running "
                      f"{metric_sum(m, 'modserve_num_requests_running')}, waiting "
                      f"{metric_sum(m, 'modserve_num_requests_waiting')}")
        try:
            wait_for(lambda: self.health_status() == want_health, 10, "health")
        except TimeoutError:
            self.fail(f"health {self.health_status()}, expected {want_health}")
        pid = self.server.proc.pid
        before = cpu_seconds(pid)
        time.sleep(IDLE_SECONDS)
        used = (cpu_seconds(pid) - before) / IDLE_SECONDS
        if used > IDLE_CPU_LIMIT:
            self.fail(f"the idle server used {used:.1%} of a core over {IDLE_SECONDS} s")
        return used

    def close(self):
        self.client.close()
        self.channel.close()
        if self.server.proc.poll() is None:
            try:
                self.server.terminate(timeout=60)
            except subprocess.TimeoutExpired:
                self.fail("did not exit within 60 s of SIGTERM")
        self.server.stop()


def phase_faults(binary, model, rng, log):
    p = Phase("faults", binary, model, "--inject_faults",
              f"sampler=0.01,detokenizer=0.01,seed={rng.randrange(2 ** 31)}", log=log)
    reqs = [token_request(rng, 2048, rng.randint(8, 48), f"f{i}") for i in range(160)]
    results = run_all(p.stub, reqs)
    codes = [c for c, _, _ in results]
    internal = sum(c == grpc.StatusCode.INTERNAL for c in codes)
    ok = sum(c == grpc.StatusCode.OK for c in codes)
    if internal == 0 or ok == 0:
        p.fail(f"expected some INTERNAL and some OK, got {internal} / {ok}")
    if internal + ok != len(codes):
        p.fail(f"other codes: {sorted({c.name for c in codes} - {'OK', 'INTERNAL'})}")
    for (code, _, tokens), req in zip(results, reqs):
        if code == grpc.StatusCode.OK and len(tokens) != req.stopping.max_new_tokens:
            p.fail(f"{req.request_id}: {len(tokens)} tokens for {req.stopping.max_new_tokens}")
    m = p.server.metrics()
    if metric_sum(m, "modserve_request_failure_total", code="INTERNAL") != internal:
        p.fail("the INTERNAL failures are not counted once each")
    p.check_settled("SERVING")
    p.close()
    return p.problems, {"internal": internal, "ok": ok}


def phase_padded(binary, model, rng, log, workdir):
    padded = os.path.join(workdir, "demo-padded")
    pad_vocab(model, padded, PADDED_VOCAB)
    p = Phase("padded", binary, padded, log=log)
    bad = pb.GenerateRequest(request_id="padded-prompt")
    bad.prompt_token_ids.ids.extend([1, 2100])
    code, details, _ = call(p.stub, bad, "unary")
    if code != grpc.StatusCode.INVALID_ARGUMENT or "2100" not in details:
        p.fail(f"prompt id 2100: {code} {details!r}")
    stop = token_request(rng, 2048, 4, "padded-stop")
    stop.stopping.stop_token_ids.append(2050)
    code, details, _ = call(p.stub, stop, "stream")
    if code != grpc.StatusCode.INVALID_ARGUMENT or "2050" not in details:
        p.fail(f"stop id 2050: {code} {details!r}")
    hot = [token_request(rng, 2048, 48, f"hot{i}", temperature=5.0) for i in range(48)]
    results = run_all(p.stub, hot)
    for (code, details, tokens), req in zip(results, hot):
        if code != grpc.StatusCode.OK:
            p.fail(f"{req.request_id}: {code} {details!r}")
        elif any(t >= 2048 for t in tokens):
            p.fail(f"{req.request_id}: sampled a padded id")
    p.check_settled("SERVING")
    p.close()
    return p.problems, {}


def phase_hostile(binary, model, rng, log):
    p = Phase("hostile", binary, model, log=log)
    cases = []
    many = token_request(rng, 2048, 4, "many-stop-ids")
    many.stopping.stop_token_ids.extend(rng.randrange(3, 2048) for _ in range(5000))
    cases.append((many, grpc.StatusCode.INVALID_ARGUMENT, "stopping.stop_token_ids"))
    huge = token_request(rng, 2048, 4, "huge-stop-list")
    huge.stopping.stop_token_ids.extend([7] * 900000)  # ~3.6 MB, under the 4 MiB message limit
    cases.append((huge, grpc.StatusCode.INVALID_ARGUMENT, "stopping.stop_token_ids"))
    outside = token_request(rng, 2048, 4, "outside-stop-id")
    outside.stopping.stop_token_ids.append(99999)
    cases.append((outside, grpc.StatusCode.INVALID_ARGUMENT, "stopping.stop_token_ids[0]"))
    negative = token_request(rng, 2048, 4, "negative-stop-id")
    negative.stopping.stop_token_ids.append(-1)
    cases.append((negative, grpc.StatusCode.INVALID_ARGUMENT, "stopping.stop_token_ids[0]"))
    for req, want, field in cases:
        code, details, _ = call(p.stub, req, "unary")
        if code != want or field not in details:
            p.fail(f"{req.request_id}: {code} {details[:200]!r}, expected {want.name} naming "
                   f"{field}")
    # The server still serves a normal request with an ordinary stop list.
    ok = token_request(rng, 2048, 8, "after-hostile")
    ok.stopping.stop_token_ids.extend([5, 6, 7])
    code, details, _ = call(p.stub, ok, "stream")
    if code != grpc.StatusCode.OK:
        p.fail(f"after the hostile lists: {code} {details!r}")
    p.check_settled("SERVING")
    p.close()
    return p.problems, {}


def phase_burst(binary, model, rng, log):
    # 2 MiB of F32 KV holds 256 pages of 16 tokens, ~680 tokens of the 6-layer demo stored
    # densely: far fewer than 128 requests need at once, so admission and preemption must cope.
    p = Phase("burst", binary, model, "--kv_cache_bytes", str(2 << 20), "--max_num_seqs", "128",
              "--max_queue", "256", log=log)
    reqs = [token_request(rng, 2048, rng.randint(16, 64), f"b{i}", threshold=0.01)
            for i in range(128)]
    results = run_all(p.stub, reqs, concurrency=128)
    bad = [(r.request_id, c.name, d) for (c, d, _), r in zip(results, reqs)
           if c != grpc.StatusCode.OK]
    if bad:
        p.fail(f"{len(bad)} requests did not complete, e.g. {bad[:3]}")
    m = p.server.metrics()
    preemptions = metric_sum(m, "modserve_num_preemptions_total")
    # A storm would preempt most requests many times over; one preemption per request at most
    # on average is the bound that still catches it.
    if preemptions > len(reqs):
        p.fail(f"{preemptions:g} preemptions for {len(reqs)} requests")
    p.check_settled("SERVING")
    p.close()
    return p.problems, {"preemptions": preemptions}


def phase_backend(binary, model, rng, log):
    p = Phase("backend", binary, model, "--inject_faults", "backend_step=40", log=log)
    reqs = [token_request(rng, 2048, 64, f"k{i}") for i in range(64)]
    results = run_all(p.stub, reqs)
    codes = {c for c, _, _ in results}
    if not codes <= {grpc.StatusCode.OK, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE}:
        p.fail(f"unexpected codes {sorted(c.name for c in codes)}")
    if grpc.StatusCode.INTERNAL not in codes:
        p.fail("no request saw the backend fault")
    code, details, _ = call(p.stub, token_request(rng, 2048, 4, "after"), "unary")
    if code != grpc.StatusCode.UNAVAILABLE:
        p.fail(f"after the fault: {code} {details!r}")
    p.check_settled("NOT_SERVING")
    p.close()
    return p.problems, {"codes": sorted(c.name for c in codes)}


def phase_stop(binary, model, rng, log):
    p = Phase("stop", binary, model, "--drain_timeout", "1s", log=log)
    reqs = [token_request(rng, 2048, rng.randint(64, 512), f"s{i}") for i in range(48)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(call, p.stub, r, "stream" if i % 2 else "unary", 60)
                   for i, r in enumerate(reqs)]
        time.sleep(0.5)
        p.server.proc.send_signal(signal.SIGTERM)
        results = [f.result() for f in futures]
    try:
        code = p.server.proc.wait(timeout=60)
        if code != 0:
            p.fail(f"exit status {code} after SIGTERM")
    except subprocess.TimeoutExpired:
        p.fail("did not exit within 60 s of SIGTERM")
    # OK (finished within the drain), UNAVAILABLE (refused while draining, or ended by the drain
    # timeout), CANCELLED (a call gRPC itself cancels as the server shuts its listener down).
    allowed = {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
    other = [(r.request_id, c.name) for (c, _, _), r in zip(results, reqs) if c not in allowed]
    if other:
        p.fail(f"requests ended with {other[:3]}")
    p.close()
    return p.problems, {"ok": sum(c == grpc.StatusCode.OK for c, _, _ in results)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary")
    ap.add_argument("checkpoint")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--phases", default="faults,padded,hostile,burst,backend,stop")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2 ** 31)
    print(f"fault injection: seed {seed} (rerun with --seed {seed})", flush=True)
    problems = []
    log = tempfile.TemporaryFile(mode="w+")
    workdir = tempfile.mkdtemp(prefix="modserve-faults-")
    try:
        for name in args.phases.split(","):
            rng = random.Random(f"{seed}-{name}")
            started = time.monotonic()
            fn = {"faults": phase_faults, "padded": phase_padded, "hostile": phase_hostile,
                  "burst": phase_burst, "backend": phase_backend, "stop": phase_stop}[name]
            extra = (workdir,) if name == "padded" else ()
            found, info = fn(args.binary, args.checkpoint, rng, log, *extra)
            problems += found
            print(f"  {name:<8} {'ok' if not found else 'FAILED'} "
                  f"({time.monotonic() - started:.1f} s) {info}", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for problem in problems:
        print(f"FAIL: {problem}")
    if problems:
        log.seek(0)
        print("server log (tail):\n" + log.read()[-3000:])
    print(f"fault injection: {'FAILED' if problems else 'passed'} ({len(problems)} problems)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
