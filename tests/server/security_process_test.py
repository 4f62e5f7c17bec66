"""End-to-end security of the built `modserve`: start-up refusals of bad credential files (exit 1,
naming the flag and the file), then mutual TLS + bearer token + a health-only port, driven by
Python's grpc.secure_channel with metadata, by the built C++ client's --tls_* and
--auth_token_file flags, and over HTTPS on the OpenAI API port (Python's ssl + http.client). The PKI is made at test time by the built modserve-test-certs.

    python3 tests/server/security_process_test.py MODSERVE MODSERVE_CLIENT MODSERVE_TEST_CERTS \
        CHECKPOINT_DIR
"""

import http.client
import json
import os
import ssl
import subprocess
import sys
import tempfile
import unittest

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
from loopback import Server  # noqa: E402
from modserve.v1 import modserve_pb2  # noqa: E402
from modserve.v1 import modserve_pb2_grpc  # noqa: E402
from modserve_client import Client  # noqa: E402

MODSERVE = CLIENT = MAKE_CERTS = CHECKPOINT = None
TOKEN = "process-test-token-8f3a"
TIMEOUT = 60


def health_check(channel, service=""):
    """grpc.health.v1.Health/Check without generated stubs; returns the status enum value."""
    data = service.encode()
    request = (b"\x0a" + bytes([len(data)]) + data) if data else b""
    call = channel.unary_unary("/grpc.health.v1.Health/Check",
                               request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)
    resp = call(request, timeout=TIMEOUT)
    return resp[1] if len(resp) >= 2 and resp[0] == 0x08 else 0


class SecurityProcessTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = cls.tmp.name
        subprocess.run([MAKE_CERTS, cls.dir], check=True, timeout=TIMEOUT)
        cls.token_file = os.path.join(cls.dir, "token")
        with open(cls.token_file, "w") as f:
            f.write(TOKEN + "\n")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def read(self, name):
        with open(self.path(name), "rb") as f:
            return f.read()

    def test_bad_credential_files_exit_one_naming_flag_and_file(self):
        empty = self.path("empty")
        open(empty, "w").close()
        missing = self.path("missing.pem")
        cases = [
            (["--tls_cert_file", missing, "--tls_key_file", self.path("server.key")],
             f"--tls_cert_file: '{missing}' cannot be opened"),
            (["--tls_cert_file", self.path("server.crt"), "--tls_key_file", empty],
             f"--tls_key_file: '{empty}' is empty"),
            (["--tls_cert_file", self.path("server.crt"), "--tls_key_file",
              self.path("client.key")], "is not the key of the certificate"),
            (["--auth_token_file", empty], f"--auth_token_file: '{empty}' is empty"),
            (["--auth_token_file", missing], f"--auth_token_file: '{missing}' cannot be opened"),
        ]
        for flags, message in cases:
            proc = subprocess.run([MODSERVE, "--model", CHECKPOINT, "--port", "0"] + flags,
                                  capture_output=True, text=True, timeout=TIMEOUT)
            self.assertEqual(proc.returncode, 1, proc.stderr)
            self.assertIn(message, proc.stderr)

    def test_mutual_tls_token_and_health_port(self):
        server = Server(MODSERVE, CHECKPOINT, "--health_port", "0", "--threads", "1",
                        "--tls_cert_file", self.path("server.crt"),
                        "--tls_key_file", self.path("server.key"),
                        "--tls_client_ca_file", self.path("ca.crt"),
                        "--auth_token_file", self.token_file, "--max_new_tokens", "64",
                        "--http_port", "0", metrics=False, stderr=None)
        try:
            port, health_port = server.port, server.health_port
            target = f"127.0.0.1:{port}"
            credentials = grpc.ssl_channel_credentials(
                root_certificates=self.read("ca.crt"), private_key=self.read("client.key"),
                certificate_chain=self.read("client.crt"))
            auth = [("authorization", f"Bearer {TOKEN}")]
            req = modserve_pb2.GenerateRequest()
            req.prompt_token_ids.ids.extend([1, 42, 7])
            req.stopping.max_new_tokens = 5
            req.stopping.ignore_eos = True
            with grpc.secure_channel(target, credentials) as channel:
                stub = modserve_pb2_grpc.ModServeStub(channel)
                resp = stub.Generate(req, metadata=auth, timeout=TIMEOUT)
                self.assertEqual(len(resp.token_ids), 5)
                streamed = [t for m in stub.GenerateStream(req, metadata=auth, timeout=TIMEOUT)
                            for t in m.token_ids]
                self.assertEqual(streamed, list(resp.token_ids))
                with self.assertRaises(grpc.RpcError) as e:
                    stub.GetModelInfo(modserve_pb2.GetModelInfoRequest(), timeout=TIMEOUT)
                self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
                too_many = modserve_pb2.GenerateRequest()
                too_many.CopyFrom(req)
                too_many.stopping.max_new_tokens = 65
                with self.assertRaises(grpc.RpcError) as e:
                    stub.Generate(too_many, metadata=auth, timeout=TIMEOUT)
                self.assertEqual(e.exception.code(), grpc.StatusCode.OUT_OF_RANGE)
                self.assertIn("--max_new_tokens=64", e.exception.details())
            # Without a client certificate the handshake fails, token or not.
            no_cert = grpc.ssl_channel_credentials(root_certificates=self.read("ca.crt"))
            with grpc.secure_channel(target, no_cert) as channel:
                with self.assertRaises(grpc.RpcError) as e:
                    modserve_pb2_grpc.ModServeStub(channel).GetModelInfo(
                        modserve_pb2.GetModelInfoRequest(), metadata=auth, timeout=TIMEOUT)
                self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
            # The health port: plaintext, no token, no client certificate.
            with grpc.insecure_channel(f"127.0.0.1:{health_port}") as channel:
                self.assertEqual(health_check(channel), 1)  # SERVING
                self.assertEqual(health_check(channel, "modserve.v1.ModServe"), 1)

            # The Python client package: TLS material and token from files.
            with Client.from_files(target, ca_file=self.path("ca.crt"),
                                   cert_file=self.path("client.crt"),
                                   key_file=self.path("client.key"),
                                   token_file=self.token_file, timeout=TIMEOUT) as client:
                got = client.generate([1, 42, 7], max_new_tokens=5, ignore_eos=True)
                self.assertEqual(got.token_ids, list(resp.token_ids))
                self.assertEqual([t for c in client.stream([1, 42, 7], max_new_tokens=5,
                                                           ignore_eos=True)
                                  for t in c.token_ids], list(resp.token_ids))
            with Client.from_files(target, ca_file=self.path("ca.crt"),
                                   cert_file=self.path("client.crt"),
                                   key_file=self.path("client.key"), timeout=TIMEOUT) as client:
                with self.assertRaises(grpc.RpcError) as e:
                    client.generate([1, 42, 7], max_new_tokens=5)
                self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)

            self.check_https(server.http_port, [l.logprob for l in resp.logprobs])

            # The C++ client's flags.
            tls_flags = ["--server", target, "--tls_ca_file", self.path("ca.crt"),
                         "--tls_cert_file", self.path("client.crt"),
                         "--tls_key_file", self.path("client.key")]
            gen = ["generate", "--prompt_ids", "1,42,7", "--max_new_tokens", "5",
                   "--ignore_eos"]
            ok = subprocess.run([CLIENT] + tls_flags + ["--auth_token_file", self.token_file]
                                + gen, capture_output=True, text=True, timeout=TIMEOUT)
            self.assertEqual(ok.returncode, 0, ok.stderr)
            self.assertEqual(ok.stdout.strip(), ",".join(str(t) for t in resp.token_ids))
            refused = subprocess.run([CLIENT] + tls_flags + gen, capture_output=True, text=True,
                                     timeout=TIMEOUT)
            self.assertEqual(refused.returncode, 1)
            self.assertIn("code 16", refused.stderr)  # UNAUTHENTICATED
        finally:
            try:
                self.assertEqual(server.terminate(timeout=TIMEOUT), 0)
            finally:
                server.stop()

    def check_https(self, port, want_logprobs):
        """The HTTP port serves the same certificate, client CA and token as the gRPC port."""
        body = json.dumps({"prompt": [1, 42, 7], "max_tokens": 5, "ignore_eos": True,
                           "temperature": 0, "logprobs": 0})
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}

        def context(client_cert):
            ctx = ssl.create_default_context(cafile=self.path("ca.crt"))
            ctx.check_hostname = False  # the test certificate names localhost, we dial 127.0.0.1
            if client_cert:
                ctx.load_cert_chain(self.path("client.crt"), self.path("client.key"))
            return ctx

        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=TIMEOUT,
                                           context=context(True))
        conn.request("POST", "/v1/completions", body, headers)
        resp = conn.getresponse()
        got = json.loads(resp.read())
        self.assertEqual(resp.status, 200, got)
        self.assertEqual(got["usage"]["completion_tokens"], 5)
        # The same generation as gRPC's (this checkpoint has no tokenizer, so no text: its
        # logprobs, which name the chosen tokens' scores, are compared).
        self.assertEqual(got["choices"][0]["logprobs"]["token_logprobs"], want_logprobs)
        conn.request("POST", "/v1/completions", body,
                     {"Content-Type": "application/json", "Authorization": "Bearer wrong"})
        resp = conn.getresponse()
        resp.read()
        self.assertEqual(resp.status, 401)
        conn.close()
        # Without a client certificate the TLS handshake fails.
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=TIMEOUT,
                                           context=context(False))
        with self.assertRaises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
            conn.request("POST", "/v1/completions", body, headers)
            conn.getresponse().read()
        conn.close()
        # Plaintext to the TLS port is not served.
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
        with self.assertRaises((ConnectionError, http.client.HTTPException)):
            plain.request("GET", "/health")
            plain.getresponse().read()
        plain.close()


if __name__ == "__main__":
    MODSERVE, CLIENT, MAKE_CERTS, CHECKPOINT = sys.argv[1:5]
    del sys.argv[1:5]
    unittest.main()
