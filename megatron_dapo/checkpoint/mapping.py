"""The ONE mapping between megatron-core ``GPTModel`` weights and Hugging Face weights.

Used by the converters (``tools/convert_*``), by checkpoint loading, and by the hybrid
engine's weight sync into rollout engines. Three layers of names:

* **HF names**: ``model.layers.3.self_attn.q_proj.weight`` ... (Qwen2/Qwen2.5, Qwen3,
  Qwen3-MoE and Llama), as stored in HF checkpoints and loaded by SGLang: one tensor per
  expert, ``model.layers.3.mlp.experts.5.gate_proj.weight``.
* **megatron full names**: the names of megatron-core's ``GPTModel`` with *global* layer
  indices and *TP-gathered* tensors, e.g. ``decoder.layers.3.self_attention.linear_qkv.weight``.
* **megatron local names**: what a rank's module holds: local layer indices (PP offset
  removed), local expert indices (EP offset removed) and the rank's TP (experts: ETP) shard.

Experts (docs/moe.md). A megatron full name holds the GLOBAL expert index in megatron-core's
``SequentialMLP`` naming, ``decoder.layers.3.mlp.experts.local_experts.5.linear_fc1.weight``
(``[gate; up]`` of expert 5, like a dense ``linear_fc1``); under the TE spec the grouped GEMM
(``TEGroupedMLP``) names it ``decoder.layers.3.mlp.experts.linear_fc1.weight5``
(:func:`spec_name`). EP rank ``r`` holds experts ``r * E/EP .. (r + 1) * E/EP - 1`` as its local
experts ``0 .. E/EP - 1``; an expert's tensors are split over the expert-tensor-parallel
(ETP) ranks as a dense MLP's are over TP. The router ``mlp.router.weight`` is HF's
``mlp.gate.weight``, replicated.

Engine naming (:data:`NAMINGS`): ``checkpoint`` is the HF checkpoint's (and SGLang's) names;
``transformers`` is the names of the transformers model in memory (the CPU engine), which
stacks a layer's experts into ``mlp.experts.gate_up_proj`` ``[E, 2 I, H]`` (expert ``e``:
``[gate_e; up_e]``, megatron's ``linear_fc1`` of ``e``) and ``mlp.experts.down_proj``
``[E, H, I]``. Dense models have the same names in both.

Layouts handled here:

* fused QKV: megatron stores, per query group g, ``[q heads of g; k_g; v_g]`` row blocks
  (``ng * (np/ng + 2) * head_dim`` rows), the HF model separate q/k/v projections;
  the QKV bias of Qwen2 the same way.
* fused gate/up: ``linear_fc1 = [gate; up]`` (each TP rank holds ``[gate_r; up_r]``).
* norms fused into TE linears under the TE spec: ``linear_qkv.layer_norm_weight`` is
  ``input_layernorm.weight`` and ``linear_fc1.layer_norm_weight`` is
  ``pre_mlp_layernorm.weight`` (= HF ``post_attention_layernorm``).
* tied embeddings: no ``output_layer.weight`` / ``lm_head.weight``.
* vocabulary padding: megatron's embedding and output rows are padded to
  ``padded_vocab``; padding rows are zero when converting in and dropped when converting out.
"""

from __future__ import annotations

import re
from typing import Callable, Iterator, Optional

import torch

from ..models.hf_config import ModelArch

_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.(.*)$")

# megatron per-layer suffix -> (HF per-layer suffixes, kind)
_LAYER_MAP = {
    "input_layernorm.weight": (("input_layernorm.weight",), "copy"),
    "self_attention.linear_qkv.weight": (
        ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
        "qkv",
    ),
    "self_attention.linear_qkv.bias": (
        ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
        "qkv",
    ),
    "self_attention.linear_proj.weight": (("self_attn.o_proj.weight",), "copy"),
    "pre_mlp_layernorm.weight": (("post_attention_layernorm.weight",), "copy"),
    "mlp.linear_fc1.weight": (("mlp.gate_proj.weight", "mlp.up_proj.weight"), "cat"),
    "mlp.linear_fc2.weight": (("mlp.down_proj.weight",), "copy"),
    "self_attention.q_layernorm.weight": (("self_attn.q_norm.weight",), "copy"),
    "self_attention.k_layernorm.weight": (("self_attn.k_norm.weight",), "copy"),
    "mlp.router.weight": (("mlp.gate.weight",), "copy"),
}
# experts: megatron per-expert suffix -> (HF per-expert suffixes, kind)
_EXPERT_MAP = {
    "linear_fc1.weight": (("gate_proj.weight", "up_proj.weight"), "cat"),
    "linear_fc2.weight": (("down_proj.weight",), "copy"),
}
_EXPERT_RE = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc[12]\.weight)$")
_TE_EXPERT_RE = re.compile(r"^mlp\.experts\.(linear_fc[12])\.weight(\d+)$")
#: engine weight naming: the HF checkpoint's (SGLang) or transformers' modules' (HFEngine)
NAMINGS = ("checkpoint", "transformers")
# TE spec: norms fused into the following linear layer
_TE_ALIASES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}
_TE_ALIASES_INV = {v: k for k, v in _TE_ALIASES.items()}

