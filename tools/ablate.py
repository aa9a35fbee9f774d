#!/usr/bin/env python
"""Factorial ablation of DAPO's controls: plan, launch and report a 2^k / 2^(k-p) grid.

    python tools/ablate.py run --grid GRID [--factors clip-higher,dynamic-sampling,...] [--seeds 1 2]
                               [--fraction P | --generators D=ABC] [--dry-run] [--slurm] -- <train flags>
    python tools/ablate.py status GRID
    python tools/ablate.py report GRID [--metric M] [--threshold T]

The logic is in megatron_dapo/ablation; docs/ablation.md explains the design, the launch
(local or Slurm), resuming, and how to read the report.
"""

import os
import sys

if __name__ == "__main__":
    try:
        import megatron_dapo.ablation  # noqa: F401
    except ImportError:  # not installed: run from a checkout
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    from megatron_dapo.ablation.cli import main  # after the sys.path line above

    sys.exit(main())
