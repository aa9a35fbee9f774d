"""Routing replay (R3) in the trainer, on megatron-core 0.16's router replay hook.

megatron-core's ``TopKRouter`` calls ``self.router_replay.get_replay_topk(scores, topk, ...,
default_compute_topk)`` inside ``topk_routing_with_score_function`` when it has a
``router_replay`` (``transformer/moe/router_replay.py``). :func:`install` gives every router of
a model a :class:`ReplayRouter` (a ``RouterReplay`` that is NOT added to megatron's global
instance list, so models built one after another in a process do not share it), keyed by the
router's global layer index.

The replay targets of a micro-batch come from its ``routed_experts`` tensor
(``packing.pack_samples``: ``[1, T, layers, top_k]``, CP-split like the tokens; ``[b, s, ...]``
for a right-padded batch), one row per input position: the engine's expert ids, ``-1`` where the engine gave
none (the position routes freely) and ``-2`` on padding. :func:`set_targets` lays them out in
the order the router sees its tokens: ``[s, b]`` flattened, this TP rank's sequence slice under
sequence parallelism. On each router call:

* forward: the router's own top-k is computed, compared with the targets (metrics), and the
  targets replace it on every position that has one; the probabilities are the router's scores
  gathered at the replayed experts (megatron's ``REPLAY_FORWARD`` rule: for Qwen3-MoE's
  renormalised top-k, the softmax over the k replayed logits);
* recompute in backward (``--recompute-granularity``): the targets the forward used, in
  forward order (megatron's ``replay_backward_list`` FIFO; a router call inside autograd's
  backward is the recompute).

Metrics (:func:`collect_stats`): per layer, the agreement of the router's own top-k with the
engine's (before replacing it; in the old-logprob forward only, the one without gradients,
whose weights are the rollout's), the expert loads of the routing used, and the router
entropy (every forward outside backward), accumulated since the last collection.
"""

from __future__ import annotations

from typing import Optional

import torch
from megatron.core.transformer.moe.router_replay import RouterReplay

from ..algo.routing_metrics import router_entropy, topk_agreement
from ..distributed import collective_device

FREE = -1  # a position without the engine's routing: the router's own top-k
PAD = -2  # padding: no token


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


class ReplayRouter(RouterReplay):
    """One layer's replay state (see the module doc)."""

    def __init__(self, layer: int, num_experts: int, pre_softmax: bool):  # noqa: D107 (no global registration)
        self.target_topk_idx: Optional[torch.Tensor] = None
        self.recorded_topk_idx = None
        self.router_replay_action = None
        self.replay_backward_list: list = []
        # what megatron-core 0.19's RouterReplay.__init__ sets as well (its CUDA-graph buffer, unused
        # here; the router's 1-based layer number)
        self.static_buffer: Optional[torch.Tensor] = None
        self.layer_number: Optional[int] = int(layer) + 1
        self.layer, self.num_experts, self.pre_softmax = int(layer), int(num_experts), bool(pre_softmax)
        self.replay = True
        self.reset_stats()

    def reset_stats(self) -> None:
        # [agreement sum, agreement rows, entropy sum, entropy rows] + expert loads
        self.stats = torch.zeros(4 + self.num_experts, dtype=torch.float64)

    def set_target_indices(self, topk_indices: Optional[torch.Tensor], for_backward: bool = False):
        self.target_topk_idx = topk_indices
        if for_backward:
            self.replay_backward_list.append(topk_indices)

    def clear_indices(self):
        self.target_topk_idx = None
        self.replay_backward_list = []

    def get_replay_topk(self, scores, topk, num_groups=None, group_topk=None, default_compute_topk=None):
        vals, own = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        backward = _in_backward()
        if backward:
            target = self.replay_backward_list.pop(0) if self.replay_backward_list else None
        else:
            target = self.target_topk_idx
        idx = own
        if target is not None:
            target = target.to(scores.device, torch.long)
            if target.shape != own.shape:
                raise ValueError(
                    f"routing replay, layer {self.layer}: {tuple(target.shape)} targets for "
                    f"{tuple(own.shape)} routed tokens (token layout mismatch)"
                )
            if self.replay:
                idx = torch.where((target >= 0).all(-1, keepdim=True), target, own)
                vals = scores.gather(1, idx)
        if not backward:
            self.recorded_topk_idx = idx  # the routing used by the last forward call (tests, debugging)
            self._observe(scores, own, idx, target)
        return vals, idx

    @torch.no_grad()
    def _observe(self, scores, own, used, target) -> None:
        """Accumulate this call's sums on the scores' device (no host synchronisation)."""
        if self.stats.device != scores.device:
            self.stats = self.stats.to(scores.device)
        if target is None:
            real = torch.ones(own.shape[0], dtype=torch.float64, device=own.device)
        else:
            real = (target[:, 0] != PAD).to(torch.float64)
        st = torch.zeros_like(self.stats)
        if target is not None and not torch.is_grad_enabled():  # the old-logprob pass: rollout weights
            have = (target >= 0).all(-1).to(torch.float64)
            st[0] = (topk_agreement(own, target.clamp_min(-1)).to(torch.float64) * have).sum()
            st[1] = have.sum()
        s = scores.float()
        probs = s if self.pre_softmax else torch.softmax(s, dim=-1)
        st[2] = (router_entropy(probs).to(torch.float64) * real).sum()
        st[3] = real.sum()
        st[4:] = st[4:].index_add(0, used.reshape(-1), real.unsqueeze(1).expand(used.shape).reshape(-1))
        self.stats += st


