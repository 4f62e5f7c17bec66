"""End-to-end: starts the built `modserve` on free loopback ports, calls it from the Python client
(unary and stream), reads /metrics and finds every metric name of the contract, then SIGTERM ->
exit 0.

    python3 tests/server/e2e_python_client_test.py BUILD_DIR/bin/modserve CHECKPOINT_DIR
"""

import os
import sys
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
from loopback import Server  # noqa: E402
from modserve_client import Client  # noqa: E402

METRIC_NAMES = [
    "modserve_time_to_first_token_seconds",
    "modserve_inter_token_latency_seconds",
    "modserve_e2e_request_latency_seconds",
    "modserve_request_queue_time_seconds",
    "modserve_request_prefill_time_seconds",
    "modserve_request_decode_time_seconds",
    "modserve_prompt_tokens_total",
    "modserve_generation_tokens_total",
    "modserve_num_requests_running",
    "modserve_num_requests_waiting",
    "modserve_kv_cache_usage_ratio",
    "modserve_num_preemptions_total",
    "modserve_request_success_total",
    "modserve_request_failure_total",
    "modserve_layer_tokens_total",
    "modserve_layer_batch_skips_total",
    "modserve_kv_bytes_per_token",
    "modserve_kv_bytes_per_token_dense",
    "modserve_step_duration_seconds",
]

BINARY, CHECKPOINT = None, None


class PythonClientEndToEndTest(unittest.TestCase):
    def setUp(self):
        self.server = Server(BINARY, CHECKPOINT, "--threads", "1", "--drain_timeout", "20s",
                             stderr=None)
        self.port, self.metrics_port = self.server.port, self.server.metrics_port

    def tearDown(self):
        self.server.stop()

    def test_unary_stream_metrics_and_drain(self):
        prompt = [1, 17, 42, 99, 5]
        with Client(f"127.0.0.1:{self.port}", timeout=60) as client:
            self.assertEqual(client.health(), "SERVING")
            self.assertEqual(client.health("modserve.v1.ModServe"), "SERVING")
            unary = client.generate(prompt, max_new_tokens=12, ignore_eos=True)
            self.assertEqual(len(unary.token_ids), 12)
            self.assertEqual(unary.finish_reason, "length")
            self.assertEqual(unary.prompt_tokens, len(prompt))
            chunks = list(client.stream(prompt, max_new_tokens=12, ignore_eos=True))
            streamed = [t for c in chunks for t in c.token_ids]
            self.assertEqual(streamed, unary.token_ids)  # greedy: the same tokens
            self.assertEqual(chunks[-1].finish_reason, "length")
            sampled = client.generate(prompt, max_new_tokens=8, temperature=1.0, seed=5,
                                      ignore_eos=True)
            again = client.generate(prompt, max_new_tokens=8, temperature=1.0, seed=5,
                                    ignore_eos=True)
            self.assertEqual(sampled.token_ids, again.token_ids)
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=30) as resp:
            body = resp.read().decode()
        for name in METRIC_NAMES:
            self.assertRegex(body, rf"(?m)^{name}(\{{|_bucket|_count|_sum| )",
                             f"{name} missing from /metrics")
        # Three requests of 12 + 12 + 8 + 8 tokens were generated.
        self.assertRegex(body, r"(?m)^modserve_generation_tokens_total 40(\.0+)?$")
        self.assertEqual(self.server.terminate(timeout=60), 0)


if __name__ == "__main__":
    BINARY, CHECKPOINT = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1])
