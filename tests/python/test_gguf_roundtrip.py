"""models/demo (MoD, predictor routing) through the built modserve-quantize and back through the
built engine and server, compared with the safetensors original.

Files are made from models/demo: F32, Q8_0, Q5_K, Q6_K, Q5_0 and Q5_1 GGUF files
(modserve-quantize), and directories holding the quantized files' weights dequantized to F32 by
the `gguf` package, an independent dequantizer (Q/K rows un-permuted and names mapped back here, in numpy). Greedy runs
of modserve-generate (token ids from the `tokenizers` package, top-2 logprobs) then compare:

1. the F32 file with the original: the same values in another container, so the same tokens,
   routing and logprobs within 1e-3 (F32 instead of BF16 weight kernels: accumulation order);
2. the Q8_0 file with its dequantized directory: the same weight values, so what differs is the
   quantized kernels' arithmetic. They round activations to int8 per 32-element block, as
   llama.cpp's do: each activation moves by up to 1/254 of its block's largest, ~0.2% RMS, and
   the per-token logprobs by a few hundredths of a nat (measured: 0.076 at most over 96 steps);
3. the Q8_0 file with the original: that activation rounding plus Q8_0's weight rounding (half a
   step of amax/127 per 32-block, ~0.3% RMS of a Gaussian row), of the same size (measured:
   0.069 at most).
TOL, twice the larger measured deviation, bounds both. Greedy paths may part only at a near-tie:
at the first differing step one side's top-1/top-2 margin must be under 2 * TOL (each logprob
may move by TOL, so their difference by twice that); comparison stops there, and at least half
the steps must have been compared. The Q5_K, Q6_K, Q5_0 and Q5_1 files (whose paths may part
early at a near-tie of the small model) instead go on from the same prefix after each near-tie,
and every step but the ties' own is compared. Finally `modserve` serves the Q8_0 file and a
Generate call through the Python client returns exactly modserve-generate's tokens and logprobs
on it.

Binaries: $MODSERVE_BUILD_DIR/bin (default build/); without them the tests skip.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import quants as gguf_quants  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "common"))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
from loopback import Server  # noqa: E402

DEMO = os.path.join(ROOT, "models", "demo")
BUILD = os.environ.get("MODSERVE_BUILD_DIR", os.path.join(ROOT, "build"))
BIN = os.path.join(BUILD if os.path.isabs(BUILD) else os.path.join(ROOT, BUILD), "bin")
QUANTIZE = os.path.join(BIN, "modserve-quantize")
GENERATE = os.path.join(BIN, "modserve-generate")
SERVER = os.path.join(BIN, "modserve")

PROMPTS = ["Once upon a time", "The trouble with computers is", "Q: What is a computer?\nA:",
           "You will be"]
NEW_TOKENS = 24
EXACT_TOL = 1e-3
TOL = 0.15

pytestmark = pytest.mark.skipif(
    not all(os.access(p, os.X_OK) for p in (QUANTIZE, GENERATE)),
    reason=f"{QUANTIZE} or {GENERATE} is not built")

_HF_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "mod_router.weight": "router.weight",
    "mod_router.bias": "router.bias",
    "mod_pred_hidden.weight": "aux_router.0.weight",
    "mod_pred_hidden.bias": "aux_router.0.bias",
    "mod_pred_out.weight": "aux_router.2.weight",
    "mod_pred_out.bias": "aux_router.2.bias",
}
_HF_TOP = {"token_embd.weight": "model.embed_tokens.weight",
           "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def hf_name(name):
    if name in _HF_TOP:
        return _HF_TOP[name]
    _, layer, rest = name.split(".", 2)
    return f"model.layers.{layer}.{_HF_LAYER[rest]}"


def unpermute(w, n_head):
    """GGUF row 2i + j of a head is rotate-half row j * head_dim / 2 + i."""
    head_dim = w.shape[0] // n_head
    out = np.empty_like(w)
    for h in range(n_head):
        for i in range(head_dim // 2):
            for j in range(2):
                out[h * head_dim + j * head_dim // 2 + i] = w[h * head_dim + 2 * i + j]
    return out


def dequantized_dir(gguf_path, out_dir):
    """The GGUF file's weights, dequantized by the gguf package, as an F32 model directory."""
    cfg = json.load(open(os.path.join(DEMO, "config.json")))
    reader = gguf.GGUFReader(gguf_path)
    tensors = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        a = np.asarray(gguf_quants.dequantize(t.data, gguf.GGMLQuantizationType(int(t.tensor_type))),
                       dtype=np.float32).reshape(shape)
        if t.name.endswith("attn_q.weight"):
            a = unpermute(a, cfg["num_attention_heads"])
        elif t.name.endswith("attn_k.weight"):
            a = unpermute(a, cfg["num_key_value_heads"])
        tensors[hf_name(t.name)] = np.ascontiguousarray(a)
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"))
    cfg["torch_dtype"] = "float32"
    json.dump(cfg, open(os.path.join(out_dir, "config.json"), "w"))
    return out_dir


