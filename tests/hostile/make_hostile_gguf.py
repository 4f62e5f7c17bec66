"""Writes hostile GGUF files: truncated, corrupted and malicious variants of a small valid MoD
model, one file per case, each with the stderr fragments a correct loader must print. The valid
base is tests/testdata/checkpoints/router_identity_update written as GGUF by the `gguf` package
(an independent writer: llama.cpp's names, Q/K rows permuted as llama.cpp's converter does, the
modserve.mod.* keys of DESIGN.md section 3.1). It only writes files; running the engine on them
is tests/python/test_hostile_checkpoints.py's job.

    python tests/hostile/make_hostile_gguf.py OUT_DIR   # writes OUT_DIR/<case>.gguf, lists them
"""
import math
import os
import struct
import sys
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import numpy as np

import gguf
from safetensors.numpy import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(ROOT, "tests", "testdata", "checkpoints", "router_identity_update")
# The source's config (tests/testdata/checkpoints/router_identity_update/config.json).
D, FF, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 48, 96, 4, 4, 2, 12, 160
ROUTED = [1, 3]
ROUTER = "blk.1.mod_router.weight"

_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "router.weight": "mod_router.weight",
}


def gguf_name(hf):
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
           "output_norm.weight", "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{_LAYER_NAMES[rest]}"


def permute_qk(w, n_head):
    """llama.cpp's converter's row order for its interleaved RoPE (LlamaModel.permute)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


@dataclass
class Spec:
    """What the base writer emits; cases edit a copy."""
    arch: str = "llama"
    meta: dict = field(default_factory=dict)      # key -> (writer method name, value)
    tensors: dict = field(default_factory=dict)   # gguf name -> np.ndarray (f32, numpy shape)


def base_spec():
    s = Spec()
    m = s.meta
    for key, v in [("llama.embedding_length", D), ("llama.feed_forward_length", FF),
                   ("llama.block_count", LAYERS), ("llama.attention.head_count", HEADS),
                   ("llama.attention.head_count_kv", KV_HEADS),
                   ("llama.attention.key_length", HEAD_DIM), ("llama.context_length", 512),
                   ("llama.vocab_size", VOCAB), ("tokenizer.ggml.bos_token_id", 1),
                   ("tokenizer.ggml.eos_token_id", 2)]:
        m[key] = ("add_uint32", v)
    m["llama.rope.freq_base"] = ("add_float32", 10000.0)
    m["llama.attention.layer_norm_rms_epsilon"] = ("add_float32", 1e-5)
    m["modserve.mod.format_version"] = ("add_uint32", 1)
    m["modserve.mod.routed_layers"] = ("add_array", ROUTED)
    m["modserve.mod.capacity"] = ("add_float64", 0.125)
    m["modserve.mod.router.bias"] = ("add_bool", False)
    m["modserve.mod.router.input"] = ("add_string", "residual")
    m["modserve.mod.weight_fn"] = ("add_string", "identity")
    m["modserve.mod.scale_target"] = ("add_string", "update")
    m["modserve.mod.inference_routing"] = ("add_string", "router_threshold")
    m["modserve.mod.threshold"] = ("add_float64", 0.5)
    src = load_file(os.path.join(SOURCE, "model.safetensors"))
    order = sorted(src, key=lambda n: (n.startswith("model.layers."), n))
    for hf in order:
        a = src[hf].astype(np.float32)
        if hf.endswith("q_proj.weight"):
            a = permute_qk(a, HEADS)
        elif hf.endswith("k_proj.weight"):
            a = permute_qk(a, KV_HEADS)
        s.tensors[gguf_name(hf)] = np.ascontiguousarray(a)
    return s


def write_spec(s, path):
    w = gguf.GGUFWriter(path, s.arch)
    for key, (method, value) in s.meta.items():
        getattr(w, method)(key, value)
    for name, a in s.tensors.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---- byte-level layout of a written file, for patches the writer cannot make ----

_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


class Layout:
    """Offsets of the fields of a well-formed GGUF file (v3, little-endian)."""

    def __init__(self, raw):
        self.raw = raw
        self.n_tensors, self.n_kv = struct.unpack_from("<QQ", raw, 8)
        pos = 24
        self.kv = {}  # key -> (entry start, value type offset, end)
        for _ in range(self.n_kv):
            start = pos
            (n,) = struct.unpack_from("<Q", raw, pos)
            key = raw[pos + 8:pos + 8 + n].decode()
            pos += 8 + n
            type_pos = pos
            (t,) = struct.unpack_from("<I", raw, pos)
            pos = self._skip(t, pos + 4)
            self.kv[key] = (start, type_pos, pos)
        self.tensors = {}  # name -> (info start, ndim offset, type offset, offset offset)
        for _ in range(self.n_tensors):
            start = pos
            (n,) = struct.unpack_from("<Q", raw, pos)
            name = raw[pos + 8:pos + 8 + n].decode()
            pos += 8 + n
            ndim_pos = pos
            (ndim,) = struct.unpack_from("<I", raw, pos)
            pos += 4 + 8 * ndim
            self.tensors[name] = (start, ndim_pos, pos, pos + 4)
            pos += 4 + 8
        self.infos_end = pos
        self.data_start = (pos + 31) // 32 * 32

    def _skip(self, t, pos):
        if t == 8:
            (n,) = struct.unpack_from("<Q", self.raw, pos)
            return pos + 8 + n
        if t == 9:
            et, count = struct.unpack_from("<IQ", self.raw, pos)
            pos += 12
            for _ in range(count):
                pos = self._skip(et, pos)
            return pos
        return pos + _SCALAR[t]

    def tensor_offset(self, name):
        return struct.unpack_from("<Q", self.raw, self.tensors[name][3])[0]


def base_bytes():
    if not hasattr(base_bytes, "cache"):
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "base.gguf")
            write_spec(base_spec(), p)
            base_bytes.cache = open(p, "rb").read()
    return base_bytes.cache


def patch(fn):
    """A case that edits the base file's bytes: fn(bytearray, Layout) -> bytes."""
    def make(path):
        raw = base_bytes()
        out = fn(bytearray(raw), Layout(raw))
        with open(path, "wb") as f:
            f.write(bytes(out))
    return make


