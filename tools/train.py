"""Trains the demo MoD model (or its dense twin) on the corpus's training split.

  .venv/bin/python tools/train.py --tokenizer models/demo/tokenizer.json --out models/demo
  .venv/bin/python tools/train.py --dense --tokenizer ... --out build/demo-dense

Training routing is expert-choice top-k per routed layer (DESIGN.md section 2); the predictor
learns on a stop-gradient input with BCE against the top-k labels, and an optional BCE on the
router itself pushes router scores to either side of 0 (--router_aux). Weights are saved in BF16
with routers and predictors in F32. Deterministic for a seed and thread count.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
from modref import checkpoint  # noqa: E402
from modref.config import ModConfig, ModelConfig, PredictorConfig  # noqa: E402
from modref.model import MoDLlama  # noqa: E402

BOS, EOS = 1, 2


def demo_config(args) -> ModelConfig:
    cfg = ModelConfig(d_model=args.d_model, d_ff=args.d_ff, n_layers=args.n_layers,
                      n_heads=args.n_heads, n_kv_heads=args.n_kv_heads,
                      head_dim=args.d_model // args.n_heads, vocab_size=args.vocab_size,
                      max_seq_len=2048, rms_norm_eps=1e-5, rope_theta=10000.0,
                      tie_word_embeddings=False, bos_token_id=BOS, eos_token_ids=(EOS,))
    if not args.dense:
        cfg.mod = ModConfig(routed_layers=list(range(1, args.n_layers, 2)), capacity=args.capacity,
                            router_bias=False, router_input="residual", weight_fn="sigmoid",
                            scale_target="update", inference_routing="predictor_threshold",
                            threshold=0.5,
                            predictor=PredictorConfig(type="mlp", hidden_size=args.predictor_hidden,
                                                      activation="silu", bias=True))
    return cfg


def encode_docs(tokenizer_path: str, docs: list) -> list:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_path)
    return [e.ids + [EOS] for e in tok.encode_batch(docs)]


def windows(encoded: list, T: int):
    """The token stream and the offsets where a document starts and T+1 tokens follow."""
    stream, starts = [], []
    for ids in encoded:
        starts.append(len(stream))
        stream.extend(ids)
    starts = [s for s in starts if s + T + 1 <= len(stream)]
    return torch.tensor(stream, dtype=torch.long), starts


def init_weights(model: MoDLlama, n_layers: int) -> None:
    for name, p in model.named_parameters():
        if p.dim() == 2:
            std = 0.02
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                std = 0.02 / math.sqrt(2 * n_layers)
            torch.nn.init.normal_(p, 0.0, std)
        elif "bias" in name:
            torch.nn.init.zeros_(p)


def losses(model: MoDLlama, batch: torch.Tensor, router_aux: float):
    logits, info = model(batch[:, :-1], mode="topk" if model.cfg.mod else "causal")
    lm = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
    pred_bce = torch.zeros(())
    router_bce = torch.zeros(())
    acc = []
    for rec in info.values():
        labels = rec["selected"].float()
        if "pred" in rec:
            pred_bce = pred_bce + F.binary_cross_entropy_with_logits(rec["pred"], labels)
            acc.append(((rec["pred"] > 0) == rec["selected"]).float().mean().item())
        if router_aux > 0:
            router_bce = router_bce + F.binary_cross_entropy_with_logits(rec["s"], labels)
    return lm, pred_bce, router_bce, acc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dense", action="store_true", help="no routed layers (the baseline)")
    ap.add_argument("--d_model", type=int, default=192)
    ap.add_argument("--d_ff", type=int, default=512)
    ap.add_argument("--n_layers", type=int, default=6)
    ap.add_argument("--n_heads", type=int, default=6)
    ap.add_argument("--n_kv_heads", type=int, default=2)
    ap.add_argument("--vocab_size", type=int, default=2048)
    ap.add_argument("--capacity", type=float, default=0.125)
    ap.add_argument("--predictor_hidden", type=int, default=64)
    ap.add_argument("--router_aux", type=float, default=0.1, help="weight of the router BCE")
    ap.add_argument("--seq_len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    train_docs, _ = corpus.split()
    stream, starts = windows(encode_docs(args.tokenizer, train_docs), args.seq_len)
    cfg = demo_config(args)
    model = MoDLlama(cfg)
    init_weights(model, cfg.n_layers)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    log = []
    t0 = time.time()
    print(f"{'dense' if args.dense else 'MoD'}: {n_params} parameters, {len(starts)} windows",
          flush=True)
    for step in range(1, args.steps + 1):
        lr = args.lr * min(1.0, step / args.warmup)
        progress = (step - args.warmup) / max(1, args.steps - args.warmup)
        if step > args.warmup:
            lr = args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for g in opt.param_groups:
            g["lr"] = lr
        batch = torch.stack([stream[s:s + args.seq_len + 1]
                             for s in (rng.choice(starts) for _ in range(args.batch))])
        model.train()
        lm, pred_bce, router_bce, acc = losses(model, batch, args.router_aux)
        loss = lm + pred_bce + args.router_aux * router_bce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0 or step == args.steps:
            rec = {"step": step, "lm_loss": round(lm.item(), 4), "pred_bce": round(pred_bce.item(), 4),
                   "router_bce": round(router_bce.item(), 4), "pred_acc": [round(a, 4) for a in acc],
                   "lr": round(lr, 6), "elapsed_s": round(time.time() - t0, 1)}
            log.append(rec)
            print(json.dumps(rec), flush=True)
    elapsed = time.time() - t0
    model.eval()
    checkpoint.save(model, args.out, dtype=torch.bfloat16, router_dtype=torch.float32)
    if os.path.abspath(os.path.dirname(args.tokenizer)) != os.path.abspath(args.out):
        shutil.copy(args.tokenizer, os.path.join(args.out, "tokenizer.json"))
    meta = {"args": vars(args), "parameters": n_params, "train_seconds": round(elapsed, 1),
            "tokens_seen": args.steps * args.batch * args.seq_len, "torch": torch.__version__,
            "log": log}
    with open(os.path.join(args.out, "training_log.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"done in {elapsed:.0f} s -> {args.out}", flush=True)


if __name__ == "__main__":
    main()
