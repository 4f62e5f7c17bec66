"""Loads and saves a reference model as a checkpoint directory (DESIGN.md section 3), and loads
and saves a MoD adapter: a directory whose config.json names a dense base model and holds the
`mod` object, with only the router and predictor tensors in adapter.safetensors (section 3.2).
"""
from __future__ import annotations

import json
import os

import torch

from . import safetensors_io as st
from .config import ConfigError, ModelConfig, load_config, parse_mod
from .model import MoDLlama

ADAPTER_KEYS = ("base_model", "mod")
ADAPTER_FILE = "adapter.safetensors"


def is_router_tensor(name: str) -> bool:
    return ".router." in name or ".aux_router" in name


def read_adapter_config(model_dir: str):
    """config.json of `model_dir` as a dict when it is an adapter's (it has `base_model`), else
    None."""
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path, "r", encoding="utf-8") as f:
            raw = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None  # load_config reports these
    if not isinstance(raw, dict) or "base_model" not in raw:
        return None
    return raw


def adapter_base_path(model_dir: str, raw: dict) -> str:
    """The base model `base_model` names: relative to the adapter directory unless absolute."""
    base = raw["base_model"]
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{model_dir}/config.json: 'base_model' must be a non-empty path, got "
                          f"{base!r}")
    return os.path.normpath(os.path.join(model_dir, base))


def load_base(path: str, dtype=torch.float32) -> MoDLlama:
    """A dense model from a GGUF file or a checkpoint directory."""
    if os.path.isfile(path):
        from . import gguf_io  # the gguf package is needed only here
        return gguf_io.load(path, dtype=dtype)
    return load(path, dtype=dtype)


def load_adapter(model_dir: str, dtype=torch.float32) -> MoDLlama:
    """The MoD model an adapter directory describes: its base's weights plus its routers."""
    raw = read_adapter_config(model_dir)
    cfg_path = os.path.join(model_dir, "config.json")
    for k in raw:
        if k not in ADAPTER_KEYS:
            raise ConfigError(f"{cfg_path}: unknown key '{k}' in an adapter config (known keys: "
                              f"{', '.join(ADAPTER_KEYS)})")
    base_path = adapter_base_path(model_dir, raw)
    if not os.path.exists(base_path):
        raise ConfigError(f"{cfg_path}: base model '{raw['base_model']}' ({base_path}) does not "
                          f"exist")
    if "mod" not in raw or raw["mod"] is None:
        raise ConfigError(f"{cfg_path}: an adapter needs the 'mod' object")
    base = load_base(base_path, dtype=torch.float32)
    if base.cfg.mod is not None:
        raise ConfigError(f"{cfg_path}: base model {base_path} is itself a MoD model; an "
                          f"adapter's base must be dense")
    cfg = base.cfg
    try:
        cfg.mod = parse_mod(raw["mod"], cfg.n_layers)
    except ConfigError as e:
        raise ConfigError(f"{cfg_path}: {str(e).removeprefix('config.json: ')} (base model "
                          f"{base_path}, {cfg.n_layers} layers)") from None
    model = MoDLlama(cfg)
    expected = {k: v for k, v in model.state_dict().items() if is_router_tensor(k)}
    tpath = os.path.join(model_dir, ADAPTER_FILE)
    if not os.path.exists(tpath):
        raise st.CheckpointError(f"{tpath}: no such file")
    tensors = st.read_file(tpath)
    for name in sorted(expected):
        if name not in tensors:
            raise st.CheckpointError(f"{tpath}: missing tensor '{name}'")
        if tuple(tensors[name].shape) != tuple(expected[name].shape):
            raise st.CheckpointError(
                f"{tpath}: tensor '{name}' has shape {list(tensors[name].shape)}, but the base "
                f"model {base_path} needs {list(expected[name].shape)}")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise st.CheckpointError(f"{tpath}: unexpected tensor '{extra[0]}'")
    state = dict(base.state_dict())
    state.update({k: v.to(torch.float32) for k, v in tensors.items()})
    model.load_state_dict(state)
    return model.to(dtype).eval()


def save_adapter(model: MoDLlama, model_dir: str, base_model: str) -> None:
    """Writes config.json ({base_model, mod}) and adapter.safetensors (F32 routers and
    predictors). `base_model` is stored as given (relative to model_dir, or absolute)."""
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump({"base_model": base_model, "mod": model.cfg.mod.to_json()}, f, indent=2)
        f.write("\n")
    tensors = {k: v.detach().to(torch.float32) for k, v in model.state_dict().items()
               if is_router_tensor(k)}
    st.write_file(os.path.join(model_dir, ADAPTER_FILE), tensors, {"format": "pt"})


def load(model_dir: str, dtype=torch.float32) -> MoDLlama:
    if read_adapter_config(model_dir) is not None:
        return load_adapter(model_dir, dtype)
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
