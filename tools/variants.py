"""Small random checkpoints that together cover every option of DESIGN.md section 3.

Shared by the golden-data script and the Python tests, so both exercise the same set.
"""
from __future__ import annotations

import copy
import math

import torch

from modref.config import parse_config
from modref.model import MoDLlama

BASE = {
    "model_type": "llama", "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "vocab_size": 160, "max_position_embeddings": 512,
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
}

# name -> (config overrides, weight dtype, shard bytes (0 = one file))
VARIANTS = {
    "router_identity_update": ({"mod": {
        "format_version": 1, "routed_layers": [1, 3], "capacity": 0.125,
        "router": {"bias": False, "input": "residual"}, "weight_fn": "identity",
        "scale_target": "update", "inference_routing": "router_threshold", "threshold": 0.5,
        "predictor": None}}, torch.float32, 0),
    "router_sigmoid_blockout_ln_bias": ({"mod": {
        "format_version": 1, "routed_layers": [0, 2], "capacity": 0.25,
        "router": {"bias": True, "input": "input_layernorm"}, "weight_fn": "sigmoid",
        "scale_target": "block_output", "inference_routing": "router_threshold",
        "threshold": 0.5}}, torch.float32, 0),
    "predictor_mlp_silu_bf16": ({"mod": {
        "format_version": 1, "routed_layers": [1, 3], "weight_fn": "sigmoid",
        "inference_routing": "predictor_threshold",
        "predictor": {"type": "mlp", "hidden_size": 16, "activation": "silu", "bias": True}}},
        torch.bfloat16, 0),
    "predictor_linear_f16_tied": ({"tie_word_embeddings": True, "mod": {
        "format_version": 1, "routed_layers": [1, 2, 3], "weight_fn": "identity",
        "scale_target": "update", "inference_routing": "predictor_threshold", "threshold": 0.4,
        "predictor": {"type": "linear", "bias": False}}}, torch.float16, 0),
    "predictor_mlp_gelu_sharded_mha": ({"num_key_value_heads": 4, "mod": {
        "format_version": 1, "routed_layers": [1, 3], "weight_fn": "sigmoid",
        "scale_target": "block_output", "router": {"bias": True, "input": "input_layernorm"},
        "inference_routing": "predictor_threshold", "threshold": 0.6,
        "predictor": {"type": "mlp", "hidden_size": 8, "activation": "gelu", "bias": False}}},
        torch.float32, 120000),
    "predictor_mlp_relu_headdim": ({"head_dim": 16, "num_attention_heads": 6,
                                    "num_key_value_heads": 3, "eos_token_id": [2, 3], "mod": {
        "format_version": 1, "routed_layers": [0, 1, 2, 3], "weight_fn": "sigmoid",
        "inference_routing": "predictor_threshold",
        "predictor": {"type": "mlp", "hidden_size": 12, "activation": "relu", "bias": True}}},
        torch.bfloat16, 60000),
    "dense": ({}, torch.float32, 0),
    "dense_bf16_tied": ({"tie_word_embeddings": True}, torch.bfloat16, 0),
    # Per-layer capacities and thresholds (given in routed_layers' written order), weight_fn one.
    "per_layer_one_predictor": ({"mod": {
        "format_version": 1, "routed_layers": [3, 1, 2], "capacity": [0.25, 0.75, 0.5],
        "router": {"bias": True, "input": "input_layernorm"}, "weight_fn": "one",
        "inference_routing": "predictor_threshold", "threshold": 0.5,
        "layer_thresholds": [0.62, 0.35, 0.5],
        "predictor": {"type": "mlp", "hidden_size": 16, "activation": "silu", "bias": True}}},
        torch.bfloat16, 0),
}

# MoD adapters over one of the checkpoints above: name -> (base variant, the `mod` object).
# The adapter directory holds config.json {base_model: "../<base>", mod} and adapter.safetensors.
ADAPTERS = {
    "adapter_per_layer_router": ("dense", {
        "format_version": 1, "routed_layers": [0, 1, 2, 3], "capacity": [0.9, 0.7, 0.6, 0.4],
        "router": {"bias": True, "input": "input_layernorm"}, "weight_fn": "one",
        "scale_target": "update", "inference_routing": "router_threshold", "threshold": 0.5,
        "layer_thresholds": [0.3, 0.45, 0.55, 0.7]}),
}


def variant_config(name: str) -> dict:
    overrides, _, _ = VARIANTS[name]
    cfg = copy.deepcopy(BASE)
    cfg.update(copy.deepcopy(overrides))
    return cfg


def random_adapter(name: str, seed: int = 1) -> MoDLlama:
    """The base variant's weights (random_model) with random routers of adapter `name`."""
    base_name, mod = ADAPTERS[name]
    base = random_model(base_name)
    cfg = variant_config(base_name)
    cfg["mod"] = copy.deepcopy(mod)
    model = MoDLlama(parse_config(cfg))
    gen = torch.Generator().manual_seed(seed)
    state = dict(base.state_dict())
    for pname, p in sorted(model.state_dict().items()):
        if pname in state:
            continue
        if p.dim() == 1:
            state[pname] = 0.3 * torch.randn(p.shape, generator=gen)
        else:
            state[pname] = torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1])
    model.load_state_dict(state)
    return model.eval()


def random_model(name: str, seed: int = 0) -> MoDLlama:
    """Weights drawn so that activations stay O(1) and routing decisions are mixed."""
    cfg = parse_config(variant_config(name))
    gen = torch.Generator().manual_seed(seed)
    model = MoDLlama(cfg)
    with torch.no_grad():
        for pname, p in sorted(model.named_parameters()):
            if pname.endswith("layernorm.weight") or pname == "model.norm.weight":
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 1:  # biases
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in pname:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
    return model.eval()
