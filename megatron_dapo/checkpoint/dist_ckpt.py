"""megatron-core ``dist_checkpointing`` (torch_dist) checkpoints of the model, plus our metadata.

A checkpoint directory holds what ``megatron.core.dist_checkpointing.save`` writes (``.metadata``,
``__*.distcp``, ``common.pt``, ``metadata.json``) and :data:`METADATA_FILE`, a JSON file with:

* ``format`` / ``format_version``: this layout (:data:`FORMAT`, :data:`FORMAT_VERSION`);
* ``arch``: ``ModelArch.to_dict()`` of the model; ``hf_config_hash``: ``hf_config_hash`` of the
  source HF config; ``hf_config``: the raw HF config (so the HF exporter can rebuild config.json);
* ``dtype``: ``"fp32"`` or ``"bf16"``; ``padded_vocab_size``; ``saved_with`` (TP/PP/world);
* ``extra``: anything the caller adds (the trainer's iteration, ...).

Tensors are stored under megatron-core's global sharded keys, so a checkpoint written at one
TP/PP layout loads at any other (dist_checkpointing reshards on load). Loading is always
validated: the metadata against the model's architecture (every mismatching field named with
both values), then the tensors against the checkpoint (missing or unexpected tensors listed),
and the model's ``load_state_dict`` is strict. There is no partial load.

The trainer adds its optimizer state to the same checkpoint through ``extra_sharded_state``
(a sharded state dict, or a callable that gets the model's sharded state dict and returns one,
as ``optimizer.sharded_state_dict(model_sharded_state_dict)`` needs).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Callable, Optional, Union

import torch

from ..models.hf_config import ModelArch, hf_config_hash, load_hf_config, parse_hf_config

FORMAT = "megatron_dapo/torch_dist"
FORMAT_VERSION = 1
METADATA_FILE = "megatron_dapo_checkpoint.json"
MODEL_KEY = "model"
#: what a trainer checkpoint stores beside the model (``training.train_checkpoint``): loading the
#: model alone from it leaves these unread, which is not a mismatch
TRAINER_STATE_PREFIXES = ("optimizer.", "scheduler")

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Architecture fields whose mismatch is an error (they change shapes or the math).
CHECKED_FIELDS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "rope_theta",
    "tie_word_embeddings",
    "num_layers",
    "ffn_hidden_size",
    "head_dim",
    "qkv_bias",
    "norm_eps",
)
# HF spelling of the fields, for messages.
_HF_NAMES = {
    "model_type": "model_type (architecture)",
    "num_query_groups": "num_query_groups (HF num_key_value_heads)",
    "num_layers": "num_layers (HF num_hidden_layers)",
    "ffn_hidden_size": "ffn_hidden_size (HF intermediate_size)",
    "norm_eps": "norm_eps (HF rms_norm_eps)",
}

logger = logging.getLogger(__name__)

ExtraState = Union[None, dict, Callable[[dict], dict]]


class CheckpointError(ValueError):
    """A checkpoint that does not match the model it is loaded into (never a partial load)."""


# ---------------------------------------------------------------- metadata

def dtype_name(dtype) -> str:
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(_DTYPES)}")
        return dtype
    for k, v in _DTYPES.items():
        if v == dtype:
            return k
    raise ValueError(f"unsupported dtype {dtype}")


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[dtype_name(name)]


def checkpoint_metadata(hf_config, dtype="fp32", extra: Optional[dict] = None) -> dict:
    """The metadata of a checkpoint of the model described by ``hf_config`` (dir, path or dict)."""
    cfg = load_hf_config(hf_config)
    arch = parse_hf_config(cfg)
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "arch": arch.to_dict(),
        "hf_config_hash": hf_config_hash(cfg),
        "hf_config": cfg,
        "dtype": dtype_name(dtype),
        "extra": dict(extra or {}),
    }


def read_metadata(directory) -> dict:
    """The metadata of the checkpoint in ``directory`` (error when it is not one of ours)."""
    path = os.path.join(os.fspath(directory), METADATA_FILE)
    if not os.path.exists(path):
        if os.path.exists(os.path.join(os.fspath(directory), "config.json")):
            hint = " (this looks like an HF checkpoint: convert it with tools/convert_hf_to_megatron.py)"
        else:
            hint = ""
        raise CheckpointError(f"{directory}: not a megatron-dapo torch_dist checkpoint, {METADATA_FILE} missing{hint}")
    with open(path) as f:
        meta = json.load(f)
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format={meta.get('format')!r}, expected {FORMAT!r}")
    if int(meta.get("format_version", -1)) > FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: format_version={meta.get('format_version')} is newer than this code's {FORMAT_VERSION}"
        )
    return meta


def metadata_arch(meta: dict) -> ModelArch:
    fields = {k: v for k, v in meta["arch"].items() if k in ModelArch.__dataclass_fields__}
    return ModelArch(**fields)


def check_metadata(meta: dict, arch: ModelArch, where: str = "checkpoint") -> None:
    """Error naming every architecture field where the checkpoint and the model differ."""
    ck = meta["arch"]
    mine = arch.to_dict()
    bad = []
    for field in CHECKED_FIELDS:
        a, b = ck.get(field), mine.get(field)
        if field in ("rope_theta", "norm_eps") and a is not None and b is not None:
            same = float(a) == float(b)
        else:
            same = a == b
        if not same:
            bad.append(f"{_HF_NAMES.get(field, field)}: {where} has {a!r}, model has {b!r}")
    if bad:
        raise CheckpointError(f"{where} does not match the model's config: " + "; ".join(bad))
    for field in ("max_position_embeddings", "bos_token_id", "eos_token_id"):
        if ck.get(field) != mine.get(field):
            logger.warning("%s: %s differs (checkpoint %r, model %r)", where, field, ck.get(field), mine.get(field))


# ---------------------------------------------------------------- save / load

def _chunks(model) -> list:
    return list(model) if isinstance(model, (list, tuple)) else [model]


def _model_sharded_state_dict(model) -> dict:
    chunks = _chunks(model)
    if len(chunks) == 1:
        return {MODEL_KEY: chunks[0].sharded_state_dict()}
    return {f"{MODEL_KEY}{i}": c.sharded_state_dict() for i, c in enumerate(chunks)}


def _with_extra(model_ssd: dict, extra_sharded_state: ExtraState) -> dict:
    if extra_sharded_state is None:
        return dict(model_ssd)
    extra = extra_sharded_state(model_ssd) if callable(extra_sharded_state) else extra_sharded_state
    clash = set(extra) & set(model_ssd)
    if clash:
        raise ValueError(f"extra_sharded_state uses reserved keys {sorted(clash)}")
    out = dict(model_ssd)
    out.update(extra)
    return out


def _embedding_rows(model) -> Optional[int]:
    from .model_io import unwrap

    for c in _chunks(model):
        inner = unwrap(c)
        emb = getattr(inner, "embedding", None)
        if emb is not None:
            return int(emb.word_embeddings.num_embeddings)
        out = getattr(inner, "output_layer", None)
        if out is not None and getattr(out, "weight", None) is not None:
            from megatron.core import parallel_state as ps

            return int(out.weight.shape[0]) * ps.get_tensor_model_parallel_world_size()
    return None


def _padded_vocab(model) -> int:
    """The global padded vocabulary of the model (all ranks agree; a stage without
    embedding/output reports -1 and takes the max)."""
    import torch.distributed as dist

    rows = _embedding_rows(model)
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return int(rows if rows is not None else -1)
    from ..distributed import collective_device

    # On the default group's device: a host tensor handed to NCCL raises at the first save.
    t = torch.tensor([rows if rows is not None else -1], dtype=torch.long, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _walk(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _walk(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _walk(v)
    else:
        yield x


def _own_storage_release_params(model, ssd: dict) -> None:
    """Build the sharded tensors now and give those that are views of a parameter (the two
    halves of the gated ``linear_fc1``) their own storage, freeing the parameter.

    dist_checkpointing's writer clones every view before writing anything, which would hold
    all fc1 weights twice at once (~55% of a Qwen2.5-32B); here one parameter at a time is
    duplicated instead. The model's freed parameters are empty afterwards.
    """
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factories

    from .model_io import unwrap

    apply_factories(ssd)
    params: dict[int, list] = {}
    for c in _chunks(model):
        for p in unwrap(c).parameters():
            params.setdefault(p.untyped_storage().data_ptr(), []).append(p)
    views: dict[int, list] = {}
    for sh in _walk(ssd):
        if isinstance(sh, ShardedTensor) and isinstance(sh.data, torch.Tensor):
            t = sh.data
            if t.untyped_storage().nbytes() != t.numel() * t.element_size():
                views.setdefault(t.untyped_storage().data_ptr(), []).append(sh)
    for ptr, shs in views.items():
        for sh in shs:
            sh.data = sh.data.clone()
        for p in params.get(ptr, []):
            p.data = torch.empty(0, dtype=p.dtype)


def save_checkpoint(
    model,
    directory,
    metadata: dict,
    extra_sharded_state: ExtraState = None,
    release_model_memory: bool = False,
) -> None:
    """Save ``model`` (a module or a list of virtual-PP chunks) as a torch_dist checkpoint.

    Collective over the default process group: every rank calls it with its own shard of the
    model. ``metadata`` comes from :func:`checkpoint_metadata`; ``padded_vocab_size`` and
    ``saved_with`` are filled in here. ``extra_sharded_state`` (a sharded state dict, or a
    callable getting the model's sharded state dict) is saved alongside, under its own keys.
    ``release_model_memory=True`` (one-shot converters) bounds the writer's extra memory to
    one parameter but leaves the model unusable (see :func:`_own_storage_release_params`).
    """
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state as ps

    directory = os.fspath(directory)  # (CPU patches: applied by distributed.init_distributed)
    rank = dist.get_rank()
    if rank == 0:
        os.makedirs(directory, exist_ok=True)
    dist.barrier()
    meta = dict(metadata)
    meta["padded_vocab_size"] = _padded_vocab(model)
    meta["saved_with"] = {
        "tensor_model_parallel_size": ps.get_tensor_model_parallel_world_size(),
        "pipeline_model_parallel_size": ps.get_pipeline_model_parallel_world_size(),
        "world_size": dist.get_world_size(),
    }
    ssd = _with_extra(_model_sharded_state_dict(model), extra_sharded_state)
    if release_model_memory:
        _own_storage_release_params(model, ssd)
    dist_checkpointing.save(ssd, directory)
    if rank == 0:
        tmp = os.path.join(directory, METADATA_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(meta, f, indent=1, sort_keys=True, default=str)
        os.replace(tmp, os.path.join(directory, METADATA_FILE))  # written last: marks it complete
    dist.barrier()


def _raise_mismatch(directory, missing: set, unexpected: set) -> None:
    """Raise on every rank when any rank saw a tensor mismatch (no rank may go on to load)."""
    import torch.distributed as dist

    per_rank = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, sorted(unexpected))
    not_in_ckpt = sorted({k for r in per_rank for k in r})
    missing = sorted(missing)
    if not_in_ckpt or missing:
        def show(keys):
            return f"{keys[:30]}{' ...' if len(keys) > 30 else ''} ({len(keys)})"

        parts = []
        if not_in_ckpt:
            parts.append(f"tensors the model needs but the checkpoint lacks: {show(not_in_ckpt)}")
        if missing:
            parts.append(f"tensors in the checkpoint that the model does not have: {show(missing)}")
        raise CheckpointError(f"{directory}: checkpoint tensors do not match the model; " + "; ".join(parts))


_VOCAB_KEYS = ("embedding.word_embeddings.weight", "output_layer.weight")


def _request_full_vocab_tensors(model_ssd: dict, ckpt_rows: int) -> list[tuple[str, str]]:
    """The checkpoint pads the vocabulary differently from the model (another TP size or
    ``make_vocab_size_divisible_by``): request the embedding/output tensors whole, as replicas,
    and cut this rank's shard after loading (:func:`_vocab_shard`). Returns their paths."""
    import torch.distributed as dist
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    found = []
    for top, sd in model_ssd.items():
        for name, sh in sd.items():
            if name in _VOCAB_KEYS and isinstance(sh, ShardedTensor):
                found.append((top, name, sh))
    rank = dist.get_rank()
    per_rank = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, sorted({sh.key for _, _, sh in found}))
    first = {}
    for r, keys in enumerate(per_rank):
        for k in keys:
            first.setdefault(k, r)
    out, main_taken = [], set()
    for top, name, sh in found:
        main = first[sh.key] == rank and sh.key not in main_taken
        main_taken.add(sh.key)
        buf = torch.empty((ckpt_rows,) + tuple(sh.global_shape[1:]), dtype=sh.data.dtype)
        model_ssd[top][name] = ShardedTensor.from_rank_offsets(
            sh.key, buf, replica_id=0 if main else (rank + 1)
        )
        out.append((top, name))
    return out


