"""Parses and validates config.json (Hugging Face Llama keys plus the `mod` object, format 1).

Every error names the key and the bad value. It does not read weights.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Optional


class ConfigError(ValueError):
    """A config.json that does not follow DESIGN.md section 3."""


MOD_KEYS = ("format_version", "routed_layers", "capacity", "router", "weight_fn", "scale_target",
            "inference_routing", "threshold", "layer_thresholds", "predictor")
ROUTER_KEYS = ("bias", "input")
PREDICTOR_KEYS = ("type", "hidden_size", "activation", "bias")


@dataclasses.dataclass
class PredictorConfig:
    type: str = "mlp"  # "mlp" or "linear"
    hidden_size: int = 0  # p, for "mlp"
    activation: str = "silu"  # "silu", "gelu", "relu"
    bias: bool = True


@dataclasses.dataclass
class ModConfig:
    routed_layers: list
    format_version: int = 1
    capacity: float = 0.125
    router_bias: bool = False
    router_input: str = "residual"  # or "input_layernorm"
    weight_fn: str = "identity"  # or "sigmoid", or "one" (a routed-in token takes y as it is)
    scale_target: str = "update"  # or "block_output"
    inference_routing: str = "router_threshold"  # or "predictor_threshold"
    threshold: float = 0.5
    predictor: Optional[PredictorConfig] = None
    # Per routed layer (in ascending layer order): the training capacity, and the layer's own
    # threshold tau_l at the default request threshold (None: every layer uses the request's).
    # `capacity` is then the largest of the capacities.
    capacities: Optional[list] = None
    layer_thresholds: Optional[list] = None

    def __post_init__(self):
        if self.capacities is None:
            self.capacities = [self.capacity] * len(self.routed_layers)
        else:
            self.capacity = max(self.capacities)

    def layer_capacity(self, layer: int) -> float:
        return self.capacities[self.routed_layers.index(layer)]

    def layer_threshold(self, layer: int, request_tau: Optional[float] = None) -> float:
        """tau_l(r) of DESIGN.md section 2: layer `layer`'s threshold for request threshold r."""
        r = self.threshold if request_tau is None else request_tau
        if self.layer_thresholds is None:
            return r
        return shift_threshold(self.layer_thresholds[self.routed_layers.index(layer)],
                               self.threshold, r)

    def to_json(self) -> dict:
        per_layer = any(c != self.capacities[0] for c in self.capacities)
        out = {
            "format_version": self.format_version,
            "routed_layers": list(self.routed_layers),
            "capacity": list(self.capacities) if per_layer else self.capacity,
            "router": {"bias": self.router_bias, "input": self.router_input},
            "weight_fn": self.weight_fn,
            "scale_target": self.scale_target,
            "inference_routing": self.inference_routing,
            "threshold": self.threshold,
            "predictor": None,
        }
        if self.layer_thresholds is not None:
            out["layer_thresholds"] = list(self.layer_thresholds)
        if self.predictor is not None:
            p = self.predictor
            out["predictor"] = {"type": p.type, "bias": p.bias}
            if p.type == "mlp":
                out["predictor"].update({"hidden_size": p.hidden_size, "activation": p.activation})
        return out


@dataclasses.dataclass
class ModelConfig:
    d_model: int
    d_ff: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    max_seq_len: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    bos_token_id: Optional[int] = None
    eos_token_ids: tuple = ()
    torch_dtype: str = "float32"
    mod: Optional[ModConfig] = None

    def is_routed(self, layer: int) -> bool:
        return self.mod is not None and layer in self.mod.routed_layers

    def to_json(self) -> dict:
        eos: Any = list(self.eos_token_ids)
        if len(eos) == 1:
            eos = eos[0]
        out = {
            "model_type": "llama",
            "architectures": ["LlamaMoDForCausalLM" if self.mod else "LlamaForCausalLM"],
            "hidden_size": self.d_model,
            "intermediate_size": self.d_ff,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_seq_len,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "torch_dtype": self.torch_dtype,
            "hidden_act": "silu",
        }
        if self.mod is not None:
            out["mod"] = self.mod.to_json()
        return out


def shift_threshold(tau_l: float, tau_0: float, r: float) -> float:
    """sigmoid(logit(tau_l) + logit(r) - logit(tau_0)): tau_l moved along the logit axis by as
    much as the request threshold r differs from the default tau_0 (exactly tau_l at r = tau_0,
    exactly r where tau_l = tau_0). The engine computes the same in double (config.cc)."""
    if r == tau_0:
        return tau_l
    if tau_l == tau_0:
        return r

    def logit(p: float) -> float:
        return math.log(p) - math.log1p(-p)

    return 1.0 / (1.0 + math.exp(-(logit(tau_l) + logit(r) - logit(tau_0))))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))


def _req_int(cfg: dict, key: str, lo: int = 1) -> int:
    if key not in cfg:
        raise ConfigError(f"config.json: missing required key '{key}'")
    v = cfg[key]
    if not _is_int(v) or v < lo:
        raise ConfigError(f"config.json: '{key}' must be an integer >= {lo}, got {v!r}")
    return v


