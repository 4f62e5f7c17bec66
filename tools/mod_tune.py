"""Router-tunes a frozen dense Llama into a Mixture-of-Depths model and writes a MoD adapter.

The dense weights never change. Per routed layer l a router s = w_l . RMSNorm_in(x) + b_l is
trained (DESIGN.md section 2, router input "input_layernorm"); a token enters the layer when
sigmoid(s) > tau_l and then takes the block's output unscaled (weight_fn "one"): a pretrained
block's update is never shrunk, so whatever the router chooses to run runs exactly as in the dense
model. A skipped token keeps x and is absent from the layer's keys, as at serving time. The
router itself is the causal decision rule (inference_routing "router_threshold": it sees only
the token's own state), so no separate predictor is needed.

Stages (their outputs live under --work; collect and train resume from their last checkpoint,
the others take seconds to minutes and simply rerun):
  collect    one dense pass over the training windows: the teacher's top-K next-token
             log-probabilities, and per layer the token-level block influence 1 - cos(x, y) with
             least-squares statistics of its logarithm on the router input
  fit        initial routers: each layer's ridge regression of log influence (first tokens, the
             attention sink, weighted in at the largest influence), shifted and scaled so that
             sigmoid(s) > 0.5 keeps about the layer's capacity
  train      end to end on the routed model: KL to the teacher's next-token distribution; the
             hard decision s > 0 is used forward and sigmoid(s) carries the gradient
             (straight-through); after each step a controller moves each router's bias so the
             routed fraction tracks the layer's capacity (the compute term)
  calibrate  per-layer thresholds on calibration windows never trained on: layer by layer in a
             causal pass, tau_l = the sigmoid of the (1 - capacity_l) quantile of the scores
  export     the adapter directory: config.json {base_model (relative), mod} and
             adapter.safetensors (DESIGN.md section 3.2)
tools/mod_eval.py then measures the adapter against its base on held-out text.

Data: training windows from Debian's fortunes (tools/corpus.py training split, documents joined
by <|endoftext|>); calibration windows from the fortunes held-out split. The evaluation text
(The Jargon File, tools/fetch_eval_text.sh) is read by no stage here.

  .venv/bin/python tools/mod_tune.py all --base models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
      --work /tmp/tune --out models/smollm2-mod --layers 4-23,25-28 --capacity influence:0.45:0.9

Runs on the CPU in float32, one thread by default (--threads); deterministic for a given seed,
thread count and machine. Progress (a text bar with the time left) goes to stdout and
--work/log.txt, one line per chunk or step.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)
import corpus  # noqa: E402
from modref import checkpoint  # noqa: E402
from modref.config import ModConfig  # noqa: E402
from modref.model import MoDLlama, causal_mask, topk_select  # noqa: E402

EVAL_TEXT = os.path.join(ROOT, "models", "eval", "jargon-4.4.7.txt")
DOC_SEPARATOR = "<|endoftext|>"


# ---------------------------------------------------------------------------------------------
# logging and files

class Log:
    def __init__(self, work: str):
        os.makedirs(work, exist_ok=True)
        self.path = os.path.join(work, "log.txt")

    def __call__(self, msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        print(line, flush=True)
        with open(self.path, "a") as f:
            f.write(line + "\n")


def bar(done: int, total: int, width: int = 24) -> str:
    """A text progress bar, one line per update (it reads well in a log file too)."""
    n = width * done // max(1, total)
    return f"[{'#' * n}{'.' * (width - n)}] {done}/{total}"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def save_atomic(obj, path: str) -> None:
    tmp = path + ".part"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def write_json(obj, path: str) -> None:
    tmp = path + ".part"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# tokenizer and data

def gguf_tokenizer(path: str):
    """A `tokenizers` Tokenizer for a GGUF file's byte-level BPE vocabulary (tokenizer.ggml.model
    "gpt2"; pre-tokenizer "smollm" or "gpt2"/"default"). Control tokens are matched literally."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from modref import gguf_io
    f = gguf_io.GgufFile(path)
    if f.get("tokenizer.ggml.model") != "gpt2":
        raise SystemExit(f"{path}: tokenizer.ggml.model {f.get('tokenizer.ggml.model')!r}; only "
                         f"byte-level BPE (gpt2) vocabularies are supported here")
    pre = f.get("tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        pt = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("gpt2", "default"):
        pt = byte_level
    else:
        raise SystemExit(f"{path}: tokenizer.ggml.pre {pre!r} is not supported here")
    tokens = f.get("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in f.get("tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
    tok.pre_tokenizer = pt
    tok.decoder = decoders.ByteLevel()
    types = f.get("tokenizer.ggml.token_type")
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, ty in enumerate(types) if ty == 3])
    return tok


