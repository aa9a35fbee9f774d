"""benchmarks/suite_cpu.py: a command's CPU by kind of process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import suite_cpu  # noqa: E402

#: 1.5 CPU-s, then idle long enough for a sample to see the whole of it (a sweep of /proc takes
#: longer on a loaded machine with many processes)
BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5:\n    pass\ntime.sleep(2)\n"


def test_kinds_of_the_suites_processes():
    assert suite_cpu.kind("ray::PolicyActor.save", "python") == "ray::PolicyActor"
    assert suite_cpu.kind("/x/python -m megatron_dapo.train --hf-checkpoint h", "python").startswith("driver")
    assert suite_cpu.kind("/x/ray/core/src/ray/raylet/raylet --raylet_socket_name=/tmp/s", "raylet") == "ray raylet"
    assert (
        suite_cpu.kind("/x/python /r/tests/launch/ray_start_check.py --a", "python")
        == "tests/launch/ray_start_check.py"
    )
    assert suite_cpu.kind("", "kworker/0:1") == "kworker/0:1"


def test_a_child_that_burns_cpu_is_counted(tmp_path):
    script = tmp_path / "burn_cpu.py"
    script.write_text(BURN)
    out = tmp_path / "rows.json"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "suite_cpu.py"),
            "--json",
            str(out),
            "--top",  # every kind: the machine's other processes (a loaded one has many) are counted too
            "100000",
            "--",
            sys.executable,
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("exit 0, wall "), r.stdout
    line = next(ln for ln in r.stdout.splitlines() if ln.rstrip().endswith("burn_cpu.py"))
    cpu = float(line.split()[0])
    # it burns 1.5 CPU-s then sleeps 2 s, so a sample after the burn sees all of it (clock ticks of 10 ms;
    # the interpreter's start adds a little)
    assert 1.5 <= cpu <= 1.5 + 0.5, r.stdout
    rows = json.loads(out.read_text())
    assert any(title.endswith("burn_cpu.py") for _, _, _, title, _ in rows)
