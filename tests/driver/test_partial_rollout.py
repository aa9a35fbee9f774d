"""--partial-rollout: prefixes of aborted generations kept, continued under the new weights,
staleness bound, scored only when the whole group finished, exact resume (no Ray, no model
except the HF engine test)."""

from __future__ import annotations

import io

import pytest
import torch

from megatron_dapo.config import parse_args
from megatron_dapo.data.dataset import PromptRecord, ResumableSampler
from megatron_dapo.driver.rollout_manager import RolloutManager, extend_sample
from megatron_dapo.driver.batch import Sample
from megatron_dapo.reward import RewardResult
from megatron_dapo.rollout.base import GenerationOutput, SamplingParams


class Tok:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids)


def full_response(i: int, j: int, seed) -> list:
    """What a policy with unchanged weights generates for prompt i, sample j: right (first token 1)
    for j == 0 only (every group mixed); length 5 + j; later tokens depend on the request seed."""
    return [1 if j == 0 else 0] + [10 + (i * 7 + j * 3 + t + (seed or 0)) % 40 for t in range(1, 5 + j)]


class AbortingPool:
    """Engines that generate ``full_response`` (continuing a prefix where the prompt carries one).
    When ``on_result`` says stop, the next ``len(handles)`` chunks are the in-flight ones: they come
    back aborted after ``cut`` tokens; the chunks after them were never started."""

    def __init__(self, n_engines=2, cut=2):
        self.handles = [object()] * n_engines
        self.restarts = 0
        self.cut = cut
        self.prompts = []  # every prompt the engines saw, in order

    def _generate(self, prompt, params, limit=None):
        i, base = prompt[0], prompt[2:]  # prompt = [i, 7] + prefix (a continuation) or [i, 7]
        outs = []
        for j in range(params.n):
            # a continuation (n = 1) continues the sample its prefix's first token names
            full = full_response(i, j if params.n > 1 else _sample_index(base), None)
            ids = full[len(base):][: params.max_new_tokens]
            fin = "stop" if len(base) + len(ids) == len(full) else "length"
            if limit is not None and len(ids) > limit:
                ids, fin = ids[:limit], "abort"
            outs.append(GenerationOutput(list(prompt), ids, [-0.5] * len(ids), fin))
        return outs

    def run_chunks(self, chunks, on_result, ordered, on_leftover=None):
        for k, (prompts, params) in enumerate(chunks):
            self.prompts.extend(list(p) for p in prompts)
            if on_result(k, [self._generate(p, params) for p in prompts]) and not ordered:
                rest = list(range(k + 1, len(chunks)))
                for kk in rest[: len(self.handles)]:
                    ps, pr = chunks[kk]
                    self.prompts.extend(list(p) for p in ps)
                    on_leftover(kk, [self._generate(p, pr, limit=self.cut) for p in ps])
                for kk in rest[len(self.handles):]:
                    on_leftover(kk, None)
                return


def _sample_index(prefix):
    # only sample 0 starts with 1 (right); with G = 2 the other one is sample 1
    return 0 if prefix and prefix[0] == 1 else 1


class Scorer:
    def score(self, items):
        return [RewardResult(1.0 if x.response.startswith("1 ") else -1.0, x.response.startswith("1 "), "", "ok")
                for x in items]


def _mgr(argv=(), pool=None):
    cfg = parse_args(["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4",
                      "--max-response-length", "8", "--overlong-buffer-length", "4", "--over-sampling-batch-size", "6",
                      "--partial-rollout", "true", *argv])
    ds = [PromptRecord(i, [i, 7], f"p{i}", "x") for i in range(40)]
    sampler = ResumableSampler(len(ds), seed=0, shuffle=False)
    pool = pool or AbortingPool()
    return RolloutManager(cfg, ds, sampler, pool, Scorer(), Tok()), pool, sampler


