"""--partial-rollout: prefixes of aborted generations kept, continued under the new weights,
staleness bound, scored only when the whole group finished, exact resume (no Ray, no model
except the HF engine test)."""

from __future__ import annotations

import io

import pytest
import torch

from megatron_dapo.config import parse_args
from megatron_dapo.data.dataset import PromptRecord, ResumableSampler
from megatron_dapo.driver.batch import Sample
from megatron_dapo.driver.rollout_manager import RolloutManager, extend_sample
from megatron_dapo.reward import RewardResult
from megatron_dapo.rollout.base import GenerationOutput, SamplingParams
from tests.driver.scripted import ScriptedEngine, Tok, local_pool, sample_index


def full_response(i: int, j: int, seed) -> list:
    """What a policy with unchanged weights generates for prompt i, sample j: right (first token 1)
    for j == 0 only (every group mixed); 2 + 2 * (i % 3) + j tokens (prompts 0, 3, 6, ... end
    first); later tokens depend on the request seed."""
    return [1 if j == 0 else 0] + [10 + (i * 7 + j * 3 + t + (seed or 0)) % 40 for t in range(1, 2 + 2 * (i % 3) + j)]


def _respond(req):
    """The rest of ``full_response`` after the prefix the prompt carries ([i, 7] + prefix)."""
    i, prefix = req.prompt_ids[0], req.prompt_ids[2:]
    return full_response(i, sample_index(req.rid), None)[len(prefix) :], "stop"


class AbortingPool:
    """A streaming engine (tests/driver/scripted.py: one token per request per poll) that
    generates ``full_response``, continuing a prefix where the prompt carries one; the manager
    aborts what still runs when the batch is full."""

    def __init__(self, respond=_respond, slots=10**9):
        self.engine = ScriptedEngine(respond, slots=slots)
        self.pool = local_pool([self.engine])

    @property
    def prompts(self):
        return [list(r.prompt_ids) for r in self.engine.seen]

    def clear(self):
        self.engine.seen.clear()


class Scorer:
    def score(self, items):
        return [
            RewardResult(1.0 if x.response.startswith("1 ") else -1.0, x.response.startswith("1 "), "", "ok")
            for x in items
        ]


def _mgr(argv=(), pool=None):
    cfg = parse_args(
        [
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--global-batch-size",
            "4",
            "--max-response-length",
            "8",
            "--overlong-buffer-length",
            "4",
            "--over-sampling-batch-size",
            "6",
            "--partial-rollout",
            "true",
            "--no-progress",
            *argv,
        ]
    )
    ds = [PromptRecord(i, [i, 7], f"p{i}", "x") for i in range(40)]
    sampler = ResumableSampler(len(ds), seed=0, shuffle=False)
    pool = pool or AbortingPool()
    return RolloutManager(cfg, ds, sampler, pool.pool, Scorer(), Tok()), pool, sampler


