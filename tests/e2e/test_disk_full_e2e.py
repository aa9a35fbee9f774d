"""Issue 38, item 5, through the real driver: the device refuses step 2's rollout dump (its file is
a link to /dev/full, which answers every write with ENOSPC). The run stops with one line naming
the path and what it was writing (exit 2, no traceback), after its cleanup; step 1's checkpoint,
``latest`` and metrics stay as they were."""

from __future__ import annotations

import os

import pytest

from megatron_dapo.outputs import checkpoint_dirs as cd
from tests.e2e.fixtures import make_prompts, make_tiny_qwen2_dir
from tests.e2e.test_train_e2e import base_args, read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")]


def test_a_full_disk_stops_the_run_in_one_line_and_keeps_the_last_checkpoint(tmp_path, capfd):
    from megatron_dapo.train import main

    hf = make_tiny_qwen2_dir(str(tmp_path / "hf"))
    prompts = make_prompts(str(tmp_path / "prompts.jsonl"))
    run, save = tmp_path / "run", tmp_path / "ckpt"
    os.makedirs(run / "rollouts")
    os.symlink("/dev/full", run / "rollouts" / "step_000002.jsonl")
    args = {"--num-rollout": "2", "--no-progress": None, "--save": str(save), "--save-interval": "1"}
    capfd.readouterr()
    rc = main(base_args(hf, prompts, str(run), **args))
    err = capfd.readouterr().err
    assert rc == 2, err[-3000:]
    assert "Traceback" not in err
    lines = [x for x in err.splitlines() if "refused the write" in x]
    assert len(lines) == 1 and "step 2: dumping its rollouts (--dump-rollouts-every)" in lines[0], err[-3000:]
    assert f"the device of {run / 'rollouts'}" in lines[0]
    assert [r["step"] for r in read_metrics(str(run))] == [1]
    assert cd.resolve(str(save)).endswith("step_000001")
    assert os.path.exists(os.path.join(cd.resolve(str(save)), "checksums.json"))
