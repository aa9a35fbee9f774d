"""The design math (megatron_dapo/ablation/design.py): full and fractional two-level designs,
aliasing and resolution, effects as contrasts against hand computations, Student t intervals."""

import itertools
import math

import numpy as np
import pytest

from megatron_dapo.ablation.design import (
    Design,
    DesignError,
    contrast,
    full_factorial,
    make_design,
    parse_generator,
    parse_word,
    student_t_ppf,
    t_interval,
    word_name,
)


def test_full_factorial_2_3_standard_order():
    m = full_factorial(3)
    # Yates order: A alternates fastest, then B, then C
    assert m.tolist() == [
        [-1, -1, -1],
        [1, -1, -1],
        [-1, 1, -1],
        [1, 1, -1],
        [-1, -1, 1],
        [1, -1, 1],
        [-1, 1, 1],
        [1, 1, 1],
    ]
    d = make_design(3)
    assert d.is_full and d.name == "2^3" and d.runs == 8 and d.resolution is None
    assert d.resolution_name == "full (no aliasing)"
    # every combination exactly once; every column and every product of columns balanced and orthogonal
    assert len({tuple(r) for r in d.matrix}) == 8
    cols = [d.column(frozenset(w)) for r in (1, 2, 3) for w in itertools.combinations(range(3), r)]
    for c in cols:
        assert c.sum() == 0
    for a, b in itertools.combinations(cols, 2):
        assert int(a @ b) == 0
    can, cannot = d.describe_separation()
    assert can == ["A", "B", "C", "AB", "AC", "BC"] and cannot == []


def test_fractional_2_4_1_resolution_iv_and_its_aliases():
    d = make_design(4, fraction=1)
    assert [g.text for g in d.generators] == ["D=ABC"]
    assert d.name == "2^(4-1)" and d.runs == 8
    assert d.resolution == 4 and d.resolution_name == "resolution IV"
    assert [(word_name(w), s) for w, s in d.defining_relation()] == [("ABCD", 1)]
    # I = ABCD in every run
    assert (d.column(frozenset({0, 1, 2, 3})) == 1).all()
    # D is the product of A, B and C; the basic factors form a full 2^3
    assert (d.matrix[:, 3] == d.matrix[:, 0] * d.matrix[:, 1] * d.matrix[:, 2]).all()
    assert (d.matrix[:, :3] == full_factorial(3)).all()
    # main effects are aliased only with three-factor interactions; the 2FIs in pairs
    for i, _name in enumerate("ABCD"):
        assert d.low_order_aliases(frozenset({i})) == []
        assert d.separable(frozenset({i}))
    assert d.low_order_aliases(parse_word("AB", 4)) == ["CD"]
    assert d.low_order_aliases(parse_word("AC", 4)) == ["BD"]
    assert d.low_order_aliases(parse_word("AD", 4)) == ["BC"]
    assert [word_name(w) for w, _ in d.aliases(parse_word("A", 4))] == ["BCD"]
    can, cannot = d.describe_separation()
    assert can == ["A", "B", "C", "D"]
    assert cannot == ["AB = CD", "AC = BD", "AD = BC"]
    # aliases share a column exactly
    assert (d.column(parse_word("AB", 4)) == d.column(parse_word("CD", 4))).all()
    # the effects list has one entry per column: 4 mains + 3 alias pairs
    assert [e.label for e in d.effects()] == ["A", "B", "C", "D", "AB = CD", "AC = BD", "AD = BC"]


def test_other_half_fraction_and_resolution_iii():
    d = make_design(4, generators=["D=-ABC"])
    assert [(word_name(w), s) for w, s in d.defining_relation()] == [("ABCD", -1)]
    assert (d.column(parse_word("ABCD", 4)) == -1).all()
    assert d.low_order_aliases(parse_word("AB", 4)) == ["-CD"]
    d3 = make_design(3, fraction=1)  # C = AB: main effects aliased with 2FIs
    assert d3.resolution == 3 and d3.resolution_name == "resolution III"
    assert d3.low_order_aliases(parse_word("C", 3)) == ["AB"]
    assert not d3.separable(parse_word("A", 3))
    d5 = make_design(5, fraction=2)  # D=AB, E=AC: I = ABD = ACE = BCDE
    rel = sorted(word_name(w) for w, _ in d5.defining_relation())
    assert rel == ["ABD", "ACE", "BCDE"] and d5.resolution == 3
    assert make_design(5, fraction=1).resolution == 5
    assert make_design(6, fraction=2).resolution == 4


