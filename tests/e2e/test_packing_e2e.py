"""A full DAPO run on the CPU with packed micro-batches and context parallelism 2
(``python -m megatron_dapo.train``'s main: HFEngine on Ray, gloo ranks, tiny random Qwen2).

The trainer's old logprobs (packed, zigzag-split over the CP pair, gathered back) agree with
the engine's (train_infer_logprob_diff), the weight-sync probe passes after every step, the
optimizer steps are finite and the DP token imbalance is reported by the worker.
"""

from __future__ import annotations

import math

import pytest

from tests.e2e.fixtures import make_prompts, make_tiny_qwen2_dir
from tests.e2e.test_train_e2e import base_args, read_metrics

pytestmark = [pytest.mark.slow]


def test_cp2_packed_dapo_steps(tmp_path):
    from megatron_dapo.train import main

    hf = make_tiny_qwen2_dir(str(tmp_path / "hf"))
    prompts = make_prompts(str(tmp_path / "prompts.jsonl"))
    run = str(tmp_path / "run")
    rc = main(
        base_args(
            hf,
            prompts,
            run,
            **{
                "--actor-num-gpus-per-node": "2",
                "--context-parallel-size": "2",
                "--use-packing": None,
                "--max-tokens-per-gpu": "160",
                "--num-rollout": "2",
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
