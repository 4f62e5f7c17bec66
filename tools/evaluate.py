"""Evaluates the demo MoD checkpoint against its dense twin on the held-out split.

Prints held-out loss in bits per byte for the dense baseline, the MoD model with training-time
top-k routing (non-causal) and with causal predictor routing; predictor accuracy against top-k
labels and the routed fraction per routed layer; forward FLOPs per token, MoD against dense.

  .venv/bin/python tools/evaluate.py --mod models/demo --dense models/demo-dense [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
from modref import checkpoint  # noqa: E402

EOS = 2


def byte_level_decoder() -> dict:
    """GPT-2's byte <-> printable-character table, inverted: char -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_bytes(tok) -> list:
    """UTF-8 bytes each token id stands for (0 for special tokens)."""
    inv = byte_level_decoder()
    specials = {t.content for t in tok.get_added_tokens_decoder().values()}
    out = []
    for i in range(tok.get_vocab_size()):
        s = tok.id_to_token(i)
        out.append(0 if s in specials else len(s))
        assert s in specials or all(c in inv for c in s)
    return out


def heldout_windows(tokenizer_path: str, T: int) -> torch.Tensor:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_path)
    _, held = corpus.split()
    stream = []
    for e in tok.encode_batch(held):
        stream.extend(e.ids + [EOS])
    n = (len(stream) - 1) // T
    x = torch.tensor(stream[: n * T + 1])
    return torch.stack([x[i * T: i * T + T + 1] for i in range(n)]), token_bytes(tok)


def flops_per_token(cfg, fractions: dict, ctx: float) -> float:
    """Forward multiply-adds x 2 per token at average attention context `ctx`."""
    d, hd = cfg.d_model, cfg.head_dim
    proj = 2 * d * hd * (2 * cfg.n_heads + 2 * cfg.n_kv_heads)
    attn = 2 * 2 * cfg.n_heads * hd * ctx
    mlp = 2 * 3 * d * cfg.d_ff
    total = 2 * d * cfg.vocab_size
    for l in range(cfg.n_layers):
        f = fractions.get(l, 1.0)
        # A routed layer runs on a fraction f of tokens, and they attend to a fraction f of keys.
        total += f * (proj + mlp) + f * f * attn
        if cfg.is_routed(l):
            total += 2 * d
            p = cfg.mod.predictor
            if cfg.mod.inference_routing == "predictor_threshold" and p is not None:
                total += 2 * d * p.hidden_size + 2 * p.hidden_size if p.type == "mlp" else 2 * d
    return total


@torch.no_grad()
def evaluate(model, windows, nbytes, mode, batch=16):
    nll, nb = 0.0, 0
    routed = {}
    acc = {}
    bytes_t = torch.tensor(nbytes)
    for i in range(0, len(windows), batch):
        w = windows[i: i + batch]
        logits, info = model(w[:, :-1], mode=mode)
        nll += F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten(), reduction="sum").item()
        nb += bytes_t[w[:, 1:]].sum().item()
        for l, rec in info.items():
            r = routed.setdefault(l, [0, 0])
            r[0] += rec["selected"].sum().item()
            r[1] += rec["selected"].numel()
            if "pred" in rec:
                a = acc.setdefault(l, [0, 0])
                a[0] += ((rec["pred"] > 0) == rec["selected"]).sum().item()
                a[1] += rec["selected"].numel()
    return {"bpb": nll / math.log(2) / nb, "nats_per_token": nll / windows[:, 1:].numel(),
            "routed_fraction": {l: r[0] / r[1] for l, r in routed.items()},
            "predictor_accuracy": {l: a[0] / a[1] for l, a in acc.items()}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mod", default="models/demo")
    ap.add_argument("--dense", default="models/demo-dense")
    ap.add_argument("--seq_len", type=int, default=256)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    t0 = time.time()
    windows, nbytes = heldout_windows(os.path.join(args.mod, "tokenizer.json"), args.seq_len)
    mod = checkpoint.load(args.mod)
    dense = checkpoint.load(args.dense)
    r_dense = evaluate(dense, windows, nbytes, "causal")
    r_topk = evaluate(mod, windows, nbytes, "topk")
    r_causal = evaluate(mod, windows, nbytes, "causal")
    ctx = (args.seq_len + 1) / 2
    f_dense = flops_per_token(dense.cfg, {}, ctx)
    f_mod = flops_per_token(mod.cfg, r_causal["routed_fraction"], ctx)
    n_tok = windows[:, 1:].numel()
    print(f"held-out split: {len(windows)} windows of {args.seq_len} tokens ({n_tok} tokens)\n")
    print("| model | routing | loss (bits/byte) | vs top-k |")
    print("|---|---|---|---|")
    print(f"| dense | - | {r_dense['bpb']:.4f} | |")
    print(f"| MoD | top-k (training, non-causal) | {r_topk['bpb']:.4f} | |")
    rel = (r_causal["bpb"] / r_topk["bpb"] - 1) * 100
    print(f"| MoD | causal predictor, tau={mod.cfg.mod.threshold} | {r_causal['bpb']:.4f} | "
          f"{rel:+.2f}% |\n")
    print("| routed layer | predictor accuracy vs top-k labels | routed fraction (causal) | "
          "routed fraction (top-k) |")
    print("|---|---|---|---|")
    for l in sorted(r_causal["routed_fraction"]):
        print(f"| {l} | {r_topk['predictor_accuracy'].get(l, float('nan')) * 100:.2f}% | "
              f"{r_causal['routed_fraction'][l] * 100:.2f}% | "
              f"{r_topk['routed_fraction'][l] * 100:.2f}% |")
    print(f"\nforward FLOPs per token (context {ctx:.0f}): dense {f_dense / 1e6:.2f} M, "
          f"MoD {f_mod / 1e6:.2f} M ({f_mod / f_dense * 100:.1f}% of dense)")
    print(f"evaluated in {time.time() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"dense": r_dense, "topk": r_topk, "causal": r_causal,
                       "flops_dense": f_dense, "flops_mod": f_mod, "tokens": n_tok}, f,
                      indent=1, default=str)


if __name__ == "__main__":
    main()
