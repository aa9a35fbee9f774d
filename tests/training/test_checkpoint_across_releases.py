"""A trainer checkpoint written by megatron-core 0.16.1 (the compatibility stack) loads on the
release installed here, 0.19 on the primary stack (issue #43).

tests/fixtures/mc0161_checkpoint/ holds a checkpoint that ``make_fixture.py`` wrote on 0.16.1 (a
tiny Qwen2 after two DAPO optimizer steps, the plain optimizer at TP1) and what loading it on
0.16.1 restored. A load here must restore the same bits: every weight, both Adam moments of every
parameter, the learning rate and the scheduler's step (the load copies stored tensors, it
computes nothing, so there is no tolerance); and the run goes on from it (one more step, finite
loss). The other direction (0.19's layout on 0.16.1) is one line:
tests/training/test_reshard_resume.py::test_a_checkpoint_in_megatron_core_019s_layout.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import pytest
import torch

from megatron_dapo.checkpoint import dist_ckpt
from tests.tiny import tiny_qwen2_config
from tests.training import reshard_bodies as bodies

pytestmark = [pytest.mark.gloo]

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "mc0161_checkpoint"
CFG = tiny_qwen2_config(
    vocab_size=300,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
)
LAYOUT: dict = {}  # one rank, TP1, the plain optimizer


def test_the_fixture_was_written_by_megatron_core_0161():
    meta = dist_ckpt.read_metadata(str(FIXTURE / "checkpoint"))
    assert meta["megatron_core_version"] == "0.16.1", meta
    assert dist_ckpt.common_state_layout(str(FIXTURE / "checkpoint")) == "common.pt"


def test_a_0161_checkpoint_loads_here_bit_for_bit(gloo, tmp_path):
    ck = str(tmp_path / "checkpoint")
    shutil.copytree(FIXTURE / "checkpoint", ck)  # the load must not need to write into it, but a copy is cheap
    want = torch.load(FIXTURE / "expected.pt", weights_only=True)
    got = gloo(1).run(bodies.loaded_state, CFG, LAYOUT, ck)[0]
    assert got["weights"].keys() == want["weights"].keys()
    assert got["adam"].keys() == want["adam"].keys() and want["adam"]
    for part in ("weights", "adam"):
        for k, t in want[part].items():
            assert torch.equal(got[part][k], t), (part, k, float((got[part][k] - t).abs().max()))
    assert got["lr"] == want["lr"] and got["step"] == want["step"] == 2, (got["lr"], got["step"], want["lr"])
    out = gloo(1).run(bodies.resume_and_step, CFG, LAYOUT, ck)[0]  # and the run goes on from it
    assert math.isfinite(out["grad_norm"]) and out["grad_norm"] > 0
    assert sorted(os.listdir(ck)) == sorted(os.listdir(FIXTURE / "checkpoint"))  # nothing written into it