def spec(fn):
    """A case that edits the writer's input: fn(Spec) -> None."""
    def make(path):
        s = base_spec()
        fn(s)
        write_spec(s, path)
    return make


def put(fmt, offset, *values):
    def fn(raw, lay):
        struct.pack_into(fmt, raw, offset(lay) if callable(offset) else offset, *values)
        return raw
    return fn


def truncate(fraction):
    return patch(lambda raw, lay: raw[:int(len(raw) * fraction)])


def set_meta(key, method, value):
    return spec(lambda s: s.meta.__setitem__(key, (method, value)))


def drop_meta(key):
    return spec(lambda s: s.meta.pop(key))


def tensor_type(name, ggml_type):
    return patch(lambda raw, lay: put("<I", lay.tensors[name][2], ggml_type)(raw, lay))


def tensor_field(name, which, fmt, value):
    """Overwrites field `which` (1: ndim, 3: offset) of tensor `name`'s info."""
    return patch(lambda raw, lay: put(fmt, lay.tensors[name][which], value)(raw, lay))


def overlap(raw, lay):
    # attn_v gets attn_k's offset: same shape and type, so only the overlap check can catch it.
    k = lay.tensor_offset("blk.0.attn_k.weight")
    struct.pack_into("<Q", raw, lay.tensors["blk.0.attn_v.weight"][3], k)
    return raw


def rename_key(old, new):
    assert len(old) == len(new)

    def fn(raw, lay):
        start = lay.kv[old][0]
        raw[start + 8:start + 8 + len(old)] = new.encode()
        return raw
    return patch(fn)


