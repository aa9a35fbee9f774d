"""LoRA adapters on megatron-core's tensor-parallel linears (issue 41; docs/lora.md).

Every adapted HF projection ``p`` of a layer gets its own pair (PEFT's layout and init):
``lora_A[p]`` ``[r, in]`` (kaiming-uniform, a = sqrt(5)) and ``lora_B[p]`` ``[out, r]`` (zeros),
and the projection computes ``W x + (alpha / r) B A x``. Megatron fuses projections: the QKV
linear holds q, k and v (``[q heads of g; k_g; v_g]`` per query group g), ``linear_fc1`` holds
``[gate; up]``; each HF projection still gets its own pair, and the adapters' outputs are laid
out as the fused weight's rows are.

Tensor parallelism (group ``tp``, size t; SP = sequence parallel):

* column-parallel linears (QKV, fc1): B is split by output rows like the weight, A is replicated.
  ``h = A x`` is computed on every rank; without SP ``h`` passes megatron's
  ``copy_to_tensor_model_parallel_region`` (identity forward, all-reduce of dh backward), so dA
  and the adapter's dx are whole on every rank; with SP ``h`` is all-gathered along the sequence
  (reduce-scattered backward) and A is marked ``sequence_parallel`` so that megatron sums its
  gradient over TP as it does for the norms.
* row-parallel linears (o_proj, down_proj): A is split by input columns like the weight, B is
  replicated. ``A_r x_r`` is summed over TP (all-reduce; reduce-scatter along the sequence with
  SP, B then marked ``sequence_parallel``).

The cost beyond the layer's own collectives is one collective on the rank-r activations of each
adapted linear (``tokens x r`` values, r/hidden of the layer's own), in the backward for column
layers and the forward for row layers. PP needs nothing: adapters live in their layer's stage.

The base weights are frozen (``requires_grad`` False), so megatron's DDP buffers and the
(distributed) optimizer hold the adapters only. A is drawn from a generator seeded by the seed,
the adapter's global name and the projection, over the whole matrix, then split: every TP layout
starts from the same adapters.

MoE: adapters go on attention only; the experts and the router take none (``moe_refusal``).
The TE spec fuses the input norm into the QKV and fc1 linears; a LoRA model is built with those
norms as modules of their own (``ModelBuildOptions.unfuse_norms``, models/provider.py), so the
adapters see the normalised input under both specs (``te_refusal`` guards a fused linear).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import types
from typing import Dict, Iterator, Optional, Tuple

import torch
from torch import nn

from ..checkpoint.mapping import LORA_ATTR, fuse_qkv, is_lora_param
from ..models.hf_config import LORA_TARGETS, ModelArch, lora_moe_refusal

#: the HF projections an adapter can target, in PEFT's names
TARGETS = LORA_TARGETS
#: megatron linear (suffix inside a decoder layer) -> (HF projections it fuses, parallel kind)
MODULES: Dict[str, Tuple[Tuple[str, ...], str]] = {
    "self_attention.linear_qkv": (("q_proj", "k_proj", "v_proj"), "column"),
    "self_attention.linear_proj": (("o_proj",), "row"),
    "mlp.linear_fc1": (("gate_proj", "up_proj"), "column"),
    "mlp.linear_fc2": (("down_proj",), "row"),
}
#: HF module holding each projection (``model.layers.L.<here>.<p>``)
HF_PARENT = {p: ("self_attn" if p in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp") for p in TARGETS}
#: the attribute an adapted megatron linear holds its adapters in (parameter names ``...linear_qkv.lora.*``)
ATTR = LORA_ATTR
__all__ = ["LoRAOptions", "apply_lora", "is_lora_param", "adapted_modules", "moe_refusal"]


@dataclasses.dataclass(frozen=True)
class LoRAOptions:
    rank: int
    alpha: float
    dropout: float = 0.0
    targets: Tuple[str, ...] = TARGETS
    seed: int = 0

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def unknown_targets(targets) -> list:
    return [t for t in targets if t not in TARGETS]


def moe_refusal(arch: ModelArch, targets) -> Optional[str]:
    """``models.hf_config.lora_moe_refusal``: MLP targets on a mixture-of-experts model."""
    return lora_moe_refusal(arch, targets)


def _uniform_a(name: str, rows: int, cols: int, seed: int) -> torch.Tensor:
    """PEFT's init of A (kaiming-uniform with a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in))), from a
    generator seeded by ``seed`` and ``name``: the same matrix on every rank and TP size."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    bound = 1.0 / math.sqrt(cols)
    return (torch.rand(rows, cols, generator=g, dtype=torch.float64) * 2 - 1).mul_(bound).float()


