"""HF export from the trainer's own weights (GPU first contact: never from an engine's model)."""

from __future__ import annotations

import pytest

from tests.tiny import tiny_llama_config, tiny_qwen2_config

pytestmark = [pytest.mark.gloo]


@pytest.mark.parametrize(
    "tp,pp,world,cfg_fn", [(2, 1, 2, tiny_qwen2_config), (1, 2, 2, tiny_qwen2_config), (2, 2, 4, tiny_llama_config)]
)
def test_export_equals_the_trained_weights(gloo, tmp_path, tp, pp, world, cfg_fn):
    from tests.training import bodies

    out = tmp_path / "hf"
    res = [r for r in gloo(world).run(bodies.export_hf_roundtrip, cfg_fn(), tp, pp, str(out), 64 * 1024) if r]
    assert len(res) == 1
    r = res[0]
    assert r["missing"] == []
    assert r["max_diff"] == 0.0, r
    assert "config.json" in r["written"] and "model.safetensors.index.json" not in r["written"]
    assert len([f for f in r["written"] if f.endswith(".safetensors")]) > 1  # several shards, one index
    assert (out / "model.safetensors.index.json").exists()
    assert not list(out.glob("_pp*"))  # no temporary part left
