"""Algorithm controls (one dataclass field = one CLI flag) and the ``grpo`` / ``dapo`` presets.

Every field carries ``metadata={"help": ..., "flag": ...}``; the project's CLI builder
turns each field into an argparse flag named ``metadata["flag"]`` (booleans are given as
``--flag true|false``; ``--clip-ratio-c none`` disables the dual clip). Optional extra
metadata: ``"choices"`` for string fields. The field annotations are real types (no
``from __future__ import annotations``) so ``dataclasses.fields(...)[i].type`` is
``bool`` / ``float`` / ``int`` / ``str`` / ``Optional[float]``.

Preset resolution: the CLI parses the flags into an :class:`AlgorithmConfig`, then calls
``apply_preset(cfg, cfg.algorithm, explicit)`` with the set of fields the user gave
explicitly; every other control takes the preset's value. ``--algorithm custom`` applies
no preset (the dataclass defaults, which equal the ``dapo`` preset, plus the flags).

Decision on dual clip: the paper does not use it, the official DAPO 32B script sets
``c = 10``. The ``dapo`` preset follows the script (``clip_ratio_c = 10``) because that is
the run that produced the published numbers; it only acts on negative-advantage tokens
whose ratio exceeds 10, which are rare. ``--clip-ratio-c none`` gives the paper's
objective exactly.
"""

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Optional

from ..ranges import ABOVE_ONE, COUNT, EVERY, FINITE, FRACTION, NONNEGATIVE
from .advantages import ADVANTAGE_ESTIMATORS
from .dynamic_sampling import DYNAMIC_SAMPLING_METRICS
from .kl import KL_ESTIMATORS
from .policy_loss import LOSS_AGG_MODES
from .policy_losses import POLICY_LOSSES
from .staleness import PROXIMAL_METHODS
from .tis import TIS_MODES, TIS_SEQ_CAP_DEFAULT

ALGORITHMS = ("dapo", "grpo", "custom")


def _f(default: Any, help: str, flag: str, **extra: Any):
    return field(default=default, metadata={"help": help, "flag": flag, **extra})


