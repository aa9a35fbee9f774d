"""Tests for megatron_dapo.eval.metrics: hand-computed sample sets and brute-force pass@k."""

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_dapo.eval import (
    avg_at_k,
    group_samples,
    maj_at_k,
    majority_answer,
    normalize_answer,
    pass_at_k,
    summarize,
)


def brute_force_pass_at_k(n, c, k):
    """Share of the k-subsets of n samples (the first c correct) that contain a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    hit = sum(1 for sub in subsets if any(i < c for i in sub))
    return hit / len(subsets)


@pytest.mark.parametrize(
    "n,c,k",
    [(n, c, k) for n in (1, 2, 5, 8, 10) for c in range(n + 1) for k in range(1, n + 1)]
    + [(16, 3, 4), (16, 5, 8), (16, 1, 16), (12, 0, 3), (12, 12, 1)],
)
def test_pass_at_k_matches_subset_enumeration(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 400).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_matches_exact_binomials(nck):
    n, c, k = nck
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)  # Python int division is correctly rounded
    got = pass_at_k(n, c, k)
    assert 0.0 <= got <= 1.0
    assert got == pytest.approx(exact, abs=1e-9)


def test_pass_at_k_known_values_and_stability():
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 6, 5) == 1.0  # only 4 wrong: every 5-subset has a correct one
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 3 of the 6 pairs contain the correct one
    assert pass_at_k(32, 8, 1) == pytest.approx(8 / 32)
    # large n: binomials would overflow floats; the product form does not
    v = pass_at_k(100_000, 1, 50_000)
    assert v == pytest.approx(0.5, abs=1e-12)
    assert pass_at_k(5000, 2, 10) == pytest.approx(1 - (4990 * 4989) / (5000 * 4999), rel=1e-12)
    # monotone in k and c
    assert pass_at_k(32, 4, 1) < pass_at_k(32, 4, 8) < pass_at_k(32, 4, 16)
    assert pass_at_k(32, 2, 8) < pass_at_k(32, 3, 8)


@pytest.mark.parametrize("n,c,k", [(0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_avg_at_k():
    assert avg_at_k([True, False, True, True]) == 0.75
    assert avg_at_k([1, 0, 0, 0, 0], k=5) == 0.2
    assert avg_at_k([True] * 64, k=32) == 1.0
    with pytest.raises(ValueError):
        avg_at_k([True, False], k=3)
    with pytest.raises(ValueError):
        avg_at_k([])


def test_normalize_answer():
    assert normalize_answer("  540 ") == "540"
    assert normalize_answer("$\\frac{1}{2}$") == "\\frac{1}{2}"
    assert normalize_answer("X  =\n 3") == "x = 3"
    assert normalize_answer(None) == ""


def test_majority_vote_and_ties():
    # clear majority
    assert majority_answer(["3", "5", "3", "3"]) == ("3", [0, 2, 3])
    # a tie goes to the answer that appeared first, whatever order the counts are built in
    assert majority_answer(["7", "5", "5", "7"]) == ("7", [0, 3])
    assert majority_answer(["5", "7", "7", "5"]) == ("5", [0, 3])
    # invalid answers never vote, even when they are the most frequent
    assert majority_answer(["[INVALID]", "[INVALID]", "", "4"]) == ("4", [3])
    assert majority_answer(["[INVALID]", None, ""]) == (None, [])
    # normalisation merges trivially different spellings
    assert majority_answer(["1/2", " 1/2", "$1/2$", "2"])[1] == [0, 1, 2]


def test_maj_at_k():
    preds = ["12", "13", "12", "13", "13"]
    acc = [True, False, True, False, False]
    assert maj_at_k(preds, acc) == 0.0  # 13 wins 3-2
    assert maj_at_k(preds, acc, k=3) == 1.0  # first 3: 12 wins 2-1
    assert maj_at_k(preds, acc, k=2) == 1.0  # tie 1-1: 12 appeared first
    assert maj_at_k(["13", "12"], [False, True], k=2) == 0.0  # tie: 13 appeared first
    assert maj_at_k(["[INVALID]"] * 3 + ["1"], [False, False, False, True]) == 1.0
    assert maj_at_k(["[INVALID]"] * 3, [False] * 3) == 0.0
    with pytest.raises(ValueError):
        maj_at_k(["1"], [True, False])
    with pytest.raises(ValueError):
        maj_at_k(["1", "2"], [True, False], k=3)


def _s(pid, acc, pred, length=100, finish="stop", reason=None, key="problem_id"):
    if reason is None:
        reason = "ok" if acc else "wrong"
    return {key: pid, "acc": acc, "pred": pred, "response_length": length, "finish_reason": finish, "reason": reason}


def test_summarize_hand_computed():
    samples = [
        # problem A: 4 samples, 2 correct; votes 5,5,7,[INVALID] -> 5 (correct)
        _s("A", True, "5", 100),
        _s("A", True, "5", 200),
        _s("A", False, "7", 300),
        _s("A", False, "[INVALID]", 400, finish="length", reason="no_answer"),
        # problem B: 4 samples, 0 correct
        _s("B", False, "1", 50),
        _s("B", False, "2", 50),
        _s("B", False, "", 50, reason="no_answer"),
        _s("B", False, "3", 50, reason="timeout"),
        # problem C: 4 samples, 1 correct; votes 9,8,8,9 -> tie, 9 first (the correct one)
        _s("C", True, "9", 10),
        _s("C", False, "8", 10, finish="length"),
        _s("C", False, "8", 10),
        _s("C", False, "9x", 10),
    ]
    out = summarize(samples, k=2)
    assert out["num_problems"] == 3 and out["num_samples"] == 12 and out["k"] == 2
    # avg@2: mean of per-problem accuracies (2/4, 0, 1/4)
    assert out["avg@2"] == pytest.approx((0.5 + 0 + 0.25) / 3)
    # pass@2: A 1 - C(2,2)/C(4,2) = 5/6; B 0; C 1 - C(3,2)/C(4,2) = 1/2
    assert out["pass@2"] == pytest.approx((5 / 6 + 0 + 0.5) / 3)
    # maj@2 uses the first 2 samples: A 5,5 -> right; B 1,2 tie -> 1 wrong; C 9,8 tie -> 9 right
    assert out["maj@2"] == pytest.approx(2 / 3)
    assert out["pass@1"] == pytest.approx(out["avg@2"])
    assert out["response_length_mean"] == pytest.approx((1000 + 200 + 40) / 12)
    assert out["truncation_ratio"] == pytest.approx(2 / 12)
    assert out["no_answer_rate"] == pytest.approx(2 / 12)
    assert out["timeout_rate"] == pytest.approx(1 / 12)

    full = summarize(samples)  # k defaults to the smallest group (4)
    assert full["k"] == 4
    assert full["pass@4"] == pytest.approx((1 + 0 + 1) / 3)
    # maj@4: A 5 (2 votes) right; B 1/2/3 tie -> 1 wrong; C 8 (2 votes) vs 9 (1 vote) + "9x" -> 8 wrong
    assert full["maj@4"] == pytest.approx(1 / 3)


def test_summarize_groups_identical_prompts_not_copies():
    # 3 problems stored as 4 copies each, the way aime-2024.parquet stores 30 x 32 copies
    prompts = [[{"role": "user", "content": f"problem {i}"}] for i in range(3)]
    samples = []
    for copy in range(4):
        for i, p in enumerate(prompts):
            samples.append(
                _s(None, i == 0 or (i == 1 and copy == 0), str(i), key="problem_id") | {"problem_id": None, "prompt": p}
            )
    assert len(group_samples(samples)) == 3
    out = summarize(samples, k=4)
    assert out["num_problems"] == 3 and out["k"] == 4
    assert out["avg@4"] == pytest.approx((1 + 0.25 + 0) / 3)
    assert out["pass@4"] == pytest.approx((1 + 1 + 0) / 3)
    # raw string prompts group as well
    out2 = summarize([_s("p", True, "1", key="prompt"), _s("p", False, "2", key="prompt")])
    assert out2["num_problems"] == 1 and out2["k"] == 2 and out2["pass@2"] == 1.0


def test_summarize_errors_and_fallbacks():
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError, match="fewer than 3"):
        summarize([_s("a", True, "1"), _s("a", True, "1"), _s("b", True, "1")], k=3)
    with pytest.raises(KeyError):
        summarize([{"acc": True, "pred": "1"}])
    # no 'reason' key: an invalid pred counts as no answer; no lengths -> None
    out = summarize([{"problem_id": 1, "acc": False, "pred": "[INVALID]"}, {"problem_id": 1, "acc": True, "pred": "4"}])
    assert out["no_answer_rate"] == 0.5 and out["response_length_mean"] is None
    assert out["maj@2"] == 1.0
