"""A LoRA policy's adapters in PEFT's format (issue 41; docs/lora.md): ``adapter_config.json``
(written by ``peft.LoraConfig``) and ``adapter_model.safetensors`` with PEFT's names,
``base_model.model.model.layers.L.self_attn.q_proj.lora_A.weight`` ``[r, in]`` and
``...lora_B.weight`` ``[out, r]``: what ``peft.PeftModel.from_pretrained(base, DIR)`` loads.

Collective over the world: each adapter's TP-split factor is all-gathered in its TP group (B of
a column-parallel linear by rows, A of a row-parallel one by columns), every stage's TP rank 0 of
DP rank 0 holds its stage's adapters, and global rank 0 writes them all (adapters are small:
r x (in + out) per projection).
"""

from __future__ import annotations

import os
from typing import Dict, Iterator, Tuple

import torch

from ..checkpoint.model_io import layer_offset, unwrap
from .lora import HF_PARENT, LoRAOptions, adapted_modules

ADAPTER_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"


def peft_name(layer: int, projection: str, which: str) -> str:
    """PEFT's key of a saved adapter factor (``which``: ``A`` or ``B``)."""
    return f"base_model.model.model.layers.{layer}.{HF_PARENT[projection]}.{projection}.lora_{which}.weight"


def gather_adapters(model, tp_group=None) -> Iterator[Tuple[str, torch.Tensor]]:
    """(PEFT name, whole tensor) of every adapter factor of this PP stage (TP all-gathered;
    collective over the TP group: every rank iterates in the same order)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    tp_group = tp_group or ps.get_tensor_model_parallel_group()
    tp = dist.get_world_size(tp_group)
    inner = unwrap(model)
    offset = layer_offset(inner)
    for name, mod in adapted_modules(inner):
        layer = int(name.split(".")[2]) + offset
        adapters = mod.lora
        for p in adapters.names:
            for which, t in (("A", adapters.lora_A[p]), ("B", adapters.lora_B[p])):
                t = t.detach().contiguous()
                split = (adapters.kind == "column" and which == "B") or (adapters.kind == "row" and which == "A")
                if split and tp > 1:
                    parts = [torch.empty_like(t) for _ in range(tp)]
                    dist.all_gather(parts, t, group=tp_group)
                    t = torch.cat(parts, dim=0 if which == "B" else 1)
                yield peft_name(layer, p, which), t


def adapter_tensors(model) -> Dict[str, torch.Tensor]:
    """Every adapter factor of the whole model (all PP stages), whole, in PEFT's names, float32 on
    the CPU, on every rank (collective over the world: each stage's TP rank 0 of DP rank 0
    contributes its stage's)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    mine: Dict[str, torch.Tensor] = {}
    for n, t in gather_adapters(model):
        mine[n] = t.float().cpu()
    holder = ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine if holder else {})
    tensors: Dict[str, torch.Tensor] = {}
    for part in everyone:
        tensors.update(part or {})
    return tensors


def export_peft(model, opts: LoRAOptions, save_dir: str, base_model: str) -> list:
    """Write the adapters of ``model`` (this rank's TP/PP part) in PEFT's format into ``save_dir``
    (collective; see the module docstring). Returns the files written (on rank 0; [] elsewhere)."""
    import torch.distributed as dist
    from safetensors.torch import save_file

    tensors = adapter_tensors(model)
    if dist.get_rank() != 0:
        return []
    os.makedirs(save_dir, exist_ok=True)
    save_file({k: tensors[k].contiguous() for k in sorted(tensors)}, os.path.join(save_dir, ADAPTER_FILE))
    peft_config(opts, base_model).save_pretrained(save_dir)
    return [os.path.join(save_dir, ADAPTER_FILE), os.path.join(save_dir, CONFIG_FILE)]


def peft_config(opts: LoRAOptions, base_model: str):
    """The ``peft.LoraConfig`` of these adapters (PEFT's own init, scaling alpha / r)."""
    from peft import LoraConfig

    return LoraConfig(
        r=opts.rank,
        lora_alpha=opts.alpha,
        lora_dropout=opts.dropout,
        target_modules=list(opts.targets),
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model,
    )