@dataclass
class AlgorithmConfig:
    """All DAPO/GRPO controls. Defaults equal the ``dapo`` preset."""

    algorithm: str = _f(
        "dapo",
        "Algorithm preset: 'dapo' (clip-higher, token-mean, overlong filter + soft punishment, dynamic "
        "sampling), 'grpo' (naive GRPO baseline of the paper's ablation) or 'custom' (no preset). "
        "Flags given explicitly override the preset.",
        "--algorithm",
        choices=ALGORITHMS,
    )
    eps_clip_low: float = _f(
        0.2,
        "Lower clip range eps_low: ratio clipped at 1 - eps_low (in [0, 1]; 1: no lower clip).",
        "--eps-clip-low",
        range=FRACTION,
    )
    eps_clip_high: float = _f(
        0.28,
        "Upper clip range eps_high: ratio clipped at 1 + eps_high (DAPO clip-higher: 0.28; GRPO: 0.2).",
        "--eps-clip-high",
        range=NONNEGATIVE,
    )
    clip_ratio_c: Optional[float] = _f(
        10.0,
        "Dual-clip constant c > 1: for negative advantages the per-token loss is capped at -c*A. "
        "'none' disables it (the paper's objective); the official DAPO script uses 10.",
        "--clip-ratio-c",
        range=ABOVE_ONE,
    )
    policy_loss: str = _f(
        "decoupled-clip",
        "Policy loss (algo/policy_losses.py): 'decoupled-clip' (DAPO's clip-higher surrogate; GRPO's with "
        "symmetric clips), 'gspo' (sequence-level ratio; with --loss-agg-mode seq-mean-token-mean and the paper's "
        "--eps-clip-low 3e-4 --eps-clip-high 4e-4), 'cispo' (clipped IS weight under a stop-gradient, every "
        "token keeps its gradient) or 'dr-grpo' (no length or std normalisation: with --loss-agg-mode "
        "seq-mean-token-sum and --advantage-estimator group-mean). docs/algorithm.md has the equations.",
        "--policy-loss",
        choices=POLICY_LOSSES,
    )
    proximal_logprobs: str = _f(
        "recompute",
        "The proximal policy of tokens generated under older weights (--async-mode), the anchor of the clip and "
        "of the off-policy weight min(pi_prox / pi_behav, --tis-cap): 'recompute' (megatron's forward at the "
        "step's start) or 'interpolate' (A-3PO, arXiv 2512.06547: log pi_behav + alpha (log pi_theta - log "
        "pi_behav), alpha = lag / (lag + 1), no forward pass for those tokens).",
        "--proximal-logprobs",
        choices=PROXIMAL_METHODS,
    )
    loss_agg_mode: str = _f(
        "token-mean",
        "Loss aggregation: 'token-mean' (DAPO token-level loss over the whole optimizer step), "
        "'seq-mean-token-mean' (original GRPO) or 'seq-mean-token-sum'.",
        "--loss-agg-mode",
        choices=LOSS_AGG_MODES,
    )
    advantage_estimator: str = _f(
        "group-norm",
        "Advantage estimator: 'group-norm' (GRPO/DAPO: (R - group mean) / (group std + eps)), 'group-mean' "
        "(R - group mean, no std division) or 'reinforce-pp-baseline' (group mean baseline, then normalised by "
        "the batch std). docs/algorithm.md has the equations.",
        "--advantage-estimator",
        choices=ADVANTAGE_ESTIMATORS,
    )
    adv_eps: float = _f(
        1e-6, "Epsilon added to the std that divides the advantage (>= 0).", "--adv-eps", range=NONNEGATIVE
    )
    overlong_filter: bool = _f(
        True, "Overlong filtering: responses truncated at the length limit get loss mask 0.", "--overlong-filter"
    )
    overlong_penalty: bool = _f(
        True, "Soft overlong punishment (paper Eq. 13) added to the correctness reward.", "--overlong-penalty"
    )
    max_response_length: int = _f(
        20480,
        "L_max: maximum response length in tokens (generation cap and end of the punishment ramp).",
        "--max-response-length",
        range=COUNT,
    )
    overlong_buffer_length: int = _f(
        4096,
        "L_cache: length of the soft punishment buffer before L_max (in [0, --max-response-length]).",
        "--overlong-buffer-length",
        range=EVERY,
    )
    overlong_penalty_factor: float = _f(
        1.0,
        "Scale of the soft overlong punishment (penalty in [-factor, 0]).",
        "--overlong-penalty-factor",
        range=NONNEGATIVE,
    )
    dynamic_sampling: bool = _f(
        True,
        "Dynamic sampling: drop groups whose responses are all correct or all wrong and keep sampling "
        "until the batch is full.",
        "--dynamic-sampling",
    )
    dynamic_sampling_metric: str = _f(
        "acc",
        "Per-sample metric whose within-group std must be > 0 for a group to be kept (the registry "
        "algo/dynamic_sampling.DYNAMIC_SAMPLING_METRICS; docs/design.md lists each). 'acc' (raw correctness, "
        "the DAPO rule) is strongly recommended: filtering on the length-shaped reward destroys the policy.",
        "--dynamic-sampling-metric",
        choices=DYNAMIC_SAMPLING_METRICS,
    )
    kl_coef: float = _f(
        0.0, "Coefficient of the KL penalty to the reference model (DAPO: 0 = none).", "--kl-coef", range=NONNEGATIVE
    )
    kl_estimator: str = _f(
        "k3", "KL estimator used when --kl-coef > 0: k1, k2 or k3.", "--kl-estimator", choices=KL_ESTIMATORS
    )
    entropy_coef: float = _f(
        0.0, "Coefficient of the entropy bonus (loss -= coef * entropy; DAPO: 0).", "--entropy-coef", range=FINITE
    )
    tis_mode: str = _f(
        "none",
        "Importance-sampling correction of the engine/trainer mismatch (algo/tis.py), on the tokens the current "
        "weights generated: 'none', 'token-truncate' (weight min(pi_old/pi_engine, C)), 'token-mask' (tokens whose "
        "ratio leaves [1/C, C] are rejected) or 'sequence-mask' (sequences whose geometric-mean ratio leaves "
        "[1/--tis-seq-cap, --tis-seq-cap] are rejected). A rejected token carries no loss and leaves the "
        "token-mean denominator (the step's loss is the mean over the tokens it learns from).",
        "--tis-mode",
        choices=TIS_MODES,
    )
    tis_cap: float = _f(
        2.0,
        "The cap C > 1 of --tis-mode token-truncate / token-mask (and of --partial-rollout-offpolicy correct).",
        "--tis-cap",
        range=ABOVE_ONE,
    )
    tis_seq_cap: float = _f(
        TIS_SEQ_CAP_DEFAULT,
        "The band [1/C_s, C_s] of --tis-mode sequence-mask, on the geometric mean of a sequence's ratios, which sits "
        "much closer to 1 than a token's ratio (verl's rollout-correction guide: 1.0002-1.001).",
        "--tis-seq-cap",
        range=ABOVE_ONE,
    )

    # ------------------------------------------------------------------ helpers
    @classmethod
    def flag(cls, name: str) -> str:
        """The CLI flag of field ``name`` (``metadata["flag"]`` or ``--`` + dashed name)."""
        for f in dataclasses.fields(cls):
            if f.name == name:
                return f.metadata.get("flag", "--" + name.replace("_", "-"))
        raise ValueError(f"name: unknown AlgorithmConfig field {name!r}")

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "AlgorithmConfig":
        """A config with preset ``name`` applied and ``overrides`` (field names) on top."""
        _check_preset_name(name)
        names = {f.name for f in dataclasses.fields(cls)}
        for key in overrides:
            if key not in names:
                raise ValueError(f"{key}: unknown AlgorithmConfig field")
        values: Dict[str, Any] = dict(PRESETS.get(name, {}))
        values.update(overrides)
        values["algorithm"] = name
        return cls(**values)

    def validate(self) -> "AlgorithmConfig":
        """Check every control; raise ``ValueError`` naming the flag. Returns ``self``."""
        fl = self.flag
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"{fl('algorithm')} must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
        for name in ("overlong_filter", "overlong_penalty", "dynamic_sampling"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"{fl(name)} must be true or false, got {value!r}")
        low = _real(self.eps_clip_low, fl("eps_clip_low"))
        if not 0.0 <= low <= 1.0:
            raise ValueError(f"{fl('eps_clip_low')} must be in [0, 1], got {self.eps_clip_low}")
        if _real(self.eps_clip_high, fl("eps_clip_high")) < 0.0:
            raise ValueError(f"{fl('eps_clip_high')} must be >= 0, got {self.eps_clip_high}")
        if self.clip_ratio_c is not None and _real(self.clip_ratio_c, fl("clip_ratio_c")) <= 1.0:
            raise ValueError(f"{fl('clip_ratio_c')} must be > 1 or none, got {self.clip_ratio_c}")
        if self.policy_loss not in POLICY_LOSSES:
            raise ValueError(
                f"{fl('policy_loss')} must be one of {', '.join(POLICY_LOSSES.names())}, got {self.policy_loss!r}"
            )
        spec = POLICY_LOSSES.get(self.policy_loss)
        if spec.aggregation and self.loss_agg_mode not in spec.aggregation:
            raise ValueError(
                f"{fl('policy_loss')} {self.policy_loss} is defined with {fl('loss_agg_mode')} "
                f"{' or '.join(spec.aggregation)}, got {self.loss_agg_mode}: add {fl('loss_agg_mode')} "
                f"{spec.aggregation[0]}"
            )
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(
                f"{fl('loss_agg_mode')} must be one of {', '.join(LOSS_AGG_MODES)}, got {self.loss_agg_mode!r}"
            )
        if self.advantage_estimator not in ADVANTAGE_ESTIMATORS:
            raise ValueError(
                f"{fl('advantage_estimator')} must be one of {', '.join(ADVANTAGE_ESTIMATORS.names())}, "
                f"got {self.advantage_estimator!r}"
            )
        if _real(self.adv_eps, fl("adv_eps")) < 0.0:
            raise ValueError(f"{fl('adv_eps')} must be >= 0, got {self.adv_eps}")
        _int(self.max_response_length, fl("max_response_length"))
        if self.max_response_length <= 0:
            raise ValueError(f"{fl('max_response_length')} must be > 0, got {self.max_response_length}")
        _int(self.overlong_buffer_length, fl("overlong_buffer_length"))
        if not 0 <= self.overlong_buffer_length <= self.max_response_length:
            raise ValueError(
                f"{fl('overlong_buffer_length')} must be in [0, {fl('max_response_length')}="
                f"{self.max_response_length}], got {self.overlong_buffer_length}"
            )
        if self.overlong_penalty and self.overlong_buffer_length == 0:
            raise ValueError(
                f"{fl('overlong_buffer_length')} must be > 0 when {fl('overlong_penalty')} is true "
                f"(a zero buffer is a hard cut-off, not a soft punishment)"
            )
        if _real(self.overlong_penalty_factor, fl("overlong_penalty_factor")) < 0.0:
            raise ValueError(f"{fl('overlong_penalty_factor')} must be >= 0, got {self.overlong_penalty_factor}")
        if self.dynamic_sampling_metric not in DYNAMIC_SAMPLING_METRICS:
            raise ValueError(
                f"{fl('dynamic_sampling_metric')} must be one of {', '.join(DYNAMIC_SAMPLING_METRICS)}, "
                f"got {self.dynamic_sampling_metric!r}"
            )
        if _real(self.kl_coef, fl("kl_coef")) < 0.0:
            raise ValueError(f"{fl('kl_coef')} must be >= 0, got {self.kl_coef}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(
                f"{fl('kl_estimator')} must be one of {', '.join(KL_ESTIMATORS)}, got {self.kl_estimator!r}"
            )
        if _real(self.entropy_coef, fl("entropy_coef")) < 0.0:
            raise ValueError(f"{fl('entropy_coef')} must be >= 0, got {self.entropy_coef}")
        if self.tis_mode not in TIS_MODES:
            raise ValueError(f"{fl('tis_mode')} must be one of {', '.join(TIS_MODES)}, got {self.tis_mode!r}")
        if _real(self.tis_cap, fl("tis_cap")) <= 1.0:
            raise ValueError(f"{fl('tis_cap')} must be > 1, got {self.tis_cap}")
        if _real(self.tis_seq_cap, fl("tis_seq_cap")) <= 1.0:
            raise ValueError(f"{fl('tis_seq_cap')} must be > 1, got {self.tis_seq_cap}")
        return self


