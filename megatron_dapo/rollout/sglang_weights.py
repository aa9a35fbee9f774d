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
from typing import Any, Dict, List, Tuple

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


# ------------------------------------------------- per-probe checksums (TP 1 layout) ----
#: SGLang pads the vocabulary rows of these parameters with zeros to a multiple of this
#: (``VocabParallelEmbedding``, DEFAULT_VOCAB_PADDING_SIZE in 0.5.23)
VOCAB_PADDING = 64
VOCAB_PADDED = ("embed_tokens.weight", "lm_head.weight")
EMBED = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"


def sglang_param_name(hf_name: str) -> str:
    """The SGLang parameter an HF tensor is loaded into (the inverse of :func:`hf_sources`)."""
    for fused, parts in FUSED_FROM_HF.items():
        for p in parts:
            if f".{p}." in hf_name:
                return hf_name.replace(f".{p}.", f".{fused}.")
    return hf_name


def sglang_layout(param: str, parts: Dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The tensor a TP-1 SGLang engine holds in ``param`` after loading the HF tensors
    ``parts`` (every name of ``hf_sources(param)``): fused q/k/v and gate/up concatenated on
    dim 0 in that order, cast to the engine's ``dtype``, vocabulary rows padded with zeros to a
    multiple of :data:`VOCAB_PADDING`."""
    src = hf_sources(param)
    t = torch.cat([parts[s] for s in src], dim=0) if len(src) > 1 else parts[src[0]]
    t = t.to(dtype)
    if param.endswith(VOCAB_PADDED) and t.shape[0] % VOCAB_PADDING:
        pad = VOCAB_PADDING - t.shape[0] % VOCAB_PADDING
        t = torch.cat([t, t.new_zeros((pad, *t.shape[1:]))], dim=0)
    return t


class ProbeHashes:
    """The checksum half of the weight-sync check for an SGLang engine, by HF name.

    SGLang's checker (``check_weights``, action "checksum") hashes the engine's own parameters
    (fused, padded); the trainer records checksums of the HF tensors it hands over. On a probe
    sync the adapter records, for each HF tensor it hands to the engine, its checksum as
    received and, once all the HF sources of a parameter have passed, the hash SGLang's
    checker must report for it (:func:`sglang_layout`, hashed with SGLang's own function
    ``hash_fn``). :meth:`verdicts` then gives each HF name the checksum received when the
    engine's parameter holds exactly the expected bytes, and a line saying what differs
    otherwise: the trainer's ``compare_checksums`` names every tensor that did not arrive
    (missing), arrived changed (different) or was not written as sent (different, with the
    checker's hash). Names whose parameter the checker does not report under the fused name
    (MoE experts: SGLang stacks them into w13/w2) are not comparable (None)."""

    def __init__(self, hash_fn, dtype: torch.dtype, tied: bool):
        self.hash_fn = hash_fn
        self.dtype = dtype
        self.tied = tied
        self.received: Dict[str, tuple] = {}
        self.expected: Dict[str, str] = {}
        self._parts: Dict[str, Dict[str, torch.Tensor]] = {}

    def observe(self, named) -> None:
        from megatron_dapo.rollout.checksum import tensor_checksum

        for name, t in named:
            self.received[name] = tensor_checksum(t)
            if self.tied and name == LM_HEAD:
                continue  # the engine's head is its embedding
            param = sglang_param_name(name)
            parts = self._parts.setdefault(param, {})
            parts[name] = t
            if set(hf_sources(param)) <= set(parts):
                self.expected[param] = self.hash_fn(sglang_layout(param, parts, self.dtype))
                del self._parts[param]
        # tensors waiting for the rest of their parameter outlive the caller's buffer
        for parts in self._parts.values():
            for n, t in parts.items():
                parts[n] = t.detach().clone()

    def verdicts(self, engine_hashes: Dict[str, str]) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for name, got in self.received.items():
            param = EMBED if self.tied and name == LM_HEAD else sglang_param_name(name)
            if param not in engine_hashes:
                out[name] = None  # stored under another layout (stacked experts): not comparable
            elif param in self._parts:
                lost = sorted(set(hf_sources(param)) - set(self._parts[param]))
                out[name] = f"not written: {param} is fused from {', '.join(lost)} too, which never arrived"
            elif engine_hashes[param] != self.expected[param]:
                out[name] = (
                    f"SGLang's {param} holds other bytes than the HF tensors received give (checker hash "
                    f"{engine_hashes[param]}, expected {self.expected[param]})"
                )
            elif self.tied and name == LM_HEAD and got != self.received.get(EMBED):
                out[name] = f"the engine ties {LM_HEAD} to {EMBED}, but the two tensors sent differ"
            else:
                out[name] = got
        return out
