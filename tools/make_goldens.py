"""Writes the golden data that the C++ engine is checked against (DESIGN.md section 2).

For the demo checkpoint (models/demo) and for small random checkpoints covering every option of
DESIGN.md section 3 (tools/variants.py, written to tests/testdata/checkpoints/), it records for
fixed prompts: the reference's top-20 log-probabilities at every position, the routing decision
of every routed layer with its margin |sigmoid(z) - tau|, and a 32-token greedy continuation
(EOS ignored). The reference runs in float64 on weights read back from the files on disk, token
by token with the sparse KV cache, and the script checks that the full-sequence masked pass
agrees. Rerunning reproduces the files byte for byte.

  .venv/bin/python tools/make_goldens.py            # everything
  .venv/bin/python tools/make_goldens.py --only random --out /tmp/g   # random ones elsewhere
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from modref import checkpoint  # noqa: E402
from modref.model import IncrementalDecoder  # noqa: E402
import variants  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP_N = 20
NEW_TOKENS = 32


def fmt(x: float) -> float:
    return float(f"{x:.9g}")


def run_case(model, prompt_ids: list, threshold=None) -> dict:
    dec = IncrementalDecoder(model, threshold)
    positions = []
    ids = list(prompt_ids)
    generated = []
    step_lp = []
    for i in range(len(prompt_ids) + NEW_TOKENS - 1):
        logits = dec.step(ids[i])
        lp = torch.log_softmax(logits, dim=-1)
        step_lp.append(lp)
        top = torch.sort(-lp, stable=True).indices[:TOP_N]
        positions.append({"top_ids": top.tolist(), "top_logprobs": [fmt(lp[t]) for t in top]})
        if i >= len(prompt_ids) - 1:
            nxt = int(torch.argmax(logits).item())  # first maximum: ties to the lowest id
            generated.append(nxt)
            ids.append(nxt)
    # Cross-check against the full-sequence masked pass (a separate code path).
    full_logits, info = model(torch.tensor([ids[:-1]]), mode="causal", threshold=threshold)
    full_lp = torch.log_softmax(full_logits[0], dim=-1)
    diff = (full_lp - torch.stack(step_lp)).abs().max().item()
    if diff > 1e-9:
        raise SystemExit(f"full-sequence and token-by-token log-probabilities differ by {diff}")
    routing = {}
    tau = dec.tau
    for l in sorted(dec.decisions):
        full_sel = info[l]["selected"][0].tolist()
        if full_sel != dec.decisions[l]:
            raise SystemExit(f"layer {l}: full-sequence and token-by-token decisions differ")
        # The margin is to the layer's own threshold tau_l(r) (DESIGN.md section 2).
        routing[str(l)] = {"selected": [int(b) for b in dec.decisions[l]],
                           "margin": [fmt(abs(p - dec.layer_tau[l])) for p in dec.probs[l]]}
    return {"prompt_ids": list(prompt_ids), "threshold": tau, "greedy_ids": generated,
            "positions": positions, "routing": routing}


def write_golden(path: str, checkpoint_name: str, model, cases: list) -> None:
    """checkpoint_name: the checkpoint's path relative to the repository root."""
    out = {"checkpoint": checkpoint_name, "reference": "tools/modref, float64",
           "top_n": TOP_N, "new_tokens": NEW_TOKENS, "ignore_eos": True, "cases": []}
    for name, prompt, threshold, text in cases:
        case = {"name": name}
        if text is not None:
            case["prompt_text"] = text
        case.update(run_case(model, prompt, threshold))
        out["cases"].append(case)
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {os.path.relpath(path, ROOT)}: {len(cases)} cases")


def random_prompts(vocab: int) -> list:
    rng = random.Random(7)
    cases = []
    for n in (1, 5, 33, 230):
        cases.append((f"random_{n}", [1] + [rng.randrange(3, vocab) for _ in range(n - 1)], None,
                      None))
    cases.append(("random_33_threshold_0.3", cases[2][1], 0.3, None))
    return cases


def make_random(ckpt_root: str, golden_root: str) -> None:
    for name, (base, _) in variants.ADAPTERS.items():
        model_dir = os.path.join(ckpt_root, name)
        if os.path.isdir(model_dir):
            shutil.rmtree(model_dir)
        checkpoint.save_adapter(variants.random_adapter(name), model_dir, f"../{base}")
    for name, (_, dtype, shard) in variants.VARIANTS.items():
        model_dir = os.path.join(ckpt_root, name)
        if os.path.isdir(model_dir):
            shutil.rmtree(model_dir)
        checkpoint.save(variants.random_model(name), model_dir, dtype=dtype,
                        router_dtype=torch.float32, shard_bytes=shard)
        model = checkpoint.load(model_dir, dtype=torch.float64)
        cases = random_prompts(model.cfg.vocab_size)
        if model.cfg.mod is None:
            cases = [c for c in cases if c[2] is None]
        write_golden(os.path.join(golden_root, f"{name}.json"),
                     f"tests/testdata/checkpoints/{name}", model, cases)
    for name in variants.ADAPTERS:
        # Read back through the adapter loader: the base's weights plus adapter.safetensors.
        model = checkpoint.load(os.path.join(ckpt_root, name), dtype=torch.float64)
        write_golden(os.path.join(golden_root, f"{name}.json"),
                     f"tests/testdata/checkpoints/{name}", model,
                     random_prompts(model.cfg.vocab_size))


DEMO_PROMPTS = [
    ("short_question", "Q: What is the difference between a duck?\nA:"),
    ("short_quote", "The trouble with computers is"),
    ("short_unicode", "Caf\u00e9 \u00fcber na\u00efve \u2014 \u201cquoted\u201d \U0001F600"),
]


def make_demo(golden_root: str, model_dir: str) -> None:
    from tokenizers import Tokenizer
    import corpus
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    cases = [(n, tok.encode(t).ids, None, t) for n, t in DEMO_PROMPTS]
    _, held = corpus.split()
    long_text = ""
    for doc in held:
        long_text += doc + "\n\n"
        if len(tok.encode(long_text).ids) >= 220:
            break
    long_text = long_text.rstrip("\n")
    cases.append(("long_heldout", tok.encode(long_text).ids, None, long_text))
    cases.append(("short_question_threshold_0.3", cases[0][1], 0.3, DEMO_PROMPTS[0][1]))
    cases.append(("short_question_threshold_0.7", cases[0][1], 0.7, DEMO_PROMPTS[0][1]))
    model = checkpoint.load(model_dir, dtype=torch.float64)
    write_golden(os.path.join(golden_root, "demo.json"), "models/demo", model, cases)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", choices=["all", "random", "demo"], default="all")
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "testdata"),
                    help="writes <out>/checkpoints/<name>/ and <out>/goldens/<name>.json")
    args = ap.parse_args()
    torch.set_num_threads(1)  # fixed reduction order: reruns are bit-identical
    ckpt_root = os.path.join(args.out, "checkpoints")
    golden_root = os.path.join(args.out, "goldens")
    os.makedirs(ckpt_root, exist_ok=True)
    os.makedirs(golden_root, exist_ok=True)
    if args.only in ("all", "random"):
        make_random(ckpt_root, golden_root)
    if args.only in ("all", "demo"):
        make_demo(golden_root, os.path.join(ROOT, "models", "demo"))


if __name__ == "__main__":
    main()
