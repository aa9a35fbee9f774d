"""Converters for Qwen3 and Qwen3-MoE: HF -> torch_dist (tools/convert_hf_to_megatron.py) ->
loaded at another layout (Qwen3-MoE at EP2 x TP2, ETP1: dist_checkpointing reshards the experts)
gives the HF logits; torch_dist -> HF (tools/convert_megatron_to_hf.py) gives the
source tensors bit for bit (one tensor per expert), in small shards."""

import json
import os

import pytest
import torch

from tests.checkpoint import bodies as ckpt_bodies
from tests.checkpoint.test_roundtrip import hf_logits, read_safetensors_dir
from tests.moe import bodies
from tests.tiny import tiny_qwen3_config, tiny_qwen3_moe_config

pytestmark = [pytest.mark.gloo]

CONFIGS = {"qwen3": tiny_qwen3_config(vocab_size=300, num_hidden_layers=2), "qwen3_moe": tiny_qwen3_moe_config()}


@pytest.fixture(scope="module")
def converted(gloo, tmp_path_factory):
    """{name: (HF dir, torch_dist dir)}, converted once by the tool on 2 ranks."""
    from tests.checkpoint.conftest import write_hf

    root = tmp_path_factory.mktemp("qwen3_convert")
    out = {}
    for i, (name, cfg) in enumerate(CONFIGS.items()):
        hf_dir, ck = write_hf(cfg, root / f"{name}_hf", seed=5 + i), str(root / f"{name}_ck")
        assert gloo(2).run(ckpt_bodies.convert_hf, hf_dir, ck, "fp32") == [0, 0]
        out[name] = hf_dir, ck
    return out


LAYOUTS = [("qwen3_moe", 2, 1, 2, 1, 2)]


@pytest.mark.parametrize("name,tp,pp,ep,etp,world", LAYOUTS, ids=[f"{n}-tp{t}ep{e}" for n, t, _, e, _, _ in LAYOUTS])
def test_checkpoint_logits_equal_hf(gloo, converted, name, tp, pp, ep, etp, world):
    hf_dir, ck = converted[name]
    tokens = torch.randint(0, CONFIGS[name]["vocab_size"], (2, 10), generator=torch.Generator().manual_seed(11))
    ref = hf_logits(hf_dir, tokens)
    got = [
        g
        for g in gloo(world).run(bodies.checkpoint_logits, CONFIGS[name], ck, tokens, tp, pp, ep, etp)
        if g is not None
    ]
    assert len(got) == 1 and got[0].shape == ref.shape
    assert float((got[0] - ref).abs().max()) < 1e-5


@pytest.mark.parametrize("name", list(CONFIGS))
def test_round_trip_bit_identical(gloo, converted, tmp_path, name):
    hf_dir, ck = converted[name]
    out = str(tmp_path / "hf")
    assert gloo(2).run(ckpt_bodies.export_hf, ck, out, "--max-shard-size-gb", str(60e3 / 1024**3)) == [0, 0]
    src, got = read_safetensors_dir(hf_dir), read_safetensors_dir(out)
    tied = {"lm_head.weight"} if CONFIGS[name]["tie_word_embeddings"] else set()
    assert set(got) == set(src) - tied
    for k in got:
        assert got[k].dtype == src[k].dtype and torch.equal(got[k], src[k]), k
    index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
    assert set(index["weight_map"]) == set(got) and len(set(index["weight_map"].values())) > 1
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["model_type"] == name
    tokens = torch.randint(0, CONFIGS[name]["vocab_size"], (2, 10), generator=torch.Generator().manual_seed(3))
    assert torch.equal(hf_logits(out, tokens), hf_logits(hf_dir, tokens))
