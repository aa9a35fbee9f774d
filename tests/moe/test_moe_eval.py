"""tools/eval.py evaluates Qwen3 and Qwen3-MoE directories with the CPU engine (HFEngine):
avg@k / pass@k / maj@k over a small GSM-style file, one sample line per generation."""

from __future__ import annotations

import json

import pytest

from tests.eval.test_runner import _load_eval_tool, _write_jsonl
from tests.moe.test_moe_e2e import make_tiny_qwen3_moe_dir


@pytest.mark.parametrize("moe", [False, True], ids=["qwen3", "qwen3_moe"])
def test_tools_eval_runs_qwen3(tmp_path, moe):
    model = make_tiny_qwen3_moe_dir(str(tmp_path / "hf"), moe=moe)
    data = _write_jsonl(
        tmp_path / "gsm.jsonl",
        [{"question": "What is 2 + 3?", "answer": "#### 5"}, {"question": "What is 4 + 5?", "answer": "#### 9"}],
    )
    out = tmp_path / "out"
    rc = _load_eval_tool().main(
        [
            "--model",
            model,
            "--data",
            data,
            "--k",
            "2",
            "--max-new-tokens",
            "3",
            "--prompt-style",
            "fewshot",
            "--engine",
            "hf",
            "--out",
            str(out),
            "--seed",
            "1",
            "--reward-workers",
            "1",
            "--no-progress",
        ]
    )
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert summary["n_problems"] == 2 and summary["n_samples_total"] == 4
    assert {"avg@2", "pass@2", "maj@2"} <= set(summary) and len(samples) == 4
