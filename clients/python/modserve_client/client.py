"""Typed wrapper over the generated ModServe stubs: generate, stream, tokenize, info, health.

It converts responses into dataclasses and requests from keyword arguments; it never retries
and never hides a gRPC error (grpc.RpcError propagates with the server's code and message).
"""

from __future__ import annotations

import dataclasses
import os
import sys
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


class Client:
    """One channel to a modserve server. Every call takes a timeout (the server frees a request's
    KV cache when its deadline passes)."""

    def __init__(self, target: str = "127.0.0.1:50051", timeout: float = 120.0):
        self._channel = grpc.insecure_channel(target)
        self._stub = modserve_pb2_grpc.ModServeStub(self._channel)
        self._timeout = timeout
        self._health = self._channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=_encode_health_request,
            response_deserializer=_decode_health_status,
        )

    def close(self) -> None:
        self._channel.close()

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
                request_id: str = "") -> modserve_pb2.GenerateRequest:
        """Builds a GenerateRequest; a str prompt is text, a sequence of ints is token ids.
        Unset temperature means greedy."""
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
        return req

    def generate(self, prompt: Union[str, Sequence[int]], **kwargs) -> Generation:
        return _generation(self._stub.Generate(self.request(prompt, **kwargs),
                                               timeout=self._timeout))

    def stream(self, prompt: Union[str, Sequence[int]], **kwargs) -> Iterator[StreamChunk]:
        """Yields chunks as they arrive; text chunks never split a UTF-8 character."""
        for msg in self._stub.GenerateStream(self.request(prompt, **kwargs),
                                             timeout=self._timeout):
            yield StreamChunk(list(msg.token_ids), msg.text,
                              FINISH_REASONS.get(msg.finish_reason))

    def tokenize(self, text: str, add_special_tokens: bool = True) -> List[int]:
        resp = self._stub.Tokenize(
            modserve_pb2.TokenizeRequest(text=text, add_special_tokens=add_special_tokens),
            timeout=self._timeout)
        return list(resp.token_ids)

    def detokenize(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._stub.Detokenize(
            modserve_pb2.DetokenizeRequest(token_ids=list(token_ids),
                                           skip_special_tokens=skip_special_tokens),
            timeout=self._timeout).text

    def info(self) -> modserve_pb2.GetModelInfoResponse:
        return self._stub.GetModelInfo(modserve_pb2.GetModelInfoRequest(), timeout=self._timeout)

    def health(self, service: str = "") -> str:
        """'SERVING', 'NOT_SERVING', ... of the server ("") or one service."""
        return HEALTH_STATUS.get(self._health(service, timeout=self._timeout), "UNKNOWN")