def load_tokenizer(base: str):
    if os.path.isfile(base):
        return gguf_tokenizer(base)
    from tokenizers import Tokenizer
    return Tokenizer.from_file(os.path.join(base, "tokenizer.json"))


def pack_windows(tok, docs: list, T: int, n: int, seed: int) -> torch.Tensor:
    """n windows of T tokens; each starts at a document start and holds documents joined by the
    separator token, the last one cut at T. Documents are taken in a seeded order."""
    sep = tok.token_to_id(DOC_SEPARATOR)
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    out, cur, i = [], [], 0
    while len(out) < n:
        if i == len(order):
            raise SystemExit(f"the corpus holds fewer than {n} windows of {T} tokens")
        ids = tok.encode(docs[order[i]], add_special_tokens=False).ids
        i += 1
        cur.extend(ids + ([sep] if sep is not None else []))
        if len(cur) >= T:
            out.append(cur[:T])
            cur = []
    return torch.tensor(out, dtype=torch.long)


def eval_windows(tok, T: int, n: int) -> torch.Tensor:
    """n windows of T tokens spread evenly over The Jargon File after its front matter (the
    first 5%), each read as an independent text."""
    if not os.path.exists(EVAL_TEXT):
        raise SystemExit(f"{EVAL_TEXT} is missing: run tools/fetch_eval_text.sh")
    ids = tok.encode(open(EVAL_TEXT, encoding="utf-8").read(), add_special_tokens=False).ids
    start = len(ids) // 20
    span = len(ids) - start - T
    if span < n * T:
        raise SystemExit(f"{EVAL_TEXT}: {len(ids)} tokens, too few for {n} windows of {T}")
    step = span // n
    return torch.tensor([ids[start + k * step:start + k * step + T] for k in range(n)])


# ---------------------------------------------------------------------------------------------
# the routed forward pass used for training and calibration

def parse_layers(spec: str, n_layers: int) -> list:
    out = []
    for part in spec.split(","):
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        elif part:
            out.append(int(part))
    for l in out:
        if not 0 <= l < n_layers:
            raise SystemExit(f"--layers: layer {l} outside [0, {n_layers})")
    return sorted(set(out))


def parse_capacities(spec: str, layers: list, work: str) -> list:
    """One number for every routed layer, a comma list with one per layer, "a:b": linear from
    a at the first routed layer to b at the last (layered capacity), or "influence:a:b": linear
    in the rank of the layer's mean block influence measured by collect (a for the layer whose
    block changes the residual stream least, b for the one that changes it most)."""
    if spec.startswith("influence:"):
        a, b = (float(v) for v in spec.split(":")[1:])
        path = os.path.join(work, "collect.json")
        if not os.path.exists(path):
            return [0.5 * (a + b)] * len(layers)  # collect has not run yet: it does not need them
        bi = json.load(open(path))["block_influence_mean"]
        order = sorted(layers, key=lambda l: bi[l])
        n = len(layers)
        rank = {l: i for i, l in enumerate(order)}
        return [float(f"{a + (b - a) * (rank[l] / max(1, n - 1)):.4g}") for l in layers]
    if ":" in spec:
        a, b = (float(v) for v in spec.split(":"))
        n = len(layers)
        return [a + (b - a) * (i / max(1, n - 1)) for i in range(n)]
    vals = [float(v) for v in spec.split(",")]
    if len(vals) == 1:
        return vals * len(layers)
    if len(vals) != len(layers):
        raise SystemExit(f"--capacity has {len(vals)} values for {len(layers)} routed layers")
    return vals


class Routers(nn.Module):
    """One Linear(d_model, 1, bias) per routed layer, on RMSNorm_in(x)."""

    def __init__(self, d_model: int, layers: list):
        super().__init__()
        self.layers = list(layers)
        self.lin = nn.ModuleDict({str(l): nn.Linear(d_model, 1, bias=True) for l in layers})

    def score(self, l: int, blk, x: torch.Tensor) -> torch.Tensor:
        return self.lin[str(l)](blk.input_layernorm(x)).squeeze(-1)


