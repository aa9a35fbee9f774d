"""RolloutManager logic with a scripted engine and scorer (no Ray, no model)."""

from __future__ import annotations

import pytest

from megatron_dapo.config import parse_args
from megatron_dapo.data.dataset import PromptRecord, ResumableSampler
from megatron_dapo.driver.batch import assign_advantages
from megatron_dapo.driver.rollout_manager import RolloutManager, RolloutStallError
from megatron_dapo.reward import RewardResult
from tests.driver.scripted import ScriptedEngine, local_pool, sample_index


class Tok:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids)


class ScriptedPool:
    """Prompt i's sample j answers 'R' (right) when pattern(i, j) else 'W'; lengths vary.
    A streaming engine (tests/driver/scripted.py) behind a real EnginePool."""

    def __init__(self, pattern, lengths=None, slots=10**9):
        self.pattern = pattern
        self.lengths = lengths or (lambda i, j: 3)
        self.engine = ScriptedEngine(self._respond, slots=slots)
        self.pool = local_pool([self.engine])

    def _respond(self, req):
        i, j = req.prompt_ids[0], sample_index(req.rid)
        ok = self.pattern(i, j)
        ids = [1 if ok else 0] * self.lengths(i, j)
        return ids, "length" if len(ids) >= req.params.max_new_tokens else "stop"

    def prompts(self):
        """Prompt indices in the order the engine saw their groups."""
        out = []
        for r in self.engine.seen:
            if not out or out[-1][1] != r.group:
                out.append((r.prompt_ids[0], r.group))
        return [i for i, _ in out]


class Scorer:
    def score(self, items):
        rs = [inp.response for inp in items]
        return [RewardResult(1.0 if r.startswith("1") else -1.0, r.startswith("1"), r[:1], "ok") for r in rs]


def _mgr(pattern, argv=(), lengths=None, n_prompts=40):
    cfg = parse_args(
        [
            "--rollout-batch-size",
            "4",
            "--n-samples-per-prompt",
            "4",
            "--global-batch-size",
            "16",
            "--max-response-length",
            "8",
            "--overlong-buffer-length",
            "4",
            *argv,
        ]
    )
    ds = [PromptRecord(i, [i, 7], f"p{i}", "x") for i in range(n_prompts)]
    sampler = ResumableSampler(len(ds), seed=0, shuffle=False)
    pool = ScriptedPool(pattern, lengths)
    return RolloutManager(cfg, ds, sampler, pool.pool, Scorer(), Tok()), pool, cfg


def test_keeps_only_mixed_groups_and_counts():
    # even prompts: mixed (samples 0,1 right); prompts % 4 == 1: all right; % 4 == 3: all wrong
    pattern = lambda i, j: (j < 2) if i % 2 == 0 else (i % 4 == 1)
    mgr, pool, _ = _mgr(pattern, ["--over-sampling-batch-size", "4"])
    res = mgr.collect(1)
    assert len(res.groups) == 4
    assert all(0 < sum(g.accs) < 4 for g in res.groups)
    # a window of 4 prompts: 0-3 end together and are admitted in arrival order; after 1 (all
    # right: keep rate 1/2, 3 more needed) two new prompts take the freed places (4, 5), after 3
    # (all wrong) two more (6, 7); 6 fills the batch, so 7, ended too, is thrown away unverified
    assert [g.prompt_index for g in res.generated] == [0, 1, 2, 3, 4, 5, 6]
    assert pool.prompts() == list(range(8)) and res.submitted_prompts == 8
    assert res.num_gen_batches == 2  # 8 prompts started, windows of 4
    assert res.num_all_correct == 2 and res.num_all_wrong == 1 and res.num_kept == 4
    assert res.discarded_samples == 4 and res.aborted_samples == 0


def test_filter_uses_raw_accuracy_not_shaped_reward():
    # every group is all-correct, but response lengths differ inside the group, so the
    # length-shaped reward (overlong penalty) varies: a reward-based filter would keep them.
    lengths = lambda i, j: 3 + 2 * j  # 3, 5, 7, 9 tokens; L_max 8, L_cache 4 -> penalties differ
    mgr, _, _ = _mgr(lambda i, j: True, ["--max-num-gen-batches", "2", "--over-sampling-batch-size", "4"], lengths)
    with pytest.raises(RolloutStallError, match=r"--max-num-gen-batches 2.*all-correct"):
        mgr.collect(1)


