"""Mismatched configs and missing/unexpected tensors are errors naming what differs."""

import json
import os
import shutil

import pytest
import torch

from megatron_dapo.checkpoint import dist_ckpt
from megatron_dapo.models import parse_hf_config
from tests.checkpoint import bodies
from tests.checkpoint.conftest import TINY
from tests.tiny import tiny_llama_config, tiny_qwen2_config

# HF field, new value, the field named in the error, checkpoint value, model value
MISMATCHES = [
    ("vocab_size", 512, "vocab_size", 300, 512),
    ("hidden_size", 128, "hidden_size", 64, 128),
    ("num_attention_heads", 8, "num_attention_heads", 4, 8),
    ("num_key_value_heads", 4, "num_key_value_heads", 2, 4),
    ("rope_theta", 1e6, "rope_theta", 10000.0, 1000000.0),
    ("tie_word_embeddings", True, "tie_word_embeddings", False, True),
    ("num_hidden_layers", 6, "num_hidden_layers", 4, 6),
    ("intermediate_size", 96, "intermediate_size", 128, 96),
]


@pytest.mark.parametrize("field,value,named,ck,model", MISMATCHES, ids=[m[0] for m in MISMATCHES])
def test_config_mismatch_names_field_and_values(tiny_ckpt, field, value, named, ck, model):
    meta = dist_ckpt.read_metadata(tiny_ckpt["qwen2"])
    cfg = dict(TINY["qwen2"], **{field: value})
    with pytest.raises(dist_ckpt.CheckpointError) as e:
        dist_ckpt.check_metadata(meta, parse_hf_config(cfg))
    msg = str(e.value)
    assert named in msg and f"checkpoint has {ck!r}" in msg and f"model has {model!r}" in msg, msg


def test_architecture_mismatch(tiny_ckpt):
    meta = dist_ckpt.read_metadata(tiny_ckpt["qwen2"])
    cfg = tiny_llama_config(vocab_size=300, tie_word_embeddings=False, rms_norm_eps=1e-6)
    with pytest.raises(dist_ckpt.CheckpointError, match="model_type.*'qwen2'.*'llama'"):
        dist_ckpt.check_metadata(meta, parse_hf_config(cfg))


def test_not_a_checkpoint(tiny_hf):
    with pytest.raises(dist_ckpt.CheckpointError, match="looks like an HF checkpoint"):
        dist_ckpt.read_metadata(tiny_hf["qwen2"])


@pytest.mark.gloo
def test_load_refuses_mismatch_at_tp2(gloo, tiny_ckpt):
    errs = gloo(2).run(bodies.load_error, tiny_qwen2_config(vocab_size=300, hidden_size=128), tiny_ckpt["qwen2"], 2, 1)
    assert all(e and "hidden_size: checkpoint" in e and "has 64" in e and "has 128" in e for e in errs), errs


def _mislabelled(src, dst, **fields):
    shutil.copytree(src, dst)
    bodies.edit_metadata(str(dst), **fields)
    return str(dst)


@pytest.mark.gloo
def test_missing_tensors_listed(gloo, tiny_ckpt, tmp_path):
    """A Llama checkpoint labelled Qwen2: the QKV biases the model needs are not there."""
    ck = _mislabelled(tiny_ckpt["llama"], tmp_path / "ck", model_type="qwen2", qkv_bias=True, norm_eps=1e-6)
    cfg = tiny_qwen2_config(tie_word_embeddings=True)
    errs = gloo(2).run(bodies.load_error, cfg, ck, 1, 2)
    for e in errs:
        assert e and "checkpoint lacks" in e and "decoder.layers.self_attention.linear_qkv.bias" in e, errs


@pytest.mark.gloo
def test_unexpected_tensors_listed(gloo, tiny_ckpt, tmp_path):
    """A Qwen2 checkpoint labelled Llama: its QKV biases have no place in the model."""
    ck = _mislabelled(tiny_ckpt["qwen2"], tmp_path / "ck", model_type="llama", qkv_bias=False, norm_eps=1e-5)
    cfg = tiny_llama_config(vocab_size=300, tie_word_embeddings=False)
    errs = gloo(2).run(bodies.load_error, cfg, ck, 2, 1)
    for e in errs:
        assert e and "model does not have" in e and "decoder.layers.self_attention.linear_qkv.bias" in e, errs


@pytest.mark.gloo
def test_extra_sharded_state(gloo, tiny_hf, tmp_path):
    """What the trainer adds (optimizer state) is saved and loaded with the model; a requested
    extra tensor that the checkpoint lacks is an error listing it."""
    ck = str(tmp_path / "ck")
    same, extra = gloo(2).run(bodies.save_with_extra, tiny_hf["llama"], ck, ["opt.a", "opt.b"])[0]
    assert same and extra == {"opt.a": [0.0] * 3, "opt.b": [1.0] * 3}
    errs = gloo(2).run(bodies.load_error, TINY["llama"], ck, 1, 1, ["opt.a", "opt.b", "opt.c"])
    assert all(e and "opt.c" in e and "lacks" in e for e in errs), errs
    errs = gloo(2).run(bodies.load_error, TINY["llama"], ck, 1, 1, ["opt.a"])
    assert all(e and "opt.b" in e and "does not have" in e for e in errs), errs


def test_hf_missing_and_unexpected_tensors(tiny_hf, tmp_path):
    """The converter lists HF tensors that are missing or unexpected before building anything."""
    from safetensors.torch import load_file, save_file

    from megatron_dapo.checkpoint.hf_export import hf_to_torch_dist

    bad = tmp_path / "bad"
    shutil.copytree(tiny_hf["qwen2"], bad)
    sd = load_file(str(bad / "model.safetensors"))
    del sd["model.layers.2.self_attn.k_proj.bias"]
    sd["model.layers.9.mlp.extra.weight"] = torch.zeros(2)
    save_file(sd, str(bad / "model.safetensors"))
    with pytest.raises(ValueError) as e:
        hf_to_torch_dist(str(bad), str(tmp_path / "out"))
    msg = str(e.value)
    assert "missing 'model.layers.2.self_attn.k_proj.bias'" in msg
    assert "not in the config's model 'model.layers.9.mlp.extra.weight'" in msg
    assert not (tmp_path / "out").exists()


@pytest.mark.gloo
def test_export_refuses_mismatched_hf_config(gloo, tiny_ckpt, tmp_path):
    cfg_dir = tmp_path / "cfg"
    cfg_dir.mkdir()
    json.dump(dict(TINY["qwen2"], num_hidden_layers=2), open(cfg_dir / "config.json", "w"))
    errs = gloo(2).run(bodies.export_error, tiny_ckpt["qwen2"], str(tmp_path / "hf"), "--hf-config", str(cfg_dir))
    assert all(
        e and "num_layers (HF num_hidden_layers): the checkpoint has" in e and "--hf-config" in e for e in errs
    ), errs
    assert not os.path.exists(tmp_path / "hf")
