"""Self-speculative decoding in the built `modserve`, over loopback with real gRPC and the openai
SDK: a server started with --speculative_tokens streams, for greedy requests, exactly the tokens
and routing decisions of a server without it; the four modserve_spec_decode_* counters agree with
each other (accepted <= drafted, per-position counts sum to the accepted total and fall with the
position); a request may lower the server's K or turn speculation off, and one asking for more
than the server's K, or for a bad draft threshold, is refused naming the field (gRPC
INVALID_ARGUMENT, HTTP 400) with the server still serving; a cancelled speculative stream frees
its KV pages.

    .venv/bin/python tests/server/spec_decode_process_test.py BUILD_DIR/bin/modserve models/demo
"""

import os
import sys
import time
import unittest

import grpc
import openai

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
from loopback import Server, metric_sum, parse_metrics, wait_for  # noqa: E402,F401
from modserve.v1 import modserve_pb2, modserve_pb2_grpc  # noqa: E402
from modserve_client import Client  # noqa: E402

BINARY, MODEL = None, None
K = 4  # the speculative server's --speculative_tokens
PROMPTS = ["Once upon a time", "The capital of France is", "1, 2, 3, 4,", "In the beginning"]
SPEC = "modserve_spec_decode_"


def spec_counters(samples):
    """(drafts, draft tokens, accepted tokens, [accepted at position 0..15])."""
    per_pos = [metric_sum(samples, SPEC + "num_accepted_tokens_per_pos_total", position=str(i))
               for i in range(16)]
    return (metric_sum(samples, SPEC + "num_drafts_total"),
            metric_sum(samples, SPEC + "num_draft_tokens_total"),
            metric_sum(samples, SPEC + "num_accepted_tokens_total"), per_pos)


def settled(server):
    """The counters once two scrapes agree (a step's counters are added one after another)."""
    last = spec_counters(server.metrics())
    for _ in range(100):
        time.sleep(0.05)
        now = spec_counters(server.metrics())
        if now == last:
            return now
        last = now
    raise AssertionError("the spec_decode counters never settled")


def stream_with_decisions(stub, prompt, max_new_tokens, **fields):
    """Token ids joined over a GenerateStream, the finish reason and the decisions per layer."""
    req = Client.request(prompt, max_new_tokens=max_new_tokens, ignore_eos=True, **fields)
    req.routing.return_decisions = True
    tokens, decisions, finish = [], {}, None
    for msg in stub.GenerateStream(req, timeout=120):
        tokens.extend(msg.token_ids)
        if msg.finish_reason:
            finish = msg.finish_reason
        if msg.HasField("routing"):
            decisions = {l.layer: bytes(l.decisions) for l in msg.routing.layers}
    return tokens, finish, decisions


class SpeculativeServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.plain = Server(BINARY, MODEL, "--threads", "1")
        cls.spec = Server(BINARY, MODEL, "--threads", "1", "--http_port", "0",
                          "--speculative_tokens", str(K), "--speculative_threshold", "1")
        cls.plain_channel = grpc.insecure_channel(cls.plain.address)
        cls.spec_channel = grpc.insecure_channel(cls.spec.address)
        cls.plain_stub = modserve_pb2_grpc.ModServeStub(cls.plain_channel)
        cls.spec_stub = modserve_pb2_grpc.ModServeStub(cls.spec_channel)
        cls.spec_client = Client(cls.spec.address, timeout=120)
        cls.openai = openai.OpenAI(base_url=f"http://127.0.0.1:{cls.spec.http_port}/v1",
                                   api_key="unused", max_retries=0, timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.spec_client.close()
        cls.plain_channel.close()
        cls.spec_channel.close()
        cls.spec.stop()
        cls.plain.stop()

    def test_streamed_speculative_tokens_and_routing_equal_plain_decoding(self):
        before = settled(self.spec)
        for prompt in PROMPTS:
            want = stream_with_decisions(self.plain_stub, prompt, 48)
            got = stream_with_decisions(self.spec_stub, prompt, 48)
            self.assertEqual(len(want[0]), 48, prompt)
            self.assertEqual(got[0], want[0], prompt)
            self.assertEqual(got[1], want[1], prompt)
            self.assertTrue(want[2], prompt)
            self.assertEqual(got[2], want[2], prompt)
        after = settled(self.spec)
        self.assertGreater(after[1], before[1])  # it did speculate
        self.assertGreater(after[2], before[2])  # and kept drafts

    def test_openai_stream_equals_plain_grpc(self):
        want = Client(self.plain.address, timeout=120)
        try:
            plain = want.generate(PROMPTS[0], max_new_tokens=40, ignore_eos=True)
        finally:
            want.close()
        text = ""
        for chunk in self.openai.completions.create(model="demo", prompt=PROMPTS[0],
                                                    max_tokens=40, temperature=0, stream=True,
                                                    extra_body={"ignore_eos": True}):
            if chunk.choices:
                text += chunk.choices[0].text
        self.assertEqual(text, plain.text)

    def test_counters_are_consistent(self):
        before = settled(self.spec)
        for prompt in PROMPTS:
            self.spec_client.generate(prompt, max_new_tokens=32, ignore_eos=True)
        drafts, drafted, accepted, per_pos = settled(self.spec)
        self.assertGreater(drafts, before[0])
        self.assertGreater(drafted, before[1])
        self.assertLessEqual(accepted, drafted)
        self.assertLessEqual(drafted, K * drafts)
        self.assertEqual(sum(per_pos), accepted)
        self.assertLessEqual(per_pos[0], drafts)
        # Greedy keeps the longest accepted prefix: position i + 1 only after position i.
        for i in range(15):
            self.assertLessEqual(per_pos[i + 1], per_pos[i], i)
        self.assertEqual(per_pos[K:], [0.0] * (16 - K))

    def test_a_request_may_lower_or_turn_off_speculation(self):
        want = self.spec_client.generate(PROMPTS[1], max_new_tokens=30, ignore_eos=True,
                                         speculative_tokens=0)
        before = settled(self.spec)
        off = self.spec_client.generate(PROMPTS[1], max_new_tokens=30, ignore_eos=True,
                                        speculative_tokens=0)
        self.assertEqual(settled(self.spec), before)  # no draft at all
        lowered = self.spec_client.generate(PROMPTS[1], max_new_tokens=30, ignore_eos=True,
                                            speculative_tokens=1, speculative_threshold=0.9)
        after = settled(self.spec)
        self.assertGreater(after[0], before[0])
        self.assertEqual(after[1] - before[1], after[0] - before[0])  # one draft per step
        self.assertEqual(after[3][1:], before[3][1:])
        self.assertEqual(off.token_ids, want.token_ids)
        self.assertEqual(lowered.token_ids, want.token_ids)
        # The HTTP API's MoD extension fields.
        http_off = self.openai.completions.create(
            model="demo", prompt=PROMPTS[1], max_tokens=30, temperature=0,
            extra_body={"ignore_eos": True, "speculative_tokens": 0})
        self.assertEqual(http_off.choices[0].text, want.text)
        self.assertEqual(settled(self.spec), after)

    def test_bad_overrides_are_refused_naming_the_field(self):
        for fields, message in [
                ({"speculative_tokens": K + 1},
                 f"speculative_tokens: {K + 1} exceeds the server's --speculative_tokens={K}"),
                ({"speculative_tokens": -2}, "speculative_tokens: -2 is < 0"),
                ({"speculative_threshold": 1.5}, "speculative_threshold: 1.5 is not in (0, 1]"),
                ({"speculative_threshold": 0.0}, "speculative_threshold: 0 is not in (0, 1]")]:
            with self.assertRaises(grpc.RpcError) as e:
                self.spec_client.generate(PROMPTS[0], max_new_tokens=4, **fields)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, fields)
            self.assertIn(message, e.exception.details())
            with self.assertRaises(openai.BadRequestError) as h:
                self.openai.completions.create(model="demo", prompt=PROMPTS[0], max_tokens=4,
                                               temperature=0, extra_body=fields)
            self.assertIn(message, str(h.exception))
        # A server without speculation refuses any K > 0.
        plain = Client(self.plain.address, timeout=120)
        try:
            with self.assertRaises(grpc.RpcError) as e:
                plain.generate(PROMPTS[0], max_new_tokens=4, speculative_tokens=1)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("--speculative_tokens=0", e.exception.details())
            self.assertEqual(len(plain.generate(PROMPTS[0], max_new_tokens=4,
                                                speculative_tokens=0).token_ids), 4)
        finally:
            plain.close()
        self.assertEqual(len(self.spec_client.generate(PROMPTS[0], max_new_tokens=4).token_ids),
                         4)

    def test_cancelled_speculative_stream_frees_its_pages(self):
        samples = self.spec.metrics()
        cancelled = metric_sum(samples, "modserve_request_failure_total", code="CANCELLED")
        drafted = metric_sum(samples, SPEC + "num_draft_tokens_total")
        req = Client.request(PROMPTS[2], max_new_tokens=1500, ignore_eos=True)
        call = self.spec_stub.GenerateStream(req, timeout=120)
        got = 0
        for msg in call:
            got += len(msg.token_ids)
            if got >= 20:
                break
        self.assertGreater(metric_sum(self.spec.metrics(), "modserve_kv_cache_usage_ratio"), 0)
        call.cancel()
        wait_for(lambda: metric_sum(self.spec.metrics(), "modserve_request_failure_total",
                                    code="CANCELLED") == cancelled + 1, 30, "cancelled")
        wait_for(lambda: metric_sum(self.spec.metrics(), "modserve_kv_cache_usage_ratio") == 0,
                 30, "KV pages freed")
        after = self.spec.metrics()
        self.assertEqual(metric_sum(after, "modserve_num_requests_running"), 0)
        self.assertGreater(metric_sum(after, SPEC + "num_draft_tokens_total"), drafted)
        # Still serving, speculatively.
        self.assertEqual(len(self.spec_client.generate(PROMPTS[2], max_new_tokens=8).token_ids),
                         8)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    BINARY, MODEL = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1] + sys.argv[3:])
