"""Checkpoint round trips for every option, and config validation errors that name the key."""
import copy
import json
import os
import struct

import pytest
import torch

import variants
from modref import checkpoint, safetensors_io
from modref.config import ConfigError, parse_config


@pytest.mark.parametrize("name", list(variants.VARIANTS))
def test_round_trip(name, tmp_path):
    _, dtype, shard = variants.VARIANTS[name]
    model = variants.random_model(name)
    checkpoint.save(model, str(tmp_path), dtype=dtype, shard_bytes=shard)
    back = checkpoint.load(str(tmp_path))
    assert back.cfg.to_json() == model.cfg.to_json()
    stored = safetensors_io.load_dir(str(tmp_path))
    for pname, p in model.state_dict().items():
        want_dtype = torch.float32 if checkpoint.is_router_tensor(pname) else dtype
        assert stored[pname].dtype == want_dtype, pname
        assert torch.equal(stored[pname], p.to(want_dtype)), pname
        assert torch.equal(back.state_dict()[pname], p.to(want_dtype).float()), pname
    if model.cfg.tie_word_embeddings:
        assert "lm_head.weight" not in stored
    assert os.path.exists(tmp_path / ("model.safetensors.index.json" if shard else
                                      "model.safetensors"))


@pytest.mark.parametrize("name", list(variants.VARIANTS))
def test_files_read_by_the_safetensors_package(name, tmp_path):
    st = pytest.importorskip("safetensors.torch")
    _, dtype, shard = variants.VARIANTS[name]
    model = variants.random_model(name)
    checkpoint.save(model, str(tmp_path), dtype=dtype, shard_bytes=shard)
    ours = safetensors_io.load_dir(str(tmp_path))
    theirs = {}
    for f in sorted(os.listdir(tmp_path)):
        if f.endswith(".safetensors"):
            theirs.update(st.load_file(str(tmp_path / f)))
    assert sorted(ours) == sorted(theirs)
    for k in ours:
        assert ours[k].dtype == theirs[k].dtype and torch.equal(ours[k], theirs[k]), k


def test_committed_checkpoints_load_and_match_their_variant():
    root = os.path.join(os.path.dirname(__file__), "..", "testdata", "checkpoints")
    for name in variants.VARIANTS:
        back = checkpoint.load(os.path.join(root, name))
        assert back.cfg.to_json()["mod"] if "mod" in variants.variant_config(name) else True
        expected = parse_config(variants.variant_config(name)).to_json()
        got = back.cfg.to_json()
        got.pop("torch_dtype"), expected.pop("torch_dtype")
        assert got == expected


def base_mod():
    return variants.variant_config("predictor_mlp_silu_bf16")


def mutate(path, value):
    cfg = base_mod()
    obj = cfg
    for key in path[:-1]:
        obj = obj[key]
    if value is DELETE:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value
    return cfg


DELETE = object()
BAD = [
    (("mod", "format_version"), 2, "mod.format_version"),
    (("mod", "format_version"), DELETE, "mod.format_version"),
    (("mod", "routed_layers"), DELETE, "mod.routed_layers"),
    (("mod", "routed_layers"), [1, 9], "mod.routed_layers"),
    (("mod", "routed_layers"), [1, 1], "mod.routed_layers"),
    (("mod", "routed_layers"), "1,3", "mod.routed_layers"),
    (("mod", "capacity"), 0.0, "mod.capacity"),
    (("mod", "capacity"), 1.5, "mod.capacity"),
    (("mod", "weight_fn"), "tanh", "mod.weight_fn"),
    (("mod", "scale_target"), "residual", "mod.scale_target"),
    (("mod", "inference_routing"), "topk", "mod.inference_routing"),
    (("mod", "threshold"), 1.0, "mod.threshold"),
    (("mod", "threshold"), "high", "mod.threshold"),
    (("mod", "router"), {"bias": "yes"}, "mod.router.bias"),
    (("mod", "router"), {"input": "post_attention_layernorm"}, "mod.router.input"),
    (("mod", "router"), {"scale": 2}, "mod.router.scale"),
    (("mod", "predictor", "type"), "transformer", "mod.predictor.type"),
    (("mod", "predictor", "activation"), "tanh", "mod.predictor.activation"),
    (("mod", "predictor", "hidden_size"), 0, "mod.predictor.hidden_size"),
    (("mod", "predictor", "hidden_size"), DELETE, "mod.predictor.hidden_size"),
    (("mod", "predictor", "dropout"), 0.1, "mod.predictor.dropout"),
    (("mod", "predictor"), None, "mod.predictor"),  # predictor_threshold without a predictor
    (("mod", "capacity_factor"), 0.5, "mod.capacity_factor"),
    (("mod", "capacity"), [0.5], "mod.capacity"),  # one value for two routed layers
    (("mod", "capacity"), [0.5, 1.5], "mod.capacity"),
    (("mod", "capacity"), ["0.5", "0.5"], "mod.capacity"),
    (("mod", "layer_thresholds"), 0.5, "mod.layer_thresholds"),
    (("mod", "layer_thresholds"), [0.5, 1.0], "mod.layer_thresholds"),
    (("mod", "layer_thresholds"), [0.5, 0.5, 0.5], "mod.layer_thresholds"),
    (("hidden_size",), DELETE, "hidden_size"),
    (("num_key_value_heads",), 3, "num_key_value_heads"),
    (("head_dim",), 7, "head_dim"),
    (("eos_token_id",), 5000, "eos_token_id"),
    (("bos_token_id",), -1, "bos_token_id"),
    (("vocab_size",), 0, "vocab_size"),
    (("rms_norm_eps",), -1.0, "rms_norm_eps"),
    (("rope_scaling",), {"type": "linear", "factor": 2.0}, "rope_scaling"),
    (("tie_word_embeddings",), "no", "tie_word_embeddings"),
    (("model_type",), "mistral", "model_type"),
]


