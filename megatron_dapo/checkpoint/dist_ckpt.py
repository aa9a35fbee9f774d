"""megatron-core ``dist_checkpointing`` (torch_dist) checkpoints of the model, plus our metadata.

A checkpoint directory holds what ``megatron.core.dist_checkpointing.save`` writes (``.metadata``,
``__*.distcp``, ``metadata.json``, and up to megatron-core 0.18 ``common.pt``: from 0.19 the
non-tensor state is a sharded object inside the ``.distcp`` files, :data:`INLINE_COMMON_STATE_KEY`)
and :data:`METADATA_FILE`, a JSON file with:

* ``format`` / ``format_version``: this layout (:data:`FORMAT`, :data:`FORMAT_VERSION`);
* ``arch``: ``ModelArch.to_dict()`` of the model; ``hf_config_hash``: ``hf_config_hash`` of the
  source HF config; ``hf_config``: the raw HF config (so the HF exporter can rebuild config.json);
* ``dtype``: ``"fp32"`` or ``"bf16"``; ``padded_vocab_size``; ``saved_with`` (TP/PP/world);
* ``layout``: the layout that wrote it (:func:`current_layout`: TP, PP, CP, DP, world size,
  nodes; the trainer adds whether the distributed optimizer was on and its state's format);
* ``megatron_core_version``: the megatron-core release that wrote it (a checkpoint in 0.19's
  layout is refused in one line by an older release, :func:`verify_checkpoint_files`);
* ``extra``: anything the caller adds (the trainer's iteration, ...).

Tensors are stored under megatron-core's global sharded keys, so a checkpoint written at one
TP/PP/CP/DP layout loads at any other (dist_checkpointing reshards on load; the vocabulary rows
of the embedding, the output layer and their optimizer state are re-padded when the padded
vocabulary differs, :func:`_request_full_vocab_tensors`). Before any tensor is read the files
are checked (:func:`verify_checkpoint_files`: a missing ``.metadata``, a truncated ``.distcp``
is one :class:`CheckpointError` naming the directory and what to do). Loading is always
validated: the metadata against the model's architecture (every mismatching field named with
both values), then the tensors against the checkpoint (missing or unexpected tensors listed),
and the model's ``load_state_dict`` is strict. There is no partial load.

The trainer adds its optimizer state to the same checkpoint through ``extra_sharded_state``
(a sharded state dict, or a callable that gets the model's sharded state dict and returns one,
as ``optimizer.sharded_state_dict(model_sharded_state_dict)`` needs).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from typing import Callable, Optional, Union

import torch

from .. import platform, platform_imports
from ..distributed import collective_device
from ..errors import CheckpointError
from ..models.hf_config import ModelArch, hf_config_hash, load_hf_config, parse_hf_config
from . import manifest, mapping
from .model_io import unwrap

FORMAT = "megatron_dapo/torch_dist"
FORMAT_VERSION = 1
METADATA_FILE = "megatron_dapo_checkpoint.json"
MODEL_KEY = "model"
#: Where megatron-core >= 0.19 keeps the common (non-tensor) state: one sharded object
#: ``common_state`` in the ``.distcp`` files, listed in ``.metadata``, instead of ``common.pt``.
INLINE_COMMON_STATE_KEY = "common_state/shard_0_1"
#: The first release that writes and reads that layout (0.17 and 0.18 still write ``common.pt``;
#: 0.19 reads both).
INLINE_COMMON_STATE_SINCE = (0, 19)
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
    # Qwen3 q/k norms and the mixture of experts (a checkpoint of another expert count, width
    # or routing is another model; the expert LAYOUT, EP x ETP, is resharded on load)
    "qk_layernorm",
    "num_experts",
    "moe_ffn_hidden_size",
    "moe_router_topk",
    "moe_norm_topk_prob",
)
# HF spelling of the fields, for messages.
_HF_NAMES = {
    "model_type": "model_type (architecture)",
    "num_query_groups": "num_query_groups (HF num_key_value_heads)",
    "num_layers": "num_layers (HF num_hidden_layers)",
    "ffn_hidden_size": "ffn_hidden_size (HF intermediate_size)",
    "norm_eps": "norm_eps (HF rms_norm_eps)",
    "qk_layernorm": "qk_layernorm (HF q_norm / k_norm)",
    "num_experts": "num_experts (HF num_experts)",
    "moe_ffn_hidden_size": "moe_ffn_hidden_size (HF moe_intermediate_size)",
    "moe_router_topk": "moe_router_topk (HF num_experts_per_tok)",
    "moe_norm_topk_prob": "moe_norm_topk_prob (HF norm_topk_prob)",
}

logger = logging.getLogger(__name__)

ExtraState = Union[None, dict, Callable[[dict], dict]]


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
        "megatron_core_version": megatron_core_version(),
        "extra": dict(extra or {}),
    }


def megatron_core_version() -> str:
    """The installed megatron-core release (its package metadata; megatron itself not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("megatron-core")
    except PackageNotFoundError:  # pragma: no cover - megatron-core is a dependency
        return "unknown"


def _release(v: str) -> tuple:
    m = re.match(r"(\d+)\.(\d+)", v or "")
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def read_metadata(directory) -> dict:
    """The metadata of the checkpoint in ``directory`` (error when it is not one of ours)."""
    path = os.path.join(os.fspath(directory), METADATA_FILE)
    if not os.path.exists(path):
        if os.path.exists(os.path.join(os.fspath(directory), "config.json")):
            hint = " (this looks like an HF checkpoint: convert it with tools/convert_hf_to_megatron.py)"
        else:
            hint = ""
        raise CheckpointError(f"{directory}: not a megatron-dapo torch_dist checkpoint, {METADATA_FILE} missing{hint}")
    try:
        with open(path) as f:
            meta = json.load(f)
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: damaged ({type(e).__name__}: {e}); {FIX_DAMAGED}") from None
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
    defaults = {f.name: f.default for f in dataclasses.fields(ModelArch) if f.default is not dataclasses.MISSING}
    for field in CHECKED_FIELDS:
        # a checkpoint written before a field existed has the field's default (dense, no q/k norms)
        a, b = ck.get(field, defaults.get(field)), mine.get(field)
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


# ---------------------------------------------------------------- layout

#: The keys of a checkpoint's ``layout`` record (metadata["layout"]).
LAYOUT_KEYS = ("tp", "pp", "cp", "dp", "world_size", "nodes", "distributed_optimizer", "optimizer_format")


def current_layout() -> dict:
    """The layout of the running ranks (collective over the default group): TP, PP, CP and DP
    sizes, the world size and the number of distinct hosts the ranks run on."""
    import socket

    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    world = dist.get_world_size()
    hosts = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    return {
        "tp": ps.get_tensor_model_parallel_world_size(),
        "pp": ps.get_pipeline_model_parallel_world_size(),
        "cp": ps.get_context_parallel_world_size(),
        "dp": ps.get_data_parallel_world_size(),
        "world_size": world,
        "nodes": len(set(hosts)),
    }


#: ``optimizer_format`` of the plain optimizer's state (megatron's per-parameter sharded tensors).
PER_PARAMETER = "per_parameter"
#: ``optimizer_format`` of the distributed optimizer's state (megatron-core's name).
FULLY_RESHARDABLE = "fully_reshardable"
#: Optimizer formats that dist_checkpointing reshards over TP, PP, CP and DP.
RESHARDABLE_FORMATS = (PER_PARAMETER, FULLY_RESHARDABLE)

_LAYOUT_NAMES = {"tp": "TP", "pp": "PP", "cp": "CP", "dp": "DP", "world_size": "ranks", "nodes": "nodes"}
_SAVED_WITH = {"tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp", "world_size": "world_size"}


def checkpoint_layout(meta: dict) -> Optional[dict]:
    """The layout a checkpoint was saved at: its ``layout`` record, else (older checkpoints)
    what ``saved_with`` has (TP, PP, world size); None when neither is there."""
    if meta.get("layout"):
        return dict(meta["layout"])
    old = meta.get("saved_with") or {}
    return {_SAVED_WITH[k]: v for k, v in old.items() if k in _SAVED_WITH} or None


def _describe(layout: dict) -> str:
    s = f"TP {layout.get('tp')} x PP {layout.get('pp')} x CP {layout.get('cp')} x DP {layout.get('dp')}"
    s += f", {layout.get('world_size')} rank(s)"
    if layout.get("nodes"):
        s += f" on {layout['nodes']} node(s)"
    if layout.get("distributed_optimizer") is not None:
        s += ", distributed optimizer " + ("on" if layout["distributed_optimizer"] else "off")
    return s


def same_ranks(saved: Optional[dict], new: dict) -> bool:
    """Whether every rank of the new layout has the same place (TP/PP/CP/DP coordinates) as in
    the saved one, so that per-rank states (RNG) can be restored as saved. Sizes an older
    checkpoint did not record (CP, DP before ``layout``) count as the same."""
    if not saved:
        return False
    return all(saved.get(k) == new.get(k) for k in ("tp", "pp", "cp", "dp", "world_size") if saved.get(k) is not None)


def resume_note(saved: Optional[dict], new: dict) -> tuple[bool, str]:
    """Whether a checkpoint saved at layout ``saved`` (its ``metadata["layout"]``; None for a
    checkpoint written before layouts were recorded) resumes at layout ``new``, and a one-line
    note saying what changes. Pure: no I/O."""
    if not saved:
        return True, (
            "layout not recorded in this checkpoint (written before layouts were): model and optimizer "
            "reshard if the layout changed; per-rank RNG states restored when the rank count matches, "
            "otherwise re-derived"
        )
    if (
        saved.get("distributed_optimizer") is not None
        and new.get("distributed_optimizer") is not None
        and bool(saved["distributed_optimizer"]) != bool(new["distributed_optimizer"])
    ):
        was = "on" if saved["distributed_optimizer"] else "off"
        return False, (
            f"saved with the distributed optimizer {was}, resumed with it "
            f"{'on' if new['distributed_optimizer'] else 'off'}: the optimizer states differ in format "
            f"({saved.get('optimizer_format')} vs {new.get('optimizer_format')}); "
            f"{'pass' if saved['distributed_optimizer'] else 'drop'} --use-distributed-optimizer"
        )
    fmt = saved.get("optimizer_format")
    changes = [
        f"{_LAYOUT_NAMES[k]} {saved.get(k)} -> {new.get(k)}"
        for k in ("tp", "pp", "cp", "dp", "world_size", "nodes")
        if saved.get(k) is not None and new.get(k) is not None and saved.get(k) != new.get(k)
    ]
    if not changes:
        return True, f"same layout as saved ({_describe(new)}): exact resume, per-rank RNG states restored"
    if fmt is not None and fmt not in RESHARDABLE_FORMATS:
        return False, (
            f"{', '.join(changes)}: the optimizer state's format {fmt!r} does not reshard; resume at the "
            f"saved layout ({_describe(saved)})"
        )
    parallel = [c for c in changes if not c.startswith(("ranks", "nodes"))]
    what = "model and optimizer resharded by dist_checkpointing" if parallel else "the same shards, read by other ranks"
    if same_ranks(saved, new):
        rng = "per-rank RNG states restored (every rank keeps its place)"
    else:
        rng = "per-rank RNG states re-derived from (seed, rank, step): resume not bit-exact"
    return True, f"{', '.join(changes)}: {what}; {rng}"


#: megatron-core 0.19 logs this at a process's first save, synchronous ones included (its torch_dist
#: strategy runs every save through ``async_save(..., async_strategy="mcore")``); this project never
#: saves asynchronously, so the line would only mislead: it is dropped from that logger.
ASYNC_SAVE_DEPRECATION = "MCore's async save is deprecated"
_TORCH_STRATEGY_LOGGER = "megatron.core.dist_checkpointing.strategies.torch"


# ---------------------------------------------------------------- files

FIX_DAMAGED = "copy or write this checkpoint again, or resume from an earlier step of the run (--load SAVE_DIR/step_N)"


def verify_checkpoint_files(directory) -> None:
    """Error (one :class:`CheckpointError` naming ``directory`` and the fix) when a file that
    ``dist_checkpointing.load`` needs is missing or a ``.distcp`` shard is shorter than the
    ``.metadata`` index says (a copy or a save cut short). Reads only ``.metadata`` and file sizes."""
    directory = os.fspath(directory)
    for name, what in (
        (".metadata", "the tensor index of torch.distributed.checkpoint"),
        ("metadata.json", "megatron-core's dist_checkpointing config"),
    ):
        if not os.path.exists(os.path.join(directory, name)):
            raise CheckpointError(f"{directory}: incomplete checkpoint, {name} ({what}) is missing; {FIX_DAMAGED}")
    from torch.distributed.checkpoint import FileSystemReader

    try:
        md = FileSystemReader(directory).read_metadata()
    except Exception as e:  # a truncated or overwritten index
        raise CheckpointError(
            f"{directory}: .metadata does not read ({type(e).__name__}: {e}); {FIX_DAMAGED}"
        ) from None
    if common_state_layout(directory, md) == "inline" and _release(megatron_core_version()) < INLINE_COMMON_STATE_SINCE:
        raise CheckpointError(
            f"{directory}: written by megatron-core {_written_by(directory)}, which keeps the non-tensor state "
            f"inside the .distcp files (no common.pt); megatron-core {megatron_core_version()} here reads only "
            f"checkpoints with common.pt: load it with megatron-core >= "
            f"{'.'.join(map(str, INLINE_COMMON_STATE_SINCE))} (README, the primary stack)"
        )
    need: dict[str, int] = {}
    for info in (getattr(md, "storage_data", None) or {}).values():
        path = getattr(info, "relative_path", None)
        if path is not None:
            need[path] = max(need.get(path, 0), int(info.offset) + int(info.length))
    bad = []
    for path, size in sorted(need.items()):
        full = os.path.join(directory, path)
        have = os.path.getsize(full) if os.path.exists(full) else None
        if have is None:
            bad.append(f"{path} missing")
        elif have < size:
            bad.append(f"{path} truncated ({have} of {size} bytes)")
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise CheckpointError(f"{directory}: incomplete checkpoint, {shown}; {FIX_DAMAGED}")


def common_state_layout(directory, md=None) -> str:
    """Where a checkpoint keeps its common (non-tensor) state: ``"common.pt"`` (megatron-core up
    to 0.18) or ``"inline"`` (0.19: a sharded object in the ``.distcp`` files, found in
    ``.metadata``); neither is an incomplete checkpoint (one :class:`CheckpointError`)."""
    directory = os.fspath(directory)
    if os.path.exists(os.path.join(directory, "common.pt")):
        return "common.pt"
    if md is None:
        from torch.distributed.checkpoint import FileSystemReader

        md = FileSystemReader(directory).read_metadata()
    if INLINE_COMMON_STATE_KEY in (getattr(md, "state_dict_metadata", None) or {}):
        return "inline"
    raise CheckpointError(
        f"{directory}: incomplete checkpoint, common.pt (the non-tensor state) is missing and .metadata lists "
        f"no {INLINE_COMMON_STATE_KEY.split('/')[0]} (megatron-core 0.19's place for it); {FIX_DAMAGED}"
    )


def _written_by(directory) -> str:
    try:
        with open(os.path.join(os.fspath(directory), METADATA_FILE)) as f:
            v = json.load(f).get("megatron_core_version")
    except (OSError, ValueError, AttributeError):
        v = None
    return str(v) if v else ">= " + ".".join(map(str, INLINE_COMMON_STATE_SINCE))


# ---------------------------------------------------------------- save / load


def _chunks(model) -> list:
    return list(model) if isinstance(model, (list, tuple)) else [model]


def has_adapters(model) -> bool:
    """The model holds LoRA adapters (training/lora.py): its checkpoints hold those only."""
    return any(mapping.is_lora_param(n) for c in _chunks(model) for n, _ in unwrap(c).named_parameters())


def _adapters_only(ssd: dict) -> dict:
    """A LoRA model's checkpoint: the adapters (the base weights are frozen and come from
    ``--hf-checkpoint``, named and fingerprinted in the metadata: checkpoint/lora_meta.py)."""
    return {k: v for k, v in ssd.items() if mapping.is_lora_param(k)}


def _base_only(ssd: dict) -> dict:
    return {k: v for k, v in ssd.items() if not mapping.is_lora_param(k)}


def _model_sharded_state_dict(model, part: str = "auto") -> dict:
    """``part``: ``auto`` (a LoRA model's adapters, else everything) or ``base`` (everything but
    adapters: a full checkpoint read into a LoRA model as its base)."""
    chunks = _chunks(model)
    only = _base_only if part == "base" else _adapters_only if has_adapters(model) else dict
    if len(chunks) == 1:
        return {MODEL_KEY: only(chunks[0].sharded_state_dict())}
    return {f"{MODEL_KEY}{i}": only(c.sharded_state_dict()) for i, c in enumerate(chunks)}


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
    model, directory, metadata: dict, extra_sharded_state: ExtraState = None, release_model_memory: bool = False
) -> None:
    """Save ``model`` (a module or a list of virtual-PP chunks) as a torch_dist checkpoint.

    Collective over the default process group: every rank calls it with its own shard of the
    model. ``metadata`` comes from :func:`checkpoint_metadata`; ``padded_vocab_size`` and
    ``saved_with`` are filled in here. ``extra_sharded_state`` (a sharded state dict, or a
    callable getting the model's sharded state dict) is saved alongside, under its own keys.
    ``release_model_memory=True`` (one-shot converters) bounds the writer's extra memory to
    one parameter but leaves the model unusable (see :func:`_own_storage_release_params`).
    ``metadata["layout"]``, when given, is merged over :func:`current_layout` (the trainer adds
    its optimizer's fields there).
    """
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps

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
    meta["layout"] = {**{k: None for k in LAYOUT_KEYS}, **current_layout(), **dict(metadata.get("layout") or {})}
    ssd = _with_extra(_model_sharded_state_dict(model), extra_sharded_state)
    if release_model_memory:
        _own_storage_release_params(model, ssd)
    platform.in_process_write_results()
    platform_imports.drop_log_lines(_TORCH_STRATEGY_LOGGER, ASYNC_SAVE_DEPRECATION)
    dist_checkpointing.save(ssd, directory)
    manifest.record_rank_files(directory, rank)  # this rank's shards, hashed while in its page cache
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


