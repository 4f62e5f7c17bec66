"""Writes hostile model directories: truncated, corrupted and malicious variants of a small valid
checkpoint (tests/testdata/checkpoints/router_identity_update), one directory per case, each with
the stderr fragments a correct loader must print. It only writes files; running the engine on
them is tests/python/test_hostile_checkpoints.py's job.

    python tests/hostile/make_hostile.py OUT_DIR     # writes OUT_DIR/<case>/ and lists the cases
"""
import json
import math
import os
import shutil
import struct
import sys
from dataclasses import dataclass
from typing import Callable, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE = os.path.join(ROOT, "tests", "testdata", "checkpoints", "router_identity_update")
SHARDED_BASE = os.path.join(ROOT, "tests", "testdata", "checkpoints",
                            "predictor_mlp_gelu_sharded_mha")
ST = "model.safetensors"
ROUTER = "model.layers.1.router.weight"


@dataclass
class Case:
    name: str
    make: Callable[[str], None]  # writes the case into an existing copy of its base directory
    # Fragments stderr must contain; "{dir}" is replaced by the case directory.
    expect: List[str]
    base: str = BASE
    # Set while the engine is known to fail this case; the test is then a strict xfail, so it
    # turns red the day the engine is fixed and the marker must go.
    known_bug: Optional[str] = None
    unlimited: bool = True    # run without a memory limit
    mem_limited: bool = True  # run under the address-space limit
    # The input is legal but extreme: a clean exit 0 is as good as a clean exit 1.
    may_succeed: bool = False


# ---- safetensors editing ----

def read_st(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_st(path, header, data, header_len=None):
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    n = len(text) if header_len is None else header_len
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n) + text + data)


def edit_header(fn):
    def make(d):
        p = os.path.join(d, ST)
        header, data = read_st(p)
        fn(header)
        write_st(p, header, data)
    return make


def edit_config(fn):
    def make(d):
        p = os.path.join(d, "config.json")
        cfg = json.load(open(p))
        fn(cfg)
        with open(p, "w") as f:
            json.dump(cfg, f, indent=2)
    return make


# ---- the cases ----

def truncate(fraction):
    def make(d):
        p = os.path.join(d, ST)
        raw = open(p, "rb").read()
        with open(p, "wb") as f:
            f.write(raw[:int(len(raw) * fraction)])
    return make


def header_len_2p60(d):
    p = os.path.join(d, ST)
    header, data = read_st(p)
    write_st(p, header, data, header_len=1 << 60)


def corrupt_header_json(d):
    p = os.path.join(d, ST)
    raw = bytearray(open(p, "rb").read())
    for i in range(40, 48):  # inside the JSON text, well before the data
        raw[i] = 0xFF
    open(p, "wb").write(bytes(raw))


def offsets_past_end(h):
    e = h["model.norm.weight"]
    n = e["data_offsets"][1] - e["data_offsets"][0]
    e["data_offsets"] = [1 << 40, (1 << 40) + n]


def overlap(h):
    # v_proj gets k_proj's bytes: same shape, so only the overlap check can catch it.
    h["model.layers.0.self_attn.v_proj.weight"]["data_offsets"] = list(
        h["model.layers.0.self_attn.k_proj.weight"]["data_offsets"])


