"""`math` mode against a policy that games the reward.

Reward hacks must score wrong, and hostile answers (huge powers, long runs that make
regexes backtrack) must get a verdict quickly in-process, without the pool's timeout.
The bound (1 s of this process's CPU time per answer) is generous on purpose: it catches
exponential or quadratic blow-ups (seconds to hours), not ordinary slowness; CPU time, not
wall time, so that other processes on a loaded machine do not count.
"""

from __future__ import annotations

import random
import time

import pytest

from megatron_dapo.reward import compute_score, is_equivalent

BOUND_S = 1.0


@pytest.fixture(scope="module", autouse=True)
def _warm():
    # The first call imports sympy's evaluation machinery (seconds): not part of any bound.
    is_equivalent("\\frac{1}{2}", "0.5")
    compute_score("Answer: \\sqrt{2}", "\\sqrt{2}", mode="math")


@pytest.mark.parametrize(
    "gold,pred",
    [
        ("C", "C, B, D, E, A"),
        ("C", "Answer: C, B, D, E, A"),
        ("C", "The answer is A or C"),
        ("(C) 12", "(A) (B) (C) (D) (E)"),
        ("C", "C or maybe B"),
        ("C", "C/D"),
        ("\\pi", "\\pi + 10^{-10}\\pi"),
        ("\\pi", "\\pi(1 + 10^{-12})"),
        ("\\sqrt{2}", "\\sqrt{2} - 10^{-15}"),
        ("e", "e + \\frac{1}{10^{20}}"),
        ("\\frac{\\pi}{4}", "\\frac{\\pi}{4} + \\frac{\\sqrt{2}}{10^{11}}"),
        ("\\ln 2", "\\ln 2 + 10^{-30}\\pi"),
    ],
)
def test_reward_hacks_refused(gold, pred):
    assert not is_equivalent(gold, pred)
    assert not compute_score(f"Answer: {pred}", gold, mode="math").acc


def test_hack_neighbours_still_accepted():
    # The fixes refuse the hacks, not the honest answers next to them.
    assert is_equivalent("C", "Answer: C")
    assert is_equivalent("C", "The answer is (C). A is wrong because ...")
    assert is_equivalent("D", "The answer is for sure D, it can't be A or B")  # other letters in prose
    assert is_equivalent("\\pi", "\\pi + 0 \\cdot 10^{-10}")
    assert is_equivalent("\\frac{\\pi}{4}", "\\arctan\\frac{1}{2} + \\arctan\\frac{1}{3}")  # sympy cannot simplify it
    assert is_equivalent("\\sqrt{2} + \\sqrt{3}", "\\sqrt{5 + 2\\sqrt{6}}")


HOSTILE = [
    "((x-1)^{2})^{123456789}",  # a power of a power
    "(2x)^{10^{10}}",  # a large exponent on a non-sum base
    "\\binom{10^{100}}{5 \\cdot 10^{99}}",
    "\\binom{x}{10^{9}}",
    "\\dbinom{123456789}{54321}",
    "\\sum_{k=1}^{10^{9}} k",
    "\\sum_{k=1}^{n} k^{10^{8}}",
    "\\sum_{k=1}^{100} k^{10^{6}} \\cdot 10^{2999}",
    "5 " + "a" * 40 + "!",  # number-with-unit regex
    "5" + " " * 20000 + "percent",  # percentage regex
    "1" * 100_000,
    "1." * 10_000,
    "\\(" * 5000,
    "\\[" * 5000,
    "$$" + "x" * 19000,
    "\\boxed{" * 3000,
    "(x+y+z+w)^{24}",
    "(1+\\sqrt{2})^{100000}",
    "x^{\\frac{10^{9}}{3}}",
    "\\tan(\\tan(\\tan(\\tan(\\tan(\\tan(x))))))",
    "45^\\circ " * 500,
    "7^{th} " * 1000,
    "p=4, " * 300,
    "x=" * 5000,
    "(=" * 3000,
    "Smallest: " * 500,
    "\\{x | " * 500,
    "x < 1 or " * 300,
    "\\begin{pmatrix}" + "1 & " * 500 + "1\\end{pmatrix}",
]


