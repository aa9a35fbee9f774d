"""`math` mode: the order of readings that finds a response's answer, the hedge rule, and the
forms models write (ASCII math, Unicode, thin spaces, worded lists, text in any case).

Every reading and every form has near-miss negatives next to its positives: a wrong value
in the same spelling, or a number that the reading must not cut out of an expression.
The rules are documented in docs/verifier.md.
"""

from __future__ import annotations

import pytest

from megatron_dapo.reward import compute_score, is_equivalent
from megatron_dapo.reward.answer_reading import read_answer


def score(response: str, gold: str):
    return compute_score(response, gold, mode="math")


def reading(text: str):
    r = read_answer(text)
    return None if r is None else (r.parts, r.source)


# --------------------------------------------------------------------------- extraction order
@pytest.mark.parametrize(
    "response,parts,source",
    [
        # 1. the last group of boxes, even with numbers after it
        ("We get 3 + 4 = 7, so $\\boxed{12}$ is the total of 3 parts.", ["12"], "boxed"),
        ("\\boxed{2} \\text{ and } \\boxed{3}", ["2", "3"], "boxed"),
        # 2. the last "Answer:" line, markdown bold ignored
        ("We get 7.\n\nAnswer: 15x - 80", ["15x - 80"], "answer"),
        ("**Answer:** $\\frac{1}{2}$", ["\\frac{1}{2}"], "answer"),
        ("**Final Answer**: 5", ["5"], "answer"),
        ("\\textbf{Answer:} 5", ["5"], "answer"),
        ("Answer: x**2 + 1", ["x**2 + 1"], "answer"),  # an ASCII power is no markdown bold
        ("Answer: x \\in (5, \\infty), as computed above.", ["x \\in (5, \\infty)"], "answer"),  # a remark after it
        ("Answer: (a + 5)*(b + 2) (expanded below)", ["(a + 5)*(b + 2)"], "answer"),
        ("Answer: evelyn (as required)", ["evelyn"], "answer"),
        # 3. an answer sentence, whole, up to the sentence's end
        ("The answer is 15x - 80.", ["15x - 80"], "sentence"),
        ("So the answer is 6 - 5*i.", ["6 - 5*i"], "sentence"),
        ("the answer is .0000672.", [".0000672"], "sentence"),
        ("The answer is Evelyn.", ["Evelyn"], "sentence"),
        ("The answer is 2*pi + 18.", ["2*pi + 18"], "sentence"),
        ("The answer is 3, 5, and 7.", ["3, 5, and 7"], "sentence"),
        ("The final answer is $\\frac{1}{2}$. I hope it is correct.", ["\\frac{1}{2}"], "sentence"),
        ("The answer is\n$$\\frac{1}{2}$$", ["\\frac{1}{2}"], "sentence"),
        ("The answer is 5, which is prime.", ["5"], "sentence"),
        ("The answer is 12 apples.", ["12"], "sentence"),
        ("The answer is 76 degrees.", ["76°"], "sentence"),
        ("The answer to the problem is 12.", ["12"], "sentence"),
        ("The answer is 5. We can check that our answer is correct.", ["5"], "sentence"),
        ("#### 42", ["42"], "sentence"),
        # 4. a concluding sentence near the end
        ("We compute the area step by step.\nTherefore, the area is $2\\pi + 18$.", ["2\\pi + 18"], "conclusion"),
        ("Therefore, $x = 5$.", ["x = 5"], "conclusion"),
        ("Thus there are 12 ways to do it.", ["12"], "conclusion"),
    ],
)
def test_readings_of_a_response(response, parts, source):
    assert reading(response) == (parts, source)


@pytest.mark.parametrize(
    "response",
    [
        "The answer is not 5.",  # a judgment, not an answer
        "So our answer is correct.",
        "So we need to find $x$ such that",  # a conclusion that states no value (a truncated response)
        "Therefore, we are done. "
        + "More reasoning follows here without any result. " * 10,  # beyond the last 300 characters
        "We need $x > 0$ for the logarithm to exist.",  # a restated condition, not a conclusion
        "Suppose $n = 5$.",
        "Let me recall that $a + b = 10$ and see where that leads.",
        "Is it $5$?",
        "Hmm, I am not sure where to go from here.",
    ],
)
def test_no_reading_means_no_answer(response):
    assert reading(response) is None
    assert score(response, "18").reason == "no_answer"


