"""Preflight checks of the checkpoints and the disk: ``--hf-checkpoint``'s weights,
``--pretrained-checkpoint`` / ``--ref-load`` (torch_dist of this model), ``--load`` (its saved
layout and data fingerprint), and the free space for ``--save``'s checkpoints and HF exports.

Each returns :class:`~.preflight_result.Check` lines; launch/preflight.py runs them.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import List, Optional, Tuple

from ..checkpoint import dist_ckpt, hf_check, manifest
from ..checkpoint.dist_ckpt import CheckpointError, check_metadata, read_metadata
from ..checkpoint.lora_meta import KEY as LORA_KEY
from ..checkpoint.lora_meta import check_lora_record
from ..config.validate import data_parallel_size, lora_targets, world_size
from ..data.dataset import DataError, check_fingerprint
from ..errors import one_line
from ..models.hf_config import lora_parameters
from ..outputs import checkpoint_dirs as checkpoints
from ..training.train_checkpoint import lora_record_of, run_layout
from .preflight_result import FAIL, OK, SHAPE_ONLY_FILE, WARN, Check, _strip

GB = 1e9


def _params(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def _bytes(n: float) -> str:
    return f"{n / GB:.1f} GB" if n >= GB else f"{n / 1e6:.1f} MB"


def _nearest_existing(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


# ----------------------------------------------------------------------------- checkpoints


def _hf_weight_files(hf: str) -> Tuple[List[str], List[str], Optional[str]]:
    """(present weight files, missing shard files, problem) of an HF directory."""
    index = os.path.join(hf, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            return [], [], f"{index} cannot be read ({type(e).__name__}: {one_line(e)})"
        present = [f for f in files if os.path.isfile(os.path.join(hf, f))]
        return present, [f for f in files if f not in present], None
    if os.path.isfile(os.path.join(hf, "model.safetensors")):
        return ["model.safetensors"], [], None
    return [], [], None


def check_hf_checkpoint(cfg, arch, dry_run: bool) -> Check:
    """``--hf-checkpoint``: the shape (already parsed into ``arch``) and, when they are the
    trainer's initial weights (no ``--load`` / ``--pretrained-checkpoint``), the weight files."""
    m, hf = cfg.model, cfg.model.hf_checkpoint
    shape = f"config.json: {arch.model_type} {_params(arch.num_parameters)} params, vocab_size {arch.vocab_size:,}"
    present, missing, problem = _hf_weight_files(hf)
    size = sum(os.path.getsize(os.path.join(hf, f)) for f in present)
    # a LoRA checkpoint (--load) holds the adapters: the frozen base still comes from here
    load_has_base = cfg.checkpoint.load and not m.lora_rank
    weights_from = "--load" if load_has_base else "--pretrained-checkpoint" if m.pretrained_checkpoint else None
    if weights_from:
        return Check("hf-checkpoint", OK, hf, f"{shape}; the initial weights come from {weights_from}")
    if problem or missing:
        why = problem or (
            f"model.safetensors.index.json names {len(missing)} missing shard file(s) "
            f"({', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''})"
        )
        return Check("hf-checkpoint", FAIL, hf, f"--hf-checkpoint: {why}; copy the complete checkpoint")
    if not present:
        if dry_run and os.path.exists(os.path.join(hf, SHAPE_ONLY_FILE)):
            return Check(
                "hf-checkpoint",
                WARN,
                hf,
                f"{shape}; a model shape only ({SHAPE_ONLY_FILE}), no weights: a "
                "real run needs --hf-checkpoint with the weights (or --pretrained-checkpoint / --load)",
            )
        return Check(
            "hf-checkpoint",
            FAIL,
            hf,
            "--hf-checkpoint: no model.safetensors or "
            "model.safetensors.index.json, and the trainer's initial weights come from here (no --load or "
            "--pretrained-checkpoint); give the HF checkpoint directory with its weights",
        )
    try:  # the headers only: whole files, float tensors, the names and shapes config.json gives
        hf_check.check_hf_checkpoint(hf, arch)
    except CheckpointError as e:
        return Check("hf-checkpoint", FAIL, hf, one_line(e))
    return Check(
        "hf-checkpoint", OK, hf, f"{shape}; initial weights: {len(present)} safetensors file(s), {_bytes(size)}"
    )