# TP partitioning of megatron tensors: dim that is split, or None (replicated)
_TP_DIM = {
    "embedding.word_embeddings.weight": 0,
    "output_layer.weight": 0,
    "decoder.final_layernorm.weight": None,
    "input_layernorm.weight": None,
    "pre_mlp_layernorm.weight": None,
    "self_attention.linear_qkv.weight": 0,
    "self_attention.linear_qkv.bias": 0,
    "self_attention.linear_proj.weight": 1,
    "mlp.linear_fc1.weight": 0,
    "mlp.linear_fc2.weight": 1,
    "self_attention.q_layernorm.weight": None,
    "self_attention.k_layernorm.weight": None,
    "mlp.router.weight": None,
}


#: the attribute of a megatron linear holding its LoRA adapters (training/lora.py): their
#: parameters (``...linear_qkv.lora.lora_A.q_proj``) belong to no HF tensor of the base model
LORA_ATTR = "lora"


def is_lora_param(name: str) -> bool:
    """A parameter of a LoRA adapter, not of the base model."""
    return f".{LORA_ATTR}." in f".{name}"


class MappingError(KeyError):
    """A name with no place in the mapping (reported with the name)."""

    def __str__(self):  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


def canonical_name(name: str) -> str:
    """Map a TE-spec megatron name to its local-spec equivalent (identity otherwise)."""
    m = _LAYER_RE.match(name)
    if m and m.group(2) in _TE_ALIASES:
        return f"decoder.layers.{m.group(1)}.{_TE_ALIASES[m.group(2)]}"
    if m:
        e = _TE_EXPERT_RE.match(m.group(2))
        if e:
            return f"decoder.layers.{m.group(1)}.mlp.experts.local_experts.{e.group(2)}.{e.group(1)}.weight"
    return name


def spec_name(name: str, te_spec: bool, grouped_gemm: Optional[bool] = None) -> str:
    """Map a canonical (local-spec) megatron name to the name under the chosen spec
    (``grouped_gemm``: experts as TE's grouped GEMM; default: with the TE spec)."""
    m = _LAYER_RE.match(name)
    if m and (te_spec if grouped_gemm is None else grouped_gemm):
        e = _EXPERT_RE.match(m.group(2))
        if e:
            return f"decoder.layers.{m.group(1)}.mlp.experts.{e.group(2)[: -len('.weight')]}.weight{e.group(1)}"
    if not te_spec:
        return name
    if m and m.group(2) in _TE_ALIASES_INV:
        return f"decoder.layers.{m.group(1)}.{_TE_ALIASES_INV[m.group(2)]}"
    return name


def _layer_suffixes(arch: ModelArch) -> list[str]:
    """The per-layer megatron suffixes of ``arch`` (canonical), experts with global indices."""
    out = []
    for suffix in _LAYER_MAP:
        if suffix.endswith("linear_qkv.bias") and not arch.qkv_bias:
            continue
        if "_layernorm." in suffix and suffix.startswith("self_attention.") and not arch.qk_layernorm:
            continue
        if suffix.startswith("mlp.") and (suffix == "mlp.router.weight") != arch.is_moe:
            continue
        out.append(suffix)
        if suffix == "mlp.router.weight":
            out += [f"mlp.experts.local_experts.{e}.{w}" for e in range(arch.num_experts) for w in _EXPERT_MAP]
    return out


def megatron_names(arch: ModelArch, te_spec: bool = False) -> list[str]:
    """All megatron full parameter names of ``arch`` (global layer indices), in model order."""
    names = ["embedding.word_embeddings.weight"]
    for layer in range(arch.num_layers):
        for suffix in _layer_suffixes(arch):
            names.append(spec_name(f"decoder.layers.{layer}.{suffix}", te_spec))
    names.append("decoder.final_layernorm.weight")
    if not arch.tie_word_embeddings:
        names.append("output_layer.weight")
    return names