def _real(value: Any, flag: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{flag} must be a finite number, got {value!r}")
    return float(value)


def _int(value: Any, flag: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{flag} must be an integer, got {value!r}")
    return value


#: Every control of each preset (``algorithm`` itself excluded). ``grpo`` is the naive
#: GRPO baseline of the paper's ablation; ``dapo`` the full method with the official
#: script's settings.
PRESETS: Dict[str, Dict[str, Any]] = {
    "grpo": dict(
        policy_loss="decoupled-clip",
        proximal_logprobs="recompute",
        eps_clip_low=0.2,
        eps_clip_high=0.2,
        clip_ratio_c=None,
        loss_agg_mode="seq-mean-token-mean",
        advantage_estimator="group-norm",
        adv_eps=1e-6,
        overlong_filter=False,
        overlong_penalty=False,
        max_response_length=20480,
        overlong_buffer_length=4096,
        overlong_penalty_factor=1.0,
        dynamic_sampling=False,
        dynamic_sampling_metric="acc",
        kl_coef=0.0,
        kl_estimator="k3",
        entropy_coef=0.0,
        tis_mode="none",
        tis_cap=2.0,
        tis_seq_cap=TIS_SEQ_CAP_DEFAULT,
    ),
    "dapo": dict(
        policy_loss="decoupled-clip",
        proximal_logprobs="recompute",
        eps_clip_low=0.2,
        eps_clip_high=0.28,
        clip_ratio_c=10.0,
        loss_agg_mode="token-mean",
        advantage_estimator="group-norm",
        adv_eps=1e-6,
        overlong_filter=True,
        overlong_penalty=True,
        max_response_length=20480,
        overlong_buffer_length=4096,
        overlong_penalty_factor=1.0,
        dynamic_sampling=True,
        dynamic_sampling_metric="acc",
        kl_coef=0.0,
        kl_estimator="k3",
        entropy_coef=0.0,
        tis_mode="none",
        tis_cap=2.0,
        tis_seq_cap=TIS_SEQ_CAP_DEFAULT,
    ),
}


def _check_preset_name(name: str) -> None:
    if name not in ALGORITHMS:
        raise ValueError(f"--algorithm must be one of {', '.join(ALGORITHMS)}, got {name!r}")


def _field_name(key: str) -> str:
    """Accept a field name or its flag (``--eps-clip-high`` -> ``eps_clip_high``)."""
    for f in dataclasses.fields(AlgorithmConfig):
        if key == f.name or key == f.metadata.get("flag"):
            return f.name
    return key.lstrip("-").replace("-", "_")


def apply_preset(cfg: AlgorithmConfig, name: Optional[str] = None, explicit: Iterable[str] = ()) -> AlgorithmConfig:
    """Return a copy of ``cfg`` with preset ``name`` (default ``cfg.algorithm``) applied
    to every control not in ``explicit`` (field names or flags given on the command line
    or in the config file); explicit values win. ``custom`` changes nothing. The result's
    ``algorithm`` is ``name``.
    """
    name = cfg.algorithm if name is None else name
    _check_preset_name(name)
    given = {_field_name(k) for k in explicit}
    updates = {k: v for k, v in PRESETS.get(name, {}).items() if k not in given}
    updates["algorithm"] = name
    return dataclasses.replace(cfg, **updates)
