"""Typed wrapper over the generated ModServe stubs: generate, stream, tokenize, info, health.

It converts responses into dataclasses and requests from keyword arguments; it never hides a gRPC
error (grpc.RpcError propagates with the server's code and message), and retries only when asked
to (``retries``: UNAVAILABLE, the whole request again).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from typing import Iterator, List, Optional, Sequence, Union

import grpc

# The generated package `modserve.v1` sits beside this package (clients/python/).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from modserve.v1 import modserve_pb2  # noqa: E402
from modserve.v1 import modserve_pb2_grpc  # noqa: E402

FINISH_REASONS = {
    modserve_pb2.FINISH_REASON_UNSPECIFIED: None,
    modserve_pb2.FINISH_REASON_LENGTH: "length",
    modserve_pb2.FINISH_REASON_STOP_TOKEN: "stop_token",
    modserve_pb2.FINISH_REASON_STOP_STRING: "stop_string",
}


@dataclasses.dataclass
class RoutingLayer:
    layer: int
    tokens_total: int
    tokens_computed: int
    computed_fraction: float


@dataclasses.dataclass
class Generation:
    """A finished generation (the unary response, or a stream's chunks joined)."""

    token_ids: List[int]
    text: str
    logprobs: List[float]
    finish_reason: Optional[str]
    prompt_tokens: int
    completion_tokens: int
    ttft_seconds: float
    total_seconds: float
    routing: List[RoutingLayer]
    kv_bytes: int
    kv_bytes_dense: int
    # (token_id, logprob or None for the first) per prompt token, when prompt_logprobs was asked.
    prompt_logprobs: List[tuple] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class StreamChunk:
    token_ids: List[int]
    text: str
    finish_reason: Optional[str]  # set on the last chunk only


def _routing(r) -> List[RoutingLayer]:
    return [RoutingLayer(l.layer, l.tokens_total, l.tokens_computed, l.computed_fraction)
            for l in r.layers]


def _generation(resp) -> Generation:
    return Generation(
        token_ids=list(resp.token_ids),
        text=resp.text,
        logprobs=[lp.logprob for lp in resp.logprobs],
        finish_reason=FINISH_REASONS.get(resp.finish_reason),
        prompt_tokens=resp.usage.prompt_tokens,
        completion_tokens=resp.usage.completion_tokens,
        ttft_seconds=resp.timings.first_token_seconds,
        total_seconds=resp.timings.total_seconds,
        routing=_routing(resp.routing),
        kv_bytes=resp.routing.kv_bytes,
        kv_bytes_dense=resp.routing.kv_bytes_dense,
        prompt_logprobs=[(p.token_id, p.logprob if p.HasField("logprob") else None)
                         for p in resp.prompt_logprobs],
    )


def _encode_health_request(service: str) -> bytes:
    # grpc.health.v1.HealthCheckRequest{service}: field 1, length-delimited. Hand-encoded so the
    # client needs no `grpc.health` stubs (a generated `grpc/` package would shadow grpcio).
    data = service.encode()
    length, varint = len(data), bytearray()
    while True:
        byte = length & 0x7F
        length >>= 7
        varint.append(byte | (0x80 if length else 0))
        if not length:
            break
    return (b"\x0a" + bytes(varint) + data) if data else b""


def _decode_health_status(data: bytes) -> int:
    # HealthCheckResponse{status}: field 1 varint (a single byte for the four statuses).
    return data[1] if len(data) >= 2 and data[0] == 0x08 else 0


HEALTH_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}

_SCHEMES = ("ipv4:", "ipv6:", "dns:", "unix:", "unix-abstract:")


def _target(target: str) -> str:
    """A comma-separated list of IPv4 host:port without a scheme -> gRPC's ipv4: resolver (the
    default dns: resolver would read it as one name)."""
    return "ipv4:" + target if "," in target and not target.startswith(_SCHEMES) else target


