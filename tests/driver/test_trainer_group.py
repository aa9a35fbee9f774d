"""driver/trainer_group.TrainerGroup: the driver's one way to the trainer ranks. Which rank's
answer stands for each DP rank, how samples are sharded over DP ranks (every TP/PP peer of a
DP rank gets the same shard), where logprobs land, how a step's outputs are reduced, and a
user error raised on a rank coming out as itself. Stand-in ranks (tests/driver/fake_ranks.py);
the real ranks behind Ray are driven by tests/e2e and tests/hybrid/test_ray_sync.py."""

from __future__ import annotations

import pytest

from megatron_dapo.checkpoint.dist_ckpt import CheckpointError
from megatron_dapo.driver.batch import Sample, minibatches
from megatron_dapo.driver.trainer_group import TrainerGroup
from tests.driver.fake_ranks import FakeRank, fake_group


def _s(n: int, tag: int = 0) -> Sample:
    return Sample(
        prompt_index=tag,
        prompt_ids=[1, 2],
        response_ids=[5] * n,
        engine_logprobs=[-0.5] * n,
        finish_reason="stop",
        ground_truth="x",
        advantage=float(tag),
    )


@pytest.mark.parametrize(
    "tp,pp,dp,want", [(1, 1, 2, {0: 0, 1: 1}), (2, 1, 2, {0: 0, 1: 2}), (1, 2, 2, {0: 2, 1: 3}), (2, 2, 1, {0: 2})]
)
def test_the_reporter_of_each_dp_rank_is_its_last_stage_tp_rank_0(tp, pp, dp, want):
    group, _ = fake_group(tp, pp, dp)
    assert group.dp_size == dp and group.reporters == want and group.world == tp * pp * dp


def test_logprobs_are_sharded_by_dp_rank_and_read_from_each_reporter():
    group, ranks = fake_group(tp=2, pp=2, dp=2)  # 8 ranks; reporters: DP 0 -> rank 4, DP 1 -> rank 6
    samples = [_s(n, tag=k) for k, n in enumerate([7, 1, 3, 3, 5, 2])]
    group.logprobs(samples, model="policy")
    by_dp = {}
    for r in ranks:  # every rank of a DP rank got the same shard, one call each
        ((shard,),) = r.sent("compute_logprobs")
        by_dp.setdefault(r.info_dict["dp_rank"], []).append([x.advantage for x in shard])
    for shards in by_dp.values():
        assert all(s == shards[0] for s in shards)
    assert sorted(t for s in by_dp.values() for t in s[0]) == list(range(6))  # each sample on one DP rank
    for s in samples:  # the reporter's answer, one value per response token
        dp = 0 if s.advantage in by_dp[0][0] else 1
        assert s.old_logprobs == [{0: 4, 1: 6}[dp] + 0.5] * len(s.response_ids) and s.ref_logprobs is None
    # balanced by tokens (Karmarkar-Karp over prompt + response lengths 9,3,5,5,7,4: 17 / 16)
    tokens = [sum(len(samples[int(a)].response_ids) + 2 for a in by_dp[d][0]) for d in (0, 1)]
    assert abs(tokens[0] - tokens[1]) <= 1, tokens
    group.logprobs(samples[:2], model="ref")
    assert all(s.ref_logprobs is not None for s in samples[:2]) and all(s.ref_logprobs is None for s in samples[2:])
    with pytest.raises(ValueError, match="'policy' or 'ref'"):
        group.logprobs(samples, model="reference")


def test_fewer_samples_than_dp_ranks_leave_a_rank_an_empty_shard():
    group, ranks = fake_group(dp=2)
    s = _s(3)
    group.logprobs([s])
    assert [r.sent("compute_logprobs")[0][0] and 1 or 0 for r in ranks] == [1, 0] and s.old_logprobs == [0.5] * 3


def test_train_sends_each_rank_its_dp_shard_of_every_minibatch_and_reduces_the_outputs():
    group, ranks = fake_group(tp=2, dp=2)
    samples = [_s(n, tag=k) for k, n in enumerate([4, 4, 2, 6, 3, 3, 5, 1])]
    mbs = minibatches(samples, 2, dp_size=2)
    m = group.train(mbs)
    for r in ranks:  # one train call per optimizer step, with one shard
        calls = r.sent("train")
        assert len(calls) == 2 and all(len(args[0]) == 1 for args in calls)
    for k, mb in enumerate(mbs):  # the TP peers of a DP rank train on the same shard; the shards cover mb
        shards = [[x.advantage for x in r.sent("train")[k][0][0]] for r in ranks]
        assert shards[0] == shards[1] and shards[2] == shards[3]
        assert sorted(shards[0] + shards[2]) == sorted(s.advantage for s in mb)
    total_tokens = sum(len(s.response_ids) + 2 for s in samples)
    # the reporters' (ranks 0 and 2) sums, token-weighted over both optimizer steps
    assert m["pg_loss"] == pytest.approx(total_tokens / len(samples))
    assert m["optimizer_steps"] == 2 and m["skipped_optimizer_steps"] == 0 and m["ratio_max"] == 3.0
    assert group.train(mbs, inject_nan=True)["skipped_optimizer_steps"] == 2


def test_rng_weights_and_checkpoint_calls_reach_every_rank():
    group, ranks = fake_group(tp=2)
    assert group.rng_states() == [{"rank": 0}, {"rank": 1}]
    group.set_rng_states([{"a": 1}, {"b": 2}])
    assert [r.sent("set_rng_state") for r in ranks] == [[({"a": 1},)], [({"b": 2},)]]
    with pytest.raises(ValueError, match="1 state"):
        group.set_rng_states([{}])
    assert group.derive_rng_states(7) == [7, 107]
    assert group.full_weights() == {"w0": 0, "w1": 1}
    assert group.load_initial_weights() == "hf" and group.build_reference() == "ref"
    group.save("/ckpt/step_1", {"step": 1})
    group.load("/ckpt/step_1")
    assert all(
        r.sent("save") == [("/ckpt/step_1", {"step": 1})] and r.sent("load") == [("/ckpt/step_1",)] for r in ranks
    )
    assert group.probe_logprobs([[1, 2, 3]]) == [[0.5, 0.5]]


class _RayTaskError(Exception):
    """What ray.get raises for an exception on an actor: the original in ``cause``."""

    def __init__(self, cause):
        super().__init__(f"wrapped: {cause}")
        self.cause = cause


def test_a_user_error_on_a_rank_comes_out_as_itself_other_errors_unchanged():
    ranks = [FakeRank(0)]

    def get_user_error(futures):
        raise _RayTaskError(CheckpointError("--load /x: no .metadata"))

    group = TrainerGroup(ranks, [ranks[0].info_dict], get=get_user_error)
    with pytest.raises(CheckpointError, match="no .metadata"):
        group.load("/x")

    def get_bug(futures):
        raise _RayTaskError(KeyError("w"))

    group = TrainerGroup(ranks, [ranks[0].info_dict], get=get_bug)
    with pytest.raises(_RayTaskError):
        group.load("/x")
