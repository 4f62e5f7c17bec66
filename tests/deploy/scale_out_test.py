"""Scale-out on loopback: two `modserve` replicas, clients balancing over both with gRPC's
round_robin (modserve-loadgen, modserve-client, the Python package), and one replica SIGKILLed
mid-load while the clients' retries finish every request on the survivor. No network beyond
127.0.0.1; no fixed sleeps (the kill waits for the replica's own /metrics).

    python3 tests/deploy/scale_out_test.py MODSERVE LOADGEN CLIENT CHECKPOINT_DIR
"""

import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
from loopback import Server, metric_sum, wait_for  # noqa: E402
from modserve_client import Client  # noqa: E402

MODSERVE = LOADGEN = CLIENT = CHECKPOINT = None
PROMPT_IDS = [1, 17, 42, 99, 5]
# Long enough (about half a second per request on one CPU thread for the demo checkpoint) that a
# replica seen running a request is still running one when it is killed a few ms later.
LONG_TOKENS = 1000
# Per request and for a whole load: generous, since the sanitizer builds (tools/ci_sanitizers.sh)
# run these loads 10-15x slower than a release build, which takes a few seconds.
REQUEST_TIMEOUT_S = 120
LOAD_TIMEOUT_S = 300


def _kill_when_busy(server, still_loading):
    """SIGKILLs `server` once its /metrics shows a finished request and one running (the first
    responses arrived and more are in flight); fails if the load ended before that."""
    def busy():
        if not still_loading():
            raise AssertionError("the load finished before the replica was killed")
        samples = server.metrics()
        return (metric_sum(samples, "modserve_request_success_total") >= 1
                and metric_sum(samples, "modserve_num_requests_running") >= 1) and samples
    wait_for(busy, 60, "replica busy with a finished request")
    server.stop()


class ScaleOutTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.replicas = []
        for _ in range(2):
            self.replicas.append(Server(MODSERVE, CHECKPOINT, "--threads", "1"))
        self.a, self.b = self.replicas
        self.target = f"{self.a.address},{self.b.address}"
        self.prompts = os.path.join(self.tmp.name, "prompts.txt")
        with open(self.prompts, "w") as f:
            f.write("ids:" + ",".join(map(str, PROMPT_IDS)) + "\nids:1,2,3,4\n")

    def tearDown(self):
        for r in self.replicas:
            r.stop()
        self.tmp.cleanup()

    def _loadgen(self, *flags):
        out = os.path.join(self.tmp.name, "loadgen.json")
        cmd = [LOADGEN, "--server", self.target, "--prompts", self.prompts, "--json_out", out,
               "--timeout", f"{REQUEST_TIMEOUT_S}s", *flags]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True), out

    def _finish(self, proc, out):
        log, _ = proc.communicate(timeout=LOAD_TIMEOUT_S)
        self.assertEqual(proc.returncode, 0, log)
        with open(out) as f:
            return json.load(f), log

    def test_loadgen_round_robin_reaches_both_replicas(self):
        proc, out = self._loadgen("--lb_policy", "round_robin", "--concurrency", "4",
                                  "--num_requests", "24", "--max_new_tokens", "32")
        result, log = self._finish(proc, out)
        self.assertEqual(result["requests_ok"], 24, log)
        self.assertEqual(result["errors"], {}, log)
        peers = result["peers"]
        self.assertEqual(set(peers), {"ipv4:" + self.a.address, "ipv4:" + self.b.address}, log)
        for replica in self.replicas:
            served = peers["ipv4:" + replica.address]["ok"]
            self.assertGreater(served, 0, log)
            # The server's own count agrees with what the client saw.
            self.assertEqual(replica.successes(), served)
        self.assertIn("replica ipv4:" + self.a.address, log)

        # pick_first (gRPC's default) over the same target: every request to one replica.
        before = [r.successes() for r in self.replicas]
        proc, out = self._loadgen("--concurrency", "4", "--num_requests", "8",
                                  "--max_new_tokens", "8")
        result, log = self._finish(proc, out)
        self.assertEqual(len(result["peers"]), 1, log)
        self.assertEqual(sorted(r.successes() - n for r, n in zip(self.replicas, before)), [0, 8])

    def test_python_round_robin_reaches_both_replicas(self):
        with Client(self.target, timeout=60, lb_policy="round_robin") as client, \
                concurrent.futures.ThreadPoolExecutor(4) as pool:
            unary = [pool.submit(client.generate, PROMPT_IDS, max_new_tokens=16, ignore_eos=True)
                     for _ in range(16)]
            streams = [pool.submit(lambda: list(client.stream(PROMPT_IDS, max_new_tokens=16,
                                                              ignore_eos=True)))
                       for _ in range(8)]
            for f in unary:
                self.assertEqual(len(f.result().token_ids), 16)
            for f in streams:
                self.assertEqual(sum(len(c.token_ids) for c in f.result()), 16)
        served = [r.successes() for r in self.replicas]
        self.assertEqual(sum(served), 24)
        self.assertGreater(min(served), 0, served)

    def test_loadgen_retries_finish_every_request_after_a_replica_dies(self):
        total = 16
        proc, out = self._loadgen("--lb_policy", "round_robin", "--retries", "5",
                                  "--concurrency", "4", "--num_requests", str(total),
                                  "--max_new_tokens", str(LONG_TOKENS))
        try:
            _kill_when_busy(self.a, lambda: proc.poll() is None)
        except BaseException:
            proc.kill()
            raise
        result, log = self._finish(proc, out)
        self.assertEqual(result["requests_ok"], total, log)
        self.assertEqual(result["errors"], {}, log)
        self.assertGreater(result["retries"], 0, log)
        a = result["peers"]["ipv4:" + self.a.address]
        b = result["peers"]["ipv4:" + self.b.address]
        self.assertGreater(a["failed"], 0, log)  # the in-flight requests the kill broke
        self.assertEqual(a["failed"] + b["failed"], result["retries"], log)
        self.assertEqual(a["ok"] + b["ok"], total, log)
        self.assertEqual(self.b.successes(), b["ok"])  # the survivor finished the rest
        self.assertEqual(result["tokens"], total * LONG_TOKENS + result["discarded_tokens"], log)

        # modserve-client with the dead replica first in the list: both policies reach B.
        ids = ",".join(map(str, PROMPT_IDS))
        for policy in ("pick_first", "round_robin"):
            before = self.b.successes()
            cli = subprocess.run(
                [CLIENT, "--server", self.target, "--lb_policy", policy, "--retries", "2",
                 "--timeout", "30s", "generate", "--prompt_ids", ids, "--max_new_tokens", "4",
                 "--ignore_eos"], capture_output=True, text=True, timeout=60)
            self.assertEqual(cli.returncode, 0, cli.stderr)
            self.assertEqual(len(cli.stdout.strip().split(",")), 4, cli.stdout)
            self.assertEqual(self.b.successes(), before + 1)

    def test_python_retries_finish_every_request_after_a_replica_dies(self):
        total = 16
        with Client(self.target, timeout=REQUEST_TIMEOUT_S, lb_policy="round_robin",
                    retries=5) as client, \
                concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(client.generate, PROMPT_IDS, max_new_tokens=LONG_TOKENS,
                                   ignore_eos=True) for _ in range(total)]
            _kill_when_busy(self.a, lambda: not all(f.done() for f in futures))
            for f in futures:
                gen = f.result()
                self.assertEqual(len(gen.token_ids), LONG_TOKENS)
                self.assertEqual(gen.finish_reason, "length")
            self.assertGreater(client.retry_count, 0)
        self.assertGreater(self.b.successes(), 0)


if __name__ == "__main__":
    MODSERVE, LOADGEN, CLIENT, CHECKPOINT = sys.argv[1:5]
    unittest.main(argv=sys.argv[:1])