def routed_forward(dense: MoDLlama, routers: Routers, tokens: torch.Tensor, thresholds=None,
                   straight_through: bool = False, calibrate: dict | None = None):
    """Logits [B, T, V] and per routed layer (scores [B, T], selected [B, T] bool).

    A token enters layer l when s > thresholds[l] (logit units; 0 when None). With
    straight_through the combine is x + m (y - x), m = hard + sigmoid(s) - sigmoid(s).detach():
    forward exactly the hard routing, backward the sigmoid's gradient. With `calibrate`
    ({layer: capacity}) each layer's threshold is first set to the (1 - capacity) quantile of its
    scores on this batch, given the routing of the layers before it; the chosen thresholds are
    written back into `calibrate` as (layer, threshold) pairs under key "thresholds".
    """
    B, T = tokens.shape
    x = dense.model.embed_tokens(tokens)
    pos = torch.arange(T).expand(B, T)
    mask = causal_mask(B, T)
    eye = torch.eye(T, dtype=torch.bool)
    info = {}
    for l, blk in enumerate(dense.model.layers):
        if str(l) not in routers.lin:
            x, _, _ = blk.run(x, pos, mask)
            continue
        s = routers.score(l, blk, x)
        if calibrate is not None:
            flat = s.detach().flatten().double()
            q = torch.quantile(flat, 1.0 - calibrate[l]).item()
            calibrate.setdefault("thresholds", {})[l] = q
            th = q
        else:
            th = 0.0 if thresholds is None else thresholds[l]
        sel = s > th
        kmask = mask & (sel[:, None, :] | eye)
        y, _, _ = blk.run(x, pos, kmask)
        if straight_through:
            soft = torch.sigmoid(s - th)
            m = sel.to(x.dtype) + soft - soft.detach()
            x = x + m[..., None] * (y - x)
        else:
            x = torch.where(sel[..., None], y, x)
        info[l] = (s, sel)
    return dense.logits(x), info


def kl_to_teacher(logits: torch.Tensor, top_ids: torch.Tensor, top_lp: torch.Tensor):
    """KL(teacher || student) per token with the teacher known on its top-K ids plus one bucket
    for the rest of the vocabulary. logits [N, V]; top_ids, top_lp [N, K]."""
    lq = torch.log_softmax(logits, dim=-1)
    lq_k = lq.gather(-1, top_ids)
    p_k = top_lp.exp()
    p_rest = (1.0 - p_k.sum(-1)).clamp_min(1e-8)
    q_rest = (1.0 - lq_k.exp().sum(-1)).clamp_min(1e-8)
    return (p_k * (top_lp - lq_k)).sum(-1) + p_rest * (p_rest.log() - q_rest.log())


# ---------------------------------------------------------------------------------------------
# stages