@pytest.mark.parametrize(
    "bad, msg",
    [
        ("D=A", "resolution II"),
        ("D=ABD", "by itself"),
        ("D=ABX", "letters among"),
        ("DABC", "write it as"),
        ("E=ABC", "not one of the 4 factors"),
        ("D=AAB", "appears twice"),
    ],
)
def test_bad_generators(bad, msg):
    with pytest.raises(DesignError, match=msg):
        parse_generator(bad, 4)


def test_design_refusals():
    with pytest.raises(DesignError, match="defined twice"):
        make_design(5, generators=["D=AB", "D=AC"])
    with pytest.raises(DesignError, match="itself generated"):
        make_design(5, generators=["D=AB", "E=AD"])
    with pytest.raises(DesignError, match=r"must be in \[0, 2\]"):
        make_design(3, fraction=3)
    with pytest.raises(DesignError, match="no default generators"):
        make_design(9, fraction=4)


def test_effects_against_a_hand_computation():
    """y = 10 + 3 xA - 2 xB + 1.5 xA xB + 0.5 xC (effects are twice the coefficients):
    A = 6, B = -4, C = 1, AB = 3, AC = BC = 0."""
    d = make_design(3)
    x = d.matrix
    y = 10 + 3 * x[:, 0] - 2 * x[:, 1] + 1.5 * x[:, 0] * x[:, 1] + 0.5 * x[:, 2]
    got = {e.name: contrast(d, e.word, y) for e in d.effects()}
    assert got == pytest.approx({"A": 6.0, "B": -4.0, "C": 1.0, "AB": 3.0, "AC": 0.0, "BC": 0.0})
    # by hand, A: mean of the A+ runs minus mean of the A- runs
    a_plus = (y[1] + y[3] + y[5] + y[7]) / 4
    a_minus = (y[0] + y[2] + y[4] + y[6]) / 4
    assert got["A"] == pytest.approx(a_plus - a_minus)
    # = 2/n sum x y
    assert got["AB"] == pytest.approx(2 / 8 * float((x[:, 0] * x[:, 1]) @ y))


def test_fractional_effects_estimate_the_alias_sums():
    """In 2^(4-1) with D = ABC the AB column estimates AB + CD."""
    d = make_design(4, fraction=1)
    x = d.matrix
    y = 1 + 2 * x[:, 0] + 0.75 * x[:, 0] * x[:, 1] + 0.25 * x[:, 2] * x[:, 3]
    assert contrast(d, parse_word("A", 4), y) == pytest.approx(4.0)
    assert contrast(d, parse_word("AB", 4), y) == pytest.approx(2 * (0.75 + 0.25))
    assert contrast(d, parse_word("CD", 4), y) == pytest.approx(2.0)
    assert contrast(d, parse_word("D", 4), y) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="7 outcomes for a design of 8"):
        contrast(d, parse_word("A", 4), y[:7])


def test_student_t_quantiles_and_interval():
    # table values of t(0.975, df)
    for df, want in ((1, 12.7062), (2, 4.3027), (4, 2.7764), (10, 2.2281), (30, 2.0423)):
        assert student_t_ppf(0.975, df) == pytest.approx(want, abs=1e-4)
    assert student_t_ppf(0.95, 5) == pytest.approx(2.0150, abs=1e-4)
    assert student_t_ppf(0.025, 3) == pytest.approx(-3.1824, abs=1e-4)
    iv = t_interval([0.10, 0.14])
    sd = math.sqrt(((0.10 - 0.12) ** 2 + (0.14 - 0.12) ** 2) / 1)
    half = 12.7062 * sd / math.sqrt(2)
    assert iv.mean == pytest.approx(0.12) and iv.n == 2 and iv.sd == pytest.approx(sd)
    assert (iv.low, iv.high) == (pytest.approx(0.12 - half, abs=1e-5), pytest.approx(0.12 + half, abs=1e-5))
    one = t_interval([0.3])
    assert one.mean == 0.3 and one.low is None and one.high is None and one.n == 1
    assert t_interval([]).n == 0 and math.isnan(t_interval([]).mean)
    assert t_interval([1.0, float("nan"), 3.0]).n == 2


def test_design_matrix_of_every_default_fraction_is_balanced():
    from megatron_dapo.ablation.design import DEFAULT_GENERATORS

    for k, p in DEFAULT_GENERATORS:
        d = make_design(k, fraction=p)
        assert d.runs == 2 ** (k - p)
        assert (d.matrix.sum(axis=0) == 0).all()
        assert len({tuple(r) for r in d.matrix}) == d.runs
        assert isinstance(d, Design) and np.isin(d.matrix, (-1, 1)).all()
