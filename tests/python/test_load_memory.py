"""Loading a model whose Gemm weights the CPU backend copies into its own layouts (BF16 panels on
a CPU with AVX512_BF16 and no AMX; Q4_K and friends on AVX-512 VNNI) must not hold the file's
pages and the copies of the whole model at once: the engine drops each weight's file pages as
its copy is made. The peak resident size of `modserve-generate` on a ~90 MB BF16 checkpoint is
compared with the same run on the AVX2 kernels, which copy nothing (so the file's pages are the
weights there). On a CPU whose best kernels copy nothing either, the two runs are the same."""
import json
import os
import random
import struct
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("MODSERVE_BUILD_DIR", "build"))
GENERATE = os.path.join(BUILD, "bin", "modserve-generate")

D, FF, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 1024, 2816, 4, 16, 4, 64, 2048


def _bf16_block(rng, n):
    out = bytearray()
    for _ in range(n):
        bits = struct.unpack("<I", struct.pack("<f", rng.uniform(-0.03, 0.03)))[0]
        out += struct.pack("<H", bits >> 16)
    return bytes(out)


def _write_checkpoint(path):
    rng = random.Random(5)
    block = _bf16_block(rng, 4099)  # an odd length, so rows do not repeat in step
    one = struct.pack("<H", 0x3F80)  # 1.0 in bf16
    shapes = {"model.embed_tokens.weight": [VOCAB, D], "model.norm.weight": [D],
              "lm_head.weight": [VOCAB, D]}
    for l in range(LAYERS):
        p = f"model.layers.{l}."
        shapes.update({
            p + "self_attn.q_proj.weight": [HEADS * HEAD_DIM, D],
            p + "self_attn.k_proj.weight": [KV_HEADS * HEAD_DIM, D],
            p + "self_attn.v_proj.weight": [KV_HEADS * HEAD_DIM, D],
            p + "self_attn.o_proj.weight": [D, HEADS * HEAD_DIM],
            p + "mlp.gate_proj.weight": [FF, D],
            p + "mlp.up_proj.weight": [FF, D],
            p + "mlp.down_proj.weight": [D, FF],
            p + "input_layernorm.weight": [D],
            p + "post_attention_layernorm.weight": [D],
        })
    header, offset, gemm_bytes = {}, 0, 0
    for name, shape in shapes.items():
        nbytes = 2 * shape[0] * (shape[1] if len(shape) > 1 else 1)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
        if "proj" in name or name == "lm_head.weight":
            gemm_bytes += nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, shape in shapes.items():
            nbytes = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            if len(shape) == 1:
                f.write(one * (nbytes // 2))
            else:
                f.write((block * (nbytes // len(block) + 1))[:nbytes])
    config = {"model_type": "llama", "hidden_size": D, "intermediate_size": FF,
              "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
              "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "vocab_size": VOCAB, "max_position_embeddings": 256,
              "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
              "torch_dtype": "bfloat16", "hidden_act": "silu"}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return gemm_bytes


def _peak_rss_bytes(model, isa):
    env = dict(os.environ)
    if isa is not None:
        env["MODSERVE_CPU_ISA"] = isa
    proc = subprocess.Popen([GENERATE, "--model", model, "--prompt_ids", "5,6,7",
                             "--max_new_tokens", "1"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    assert os.waitstatus_to_exitcode(status) == 0, err
    return usage.ru_maxrss * 1024  # kilobytes on Linux


def test_copied_weights_do_not_double_the_peak_resident_size(tmp_path):
    if not os.path.exists(GENERATE):
        pytest.skip(f"{GENERATE} is not built (run tools/test.sh, or set MODSERVE_BUILD_DIR)")
    gemm_bytes = _write_checkpoint(str(tmp_path))
    plain = _peak_rss_bytes(str(tmp_path), "avx2")
    best = _peak_rss_bytes(str(tmp_path), None)
    # Holding the file's pages and every copy at once would add gemm_bytes; one weight's file
    # pages alongside the copies adds at most the largest weight (an eighth of them here).
    assert best < plain + gemm_bytes // 4, (best, plain, gemm_bytes)