def _opt_num(cfg: dict, key: str, default: float, prefix: str = "") -> float:
    v = cfg.get(key, default)
    if not _is_num(v):
        raise ConfigError(f"config.json: '{prefix}{key}' must be a finite number, got {v!r}")
    return float(v)


def _choice(obj: dict, key: str, default: str, allowed: tuple, prefix: str) -> str:
    v = obj.get(key, default)
    if v not in allowed:
        raise ConfigError(f"config.json: '{prefix}{key}' has unknown value {v!r} "
                          f"(expected one of {', '.join(repr(a) for a in allowed)})")
    return v


def _bool(obj: dict, key: str, default: bool, prefix: str) -> bool:
    v = obj.get(key, default)
    if not isinstance(v, bool):
        raise ConfigError(f"config.json: '{prefix}{key}' must be true or false, got {v!r}")
    return v


def _check_keys(obj: Any, allowed: tuple, where: str) -> None:
    if not isinstance(obj, dict):
        raise ConfigError(f"config.json: '{where}' must be an object, got {obj!r}")
    for k in obj:
        if k not in allowed:
            raise ConfigError(f"config.json: unknown key '{where}.{k}' "
                              f"(known keys: {', '.join(allowed)})")


def _per_layer(v: Any, key: str, routed: list) -> list:
    """A list of finite numbers, one per routed layer."""
    if not isinstance(v, list) or not all(_is_num(x) for x in v):
        raise ConfigError(f"config.json: 'mod.{key}' must be a list of numbers, one "
                          f"per routed layer, got {v!r}")
    if len(v) != len(routed):
        raise ConfigError(f"config.json: 'mod.{key}' has {len(v)} values for {len(routed)} "
                          f"routed layers")
    return v


def parse_mod(obj: Any, n_layers: int) -> ModConfig:
    _check_keys(obj, MOD_KEYS, "mod")
    if "format_version" not in obj:
        raise ConfigError("config.json: missing required key 'mod.format_version'")
    if obj["format_version"] != 1 or isinstance(obj["format_version"], bool):
        raise ConfigError(f"config.json: 'mod.format_version' must be 1, got "
                          f"{obj['format_version']!r}")
    if "routed_layers" not in obj:
        raise ConfigError("config.json: missing required key 'mod.routed_layers'")
    routed = obj["routed_layers"]
    if not isinstance(routed, list) or not all(_is_int(i) for i in routed):
        raise ConfigError(f"config.json: 'mod.routed_layers' must be a list of layer indices, "
                          f"got {routed!r}")
    for i in routed:
        if not 0 <= i < n_layers:
            raise ConfigError(f"config.json: 'mod.routed_layers' has layer {i}, outside "
                              f"[0, {n_layers})")
    if len(set(routed)) != len(routed):
        raise ConfigError(f"config.json: 'mod.routed_layers' repeats a layer: {routed!r}")
    # Per-layer lists are given in the order of routed_layers as written; kept in layer order.
    order = sorted(range(len(routed)), key=lambda i: routed[i])
    capacity = obj.get("capacity", 0.125)
    capacities = None
    if isinstance(capacity, list):
        capacities = [float(c) for c in _per_layer(capacity, "capacity", routed)]
        for c in capacities:
            if not 0.0 < c <= 1.0:
                raise ConfigError(f"config.json: 'mod.capacity' must be in (0, 1], got {c!r}")
        capacities = [capacities[i] for i in order]
        capacity = max(capacities)
    else:
        capacity = _opt_num(obj, "capacity", 0.125, "mod.")
        if not 0.0 < capacity <= 1.0:
            raise ConfigError(f"config.json: 'mod.capacity' must be in (0, 1], got {capacity!r}")
    router = obj.get("router", {})
    if router is None:
        router = {}
    _check_keys(router, ROUTER_KEYS, "mod.router")
    threshold = _opt_num(obj, "threshold", 0.5, "mod.")
    if not 0.0 < threshold < 1.0:
        raise ConfigError(f"config.json: 'mod.threshold' must be in (0, 1), got {threshold!r}")
    layer_thresholds = obj.get("layer_thresholds")
    if layer_thresholds is not None:
        layer_thresholds = [float(t) for t in _per_layer(layer_thresholds, "layer_thresholds",
                                                         routed)]
        for t in layer_thresholds:
            if not 0.0 < t < 1.0:
                raise ConfigError(f"config.json: 'mod.layer_thresholds' must be in (0, 1), "
                                  f"got {t!r}")
        layer_thresholds = [layer_thresholds[i] for i in order]
    mod = ModConfig(
        routed_layers=sorted(routed),
        capacity=capacity,
        router_bias=_bool(router, "bias", False, "mod.router."),
        router_input=_choice(router, "input", "residual", ("residual", "input_layernorm"),
                             "mod.router."),
        weight_fn=_choice(obj, "weight_fn", "identity", ("identity", "sigmoid", "one"), "mod."),
        scale_target=_choice(obj, "scale_target", "update", ("update", "block_output"), "mod."),
        inference_routing=_choice(obj, "inference_routing", "router_threshold",
                                  ("router_threshold", "predictor_threshold"), "mod."),
        threshold=threshold,
        capacities=capacities,
        layer_thresholds=layer_thresholds,
    )
    pred = obj.get("predictor")
    if pred is not None:
        _check_keys(pred, PREDICTOR_KEYS, "mod.predictor")
        ptype = _choice(pred, "type", "mlp", ("mlp", "linear"), "mod.predictor.")
        p = PredictorConfig(type=ptype, bias=_bool(pred, "bias", True, "mod.predictor."))
        if ptype == "mlp":
            if "hidden_size" not in pred:
                raise ConfigError("config.json: missing required key 'mod.predictor.hidden_size'")
            hs = pred["hidden_size"]
            if not _is_int(hs) or hs < 1:
                raise ConfigError(f"config.json: 'mod.predictor.hidden_size' must be an integer "
                                  f">= 1, got {hs!r}")
            p.hidden_size = hs
            p.activation = _choice(pred, "activation", "silu", ("silu", "gelu", "relu"),
                                   "mod.predictor.")
        mod.predictor = p
    if mod.inference_routing == "predictor_threshold" and mod.predictor is None:
        raise ConfigError("config.json: 'mod.inference_routing' is 'predictor_threshold' but "
                          "'mod.predictor' is missing")
    return mod