def nan_router(d):
    p = os.path.join(d, ST)
    header, data = read_st(p)
    b, e = header[ROUTER]["data_offsets"]
    data = data[:b] + struct.pack("<f", math.nan) * ((e - b) // 4) + data[e:]
    write_st(p, header, data)


def nan_router_in_shard(d):
    p = os.path.join(d, "model-00004-of-00004.safetensors")
    header, data = read_st(p)
    b, e = header["model.layers.3.router.weight"]["data_offsets"]
    data = data[:b] + struct.pack("<f", math.nan) * ((e - b) // 4) + data[e:]
    write_st(p, header, data)


def nan_norm(d):
    # One value of a norm's weights, in the tensor's own dtype.
    p = os.path.join(d, ST)
    header, data = read_st(p)
    t = header["model.layers.2.post_attention_layernorm.weight"]
    nan = {"F32": struct.pack("<f", math.nan), "F16": b"\x00\x7e", "BF16": b"\xc0\x7f"}[t["dtype"]]
    b = t["data_offsets"][0] + 5 * len(nan)
    write_st(p, header, data[:b] + nan + data[b + len(nan):])


def inf_router(d):
    p = os.path.join(d, ST)
    header, data = read_st(p)
    b, e = header[ROUTER]["data_offsets"]
    data = data[:b] + data[b:e - 4] + struct.pack("<f", math.inf) + data[e:]
    write_st(p, header, data)


def write_file(name, content):
    def make(d):
        with open(os.path.join(d, name), "wb") as f:
            f.write(content)
    return make


def replace_with_dir(name):
    def make(d):
        os.remove(os.path.join(d, name))
        os.mkdir(os.path.join(d, name))
    return make


def replace_with_fifo(name):
    def make(d):
        os.remove(os.path.join(d, name))
        os.mkfifo(os.path.join(d, name))
    return make


def remove(name):
    return lambda d: os.remove(os.path.join(d, name))


def edit_index(fn):
    def make(d):
        p = os.path.join(d, "model.safetensors.index.json")
        idx = json.load(open(p))
        fn(idx)
        with open(p, "w") as f:
            json.dump(idx, f)
    return make


def set_key(path, value):
    def fn(obj):
        *outer, last = path
        for k in outer:
            obj = obj[k]
        obj[last] = value
    return fn


SAFETENSORS = "{dir}/" + ST
CONFIG = "{dir}/config.json"

CASES = [
    Case("empty_file", write_file(ST, b""), [SAFETENSORS, "too short for the 8-byte header"]),
    Case("truncated_in_header", truncate(0.005), [SAFETENSORS, "header length",
                                                  "runs past the end of the file"]),
    Case("truncated_in_data", truncate(0.5), [SAFETENSORS, "run past the end of the data section"]),
    Case("header_len_2p60", header_len_2p60, [SAFETENSORS, "header length 1152921504606846976",
                                              "runs past the end of the file"]),
    Case("header_not_json", corrupt_header_json, [SAFETENSORS, "header is not valid JSON"]),
    Case("offsets_past_end", edit_header(offsets_past_end),
         [SAFETENSORS, "model.norm.weight", "run past the end of the data section"]),
    Case("overlapping_tensors", edit_header(overlap),
         [SAFETENSORS, "model.layers.0.self_attn.k_proj.weight",
          "model.layers.0.self_attn.v_proj.weight", "overlap"]),
    Case("bad_dtype", edit_header(set_key(["model.norm.weight", "dtype"], "I64")),
         [SAFETENSORS, "model.norm.weight", "unsupported dtype"]),
    Case("shape_bytes_mismatch", edit_header(set_key(["model.norm.weight", "shape"], [49])),
         [SAFETENSORS, "model.norm.weight", "needs"]),
    Case("shape_overflow", edit_header(set_key(["model.norm.weight", "shape"], [2**40, 2**40])),
         [SAFETENSORS, "model.norm.weight", "more elements than fit in 64 bits"]),
    Case("wrong_shape", edit_header(set_key(["model.layers.0.mlp.up_proj.weight", "shape"],
                                            [48, 96])),
         ["{dir}", "model.safetensors: ", "model.layers.0.mlp.up_proj.weight",
          "has shape [48, 96], expected [96, 48]"]),
    Case("missing_tensor", edit_header(lambda h: h.pop("model.layers.2.mlp.up_proj.weight")),
         ["{dir}", "missing tensor 'model.layers.2.mlp.up_proj.weight'"]),
    Case("nan_router", nan_router, ["{dir}", "model.safetensors: ", ROUTER,
                                    "non-finite value (nan)"]),
    Case("nan_router_in_shard", nan_router_in_shard,
         ["{dir}", "model-00004-of-00004.safetensors: ", "model.layers.3.router.weight",
          "non-finite value (nan)"], base=SHARDED_BASE),
    Case("inf_router", inf_router, ["{dir}", "model.safetensors: ", ROUTER,
                                    "non-finite value (inf)"]),
    Case("nan_norm", nan_norm, ["{dir}", "model.safetensors: ",
                                "model.layers.2.post_attention_layernorm.weight",
                                "non-finite value (nan) at element 5"]),
    Case("safetensors_is_a_directory", replace_with_dir(ST), [SAFETENSORS, "not a regular file"]),
    Case("safetensors_is_a_fifo", replace_with_fifo(ST), [SAFETENSORS, "not a regular file"]),
    Case("no_weights", remove(ST), ["{dir}", "neither model.safetensors nor"]),
    Case("config_unknown_mod_key", edit_config(set_key(["mod", "experts"], 8)),
         [CONFIG, "unknown key 'mod.experts'"]),
    Case("config_unknown_mod_value", edit_config(set_key(["mod", "weight_fn"], "tanh")),
         [CONFIG, "'mod.weight_fn'", "tanh"]),
    Case("config_format_version_2", edit_config(set_key(["mod", "format_version"], 2)),
         [CONFIG, "'mod.format_version' must be 1"]),
    Case("config_not_json", write_file("config.json", b'{"hidden_size": 48,'),
         [CONFIG]),
    Case("config_missing", remove("config.json"), [CONFIG, "no such file"]),
    Case("config_is_a_fifo", replace_with_fifo("config.json"), [CONFIG, "not a regular file"]),
    # Sizes a config may claim, with nothing in the checkpoint to back them.
    Case("config_2p31_layers", edit_config(set_key(["num_hidden_layers"], 2**31 - 1)),
         ["{dir}", "model.layers"]),
    # Legal (a model may claim 2^31 positions) and tiny on disk: it must not cost memory in
    # proportion to the claim. Only run under the limit; without it, it succeeds.
    Case("config_2p31_positions", edit_config(set_key(["max_position_embeddings"], 2**31 - 1)),
         [], unlimited=False, may_succeed=True),
    Case("tokenizer_garbage", write_file("tokenizer.json", b"\x00\xffnot json"),
         ["{dir}/tokenizer.json"]),
    Case("sharded_missing_shard", edit_index(set_key(["weight_map", "lm_head.weight"],
                                                     "model-00009-of-00009.safetensors")),
         ["model-00009-of-00009.safetensors"], base=SHARDED_BASE),
    Case("sharded_path_escape", edit_index(set_key(["weight_map", "lm_head.weight"],
                                                   "../../../etc/passwd")),
         ["{dir}/model.safetensors.index.json", "not a file name inside the model directory"],
         base=SHARDED_BASE),
]

# Engine bugs these cases expose (see docs/RELIABILITY.md). Each entry
# marks its case as a strict xfail until the engine is fixed.
KNOWN_BUGS = {
}
for c in CASES:
    c.known_bug = KNOWN_BUGS.get(c.name)


def write_case(case, out_dir):
    """Copies the case's base into out_dir/<name> and applies the case; returns that path."""
    d = os.path.join(out_dir, case.name)
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(case.base, d)
    case.make(d)
    return d


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    for case in CASES:
        print(write_case(case, sys.argv[1]))


if __name__ == "__main__":
    main()
