"""The DAPO driver: ``python -m megatron_dapo.train [flags]`` (``--help`` lists them).

One rollout step, top to bottom (see docs/design.md for the picture):

1. generate + verify + dynamic-sampling filter          (RolloutManager.collect)
2. rewards -> group advantages, overlong filtering       (driver/batch.py)
3. engines release their memory, trainer onloads         (HybridStep.to_train, docs/hybrid.md)
4. old-policy logprobs recomputed by megatron            (PolicyWorker.compute_logprobs)
5. rollout x G / --global-batch-size optimizer steps     (PolicyWorker.train; samples without a
   trainable token left out, driver/batch.py)
6. engines resume weights, bucketed TP/PP -> HF sync,    (HybridStep.to_rollout)
   probe, trainer offloads, engines resume KV cache
7. metrics, rollout dump, checkpoint                     (driver/metrics.py, driver/debug.py)
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time

import numpy as np
import torch

from .config import ConfigError, parse_args, validate
from .config.validate import load_tokenizer
from .errors import report_user_error
from .driver.batch import assign_advantages, dp_partition, dp_shards, minibatches, optimizer_steps, training_samples
from .driver.cluster import Cluster
from .models import parse_hf_config


class TrainingError(RuntimeError):
    pass


# ---------------------------------------------------------------------------- setup helpers

def hf_config_source(cfg) -> str:
    """Where the model shape and the tokenizer come from: --hf-checkpoint (required; a torch_dist checkpoint
    holds the weights, not the tokenizer files)."""
    if cfg.model.hf_checkpoint:
        return cfg.model.hf_checkpoint
    raise ConfigError("--hf-checkpoint is required (the model shape and tokenizer are read from its config.json)")


# ---------------------------------------------------------------------------- the run

class Trainer:
    def __init__(self, cfg):
        from .data import ResumableSampler, load_prompt_dataset
        from .reward import BatchScorer, reward_needs_label

        self.cfg = cfg
        self.hf_dir = hf_config_source(cfg)
        self.arch = parse_hf_config(self.hf_dir)
        self.run_dir = cfg.logging.run_dir  # written only once the checks of run() passed (driver/run_dir.py)
        tok_dir = cfg.model.tokenizer or self.hf_dir
        self.tokenizer = load_tokenizer(tok_dir, "--tokenizer" if cfg.model.tokenizer else "--hf-checkpoint")
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
        self.run_id = None
        self.offload_train = cfg.rollout.offload_train if cfg.rollout.offload_train is not None else torch.cuda.is_available()
        self._probe_tokens = list(self.dataset[0].prompt_ids) if len(self.dataset) else []
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
            "num_syncs": self.hybrid.num_syncs,
            "probe_tokens": self._probe_tokens,
            "run_id": self.run_id,
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
        self.hybrid.num_syncs = int(s["num_syncs"])
        self._probe_tokens = list(s.get("probe_tokens") or self._probe_tokens)

    # -- resume on this or another layout (megatron_dapo/training/train_checkpoint.py) --------
    def layout(self) -> dict:
        """This run's layout, in the keys of a checkpoint's ``layout`` record."""
        from .training.train_checkpoint import run_layout

        p = self.cfg.parallel
        hosts = {i.get("node_ip") for i in self.cluster.infos if i.get("node_ip")}
        return run_layout(p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size,
                          self.cluster.world, len(hosts) or None, p.use_distributed_optimizer)

    def check_resume_layout(self, resume_dir: str) -> str:
        """The note on resuming ``resume_dir`` at this run's layout; a CheckpointError (one
        line) before any rank reads it when that is not supported."""
        from .checkpoint.dist_ckpt import CheckpointError, checkpoint_layout, read_metadata, resume_note

        ok, note = resume_note(checkpoint_layout(read_metadata(resume_dir)), self.layout())
        if not ok:
            raise CheckpointError(f"--load {resume_dir}: cannot resume: {note}")
        return note

    def restore_rank_rng(self, resume_dir: str, state: dict, note: str) -> None:
        """Per-rank RNG states: restored as saved when every rank keeps its place (the exact
        resume), else re-derived from (--seed, rank, step) on each rank, with one logged note."""
        from .checkpoint.dist_ckpt import checkpoint_layout, read_metadata, same_ranks

        saved = checkpoint_layout(read_metadata(resume_dir))
        rank_rng = list(state.get("rank_rng") or [])
        if len(rank_rng) == self.cluster.world and (saved is None or same_ranks(saved, self.layout())):
            self.cluster.call("set_rng_state", per_rank=[(r,) for r in rank_rng])
            print(f"[resume] layout: {note}", flush=True)
        else:
            self.cluster.call("derive_rng_state", self.step)
            print(f"[resume] layout: {note} (the checkpoint's {len(rank_rng)} rank RNG state(s) belong to another "
                  f"layout; each of the {self.cluster.world} rank(s) seeded from (--seed {self.cfg.optim.seed}, rank, "
                  f"step {self.step}))", flush=True)

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> dict:
        from .driver import checkpoint_dirs as checkpoints
        from .driver.logging import MetricsLogger
        from .driver.rollout_manager import EnginePool, RolloutManager
        from .driver.run_dir import prepare_outputs, write_config
        from .hybrid.phases import HybridStep

        cfg = self.cfg
        # before Ray: whose files are in --run-dir and --save (nothing written until they pass)
        outs = prepare_outputs(cfg)
        for line in outs.lines:
            print(f"[outputs] {line}")
        self.run_id = outs.run_id
        write_config(self.run_dir, cfg.to_dict())
        resume_dir, state = outs.resume_dir, outs.state
        # placement only: the trainer actors come after the engines (HybridStep.launch)
        self.cluster = Cluster(cfg, self.hf_dir, self.tokenizer_dir, build_trainers=False)
        stop_on_sigterm()  # after ray.init, which replaced it
        self.hybrid = HybridStep(
            self.cluster, offload=self.offload_train, check_weight_sync_every=cfg.rollout.check_weight_sync_every,
            probe_tolerance=cfg.rollout.weight_sync_tolerance,
            param_dtype=torch.bfloat16 if cfg.model.bf16 else torch.float32,
            check_init_sync=cfg.rollout.check_weight_sync_init,
        )
        self.logger = MetricsLogger(self.run_dir, cfg.to_dict(), cfg.logging.wandb_project, cfg.logging.wandb_mode,
                                    cfg.logging.tensorboard, run_id=self.run_id)
        # engines first, sized on free GPUs; they release all their memory, then the trainers are built
        self.engines = EnginePool(self.cluster.make_engine, self.cluster.num_engines, self._resync,
                                  cfg.rollout.engine_timeout_s)
        self.hybrid.launch(self._remote_engines(), self.cluster.build_trainers)
        print(f"[init] launch order: {' -> '.join(self.hybrid.events)} "
              f"({self.cluster.num_engines} engine(s), {self.cluster.world} trainer rank(s), "
              f"rendezvous {self.cluster.master_addr}:{self.cluster.master_port})", flush=True)
        self.manager = RolloutManager(cfg, self.dataset, self.sampler, self.engines, self.scorer, self.tokenizer)
        if resume_dir:
            note = self.check_resume_layout(resume_dir)
            self.cluster.call("load", resume_dir)  # model and optimizer, resharded to this layout if it changed
            self.load_driver_state(state)
            self.restore_rank_rng(resume_dir, state, note)
            self.logger.truncate_after(self.step)
            print(f"[resume] {resume_dir}: continuing after step {self.step}")
        else:  # a fresh run: prepare_outputs made sure no earlier metrics or event log is here
            src = self.cluster.call("load_initial_weights")[0]
            print(f"[init] weights from {src}")
        if cfg.algo.kl_coef > 0:
            print(f"[init] reference model for KL from {self.cluster.call('build_reference')[0]}")
        if cfg.checkpoint.save:
            checkpoints.clean_stale(cfg.checkpoint.save)
        # the engines were built without weights: the first sync fills them (and probes them)
        from .driver import debug

        self.hybrid.to_rollout(self._remote_engines(), probe=self._probe)
        debug.log_hybrid_events(self.run_dir, self.step, self.hybrid.events)  # the first sync: "step" 0
        self.hybrid.events.clear()
        last = {}
        try:
            while self.step < cfg.run.num_rollout_steps:
                if _SIGTERM.is_set():  # in case a library swallowed the interruption
                    raise Terminated()
                self.step += 1
                last = self.one_step(self.step)
                if cfg.checkpoint.save and (
                    (cfg.checkpoint.save_interval and self.step % cfg.checkpoint.save_interval == 0)
                    or self.step == cfg.run.num_rollout_steps
                ):
                    t = time.perf_counter()
                    self.save_checkpoint()
                    last["time_save"] = time.perf_counter() - t
                if cfg.checkpoint.save_hf_interval and self.step % cfg.checkpoint.save_hf_interval == 0:
                    self.export_hf(os.path.join(self.run_dir, "hf", f"step_{self.step:06d}"))
                self.logger.log(last)
        finally:
            self.logger.close()
            self.scorer.close()
        self.finish()
        return last

    def _remote_engines(self, handles=None):
        from .driver.cluster import RemoteEngines

        return RemoteEngines(self.engines.handles if handles is None else handles)

    @property
    def _probe(self) -> list:
        """The probe sequence (real tokens): the first trained sample, else the first prompt."""
        return [self._probe_tokens] if len(self._probe_tokens) > 1 else None

    def _resync(self, handles) -> dict:
        """Weight sync into restarted engines mid-rollout (EnginePool), probe included."""
        restarted = {h._actor_id for h in handles}
        others = [h for h in self.engines.handles if h._actor_id not in restarted]
        return self.hybrid.resync(self._remote_engines(handles), probe=self._probe,
                                  others=self._remote_engines(others) if others else None)

    def one_step(self, step: int) -> dict:
        from .diagnostics import repetition_rate
        from .driver import debug
        from .driver.metrics import step_metrics, summary_line

        cfg, a = self.cfg, self.cfg.algo
        t_step = time.perf_counter()
        engines = self._remote_engines()
        # 1. rollout: generate, verify, filter on raw accuracy
        self.engines.kill_next_generation = cfg.run.kill_engine_at_step == step
        roll = self.manager.collect(step)
        engines = self._remote_engines()  # a restarted engine has a new handle
        # 2. rewards -> advantages (over whole groups); overlong filtering; the samples without a
        # trainable token are left out of the trainer's list (driver/batch.py training_samples)
        samples = assign_advantages(roll.groups, a)
        offpolicy = cfg.rollout.partial_rollout_offpolicy if cfg.rollout.partial_rollout else None
        samples, untrainable = training_samples(samples, optimizer_steps(cfg), self.cluster.dp_layout()[0], offpolicy)
        extra = [s for g in self.manager.surplus for s in g.samples if s.old_logprobs is None]
        # 3. engines release their memory, the trainer onloads
        self.hybrid.to_train(engines)
        # 4. old-policy logprobs by megatron (not the engine's), and the KL reference's
        t = time.perf_counter()
        need = [s for s in samples if s.old_logprobs is None] + extra
        self._compute_old_logprobs(need)
        if a.kl_coef > 0:  # frozen reference policy (--ref-load or the initial weights)
            self._compute_old_logprobs([s for s in need if s.ref_logprobs is None], method="compute_ref_logprobs",
                                       field="ref_logprobs")
        t_old = time.perf_counter() - t
        # 5. rollout_batch_size x n_samples_per_prompt / global_batch_size optimizer steps
        if cfg.run.dump_train_batch:
            debug.dump_train_batch(self.cluster, cfg.run.dump_train_batch, step, samples, cfg.optim.global_batch_size, "before")
        t = time.perf_counter()
        train_metrics = self._train(samples, inject_nan=(cfg.run.inject_nan_at_step == step))
        t_train = time.perf_counter() - t
        if cfg.run.dump_train_batch:
            debug.dump_train_batch(self.cluster, cfg.run.dump_train_batch, step, samples, cfg.optim.global_batch_size, "after")
        # 6. engines resume weights, sync, probe, trainer offloads, engines resume KV cache
        if samples:
            self._probe_tokens = list(samples[0].prompt_ids) + list(samples[0].response_ids)
        info = self.hybrid.to_rollout(engines, probe=self._probe)
        h = self.hybrid.timings
        debug.log_hybrid_events(self.run_dir, step, self.hybrid.events)
        self.hybrid.events.clear()
        # 7. metrics
        timings = {"time_old_logprob": t_old, "time_train": t_train, "time_sync": h.get("sync_s", 0.0),
                   "time_offload": sum(h.get(k, 0.0) for k in ("release_s", "resume_s", "onload_s", "offload_s")),
                   "time_probe": h.get("probe_s", 0.0)}
        m = step_metrics(step, roll, samples, train_metrics, info, repetition_rate=repetition_rate,
                         engine_restarts=self.engines.restarts, timings=timings, untrainable=untrainable)
        m["time_step"] = time.perf_counter() - t_step
        gen_tokens = sum(len(s.response_ids) for g in roll.generated for s in g.samples)
        m["tokens_per_second"] = gen_tokens / max(m["time_step"], 1e-9)
        if cfg.logging.dump_rollouts_every and step % cfg.logging.dump_rollouts_every == 0:
            debug.dump_rollouts(self.run_dir, self.dataset, step, roll)
        if cfg.logging.eval_interval and step % cfg.logging.eval_interval == 0 and cfg.data.eval_data:
            m.update(self._evaluate())
        print(summary_line(m), flush=True)
        return m

    def _compute_old_logprobs(self, samples: list, method: str = "compute_logprobs", field: str = "old_logprobs") -> None:
        """Forward-only logprobs of the response tokens by megatron, sharded over DP ranks."""
        if not samples:
            return
        dp, reporters = self.cluster.dp_layout()
        items = [s.to_worker() for s in samples]
        parts = dp_partition(items, dp)  # balanced by tokens, like the training shards
        per_rank = [([items[i] for i in parts[info["dp_rank"]]],) for info in self.cluster.infos]
        outs = self.cluster.call(method, per_rank=per_rank)
        for d in range(dp):
            for i, lp in zip(parts[d], outs[reporters[d]] or []):
                setattr(samples[i], field, lp)

    def _train(self, samples: list, inject_nan: bool) -> dict:
        from .driver.metrics import reduce_train_outputs

        cfg = self.cfg
        dp, reporters = self.cluster.dp_layout()
        mbs = minibatches(samples, optimizer_steps(cfg), dp)
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
        m = reduce_train_outputs(outs, reporters)
        skipped = m["skipped_optimizer_steps"]
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
        return m

    def _evaluate(self) -> dict:
        from .driver.actors import RemoteEngine
        from .eval.runner import dataset_name, eval_log_keys, evaluate
        from .models.hf_config import generation_eos_ids

        out, lg = {}, self.cfg.logging
        for path in self.cfg.data.eval_data:
            res = evaluate(RemoteEngine(self.engines.handles[0]), self.tokenizer, path, progress=False,
                           max_new_tokens=self.cfg.algo.max_response_length, scorer=self.scorer, k=lg.eval_k,
                           temperature=lg.eval_temperature, top_p=lg.eval_top_p, prompt_style=lg.eval_prompt_style,
                           stop_token_ids=generation_eos_ids(self.hf_dir),  # as tools/eval.py
                           context_length=self.arch.max_position_embeddings,
                           apply_chat_template=self.cfg.data.apply_chat_template,
                           out_dir=os.path.join(self.run_dir, "eval", f"step_{self.step:06d}", dataset_name(path)))
            out.update(eval_log_keys(res, dataset_name(path)))
        return out

    def save_checkpoint(self) -> str:
        from .checkpoint.dist_ckpt import checkpoint_metadata
        from .driver import checkpoint_dirs as checkpoints, debug

        root = self.cfg.checkpoint.save
        tmp = checkpoints.tmp_dir(root, self.step)
        meta = checkpoint_metadata(self.hf_dir, "bf16" if self.cfg.model.bf16 else "fp32", extra={"step": self.step})
        self.hybrid.while_trainer_resident(self.cluster.call, "save", tmp, meta)
        state = self.driver_state()
        state["rank_rng"] = self.cluster.call("rng_state")
        if self.cfg.run.crash_during_save_at_step == self.step:  # testing: die mid-save
            debug.crash_now()
        torch.save(state, os.path.join(tmp, checkpoints.STATE_FILE))
        return checkpoints.commit(root, self.step, self.cfg.checkpoint.keep_last, run_id=self.run_id)

    def export_hf(self, directory: str) -> str:
        """The trainer's weights as an HF checkpoint, written to a temporary directory and
        renamed into place (a crash never leaves a half-written export under ``directory``)."""
        import shutil

        tmp = directory.rstrip("/") + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        self.hybrid.while_trainer_resident(self.cluster.call, "export_hf", tmp)
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(os.path.dirname(os.path.abspath(directory)), exist_ok=True)
        os.replace(tmp, directory)
        return directory

    def finish(self) -> None:
        from .driver.plots import plot_training_curves

        try:
            plot_training_curves(os.path.join(self.run_dir, "metrics.jsonl"), os.path.join(self.run_dir, "training_curves.png"))
        except Exception as e:
            print(f"[plot] skipped: {e}")
        if self.cfg.checkpoint.save_hf_final:
            self.export_hf(os.path.join(self.run_dir, "final_hf"))


_SIGTERM = threading.Event()  # set once SIGTERM has reached the driver


class Terminated(KeyboardInterrupt):
    """SIGTERM reached the driver (scancel, a job's time limit, a plain ``kill``).

    A KeyboardInterrupt because that is what a blocking Ray call (``ray.get``) passes on intact
    from a signal handler; a SystemExit raised there comes out as ``SystemExit(1)``. Either way
    ``main`` goes by :data:`_SIGTERM`, not by the exception it sees."""


def _on_sigterm(signum, frame):
    """Turn SIGTERM into an exception in the main thread, so that ``main``'s ``finally`` stops
    the actors and unlinks the trainers' shared-memory buffers (the default action would end
    the driver at once: nothing cleaned up, the bucket files left in /dev/shm). A second
    SIGTERM during that cleanup is ignored; Slurm's KILL after its KillWait still ends it."""
    _SIGTERM.set()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("megatron_dapo.train: SIGTERM: stopping the run (checkpoints already committed are kept)",
          file=sys.stderr, flush=True)
    raise Terminated()