def _roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def test_aborted_prefixes_are_kept_and_continued_next_step():
    mgr, pool, sampler = _mgr()
    r1 = mgr.collect(1)
    # 6 prompts in 4 chunks [0, 4], [1, 5], [2], [3]: chunk 0 fills the batch; chunks 1 and 2 were
    # in flight (aborted after 2 tokens), chunk 3 never started
    assert [g.prompt_index for g in r1.groups] == [0, 4]
    assert [g.prompt_index for g in mgr.pending] == [1, 5, 2] and mgr.pending_prompts == [3]
    assert r1.partial_pending == 3 and r1.discarded_samples == 0
    for g in mgr.pending:
        for s in g.samples:
            assert s.finish_reason == "abort" and len(s.response_ids) == 2 and s.token_versions == [1, 1]
            assert s.score == 0.0 and not s.acc  # not scored before the whole group finished
    state = _roundtrip({"mgr": mgr.state_dict(), "sampler": sampler.state_dict()})
    pool.prompts.clear()
    r2 = mgr.collect(2)
    # the engines continue prompt + prefix (remaining budget) before any new prompt, in the first
    # round; the continuations of groups 1 and 5 fill the batch, so the one of group 2 and the
    # first new chunk (kept prompt 3 first, then 9) are in flight and aborted in their turn
    assert [p[:2] for p in pool.prompts[:6]] == [[1, 7], [1, 7], [5, 7], [5, 7], [2, 7], [2, 7]]
    assert all(len(p) == 4 for p in pool.prompts[:6]) and pool.prompts[6] == [3, 7]
    assert r2.num_gen_batches == 1 and r2.partial_resumed == 6
    assert [g.prompt_index for g in r2.groups] == [1, 5]
    for g in r2.groups:
        for j, s in enumerate(g.samples):
            # the same tokens as an uninterrupted generation (the weights did not change here)
            assert s.response_ids == full_response(g.prompt_index, j, None)
            assert s.token_versions == [1, 1] + [2] * (len(s.response_ids) - 2)
            assert s.stale_len == 2 and s.step_generated == 2 and s.finish_reason == "stop"
            assert len(s.engine_logprobs) == len(s.response_ids)
    # group 2 was continued by 2 more tokens, then aborted again: still waiting, both versions
    g2 = {g.prompt_index: g for g in mgr.pending}[2]
    assert all(s.token_versions == [1, 1, 2, 2] and s.finish_reason == "abort" for s in g2.samples)
    assert [g.prompt_index for g in mgr.pending] == [2, 3, 9] and mgr.pending_prompts == [6, 10, 7, 8]
    # step 3: the continuations of groups 2 and 3 fill the batch (group 2 with 4 stale tokens per
    # sample); group 9's is aborted a second time; the first new chunk starts with kept prompt 6
    pool.prompts.clear()
    r3 = mgr.collect(3)
    assert [g.prompt_index for g in r3.groups] == [2, 3] and pool.prompts[6] == [6, 7]
    for j, s in enumerate(r3.groups[0].samples):
        assert s.response_ids == full_response(2, j, None) and s.stale_len == 4
    g9 = {g.prompt_index: g for g in mgr.pending}[9]
    assert all(s.token_versions == [2, 2, 3, 3] and s.finish_reason == "abort" for s in g9.samples)
    # the checkpointed state continues identically
    mgr2, pool2, sampler2 = _mgr()
    mgr2.load_state_dict(state["mgr"])
    sampler2.load_state_dict(state["sampler"])
    r2b = mgr2.collect(2)
    assert [[s.response_ids for s in g.samples] for g in r2b.groups] == [[s.response_ids for s in g.samples]
                                                                         for g in r2.groups]
    assert [g.prompt_index for g in mgr2.pending] == [2, 3, 9]


def test_staleness_bound_drops_old_prefixes():
    mgr, pool, _ = _mgr(["--partial-rollout-max-staleness", "1"])
    mgr.collect(1)
    pool.prompts.clear()
    r = mgr.collect(3)  # prefixes of step 1 are 2 steps old at step 3 > bound 1
    assert r.partial_dropped == 6 and r.partial_resumed == 6
    # regenerated from the bare prompt, as continuations (n = 1) of an empty prefix
    assert [p[0] for p in pool.prompts[:6]] == [1, 1, 5, 5, 2, 2] and all(len(p) == 2 for p in pool.prompts[:6])
    again = [g for g in r.generated if g.prompt_index in (1, 5, 2)]
    assert again
    for g in again:
        for s in g.samples:
            assert s.stale_len == 0 and set(s.token_versions) == {3}


def test_a_group_waits_for_all_its_samples():
    mgr, _, _ = _mgr()
    mgr.collect(1)
    g = mgr.pending[0]
    g.samples[0].finish_reason = "stop"  # one sample finished in the aborted chunk, one not
    g.samples[0].response_ids = full_response(g.prompt_index, 0, None)
    g.samples[0].token_versions = [1] * len(g.samples[0].response_ids)
    r = mgr.collect(2)
    done = {x.prompt_index: x for x in r.generated}[g.prompt_index]
    assert done.samples[0].stale_len == len(done.samples[0].response_ids)  # all of it older than step 2
    assert done.samples[1].stale_len == 2 and done.samples[0].acc and not done.samples[1].acc


def test_without_partial_rollout_aborted_samples_are_discarded():
    mgr, _, _ = _mgr(["--partial-rollout", "false"])
    r = mgr.collect(1)
    assert mgr.pending == [] and mgr.pending_prompts == [] and r.discarded_samples == 6


def test_extend_sample_cuts_to_the_budget():
    s = Sample(0, [1], [5, 6], [-1.0, -1.0], "abort", "x", token_versions=[1, 1])
    extend_sample(s, GenerationOutput([1, 5, 6], [7, 8, 9], [-2.0] * 3, "stop"), 2, max_len=4)
    assert s.response_ids == [5, 6, 7, 8] and s.finish_reason == "length" and s.token_versions == [1, 1, 2, 2]
    s = Sample(0, [1], [5], [-1.0], "abort", "x", token_versions=[1])
    extend_sample(s, GenerationOutput([1, 5], [7, 2], [-2.0] * 2, "stop"), 2, max_len=3)
    assert s.response_ids == [5, 7, 2] and s.finish_reason == "stop" and s.engine_logprobs == [-1.0, -2.0, -2.0]


class SeededPool(AbortingPool):
    """Deterministic mode: responses depend on the request seed, nothing is aborted."""

    def _generate(self, prompt, params, limit=None):
        assert limit is None and params.seed is not None
        i = prompt[0]
        outs = []
        for j in range(params.n):
            full = full_response(i, j, params.seed % 1000)
            outs.append(GenerationOutput(list(prompt), full, [-0.5] * len(full), "stop"))
        return outs


def _summary(res):
    return [(g.prompt_index, [(s.response_ids, s.stale_len, s.token_versions, s.acc) for s in g.samples])
            for g in res.groups]


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
    tail = [o[0] for o in eng.generate([p + h.output_ids for p, h in zip(prompts, head)],
                                       SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True))]
    for f, h, t in zip(full, head, tail):
        assert h.output_ids + t.output_ids == f.output_ids
        assert h.logprobs + t.logprobs == pytest.approx(f.logprobs, abs=1e-4)