@pytest.mark.parametrize(
    "response,gold,ok",
    [
        ("The answer is 15x - 80.", "15x - 80", True),
        ("The answer is 15x - 80.", "80", False),  # the whole span, never its last number
        ("the answer is 6 - 5*i.", "6 - 5i", True),
        ("the answer is 6 - 5*i.", "5", False),
        ("the answer is .0000672.", ".0000672", True),
        ("the answer is .0000672.", "0.000672", False),
        ("The answer is Evelyn.", "\\text{Evelyn}", True),
        ("The answer is Evelyn.", "\\text{Eve}", False),
        ("The answer is 2*pi + 18.", "18+2\\pi", True),
        ("The answer is 2*pi + 18.", "18", False),
        ("Therefore, the area is $2\\pi + 18$.", "18 + 2\\pi", True),
        ("Therefore, the area is $2\\pi + 18$.", "18", False),
        ("Therefore, $x = 5$.", "5", True),
        ("Therefore, $x = 5$.", "6", False),
        ("**Final Answer**: 5", "5", True),
        ("**Final Answer**: 5", "6", False),
        ("Answer: 12 (twelve)", "12", True),
        ("Answer: 12 (twelve)", "2", False),
        ("The answer is 3. So x = 4.", "3", True),  # the answer sentence beats a later conclusion
        ("The answer is 3. So x = 4.", "4", False),
        # no marker: the formula that closes the final sentence
        ("We get $2\\pi+18$", "18 + 2\\pi", True),
        ("We get $2\\pi+18$", "18", False),
        ("... x is 15, so the total is 2*pi + 18", "18 + 2\\pi", True),
        ("... x is 15, so the total is 2*pi + 18", "15", False),
    ],
)
def test_each_reading_scores_with_near_misses(response, gold, ok):
    assert score(response, gold).acc is ok


def test_last_number_fallback_only_for_a_lone_number():
    # A bare answer or a solution text (is_equivalent) may end in prose: its last number counts
    # only when it stands alone.
    assert is_equivalent("42", "Adding the two groups gives 42 apples in total")
    assert not is_equivalent("41", "Adding the two groups gives 42 apples in total")
    assert not is_equivalent("18", "Adding the two areas, the total is 2*pi + 18 in all")
    assert not is_equivalent("18", "Adding the two areas, the total is 2*pi+18 in all")
    assert not is_equivalent("80", "so the profit grows like 15x - 80 overall")


