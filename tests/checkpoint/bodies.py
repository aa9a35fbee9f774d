"""Checkpoint test bodies: run on every gloo rank (module-level so they pickle by name)."""

from __future__ import annotations

import importlib.util
import json
import os

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tool(name: str):
    """The module of ``tools/<name>.py`` (tools/ is not a package)."""
    path = os.path.join(ROOT, "tools", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_tool_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def allow_children() -> None:
    """tests/harness.py's workers are daemonic; dist_checkpointing.save starts writer processes
    (a multiprocessing Manager and forked writers), which a daemonic process may not. The
    workers are killed by the pool, so letting them have children is safe here."""
    import multiprocessing

    multiprocessing.current_process()._config["daemon"] = False


def convert_hf(hf_dir: str, out_dir: str, dtype: str = "fp32", *extra: str) -> int:
    """tools/convert_hf_to_megatron.py's main, collectively on every rank."""
    allow_children()
    return tool("convert_hf_to_megatron").main(["--hf-checkpoint", hf_dir, "--save", out_dir, "--dtype", dtype, *extra])


def export_hf(ckpt_dir: str, out_dir: str, *extra: str) -> int:
    return tool("convert_megatron_to_hf").main(["--load", ckpt_dir, "--save", out_dir, *extra])


def _load(hf_config, ckpt_dir: str, tp: int, pp: int, dtype=torch.float32):
    from megatron_dapo.checkpoint.dist_ckpt import load_checkpoint
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.models import ModelBuildOptions, build_gpt_model

    init_parallel(tp, pp, seed=4321)  # a seed unlike the HF model's: weights must come from the checkpoint
    model, arch, _ = build_gpt_model(hf_config, ModelBuildOptions(params_dtype=dtype))
    meta, extra = load_checkpoint(model, ckpt_dir, arch)
    model.eval()
    return model, arch, meta


def _logits(model, arch, tokens: torch.Tensor):
    """Full-vocab logits on the last PP stage (None elsewhere)."""
    from megatron.core import parallel_state as ps

    from megatron_dapo.training.forward import forward_backward, gather_vocab

    got = []

    def loss_fn(batch, logits):
        got.append(gather_vocab(logits)[..., : arch.vocab_size].detach().float())
        return logits.sum() * 0, {}

    with torch.no_grad():
        forward_backward(model, [{"tokens": tokens}], loss_fn, forward_only=True)
    return got[0] if ps.is_pipeline_last_stage() else None


def checkpoint_logits(hf_config, ckpt_dir: str, tp: int, pp: int, tokens: torch.Tensor, dtype=torch.float32):
    """Load the checkpoint at TP x PP and return the logits of ``tokens`` (last stage, TP rank 0)."""
    from megatron.core import parallel_state as ps

    model, arch, _ = _load(hf_config, ckpt_dir, tp, pp, dtype)
    out = _logits(model, arch, tokens)
    if out is None or ps.get_tensor_model_parallel_rank() != 0:
        return None
    return out


def greedy(hf_config, ckpt_dir: str, prompt: list, n_new: int):
    """TP1 on every rank (DP replicas): logits of ``prompt`` and a greedy continuation (rank 0)."""
    import torch.distributed as dist

    model, arch, _ = _load(hf_config, ckpt_dir, 1, 1)
    if dist.get_rank() != 0:
        return None
    tokens = torch.tensor([prompt])
    first = _logits(model, arch, tokens)
    for _ in range(n_new):
        nxt = _logits(model, arch, tokens)[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, nxt], dim=1)
    return first, tokens[0, len(prompt) :].tolist()