def test_stall_error_says_what_to_change():
    mgr, _, _ = _mgr(lambda i, j: False, ["--max-num-gen-batches", "3"])
    with pytest.raises(RolloutStallError) as e:
        mgr.collect(1)
    msg = str(e.value)
    assert "--max-num-gen-batches" in msg and "--over-sampling-batch-size" in msg and "--dynamic-sampling" in msg


def test_every_extra_generation_round_prints_a_line_and_zero_rounds_is_refused(capsys):
    from megatron_dapo.config import ConfigError, validate

    mgr, _, _ = _mgr(lambda i, j: False, ["--max-num-gen-batches", "3"])
    with pytest.raises(RolloutStallError):
        mgr.collect(1)
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("[rollout] step 1: round")]
    assert [l.split()[4] for l in lines] == ["2", "3"], lines  # rounds 2 and 3 announced, then the error
    # the first prompt of the second window starts as soon as the first group is rejected
    assert "0/4 mixed-correctness groups so far (0 all-correct, 1 all-wrong)" in lines[0]
    cfg = parse_args(["--max-num-gen-batches", "0"])
    with pytest.raises(ConfigError, match="--max-num-gen-batches must be an integer >= 1, got 0"):
        validate(cfg)


def test_dynamic_sampling_off_keeps_everything():
    mgr, _, _ = _mgr(lambda i, j: True, ["--no-dynamic-sampling"])
    res = mgr.collect(1)
    assert len(res.groups) == 4 and res.num_gen_batches == 1


def test_surplus_groups_reused_next_step_with_their_old_logprobs():
    pattern = lambda i, j: j < 2  # every group mixed
    mgr, pool, cfg = _mgr(pattern, ["--over-sampling-batch-size", "6", "--reuse-surplus-groups"])
    r1 = mgr.collect(1)
    assert len(r1.groups) == 4 and len(mgr.surplus) == 2
    # the result names the carried samples whose pi_old the driver computes at the generating step
    assert r1.carried_need_logprobs == [s for g in mgr.surplus for s in g.samples]
    for s in r1.carried_need_logprobs:
        s.old_logprobs = [-1.0] * len(s.response_ids)
    carried = [g.prompt_index for g in mgr.surplus]
    state = mgr.state_dict()
    r2 = mgr.collect(2)
    assert [g.prompt_index for g in r2.groups[:2]] == carried and r2.reused == 2
    assert all(s.step_generated == 1 and s.old_logprobs == [-1.0] * 3 for g in r2.groups[:2] for s in g.samples)
    # the surplus survives a checkpoint
    mgr2, _, _ = _mgr(pattern, ["--over-sampling-batch-size", "6", "--reuse-surplus-groups"])
    mgr2.load_state_dict(state)
    assert [g.prompt_index for g in mgr2.surplus] == carried


def test_overlong_shaping_and_filter_on_samples():
    lengths = lambda i, j: 8 if j == 0 else 3  # sample 0 hits L_max = 8 -> truncated
    mgr, _, cfg = _mgr(lambda i, j: j in (0, 1), [], lengths)
    res = mgr.collect(1)
    samples = assign_advantages(res.groups, cfg.algo)
    first = samples[0]
    assert first.finish_reason == "length" and first.overlong_penalty == pytest.approx(-1.0)
    assert first.train is False  # overlong filtering: no loss on truncated responses
    assert all(s.train for s in samples if s.finish_reason == "stop")
    g0 = samples[:4]
    assert sum(s.advantage for s in g0) == pytest.approx(0.0, abs=1e-9)


