"""Per-step metrics: one flat JSON object per line in RUN_DIR/metrics.jsonl, plus wandb/tensorboard.

The key names of metrics.jsonl are a contract (the diagnosis tool and users' scripts read
them); see docs/metrics.md.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from typing import Optional

REQUIRED_KEYS = (
    "step",
    "reward_mean",
    "acc_mean",
    "entropy",
    "clip_frac_low",
    "clip_frac_high",
    "approx_kl",
    "grad_norm",
    "kept_group_ratio",
    "all_correct_ratio",
    "all_wrong_ratio",
    "num_gen_batches",
    "response_length_mean",
    "response_length_max",
    "repetition_rate",
    "truncation_ratio",
    "overlong_penalty_mean",
    "no_answer_rate",
    "train_infer_logprob_diff",
    "time_generate",
    "time_verify",
    "time_old_logprob",
    "time_train",
    "time_sync",
    "time_offload",
    "time_save",
    "time_step",
    "tokens_per_second",
)


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else v
    return v


class MetricsLogger:
    def __init__(
        self,
        run_dir: str,
        cfg_dict: dict,
        wandb_project: Optional[str],
        wandb_mode: str,
        tensorboard: bool,
        run_id: Optional[str] = None,
    ):
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.run_id = run_id
        self._wandb = None
        self._tb = None
        if wandb_mode != "disabled":
            try:
                import wandb  # optional, only with --wandb-mode other than disabled

                os.environ.setdefault("WANDB_SILENT", "true")
                self._wandb = wandb.init(
                    # mode: one of --wandb-mode's choices (config validation), all wandb's own
                    project=wandb_project or "megatron-dapo",
                    mode=wandb_mode,  # type: ignore[arg-type]
                    dir=run_dir,
                    config=cfg_dict,
                    id=run_id,
                    resume="allow" if run_id else None,
                    reinit=True,
                )
                self.run_id = self._wandb.id
            except Exception as e:  # logging must never stop a run
                print(f"[megatron-dapo] wandb disabled: {e}")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # optional (tensorboard), only with --tensorboard

            self._tb = SummaryWriter(os.path.join(run_dir, "tensorboard"))

    def truncate_after(self, step: int) -> Optional[str]:
        """On resume: drop lines of steps after the checkpoint (they will be re-run). The whole
        file as it was is kept first in ``aside-<time>/metrics.jsonl`` when a line goes (its
        path is returned): nothing a run logged is lost."""
        if not os.path.exists(self.path):
            return None
        keep, total = [], 0
        with open(self.path) as f:
            for line in f:
                total += 1
                try:
                    if json.loads(line)["step"] <= step:
                        keep.append(line)
                except Exception:
                    pass
        if len(keep) == total:
            return None
        aside = os.path.join(os.path.dirname(self.path), f"aside-{time.strftime('%Y%m%d-%H%M%S')}")
        while os.path.exists(aside):
            aside += "-1"
        os.makedirs(aside)
        shutil.copy2(self.path, os.path.join(aside, "metrics.jsonl"))
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(keep)
        os.replace(tmp, self.path)
        return os.path.join(aside, "metrics.jsonl")

    def log(self, metrics: dict) -> None:
        m = {k: _clean(v) for k, v in metrics.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps(m, sort_keys=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        step = metrics["step"]
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in m.items() if isinstance(v, (int, float)) and v is not None}, step=step)
        if self._tb is not None:
            for k, v in m.items():
                if isinstance(v, (int, float)) and v is not None:
                    self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
        if self._tb is not None:
            self._tb.close()
