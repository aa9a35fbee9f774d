"""Two-level factorial designs: full 2^k and fractional 2^(k-p), their aliasing, and effects
as contrasts. Pure functions (numpy only); docs/ablation.md explains how to read them.

Notation. Factors are letters ``A, B, C, ...`` in the order given. A level is coded -1 (the
control off, the "low" level) or +1 (on, "high"). An *effect word* is a set of factors: ``A``
a main effect, ``AB`` a two-factor interaction (2FI). Its column in the design is the product
of its factors' columns.

* **Full factorial** 2^k: every combination of levels, in standard (Yates) order: the first
  factor alternates fastest. Every effect has its own column (no aliasing).
* **Fractional factorial** 2^(k-p): a full factorial in the k-p *basic* factors; each of the p
  *generated* factors is the product of basic factors, a *generator* such as ``D=ABC``
  (``D=-ABC`` for the other half). The generator gives the *defining word* ``I = ABCD``: the
  product of a run's ABCD columns is +1 in every run. The *defining relation* is every product of
  defining words; two effects whose product is a defining word have the same column (they are
  *aliases*: ``AB = CD`` when ``I = ABCD``). The *resolution* is the length of the shortest
  defining word: III (mains aliased with 2FIs), IV (mains clear of 2FIs, 2FIs aliased with
  each other), V (mains and 2FIs clear of each other).
* An effect is *separable* here when none of its aliases is a main effect or a 2FI, i.e. its
  estimate is its own assuming interactions of three or more factors are negligible (Wu &
  Hamada's "clear" effects).

Estimates. The effect of word ``w`` on an outcome ``y`` over one complete replicate of the
design is the contrast ``mean(y | x_w = +1) - mean(y | x_w = -1)`` (= ``2/n * sum x_w y`` in a
balanced two-level design). With ``r`` replicates (one per seed) each replicate gives its own
estimate; the reported effect is their mean and its confidence interval is Student's t over
the ``r`` per-replicate estimates: ``mean +- t(1 - alpha/2, r - 1) * sd / sqrt(r)``.
"""

from __future__ import annotations

import itertools
import math
import re
import string
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

import numpy as np

LETTERS = string.ascii_uppercase

#: Minimum-aberration generators (Box, Hunter & Hunter, table 6.22; Montgomery, table 8.14) by
#: (k, p): the highest resolution for the fraction, the fewest shortest words.
DEFAULT_GENERATORS: Dict[Tuple[int, int], Tuple[str, ...]] = {
    (3, 1): ("C=AB",),
    (4, 1): ("D=ABC",),
    (5, 1): ("E=ABCD",),
    (5, 2): ("D=AB", "E=AC"),
    (6, 1): ("F=ABCDE",),
    (6, 2): ("E=ABC", "F=BCD"),
    (6, 3): ("D=AB", "E=AC", "F=BC"),
    (7, 1): ("G=ABCDEF",),
    (7, 2): ("F=ABCD", "G=ABDE"),
    (7, 3): ("E=ABC", "F=BCD", "G=ACD"),
    (7, 4): ("D=AB", "E=AC", "F=BC", "G=ABC"),
}

Word = FrozenSet[int]


class DesignError(ValueError):
    """A design that cannot be built (bad generator, too many factors); the message says why."""


def word_name(word: Iterable[int]) -> str:
    """``{0, 2}`` -> ``"AC"``; the empty word is ``"I"``."""
    w = sorted(word)
    return "".join(LETTERS[i] for i in w) if w else "I"


def parse_word(text: str, k: int) -> Word:
    """``"ABC"`` -> ``{0, 1, 2}``; letters beyond the k-th, repeats or other characters are an error."""
    text = text.strip().upper()
    if not text or not all(c in LETTERS[:k] for c in text):
        raise DesignError(f"{text!r}: an effect word is letters among {LETTERS[:k]} (one per factor)")
    if len(set(text)) != len(text):
        raise DesignError(f"{text!r}: a letter appears twice")
    return frozenset(LETTERS.index(c) for c in text)


@dataclass(frozen=True)
class Generator:
    target: int  # the generated factor
    word: Word  # basic factors whose product defines it
    sign: int = 1

    @property
    def text(self) -> str:
        return f"{LETTERS[self.target]}={'-' if self.sign < 0 else ''}{word_name(self.word)}"

    @property
    def defining_word(self) -> Word:
        return self.word | {self.target}