def replay_routers(model) -> list:
    """The :class:`ReplayRouter` of every router of ``model`` (a chunk, possibly DDP-wrapped)."""
    return [m.router_replay for m in model.modules() if isinstance(getattr(m, "router_replay", None), ReplayRouter)]


def install(model) -> int:
    """Give every megatron-core ``TopKRouter`` of ``model`` a :class:`ReplayRouter` (layer index
    = the router's global layer number - 1); returns how many. Fused TE routing
    (``moe_router_fusion``) bypasses the hook and is refused."""
    from megatron.core.transformer.moe.router import TopKRouter

    n = 0
    for m in model.modules():
        if isinstance(m, TopKRouter):
            if m.config.moe_router_fusion:
                raise ValueError("routing replay needs moe_router_fusion off (the fused kernel has no replay hook)")
            m.router_replay = ReplayRouter(
                m.layer_number - 1, m.config.num_moe_experts, m.config.moe_router_pre_softmax
            )
            n += 1
    return n


def token_major(
    routed: torch.Tensor, tp_size: int = 1, tp_rank: int = 0, sequence_parallel: bool = False
) -> torch.Tensor:
    """A micro-batch's ``[b, s, layers, k]`` routing -> ``[tokens, layers, k]`` in the order the
    routers see their tokens: ``[s, b]`` flattened, this TP rank's ``s / tp`` slice under
    sequence parallelism."""
    r = routed.transpose(0, 1)  # [s, b, L, k]
    if sequence_parallel and tp_size > 1:
        s = r.shape[0]
        if s % tp_size:
            raise ValueError(f"routing replay: sequence length {s} not divisible by TP {tp_size}")
        r = r[tp_rank * (s // tp_size) : (tp_rank + 1) * (s // tp_size)]
    return r.reshape(-1, r.shape[2], r.shape[3])


def set_targets(model, routed: Optional[torch.Tensor]) -> None:
    """This micro-batch's targets for every :class:`ReplayRouter` of ``model`` (see the module doc);
    kept for the recompute in backward when gradients are on."""
    routers = replay_routers(model)
    if not routers:
        return
    if routed is None:
        for r in routers:
            r.set_target_indices(None, torch.is_grad_enabled())
        return
    from megatron.core import parallel_state as ps
    from megatron.core.utils import get_model_config

    sp = bool(getattr(get_model_config(model), "sequence_parallel", False))
    flat = token_major(routed, ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank(), sp)
    for r in routers:
        if r.layer >= flat.shape[1]:
            raise ValueError(
                f"routing replay: the rollout routing has {flat.shape[1]} layers, the model's layer {r.layer} has none"
            )
        r.set_target_indices(flat[:, r.layer].contiguous(), torch.is_grad_enabled())


def clear_targets(model) -> None:
    for r in replay_routers(model):
        r.clear_indices()


def set_replay(model, on: bool) -> None:
    """Replay (``on``) or only observe (``off``: the routers route themselves; metrics still
    compare their top-k with the targets)."""
    for r in replay_routers(model):
        r.replay = bool(on)


def collect_stats(model, groups=None) -> Optional[dict]:
    """The routing statistics accumulated since the last call, summed over ``groups`` (process
    groups whose ranks saw different tokens of the same layers: the TP group under sequence
    parallelism, the CP group) and over the pipeline stages (each holds its own layers); reset.
    Returns ``{"layers": L, "stats": float64 [L, 4 + E]}`` (see :class:`ReplayRouter`) or None
    without routers."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    routers = replay_routers(model)
    if not routers:
        return None
    from megatron.core.utils import get_model_config

    if groups is None:  # ranks that saw other tokens of the same layers
        groups = []
        if getattr(get_model_config(model), "sequence_parallel", False):
            groups.append(ps.get_tensor_model_parallel_group())
        groups.append(ps.get_context_parallel_group())
    n_layers = int(get_model_config(model).num_layers)
    E = routers[0].num_experts
    st = torch.zeros(n_layers, 4 + E, dtype=torch.float64)
    for r in routers:
        st[r.layer] += r.stats.cpu()
        r.reset_stats()
        r.recorded_topk_idx = None  # (device memory held across the rollout otherwise)
    if dist.is_initialized():
        for g in list(groups) + [ps.get_pipeline_model_parallel_group()]:
            if g is not None and dist.get_world_size(g) > 1:
                t = st.to(collective_device(g))
                dist.all_reduce(t, group=g)
                st = t.cpu()
    return {"layers": n_layers, "stats": st}
