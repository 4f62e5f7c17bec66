"""The Mixture-of-Depths Llama of DESIGN.md section 2, in plain PyTorch.

Three ways to run it, kept as separate code paths so that they check one another:
  * forward(mode="topk"): training-time expert-choice routing; the selected rows of each routed
    layer are gathered into a compact batch (k = ceil(capacity * T) per sequence).
  * forward(mode="causal"): causal threshold routing over a whole sequence at once; every row runs
    the block and an attention mask hides unselected keys, then only selected rows are updated.
  * IncrementalDecoder: token by token with a sparse per-layer KV cache that holds only the
    tokens routed into each layer.
Not here: speed. It computes in the dtype of its parameters (fp32 to train, fp64 for goldens).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig

ACTIVATIONS = {"silu": nn.SiLU, "gelu": nn.GELU, "relu": nn.ReLU}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """HF rotate-half RoPE. x: [B, n, H, hd]; pos: [B, n] absolute positions.

    Angles are formed in fp64 whatever the compute dtype, so the reference is the accurate side.
    """
    hd = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = pos.to(torch.float64)[..., None] * inv_freq  # [B, n, hd/2]
    ang = torch.cat([ang, ang], dim=-1)[..., None, :]  # [B, n, 1, hd]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def attend(q, k, v, mask):
    """q: [B, n, H, hd]; k, v: [B, m, KV, hd]; mask: [B, n, m] bool (True = may attend)."""
    n_heads, n_kv = q.shape[2], k.shape[2]
    k = k.repeat_interleave(n_heads // n_kv, dim=2)
    v = v.repeat_interleave(n_heads // n_kv, dim=2)
    scores = torch.einsum("bnhd,bmhd->bhnm", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhnm,bmhd->bnhd", probs, v)
    return out.reshape(out.shape[0], out.shape[1], -1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d, hd = cfg.d_model, cfg.head_dim
        self.q_proj = nn.Linear(d, cfg.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, cfg.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, cfg.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * hd, d, bias=False)

    def qkv(self, a, pos):
        """a: [B, n, d] normed input -> rope'd q [B,n,H,hd], k [B,n,KV,hd], v [B,n,KV,hd]."""
        B, n, _ = a.shape
        c = self.cfg
        q = self.q_proj(a).view(B, n, c.n_heads, c.head_dim)
        k = self.k_proj(a).view(B, n, c.n_kv_heads, c.head_dim)
        v = self.v_proj(a).view(B, n, c.n_kv_heads, c.head_dim)
        return rope(q, pos, c.rope_theta), rope(k, pos, c.rope_theta), v


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class Block(nn.Module):
    """One pre-norm Llama block; a routed block also owns its router and optional predictor."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg = cfg
        self.routed = cfg.is_routed(layer)
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)
        if self.routed:
            m = cfg.mod
            self.router = nn.Linear(cfg.d_model, 1, bias=m.router_bias)
            p = m.predictor
            if p is not None and p.type == "mlp":
                self.aux_router = nn.Sequential(nn.Linear(cfg.d_model, p.hidden_size, bias=p.bias),
                                                ACTIVATIONS[p.activation](),
                                                nn.Linear(p.hidden_size, 1, bias=p.bias))
            elif p is not None:
                self.aux_router = nn.Linear(cfg.d_model, 1, bias=p.bias)
            else:
                self.aux_router = None

    # -- routing ---------------------------------------------------------------------------
    def router_score(self, x):
        """s = w . u + b, u = x or RMSNorm_in(x). x: [..., d] -> [...]."""
        u = self.input_layernorm(x) if self.cfg.mod.router_input == "input_layernorm" else x
        return self.router(u).squeeze(-1)

    def predictor_logit(self, x):
        return self.aux_router(x).squeeze(-1)

    def decision_logit(self, x, s):
        """z of DESIGN.md: the router score or the predictor's logit."""
        if self.cfg.mod.inference_routing == "predictor_threshold":
            return self.predictor_logit(x)
        return s

    def combine(self, x, y, s):
        if self.cfg.mod.weight_fn == "one":
            return y  # g = 1: a routed-in token takes the block's output unscaled
        g = torch.sigmoid(s) if self.cfg.mod.weight_fn == "sigmoid" else s
        g = g[..., None]
        if self.cfg.mod.scale_target == "block_output":
            return g * y
        return x + g * (y - x)

    # -- the dense block on some rows ------------------------------------------------------
    def run(self, x, pos, mask, past_k=None, past_v=None):
        """x: [B, n, d] rows; pos: [B, n]; mask: [B, n, m] over keys (past then new).

        Returns the dense block output y [B, n, d] and the new rows' k, v [B, n, KV, hd].
        """
        q, k, v = self.self_attn.qkv(self.input_layernorm(x), pos)
        keys = k if past_k is None else torch.cat([past_k, k], dim=1)
        vals = v if past_v is None else torch.cat([past_v, v], dim=1)
        h = x + self.self_attn.o_proj(attend(q, keys, vals, mask))
        y = h + self.mlp(self.post_attention_layernorm(h))
        return y, k, v


def causal_mask(B: int, T: int, device=None) -> torch.Tensor:
    m = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    return m.expand(B, T, T)


def topk_select(s: torch.Tensor, k: int) -> torch.Tensor:
    """Indices [B, k] of the k largest scores per row, ties to the lower position, ascending."""
    order = torch.sort(-s, dim=-1, stable=True).indices[:, :k]
    return torch.sort(order, dim=-1).values


