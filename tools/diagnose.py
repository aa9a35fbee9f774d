#!/usr/bin/env python
"""Four-boundary stability diagnosis of a DAPO run.

    python tools/diagnose.py RUN_DIR [--fail-on-alert] [--out PNG]
                             [--thresholds FILE.yaml] [--set key=value ...] [--json FILE] [-v]

Reads RUN_DIR/metrics.jsonl, prints one verdict per boundary (exploration, group contrast,
token credit, reward interpretation), writes RUN_DIR/diagnosis.png, and with --fail-on-alert
exits 1 when any alert fires. docs/diagnosis.md explains the metrics and thresholds.
"""

import os
import sys

if __name__ == "__main__":
    try:
        import megatron_dapo.diagnostics  # noqa: F401
    except ImportError:  # not installed: run from a checkout
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    from megatron_dapo.diagnostics.cli import main  # after the sys.path line above

    sys.exit(main())
