"""Samples with no trainable token are not kept as training samples (issue #25 point 2).

A sample whose every response token carries no gradient (generated entirely under older
weights with ``--partial-rollout-offpolicy mask``, overlong-filtered, or empty) still counts in
its group's advantage statistics but is left out of the trainer's list
(``driver/batch.py training_samples``); the rollout step keeps the configured number of
optimizer steps, over near-equal mini-batches (``minibatches``). A mixed group whose every
sample is entirely stale under ``mask`` is not kept by the rollout manager at all. The
scenarios come from the real RolloutManager with partial rollout over a scripted streaming
engine.
"""

from __future__ import annotations

import types

import pytest

from megatron_dapo.config import parse_args
from megatron_dapo.data.dataset import PromptRecord, ResumableSampler
from megatron_dapo.driver.batch import (
    Sample,
    assign_advantages,
    has_trainable_token,
    minibatches,
    optimizer_steps,
    training_samples,
)
from megatron_dapo.driver.rollout_manager import RolloutManager
from megatron_dapo.reward import RewardResult
from tests.driver.scripted import ScriptedEngine, Tok, local_pool, sample_index

P = 2  # prompt length: [i, 7]


def _respond(req):
    """Prompt i, sample 0: right, 2 tokens. Sample 1: wrong, 2 tokens for an even i, 6 for an
    odd one; prompts from 4 on answer slowly (8 tokens each), so a step-2 batch is made of the
    continued groups. A continuation gets the rest after the prefix the prompt carries."""
    i, j = req.prompt_ids[0], sample_index(req.rid)
    if i >= 4:
        full = [1 if j == 0 else 0] + [20] * 7
    elif j == 0:
        full = [1, 21]
    else:
        full = [0] + [22] * (1 if i % 2 == 0 else 5)
    return full[len(req.prompt_ids) - P :], "stop"


class Scorer:
    def score(self, items):
        return [
            RewardResult(1.0 if x.response.startswith("1") else -1.0, x.response.startswith("1"), "", "ok")
            for x in items
        ]


def _manager(offpolicy: str):
    cfg = parse_args(
        [
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--global-batch-size",
            "2",
            "--max-response-length",
            "8",
            "--overlong-buffer-length",
            "4",
            "--over-sampling-batch-size",
            "4",
            "--partial-rollout",
            "true",
            "--partial-rollout-offpolicy",
            offpolicy,
            "--no-progress",
        ]
    )
    ds = [PromptRecord(i, [i, 7], f"p{i}", "x") for i in range(40)]
    pool = local_pool([ScriptedEngine(_respond)])
    return cfg, RolloutManager(cfg, ds, ResumableSampler(len(ds), seed=0, shuffle=False), pool, Scorer(), Tok())


def test_a_sample_generated_under_older_weights_is_left_out_under_mask_but_counts_in_its_group():
    cfg, mgr = _manager("mask")
    assert optimizer_steps(cfg) == 2
    r1 = mgr.collect(1)
    # step 1: prompts 0 and 2 end at the second decode step and fill the batch; in prompts 1
    # and 3 sample 0 has ended (2 tokens) while sample 1 is aborted after 2 of its 6 tokens
    assert [g.prompt_index for g in r1.groups] == [0, 2]
    assert r1.aborted_samples == 2 and [g.prompt_index for g in mgr.pending] == [1, 3]
    s1 = assign_advantages(r1.groups, cfg.algo)
    kept, left = training_samples(s1, optimizer_steps(cfg), 1, "mask")
    assert kept == s1 and left == 0  # everything generated under this step's weights

    r2 = mgr.collect(2)
    assert [g.prompt_index for g in r2.groups] == [1, 3]
    samples = assign_advantages(r2.groups, cfg.algo)
    done_early = [g.samples[0] for g in r2.groups]
    continued = [g.samples[1] for g in r2.groups]
    # sample 0 was generated entirely at step 1: every token stale; sample 1 has 2 stale + 4 fresh
    assert [(s.stale_len, len(s.response_ids)) for s in done_early] == [(2, 2), (2, 2)]
    assert [(s.stale_len, len(s.response_ids)) for s in continued] == [(2, 6), (2, 6)]
    # the stale sample still counts in its group's statistics: with it the wrong sample's
    # advantage is negative (alone in its group it would be 0)
    assert all(s.advantage < -0.5 for s in continued) and all(s.advantage > 0.5 for s in done_early)

    train, left = training_samples(samples, optimizer_steps(cfg), 1, "mask")
    assert train == continued and left == 2
    mbs = minibatches(train, optimizer_steps(cfg), 1)
    assert [len(mb) for mb in mbs] == [1, 1]  # the configured 2 optimizer steps, smaller mini-batches


