"""The DAPO driver: ``python -m megatron_dapo.train [flags]`` (``--help`` lists them).

One rollout step, top to bottom (see docs/design.md for the picture):

1. generate + verify + dynamic-sampling filter          (RolloutManager.collect)
2. rewards -> group advantages, overlong filtering       (driver/batch.py)
3. engines release their memory, trainer onloads         (HybridStep.to_train, docs/hybrid.md)
4. old-policy logprobs recomputed by megatron            (TrainerGroup.logprobs, driver/trainer_group.py)
5. rollout x G / --global-batch-size optimizer steps     (TrainerGroup.train; samples without a
   trainable token left out, driver/batch.py)
6. engines resume weights, bucketed TP/PP -> HF sync,    (HybridStep.to_rollout)
   probe, trainer offloads, engines resume KV cache
7. metrics, rollout dump, checkpoint                     (driver/metrics.py, driver/debug.py)
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import sys
import threading
import time

import torch

from .algo.staleness import ControllerSettings, StalenessController
from .checkpoint.dist_ckpt import checkpoint_metadata
from .config import ConfigError, parse_args, validate
from .config.cli import decode_escapes
from .config.validate import (
    check_model_dir,
    hf_config_source,
    load_tokenizer,
    lora_targets,
    offload_train_default,
    stale_token_mode,
)
from .data import ResumableSampler, load_prompt_dataset
from .diagnostics import repetition_rate
from .driver import debug, resume
from .driver.batch import assign_advantages, interpolate_stale, minibatches, optimizer_steps, training_samples
from .driver.cluster import Cluster, RemoteEngine, RemoteEngines
from .driver.logging import MetricsLogger
from .driver.metrics import sample_staleness, step_metrics, summary_line
from .driver.plots import plot_training_curves
from .driver.prefetch import RolloutQueue
from .driver.rollout_manager import EnginePool, RolloutManager
from .driver.signals import SIGTERM_SEEN as _SIGTERM  # noqa: F401
from .driver.signals import STOP_BOUND_S, check_not_terminated, exit_within, stop_on_sigterm
from .errors import DiskFullError, RunStoppedError, out_of_memory_stop, report_user_error, writing
from .eval.runner import evaluate_in_training
from .hybrid.phases import HybridStep
from .known_warnings import quiet_known_warnings
from .launch.preflight import check_before_launch, dry_run
from .launch.preflight_checkpoints import checkpoint_bytes, lora_of
from .models import parse_hf_config
from .models.hf_config import lora_parameters
from .outputs import checkpoint_dirs as checkpoints
from .outputs import run_lock
from .outputs.run_dir import prepare_outputs, write_config
from .reward import BatchScorer, reward_needs_label
from .rollout.engines import engine_kind as engine_kind_spec
from .training.train_checkpoint import lora_record_of


class TrainingError(RunStoppedError):
    """Training cannot go on (non-finite gradients step after step); the message says what to change."""


class Trainer:
    def __init__(self, cfg, checks=None):
        self.cfg = cfg
        self.hf_dir = hf_config_source(cfg)
        self.arch = parse_hf_config(self.hf_dir)
        self.run_dir = cfg.logging.run_dir  # written only once the checks of run() passed (outputs/run_dir.py)
        tok_dir = cfg.model.tokenizer or self.hf_dir
        if checks is not None and checks.tokenizer is not None and checks.tokenizer_dir == tok_dir:
            self.tokenizer = checks.tokenizer  # the one the preflight loaded and checked (~1 s of CPU)
        else:
            self.tokenizer = load_tokenizer(tok_dir, "--tokenizer" if cfg.model.tokenizer else "--hf-checkpoint")
        self.tokenizer_dir = tok_dir
        if not cfg.data.prompt_data:
            raise ConfigError("--prompt-data is required")
        d = cfg.data
        self.dataset = load_prompt_dataset(
            d.prompt_data,
            self.tokenizer,
            d.max_prompt_length,
            d.prompt_overflow,
            d.apply_chat_template,
            d.skip_bad_rows,
            reward_needs_label(cfg.reward),
        )
        print(f"[data] {self.dataset.describe()}")
        self.sampler = ResumableSampler(len(self.dataset), cfg.optim.seed, cfg.data.shuffle)
        self.scorer = BatchScorer.from_config(cfg.reward)
        self.rng = random.Random(cfg.optim.seed)
        self.step = 0
        self.skipped_in_a_row = 0
        self.run_id = None
        self.step_times: list = []  # this session's step times (the ETA of the step line)
        self.trainer_version = 1  # the weights the trainer holds, in Sample.token_versions' numbering
        self._hybrid_lock = threading.Lock()  # the hybrid step's calls, from the rollout thread too
        self.offload_train = offload_train_default(cfg, on_gpu=torch.cuda.is_available())
        self._probe_tokens = list(self.dataset[0].prompt_ids) if len(self.dataset) else []
        self.data_fingerprint = self.dataset.fingerprint

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        # before Ray: whose files are in --run-dir and --save (nothing written until they pass)
        outs = prepare_outputs(cfg)
        for line in outs.lines:
            print(f"[outputs] {line}")
        if outs.nothing_to_do:  # said by the line above; start nothing
            return {}
        self.run_id = outs.run_id
        write_config(self.run_dir, cfg.to_dict())
        resume_dir, state = outs.resume_dir, outs.state
        # placement only: the trainer actors come after the engines (HybridStep.launch)
        self.cluster = Cluster(cfg, self.hf_dir, self.tokenizer_dir, build_trainers=False)
        stop_on_sigterm()  # in case anything replaced it during the start
        check_not_terminated()  # a SIGTERM during ray.init that a library swallowed
        self.hybrid = HybridStep(
            self.cluster,
            offload=self.offload_train,
            check_weight_sync_every=cfg.rollout.check_weight_sync_every,
            probe_tolerance=cfg.rollout.weight_sync_tolerance,
            param_dtype=torch.bfloat16 if cfg.model.bf16 else torch.float32,
            check_init_sync=cfg.rollout.check_weight_sync_init,
            adapters_only=cfg.model.lora_rank > 0 and cfg.model.lora_sync == "adapter",
        )
        self.logger = MetricsLogger(
            self.run_dir,
            cfg.to_dict(),
            cfg.logging.wandb_project,
            cfg.logging.wandb_mode,
            cfg.logging.tensorboard,
            run_id=self.run_id,
        )
        # engines first, sized on free GPUs; they release all their memory, then the trainers are built
        # (async without offload: a restart's re-sync leaves the other engines generating)
        self.engines = EnginePool(
            self.cluster.make_engine,
            self.cluster.num_engines,
            self._resync,
            cfg.rollout.engine_timeout_s,
            pause_others_on_restart=(cfg.rollout.async_mode == "off" and cfg.rollout.placement == "colocated")
            or self.offload_train,
        )
        self.hybrid.launch(self._remote_engines(), self.cluster.build_trainers)
        print(
            f"[init] launch order: {' -> '.join(self.hybrid.events)} "
            f"({self.cluster.num_engines} engine(s), {self.cluster.world} trainer rank(s), "
            f"rendezvous {self.cluster.master_addr}:{self.cluster.master_port})",
            flush=True,
        )
        if self.cluster.disaggregated:
            print(
                f"[init] placement: disaggregated: {self.cluster.num_engines} engine(s) on {cfg.rollout.num_gpus} "
                f"GPU(s) of their own (a placement group apart from the trainer's {self.cluster.world}); each sync "
                "broadcasts the weights from trainer rank 0 to every engine",
                flush=True,
            )
        self.manager = RolloutManager(cfg, self.dataset, self.sampler, self.engines, self.scorer, self.tokenizer)
        r = cfg.rollout
        # --async-mode: the engines generate up to `lag` versions ahead of the trainer (driver/prefetch.py)
        lag = {"off": 0, "one-step-off": 1, "bounded": r.max_staleness}[r.async_mode]
        self.queue = RolloutQueue(self.manager, version=1, lag=lag, limit=0) if r.async_mode != "off" else None
        self.staleness = (  # --staleness-control ess: the lag between 0 and its bound
            StalenessController(
                ControllerSettings(max_staleness=lag, ess_low=r.staleness_ess_low, ess_high=r.staleness_ess_high)
            )
            if r.async_mode != "off" and r.staleness_control == "ess"
            else None
        )
        self.trainers = self.cluster.trainers  # the ranks, one typed group (driver/trainer_group.py)
        if resume_dir:
            note = resume.check_resume_layout(cfg, self.trainers, resume_dir)
            self.trainers.load(resume_dir)  # model and optimizer, resharded to this layout if it changed
            resume.load_driver_state(self, state)
            resume.restore_rank_rng(cfg, self.trainers, resume_dir, state, self.step, note)
            self.logger.truncate_after(self.step)
            print(f"[resume] {resume_dir}: continuing after step {self.step}")
        else:  # a fresh run: prepare_outputs made sure no earlier metrics or event log is here
            print(f"[init] weights from {self.trainers.load_initial_weights()}")
        if cfg.algo.kl_coef > 0:
            print(f"[init] reference model for KL from {self.trainers.build_reference()}")
        if cfg.checkpoint.save:
            checkpoints.clean_stale(cfg.checkpoint.save)
        # the engines were built without weights: the first sync fills them (and probes them)
        self.hybrid.to_rollout(self._remote_engines(), probe=self._probe)
        debug.log_hybrid_events(self.run_dir, self.step, self.hybrid.events)  # the first sync: "step" 0
        self.hybrid.events.clear()
        last = {}
        try:
            while self.step < cfg.run.num_rollout_steps:
                check_not_terminated()  # in case a library swallowed the interruption
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
                with writing(self.logger.path, f"step {self.step}: writing its metrics"):
                    self.logger.log(last)
        finally:
            if self.queue is not None:
                self.queue.stop()
            self.logger.close()
            self.scorer.close()
        self.finish()
        return last

    def _remote_engines(self, handles=None):
        return RemoteEngines(self.engines.handles if handles is None else handles)

    @property
    def _probe(self) -> list:
        """The probe sequence (real tokens): the first trained sample, else the first prompt."""
        return [self._probe_tokens] if len(self._probe_tokens) > 1 else None

    def _resync(self, handles) -> dict:
        """Weight sync into restarted engines mid-rollout (EnginePool), probe included."""
        restarted = {h._actor_id for h in handles}
        others = [h for h in self.engines.handles if h._actor_id not in restarted]
        # async: the rollout thread's restart waits for the trainer's work and the driver's own sync,
        # then gets the newest weights (and stamps its tokens with their version)
        with self._hybrid_lock:
            self.cluster.weight_version = self.trainer_version if self.queue is not None else None
            info = self.hybrid.resync(
                self._remote_engines(handles),
                probe=self._probe,
                others=self._remote_engines(others) if others else None,
            )
            if self.queue is not None:
                self._remote_engines(handles).set_weight_version(self.trainer_version)
            return info

    def _limit(self, step: int) -> int:
        """The last step the engines may generate ahead to, from step ``step`` on: the next
        checkpoint step (a checkpoint holds no rollout in flight: a resume continues exactly)
        or the last step."""
        cfg, last = self.cfg, self.cfg.run.num_rollout_steps
        every = cfg.checkpoint.save_interval if cfg.checkpoint.save else 0
        return min(last, -(-step // every) * every) if every else last

    def _take_rollout(self, step: int):
        """Step ``step``'s rollout: collected now (synchronous), or from the queue the engines
        fill ahead of the trainer (--async-mode; driver/prefetch.py)."""
        if self.queue is None:
            return self.manager.collect(step)
        if self.queue.next_step is None:  # the first step of this session: the engines hold its weights
            lag = self.staleness.k if self.staleness is not None else None
            self.queue.update(version=step, lag=lag, limit=self._limit(step))
            self.trainer_version = step
            self.queue.start(step)
        self.queue.update(limit=self._limit(step))
        roll, _ = self.queue.take(step)
        return roll

    def one_step(self, step: int) -> dict:
        cfg, a = self.cfg, self.cfg.algo
        t_step = time.perf_counter()
        engines = self._remote_engines()
        # 1. rollout: generate, verify, filter on raw accuracy
        # async: generated ahead (while earlier steps trained), at most the allowed lag old
        roll = self._take_rollout(step)
        engines = self._remote_engines()  # a restarted engine has a new handle
        # 2. rewards -> advantages (over whole groups); overlong filtering; the samples without a
        # trainable token are left out of the trainer's list (driver/batch.py training_samples)
        samples = assign_advantages(roll.groups, a)
        offpolicy = stale_token_mode(cfg)
        samples, untrainable = training_samples(samples, optimizer_steps(cfg), self.trainers.dp_size, offpolicy)
        # 3. engines release their memory, the trainer onloads (async or on GPUs of their own: they keep it)
        switch = cfg.rollout.async_mode == "off" and cfg.rollout.placement == "colocated"
        if switch:
            self.hybrid.to_train(engines)
        # async: a restarted engine's resync (from the rollout thread) waits for this work, then gets the newest weights
        with self._hybrid_lock if self.queue is not None else contextlib.nullcontext():
            # 4. old-policy logprobs by megatron (not the engine's), and the KL reference's
            t = time.perf_counter()
            need = [s for s in samples if s.old_logprobs is None] + roll.carried_need_logprobs
            # --proximal-logprobs interpolate: no forward for the stale samples, the loss interpolates
            forward = interpolate_stale(need, step) if a.proximal_logprobs == "interpolate" else need
            self.trainers.logprobs(forward, model="policy")
            if a.kl_coef > 0:  # frozen reference policy (--ref-load or the initial weights)
                self.trainers.logprobs([s for s in need if s.ref_logprobs is None], model="ref")
            t_old = time.perf_counter() - t
            # 5. rollout_batch_size x n_samples_per_prompt / global_batch_size optimizer steps
            mbs = minibatches(samples, optimizer_steps(cfg), self.trainers.dp_size)
            if cfg.run.dump_train_batch:
                debug.dump_train_batch(self.trainers, cfg.run.dump_train_batch, step, mbs, "before")
            t = time.perf_counter()
            train_metrics = self._train(mbs, inject_nan=(cfg.run.inject_nan_at_step == step))
            t_train = time.perf_counter() - t
            if cfg.run.dump_train_batch:
                debug.dump_train_batch(self.trainers, cfg.run.dump_train_batch, step, mbs, "after")
            self.trainer_version = step + 1  # (the version numbering of Sample.token_versions)
        # 6. engines resume weights, sync, probe, trainer offloads, engines resume KV cache
        if samples:
            self._probe_tokens = list(samples[0].prompt_ids) + list(samples[0].response_ids)
        if switch:
            info = self.hybrid.to_rollout(engines, probe=self._probe)
        else:
            # colocated async: the engines end the collection they are in first, then take the new
            # weights; on GPUs of their own they take them while they generate (a broadcast they
            # load between two decode steps, the version switching with the weights)
            idle = self.queue is not None and not (
                self.cluster.disaggregated and engine_kind_spec(self.cluster.engine_kind).broadcast_while_generating
            )
            with self.queue.paused() if idle else contextlib.nullcontext(), self._hybrid_lock:
                self.hybrid.timings = {}
                self.cluster.weight_version = step + 1
                info = self.hybrid.resync(self._remote_engines(), probe=self._probe)
                if self.queue is not None:
                    self._remote_engines().set_weight_version(step + 1)
                    self.queue.update(version=step + 1)
        h = self.hybrid.timings
        debug.log_hybrid_events(self.run_dir, step, self.hybrid.events)
        self.hybrid.events.clear()
        # 7. metrics
        timings = {
            "time_old_logprob": t_old,
            "time_train": t_train,
            "time_sync": h.get("sync_s", 0.0),
            "time_offload": sum(h.get(k, 0.0) for k in ("release_s", "resume_s", "onload_s", "offload_s")),
            "time_probe": h.get("probe_s", 0.0),
        }
        m = step_metrics(
            step,
            roll,
            samples,
            train_metrics,
            info,
            repetition_rate=repetition_rate,
            engine_restarts=self.engines.restarts,
            timings=timings,
            untrainable=untrainable,
        )
        m.update(sample_staleness(step, samples))
        m["engine_resent_requests"] = self.engines.resent
        m["old_logprob_forward_samples"] = len(forward)
        if self.queue is not None:
            m["async_regenerated_steps"] = self.queue.regenerated
        if self.staleness is not None:  # the lag of the next rollouts, from this step's ESS / N and ratio tail
            d = self.staleness.observe(
                float(m.get("is_ess_frac", 1.0)), tail_frac=float(m.get("is_ratio_tail_frac", 0.0))
            )
            m["staleness_lag"] = d.k
            assert self.queue is not None
            self.queue.update(lag=d.k)
            if d.changed:
                print(f"[async] step {step}: {d.reason}", flush=True)
        m["time_step"] = time.perf_counter() - t_step
        gen_tokens = sum(len(s.response_ids) for g in roll.generated for s in g.samples)
        m["tokens_per_second"] = gen_tokens / max(m["time_step"], 1e-9)
        if cfg.logging.dump_rollouts_every and step % cfg.logging.dump_rollouts_every == 0:
            where = os.path.join(self.run_dir, "rollouts")
            with writing(where, f"step {step}: dumping its rollouts (--dump-rollouts-every)"):
                debug.dump_rollouts(self.run_dir, self.dataset, step, roll)
        if cfg.logging.eval_interval and step % cfg.logging.eval_interval == 0 and cfg.data.eval_data:
            with self.queue.paused() if self.queue is not None else contextlib.nullcontext():
                m.update(
                    evaluate_in_training(
                        RemoteEngine(self.engines.handles[0]),
                        self.tokenizer,
                        cfg,
                        self.hf_dir,
                        self.arch,
                        self.scorer,
                        os.path.join(self.run_dir, "eval", f"step_{step:06d}"),
                    )
                )
        self.step_times.append(m["time_step"])
        remaining = cfg.run.num_rollout_steps - step
        eta = sum(self.step_times) / len(self.step_times) * remaining
        print(summary_line(m, cfg.run.num_rollout_steps, eta), flush=True)
        return m

    def _train(self, mbs: list, inject_nan: bool) -> dict:
        """One optimizer step per mini-batch; stops the run after --max-skipped-steps rollout
        steps in a row with a non-finite loss or gradient."""
        cfg = self.cfg
        m = self.trainers.train(mbs, inject_nan, progress=f"step {self.step} train" if cfg.logging.progress else None)
        skipped = m["skipped_optimizer_steps"]
        self.skipped_in_a_row = self.skipped_in_a_row + 1 if skipped else 0
        if skipped:
            print(f"[train] step {self.step}: {skipped} optimizer step(s) skipped (non-finite loss or grad norm)")
        if skipped and self.skipped_in_a_row >= cfg.optim.max_skipped_steps:
            raise TrainingError(
                f"{self.skipped_in_a_row} rollout steps in a row had non-finite gradients (--max-skipped-steps "
                f"{cfg.optim.max_skipped_steps}): lower --lr, check the data, or resume from the last checkpoint"
            )
        return m

    def save_checkpoint(self) -> str:
        root = self.cfg.checkpoint.save
        tmp = checkpoints.tmp_dir(root, self.step)
        previous = checkpoints.resolve(root)
        kept = (
            f"the previous checkpoint {os.path.basename(previous)} and '{checkpoints.LATEST}' are intact"
            if previous
            else "no earlier checkpoint of this run"
        )
        need, _ = checkpoint_bytes(self.arch, self.cfg.model.bf16, lora_of(self.cfg))
        try:
            with writing(root, f"step {self.step}: saving the checkpoint", need, kept):
                lora = lora_record_of(self.cfg)  # LoRA: the adapters' record, the base named
                meta = checkpoint_metadata(
                    self.hf_dir,
                    "bf16" if self.cfg.model.bf16 else "fp32",
                    extra={"step": self.step, **({"lora": lora} if lora else {})},
                )
                self.hybrid.while_trainer_resident(self.trainers.save, tmp, meta)
                state = resume.driver_state(self)
                state["rank_rng"] = self.trainers.rng_states()
                if self.cfg.run.crash_during_save_at_step == self.step:  # testing: die mid-save
                    debug.crash_now()
                torch.save(state, os.path.join(tmp, checkpoints.STATE_FILE))
                return checkpoints.commit(root, self.step, self.cfg.checkpoint.keep_last, run_id=self.run_id)
        except DiskFullError:
            shutil.rmtree(tmp, ignore_errors=True)  # the partial save: its space back, 'latest' untouched
            raise

    def export_hf(self, directory: str) -> str:
        """The trainer's weights as an HF checkpoint (written aside, renamed into place)."""
        try:
            with writing(directory, "exporting the HF checkpoint", self.arch.num_parameters * 4):
                return checkpoints.write_dir_atomically(
                    directory, lambda tmp: self.hybrid.while_trainer_resident(self.trainers.export_hf, tmp)
                )
        except DiskFullError:
            shutil.rmtree(directory.rstrip("/") + ".tmp", ignore_errors=True)
            raise

    def export_peft(self, directory: str) -> str:
        """A LoRA policy's adapters in PEFT's format (written aside, renamed into place)."""
        need = lora_parameters(self.arch, self.cfg.model.lora_rank, lora_targets(self.cfg)) * 4
        try:
            with writing(directory, "exporting the LoRA adapters", need):
                return checkpoints.write_dir_atomically(
                    directory, lambda tmp: self.hybrid.while_trainer_resident(self.trainers.export_peft, tmp)
                )
        except DiskFullError:
            shutil.rmtree(directory.rstrip("/") + ".tmp", ignore_errors=True)
            raise

    def finish(self) -> None:
        try:
            plot_training_curves(
                os.path.join(self.run_dir, "metrics.jsonl"), os.path.join(self.run_dir, "training_curves.png")
            )
        except Exception as e:
            print(f"[plot] skipped: {e}")
        if self.cfg.checkpoint.save_hf_final:
            self.export_hf(os.path.join(self.run_dir, "final_hf"))  # LoRA: the adapters merged in
            if self.cfg.model.lora_rank:  # and the adapters alone, in PEFT's format
                self.export_peft(os.path.join(self.run_dir, "final_peft"))