class LoRAAdapters(nn.Module):
    """The adapters of one megatron linear (this rank's shards) and their contribution to its
    output. ``rows[p]``: the rows of each projection the linear fuses in this rank's weight shard
    (an untargeted one contributes zeros), ``in_local``: the shard's input width."""

    def __init__(
        self,
        kind: str,
        rows: Dict[str, int],
        chosen: Tuple[str, ...],
        in_local: int,
        opts: LoRAOptions,
        global_name: str,
        tp_group,
        sequence_parallel: bool,
        arch: ModelArch,
        dtype: torch.dtype,
        device,
    ):
        super().__init__()
        import torch.distributed as dist
        from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

        self.kind, self.scaling, self.tp_group = kind, opts.scaling, tp_group
        self.sequence_parallel = sequence_parallel
        self.tp = dist.get_world_size(tp_group) if tp_group is not None and dist.is_initialized() else 1
        tp_rank = dist.get_rank(tp_group) if self.tp > 1 else 0
        self.arch = arch
        self.rows, self.names = dict(rows), tuple(chosen)
        self.dropout = nn.Dropout(opts.dropout) if opts.dropout > 0 else None
        self.lora_A = nn.ParameterDict()
        self.lora_B = nn.ParameterDict()
        r = opts.rank
        for p in self.names:
            out_local = self.rows[p]
            full_in = in_local * (self.tp if kind == "row" else 1)
            a = _uniform_a(f"{global_name}.{p}", r, full_in, opts.seed)
            if kind == "row":
                a = a[:, tp_rank * in_local : (tp_rank + 1) * in_local]
            A = nn.Parameter(a.to(device=device, dtype=dtype).contiguous())
            B = nn.Parameter(torch.zeros(out_local, r, device=device, dtype=dtype))
            sharded, replicated, dim = (B, A, 0) if kind == "column" else (A, B, 1)
            set_tensor_model_parallel_attributes(sharded, True, dim, 1)
            replicated.tensor_model_parallel = False
            if sequence_parallel:  # megatron sums its gradient over TP (finalize_model_grads)
                replicated.sequence_parallel = True
            self.lora_A[p], self.lora_B[p] = A, B

    # -------------------------------------------------------------------- layout of the outputs
    def _fuse(self, parts: list, dim: int) -> torch.Tensor:
        """The chosen projections' outputs (or weight rows), laid out as the fused megatron
        weight's rows, zeros where a fused projection has no adapter."""
        given = dict(zip(self.names, parts))
        like = parts[0]
        full = []
        for p, n in self.rows.items():
            if p in given:
                full.append(given[p])
            else:
                shape = list(like.shape)
                shape[dim] = n
                full.append(like.new_zeros(shape))
        if len(full) == 1:
            return full[0]
        parts = full
        if tuple(self.rows) == ("q_proj", "k_proj", "v_proj"):
            local = dataclasses.replace(
                self.arch,
                num_attention_heads=self.arch.num_attention_heads // self.tp,
                num_query_groups=self.arch.num_query_groups // self.tp,
            )
            moved = [t.movedim(dim, 0) for t in parts]
            return fuse_qkv(local, *moved).movedim(0, dim)
        return torch.cat(parts, dim=dim)  # [gate; up]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The adapters' part of the linear's output for its input ``x`` (``[s, b, in_local]``)."""
        from megatron.core.tensor_parallel import mappings

        group = self.tp_group
        xs = [self.dropout(x) if self.dropout is not None else x for _ in self.names]
        hs = [xi @ self.lora_A[p].t() for xi, p in zip(xs, self.names)]
        h = torch.cat(hs, dim=-1) if len(hs) > 1 else hs[0]
        if self.kind == "column":
            if self.sequence_parallel and self.tp > 1:
                h = mappings.gather_from_sequence_parallel_region(h, group=group)
            elif self.tp > 1:
                h = mappings.copy_to_tensor_model_parallel_region(h, group=group)
        elif self.tp > 1:
            if self.sequence_parallel:
                h = mappings.reduce_scatter_to_sequence_parallel_region(h, group=group)
            else:
                h = mappings.reduce_from_tensor_model_parallel_region(h, group=group)
        r = self.lora_A[self.names[0]].shape[0]
        outs = [h[..., i * r : (i + 1) * r] @ self.lora_B[p].t() for i, p in enumerate(self.names)]
        return self._fuse(outs, dim=-1) * self.scaling

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
        """megatron dist_checkpointing's view: the TP-split factor sharded along its split axis
        (B by rows in a column layer, A by columns in a row layer), the other one replicated; each
        projection's factor is its HF-layout tensor, so a checkpoint reshards to any TP."""
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

        axis = (
            {f"lora_B.{p}": 0 for p in self.names} if self.kind == "column" else {f"lora_A.{p}": 1 for p in self.names}
        )
        return make_sharded_tensors_for_checkpoint(
            self.state_dict(prefix="", keep_vars=True),
            prefix,
            axis,
            sharded_offsets,
            tp_group=self.tp_group,
            dp_cp_group=(metadata or {}).get("dp_cp_group"),
        )

    @torch.no_grad()
    def delta_weight(self) -> torch.Tensor:
        """(alpha / r) B A of this rank's shard, laid out as the base weight: what merging adds."""
        parts = [self.lora_B[p].float() @ self.lora_A[p].float() for p in self.names]
        return self._fuse(parts, dim=0) * self.scaling


