"""The run plan of a factorial ablation: factors as flags, cells, runs, their cost.

A *factor* is a control with two levels, each a list of ``megatron_dapo.train`` flags: by
default DAPO's controls (:data:`DEFAULT_FACTORS`), each off (the GRPO side) at its low level and
on (DAPO) at its high level; any flag can be one (``--factor 'lr=--lr 1e-6|--lr 2e-6'``).
A *cell* is one combination of levels (a row of the design); a *run* is one cell with one seed,
in its own run directory ``GRID/runs/<cell>/seed<S>``. Cells are named by their levels, factor
letter and 0/1: ``A1B0C1`` is A and C on, B off.

The plan is written to ``GRID/ablation_plan.json`` before anything runs; the launcher, the
Slurm array and the report read it from there. :func:`format_plan` is the ``--dry-run`` text:
the design, its resolution, the effects it can and cannot separate, every run, and the cost in
GPU-hours from the dry-run placement plan (GPUs per run) and a step time (measured, given, or
the rough estimate of :func:`estimate_step_seconds`).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import shlex
import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..config import ConfigError, parse_args
from ..config.cli import decode_escapes
from ..config.validate import check_model_dir, validate, world_size
from ..diagnostics.history import load_metrics, metrics_path
from ..launch.memory_estimate import GPU_CAPACITY_GB, estimate_memory
from ..launch.plan import _target_is_gpu
from ..launch.rank_layout import placement_plan
from ..models import parse_hf_config
from .design import DEFAULT_GENERATORS, LETTERS, Design, DesignError, make_design, word_name

PLAN_FILE = "ablation_plan.json"
PLAN_VERSION = 1


class AblationError(ConfigError):
    """A mistake in an ablation's command line, plan or run directories (one line, exit 2)."""


@dataclass(frozen=True)
class Factor:
    name: str
    low: Tuple[str, ...]  # train flags of the low level (-1, "off")
    high: Tuple[str, ...]  # ... of the high level (+1, "on")
    description: str = ""

    def args(self, level: int) -> List[str]:
        return list(self.high if level > 0 else self.low)

    def flags(self) -> List[str]:
        return sorted({a.split("=", 1)[0] for a in (*self.low, *self.high) if a.startswith("--")})

    def to_dict(self) -> dict:
        return {"name": self.name, "low": list(self.low), "high": list(self.high), "description": self.description}

    @classmethod
    def from_dict(cls, d: dict) -> "Factor":
        return cls(d["name"], tuple(d["low"]), tuple(d["high"]), d.get("description", ""))


#: DAPO's controls, low = the naive-GRPO side, high = DAPO's (docs/algorithm.md, Summary).
DEFAULT_FACTORS: Dict[str, Factor] = {
    f.name: f
    for f in (
        Factor(
            "clip-higher",
            ("--eps-clip-high", "0.2"),
            ("--eps-clip-high", "0.28"),
            "decoupled clip: eps_high 0.28 (off: the symmetric 0.2)",
        ),
        Factor(
            "dynamic-sampling",
            ("--dynamic-sampling", "false"),
            ("--dynamic-sampling", "true"),
            "drop all-correct / all-wrong groups and keep sampling",
        ),
        Factor(
            "token-level-loss",
            ("--loss-agg-mode", "seq-mean-token-mean"),
            ("--loss-agg-mode", "token-mean"),
            "token-mean over the optimizer step (off: GRPO's per-sequence mean)",
        ),
        Factor(
            "overlong-filter",
            ("--overlong-filter", "false"),
            ("--overlong-filter", "true"),
            "truncated responses get loss mask 0",
        ),
        Factor(
            "soft-overlong-punishment",
            ("--overlong-penalty", "false"),
            ("--overlong-penalty", "true"),
            "length penalty ramp over the last --overlong-buffer-length tokens",
        ),
    )
}