def _vocab_shard(full: torch.Tensor, vocab_size: int, padded: int) -> torch.Tensor:
    """This TP rank's rows of the model-padded vocabulary from a differently padded full tensor."""
    from megatron.core import parallel_state as ps

    tp, r = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    rows = padded // tp
    out = full.new_zeros((rows,) + tuple(full.shape[1:]))
    lo, hi = r * rows, min((r + 1) * rows, vocab_size)
    if hi > lo:
        out[: hi - lo] = full[lo:hi]
    return out


def load_checkpoint(
    model,
    directory,
    arch: ModelArch,
    extra_sharded_state: ExtraState = None,
) -> tuple[dict, dict]:
    """Load a torch_dist checkpoint into ``model`` at the current TP/PP (resharding as needed).

    Collective over the default process group. ``arch`` is the architecture the model was
    built from; it is checked against the checkpoint's metadata first. Returns
    ``(metadata, extra_state)``, where ``extra_state`` is the loaded counterpart of
    ``extra_sharded_state`` (plain tensors/objects under the caller's keys; ``{}`` if none).
    """
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.validation import StrictHandling

    from .model_io import unwrap

    directory = os.fspath(directory)
    meta = read_metadata(directory)
    check_metadata(meta, arch, where=f"checkpoint {directory}")
    want_vocab = _padded_vocab(model)
    have_vocab = int(meta.get("padded_vocab_size") or want_vocab)
    model_ssd = _model_sharded_state_dict(model)
    repad = []
    if want_vocab > 0 and have_vocab != want_vocab:
        repad = _request_full_vocab_tensors(model_ssd, have_vocab)
    ssd = _with_extra(model_ssd, extra_sharded_state)
    loaded, missing, unexpected = dist_checkpointing.load(ssd, directory, strict=StrictHandling.RETURN_ALL)
    if extra_sharded_state is None:  # the model alone (a converter, --pretrained-checkpoint, eval): a trainer
        missing = {k for k in missing if not str(k).startswith(TRAINER_STATE_PREFIXES)}  # checkpoint holds more
    _raise_mismatch(directory, missing, unexpected)
    for top, name in repad:
        loaded[top][name] = _vocab_shard(loaded[top][name], arch.vocab_size, want_vocab)
    chunks = _chunks(model)
    keys = [MODEL_KEY] if len(chunks) == 1 else [f"{MODEL_KEY}{i}" for i in range(len(chunks))]
    for key, chunk in zip(keys, chunks):
        unwrap(chunk).load_state_dict(loaded.pop(key), strict=True)
    return meta, loaded


def checkpoint_tensor_shapes(directory) -> dict[str, tuple]:
    """Global shapes of the sharded tensors stored in a checkpoint (no data read)."""
    from megatron.core import dist_checkpointing

    md = dist_checkpointing.load_tensors_metadata(os.fspath(directory))
    return {k: tuple(v.global_shape) for k, v in md.items() if hasattr(v, "global_shape")}


def is_checkpoint(directory) -> bool:
    return os.path.exists(os.path.join(os.fspath(directory), METADATA_FILE)) and os.path.exists(
        os.path.join(os.fspath(directory), "metadata.json")
    )


__all__ = [
    "CHECKED_FIELDS",
    "CheckpointError",
    "FORMAT",
    "FORMAT_VERSION",
    "METADATA_FILE",
    "check_metadata",
    "checkpoint_metadata",
    "checkpoint_tensor_shapes",
    "dtype_name",
    "is_checkpoint",
    "load_checkpoint",
    "metadata_arch",
    "read_metadata",
    "save_checkpoint",
    "torch_dtype",
]