def hf_names(arch: ModelArch) -> list[str]:
    """All HF parameter names of ``arch`` (what an engine must receive in a full sync)."""
    out = []
    for name in megatron_names(arch):
        out.extend(hf_names_for(arch, name))
    return out


def hf_names_for(arch: ModelArch, megatron_name: str) -> list[str]:
    name = canonical_name(megatron_name)
    if name == "embedding.word_embeddings.weight":
        return ["model.embed_tokens.weight"]
    if name == "output_layer.weight":
        return ["lm_head.weight"]
    if name == "decoder.final_layernorm.weight":
        return ["model.norm.weight"]
    m = _LAYER_RE.match(name)
    e = _EXPERT_RE.match(m.group(2)) if m else None
    if e:
        hf_suffixes, _ = _EXPERT_MAP[e.group(2)]
        return [f"model.layers.{m.group(1)}.mlp.experts.{e.group(1)}.{s}" for s in hf_suffixes]
    if not m or m.group(2) not in _LAYER_MAP:
        raise MappingError(f"no HF counterpart for megatron parameter {megatron_name!r}")
    hf_suffixes, _ = _LAYER_MAP[m.group(2)]
    return [f"model.layers.{m.group(1)}.{s}" for s in hf_suffixes]


def _kind(canon: str) -> str:
    m = _LAYER_RE.match(canon)
    e = _EXPERT_RE.match(m.group(2))
    return _EXPERT_MAP[e.group(2)][1] if e else _LAYER_MAP[m.group(2)][1]


def tp_partition_dim(megatron_name: str) -> Optional[int]:
    """The dimension along which megatron splits this tensor over TP ranks (None: replicated);
    an expert's tensors are split the same way over the ETP ranks."""
    name = canonical_name(megatron_name)
    if name in _TP_DIM:
        return _TP_DIM[name]
    m = _LAYER_RE.match(name)
    if m and m.group(2) in _TP_DIM:
        return _TP_DIM[m.group(2)]
    e = _EXPERT_RE.match(m.group(2)) if m else None
    if e:
        return _TP_DIM[f"mlp.{e.group(2)}"]
    raise MappingError(f"unknown megatron parameter {megatron_name!r}")


def is_gated_fc1(megatron_name: str) -> bool:
    """A SwiGLU ``linear_fc1`` (``[gate; up]``): a dense MLP's or an expert's."""
    name = canonical_name(megatron_name)
    if name.endswith("mlp.linear_fc1.weight"):
        return True
    m = _LAYER_RE.match(name)
    e = _EXPERT_RE.match(m.group(2)) if m else None
    return bool(e) and e.group(2) == "linear_fc1.weight"


# ---------------------------------------------------------------- experts


def expert_index(megatron_name: str) -> Optional[int]:
    """The expert index in an expert tensor's name (local or global, as the name holds it);
    None for every other tensor."""
    m = _LAYER_RE.match(canonical_name(megatron_name))
    e = _EXPERT_RE.match(m.group(2)) if m else None
    return int(e.group(1)) if e else None


def is_expert(megatron_name: str) -> bool:
    return expert_index(megatron_name) is not None


def with_expert_index(megatron_name: str, index: int) -> str:
    """The name of the same tensor of expert ``index`` (canonical naming)."""
    m = _LAYER_RE.match(canonical_name(megatron_name))
    e = _EXPERT_RE.match(m.group(2)) if m else None
    if not e:
        raise MappingError(f"{megatron_name!r} is not an expert tensor")
    return f"decoder.layers.{m.group(1)}.mlp.experts.local_experts.{int(index)}.{e.group(2)}"


def local_to_global_expert(name: str, ep_rank: int, num_local_experts: int) -> str:
    """A local expert name (index within this EP rank) -> the global expert's (canonical);
    other names unchanged."""
    i = expert_index(name)
    return name if i is None else with_expert_index(name, ep_rank * num_local_experts + i)


def global_to_local_expert(name: str, ep_rank: int, num_local_experts: int) -> Optional[str]:
    """A global expert name -> this EP rank's local name; None when another EP rank holds it."""
    i = expert_index(name)
    if i is None:
        return name
    j = i - ep_rank * num_local_experts
    return with_expert_index(name, j) if 0 <= j < num_local_experts else None


