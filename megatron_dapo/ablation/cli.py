"""Command line of ``tools/ablate.py`` (docs/ablation.md).

    tools/ablate.py run --grid DIR [design and launch options] -- <megatron_dapo.train flags>
    tools/ablate.py run --grid DIR --dry-run -- <flags>     # the plan, its cost, what it can separate
    tools/ablate.py run --grid DIR                          # again: fills only what is missing
    tools/ablate.py status DIR
    tools/ablate.py report DIR [--metric M] [--threshold T]

Exit codes: 0 done (every run finished and the report written, or a dry run), 1 a run failed
or is still missing, 2 a mistake on the command line or in the grid (one line on stderr),
130/143 interrupted by Ctrl-C/SIGTERM (the running run stopped, nothing left behind).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import List, Optional, Sequence

from ..errors import OneLineArgumentParser, exit_on_user_error
from .launch import format_states, grid_states, launch_local, submit_slurm, task_args
from .plan import (
    DEFAULT_FACTORS,
    PLAN_FILE,
    AblationError,
    build_plan,
    check_and_cost,
    differences,
    fit_budget,
    format_plan,
    load_plan,
    resolve_factors,
)
from .report import write_report

PROG = "ablate.py"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(
        prog=PROG,
        description="Factorial ablation of DAPO's controls: plan, launch and report a "
        "2^k or 2^(k-p) grid of megatron_dapo.train runs (docs/ablation.md).",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineArgumentParser)
    r = sub.add_parser("run", help="plan, launch what is not done, report (flags of the base command after --)")
    r.add_argument(
        "--grid", required=True, help="grid directory: ablation_plan.json, runs/<cell>/seed<S>, logs/, report/"
    )
    r.add_argument(
        "--base-config", metavar="FILE.yaml", help="a megatron_dapo.train --config file as (part of) the base"
    )
    r.add_argument(
        "--factors", metavar="A,B,...", help="known controls: " + ", ".join(DEFAULT_FACTORS) + " (default: all five)"
    )
    r.add_argument(
        "--factor",
        action="append",
        default=[],
        metavar="SPEC",
        help="a factor: a known control's name, or 'NAME=LOW FLAGS|HIGH FLAGS' (repeatable)",
    )
    r.add_argument(
        "--seeds", nargs="+", type=int, default=None, metavar="S", help="seeds, one replicate each (default 1)"
    )
    r.add_argument(
        "--fraction",
        type=int,
        default=None,
        metavar="P",
        help="run a 2^(k-P) fraction with the default (minimum-aberration) generators",
    )
    r.add_argument("--generators", nargs="+", default=None, metavar="D=ABC", help="the fraction's generators")
    r.add_argument(
        "--budget-gpu-hours",
        type=float,
        default=None,
        metavar="H",
        help="the largest design (full, else the highest-resolution fraction) within H GPU-hours",
    )
    r.add_argument(
        "--step-seconds", type=float, default=None, metavar="S", help="seconds per rollout step, for the cost"
    )
    r.add_argument(
        "--calibrate", metavar="RUN_DIR", help="take the step time from a finished run's metrics (median time_step)"
    )
    r.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        metavar="N",
        help="each run saves a checkpoint every N steps (RUN_DIR/checkpoints, the last one kept): an "
        "interrupted run resumes from it (default 0: it starts over)",
    )
    r.add_argument("--metric", default=None, help="outcome metric (default auto: eval/<set>/pass@1, else acc_mean)")
    r.add_argument(
        "--threshold", type=float, default=None, help="level of the steps-to-threshold outcome (default 0.5)"
    )
    r.add_argument("--dry-run", action="store_true", help="print the plan and its cost; write and start nothing")
    r.add_argument(
        "--slurm", action="store_true", help="submit a Slurm job array (examples/slurm/submit_dapo.sbatch per run)"
    )
    r.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra sbatch argument, e.g. --sbatch-arg=--partition=gpu (repeatable)",
    )
    r.add_argument("--max-parallel", type=int, default=0, help="Slurm: at most this many runs at once (array %%N)")
    r.add_argument(
        "--slurm-time", default=None, help="Slurm --time per run (default: 1.5x the estimate + 15 min, or 72 h)"
    )
    r.add_argument("--only", nargs="+", default=(), metavar="CELL:SEED", help="launch only these runs")
    r.add_argument(
        "--skip-incomplete",
        action="store_true",
        help="leave crashed/killed runs as they are (default: resume or start them over)",
    )
    r.add_argument(
        "--kill-grace",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds a stopped run gets to exit after SIGTERM before SIGKILL (default 60)",
    )
    r.add_argument(
        "--python",
        default=None,
        metavar="PATH",
        help="the interpreter that runs megatron_dapo.train locally (default: the one running this tool)",
    )
    r.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    r.add_argument("--no-plot", action="store_true", help="report without plots")
    s = sub.add_parser("status", help="the state of every run of a grid")
    s.add_argument("grid")
    rp = sub.add_parser("report", help="the report of a grid's finished runs (GRID/report/)")
    rp.add_argument("grid")
    rp.add_argument("--metric", default=None)
    rp.add_argument("--threshold", type=float, default=None)
    rp.add_argument("--out", default=None, help="report directory (default GRID/report)")
    rp.add_argument("--no-plot", action="store_true")
    t = sub.add_parser("task-args", help=argparse.SUPPRESS)  # the Slurm array's question: what does run KEY run now
    t.add_argument("grid")
    t.add_argument("key")
    t.add_argument("--skip-incomplete", action="store_true")
    return p


def split_base(argv: Sequence[str]):
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def _plan_for_run(args, base: List[str]):
    """The plan of ``run``: a new one, or the grid's own (a rerun), which the options must match."""
    path = os.path.join(args.grid, PLAN_FILE)
    existing = load_plan(args.grid) if os.path.isfile(path) else None
    design_given = (
        any(
            x is not None
            for x in (args.fraction, args.generators, args.seeds, args.checkpoint_every, args.budget_gpu_hours)
        )
        or args.factors
        or args.factor
    )
    if existing is not None and not base and not args.base_config and not design_given:
        return existing, True
    if args.base_config:
        if not os.path.isfile(args.base_config):
            raise AblationError(f"--base-config {args.base_config}: file not found")
        base = ["--config", args.base_config, *base]
    if not base:
        raise AblationError("no base command: give the megatron_dapo.train flags after '--' (or --base-config FILE)")
    factors = resolve_factors(args.factors, args.factor)
    seeds = args.seeds or [1]
    explicit = args.fraction is not None or args.generators is not None

    def make(p: int):
        return build_plan(
            args.grid,
            base,
            factors,
            seeds,
            fraction=args.fraction if explicit else p,
            generators=args.generators or (),
            checkpoint_every=args.checkpoint_every or 0,
            metric=args.metric or "auto",
            threshold=0.5 if args.threshold is None else args.threshold,
        )

    def cost_of(plan):
        return check_and_cost(plan, args.step_seconds, args.calibrate)

    if args.budget_gpu_hours is not None:
        plan, cost = fit_budget(make, args.budget_gpu_hours, len(factors), explicit, cost_of)
    else:
        plan = make(0)
        cost = cost_of(plan)
    plan.cost = cost
    if existing is not None:
        old, new = existing.identity(), plan.identity()
        diff = differences(old, new)
        if diff:
            raise AblationError(
                f"--grid {args.grid} holds another grid's plan ({PLAN_FILE} differs in: "
                f"{', '.join(diff)}); rerun it with the same options (or none), or choose a new --grid"
            )
        existing.cost = existing.cost or cost
        return existing, True  # its outcome metric and threshold unless given again (cmd_run passes them on)
    return plan, False


