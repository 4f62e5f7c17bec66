#!/usr/bin/env python3
"""Converts a modserve DENSE Llama checkpoint (config.json + *.safetensors) into a GGUF "llama"
model that llama.cpp runs, for benchmarking modserve against llama.cpp on the same weights.
It does not convert MoD checkpoints (llama.cpp has no routing) and writes no real tokenizer:
the vocabulary is placeholder SentencePiece pieces, the benchmarks feed token ids.

  /tmp/gguf-venv/bin/python to_gguf.py CKPT_DIR OUT.gguf [--outtype bf16|f16|q8_0]

Needs: numpy and the `gguf` package (pip, any 0.10+); safetensors files are parsed here, not
with the safetensors package, so BF16 needs no torch.
"""
import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

import gguf

# safetensors dtype -> (numpy storage dtype, is bf16 stored as uint16)
_ST_DTYPES = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}


class Tensor:
    """One tensor of a safetensors shard, mapped read-only; .f32() widens it."""

    def __init__(self, path, dtype, shape, begin, end):
        self.path, self.dtype, self.shape = path, dtype, list(shape)
        self.begin, self.end = begin, end

    def raw(self):
        if self.dtype not in _ST_DTYPES:
            raise SystemExit(f"to_gguf: {self.path}: dtype {self.dtype} unsupported "
                             f"(BF16, F16, F32 are)")
        n = int(np.prod(self.shape)) if self.shape else 1
        a = np.memmap(self.path, dtype=_ST_DTYPES[self.dtype], mode="r", offset=self.begin,
                      shape=(n,))
        assert a.nbytes == self.end - self.begin, self.path
        return a.reshape(self.shape)

    def f32(self):
        a = self.raw()
        if self.dtype == "BF16":
            return (a.astype(np.uint32) << 16).view(np.float32)
        return a.astype(np.float32)


