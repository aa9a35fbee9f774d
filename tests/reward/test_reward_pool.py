"""BatchScorer: real per-item timeouts, killed and replaced workers, memory caps, fuzzing.

Assertions are about outcomes (every item comes back with a valid reason; an overrunning
item is a "timeout"), never about wall time; pytest-timeout only catches a hang.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_dapo.reward import REASONS, BatchScorer, RewardResult

PLUGIN = "reward_test_plugins:misbehave"


@pytest.fixture(scope="module")
def plugin_pool():
    with BatchScorer(num_workers=2, timeout_s=2.0, memory_limit_mb=1024, reward_fn=PLUGIN) as pool:
        yield pool


@pytest.fixture(scope="module")
def math_pool():
    with BatchScorer(num_workers=2, timeout_s=3.0, memory_limit_mb=1536, mode="math") as pool:
        yield pool


def _valid(result: RewardResult) -> None:
    assert isinstance(result, RewardResult)
    assert result.reason in REASONS
    assert result.acc is (result.reason == "ok")
    if not result.acc:
        assert result.score == -1.0


@pytest.mark.timeout(120)
def test_stuck_workers_are_killed_and_replaced(plugin_pool):
    pids_before = set(plugin_pool.worker_pids)
    timeouts_before = plugin_pool.timeouts
    results = plugin_pool.score([("sleep", "x"), ("a", "a"), ("spin", "x"), ("b", "b"), ("c", "x")])
    assert [r.reason for r in results] == ["timeout", "ok", "timeout", "ok", "wrong"]
    assert results[0].score == -1.0 and results[0].acc is False
    assert plugin_pool.timeouts - timeouts_before == 2
    pids_after = set(plugin_pool.worker_pids)
    assert len(pids_after) == 2
    # Both stuck workers were killed: their processes are gone and new ones serve.
    for pid in pids_before - pids_after:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert len(pids_before - pids_after) >= 1
    # The pool goes on scoring.
    assert [r.reason for r in plugin_pool.score([("a", "a")] * 6)] == ["ok"] * 6


@pytest.mark.timeout(120)
def test_errors_memory_cap_and_dead_workers(plugin_pool):
    results = plugin_pool.score([("oom", "x"), ("raise", "x"), ("die", "x"), ("a", "a")])
    assert [r.reason for r in results] == ["error", "error", "error", "ok"]
    assert "MemoryError" in results[0].extra["error"]  # the RLIMIT_AS cap fired, not the machine
    assert "plug-in failure" in results[1].extra["error"]
    assert "died" in results[2].extra["error"]
    assert plugin_pool.score([("b", "b")])[0].reason == "ok"


def test_pool_is_reused(plugin_pool):
    pids = plugin_pool.score([("pid", "x")] * 8)
    assert {int(r.score) for r in pids} <= set(plugin_pool.worker_pids)


def test_results_keep_input_order(math_pool):
    items = [(f"Answer: {k}", str(k)) for k in range(20)] + [("Answer: 3", "4")]
    results = math_pool.score(items)
    assert [r.reason for r in results] == ["ok"] * 20 + ["wrong"]
    assert [r.pred for r in results[:3]] == ["0", "1", "2"]


@pytest.mark.parametrize("bad", [None, "", "   ", 540, ["540"]])
def test_bad_ground_truth_is_an_error(math_pool, bad):
    with pytest.raises(ValueError, match="ground_truth"):
        math_pool.score([("Answer: 540", "540"), ("Answer: 540", bad)])


ADVERSARIAL = [
    "{" * 100_000 + "}" * 100_000,
    "\\boxed{" + "{" * 100_000 + "1" + "}" * 100_000 + "}",
    "Answer: " + "9" * 100_000,
    "\\boxed{" + "1" * 100_000 + "}",
    "Answer: " + "\\frac{1}{" * 2000 + "2" + "}" * 2000,
    "Answer: " + "\\frac12" * 3000,
    "Answer: 9^{9^{9^{9}}}",
    "\\boxed{9^{9^{9^{9^{9}}}}}",
    "Answer: (10^{10^{10}})!",
    "Answer: " + "(" * 5000 + "x" + ")" * 5000,
    "Answer: " + "\\sqrt{" * 3000 + "2" + "}" * 3000,
    "Answer: $" * 5000,
    "Answer: \\begin{pmatrix}" + "1 & " * 5000 + "1\\end{pmatrix}",
    "Answer: " + "x^" * 3000 + "2",
    "Answer: " + "-" * 50_000 + "1",
    "Answer: " + "1/" * 20_000 + "1",
    "\\boxed{" * 20_000,
    "Answer: (x+1)^{1000000}",
    "Answer: \\left(" * 10_000,
]

adversarial_text = (
    st.sampled_from(ADVERSARIAL)
    | st.text(alphabet=st.sampled_from(list("0123456789{}()[]^_\\$!+-*/=,.: xabcefrqtAnswer\n")), max_size=300)
    | st.text(max_size=200)
)


@pytest.mark.timeout(300)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(
    st.lists(
        st.tuples(adversarial_text, st.sampled_from(["540", "\\frac{1}{2}", "x^2", "(1, 2)", "9^{9^{9^{9}}}"])),
        min_size=1,
        max_size=6,
    )
)
def test_fuzz_never_crashes_and_every_item_returns(math_pool, items):
    results = math_pool.score(items)
    assert len(results) == len(items)
    for result in results:
        _valid(result)


@pytest.mark.timeout(300)
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.lists(st.sampled_from(ADVERSARIAL), min_size=1, max_size=4))
def test_fuzz_dapo_mode(items):
    # dapo mode is pure string work: score it in-process as well as in the pool.
    from megatron_dapo.reward import compute_score

    for text in items:
        _valid(compute_score(text, "540", mode="dapo"))


def test_all_adversarial_inputs_in_one_batch(math_pool):
    results = math_pool.score([(text, "540") for text in ADVERSARIAL])
    assert len(results) == len(ADVERSARIAL)
    for result in results:
        _valid(result)
        assert not result.acc


def test_constructor_validation():
    with pytest.raises(ValueError, match="mode"):
        BatchScorer(num_workers=1, mode="nope")
    with pytest.raises(ValueError, match="timeout_s"):
        BatchScorer(num_workers=1, timeout_s=0)
    with pytest.raises(ValueError, match="start_method"):
        BatchScorer(num_workers=1, start_method="fork")
    with pytest.raises(AttributeError, match="no_such_fn"):
        BatchScorer(num_workers=1, reward_fn="reward_test_plugins:no_such_fn")


def test_closed_pool_refuses_work():
    pool = BatchScorer(num_workers=1, timeout_s=5, reward_fn="reward_test_plugins:exact")
    assert pool.score([("a", "a")])[0].score == 1.0
    pool.close()
    pool.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        pool.score([("a", "a")])


def test_plugin_in_the_workers_sees_the_record_and_needs_no_label():
    from megatron_dapo.reward import RewardInput

    with BatchScorer(num_workers=1, timeout_s=30, sources={"judge": "reward_test_plugins:echo_record"}) as pool:
        got = pool.score([RewardInput("resp", "", "the prompt", "judge", {"k": 1}), ("Answer: 2", "2")])
        assert [r.pred for r in got] == ["resp||the prompt|judge|{'k': 1}", "2"]
        with pytest.raises(ValueError, match="ground_truth is empty"):  # the default dapo checker needs one
            pool.score([RewardInput("Answer: 2", "", "p", "other")])


@pytest.mark.timeout(180)
@pytest.mark.parametrize("reward", ["builtin", "main-fn"])
def test_workers_rerun_the_main_module_only_for_a_reward_defined_there(reward, tmp_path):
    """The driver runs as ``python -m megatron_dapo.train``; a spawned worker that re-ran it
    would import torch for nothing. A reward function defined in the main module still needs it."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = tmp_path / "pids"
    args = [sys.executable, "-m", "tests.reward.main_module_check", str(out)] + (
        [reward] if reward != "builtin" else []
    )
    done = subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stdout + done.stderr
    reason, score, worker = done.stdout.split()
    assert reason == "ok"
    assert float(score) == 1.0
    pids = out.read_text().split()
    assert pids[0] != worker
    assert pids[1:] == ([worker] if reward == "main-fn" else []), pids
