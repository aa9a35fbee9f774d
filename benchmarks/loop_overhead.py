"""Loop overhead of a run, from its metrics.jsonl:

    overhead = step time - generation - old-logprob forward - training      (summed over steps)

reported as a share of the step time, with what it is made of (weight sync, probe, engine
release/resume and trainer offload/onload, verification, the rest = driver bookkeeping).

    python benchmarks/loop_overhead.py runs/smollm2-cpu [--skip-first N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def overhead(rows: list) -> dict:
    tot = lambda k: sum(float(r.get(k) or 0.0) for r in rows)  # noqa: E731
    step, gen, old, train = tot("time_step"), tot("time_generate"), tot("time_old_logprob"), tot("time_train")
    over = step - gen - old - train
    parts = {k: tot(k) for k in ("time_sync", "time_probe", "time_offload", "time_verify")}
    parts["rest"] = over - sum(parts.values())
    return {
        "steps": len(rows),
        "step_s": step,
        "overhead_s": over,
        "overhead_share": over / step if step else 0.0,
        "parts_s": parts,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir")
    p.add_argument("--skip-first", type=int, default=0, help="leave out the first N steps (warm-up)")
    a = p.parse_args(argv)
    with open(os.path.join(a.run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()][a.skip_first :]
    o = overhead(rows)
    parts = ", ".join(f"{k.replace('time_', '')} {v:.1f} s" for k, v in o["parts_s"].items())
    print(f"{o['steps']} steps, {o['step_s']:.1f} s; overhead {o['overhead_s']:.1f} s ({parts})")
    print(f"loop overhead: {100 * o['overhead_share']:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
