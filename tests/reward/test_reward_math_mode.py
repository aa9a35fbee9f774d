"""`math` mode: equivalence on the public Math-Verify / lighteval cases, and near-misses."""

from __future__ import annotations

import json
import re

import pytest

from megatron_dapo.reward import compute_score, is_equivalent
from tests.data import DATA

CASES = [json.loads(line) for line in (DATA / "verifier" / "equivalence-cases.jsonl").open()]


def test_case_file_shape():
    assert len(CASES) == 251
    assert sum(c["expected"] == 1 for c in CASES) == 218
    assert sum(c["expected"] == 0 for c in CASES) == 33


def test_equivalence_cases_beat_math_verify():
    """math-verify 0.9.0 recognises 203/218 equal pairs and accepts 3/33 non-equal ones."""
    equal_ok = [c for c in CASES if c["expected"] == 1 and is_equivalent(c["gold"], c["pred"])]
    wrong_ok = [c for c in CASES if c["expected"] == 0 and is_equivalent(c["gold"], c["pred"])]
    missed = [(c["gold"][-60:], c["pred"][-60:]) for c in CASES if c["expected"] == 1 and c not in equal_ok]
    assert len(equal_ok) > 203, missed
    assert len(wrong_ok) <= 2, [(c["gold"][-60:], c["pred"][-60:]) for c in wrong_ok]


EQUAL = [
    ("1000", "1000.0"),
    ("1000", "1,000"),
    ("1000.0", "1,000"),
    ("10/9", "\\frac{10}{9}"),
    ("10/9", "\\dfrac{10}{9}"),
    ("\\frac{10}{9}", "\\tfrac{10}{9}"),
    ("28\\%", "28"),
    ("28\\%", "28 percent"),
    ("(1, 2)", "\\left( 1, 2 \\right)"),
    ("\\{1, 2, 3\\}", "\\{3, 1, 2\\}"),
    ("[0, 1)", "[0,1)"),
    ("(-\\infty, 3] \\cup (5, \\infty)", "(-\\infty,3]\\cup(5,\\infty)"),
    ("\\sqrt{8}", "2\\sqrt{2}"),
    ("\\sqrt3", "\\sqrt{3}"),
    ("2^{10}", "1024"),
    ("\\frac{\\pi}{2}", "\\pi/2"),
    ("x^2 - 1", "(x-1)(x+1)"),
    ("\\frac{x+1}{2}", "\\frac{1}{2}x + \\frac{1}{2}"),
    ("\\frac{\\sqrt{3}}{2}", "\\sin(\\pi/3)"),
    ("$540$", "540"),
    ("x = 5", "5"),
    ("3 \\pm \\sqrt{2}", "\\{3 + \\sqrt{2}, 3 - \\sqrt{2}\\}"),
    ("\\begin{pmatrix}1 & 2 \\\\ 3 & 4\\end{pmatrix}", "\\begin{bmatrix}1 & 2 \\\\ 3 & 4\\end{bmatrix}"),
    ("90^\\circ", "90"),
    ("\\text{Evelyn}", "Evelyn"),
]

NOT_EQUAL = [
    ("\\frac{1}{2004!}", "\\frac{1}{2006!}"),
    ("1+\\frac{1}{e}", "1-\\frac{1}{e}"),
    ("1/2", "0.50000001"),
    ("(1, 2, 3)", "(1, 2)"),
    ("\\{1, 2, 3\\}", "\\{1, 2\\}"),
    ("(1, 2)", "(2, 1)"),
    ("[0, 1)", "(0, 1)"),
    ("\\sqrt{2}", "1.41421356237"),  # a decimal approximation of an irrational is not equal to it
    ("x^2 + 1", "x^2 - 1"),
    ("x < 1", "x > 1"),
    ("\\pm 2", "2"),
    ("540", "541"),
    ("2", "AZYUK2A"),
    ("5", "9^{9^{9^{9}}}"),
]


@pytest.mark.parametrize("gold,pred", EQUAL)
def test_equal(gold, pred):
    assert is_equivalent(gold, pred)
    assert is_equivalent(pred, gold)


@pytest.mark.parametrize("gold,pred", NOT_EQUAL)
def test_near_misses_rejected(gold, pred):
    assert not is_equivalent(gold, pred)
    if not (re.fullmatch(r"[-+]?\d*\.\d{2,}", pred) and "." not in gold):
        # (a gold given in decimals accepts an exact answer that rounds to its digits:
        # test_reward_phrasings.py::test_decimal_golds_of_any_precision)
        assert not is_equivalent(pred, gold)


@pytest.mark.parametrize(
    "gold,pred",
    [
        ("5", "9^{9^{9^{9}}}"),
        ("5", "1" * 100_000),
        ("5", "{" * 100_000 + "5" + "}" * 100_000),
        ("5", "\\frac{1}{" * 3000),
        ("5", "\\sqrt{" * 5000 + "5"),
        ("5", "10^{10^{10}} - 10^{10^{10}} + 5"),
        ("5", "(99999999)!"),
        ("5", "(x+1)^{100000}"),
    ],
)
def test_pathological_inputs_return_quickly(gold, pred):
    # Guards reject these before sympy evaluates anything (no timeout involved here).
    assert is_equivalent(gold, pred) is False


def test_identical_huge_answers_still_equal():
    assert is_equivalent("9^{9^{9^{9}}}", "9^{9^{9^{9}}}")


