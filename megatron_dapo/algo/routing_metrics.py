"""Routing metrics of a mixture-of-experts model (routing replay, docs/moe.md): pure functions
of tensors, no process groups.

* :func:`topk_agreement`: per token, the share of the engine's top-k experts the trainer's
  router also chose (1.0: the same set).
* :func:`router_entropy`: per token, the entropy of the router's distribution over all experts.
* :func:`load_imbalance`: max over mean of the experts' token loads (1.0: balanced).
* :func:`layer_metrics`: the metrics.jsonl keys of per-layer sums (what the trainer accumulates).
"""

from __future__ import annotations

import math

import torch


def topk_agreement(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``|set(a_t) & set(b_t)| / k`` per token of two ``[tokens, k]`` top-k index tensors (order
    within a row does not matter; indices within a row are distinct). Returns float ``[tokens]``."""
    if a.shape != b.shape:
        raise ValueError(f"topk_agreement: shapes {tuple(a.shape)} and {tuple(b.shape)} differ")
    k = a.shape[-1]
    if k == 0:
        return torch.ones(a.shape[:-1])
    same = (a.unsqueeze(-1) == b.unsqueeze(-2)).any(-1)  # [tokens, k]: a's expert is among b's
    return same.float().sum(-1) / k


def router_entropy(probs: torch.Tensor) -> torch.Tensor:
    """``H = -sum_e p_e log p_e`` (nats) per row of ``[tokens, experts]`` probabilities (0 log 0 = 0).
    The maximum is ``log(experts)`` (uniform routing)."""
    p = probs.float()
    return -(torch.where(p > 0, p * torch.log(p.clamp_min(1e-30)), torch.zeros_like(p))).sum(-1)


def load_imbalance(loads: torch.Tensor) -> float:
    """``max(loads) / mean(loads)`` of the experts' token counts of one layer; 1.0 is perfectly
    balanced, ``experts`` means one expert took every token; 1.0 when no token was routed."""
    loads = torch.as_tensor(loads, dtype=torch.float64)
    mean = float(loads.mean()) if loads.numel() else 0.0
    return float(loads.max()) / mean if mean > 0 else 1.0


def layer_metrics(stats: torch.Tensor) -> dict:
    """metrics.jsonl keys from per-layer sums ``stats`` float ``[layers, 4 + experts]``: columns
    agreement sum, agreement tokens, entropy sum, entropy tokens, then the expert loads.

    ``moe/routing_agreement/layer_{l}`` (only where the engine's routing was compared),
    ``moe/load_imbalance/layer_{l}``, ``moe/router_entropy/layer_{l}``, and the means over layers
    ``moe/routing_agreement``, ``moe/routing_agreement_min`` (the worst layer),
    ``moe/load_imbalance``, ``moe/load_imbalance_max``, ``moe/router_entropy``."""
    out, agree, imb, ent = {}, [], [], []
    for l, row in enumerate(stats.tolist()):
        if row[1] > 0:
            agree.append(row[0] / row[1])
            out[f"moe/routing_agreement/layer_{l}"] = agree[-1]
        if row[3] > 0:
            ent.append(row[2] / row[3])
            out[f"moe/router_entropy/layer_{l}"] = ent[-1]
            imb.append(load_imbalance(torch.tensor(row[4:])))
            out[f"moe/load_imbalance/layer_{l}"] = imb[-1]
    if agree:
        out["moe/routing_agreement"] = sum(agree) / len(agree)
        out["moe/routing_agreement_min"] = min(agree)
    if imb:
        out["moe/load_imbalance"] = sum(imb) / len(imb)
        out["moe/load_imbalance_max"] = max(imb)
        out["moe/router_entropy"] = sum(ent) / len(ent)
    return {k: (v if math.isfinite(v) else float("nan")) for k, v in out.items()}
