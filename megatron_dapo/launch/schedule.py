"""The LR schedule the dry run prints: optimizer steps per rollout step, warm-up and run length
in both units (pure function of the config tree)."""

from __future__ import annotations

import dataclasses

from ..config.schema import DAPOConfig
from ..config.validate import lr_warmup_optimizer_steps


@dataclasses.dataclass(frozen=True)
class LRSchedule:
    lr: float
    optimizer_steps_per_rollout_step: int
    warmup_optimizer_steps: int
    warmup_rollout_steps: float
    total_rollout_steps: int
    total_optimizer_steps: int


def lr_schedule(cfg: DAPOConfig) -> LRSchedule:
    o, r = cfg.optim, cfg.rollout
    per = (r.rollout_batch_size * r.n_samples_per_prompt) // o.global_batch_size
    warm = lr_warmup_optimizer_steps(cfg)
    return LRSchedule(
        lr=o.lr,
        optimizer_steps_per_rollout_step=per,
        warmup_optimizer_steps=warm,
        warmup_rollout_steps=warm / per if per else float("nan"),
        total_rollout_steps=cfg.run.num_rollout_steps,
        total_optimizer_steps=cfg.run.num_rollout_steps * per,
    )