def test_compute_score_math_mode_extracts_answer_and_boxed():
    assert compute_score("Thus ...\nAnswer: $\\frac{1}{2}$", "0.5", mode="math").score == 1.0
    assert compute_score("so the result is \\boxed{1,000}.", "1000", mode="math").acc
    # The official checker rejects "Answer: 540." (period); math mode does not.
    assert compute_score("Answer: 540.", "540", mode="math").acc
    assert not compute_score("Answer: 540.", "540", mode="dapo").acc
    r = compute_score("I could not solve it.", "540", mode="math")
    assert (r.score, r.acc, r.reason) == (-1.0, False, "no_answer")
    r = compute_score("Answer: 541<|im_end|>", "540", mode="math")
    assert (r.score, r.reason, r.pred) == (-1.0, "wrong", "541")


def test_multiple_choice():
    assert is_equivalent("C", "thinking about it I think the correct answer is C")
    assert is_equivalent("(D) Alina", "D")
    assert not is_equivalent("(A) Cecile", "C")


def _math500():
    return [json.loads(line) for line in (DATA / "eval" / "math500.jsonl").open()]


def test_held_out_math500_gold_vs_boxed_solution():
    """A second data set beside the tuning cases: each MATH-500 gold answer is equivalent to
    the worked solution that boxes it, and unrelated golds are not. (Three of its misses -
    mixed numbers, "-2,1" lists, "our answer is correct" phrases - led to rule fixes, so it
    is only partly held out.)"""
    rows = _math500()
    missed = [(r["answer"], r["solution"][-80:]) for r in rows if not is_equivalent(r["answer"], r["solution"])]
    assert len(missed) <= 5, missed
    accepted = [
        (a["answer"], b["answer"])
        for a, b in zip(rows[:250], rows[250:])
        if a["answer"].strip() != b["answer"].strip() and is_equivalent(a["answer"], b["answer"])
    ]
    assert len(accepted) <= 1, accepted


def test_mixed_numbers_and_comma_readings():
    assert is_equivalent("\\frac{639}{40}", "15\\frac{39}{40}")
    assert is_equivalent("-2,1", "$\\boxed{-2,1}$")  # a list ...
    assert is_equivalent("1,22", "1.22")  # ... or a decimal comma in plain text
    assert not is_equivalent("1,22", "1.23")


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_PIECES = list("0123456789{}()[]^_\\$!+-*/=,.:;|<> xyzabcefpqrt%&\n") + [
    "\\frac",
    "\\sqrt",
    "\\pm",
    "\\boxed{",
    "\\text{",
    "\\left(",
    "\\right)",
    "\\infty",
    "\\pi",
    "\\cup",
    "\\le",
    "\\begin{pmatrix}",
    "\\end{pmatrix}",
    "\\\\",
    "\\sum_",
    "Answer:",
    "\\in",
    "\\approx",
    "\\{",
    "\\}",
    "\\cdot",
    "\\log_",
    "\\sin",
    "f(",
    "\\mathrm{",
    "\\dfrac",
    "9^{9^{9^{9}}}",
]
_latexish = st.lists(st.sampled_from(_PIECES), max_size=25).map("".join)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(_latexish.filter(str.strip), _latexish | st.text(max_size=60))
def test_fuzz_in_process_never_raises(gold, pred):
    assert isinstance(is_equivalent(gold, pred), bool)
    for mode in ("math", "dapo"):
        result = compute_score(pred, gold, mode=mode)
        assert result.score in (1.0, -1.0) and result.acc is (result.score > 0)


@pytest.mark.parametrize(
    "template,acc",
    [
        ("Answer: {g}", True),
        ("Answer: {g}.", True),  # dapo mode: wrong (period)
        ("**Answer:** {g}", True),  # dapo mode: wrong (markdown)
        ("Answer: \\frac{{{g}}}{{1}}", True),  # dapo mode: wrong (no equivalence)
        ("Answer: {g} degrees", True),
        ("Answer: {g} cm^2", True),
        ("Answer: x = {g}", True),
        ("So the result is \\boxed{{{g}}}.", True),  # dapo mode: no Answer line
        ("The final answer is ${g}$.", True),
        ("Answer: {g}<|im_end|>", True),
        ("Answer: {g}\nAnswer: {g}1", False),  # the last Answer line counts
        ("Answer: {g} 0", False),
        ("The answer might be {g} but I am not sure", False),  # no stated answer
    ],
)
def test_math_mode_response_styles(template, acc):
    from test_reward_dapo_parity import GROUND_TRUTHS

    for gt in GROUND_TRUTHS[:10]:
        assert compute_score(template.format(g=gt), gt, mode="math").acc is acc, (template, gt)


def test_gsm8k_gold_vs_solution_with_currency_dollars():
    """GSM8K solutions use "$" for money and end with "#### N"; both must not confuse math mode."""
    rows = [json.loads(line) for line in (DATA / "eval" / "gsm8k-test-head300.jsonl").open()][:300]
    missed = [r["answer"][-60:] for r in rows if not is_equivalent(r["answer"].split("####")[-1].strip(), r["answer"])]
    assert not missed, missed[:5]
    assert is_equivalent("18", "Answer: $18")
    assert not is_equivalent("18", "She pays $18 + $2 = $20.\n#### 20")


def test_math500_answers_against_other_solutions():
    rows = _math500()
    accepted = [
        (a["answer"], b["answer"])
        for a, b in zip(rows[::2], rows[1::2])
        if not is_equivalent(a["answer"], b["answer"]) and is_equivalent(a["answer"], b["solution"])
    ]
    assert not accepted