def _linear_sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
    """An adapted linear's sharded state dict: its own (the adapters dropped from it, where
    megatron would call them replicated) and its adapters' (:meth:`LoRAAdapters.sharded_state_dict`)."""
    own = type(self).sharded_state_dict(self, prefix, sharded_offsets, metadata)
    inner = f"{prefix}{ATTR}."
    own = {k: v for k, v in own.items() if not k.startswith(inner)}
    own.update(getattr(self, ATTR).sharded_state_dict(inner, sharded_offsets, metadata))
    return own


def _hook(module, args, output):
    out, bias = output
    return out + getattr(module, ATTR)(args[0]).to(out.dtype), bias


def adapted_modules(model) -> Iterator[Tuple[str, nn.Module]]:
    """(local name, linear) of every linear holding adapters."""
    for name, mod in model.named_modules():
        if isinstance(getattr(mod, ATTR, None), LoRAAdapters):
            yield name, mod


def apply_lora(model, arch: ModelArch, opts: LoRAOptions, tp_group=None) -> int:
    """Put adapters on the targeted linears of ``model`` (this rank's TP/PP part, before DDP) and
    freeze every base parameter; returns the number of adapter parameters on this rank."""
    from ..checkpoint.mapping import local_to_global
    from ..checkpoint.model_io import layer_offset, unwrap

    bad = unknown_targets(opts.targets)
    if bad:
        raise ValueError(f"unknown LoRA targets {bad}: choose from {', '.join(TARGETS)}")
    refusal = moe_refusal(arch, opts.targets)
    if refusal:
        raise ValueError(refusal)
    inner = unwrap(model)
    offset = layer_offset(inner)
    for p in inner.parameters():
        p.requires_grad_(False)
    count = 0
    for name, mod in list(inner.named_modules()):
        suffix = next((s for s in MODULES if name.endswith("." + s)), None)
        if suffix is None or not name.startswith("decoder.layers."):
            continue
        fused, kind = MODULES[suffix]
        chosen = [p for p in fused if p in opts.targets]
        if not chosen:
            continue
        if type(mod).__name__.startswith("TELayerNorm"):
            raise ValueError(te_refusal())
        weight = mod.weight
        out_local, in_local = weight.shape
        group = tp_group if tp_group is not None else getattr(mod, "tp_group", None)
        adapters = LoRAAdapters(
            kind,
            _fused_rows(arch, fused, out_local),
            tuple(chosen),
            in_local,
            opts,
            local_to_global(name, offset),
            group,
            bool(getattr(mod, "sequence_parallel", False)),
            arch,
            weight.dtype,
            weight.device,
        )
        setattr(mod, ATTR, adapters)
        mod.register_forward_hook(_hook)
        mod.sharded_state_dict = types.MethodType(_linear_sharded_state_dict, mod)
        count += sum(p.numel() for p in adapters.parameters())
    return count


def te_refusal() -> str:
    return (
        "LoRA on a TE linear with the input norm fused in (TELayerNormColumnParallelLinear): an adapter would "
        "see the un-normalised input; build the model with ModelBuildOptions(unfuse_norms=True)"
    )


def _fused_rows(arch: ModelArch, fused: Tuple[str, ...], out_local: int) -> Dict[str, int]:
    """The rows of each fused projection in a weight shard of ``out_local`` rows."""
    if fused == ("q_proj", "k_proj", "v_proj"):
        qpg, hd = arch.num_attention_heads // arch.num_query_groups, arch.head_dim
        groups = out_local // ((qpg + 2) * hd)
        return {"q_proj": groups * qpg * hd, "k_proj": groups * hd, "v_proj": groups * hd}
    if fused == ("gate_proj", "up_proj"):
        return {"gate_proj": out_local // 2, "up_proj": out_local // 2}
    return {fused[0]: out_local}