def test_under_correct_a_stale_sample_is_trained():
    cfg, mgr = _manager("correct")
    mgr.collect(1)
    r2 = mgr.collect(2)
    samples = assign_advantages(r2.groups, cfg.algo)
    assert any(s.stale_len == len(s.response_ids) for s in samples)
    train, left = training_samples(samples, optimizer_steps(cfg), 1, "correct")
    assert train == samples and left == 0
    assert [len(mb) for mb in minibatches(train, optimizer_steps(cfg))] == [2, 2]


def _respond_carried(req):
    """Prompts 0 and 1: 2 tokens per sample (sample 0 right); prompt 2: 6; later ones: 3."""
    i, j = req.prompt_ids[0], sample_index(req.rid)
    n = 2 if i < 2 else (6 if i == 2 else 3)
    return ([1 if j == 0 else 0] + [20] * (n - 1))[len(req.prompt_ids) - P :], "stop"


@pytest.mark.parametrize("offpolicy", ["mask", "correct"])
def test_a_carried_group_generated_entirely_under_older_weights_takes_no_place_under_mask(offpolicy):
    cfg = parse_args(
        [
            "--rollout-batch-size",
            "1",
            "--n-samples-per-prompt",
            "2",
            "--global-batch-size",
            "2",
            "--max-response-length",
            "8",
            "--overlong-buffer-length",
            "4",
            "--over-sampling-batch-size",
            "3",
            "--partial-rollout",
            "true",
            "--partial-rollout-offpolicy",
            offpolicy,
            "--no-progress",
        ]
    )
    ds = [PromptRecord(i, [i, 7], f"p{i}", "x") for i in range(40)]
    mgr = RolloutManager(
        cfg,
        ds,
        ResumableSampler(len(ds), seed=0, shuffle=False),
        local_pool([ScriptedEngine(_respond_carried)]),
        Scorer(),
        Tok(),
    )
    r1 = mgr.collect(1)
    # prompts 0 and 1 end at the same decode step: 0 fills the batch, 1 is carried whole (mixed,
    # not verified yet), 2 is aborted and carried
    assert [g.prompt_index for g in r1.groups] == [0] and [g.prompt_index for g in mgr.pending] == [1, 2]
    r2 = mgr.collect(2)
    if offpolicy == "mask":  # group 1 would teach nothing: not kept; new prompt 3 ends first
        assert [g.prompt_index for g in r2.groups] == [3] and r2.untrainable_samples == 2
        dropped = {g.prompt_index: g for g in r2.generated}[1]
        assert all(s.stale_len == len(s.response_ids) for s in dropped.samples)
    else:  # its tokens are trained with the off-policy weight
        assert [g.prompt_index for g in r2.groups] == [1] and r2.untrainable_samples == 0


def _s(n=3, stale=0, train=True, tag=0):
    return Sample(
        prompt_index=tag,
        prompt_ids=[1, 2],
        response_ids=[5] * n,
        engine_logprobs=[-0.5] * n,
        finish_reason="stop" if train else "length",
        ground_truth="x",
        train=train,
        stale_len=stale,
    )