@pytest.mark.parametrize("hostile", HOSTILE, ids=[h[:30] for h in HOSTILE])
def test_hostile_answers_answered_quickly(hostile):
    for gold in ("5", "x^2", "(0, 2)", "\\pi"):
        for call in (
            lambda: is_equivalent(gold, hostile),
            lambda: is_equivalent(hostile, gold),
            lambda: compute_score("Answer: " + hostile, gold, mode="math"),
            lambda: compute_score("Answer: " + hostile, gold, mode="dapo"),
        ):
            start = time.process_time()
            call()
            elapsed = time.process_time() - start
            assert elapsed < BOUND_S, (hostile[:60], gold, f"{elapsed:.2f}s")


_PIECES = [
    "0",
    "1",
    "9",
    "123456789",
    "x",
    "y",
    "n",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "\\{",
    "\\}",
    "^",
    "_",
    "!",
    "+",
    "-",
    "*",
    "/",
    "=",
    ",",
    ".",
    ":",
    ";",
    "|",
    "<",
    ">",
    " ",
    "  ",
    "'",
    "%",
    "$",
    "\\frac",
    "\\dfrac",
    "\\sqrt",
    "\\binom",
    "\\sum_{k=1}^{",
    "\\pi",
    "\\infty",
    "\\pm",
    "\\cup",
    "\\le",
    "\\circ",
    "\\text{",
    "\\mid",
    "\\lor",
    "\\begin{pmatrix}",
    "\\end{pmatrix}",
    "\\\\",
    "&",
    "\\left(",
    "\\right)",
    "Answer:",
    "\\boxed{",
    " or ",
    " and ",
    "th",
    "st",
    "percent",
    "Smallest: ",
    "f(",
    "g(t)=",
    "10^{10}",
    "^{10^{9}}",
    "((x-1)^{2})^{",
    "∞",
    "∪",
    "≤",
    "＜",
]


