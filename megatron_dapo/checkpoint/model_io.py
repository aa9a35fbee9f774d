"""Move weights between a rank's megatron-core modules and full (HF or megatron) tensors.

Built on :mod:`megatron_dapo.checkpoint.mapping`; no layout logic of its own.
"""

from __future__ import annotations

import os
from typing import Callable, Iterator

import torch

from ..models.hf_config import ModelArch
from . import mapping
from .hf_check import weight_files


def layer_offset(model) -> int:
    """Global index of the first transformer layer held by this PP stage's model."""
    model = unwrap(model)
    layers = model.decoder.layers
    return (layers[0].layer_number - 1) if len(layers) else 0


def unwrap(model):
    """Strip DDP / Float16Module wrappers."""
    while hasattr(model, "module"):
        model = model.module
    return model


def expert_layout(arch: ModelArch) -> tuple[int, int, int, int, int]:
    """``(ep_rank, ep_size, etp_rank, etp_size, local experts)`` of this rank (EP/ETP from
    megatron's parallel state; all 1 / 0 for a dense model)."""
    from megatron.core import parallel_state as ps

    if not arch.is_moe:
        return 0, 1, 0, 1, 0
    ep, ep_size = ps.get_expert_model_parallel_rank(), ps.get_expert_model_parallel_world_size()
    etp, etp_size = ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size()
    if arch.num_experts % ep_size:
        raise ValueError(f"{arch.num_experts} experts not divisible by --expert-model-parallel-size {ep_size}")
    return ep, ep_size, etp, etp_size, arch.num_experts // ep_size


def global_param_name(model, local_name: str, arch: ModelArch) -> str:
    """The megatron full name of a local parameter (a tied output layer maps to the embedding;
    an expert's name gets its global expert index, in the canonical naming)."""
    name = mapping.local_to_global(local_name, layer_offset(model))
    if name == "output_layer.weight" and arch.tie_word_embeddings:
        return "embedding.word_embeddings.weight"
    if arch.is_moe and mapping.is_expert(name):
        ep, _, _, _, n_local = expert_layout(arch)
        return mapping.local_to_global_expert(name, ep, n_local)
    return name


class HFWeights:
    """Lazy read access to an HF checkpoint directory (safetensors, sharded or not)."""

    def __init__(self, directory: str):
        from safetensors import safe_open

        self.directory = directory
        self.weight_map = weight_files(directory)  # CheckpointError when there are no weights
        self._open = {}
        self._safe_open = safe_open

    def keys(self) -> list[str]:
        return list(self.weight_map)

    def __contains__(self, name: str) -> bool:
        return name in self.weight_map

    def __call__(self, name: str) -> torch.Tensor:
        if name not in self.weight_map:
            raise KeyError(f"{self.directory}: tensor {name!r} missing from the HF checkpoint")
        fname = self.weight_map[name]
        if fname not in self._open:
            self._open[fname] = self._safe_open(os.path.join(self.directory, fname), "pt")
        return self._open[fname].get_tensor(name)


def check_hf_tensors(arch: ModelArch, names) -> None:
    """Missing or unexpected HF tensors are an error listing them (never a partial load)."""
    want = set(mapping.hf_names(arch))
    have = set(names)
    if arch.tie_word_embeddings:
        have.discard("lm_head.weight")  # some tied checkpoints still store it
    have = {n for n in have if not n.endswith("rotary_emb.inv_freq")}
    missing, unexpected = sorted(want - have), sorted(have - want)
    if missing or unexpected:
        raise ValueError(
            f"HF checkpoint tensors do not match the config: missing {missing[:20]}"
            f"{' ...' if len(missing) > 20 else ''}, unexpected {unexpected[:20]}{' ...' if len(unexpected) > 20 else ''}"
        )


