"""Writes golden.json: the float64 PyTorch reference (tools/modref) on the MoD adapter
models/smollm2-mod over the SmolLM2 Q4_1 base (dequantized exactly by the gguf package), for
the first 256 tokens of the held-out passage of tests/testdata/smollm2/logprobs.json (The Jargon
File, as llama.cpp tokenizes it), teacher-forced at two request thresholds: the default and 0.9
(the point of the calibrated capacities).
Per case: every position's log-probability of the next token, its top-1 id and top-1/top-2
margin, and per routed layer the decision and |sigmoid(s) - tau_l(r)|.

  .venv/bin/python tests/testdata/smollm2_mod/make_golden.py

The engine (tests/engine/smollm2_mod_golden_test.cc) runs the Q4_1 file with 8-bit activation
rounding, so it is held to measured bounds, not to this file's last digits.
"""
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from modref import checkpoint  # noqa: E402

TOKENS = 256
THRESHOLDS = (None, 0.9)


def fmt(x: float) -> float:
    return float(f"{x:.9g}")


def main():
    torch.set_num_threads(1)
    adapter = os.path.join(ROOT, "models", "smollm2-mod")
    with open(os.path.join(ROOT, "tests", "testdata", "smollm2", "logprobs.json")) as f:
        ids = json.load(f)["ids"][:TOKENS]
    model = checkpoint.load(adapter, dtype=torch.float64)
    mod = model.cfg.mod
    out = {"checkpoint": "models/smollm2-mod", "reference": "tools/modref, float64",
           "source": "tests/testdata/smollm2/logprobs.json ids[:256]", "ids": ids, "cases": []}
    tokens = torch.tensor([ids])
    for r in THRESHOLDS:
        with torch.no_grad():
            logits, info = model(tokens, mode="causal", threshold=r)
        lp = torch.log_softmax(logits[0], dim=-1)
        top2 = torch.topk(logits[0], 2, dim=-1)
        case = {"threshold": mod.threshold if r is None else r,
                "next_logprobs": [fmt(lp[p, ids[p + 1]].item()) for p in range(len(ids) - 1)],
                "argmax": top2.indices[:, 0].tolist(),
                "margin": [fmt(m) for m in (top2.values[:, 0] - top2.values[:, 1]).tolist()],
                "routing": {}}
        for l in mod.routed_layers:
            rec = info[l]
            case["routing"][str(l)] = {
                "tau": rec["tau"], "selected": [int(b) for b in rec["selected"][0].tolist()],
                "margin": [fmt(abs(p - rec["tau"])) for p in rec["prob"][0].tolist()]}
        nll = -sum(case["next_logprobs"]) / len(case["next_logprobs"])
        case["ppl"] = fmt(float(torch.tensor(nll).exp()))
        out["cases"].append(case)
        print(f"threshold {case['threshold']}: ppl {case['ppl']}")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    main()