def stop_on_sigterm():
    """Install :func:`_on_sigterm` (main thread only); returns the handler it replaced. Called
    again once Ray is up: ``ray.init`` installs its own C++ handler (it logs and aborts)."""
    if threading.current_thread() is threading.main_thread():
        return signal.signal(signal.SIGTERM, _on_sigterm)
    return None


def main(argv=None) -> int:
    """The driver's entry point. A mistake of the user's (megatron_dapo/errors.py: config, data,
    checkpoint, model, reward, an unusable path) ends it with one line on stderr and exit code 2;
    ``MEGATRON_DAPO_DEBUG=1`` shows the traceback. SIGTERM: exit code 143 after the cleanup."""
    from .config.cli import decode_escapes
    from .config.validate import check_model_dir

    previous = stop_on_sigterm()
    try:
        cfg = parse_args(argv)
        cfg.rollout.stop = decode_escapes("--rollout-stop", cfg.rollout.stop)
        check_model_dir(cfg)  # --hf-checkpoint and its config.json, before they are read
        arch = parse_hf_config(hf_config_source(cfg))
        if cfg.run.dry_run:  # validates for the target hardware (GPU flags on a CPU login node)
            from .launch.preflight import dry_run

            dry_run(cfg, arch, hf_config_source(cfg))  # the plan, a [check] line per check, the [outputs] lines
            return 0
        for w in validate(cfg, arch):
            print(f"[config] warning: {w}", file=sys.stderr)
        from .launch.preflight import check_before_launch

        check_before_launch(cfg, arch)  # tokenizer vs vocab, weights, checkpoints, eval data, disk: before Ray
        trainer = Trainer(cfg)
        trainer.run()
    except Exception as e:
        if _SIGTERM.is_set():  # whatever a library made of the interruption
            return 128 + signal.SIGTERM
        return report_user_error("megatron_dapo.train", e)  # re-raises anything but a user error
    except BaseException:
        if not _SIGTERM.is_set():
            raise
        return 128 + signal.SIGTERM  # whatever form the interruption took on its way out
    finally:
        t = locals().get("trainer")
        if t is not None and getattr(t, "cluster", None) is not None:
            t.cluster.shutdown(t.engines.handles if getattr(t, "engines", None) else ())
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
