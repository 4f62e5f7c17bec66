"""How much block compute can a frozen dense model skip at all? An upper bound for router tuning.

tools/mod_tune.py trains causal routers on a frozen dense model. This script asks what the best
possible router could reach on the same model: an oracle that, in each routed layer, first runs
the block on every token, measures how much the block changes each token (the relative update
||y - x|| / ||x||), and then skips the tokens it changes least. The oracle sees the block's
output before it decides, which no causal router can; its perplexity at a given fraction of
block compute skipped is therefore a bound that router tuning cannot beat (up to the oracle's own
greediness: it decides layer by layer, not for the whole network).

The skipped tokens are treated exactly as at serving time (DESIGN.md section 2, weight_fn
"one"): a skipped token keeps x and is absent from the layer's keys; a routed token takes the
block output computed over the routed keys only. Position 0 (the attention sink) is always kept.
--metric cos ranks by 1 - cos(x, y) instead of the relative update norm.

Policies, each over the --layers routed layers:
  token:C     every routed layer keeps the fraction C of the tokens with the largest update
  global:R    a token is skipped in any routed layer where its relative update is below R (the
              budget flows to the layers that need it least)
  grad:C      every routed layer keeps the fraction C of the tokens whose skipping would raise
              the loss most to first order: with the dense model's gradient g of the windows'
              next-token loss at the layer's output, skipping token t changes the loss by about
              -g[t] . (y[t] - x[t]); it sees the labels, so it bounds any router from above
  layers:N    whole layers skipped: the N routed layers with the smallest mean update on these
              windows (early-exit / layer-skipping baselines, for comparison)

  .venv/bin/python tools/mod_oracle.py --base models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
      --layers 4-23,25-28 --windows 8 --len 512 \\
      --policies token:0.9,token:0.8,token:0.7,global:0.05,global:0.1,layers:4,layers:8

Prints a Markdown table: perplexity vs dense and the fraction of all block computations skipped
(over all layers, dense ones included), on The Jargon File windows mod_eval.py uses.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TOOLS)
import mod_tune  # noqa: E402
from modref.model import causal_mask  # noqa: E402


def relative_update(x: torch.Tensor, y: torch.Tensor, metric: str = "norm") -> torch.Tensor:
    """How much a block changes each token: ||y - x|| / ||x|| ("norm") or 1 - cos(x, y)
    ("cos", the influence mod_tune.py's collect stage measures)."""
    if metric == "cos":
        return 1.0 - torch.nn.functional.cosine_similarity(x, y, dim=-1)
    return (y - x).norm(dim=-1) / x.norm(dim=-1).clamp_min(1e-12)


def grad_estimates(dense, tokens: torch.Tensor, layers: set) -> dict:
    """Per routed layer, the first-order loss change of skipping each token: -g . (y - x) [B, T],
    g the gradient of the summed next-token loss at the layer's output, on the dense pass."""
    B, T = tokens.shape
    pos = torch.arange(T).expand(B, T)
    mask = causal_mask(B, T)
    with torch.enable_grad():
        x = dense.model.embed_tokens(tokens).detach().requires_grad_(True)
        outs = {}
        for l, blk in enumerate(dense.model.layers):
            y, _, _ = blk.run(x, pos, mask)
            if l in layers:
                y.retain_grad()
                outs[l] = (x.detach(), y)
            x = y
        lp = torch.log_softmax(dense.logits(x)[:, :-1], dim=-1)
        loss = -lp.gather(-1, tokens[:, 1:, None]).sum()
        loss.backward()
    return {l: -(y.grad * (y.detach() - x0)).sum(-1) for l, (x0, y) in outs.items()}


def oracle_forward(dense, tokens: torch.Tensor, layers: set, policy: str, arg: float,
                   skip_layers: set, record: dict | None = None, metric: str = "norm"):
    """Logits [B, T, V] and the number of block computations skipped. With `record`, each routed
    layer's decisions (bool [B, T], True = computed) are stored in it. `metric`: the ranking of
    the token and global policies (relative_update)."""
    B, T = tokens.shape
    x = dense.model.embed_tokens(tokens)
    pos = torch.arange(T).expand(B, T)
    mask = causal_mask(B, T)
    eye = torch.eye(T, dtype=torch.bool)
    skipped = 0
    est = grad_estimates(dense, tokens, layers) if policy == "grad" else None
    for l, blk in enumerate(dense.model.layers):
        if l in skip_layers:
            skipped += B * T
            continue
        y, _, _ = blk.run(x, pos, mask)
        if l not in layers or policy == "layers":
            x = y
            continue
        u = est[l] if policy == "grad" else relative_update(x, y, metric)
        if policy in ("token", "grad"):
            k = min(T, math.ceil(arg * T - 1e-9))
            keep = torch.zeros(B, T, dtype=torch.bool)
            keep.scatter_(1, torch.topk(u, k, dim=-1).indices, True)
        else:  # global
            keep = u >= arg
        keep[:, 0] = True
        if record is not None:
            record[l] = keep
        skipped += int((~keep).sum())
        y, _, _ = blk.run(x, pos, mask & (keep[:, None, :] | eye))
        x = torch.where(keep[..., None], y, x)
    return dense.logits(x), skipped


def dense_pass(dense, tokens: torch.Tensor, metric: str) -> tuple:
    """The dense model's logits [B, T, V] and each layer's mean relative update."""
    B, T = tokens.shape
    x = dense.model.embed_tokens(tokens)
    pos = torch.arange(T).expand(B, T)
    mask = causal_mask(B, T)
    means = []
    for blk in dense.model.layers:
        y, _, _ = blk.run(x, pos, mask)
        means.append(relative_update(x, y, metric).mean().item())
        x = y
    return dense.logits(x), means


def nll(logits: torch.Tensor, tokens: torch.Tensor) -> float:
    lp = torch.log_softmax(logits[:, :-1].double(), dim=-1)
    return -lp.gather(-1, tokens[:, 1:, None]).sum().item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--base", required=True, help="dense checkpoint (model directory or GGUF)")
    ap.add_argument("--layers", required=True, help="routed layers, e.g. 4-23,25-28")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--len", type=int, default=512)
    ap.add_argument("--policies", default="token:0.9,token:0.8,token:0.7,layers:4,layers:8")
    ap.add_argument("--metric", choices=["norm", "cos"], default="norm",
                    help="the oracle's measure of a block's update (see relative_update)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="write every number here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dense = mod_tune.load_dense(args.base)
    n_layers = dense.cfg.n_layers
    layers = set(mod_tune.parse_layers(args.layers, n_layers))
    tok = mod_tune.load_tokenizer(args.base)
    windows = mod_tune.eval_windows(tok, args.len, args.windows)
    total_blocks = n_layers * windows.numel()
    predicted = windows.shape[0] * (windows.shape[1] - 1)
    rows = []
    with torch.no_grad():
        t0 = time.time()
        means = [0.0] * n_layers
        dense_nll = 0.0
        for b in range(windows.shape[0]):
            wb = windows[b:b + 1]
            logits, layer_mean = dense_pass(dense, wb, args.metric)
            dense_nll += nll(logits, wb)
            for l, m in enumerate(layer_mean):
                means[l] += m / windows.shape[0]
        dense_ppl = math.exp(dense_nll / predicted)
        print(f"dense: ppl {dense_ppl:.3f} ({time.time() - t0:.0f} s); mean relative update per "
              f"layer: {' '.join(f'{m:.3f}' for m in means)}", flush=True)
        for spec in args.policies.split(","):
            policy, val = spec.split(":")
            arg = float(val)
            skip_layers = set()
            if policy == "layers":
                skip_layers = set(sorted(layers, key=lambda l: means[l])[:int(arg)])
            elif policy not in ("token", "global", "grad"):
                raise SystemExit(f"--policies: unknown policy {policy!r}")
            t0 = time.time()
            total_nll, skipped = 0.0, 0
            for b in range(windows.shape[0]):
                wb = windows[b:b + 1]
                logits, s = oracle_forward(dense, wb, layers, policy, arg, skip_layers,
                                           metric=args.metric)
                total_nll += nll(logits, wb)
                skipped += s
            ppl = math.exp(total_nll / predicted)
            row = {"policy": spec, "ppl": ppl, "vs_dense": ppl / dense_ppl - 1,
                   "skipped_fraction": skipped / total_blocks,
                   "skip_layers": sorted(skip_layers)}
            rows.append(row)
            print(f"{spec}: ppl {ppl:.3f} ({100 * row['vs_dense']:+.1f}%), skipped "
                  f"{100 * row['skipped_fraction']:.1f}% ({time.time() - t0:.0f} s)", flush=True)
    print(f"\n{predicted} tokens of {os.path.relpath(mod_tune.EVAL_TEXT, mod_tune.ROOT)}, "
          f"{mod_tune.cpu_model()}\n")
    print("| oracle policy | perplexity | vs dense | block compute skipped |")
    print("|---|---:|---:|---:|")
    print(f"| dense | {dense_ppl:.3f} | - | 0% |")
    for r in rows:
        extra = f" (layers {','.join(map(str, r['skip_layers']))})" if r["skip_layers"] else ""
        print(f"| {r['policy']}{extra} | {r['ppl']:.3f} | {100 * r['vs_dense']:+.1f}% | "
              f"{100 * r['skipped_fraction']:.1f}% |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"dense_ppl": dense_ppl, "layer_mean_update": means, "rows": rows,
                       "predicted_tokens": predicted, "cpu": mod_tune.cpu_model()}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
