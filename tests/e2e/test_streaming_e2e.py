"""Streaming generation end to end on the CPU (issue #25).

* ``python -m megatron_dapo.train``'s main with the HF engine on Ray, --partial-rollout, a
  window of 8 prompts for a batch of 4: the rollout dump's time stamps show groups verified
  before the longest response submitted with them ended; when the batch is full the requests
  still running are aborted and their prefixes carried (checkpointed state, metrics), and the
  next step continues them (``stale_len`` in its dump).
* The same RolloutManager and EnginePool with an in-process HFEngine, greedy: a sample aborted
  at step 1 and continued at step 2 equals the engine's uninterrupted greedy generation (the
  trainer refuses temperature 0, so this part does not go through the driver; the weights do
  not change between the two steps here).
"""

from __future__ import annotations

import json
import os

import pytest

from tests.e2e.fixtures import make_prompts, make_tiny_qwen2_dir
from tests.e2e.test_train_e2e import base_args, read_metrics

pytestmark = [pytest.mark.slow]


def _dump(run, step):
    with open(os.path.join(run, "rollouts", f"step_{step:06d}.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_groups_stream_in_and_aborted_prefixes_continue(tmp_path):
    from megatron_dapo.train import main

    hf = make_tiny_qwen2_dir(str(tmp_path / "hf"))
    prompts = make_prompts(str(tmp_path / "prompts.jsonl"))
    run = str(tmp_path / "run")
    # stop string "e": responses of 1 to 16 tokens (a random model's tokens contain an "e" now and then)
    rc = main(
        base_args(
            hf,
            prompts,
            run,
            **{
                "--num-rollout": "2",
                "--over-sampling-batch-size": "8",
                "--max-response-length": "16",
                "--rollout-stop": "e",
                "--partial-rollout": "true",
                "--no-progress": None,
            },
        )
    )
    assert rc == 0
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    # step 1: the batch filled while requests were running: aborted, their groups carried
    assert rows[0]["rollout_aborted_samples"] > 0 and rows[0]["partial_pending_groups"] > 0
    assert rows[1]["partial_resumed_samples"] > 0

    first = _dump(run, 1)
    assert all(r["submitted_at"] and r["finished_at"] and r["group_scored_at"] for r in first)
    by_sub = {}
    for r in first:
        by_sub.setdefault(r["submitted_at"], []).append(r)
    start = by_sub[min(by_sub)]  # the step's first submission: the whole window at once
    longest_end = max(r["finished_at"] for r in start)
    scored = sorted({r["group_scored_at"] for r in start})
    # a group was verified before a response submitted with it had ended (a blocking batch
    # verifies its groups only after its longest response)
    assert scored[0] < longest_end, (scored, longest_end)
    for r in first:
        assert r["finished_at"] <= r["group_scored_at"]  # verified once its own samples ended

    second = _dump(run, 2)
    continued = [r for r in second if r["stale_len"] > 0]
    assert continued, "step 2 verified no continued prefix"
    assert all(r["response_length"] >= r["stale_len"] for r in continued)


def test_a_continued_sample_equals_the_uninterrupted_greedy_generation():
    from megatron_dapo.config import parse_args
    from megatron_dapo.data.dataset import PromptRecord, ResumableSampler
    from megatron_dapo.driver.engine_pool import EnginePool, LocalTransport
    from megatron_dapo.driver.rollout_manager import RolloutManager
    from megatron_dapo.rollout.base import SamplingParams
    from megatron_dapo.rollout.hf_engine import HFEngine
    from tests.driver.scripted import Scorer
    from tests.rollout.helpers import CharTokenizer, qwen2_config, random_model

    L, tok = 14, CharTokenizer()
    ref = random_model(qwen2_config())
    eng = HFEngine(ref.config, ref.state_dict(), tokenizer=tok, eos_token_ids=[], max_running=6)
    cfg = parse_args(
        [
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--global-batch-size",
            "4",
            "--max-response-length",
            str(L),
            "--overlong-buffer-length",
            "4",
            "--no-dynamic-sampling",
            "--over-sampling-batch-size",
            "6",
            "--partial-rollout",
            "true",
            "--rollout-stop",
            "q",
            "--no-progress",
        ]
    )
    cfg.rollout.temperature = 0.0  # greedy (the driver's validation refuses it for training)
    ds = [PromptRecord(i, [3 + i, 17 + 2 * i, 29 + i][: 2 + i % 2], f"p{i}", "x") for i in range(40)]
    pool = EnginePool(lambda i: eng, 1, lambda handles: None, timeout_s=600.0, transport=LocalTransport())

    class Decode(CharTokenizer):
        def decode(self, ids, skip_special_tokens=True):
            return " ".join(str(i) for i in ids)  # what tests.driver.scripted.Scorer reads

    mgr = RolloutManager(cfg, ds, ResumableSampler(len(ds), seed=0, shuffle=False), pool, Scorer(), Decode())
    r1 = mgr.collect(1)
    assert r1.aborted_samples > 0 and mgr.pending
    prefixes = {g.prompt_index: [list(s.response_ids) for s in g.samples] for g in mgr.pending}
    assert any(p for ps in prefixes.values() for p in ps)
    r2 = mgr.collect(2)
    continued = [g for g in r2.generated if g.prompt_index in prefixes]
    assert any(s.stale_len > 0 for g in continued for s in g.samples)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=L, stop=["q"])
    for g in continued:
        full = eng.generate([ds[g.prompt_index].prompt_ids], greedy)[0][0]
        for s, before in zip(g.samples, prefixes[g.prompt_index]):
            assert s.response_ids[: len(before)] == before
            assert s.response_ids == full.output_ids and s.finish_reason == full.finish_reason
            assert s.engine_logprobs == pytest.approx(full.logprobs, abs=1e-4)
    assert pool.outstanding == 0 or mgr.pending