def _roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def test_aborted_prefixes_are_kept_and_continued_next_step():
    mgr, pool, sampler = _mgr()
    r1 = mgr.collect(1)
    # a window of 6 prompts; groups 0 and 3 (2 and 3 tokens) end first, at the third decode
    # step, and fill the batch; the other four are aborted with 3 tokens per sample
    assert [g.prompt_index for g in r1.groups] == [0, 3] and r1.submitted_prompts == 6
    assert [g.prompt_index for g in mgr.pending] == [1, 2, 4, 5]
    assert r1.partial_pending == 4 and r1.discarded_samples == 0 and r1.aborted_samples == 8
    for g in mgr.pending:
        for s in g.samples:
            assert s.finish_reason == "abort" and len(s.response_ids) == 3 and s.token_versions == [1, 1, 1]
            assert s.score == 0.0 and not s.acc  # not scored before the whole group finished
    state = _roundtrip({"mgr": mgr.state_dict(), "sampler": sampler.state_dict()})
    pool.clear()
    r2 = mgr.collect(2)
    # the engines continue prompt + prefix (the remaining budget) before any new prompt; the
    # continuations of groups 1 and 4 end first and fill the batch; those of 2 and 5 and the
    # new prompts 6 and 7 are aborted in their turn
    assert [p[:2] for p in pool.prompts[:8]] == [[1, 7], [1, 7], [2, 7], [2, 7], [4, 7], [4, 7], [5, 7], [5, 7]]
    assert all(len(p) == 5 for p in pool.prompts[:8]) and pool.prompts[8:] == [[6, 7]] * 2 + [[7, 7]] * 2
    assert r2.partial_resumed == 8 and r2.submitted_prompts == 2
    assert [g.prompt_index for g in r2.groups] == [1, 4]
    for g in r2.groups:
        for j, s in enumerate(g.samples):
            # the same tokens as an uninterrupted generation (the weights did not change here)
            assert s.response_ids == full_response(g.prompt_index, j, None)
            assert s.token_versions == [1, 1, 1] + [2] * (len(s.response_ids) - 3)
            assert s.stale_len == 3 and s.step_generated == 2 and s.finish_reason == "stop"
            assert len(s.engine_logprobs) == len(s.response_ids)
    # group 2 was continued by 2 more tokens, then aborted again: still waiting, both versions
    g2 = {g.prompt_index: g for g in mgr.pending}[2]
    assert all(s.token_versions == [1, 1, 1, 2, 2] and s.finish_reason == "abort" for s in g2.samples)
    assert [g.prompt_index for g in mgr.pending] == [2, 5, 6, 7]
    g6 = {g.prompt_index: g for g in mgr.pending}[6]  # sample 0 (2 tokens) had ended, sample 1 had not
    assert [s.finish_reason for s in g6.samples] == ["stop", "abort"]
    # step 3: group 6 is complete (verified at once: 2 of its tokens of step 2), group 2's
    # continuation (1 and 2 tokens left) ends first; group 5's is aborted again
    pool.clear()
    r3 = mgr.collect(3)
    assert [g.prompt_index for g in r3.groups] == [6, 2]
    for j, s in enumerate(r3.groups[1].samples):
        assert s.response_ids == full_response(2, j, None) and s.stale_len == 5
    # the checkpointed state continues identically
    mgr2, pool2, sampler2 = _mgr()
    mgr2.load_state_dict(state["mgr"])
    sampler2.load_state_dict(state["sampler"])
    r2b = mgr2.collect(2)
    assert [[s.response_ids for s in g.samples] for g in r2b.groups] == [
        [s.response_ids for s in g.samples] for g in r2.groups
    ]
    assert [g.prompt_index for g in mgr2.pending] == [2, 5, 6, 7]


def test_staleness_bound_drops_old_prefixes():
    mgr, pool, _ = _mgr(["--partial-rollout-max-staleness", "1"])
    mgr.collect(1)
    pool.clear()
    r = mgr.collect(3)  # prefixes of step 1 are 2 steps old at step 3 > bound 1
    assert r.partial_dropped == 8 and r.partial_resumed == 8
    # regenerated from the bare prompt, as continuations (n = 1) of an empty prefix
    assert [p for p in pool.prompts[:8]] == [[1, 7], [1, 7], [2, 7], [2, 7], [4, 7], [4, 7], [5, 7], [5, 7]]
    again = [g for g in r.generated if g.prompt_index in (1, 2, 4, 5)]
    assert again
    for g in again:
        for s in g.samples:
            assert s.stale_len == 0 and set(s.token_versions) == {3}


def test_a_group_waits_for_all_its_samples():
    mgr, _, _ = _mgr()
    mgr.collect(1)
    g = mgr.pending[0]
    g.samples[0].finish_reason = "stop"  # one sample finished before the abort, one not
    g.samples[0].response_ids = full_response(g.prompt_index, 0, None)
    g.samples[0].token_versions = [1] * len(g.samples[0].response_ids)
    r = mgr.collect(2)
    done = {x.prompt_index: x for x in r.generated}[g.prompt_index]
    assert done.samples[0].stale_len == len(done.samples[0].response_ids)  # all of it older than step 2
    assert done.samples[1].stale_len == 3 and done.samples[0].acc and not done.samples[1].acc


