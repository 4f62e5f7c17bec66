"""The OpenAI-compatible HTTP API of the built `modserve`, driven by the real `openai` SDK (PyPI)
and, for what the SDK cannot send, by raw sockets: completions and chat, unary and streamed, give
the greedy text the gRPC API gives for the same request; logprobs equal gRPC's; a client that
disconnects mid-stream has its request cancelled and its KV pages freed; 400 (naming the field),
401, 404, 413, 408 (slow headers), 429 and malformed or non-UTF-8 bodies leave the server serving;
HTTP requests count in the same /metrics as gRPC ones.

    .venv/bin/python tests/server/openai_e2e_test.py BUILD_DIR/bin/modserve models/demo
"""

import http.client
import json
import os
import socket
import sys
import tempfile
import time
import unittest

import openai

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
from loopback import Server, metric_sum, wait_for  # noqa: E402
from modserve_client import Client  # noqa: E402

BINARY, MODEL = None, None
# The demo checkpoint has no chat template; the tests give it SmolLM2's (its special tokens are
# plain text to the demo tokenizer, which is all a template needs).
CHAT_TEMPLATE = os.path.join(ROOT, "tests", "testdata", "chat_templates", "smollm2.jinja")
PROMPT = "Once upon a time"


def render_chat(messages, add_generation_prompt=True):
    """The chat prompt as Python's jinja2 renders SmolLM2's template (an independent render)."""
    import jinja2
    with open(CHAT_TEMPLATE) as f:
        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(f.read()).render(messages=messages,
                                                add_generation_prompt=add_generation_prompt)