def duplicate_key(raw, lay):
    # Two keys of the same length: the later one is renamed to the earlier one.
    by_len = {}
    for key in lay.kv:
        by_len.setdefault(len(key), []).append(key)
    first, second = next(keys for keys in by_len.values() if len(keys) >= 2)[:2]
    start = lay.kv[second][0]
    raw[start + 8:start + 8 + len(second)] = first.encode()
    return raw


def dims_overflow(raw, lay):
    # token_embd's two dims (48, 160) become (2^40, 2^40).
    ndim_pos = lay.tensors["token_embd.weight"][1]
    struct.pack_into("<QQ", raw, ndim_pos + 4, 1 << 40, 1 << 40)
    return raw


def nan_router(s):
    s.tensors[ROUTER] = s.tensors[ROUTER].copy()
    s.tensors[ROUTER][0, 5] = math.nan


def huge_string(raw, lay):
    # general.architecture's string length field says 2^62.
    _, type_pos, _ = lay.kv["general.architecture"]
    struct.pack_into("<Q", raw, type_pos + 4, 1 << 62)
    return raw


def huge_array(raw, lay):
    _, type_pos, _ = lay.kv["modserve.mod.routed_layers"]
    struct.pack_into("<Q", raw, type_pos + 8, 1 << 61)  # after the element type
    return raw


def bad_value_type(raw, lay):
    _, type_pos, _ = lay.kv["llama.block_count"]
    struct.pack_into("<I", raw, type_pos, 99)
    return raw


def tokenizer(**keys):
    """A case whose metadata gains tokenizer.ggml.<key> = (writer method, value) entries."""
    def fn(s):
        for key, mv in keys.items():
            s.meta[f"tokenizer.ggml.{key}"] = mv
    return spec(fn)


# A byte-level vocabulary of the base's size: enough for the tokenizer to get past its tokens.
TOKENS = [chr(0x100 + i) if i >= 94 else chr(0x21 + i) for i in range(VOCAB)]


def make_special(kind):
    def make(path):
        if kind == "directory":
            os.mkdir(path)
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "empty":
            open(path, "wb").close()
    return make


@dataclass
class Case:
    name: str
    make: Callable[[str], None]  # writes the case to the given path (which does not exist)
    expect: List[str]            # stderr fragments; "{file}" is replaced by the case's path
    known_bug: Optional[str] = None
    unlimited: bool = True
    mem_limited: bool = True
    may_succeed: bool = False


