"""Writes the SmolLM2-135M-Instruct Q4_1 goldens that the real-model tests check modserve with
(tests/engine/smollm2_golden_test.cc):

  greedy.json    per prompt: llama.cpp's tokenization of it, llama.cpp's greedy 64 tokens with
                 the top-1 minus top-2 logit margin of every step, and, for comparison, the
                 float64 PyTorch reference's greedy tokens and margins on the same dequantized
                 weights
  logprobs.json  a held-out passage of The Jargon File 4.4.7 (tools/fetch_eval_text.sh; never
                 seen by the demo model) of at least 2,000 tokens as llama.cpp tokenizes it, the
                 float64 reference's teacher-forced log-probability of every token after the
                 first and its perplexity, and the same from llama.cpp over the same ids (so
                 the tests can say how far an engine that quantizes activations to 8 bits, as
                 llama.cpp's CPU kernels do, lands from the reference)

The reference is tools/modref: the GGUF's tensors expanded by the `gguf` package's dequantizer,
Q/K rows un-permuted, computed in float64 (tools/modref/gguf_io.py). llama.cpp runs with an F32
KV cache, no flash attention and no repacked weights (llamacpp_probe.cc, built here against its
libllama; the tokenizer tool is ../tokenizer/gguf/llamacpp_tokenize.cc).

  bash tools/fetch_models.sh && bash tools/fetch_eval_text.sh
  .venv/bin/python tests/testdata/smollm2/make_goldens.py [--llamacpp /tmp/llamacpp] [--threads 2]
      [--only greedy|logprobs]

Deterministic for one llama.cpp build and machine (reruns reproduce the files); a different CPU
may move llama.cpp's margins in the last digits.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(REPO, "tools"))
sys.path.insert(0, os.path.join(REPO, "tests", "testdata", "tokenizer", "gguf"))
from modref import gguf_io  # noqa: E402
from modref.model import IncrementalDecoder  # noqa: E402
import make_goldens as tokenizer_goldens  # noqa: E402

MODEL = os.path.join(REPO, "models", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
TEXT = os.path.join(REPO, "models", "eval", "jargon-4.4.7.txt")
N_NEW = 64
MIN_PASSAGE_TOKENS = 2100

PROMPTS = [
    "The capital of France is",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nWhat is the boiling point of water at sea level?<|im_end|>\n"
    "<|im_start|>assistant\n",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "Translate to French: I like apples.\nFrench:",
    "1, 2, 3, 5, 8, 13,",
]


def build(llamacpp: str, src: str, out_dir: str) -> str:
    import glob
    inc = glob.glob(os.path.join(llamacpp, "*", "vendor", "llama.cpp"))[0]
    lib = os.path.join(llamacpp, "build", "bin")
    exe = os.path.join(out_dir, os.path.splitext(os.path.basename(src))[0])
    subprocess.run(["c++", "-std=c++17", "-O2", src, "-I", os.path.join(inc, "include"), "-I",
                    os.path.join(inc, "ggml", "include"), "-L", lib, "-lllama",
                    f"-Wl,-rpath,{lib}", "-o", exe], check=True)
    return exe


def tokenize(tok_exe: str, texts: list) -> list:
    reqs = "".join(f"E 1 {t.encode('utf-8').hex()}\n" for t in texts)
    out = subprocess.run([tok_exe, MODEL, "0"], input=reqs, capture_output=True, text=True,
                         check=True).stdout.split("\n")
    return [[int(x) for x in line.split(",")] if line else [] for line in out[1:1 + len(texts)]]


def probe(probe_exe: str, args: list) -> list:
    out = subprocess.run([probe_exe] + args, capture_output=True, text=True, check=True).stdout
    return [line.split(" ") for line in out.strip().split("\n")]


def passage_paragraphs() -> list:
    """Chapter 1 of the Jargon File onwards, one string per paragraph (lines re-joined)."""
    with open(TEXT, encoding="utf-8") as f:
        lines = f.read().split("\n")
    # The headings use no-break spaces ("Chapter\u00a01.\u00a0Hacker Slang ...").
    start = next(i for i, l in enumerate(lines) if re.match(r"Chapter\s1\.\sHacker Slang", l))
    paras, cur = [], []
    for line in lines[start:]:
        if line.strip():
            cur.append(line.strip())
        elif cur:
            paras.append(" ".join(cur))
            cur = []
    return paras


def reference_greedy(model, prompt_ids: list) -> tuple:
    dec = IncrementalDecoder(model)
    logits = None
    for t in prompt_ids:
        logits = dec.step(t)
    ids, margins = [], []
    for _ in range(N_NEW):
        top = torch.topk(logits, 2)
        ids.append(int(top.indices[0]))
        margins.append(round(float(top.values[0] - top.values[1]), 6))
        logits = dec.step(ids[-1])
    return ids, margins


def stats(a: list, b: list) -> dict:
    d = sorted(abs(x - y) for x, y in zip(a, b))
    return {"max_abs": d[-1], "mean_abs": sum(d) / len(d), "p99_abs": d[int(0.99 * len(d))]}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llamacpp", default="/tmp/llamacpp")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=["greedy", "logprobs"])
    args = ap.parse_args()
    for path, how in ((MODEL, "tools/fetch_models.sh"), (TEXT, "tools/fetch_eval_text.sh")):
        if not os.path.exists(path):
            sys.exit(f"make_goldens: {path} is missing (bash {how})")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        tok_exe = build(args.llamacpp, os.path.join(os.path.dirname(tokenizer_goldens.__file__),
                                                     "llamacpp_tokenize.cc"), tmp)
        probe_exe = build(args.llamacpp, os.path.join(HERE, "llamacpp_probe.cc"), tmp)

        t0 = time.time()
        model = gguf_io.load(MODEL, torch.float64)
        print(f"reference loaded in {time.time() - t0:.0f} s")

        prompts = []
        for text, ids in zip(PROMPTS, tokenize(tok_exe, PROMPTS) if args.only != "logprobs"
                             else []):
            rows = probe(probe_exe, ["greedy", MODEL, ",".join(map(str, ids)), str(N_NEW),
                                     str(args.threads)])
            ref_ids, ref_margins = reference_greedy(model, ids)
            entry = {"text": text, "prompt_ids": ids,
                     "llamacpp_ids": [int(r[1]) for r in rows],
                     "llamacpp_margins": [float(r[3]) for r in rows],
                     "reference_ids": ref_ids, "reference_margins": ref_margins}
            same = next((i for i, (a, b) in enumerate(zip(entry["llamacpp_ids"], ref_ids))
                         if a != b), N_NEW)
            print(f"greedy {text[:30]!r}: llama.cpp and reference agree on {same}/{N_NEW}")
            prompts.append(entry)
        if args.only != "logprobs":
            tokenizer_goldens.write_json(os.path.join(HERE, "greedy.json"),
                                         {"model": os.path.relpath(MODEL, REPO), "n_new": N_NEW,
                                          "prompts": prompts})
        if args.only == "greedy":
            return

        paras = passage_paragraphs()
        candidates = ["\n\n".join(paras[:k]) for k in range(1, min(len(paras), 120) + 1)]
        counts = [len(x) for x in tokenize(tok_exe, candidates)]
        k = next(i for i, c in enumerate(counts) if c >= MIN_PASSAGE_TOKENS)
        passage = candidates[k]
        ids = tokenize(tok_exe, [passage])[0]
        print(f"passage: {k + 1} paragraphs, {len(passage)} chars, {len(ids)} tokens")

        t0 = time.time()
        with torch.no_grad():
            logits, _ = model(torch.tensor([ids]), mode="causal")
            logp = torch.log_softmax(logits[0, :-1], dim=-1)
            ref = logp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
            top2 = torch.topk(logits[0, :-1], 2, dim=-1)
            ref_argmax = top2.indices[:, 0].tolist()
            ref_margin = (top2.values[:, 0] - top2.values[:, 1]).tolist()
            del logits, logp, top2
        print(f"reference teacher-forced pass in {time.time() - t0:.0f} s")
        rows = probe(probe_exe, ["logprobs", MODEL, ",".join(map(str, ids)), str(args.threads)])
        lcp = [float(r[1]) for r in rows]
        lcp_argmax = [int(r[2]) for r in rows]
        lcp_margin = [float(r[3]) for r in rows]
        margin_err = stats(lcp_margin, ref_margin)
        ref_ppl = math.exp(-sum(ref) / len(ref))
        lcp_ppl = math.exp(-sum(lcp) / len(lcp))
        agreement = stats(lcp, ref)
        print(f"top-1 - top-2 margin: |llama.cpp - reference| max {margin_err['max_abs']:.4f} "
              f"mean {margin_err['mean_abs']:.5f}; argmax differs at "
              f"{sum(a != b for a, b in zip(lcp_argmax, ref_argmax))} of {len(ref)} positions")
        print(f"perplexity: reference {ref_ppl:.4f}, llama.cpp {lcp_ppl:.4f}; llama.cpp - "
              f"reference |logprob| max {agreement['max_abs']:.4f} mean "
              f"{agreement['mean_abs']:.5f} p99 {agreement['p99_abs']:.4f}")
        tokenizer_goldens.write_json(os.path.join(HERE, "logprobs.json"), {
            "model": os.path.relpath(MODEL, REPO),
            "source": "The Jargon File 4.4.7 (Debian jargon-text 4.4.7-4.1), chapter 1 on",
            "passage_sha256": hashlib.sha256(passage.encode("utf-8")).hexdigest(),
            "num_tokens": len(ids),
            "ids": ids,
            "reference_ppl": ref_ppl,
            "reference_logprobs": [round(x, 8) for x in ref],
            "reference_argmax": ref_argmax,
            "reference_margins": [round(x, 6) for x in ref_margin],
            "llamacpp_ppl": lcp_ppl,
            "llamacpp_logprobs": [round(x, 8) for x in lcp],
            "llamacpp_argmax": lcp_argmax,
            "llamacpp_margins": lcp_margin,
            "llamacpp_vs_reference": agreement,
            "llamacpp_vs_reference_margins": margin_err,
        })


if __name__ == "__main__":
    main()
