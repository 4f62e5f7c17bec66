"""tools/mod_oracle.py: the oracle's skips are counted right and cost nothing when it keeps all."""
import math
import os

import torch

import mod_oracle
import mod_tune
from modref.model import causal_mask

DENSE = os.path.join(mod_tune.ROOT, "tests", "testdata", "checkpoints", "dense")


def setup():
    dense = mod_tune.load_dense(DENSE)
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(3, dense.cfg.vocab_size, (2, 40), generator=g)
    return dense, tokens


def dense_logits(dense, tokens, drop=()):
    B, T = tokens.shape
    x = dense.model.embed_tokens(tokens)
    pos = torch.arange(T).expand(B, T)
    for l, blk in enumerate(dense.model.layers):
        if l not in drop:
            x, _, _ = blk.run(x, pos, causal_mask(B, T))
    return dense.logits(x)


def test_keeping_every_token_is_the_dense_model():
    dense, tokens = setup()
    want = dense_logits(dense, tokens)
    with torch.no_grad():
        for policy in ("token", "grad"):
            got, skipped = mod_oracle.oracle_forward(dense, tokens, {1, 2}, policy, 1.0, set())
            assert skipped == 0
            assert torch.allclose(got, want, atol=1e-5, rtol=0)
        got, skipped = mod_oracle.oracle_forward(dense, tokens, {1, 2}, "global", 0.0, set())
        assert skipped == 0
        assert torch.allclose(got, want, atol=1e-5, rtol=0)


def test_token_policy_skips_the_capacity_complement_and_keeps_position_zero():
    dense, tokens = setup()
    B, T = tokens.shape
    k = math.ceil(0.6 * T)
    with torch.no_grad():
        for policy in ("token", "grad"):
            _, skipped = mod_oracle.oracle_forward(dense, tokens, {0, 2, 3}, policy, 0.6, set())
            # Per layer and row: T - k skipped, one fewer when position 0 was not among the top k.
            assert 3 * B * (T - k - 1) <= skipped <= 3 * B * (T - k)


def test_whole_layers_skipped_are_removed_layers():
    dense, tokens = setup()
    B, T = tokens.shape
    with torch.no_grad():
        got, skipped = mod_oracle.oracle_forward(dense, tokens, {1, 2, 3}, "layers", 2, {1, 3})
    assert skipped == 2 * B * T
    assert torch.allclose(got, dense_logits(dense, tokens, drop={1, 3}), atol=1e-5, rtol=0)


def test_oracle_routing_is_the_reference_mod_model_with_those_decisions():
    # The reference's MoD model (weight_fn "one", the adapter test checkpoint over the same dense
    # weights) fed the oracle's decisions through its "masked" path gives the oracle's logits:
    # a skipped token keeps its state and is absent from the layer's keys, as at serving time.
    from modref import checkpoint

    dense, tokens = setup()
    mod = checkpoint.load(os.path.join(mod_tune.ROOT, "tests", "testdata", "checkpoints",
                                       "adapter_per_layer_router"), dtype=torch.float32)
    assert mod.cfg.mod.weight_fn == "one"
    routed = set(mod.cfg.mod.routed_layers)
    with torch.no_grad():
        for policy, arg in (("token", 0.5), ("grad", 0.7), ("global", 0.3)):
            record = {}
            got, skipped = mod_oracle.oracle_forward(dense, tokens, routed, policy, arg, set(),
                                                     record)
            assert skipped == sum(int((~k).sum()) for k in record.values())
            want, _ = mod(tokens, mode="masked", selections=record)
            assert torch.allclose(got, want, atol=1e-5, rtol=0), policy