F = "{file}"
CASES = [
    Case("gguf_empty", make_special("empty"), [F, "too short for the 24-byte GGUF header"]),
    Case("gguf_truncated_in_header", patch(lambda raw, lay: raw[:20]),
         [F, "too short for the 24-byte GGUF header"]),
    # Inside the metadata: the counts no longer fit what is left.
    Case("gguf_truncated_in_metadata",
         patch(lambda raw, lay: raw[:lay.kv["modserve.mod.inference_routing"][1] + 10]),
         [F, "tensor count 41 cannot fit"]),
    Case("gguf_truncated_in_tensor_infos",
         patch(lambda raw, lay: raw[:lay.tensors["blk.2.attn_q.weight"][1] + 2]), [F]),
    Case("gguf_truncated_in_data", truncate(0.6), [F, "runs past the end of the data section",
                                                   "truncated"]),
    Case("gguf_bad_magic", patch(lambda raw, lay: b"GGML" + raw[4:]), [F, "not a GGUF file"]),
    Case("gguf_version_1", patch(put("<I", 4, 1)), [F, "GGUF version 1 is not supported"]),
    Case("gguf_big_endian", patch(put(">I", 4, 3)), [F, "big-endian"]),
    Case("gguf_tensor_count_2p60", patch(put("<Q", 8, 1 << 60)),
         [F, "tensor count 1152921504606846976 cannot fit"]),
    Case("gguf_kv_count_2p60", patch(put("<Q", 16, 1 << 60)),
         [F, "metadata count 1152921504606846976 cannot fit"]),
    Case("gguf_tensor_count_plus_one", patch(lambda raw, lay: put(
        "<Q", 8, lay.n_tensors + 1)(raw, lay)), [F]),
    Case("gguf_kv_count_minus_one", patch(lambda raw, lay: put(
        "<Q", 16, lay.n_kv - 1)(raw, lay)), [F]),
    Case("gguf_string_length_2p62", patch(huge_string),
         [F, "'general.architecture' has length 4611686018427387904"]),
    Case("gguf_array_length_2p61", patch(huge_array),
         [F, "'modserve.mod.routed_layers' has 2305843009213693952 elements"]),
    Case("gguf_unknown_value_type", patch(bad_value_type),
         [F, "'llama.block_count': the value type is 99"]),
    Case("gguf_duplicate_key", patch(duplicate_key), [F, "appears twice"]),
    Case("gguf_offset_past_end", tensor_field("output_norm.weight", 3, "<Q", 1 << 40),
         [F, "tensor 'output_norm.weight' [1099511627776", "runs past the end of the data "
          "section"]),
    Case("gguf_offset_misaligned", tensor_field("output_norm.weight", 3, "<Q", 36),
         [F, "tensor 'output_norm.weight' has data offset 36, not a multiple of the "
          "alignment 32"]),
    Case("gguf_overlapping_tensors", patch(overlap),
         [F, "'blk.0.attn_k.weight'", "'blk.0.attn_v.weight'", "overlap"]),
    Case("gguf_five_dims", tensor_field("output_norm.weight", 1, "<I", 5),
         [F, "tensor 'output_norm.weight' has 5 dimensions"]),
    Case("gguf_dims_overflow", patch(dims_overflow),
         [F, "tensor 'token_embd.weight' has more elements than fit in 64 bits"]),
    Case("gguf_unknown_ggml_type", tensor_type("blk.2.ffn_up.weight", 1000),
         [F, "tensor 'blk.2.ffn_up.weight' has unknown ggml type id 1000"]),
    # IQ4_NL (32-element blocks of 18 bytes) takes fewer bytes than F32: still inside the file.
    Case("gguf_unsupported_quant_type", tensor_type("blk.2.ffn_down.weight", 20),
         [F, "tensor 'blk.2.ffn_down.weight' has type IQ4_NL, which modserve does not run"]),
    Case("gguf_row_not_a_block_multiple", tensor_type("blk.2.ffn_up.weight", 8),
         [F, "tensor 'blk.2.ffn_up.weight' of type Q8_0 has rows of 48 elements, not a "
          "multiple of its block of 32"]),
    Case("gguf_alignment_not_power_of_two", set_meta("general.alignment", "add_uint32", 24),
         [F, "'general.alignment' = 24 is not a power of two"]),
    Case("gguf_unknown_architecture", spec(lambda s: setattr(s, "arch", "qwen2")),
         [F, "architecture \"qwen2\"", "not supported"]),
    Case("gguf_no_architecture", rename_key("general.architecture", "general.architecturX"),
         [F, "metadata key 'general.architecture' is missing"]),
    Case("gguf_missing_block_count", drop_meta("llama.block_count"),
         [F, "missing required metadata key 'llama.block_count'"]),
    Case("gguf_block_count_is_a_string", set_meta("llama.block_count", "add_string", "four"),
         [F, "'llama.block_count' has type STRING, expected an integer"]),
    Case("gguf_2p31_layers", set_meta("llama.block_count", "add_uint32", 2**31 - 1),
         [F, "2147483647 layers"]),
    Case("gguf_rope_scaling", set_meta("llama.rope.scaling.type", "add_string", "yarn"),
         [F, "RoPE scaling is not supported"]),
    Case("gguf_unknown_mod_key", set_meta("modserve.mod.experts", "add_uint32", 8),
         [F, "unknown metadata key 'modserve.mod.experts'"]),
    Case("gguf_unknown_mod_value", set_meta("modserve.mod.weight_fn", "add_string", "tanh"),
         [F, "'modserve.mod.weight_fn' has unknown value \"tanh\""]),
    Case("gguf_mod_format_version_2", set_meta("modserve.mod.format_version", "add_uint32", 2),
         [F, "'modserve.mod.format_version' must be 1"]),
    Case("gguf_routed_layer_out_of_range", set_meta("modserve.mod.routed_layers", "add_array",
                                                    [1, 4]),
         [F, "'modserve.mod.routed_layers' has layer 4, outside [0, 4)"]),
    Case("gguf_missing_tensor", spec(lambda s: s.tensors.pop("blk.2.ffn_up.weight")),
         [F, "missing tensor 'blk.2.ffn_up.weight'"]),
    Case("gguf_missing_router", spec(lambda s: s.tensors.pop("blk.3.mod_router.weight")),
         [F, "missing tensor 'blk.3.mod_router.weight'"]),
    Case("gguf_wrong_shape", spec(lambda s: s.tensors.__setitem__(
        "blk.0.ffn_up.weight", np.zeros((FF, D + 16), np.float32))),
         [F, "tensor 'blk.0.ffn_up.weight' has shape [96, 64], expected [96, 48]"]),
    Case("gguf_unexpected_tensor", spec(lambda s: s.tensors.__setitem__(
        "rope_freqs.weight", np.ones(HEAD_DIM // 2, np.float32))),
         [F, "unexpected tensor 'rope_freqs.weight'"]),
    Case("gguf_nan_router", spec(nan_router),
         [F, f"tensor '{ROUTER}' has a non-finite value (nan) at element 5"]),
    # Tokenizer metadata: absent altogether is a model without a tokenizer (it serves ids); a
    # tokenizer that is there but incomplete or unknown is an error naming the key.
    Case("gguf_tokenizer_without_tokens", tokenizer(model=("add_string", "gpt2")),
         [F, "'tokenizer.ggml.tokens'"]),
    Case("gguf_tokenizer_without_merges", tokenizer(model=("add_string", "gpt2"),
                                                    tokens=("add_array", TOKENS)),
         [F, "'tokenizer.ggml.merges'"]),
    Case("gguf_tokenizer_unknown_model", tokenizer(model=("add_string", "bert"),
                                                   tokens=("add_array", TOKENS)),
         [F, "'tokenizer.ggml.model'", "bert"]),
    Case("gguf_tokenizer_unknown_pre", tokenizer(model=("add_string", "gpt2"),
                                                 pre=("add_string", "no-such-pre"),
                                                 tokens=("add_array", TOKENS),
                                                 merges=("add_array", ["\u0121 t"])),
         [F, "'tokenizer.ggml.pre'", "no-such-pre"]),
    Case("gguf_tokenizer_tokens_not_strings", tokenizer(model=("add_string", "gpt2"),
                                                        tokens=("add_array", list(range(VOCAB)))),
         [F, "'tokenizer.ggml.tokens'"]),
    Case("gguf_is_a_directory", make_special("directory"), [F, "not a regular file"]),
    Case("gguf_is_a_fifo", make_special("fifo"), [F, "not a regular file"]),
    Case("gguf_missing_file", lambda path: None, [F, "no such file"]),
]


def write_case(case, out_dir):
    """Writes the case to out_dir/<name>.gguf (replacing what was there); returns the path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, case.name + ".gguf")
    if os.path.isdir(path) and not os.path.islink(path):
        os.rmdir(path)
    elif os.path.lexists(path):
        os.remove(path)
    case.make(path)
    return path


def write_base(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "base.gguf")
    with open(path, "wb") as f:
        f.write(base_bytes())
    return path


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(write_base(sys.argv[1]))
    for case in CASES:
        print(write_case(case, sys.argv[1]))


if __name__ == "__main__":
    main()
