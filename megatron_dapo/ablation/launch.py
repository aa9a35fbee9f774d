"""Launching a grid: the state of each run, local runs one after another, or a Slurm job array.

State of a run (:func:`grid_states`), from its run directory alone:

* ``done``: its ``metrics.jsonl`` has the final step (``--num-rollout``);
* ``incomplete``: the trainer wrote there (``config.json`` / ``metrics.jsonl``) but did not
  reach the final step: it crashed, was killed, or is running now;
* ``missing``: nothing written yet;
* ``foreign``: its ``config.json`` is not this cell's configuration (another run's files): it is
  never touched, and the report refuses the grid naming the fields.

A launch runs only what is not done: a missing run starts fresh; an incomplete one resumes from
its last checkpoint (``--checkpoint-every``) with ``--load``, else starts again with
``--start-over``, which moves its partial files into ``RUN_DIR/aside-<time>/`` (the trainer never
deletes; without that flag it refuses a run directory holding another run's files, which is
the guard against overwriting anything). Locally each run is a ``python -m
megatron_dapo.train`` in a session of its own; Ctrl-C or SIGTERM stops it (SIGTERM, then after
``--kill-grace`` seconds SIGKILL to every process left in its session) and the launcher exits;
nothing it started outlives it. On Slurm one array task per run calls
``examples/slurm/submit_dapo.sbatch`` (Ray on the task's nodes, then the driver).
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from ..outputs.checkpoint_dirs import resolve
from .plan import PER_RUN_FIELDS, AblationError, Plan, Run, expected_config, flatten, parse_train_args

LAUNCH_LOG = "launch.jsonl"
RUN_MARKERS = ("config.json", "metrics.jsonl", "hybrid_events.jsonl")  # outputs/run_dir.py RUN_MARKERS


@dataclass
class RunState:
    run: Run
    status: str  # done | incomplete | missing | foreign
    steps: int  # the run's --num-rollout
    last_step: Optional[int] = None
    detail: str = ""
    last_launch: Optional[dict] = None

    @property
    def key(self) -> str:
        return self.run.key


def read_launches(grid: str) -> Dict[str, dict]:
    """The last record of each run in ``GRID/launch.jsonl`` (lines cut short are skipped)."""
    out: Dict[str, dict] = {}
    path = os.path.join(grid, LAUNCH_LOG)
    if not os.path.isfile(path):
        return out
    with open(path, errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and "key" in rec:
                out[rec["key"]] = rec
    return out


def record_launch(grid: str, rec: dict) -> None:
    with open(os.path.join(grid, LAUNCH_LOG), "a") as f:
        f.write(json.dumps(rec) + "\n")


def last_step(run_dir: str) -> Optional[int]:
    """The highest ``step`` in ``RUN_DIR/metrics.jsonl`` (None without one)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return None
    best = None
    with open(path, errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            s = rec.get("step") if isinstance(rec, dict) else None
            if isinstance(s, (int, float)) and not isinstance(s, bool):
                best = int(s) if best is None else max(best, int(s))
    return best


def config_differences(got: dict, want: dict, ignore: Sequence[str] = PER_RUN_FIELDS) -> List[str]:
    keys = sorted((set(got) | set(want)) - set(ignore))
    return [k for k in keys if got.get(k, "<absent>") != want.get(k, "<absent>")]


def read_config(run_dir: str) -> Optional[dict]:
    path = os.path.join(run_dir, "config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return flatten(json.load(f))
    except (OSError, json.JSONDecodeError) as e:
        raise AblationError(f"{path}: cannot be read ({e}); move it away or fix it") from None


def run_state(
    plan: Plan, run: Run, launches: Optional[Dict[str, dict]] = None, want: Optional[dict] = None
) -> RunState:
    want = want if want is not None else expected_config(run.argv, f"run {run.key}")
    steps = int(want["run.num_rollout_steps"])
    launch = (launches or {}).get(run.key)
    rd = run.run_dir
    if not any(os.path.lexists(os.path.join(rd, m)) for m in RUN_MARKERS):
        return RunState(run, "missing", steps, None, "never started" if not launch else "nothing written", launch)
    got = read_config(rd)
    if got is not None:
        diff = config_differences(got, want)
        if diff:
            shown = ", ".join(f"{k} ({got.get(k)!r}, plan {want.get(k)!r})" for k in diff[:4])
            return RunState(
                run,
                "foreign",
                steps,
                last_step(rd),
                f"its config.json is not this cell's: {shown}{' ...' if len(diff) > 4 else ''}",
                launch,
            )
    ls = last_step(rd)
    if ls is not None and ls >= steps:
        return RunState(run, "done", steps, ls, f"{ls} steps", launch)
    how = ""
    if launch and launch.get("rc") is not None:
        rc = launch["rc"]
        how = f"; last launch exited {rc}" + (f" ({signal.Signals(rc - 128).name})" if 128 < rc < 160 else "")
        if launch.get("log"):
            how += f", log {launch['log']}"
    where = f"step {ls} of {steps}" if ls else f"no step finished of {steps}"
    return RunState(run, "incomplete", steps, ls, where + how, launch)


def grid_states(plan: Plan) -> List[RunState]:
    launches = read_launches(plan.grid)
    return [run_state(plan, r, launches) for r in plan.runs]


def checkpoint_of(run: Run) -> Optional[str]:
    save = os.path.join(run.run_dir, "checkpoints")
    return save if os.path.isdir(save) and resolve(save) else None


def action_for(state: RunState, skip_incomplete: bool = False):
    """(action, extra train flags) for a run, or None when it is not to be launched."""
    if state.status == "missing":
        return "new", []
    if state.status == "incomplete" and not skip_incomplete:
        ckpt = checkpoint_of(state.run)
        if ckpt:
            return "resume", ["--load", ckpt]
        return "restart", ["--start-over"]
    return None


def format_states(plan: Plan, states: Sequence[RunState]) -> str:
    lines = []
    counts: Dict[str, int] = {}
    for s in states:
        counts[s.status] = counts.get(s.status, 0) + 1
        lines.append(f"  {s.key:<{len(s.key) + 2}} {s.status:<10} {s.detail}  [{plan.cell_label(s.run.cell)}]")
    head = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    return f"grid {plan.grid}: {len(states)} runs: {head}\n" + "\n".join(lines)


# ---------------------------------------------------------------------------- processes


def session_pids(sid: int) -> List[int]:
    """Live processes of session ``sid`` (field 6 of /proc/PID/stat)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def end_session(proc: subprocess.Popen, grace_s: float, term: bool) -> List[int]:
    """Stop ``proc`` (started with ``start_new_session``) and everything in its session: SIGTERM
    to ``proc`` when ``term``, up to ``grace_s`` for it and its session to end on their own, then
    SIGKILL to what is left. Returns the pids that had to be killed."""
    if term and proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if proc.poll() is not None and not [p for p in session_pids(proc.pid) if p != proc.pid]:
            break
        time.sleep(0.2)
    killed = [p for p in session_pids(proc.pid)]
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    return killed


class _Stop:
    """The first SIGINT/SIGTERM the launcher receives (later ones change nothing: the cleanup of
    the running run is not cut short). A flag the launch loop polls, so a signal never lands
    between starting a run and recording its process."""

    def __init__(self):
        self.signum: Optional[int] = None

    def __call__(self, signum, frame):
        if self.signum is None:
            self.signum = signum


def _now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


def launch_local(
    plan: Plan,
    skip_incomplete: bool = False,
    kill_grace_s: float = 60.0,
    only: Sequence[str] = (),
    echo: Callable[[str], None] = print,
    python: Optional[str] = None,
) -> dict:
    """Run every run that is not done, one after another; returns ``{"ran": [...], "failed": [...],
    "skipped": [...], "interrupted": signum or None}``."""
    states = grid_states(plan)
    if only:
        unknown = sorted(set(only) - {s.key for s in states})
        if unknown:
            raise AblationError(f"--only {', '.join(unknown)}: no such run (runs are CELL:SEED, e.g. {states[0].key})")
        states = [s for s in states if s.key in set(only)]
    todo = [(s, action_for(s, skip_incomplete)) for s in states]
    todo = [(s, a) for s, a in todo if a is not None]
    summary = {"ran": [], "failed": [], "skipped": [], "interrupted": None}
    for s in states:
        if s.status == "foreign":
            summary["failed"].append(s.key)
            echo(f"[ablate] {s.key}: NOT launched: {s.run.run_dir} holds another run ({s.detail}); move it away")
        elif s.status == "incomplete" and skip_incomplete:
            summary["skipped"].append(s.key)
            echo(f"[ablate] {s.key}: incomplete ({s.detail}), left as it is (--skip-incomplete)")
    done = sum(1 for s in states if s.status == "done")
    echo(f"[ablate] {len(todo)} run(s) to launch, {done} already done")
    if not todo:
        return summary
    lock = _lock_grid(plan.grid)  # held until this process ends
    os.makedirs(os.path.join(plan.grid, "logs"), exist_ok=True)
    stop = _Stop()
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            handlers[sig] = signal.signal(sig, stop)
    try:
        for i, (state, (action, extra)) in enumerate(todo, 1):
            if stop.signum is not None:
                break
            run = state.run
            log = os.path.join(plan.grid, "logs", f"{run.cell}-seed{run.seed}.log")
            cmd = [python or sys.executable, "-m", "megatron_dapo.train", *run.argv, *extra]
            echo(
                f"[ablate] {i}/{len(todo)} {run.key} ({plan.cell_label(run.cell)}): {action}"
                f"{' from ' + extra[1] if action == 'resume' else ''}; log {log}"
            )
            rec = {
                "key": run.key,
                "cell": run.cell,
                "seed": run.seed,
                "action": action,
                "log": log,
                "start": _now(),
                "argv": cmd,
            }
            t0 = time.monotonic()
            with open(log, "a") as lf:
                lf.write(f"=== {rec['start']} {action}: {' '.join(shlex.quote(a) for a in cmd)}\n")
                lf.flush()
                proc = subprocess.Popen(
                    cmd,
                    stdout=lf,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=plan.cwd,
                    env=dict(os.environ, PYTHONUNBUFFERED="1"),
                    start_new_session=True,
                )
                rec["pid"] = proc.pid  # = its session id
                while proc.poll() is None and stop.signum is None:
                    try:
                        proc.wait(timeout=0.5)
                    except subprocess.TimeoutExpired:
                        pass
                if stop.signum is not None and proc.poll() is None:
                    name = signal.Signals(stop.signum).name
                    echo(
                        f"[ablate] {name}: stopping {run.key} (SIGTERM, then SIGKILL after {kill_grace_s:g} s to "
                        "what is left of it)"
                    )
                    killed = end_session(proc, grace_s=kill_grace_s, term=True)
                    if killed:
                        echo(f"[ablate] killed {len(killed)} process(es) left in {run.key}'s session")
                    rec["interrupted"] = name
                else:
                    end_session(proc, grace_s=kill_grace_s, term=False)  # whatever it left behind
            rc = proc.returncode
            rec.update(end=_now(), rc=rc, seconds=round(time.monotonic() - t0, 1))
            record_launch(plan.grid, rec)
            if "interrupted" in rec:
                break
            st = run_state(plan, run, read_launches(plan.grid))
            if rc == 0 and st.status == "done":
                summary["ran"].append(run.key)
                echo(f"[ablate] {run.key}: done in {rec['seconds']:.0f} s")
            else:
                summary["failed"].append(run.key)
                echo(f"[ablate] {run.key}: FAILED (exit {rc}, {st.status}: {st.detail}); last lines of {log}:")
                for line in _tail(log, 12):
                    echo(f"    {line}")
    finally:
        for sig, h in handlers.items():
            signal.signal(sig, h)
        lock.close()
    summary["interrupted"] = stop.signum
    return summary


def _lock_grid(grid: str):
    """An exclusive lock on ``GRID/launch.lock`` (a second launcher of the same grid would start
    the running run over); refused in one line naming the holder."""
    f = open(os.path.join(grid, "launch.lock"), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise AblationError(
            f"{grid}: another launch of this grid is running ({holder}); wait for it, or stop it "
            "(Ctrl-C / kill its pid) first"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} since {_now()}\n")
    f.flush()
    return f


def _tail(path: str, n: int) -> List[str]:
    try:
        with open(path, errors="replace") as f:
            return [x.rstrip("\n")[-300:] for x in f.readlines()[-n:]]
    except OSError:
        return []


# ---------------------------------------------------------------------------- Slurm


def repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def task_args(plan: Plan, key: str, skip_incomplete: bool = False) -> Optional[List[str]]:
    """The train flags of run ``key`` now (what a Slurm array task runs), or None when it is done."""
    run = plan.run(key)
    state = run_state(plan, run, read_launches(plan.grid))
    if state.status == "foreign":
        raise AblationError(f"{key}: {run.run_dir} holds another run ({state.detail}); move it away")
    act = action_for(state, skip_incomplete)
    if act is None:
        return None
    action, extra = act
    record_launch(
        plan.grid,
        {
            "key": key,
            "cell": run.cell,
            "seed": run.seed,
            "action": action,
            "start": _now(),
            "slurm_job": os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID"),
            "slurm_task": os.environ.get("SLURM_ARRAY_TASK_ID"),
        },
    )
    return [*run.argv, *extra]


def _slurm_time(hours: Optional[float]) -> str:
    if hours is None:
        return "72:00:00"
    minutes = int(hours * 60 * 1.5 + 15)  # 1.5x the estimate + 15 min for the start (Ray, weights)
    return f"{minutes // 60}:{minutes % 60:02d}:00"


def write_slurm_array(
    plan: Plan,
    keys: Sequence[str],
    max_parallel: int = 0,
    time_limit: Optional[str] = None,
    python: Optional[str] = None,
) -> str:
    """``GRID/slurm/array-<stamp>.sbatch``: one array task per run in ``keys`` (its task file
    beside it); each task asks ``task-args`` what to run and calls examples/slurm/submit_dapo.sbatch
    with the train script ``GRID/slurm/train_cell.sh`` as its DRIVER_SCRIPT."""
    root = repo_root()
    sbatch = os.path.join(root, "examples", "slurm", "submit_dapo.sbatch")
    if not os.path.isfile(sbatch):
        raise AblationError(f"--slurm: {sbatch} not found; run the ablation from a checkout of megatron-dapo")
    cfg = parse_train_args(plan.base_args, "base command")
    nodes, gpus = cfg.parallel.nnodes, cfg.parallel.gpus_per_node
    hours = max((c.get("hours_per_run") or 0.0 for c in plan.cost.get("cells", {}).values()), default=0.0) or None
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    sdir = os.path.join(plan.grid, "slurm")
    os.makedirs(sdir, exist_ok=True)
    os.makedirs(os.path.join(plan.grid, "logs"), exist_ok=True)
    tasks = os.path.join(sdir, f"tasks-{stamp}.txt")
    with open(tasks, "w") as f:
        f.write("".join(k + "\n" for k in keys))
    driver = os.path.join(sdir, "train_cell.sh")
    with open(driver, "w") as f:
        f.write(
            "#!/usr/bin/env bash\n# DRIVER_SCRIPT of examples/slurm/submit_dapo.sbatch for an ablation run: the "
            'trainer with the run\'s flags\nset -euo pipefail\nexec "${PYTHON:-python3}" -m megatron_dapo.train '
            '"$@"\n'
        )
    os.chmod(driver, 0o755)
    py = python or sys.executable
    name = os.path.basename(plan.grid.rstrip("/")) or "grid"
    array = f"0-{len(keys) - 1}" + (f"%{max_parallel}" if max_parallel else "")
    q = shlex.quote
    text = f"""#!/usr/bin/env bash
# Ablation grid {plan.grid}: one array task per run listed in {os.path.basename(tasks)} (written by tools/ablate.py).
# Each task runs examples/slurm/submit_dapo.sbatch on its own nodes with the run's flags; a run that is done
# by the time its task starts is skipped, an incomplete one is resumed or started over (docs/ablation.md).
#SBATCH --job-name=ablate-{name}
#SBATCH --array={array}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-task={gpus}
#SBATCH --exclusive
#SBATCH --time={time_limit or _slurm_time(hours)}
#SBATCH --output={os.path.join(plan.grid, "logs", "slurm-%A_%a.out")}
set -euo pipefail
GRID={q(plan.grid)}
TASKS={q(tasks)}
export REPO_ROOT={q(root)}
export PYTHONPATH="$REPO_ROOT${{PYTHONPATH:+:$PYTHONPATH}}"  # megatron_dapo from this checkout
export PYTHON="${{PYTHON:-{py}}}"
export DRIVER_SCRIPT={q(driver)}
[[ -n "${{SLURM_ARRAY_TASK_ID:-}}" ]] || {{ echo "ablate: SLURM_ARRAY_TASK_ID is not set; submit this file with sbatch" >&2; exit 2; }}
KEY="$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" "$TASKS")"
[[ -n "$KEY" ]] || {{ echo "ablate: no run for array task $SLURM_ARRAY_TASK_ID in $TASKS" >&2; exit 2; }}
cd {q(plan.cwd)}
ARGS_FILE="$(mktemp)"
trap 'rm -f "$ARGS_FILE"' EXIT
"$PYTHON" -m megatron_dapo.ablation.cli task-args "$GRID" "$KEY" > "$ARGS_FILE"
mapfile -d '' ARGS < "$ARGS_FILE"
if [[ ${{#ARGS[@]}} -eq 0 ]]; then echo "ablate: $KEY is already done"; exit 0; fi
echo "ablate: $KEY (array task $SLURM_ARRAY_TASK_ID)"
bash "$REPO_ROOT/examples/slurm/submit_dapo.sbatch" "${{ARGS[@]}}"
"""
    path = os.path.join(sdir, f"array-{stamp}.sbatch")
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return path


def submit_slurm(
    plan: Plan,
    skip_incomplete: bool = False,
    sbatch_args: Sequence[str] = (),
    max_parallel: int = 0,
    time_limit: Optional[str] = None,
    echo: Callable[[str], None] = print,
) -> Optional[str]:
    """Write the array for every run not done and submit it with ``sbatch --parsable``; returns
    the job id (None when nothing is left to run)."""
    states = grid_states(plan)
    keys = [s.key for s in states if action_for(s, skip_incomplete) is not None]
    for s in states:
        if s.status == "foreign":
            echo(f"[ablate] {s.key}: NOT submitted: {s.run.run_dir} holds another run ({s.detail}); move it away")
    if not keys:
        echo("[ablate] nothing to submit: every run is done")
        return None
    script = write_slurm_array(plan, keys, max_parallel, time_limit)
    cmd = ["sbatch", "--parsable", *sbatch_args, script]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=plan.cwd, timeout=300)
    except FileNotFoundError:
        raise AblationError(f"--slurm: sbatch not found on PATH; submit {script} on the cluster's login node") from None
    if p.returncode != 0:
        msg = " ".join((p.stderr or p.stdout).split())[-500:]
        raise AblationError(f"--slurm: sbatch failed (exit {p.returncode}: {msg}); the array script is {script}")
    job = p.stdout.strip().split(";")[0]
    with open(os.path.join(plan.grid, "slurm", "submissions.jsonl"), "a") as f:
        f.write(json.dumps({"job": job, "script": script, "runs": keys, "time": _now(), "argv": cmd}) + "\n")
    echo(
        f"[ablate] submitted job array {job}: {len(keys)} run(s) ({', '.join(keys)}); script {script}; logs "
        f"{os.path.join(plan.grid, 'logs')}/slurm-{job}_<task>.out"
    )
    echo(f"[ablate] when it has finished: tools/ablate.py report {plan.grid}")
    return job