def _torch_dist_meta(flag: str, path: str, arch) -> Tuple[Optional[dict], Optional[str]]:
    """(metadata, None) of a megatron-dapo torch_dist checkpoint matching ``arch``, or (None, why)."""
    if not os.path.exists(path):
        return None, f"{flag}: not found"
    if not os.path.isdir(path):
        return None, f"{flag}: not a directory (a torch_dist checkpoint is a directory)"
    try:
        meta = read_metadata(path)
        check_metadata(meta, arch, where="the checkpoint")
    except CheckpointError as e:
        msg = one_line(e)
        return None, f"{flag}: {_strip(msg, path)}"
    except (OSError, ValueError, KeyError, TypeError) as e:  # a truncated or foreign metadata file
        return None, f"{flag}: its checkpoint metadata cannot be read ({type(e).__name__}: {one_line(e)})"
    verify = getattr(dist_ckpt, "verify_checkpoint_files", None)  # .metadata, shard sizes (when available)
    if verify is not None:
        try:
            verify(path)
        except CheckpointError as e:
            return None, f"{flag}: {_strip(one_line(e), path)}"
    damaged = manifest.verify(path)  # the digests recorded at save (none: written before they existed)
    if damaged:
        return None, f"{flag}: {damaged}; {dist_ckpt.FIX_DAMAGED}"
    if not os.path.exists(os.path.join(path, "metadata.json")) or not any(
        n.endswith(".distcp") for n in os.listdir(path)
    ):
        return None, (
            f"{flag}: metadata present but no torch_dist tensor files (metadata.json, *.distcp): an incomplete copy"
        )
    return meta, None


_LONG_KEYS = {
    "tensor_model_parallel_size": "tp",
    "pipeline_model_parallel_size": "pp",
    "context_parallel_size": "cp",
    "data_parallel_size": "dp",
}


def saved_layout(meta: dict) -> dict:
    """A checkpoint's layout as ``{"tp", "pp", "cp", "dp", "world_size", ...}``: its ``layout``
    record, else the older ``saved_with`` (TP, PP, world size); ``{}`` when neither is there."""
    lay = meta.get("layout") or meta.get("saved_with") or {}
    return {_LONG_KEYS.get(k, k): v for k, v in lay.items() if v is not None}


def _layout_str(lay: dict) -> str:
    text = " x ".join(f"{k.upper()} {lay[k]}" for k in ("tp", "pp", "cp", "dp") if k in lay) or "an unrecorded layout"
    extra = [f"world {lay['world_size']}"] if "world_size" in lay else []
    if "nodes" in lay:
        extra.append(f"{lay['nodes']} node{'s' if lay['nodes'] != 1 else ''}")
    return text + (f" ({', '.join(extra)})" if extra else "")


def current_layout(cfg) -> dict:
    """This run's layout, in the keys of a checkpoint's ``layout`` record (checkpoint/dist_ckpt.py)."""
    p = cfg.parallel
    return {
        "tp": p.tensor_model_parallel_size,
        "pp": p.pipeline_model_parallel_size,
        "cp": p.context_parallel_size,
        "dp": data_parallel_size(cfg),
        "world_size": world_size(cfg),
        "nodes": p.nnodes,
        "distributed_optimizer": bool(p.use_distributed_optimizer),
    }


def check_torch_dist(cfg, arch, flag: str, path: str) -> Check:
    """``--pretrained-checkpoint`` or ``--ref-load``: a torch_dist checkpoint of this model."""
    name = flag.lstrip("-")
    meta, why = _torch_dist_meta(flag, path, arch)
    if why:
        return Check(
            name,
            FAIL,
            path,
            why
            + (
                "; convert an HF checkpoint with tools/convert_hf_to_megatron.py"
                if "not a megatron-dapo" not in why
                else ""
            ),
        )
    detail = (
        f"torch_dist, {meta.get('dtype', '?')}, saved at {_layout_str(saved_layout(meta))}, architecture matches "
        "the model"
    )
    if flag == "--ref-load" and not cfg.algo.kl_coef > 0:
        return Check(name, WARN, path, detail + "; unused: --kl-coef is 0 (no reference model)")
    return Check(name, OK, path, detail)