def _hostile_sample(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.2:  # a long run of one piece: catches quadratic / exponential regexes
        return rng.choice(_PIECES) * rng.randint(200, 3000)
    pieces = [rng.choice(_PIECES) for _ in range(rng.randint(1, 40))]
    if kind < 0.5:  # nested powers and huge numbers
        pieces.insert(rng.randrange(len(pieces) + 1), rng.choice(["^{10^{8}}", "^{123456789}", "!", "^{99999}"]))
    return "".join(pieces)


def test_fuzz_random_and_hostile_answers_bounded_time():
    """400 random and mutated hostile answers through both modes, each under the bound."""
    rng = random.Random(17)
    golds = ["5", "\\frac{3}{7}", "(0, 2)", "x^2 - 1", "C", "\\pi", "0.43", "p=4, q=7"]
    slow = []
    for _ in range(400):
        pred = _hostile_sample(rng)
        gold = rng.choice(golds)
        for mode in ("math", "dapo"):
            start = time.process_time()
            result = compute_score("Answer: " + pred, gold, mode=mode)
            elapsed = time.process_time() - start
            assert result.score in (1.0, -1.0)
            if elapsed >= BOUND_S:
                slow.append((mode, pred[:80], gold, round(elapsed, 2)))
        start = time.process_time()
        is_equivalent(gold, pred)
        elapsed = time.process_time() - start
        if elapsed >= BOUND_S:
            slow.append(("is_equivalent", pred[:80], gold, round(elapsed, 2)))
    assert not slow, slow


# Sums and products of huge terms: a bound must hold for the shape, whatever the index letter
# or the spelling of the bounds (sympy's Euler-Maclaurin on k^k once ran for minutes).
BIGOPS = [
    "\\sum_{k=1}^{2000} k^{k}",
    "\\prod_{k=1}^{2000} k^{k}",
    "\\sum_{k=1}^{1000} k!",
    "\\sum_{k=1}^{300} 2^{2^{k}}",
    "\\sum_{k=1}^{9999} \\sin(k)",
    "\\sum_{k=1}^{10^{4}} \\sqrt{k}",
    "\\sum_{k=1}^{n} k^{k}",
    "\\sum_{k=1}^{300} \\binom{2k}{k}",
    "\\sum_{k=1}^{300} \\frac{1}{k^{k}}",
    "\\prod_{k=1}^{10^{9}} k",
    "\\sum_{j=1}^{2000} \\sum_{k=1}^{2000} j^{k}",
    "\\sum_{k=1}^{2000} k^{k} - \\sum_{k=1}^{2000} k^{k} + 5",
]


@pytest.mark.parametrize("shape", BIGOPS, ids=[b[:30] for b in BIGOPS])
@pytest.mark.parametrize("letter", ["k", "n", "i", "j", "m", "t", "e"])
def test_huge_sums_any_index_letter(shape, letter):
    text = _rename_index(shape, letter) if letter != "k" else shape
    for gold in ("5", "\\pi"):
        for call in (lambda: is_equivalent(gold, text), lambda: compute_score("Answer: " + text, gold, mode="math")):
            start = time.process_time()
            call()
            elapsed = time.process_time() - start
            assert elapsed < BOUND_S, (text[:60], gold, f"{elapsed:.2f}s")


def _rename_index(text: str, letter: str) -> str:
    """The same sum with another index letter (k -> letter), the other letters kept apart."""
    import re

    if re.search(rf"(?<![A-Za-z\\]){letter}(?![A-Za-z])", text):
        return text  # the letter is taken
    return re.sub(r"(?<![A-Za-z\\])k(?![A-Za-z])", letter, text)


def _respell(text: str, rng: random.Random) -> str:
    """One random respelling of a hostile answer: index letter, braces, script order, \\limits,
    \\displaystyle, \\prod for \\sum, spaces, \\dfrac / \\tfrac, \\times, written-out powers of
    ten, thin-space thousands, \\left( \\right), and a wrapper ($...$, \\boxed{}, \\(...\\))."""
    import re

    s = text
    if rng.random() < 0.5:
        s = _rename_index(s, rng.choice("nijmte"))
    if rng.random() < 0.3:
        s = re.sub(r"(\\(?:sum|prod))(_\{[^{}]*\})(\^\{[^{}]*\})", r"\1\3\2", s)  # ^ before _
    if rng.random() < 0.3:
        s = s.replace("\\sum", "\\sum\\limits").replace("\\prod", "\\prod\\limits")
    if rng.random() < 0.2:
        s = s.replace("\\sum", "\\prod") if rng.random() < 0.5 else s.replace("\\prod", "\\sum")
    if rng.random() < 0.3:
        s = re.sub(r"\^\{(\w)\}", r"^\1", s)  # ^{k} -> ^k
    if rng.random() < 0.3:
        s = re.sub(r"10\^\{(\d)\}", lambda m: "1" + "0" * int(m.group(1)), s)  # 10^{9} -> 1000000000
    if rng.random() < 0.2:
        s = re.sub(
            r"(?<![\d.])(\d{4,12})(?!\d)", lambda m: f"{int(m.group(1)):,}".replace(",", rng.choice(["\\,", "{,}"])), s
        )
    if rng.random() < 0.3:
        s = s.replace("\\frac", rng.choice(["\\dfrac", "\\tfrac"])).replace("\\binom", "\\dbinom")
    if rng.random() < 0.2:
        s = s.replace("\\cdot", rng.choice(["\\times", "*"]))
    if rng.random() < 0.3:
        s = re.sub(r"([\^_=+])", r" \1 ", s)
    if rng.random() < 0.2:
        s = "\\displaystyle " + s
    if rng.random() < 0.2:
        s = f"\\left({s}\\right)"
    wrap = rng.choice(["{}", "${}$", "\\boxed{{{}}}", "\\({}\\)", "{}."])
    return wrap.format(s)


@pytest.mark.slow
def test_fuzz_respelled_hostile_shapes_bounded_time():
    """Every hostile shape above, respelled four ways, answered under the bound in both modes."""
    rng = random.Random(28)
    slow = []
    for shape in HOSTILE + BIGOPS:
        for _ in range(4):
            text = _respell(shape, rng)
            gold = rng.choice(["5", "x^2", "(0, 2)", "\\pi"])
            for name, call in (
                ("is_equivalent", lambda: is_equivalent(gold, text)),
                ("is_equivalent reversed", lambda: is_equivalent(text, gold)),
                ("math", lambda: compute_score("Answer: " + text, gold, mode="math")),
                ("math sentence", lambda: compute_score(f"So the answer is {text}", gold, mode="math")),
                ("dapo", lambda: compute_score("Answer: " + text, gold, mode="dapo")),
            ):
                start = time.process_time()
                call()
                elapsed = time.process_time() - start
                if elapsed >= BOUND_S:
                    slow.append((name, text[:80], gold, round(elapsed, 2)))
    assert not slow, slow
