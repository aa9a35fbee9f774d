"""Command line of ``tools/diagnose.py``: diagnose a run directory, print verdicts, plot."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from megatron_dapo.diagnostics.analysis import diagnose
from megatron_dapo.diagnostics.history import load_metrics, metrics_path
from megatron_dapo.diagnostics.plot import plot_diagnosis
from megatron_dapo.diagnostics.report import print_report
from megatron_dapo.diagnostics.thresholds import Thresholds, load_thresholds
from megatron_dapo.errors import OneLineArgumentParser, one_line, report_user_error

__all__ = ["build_parser", "main"]

#: Exit codes: 0 diagnosed (no alert, or alerts without --fail-on-alert); 1 alerts with
#: --fail-on-alert; 2 bad usage / unreadable input: one line on stderr (``diagnose: error: ...``),
#: also for a metrics file with no step in it and, with --fail-on-alert, for one in which no
#: boundary has data (a gate that checks nothing must not pass).
EXIT_OK, EXIT_ALERT, EXIT_USAGE = 0, 1, 2
PROG = "diagnose.py"


def _usage_error(message: str) -> int:
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    return EXIT_USAGE


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(
        prog=PROG,
        description="Four-boundary stability diagnosis of a DAPO run (exploration, group contrast, "
        "token credit, reward interpretation) from RUN_DIR/metrics.jsonl. "
        "See docs/diagnosis.md.",
    )
    p.add_argument(
        "run_dir", metavar="RUN_DIR", help="run directory holding metrics.jsonl (or the path of a metrics .jsonl file)"
    )
    p.add_argument("--fail-on-alert", action="store_true", help="exit with status 1 when any alert fires")
    p.add_argument("--out", metavar="PNG", default=None, help="dashboard path (default: RUN_DIR/diagnosis.png)")
    p.add_argument("--no-plot", action="store_true", help="do not write the dashboard")
    p.add_argument(
        "--thresholds",
        metavar="FILE.yaml",
        default=None,
        help="YAML mapping of threshold names to values (see Thresholds)",
    )
    p.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one threshold (repeatable; applied after --thresholds)",
    )
    p.add_argument(
        "--json", metavar="FILE", default=None, help="also write the full diagnosis as JSON ('-' for stdout)"
    )
    p.add_argument(
        "--verbose", "-v", action="store_true", help="print every metric's early/recent/last values and slope"
    )
    p.add_argument("--plain", action="store_true", help="plain text even on a terminal")
    p.add_argument("--list-thresholds", action="store_true", help="print the thresholds in use (YAML) and exit")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _main(args)
    except Exception as e:  # an unwritable --out / --json: one line (MEGATRON_DAPO_DEBUG=1: the traceback)
        return report_user_error(PROG, e)


def _main(args) -> int:
    import yaml

    try:
        th = Thresholds()
        if args.thresholds:
            th = load_thresholds(args.thresholds, base=th)
        if args.set:
            th = th.with_overrides(args.set)
    except (OSError, ValueError, TypeError, yaml.YAMLError) as e:
        where = f"--thresholds {args.thresholds}" if args.thresholds else "--set"
        return _usage_error(f"bad thresholds ({where}): {one_line(e)}")
    if args.list_thresholds:
        for k, v in th.to_dict().items():
            print(f"{k}: {v}")
        return EXIT_OK
    path = metrics_path(args.run_dir)
    if not os.path.isfile(path):
        return _usage_error(
            f"no metrics file at {path}: give a run directory (--run-dir of megatron_dapo.train) "
            "or the path of its metrics.jsonl"
        )
    try:
        history = load_metrics(path)
    except OSError as e:
        return _usage_error(f"cannot read {path}: {e.strerror or e}")
    if len(history) == 0:
        bad = f"{history.bad_lines} line(s) that are not JSON objects" if history.bad_lines else "no lines"
        return _usage_error(
            f"{path}: no metrics in it ({bad}); give the metrics.jsonl that megatron_dapo.train "
            "writes (one JSON object per step)"
        )
    diag = diagnose(history, th)
    if args.fail_on_alert and all(b.status == "no_data" for b in diag.boundaries):
        return _usage_error(
            f"{path}: {len(history)} record(s) but none of the {len(diag.boundaries)} boundaries has any of its "
            "metrics, so --fail-on-alert would check nothing; give the metrics.jsonl that megatron_dapo.train "
            "writes (docs/metrics.md)"
        )
    print_report(diag, verbose=args.verbose, use_rich=False if args.plain else None)
    if args.json:
        text = json.dumps(diag.to_dict(), indent=2, default=str)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    if not args.no_plot:
        out = args.out or os.path.join(os.path.dirname(os.path.abspath(path)), "diagnosis.png")
        plot_diagnosis(diag, history, out)
        print(f"dashboard: {out}")
    if args.fail_on_alert and diag.any_alert:
        return EXIT_ALERT
    return EXIT_OK
