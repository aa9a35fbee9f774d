"""LoRA on megatron-core's parallel linears (issue 41, training/lora.py), on gloo ranks.

* The forward with adapters equals transformers' model whose weights have the adapters merged
  in HF's own layout (q/k/v and gate/up separate: an independent check of the fused layouts and
  the TP split), at TP 2, PP 2 and TP 2 x PP 2, all seven targets and a partial set.
* Training: the optimizer holds the adapters only, no base weight moves (bitwise) over Adam
  steps, and TP 2 and PP 2 end with the adapters of one rank within the bound of
  tests/tolerances.py (the collectives of the adapters give whole gradients).
"""

from __future__ import annotations

import pytest
import torch

from megatron_dapo.models.hf_config import lora_parameters, parse_hf_config
from megatron_dapo.training.lora import TARGETS, LoRAOptions, is_lora_param, moe_refusal
from tests.tiny import tiny_qwen2_config, tiny_qwen3_moe_config
from tests.tolerances import COMPARE_ADAM_EPS, adam_weight_atol
from tests.training import lora_bodies

pytestmark = [pytest.mark.gloo]

#: float32 logits of two implementations of the same forward (tests/foundation/test_parallel_logits.py)
LOGITS_ATOL = 1e-5


@pytest.mark.parametrize(
    "tp,pp,world,targets",
    [
        (2, 1, 2, TARGETS),
        (1, 2, 2, TARGETS),
        (2, 2, 4, TARGETS),
        (2, 1, 2, ("q_proj", "v_proj", "up_proj", "down_proj")),
    ],
    ids=["tp2", "pp2", "tp2xpp2", "tp2-partial"],
)
def test_the_lora_forward_equals_hf_with_the_adapters_merged(gloo, tp, pp, world, targets):
    outs = [o for o in gloo(world).run(lora_bodies.lora_logits_vs_merged_hf, tiny_qwen2_config(), tp, pp, targets) if o]
    assert outs, "no rank reported logits"
    for o in outs:
        assert o["effect"] > 100 * LOGITS_ATOL, o  # the adapters change the logits well beyond the tolerance
        assert o["diff"] < LOGITS_ATOL, o


def test_only_adapters_train_and_tp2_pp2_end_where_one_rank_ends(gloo):
    cfg = tiny_qwen2_config()
    steps = 2
    one = gloo(1).run(lora_bodies.lora_train_steps, cfg, 1, 1, steps)[0]
    tp2 = gloo(2).run(lora_bodies.lora_train_steps, cfg, 2, 1, steps)
    pp2 = gloo(2).run(lora_bodies.lora_train_steps, cfg, 1, 2, steps)
    for res in [one, *tp2, *pp2]:
        assert res["trainable"] and all(is_lora_param(n) for n in res["trainable"]), res["trainable"]
        assert res["in_optimizer"] == res["adapter_numel"] > 0
        assert res["moved"] == [], res["moved"]  # the base is bit-identical after the steps
    ref = one["adapters"]
    assert len(ref) == 2 * len(TARGETS) * cfg["num_hidden_layers"]
    # the plan's count (checkpoint size, memory) is what the model holds
    assert one["adapter_numel"] == lora_parameters(parse_hf_config(cfg), lora_bodies.R, TARGETS)
    moved = max(float((ref[k] - v).abs().max()) for k, v in lora_bodies_init(cfg).items())
    assert moved > 1e-3, moved  # the adapters did train
    tol = adam_weight_atol(
        1e-2, max(one["grad_norm"]), max(float(t.abs().max()) for t in ref.values()), steps=steps, clip_grad=1.0
    )
    for name, ranks in (("TP 2", tp2[:1]), ("PP 2", pp2)):
        got = {k: v for r in ranks for k, v in r["adapters"].items()}
        assert got.keys() <= ref.keys() and (name != "TP 2" or got.keys() == ref.keys())
        worst = max(float((ref[k] - v).abs().max()) for k, v in got.items())
        assert worst <= tol, (name, worst, tol)
    assert {k for r in pp2 for k in r["adapters"]} == set(ref)
    assert COMPARE_ADAM_EPS > 0


def test_the_distributed_optimizer_shards_the_adapters_only(gloo):
    """DP 2 with megatron's distributed optimizer: its shards of the two ranks add up to the
    adapters (the frozen base is in no buffer), the base stays bit-identical, both ranks end with
    the same adapters."""
    a, b = gloo(2).run(lora_bodies.lora_train_steps, tiny_qwen2_config(), 1, 1, 2, True)
    assert a["adapter_numel"] == b["adapter_numel"] > 0
    assert a["in_optimizer"] + b["in_optimizer"] == a["adapter_numel"], (a["in_optimizer"], b["in_optimizer"])
    assert a["moved"] == b["moved"] == []
    assert all(torch.equal(a["adapters"][k], b["adapters"][k]) for k in a["adapters"])


def lora_bodies_init(cfg: dict) -> dict:
    """The adapters as the init leaves them (A drawn from its seed, B zero), keyed as the bodies key them."""
    from megatron_dapo.models import parse_hf_config
    from megatron_dapo.training.lora import MODULES, _uniform_a

    arch = parse_hf_config(cfg)
    out = {}
    for layer in range(arch.num_layers):
        for suffix, (fused, _) in MODULES.items():
            for p in fused:
                a = _uniform_a(f"decoder.layers.{layer}.{suffix}.{p}", lora_bodies.R, lora_bodies._in_full(arch, p), 5)
                out[f"{layer}.{p}.A"] = a
                out[f"{layer}.{p}.B"] = torch.zeros(lora_bodies._out_full(arch, p), lora_bodies.R)
    return out


