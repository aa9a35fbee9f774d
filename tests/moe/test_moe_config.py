"""Qwen3 / Qwen3-MoE configs, expert-parallel validation and the dry run's expert accounting
(pure, CPU, no process groups)."""

import pytest

from megatron_dapo.config import ConfigError, parse_args
from megatron_dapo.config.validate import validate
from megatron_dapo.launch.memory_estimate import estimate_memory, stage_params
from megatron_dapo.launch.plan import dry_run_report
from megatron_dapo.launch.weight_sync_plan import sync_plan
from megatron_dapo.models import ModelConfigError, parse_hf_config
from tests.tiny import tiny_qwen3_config, tiny_qwen3_moe_config

#: Qwen3-30B-A3B's published config.json (shape fields): 30.5B parameters, 3.3B active.
QWEN3_30B_A3B = dict(
    model_type="qwen3_moe",
    architectures=["Qwen3MoeForCausalLM"],
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    router_aux_loss_coef=0.001,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    attention_bias=False,
    use_sliding_window=False,
    hidden_act="silu",
)


def test_qwen3_fields():
    a = parse_hf_config(tiny_qwen3_config())
    assert a.qk_layernorm and not a.qkv_bias and a.tie_word_embeddings and a.head_dim == 32 and not a.is_moe
    a = parse_hf_config({**tiny_qwen3_config(), "head_dim": None})
    assert a.head_dim == 128  # transformers' Qwen3Config default
    m = parse_hf_config(tiny_qwen3_moe_config())
    assert (m.num_experts, m.moe_router_topk, m.moe_ffn_hidden_size, m.moe_norm_topk_prob) == (8, 2, 32, True)
    assert m.router_aux_loss_coef == 0.001 and m.qk_layernorm
    # transformers >= 5 writes num_local_experts
    cfg = tiny_qwen3_moe_config()
    cfg["num_local_experts"] = cfg.pop("num_experts")
    assert parse_hf_config(cfg).num_experts == 8


def test_qwen3_30b_a3b_parameter_count():
    a = parse_hf_config(QWEN3_30B_A3B)
    assert round(a.num_parameters / 1e9, 1) == 30.5
    assert sum(stage_params(a, 1, 1)) == a.num_parameters


@pytest.mark.parametrize(
    "override,field",
    [
        ({"mlp_only_layers": [0]}, "mlp_only_layers"),
        ({"decoder_sparse_step": 2}, "decoder_sparse_step"),
        ({"attention_bias": True}, "attention_bias"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ],
)
def test_unsupported_moe_fields_named(override, field):
    with pytest.raises(ModelConfigError, match=field):
        parse_hf_config(tiny_qwen3_moe_config(**override))


# 2 nodes x 8 GPUs, bf16, SGLang
CLUSTER = [
    "--actor-num-nodes",
    "2",
    "--actor-num-gpus-per-node",
    "8",
    "--bf16",
    "--rollout-engine",
    "sglang",
    "--use-distributed-optimizer",
    "--max-tokens-per-gpu",
    "8192",
    "--rollout-batch-size",
    "32",
    "--n-samples-per-prompt",
    "8",
    "--global-batch-size",
    "32",
    "--rollout-num-gpus-per-engine",
    "4",
]


def test_expert_layout_checks():
    arch = parse_hf_config(QWEN3_30B_A3B)
    ok = parse_args(CLUSTER + ["--expert-model-parallel-size", "8"])
    validate(ok, arch, on_gpu=True)
    for extra, needle in [
        (["--expert-model-parallel-size", "3"], "--expert-model-parallel-size 3"),
        (
            ["--expert-model-parallel-size", "16", "--pipeline-model-parallel-size", "2"],
            "--expert-model-parallel-size 16",
        ),
        (["--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "8"], "--sequence-parallel"),
        (["--expert-model-parallel-size", "8", "--moe-router-enable-expert-bias"], "sigmoid"),
        (["--expert-model-parallel-size", "8", "--moe-aux-loss-coeff", "-1"], "--moe-aux-loss-coeff"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            validate(parse_args(CLUSTER + extra), arch, on_gpu=True)
    with pytest.raises(ConfigError, match="expert width 100"):
        validate(
            parse_args(CLUSTER + ["--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "8"]),
            parse_hf_config({**QWEN3_30B_A3B, "moe_intermediate_size": 100}),
            on_gpu=True,
        )
    with pytest.raises(ConfigError, match="has no experts"):
        validate(
            parse_args(CLUSTER + ["--expert-model-parallel-size", "2"]),
            parse_hf_config(tiny_qwen3_config()),
            on_gpu=True,
        )


def test_dry_run_counts_expert_bytes_per_feeder():
    arch = parse_hf_config(QWEN3_30B_A3B)
    cfg = parse_args(CLUSTER + ["--expert-model-parallel-size", "8"])
    sp = sync_plan(cfg, arch, "sglang")
    experts = 48 * 128 * 3 * 2048 * 768 * 2  # layers x experts x (gate, up, down) x H x I x bf16
    assert sp.expert_bytes_per_feeder == experts and sp.expert_group == 8
    assert sp.expert_gathered_bytes == experts * 7 // 8
    assert sp.bytes_per_feeder == arch.num_parameters * 2 > experts
    report = dry_run_report(cfg, arch, on_gpu=True)
    assert "experts:" in report and "128 experts of width 768, top-8" in report
    # each GPU holds 1/8 of the experts; the distributed optimizer shards them over EDP = 16 / 8
    m = estimate_memory(cfg, arch)
    dense = arch.num_parameters - 48 * arch.expert_parameters_per_layer
    assert m.params_per_gpu == pytest.approx(dense + 48 * arch.expert_parameters_per_layer / 8, rel=1e-3)
    assert m.optimizer == pytest.approx(
        12
        * (
            (m.params_per_gpu - 48 * arch.expert_parameters_per_layer / 8) / 16
            + 48 * arch.expert_parameters_per_layer / 8 / 2
        ),
        rel=1e-3,
    )
