"""Alert thresholds of the four-boundary diagnosis (docs/diagnosis.md explains each one).

"early" is the median of the first ``early_window`` logged steps, "recent" the mean of the last
``window`` steps (both shrink to a third of the history when it is short). Every threshold that
compares with "early" needs at least ``min_steps`` logged steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["Thresholds", "load_thresholds"]


@dataclasses.dataclass(frozen=True)
class Thresholds:
    # --- windows ---------------------------------------------------------------------------
    early_window: int = 5  # steps whose median is the "early" reference value
    window: int = 10  # trailing steps averaged into the "recent" (smoothed) value
    trend_window: int = 20  # trailing steps of the least-squares trend (slope)
    min_steps: int = 6  # fewer logged steps: relative (vs early) alerts stay silent

    # --- exploration: entropy, clip fractions ------------------------------------------------
    entropy_collapse_ratio: float = 0.3  # recent entropy < 0.3 x early entropy -> collapse
    entropy_explode_ratio: float = 3.0  # recent entropy > 3 x early entropy -> runaway
    clip_frac_max: float = 0.2  # recent clip_frac_low + clip_frac_high above this
    mismatch_kl_max: float = 0.01  # recent KL(pi_engine || pi_old) above this (engine/trainer mismatch)
    routing_agreement_min: float = 0.9  # MoE: recent worst-layer engine/trainer top-k agreement below this
    routing_agreement_drop: float = 0.05  # ... or this much below its early value (routing drift)
    load_imbalance_max: float = 4.0  # MoE: recent worst-layer max/mean expert load above this
    ess_frac_min: float = 0.5  # recent ESS / N of the importance weights below this: off-policy collapse

    # --- group contrast: kept groups, all-correct / all-wrong, generation rounds --------------
    kept_group_ratio_min: float = 0.1  # recent share of mixed-correctness groups below this
    kept_group_ratio_drop: float = 0.25  # ... or below 0.25 x its early value
    all_correct_ratio_max: float = 0.8  # recent share of all-correct groups above this
    all_wrong_ratio_max: float = 0.8  # recent share of all-wrong groups above this
    num_gen_batches_max: float = 10.0  # recent generation rounds per step at/above this (cap)
    num_gen_batches_rise: float = 2.0  # ... or >= 2 x early and at least 1 round more than early

    # --- token credit: response length and repetition against accuracy ----------------------
    length_growth_min: float = 0.25  # relative length growth over trend_window ...
    acc_stall_delta: float = 0.02  # ... while acc_mean gains less than this over the same window
    length_growth_run: float = 1.0  # or: recent length > (1 + this) x early length while acc_mean
    #                                  gained less than acc_stall_delta since the start
    repetition_rate_max: float = 0.1  # recent share of responses in a repetition loop above this
    repetition_rise: float = 0.05  # ... or this much above its early value

    # --- reward interpretation: truncation, overlong penalty, missing answers ----------------
    truncation_ratio_max: float = 0.1  # recent share of responses cut at the length cap
    overlong_penalty_max: float = 0.1  # recent |overlong_penalty_mean| above this
    no_answer_rate_max: float = 0.2  # recent share of responses without an "Answer:" line
    no_answer_rise: float = 0.1  # ... or this much above its early value
    offpolicy_token_frac_max: float = 0.5  # recent share of trained tokens from older weights (partial rollout)

    # --- sudden changes (any step inside the recent window) ----------------------------------
    sudden_z: float = 6.0  # jump of more than 6 robust sigmas of the preceding window ...
    sudden_rel: float = 0.5  # ... and more than 50% of the preceding level ...
    sudden_abs_rate: float = 0.1  # ... and, for ratios in [0, 1], more than 0.1 absolute

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise TypeError(f"threshold {f.name} must be a number, got {v!r}")
            if v < 0:
                raise ValueError(f"threshold {f.name} must be >= 0, got {v}")
        for name in ("early_window", "window", "trend_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"threshold {name} must be >= 1")

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def replace(self, **changes: Any) -> "Thresholds":
        return self.from_mapping(changes, base=self)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], base: "Thresholds | None" = None) -> "Thresholds":
        """Thresholds from a mapping; unknown keys are an error (a typo must not pass silently)."""
        base = base or cls()
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(types))
        if unknown:
            raise ValueError(f"unknown threshold(s) {unknown}; known: {sorted(types)}")
        changes = {}
        for key, v in values.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError(f"threshold {key} must be a number, got {v!r}")
            changes[key] = int(v) if types[key] in ("int", int) else float(v)
        return dataclasses.replace(base, **changes)

    def with_overrides(self, assignments: Iterable[str]) -> "Thresholds":
        """Apply ``key=value`` strings (the CLI's ``--set``)."""
        values: dict[str, Any] = {}
        for a in assignments:
            key, sep, raw = a.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"--set expects key=value, got {a!r}")
            try:
                values[key.strip()] = float(raw)
            except ValueError:
                raise ValueError(f"--set {key.strip()}: {raw!r} is not a number") from None
        return self.from_mapping(values, base=self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_thresholds(path: str, base: Thresholds | None = None) -> Thresholds:
    """Read thresholds from a YAML (or JSON) mapping of ``name: value``; missing names keep
    their defaults. A top-level ``thresholds:`` key is also accepted."""
    import yaml

    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if isinstance(data, Mapping) and set(data) == {"thresholds"}:
        data = data["thresholds"] or {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: expected a mapping of threshold names to numbers")
    return Thresholds.from_mapping(data, base=base)