def _state_problem(e: Exception) -> str:
    if isinstance(e, ValueError):  # manifest.load_state's one line
        return one_line(e)
    return f"{checkpoints.STATE_FILE} cannot be read ({type(e).__name__})"


def check_load(cfg, arch, dataset=None, dry_run: bool = True) -> Check:
    """``--load``: the resumed checkpoint (metadata against the model, its saved layout against
    this run's) and, with the prompt data loaded, the data fingerprint it recorded. The node
    count is compared in the dry run only (the real run compares the hosts its ranks got)."""
    load = cfg.checkpoint.load
    if not os.path.exists(load):
        return Check("load", FAIL, load, "--load: not found")
    resolved = checkpoints.resolve(load)
    if resolved is None:
        return Check(
            "load",
            FAIL,
            load,
            f"--load: no checkpoint found (no '{checkpoints.LATEST}' pointer or "
            f"{checkpoints.STATE_FILE}); give a run's --save directory or one step_* in it",
        )
    damaged = manifest.verify(resolved)
    if damaged:
        return Check(
            "load",
            FAIL,
            load,
            f"--load: {os.path.basename(resolved)}/{damaged}; resume from an earlier checkpoint of the run "
            "(--load <its --save>/step_...) or restore the file",
        )
    meta, why = _torch_dist_meta("--load", resolved, arch)
    if why:
        return Check("load", FAIL, load, why)
    try:  # LoRA: the same adapters (rank, alpha, targets) on the same base model, or none on both sides
        check_lora_record((meta.get("extra") or {}).get(LORA_KEY), lora_record_of(cfg), "--load")
    except CheckpointError as e:
        return Check("load", FAIL, load, _strip(one_line(e), load))
    saved = saved_layout(meta)
    new = current_layout(cfg)
    status = OK
    note_fn = getattr(dist_ckpt, "resume_note", None)  # the checkpoint module's verdict on a layout change
    if note_fn is not None:
        record = dist_ckpt.checkpoint_layout(meta) if hasattr(dist_ckpt, "checkpoint_layout") else (saved or None)
        p = cfg.parallel
        new = run_layout(
            p.tensor_model_parallel_size,
            p.pipeline_model_parallel_size,
            p.context_parallel_size,
            world_size(cfg),
            p.nnodes if dry_run else None,
            p.use_distributed_optimizer,
        )
        try:
            verdict = note_fn(record, new)
        except dist_ckpt.CheckpointError as e:
            verdict = (False, one_line(e))
        ok, note = verdict if isinstance(verdict, tuple) else (True, str(verdict))
        if not ok:
            return Check(
                "load",
                FAIL,
                load,
                f"--load ({os.path.basename(resolved)}): saved at {_layout_str(saved)}, "
                f"cannot resume at this layout: {note}",
            )
        layout = f"saved at {_layout_str(saved)}; {note}"
    else:
        same = all(saved[k] == new[k] for k in ("tp", "pp", "cp", "dp", "world_size") if k in saved)
        if not saved:
            layout = "saved layout not recorded"
        elif same:
            layout = f"saved at {_layout_str(saved)}, resumed at the same layout"
        else:
            status = WARN
            layout = (
                f"saved at {_layout_str(saved)}, resumed at {_layout_str(new)}: resharding the model and "
                "optimizer is left to dist_checkpointing (resuming at another layout is not tested here)"
            )
    detail = f"{os.path.basename(resolved)}: torch_dist, architecture matches the model, {layout}"
    if dataset is not None:
        try:
            state = manifest.load_state(os.path.join(resolved, checkpoints.STATE_FILE))
            check_fingerprint(
                state.get("data_fingerprint"), dataset.fingerprint, cfg.data.allow_data_change, cfg.data.prompt_data
            )
        except DataError as e:
            pd = cfg.data.prompt_data
            return Check("load", FAIL, load, f"--prompt-data {pd}: {_strip(one_line(e), pd)}")
        except Exception as e:  # noqa: BLE001 - a truncated state file (prepare_outputs names it too)
            return Check(
                "load", FAIL, load, f"--load: {os.path.basename(resolved)}/{_state_problem(e)}; give another checkpoint"
            )
        detail += f"; step {state.get('step')}, the same prompt data"
    return Check("load", status, load, f"{detail}; checksums: {manifest.describe(resolved)}")