def _paths(x, path=()):
    """(path, leaf) of every leaf of a nested dict/list (a path is a tuple of keys/indices)."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _paths(v, path + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _paths(v, path + (i,))
    else:
        yield path, x


def _get_path(x, path):
    for k in path:
        x = x[k]
    return x


def _set_path(x, path, value) -> None:
    for k in path[:-1]:
        x = x[k]
    x[path[-1]] = value


def _is_vocab_key(key: str) -> bool:
    """A model vocabulary tensor or the optimizer state of one (``optimizer.state.exp_avg.<key>``)."""
    return any(key == k or key.endswith("." + k) for k in _VOCAB_KEYS)


def _request_full_vocab_tensors(ssd: dict, model_rows: int, ckpt_rows: int) -> list[tuple]:
    """The checkpoint pads the vocabulary differently from the model (another TP size or
    ``make_vocab_size_divisible_by``): request the embedding/output tensors and the optimizer
    state that has their shape (exp_avg, exp_avg_sq, fp32 main params) whole, as replicas, and
    cut this rank's shard after loading (:func:`_vocab_shard`). Returns their paths in ``ssd``."""
    import torch.distributed as dist
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    found = [
        (path, sh)
        for path, sh in _paths(ssd)
        if isinstance(sh, ShardedTensor) and _is_vocab_key(sh.key) and sh.global_shape[0] == model_rows
    ]
    rank = dist.get_rank()
    per_rank = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, sorted({sh.key for _, sh in found}))
    first = {}
    for r, keys in enumerate(per_rank):
        for k in keys:
            first.setdefault(k, r)
    out, main_taken = [], set()
    for path, sh in found:
        main = first[sh.key] == rank and sh.key not in main_taken
        main_taken.add(sh.key)
        buf = torch.empty((ckpt_rows,) + tuple(sh.global_shape[1:]), dtype=sh.data.dtype)
        _set_path(ssd, path, ShardedTensor.from_rank_offsets(sh.key, buf, replica_id=0 if main else (rank + 1)))
        out.append(path)
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
    model, directory, arch: ModelArch, extra_sharded_state: ExtraState = None, part: str = "auto"
) -> tuple[dict, dict]:
    """Load a torch_dist checkpoint into ``model`` at the current TP/PP (resharding as needed).

    Collective over the default process group. ``arch`` is the architecture the model was
    built from; it is checked against the checkpoint's metadata first. Returns
    ``(metadata, extra_state)``, where ``extra_state`` is the loaded counterpart of
    ``extra_sharded_state`` (plain tensors/objects under the caller's keys; ``{}`` if none).
    A LoRA model (``part="auto"``) reads its adapters, the rest of it untouched; ``part="base"``
    reads a full checkpoint into a LoRA model's base, its adapters untouched.
    """
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.validation import StrictHandling

    directory = os.fspath(directory)
    meta = read_metadata(directory)
    check_metadata(meta, arch, where=f"checkpoint {directory}")
    verify_checkpoint_files(directory)
    want_vocab = _padded_vocab(model)
    have_vocab = int(meta.get("padded_vocab_size") or want_vocab)
    # the extra state (the optimizer's) is built from the model's own sharded tensors: it finds
    # its parameters by identity, so before any of them is swapped for a re-padding buffer
    ssd = _with_extra(_model_sharded_state_dict(model, part), extra_sharded_state)
    repad = []
    if want_vocab > 0 and have_vocab != want_vocab:
        repad = _request_full_vocab_tensors(ssd, want_vocab, have_vocab)
    loaded, missing, unexpected = dist_checkpointing.load(ssd, directory, strict=StrictHandling.RETURN_ALL)
    if extra_sharded_state is None:  # the model alone (a converter, --pretrained-checkpoint, eval): a trainer
        missing = {k for k in missing if not str(k).startswith(TRAINER_STATE_PREFIXES)}  # checkpoint holds more
    _raise_mismatch(directory, missing, unexpected)
    for path in repad:
        _set_path(loaded, path, _vocab_shard(_get_path(loaded, path), arch.vocab_size, want_vocab))
    chunks = _chunks(model)
    keys = [MODEL_KEY] if len(chunks) == 1 else [f"{MODEL_KEY}{i}" for i in range(len(chunks))]
    adapters = has_adapters(model)
    for key, chunk in zip(keys, chunks):
        inner = unwrap(chunk)
        if not adapters:
            inner.load_state_dict(loaded.pop(key), strict=True)
            continue
        result = inner.load_state_dict(loaded.pop(key), strict=False)  # one part; the other stays
        wanted = (lambda k: not mapping.is_lora_param(k)) if part == "base" else mapping.is_lora_param
        left = [k for k in result.missing_keys if wanted(k) and not k.endswith("_extra_state")]
        if left or result.unexpected_keys:
            raise CheckpointError(
                f"{directory}: its tensors do not match the model's: missing {left[:5]}, unexpected "
                f"{list(result.unexpected_keys)[:5]}"
            )
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
    "FULLY_RESHARDABLE",
    "INLINE_COMMON_STATE_KEY",
    "INLINE_COMMON_STATE_SINCE",
    "LAYOUT_KEYS",
    "METADATA_FILE",
    "PER_PARAMETER",
    "RESHARDABLE_FORMATS",
    "check_metadata",
    "checkpoint_layout",
    "checkpoint_metadata",
    "checkpoint_tensor_shapes",
    "common_state_layout",
    "current_layout",
    "dtype_name",
    "is_checkpoint",
    "load_checkpoint",
    "megatron_core_version",
    "metadata_arch",
    "read_metadata",
    "resume_note",
    "same_ranks",
    "save_checkpoint",
    "torch_dtype",
    "verify_checkpoint_files",
]
