"""A DAPO run on the CPU through ``python -m megatron_dapo.train``'s main with --partial-rollout
and --tis-mode token-truncate (HFEngine on Ray, 2 gloo ranks, tiny random Qwen2).

The importance weights compare like with like (the engines return logprobs at the rollout
temperature, as the trainer computes them): the mismatch KL is ~0 and the weights ~1; the
partial-rollout and TIS metrics are logged every step; the rollout manager's carried work is
in the checkpoint.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from tests.e2e.fixtures import make_prompts, make_tiny_qwen2_dir
from tests.e2e.test_train_e2e import base_args, read_metrics

pytestmark = [pytest.mark.slow]


def test_partial_rollout_and_tis_steps(tmp_path):
    from megatron_dapo.outputs import checkpoint_dirs as checkpoints
    from megatron_dapo.train import main

    hf = make_tiny_qwen2_dir(str(tmp_path / "hf"))
    prompts = make_prompts(str(tmp_path / "prompts.jsonl"))
    run, ckpt = str(tmp_path / "run"), str(tmp_path / "ckpt")
    rc = main(
        base_args(
            hf,
            prompts,
            run,
            **{
                "--actor-num-gpus-per-node": "2",
                "--num-rollout": "2",
                "--over-sampling-batch-size": "8",
                "--rollout-temperature": "0.8",
                "--partial-rollout": "true",
                "--partial-rollout-offpolicy": "mask",
                "--tis-mode": "token-truncate",
                "--tis-cap": "2",
                "--save": ckpt,
                "--save-interval": "2",
            },
        )
    )
    assert rc == 0
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        for k in (
            "tis_weight_mean",
            "tis_clip_frac",
            "mismatch_kl",
            "offpolicy_token_frac",
            "partial_resumed_samples",
            "partial_dropped_prefixes",
            "partial_pending_groups",
        ):
            assert k in r and math.isfinite(r[k]), k
        # same weights, tempered logprobs on both sides: no mismatch to correct
        assert r["mismatch_kl"] < 1e-6 and abs(r["tis_weight_mean"] - 1.0) < 1e-3 and r["tis_clip_frac"] == 0.0
        assert r["train_infer_logprob_diff"] < 1e-4
        assert 0.0 <= r["offpolicy_token_frac"] <= 1.0
        assert math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0
    state = torch.load(os.path.join(checkpoints.resolve(ckpt), checkpoints.STATE_FILE), weights_only=False)
    carried = state["rollout_manager"]
    assert {"pending", "surplus"} <= set(carried)
    assert len(carried["pending"]) == rows[-1]["partial_pending_groups"]