def load_tensors(ckpt: Path):
    shards = sorted(ckpt.glob("*.safetensors"))
    if not shards:
        raise SystemExit(f"to_gguf: no *.safetensors in {ckpt}")
    out = {}
    for p in shards:
        with open(p, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        base = 8 + n
        for name, v in header.items():
            if name == "__metadata__":
                continue
            if name in out:
                raise SystemExit(f"to_gguf: tensor {name} appears in two shards")
            b, e = v["data_offsets"]
            out[name] = Tensor(p, v["dtype"], v["shape"], base + b, base + e)
    return out


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate-half rows -> llama.cpp's interleaved-pair RoPE rows (as convert_hf_to_gguf.py's
    LlamaModel.permute): per head, row i of the first half and row i of the second half become
    rows 2i and 2i+1. n_head is the number of heads the matrix holds (kv heads for k_proj)."""
    rows = w.shape[0]
    return (w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def placeholder_vocab(vocab_size: int, bos: int, eos: int):
    """A Llama-style SPM vocabulary: <unk>, <s>, </s>, the 256 byte pieces (llama.cpp looks up
    <0x0A> for its newline token) and '▁tokN' placeholders, all distinct."""
    tokens = [None] * vocab_size
    types = [gguf.TokenType.NORMAL] * vocab_size
    special = {bos: "<s>", eos: "</s>"}
    unk = next(i for i in range(vocab_size) if i not in special)
    special[unk] = "<unk>"
    for i, s in special.items():
        tokens[i] = s
        types[i] = gguf.TokenType.UNKNOWN if i == unk else gguf.TokenType.CONTROL
    free = (i for i in range(vocab_size) if tokens[i] is None)
    if vocab_size >= 3 + 256:
        for b in range(256):
            i = next(free)
            tokens[i] = f"<0x{b:02X}>"
            types[i] = gguf.TokenType.BYTE
    for i in range(vocab_size):
        if tokens[i] is None:
            tokens[i] = f"\u2581tok{i}"
    scores = [0.0 if types[i] != gguf.TokenType.NORMAL else -float(i) for i in range(vocab_size)]
    return tokens, scores, types, unk


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--outtype", choices=["bf16", "f16", "q8_0"], default="bf16")
    args = ap.parse_args()

    cfg = json.loads((args.ckpt / "config.json").read_text())
    if "mod" in cfg:
        raise SystemExit(f"to_gguf: {args.ckpt} is a MoD checkpoint (config.json has a 'mod' "
                         "block); llama.cpp has no per-token routing, so converting it would "
                         "silently run a different (dense) model. Convert the dense variant.")
    if cfg.get("model_type", "llama") != "llama":
        raise SystemExit(f"to_gguf: model_type {cfg.get('model_type')!r} is not 'llama'")
    for k in ("rope_scaling", "attention_bias", "mlp_bias"):
        if cfg.get(k):
            raise SystemExit(f"to_gguf: config.json key {k!r}={cfg[k]!r} is not supported")

    d = cfg["hidden_size"]
    n_layer = cfg["num_hidden_layers"]
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    head_dim = cfg.get("head_dim") or d // n_head
    vocab = cfg["vocab_size"]
    tied = bool(cfg.get("tie_word_embeddings", False))

    src = load_tensors(args.ckpt)
    # (gguf name, hf name, permute heads or 0)
    plan = [("token_embd.weight", "model.embed_tokens.weight", 0)]
    for i in range(n_layer):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        plan += [
            (g + "attn_norm.weight", p + "input_layernorm.weight", 0),
            (g + "attn_q.weight", p + "self_attn.q_proj.weight", n_head),
            (g + "attn_k.weight", p + "self_attn.k_proj.weight", n_kv),
            (g + "attn_v.weight", p + "self_attn.v_proj.weight", 0),
            (g + "attn_output.weight", p + "self_attn.o_proj.weight", 0),
            (g + "ffn_norm.weight", p + "post_attention_layernorm.weight", 0),
            (g + "ffn_gate.weight", p + "mlp.gate_proj.weight", 0),
            (g + "ffn_up.weight", p + "mlp.up_proj.weight", 0),
            (g + "ffn_down.weight", p + "mlp.down_proj.weight", 0),
        ]
    plan.append(("output_norm.weight", "model.norm.weight", 0))
    if "lm_head.weight" in src:
        plan.append(("output.weight", "lm_head.weight", 0))
    elif not tied:
        raise SystemExit("to_gguf: no lm_head.weight and tie_word_embeddings is false")
    used = {h for _, h, _ in plan}
    missing = [h for h in used if h not in src]
    if missing:
        raise SystemExit(f"to_gguf: checkpoint lacks {sorted(missing)[:5]}")
    extra = sorted(set(src) - used)
    if extra:
        raise SystemExit(f"to_gguf: unexpected tensors (not a plain Llama?): {extra[:5]}")
    expect = {"model.layers.0.self_attn.q_proj.weight": [n_head * head_dim, d],
              "model.layers.0.self_attn.k_proj.weight": [n_kv * head_dim, d],
              "model.embed_tokens.weight": [vocab, d]}
    for h, shape in expect.items():
        if src[h].shape != shape:
            raise SystemExit(f"to_gguf: {h} has shape {src[h].shape}, config implies {shape}")

    QT = gguf.GGMLQuantizationType
    wtype = {"bf16": QT.BF16, "f16": QT.F16, "q8_0": QT.Q8_0}[args.outtype]
    ftype = {"bf16": gguf.LlamaFileType.MOSTLY_BF16, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[args.outtype]

    def out_type(name, shape):
        if len(shape) == 1:
            return QT.F32  # norms stay F32, as convert_hf_to_gguf.py does
        if wtype == QT.Q8_0 and name == "token_embd.weight":
            return QT.Q8_0
        return wtype

    def convert(name, t, heads):
        qt = out_type(name, t.shape)
        if qt == QT.BF16 and t.dtype == "BF16":
            a = t.raw()  # bit-exact, no float round trip
        else:
            a = t.f32()
        if heads:
            a = permute_qk(a, heads)
        if qt == QT.F32:
            return np.ascontiguousarray(a, dtype=np.float32)
        if qt == QT.BF16:
            if a.dtype == np.uint16:
                return np.ascontiguousarray(a)
            return gguf.quants.quantize(a, QT.BF16)
        if qt == QT.F16:
            return a.astype(np.float16)
        return gguf.quants.quantize(np.ascontiguousarray(a, dtype=np.float32), qt)

    w = gguf.GGUFWriter(str(args.out), "llama")
    w.add_name(args.ckpt.name)
    w.add_context_length(cfg.get("max_position_embeddings", 2048))
    w.add_embedding_length(d)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    w.add_vocab_size(vocab)
    w.add_file_type(ftype)
    if wtype == QT.Q8_0:
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    bos, eos = int(cfg.get("bos_token_id", 1)), int(cfg.get("eos_token_id", 2))
    tokens, scores, types, unk = placeholder_vocab(vocab, bos, eos)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_unk_token_id(unk)
    w.add_add_bos_token(False)  # callers give exact ids, bos included when they want it
    w.add_add_eos_token(False)

    # Tensor infos first, then the data one tensor at a time, so a 2 GB model is never held in
    # memory (GGUFWriter.add_tensor would keep every converted array until the end).
    for name, h, _ in plan:
        t = src[h]
        qt = out_type(name, t.shape)
        if qt in (QT.F32, QT.BF16, QT.F16):
            itemsize = {QT.F32: 4, QT.BF16: 2, QT.F16: 2}[qt]
            nbytes = int(np.prod(t.shape)) * itemsize
            w.add_tensor_info(name, t.shape, np.dtype(np.float32 if qt == QT.F32 else np.float16),
                              nbytes, raw_dtype=qt)
        else:
            if t.shape[-1] % 32:
                raise SystemExit(f"to_gguf: {h} row length {t.shape[-1]} not a multiple of 32")
            bshape = gguf.quants.quant_shape_to_byte_shape(t.shape, qt)
            w.add_tensor_info(name, bshape, np.dtype(np.uint8), int(np.prod(bshape)),
                              raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for k, (name, h, heads) in enumerate(plan):
        w.write_tensor_data(convert(name, src[h], heads))
        if k % 20 == 0:
            print(f"to_gguf: [{k + 1}/{len(plan)}] {name}", file=sys.stderr)
    w.close()
    print(f"to_gguf: wrote {args.out} ({args.outtype}, {len(plan)} tensors, "
          f"{args.out.stat().st_size / 1e9:.2f} GB)", file=sys.stderr)


if __name__ == "__main__":
    main()