@pytest.mark.parametrize("path,value,key", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_malformed_config_names_the_key(path, value, key):
    with pytest.raises(ConfigError) as e:
        parse_config(mutate(path, value))
    assert f"'{key}'" in str(e.value)


def test_valid_configs_parse():
    for name in variants.VARIANTS:
        cfg = parse_config(variants.variant_config(name))
        assert (cfg.mod is None) == (name.startswith("dense"))


def write_raw(path, header: bytes, body: bytes = b"", hlen=None):
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header) if hlen is None else hlen) + header + body)


def test_malformed_safetensors(tmp_path):
    p = str(tmp_path / "x.safetensors")
    write_raw(p, b"{}", hlen=2 ** 60)
    with pytest.raises(safetensors_io.CheckpointError, match="past the end"):
        safetensors_io.read_file(p)
    hdr = json.dumps({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}).encode()
    write_raw(p, hdr, b"\0" * 12)
    with pytest.raises(safetensors_io.CheckpointError, match="overlap"):
        safetensors_io.read_file(p)
    hdr = json.dumps({"a": {"dtype": "I8", "shape": [2], "data_offsets": [0, 2]}}).encode()
    write_raw(p, hdr, b"\0" * 2)
    with pytest.raises(safetensors_io.CheckpointError, match="dtype"):
        safetensors_io.read_file(p)
    hdr = json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    write_raw(p, hdr, b"\0" * 8)
    with pytest.raises(safetensors_io.CheckpointError, match="outside"):
        safetensors_io.read_file(p)


def test_unknown_mod_key_is_rejected_when_loading(tmp_path):
    model = variants.random_model("router_identity_update")
    checkpoint.save(model, str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["mod"]["router_z_loss"] = 0.01
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="'mod.router_z_loss'"):
        checkpoint.load(str(tmp_path))


def test_missing_and_misshapen_tensors(tmp_path):
    model = variants.random_model("predictor_mlp_silu_bf16")
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    checkpoint.save(model, str(tmp_path))
    bad = copy.copy(sd)
    del bad["model.layers.1.aux_router.2.weight"]
    safetensors_io.write_file(str(tmp_path / "model.safetensors"), bad)
    with pytest.raises(safetensors_io.CheckpointError, match="aux_router.2.weight"):
        checkpoint.load(str(tmp_path))
    bad = copy.copy(sd)
    bad["model.layers.1.router.weight"] = torch.zeros(2, 48)
    safetensors_io.write_file(str(tmp_path / "model.safetensors"), bad)
    with pytest.raises(safetensors_io.CheckpointError, match="router.weight"):
        checkpoint.load(str(tmp_path))


def save_adapter_pair(tmp_path, name="adapter_per_layer_router"):
    base_name, _ = variants.ADAPTERS[name]
    _, dtype, shard = variants.VARIANTS[base_name]
    checkpoint.save(variants.random_model(base_name), str(tmp_path / "base"), dtype=dtype,
                    shard_bytes=shard)
    model = variants.random_adapter(name)
    checkpoint.save_adapter(model, str(tmp_path / "adapter"), "../base")
    return model


def test_adapter_round_trip_holds_only_routers(tmp_path):
    model = save_adapter_pair(tmp_path)
    raw = json.loads((tmp_path / "adapter" / "config.json").read_text())
    assert sorted(raw) == ["base_model", "mod"] and raw["base_model"] == "../base"
    stored = safetensors_io.read_file(str(tmp_path / "adapter" / checkpoint.ADAPTER_FILE))
    assert stored and all(checkpoint.is_router_tensor(k) for k in stored)
    back = checkpoint.load(str(tmp_path / "adapter"))
    assert back.cfg.mod.to_json() == model.cfg.mod.to_json()
    for pname, p in model.state_dict().items():
        assert torch.equal(back.state_dict()[pname], p.float()), pname


def test_adapter_errors_name_both_files(tmp_path):
    save_adapter_pair(tmp_path)
    adapter = tmp_path / "adapter"
    cfg_path = adapter / "config.json"
    raw = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps(dict(raw, base_model="../nowhere")))
    with pytest.raises(ConfigError, match=r"config.json: base model '../nowhere' \(.*nowhere\) "
                                          r"does not exist"):
        checkpoint.load(str(adapter))
    cfg_path.write_text(json.dumps(raw))
    tensors = safetensors_io.read_file(str(adapter / checkpoint.ADAPTER_FILE))
    tensors["model.layers.2.router.weight"] = torch.zeros(1, 7)
    safetensors_io.write_file(str(adapter / checkpoint.ADAPTER_FILE), tensors)
    with pytest.raises(safetensors_io.CheckpointError,
                       match=r"adapter.safetensors: tensor 'model.layers.2.router.weight' has "
                             r"shape \[1, 7\], but the base model .*base needs \[1, "):
        checkpoint.load(str(adapter))