def parse_config(cfg: Any) -> ModelConfig:
    if not isinstance(cfg, dict):
        raise ConfigError("config.json: top level must be an object")
    mt = cfg.get("model_type", "llama")
    if mt != "llama":
        raise ConfigError(f"config.json: 'model_type' must be 'llama', got {mt!r}")
    d_model = _req_int(cfg, "hidden_size")
    n_layers = _req_int(cfg, "num_hidden_layers")
    n_heads = _req_int(cfg, "num_attention_heads")
    n_kv_heads = cfg.get("num_key_value_heads", n_heads)
    if not _is_int(n_kv_heads) or n_kv_heads < 1 or n_heads % n_kv_heads != 0:
        raise ConfigError(f"config.json: 'num_key_value_heads' must divide num_attention_heads "
                          f"({n_heads}), got {n_kv_heads!r}")
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        if d_model % n_heads != 0:
            raise ConfigError(f"config.json: 'hidden_size' {d_model} is not a multiple of "
                              f"num_attention_heads {n_heads} and 'head_dim' is not given")
        head_dim = d_model // n_heads
    if not _is_int(head_dim) or head_dim < 2 or head_dim % 2 != 0:
        raise ConfigError(f"config.json: 'head_dim' must be an even integer >= 2, got {head_dim!r}")
    eos = cfg.get("eos_token_id")
    vocab = _req_int(cfg, "vocab_size")
    if eos is None:
        eos_ids = ()
    elif _is_int(eos):
        eos_ids = (eos,)
    elif isinstance(eos, list) and all(_is_int(e) for e in eos):
        eos_ids = tuple(eos)
    else:
        raise ConfigError(f"config.json: 'eos_token_id' must be an integer or a list of them, "
                          f"got {eos!r}")
    for e in eos_ids:
        if not 0 <= e < vocab:
            raise ConfigError(f"config.json: 'eos_token_id' {e} is outside the vocabulary "
                              f"[0, {vocab})")
    bos = cfg.get("bos_token_id")
    if bos is not None and (not _is_int(bos) or not 0 <= bos < vocab):
        raise ConfigError(f"config.json: 'bos_token_id' must be a token id below vocab_size "
                          f"{vocab}, got {bos!r}")
    eps = _opt_num(cfg, "rms_norm_eps", 1e-6)
    if eps <= 0:
        raise ConfigError(f"config.json: 'rms_norm_eps' must be > 0, got {eps!r}")
    theta = _opt_num(cfg, "rope_theta", 10000.0)
    if theta <= 0:
        raise ConfigError(f"config.json: 'rope_theta' must be > 0, got {theta!r}")
    if cfg.get("rope_scaling") is not None:
        raise ConfigError(f"config.json: 'rope_scaling' is not supported, got "
                          f"{cfg['rope_scaling']!r}")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"config.json: 'hidden_act' must be 'silu', got {act!r}")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key, False):
            raise ConfigError(f"config.json: '{key}' = true is not supported")
    tie = cfg.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise ConfigError(f"config.json: 'tie_word_embeddings' must be true or false, got {tie!r}")
    mc = ModelConfig(
        d_model=d_model,
        d_ff=_req_int(cfg, "intermediate_size"),
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        max_seq_len=_req_int(cfg, "max_position_embeddings"),
        rms_norm_eps=eps,
        rope_theta=theta,
        tie_word_embeddings=tie,
        bos_token_id=bos,
        eos_token_ids=eos_ids,
        torch_dtype=str(cfg.get("torch_dtype", "float32")),
    )
    if "mod" in cfg and cfg["mod"] is not None:
        mc.mod = parse_mod(cfg["mod"], n_layers)
    return mc


def load_config(model_dir: str) -> ModelConfig:
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path, "r", encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON: {e}") from None
    return parse_config(raw)