def load_dense(base: str) -> MoDLlama:
    model = checkpoint.load_base(base, dtype=torch.float32)
    if model.cfg.mod is not None:
        raise SystemExit(f"{base}: the base model must be dense")
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def stage_collect(args, log, dense, tok) -> None:
    """Teacher top-K and block-influence statistics over the training windows, in chunks."""
    cdir = os.path.join(args.work, "collect")
    os.makedirs(cdir, exist_ok=True)
    windows = pack_windows(tok, corpus.split()[0], args.seq_len, args.train_windows, args.seed)
    L, d = dense.cfg.n_layers, dense.cfg.d_model
    state_path = os.path.join(cdir, "state.pt")
    if os.path.exists(state_path):
        state = torch.load(state_path)
    else:
        state = {"done": 0, "A": torch.zeros(L, d + 1, d + 1, dtype=torch.float64),
                 "b": torch.zeros(L, d + 1, dtype=torch.float64),
                 "yy": torch.zeros(L, dtype=torch.float64), "n": 0,
                 "bi_sum": torch.zeros(L, dtype=torch.float64),
                 "bi_pos0": torch.zeros(L, dtype=torch.float64)}
    chunk = args.chunk
    n_chunks = math.ceil(args.train_windows / chunk)
    t0 = time.time()
    first = state["done"]
    for c in range(state["done"], n_chunks):
        tokens = windows[c * chunk:(c + 1) * chunk]
        B, T = tokens.shape
        with torch.no_grad():
            x = dense.model.embed_tokens(tokens)
            pos = torch.arange(T).expand(B, T)
            mask = causal_mask(B, T)
            bis = []
            for l, blk in enumerate(dense.model.layers):
                u = blk.input_layernorm(x).reshape(-1, d).double()
                y, _, _ = blk.run(x, pos, mask)
                bi = (1.0 - F.cosine_similarity(x, y, dim=-1)).clamp_min(1e-6)
                # The first token of a window is the attention sink: its own update is tiny,
                # but every later token attends to it, so skipping it costs the most. Its
                # target is the largest influence there is.
                target = bi.clone()
                target[:, 0] = 1.0
                t = target.log().reshape(-1).double()
                u1 = torch.cat([u, torch.ones(u.shape[0], 1, dtype=torch.float64)], dim=1)
                state["A"][l] += u1.t() @ u1
                state["b"][l] += u1.t() @ t
                state["yy"][l] += (t * t).sum()
                state["bi_sum"][l] += bi.sum().double()
                state["bi_pos0"][l] += bi[:, 0].sum().double()
                bis.append(bi.half())
                x = y
            chunk_path = os.path.join(cdir, f"chunk{c:04d}.pt")
            if not os.path.exists(chunk_path):  # else kept from a run before (the same teacher)
                lp = torch.log_softmax(dense.logits(x), dim=-1)
                top_lp, top_ids = lp.topk(args.top_k, dim=-1)
                save_atomic({"tokens": tokens, "top_ids": top_ids.int(), "top_lp": top_lp.float(),
                             "bi": torch.stack(bis)}, chunk_path)
        state["n"] += B * T
        state["done"] = c + 1
        save_atomic(state, state_path)
        el = time.time() - t0
        log(f"collect {bar(c + 1, n_chunks)} chunks, {state['n']} tokens, {el:.0f} s, "
            f"eta {el / (c + 1 - first) * (n_chunks - c - 1):.0f} s")
    bi_mean = (state["bi_sum"] / state["n"]).tolist()
    write_json({"tokens": state["n"], "block_influence_mean": bi_mean,
                "block_influence_pos0": (state["bi_pos0"] / (state["n"] / args.seq_len)).tolist()},
               os.path.join(args.work, "collect.json"))
    log("collect: mean block influence per layer " +
        " ".join(f"{l}:{v:.3f}" for l, v in enumerate(bi_mean)))


def sink_inputs(dense, tok, args) -> list:
    """Per layer, the router inputs [N, d + 1] (with the constant) of first tokens: the first
    token of each training window and a seeded sample of the vocabulary, each fed alone (a first
    token's state depends on nothing else)."""
    windows = pack_windows(tok, corpus.split()[0], args.seq_len, args.train_windows, args.seed)
    gen = torch.Generator().manual_seed(args.seed + 2)
    ids = torch.cat([windows[:, 0], torch.randint(0, dense.cfg.vocab_size, (args.sink_sample,),
                                                  generator=gen)])
    x = dense.model.embed_tokens(ids[:, None])
    pos = torch.zeros(ids.shape[0], 1, dtype=torch.long)
    mask = causal_mask(ids.shape[0], 1)
    out = []
    with torch.no_grad():
        for blk in dense.model.layers:
            u = blk.input_layernorm(x).reshape(-1, dense.cfg.d_model).double()
            out.append(torch.cat([u, torch.ones(u.shape[0], 1, dtype=torch.float64)], dim=1))
            x, _, _ = blk.run(x, pos, mask)
    return out


def stage_fit(args, log, dense, tok) -> Routers:
    """Ridge regression of log block influence on [RMSNorm_in(x), 1] per routed layer, turned
    into a router whose score is in units of the prediction's standard deviation, 0 at the
    Gaussian (1 - capacity) quantile. First tokens (the attention sink) enter the regression with
    weight --sink_weight at the largest target, so that the router keeps them."""
    state = torch.load(os.path.join(args.work, "collect", "state.pt"))
    d = dense.cfg.d_model
    routers = Routers(d, args.layer_list)
    n = state["n"]
    sinks = sink_inputs(dense, tok, args)
    with torch.no_grad():
        for l, cap in zip(args.layer_list, args.capacity_list):
            A = state["A"][l] + args.sink_weight * sinks[l].t() @ sinks[l]
            b = state["b"][l]  # the sink rows' target, log 1, adds nothing
            lam = args.ridge * torch.diagonal(A)[:d].mean()
            reg = torch.eye(d + 1, dtype=torch.float64) * lam
            reg[d, d] = 0.0
            w = torch.linalg.solve(A + reg, b)
            A0 = state["A"][l]  # the training tokens alone
            mean_u = A0[d, :] / n  # E[u1]
            cov = A0 / n - torch.outer(mean_u, mean_u)
            mu = (w @ mean_u).item()
            sd = math.sqrt(max((w @ cov @ w).item(), 1e-12))
            z = torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(1.0 - cap)).item()
            lin = routers.lin[str(l)]
            lin.weight.copy_((w[:d] / sd).float()[None])
            lin.bias.copy_(torch.tensor([(w[d].item() - mu) / sd - z]).float())
            kept = (lin(sinks[l][:, :d].float()).squeeze(-1) > 0).float().mean().item()
            log(f"fit layer {l}: capacity {cap:.3f}, prediction sd {sd:.3f} (log influence), "
                f"first tokens kept {100 * kept:.0f}%")
    save_atomic(routers.state_dict(), os.path.join(args.work, "routers_fit.pt"))
    return routers


