"""Loads and saves a reference model as a checkpoint directory (DESIGN.md section 3)."""
from __future__ import annotations

import json
import os

import torch

from . import safetensors_io as st
from .config import ModelConfig, load_config
from .model import MoDLlama


def is_router_tensor(name: str) -> bool:
    return ".router." in name or ".aux_router" in name


def load(model_dir: str, dtype=torch.float32) -> MoDLlama:
    cfg = load_config(model_dir)
    tensors = st.load_dir(model_dir)
    model = MoDLlama(cfg)
    expected = model.state_dict()
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    for name in sorted(expected):
        if name not in tensors:
            raise st.CheckpointError(f"{model_dir}: missing tensor '{name}'")
        if tuple(tensors[name].shape) != tuple(expected[name].shape):
            raise st.CheckpointError(f"{model_dir}: tensor '{name}' has shape "
                                     f"{list(tensors[name].shape)}, expected "
                                     f"{list(expected[name].shape)}")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise st.CheckpointError(f"{model_dir}: unexpected tensor '{extra[0]}'")
    model.load_state_dict({k: v.to(torch.float32) for k, v in tensors.items()})
    return model.to(dtype).eval()


def save(model: MoDLlama, model_dir: str, dtype=torch.float32, router_dtype=torch.float32,
         shard_bytes: int = 0, extra_config: dict | None = None) -> None:
    """Writes config.json and weights; routers and predictors in `router_dtype`, the rest in
    `dtype`. shard_bytes > 0 writes shards of at most that size plus an index."""
    os.makedirs(model_dir, exist_ok=True)
    cfg: ModelConfig = model.cfg
    cfg.torch_dtype = {torch.float32: "float32", torch.float16: "float16",
                       torch.bfloat16: "bfloat16"}[dtype]
    out = cfg.to_json()
    if extra_config:
        out.update(extra_config)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    tensors = {}
    for name, t in model.state_dict().items():
        tensors[name] = t.detach().to(router_dtype if is_router_tensor(name) else dtype)
    for stale in ("model.safetensors", "model.safetensors.index.json"):
        if os.path.exists(os.path.join(model_dir, stale)):
            os.remove(os.path.join(model_dir, stale))
    if shard_bytes > 0:
        st.save_sharded(model_dir, tensors, shard_bytes)
    else:
        st.write_file(os.path.join(model_dir, "model.safetensors"), tensors, {"format": "pt"})