def raw_request(port, data, timeout=30):
    """Sends raw bytes, returns (status, parsed JSON body or raw text); the server closes or
    answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = s.recv(65536)
            if not chunk:
                break
            received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v)
        while len(body) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
        status = int(head.split(b" ")[1]) if head else 0
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body


def post(port, path, body, headers=None, timeout=60):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", path, body=body, headers=headers or {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, json.loads(data)


class OpenAiApiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(BINARY, MODEL, "--threads", "1", "--http_port", "0",
                            "--chat_template", CHAT_TEMPLATE, "--http_max_body_bytes", "65536",
                            "--http_header_timeout", "1s", "--http_body_timeout", "1s")
        cls.base = f"http://127.0.0.1:{cls.server.http_port}/v1"
        cls.client = openai.OpenAI(base_url=cls.base, api_key="unused", max_retries=0,
                                   timeout=120)
        cls.grpc = Client(cls.server.address, timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.grpc.close()
        cls.server.stop()

    def test_models_and_health(self):
        models = self.client.models.list()
        self.assertEqual([m.id for m in models.data], ["demo"])
        self.assertEqual(self.client.models.retrieve("demo").id, "demo")
        conn = http.client.HTTPConnection("127.0.0.1", self.server.http_port, timeout=10)
        conn.request("GET", "/health")
        resp = conn.getresponse()
        self.assertEqual((resp.status, json.loads(resp.read())), (200, {"status": "ok"}))
        conn.close()

    def test_completion_equals_grpc_greedy(self):
        want = self.grpc.generate(PROMPT, max_new_tokens=24, top_logprobs=2)
        got = self.client.completions.create(model="demo", prompt=PROMPT, max_tokens=24,
                                             temperature=0, logprobs=2)
        choice = got.choices[0]
        self.assertEqual(choice.text, want.text)
        self.assertEqual(choice.finish_reason, "length" if want.finish_reason == "length"
                         else "stop")
        self.assertEqual(got.usage.prompt_tokens, want.prompt_tokens)
        self.assertEqual(got.usage.completion_tokens, want.completion_tokens)
        # The same floats: both are the engine's float32, written without loss.
        self.assertEqual(choice.logprobs.token_logprobs, want.logprobs)
        self.assertEqual(len(choice.logprobs.top_logprobs), want.completion_tokens)
        streamed = self.client.completions.create(model="demo", prompt=PROMPT, max_tokens=24,
                                                  temperature=0, stream=True,
                                                  stream_options={"include_usage": True})
        texts, finish, usage = [], None, None
        for chunk in streamed:
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                texts.append(c.text)
                finish = c.finish_reason or finish
        self.assertEqual("".join(texts), want.text)
        self.assertEqual(finish, choice.finish_reason)
        self.assertEqual(usage.completion_tokens, want.completion_tokens)
        # One SSE event per token, plus the one with finish_reason.
        self.assertEqual(len(texts), want.completion_tokens + 1)

    def test_token_prompts_and_lists_and_extensions(self):
        ids = self.grpc.tokenize(PROMPT, add_special_tokens=True)
        want = self.grpc.generate(ids, max_new_tokens=8, ignore_eos=True, threshold=0.3)
        got = self.client.completions.create(
            model="demo", prompt=[ids, ids[:3]], max_tokens=8, temperature=0,
            extra_body={"ignore_eos": True, "routing_threshold": 0.3, "return_routing": True,
                        "no_such_field": 1})
        self.assertEqual([c.index for c in got.choices], [0, 1])
        self.assertEqual(got.choices[0].text, want.text)
        routing = got.choices[0].model_extra["routing"]
        self.assertAlmostEqual(routing["threshold"], 0.3)
        self.assertEqual([l["layer"] for l in routing["layers"]], [l.layer for l in want.routing])
        self.assertEqual([l["tokens_computed"] for l in routing["layers"]],
                         [l.tokens_computed for l in want.routing])
        self.assertEqual(got.usage.prompt_tokens, len(ids) + 3)
        echo = self.client.completions.create(model="demo", prompt=PROMPT, max_tokens=4,
                                              temperature=0, echo=True)
        self.assertTrue(echo.choices[0].text.startswith(PROMPT))

    def test_echo_logprobs_equal_grpc_prompt_logprobs(self):
        ids = self.grpc.tokenize(PROMPT, add_special_tokens=True)
        want = self.grpc.generate(ids, max_new_tokens=1, prompt_logprobs=1, top_logprobs=1)
        self.assertEqual([t for t, _ in want.prompt_logprobs], ids)
        self.assertIsNone(want.prompt_logprobs[0][1])
        # What lm-eval's local-completions sends for a loglikelihood request.
        got = self.client.completions.create(model="demo", prompt=ids, max_tokens=1,
                                             temperature=0, logprobs=1, echo=True, seed=1234)
        lp = got.choices[0].logprobs
        self.assertEqual(len(lp.token_logprobs), len(ids) + 1)
        self.assertEqual(lp.token_logprobs[:len(ids)], [l for _, l in want.prompt_logprobs])
        self.assertEqual(lp.token_logprobs[len(ids)], want.logprobs[0])
        self.assertIsNone(lp.top_logprobs[0])
        self.assertTrue(all(len(t) >= 1 for t in lp.top_logprobs[1:]))
        # Streamed: the prompt's entries come with the first token.
        first = next(iter(self.client.completions.create(
            model="demo", prompt=ids, max_tokens=1, temperature=0, logprobs=1, echo=True,
            stream=True)))
        self.assertEqual(first.choices[0].logprobs.token_logprobs,
                         lp.token_logprobs)
        # modserve-generate --prompt_logprobs (the offline engine, no server) agrees.
        import subprocess
        out = subprocess.run(
            [os.path.join(os.path.dirname(BINARY), "modserve-generate"), "--model", MODEL,
             "--prompt_ids", ",".join(map(str, ids)), "--max_new_tokens", "1",
             "--prompt_logprobs", "1", "--echo", "--json", "--threads", "1",
             "--kv_cache_dtype", "auto"],  # the server's default
            capture_output=True, text=True, check=True)
        offline = json.loads(out.stdout)
        self.assertEqual([p["logprob"] for p in offline["prompt_logprobs"]],
                         [l for _, l in want.prompt_logprobs])
        self.assertEqual(offline["echo"]["logprobs"], lp.token_logprobs)

    def test_chat_equals_grpc_greedy(self):
        messages = [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "What is a computer?"}]
        ids = self.grpc.tokenize(render_chat(messages), add_special_tokens=False)
        want = self.grpc.generate(ids, max_new_tokens=20)
        got = self.client.chat.completions.create(model="demo", messages=messages, max_tokens=20,
                                                  temperature=0)
        self.assertEqual(got.choices[0].message.role, "assistant")
        self.assertEqual(got.choices[0].message.content, want.text)
        self.assertEqual(got.usage.prompt_tokens, len(ids))
        stream = self.client.chat.completions.create(model="demo", messages=messages,
                                                     max_completion_tokens=20, temperature=0,
                                                     stream=True)
        parts, roles = [], []
        for chunk in stream:
            for c in chunk.choices:
                if c.delta.role:
                    roles.append(c.delta.role)
                parts.append(c.delta.content or "")
        self.assertEqual("".join(parts), want.text)
        self.assertEqual(roles, ["assistant"])
        logprobs = self.client.chat.completions.create(
            model="demo", messages=messages, max_tokens=5, temperature=0, logprobs=True,
            top_logprobs=3)
        content = logprobs.choices[0].logprobs.content
        self.assertEqual(len(content), 5)
        self.assertTrue(all(len(c.top_logprobs) == 3 for c in content))

    def test_bad_requests_are_400_naming_the_field(self):
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model="demo", prompt=PROMPT, top_p=1.5)
        self.assertEqual(e.exception.status_code, 400)
        self.assertEqual(e.exception.body["param"], "top_p")
        self.assertIn("top_p: 1.5 is not in (0, 1]", e.exception.message)
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model="demo", prompt=PROMPT, n=2)
        self.assertEqual(e.exception.body["param"], "n")
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.chat.completions.create(model="demo", messages=[{"role": "user"}],
                                                extra_body={"max_tokens": "many"})
        self.assertEqual(e.exception.body["param"], "max_tokens")
        with self.assertRaises(openai.NotFoundError) as e:
            self.client.completions.create(model="gpt-9", prompt=PROMPT)
        self.assertEqual(e.exception.body["code"], "model_not_found")
        # Raw bodies the SDK would not send: each a 400, and the server keeps serving.
        port = self.server.http_port
        for body in (b'{"prompt": "x", ', b"[]", b"not json", b'{"prompt": "\xff\xfe"}',
                     b'{"prompt": "\\ud800"}'):
            status, err = post(port, "/v1/completions", body)
            self.assertEqual(status, 400, body)
            self.assertEqual(err["error"]["type"], "invalid_request_error")
        status, _ = post(port, "/v1/completions", json.dumps({"prompt": "x" * 70000}))
        self.assertEqual(status, 413)
        status, err = raw_request(port, b"GARBAGE\r\n\r\n")
        self.assertEqual(status, 400)
        self.assertEqual(self.client.completions.create(model="demo", prompt=PROMPT, max_tokens=2,
                                                        temperature=0).usage.completion_tokens, 2)

    def test_slow_headers_get_408_and_others_are_served(self):
        with socket.create_connection(("127.0.0.1", self.server.http_port), timeout=30) as slow:
            slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
            # Served while the slow client holds its connection.
            self.client.completions.create(model="demo", prompt=PROMPT, max_tokens=2)
            received = b""
            while True:
                chunk = slow.recv(65536)
                if not chunk:
                    break
                received += chunk
        self.assertTrue(received.startswith(b"HTTP/1.1 408"), received[:100])
        self.assertIn(b"--http_header_timeout", received)

    def test_disconnect_mid_stream_frees_the_pages(self):
        before = self.server.metrics()
        cancelled = metric_sum(before, "modserve_request_failure_total", code="CANCELLED")
        stream = self.client.completions.create(model="demo", prompt=PROMPT, max_tokens=1500,
                                                temperature=0, stream=True,
                                                extra_body={"ignore_eos": True})
        got = 0
        for _ in stream:
            got += 1
            if got == 5:
                break
        used = metric_sum(self.server.metrics(), "modserve_kv_cache_usage_ratio")
        self.assertGreater(used, 0)
        stream.close()  # drops the connection mid-stream
        wait_for(lambda: metric_sum(self.server.metrics(), "modserve_request_failure_total",
                                    code="CANCELLED") == cancelled + 1, 30, "cancelled")
        wait_for(lambda: metric_sum(self.server.metrics(), "modserve_kv_cache_usage_ratio") == 0,
                 30, "KV pages freed")
        after = self.server.metrics()
        self.assertEqual(metric_sum(after, "modserve_num_requests_running"), 0)
        # Far fewer than 1500 tokens were generated before the cancel took effect.
        generated = metric_sum(after, "modserve_generation_tokens_total") - \
            metric_sum(before, "modserve_generation_tokens_total")
        self.assertLess(generated, 1000)

    def test_http_requests_count_in_the_shared_metrics(self):
        before = self.server.metrics()
        self.client.completions.create(model="demo", prompt=PROMPT, max_tokens=3, temperature=0,
                                       extra_body={"ignore_eos": True})
        with self.assertRaises(openai.BadRequestError):
            self.client.completions.create(model="demo", prompt=PROMPT, temperature=-1)
        after = self.server.metrics()
        self.assertEqual(metric_sum(after, "modserve_request_success_total") -
                         metric_sum(before, "modserve_request_success_total"), 1)
        self.assertEqual(metric_sum(after, "modserve_generation_tokens_total") -
                         metric_sum(before, "modserve_generation_tokens_total"), 3)
        self.assertEqual(metric_sum(after, "modserve_request_failure_total",
                                    code="INVALID_ARGUMENT") -
                         metric_sum(before, "modserve_request_failure_total",
                                    code="INVALID_ARGUMENT"), 1)


class OpenAiLimitsTest(unittest.TestCase):
    """A bearer token and a one-request concurrency bound: 401 and 429."""

    def test_token_and_concurrency_limit(self):
        with tempfile.TemporaryDirectory() as tmp:
            token_file = os.path.join(tmp, "token")
            with open(token_file, "w") as f:
                f.write("s3cret\n")
            with Server(BINARY, MODEL, "--threads", "1", "--http_port", "0", "--auth_token_file",
                        token_file, "--max_concurrent_streams", "1") as server:
                base = f"http://127.0.0.1:{server.http_port}/v1"
                wrong = openai.OpenAI(base_url=base, api_key="nope", max_retries=0)
                with self.assertRaises(openai.AuthenticationError) as e:
                    wrong.completions.create(model="demo", prompt=PROMPT, max_tokens=2)
                self.assertEqual(e.exception.status_code, 401)
                # No Authorization header at all (the SDK always sends one).
                conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
                conn.request("GET", "/v1/models")
                resp = conn.getresponse()
                self.assertEqual(resp.status, 401)
                self.assertEqual(resp.getheader("WWW-Authenticate"), "Bearer")
                self.assertIn("missing 'authorization: Bearer <token>'",
                              json.loads(resp.read())["error"]["message"])
                # Health needs no token.
                conn.request("GET", "/health")
                resp = conn.getresponse()
                self.assertEqual(resp.status, 200)
                resp.read()
                conn.close()
                right = openai.OpenAI(base_url=base, api_key="s3cret", max_retries=0)
                self.assertEqual(right.completions.create(model="demo", prompt=PROMPT,
                                                          max_tokens=2).usage.completion_tokens,
                                 2)
                hold = right.completions.create(model="demo", prompt=PROMPT, max_tokens=1500,
                                                stream=True, extra_body={"ignore_eos": True})
                next(iter(hold))
                with self.assertRaises(openai.RateLimitError) as e:
                    right.completions.create(model="demo", prompt=PROMPT, max_tokens=2)
                self.assertEqual(e.exception.status_code, 429)
                self.assertIn("--max_concurrent_streams=1", e.exception.message)
                hold.close()
                # The slot comes back once the cancelled request has ended.
                wait_for(lambda: self._completes(right), 30, "slot released")

    @staticmethod
    def _completes(client):
        try:
            client.completions.create(model="demo", prompt=PROMPT, max_tokens=1)
            return True
        except openai.RateLimitError:
            return False

    def test_chat_without_a_template_is_a_400_that_says_why(self):
        with Server(BINARY, MODEL, "--threads", "1", "--http_port", "0") as server:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1",
                                   api_key="x", max_retries=0)
            with self.assertRaises(openai.BadRequestError) as e:
                client.chat.completions.create(model="demo",
                                               messages=[{"role": "user", "content": "hi"}])
            self.assertIn("no chat template", e.exception.message)
            self.assertIn("--chat_template", e.exception.message)


class SmolLm2ChatTest(unittest.TestCase):
    """A real instruct model and its own chat template, read from its GGUF file: chat through the
    SDK equals gRPC on the prompt that jinja2 renders from the same template."""

    def test_chat_with_the_models_own_template_equals_grpc(self):
        path = os.path.join(ROOT, "models", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
        if not os.path.isfile(path):
            msg = f"{path} is missing: run `bash tools/fetch_models.sh`"
            if os.environ.get("CI") == "true":
                self.fail(msg + " (CI must have it: tools/test.sh fetches it first)")
            self.skipTest(msg)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        # The chat requests find the gRPC request's prompt in the prefix cache and compute only
        # its last rows, in a smaller step: with quantized weights that gives the same bits
        # (docs/DESIGN.md, 4.1, Exactness), so the texts must be equal, not merely close.
        with Server(BINARY, path, "--threads", "1", "--http_port", "0") as server, \
                Client(server.address, timeout=120) as grpc:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1",
                                   api_key="x", max_retries=0, timeout=120)
            [model] = [m.id for m in client.models.list().data]
            self.assertEqual(model, "SmolLM2-135M-Instruct.Q4_1")
            # tests/server/chat_template_test.cc checks that this file is the GGUF's template.
            ids = grpc.tokenize(render_chat(messages), add_special_tokens=False)
            want = grpc.generate(ids, max_new_tokens=12)
            got = client.chat.completions.create(model=model, messages=messages, max_tokens=12,
                                                 temperature=0)
            self.assertEqual(got.usage.prompt_tokens, len(ids))
            self.assertEqual(got.choices[0].message.content, want.text)
            self.assertTrue(want.text)
            streamed = "".join(c.choices[0].delta.content or "" for c in
                               client.chat.completions.create(model=model, messages=messages,
                                                              max_tokens=12, temperature=0,
                                                              stream=True) if c.choices)
            self.assertEqual(streamed, want.text)
            self.assertGreater(metric_sum(server.metrics(), "modserve_prefix_cache_hits_total"), 0)


if __name__ == "__main__":
    BINARY, MODEL = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1])
