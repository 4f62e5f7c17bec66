"""Reads and writes safetensors files, single or sharded (model.safetensors.index.json).

A small independent implementation (the format is an 8-byte little-endian header length, a JSON
header of {name: {dtype, shape, data_offsets}}, then the raw bytes); the tests check it against
the `safetensors` package. Dtypes: F32, F16, BF16.
"""
from __future__ import annotations

import json
import os
import struct

import torch

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
NAMES = {v: k for k, v in DTYPES.items()}
HEADER_ALIGN = 8  # the data section starts on an 8-byte boundary


class CheckpointError(ValueError):
    """A safetensors file or index that is malformed."""


def write_file(path: str, tensors: dict, metadata: dict | None = None) -> None:
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    # The format allows no gaps between tensors. Wider elements first keeps every tensor aligned
    # to its element size, so a reader can use the mapped bytes in place.
    for name in sorted(tensors, key=lambda n: (-tensors[n].element_size(), n)):
        t = tensors[name].detach().contiguous().cpu()
        if t.dtype not in NAMES:
            raise CheckpointError(f"{name}: unsupported dtype {t.dtype}")
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * ((-len(hjson)) % HEADER_ALIGN)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


def read_file(path: str) -> dict:
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise CheckpointError(f"{path}: file is {len(data)} bytes, too short for a header")
    (hlen,) = struct.unpack("<Q", data[:8])
    if hlen > len(data) - 8:
        raise CheckpointError(f"{path}: header length {hlen} runs past the end of the file "
                              f"({len(data)} bytes)")
    try:
        header = json.loads(data[8:8 + hlen])
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: header is not valid JSON: {e}") from None
    body = memoryview(data)[8 + hlen:]
    out = {}
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = DTYPES.get(info.get("dtype"))
        if dt is None:
            raise CheckpointError(f"{path}: tensor '{name}' has unsupported dtype "
                                  f"{info.get('dtype')!r}")
        shape = info["shape"]
        begin, end = info["data_offsets"]
        n = 1
        for s in shape:
            n *= s
        if not 0 <= begin <= end <= len(body):
            raise CheckpointError(f"{path}: tensor '{name}' offsets [{begin}, {end}) lie outside "
                                  f"the data ({len(body)} bytes)")
        if end - begin != n * torch.tensor([], dtype=dt).element_size():
            raise CheckpointError(f"{path}: tensor '{name}' has {end - begin} bytes for shape "
                                  f"{shape}")
        spans.append((begin, end, name))
        buf = bytearray(body[begin:end])
        t = torch.frombuffer(buf, dtype=dt) if n else torch.empty(0, dtype=dt)
        out[name] = t.reshape(shape).clone()
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise CheckpointError(f"{path}: tensors '{n0}' and '{n1}' overlap")
    return out


def save_sharded(model_dir: str, tensors: dict, max_shard_bytes: int) -> None:
    """Writes model-0000i-of-0000n.safetensors shards and model.safetensors.index.json."""
    shards, cur, cur_bytes = [], {}, 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if cur and cur_bytes + nbytes > max_shard_bytes:
            shards.append(cur)
            cur, cur_bytes = {}, 0
        cur[name] = tensors[name]
        cur_bytes += nbytes
    if cur:
        shards.append(cur)
    weight_map = {}
    total = 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_file(os.path.join(model_dir, fname), shard, {"format": "pt"})
        for name, t in shard.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(model_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")


def load_dir(model_dir: str) -> dict:
    """All tensors of a checkpoint directory, single file or sharded."""
    single = os.path.join(model_dir, "model.safetensors")
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(single):
        return read_file(single)
    if not os.path.exists(index_path):
        raise CheckpointError(f"{model_dir}: neither model.safetensors nor "
                              f"model.safetensors.index.json exists")
    with open(index_path) as f:
        index = json.load(f)
    out = {}
    wanted = index.get("weight_map", {})
    for fname in sorted(set(wanted.values())):
        part = read_file(os.path.join(model_dir, fname))
        for name, t in part.items():
            if wanted.get(name) != fname:
                raise CheckpointError(f"{fname}: tensor '{name}' is not listed for this shard in "
                                      f"model.safetensors.index.json")
            out[name] = t
    missing = sorted(set(wanted) - set(out))
    if missing:
        raise CheckpointError(f"{index_path}: tensors listed but not found: {missing[:5]}")
    return out