@torch.no_grad()
def load_full_weights(model, arch: ModelArch, get_full: Callable[[str], torch.Tensor]) -> None:
    """Copy FULL megatron tensors (by global name) into this rank's shards of ``model``."""
    from megatron.core import parallel_state as ps

    tp_rank = ps.get_tensor_model_parallel_rank()
    tp_size = ps.get_tensor_model_parallel_world_size()
    _, _, etp_rank, etp_size, _ = expert_layout(arch)
    inner = unwrap(model)
    for local, p in inner.named_parameters():
        if mapping.is_lora_param(local):
            continue  # an adapter: no tensor of the base model (training/lora.py)
        gname = global_param_name(inner, local, arch)
        full = get_full(gname)
        if mapping.is_expert(gname):  # an expert's tensors are split over the ETP ranks
            shard = mapping.shard_tp(gname, full, etp_rank, etp_size)
        else:
            shard = mapping.shard_tp(gname, full, tp_rank, tp_size)
        if tuple(shard.shape) != tuple(p.shape):
            raise ValueError(f"{local}: shard shape {tuple(shard.shape)} != parameter shape {tuple(p.shape)}")
        p.copy_(shard.to(p.dtype))


@torch.no_grad()
def load_hf_weights(model, arch: ModelArch, hf_dir_or_getter, padded_vocab: int) -> None:
    """Initialise this rank's shards from an HF checkpoint (directory or tensor getter)."""
    getter = HFWeights(hf_dir_or_getter) if isinstance(hf_dir_or_getter, (str, os.PathLike)) else hf_dir_or_getter
    if isinstance(getter, HFWeights):
        check_hf_tensors(arch, getter.keys())
    cache: dict[str, torch.Tensor] = {}

    def get_full(gname):
        if gname not in cache:
            cache.clear()  # one full tensor at a time
            ((_, t),) = list(mapping.hf_to_megatron(arch, getter, padded_vocab, names=[gname]))
            cache[gname] = t
        return cache[gname]

    load_full_weights(model, arch, get_full)


@torch.no_grad()
def gather_full_weights(model, arch: ModelArch, tp_group=None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (global megatron name, FULL tensor) for this PP stage, TP shards all-gathered.

    Experts (canonical names, global expert indices): each local expert's ETP shards are
    all-gathered, then the EP ranks' experts of the same local index, so every rank of the
    expert-parallel group yields every expert of the stage, one at a time. A LoRA-adapted
    weight is yielded merged (the weight the model computes with); the adapters themselves are
    not yielded (training/lora.py).

    Collective over the TP group (and the ETP and EP groups of a MoE model): every rank must
    iterate in the same order.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    tp_group = tp_group or ps.get_tensor_model_parallel_group()
    tp_size = dist.get_world_size(tp_group)
    ep, ep_size, _, etp_size, n_local = expert_layout(arch)
    inner = unwrap(model)
    for local, p in inner.named_parameters():
        if mapping.is_lora_param(local):
            continue  # an adapter: no tensor of the base model (training/lora.py)
        gname = mapping.local_to_global(local, layer_offset(inner))
        if gname == "output_layer.weight" and arch.tie_word_embeddings:
            continue  # the tied copy on the last stage
        t = p.detach()
        owner = inner.get_submodule(local.rsplit(".", 1)[0]) if "." in local else None
        adapters = getattr(owner, mapping.LORA_ATTR, None) if local.endswith(".weight") else None
        if adapters is not None:  # LoRA: the weight as the model computes with it, W + (alpha / r) B A
            t = (t.float() + adapters.delta_weight()).to(t.dtype)
        if arch.is_moe and mapping.is_expert(gname):
            if etp_size > 1:
                shards = [torch.empty_like(t) for _ in range(etp_size)]
                dist.all_gather(shards, t.contiguous(), group=ps.get_expert_tensor_parallel_group())
                t = mapping.unshard_tp(gname, shards)
            j = mapping.expert_index(gname)
            if ep_size == 1:
                yield mapping.with_expert_index(gname, j), t
                continue
            parts = [torch.empty_like(t) for _ in range(ep_size)]
            dist.all_gather(parts, t.contiguous(), group=ps.get_expert_model_parallel_group())
            for r, x in enumerate(parts):
                yield mapping.with_expert_index(gname, r * n_local + j), x
            continue
        if tp_size > 1 and mapping.tp_partition_dim(gname) is not None:
            shards = [torch.empty_like(t) for _ in range(tp_size)]
            dist.all_gather(shards, t.contiguous(), group=tp_group)
            t = mapping.unshard_tp(gname, shards)
        yield gname, t
