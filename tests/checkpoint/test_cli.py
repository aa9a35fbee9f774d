"""The tools as a user runs them: separate processes, a world of one, no torchrun."""

import os
import subprocess
import sys

import pytest
import torch

from tests.checkpoint.bodies import ROOT

pytestmark = [pytest.mark.slow]


def run_tool(name, *args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("RANK", None), env.pop("WORLD_SIZE", None)
    p = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", f"{name}.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    # the known-harmless library warnings are filtered at the entry point (megatron_dapo/known_warnings.py)
    assert "Warning:" not in p.stderr, p.stderr[-3000:]
    return p.stdout


def test_cli_round_trip(tiny_hf, tmp_path):
    """No --dtype: the fp32 source stays fp32, and the round trip is bit-for-bit lossless."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    ck, out = str(tmp_path / "ck"), str(tmp_path / "hf")
    src = load_file(f"{tiny_hf['llama']}/model.safetensors")
    assert {t.dtype for t in src.values()} == {torch.float32}
    assert "[fp32 (the source dtype), torch_dist]" in run_tool(
        "convert_hf_to_megatron", "--hf-checkpoint", tiny_hf["llama"], "--save", ck
    )
    run_tool("convert_megatron_to_hf", "--load", ck, "--save", out)
    got = load_file(f"{out}/model.safetensors")
    assert set(got) == set(src)
    assert all(got[k].dtype == torch.float32 and torch.equal(got[k], src[k]) for k in got)
    tokens = torch.arange(12).view(1, 12)
    a = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    b = AutoModelForCausalLM.from_pretrained(tiny_hf["llama"], local_files_only=True).eval()
    with torch.no_grad():
        assert torch.equal(a(tokens).logits, b(tokens).logits)