def test_reward_sees_the_whole_record_and_is_chosen_by_data_source():
    """Real BatchScorer: rows of source "judged" (no label) go to a plug-in that reads the
    prompt, data source and metadata; rows of other sources keep the built-in dapo checker."""
    from megatron_dapo.reward import BatchScorer

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
            "--dynamic-sampling",
            "false",
            "--over-sampling-batch-size",
            "2",
        ]
    )
    ds = [
        PromptRecord(0, [0, 7], "prompt zero", "", "judged", {"want": "Answer: 1"}),
        PromptRecord(1, [1, 7], "prompt one", "1", "gsm8k"),
    ]

    class Answers(Tok):
        def decode(self, ids, skip_special_tokens=True):
            return f"Answer: {ids[0]}"

    pool = ScriptedPool(lambda i, j: j == 0)  # sample 0 of each prompt answers 1, sample 1 answers 0
    with BatchScorer(
        num_workers=1, timeout_s=30, sources=["judged=tests.driver.record_rewards:judge_by_metadata"]
    ) as scorer:
        assert not scorer.needs_label("judged") and scorer.needs_label("gsm8k")
        mgr = RolloutManager(cfg, ds, ResumableSampler(2, seed=0, shuffle=False), pool.pool, scorer, Answers())
        res = mgr.collect(1)
    by_prompt = {g.prompt_index: g.samples for g in res.groups}
    assert [(s.acc, s.pred) for s in by_prompt[0]] == [
        (True, "judged|prompt zero||Answer: 1"),
        (False, "judged|prompt zero||Answer: 1"),
    ]
    assert [(s.acc, s.pred, s.reason) for s in by_prompt[1]] == [(True, "1", "ok"), (False, "0", "wrong")]


def _broken_reward_mgr(spec, dynamic=True):
    """A real BatchScorer over a reward function of tests/driver/record_rewards.py."""
    from megatron_dapo.reward import BatchScorer

    cfg = parse_args(
        [
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4",
            "--max-response-length", "8", "--overlong-buffer-length", "4", "--over-sampling-batch-size", "2",
            "--max-num-gen-batches", "2", "--dynamic-sampling", str(dynamic).lower(),
            "--reward-fn", f"tests.driver.record_rewards:{spec}",
        ]
    )  # fmt: skip
    ds = [PromptRecord(i, [i, 7], f"prompt {'zero' if i == 0 else i}", "1", "x") for i in range(6)]

    class Answers(Tok):
        def decode(self, ids, skip_special_tokens=True):
            return f"Answer: {ids[0]}"

    pool = ScriptedPool(lambda i, j: j == 0)
    scorer = BatchScorer(num_workers=1, timeout_s=30, reward_fn=cfg.reward.reward_fn)
    mgr = RolloutManager(cfg, ds, ResumableSampler(len(ds), seed=0, shuffle=False), pool.pool, scorer, Answers())
    return mgr, scorer


@pytest.mark.parametrize("dynamic", [True, False])
def test_a_reward_that_fails_on_every_sample_stops_the_step_with_its_own_error(dynamic):
    """Not "the data is too easy or too hard": the reward's TypeError, the flag, the first sample
    (with and without dynamic sampling, which would otherwise train on all -1 rewards)."""
    from megatron_dapo.errors import RewardConfigError

    mgr, scorer = _broken_reward_mgr("wrong_signature", dynamic)
    with scorer, pytest.raises(RewardConfigError) as e:
        mgr.collect(1)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("--reward-fn tests.driver.record_rewards:wrong_signature failed on every")
    assert "TypeError: wrong_signature() got an unexpected keyword argument" in msg
    assert "first on prompt #0: 'prompt zero'" in msg


def test_a_non_finite_reward_is_refused_in_one_line():
    from megatron_dapo.errors import RewardConfigError
    from megatron_dapo.reward.result import RewardResult as RR
    from megatron_dapo.reward.result import to_reward_result

    for bad in (float("inf"), float("-inf"), float("nan")):
        with pytest.raises(ValueError, match="finite"):
            to_reward_result(bad)
        with pytest.raises(ValueError, match="finite"):
            RR(bad, True)
    mgr, scorer = _broken_reward_mgr("infinite")
    with scorer, pytest.raises(RewardConfigError, match="infinite failed on every sample.*returned inf.*finite"):
        mgr.collect(1)


def test_a_reward_that_fails_on_some_samples_warns_once_per_step(capsys):
    mgr, scorer = _broken_reward_mgr("broken_on_prompt_zero", dynamic=False)
    with scorer:
        res = mgr.collect(1)
    out = capsys.readouterr().out
    assert "[reward] step 1: --reward-fn tests.driver.record_rewards:broken_on_prompt_zero failed on 2 of 4" in out
    assert "KeyError" in out and "first on prompt #0" in out
    failed = [s for g in res.groups for s in g.samples if s.reason == "error"]
    assert len(failed) == 2 and all(s.score == -1.0 and "KeyError" in s.reward_error for s in failed)
