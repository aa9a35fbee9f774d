"""The DAPO driver: ``python -m megatron_dapo.train [flags]`` (``--help`` lists them).

One rollout step, top to bottom (see docs/design.md for the picture):

1. generate + verify + dynamic-sampling filter          (RolloutManager.collect)
2. rewards -> group advantages, overlong filtering       (driver/batch.py)
3. engine releases weights and KV cache                  (hybrid order, docs/hybrid.md)
4. old-policy logprobs recomputed by megatron            (PolicyWorker.compute_logprobs)
5. one optimizer step per --global-batch-size responses  (PolicyWorker.train)
6. engine resumes weights, bucketed TP/PP -> HF sync, resumes KV cache, probe
7. metrics, rollout dump, checkpoint
"""

from __future__ import annotations

import codecs
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch

from .config import ConfigError, parse_args, validate
from .driver.batch import assign_advantages, dp_shards, minibatches
from .driver.cluster import Cluster
from .models import parse_hf_config


class TrainingError(RuntimeError):
    pass


# ---------------------------------------------------------------------------- setup helpers

def hf_config_source(cfg) -> str:
    """Where the model shape comes from: --hf-checkpoint, else a --pretrained-checkpoint/--load metadata."""
    if cfg.model.hf_checkpoint:
        return cfg.model.hf_checkpoint
    raise ConfigError("--hf-checkpoint is required (the model shape and tokenizer are read from its config.json)")


def _mean(xs):
    xs = list(xs)
    return float(sum(xs) / len(xs)) if xs else 0.0


# ---------------------------------------------------------------------------- the run