def test_which_samples_have_a_trainable_token():
    assert has_trainable_token(_s())
    assert not has_trainable_token(_s(n=0))
    assert not has_trainable_token(_s(train=False))  # overlong filtering: loss mask 0 on every token
    assert not has_trainable_token(_s(stale=3), "mask") and has_trainable_token(_s(stale=2), "mask")
    assert has_trainable_token(_s(stale=3), "correct") and has_trainable_token(_s(stale=3), None)


def test_minibatches_split_into_the_configured_steps_near_equal():
    items = list(range(10))
    mbs = minibatches(items, 3)
    assert [len(mb) for mb in mbs] == [4, 3, 3] and sum(mbs, []) == items
    assert [len(mb) for mb in minibatches(list(range(8)), 4, dp_size=2)] == [2, 2, 2, 2]
    with pytest.raises(ValueError) as e:
        minibatches(list(range(5)), 3, dp_size=2)
    msg = str(e.value)
    assert "\n" not in msg and "--global-batch-size" in msg and "data-parallel rank (2)" in msg


def test_too_few_trainable_samples_are_topped_up_per_step_with_zero_weight_ones():
    trainable = _s(tag=99)
    untrainable = [_s(train=False, tag=k) for k in range(5)]
    samples = untrainable[:3] + [trainable] + untrainable[3:]
    out, left = training_samples(samples, num_steps=2, dp_size=2)
    mbs = minibatches(out, 2, dp_size=2)
    # each optimizer step gets a sample per DP rank; the trainable one is in the first
    assert [len(mb) for mb in mbs] == [2, 2] and mbs[0][0] is trainable
    assert left == 2 and all(not has_trainable_token(s) for s in mbs[0][1:] + mbs[1])


def test_train_runs_the_configured_optimizer_steps_over_the_trainers_list():
    """Trainer._train over TrainerGroup: one ``train`` call per configured optimizer step, each
    with every DP rank's shard of a near-equal mini-batch (stand-in ranks record the calls)."""
    from megatron_dapo.train import Trainer
    from tests.driver.fake_ranks import fake_group

    cfg = parse_args(
        ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--global-batch-size", "4", "--no-progress"]
    )
    t = Trainer.__new__(Trainer)
    t.cfg, t.step, t.skipped_in_a_row = cfg, 1, 0
    t.trainers, ranks = fake_group(dp=2)
    samples = [_s(n=2 + k % 3, tag=k) for k in range(13)]  # the list of 16 responses, 3 left out
    m = t._train(minibatches(samples, optimizer_steps(cfg), 2), inject_nan=False)  # as Trainer.one_step splits them
    assert optimizer_steps(cfg) == 4 and m["optimizer_steps"] == 4
    calls = [[len(r.sent("train")[k][0][0]) for r in ranks] for k in range(4)]
    assert [sum(c) for c in calls] == [4, 3, 3, 3] and all(min(c) >= 1 for c in calls)


def test_the_metrics_row_counts_the_samples_left_out():
    from megatron_dapo.driver.metrics import step_metrics

    roll = types.SimpleNamespace(
        generated=[],
        groups=[],
        num_kept=0,
        num_all_correct=0,
        num_all_wrong=0,
        num_gen_batches=1,
        reused=0,
        partial_resumed=0,
        partial_dropped=0,
        partial_pending=0,
        aborted_samples=0,
        time_generate=0.0,
        time_verify=0.0,
    )
    m = step_metrics(1, roll, [], {}, {}, repetition_rate=lambda xs: 0.0, engine_restarts=0, timings={}, untrainable=3)
    assert m["untrainable_samples"] == 3
    roll.untrainable_samples = 4  # samples of mixed groups the manager did not keep (all stale, mask)
    m = step_metrics(1, roll, [], {}, {}, repetition_rate=lambda xs: 0.0, engine_restarts=0, timings={}, untrainable=3)
    assert m["untrainable_samples"] == 7
