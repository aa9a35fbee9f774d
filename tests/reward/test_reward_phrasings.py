"""`math` mode, issue 37: the answer phrasings models write, decimal golds of any precision, and
the committed letter of a multiple-choice answer. Every positive has a near-miss negative next
to it (another value in the same phrasing, or a formula in the final sentence that is not the
answer), so none of these readings can raise false accepts unseen. docs/verifier.md lists them.
"""

from __future__ import annotations

import pytest

from megatron_dapo.reward import compute_score, is_equivalent


def accepted(response: str, gold: str) -> bool:
    got = compute_score(response, gold, mode="math").acc
    assert is_equivalent(gold, response) is got, "the two entries read the text differently"
    return got


PHRASINGS = [
    # "Answer" / "Final answer" without a colon, at a line's start
    ("We simplify the sum.\n\nAnswer $ 9 $", "9", True),
    ("We simplify the sum.\n\nAnswer $ 9 $", "8", False),
    ("**Final Answer** 12", "12", True),
    ("**Final Answer** 12", "21", False),
    ("... and so\nANSWER 5", "5", True),
    # "the result / value / solution is"
    ("Putting it together, the result is $3$.", "3", True),
    ("Putting it together, the result is $3$.", "4", False),
    ("Solving both equations, the solution to the system is $(7, 6)$.", "(7, 6)", True),
    ("Solving both equations, the solution to the system is $(7, 6)$.", "(6, 7)", False),
    ("Hence the value of the expression is $\\frac{1}{2}$.", "0.5", True),
    # a concluding formula in prose, no marker: the last formula of the final sentence
    ("Combining the two cases. We find that $x \\lt 3$.", "x < 3", True),
    ("Combining the two cases. We find that $x \\lt 3$.", "x > 3", False),
    ("After a long derivation we obtain the area " + "of the region. " * 25 + "It comes to $12\\pi$.", "12\\pi", True),
    # ... not a formula that restates a condition or sets up the next step
    ("The domain matters here " * 15 + "We need $x > 0$ for the logarithm.", "x > 0", False),
    ("The domain matters here " * 15 + "Suppose $n = 5$.", "5", False),
    ("The domain matters here " * 15 + "Is it $5$?", "5", False),
    ("The domain matters here " * 15 + "Let us compute $2 + 3$ next.", "5", False),
    # an equation whose left side is a computation: the value after the last "="
    ("So $17 \\bmod 5 = 2$.", "2", True),
    ("So $17 \\bmod 5 = 2$.", "17", False),
    ("Therefore $\\det\\begin{pmatrix}2&1\\\\1&2\\end{pmatrix} = 3$.", "3", True),
    ("Therefore $\\det\\begin{pmatrix}2&1\\\\1&2\\end{pmatrix} = 3$.", "2", False),
    ("The answer is $\\sum_{i=1}^n i = \\frac{n(n+1)}{2}$.", "\\frac{n^2+n}{2}", True),
    ("The answer is $\\sum_{i=1}^n i = \\frac{n(n+1)}{2}$.", "\\frac{n(n-1)}{2}", False),
    ("Answer: $3^2 + 4^2 = 25$", "25", True),
    # ... an equation in unknowns stays an equation
    ("The answer is $2x + 4y - 3 = 0$.", "2x + 4y = 3", True),
    ("The answer is $2x + 4y - 3 = 0$.", "3", False),
    # one value in brackets
    ("[5]", "5", True),
    ("[5]", "6", False),
]


@pytest.mark.parametrize("response,gold,ok", PHRASINGS)
def test_phrasings(response, gold, ok):
    assert accepted(response, gold) is ok


DECIMALS = [
    # a symbolic answer against a decimal gold: rounds to the gold's stated digits
    ("4.123105625617661", "\\sqrt{17}", True),
    ("4.123105625617662", "\\sqrt{17}", False),  # off by one unit in the last place
    ("0.6666667", "\\frac{2}{3}", True),
    ("0.6666668", "\\frac{2}{3}", False),
    ("0.43", "\\frac{3}{7}", True),
    ("0.43", "0.425", False),  # a decimal answer is compared exactly
    ("0.3", "\\frac{1}{3}", False),  # one digit: an exact value (0.5, 2.5, 0.3)
    ("3.14", "\\pi", True),
    ("3.15", "\\pi", False),
    # element by element inside tuples, intervals, lists and matrices, brackets as usual
    ("(-1.732, 1.732)", "(-\\sqrt{3}, \\sqrt{3})", True),
    ("(-1.732, 1.732)", "(-\\sqrt{3}, \\sqrt{2})", False),
    ("[-1.732, 1.732)", "(-\\sqrt{3}, \\sqrt{3})", False),
    ("(1.41, 2)", "(\\sqrt{2}, 2)", True),
    ("1.41, 2.24", "\\sqrt{2}, \\sqrt{5}", True),
    ("1.41, 2.24", "\\sqrt{2}, \\sqrt{6}", False),
    (
        "\\begin{pmatrix} 0.71 & 0.71 \\end{pmatrix}",
        "\\begin{pmatrix} \\frac{\\sqrt2}{2} & \\frac{\\sqrt2}{2} \\end{pmatrix}",
        True,
    ),
    (
        "\\begin{pmatrix} 0.71 & 0.72 \\end{pmatrix}",
        "\\begin{pmatrix} \\frac{\\sqrt2}{2} & \\frac{\\sqrt2}{2} \\end{pmatrix}",
        False,
    ),
    # the other direction keeps today's rule: a decimal answer to a symbolic gold is not rounded
    ("\\sqrt{17}", "4.123105625617661", False),
    ("\\frac{2}{3}", "0.6666667", False),
]


@pytest.mark.parametrize("gold,answer,ok", DECIMALS)
def test_decimal_golds_of_any_precision(gold, answer, ok):
    assert accepted(f"Answer: ${answer}$", gold) is ok


LETTERS = [
    ("The answer is for sure D, it can't be A or B", "D", True),
    ("The answer is for sure D, it can't be A or B", "A", False),
    ("The answer is for sure D, it can't be A or B", "B", False),
    ("Answer: B。不是 A", "B", True),
    ("Answer: B。不是 A", "A", False),
    ("排除 A、C，答案是 B", "B", True),
    ("排除 A、C，答案是 B", "A", False),
    ("Answer: C, not A", "C", True),
    ("Answer: C, not A", "A", False),
    ("We rule out (B) and (E). The answer is (C).", "C", True),
    # still refused: every option listed, or several offered together
    ("Answer: C, B, D, E, A", "C", False),
    ("The answer is A or C", "C", False),
    ("Answer: not A, B or C", "B", False),
]


@pytest.mark.parametrize("response,gold,ok", LETTERS)
def test_the_committed_letter_is_the_one_asserted(response, gold, ok):
    assert accepted(response, gold) is ok