def load_error(hf_config, ckpt_dir: str, tp: int = 1, pp: int = 1, extra=None):
    """The CheckpointError text of a load (the same on every rank), or None when it loads."""
    from megatron_dapo.checkpoint.dist_ckpt import CheckpointError, load_checkpoint
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.models import ModelBuildOptions, build_gpt_model

    init_parallel(tp, pp)
    model, arch, _ = build_gpt_model(hf_config, ModelBuildOptions())
    try:
        load_checkpoint(model, ckpt_dir, arch, extra_sharded_state=_extra_state(extra))
    except CheckpointError as e:
        return str(e)
    return None


def _extra_state(names):
    """A sharded state dict of small replicated tensors (what an optimizer adds)."""
    if not names:
        return None
    import torch.distributed as dist
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    return {
        "extra": {
            n: ShardedTensor.from_rank_offsets(n, torch.full((3,), float(i)), replica_id=dist.get_rank())
            for i, n in enumerate(names)
        }
    }


def save_with_extra(hf_dir: str, out_dir: str, names: list):
    """Convert-like save of the HF model at TP1 with extra sharded tensors; returns them loaded back."""
    from megatron_dapo.checkpoint import dist_ckpt
    from megatron_dapo.checkpoint.model_io import load_hf_weights
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.models import ModelBuildOptions, build_gpt_model

    allow_children()
    init_parallel(1, 1)
    model, arch, _ = build_gpt_model(hf_dir, ModelBuildOptions())
    load_hf_weights(model, arch, hf_dir, 128)
    dist_ckpt.save_checkpoint(model, out_dir, dist_ckpt.checkpoint_metadata(hf_dir, "fp32"), _extra_state(names))
    model2, arch, _ = build_gpt_model(hf_dir, ModelBuildOptions())
    _, extra = dist_ckpt.load_checkpoint(model2, out_dir, arch, _extra_state(names))
    same = all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))
    return same, {k: v.tolist() for k, v in extra["extra"].items()}


def edit_metadata(ckpt_dir: str, **arch_fields) -> None:
    """Rewrite fields of a checkpoint's metadata (simulates a mislabelled checkpoint)."""
    from megatron_dapo.checkpoint.dist_ckpt import METADATA_FILE

    path = os.path.join(ckpt_dir, METADATA_FILE)
    with open(path) as f:
        meta = json.load(f)
    meta["arch"].update(arch_fields)
    with open(path, "w") as f:
        json.dump(meta, f)


def convert_error(hf_dir: str, out_dir: str):
    """The error text of a conversion that must fail (on every rank), or None."""
    try:
        convert_hf(hf_dir, out_dir)
    except (ValueError, KeyError) as e:
        return str(e)
    return None


def export_error(ckpt_dir: str, out_dir: str, *extra: str):
    """The converter's CheckpointError itself (MEGATRON_DAPO_DEBUG: the error, not its one-line exit)."""
    import os

    from megatron_dapo.checkpoint.dist_ckpt import CheckpointError
    from megatron_dapo.errors import DEBUG_ENV

    old = os.environ.get(DEBUG_ENV)
    os.environ[DEBUG_ENV] = "1"
    try:
        export_hf(ckpt_dir, out_dir, *extra)
    except CheckpointError as e:
        return str(e)
    finally:
        if old is None:
            os.environ.pop(DEBUG_ENV, None)
        else:
            os.environ[DEBUG_ENV] = old
    return None


def save_and_list_children(hf_dir: str, out_dir: str) -> dict:
    """convert_hf (a synchronous dist_checkpointing.save on every rank), then what the save left:
    the type of megatron-core's write-results queue and this rank's live child processes."""
    import logging

    import psutil
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    seen = []

    class _Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    keep = _Keep()
    logging.getLogger("megatron.core").addHandler(keep)
    try:
        rc = convert_hf(hf_dir, out_dir)
    finally:
        logging.getLogger("megatron.core").removeHandler(keep)
    children = [" ".join(p.cmdline())[:200] for p in psutil.Process().children(recursive=True) if p.is_running()]
    queue = type(filesystem_async._results_queue).__module__
    return {"rc": rc, "queue": queue, "children": children, "logged": seen}
