#!/usr/bin/env python3
"""Rewrites a GGUF file with every tensor dequantized to F32 (the `gguf` package's
dequantizers), metadata and tensor order unchanged, Q/K rows left in llama.cpp's order. Both
engines then run the same weight values without quantized arithmetic (llama.cpp quantizes
activations for its quantized matmuls), which isolates loading bugs (names, Q/K order, config
mapping) from rounding: greedy_ids and modserve-generate on the F32 file should agree token for
token with top-1/top-2 margins within ~1e-2.

  .venv/bin/python tests/bench/llamacpp/gguf_to_f32.py IN.gguf OUT.gguf [bf16]

With `bf16`, the matrices (tensors of two dimensions) are stored as BF16 instead (rounded to
nearest even from the dequantized values), the rest F32: a BF16 copy of a quantized model, for
the BF16 kernels (the AMX tile Gemm and --matmul_precision).
"""
import sys

import numpy as np

import gguf
from gguf import quants


def main():
    if len(sys.argv) not in (3, 4) or (len(sys.argv) == 4 and sys.argv[3] != "bf16"):
        sys.exit(__doc__)
    src, dst = sys.argv[1:3]
    bf16 = len(sys.argv) == 4
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        vtype = gguf.GGUFValueType(f.types[0])
        sub = gguf.GGUFValueType(f.types[1]) if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), vtype, sub_type=sub)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if bf16 else gguf.LlamaFileType.ALL_F32)
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        qtype = gguf.GGMLQuantizationType(int(t.tensor_type))
        a = np.asarray(quants.dequantize(t.data, qtype), dtype=np.float32).reshape(shape)
        if bf16 and a.ndim == 2:
            b = quants.quantize(a, gguf.GGMLQuantizationType.BF16)
            w.add_tensor(t.name, b, raw_shape=b.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor(t.name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