# --------------------------------------------------------------------------- hedges
@pytest.mark.parametrize(
    "response,gold,ok",
    [
        ("The answer is 3 or 4.", "3", False),
        ("The answer is 3 or 4.", "4", False),
        ("The answer is 3 or 4.", "3, 4", True),  # a gold that is a list matches element-wise
        ("Answer: 215 or 216", "216", False),
        ("Answer: -3/4, 5/4, or 1/4", "\\frac14", False),
        ("Answer: -3/4, 5/4, or 1/4", "-\\frac34, \\frac54, \\frac14", True),
        ("The answer is either $3$ or $4$.", "4", False),
        ("The answer is $3$ or 4.", "3", False),
        ("The answer is 3 (or 4).", "3", False),
        ("Answer: 5 (or possibly 6)", "5", False),
        ("Answer: $5 \\text{ or } 6$", "5", False),
        ("Answer: $\\pm 3$", "3", False),
        ("Answer: $\\pm 3$", "\\pm 3", True),
        ("Answer: x = 3 or x = -3", "\\pm 3", True),
        # two boxes
        # a correction in the open: the last committed answer counts, earlier ones were superseded
        ("First $\\boxed{3}$. Checking again, the answer is $\\boxed{4}$.", "4", True),
        ("First $\\boxed{3}$. Checking again, the answer is $\\boxed{4}$.", "3", False),
        ("First $\\boxed{4}$. Checking again, the answer is $\\boxed{3}$.", "4", False),
        ("A first pass gives $\\boxed{6}$. I find a slip, so the corrected answer is $\\boxed{7}$.", "7", True),
        ("A first pass gives $\\boxed{6}$. I find a slip, so the corrected answer is $\\boxed{7}$.", "6", False),
        ("Answer: 6\n\nWait, I made an error in step 2. Redoing it:\n\nAnswer: 7", "7", True),
        ("Answer: 6\n\nWait, I made an error in step 2. Redoing it:\n\nAnswer: 7", "6", False),
        # a hedge: candidates offered together in the final box group, sentence or line
        ("So the answer is $\\boxed{3}$ or $\\boxed{4}$.", "4", False),
        ("So the answer is $\\boxed{3}$ or $\\boxed{4}$.", "3", False),
        ("Both work: $\\boxed{3}$, $\\boxed{4}$", "4", False),
        ("Both work: $\\boxed{3}$, $\\boxed{4}$", "3, 4", True),
        ("It is $\\boxed{3}$ and maybe later $\\boxed{4}$.", "4", False),
        ("First $\\boxed{\\frac{1}{2}}$. Simplifying, the answer is $\\boxed{0.5}$.", "\\frac12", True),
        ("The first root is $\\boxed{3}$. The second root is $\\boxed{5}$.", "3, 5", True),
        ("The first root is $\\boxed{3}$. The second root is $\\boxed{5}$.", "3", False),
        ("Roots: $\\boxed{3}$. Then $\\boxed{5}$. Also $\\boxed{7}$.", "3, 5", False),
        # a final statement after the last box supersedes the boxes (they were steps) ...
        ("So $\\boxed{5}$.\n\nAnswer: 6", "5", False),
        ("So $\\boxed{5}$.\n\nAnswer: 6", "6", True),
        ("So $\\boxed{0.5}$.\n\nAnswer: 1/2", "\\frac{1}{2}", True),
        ("Interest: $\\boxed{255}$. Total $10,455. The final answer is $10,455$.", "10455", True),
        ("Interest: $\\boxed{255}$. Total $10,455. The final answer is $10,455$.", "255", False),
        # ... and so does a later answer sentence
        ("So $\\boxed{5}$. Hence the answer is 6.", "5", False),
        ("So $\\boxed{5}$. Hence the answer is 6.", "6", True),
        ("So $\\boxed{5}$. Hence the answer is 5.", "5", True),
        # an "Answer:" line and a later answer sentence
        ("Answer: 3.\nThe answer is 4.", "3", False),
        ("Answer: 3.\nThe answer is 4.", "4", True),
        ("Answer: 3.\nThe answer is 3.", "3", True),
        # the same value twice is no hedge
        ("Answer: 2 or 2.0", "2", True),
    ],
)
def test_hedge_rule(response, gold, ok):
    assert score(response, gold).acc is ok


def test_hedges_and_corrections_through_is_equivalent():
    """`is_equivalent` reads a text exactly as `compute_score` reads a response."""
    assert not is_equivalent("216", "215 or 216")
    assert not is_equivalent("4", "\\boxed{3} and later \\boxed{4}")  # one sentence: offered together
    assert is_equivalent("4", "We found \\boxed{3}. On reflection the answer is \\boxed{4}.")  # a correction
    assert not is_equivalent("3", "We found \\boxed{3}. On reflection the answer is \\boxed{4}.")
    assert is_equivalent("3, 4", "3 or 4")


ONE_READING = [
    "We find that $x \\lt 3$.",
    "Answer $ 9 $",
    "After simplifying, the result is $3$.",
    "Solving both equations, the solution to the system is $(7, 6)$.",
    "So $17 \\bmod 5 = 2$.",
    "A first pass gives $\\boxed{6}$. I find a slip, so the corrected answer is $\\boxed{7}$.",
    "The answer is 3 or 4.",
    "I could not solve it.",
    "Final answer 12",
    "The answer is for sure D, it can't be A or B",
    "We need $x > 0$ here.",
]


@pytest.mark.parametrize("text", ONE_READING)
def test_is_equivalent_and_compute_score_read_the_same_answer(text):
    for gold in ("x < 3", "9", "3", "(7, 6)", "2", "7", "6", "4", "12", "D", "A", "0"):
        assert is_equivalent(gold, text) is score(text, gold).acc, (gold, text)


