"""The shipped demo checkpoint meets its card: it loads by DESIGN.md names alone, routes 8-20% of
held-out tokens per routed layer causally, its predictor agrees with top-k on at least 95% of
tokens, and causal routing costs under 2% loss against top-k routing."""
import os

import pytest
import torch

import evaluate
from modref import checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(ROOT, "models", "demo")


@pytest.fixture(scope="module")
def results():
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model = checkpoint.load(DEMO)
    windows, nbytes = evaluate.heldout_windows(os.path.join(DEMO, "tokenizer.json"), 256)
    windows = windows[:48]  # a third of the split keeps this test fast; the card uses it all
    return (model, evaluate.evaluate(model, windows, nbytes, "topk"),
            evaluate.evaluate(model, windows, nbytes, "causal"))


def test_demo_is_a_mod_model_with_gqa_and_untied_embeddings(results):
    cfg = results[0].cfg
    assert cfg.mod is not None and cfg.mod.inference_routing == "predictor_threshold"
    assert cfg.mod.routed_layers == list(range(1, cfg.n_layers, 2))
    assert cfg.mod.capacity == 0.125
    assert cfg.n_kv_heads < cfg.n_heads and not cfg.tie_word_embeddings
    size = sum(os.path.getsize(os.path.join(DEMO, f)) for f in os.listdir(DEMO))
    assert size <= 16 * 2 ** 20


def test_causal_routing_fraction_is_within_8_to_20_percent(results):
    for layer, frac in results[2]["routed_fraction"].items():
        assert 0.08 <= frac <= 0.20, (layer, frac)


def test_predictor_accuracy_is_at_least_95_percent(results):
    for layer, acc in results[1]["predictor_accuracy"].items():
        assert acc >= 0.95, (layer, acc)


def test_causal_loss_is_within_2_percent_of_topk(results):
    assert results[2]["bpb"] <= results[1]["bpb"] * 1.02
