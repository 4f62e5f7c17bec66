"""Loads a GGUF Llama file (the llama.cpp format) into the reference model, dequantized.

The file is read with the `gguf` package (GGUFReader) and every quantized tensor is expanded with
its reference dequantizer, `gguf.quants.dequantize`, so the reference sees exactly the weights
llama.cpp's own dequantization gives, then widened to the requested dtype (float64 for goldens).
llama.cpp's converter permutes the rows of attn_q / attn_k from the Hugging Face rotate-half
layout into interleaved RoPE pairs; `unpermute_qk` undoes that, so the reference keeps its
rotate-half RoPE. Dense Llama files only: an architecture other than "llama", RoPE scaling,
biases or any tensor this module does not know is refused with a GgufError naming it.

  from modref import gguf_io
  model = gguf_io.load("models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")  # float64 MoDLlama
"""
from __future__ import annotations

import re
from typing import Optional

import numpy as np
import torch

from .config import ModelConfig
from .model import MoDLlama

try:
    import gguf
    from gguf import quants as gguf_quants
except ImportError as e:  # pragma: no cover - install_deps.sh installs it
    raise ImportError("modref.gguf_io needs the `gguf` package (tools/requirements.txt)") from e


class GgufError(ValueError):
    """A GGUF file this reference cannot load (the message names the key or tensor)."""


# GGUF tensor name -> reference state_dict name; {l} is the layer index.
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")


def reference_name(gguf_name: str) -> Optional[str]:
    """The reference state_dict name of a GGUF tensor, or None for a name it does not know."""
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    m = _LAYER_RE.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER_TENSORS:
        return f"model.layers.{int(m.group(1))}.{_LAYER_TENSORS[m.group(2)]}"
    return None


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Rotate-half rows -> llama.cpp's interleaved RoPE rows: per head, row i of the first half
    and row i of the second half become rows 2i and 2i+1 (what the converter writes)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of permute_qk: interleaved pairs back to rotate-half halves."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GgufFile:
    """A parsed GGUF file: metadata values by key and tensors by name (still in file form)."""

    def __init__(self, path: str):
        self.path = path
        try:
            self.reader = gguf.GGUFReader(path, "r")
        except (ValueError, OSError, IndexError, KeyError) as e:
            raise GgufError(f"{path}: not a readable GGUF file: {e}") from None
        self.tensors = {t.name: t for t in self.reader.tensors}

    def has(self, key: str) -> bool:
        return key in self.reader.fields

    def get(self, key: str, default=None):
        """The value of metadata key `key` (scalar, str or list), or `default` when absent."""
        field = self.reader.fields.get(key)
        if field is None:
            return default
        return field.contents()

    def require(self, key: str, kind=None):
        if key not in self.reader.fields:
            raise GgufError(f"{self.path}: metadata key '{key}' is missing")
        v = self.get(key)
        if kind is int and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
            raise GgufError(f"{self.path}: metadata key '{key}' must be an integer, got {v!r}")
        if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float, np.number))):
            raise GgufError(f"{self.path}: metadata key '{key}' must be a number, got {v!r}")
        if kind is str and not isinstance(v, str):
            raise GgufError(f"{self.path}: metadata key '{key}' must be a string, got {v!r}")
        return v

    def dequantize(self, name: str) -> np.ndarray:
        """Tensor `name` as float32, shape outer to inner (GGUF dims reversed)."""
        t = self.tensors[name]
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        qtype = gguf.GGMLQuantizationType(int(t.tensor_type))
        try:
            values = gguf_quants.dequantize(t.data, qtype)
        except NotImplementedError as e:
            raise GgufError(f"{self.path}: tensor '{name}' has type {qtype.name}, which the gguf "
                            f"package cannot dequantize: {e}") from None
        return np.asarray(values, dtype=np.float32).reshape(shape)


def load_config(f: GgufFile) -> ModelConfig:
    """The reference config of a GGUF Llama file (llama.* keys, tokenizer.ggml.* ids)."""
    arch = f.require("general.architecture", str)
    if arch != "llama":
        raise GgufError(f"{f.path}: general.architecture is '{arch}', only 'llama' is supported")
    d_model = f.require("llama.embedding_length", int)
    n_heads = f.require("llama.attention.head_count", int)
    n_kv_heads = f.get("llama.attention.head_count_kv", n_heads)
    head_dim = f.get("llama.attention.key_length", d_model // n_heads)
    if f.get("llama.attention.value_length", head_dim) != head_dim:
        raise GgufError(f"{f.path}: llama.attention.value_length differs from key_length")
    rope_dims = f.get("llama.rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise GgufError(f"{f.path}: llama.rope.dimension_count {rope_dims} != head_dim "
                        f"{head_dim} (partial RoPE is not supported)")
    scaling = f.get("llama.rope.scaling.type", "none")
    if scaling not in ("none", None) or f.get("llama.rope.scale_linear", 1.0) != 1.0:
        raise GgufError(f"{f.path}: RoPE scaling '{scaling}' is not supported")
    tokens = f.get("tokenizer.ggml.tokens")
    vocab = f.get("llama.vocab_size", len(tokens) if tokens is not None else None)
    if vocab is None:
        raise GgufError(f"{f.path}: neither llama.vocab_size nor tokenizer.ggml.tokens is present")
    eos = f.get("tokenizer.ggml.eos_token_id")
    cfg = ModelConfig(
        d_model=d_model,
        d_ff=f.require("llama.feed_forward_length", int),
        n_layers=f.require("llama.block_count", int),
        n_heads=n_heads,
        n_kv_heads=int(n_kv_heads),
        head_dim=int(head_dim),
        vocab_size=int(vocab),
        max_seq_len=f.require("llama.context_length", int),
        rms_norm_eps=float(f.require("llama.attention.layer_norm_rms_epsilon", float)),
        rope_theta=float(f.get("llama.rope.freq_base", 10000.0)),
        tie_word_embeddings="output.weight" not in f.tensors,
        bos_token_id=f.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
    )
    if n_heads % cfg.n_kv_heads != 0:
        raise GgufError(f"{f.path}: head_count_kv {cfg.n_kv_heads} does not divide head_count "
                        f"{n_heads}")
    return cfg


def load(path: str, dtype=torch.float64) -> MoDLlama:
    """The dense reference model of GGUF Llama file `path`, every tensor dequantized, in `dtype`."""
    f = GgufFile(path)
    cfg = load_config(f)
    model = MoDLlama(cfg)
    expected = model.state_dict()
    state = {}
    for name in f.tensors:
        ref = reference_name(name)
        if ref is None or ref not in expected:
            raise GgufError(f"{path}: unexpected tensor '{name}'")
        w = f.dequantize(name)
        if name.endswith("attn_q.weight"):
            w = unpermute_qk(w, cfg.n_heads)
        elif name.endswith("attn_k.weight"):
            w = unpermute_qk(w, cfg.n_kv_heads)
        if tuple(w.shape) != tuple(expected[ref].shape):
            raise GgufError(f"{path}: tensor '{name}' has shape {list(w.shape)}, expected "
                            f"{list(expected[ref].shape)}")
        state[ref] = torch.from_numpy(np.array(w, dtype=np.float32, order="C")).to(dtype)
    for ref in expected:
        if ref not in state:
            raise GgufError(f"{path}: missing tensor for '{ref}'")
    model = model.to(dtype)
    model.load_state_dict(state)
    return model.eval()
