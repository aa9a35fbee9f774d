"""The CPU demo's step time at two commits, back to back on one machine (A B B A).

    python benchmarks/demo_ab.py OLD_REV [NEW_REV] [--steps 3] [--out DIR]

Each commit is checked out with ``git worktree add --detach`` under ``OUT/trees/``; the demo's
training command (examples/run_smollm2_cpu.sh's flags, ``--num-rollout STEPS``, no evaluation,
no checkpoint) runs from that tree with ``PYTHONPATH`` set to it, so that the driver and its Ray
actors import that commit's package (not the editable install). The order is A B B A, so a drift
of the machine's speed during the round falls on both sides. Prints, per phase, the mean of every
step of the A runs and of the B runs and their ratio B/A; writes ``OUT/summary.json``.

It needs the demo's model and data in ``.cache/demo`` (``bash examples/run_smollm2_cpu.sh
--dry-run`` prepares the model and data; the torch_dist conversion is done here if missing, with
the demo's command). Run it alone on the machine: the numbers are wall-clock times. OUT must not
exist (nothing is overwritten); the worktrees are removed at the end (``git worktree remove``),
the runs' metrics stay in ``OUT/<label>/run``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(ROOT, ".cache", "demo")
PHASES = ("time_step", "time_generate", "time_old_logprob", "time_train", "time_sync", "time_probe")


def _engine() -> str:
    """The demo script's ENGINE: sglang where this environment has it, else hf."""
    import importlib.util

    return os.environ.get("ENGINE") or ("sglang" if importlib.util.find_spec("sglang") is not None else "hf")


def demo_args(steps: int, run_dir: str) -> list:
    """examples/run_smollm2_cpu.sh's training flags, without evaluation, checkpoints or the HF export."""
    return [
        "--rollout-engine",
        _engine(),
        "--hf-checkpoint",
        f"{WORK}/smollm2-hf",
        "--pretrained-checkpoint",
        f"{WORK}/smollm2-torch_dist",
        "--prompt-data",
        f"{WORK}/addition/train.jsonl",
        "--no-apply-chat-template",
        "--max-prompt-length",
        "128",
        "--algorithm",
        "dapo",
        "--rollout-batch-size",
        "16",
        "--n-samples-per-prompt",
        "8",
        "--over-sampling-batch-size",
        "32",
        "--max-num-gen-batches",
        "4",
        "--global-batch-size",
        "64",
        "--micro-batch-size",
        "16",
        "--max-response-length",
        "12",
        "--overlong-buffer-length",
        "4",
        "--rollout-stop",
        "\\n",
        "--rollout-temperature",
        "1.0",
        "--rollout-top-p",
        "1.0",
        "--lr",
        "1e-5",
        "--weight-decay",
        "0.0",
        "--clip-grad",
        "1.0",
        "--adam-beta2",
        "0.99",
        "--num-rollout",
        str(steps),
        "--seed",
        "1",
        "--reward-num-workers",
        "1",
        "--run-dir",
        run_dir,
        "--wandb-mode",
        "offline",
    ]


def phase_means(rows: list) -> dict:
    return {k: statistics.mean(float(r[k]) for r in rows) for k in PHASES}


def compare(runs: dict) -> dict:
    """``runs``: label ('A1', 'B1', ...) -> metrics rows. The mean over all steps of each side, and B/A."""
    side = {s: [r for label, rows in runs.items() if label.startswith(s) for r in rows] for s in "AB"}
    a, b = phase_means(side["A"]), phase_means(side["B"])
    return {k: {"A": a[k], "B": b[k], "ratio": b[k] / a[k] if a[k] else float("nan")} for k in PHASES}


def _git(*args) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old"), p.add_argument("new", nargs="?", default="HEAD")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default=os.path.join(ROOT, "runs", time.strftime("demo-ab-%Y%m%d-%H%M%S")))
    a = p.parse_args(argv)
    if os.path.exists(a.out):
        print(f"demo_ab: --out {a.out} exists; give a new directory (nothing is overwritten)", file=sys.stderr)
        return 2
    for need in ("smollm2-hf/config.json", "addition/train.jsonl"):
        if not os.path.exists(os.path.join(WORK, need)):
            print(
                f"demo_ab: {WORK}/{need} is missing; run `bash examples/run_smollm2_cpu.sh --dry-run` first",
                file=sys.stderr,
            )
            return 2
    if not os.path.exists(f"{WORK}/smollm2-torch_dist/megatron_dapo_checkpoint.json"):
        subprocess.run(
            [
                sys.executable,
                "tools/convert_hf_to_megatron.py",
                "--hf-checkpoint",
                f"{WORK}/smollm2-hf",
                "--save",
                f"{WORK}/smollm2-torch_dist",
                "--dtype",
                "fp32",
            ],
            cwd=ROOT,
            check=True,
        )
    revs = {"A": _git("rev-parse", a.old), "B": _git("rev-parse", a.new)}
    trees = {s: os.path.join(a.out, "trees", s) for s in revs}
    os.makedirs(os.path.join(a.out, "trees"))
    for s, rev in revs.items():
        _git("worktree", "add", "--detach", trees[s], rev)
    runs, walls = {}, {}
    try:
        for label in ("A1", "B1", "B2", "A2"):
            tree, run_dir = trees[label[0]], os.path.join(a.out, label, "run")
            os.makedirs(os.path.dirname(run_dir))
            env = dict(os.environ, PYTHONPATH=tree)
            env.pop("RAY_ADDRESS", None)
            t0 = time.time()
            with open(os.path.join(a.out, label, "log.txt"), "w") as log:
                rc = subprocess.run(
                    [sys.executable, "-m", "megatron_dapo.train", *demo_args(a.steps, run_dir)],
                    cwd=tree,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                ).returncode
            walls[label] = time.time() - t0
            if rc != 0:
                print(
                    f"demo_ab: run {label} ({revs[label[0]][:8]}) exited {rc}; see {a.out}/{label}/log.txt",
                    file=sys.stderr,
                )
                return 1
            with open(os.path.join(run_dir, "metrics.jsonl")) as f:
                runs[label] = [json.loads(x) for x in f if x.strip()]
            print(
                f"[demo_ab] {label} {revs[label[0]][:8]}: {walls[label]:.0f} s, steps "
                + " ".join(f"{r['time_step']:.1f}" for r in runs[label]),
                flush=True,
            )
    finally:
        for s in trees:
            subprocess.run(["git", "worktree", "remove", "--force", trees[s]], cwd=ROOT, capture_output=True)
    res = compare(runs)
    for k, v in res.items():
        print(f"{k:18s} A {v['A']:8.2f}  B {v['B']:8.2f}  B/A {v['ratio']:.3f}")
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(
            {
                "revs": revs,
                "steps": a.steps,
                "wall_s": walls,
                "phases": res,
                "per_run": {k: phase_means(v) for k, v in runs.items()},
            },
            f,
            indent=1,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