class _Retrying:
    """Wraps a stub method: on UNAVAILABLE (a replica died, drains or is unreachable) it sends the
    whole request again, up to the client's `retries` times, pausing `retry_backoff` s (doubled
    each time, at most 2 s). A stream is resent only before its first message: chunks already
    handed to the caller cannot be taken back, so a later failure propagates."""

    def __init__(self, method, client: "Client", stream: bool):
        self._method, self._client, self._stream = method, client, stream

    def __call__(self, request, **kwargs):
        if self._stream:
            return self._stream_call(request, **kwargs)
        for attempt in range(self._client.retries + 1):
            try:
                return self._method(request, **kwargs)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or attempt == self._client.retries:
                    raise
                self._client._count_retry(attempt)
        raise AssertionError("unreachable")

    def _stream_call(self, request, **kwargs):
        for attempt in range(self._client.retries + 1):
            received = False
            try:
                for msg in self._method(request, **kwargs):
                    received = True
                    yield msg
                return
            except grpc.RpcError as e:
                if (received or e.code() != grpc.StatusCode.UNAVAILABLE
                        or attempt == self._client.retries):
                    raise
                self._client._count_retry(attempt)


class Client:
    """One channel to a modserve server or to several replicas. Every call takes a timeout (the
    server frees a request's KV cache when its deadline passes).

    target: "host:port", "ip:port,ip:port,..." (several replicas) or a gRPC URI such as
    "dns:///modserve.ns.svc.cluster.local:50051" (a headless Service: every ready pod).
    lb_policy: "pick_first" (gRPC's default: every call to one address) or "round_robin" (per
    call, over every ready address). retries: resend a call that ended UNAVAILABLE up to this many
    times, the whole request again (greedy or seeded requests give the same tokens); streams only
    before their first chunk, after `retry_backoff` s (doubling, at most 2 s). `retry_count`
    counts the resends of this client.
    TLS: pass `root_certificates` (PEM bytes of the CA; None = the system roots with tls=True),
    and for client certificates `private_key` and `certificate_chain` (PEM bytes); `token` is
    sent as "authorization: Bearer <token>" on every call. `Client.from_files` reads them."""

    def __init__(self, target: str = "127.0.0.1:50051", timeout: float = 120.0,
                 lb_policy: Optional[str] = None, retries: int = 0, retry_backoff: float = 0.05,
                 tls: bool = False, root_certificates: Optional[bytes] = None,
                 private_key: Optional[bytes] = None, certificate_chain: Optional[bytes] = None,
                 token: Optional[str] = None):
        if lb_policy not in (None, "pick_first", "round_robin"):
            raise ValueError(f"lb_policy {lb_policy!r} is not pick_first or round_robin")
        if retries < 0:
            raise ValueError(f"retries {retries} is negative")
        options = [("grpc.lb_policy_name", lb_policy)] if lb_policy else []
        if tls or root_certificates or certificate_chain:
            creds = grpc.ssl_channel_credentials(root_certificates=root_certificates,
                                                 private_key=private_key,
                                                 certificate_chain=certificate_chain)
            self._channel = grpc.secure_channel(_target(target), creds, options=options)
        else:
            self._channel = grpc.insecure_channel(_target(target), options=options)
        # Plain metadata rather than call credentials: it also works on plaintext channels
        # (behind a TLS-terminating proxy).
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._stub = modserve_pb2_grpc.ModServeStub(self._channel)
        self._timeout = timeout
        self.retries, self.retry_backoff, self.retry_count = retries, retry_backoff, 0
        self._retry_lock = threading.Lock()
        if retries:
            for name in ("Generate", "Tokenize", "Detokenize", "GetModelInfo", "GenerateStream"):
                setattr(self._stub, name, _Retrying(getattr(self._stub, name), self,
                                                    stream=name == "GenerateStream"))
        self._health = self._channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=_encode_health_request,
            response_deserializer=_decode_health_status,
        )

    def close(self) -> None:
        self._channel.close()

    def _count_retry(self, attempt: int) -> None:
        with self._retry_lock:
            self.retry_count += 1
        time.sleep(min(self.retry_backoff * 2 ** attempt, 2.0))

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @staticmethod
    def request(prompt: Union[str, Sequence[int]], max_new_tokens: int = 16,
                temperature: Optional[float] = None, top_k: Optional[int] = None,
                top_p: Optional[float] = None, seed: Optional[int] = None,
                stop: Sequence[str] = (), ignore_eos: bool = False,
                threshold: Optional[float] = None, top_logprobs: int = 0,
                request_id: str = "",
                prompt_logprobs: Optional[int] = None,
                speculative_tokens: Optional[int] = None,
                speculative_threshold: Optional[float] = None) -> modserve_pb2.GenerateRequest:
        """Builds a GenerateRequest; a str prompt is text, a sequence of ints is token ids.
        Unset temperature means greedy; unset speculative_* means the server's flags."""
        req = modserve_pb2.GenerateRequest(request_id=request_id, top_logprobs=top_logprobs)
        if isinstance(prompt, str):
            req.prompt = prompt
        else:
            req.prompt_token_ids.ids.extend(int(t) for t in prompt)
        if temperature is not None:
            req.sampling.temperature = temperature
        if top_k is not None:
            req.sampling.top_k = top_k
        if top_p is not None:
            req.sampling.top_p = top_p
        if seed is not None:
            req.sampling.seed = seed
        req.stopping.max_new_tokens = max_new_tokens
        req.stopping.stop.extend(stop)
        req.stopping.ignore_eos = ignore_eos
        if threshold is not None:
            req.routing.threshold = threshold
        if prompt_logprobs is not None:
            req.prompt_logprobs = prompt_logprobs
        if speculative_tokens is not None:
            req.speculative_tokens = speculative_tokens
        if speculative_threshold is not None:
            req.speculative_threshold = speculative_threshold
        return req

    @classmethod
    def from_files(cls, target: str, ca_file: Optional[str] = None, cert_file: Optional[str] = None,
                   key_file: Optional[str] = None, token_file: Optional[str] = None,
                   **kwargs) -> "Client":
        """A client whose TLS material and token come from files (the token is the first
        non-empty line, as the C++ client reads it)."""
        def read(path):
            with open(path, "rb") as f:
                return f.read()
        token = None
        if token_file:
            with open(token_file, encoding="utf-8") as f:
                token = next((line.strip() for line in f if line.strip()), None)
            if token is None:
                raise ValueError(f"token file {token_file!r} has no token")
        return cls(target, tls=bool(ca_file or cert_file),
                   root_certificates=read(ca_file) if ca_file else None,
                   private_key=read(key_file) if key_file else None,
                   certificate_chain=read(cert_file) if cert_file else None,
                   token=token, **kwargs)

    def generate(self, prompt: Union[str, Sequence[int]], **kwargs) -> Generation:
        return _generation(self._stub.Generate(self.request(prompt, **kwargs),
                                               timeout=self._timeout, metadata=self._metadata))

    def stream(self, prompt: Union[str, Sequence[int]], **kwargs) -> Iterator[StreamChunk]:
        """Yields chunks as they arrive; text chunks never split a UTF-8 character."""
        for msg in self._stub.GenerateStream(self.request(prompt, **kwargs),
                                             timeout=self._timeout, metadata=self._metadata):
            yield StreamChunk(list(msg.token_ids), msg.text,
                              FINISH_REASONS.get(msg.finish_reason))

    def tokenize(self, text: str, add_special_tokens: bool = True) -> List[int]:
        resp = self._stub.Tokenize(
            modserve_pb2.TokenizeRequest(text=text, add_special_tokens=add_special_tokens),
            timeout=self._timeout, metadata=self._metadata)
        return list(resp.token_ids)

    def detokenize(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._stub.Detokenize(
            modserve_pb2.DetokenizeRequest(token_ids=list(token_ids),
                                           skip_special_tokens=skip_special_tokens),
            timeout=self._timeout, metadata=self._metadata).text

    def info(self) -> modserve_pb2.GetModelInfoResponse:
        return self._stub.GetModelInfo(modserve_pb2.GetModelInfoRequest(), timeout=self._timeout,
                                       metadata=self._metadata)

    def health(self, service: str = "") -> str:
        """'SERVING', 'NOT_SERVING', ... of the server ("") or one service."""
        return HEALTH_STATUS.get(self._health(service, timeout=self._timeout), "UNKNOWN")
