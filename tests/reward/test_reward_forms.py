"""`math` mode: the answer forms real solutions use, each with near-miss negatives.

Every form has pairs that must be equal and pairs in the same notation with a wrong value
(or a wrong structure) that must not be. Both directions are checked unless a rule is
one-sided by design (a rounded decimal gold against an exact response).
"""

from __future__ import annotations

import pytest

from megatron_dapo.reward import compute_score, is_equivalent

# (form, gold, pred): equal, in both directions.
EQUAL = [
    # labelled answers and tuples
    ("labels", "4,7", "p=4, q=7"),
    ("labels", "p=4, q=7", "q=7, p=4"),
    ("labels", "2,9", "Smallest: 2, Largest: 9"),
    ("labels", "(n^2, 3)", "(g(n), h(n)) = (n^2, 3)"),
    ("labels", "g(n)=n^2, h(n)=3", "(g(n), h(n)) = (n^2, 3)"),
    ("labels", "1, 2, 3, 7, 8, 9", "First list: 1, 2, 3 and second list: 7, 8, 9"),
    ("labels", "\\{-1, 1, 5\\}", "x_1 = 5, x_2 = -1, x_3 = 1"),
    # functions and equations
    ("functions", "g(t)=t^2", "g(u)=u^2"),
    ("functions", "f(x)=3x-1", "f(z) = 3z - 1"),
    ("functions", "f(x, y) = x + 2y", "f(a, b) = a + 2b"),
    ("functions", "y = 2x + 1", "2x + 1"),
    ("functions", "y = 2x + 1", "2x - y + 1 = 0"),
    ("functions", "y = \\frac{x}{2} - 3", "x - 2y = 6"),
    # decimals, percentages, mixed numbers, ratios
    ("decimals", "37.5\\%", "\\frac{3}{8}"),
    ("decimals", "37.5\\%", "0.375"),
    ("decimals", "12\\%", "12"),
    ("decimals", "\\frac{38}{9}", "4 2/9"),
    ("decimals", "\\frac{38}{9}", "4\\frac{2}{9}"),
    ("ratios", "5:2", "10:4"),
    ("ratios", "5:2", "5 : 2"),
    ("ratios", "3:4:5", "6:8:10"),
    # intervals and sets
    ("intervals", "(0, 2)", "\\{x \\mid 0 < x < 2\\}"),
    ("intervals", "[1, 3)", "\\{x | 1 \\le x < 3\\}"),
    ("intervals", "(-\\infty, -1) \\cup (2, \\infty)", "x < -1 \\text{ or } x > 2"),
    ("intervals", "(-\\infty, -1] \\cup [2, +\\infty)", "x \\le -1 or x \\ge 2"),
    ("intervals", "(1, 3)", "x > 1 \\text{ and } x < 3"),
    ("intervals", "(-\\infty, 3]", "(-∞, 3]"),
    ("intervals", "(0, 1) \\cup (2, 3)", "(0,1)∪(2,3)"),
    ("intervals", "x \\le 5", "x ≤ 5"),
    ("intervals", "x < 5", "x ＜ 5"),
    ("intervals", "(2, \\infty)", "(2, +∞)"),
    ("intervals", "(2, \\infty)", "x > 2"),
    # vectors, matrices, plus-minus
    ("vectors", "(1, -2, 3)", "\\begin{pmatrix} 1 \\\\ -2 \\\\ 3 \\end{pmatrix}"),
    ("vectors", "(1, 2)", "\\begin{pmatrix} 1 & 2 \\end{pmatrix}"),
    ("vectors", "\\begin{pmatrix} 1/2 \\\\ 4 \\end{pmatrix}", "\\left(\\frac{1}{2}, 4\\right)"),
    ("plus-minus", "3 \\pm \\sqrt{2}", "3 + \\sqrt{2}, 3 - \\sqrt{2}"),
    ("plus-minus", "x = \\pm 2", "-2, 2"),
    ("plus-minus", "1 \\pm i", "x_1 = 1 + i, x_2 = 1 - i"),
    # degrees, ordinals, wrappers, commands
    ("degrees", "45^\\circ 30'", "45.5"),
    ("degrees", "45^\\circ 30'", "\\frac{91}{2}^\\circ"),
    ("degrees", "12^\\circ 15' 36''", "12.26"),
    ("ordinals", "7", "7^{th}"),
    ("ordinals", "21", "21st"),
    ("ordinals", "2", "2^{\\text{nd}}"),
    ("wrappers", "13", "\\text{13}"),
    ("wrappers", "1000", "\\textbf{1,000}"),
    ("wrappers", "\\frac{3}{4}", "\\tfrac{3}{4}"),
    ("wrappers", "10", "\\dbinom{5}{2}"),
    ("wrappers", "10", "\\tbinom{5}{3}"),
    ("wrappers", "15", "x = 15"),
    ("wrappers", "15", "\\therefore 15"),
    ("wrappers", "15", "\\therefore x = 15"),
    # short text answers
    ("text", "Evelyn", "evelyn"),
    ("text", "\\text{the Cougars}", "Cougars."),
    ("text", "no solution", "No Solution!"),
    ("text", "\\text{yes}", "Yes"),
]

