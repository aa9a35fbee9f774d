"""Issue 38, item 5: a write the device refuses (ENOSPC, EDQUOT; torch's writer on a full disk)
is one line naming the path, what was being written and the space needed and free; the partial
checkpoint is removed and the previous one and ``latest`` stay as they were. The full device is
the kernel's own: /dev/full refuses every write with ENOSPC."""

from __future__ import annotations

import os
import types

import pytest
import torch

from megatron_dapo.driver.logging import MetricsLogger
from megatron_dapo.errors import DiskFullError, is_disk_full, one_line, writing
from megatron_dapo.outputs import checkpoint_dirs as cd
from megatron_dapo.train import Trainer
from tests.e2e.fixtures import make_tiny_qwen2_dir

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")


def test_a_refused_write_is_one_line_naming_the_path(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    os.symlink("/dev/full", metrics)
    logger = MetricsLogger(str(tmp_path), {}, None, "disabled", False, run_id="r")
    with pytest.raises(DiskFullError) as e:
        with writing(str(metrics), "step 4: writing its metrics"):
            logger.log({"step": 4, "loss": 1.0})
    line = one_line(e.value)
    assert "\n" not in line and line.startswith(f"step 4: writing its metrics: the device of {metrics} refused the write")
    assert "free there" in line
    # torch's writer loses the errno on a full device ("unexpected pos", "iostream error"): still recognised
    with pytest.raises(Exception) as raw:
        torch.save({"w": torch.zeros(1000)}, "/dev/full")
    assert is_disk_full(raw.value)
    assert not is_disk_full(ValueError("a bug"))


def test_a_checkpoint_save_on_a_full_disk_keeps_the_previous_one_and_latest(tmp_path):
    """Trainer.save_checkpoint with the ranks' writer landing on a full device (the trainer
    state goes to /dev/full through a link in the step's temporary directory)."""
    save = tmp_path / "ckpt"
    os.makedirs(cd.tmp_dir(str(save), 2))
    torch.save({"step": 2, "run_id": "r"}, os.path.join(cd.tmp_dir(str(save), 2), cd.STATE_FILE))
    cd.commit(str(save), 2, 5, "r")

    def rank_save(tmp, meta):  # what the ranks write: a shard, then the device is full
        os.makedirs(tmp, exist_ok=True)
        (open(os.path.join(tmp, "__0_0.distcp"), "wb")).close()
        os.symlink("/dev/full", os.path.join(tmp, "common.pt"))
        torch.save({"w": torch.zeros(10_000)}, os.path.join(tmp, "common.pt"))

    t = Trainer.__new__(Trainer)
    t.cfg = types.SimpleNamespace(
        checkpoint=types.SimpleNamespace(save=str(save), keep_last=2),
        model=types.SimpleNamespace(bf16=False, lora_rank=0),
        run=types.SimpleNamespace(crash_during_save_at_step=None),
    )
    t.step, t.run_id, t.hf_dir = 3, "r", make_tiny_qwen2_dir(str(tmp_path / "hf"))
    t.arch = types.SimpleNamespace(num_parameters=1_000_000)
    t.hybrid = types.SimpleNamespace(while_trainer_resident=lambda fn, *a: fn(*a))
    t.trainers = types.SimpleNamespace(save=rank_save)
    with pytest.raises(DiskFullError) as e:
        t.save_checkpoint()
    line = one_line(e.value)
    assert line.startswith(f"step 3: saving the checkpoint: the device of {save} refused the write")
    assert "about 11.4 MiB needed" in line and "the previous checkpoint step_000002 and 'latest' are intact" in line
    assert not os.path.exists(cd.tmp_dir(str(save), 3))  # the partial save is gone
    assert cd.resolve(str(save)).endswith("step_000002") and [n for _, n in cd.steps(str(save))] == ["step_000002"]
