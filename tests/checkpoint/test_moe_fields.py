"""A checkpoint of another expert count, expert width, top-k, routing normalisation or q/k-norm
setting is another model: loading, resuming or exporting it against this model's config fails
with one line naming each field and both values (dist_ckpt.CHECKED_FIELDS). Pure: metadata only."""

import json

import pytest

from megatron_dapo.checkpoint import dist_ckpt
from megatron_dapo.models import parse_hf_config
from tests.tiny import tiny_qwen2_config, tiny_qwen3_config, tiny_qwen3_moe_config

# HF field, new value, the field named in the error, checkpoint value, model value
MOE_MISMATCHES = [
    ("num_experts", 16, "num_experts (HF num_experts)", 8, 16),
    ("moe_intermediate_size", 64, "moe_ffn_hidden_size (HF moe_intermediate_size)", 32, 64),
    ("num_experts_per_tok", 4, "moe_router_topk (HF num_experts_per_tok)", 2, 4),
    ("norm_topk_prob", False, "moe_norm_topk_prob (HF norm_topk_prob)", True, False),
]


def _raises(meta, cfg) -> str:
    with pytest.raises(dist_ckpt.CheckpointError) as e:
        dist_ckpt.check_metadata(meta, parse_hf_config(cfg))
    msg = str(e.value)
    assert "\n" not in msg, msg  # one line
    return msg


@pytest.mark.parametrize("field,value,named,ck,model", MOE_MISMATCHES, ids=[m[0] for m in MOE_MISMATCHES])
def test_moe_shape_mismatch_is_one_line(field, value, named, ck, model):
    meta = dist_ckpt.checkpoint_metadata(tiny_qwen3_moe_config())
    dist_ckpt.check_metadata(meta, parse_hf_config(tiny_qwen3_moe_config()))  # the same config passes
    msg = _raises(meta, tiny_qwen3_moe_config(**{field: value}))
    assert f"{named}: checkpoint has {ck!r}, model has {model!r}" in msg, msg
    assert msg.count(": checkpoint has") == 1, msg  # only that field


def test_dense_checkpoint_into_moe_model_names_the_experts():
    meta = dist_ckpt.checkpoint_metadata(tiny_qwen3_config())
    msg = _raises(meta, tiny_qwen3_moe_config())
    assert "model_type (architecture): checkpoint has 'qwen3', model has 'qwen3_moe'" in msg
    assert "num_experts (HF num_experts): checkpoint has 0, model has 8" in msg
    assert "moe_router_topk (HF num_experts_per_tok): checkpoint has 0, model has 2" in msg


def test_qk_layernorm_is_checked():
    # a qwen3 checkpoint whose metadata says no q/k norms (as a hand-edited or foreign one would)
    meta = dist_ckpt.checkpoint_metadata(tiny_qwen3_config())
    meta["arch"]["qk_layernorm"] = False
    msg = _raises(meta, tiny_qwen3_config())
    assert msg.endswith("qk_layernorm (HF q_norm / k_norm): checkpoint has False, model has True"), msg


def test_checkpoint_written_before_the_moe_fields_still_loads_dense():
    """Metadata without the new fields (checkpoints written before them) reads as dense."""
    meta = dist_ckpt.checkpoint_metadata(tiny_qwen2_config())
    for k in ("qk_layernorm", "num_experts", "moe_ffn_hidden_size", "moe_router_topk", "moe_norm_topk_prob"):
        del meta["arch"][k]
    dist_ckpt.check_metadata(meta, parse_hf_config(tiny_qwen2_config()))
    # but not as a MoE model
    meta = dist_ckpt.checkpoint_metadata(tiny_qwen3_config())
    for k in ("num_experts", "moe_ffn_hidden_size", "moe_router_topk", "moe_norm_topk_prob"):
        del meta["arch"][k]
    assert "num_experts (HF num_experts): checkpoint has 0, model has 8" in _raises(meta, tiny_qwen3_moe_config())


def test_load_refuses_another_expert_shape_before_reading_tensors(tmp_path):
    """load_checkpoint (resume, --pretrained-checkpoint) checks the metadata first: a directory
    holding only the metadata of a 8-expert model is refused for a 16-expert one, naming it."""
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / dist_ckpt.METADATA_FILE).write_text(json.dumps(dist_ckpt.checkpoint_metadata(tiny_qwen3_moe_config())))
    with pytest.raises(dist_ckpt.CheckpointError) as e:
        dist_ckpt.load_checkpoint(None, d, parse_hf_config(tiny_qwen3_moe_config(num_experts=16)))
    msg = str(e.value)
    assert "\n" not in msg and str(d) in msg
    assert f"num_experts (HF num_experts): checkpoint {d} has 8, model has 16" in msg, msg


def test_preflight_names_the_expert_field_in_one_check_line(tmp_path):
    """The dry run's and the launch's preflight (--pretrained-checkpoint / --ref-load / --load all
    read the metadata this way): one FAIL line naming the field, before anything starts."""
    from megatron_dapo.config import parse_args
    from megatron_dapo.launch.preflight_checkpoints import check_torch_dist
    from megatron_dapo.launch.preflight_result import FAIL

    d = tmp_path / "ckpt"
    d.mkdir()
    (d / dist_ckpt.METADATA_FILE).write_text(json.dumps(dist_ckpt.checkpoint_metadata(tiny_qwen3_moe_config())))
    c = check_torch_dist(
        parse_args([]), parse_hf_config(tiny_qwen3_moe_config(num_experts_per_tok=4)), "--pretrained-checkpoint", str(d)
    )
    assert c.status == FAIL, c
    assert (
        "\n" not in c.line and "moe_router_topk (HF num_experts_per_tok): the checkpoint has 2, model has 4" in c.line
    ), c.line