# (form, gold, pred): a wrong value (or structure) in the same notation, never equal.
NEAR_MISS = [
    ("labels", "4,7", "p=4, q=8"),
    ("labels", "p=4, q=7", "p=7, q=4"),
    ("labels", "2,9", "Smallest: 2, Largest: 8"),
    ("labels", "(n^2, 3)", "(g(n), h(n)) = (n^2, 4)"),
    ("labels", "1, 2, 3, 7, 8, 9", "First list: 1, 2, 3 and second list: 7, 8"),
    ("labels", "\\{-1, 1, 5\\}", "x_1 = 5, x_2 = -1, x_3 = 2"),
    ("functions", "g(t)=t^2", "g(u)=u^3"),
    ("functions", "g(t)=t^2", "g(u)=t^2"),
    ("functions", "f(x)=3x-1", "h(z) = 3z - 1"),
    ("functions", "f(x, y) = x + 2y", "f(a, b) = b + 2a"),
    ("functions", "y = 2x + 1", "2x + 2"),
    ("functions", "y = 2x + 1", "2x - y - 1 = 0"),
    ("functions", "y = 2x + 1", "x = \\frac{y - 1}{2}"),
    ("decimals", "37.5\\%", "\\frac{3}{7}"),
    ("decimals", "37.5\\%", "0.37"),
    ("decimals", "50\\%", "0.5\\%"),
    ("decimals", "\\frac{38}{9}", "4 2/7"),
    ("decimals", "\\frac{38}{9}", "4 1/9"),
    ("ratios", "5:2", "2:5"),
    ("ratios", "5:2", "5:3"),
    ("ratios", "3:4:5", "3:4:6"),
    ("intervals", "(0, 2)", "\\{x \\mid 0 < x \\le 2\\}"),
    ("intervals", "(0, 2)", "\\{x \\mid 0 < x < 3\\}"),
    ("intervals", "(-\\infty, -1) \\cup (2, \\infty)", "x < -1 \\text{ or } x \\ge 2"),
    ("intervals", "(-\\infty, -1) \\cup (2, \\infty)", "x < -1 \\text{ and } x > 2"),
    ("intervals", "(1, 3)", "x > 1 \\text{ or } x < 3"),
    ("intervals", "(-\\infty, 3]", "(-∞, 3)"),
    ("intervals", "(0, 1) \\cup (2, 3)", "(0,1)∪(2,4)"),
    ("intervals", "x \\le 5", "x ≥ 5"),
    ("intervals", "x < 5", "x ＞ 5"),
    ("intervals", "(2, \\infty)", "(2, -∞)"),
    ("vectors", "(1, -2, 3)", "\\begin{pmatrix} 1 \\\\ 2 \\\\ 3 \\end{pmatrix}"),
    ("vectors", "(1, -2, 3)", "\\begin{pmatrix} 3 \\\\ -2 \\\\ 1 \\end{pmatrix}"),
    ("vectors", "(1, 2, 3, 4)", "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}"),
    ("plus-minus", "3 \\pm \\sqrt{2}", "3 + \\sqrt{2}, 3 - \\sqrt{3}"),
    ("plus-minus", "3 \\pm \\sqrt{2}", "3 + \\sqrt{2}"),
    ("plus-minus", "x = \\pm 2", "2"),
    ("degrees", "45^\\circ 30'", "45.3"),
    ("degrees", "45^\\circ 30'", "45^\\circ 50'"),
    ("ordinals", "7", "8^{th}"),
    ("ordinals", "21", "22nd"),
    ("wrappers", "13", "\\text{14}"),
    ("wrappers", "10", "\\dbinom{5}{1}"),
    ("wrappers", "15", "\\therefore 16"),
    ("text", "Evelyn", "Evelyn and Bob"),
    ("text", "Evelyn", "Eve"),
    ("text", "no solution", "one solution"),
    ("text", "\\text{yes}", "no"),
]


@pytest.mark.parametrize("form,gold,pred", EQUAL, ids=[f"{f}:{p}" for f, _, p in EQUAL])
def test_form_equal(form, gold, pred):
    assert is_equivalent(gold, pred), (form, gold, pred)
    assert is_equivalent(pred, gold), (form, pred, gold)


@pytest.mark.parametrize("form,gold,pred", NEAR_MISS, ids=[f"{f}:{p}" for f, _, p in NEAR_MISS])
def test_form_near_miss(form, gold, pred):
    assert not is_equivalent(gold, pred), (form, gold, pred)
    assert not is_equivalent(pred, gold), (form, pred, gold)


def test_every_form_has_near_misses():
    assert {f for f, _, _ in EQUAL} == {f for f, _, _ in NEAR_MISS}