# --------------------------------------------------------------------------- forms
# (gold, written answer, equal): each form with near-misses in the same spelling.
FORMS = [
    # ASCII math
    ("\\sqrt{5}", "sqrt(5)", True),
    ("\\sqrt{5}", "sqrt(6)", False),
    ("\\sqrt{5}", "5", False),
    ("3\\sqrt{13}", "3sqrt(13)", True),
    ("3\\sqrt{13}", "3*sqrt(13)", True),
    ("3\\sqrt{13}", "3*sqrt(12)", False),
    ("6 - 5i", "6 - 5*i", True),
    ("6 - 5i", "6 + 5*i", False),
    ("2i", "(1+i)^2", True),  # i is the imaginary unit
    ("-1", "i^2", True),
    ("2i", "(1+i)^3", False),
    ("2\\pi", "2*pi", True),
    ("2\\pi", "2", False),
    ("x^2 + 1", "x**2 + 1", True),
    ("x^2 + 1", "x^3 + 1", False),
    ("\\frac{\\sqrt{3}}{3}", "sqrt(3)/3", True),
    ("\\frac{\\sqrt{3}}{3}", "1/sqrt(3)", True),
    ("\\frac{\\sqrt{3}}{3}", "sqrt(3)/2", False),
    ("\\infty", "infinity", True),
    # Unicode
    ("76^\\circ", "76°", True),
    ("76", "76°", True),
    ("76^\\circ", "77°", False),
    ("\\sqrt{51}", "√51", True),
    ("\\sqrt{51}", "√5", False),
    ("2\\sqrt{113}", "2√113", True),
    ("2\\sqrt{113}", "2√112", False),
    ("\\frac{\\sqrt{21}}{5}", "√21/5", True),
    ("-\\frac{3}{8}", "−3/8", True),
    ("-\\frac{3}{8}", "3/8", False),
    # thousands separators
    ("9901", "9\\,901", True),
    ("9901", "9\\,900", False),
    ("9901", "19\\,802", False),  # a factor of 2
    ("1000000", "1\\,000\\,000", True),
    ("1000000", "1\\,000\\,001", False),
    ("10080", "10{,}080", True),
    ("11111111100", "11,\\! 111,\\! 111,\\! 100", True),
    # worded lists
    ("3, 5, 7", "3, 5, and 7", True),
    ("3, 5, 7", "3, 5 and 7", True),
    ("3, 5, 7", "3, 5, and 8", False),
    ("3, 5, 7", "3 and 5", False),
    # text in another case or without \text{}
    ("\\text{Evelyn}", "EVELYN", True),
    ("\\text{Evelyn}", "evelyn", True),
    ("\\text{Evelyn}", "\\textbf{Evelyn}", True),
    ("\\text{Evelyn}", "Evelyn and Bob", False),
    ("\\text{east}", "West", False),
    # rounded decimals and dropped factors stay wrong
    ("\\sqrt{2}", "1.414", False),
    ("2\\pi", "6.28", False),
    ("\\frac{14}{3}", "4.67", False),
    ("\\pi", "2\\pi", False),
    ("288\\pi", "144\\pi", False),
    # an exact value with an approximation beside it
    ("\\frac{\\sqrt{3}}{3}", "\\frac{\\sqrt{3}}{3} \\approx 0.577", True),
    ("\\pi", "\\pi \\approx 3.142", True),
    ("\\pi", "\\approx 3.142", False),
]


@pytest.mark.parametrize("gold,pred,equal", FORMS, ids=[f"{g}|{p}" for g, p, _ in FORMS])
def test_forms(gold, pred, equal):
    assert is_equivalent(gold, pred) is equal
    assert score(f"Thinking about it with 3 + 4 = 7.\n\nAnswer: {pred}", gold).acc is equal
    assert score(f"So the answer is {pred}.", gold).acc is equal


@pytest.mark.parametrize(
    "pred,value",
    [
        ("\\sum_{k=1}^{5} k^2", "55"),
        ("\\sum_{i=1}^{5} i^2", "55"),  # the index i is no imaginary unit
        ("\\sum_{e=1}^{5} e", "15"),
        ("\\sum\\limits_{n=1}^{3} n", "6"),
        ("\\sum^{3}_{n=1} n", "6"),
        ("\\prod_{j=1}^{5} j", "120"),
        ("\\sum_{k=1}^{4} k!", "33"),
        ("\\sum_{k=0}^{3} \\binom{3}{k}", "8"),
    ],
)
def test_sums_and_products_any_index_letter(pred, value):
    assert is_equivalent(value, pred)
    assert not is_equivalent(str(int(value) + 1), pred)