def parse_generator(text: str, k: int) -> Generator:
    """``"D=ABC"`` or ``"D=-ABC"`` (factor D is the product of A, B and C, or minus it)."""
    m = re.fullmatch(r"\s*([A-Za-z])\s*=\s*([+-]?)\s*([A-Za-z]+)\s*", text)
    if not m:
        raise DesignError(
            f"generator {text!r}: write it as D=ABC (the factor, '=', the product of other factors; "
            "D=-ABC for the other half fraction)"
        )
    target = m.group(1).upper()
    if target not in LETTERS[:k]:
        raise DesignError(f"generator {text!r}: {target} is not one of the {k} factors ({LETTERS[:k]})")
    word = parse_word(m.group(3), k)
    t = LETTERS.index(target)
    if t in word:
        raise DesignError(f"generator {text!r}: {target} cannot be defined by itself")
    if len(word) < 2:
        raise DesignError(
            f"generator {text!r}: {target} would equal the main effect {word_name(word)} in every run "
            "(resolution II: the two can never be told apart); use a product of two or more factors"
        )
    return Generator(t, word, -1 if m.group(2) == "-" else 1)


@dataclass
class Design:
    """A two-level design in ``k`` factors: full (no generators) or 2^(k-p) fractional."""

    k: int
    generators: Tuple[Generator, ...] = ()
    matrix: np.ndarray = field(init=False, repr=False)  # (runs, k) of -1/+1, standard order of the basic factors

    def __post_init__(self):
        if not 1 <= self.k <= len(LETTERS):
            raise DesignError(f"{self.k} factors: a design has 1 to {len(LETTERS)}")
        targets = [g.target for g in self.generators]
        if len(set(targets)) != len(targets):
            dup = sorted({LETTERS[t] for t in targets if targets.count(t) > 1})
            raise DesignError(f"generators: {', '.join(dup)} defined twice")
        basic = [i for i in range(self.k) if i not in targets]
        for g in self.generators:
            bad = [LETTERS[i] for i in g.word if i in targets]
            if bad:
                raise DesignError(
                    f"generator {g.text}: {', '.join(bad)} is itself generated; define generated factors "
                    f"by basic ones ({word_name(basic)}) only"
                )
        self.basic = basic
        base = full_factorial(len(basic))
        m = np.zeros((base.shape[0], self.k), dtype=int)
        for j, i in enumerate(basic):
            m[:, i] = base[:, j]
        for g in self.generators:
            m[:, g.target] = g.sign * np.prod(m[:, sorted(g.word)], axis=1)
        self.matrix = m

    # ------------------------------------------------------------------ description
    @property
    def p(self) -> int:
        return len(self.generators)

    @property
    def runs(self) -> int:
        return self.matrix.shape[0]

    @property
    def is_full(self) -> bool:
        return not self.generators

    @property
    def name(self) -> str:
        return f"2^{self.k}" if self.is_full else f"2^({self.k}-{self.p})"

    def defining_relation(self) -> List[Tuple[Word, int]]:
        """Every non-identity word ``w`` with sign ``s`` such that ``prod(x_w) = s`` in every run."""
        words = [(g.defining_word, g.sign) for g in self.generators]
        out: Dict[Word, int] = {}
        for r in range(1, len(words) + 1):
            for combo in itertools.combinations(words, r):
                w: Word = frozenset()
                s = 1
                for cw, cs in combo:
                    w = w ^ cw
                    s *= cs
                out[w] = s
        return sorted(out.items(), key=lambda ws: (len(ws[0]), sorted(ws[0])))

    @property
    def resolution(self) -> Optional[int]:
        """Length of the shortest defining word; None for a full factorial (nothing aliased)."""
        rel = self.defining_relation()
        return min(len(w) for w, _ in rel) if rel else None

    @property
    def resolution_name(self) -> str:
        r = self.resolution
        return "full (no aliasing)" if r is None else f"resolution {roman(r)}"

    def aliases(self, word: Word) -> List[Tuple[Word, int]]:
        """The words sharing ``word``'s column (``word`` excluded), with the sign of the product."""
        return sorted(((word ^ w, s) for w, s in self.defining_relation()), key=lambda ws: (len(ws[0]), sorted(ws[0])))

    def low_order_aliases(self, word: Word, max_order: int = 2) -> List[str]:
        return [("-" if s < 0 else "") + word_name(a) for a, s in self.aliases(word) if 0 < len(a) <= max_order]

    def separable(self, word: Word) -> bool:
        """True when no main effect or 2FI shares ``word``'s column (higher interactions assumed negligible)."""
        return not self.low_order_aliases(word)

    def column(self, word: Word) -> np.ndarray:
        return np.prod(self.matrix[:, sorted(word)], axis=1) if word else np.ones(self.runs, dtype=int)

    def effects(self, max_order: int = 2) -> List["EffectColumn"]:
        """Main effects and 2FIs (up to ``max_order``), one per column: an effect aliased with an
        earlier one (``CD`` when ``AB = CD``) is listed under it, not again."""
        out: List[EffectColumn] = []
        seen: Dict[Word, EffectColumn] = {}
        for order in range(1, max_order + 1):
            for combo in itertools.combinations(range(self.k), order):
                w = frozenset(combo)
                if w in seen:
                    continue
                low = [(a, s) for a, s in self.aliases(w) if 0 < len(a) <= max_order]
                col = EffectColumn(w, tuple(("-" if s < 0 else "") + word_name(a) for a, s in low))
                out.append(col)
                seen[w] = col
                for a, _ in low:
                    seen[a] = col
        return out

    def describe_separation(self, max_order: int = 2) -> Tuple[List[str], List[str]]:
        """(separable effects, the others as ``"AB = CD"`` chains), mains and 2FIs."""
        can, cannot = [], []
        for col in self.effects(max_order):
            if col.aliases:
                cannot.append(" = ".join([col.name, *col.aliases]))
            else:
                can.append(col.name)
        return can, cannot