def quantize(out, wtype):
    r = subprocess.run([QUANTIZE, "--model", DEMO, "--out", out, "--type", wtype],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


def prompt_ids():
    tok = Tokenizer.from_file(os.path.join(DEMO, "tokenizer.json"))
    return [tok.encode(p).ids for p in PROMPTS]


def generate(model, ids):
    r = subprocess.run([GENERATE, "--model", model, "--prompt_ids", ",".join(map(str, ids)),
                        "--max_new_tokens", str(NEW_TOKENS), "--ignore_eos", "--top_logprobs", "2",
                        "--json", "--threads", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def margin(run, k):
    tops = run["top_logprobs"][k]
    return tops[0]["logprob"] - tops[1]["logprob"]


def compare(a, b, tol):
    """Steps compared and the largest logprob difference; asserts the near-tie rule."""
    worst, steps = 0.0, 0
    for k, (x, y) in enumerate(zip(a["token_ids"], b["token_ids"])):
        if x != y:
            assert min(margin(a, k), margin(b, k)) < 2 * tol, (
                f"step {k}: tokens {x} vs {y} differ without a near-tie (margins "
                f"{margin(a, k):.4f}, {margin(b, k):.4f})")
            break
        worst = max(worst, abs(a["logprobs"][k] - b["logprobs"][k]))
        steps += 1
    return steps, worst


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("roundtrip")
    q8 = quantize(str(d / "demo-q8_0.gguf"), "q8_0")
    q5 = quantize(str(d / "demo-q5_k.gguf"), "q5_k")
    q6 = quantize(str(d / "demo-q6_k.gguf"), "q6_k")
    q5_0 = quantize(str(d / "demo-q5_0.gguf"), "q5_0")
    q5_1 = quantize(str(d / "demo-q5_1.gguf"), "q5_1")
    return {"f32": quantize(str(d / "demo-f32.gguf"), "f32"), "q8_0": q8,
            "q8_0_dequantized": dequantized_dir(q8, str(d / "q8_0-dequantized")),
            "q5_k": q5, "q5_k_dequantized": dequantized_dir(q5, str(d / "q5_k-dequantized")),
            "q6_k": q6, "q6_k_dequantized": dequantized_dir(q6, str(d / "q6_k-dequantized")),
            "q5_0": q5_0, "q5_0_dequantized": dequantized_dir(q5_0, str(d / "q5_0-dequantized")),
            "q5_1": q5_1, "q5_1_dequantized": dequantized_dir(q5_1, str(d / "q5_1-dequantized"))}


@pytest.fixture(scope="module")
def runs(files):
    out = {}
    for name, model in [("original", DEMO)] + list(files.items()):
        out[name] = [generate(model, ids) for ids in prompt_ids()]
    return out


def test_f32_gguf_matches_the_original(runs):
    for a, b in zip(runs["f32"], runs["original"]):
        assert a["token_ids"] == b["token_ids"]
        assert max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"])) < EXACT_TOL
        assert a["routing"] == b["routing"]


def expect_close_runs(runs_a, runs_b, what):
    """Every prompt's runs within TOL up to a near-tie, over at least half the steps."""
    total, worst = 0, 0.0
    for a, b in zip(runs_a, runs_b):
        steps, w = compare(a, b, TOL)
        total, worst = total + steps, max(worst, w)
    print(f"{what}: {total} steps, max |dlogprob| {worst:.4f}")
    assert worst < TOL
    assert total >= len(PROMPTS) * NEW_TOKENS // 2


def test_q8_0_gguf_matches_its_dequantized_weights(runs):
    expect_close_runs(runs["q8_0"], runs["q8_0_dequantized"],
                      "Q8_0 file vs its dequantized weights")


def compare_resyncing(model_a, model_b, ids, a, b):
    """compare() over NEW_TOKENS steps from `ids`; where the paths part at a near-tie, both go on
    greedily from the same prefix (a's tokens through the tie), so steps after an early tie are
    compared too. Returns steps compared, the largest logprob difference and the ties passed."""
    prefix, left, compared, worst, ties = list(ids), NEW_TOKENS, 0, 0.0, 0
    while True:
        steps, w = compare(a, b, TOL)
        worst = max(worst, w)
        parted = steps < min(len(a["token_ids"]), len(b["token_ids"]))
        steps = min(steps, left)
        compared, left = compared + steps, left - steps
        if not parted or left <= 1:
            return compared, worst, ties
        prefix += a["token_ids"][:steps + 1]
        left, ties = left - 1, ties + 1
        a, b = generate(model_a, prefix), generate(model_b, prefix)


def expect_k_quant_ffn_down(files, runs, name):
    # models/demo's 192-wide rows take Q8_0 (the K-quants' block is 256); its ffn_down rows (512)
    # are of the type, 192 of them: a multiple of 16, so the CPU backend runs its interleaved copy.
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(files[name]).tensors}
    assert {n for n, t in types.items() if t == name.upper()} == {
        f"blk.{i}.ffn_down.weight" for i in range(6)}, types
    expect_close_resyncing(files, runs, name)


def expect_close_resyncing(files, runs, name):
    """The `name` file's runs against its dequantized directory's, past near-ties."""
    total, worst, ties = 0, 0.0, 0
    for ids, a, b in zip(prompt_ids(), runs[name], runs[name + "_dequantized"]):
        c, w, t = compare_resyncing(files[name], files[name + "_dequantized"], ids, a, b)
        total, worst, ties = total + c, max(worst, w), ties + t
    print(f"{name.upper()} file vs its dequantized weights: {total} steps, {ties} near-ties, "
          f"max |dlogprob| {worst:.4f}")
    assert worst < TOL
    # Every step but the near-ties' own is compared.
    assert total >= len(PROMPTS) * NEW_TOKENS - ties


def test_q5_k_gguf_matches_its_dequantized_weights(files, runs):
    expect_k_quant_ffn_down(files, runs, "q5_k")


def test_q6_k_gguf_matches_its_dequantized_weights(files, runs):
    expect_k_quant_ffn_down(files, runs, "q6_k")


@pytest.mark.parametrize("name", ["q5_0", "q5_1"])
def test_q5_0_and_q5_1_ggufs_match_their_dequantized_weights(files, runs, name):
    # Every matrix of models/demo (rows of 192 and 512) is of the type: 32-element blocks fit
    # both widths, and the embeddings take it too (--embed_type defaults to --type).
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(files[name]).tensors}
    assert {n for n, t in types.items() if t == name.upper()} == {
        n for n in types if not n.endswith("norm.weight") and ".mod_" not in n}, types
    expect_close_resyncing(files, runs, name)


def test_q8_0_gguf_round_trips_the_original(runs):
    expect_close_runs(runs["q8_0"], runs["original"], "Q8_0 file vs the original")


@pytest.mark.skipif(not os.access(SERVER, os.X_OK), reason=f"{SERVER} is not built")
def test_server_serves_the_q8_0_gguf(files, runs):
    from modserve_client import Client
    with Server(SERVER, files["q8_0"], "--threads", "2", metrics=False) as server:
        with Client(f"127.0.0.1:{server.port}") as client:
            for ids, expected in zip(prompt_ids(), runs["q8_0"]):
                g = client.generate(ids, max_new_tokens=NEW_TOKENS, ignore_eos=True)
                assert g.token_ids == expected["token_ids"]
                assert np.allclose(g.logprobs, expected["logprobs"], atol=1e-5)
