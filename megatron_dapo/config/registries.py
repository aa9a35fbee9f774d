"""Every registry a flag chooses from, and the docs' table generated from them.

``python -m megatron_dapo.config.registries --markdown`` prints the table that docs/design.md
holds between the ``registries:begin`` / ``registries:end`` markers
(``tests/config/test_registries.py`` fails when the two differ): per flag, each registered
name and the first paragraph of its docstring. The flags' ``--help`` choices come from the
same registries (``config/schema.py``, ``algo/config.py``).
"""

from __future__ import annotations

import argparse
from typing import List, Tuple

from ..algo.advantages import ADVANTAGE_ESTIMATORS
from ..algo.dynamic_sampling import DYNAMIC_SAMPLING_METRICS
from ..algo.kl import KL_ESTIMATORS
from ..algo.policy_losses import POLICY_LOSSES
from ..algo.tis import TIS_MODES
from ..registry import Registry
from ..reward.api import REWARD_MODES
from ..rollout.engines import ENGINE_KINDS

BEGIN = "<!-- registries:begin (python -m megatron_dapo.config.registries --markdown) -->"
END = "<!-- registries:end -->"


def registries() -> Tuple[Tuple[str, Registry, str], ...]:
    """``(flag, registry, where it lives)`` of every registry-backed flag."""
    return (
        ("--advantage-estimator", ADVANTAGE_ESTIMATORS, "algo/advantages.py"),
        ("--policy-loss", POLICY_LOSSES, "algo/policy_losses.py"),
        ("--kl-estimator", KL_ESTIMATORS, "algo/kl.py"),
        ("--tis-mode", TIS_MODES, "algo/tis.py"),
        ("--dynamic-sampling-metric", DYNAMIC_SAMPLING_METRICS, "algo/dynamic_sampling.py"),
        ("--reward-mode", REWARD_MODES, "reward/api.py"),
        ("--rollout-engine", ENGINE_KINDS, "rollout/engines.py"),
    )


def markdown() -> str:
    """The table of every registry (flag, name, one-line doc), between the docs' markers."""
    lines: List[str] = [BEGIN, "", "| flag | name | what it is | registry |", "| --- | --- | --- | --- |"]
    for flag, reg, where in registries():
        for i, name in enumerate(reg.names()):
            doc = reg.doc(name).replace("|", "\\|")
            lines.append(f"| `{flag}` | `{name}` | {doc} | {f'`{where}`' if i == 0 else ''} |")
    lines += ["", END]
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m megatron_dapo.config.registries", description=__doc__.split("\n\n")[0])
    p.add_argument("--markdown", action="store_true", help="print the docs' table (default: flag and names)")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown())
        return
    for flag, reg, _ in registries():
        print(f"{flag}: {', '.join(reg.names())}")


if __name__ == "__main__":
    main()