def cmd_run(args, base: List[str]) -> int:
    plan, rerun = _plan_for_run(args, base)
    if not rerun or args.dry_run:
        if rerun and (not plan.cost or args.step_seconds is not None or args.calibrate):
            plan.cost = check_and_cost(plan, args.step_seconds, args.calibrate)  # shown, not saved
        print(format_plan(plan, plan.cost))
    if args.dry_run:
        if rerun:
            print(format_states(plan, grid_states(plan)))
        print("[ablate] dry run: nothing written, nothing started")
        return 0
    if rerun:
        print(f"[ablate] grid {plan.grid}: the plan in {PLAN_FILE}; launching what is not done")
    else:
        if os.path.isdir(os.path.join(plan.grid, "runs")) and os.listdir(os.path.join(plan.grid, "runs")):
            raise AblationError(f"--grid {plan.grid}: has run directories but no {PLAN_FILE}; choose a new --grid")
        print(f"[ablate] plan written to {plan.save()}")
    if args.slurm:
        submit_slurm(plan, args.skip_incomplete, args.sbatch_arg, args.max_parallel, args.slurm_time)
        return 0
    summary = launch_local(
        plan, skip_incomplete=args.skip_incomplete, kill_grace_s=args.kill_grace, only=args.only, python=args.python
    )
    if summary["interrupted"]:
        print(f"[ablate] interrupted ({signal.Signals(summary['interrupted']).name}): rerun the same command to go on")
        return 128 + summary["interrupted"]
    states = grid_states(plan)
    print(format_states(plan, states))
    if not args.no_report:
        _report(plan, args.metric, args.threshold, None, not args.no_plot)
    if summary["failed"] or any(s.status != "done" for s in states):
        return 1
    return 0


def _report(plan, metric, threshold, out, plots) -> None:
    md, rep = write_report(plan, out, metric or plan.metric, threshold, plots)
    print(md)
    print("[ablate] report: " + ", ".join(rep["files"]))


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    own, base = split_base(argv)
    args = build_parser().parse_args(own)
    with exit_on_user_error(PROG):
        if args.command == "run":
            return cmd_run(args, base)
        if base:
            raise AblationError(f"{args.command}: takes no train flags after '--'")
        plan = load_plan(args.grid)
        if args.command == "status":
            print(format_states(plan, grid_states(plan)))
            return 0
        if args.command == "report":
            _report(plan, args.metric, args.threshold, args.out, not args.no_plot)
            return 0
        if args.command == "task-args":
            out = task_args(plan, args.key, args.skip_incomplete)
            if out:
                sys.stdout.write("\0".join(out) + "\0")
                sys.stdout.flush()
            return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
