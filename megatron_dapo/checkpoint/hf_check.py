"""Check an HF checkpoint directory against its config before anything is built or loaded.

Read from the safetensors headers alone (no tensor is read): every shard the index names is
present and whole, every tensor the index places in a shard is there, every tensor is a float,
the tensors are exactly those the config's architecture has, each of the shape the config says.
Each mistake is one :class:`CheckpointError` naming the file (and the tensor) and the fix; the
converters and the trainer's dry run call :func:`check_hf_checkpoint` first.
"""

from __future__ import annotations

import json
import os

from ..errors import CheckpointError
from ..models.hf_config import ModelArch
from . import manifest, mapping

#: safetensors dtypes of model weights (the header's "dtype"); anything else is not a weight
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
_REFETCH = "download or copy it again"


def _few(names: list[str], n: int = 3) -> str:
    shown = ", ".join(repr(x) for x in names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


def weight_files(directory: str) -> dict[str, str]:
    """``{tensor name: file}`` of the HF checkpoint in ``directory``, from its index (a sharded
    checkpoint) or its single file's header; CheckpointError when neither is there or the
    index is not an index."""
    index = os.path.join(directory, INDEX)
    if os.path.exists(index):
        try:
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise TypeError("weight_map is not a {tensor: file} object")
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a safetensors index ({type(e).__name__}: {e}); {_REFETCH}") from None
        return weight_map
    single = os.path.join(directory, SINGLE)
    if not os.path.exists(single):
        raise CheckpointError(
            f"{directory}: no {SINGLE} or {INDEX} there (the weights of an HF checkpoint); give the directory "
            "that holds them"
        )
    return {name: SINGLE for name in read_header(single)}


def read_header(path: str) -> dict[str, dict]:
    """``{tensor: {"dtype", "shape", "data_offsets"}}`` of one safetensors file, the file
    checked whole by safetensors itself (a truncated file, a damaged header: CheckpointError
    naming the file and its size)."""
    from safetensors import SafetensorError, safe_open

    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: missing (the index lists tensors in it); {_REFETCH}")
    try:
        with safe_open(path, "pt") as f:  # safetensors checks that the data covers the header exactly
            names = list(f.keys())
        with open(path, "rb") as raw:
            n = int.from_bytes(raw.read(8), "little")
            header = json.loads(raw.read(n))
    except (SafetensorError, ValueError, OSError) as e:
        size = os.path.getsize(path)
        raise CheckpointError(
            f"{path}: not a whole safetensors file ({size} bytes; safetensors says: {e}); truncated or damaged, "
            f"{_REFETCH}"
        ) from None
    return {k: header[k] for k in names}


def expected_hf_shape(arch: ModelArch, hf_name: str) -> tuple[int, ...] | None:
    """The shape the config's architecture gives the HF tensor ``hf_name`` (None: a name this
    table does not know, left to the name check)."""
    h, hd = arch.hidden_size, arch.head_dim
    q, kv = arch.num_attention_heads * hd, arch.num_query_groups * hd
    suffix = hf_name.split(".", 3)[-1] if hf_name.startswith("model.layers.") else hf_name
    if ".experts." in hf_name:
        f = arch.moe_ffn_hidden_size
        return (h, f) if hf_name.endswith("down_proj.weight") else (f, h)
    shapes = {
        "model.embed_tokens.weight": (arch.vocab_size, h),
        "lm_head.weight": (arch.vocab_size, h),
        "model.norm.weight": (h,),
        "input_layernorm.weight": (h,),
        "post_attention_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (q, h),
        "self_attn.k_proj.weight": (kv, h),
        "self_attn.v_proj.weight": (kv, h),
        "self_attn.q_proj.bias": (q,),
        "self_attn.k_proj.bias": (kv,),
        "self_attn.v_proj.bias": (kv,),
        "self_attn.o_proj.weight": (h, q),
        "self_attn.q_norm.weight": (hd,),
        "self_attn.k_norm.weight": (hd,),
        "mlp.gate_proj.weight": (arch.ffn_hidden_size, h),
        "mlp.up_proj.weight": (arch.ffn_hidden_size, h),
        "mlp.down_proj.weight": (h, arch.ffn_hidden_size),
        "mlp.gate.weight": (arch.num_experts, h),
    }
    return shapes.get(suffix)


def check_hf_checkpoint(directory: str, arch: ModelArch, flag: str = "--hf-checkpoint") -> dict[str, dict]:
    """Check the HF checkpoint in ``directory`` against ``arch`` (its config.json) from the
    headers alone; returns ``{tensor: header entry}``. CheckpointError, one line, for: an index
    naming a shard that is missing, a shard truncated or damaged, a tensor the index places in
    a shard that does not hold it, a tensor that is not floating point, tensors missing or
    unexpected for the config (a config that does not belong to the weights: the layer count
    said), a tensor whose shape is not the config's; a file whose bytes differ from the
    ``checksums.json`` recorded when it was exported (then every file is read once)."""
    weight_map = weight_files(directory)
    damaged = manifest.verify(directory)  # an HF export of this project records its checksums
    if damaged:
        raise CheckpointError(f"{flag} {directory}: {damaged}; export or copy it again")
    headers: dict[str, dict] = {}
    for fname in sorted(set(weight_map.values())):
        path = os.path.join(directory, fname)
        header = read_header(path)
        for name, info in sorted(header.items()):
            if info.get("dtype") not in FLOAT_DTYPES:
                raise CheckpointError(
                    f"{path}: tensor {name!r} has dtype {info.get('dtype')}, not a floating-point weight; give "
                    "the model's own checkpoint (weights are bf16, fp16 or fp32)"
                )
        placed = sorted(n for n, f in weight_map.items() if f == fname and n not in header)
        if placed:
            raise CheckpointError(
                f"{path}: does not hold {_few(placed)}, which {INDEX} places there; the shard is not the one the "
                f"index was written with, {_REFETCH}"
            )
        headers.update(header)
    names = {n for n in headers if not n.endswith("rotary_emb.inv_freq")}
    if arch.tie_word_embeddings:
        names.discard("lm_head.weight")  # some tied checkpoints still store it
    want = set(mapping.hf_names(arch))
    missing, unexpected = sorted(want - names), sorted(names - want)
    if missing or unexpected:
        have_layers = len({n.split(".")[2] for n in names if n.startswith("model.layers.")})
        layers = (
            f"config.json says {arch.num_layers} layers, the weights hold {have_layers}; "
            if have_layers != arch.num_layers
            else ""
        )
        what = "; ".join(
            part
            for part in (
                f"missing {_few(missing)}" if missing else "",
                f"not in the config's model {_few(unexpected)}" if unexpected else "",
            )
            if part
        )
        raise CheckpointError(
            f"{flag} {directory}: the weights do not match config.json ({layers}{what}); give the config.json that "
            "came with these weights, or the missing files"
        )
    for name in sorted(want):
        shape = expected_hf_shape(arch, name)
        got = tuple(headers[name]["shape"])
        if shape is not None and got != shape:
            raise CheckpointError(
                f"{flag} {directory}: tensor {name!r} ({weight_map[name]}) has shape {list(got)}, config.json "
                f"gives {list(shape)} (hidden_size {arch.hidden_size}, heads {arch.num_attention_heads}/"
                f"{arch.num_query_groups}, head_dim {arch.head_dim}, intermediate_size {arch.ffn_hidden_size}, "
                f"vocab_size {arch.vocab_size}); give the config.json that came with these weights"
            )
    return headers
