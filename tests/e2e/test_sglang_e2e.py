"""DAPO through the driver with the product's rollout engine: ``--rollout-engine sglang`` on a
machine without a GPU runs SGLang 0.5.23's CPU engine (rollout/sglang_cpu.py) in its EngineActor,
fed by the trainer's weight sync (SGLang's own serializer and flattened-bucket payloads).

* A 2-step run of ``megatron_dapo.train`` (the ``python -m megatron_dapo.train`` entry) on the
  tiny Qwen2 of the e2e tests: the probe after every sync compares SGLang's logprobs with
  megatron's (fp32 on both sides), and the hybrid event log records the engine's memory calls as
  the no-ops they are on a CPU. At step 2 the engine's scheduler process is killed
  mid-generation (``--debug-kill-engine-step``): SGLang takes its EngineActor down with it, the
  EnginePool starts a new engine and re-syncs it, and the trainer carries on.
* The dry-run plan says so, and what the CPU engine cannot run is refused in one line.
"""

from __future__ import annotations

import json
import os

import pytest

from megatron_dapo.rollout.sglang_launch import checkpoint_weight_shapes
from tests.e2e.fixtures import make_prompts, make_tiny_qwen2_dir
from tests.e2e.test_train_e2e import base_args, read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.sglang]


def test_a_two_step_dapo_run_on_sglangs_cpu_engine_survives_its_scheduler_dying(tmp_path, caplog):
    from megatron_dapo.train import main

    hf = make_tiny_qwen2_dir(str(tmp_path / "hf"))
    prompts = make_prompts(str(tmp_path / "prompts.jsonl"))
    run = str(tmp_path / "run")
    args = {"--num-rollout": "2", "--rollout-engine": "sglang", "--no-progress": None, "--debug-kill-engine-step": "2"}
    with caplog.at_level("WARNING", logger="megatron_dapo.driver.engine_pool"):
        rc = main(base_args(hf, prompts, run, **args))
    assert rc == 0
    assert "SIGKILL to the engine's its scheduler process (sglang::scheduler" in caplog.text, caplog.text
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["engine_restarts"] for r in rows] == [0, 1]
    for r in rows:
        # every sync was probed (--check-weight-sync-every 1): SGLang's logprobs of the probe against
        # megatron's, both fp32, within --weight-sync-tolerance 1e-5 (the check would have failed the run)
        assert r["weight_sync_probe_diff"] < 1e-4, r
        # and the exact half: every tensor sent was vouched for by SGLang's own parameter hashes
        assert r["weight_sync_checksums_compared"] == len(checkpoint_weight_shapes(hf)), r
        assert r["sync_bytes"] > 0 and r["response_length_mean"] > 0
    with open(os.path.join(run, "config.json")) as f:
        assert json.load(f)["rollout"]["engine"] == "sglang"
    with open(os.path.join(run, "hybrid_events.jsonl")) as f:
        events = [json.loads(line)["events"] for line in f if line.strip()]
    assert events[0][:2] == ["engine_launch_release_noop", "trainer_build"], events[0]
    assert events[1][:3] == ["engine_release_noop", "engine_resume_weights_noop", "sync_weights"], events[1]
    # step 2: the new engine was synced and probed mid-rollout, then came the step's own sync
    assert events[2][:3] == ["sync_weights", "probe_megatron", "probe_engine"], events[2]
    assert events[2][3:6] == ["engine_release_noop", "engine_resume_weights_noop", "sync_weights"], events[2]
    for step in events[1:]:
        assert "engine_resume_kv_cache_noop" in step and step[-1] == "probe_engine", step


def test_the_plan_and_the_refusals_of_sglang_on_a_cpu_machine(tmp_path, capsys):
    from megatron_dapo.train import main

    hf = make_tiny_qwen2_dir(str(tmp_path / "hf"))
    prompts = make_prompts(str(tmp_path / "prompts.jsonl"))
    args = base_args(hf, prompts, str(tmp_path / "run"), **{"--rollout-engine": "sglang"})
    assert main(args + ["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "target: CPU" in out and "rollout engine sglang" in out
    assert "on this CPU machine: SGLang's CPU engine cannot release memory" in out
    refused = "--deterministic with --rollout-engine sglang on a CPU machine: SGLang refuses deterministic inference"
    assert main(args + ["--deterministic", "--dry-run"]) != 0
    assert f"[check] FAIL config: {refused}" in capsys.readouterr().out
    try:  # a real start is refused the same way, in one line, before anything starts
        code = main(args + ["--deterministic"])
    except SystemExit as e:
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and refused in lines[0] and "Traceback" not in err, err
    assert not os.path.exists(tmp_path / "run")