#: Flags the plan sets for each run; the base command may not give them.
OWNED_FLAGS = {
    "--run-dir": "each run gets GRID/runs/<cell>/seed<S>",
    "--seed": "give the seeds with --seeds",
    "--save": "each run gets RUN_DIR/checkpoints with --checkpoint-every N",
    "--load": "an incomplete run is resumed from its own checkpoints",
    "--start-over": "never needed: a rerun fills only what is missing",
    "--dry-run": "use the ablation's own --dry-run",
}

#: Config fields that differ between the runs of one grid by construction (besides the factors).
PER_RUN_FIELDS = ("logging.run_dir", "checkpoint.save", "checkpoint.load", "checkpoint.start_over", "optim.seed")

_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


def parse_factor(spec: str) -> Factor:
    """``NAME`` (one of :data:`DEFAULT_FACTORS`) or ``NAME=LOW FLAGS|HIGH FLAGS``."""
    if "=" not in spec:
        name = spec.strip()
        if name not in DEFAULT_FACTORS:
            raise AblationError(
                f"--factor {spec!r}: not a known control ({', '.join(DEFAULT_FACTORS)}); define it as "
                "'NAME=LOW FLAGS|HIGH FLAGS', e.g. 'lr=--lr 1e-6|--lr 2e-6'"
            )
        return DEFAULT_FACTORS[name]
    name, levels = spec.split("=", 1)
    name = name.strip()
    if not _NAME.match(name):
        raise AblationError(f"--factor {spec!r}: name {name!r}: use lower-case letters, digits, '-', '_' or '.'")
    if levels.count("|") != 1:
        raise AblationError(f"--factor {spec!r}: give the two levels separated by one '|': 'NAME=LOW FLAGS|HIGH FLAGS'")
    low, high = (tuple(shlex.split(x)) for x in levels.split("|"))
    for side, args in (("low", low), ("high", high)):
        if not args or not args[0].startswith("--"):
            raise AblationError(
                f"--factor {spec!r}: the {side} level must be train flags starting with '--', got "
                f"{' '.join(args) or 'nothing'}"
            )
    return Factor(name, low, high, "")


def resolve_factors(names: Optional[str], specs: Sequence[str]) -> List[Factor]:
    """``--factors a,b,c`` (known controls) and/or ``--factor SPEC`` (repeatable); default all five."""
    out: List[Factor] = []
    if names:
        out += [parse_factor(n) for n in names.split(",") if n.strip()]
    out += [parse_factor(s) for s in specs]
    if not out:
        out = list(DEFAULT_FACTORS.values())
    seen = set()
    for f in out:
        if f.name in seen:
            raise AblationError(f"--factor {f.name}: given twice")
        seen.add(f.name)
    if len(out) > 12:
        raise AblationError(f"{len(out)} factors: at most 12 (a 2^12 grid has 4096 cells)")
    return out


# ------------------------------------------------------------------------------ config dicts


def flatten(d: dict, prefix: str = "") -> Dict[str, Any]:
    """``{"algo": {"eps_clip_high": 0.28}}`` -> ``{"algo.eps_clip_high": 0.28}``."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def parse_train_args(argv: Sequence[str], what: str):
    """``megatron_dapo.config.parse_args`` with its argparse exit turned into one line naming ``what``."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            cfg = parse_args(list(argv))
    except SystemExit:
        msg = " ".join(err.getvalue().split()) or "invalid flags"
        msg = msg.replace("python -m megatron_dapo.train: error: ", "")
        raise AblationError(f"{what}: {msg}") from None
    except ConfigError as e:
        raise AblationError(f"{what}: {e}") from None
    return cfg


def expected_config(argv: Sequence[str], what: str = "run") -> Dict[str, Any]:
    """The flattened ``config.json`` the trainer writes for ``argv`` (escapes of --rollout-stop
    decoded as the driver does, values through JSON as ``write_config`` stores them)."""
    cfg = parse_train_args(argv, what)
    cfg.rollout.stop = decode_escapes("--rollout-stop", cfg.rollout.stop)
    return flatten(json.loads(json.dumps(cfg.to_dict(), default=str)))


# ------------------------------------------------------------------------------ plan