@pytest.mark.parametrize(
    "gold,pred,ok",
    [
        ("0.43", "\\frac{3}{7}", True),  # 3/7 = 0.4286 rounds to 0.43
        ("0.458", "\\frac{27}{59}", True),  # 0.45763
        ("1.41", "\\sqrt{2}", True),
        ("3.14", "\\pi", True),
        ("0.43", "\\frac{3}{8}", False),  # 0.375
        ("0.43", "\\frac{4}{9}", False),  # 0.444
        ("0.458", "\\frac{11}{24}", True),  # 0.458333...
        ("0.458", "\\frac{5}{11}", False),  # 0.4545...
        ("0.43", "0.425", False),  # a decimal response is compared exactly, not rounded
        ("0.43", "0.4286", False),
        ("0.4", "\\frac{2}{5}", True),  # exact anyway
        ("0.4", "\\frac{3}{7}", False),  # one decimal: too coarse to round to
        ("43", "\\frac{128}{3}", False),  # integers are never rounding targets
    ],
)
def test_rounded_decimal_gold(gold, pred, ok):
    assert is_equivalent(gold, pred) is ok
    # One-sided: an exact gold is never matched by its rounded decimal.
    if pred.startswith("\\") and gold != "0.4":
        assert not is_equivalent(pred, gold)


def test_forms_through_compute_score():
    assert compute_score("... so\nAnswer: p=4, q=7", "4,7", mode="math").acc
    assert not compute_score("... so\nAnswer: p=7, q=4", "p=4, q=7", mode="math").acc
    assert compute_score("Thus $\\boxed{\\begin{pmatrix} 1 \\\\ -2 \\end{pmatrix}}$.", "(1,-2)", mode="math").acc
    assert compute_score("Answer: 37.5%", "\\frac{3}{8}", mode="math").acc


# (gold, pred, equal): further general forms, each with near-misses in the same notation.
MORE = [
    # inverse trigonometric functions written with ^{-1}
    ("\\arctan x + C", "\\tan^{-1} x + C", True),
    ("\\arcsin \\frac{1}{2}", "\\sin^{-1}(1/2)", True),
    ("\\arctan x + C", "\\tan^{-1} 2x + C", False),
    ("\\frac{1}{\\tan x}", "\\tan^{-1} x", False),
    # a two-part ratio is the quotient
    ("5:8", "\\frac{5}{8}", True),
    ("1 : (4/3)", "\\frac{3}{4}", True),
    ("5:8", "\\frac{8}{5}", False),
    ("3:1", "2", False),
    # labelled values with repeats against a bare list
    ("16, 3, 1, 1", "w=16, d=3, a=1, b=1", True),
    ("16, 3, 1, 1", "w=16, d=3, a=1, b=2", False),
    # trailing qualifiers
    ("(n, 1)", "(n, 1) \\text{ for all positive integers } n", True),
    ("2k\\pi", "2k\\pi \\text{ where } k \\in \\mathbb{Z}", True),
    ("(n, 1)", "(n, 2) \\text{ for all positive integers } n", False),
    ("x", "x \\text{ if } x \\ge 0, -x \\text{ if } x < 0", False),  # a condition is no qualifier
    ("1", "1 \\text{ for } n \\text{ odd}, 2 \\text{ for } n \\text{ even}", False),
    # an inequality list with a point
    ("(-\\infty, -2] \\cup \\{1\\}", "a \\le -2 \\text{ or } a = 1", True),
    ("(-\\infty, -2] \\cup \\{1\\}", "a \\le -2 \\text{ or } a = 2", False),
    ("(-\\infty, -2] \\cup \\{1\\}", "a < -2 \\text{ or } a = 1", False),
    # degrees against radians
    ("\\frac{\\pi}{6}", "30^\\circ", True),
    ("\\frac{2\\pi}{3}", "120°", True),
    ("\\frac{\\pi}{6}", "60^\\circ", False),
    ("30", "\\frac{\\pi}{6}", False),
    # control characters left by unescaped JSON (\f of \frac)
    ("\x0crac{1}{2}", "0.5", True),
    ("\x0crac{1}{2}", "0.25", False),
    # \text{sin}
    ("\\text{sin}(x)", "\\sin x", True),
    ("\\text{sin}(x)", "\\cos x", False),
]


@pytest.mark.parametrize("gold,pred,equal", MORE, ids=[f"{p}" for _, p, _ in MORE])
def test_more_forms(gold, pred, equal):
    assert is_equivalent(gold, pred) is equal
    assert is_equivalent(pred, gold) is equal


@pytest.mark.parametrize(
    "gold,pred,ok",
    [
        ("6.67\\%", "\\frac{1}{15}", True),  # 6.666...%
        ("6.67\\%", "\\frac{1}{16}", False),  # 6.25%
        ("6.67", "20:3", True),
        ("6.67", "20:4", False),
    ],
)
def test_rounded_percent_and_ratio(gold, pred, ok):
    assert is_equivalent(gold, pred) is ok


def test_reward_modules_have_no_import_cycle():
    """equiv.py (values) must not import math_mode.py (which imports it): one direction only."""
    import ast
    from pathlib import Path

    import megatron_dapo.reward as reward

    folder = Path(reward.__file__).parent
    graph = {}
    for path in folder.glob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                names.add(node.module.split(".")[0])
        graph[path.stem] = names

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, seen + (n,))) for n in graph.get(start, ()))

    cycles = sorted(m for m in graph if reaches(m, m))
    assert not cycles, cycles
