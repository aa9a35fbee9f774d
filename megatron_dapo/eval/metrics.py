"""Evaluation metrics over sampled responses: avg@k, unbiased pass@k, maj@k and a summary.

All functions are pure (no I/O, no global state) and depend only on the standard library.

Conventions
-----------
* A *sample* is one generated response to one problem, given as a dict with the keys
  ``problem_id`` (or ``prompt`` when there is no id), ``acc`` (bool), ``pred`` (the extracted
  answer, a str), ``response_length`` (int, tokens), ``finish_reason`` (``"stop"``, ``"length"``,
  ...) and ``reason`` (``"ok"``, ``"wrong"``, ``"no_answer"``, ``"timeout"``).
* Samples are grouped by problem: identical prompts (or identical ``problem_id``) form one group,
  so a dataset that stores each problem as 32 copies (aime-2024.parquet) gives 30 groups of 32
  samples, never 960 problems.
* With ``n`` samples per problem and ``k <= n``:

  - ``avg@k`` is the mean accuracy over all ``n`` samples of the problem (the unbiased, lowest
    variance estimate of the expected accuracy of ``k`` samples), averaged over problems;
  - ``pass@k`` is the Codex estimator ``1 - C(n-c, k) / C(n, k)`` (``c`` correct samples),
    averaged over problems;
  - ``maj@k`` is the majority vote over the *first* ``k`` samples of the problem (in input order),
    averaged over problems (see :func:`maj_at_k` for normalisation and ties).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "INVALID_ANSWERS",
    "avg_at_k",
    "group_samples",
    "maj_at_k",
    "majority_answer",
    "normalize_answer",
    "pass_at_k",
    "summarize",
]

#: Predictions that count as "no answer" in a majority vote (they never win it).
INVALID_ANSWERS = frozenset({"", "[invalid]", "none"})

_WS = re.compile(r"\s+")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem: ``1 - C(n-c, k) / C(n, k)``.

    ``n`` samples were drawn, ``c`` of them are correct; the result is the probability that a
    uniformly random subset of ``k`` of the ``n`` samples contains at least one correct one.

    Evaluated as ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``, which never forms the (huge) binomial
    coefficients and stays accurate for large ``n`` (e.g. n = 10_000).

    Raises ``ValueError`` unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    n, c, k = int(n), int(c), int(k)
    if n < 1:
        raise ValueError(f"pass_at_k: n must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c must be in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k must be in [1, n={n}], got {k}")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    if c == 0:
        return 0.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def avg_at_k(correct: Sequence[Any], k: int | None = None) -> float:
    """avg@k for one problem: the mean accuracy of its samples.

    ``correct`` holds one truthy/falsy (or 0..1 float) value per sample. With ``n = len(correct)``
    samples and ``k <= n`` the mean over all ``n`` samples is the unbiased estimate of the mean
    accuracy of ``k`` samples, so ``k`` only validates (``1 <= k <= n``); ``k=None`` means ``n``.
    """
    n = len(correct)
    if n == 0:
        raise ValueError("avg_at_k: no samples")
    if k is not None and not 1 <= int(k) <= n:
        raise ValueError(f"avg_at_k: k must be in [1, n={n}], got {k}")
    return math.fsum(float(x) for x in correct) / n


def normalize_answer(pred: Any) -> str:
    """Normalise an extracted answer for voting: ``None`` -> ``""``; strip; collapse whitespace;
    drop one pair of enclosing ``$``; lower-case.

    This is deliberately light: predictions are expected to be normalised already by the reward's
    answer check; this only stops trivially different spellings from splitting the vote.
    """
    if pred is None:
        return ""
    s = _WS.sub(" ", str(pred)).strip()
    if len(s) >= 2 and s.startswith("$") and s.endswith("$"):
        s = s[1:-1].strip()
    return s.lower()


def majority_answer(
    preds: Sequence[Any], normalize: Callable[[Any], str] = normalize_answer
) -> tuple[str | None, list[int]]:
    """The majority answer among ``preds`` and the indices of the samples that gave it.

    Invalid predictions (normalising to ``""``, ``"[invalid]"`` or ``"none"``) do not vote.
    Ties are broken deterministically in favour of the answer whose *first* occurrence comes
    earliest in ``preds`` (independent of hashing and of the correctness of the answers).
    Returns ``(None, [])`` when no prediction is valid.
    """
    votes: dict[str, list[int]] = {}  # insertion order == order of first occurrence
    for i, p in enumerate(preds):
        key = normalize(p)
        if key in INVALID_ANSWERS:
            continue
        votes.setdefault(key, []).append(i)
    if not votes:
        return None, []
    best_key, best_idx = None, []
    for key, idx in votes.items():
        if len(idx) > len(best_idx):  # strict: an equal count never replaces an earlier answer
            best_key, best_idx = key, idx
    return best_key, best_idx


def maj_at_k(
    preds: Sequence[Any],
    correct: Sequence[Any],
    k: int | None = None,
    normalize: Callable[[Any], str] = normalize_answer,
) -> float:
    """maj@k for one problem: 1.0 if the majority answer of the first ``k`` samples is correct.

    ``preds[i]`` is the extracted answer of sample ``i`` and ``correct[i]`` its correctness.
    The vote is taken over normalised answers (see :func:`majority_answer` for invalid answers
    and the tie rule). The winning answer is correct when most of the samples that gave it are
    correct (with a deterministic checker they all agree; a tie here counts as wrong). No valid
    answer at all scores 0.0. ``k=None`` uses every sample.
    """
    if len(preds) != len(correct):
        raise ValueError(f"maj_at_k: {len(preds)} preds but {len(correct)} correctness values")
    n = len(preds)
    if n == 0:
        raise ValueError("maj_at_k: no samples")
    k = n if k is None else int(k)
    if not 1 <= k <= n:
        raise ValueError(f"maj_at_k: k must be in [1, n={n}], got {k}")
    _, idx = majority_answer(list(preds[:k]), normalize)
    if not idx:
        return 0.0
    n_correct = sum(1 for i in idx if correct[i])
    return 1.0 if 2 * n_correct > len(idx) else 0.0


def _group_key(sample: Mapping[str, Any]) -> Any:
    if sample.get("problem_id") is not None:
        return ("id", str(sample["problem_id"]))
    if "prompt" in sample:
        prompt = sample["prompt"]
        if not isinstance(prompt, str):  # chat messages: a canonical JSON string
            prompt = json.dumps(prompt, sort_keys=True, ensure_ascii=False, default=str)
        return ("prompt", prompt)
    raise KeyError("sample has neither 'problem_id' nor 'prompt'")


def group_samples(samples: Iterable[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Group samples by ``problem_id`` (or by identical ``prompt``), in order of first appearance.

    Sample order inside a group is kept (it decides which samples maj@k votes with).
    """
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    for i, s in enumerate(samples):
        try:
            key = _group_key(s)
        except KeyError as e:
            raise KeyError(f"sample {i}: {e.args[0]}") from None
        groups.setdefault(key, []).append(s)
    return list(groups.values())


