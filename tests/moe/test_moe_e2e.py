"""A full DAPO run of a tiny random Qwen3-MoE on the CPU (``python -m megatron_dapo.train``'s
main: HFEngine on Ray, two gloo ranks) with ``--expert-model-parallel-size 2``: each rank holds
4 of the 8 experts; after every step the experts are all-gathered into the engine's fused
names and the weight-sync probe passes; the trainer's old logprobs agree with the engine's;
the optimizer steps (a chained dense + expert distributed optimizer) are finite; with
``--routing-replay`` the engine's routing reaches the trainer (per-layer agreement, loads and
entropy in metrics.jsonl). One run for both (each driver run costs about a minute of the suite's
two cores); the router without replay: tests/moe/test_moe_train.py, tests/checkpoint/test_moe_resume.py."""

from __future__ import annotations

import math
import os

import pytest

from tests.e2e.fixtures import make_prompts
from tests.e2e.test_train_e2e import base_args, read_metrics

pytestmark = [pytest.mark.slow]


def make_tiny_qwen3_moe_dir(out: str, moe: bool = True) -> str:
    """A tiny random Qwen3-MoE (or, ``moe=False``, Qwen3) directory with the real Qwen2 tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from tests.data import qwen2_tokenizer_dir
    from tests.tiny import tiny_qwen3_config, tiny_qwen3_moe_config

    tok = AutoTokenizer.from_pretrained(qwen2_tokenizer_dir())
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    make = tiny_qwen3_moe_config if moe else tiny_qwen3_config
    extra = {"moe_intermediate_size": 16} if moe else {"intermediate_size": 32, "num_hidden_layers": 2}
    cfg = make(
        vocab_size=151680,
        hidden_size=32,
        head_dim=8,
        max_position_embeddings=512,
        eos_token_id=eos,
        bos_token_id=eos,
        **extra,
    )
    torch.manual_seed(0)
    conf = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    conf.architectures = cfg["architectures"]
    model = AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def test_ep2_dapo_steps(tmp_path):
    from megatron_dapo.train import main

    hf = make_tiny_qwen3_moe_dir(str(tmp_path / "hf"))
    prompts = make_prompts(str(tmp_path / "prompts.jsonl"))
    run = str(tmp_path / "run")
    rc = main(
        base_args(
            hf,
            prompts,
            run,
            **{
                "--actor-num-gpus-per-node": "2",
                "--expert-model-parallel-size": "2",
                "--use-distributed-optimizer": None,
                "--num-rollout": "2",
                "--routing-replay": None,
            },
        )
    )
    assert rc == 0
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["weight_sync_probe_diff"] is not None and r["weight_sync_probe_diff"] < 1e-5
        assert r["train_infer_logprob_diff"] < 1e-4
        assert math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0
        # routing replay: the engine's routing reaches the trainer. Same weights in engine and
        # trainer (old-logprob pass): the trainer's own routing is the engine's but for near-ties
        # of the random router (HF vs megatron numerics)
        assert 0.9 < r["moe/routing_agreement_min"] <= r["moe/routing_agreement"] <= 1.0
        for layer in (0, 1):
            assert 1.0 <= r[f"moe/load_imbalance/layer_{layer}"] <= 8.0
            assert 0.0 < r[f"moe/router_entropy/layer_{layer}"] <= math.log(8) + 1e-6