def test_experts_take_no_adapter_and_the_refusal_names_the_targets():
    from megatron_dapo.models import parse_hf_config

    moe = parse_hf_config(tiny_qwen3_moe_config())
    line = moe_refusal(moe, ("q_proj", "gate_proj", "down_proj"))
    assert line and "gate_proj,down_proj" in line and "attention only" in line and "\n" not in line
    assert moe_refusal(moe, ("q_proj", "k_proj", "v_proj", "o_proj")) is None
    assert moe_refusal(parse_hf_config(tiny_qwen2_config()), TARGETS) is None
    assert LoRAOptions(rank=8, alpha=16.0).scaling == 2.0


@pytest.mark.parametrize("tp,pp,world,feeders", [(2, 1, 2, [0]), (2, 2, 4, [0, 2])], ids=["tp2", "tp2xpp2"])
def test_the_merged_sync_and_export_give_the_weights_with_the_adapters_folded_in(gloo, tp, pp, world, feeders):
    outs = gloo(world).run(lora_bodies.merged_sync, tiny_qwen2_config(), tp, pp, feeders)
    engines = [o for o in outs if "engine_diff" in o]
    assert len(engines) == len(feeders)
    for o in outs:
        # float32 sums of the same products in another order: a few ulps of weights of size ~1
        assert o["export_diff"] < 1e-5, o
        assert o["probe"] < 1e-4, o  # the engine computes what megatron with its adapters computes
    for o in engines:
        assert o["engine_diff"] < 1e-5 and o["engine_names"] > 0, o


def test_a_lora_checkpoint_holds_the_adapters_and_resumes_exactly(gloo, tmp_path):
    """TP 2: step, save, step; a fresh TP 2 policy (base from the HF weights) loads it and takes
    the same step: bitwise the same adapters. The checkpoint holds adapters and optimizer state
    only; a TP 1 policy reads the same adapters from it (resharded, no arithmetic)."""
    from megatron_dapo.checkpoint.mapping import is_lora_param as lora_name

    cfg, ckpt = tiny_qwen2_config(), str(tmp_path / "ckpt")
    saved = gloo(2).run(lora_bodies.lora_checkpoint_resume, cfg, 2, 1, ckpt, True)
    resumed = gloo(2).run(lora_bodies.lora_checkpoint_resume, cfg, 2, 1, ckpt, False)
    for s, r in zip(saved, resumed):
        assert r["base_untouched"]
        assert s["after"].keys() == r["after"].keys()
        for n in s["after"]:
            assert torch.equal(s["after"][n], r["after"][n]), n  # bitwise: the exact resume
    model_keys = [k for k in resumed[0]["keys"] if not k.startswith(("optimizer", "scheduler"))]
    assert model_keys and all(lora_name(k) for k in model_keys), model_keys[:5]
    one = gloo(1).run(lora_bodies.lora_checkpoint_resume, cfg, 1, 1, ckpt, False)[0]
    for n, t in one["loaded"].items():
        parts = [r["loaded"][n] for r in resumed]
        if parts[0].shape == t.shape:  # replicated over TP
            assert torch.equal(parts[0], t) and torch.equal(parts[1], t), n
        else:
            dim = 0 if ".lora_B." in n else 1
            assert torch.equal(torch.cat(parts, dim=dim), t), n


def test_the_adapter_sync_and_the_merged_sync_give_the_engine_the_same_greedy_output(gloo):
    """TP 2: one engine by the merged sync, one by the base's sync and then the adapters alone (the
    HF engine's ``load_lora_adapter_from_tensors``, SGLang's call): the same greedy paths; the
    weights agree to float32 rounding of the same products; unloading gives the base back bitwise."""
    (res,) = [r for r in gloo(2).run(lora_bodies.adapter_vs_merged_sync, tiny_qwen2_config(), 2, 1, [0]) if r]
    assert res["adapter"] == res["merged"], res
    assert res["weight_diff"] < 1e-5, res["weight_diff"]
    assert res["restored"]
    assert 0 < res["adapter_bytes"] < res["model_bytes"] / 10, res  # what adapter mode sends per sync


def test_the_lora_flags_are_read_and_checked_in_one_line():
    from megatron_dapo.config.cli import parse_args
    from megatron_dapo.config.validate import check_lora, lora_targets
    from megatron_dapo.errors import ConfigError
    from megatron_dapo.models import parse_hf_config

    def cfg(*flags):
        return parse_args(["--hf-checkpoint", "x", "--lora-rank", "8", *flags])

    assert lora_targets(cfg("--lora-target-modules", "v_proj,q_proj", "down_proj")) == ("q_proj", "v_proj", "down_proj")
    assert lora_targets(cfg("--lora-target-modules", "all-linear")) == TARGETS
    dense, moe = parse_hf_config(tiny_qwen2_config()), parse_hf_config(tiny_qwen3_moe_config())
    check_lora(cfg(), dense)  # the defaults pass
    refused = {
        "q_prj": cfg("--lora-target-modules", "q_prj"),
        "--lora-dropout 0.1 with --tensor-model-parallel-size 2": cfg(
            "--lora-dropout", "0.1", "--tensor-model-parallel-size", "2"
        ),
        "is above the narrowest adapted projection": cfg("--lora-rank", "4096"),
        "--lora-sync adapter with --async-mode one-step-off": cfg(
            "--lora-sync", "adapter", "--async-mode", "one-step-off"
        ),
        "--lora-sync adapter with --rollout-engine sglang": cfg("--lora-sync", "adapter", "--rollout-engine", "sglang"),
    }
    for needle, c in refused.items():
        with pytest.raises(ConfigError) as e:
            check_lora(c, dense)
        assert needle in str(e.value) and "\n" not in str(e.value), (needle, str(e.value))
    with pytest.raises(ConfigError, match="attention only"):
        check_lora(cfg(), moe)
