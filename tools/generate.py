"""Generates text with the PyTorch reference (token by token, sparse KV cache) and reports how
much of the network each routed layer computed. A readable oracle, not a server: no batching.

  .venv/bin/python tools/generate.py --model models/demo --prompt "The trouble with computers is"
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from modref import checkpoint  # noqa: E402
from modref.model import IncrementalDecoder  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="models/demo")
    ap.add_argument("--prompt", default="The trouble with computers is")
    ap.add_argument("--max_new_tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threshold", type=float, default=None, help="override mod.threshold")
    args = ap.parse_args()
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    model = checkpoint.load(args.model)
    cfg = model.cfg
    dec = IncrementalDecoder(model, args.threshold)
    gen = torch.Generator().manual_seed(args.seed)
    ids = tok.encode(args.prompt).ids
    for t in ids[:-1]:
        dec.step(t)
    out, shown = [], ""
    nxt = ids[-1]
    print(args.prompt, end="", flush=True)
    for _ in range(args.max_new_tokens):
        logits = dec.step(nxt)
        if args.temperature > 0:
            probs = torch.softmax(logits / args.temperature, -1)
            nxt = int(torch.multinomial(probs, 1, generator=gen).item())
        else:
            nxt = int(torch.argmax(logits).item())
        if nxt in cfg.eos_token_ids:
            break
        out.append(nxt)
        text = tok.decode(out)
        if not text.endswith("\ufffd"):  # hold back an incomplete UTF-8 character
            print(text[len(shown):], end="", flush=True)
            shown = text
    print(flush=True)
    n = dec.n
    dense_tokens = n * cfg.n_layers
    kv = sum(dec.kv_tokens(l) for l in range(cfg.n_layers))
    for l in sorted(dec.decisions):
        d = dec.decisions[l]
        print(f"layer {l}: computed {sum(d)}/{len(d)} tokens ({sum(d) / len(d) * 100:.1f}%)",
              file=sys.stderr)
    print(f"KV entries held: {kv} of {dense_tokens} for a dense model "
          f"({kv / dense_tokens * 100:.1f}%)", file=sys.stderr)


if __name__ == "__main__":
    main()