def _is_no_answer(s: Mapping[str, Any]) -> bool:
    reason = s.get("reason")
    if reason is not None:
        return reason == "no_answer"
    return normalize_answer(s.get("pred")) in INVALID_ANSWERS


def summarize(
    samples: Iterable[Mapping[str, Any]], k: int | None = None, normalize: Callable[[Any], str] = normalize_answer
) -> dict[str, Any]:
    """Summarise sampled evaluation results.

    ``k=None`` uses the smallest number of samples of any problem. Every problem needs at least
    ``k`` samples (``ValueError`` otherwise: a problem with fewer samples cannot give pass@k).

    Returns a dict with ``num_problems``, ``num_samples``, ``k``, ``avg@{k}``, ``pass@{k}``,
    ``maj@{k}``, ``pass@1`` (the per-problem accuracy averaged over problems: the same number as
    ``avg@{k}``), ``response_length_mean`` (over all
    samples, tokens), ``truncation_ratio`` (share of samples with ``finish_reason == "length"``),
    ``no_answer_rate`` (share with ``reason == "no_answer"``; without a ``reason`` key, share whose
    ``pred`` is invalid) and ``timeout_rate`` (share with ``reason == "timeout"``). The rates are
    over samples; the @k metrics are means over problems.
    """
    samples = list(samples)
    if not samples:
        raise ValueError("summarize: no samples")
    groups = group_samples(samples)
    n_min = min(len(g) for g in groups)
    if k is None:
        k = n_min
    k = int(k)
    if k < 1:
        raise ValueError(f"summarize: k must be >= 1, got {k}")
    if n_min < k:
        short = sum(1 for g in groups if len(g) < k)
        raise ValueError(
            f"summarize: k={k} but {short} of {len(groups)} problems have fewer than {k} samples "
            f"(smallest group: {n_min})"
        )
    avg, pas, maj = [], [], []
    for g in groups:
        correct = [bool(s["acc"]) for s in g]
        avg.append(avg_at_k(correct, k))
        pas.append(pass_at_k(len(correct), sum(correct), k))
        maj.append(maj_at_k([s.get("pred") for s in g], correct, k, normalize))
    n = len(samples)
    lengths = [s["response_length"] for s in samples if s.get("response_length") is not None]
    return {
        "num_problems": len(groups),
        "num_samples": n,
        "k": k,
        f"avg@{k}": math.fsum(avg) / len(groups),
        f"pass@{k}": math.fsum(pas) / len(groups),
        f"maj@{k}": math.fsum(maj) / len(groups),
        "pass@1": math.fsum(avg) / len(groups),
        "response_length_mean": (math.fsum(float(x) for x in lengths) / len(lengths)) if lengths else None,
        "truncation_ratio": sum(1 for s in samples if s.get("finish_reason") == "length") / n,
        "no_answer_rate": sum(1 for s in samples if _is_no_answer(s)) / n,
        "timeout_rate": sum(1 for s in samples if s.get("reason") == "timeout") / n,
    }