def main(argv=None) -> int:
    """The driver's entry point. A mistake of the user's (megatron_dapo/errors.py: config, data,
    checkpoint, model, reward, an unusable path) ends it with one line on stderr and exit code 2;
    ``MEGATRON_DAPO_DEBUG=1`` shows the traceback. SIGTERM: exit code 143 after the cleanup; Ctrl-C
    (SIGINT): one stopping line, the same cleanup, exit code 130."""
    quiet_known_warnings()  # only the library warnings known to be harmless (known_warnings.py)
    previous = stop_on_sigterm()
    try:
        cfg = parse_args(argv)
        cfg.rollout.stop = decode_escapes("--rollout-stop", cfg.rollout.stop)
        check_model_dir(cfg)  # --hf-checkpoint and its config.json, before they are read
        arch = parse_hf_config(hf_config_source(cfg))
        if cfg.run.dry_run:  # validates for the target hardware (GPU flags on a CPU login node)
            dry_run(cfg, arch, hf_config_source(cfg))  # the plan, a [check] line per check, the [outputs] lines
            return 0
        for w in validate(cfg, arch):
            print(f"[config] warning: {w}", file=sys.stderr)
        checks = check_before_launch(cfg, arch)  # tokenizer vs vocab, weights, checkpoints, eval data, disk: before Ray
        trainer = Trainer(cfg, checks)
        trainer.run()
    except Exception as e:
        if _SIGTERM.is_set():  # whatever a library made of the interruption
            return 128 + signal.SIGTERM
        # Ray's memory monitor killed a worker: one line, as a stop of the run (errors.py)
        return report_user_error("megatron_dapo.train", out_of_memory_stop(e) or e)  # re-raises anything else
    except KeyboardInterrupt:  # Ctrl-C: one line, the cleanup below, exit 130 (no traceback)
        if _SIGTERM.is_set():  # the SIGTERM handler interrupts the same way: its own line was printed
            return 128 + signal.SIGTERM
        print(
            "[stop] interrupted (Ctrl-C): stopping the engines, the trainer ranks and Ray; resume with --load "
            "<its --save> from the last checkpoint",
            file=sys.stderr,
            flush=True,
        )
        exit_within(STOP_BOUND_S, 128 + signal.SIGINT, "Ctrl-C")
        return 128 + signal.SIGINT
    except BaseException:
        if not _SIGTERM.is_set():
            raise
        return 128 + signal.SIGTERM  # whatever form the interruption took on its way out
    finally:
        t = locals().get("trainer")
        if t is not None and getattr(t, "cluster", None) is not None:
            t.cluster.shutdown(t.engines.handles if getattr(t, "engines", None) else ())
        run_lock.release_all()  # --run-dir and --save are free for the next run (after the cluster ended)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