def stage_train(args, log, dense) -> None:
    cdir = os.path.join(args.work, "collect")
    chunks = sorted(f for f in os.listdir(cdir) if f.startswith("chunk"))
    data = [torch.load(os.path.join(cdir, f)) for f in chunks]
    tokens = torch.cat([c["tokens"] for c in data])
    top_ids = torch.cat([c["top_ids"] for c in data]).long()
    top_lp = torch.cat([c["top_lp"] for c in data])
    routers = Routers(dense.cfg.d_model, args.layer_list)
    ckpt_path = os.path.join(args.work, "train_ckpt.pt")
    opt = torch.optim.Adam([p for n_, p in routers.named_parameters() if n_.endswith("weight")],
                           lr=args.lr, betas=(0.9, 0.99))
    step = 0
    hist = []
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path)
        routers.load_state_dict(ck["routers"])
        opt.load_state_dict(ck["opt"])
        step, hist = ck["step"], ck["hist"]
        log(f"train: resumed at step {step}")
    else:
        routers.load_state_dict(torch.load(os.path.join(args.work, "routers_fit.pt")))
    caps = dict(zip(args.layer_list, args.capacity_list))
    n_win = tokens.shape[0]
    gen = torch.Generator().manual_seed(args.seed)
    perm = []
    for _ in range(math.ceil(args.steps * args.batch / n_win) + 1):
        perm.extend(torch.randperm(n_win, generator=gen).tolist())
    t0 = time.time()
    start_step = step
    while step < args.steps:
        idx = perm[step * args.batch:(step + 1) * args.batch]
        lr = args.lr * min(1.0, (step + 1) / max(1, args.warmup))
        for g in opt.param_groups:
            g["lr"] = lr
        logits, info = routed_forward(dense, routers, tokens[idx], straight_through=True)
        V = logits.shape[-1]
        kl = kl_to_teacher(logits.reshape(-1, V), top_ids[idx].reshape(-1, args.top_k),
                           top_lp[idx].reshape(-1, args.top_k)).mean()
        opt.zero_grad(set_to_none=True)
        kl.backward()
        opt.step()
        fracs = {}
        with torch.no_grad():
            for l, (s, sel) in info.items():
                f = sel.float().mean().item()
                fracs[l] = f
                # The compute term: the bias follows the capacity error (integral control).
                routers.lin[str(l)].bias -= args.bias_rate * (f - caps[l])
        step += 1
        skipped = sum(1.0 - f for f in fracs.values()) / dense.cfg.n_layers
        hist.append({"step": step, "kl": kl.item(), "skipped": skipped})
        el = time.time() - t0
        eta = el / (step - start_step) * (args.steps - step)
        log(f"train {bar(step, args.steps)} kl {kl.item():.4f} skipped {100 * skipped:.1f}% "
            f"lr {lr:.2e} {el:.0f} s eta {eta:.0f} s")
        if step % args.save_every == 0 or step == args.steps:
            save_atomic({"routers": routers.state_dict(), "opt": opt.state_dict(), "step": step,
                         "hist": hist}, ckpt_path)
    save_atomic(routers.state_dict(), os.path.join(args.work, "routers_train.pt"))


def trained_routers(args, dense) -> Routers:
    routers = Routers(dense.cfg.d_model, args.layer_list)
    name = "routers_train.pt" if os.path.exists(os.path.join(args.work, "routers_train.pt")) \
        else "routers_fit.pt"
    routers.load_state_dict(torch.load(os.path.join(args.work, name)))
    return routers


