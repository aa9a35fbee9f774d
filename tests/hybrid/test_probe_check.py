"""The weight-sync check separates noise from error.

* exact checksums (rollout/checksum.py): order-independent, see moved elements;
* the real path (PolicyWorker -> WeightSync -> HFEngine under HybridStep): a correct sync
  passes with every tensor compared; a SWAPPED, a STALE and a MISSING tensor each fail with a
  message naming the tensor; a correct sync whose engine logprobs carry bf16-scale noise
  (gaussian plus a few outlier tokens of 0.5 .. 1.0) passes (the max-based probe stopped it);
* the statistic's message names the statistic, its value and its limit.
"""

from __future__ import annotations

import pytest
import torch

from megatron_dapo.hybrid.probe import (
    PROBE_TOKENS,
    check_probe_stats,
    compare_checksums,
    cut_probe,
    default_threshold,
    probe_stats,
    reference_checksums,
)
from megatron_dapo.hybrid.weight_sync import WeightSyncError
from megatron_dapo.rollout import checksum
from tests.hybrid import check_bodies


def test_checksum_is_exact_order_independent_and_sees_moved_elements(monkeypatch):
    t = torch.randn(300, 70).to(torch.bfloat16)
    a = checksum.tensor_checksum(t)
    monkeypatch.setattr(checksum, "_CHUNK", 997)  # another reduction order: the same integers
    assert checksum.tensor_checksum(t) == a
    rows = t.clone()
    rows[[0, 1]] = rows[[1, 0]]  # the same bytes, two rows exchanged (a TP shard out of order)
    moved = checksum.tensor_checksum(rows)
    assert moved[2] == a[2] and moved[3] != a[3]
    one = t.clone()
    one.view(-1).view(torch.int16)[12345] += 1  # one element one ulp off
    assert checksum.tensor_checksum(one) != a
    assert checksum.tensor_checksum(t.float(), torch.bfloat16) == a  # exact cast back from a wider copy


def test_compare_checksums_names_missing_extra_and_different():
    ref = {"a": ("torch.float32", (2,), 1, 2), "b": ("torch.float32", (2,), 3, 4)}
    assert compare_checksums(ref, [dict(ref), None]) == {"compared": 2, "skipped": 1}
    with pytest.raises(WeightSyncError, match=r"missing in the engine: b.*extra in the engine: c"):
        compare_checksums(ref, [{"a": ref["a"], "c": ref["b"]}])
    with pytest.raises(WeightSyncError, match=r"engine 1: 1 different from what the trainer sent: a"):
        compare_checksums(ref, [dict(ref), {"a": ref["b"], "b": ref["b"]}])
    with pytest.raises(WeightSyncError, match="different bytes for a"):
        reference_checksums([ref, {"a": ref["b"]}])


def test_statistic_message_and_short_probe():
    assert cut_probe([list(range(1000))])[0] == list(range(PROBE_TOKENS))
    tol = default_threshold(torch.bfloat16)
    with pytest.raises(WeightSyncError, match=r"mean \|logp_engine - logp_megatron\| = 0\.5 > 0\.1"):
        check_probe_stats(probe_stats([[0.0] * 10], [[[0.5] * 10]]), tol)
    st = probe_stats([[0.0] * 100], [[[0.0] * 95 + [1.0] * 5]])
    assert st["max_abs"] == 1.0 and st["p90_abs"] == 0.0
    check_probe_stats(st, tol)  # five outlier tokens of 1.0 in a hundred: noise


@pytest.fixture(scope="module")
def outcomes(gloo, tmp_path_factory):
    from tests.e2e.fixtures import make_tiny_qwen2_dir

    hf = make_tiny_qwen2_dir(str(tmp_path_factory.mktemp("hf") / "hf"))
    (o,) = gloo(1).run(check_bodies.weight_sync_checks, hf, "bfloat16", timeout=900)
    return o


@pytest.mark.gloo
def test_a_correct_sync_passes_with_every_tensor_compared(outcomes):
    o = outcomes["correct"]
    assert not o["raised"], o
    assert o["check"]["compared"] > 20 and o["check"]["skipped"] == 0
    assert o["check"]["max_abs"] < 1e-4


@pytest.mark.gloo
@pytest.mark.parametrize(
    "kind,names",
    [
        ("swapped", [check_bodies.Q0, check_bodies.Q1]),
        ("stale", [check_bodies.STALE]),
        ("missing", [check_bodies.MISSING]),
    ],
)
def test_a_broken_sync_fails_naming_the_tensor(outcomes, kind, names):
    o = outcomes[kind]
    assert o["raised"], o
    for n in names:
        assert n in o["msg"], o["msg"]
    if kind == "missing":
        assert "missing in the engine" in o["msg"]
    else:
        assert "different from what the trainer sent" in o["msg"]


@pytest.mark.gloo
def test_bf16_scale_noise_on_a_correct_sync_passes(outcomes):
    o = outcomes["noisy"]
    assert not o["raised"], o
    assert o["max"] >= 0.9  # the outliers are there (and logged), they just do not fail the sync
    assert o["check"]["mean_abs"] < default_threshold(torch.bfloat16)


@pytest.mark.gloo
def test_probe_statistics_are_reduced_on_the_groups_device_whatever_the_reference(gloo):
    # under strict collectives (tests/conftest.py) the old code all-reduced a host tensor over
    # the default group (an NCCL group on a GPU) when megatron's logprobs came on the host
    for got, seen, expected in gloo(2).run(check_bodies.probe_with_host_reference):
        assert got == 0.0 and seen == [expected], (seen, expected)
