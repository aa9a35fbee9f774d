"""Before a run writes anything: whose files are in its run directory and its ``--save``.

A run never deletes or overwrites what it did not write (docs/reliability.md):

* a FRESH run refuses a ``--run-dir`` that holds a previous run's files (:data:`RUN_OUTPUTS`),
  and a ``--save`` that holds another run's checkpoints;
* a RESUMED run (``--load``) refuses a ``--save`` that holds this run's checkpoints after the
  resumed step (a rollback: rotation would mix the two histories);
* ``--start-over`` moves what is in the way into ``aside-<time>/`` beside it (never deletes);
* ``config.json`` is written only after every check passed (:func:`write_config`).

:func:`prepare_outputs` does the checks (before Ray starts: a mistake costs seconds, not a
cluster start), or only reports them for ``--dry-run``.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field
from typing import List, Optional


from ..config import ConfigError
from . import checkpoint_dirs as checkpoints
from ..checkpoint import manifest
from . import run_lock

#: What the trainer writes into its run directory (the entries --start-over moves aside).
RUN_OUTPUTS = ("config.json", "metrics.jsonl", "hybrid_events.jsonl", "rollouts", "eval", "hf", "final_hf",
               "training_curves.png", "tensorboard", "wandb")
#: Any of these means a run already wrote here.
RUN_MARKERS = ("config.json", "metrics.jsonl", "hybrid_events.jsonl")


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


@dataclass
class Outputs:
    """The outcome of :func:`prepare_outputs`."""

    run_id: str
    resume_dir: Optional[str] = None
    resume_step: Optional[int] = None
    state: Optional[dict] = None
    lines: List[str] = field(default_factory=list)  # one per check, for the log and the dry run
    nothing_to_do: bool = False  # the resumed step is already --num-rollout's


def _inside(path: str, root: str) -> Optional[str]:
    """The first component of ``path`` under ``root`` (None when ``path`` is not inside it)."""
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    return None if rel == "." or rel.startswith("..") else rel.split(os.sep)[0]


def _writable(path: str, flag: str) -> None:
    probe = path
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    probe = probe or "."
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: cannot write there ({probe} is not a writable directory); "
                          f"choose another {flag}")


def prepare_outputs(cfg, dry_run: bool = False) -> Outputs:
    """Check (and with ``--start-over`` clear by moving aside) the run directory and ``--save``
    for this run; read the resumed checkpoint's trainer state. Raises :class:`ConfigError`
    naming the flag, the path and the choices. ``dry_run``: check and report, move nothing."""
    run_dir, save, start_over = cfg.logging.run_dir, cfg.checkpoint.save, cfg.checkpoint.start_over
    out = Outputs(run_id="")
    if cfg.checkpoint.load:
        out.resume_dir = checkpoints.resolve(cfg.checkpoint.load)
        if out.resume_dir is None:
            raise ConfigError(f"--load {cfg.checkpoint.load}: no checkpoint found (no '{checkpoints.LATEST}' "
                              f"pointer or {checkpoints.STATE_FILE}); give a run's --save directory or one step_* in it")
        try:
            out.state = manifest.load_state(os.path.join(out.resume_dir, checkpoints.STATE_FILE))
            out.resume_step = int(out.state["step"])
        except Exception as e:  # noqa: BLE001 - a truncated or foreign file
            why = str(e) if isinstance(e, ValueError) else f"{checkpoints.STATE_FILE} cannot be read ({type(e).__name__})"
            raise ConfigError(f"--load {cfg.checkpoint.load}: {out.resume_dir}/{why}; give another checkpoint") from None
        saved_seed = (out.state.get("sampler") or {}).get("seed")
        if saved_seed is not None and saved_seed != cfg.optim.seed:
            raise ConfigError(
                f"--seed {cfg.optim.seed}: the resumed run (--load {cfg.checkpoint.load}) was started with --seed "
                f"{saved_seed}, and its data order and every random stream derive from it; an exact resume needs "
                f"--seed {saved_seed} (a new seed is a new run: start it without --load)"
            )
        out.lines.append(f"--load {out.resume_dir}: resumes after step {out.resume_step}")
        if out.resume_step >= cfg.run.num_rollout_steps:
            out.lines.append(
                f"--load {out.resume_dir}: step {out.resume_step} is already done and --num-rollout is "
                f"{cfg.run.num_rollout_steps}: nothing left to do (raise --num-rollout to train further)"
            )
            out.nothing_to_do = True
    out.run_id = (out.state or {}).get("run_id") or new_run_id()

    # ownership: nothing below moves or writes anything before this run holds both directories
    _writable(run_dir, "--run-dir")
    owned = [(run_dir, "--run-dir")]
    if save and _inside(save, run_dir) is None:
        _writable(save, "--save")
        owned.append((save, "--save"))
    taken = []
    try:
        for directory, flag in owned:
            if dry_run:
                out.lines += run_lock.check_free(directory, flag)
            else:
                out.lines += run_lock.acquire(directory, flag, out.run_id)
                taken.append(directory)
        _check_directories(out, run_dir, save, start_over, dry_run)
    except BaseException:
        run_lock.release(taken)  # a refused run leaves the directories as they were
        raise
    return out


def _check_directories(out: Outputs, run_dir: str, save: Optional[str], start_over: bool, dry_run: bool) -> None:
    # the run directory
    previous = [n for n in RUN_MARKERS if os.path.exists(os.path.join(run_dir, n))]
    if previous and out.resume_dir is None:
        keep = _inside(save, run_dir) if save else None
        mine = [n for n in RUN_OUTPUTS if n != keep and os.path.lexists(os.path.join(run_dir, n))]
        if not start_over:
            raise ConfigError(
                f"--run-dir {run_dir} holds a previous run's files ({', '.join(previous)}); resume that run with "
                f"--load <its --save>, choose a new --run-dir, or pass --start-over to move them into "
                f"{run_dir}/aside-<time>/ (nothing is deleted)")
        if dry_run:
            out.lines.append(f"--run-dir {run_dir}: --start-over would move {len(mine)} entries aside")
        else:
            dest = checkpoints.move_aside(run_dir, mine)
            out.lines.append(f"--run-dir {run_dir}: a previous run's {len(mine)} entries moved to {dest}")
    else:
        out.lines.append(f"--run-dir {run_dir}: " + ("continues the resumed run's files" if previous else "new"))

    # the checkpoint directory
    if save:
        _writable(save, "--save")
        try:
            checkpoints.check_save_dir(save, out.run_id, out.resume_step)
            n = len(checkpoints.steps(save))
            out.lines.append(f"--save {save}: " + (f"{n} checkpoint(s) of this run" if n else "no checkpoints yet"))
        except checkpoints.SaveDirConflict as e:
            if not start_over:
                raise ConfigError(str(e)) from None
            if dry_run:
                out.lines.append(f"--save {save}: --start-over would move {len(e.names)} checkpoint(s) aside")
            else:
                dest = checkpoints.move_aside(save, e.names)
                out.lines.append(f"--save {save}: {len(e.names)} checkpoint(s) moved to {dest}")


def write_config(run_dir: str, cfg_dict: dict) -> str:
    """``RUN_DIR/config.json`` (atomic), once every check has passed."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, "config.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(cfg_dict, f, indent=1, default=str)
    os.replace(tmp, path)
    return path
