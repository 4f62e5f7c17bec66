"""modref.gguf_io: GGUF Llama files into the reference model.

Files are written here with the `gguf` package's own writer the way llama.cpp's converter lays
them out (Q/K rows permuted into interleaved RoPE pairs, tied embeddings without output.weight),
so the reader is checked against a second implementation of the layout. The RoPE check applies
llama.cpp's interleaved rotation (ggml's "normal" mode: pairs 2i, 2i+1) to the permuted rows and
the reference's rotate-half to the un-permuted ones: the two must agree, which pins the
direction of the permutation, not just that it is invertible.
"""
import copy
import math
import os

import numpy as np
import pytest
import torch

import gguf
import variants
from modref import gguf_io
from modref.config import parse_config
from modref.model import MoDLlama, rope

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOLLM2 = os.path.join(ROOT, "models", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")

# Rows of 64 so that every quantized type's block (32 or 256 elements) fits.
CONFIG = dict(variants.BASE, hidden_size=64, intermediate_size=256, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=96, tie_word_embeddings=True)
CONFIG.pop("head_dim", None)


def random_dense(cfg_json: dict, seed: int = 0) -> MoDLlama:
    cfg = parse_config(cfg_json)
    gen = torch.Generator().manual_seed(seed)
    model = MoDLlama(cfg)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
    return model.eval()


def write_gguf(path: str, model: MoDLlama, qtype=gguf.GGMLQuantizationType.F32,
               arch: str = "llama", extra_tensor: bool = False) -> dict:
    """Writes `model` as llama.cpp lays a Llama out; returns the weights as the file holds them
    (dequantized, reference layout) by reference name."""
    cfg = model.cfg
    w = gguf.GGUFWriter(path, arch)
    w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(cfg.d_model)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.d_ff)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_vocab_size(cfg.vocab_size)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    state = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    held = {}
    names = {v: k for k, v in gguf_io._GLOBAL_TENSORS.items()}
    for l in range(cfg.n_layers):
        for g, r in gguf_io._LAYER_TENSORS.items():
            names[f"model.layers.{l}.{r}"] = f"blk.{l}.{g}"
    for ref, a in state.items():
        name = names[ref]
        if name.endswith("attn_q.weight"):
            a = gguf_io.permute_qk(a, cfg.n_heads)
        elif name.endswith("attn_k.weight"):
            a = gguf_io.permute_qk(a, cfg.n_kv_heads)
        a = np.ascontiguousarray(a)
        if a.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            q = gguf.quants.quantize(a, qtype)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)
            stored = gguf.quants.dequantize(q, qtype).reshape(a.shape)
        else:
            w.add_tensor(name, a)
            stored = a
        if name.endswith("attn_q.weight"):
            stored = gguf_io.unpermute_qk(stored, cfg.n_heads)
        elif name.endswith("attn_k.weight"):
            stored = gguf_io.unpermute_qk(stored, cfg.n_kv_heads)
        held[ref] = stored
    if extra_tensor:
        w.add_tensor("blk.0.attn_q.bias", np.zeros(cfg.d_model, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


def interleaved_rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """ggml's normal-mode RoPE: element pairs (2i, 2i+1) rotate by pos * theta^(-2i/d)."""
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = pos.to(torch.float64)[..., None] * inv  # [B, n, hd/2]
    cos, sin = ang.cos()[..., None, :], ang.sin()[..., None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


@pytest.mark.parametrize("n_head,rows,cols", [(1, 8, 3), (4, 32, 5), (3, 48, 2)])
def test_unpermute_inverts_permute(n_head, rows, cols):
    a = np.random.default_rng(0).standard_normal((rows, cols))
    assert np.array_equal(gguf_io.unpermute_qk(gguf_io.permute_qk(a, n_head), n_head), a)
    assert not np.array_equal(gguf_io.permute_qk(a, n_head), a)


def test_permuted_rows_with_interleaved_rope_equal_rotate_half():
    cfg = parse_config(CONFIG)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, 5, cfg.d_model, dtype=torch.float64, generator=gen)
    wq = torch.randn(cfg.n_heads * cfg.head_dim, cfg.d_model, dtype=torch.float64, generator=gen)
    pos = torch.arange(3, 8).expand(1, 5)
    shape = (1, 5, cfg.n_heads, cfg.head_dim)
    ref = rope((x @ wq.t()).view(shape), pos, cfg.rope_theta)
    permuted = torch.from_numpy(gguf_io.permute_qk(wq.numpy(), cfg.n_heads))
    llama_cpp = interleaved_rope((x @ permuted.t()).view(shape), pos, cfg.rope_theta)
    # Same values; the head dims differ only in order (llama.cpp's pairs are the halves' rows).
    back = torch.from_numpy(gguf_io.unpermute_qk(
        llama_cpp.reshape(-1, cfg.head_dim).t().contiguous().numpy(), 1)).t()
    assert torch.allclose(back.reshape(shape), ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("qtype", [gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16,
                                   gguf.GGMLQuantizationType.Q8_0,
                                   gguf.GGMLQuantizationType.Q4_0,
                                   gguf.GGMLQuantizationType.Q4_1])
def test_load_gives_the_file_weights_and_logits(tmp_path, qtype):
    model = random_dense(CONFIG)
    path = str(tmp_path / "m.gguf")
    held = write_gguf(path, model, qtype)
    loaded = gguf_io.load(path)
    assert loaded.cfg.d_model == 64 and loaded.cfg.n_kv_heads == 2
    assert loaded.cfg.tie_word_embeddings and loaded.cfg.eos_token_ids == (2,)
    for name, p in loaded.state_dict().items():
        assert p.dtype == torch.float64
        assert torch.equal(p, torch.from_numpy(held[name].astype(np.float64))), name
    if qtype == gguf.GGMLQuantizationType.F32:
        tokens = torch.tensor([[1, 5, 17, 33, 2, 90]])
        want, _ = model.double()(tokens)
        got, _ = loaded(tokens)
        assert torch.allclose(got, want, atol=1e-5, rtol=0)


def test_refuses_other_architectures_and_unknown_tensors(tmp_path):
    model = random_dense(CONFIG)
    path = str(tmp_path / "qwen.gguf")
    write_gguf(path, model, arch="qwen2")
    with pytest.raises(gguf_io.GgufError, match="general.architecture is 'qwen2'"):
        gguf_io.load(path)
    path = str(tmp_path / "bias.gguf")
    write_gguf(path, model, extra_tensor=True)
    with pytest.raises(gguf_io.GgufError, match="unexpected tensor 'blk.0.attn_q.bias'"):
        gguf_io.load(path)
    with pytest.raises(gguf_io.GgufError, match="not a readable GGUF file"):
        bad = tmp_path / "bad.gguf"
        bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 8)
        gguf_io.load(str(bad))


@pytest.mark.skipif(not os.path.exists(SMOLLM2), reason="run tools/fetch_models.sh first")
def test_smollm2_config_from_metadata():
    f = gguf_io.GgufFile(SMOLLM2)
    cfg = gguf_io.load_config(f)
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff,
            cfg.vocab_size, cfg.max_seq_len) == (30, 576, 9, 3, 64, 1536, 49152, 8192)
    assert cfg.rope_theta == 100000.0 and cfg.tie_word_embeddings
    assert math.isclose(cfg.rms_norm_eps, 1e-5, rel_tol=1e-6)