def expert_stack_name(layer: int, which: str) -> str:
    """The name of one layer's ``linear_fc1`` or ``linear_fc2`` of ALL experts stacked along a
    new first dim (``[E, ...]``, expert order): the unit the weight sync gathers over EP."""
    if which not in ("linear_fc1", "linear_fc2"):
        raise ValueError(f"expert_stack_name: which={which!r}")
    return f"decoder.layers.{int(layer)}.mlp.experts.{which}.stacked"


_STACK_RE = re.compile(r"^decoder\.layers\.(\d+)\.mlp\.experts\.(linear_fc[12])\.stacked$")


def stack_member(stack_name: str, expert: int) -> str:
    """The megatron full name of expert ``expert``'s tensor in the stack ``stack_name``."""
    m = _STACK_RE.match(stack_name)
    if not m:
        raise MappingError(f"not an expert stack name: {stack_name!r}")
    return f"decoder.layers.{m.group(1)}.mlp.experts.local_experts.{int(expert)}.{m.group(2)}.weight"


def stack_of(megatron_name: str) -> Optional[str]:
    """The :func:`expert_stack_name` an expert tensor belongs to (None for others)."""
    m = _LAYER_RE.match(canonical_name(megatron_name))
    e = _EXPERT_RE.match(m.group(2)) if m else None
    return expert_stack_name(int(m.group(1)), e.group(2)[: -len(".weight")]) if e else None


def expert_stack_to_hf(
    arch: ModelArch, stack_name: str, stacked: torch.Tensor, naming: str = "checkpoint"
) -> list[tuple[str, torch.Tensor]]:
    """A layer's stacked experts (``[E, *full expert tensor]``) -> engine tensors, all VIEWS
    of ``stacked`` (no copy): per expert (``checkpoint``: gate/up halves of fc1, down = fc2)
    or the layer's fused tensors (``transformers``: ``gate_up_proj`` = fc1 stack,
    ``down_proj`` = fc2 stack)."""
    m = _STACK_RE.match(stack_name)
    if not m:
        raise MappingError(f"not an expert stack name: {stack_name!r}")
    if naming not in NAMINGS:
        raise ValueError(f"naming must be one of {NAMINGS}, got {naming!r}")
    layer, which = m.group(1), m.group(2)
    if stacked.shape[0] != arch.num_experts:
        raise ValueError(f"{stack_name}: {stacked.shape[0]} experts, the config has {arch.num_experts}")
    if naming == "transformers":
        return [
            (f"model.layers.{layer}.mlp.experts.{'gate_up_proj' if which == 'linear_fc1' else 'down_proj'}", stacked)
        ]
    out = []
    for e in range(arch.num_experts):
        out.extend(megatron_to_hf(arch, stack_member(stack_name, e), stacked[e]))
    return out


def engine_names(arch: ModelArch, naming: str = "checkpoint") -> list[str]:
    """Every tensor name an engine with ``naming`` receives in a full sync (model order)."""
    if naming not in NAMINGS:
        raise ValueError(f"naming must be one of {NAMINGS}, got {naming!r}")
    out = []
    for name in megatron_names(arch):
        stack = stack_of(name)
        if stack is not None and naming == "transformers":
            if expert_index(name) == 0:
                out.append(
                    expert_stack_to_hf(arch, stack, torch.empty((arch.num_experts, 1), device="meta"), naming)[0][0]
                )
            continue
        out.extend(hf_names_for(arch, name))
    return out


# ---------------------------------------------------------------- layouts: QKV


def _qkv_sizes(arch: ModelArch):
    ng = arch.num_query_groups
    qpg = arch.num_attention_heads // ng
    return ng, qpg, arch.head_dim