def stage_calibrate(args, log, dense, tok) -> dict:
    routers = trained_routers(args, dense)
    held = corpus.split()[1]
    windows = pack_windows(tok, held, args.seq_len, args.calib_windows, args.seed + 1)
    caps = dict(zip(args.layer_list, args.capacity_list))
    with torch.no_grad():
        _, _ = routed_forward(dense, routers, windows, calibrate=caps)
    th = caps["thresholds"]
    out = {str(l): th[l] for l in args.layer_list}
    write_json(out, os.path.join(args.work, "thresholds.json"))
    log("calibrate: thresholds (logit) " + " ".join(f"{l}:{th[l]:.3f}" for l in args.layer_list))
    return out


def stage_export(args, log, dense) -> None:
    routers = trained_routers(args, dense)
    th = json.load(open(os.path.join(args.work, "thresholds.json")))
    cfg = dense.cfg
    cfg.mod = ModConfig(routed_layers=list(args.layer_list), capacities=list(args.capacity_list),
                        router_bias=True, router_input="input_layernorm", weight_fn="one",
                        scale_target="update", inference_routing="router_threshold",
                        threshold=0.5,
                        layer_thresholds=[float(f"{1.0 / (1.0 + math.exp(-th[str(l)])):.9g}")
                                          for l in args.layer_list])
    model = MoDLlama(cfg)
    state = {}
    for l in args.layer_list:
        state[f"model.layers.{l}.router.weight"] = routers.lin[str(l)].weight.detach().clone()
        state[f"model.layers.{l}.router.bias"] = routers.lin[str(l)].bias.detach().clone()
    model.load_state_dict(state, strict=False)
    base_rel = os.path.relpath(os.path.abspath(args.base), os.path.abspath(args.out))
    checkpoint.save_adapter(model, args.out, base_rel)
    cfg.mod = None
    log(f"export: wrote {args.out} (base {base_rel})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("stage", choices=["collect", "fit", "train", "calibrate", "export", "all"])
    ap.add_argument("--base", default=os.path.join(ROOT, "models", "smollm2",
                                                   "SmolLM2-135M-Instruct.Q4_1.gguf"),
                    help="dense base model: a GGUF file or a checkpoint directory")
    ap.add_argument("--work", required=True, help="working directory (resumable state)")
    ap.add_argument("--out", help="adapter directory to write (export)")
    ap.add_argument("--layers", default="2-28", help="routed layers, e.g. 2-28 or 4,6,8")
    ap.add_argument("--capacity", default="0.7",
                    help="capacity per routed layer: one value, a list, a:b (linear in depth) or "
                         "influence:a:b (linear in the rank of the measured block influence)")
    ap.add_argument("--seq_len", type=int, default=256)
    ap.add_argument("--train_windows", type=int, default=128)
    ap.add_argument("--calib_windows", type=int, default=32)
    ap.add_argument("--chunk", type=int, default=4, help="windows per collect chunk")
    ap.add_argument("--top_k", type=int, default=64, help="teacher log-probabilities kept")
    ap.add_argument("--ridge", type=float, default=1e-2)
    ap.add_argument("--sink_weight", type=float, default=10.0,
                    help="regression weight of a first token (the attention sink)")
    ap.add_argument("--sink_sample", type=int, default=224,
                    help="vocabulary ids fed alone as first tokens for the sink rows")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--bias_rate", type=float, default=2.0,
                    help="bias step per unit of routed-fraction error (compute term)")
    ap.add_argument("--save_every", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    log = Log(args.work)
    dense = load_dense(args.base)
    args.layer_list = parse_layers(args.layers, dense.cfg.n_layers)
    args.capacity_list = parse_capacities(args.capacity, args.layer_list, args.work)
    write_json({k: v for k, v in vars(args).items()}, os.path.join(args.work, "args.json"))
    tok = load_tokenizer(args.base)
    stages = ["collect", "fit", "train", "calibrate", "export"] \
        if args.stage == "all" else [args.stage]
    for st in stages:
        t0 = time.time()
        if st == "collect":
            stage_collect(args, log, dense, tok)
        elif st == "fit":
            stage_fit(args, log, dense, tok)
        elif st == "train":
            stage_train(args, log, dense)
        elif st == "calibrate":
            stage_calibrate(args, log, dense, tok)
        elif st == "export":
            stage_export(args, log, dense)
        log(f"stage {st} done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
