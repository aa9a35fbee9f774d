"""CPU a process spends before it does anything: importing megatron-core and a trainer rank's
modules, with the import hook of ``megatron_dapo/platform_imports.py`` over without it
(``MEGATRON_DAPO_EAGER_JIT=1``, megatron-core's own import path), in the same run, interleaved;
each case a fresh Python process timed by its own ``time.process_time()``:

    python benchmarks/bench_startup.py [--repeats 5]

Cases:
    megatron-core       ``import megatron_dapo, megatron.core`` (torch imported first, not counted)
    trainer rank        the modules a PolicyActor imports, then ``torch._dynamo`` (what torch's
                        optimizer imports when it is built) and transformers' Qwen2 model

Prints one line per case, last: ``CASE: hook / eager X.XX (A.AA s / B.BB s, medians)``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASES = {
    "megatron-core": "import megatron_dapo, megatron.core",
    "trainer rank": (
        "import megatron_dapo.training.worker, megatron_dapo.driver.actors, megatron_dapo.training.setup\n"
        "import torch._dynamo\nimport transformers.models.qwen2.modeling_qwen2"
    ),
}


def measure(code: str, eager: bool) -> float:
    prog = f"import time, json\nimport torch\nt = time.process_time()\n{code}\nprint(json.dumps(time.process_time() - t))\n"
    env = {**os.environ, "MEGATRON_DAPO_EAGER_JIT": "1" if eager else "0", "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([sys.executable, "-c", prog], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="runs of each case and mode (interleaved)")
    args = ap.parse_args(argv)
    for name, code in CASES.items():
        hook, eager = [], []
        for _ in range(args.repeats):
            hook.append(measure(code, eager=False))
            eager.append(measure(code, eager=True))
        h, e = statistics.median(hook), statistics.median(eager)
        print(f"{name}: hook / eager {h / e:.2f} ({h:.2f} s / {e:.2f} s, medians of {args.repeats})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