class MoDLlama(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.model.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.model.norm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.lm_head = None
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def logits(self, x):
        x = self.model.norm(x)
        w = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return x @ w.t()

    def capacity_k(self, T: int, layer: Optional[int] = None) -> int:
        """k = ceil(capacity_l * T): layer `layer`'s capacity (the largest one when None)."""
        c = self.cfg.mod.capacity if layer is None else self.cfg.mod.layer_capacity(layer)
        return min(T, math.ceil(c * T - 1e-9))

    def layer_threshold(self, layer: int, threshold: Optional[float] = None) -> float:
        """tau_l(r) for request threshold r (the config's default when None)."""
        return self.cfg.mod.layer_threshold(layer, threshold)

    def forward(self, tokens: torch.Tensor, mode: str = "causal", threshold: Optional[float] = None,
                selections: Optional[dict] = None):
        """tokens: [B, T] starting at position 0. Returns (logits [B, T, V], info).

        mode "topk": training routing (gather the top-k rows, k from the layer's capacity);
        "causal": threshold routing with masks, layer l selecting sigmoid(z) > tau_l(threshold)
        (DESIGN.md section 2); "masked": masks like "causal" but with the decisions given in
        `selections` ({layer: bool [B, T]}), used to evaluate top-k routing through the mask path.
        info[layer] holds s (router score), z, prob = sigmoid(z), tau (tau_l), selected, and for
        "topk" the predictor logit on a detached input.
        """
        B, T = tokens.shape
        x = self.model.embed_tokens(tokens)
        pos = torch.arange(T, device=tokens.device).expand(B, T)
        mask = causal_mask(B, T, tokens.device)
        eye = torch.eye(T, dtype=torch.bool, device=tokens.device)
        info = {}
        for l, blk in enumerate(self.model.layers):
            if not blk.routed:
                x, _, _ = blk.run(x, pos, mask)
                continue
            s = blk.router_score(x)
            rec = {"s": s}
            if mode == "topk":
                k = self.capacity_k(T, l)
                idx = topk_select(s, k)  # [B, k]
                sel = torch.zeros(B, T, dtype=torch.bool, device=x.device)
                sel.scatter_(1, idx, True)
                gidx = idx[..., None].expand(B, k, x.shape[-1])
                xs = x.gather(1, gidx)
                y, _, _ = blk.run(xs, idx, causal_mask(B, k, x.device))
                new = blk.combine(xs, y, s.gather(1, idx))
                if blk.aux_router is not None:
                    # The predictor learns on a stop-gradient input: it never shapes the model.
                    rec["pred"] = blk.predictor_logit(x.detach())
                x = x.scatter(1, gidx, new)
                rec["selected"] = sel
            else:
                z = blk.decision_logit(x, s)
                rec["z"] = z
                rec["prob"] = torch.sigmoid(z)
                rec["tau"] = self.layer_threshold(l, threshold)
                sel = rec["prob"] > rec["tau"] if mode == "causal" else selections[l]
                kmask = mask & (sel[:, None, :] | eye)
                y, _, _ = blk.run(x, pos, kmask)
                x = torch.where(sel[..., None], blk.combine(x, y, s), x)
                rec["selected"] = sel
            info[l] = rec
        return self.logits(x), info


class IncrementalDecoder:
    """Runs one sequence token by token; layer l's cache holds only tokens routed into l."""

    def __init__(self, model: MoDLlama, threshold: Optional[float] = None):
        self.m = model
        cfg = model.cfg
        # The request threshold r, and each routed layer's tau_l(r).
        self.tau = threshold if threshold is not None else (cfg.mod.threshold if cfg.mod else 0.5)
        self.layer_tau = {l: model.layer_threshold(l, self.tau)
                          for l in range(cfg.n_layers) if cfg.is_routed(l)}
        self.k = [None] * cfg.n_layers  # [1, m_l, KV, hd] per layer
        self.v = [None] * cfg.n_layers
        self.n = 0  # tokens consumed = next absolute position
        self.decisions = {l: [] for l in range(cfg.n_layers) if cfg.is_routed(l)}
        self.probs = {l: [] for l in self.decisions}

    def kv_tokens(self, layer: int) -> int:
        return 0 if self.k[layer] is None else self.k[layer].shape[1]

    @torch.no_grad()
    def step(self, token: int) -> torch.Tensor:
        """Feeds one token at the next position; returns its logits [V]."""
        dev = self.m.model.embed_tokens.weight.device
        x = self.m.model.embed_tokens(torch.tensor([[token]], device=dev))  # [1, 1, d]
        pos = torch.tensor([[self.n]], device=dev)
        for l, blk in enumerate(self.m.model.layers):
            if blk.routed:
                s = blk.router_score(x)
                prob = torch.sigmoid(blk.decision_logit(x, s))
                selected = bool(prob.item() > self.layer_tau[l])
                self.decisions[l].append(selected)
                self.probs[l].append(prob.item())
                if not selected:
                    continue  # x' = x, and nothing is written to layer l's cache
            m = self.kv_tokens(l) + 1
            mask = torch.ones(1, 1, m, dtype=torch.bool, device=dev)
            y, k, v = blk.run(x, pos, mask, self.k[l], self.v[l])
            self.k[l] = k if self.k[l] is None else torch.cat([self.k[l], k], dim=1)
            self.v[l] = v if self.v[l] is None else torch.cat([self.v[l], v], dim=1)
            x = blk.combine(x, y, s) if blk.routed else y
        self.n += 1
        return self.m.logits(x)[0, 0]