class Trainer:
    def __init__(self, cfg):
        from transformers import AutoTokenizer

        from .data import ResumableSampler, load_prompt_dataset
        from .reward import BatchScorer, reward_needs_label

        self.cfg = cfg
        self.hf_dir = hf_config_source(cfg)
        self.arch = parse_hf_config(self.hf_dir)
        self.run_dir = cfg.logging.run_dir
        os.makedirs(self.run_dir, exist_ok=True)
        with open(os.path.join(self.run_dir, "config.json"), "w") as f:
            json.dump(cfg.to_dict(), f, indent=1, default=str)
        tok_dir = cfg.model.tokenizer or self.hf_dir
        self.tokenizer = AutoTokenizer.from_pretrained(tok_dir)
        self.tokenizer_dir = tok_dir
        if not cfg.data.prompt_data:
            raise ConfigError("--prompt-data is required")
        self.dataset = load_prompt_dataset(
            cfg.data.prompt_data, self.tokenizer, cfg.data.max_prompt_length, cfg.data.prompt_overflow,
            cfg.data.apply_chat_template, cfg.data.skip_bad_rows, needs_label=reward_needs_label(cfg.reward),
        )
        st = self.dataset.stats
        print(f"[data] {len(self.dataset)} prompts from {cfg.data.prompt_data} ({st.rows} rows, {st.duplicates_removed} "
              f"duplicates removed, {st.skipped_long} too long skipped, {st.truncated} left-truncated, {st.bad_rows} bad rows)")
        self.sampler = ResumableSampler(len(self.dataset), cfg.optim.seed, cfg.data.shuffle)
        self.scorer = BatchScorer.from_config(cfg.reward)
        self.rng = random.Random(cfg.optim.seed)
        self.step = 0
        self.skipped_in_a_row = 0
        self.num_syncs = 0
        self.run_id = None
        self.offload_train = cfg.rollout.offload_train if cfg.rollout.offload_train is not None else torch.cuda.is_available()
        self._trainer_resident = True
        self.data_fingerprint = self.dataset.fingerprint

    # -- state that the driver owns (the ranks own model/optimizer/scheduler) --------------
    def driver_state(self) -> dict:
        return {
            "step": self.step,
            "sampler": self.sampler.state_dict(),
            "rollout_manager": self.manager.state_dict(),
            "driver_rng": self.rng.getstate(),
            "torch_rng": torch.get_rng_state(),
            "numpy_rng": np.random.get_state(),
            "skipped_in_a_row": self.skipped_in_a_row,
            "num_syncs": self.num_syncs,
            "run_id": self.logger.run_id,
            "data_fingerprint": self.data_fingerprint,
            "data_path": self.cfg.data.prompt_data,
        }

    def load_driver_state(self, s: dict) -> None:
        from .data import check_fingerprint

        check_fingerprint(s.get("data_fingerprint"), self.data_fingerprint, self.cfg.data.allow_data_change,
                          self.cfg.data.prompt_data)
        self.step = int(s["step"])
        self.sampler.load_state_dict(s["sampler"])
        self.manager.load_state_dict(s["rollout_manager"])
        self.rng.setstate(s["driver_rng"])
        torch.set_rng_state(s["torch_rng"])
        np.random.set_state(s["numpy_rng"])
        self.skipped_in_a_row = int(s["skipped_in_a_row"])
        self.num_syncs = int(s["num_syncs"])

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> dict:
        from .driver import checkpoint_dirs as checkpoints
        from .driver.logging import MetricsLogger
        from .driver.rollout_manager import EnginePool, RolloutManager

        cfg = self.cfg
        self.cluster = Cluster(cfg, self.hf_dir, self.tokenizer_dir)
        resume_dir = checkpoints.resolve(cfg.checkpoint.load) if cfg.checkpoint.load else None
        if cfg.checkpoint.load and resume_dir is None:
            raise ConfigError(f"--load {cfg.checkpoint.load}: no checkpoint found (no 'latest' pointer or {checkpoints.STATE_FILE})")
        state = None
        if resume_dir:
            state = torch.load(os.path.join(resume_dir, checkpoints.STATE_FILE), weights_only=False)
            self.run_id = state.get("run_id")
        self.logger = MetricsLogger(self.run_dir, cfg.to_dict(), cfg.logging.wandb_project, cfg.logging.wandb_mode,
                                    cfg.logging.tensorboard, run_id=self.run_id)
        self.engines = EnginePool(self.cluster.make_engine, self.cluster.num_engines, self._sync_into,
                                  cfg.rollout.engine_timeout_s)
        self.manager = RolloutManager(cfg, self.dataset, self.sampler, self.engines, self.scorer, self.tokenizer)
        if resume_dir:
            self.cluster.call("load", resume_dir)
            self.load_driver_state(state)
            if state.get("rank_rng"):
                self.cluster.call("set_rng_state", per_rank=[(r,) for r in state["rank_rng"]])
            self.logger.truncate_after(self.step)
            print(f"[resume] {resume_dir}: continuing after step {self.step}")
        else:
            self.logger.truncate_after(0)  # a fresh run starts a fresh metrics.jsonl
            src = self.cluster.call("load_initial_weights")[0]
            print(f"[init] weights from {src}")
        if cfg.algo.kl_coef > 0:
            print(f"[init] reference model for KL from {self.cluster.call('build_reference')[0]}")
        if cfg.checkpoint.save:
            checkpoints.clean_stale(cfg.checkpoint.save)
        self._sync_into(self.engines.handles)
        self._set_trainer_resident(False)  # the engine generates first
        last = {}
        try:
            while self.step < cfg.run.num_rollout_steps:
                self.step += 1
                last = self.one_step(self.step)
                if cfg.checkpoint.save and (
                    (cfg.checkpoint.save_interval and self.step % cfg.checkpoint.save_interval == 0)
                    or self.step == cfg.run.num_rollout_steps
                ):
                    t = time.perf_counter()
                    self.save_checkpoint()
                    last["time_save"] = time.perf_counter() - t
                self.logger.log(last)
        finally:
            self.logger.close()
            self.scorer.close()
        self.finish()
        return last

    def _set_trainer_resident(self, resident: bool) -> None:
        """Onload/offload trainer params, grads and optimizer state (--offload-train)."""
        if self.offload_train and resident != self._trainer_resident:
            self.cluster.call("onload" if resident else "offload")
        self._trainer_resident = resident

    def _sync_into(self, handles) -> dict:
        """Weight sync into ``handles`` (also used to re-sync a restarted engine mid-rollout)."""
        was = self._trainer_resident
        self._set_trainer_resident(True)
        out = self.cluster.sync(handles)
        self._set_trainer_resident(was)
        self.num_syncs += 1
        return out

    def one_step(self, step: int) -> dict:
        import ray

        from .diagnostics import repetition_rate

        cfg, a = self.cfg, self.cfg.algo
        t_step = time.perf_counter()
        # 1. rollout: generate, verify, filter on raw accuracy
        self.engines.kill_next_generation = cfg.run.kill_engine_at_step == step
        roll = self.manager.collect(step)
        # 2. rewards -> advantages; overlong filtering
        samples = assign_advantages(roll.groups, a)
        extra = [s for g in self.manager.surplus for s in g.samples if s.old_logprobs is None]
        # 3. engine sleeps (weights + KV cache) while the trainer wakes up
        t = time.perf_counter()
        ray.get([h.release_memory.remote() for h in self.engines.handles])
        self._set_trainer_resident(True)
        t_offload = time.perf_counter() - t
        # 4. old-policy logprobs by megatron (not the engine's)
        t = time.perf_counter()
        need = [s for s in samples if s.old_logprobs is None] + extra
        self._compute_old_logprobs(need)
        if a.kl_coef > 0:  # frozen reference policy (--ref-load or the initial weights)
            self._compute_old_logprobs([s for s in need if s.ref_logprobs is None], method="compute_ref_logprobs",
                                       field="ref_logprobs")
        t_old = time.perf_counter() - t
        # 5. one optimizer step per --global-batch-size responses
        if cfg.run.dump_train_batch:
            self._dump_train_batch(step, samples, "before")
        t = time.perf_counter()
        train_metrics = self._train(samples, inject_nan=(cfg.run.inject_nan_at_step == step))
        t_train = time.perf_counter() - t
        if cfg.run.dump_train_batch:
            self._dump_train_batch(step, samples, "after")
        # 6. engine wakes: weights first, sync, then KV cache; probe
        t = time.perf_counter()
        ray.get([h.resume_memory.remote(["weights"]) for h in self.engines.handles])
        t_offload += time.perf_counter() - t
        t = time.perf_counter()
        sync = self._sync_into(self.engines.handles)
        t_sync = time.perf_counter() - t
        check = cfg.rollout.check_weight_sync_every and self.num_syncs % cfg.rollout.check_weight_sync_every == 0
        probe = self._probe_reference(samples[0]) if check and samples else None  # trainer still resident
        t = time.perf_counter()
        self._set_trainer_resident(False)
        ray.get([h.resume_memory.remote(["kv_cache"]) for h in self.engines.handles])
        t_offload += time.perf_counter() - t
        probe_diff = self._probe_compare(*probe) if probe else None
        # 7. metrics
        gen = [s for g in roll.generated for s in g.samples]
        n_groups = max(len(roll.generated), 1)
        diffs = [abs(o - e) for s in samples if s.old_logprobs for o, e in zip(s.old_logprobs, s.engine_logprobs)
                 if s.step_generated == step]
        resp_tokens = sum(len(s.response_ids) for s in gen)
        m = {
            "step": step,
            "reward_mean": _mean(s.reward for s in gen),
            "acc_mean": _mean(float(s.acc) for s in gen),
            "score_mean": _mean(s.score for s in gen),
            **train_metrics,
            "kept_group_ratio": roll.num_kept / n_groups,
            "all_correct_ratio": roll.num_all_correct / n_groups,
            "all_wrong_ratio": roll.num_all_wrong / n_groups,
            "num_gen_batches": roll.num_gen_batches,
            "num_groups_generated": len(roll.generated),
            "surplus_reused_ratio": roll.reused / max(len(roll.groups), 1),
            "response_length_mean": _mean(len(s.response_ids) for s in gen),
            "response_length_max": max((len(s.response_ids) for s in gen), default=0),
            "repetition_rate": float(repetition_rate([s.response_ids for s in gen])) if gen else 0.0,
            "truncation_ratio": _mean(float(s.finish_reason == "length") for s in gen),
            "overlong_penalty_mean": _mean(s.overlong_penalty for s in gen),
            "no_answer_rate": _mean(float(s.reason == "no_answer") for s in gen),
            "timeout_rate": _mean(float(s.reason == "timeout") for s in gen),
            "train_infer_logprob_diff": _mean(diffs),
            "train_infer_logprob_diff_max": max(diffs, default=0.0),
            "weight_sync_probe_diff": probe_diff,
            "engine_restarts": self.engines.restarts,
            "sync_bytes": sync.get("bytes", 0),
            "time_generate": roll.time_generate,
            "time_verify": roll.time_verify,
            "time_old_logprob": t_old,
            "time_train": t_train,
            "time_sync": t_sync,
            "time_offload": t_offload,
            "time_save": 0.0,
        }
        m["time_step"] = time.perf_counter() - t_step
        m["tokens_per_second"] = resp_tokens / max(m["time_step"], 1e-9)
        if cfg.logging.dump_rollouts_every and step % cfg.logging.dump_rollouts_every == 0:
            self._dump(step, roll)
        if cfg.logging.eval_interval and step % cfg.logging.eval_interval == 0 and cfg.data.eval_data:
            m.update(self._evaluate())
        print(self._summary(m), flush=True)
        return m

    def _compute_old_logprobs(self, samples: list, method: str = "compute_logprobs", field: str = "old_logprobs") -> None:
        """Forward-only logprobs of the response tokens by megatron, sharded over DP ranks."""
        if not samples:
            return
        dp, reporters = self.cluster.dp_layout()
        items = [s.to_worker() for s in samples]
        shards = [items[d::dp] for d in range(dp)]
        per_rank = [(shards[info["dp_rank"]],) for info in self.cluster.infos]
        outs = self.cluster.call(method, per_rank=per_rank)
        for d in range(dp):
            got = outs[reporters[d]]
            for s, lp in zip(samples[d::dp], got):
                setattr(s, field, lp)

    def _train(self, samples: list, inject_nan: bool) -> dict:
        cfg = self.cfg
        dp, reporters = self.cluster.dp_layout()
        mbs = minibatches(samples, cfg.optim.global_batch_size)
        shards_per_mb = [dp_shards([s.to_worker() for s in mb], dp) for mb in mbs]
        outs = [[] for _ in self.cluster.infos]
        steps = range(len(shards_per_mb))
        if cfg.logging.progress:
            from tqdm.auto import tqdm

            steps = tqdm(steps, desc=f"step {self.step} train", unit="opt-step", leave=False)
        for k in steps:  # one optimizer step per mini-batch
            per_rank = [([shards_per_mb[k][info["dp_rank"]]],) for info in self.cluster.infos]
            for r, o in enumerate(self.cluster.call("train", per_rank=per_rank, inject_nan=inject_nan)):
                outs[r].extend(o)
        # reduce metrics over DP reporters and optimizer steps
        sums = {}
        ratio_max, norms, skipped, lr = 0.0, [], 0, 0.0
        for d, r in reporters.items():
            for step_out in outs[r]:
                for k, (s, c) in step_out["sums"].items():
                    acc = sums.setdefault(k, [0.0, 0.0])
                    acc[0] += s
                    acc[1] += c
                ratio_max = max(ratio_max, step_out["ratio_max"])
        for step_out in outs[0]:
            norms.append(step_out["grad_norm"])
            skipped += 0 if step_out["update_successful"] else 1
            lr = step_out["lr"]
        if skipped:
            self.skipped_in_a_row += 1
            print(f"[train] step {self.step}: {skipped} optimizer step(s) skipped (non-finite loss or grad norm)")
            if self.skipped_in_a_row >= cfg.optim.max_skipped_steps:
                raise TrainingError(
                    f"{self.skipped_in_a_row} rollout steps in a row had non-finite gradients (--max-skipped-steps "
                    f"{cfg.optim.max_skipped_steps}): lower --lr, check the data, or resume from the last checkpoint"
                )
        else:
            self.skipped_in_a_row = 0
        m = {k: (v[0] / v[1] if v[1] else 0.0) for k, v in sums.items()}
        finite = [n for n in norms if n is not None and math.isfinite(n)]
        m.update({
            "ratio_max": ratio_max,
            "grad_norm": _mean(finite) if finite else float("nan"),
            "optimizer_steps": len(norms),
            "skipped_optimizer_steps": skipped,
            "lr": lr,
        })
        return m

    def _probe_reference(self, sample):
        """Megatron's logprobs of one fixed sequence (the first trained sample), right after a sync."""
        item = {"tokens": list(sample.prompt_ids) + list(sample.response_ids), "prompt_len": len(sample.prompt_ids)}
        if len(item["tokens"]) <= item["prompt_len"]:
            item["tokens"] = item["tokens"] + [0]
        dp, reporters = self.cluster.dp_layout()
        mine = self.cluster.call("compute_logprobs", per_rank=[([item],) for _ in self.cluster.infos])[reporters[0]][0]
        return item, mine

    def _probe_compare(self, item, mine) -> float:
        """Score the same sequence with every engine; fail loudly above --weight-sync-tolerance."""
        import ray

        from .hybrid.weight_sync import WeightSyncError

        worst = 0.0
        for h in self.engines.handles:
            theirs = ray.get(h.score.remote([item["tokens"]], [item["prompt_len"]]))[0]
            worst = max(worst, max(abs(x - y) for x, y in zip(mine, theirs)))
        if worst > self.cfg.rollout.weight_sync_tolerance:
            raise WeightSyncError(
                f"weight sync probe: max |logp_engine - logp_megatron| = {worst:.3g} > --weight-sync-tolerance "
                f"{self.cfg.rollout.weight_sync_tolerance} after sync {self.num_syncs}: the engine's weights differ "
                "from the trainer's"
            )
        return worst

    def _dump_train_batch(self, step: int, samples: list, when: str) -> None:
        """Testing: the exact worker inputs of this step and the full weights around it."""
        weights = {}
        for part in self.cluster.call("full_weights"):
            weights.update(part)
        out = {"weights": weights}
        if when == "before":
            out["samples"] = [s.to_worker() for s in samples]
            out["global_batch_size"] = self.cfg.optim.global_batch_size
        os.makedirs(self.cfg.run.dump_train_batch, exist_ok=True)
        torch.save(out, os.path.join(self.cfg.run.dump_train_batch, f"step_{step:06d}_{when}.pt"))

    def _dump(self, step: int, roll) -> None:
        d = os.path.join(self.run_dir, "rollouts")
        os.makedirs(d, exist_ok=True)
        kept = {id(g) for g in roll.groups}
        with open(os.path.join(d, f"step_{step:06d}.jsonl"), "w") as f:
            for g in roll.generated:
                for s in g.samples:
                    f.write(json.dumps({
                        "step": step, "prompt_index": s.prompt_index,
                        "prompt": self.dataset[s.prompt_index].prompt_text, "response": s.response_text,
                        "ground_truth": s.ground_truth, "pred": s.pred, "score": s.score, "reward": s.reward,
                        "acc": s.acc, "reason": s.reason, "response_length": len(s.response_ids),
                        "finish_reason": s.finish_reason, "advantage": s.advantage, "kept": id(g) in kept,
                    }) + "\n")

    def _evaluate(self) -> dict:
        from .driver.actors import RemoteEngine
        from .eval.runner import dataset_name, eval_log_keys, evaluate

        out, lg = {}, self.cfg.logging
        for path in self.cfg.data.eval_data:
            res = evaluate(RemoteEngine(self.engines.handles[0]), self.tokenizer, path, progress=False,
                           max_new_tokens=self.cfg.algo.max_response_length, scorer=self.scorer, k=lg.eval_k,
                           temperature=lg.eval_temperature, top_p=lg.eval_top_p, prompt_style=lg.eval_prompt_style,
                           context_length=self.arch.max_position_embeddings,
                           apply_chat_template=self.cfg.data.apply_chat_template,
                           out_dir=os.path.join(self.run_dir, "eval", f"step_{self.step:06d}", dataset_name(path)))
            out.update(eval_log_keys(res, dataset_name(path)))
        return out

    def save_checkpoint(self) -> str:
        from .checkpoint.dist_ckpt import checkpoint_metadata
        from .driver import checkpoint_dirs as checkpoints

        root = self.cfg.checkpoint.save
        tmp = checkpoints.tmp_dir(root, self.step)
        meta = checkpoint_metadata(self.hf_dir, "bf16" if self.cfg.model.bf16 else "fp32", extra={"step": self.step})
        was = self._trainer_resident
        self._set_trainer_resident(True)
        self.cluster.call("save", tmp, meta)
        self._set_trainer_resident(was)
        state = self.driver_state()
        state["rank_rng"] = self.cluster.call("rng_state")
        if self.cfg.run.crash_during_save_at_step == self.step:  # testing: die mid-save
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        torch.save(state, os.path.join(tmp, checkpoints.STATE_FILE))
        path = checkpoints.commit(root, self.step, self.cfg.checkpoint.keep_last)
        if self.cfg.checkpoint.save_hf_interval and self.step % self.cfg.checkpoint.save_hf_interval == 0:
            self.export_hf(os.path.join(path, "hf"))
        return path

    def export_hf(self, directory: str) -> str:
        import ray

        return ray.get(self.engines.handles[0].save_hf.remote(directory))

    def finish(self) -> None:
        from .driver.plots import plot_training_curves

        try:
            plot_training_curves(os.path.join(self.run_dir, "metrics.jsonl"), os.path.join(self.run_dir, "training_curves.png"))
        except Exception as e:
            print(f"[plot] skipped: {e}")
        if self.cfg.checkpoint.save_hf_interval or os.environ.get("MEGATRON_DAPO_EXPORT_FINAL_HF"):
            self.export_hf(os.path.join(self.run_dir, "final_hf"))

    @staticmethod
    def _summary(m: dict) -> str:
        return (
            f"[step {m['step']}] acc {m['acc_mean']:.3f} reward {m['reward_mean']:+.3f} kept {m['kept_group_ratio']:.2f} "
            f"rounds {m['num_gen_batches']} len {m['response_length_mean']:.1f} ent {m.get('entropy', 0):.3f} "
            f"clip {m.get('clip_frac_low', 0):.3f}/{m.get('clip_frac_high', 0):.3f} gnorm {m.get('grad_norm', 0):.3f} "
            f"probe {m['weight_sync_probe_diff'] if m['weight_sync_probe_diff'] is not None else '-'} "
            f"time {m['time_step']:.1f}s (gen {m['time_generate']:.1f} train {m['time_train']:.1f} sync {m['time_sync']:.2f})"
        )


def main(argv=None) -> int:
    cfg = parse_args(argv)
    cfg.rollout.stop = [codecs.decode(s, "unicode_escape") for s in cfg.rollout.stop]
    try:
        arch = parse_hf_config(hf_config_source(cfg))
        if cfg.run.dry_run:  # validates for the target hardware (GPU flags on a CPU login node)
            from .launch.plan import dry_run_report

            print(dry_run_report(cfg, arch, hf_config_source(cfg)))
            return 0
        for w in validate(cfg, arch):
            print(f"[config] warning: {w}", file=sys.stderr)
        trainer = Trainer(cfg)
        trainer.run()
    except ConfigError as e:
        print(f"megatron_dapo.train: configuration error: {e}", file=sys.stderr)
        return 2
    finally:
        t = locals().get("trainer")
        if t is not None and getattr(t, "cluster", None) is not None:
            t.cluster.shutdown(t.engines.handles if getattr(t, "engines", None) else ())
    return 0


if __name__ == "__main__":
    sys.exit(main())
