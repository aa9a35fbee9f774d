"""The converters never write over what they did not write: a non-empty --save is refused with
one line (exit 2, no traceback) and left as it was; --overwrite writes into it."""

import os
import subprocess
import sys

import pytest

from megatron_dapo.checkpoint.dist_ckpt import CheckpointError
from megatron_dapo.checkpoint.output_dir import check_output_dir
from tests.checkpoint.bodies import ROOT


def _tool(name, *args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("RANK", None), env.pop("WORLD_SIZE", None), env.pop("MEGATRON_DAPO_DEBUG", None)
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", f"{name}.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _snapshot(d):
    return {
        os.path.relpath(os.path.join(r, f), d): os.path.getsize(os.path.join(r, f))
        for r, _, fs in os.walk(d)
        for f in fs
    }


def test_check_output_dir(tmp_path):
    check_output_dir(str(tmp_path / "new"), "--save")  # absent: fine
    (tmp_path / "empty").mkdir()
    check_output_dir(str(tmp_path / "empty"), "--save")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "latest").write_text("step_000004\n")
    with pytest.raises(
        CheckpointError, match=r"--save .*full: the directory is not empty \(1 entries: latest\).*--overwrite"
    ):
        check_output_dir(str(tmp_path / "full"), "--save")
    check_output_dir(str(tmp_path / "full"), "--save", overwrite=True)
    (tmp_path / "f").write_text("x")
    with pytest.raises(CheckpointError, match="is a file"):
        check_output_dir(str(tmp_path / "f"), "--save", overwrite=True)


@pytest.mark.slow
def test_converters_refuse_a_non_empty_save_and_leave_it_untouched(tiny_hf, tiny_ckpt, tmp_path):
    before = _snapshot(tiny_ckpt["llama"])
    p = _tool("convert_hf_to_megatron", "--hf-checkpoint", tiny_hf["llama"], "--save", tiny_ckpt["llama"])
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith("convert_hf_to_megatron.py: error: --save ")
        and "--overwrite" in lines[0]
    ), p.stderr
    assert "Traceback" not in p.stderr and _snapshot(tiny_ckpt["llama"]) == before
    out = tmp_path / "hf"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    p = _tool("convert_megatron_to_hf", "--load", tiny_ckpt["llama"], "--save", str(out))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "not empty" in p.stderr, p.stderr
    assert sorted(os.listdir(out)) == ["notes.txt"]
    p = _tool("convert_megatron_to_hf", "--load", tiny_ckpt["llama"], "--save", str(out), "--overwrite")
    assert p.returncode == 0, p.stdout + p.stderr
    assert (out / "notes.txt").read_text() == "mine" and (out / "config.json").exists()
