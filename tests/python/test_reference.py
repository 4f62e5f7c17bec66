"""The reference's own invariants: causal routing is the same whole or token by token, top-k
picks exactly k, and the gather and mask implementations of a routing agree."""
import math

import pytest
import torch

import variants
from modref.model import IncrementalDecoder, topk_select

MOD_VARIANTS = [n for n, (o, _, _) in variants.VARIANTS.items() if "mod" in o]


def prompt(vocab, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (1, n), generator=g)


@pytest.mark.parametrize("name", list(variants.VARIANTS))
@pytest.mark.parametrize("threshold", [None, 0.3])
def test_full_sequence_equals_token_by_token(name, threshold):
    model = variants.random_model(name).double()
    if model.cfg.mod is None and threshold is not None:
        pytest.skip("dense model has no threshold")
    tokens = prompt(model.cfg.vocab_size, 70, seed=3)
    full, info = model(tokens, mode="causal", threshold=threshold)
    dec = IncrementalDecoder(model, threshold)
    steps = torch.stack([dec.step(int(t)) for t in tokens[0]])
    assert torch.allclose(full[0], steps, atol=1e-10, rtol=0)
    for l, rec in info.items():
        assert rec["selected"][0].tolist() == dec.decisions[l]
        # The layer's sparse cache holds exactly the tokens routed into it.
        assert dec.kv_tokens(l) == sum(dec.decisions[l])
    for l in range(model.cfg.n_layers):
        if not model.cfg.is_routed(l):
            assert dec.kv_tokens(l) == tokens.shape[1]


@pytest.mark.parametrize("name", MOD_VARIANTS)
def test_routing_is_mixed(name):
    """Guards the other tests: a variant whose layers all skip or all compute proves little."""
    model = variants.random_model(name).double()
    _, info = model(prompt(model.cfg.vocab_size, 200, seed=5), mode="causal")
    for l, rec in info.items():
        frac = rec["selected"].double().mean().item()
        assert 0.02 < frac < 0.98, (l, frac)


@pytest.mark.parametrize("T", [1, 7, 8, 9, 64, 100])
@pytest.mark.parametrize("name", MOD_VARIANTS)
def test_topk_picks_exactly_k(name, T):
    model = variants.random_model(name)
    tokens = torch.cat([prompt(model.cfg.vocab_size, T, seed=s) for s in range(3)])
    _, info = model(tokens, mode="topk")
    for l, rec in info.items():
        k = math.ceil(model.cfg.mod.layer_capacity(l) * T - 1e-9)  # the layer's own capacity
        assert rec["selected"].sum(-1).tolist() == [k] * 3
        # The selected tokens are the k highest scores.
        s = rec["s"]
        for b in range(3):
            sel, rest = s[b][rec["selected"][b]], s[b][~rec["selected"][b]]
            if rest.numel():
                assert sel.min() >= rest.max()


def test_topk_ties_go_to_lower_positions():
    s = torch.tensor([[0.5, 1.0, 0.5, 1.0, 0.5, 0.2]])
    assert topk_select(s, 1).tolist() == [[1]]
    assert topk_select(s, 3).tolist() == [[0, 1, 3]]
    assert topk_select(s, 4).tolist() == [[0, 1, 2, 3]]


@pytest.mark.parametrize("name", MOD_VARIANTS)
def test_topk_gather_equals_mask_path(name):
    model = variants.random_model(name).double()
    tokens = torch.cat([prompt(model.cfg.vocab_size, 40, seed=s) for s in range(2)])
    gathered, info = model(tokens, mode="topk")
    masked, _ = model(tokens, mode="masked",
                      selections={l: r["selected"] for l, r in info.items()})
    assert torch.allclose(gathered, masked, atol=1e-10, rtol=0)


def test_threshold_is_the_compute_knob():
    model = variants.random_model("predictor_mlp_silu_bf16").double()
    tokens = prompt(model.cfg.vocab_size, 120, seed=9)
    fracs = []
    for tau in (0.2, 0.5, 0.8):
        _, info = model(tokens, mode="causal", threshold=tau)
        fracs.append(sum(r["selected"].sum().item() for r in info.values()))
    assert fracs[0] > fracs[1] > fracs[2]


def test_layer_thresholds_shift_along_the_logit_axis():
    """tau_l(r) of DESIGN.md section 2, and per-layer thresholds in the causal pass."""
    model = variants.random_model("per_layer_one_predictor").double()
    mod = model.cfg.mod
    assert mod.routed_layers == [1, 2, 3]
    assert mod.capacities == [0.75, 0.5, 0.25]  # given for [3, 1, 2], kept in layer order
    assert mod.layer_thresholds == [0.35, 0.5, 0.62]
    assert model.layer_threshold(1) == 0.35
    assert model.layer_threshold(2, 0.3) == 0.3  # tau_l == tau_0 follows the request
    logit = lambda p: math.log(p / (1 - p))
    t = model.layer_threshold(3, 0.3)
    assert abs(logit(t) - (logit(0.62) + logit(0.3) - logit(0.5))) < 1e-12
    tokens = prompt(model.cfg.vocab_size, 60, seed=3)
    _, info = model(tokens, mode="causal", threshold=0.3)
    for l, rec in info.items():
        assert rec["tau"] == model.layer_threshold(l, 0.3)
        assert torch.equal(rec["selected"], rec["prob"] > rec["tau"])
