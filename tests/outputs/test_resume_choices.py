"""Issue 38, item 7: a resume with another --seed is refused in one line (the data order of the
current epoch and every random stream derive from the seed: honouring a new one would repeat
and skip prompts while saying "exact resume"); a resume with nothing left to do says so and
starts nothing."""

from __future__ import annotations

import os

import pytest
import torch

from megatron_dapo.config import ConfigError, parse_args
from megatron_dapo.outputs import checkpoint_dirs as cd
from megatron_dapo.outputs import run_lock
from megatron_dapo.outputs.run_dir import prepare_outputs


@pytest.fixture(autouse=True)
def _release():
    yield
    run_lock.release_all()


def _save(save, step, seed):
    tmp = cd.tmp_dir(str(save), step)
    os.makedirs(tmp)
    state = {"step": step, "run_id": "r", "sampler": {"epoch": 0, "position": 8, "size": 40, "seed": seed}}
    torch.save(state, os.path.join(tmp, cd.STATE_FILE))
    cd.commit(str(save), step, 5, "r")


def _cfg(tmp_path, save, *extra):
    return parse_args(["--run-dir", str(tmp_path / "run"), "--load", str(save), "--save", str(save), *extra])


def test_a_changed_seed_is_refused_and_the_same_seed_resumes(tmp_path):
    save = tmp_path / "ckpt"
    _save(save, 2, seed=3)
    with pytest.raises(ConfigError) as e:
        prepare_outputs(_cfg(tmp_path, save, "--seed", "5", "--num-rollout", "4"))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("--seed 5: the resumed run") and "--seed 3" in msg
    out = prepare_outputs(_cfg(tmp_path, save, "--seed", "3", "--num-rollout", "4"))
    assert out.resume_step == 2 and not out.nothing_to_do


def test_a_resume_with_nothing_left_to_do_says_so(tmp_path):
    save = tmp_path / "ckpt"
    _save(save, 4, seed=1234)
    out = prepare_outputs(_cfg(tmp_path, save, "--num-rollout", "4"))
    assert out.nothing_to_do
    assert any("step 4 is already done and --num-rollout is 4: nothing left to do" in line for line in out.lines)
