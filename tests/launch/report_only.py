"""Stand-in for ``python -m megatron_dapo.train --dry-run`` that only parses and reports.

Used by tests/launch/test_scripts.py as the PYTHON of the launch scripts: it checks that
every flag a script passes parses (``megatron_dapo.config.parse_args``) and that the dry-run
report builds, independently of the driver. Usage: ``report_only.py -m megatron_dapo.train ARGS``.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from megatron_dapo.config import parse_args  # noqa: E402
from megatron_dapo.launch.plan import dry_run_report  # noqa: E402
from megatron_dapo.models.hf_config import parse_hf_config  # noqa: E402


def main(argv):
    if argv[:2] != ["-m", "megatron_dapo.train"]:
        print(f"report_only.py: expected '-m megatron_dapo.train ...', got {argv[:2]}", file=sys.stderr)
        return 3
    cfg = parse_args(argv[2:])
    if not cfg.run.dry_run:
        print("report_only.py: the script did not pass --dry-run", file=sys.stderr)
        return 4
    print(dry_run_report(cfg, parse_hf_config(cfg.model.hf_checkpoint), cfg.model.hf_checkpoint))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
