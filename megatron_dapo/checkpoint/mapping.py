"""The ONE mapping between megatron-core ``GPTModel`` weights and Hugging Face weights.

Used by the converters (``tools/convert_*``), by checkpoint loading, and by the hybrid
engine's weight sync into rollout engines. Three layers of names:

* **HF names**: ``model.layers.3.self_attn.q_proj.weight`` ... (Qwen2/Qwen2.5 and Llama).
* **megatron full names**: the names of megatron-core's ``GPTModel`` with *global* layer
  indices and *TP-gathered* tensors, e.g. ``decoder.layers.3.self_attention.linear_qkv.weight``.
* **megatron local names**: what a rank's module holds: local layer indices (PP offset
  removed) and the rank's TP shard.

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
}
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
}


class MappingError(KeyError):
    """A name with no place in the mapping (reported with the name)."""

    def __str__(self):  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


def canonical_name(name: str) -> str:
    """Map a TE-spec megatron name to its local-spec equivalent (identity otherwise)."""
    m = _LAYER_RE.match(name)
    if m and m.group(2) in _TE_ALIASES:
        return f"decoder.layers.{m.group(1)}.{_TE_ALIASES[m.group(2)]}"
    return name


def spec_name(name: str, te_spec: bool) -> str:
    """Map a canonical (local-spec) megatron name to the name under the chosen spec."""
    if not te_spec:
        return name
    m = _LAYER_RE.match(name)
    if m and m.group(2) in _TE_ALIASES_INV:
        return f"decoder.layers.{m.group(1)}.{_TE_ALIASES_INV[m.group(2)]}"
    return name


def megatron_names(arch: ModelArch, te_spec: bool = False) -> list[str]:
    """All megatron full parameter names of ``arch`` (global layer indices), in model order."""
    names = ["embedding.word_embeddings.weight"]
    for layer in range(arch.num_layers):
        for suffix in _LAYER_MAP:
            if suffix.endswith("linear_qkv.bias") and not arch.qkv_bias:
                continue
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
    if not m or m.group(2) not in _LAYER_MAP:
        raise MappingError(f"no HF counterpart for megatron parameter {megatron_name!r}")
    hf_suffixes, _ = _LAYER_MAP[m.group(2)]
    return [f"model.layers.{m.group(1)}.{s}" for s in hf_suffixes]


def tp_partition_dim(megatron_name: str) -> Optional[int]:
    """The dimension along which megatron splits this tensor over TP ranks (None: replicated)."""
    name = canonical_name(megatron_name)
    if name in _TP_DIM:
        return _TP_DIM[name]
    m = _LAYER_RE.match(name)
    if m and m.group(2) in _TP_DIM:
        return _TP_DIM[m.group(2)]
    raise MappingError(f"unknown megatron parameter {megatron_name!r}")


def is_gated_fc1(megatron_name: str) -> bool:
    return canonical_name(megatron_name).endswith("mlp.linear_fc1.weight")


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
    kind = _LAYER_MAP[_LAYER_RE.match(name).group(2)][1]
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
        kind = _LAYER_MAP[_LAYER_RE.match(canon).group(2)][1]
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