@dataclass(frozen=True)
class EffectColumn:
    word: Word
    aliases: Tuple[str, ...] = ()  # main effects / 2FIs sharing this column (signed)

    @property
    def name(self) -> str:
        return word_name(self.word)

    @property
    def label(self) -> str:
        return self.name + "".join(f" = {a}" for a in self.aliases)

    @property
    def order(self) -> int:
        return len(self.word)


def roman(n: int) -> str:
    return {1: "I", 2: "II", 3: "III", 4: "IV", 5: "V", 6: "VI", 7: "VII", 8: "VIII"}.get(n, str(n))


def full_factorial(k: int) -> np.ndarray:
    """All 2^k level combinations (-1/+1), standard order: column 0 alternates fastest."""
    n = 2**k
    rows = np.arange(n)[:, None]
    return np.where((rows >> np.arange(k)[None, :]) & 1, 1, -1).astype(int)


def make_design(k: int, fraction: int = 0, generators: Sequence[str] = ()) -> Design:
    """A full 2^k (``fraction`` 0, no generators), a 2^(k-p) with the default generators for
    ``fraction = p``, or the ``generators`` given (``"D=ABC"``)."""
    if generators:
        gens = tuple(parse_generator(g, k) for g in generators)
        if fraction and fraction != len(gens):
            raise DesignError(f"--fraction {fraction} but {len(gens)} generator(s) given; give one or the other")
        return Design(k, gens)
    if fraction < 0 or fraction >= k:
        raise DesignError(f"--fraction {fraction}: must be in [0, {k - 1}] for {k} factors")
    if fraction == 0:
        return Design(k)
    key = (k, fraction)
    if key not in DEFAULT_GENERATORS:
        known = ", ".join(f"2^({a}-{b})" for a, b in sorted(DEFAULT_GENERATORS) if a == k) or "none"
        raise DesignError(
            f"no default generators for 2^({k}-{fraction}) (known for {k} factors: {known}); give them "
            "with --generators, e.g. D=ABC"
        )
    return Design(k, tuple(parse_generator(g, k) for g in DEFAULT_GENERATORS[key]))


# ---------------------------------------------------------------------------- estimation


def contrast(design: Design, word: Word, y: Sequence[float]) -> float:
    """``mean(y | x_w = +1) - mean(y | x_w = -1)`` over one replicate (``y`` in design order)."""
    y = np.asarray(y, dtype=float)
    if y.shape != (design.runs,):
        raise ValueError(f"contrast: {y.shape[0] if y.ndim else 0} outcomes for a design of {design.runs} runs")
    x = design.column(word)
    return float(y[x > 0].mean() - y[x < 0].mean())


def student_t_ppf(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (bisection on the CDF,
    which is the regularized incomplete beta function; no scipy)."""
    if not 0.0 < q < 1.0 or df <= 0:
        raise ValueError(f"student_t_ppf: q in (0, 1) and df > 0, got q={q}, df={df}")
    if q < 0.5:
        return -student_t_ppf(1.0 - q, df)
    if q == 0.5:
        return 0.0
    lo, hi = 0.0, 1.0
    while student_t_cdf(hi, df) < q:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if student_t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def student_t_cdf(t: float, df: float) -> float:
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t >= 0 else tail


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) (continued fraction, Numerical Recipes 6.4)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(ln_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(ln_front) * _betacf(b, a, 1.0 - x) / b


def _betacf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 3e-16:
            break
    return h


@dataclass(frozen=True)
class Interval:
    mean: float
    low: Optional[float]  # None: no interval (fewer than 2 replicates)
    high: Optional[float]
    n: int
    sd: Optional[float]


def t_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean of ``values`` with Student's t interval (``n - 1`` degrees of freedom); with one
    value the interval is None (a single replicate says nothing about seed-to-seed spread)."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    n = int(v.size)
    if n == 0:
        return Interval(math.nan, None, None, 0, None)
    mean = float(v.mean())
    if n < 2:
        return Interval(mean, None, None, n, None)
    sd = float(v.std(ddof=1))
    half = student_t_ppf(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, sd)