@dataclass
class Run:
    cell: str  # "A1B0C1"
    seed: int
    run_dir: str  # absolute
    argv: List[str]  # megatron_dapo.train flags (no checkpoint/resume flags: launch adds them)

    @property
    def key(self) -> str:
        return f"{self.cell}:{self.seed}"


@dataclass
class Plan:
    grid: str
    cwd: str
    base_args: List[str]
    factors: List[Factor]
    generators: List[str]
    seeds: List[int]
    checkpoint_every: int = 0
    metric: str = "auto"
    threshold: float = 0.5
    factor_fields: Dict[str, List[str]] = field(default_factory=dict)  # factor name -> config fields it sets
    cost: Dict[str, Any] = field(default_factory=dict)
    design: Design = field(init=False, repr=False)

    def __post_init__(self):
        try:
            self.design = make_design(len(self.factors), generators=self.generators)
        except DesignError as e:
            raise AblationError(f"--generators: {e}") from None

    # -- cells and runs -------------------------------------------------------------------
    def letter(self, i: int) -> str:
        return LETTERS[i]

    def cell_id(self, row) -> str:
        return "".join(f"{LETTERS[i]}{1 if x > 0 else 0}" for i, x in enumerate(row))

    @property
    def cells(self) -> List[str]:
        return [self.cell_id(r) for r in self.design.matrix]

    def levels(self, cell: str) -> Dict[str, int]:
        """factor name -> +1 / -1 of ``cell``."""
        return {f.name: (1 if cell[2 * i + 1] == "1" else -1) for i, f in enumerate(self.factors)}

    def cell_args(self, cell: str) -> List[str]:
        out: List[str] = []
        for f, lv in zip(self.factors, self.levels(cell).values()):
            out += f.args(lv)
        return out

    def run_dir(self, cell: str, seed: int) -> str:
        return os.path.join(self.grid, "runs", cell, f"seed{seed}")

    @property
    def runs(self) -> List[Run]:
        """Replicate by replicate (every cell of the first seed, then the next seed), so that the
        runs finished first make complete replicates."""
        out = []
        for s in self.seeds:
            for c in self.cells:
                rd = self.run_dir(c, s)
                argv = [*self.base_args, *self.cell_args(c), "--seed", str(s), "--run-dir", rd]
                if self.checkpoint_every:
                    argv += [
                        "--save",
                        os.path.join(rd, "checkpoints"),
                        "--save-interval",
                        str(self.checkpoint_every),
                        "--keep-last",
                        "1",
                    ]
                out.append(Run(c, s, rd, argv))
        return out

    def run(self, key: str) -> Run:
        for r in self.runs:
            if r.key == key:
                return r
        raise AblationError(
            f"{key}: no such run in {os.path.join(self.grid, PLAN_FILE)} (runs are CELL:SEED, e.g. {self.runs[0].key})"
        )

    def cell_label(self, cell: str) -> str:
        return ", ".join(f"{f.name}{'+' if lv > 0 else '-'}" for f, lv in zip(self.factors, self.levels(cell).values()))

    # -- (de)serialisation -----------------------------------------------------------------
    def identity(self) -> dict:
        """What makes two plans the same grid (a rerun must match it)."""
        return {
            "base_args": list(self.base_args),
            "factors": [f.to_dict() for f in self.factors],
            "generators": list(self.generators),
            "seeds": list(self.seeds),
            "checkpoint_every": self.checkpoint_every,
            "cwd": self.cwd,
        }

    def to_dict(self) -> dict:
        return {
            "version": PLAN_VERSION,
            "grid": self.grid,
            **self.identity(),
            "metric": self.metric,
            "threshold": self.threshold,
            "design": self.design.name,
            "resolution": self.design.resolution,
            "factor_fields": self.factor_fields,
            "cost": self.cost,
            "cells": [{"cell": c, "levels": self.levels(c)} for c in self.cells],
            "runs": [
                {"key": r.key, "cell": r.cell, "seed": r.seed, "run_dir": r.run_dir, "argv": r.argv} for r in self.runs
            ],
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        return cls(
            grid=d["grid"],
            cwd=d["cwd"],
            base_args=list(d["base_args"]),
            factors=[Factor.from_dict(f) for f in d["factors"]],
            generators=list(d["generators"]),
            seeds=[int(s) for s in d["seeds"]],
            checkpoint_every=int(d.get("checkpoint_every", 0)),
            metric=d.get("metric", "auto"),
            threshold=float(d.get("threshold", 0.5)),
            factor_fields={k: list(v) for k, v in d.get("factor_fields", {}).items()},
            cost=d.get("cost", {}),
        )

    def save(self) -> str:
        os.makedirs(self.grid, exist_ok=True)
        path = os.path.join(self.grid, PLAN_FILE)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
        os.replace(tmp, path)
        return path


def load_plan(grid: str) -> Plan:
    path = os.path.join(grid, PLAN_FILE)
    if not os.path.isfile(path):
        raise AblationError(
            f"{grid}: no {PLAN_FILE} there; plan and launch a grid first (tools/ablate.py run --grid "
            f"{grid} -- <train flags>)"
        )
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise AblationError(f"{path}: cannot be read ({e}); it is written by tools/ablate.py run") from None
    if d.get("version") != PLAN_VERSION:
        raise AblationError(f"{path}: plan version {d.get('version')!r}, this tool reads {PLAN_VERSION}")
    return Plan.from_dict(d)


def differences(old: dict, new: dict) -> List[str]:
    return [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


# ------------------------------------------------------------------------------ building


def check_base_args(base: Sequence[str], factors: Sequence[Factor]) -> None:
    """The base command may not give a flag the plan sets (per run, or as a factor)."""
    owned = dict(OWNED_FLAGS)
    for f in factors:
        for fl in f.flags():
            owned.setdefault(fl, f"it is the factor {f.name!r}; remove it from the base command")
            owned.setdefault("--no-" + fl[2:], f"it is the factor {f.name!r}; remove it from the base command")
    for a in base:
        flag = a.split("=", 1)[0]
        if flag in owned:
            raise AblationError(f"base command: {flag} is set by the ablation ({owned[flag]})")


def factor_fields(base: Sequence[str], factors: Sequence[Factor]) -> Dict[str, List[str]]:
    """The config fields each factor changes (its two levels parsed on top of the base command);
    a factor whose levels are the same configuration, or two factors setting one field, is an error."""
    ref = expected_config([*base, "--run-dir", "x"], "base command")
    out: Dict[str, List[str]] = {}
    owner: Dict[str, str] = {}
    for f in factors:
        lo = expected_config([*base, *f.args(-1), "--run-dir", "x"], f"factor {f.name} (low level: {' '.join(f.low)})")
        hi = expected_config([*base, *f.args(1), "--run-dir", "x"], f"factor {f.name} (high level: {' '.join(f.high)})")
        fields = differences(lo, hi)
        if not fields:
            raise AblationError(
                f"--factor {f.name}: its two levels ({' '.join(f.low)} | {' '.join(f.high)}) give the "
                "same configuration; give levels that differ"
            )
        # a flag of the level that lands on the base's value on both sides is still the factor's
        fields = sorted(set(fields) | (set(differences(ref, lo)) | set(differences(ref, hi))) - {"logging.run_dir"})
        for fl in fields:
            if fl in owner:
                raise AblationError(
                    f"factors {owner[fl]!r} and {f.name!r} both set {fl}; a field belongs to one factor"
                )
            owner[fl] = f.name
        out[f.name] = fields
    return out


def build_plan(
    grid: str,
    base: Sequence[str],
    factors: Sequence[Factor],
    seeds: Sequence[int],
    fraction: int = 0,
    generators: Sequence[str] = (),
    checkpoint_every: int = 0,
    metric: str = "auto",
    threshold: float = 0.5,
    cwd: Optional[str] = None,
) -> Plan:
    """The plan (nothing written): the design checked, the base command and every cell parsed."""
    if not seeds:
        raise AblationError("--seeds: give at least one seed")
    if len(set(seeds)) != len(seeds):
        raise AblationError(f"--seeds {' '.join(map(str, seeds))}: a seed appears twice")
    check_base_args(base, factors)
    base_cfg = parse_train_args(base, "base command")
    c = base_cfg.checkpoint
    for name, flag in (("save", "--save"), ("load", "--load")):
        if getattr(c, name):
            raise AblationError(
                f"base command: {flag} is set (in --config?) but the ablation gives each run its own "
                f"({OWNED_FLAGS[flag]}); remove it"
            )
    try:
        gens = (
            list(generators)
            if generators
            else [g.text for g in make_design(len(factors), fraction=fraction).generators]
        )
    except DesignError as e:
        raise AblationError(f"--fraction/--generators: {e}") from None
    plan = Plan(
        grid=os.path.abspath(grid),
        cwd=os.path.abspath(cwd or os.getcwd()),
        base_args=list(base),
        factors=list(factors),
        generators=gens,
        seeds=[int(s) for s in seeds],
        checkpoint_every=int(checkpoint_every),
        metric=metric,
        threshold=float(threshold),
    )
    plan.factor_fields = factor_fields(base, factors)
    return plan


# ------------------------------------------------------------------------------ checks and cost

#: Rough throughput model for a GPU run without a measured step time (an upper bound on the
#: tokens, at stated efficiencies): every response at --max-response-length, prompts at
#: --max-prompt-length; dynamic sampling keeps KEPT_RATIO of the groups it generates; training
#: 6 FLOPs per parameter and token (8 with full recompute), the old-logprob forward 2,
#: generation 2; GPU peak PEAK_TFLOPS (H100 SXM bf16 dense) at TRAIN_MFU for the trainer and
#: GEN_MFU for generation (decoding is bound by memory bandwidth).
PEAK_TFLOPS = 989.0
TRAIN_MFU = 0.30
GEN_MFU = 0.05
KEPT_RATIO = 0.5


def estimate_step_seconds(cfg, arch) -> float:
    """Seconds per rollout step of ``cfg`` on ``cfg``'s GPUs, from :data:`PEAK_TFLOPS` and the
    stated efficiencies (see the constants above): a rough upper bound for budgeting."""
    r, a, d = cfg.rollout, cfg.algo, cfg.data
    n_params = float(arch.num_parameters)
    seqs = r.rollout_batch_size * r.n_samples_per_prompt
    gen_seqs = seqs / (KEPT_RATIO if a.dynamic_sampling else 1.0)
    train_tokens = seqs * (d.max_prompt_length + a.max_response_length)
    gen_tokens = gen_seqs * a.max_response_length
    per_token = 8.0 if cfg.model.recompute_granularity == "full" else 6.0
    train_flops = (per_token + 2.0) * n_params * train_tokens
    gen_flops = 2.0 * n_params * gen_tokens
    gpus = world_size(cfg)
    peak = PEAK_TFLOPS * 1e12 * gpus
    return train_flops / (peak * TRAIN_MFU) + gen_flops / (peak * GEN_MFU)


def calibrated_step_seconds(run_dir: str) -> float:
    """The median ``time_step`` of a finished run's metrics (its first step, which includes
    warm-up, left out when there are more)."""
    path = metrics_path(run_dir)
    if not os.path.isfile(path):
        raise AblationError(f"--calibrate {run_dir}: no metrics.jsonl there; give the --run-dir of a finished run")
    h = load_metrics(path)
    t = [x for x in h.get("time_step")[1 if len(h) > 1 else 0 :] if math.isfinite(x)]
    if not t:
        raise AblationError(f"--calibrate {run_dir}: {path} has no time_step values")
    return float(statistics.median(t))


def check_and_cost(plan: Plan, step_seconds: Optional[float] = None, calibrate: Optional[str] = None) -> dict:
    """Parse and validate every cell (a ConfigError names the cell), and the cost: GPUs per run
    from the placement plan, the memory verdict of the dry-run plan, and GPU-hours from the step
    time (``step_seconds`` given, the median of ``calibrate``'s run, or the rough estimate on GPU)."""
    runs = {r.cell: r for r in plan.runs if r.seed == plan.seeds[0]}
    cells: Dict[str, dict] = {}
    arch = None
    for cell, run in runs.items():
        what = f"cell {cell} ({plan.cell_label(cell)})"
        cfg = parse_train_args(run.argv, what)
        if not cfg.model.hf_checkpoint:
            raise AblationError(
                "base command: --hf-checkpoint is required (the model shape and tokenizer are read "
                "from its config.json)"
            )
        if arch is None:
            try:
                check_model_dir(cfg)
                arch = parse_hf_config(cfg.model.hf_checkpoint)
            except Exception as e:  # ConfigError, ModelConfigError: one line
                raise AblationError(f"base command: {e}") from None
        on_gpu = _target_is_gpu(cfg)
        try:
            warnings = validate(cfg, arch, on_gpu=on_gpu)
        except ConfigError as e:
            raise AblationError(f"{what}: {e}") from None
        pp = placement_plan(cfg)
        info: Dict[str, Any] = {
            "gpus": pp.world,
            "steps": cfg.run.num_rollout_steps,
            "on_gpu": on_gpu,
            "warnings": list(warnings),
        }
        if on_gpu:
            mem = {}
            for name, cap in GPU_CAPACITY_GB.items():
                m = estimate_memory(cfg, arch, cap)
                peak = max(m.train_peak, m.rollout_peak)
                mem[name] = {"peak_gb": round(peak / 1e9, 1), "fits": peak <= m.capacity}
            info["memory"] = mem
        if step_seconds is not None:
            info["step_s"], info["step_source"] = float(step_seconds), "--step-seconds"
        elif calibrate:
            info["step_s"], info["step_source"] = calibrated_step_seconds(calibrate), f"median time_step of {calibrate}"
        elif on_gpu:
            info["step_s"] = estimate_step_seconds(cfg, arch)
            info["step_source"] = "rough estimate (megatron_dapo/ablation/plan.py: upper-bound tokens)"
        else:
            info["step_s"], info["step_source"] = None, "unknown on CPU: give --step-seconds or --calibrate RUN_DIR"
        if info["step_s"] is not None:
            info["hours_per_run"] = info["steps"] * info["step_s"] / 3600.0
            info["gpu_hours_per_run"] = info["hours_per_run"] * info["gpus"]
        cells[cell] = info
    first = next(iter(cells.values()))
    known = all(c.get("gpu_hours_per_run") is not None for c in cells.values())
    total = sum(c["gpu_hours_per_run"] for c in cells.values()) * len(plan.seeds) if known else None
    hours = sum(c["hours_per_run"] for c in cells.values()) * len(plan.seeds) if known else None
    return {
        "unit": "GPU" if first["on_gpu"] else "CPU worker",
        "gpus_per_run": first["gpus"],
        "steps": first["steps"],
        "step_source": first["step_source"],
        "cells": cells,
        "gpu_hours": total,
        "wall_hours_sequential": hours,
        "model": f"{arch.model_type} {arch.num_parameters / 1e9:.2f}B" if arch else "",
    }


def fit_budget(make_plan, budget: float, k: int, explicit: bool, cost_of) -> Tuple[Plan, dict]:
    """The largest design within ``budget`` GPU-hours: the full factorial, else the default
    fractions 2^(k-1), 2^(k-2), ... (highest resolution first) down to resolution III.
    ``make_plan(p)`` builds the plan with fraction p; ``explicit``: the design was given, only check it."""
    candidates = [0] if explicit else [0] + [p for p in range(1, k) if (k, p) in DEFAULT_GENERATORS]
    tried = []
    for p in candidates:
        plan = make_plan(p)
        cost = cost_of(plan)
        if cost["gpu_hours"] is None:
            raise AblationError(f"--budget-gpu-hours: the step time is {cost['step_source']}")
        tried.append(f"{plan.design.name} {cost['gpu_hours']:.1f}")
        if cost["gpu_hours"] <= budget:
            return plan, cost
    raise AblationError(
        f"--budget-gpu-hours {budget:g}: no design fits ({'; '.join(tried)} GPU-hours); raise the budget, "
        "use fewer seeds or factors, or shorten the runs (--num-rollout)"
    )


# ------------------------------------------------------------------------------ dry-run text


def _hours(x: Optional[float]) -> str:
    return "unknown" if x is None else (f"{x:,.1f}" if x >= 10 else f"{x:.2f}")


def format_plan(plan: Plan, cost: dict) -> str:
    d = plan.design
    n_runs = len(plan.runs)
    out: List[str] = []
    add = out.append
    add(
        f"=== ablation plan: {d.name} {'full factorial' if d.is_full else 'fractional factorial'}, {d.resolution_name}, "
        f"{d.runs} cells x {len(plan.seeds)} seed(s) = {n_runs} runs ==="
    )
    add(f"grid: {plan.grid}")
    add("factors (low = -, high = +; the config fields each sets):")
    width = max(len(f.name) for f in plan.factors)
    for i, f in enumerate(plan.factors):
        fields = ", ".join(plan.factor_fields.get(f.name, []))
        add(f"  {LETTERS[i]} {f.name:<{width}}  -: {' '.join(f.low):<40} +: {' '.join(f.high):<40} [{fields}]")
    if d.is_full:
        add("design: every combination of levels; every main effect and interaction has its own contrast")
    else:
        rel = " = ".join(["I"] + [("-" if s < 0 else "") + word_name(w) for w, s in d.defining_relation()])
        add(f"design: generators {', '.join(plan.generators)}; defining relation {rel}")
    can, cannot = d.describe_separation()
    add(
        "can separate (main effects and two-factor interactions; interactions of 3+ factors assumed negligible): "
        + (", ".join(can) or "none")
    )
    add("cannot separate (aliased: one contrast estimates their sum): " + ("; ".join(cannot) or "none"))
    add(
        f"seeds: {', '.join(map(str, plan.seeds))} (each seed one replicate of the design; effects get a Student t "
        "interval over the replicates' estimates" + (")" if len(plan.seeds) > 1 else "; one seed: no interval)")
    )
    add("runs (replicate by replicate):")
    for r in plan.runs:
        add(f"  {r.key:<{len(r.key) + 2}} {plan.cell_label(r.cell)}  -> {os.path.relpath(r.run_dir, plan.grid)}")
    add(
        "each run: python -m megatron_dapo.train <base command> <the cell's factor flags> --seed S --run-dir "
        "GRID/runs/<cell>/seed<S>"
        + (
            f" --save RUN_DIR/checkpoints --save-interval {plan.checkpoint_every} --keep-last 1"
            if plan.checkpoint_every
            else ""
        )
    )
    add(f"base command: {' '.join(shlex.quote(a) for a in plan.base_args)}")
    unit = cost["unit"]
    add(f"--- cost ({cost['model']}; {unit}s per run from the placement plan) ---")
    for cell, c in cost["cells"].items():
        mem = ""
        if c.get("memory"):
            mem = "; memory " + ", ".join(
                f"{k} peak {v['peak_gb']} GB {'fits' if v['fits'] else 'DOES NOT FIT'}" for k, v in c["memory"].items()
            )
        step = "step time unknown" if c["step_s"] is None else f"{c['step_s']:.1f} s/step"
        add(
            f"  {cell}: {c['gpus']} {unit}s x {c['steps']} steps x {step} = {_hours(c.get('gpu_hours_per_run'))} "
            f"{unit}-hours per run{mem}"
        )
    add(f"step time: {cost['step_source']}")
    add(
        f"total: {_hours(cost['gpu_hours'])} {unit}-hours for {n_runs} runs "
        f"({_hours(cost['wall_hours_sequential'])} h one after another)"
    )
    warns = sorted({w for c in cost["cells"].values() for w in c.get("warnings", [])})
    for w in warns:
        add(f"WARNING: {w}")
    return "\n".join(out)
