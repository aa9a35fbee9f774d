"""Factorial ablation of DAPO's controls (docs/ablation.md; command line: tools/ablate.py).

* :mod:`.design` -- full 2^k and fractional 2^(k-p) designs: generators, defining relation,
  resolution, aliases, effects as contrasts, Student t intervals (pure functions);
* :mod:`.plan` -- factors as train flags, the cells and runs of a grid, their cost (GPU-hours
  from the dry-run placement plan and a step time), the ``--dry-run`` text;
* :mod:`.launch` -- the state of each run, local launches one after another (each in its own
  session, stopped on Ctrl-C/SIGTERM), a Slurm job array through examples/slurm/submit_dapo.sbatch;
* :mod:`.report` -- outcomes, main effects and two-factor interactions with intervals over the
  seeds, the diagnosis verdict of every run, the config.json check, plots.
"""

from .design import Design, DesignError, contrast, full_factorial, make_design, student_t_ppf, t_interval
from .plan import DEFAULT_FACTORS, AblationError, Factor, Plan, build_plan, load_plan

__all__ = [
    "DEFAULT_FACTORS",
    "AblationError",
    "Design",
    "DesignError",
    "Factor",
    "Plan",
    "build_plan",
    "contrast",
    "full_factorial",
    "load_plan",
    "make_design",
    "student_t_ppf",
    "t_interval",
]