# ----------------------------------------------------------------------------- disk


def checkpoint_bytes(arch, bf16: bool, lora: Optional[Tuple[int, tuple]] = None) -> Tuple[float, str]:
    """Estimated size of one trainer checkpoint (model + optimizer state) and how it is made up:
    weights in the parameter dtype, Adam m and v in fp32, and fp32 main parameters with bf16.
    ``lora`` (rank, targets): the adapters and their optimizer state only (the base is not saved)."""
    per = (2 + 4 + 8) if bf16 else (4 + 8)
    how = "bf16 weights 2 + fp32 main params 4 + Adam m, v 8" if bf16 else "fp32 weights 4 + Adam m, v 8"
    if lora:
        n = lora_parameters(arch, *lora)
        return n * per, f"{_params(n)} LoRA adapter params x {per} B ({how}; the frozen base is not saved)"
    return arch.num_parameters * per, f"{_params(arch.num_parameters)} params x {per} B ({how})"


def lora_of(cfg) -> Optional[Tuple[int, tuple]]:
    """(rank, targets) of a LoRA run, None otherwise (for :func:`checkpoint_bytes`)."""
    return (cfg.model.lora_rank, lora_targets(cfg)) if cfg.model.lora_rank else None


def check_disk(cfg, arch) -> List[Check]:
    """Free space for the checkpoints of ``--save`` (fail when one does not fit a filesystem that
    is known to be the run's: ``--save`` or its parent exists) and for HF exports (warn)."""
    out = []
    ck = cfg.checkpoint
    if ck.save:
        size, how = checkpoint_bytes(arch, cfg.model.bf16, lora_of(cfg))
        where = _nearest_existing(ck.save)
        save = os.path.abspath(ck.save)
        if not os.path.isdir(where):
            return [Check("disk", WARN, ck.save, f"not checked: {where} is not a directory (the outputs check)")]
        known = where in (save, os.path.dirname(save))
        free = shutil.disk_usage(where).free
        have = len(checkpoints.steps(ck.save)) if os.path.isdir(ck.save) else 0
        peak = max(1, ck.keep_last + 1 - have)
        detail = (
            f"one checkpoint ~{_bytes(size)} ({how}); --keep-last {ck.keep_last} holds up to "
            f"{ck.keep_last + 1} during a save; free {_bytes(free)} on {where}"
            + ("" if known else " (--save and its parent do not exist yet)")
        )
        if free < size:
            fix = "free space there or choose another --save"
            if known:
                out.append(Check("disk", FAIL, ck.save, f"--save: {detail}: the first save cannot fit; {fix}"))
            else:
                out.append(
                    Check(
                        "disk",
                        WARN,
                        ck.save,
                        f"{detail}: a checkpoint would not fit there, if that is the "
                        f"filesystem the run writes to; {fix}",
                    )
                )
        elif free < peak * size:
            out.append(
                Check(
                    "disk",
                    WARN,
                    ck.save,
                    f"{detail}: {peak} more checkpoint(s) do not fit; lower --keep-last or free space",
                )
            )
        else:
            out.append(Check("disk", OK, ck.save, detail))
    n = (cfg.run.num_rollout_steps // ck.save_hf_interval if ck.save_hf_interval else 0) + (
        1 if ck.save_hf_final else 0
    )
    if n:
        export = arch.num_parameters * (2 if cfg.model.bf16 else 4)
        where = _nearest_existing(cfg.logging.run_dir)
        free = shutil.disk_usage(where).free
        detail = (
            f"{n} HF export(s) of ~{_bytes(export)} each (--save-hf-interval / --save-hf-final, kept, not "
            f"rotated) = {_bytes(n * export)}; free {_bytes(free)} on {where}"
        )
        if free < n * export:
            out.append(
                Check(
                    "disk",
                    WARN,
                    cfg.logging.run_dir,
                    detail + ": they do not all fit (an export comes "
                    "after its step's checkpoint); free space or raise --save-hf-interval",
                )
            )
        else:
            out.append(Check("disk", OK, cfg.logging.run_dir, detail))
    return out


__all__ = ["check_disk", "check_hf_checkpoint", "check_load", "check_torch_dist", "checkpoint_bytes", "current_layout"]