def fuse_qkv(arch: ModelArch, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """HF q/k/v (weights [heads*hd, h] or biases [heads*hd]) -> megatron's grouped layout."""
    ng, qpg, hd = _qkv_sizes(arch)
    rest = q.shape[1:]
    qg = q.reshape(ng, qpg * hd, *rest)
    kg = k.reshape(ng, hd, *rest)
    vg = v.reshape(ng, hd, *rest)
    return torch.cat([qg, kg, vg], dim=1).reshape(ng * (qpg + 2) * hd, *rest)


def split_qkv(arch: ModelArch, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Megatron's grouped QKV -> HF q, k, v (contiguous tensors)."""
    ng, qpg, hd = _qkv_sizes(arch)
    rest = qkv.shape[1:]
    g = qkv.reshape(ng, (qpg + 2) * hd, *rest)
    q, k, v = torch.split(g, [qpg * hd, hd, hd], dim=1)
    return (
        q.reshape(ng * qpg * hd, *rest).contiguous(),
        k.reshape(ng * hd, *rest).contiguous(),
        v.reshape(ng * hd, *rest).contiguous(),
    )


# ---------------------------------------------------------------- conversion


def megatron_to_hf(arch: ModelArch, megatron_name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """One megatron FULL tensor -> its HF tensors (names and layouts), vocab padding dropped."""
    name = canonical_name(megatron_name)
    hf = hf_names_for(arch, name)
    if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return [(hf[0], tensor[: arch.vocab_size])]
    if name == "decoder.final_layernorm.weight":
        return [(hf[0], tensor)]
    kind = _kind(name)
    if kind == "copy":
        return [(hf[0], tensor)]
    if kind == "qkv":
        return list(zip(hf, split_qkv(arch, tensor)))
    gate, up = torch.chunk(tensor, 2, dim=0)
    return [(hf[0], gate), (hf[1], up)]


def hf_to_megatron(
    arch: ModelArch,
    get_hf: Callable[[str], torch.Tensor],
    padded_vocab: Optional[int] = None,
    names: Optional[list[str]] = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Stream megatron FULL tensors built from HF tensors fetched one at a time by ``get_hf``.

    ``names`` restricts the output (e.g. to one PP stage's layers); default all of them.
    """
    padded_vocab = padded_vocab or arch.vocab_size
    for name in names or megatron_names(arch):
        canon = canonical_name(name)
        hf = hf_names_for(arch, canon)
        if canon in ("embedding.word_embeddings.weight", "output_layer.weight"):
            t = get_hf(hf[0])
            if t.shape[0] != arch.vocab_size:
                raise ValueError(f"{hf[0]}: {t.shape[0]} rows, config vocab_size={arch.vocab_size}")
            if padded_vocab > arch.vocab_size:
                pad = t.new_zeros(padded_vocab - arch.vocab_size, *t.shape[1:])
                t = torch.cat([t, pad], dim=0)
            yield name, t
            continue
        if canon == "decoder.final_layernorm.weight":
            yield name, get_hf(hf[0])
            continue
        kind = _kind(canon)
        if kind == "copy":
            yield name, get_hf(hf[0])
        elif kind == "qkv":
            yield name, fuse_qkv(arch, *(get_hf(n) for n in hf))
        else:
            yield name, torch.cat([get_hf(hf[0]), get_hf(hf[1])], dim=0)


# ---------------------------------------------------------------- TP / PP layout


def shard_tp(megatron_name: str, full: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    """The TP shard of a megatron FULL tensor that rank ``tp_rank`` holds."""
    dim = tp_partition_dim(megatron_name)
    if dim is None or tp_size == 1:
        return full
    if is_gated_fc1(megatron_name):
        gate, up = torch.chunk(full, 2, dim=0)
        return torch.cat([torch.chunk(gate, tp_size, 0)[tp_rank], torch.chunk(up, tp_size, 0)[tp_rank]], 0)
    if full.shape[dim] % tp_size:
        raise ValueError(f"{megatron_name}: dim {dim} of size {full.shape[dim]} not divisible by TP {tp_size}")
    return torch.chunk(full, tp_size, dim=dim)[tp_rank]


def unshard_tp(megatron_name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """Inverse of :func:`shard_tp`: the FULL tensor from every TP rank's shard (rank order)."""
    dim = tp_partition_dim(megatron_name)
    if dim is None or len(shards) == 1:
        return shards[0]
    if is_gated_fc1(megatron_name):
        halves = [torch.chunk(s, 2, dim=0) for s in shards]
        return torch.cat([torch.cat([h[0] for h in halves], 0), torch.cat([h[1] for h in halves], 0)], 0)
    return torch.cat(shards, dim=dim)


def local_to_global(name: str, layer_offset: int) -> str:
    """Local module name (layer index within the PP stage) -> megatron full (global) name."""
    m = _LAYER_RE.match(name)
    if not m:
        return name
    return f"decoder.layers.{int(m.group(1)) + layer_offset}.{m.group(2)}"


def global_to_local(name: str, layer_offset: int, num_local_layers: int) -> Optional[str]:
    """Global name -> local name on a stage with ``layer_offset``; None if another stage owns it."""
    m = _LAYER_RE.match(name)
    if not m:
        return name
    i = int(m.group(1)) - layer_offset
    if 0 <= i < num_local_layers:
        return f"decoder.layers.{i}.{m.group(2)}"
    return None