def test_without_partial_rollout_aborted_samples_are_discarded():
    mgr, _, _ = _mgr(["--partial-rollout", "false"])
    r = mgr.collect(1)
    assert mgr.pending == [] and r.discarded_samples == 8 and r.aborted_samples == 8


def test_extend_sample_cuts_to_the_budget():
    s = Sample(0, [1], [5, 6], [-1.0, -1.0], "abort", "x", token_versions=[1, 1])
    extend_sample(s, GenerationOutput([1, 5, 6], [7, 8, 9], [-2.0] * 3, "stop"), 2, max_len=4)
    assert s.response_ids == [5, 6, 7, 8] and s.finish_reason == "length" and s.token_versions == [1, 1, 2, 2]
    s = Sample(0, [1], [5], [-1.0], "abort", "x", token_versions=[1])
    extend_sample(s, GenerationOutput([1, 5], [7, 2], [-2.0] * 2, "stop"), 2, max_len=3)
    assert s.response_ids == [5, 7, 2] and s.finish_reason == "stop" and s.engine_logprobs == [-1.0, -2.0, -2.0]
    s = Sample(0, [1], [5], [-1.0], "abort", "x", token_versions=[1])
    extend_sample(s, GenerationOutput([1, 5], [7, 8], [-2.0] * 2, "abort"), 2, max_len=3)
    assert s.response_ids == [5, 7, 8] and s.finish_reason == "length"  # aborted at the budget: not continued


class SeededPool(AbortingPool):
    """Deterministic mode: responses depend on the request seed, nothing is aborted."""

    def __init__(self, slots=10**9):
        super().__init__(self._seeded, slots)
        self.engine.abort_requests = self._no_abort

    @staticmethod
    def _seeded(req):
        assert req.params.seed is not None and len(req.prompt_ids) == 2
        return full_response(req.prompt_ids[0], sample_index(req.rid), req.params.seed % 1000), "stop"

    @staticmethod
    def _no_abort(rids=None):
        raise AssertionError("--deterministic --partial-rollout aborted a request")


def _summary(res):
    return [
        (g.prompt_index, [(s.response_ids, s.stale_len, s.token_versions, s.acc) for s in g.samples])
        for g in res.groups
    ]


def test_deterministic_resume_equals_an_uninterrupted_run():
    argv = ["--deterministic", "--partial-rollout-offpolicy", "correct"]
    mgr, _, sampler = _mgr(argv, SeededPool())
    full = [_summary(mgr.collect(step)) for step in (1, 2, 3)]
    first, _, sampler1 = _mgr(argv, SeededPool())
    first.collect(1)
    assert first.pending  # the round's groups beyond the full batch wait, unscored, for step 2
    state = _roundtrip({"mgr": first.state_dict(), "sampler": sampler1.state_dict()})
    resumed, _, sampler2 = _mgr(argv, SeededPool())
    resumed.load_state_dict(state["mgr"])
    sampler2.load_state_dict(state["sampler"])
    assert [_summary(resumed.collect(step)) for step in (2, 3)] == full[1:]
    assert any(s[1] > 0 for _, ss in full[1] for s in ss)  # step 2 trained carried (stale) samples


def test_hf_engine_continues_a_prefix_like_an_uninterrupted_greedy_generation():
    from megatron_dapo.rollout.hf_engine import HFEngine
    from tests.rollout.helpers import qwen2_config, random_model

    ref = random_model(qwen2_config())
    eng = HFEngine(ref.config, ref.state_dict())
    prompts = [[3, 17, 29], [8, 9]]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10, ignore_eos=True)
    full = [o[0] for o in eng.generate(prompts, greedy)]
    head = [o[0] for o in eng.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=4, ignore_eos=True))]
    tail = [
        o[0]
        for o in eng.generate(
            [p + h.output_ids for p, h in zip(prompts, head)],
            SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True),
        )
    ]
    for f, h, t in zip(full, head, tail):
        assert h.output_ids + t.output_ids == f.output_ids
        assert h.logprobs + t.logprobs == pytest.approx(f.logprobs, abs=1e-4)
