"""Resuming a run on this or another layout (docs/reliability.md, "Resume on any layout"):
the driver's half. The ranks reshard model and optimizer (training/train_checkpoint.py);
here: the run's layout record, the verdict on a checkpoint before any rank reads it, and the
per-rank RNG states (restored, or re-derived when the ranks moved)."""

from __future__ import annotations

import numpy as np
import torch

from ..checkpoint.dist_ckpt import CheckpointError, checkpoint_layout, read_metadata, resume_note, same_ranks
from ..checkpoint.lora_meta import KEY as LORA_KEY
from ..checkpoint.lora_meta import check_lora_record
from ..data import check_fingerprint
from ..training.train_checkpoint import lora_record_of, run_layout


def driver_state(t) -> dict:
    """What the driver (``megatron_dapo.train.Trainer`` ``t``) owns of a run, saved with every
    checkpoint as trainer_state.pt: the step, the data order, the rollout manager's carry-over,
    the driver's RNGs; the ranks own model, optimizer and scheduler."""
    return {
        "step": t.step,
        "sampler": t.sampler.state_dict(),
        "rollout_manager": t.manager.state_dict(),
        "driver_rng": t.rng.getstate(),
        "torch_rng": torch.get_rng_state(),
        "numpy_rng": np.random.get_state(),
        "skipped_in_a_row": t.skipped_in_a_row,
        "num_syncs": t.hybrid.num_syncs,
        "probe_tokens": t._probe_tokens,
        "run_id": t.run_id,
        "data_fingerprint": t.data_fingerprint,
        "data_path": t.cfg.data.prompt_data,
        # --staleness-control ess: the lag and its hysteresis (the async queue is empty at a checkpoint)
        "staleness_controller": t.staleness.state_dict() if t.staleness is not None else None,
        "async_regenerated_steps": t.queue.regenerated if t.queue is not None else 0,
    }


def load_driver_state(t, s: dict) -> None:
    """:func:`driver_state` ``s`` back into ``t``; a DataError (one line) when the prompt data
    changed since the checkpoint and --allow-data-change is not given."""
    check_fingerprint(
        s.get("data_fingerprint"), t.data_fingerprint, t.cfg.data.allow_data_change, t.cfg.data.prompt_data
    )
    t.step = int(s["step"])
    t.sampler.load_state_dict(s["sampler"])
    t.manager.load_state_dict(s["rollout_manager"])
    t.rng.setstate(s["driver_rng"])
    torch.set_rng_state(s["torch_rng"])
    np.random.set_state(s["numpy_rng"])
    t.skipped_in_a_row = int(s["skipped_in_a_row"])
    t.hybrid.num_syncs = int(s["num_syncs"])
    t._probe_tokens = list(s.get("probe_tokens") or t._probe_tokens)
    saved = s.get("staleness_controller")
    if t.staleness is not None and saved is not None:
        t.staleness.load_state_dict(saved)
    if t.queue is not None:
        t.queue.regenerated = int(s.get("async_regenerated_steps", 0))


def layout(cfg, trainers) -> dict:
    """This run's layout, in the keys of a checkpoint's ``layout`` record."""
    p = cfg.parallel
    hosts = {i.get("node_ip") for i in trainers.infos if i.get("node_ip")}
    return run_layout(
        p.tensor_model_parallel_size,
        p.pipeline_model_parallel_size,
        p.context_parallel_size,
        trainers.world,
        len(hosts) or None,
        p.use_distributed_optimizer,
    )


def check_resume_layout(cfg, trainers, resume_dir: str) -> str:
    """The note on resuming ``resume_dir`` at this run's layout; a CheckpointError (one line)
    before any rank reads it when that is not supported (also: LoRA adapters of another rank,
    alpha, targets or base model, or adapters against a full model)."""
    meta = read_metadata(resume_dir)
    check_lora_record((meta.get("extra") or {}).get(LORA_KEY), lora_record_of(cfg), f"--load {resume_dir}")
    ok, note = resume_note(checkpoint_layout(meta), layout(cfg, trainers))
    if not ok:
        raise CheckpointError(f"--load {resume_dir}: cannot resume: {note}")
    return note


def restore_rank_rng(cfg, trainers, resume_dir: str, state: dict, step: int, note: str) -> None:
    """Per-rank RNG states: restored as saved when every rank keeps its place (the exact
    resume), else re-derived from (--seed, rank, step) on each rank, with one logged note."""
    saved = checkpoint_layout(read_metadata(resume_dir))
    rank_rng = list(state.get("rank_rng") or [])
    if len(rank_rng) == trainers.world and (saved is None or same_ranks(saved, layout(cfg, trainers))):
        trainers.set_rng_states(rank_rng)
        print(f"[resume] layout: {note}", flush=True)
    else:
        trainers.derive_rng_states(step)
        print(
            f"[resume] layout: {note} (the checkpoint's {len(rank_rng)} rank RNG state(s) belong to another "
            f"layout; each of the {trainers.world} rank(s) seeded from (--seed {cfg.optim.seed}, rank, "
            f"step {step}))",
            flush=True,
        )
