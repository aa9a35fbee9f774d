"""Routed experts of a rollout (routing replay, R3; docs/moe.md "Routing replay").

The layout every engine returns and the trainer replays: an integer tensor ``[n, layers, top_k]``
(:func:`routing_dtype`: uint8 for up to 256 experts, every released Qwen3-MoE; else int16)
whose row ``t`` holds the experts position ``t`` of ``prompt + output`` was routed to, for the
``n = len(prompt) + len(output) - 1`` positions the engine fed through the model (the last
output token is never fed back). It is SGLang 0.5.23's layout (``meta_info["routed_experts"]``,
rows ``[routed_experts_start_len, seqlen - 1)`` of its host buffer ``[tokens, layers, top_k]``).

* :class:`RoutingRecorder`: forward hooks on a transformers Qwen3-MoE model's routers
  (``mlp.gate``, ``Qwen3MoeTopKRouter``, whose third output is the top-k expert ids), for HFEngine.
* :func:`decode_sglang_routed_experts`: SGLang's base64 int32 string -> the tensor.
* :func:`extend_routing`: a partial-rollout continuation's routing appended to the prefix's.
"""

from __future__ import annotations

import base64
from typing import List, Optional

import numpy as np
import torch

ROUTING_DTYPE = torch.int16  # more than 256 experts (or an unknown count)


def routing_dtype(num_experts) -> torch.dtype:
    """The storage dtype of expert ids: uint8 up to 256 experts (Qwen3-30B-A3B / 235B-A22B have
    128: 48 layers x top-8 = 384 bytes per token, kept per sample until the step trains), else int16."""
    return torch.uint8 if num_experts is not None and int(num_experts) <= 256 else ROUTING_DTYPE


class RoutingRecorder:
    """Keeps the top-k expert ids of the last forward of each MoE layer of an HF model.

    ``RoutingRecorder.attach(model)`` returns None for a model without Qwen3-MoE routers. The
    hooks keep a reference to the router's index output (no copy); :meth:`last` reshapes the
    last forward's ids to ``[batch, seq, layers, top_k]``.
    """

    def __init__(self, gates: list):
        self._ids: List[Optional[torch.Tensor]] = [None] * len(gates)
        self._handles = [g.register_forward_hook(self._hook(i)) for i, g in enumerate(gates)]
        self.num_layers = len(gates)
        self.dtype = routing_dtype(getattr(gates[0], "num_experts", None))

    @classmethod
    def attach(cls, model) -> Optional["RoutingRecorder"]:
        gates = [m for name, m in model.named_modules() if type(m).__name__.endswith("MoeTopKRouter")]
        return cls(gates) if gates else None

    def _hook(self, i: int):
        def hook(module, inputs, output):
            self._ids[i] = output[2]

        return hook

    def last(self, batch: int, seq: int) -> torch.Tensor:
        """The last forward's expert ids ``[batch, seq, layers, top_k]`` on the CPU (:func:`routing_dtype`)."""
        if any(x is None for x in self._ids):
            raise RuntimeError("RoutingRecorder.last: no forward recorded")
        ids = torch.stack([x.reshape(batch, seq, -1) for x in self._ids], dim=2)
        return ids.to("cpu", self.dtype)

    def clear(self) -> None:
        self._ids = [None] * self.num_layers

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def decode_sglang_routed_experts(value, num_layers: int, top_k: int, num_experts=None) -> Optional[torch.Tensor]:
    """SGLang 0.5.23's ``meta_info["routed_experts"]`` -> ``[n, num_layers, top_k]`` of
    :func:`routing_dtype` (``num_experts``).

    The detokenizer sends ``pybase64.b64encode(tensor.numpy().tobytes())`` of the int32 host
    buffer rows (sglang/srt/managers/detokenizer_manager.py:432-447; the tokenizer manager
    encodes the same way when it gets a tensor: tokenizer_manager.py:2602-2609), each row
    ``[num_layers, top_k]`` (state_capturer/base.py:63-75 allocates ``(num_tokens, num_layers,
    topk_size)`` int32). The wheel's own reader is ``extract_routed_experts_from_meta_info``
    (state_capturer/routed_experts.py:171-179). A tensor or list (no detokenizer) is accepted too.
    """
    if value is None:
        return None
    if isinstance(value, str):
        flat = np.frombuffer(base64.b64decode(value.encode("utf-8")), dtype=np.int32)
        t = torch.from_numpy(flat.copy())
    else:
        t = torch.as_tensor(value)
    per_row = num_layers * top_k
    if t.numel() % per_row:
        raise ValueError(f"routed_experts: {t.numel()} ids are not rows of {num_layers} layers x top-{top_k}")
    return t.reshape(-1, num_layers, top_k).to(routing_dtype(num_experts))


def extend_routing(prev: Optional[torch.Tensor], cont: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The routing of a sample continued by a partial rollout.

    ``prev`` covers the positions the first request fed (its prompt and all of its output but
    the last token); the continuation's prompt is ``prompt + prefix`` and its routing ``cont``
    covers all of it again (recomputed by the engine under newer weights) plus its own output.
    The positions ``prev`` has keep the routing under which their tokens were generated; the
    continuation adds the rest. Either None (the engine returned none): None.
    """
    if prev is None or cont is None:
        return None
    n = prev.shape[0]
    if cont.shape[0] < n or cont.shape[1:] != prev.shape[1:]:
        raise ValueError(
            f"extend_routing: continuation routing {tuple(cont.shape)} does not extend {tuple(prev.shape)}"
        )
    return torch.cat([prev, cont[n:]], dim=0)
