"""Weight-sync helpers of SGLangEngine, pure functions (CPU tests run them without sglang):

- ``payload_entries``: the (name, shape) list of an already serialized flattened-bucket
  payload, read from its pickled metadata without rebuilding a tensor;
- ``release_cached_memory``: the CUDA caching allocator's free blocks back to the driver
  after a weight-update session freed its buffers;
- SGLang's weight checker answers: ``rank_checksums`` (per-rank parameter hashes),
  ``diff_rank_checksums`` (what differs between two), ``hf_sources`` / ``FUSED_FROM_HF``
  (the HF tensors written into a fused SGLang parameter).

The weight-update session itself (begin / send / end) is SGLangEngine's (rollout/sglang_engine.py).
"""

from __future__ import annotations

import base64
import io
import pickle
from typing import Dict, List, Tuple

import torch

from megatron_dapo.rollout.base import WeightUpdateError


# ---------------------------------------------------------------- payload metadata ----
class _Opaque:
    """Stands in for every global a metadata-only decode does not need (tensor rebuilders,
    storages, fd/IPC handles): constructing or calling it touches no memory."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return self

    def __setstate__(self, state):
        pass


class _MetadataUnpickler(pickle.Unpickler):
    _KEEP = {
        ("torch", "Size"),
        ("torch", "dtype"),
        ("copyreg", "__newobj__"),
        ("copyreg", "_reconstructor"),
        ("builtins", "object"),
        ("collections", "OrderedDict"),
    }

    def find_class(self, module, name):
        if (module, name) in self._KEEP or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        if name in ("FlattenedTensorMetadata", "BucketEntry") and module in (
            "sglang.srt.weight_sync.tensor_bucket",
            "megatron_dapo.rollout.payload",
        ):
            return super().find_class(module, name)
        return _Opaque


def payload_entries(payload) -> List[Tuple[str, Tuple[int, ...]]]:
    """(name, shape) of every tensor a serialized flattened-bucket payload describes, read
    from its metadata without rebuilding any tensor (no CUDA IPC handle or shared memory is
    opened)."""
    data = base64.b64decode(payload, validate=True) if isinstance(payload, str) else bytes(payload)
    obj = _MetadataUnpickler(io.BytesIO(data)).load()
    if not isinstance(obj, dict) or "metadata" not in obj:
        raise WeightUpdateError("not a flattened-bucket payload (a dict with 'flattened_tensor' and 'metadata')")
    return [(m.name, tuple(m.shape)) for m in obj["metadata"]]


def release_cached_memory(devices) -> None:
    """Return the CUDA caching allocator's free blocks to the driver after buffers on these
    devices were freed (the colocated trainer needs the memory back); nothing for CPU ones."""
    if any(torch.device(d).type == "cuda" for d in devices):
        torch.cuda.empty_cache()


# ------------------------------------------------------------- weight checksums ----
#: SGLang's fused parameters (Qwen2/Qwen3/Llama ``stacked_params_mapping``) and the HF tensors
#: the weight sync writes into them
FUSED_FROM_HF = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def hf_sources(sglang_name: str) -> List[str]:
    """The HF tensors that are loaded into SGLang's parameter ``sglang_name`` (itself when not fused)."""
    for fused, parts in FUSED_FROM_HF.items():
        if f".{fused}." in sglang_name:
            return [sglang_name.replace(f".{fused}.", f".{p}.") for p in parts]
    return [sglang_name]


def rank_checksums(ranks) -> Dict[str, Dict[str, str]]:
    """SGLang's ``check_weights`` answer to "checksum" (one ChecksumInfo dict per GPU rank:
    ``checksums`` {SGLang parameter name: hash}, ``parallelism_info``) -> {rank label: checksums}."""
    out: Dict[str, Dict[str, str]] = {}
    for info in ranks or []:
        p = info["parallelism_info"]
        p = p[0] if isinstance(p, (list, tuple)) else p
        label = f"tp rank {p['tp_rank']}"
        if p.get("dp_size", 1) > 1:
            label += f" dp rank {p['dp_rank']}"
        if p.get("pp_size", 1) > 1:
            label += f" pp rank {p['pp_rank']}"
        if label in out:
            raise WeightUpdateError(f"SGLang check_weights: two answers for {label}")
        out[label] = dict(info["checksums"])
    if not out:
        raise WeightUpdateError("SGLang check_weights('checksum') returned no per-rank checksums")
    return out


def diff_rank_checksums(before: Dict[str, Dict[str, str]], after: Dict[str, Dict[str, str]]) -> List[str]:
    """One line per SGLang parameter whose hash differs between two :func:`rank_checksums`
    (the ranks where it differs, and the HF tensors written into it when it is fused), then
    a line per rank or parameter present only once."""
    differ: Dict[str, List[str]] = {}
    extra = []
    for label in sorted(set(before) | set(after)):
        if label not in before or label not in after:
            extra.append(f"{label}: answered {'only before' if label in before else 'only after'} the sync")
            continue
        b, a = before[label], after[label]
        for name in sorted(set(b) | set(a)):
            if name not in b or name not in a:
                extra.append(f"{name} ({label}): reported {'only before' if name in b else 'only after'} the sync")
            elif b[name] != a[name]:
                differ.setdefault(name, []).append(label)
    out = []
    for name, labels in differ.items():
        src = hf_sources(name)
        fused = f"; written from HF {', '.join(src)}" if src != [name] else ""
        out.append(f"{name}: hash differs on {', '.join(labels)}{fused}")
    return out + extra
