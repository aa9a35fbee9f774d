"""One trainer rank (SPMD): the policy, its DAPO update, weight sync and checkpoints.

The driver (``megatron_dapo.train``) creates one ``PolicyWorker`` per rank (inside the Ray
actor ``megatron_dapo.driver.actors.PolicyActor``) and calls the same method on every rank; collectives run
inside. Nothing here knows about Ray.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from ..checkpoint.dist_ckpt import load_checkpoint
from ..checkpoint.hf_export import export_model_to_hf
from ..checkpoint.model_io import gather_full_weights, load_hf_weights, unwrap
from ..config.schema import DAPOConfig
from ..config.validate import lr_warmup_optimizer_steps, stale_token_mode
from ..distributed import destroy_parallel, init_distributed, init_parallel
from ..hybrid.offload import TrainerOffloader
from ..hybrid.weight_sync import DiscardSink, EngineFeeding, WeightSync
from ..known_warnings import quiet_known_warnings
from ..models.provider import ModelBuildOptions, build_gpt_model, use_te_for
from .dapo_step import compute_logprobs, train_on_minibatch
from .item import TrainItem
from .lora_export import adapter_tensors, export_peft, peft_config
from .routing_replay import install as install_routing_replay
from .setup import OptimizerOptions, build_policy, expert_parallel_sizes, lora_options, moe_options
from .train_checkpoint import load_train_checkpoint, save_train_checkpoint


def _node_ip() -> Optional[str]:
    """This process's Ray node address (None outside Ray)."""
    try:
        import ray  # optional here: the rank only asks Ray for its node address when it runs inside it

        return ray.util.get_node_ip_address() if ray.is_initialized() else None
    except ImportError:
        return None


def derived_rank_seed(seed: int, rank: int, step: int) -> int:
    """A 63-bit seed of (seed, rank, step) (sha256: neighbouring ranks and steps get unrelated seeds)."""

    h = hashlib.sha256(f"megatron-dapo-rng/{int(seed)}/{int(rank)}/{int(step)}".encode()).digest()
    return int.from_bytes(h[:8], "little") & (2**63 - 1)


class PolicyWorker:
    def __init__(
        self, rank: int, world_size: int, master_addr: str, master_port: int, cfg: DAPOConfig, hf_config_path: str
    ):
        quiet_known_warnings()  # megatron-core's fallbacks to torch, said once per module it imports
        from megatron.core import parallel_state as ps

        self.cfg = cfg
        self.rank = rank
        init_distributed(rank=rank, world_size=world_size, master_addr=master_addr, master_port=master_port)
        p = cfg.parallel
        init_parallel(
            p.tensor_model_parallel_size,
            p.pipeline_model_parallel_size,
            p.context_parallel_size,
            seed=cfg.optim.seed,
            **expert_parallel_sizes(p),
        )
        o = cfg.optim
        build = ModelBuildOptions(
            params_dtype=torch.bfloat16 if cfg.model.bf16 else torch.float32,
            bf16=cfg.model.bf16,
            sequence_parallel=p.sequence_parallel,
            make_vocab_size_divisible_by=cfg.model.make_vocab_size_divisible_by,
            recompute_granularity=cfg.model.recompute_granularity,
            recompute_method=cfg.model.recompute_method,
            recompute_num_layers=cfg.model.recompute_num_layers,
            context_parallel_size=p.context_parallel_size,
            deterministic=cfg.run.deterministic,
            use_te=use_te_for(cfg.model.transformer_impl),
            moe=moe_options(cfg.moe),
        )
        opt = OptimizerOptions(
            lr=o.lr,
            weight_decay=o.weight_decay,
            adam_beta1=o.adam_beta1,
            adam_beta2=o.adam_beta2,
            adam_eps=o.adam_eps,
            clip_grad=o.clip_grad,
            use_distributed_optimizer=p.use_distributed_optimizer,
            lr_warmup_iters=lr_warmup_optimizer_steps(cfg),
        )
        self.policy = build_policy(hf_config_path, build, opt, lora=lora_options(cfg))
        if cfg.moe.routing_replay:  # R3: replay the engines' routing (training/routing_replay.py)
            install_routing_replay(self.policy.model)
        self.arch = self.policy.arch
        self.hf_config_path = hf_config_path
        self.build_opts = build
        self.ps = ps
        self._sync = None
        self._ref = None

    # ------------------------------------------------------------------ info
    def info(self) -> dict:
        ps = self.ps
        return {
            "rank": self.rank,
            "tp_rank": ps.get_tensor_model_parallel_rank(),
            "pp_rank": ps.get_pipeline_model_parallel_rank(),
            "dp_rank": ps.get_data_parallel_rank(),
            "dp_size": ps.get_data_parallel_world_size(),
            "last_stage": ps.is_pipeline_last_stage(),
            "pid": os.getpid(),
            "node_ip": _node_ip(),
        }

    # ------------------------------------------------------------------ weights
    def load_initial_weights(self) -> str:
        """--pretrained-checkpoint (torch_dist) or --hf-checkpoint weights, whichever is given."""
        src = self._load_init_weights(self.policy.model)
        self.policy.optimizer.reload_model_params()
        return src

    def _load_init_weights(self, model) -> str:

        m = self.cfg.model
        if m.pretrained_checkpoint:  # a LoRA model reads it as its base (its adapters stay as built)
            load_checkpoint(unwrap(model), m.pretrained_checkpoint, self.arch, part="base")
            return m.pretrained_checkpoint
        if m.hf_checkpoint and os.path.exists(os.path.join(m.hf_checkpoint, "config.json")):
            load_hf_weights(model, self.arch, m.hf_checkpoint, self.policy.padded_vocab)
            return m.hf_checkpoint
        return "random init"

    def build_reference(self) -> str:
        """A frozen reference policy for the KL term (--kl-coef > 0): --ref-load, else the
        initial weights (re-read from the init source, so a resumed run gets the same ref)."""

        model, _, _ = build_gpt_model(self.hf_config_path, self.build_opts)
        if self.cfg.model.ref_load:
            load_checkpoint(model, self.cfg.model.ref_load, self.arch)
            src = self.cfg.model.ref_load
        else:
            src = self._load_init_weights(model)
        model.eval()
        model.requires_grad_(False)
        self._ref = model
        return src

    def compute_ref_logprobs(self, samples: list) -> Optional[list]:

        o = self.cfg.optim
        return compute_logprobs(
            self._ref,
            samples,
            self.arch.vocab_size,
            o.micro_batch_size,
            o.max_tokens_per_gpu,
            self.cfg.rollout.temperature,
            packing=o.use_packing,
        )

    def full_weights(self) -> dict:
        """TP-gathered weights of this PP stage by megatron global name (tests, replay)."""

        return {n: t.clone() for n, t in gather_full_weights(self.policy.model, self.arch)}

    def sync_weights(
        self,
        engine=None,
        bucket_bytes: Optional[int] = None,
        *,
        engine_calls=None,
        engine_protocol=None,
        feed_engines: bool = False,
        skip_engine: bool = False,
        active_feeders=None,
    ) -> dict:
        """Bucketed TP/PP -> HF weight sync.

        ``feed_engines``: one engine per group of ``--rollout-num-gpus-per-engine`` ranks, fed by
        the ranks of its group with handles to their own bucket buffers
        (``hybrid.weight_sync.PayloadSink``); ``engine_protocol`` (``EngineProtocol``) is given on
        every rank of the group, ``engine_calls`` (``EngineCalls``) on its first rank; ``skip_engine`` (every rank of a group alike): this rank's
        engine is not synced this time, the rank only takes part in the collectives (or in none,
        when no rank of its model-parallel replica is in ``active_feeders``). Otherwise
        ``engine`` is an in-process engine (or a list of them) on rank 0 only."""

        size = bucket_bytes or self.cfg.rollout.update_weight_buffer_size
        key = ("feed" if feed_engines else "rank0", size)
        if self._sync is None or self._sync[0] != key:
            feeding = EngineFeeding(self.cfg.rollout.num_gpus_per_engine) if feed_engines else None
            ws = WeightSync(
                self.policy.model,
                self.arch,
                bucket_bytes=size,
                feeder_ranks=feeding.feeder_ranks if feeding else (0,),
                merge_lora=self.cfg.model.lora_sync != "adapter",  # adapter: the base, the adapters apart
            )
            ws.keep_buffers = ws.device.type == "cpu"  # no first-touch of fresh memory each sync
            self._sync = (key, ws, feeding)
        _, ws, feeding = self._sync
        t0 = time.perf_counter()
        if feeding is not None:
            target = DiscardSink() if skip_engine else feeding.sink(engine_calls, engine_protocol)
        else:
            target = engine if self.rank == 0 else None
        stats = ws.sync(target, active_feeders=active_feeders)
        return {"seconds": time.perf_counter() - t0, "bytes": stats.bytes, "buckets": stats.buckets}

    def export_hf(self, directory: str) -> list:
        """Write the trainer's current weights as an HF checkpoint (collective; see
        ``checkpoint.hf_export.export_model_to_hf``): config.json from --hf-checkpoint, the
        tokenizer from --tokenizer (or --hf-checkpoint)."""

        m = self.cfg.model
        tok = m.tokenizer or m.hf_checkpoint
        return export_model_to_hf(
            self.policy.model,
            self.arch,
            directory,
            hf_config_dir=self.hf_config_path,
            tokenizer_dir=tok if tok and os.path.isdir(tok) else None,
        )

    def export_peft(self, directory: str) -> list:
        """Write the adapters of a LoRA policy in PEFT's format (collective; training/lora_export.py)."""

        if self.policy.lora is None:
            return []
        return export_peft(self.policy.model, self.policy.lora, directory, self.cfg.model.hf_checkpoint)

    def adapter_payload(self):
        """The LoRA adapters for the engines (--lora-sync adapter): ``(tensors in PEFT's names,
        the adapter_config dict)`` on rank 0, None elsewhere (collective: every rank calls)."""

        tensors = adapter_tensors(self.policy.model)
        if self.rank != 0 or self.policy.lora is None:
            return None
        return tensors, peft_config(self.policy.lora, self.cfg.model.hf_checkpoint).to_dict()

    # ------------------------------------------------------------------ DAPO
    def compute_logprobs(self, samples: list) -> Optional[list]:

        o = self.cfg.optim
        return compute_logprobs(
            self.policy,
            samples,
            self.arch.vocab_size,
            o.micro_batch_size,
            o.max_tokens_per_gpu,
            self.cfg.rollout.temperature,
            packing=o.use_packing,
        )

    def probe_logprobs(self, sequences: list) -> Optional[list]:
        """The weight-sync probe's megatron half: logprobs of tokens 1.. of each sequence at
        temperature 1 (what ``RolloutEngine.score(sequences, [1] * n)`` returns)."""

        o = self.cfg.optim
        items = [TrainItem(tokens=list(s), prompt_len=1) for s in sequences]
        return compute_logprobs(
            self.policy, items, self.arch.vocab_size, o.micro_batch_size, o.max_tokens_per_gpu, packing=o.use_packing
        )

    def train(self, shards: list, inject_nan: bool = False) -> list:
        """``shards[k]`` is this rank's DP shard of mini-batch k: one optimizer step each (a ``StepStats`` each)."""

        o = self.cfg.optim
        out = []
        for shard in shards:
            out.append(
                train_on_minibatch(
                    self.policy,
                    shard,
                    self.cfg.algo,
                    self.arch.vocab_size,
                    o.micro_batch_size,
                    o.max_tokens_per_gpu,
                    nan_loss=inject_nan,
                    temperature=self.cfg.rollout.temperature,
                    packing=o.use_packing,
                    offpolicy=stale_token_mode(self.cfg),
                )
            )
        return out

    def offload(self) -> int:
        """Release params, grads and optimizer state (host copy kept) while the engine runs."""

        if getattr(self, "_offloader", None) is None:
            self._offloader = TrainerOffloader(self.policy.model, self.policy.optimizer)
        return self._offloader.offload() if not self._offloader.is_offloaded else 0

    def onload(self) -> int:
        off = getattr(self, "_offloader", None)
        return off.onload() if off is not None and off.is_offloaded else 0

    # ------------------------------------------------------------------ state
    def rng_state(self) -> dict:

        return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}

    def set_rng_state(self, s: dict) -> None:
        """Restore what :meth:`rng_state` returned on this rank (same layout: exact resume)."""

        torch.set_rng_state(s["torch"])
        np.random.set_state(s["numpy"])
        random.setstate(s["python"])

    def derive_rng_state(self, step: int) -> int:
        """Seed this rank's torch, numpy and python RNGs from (``--seed``, rank, ``step``): a
        resume on another layout, where the saved per-rank states have no rank to go to. The
        same (seed, rank, step) always gives the same states; returns the derived seed."""
        seed = derived_rank_seed(self.cfg.optim.seed, self.rank, step)

        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        random.seed(seed)
        return seed

    def save(self, directory: str, metadata: dict) -> None:

        save_train_checkpoint(self.policy, directory, metadata)

    def load(self, directory: str) -> None:
        if self.policy.lora is not None:  # a LoRA checkpoint holds the adapters: the base first
            self._load_init_weights(self.policy.model)
        load_train_checkpoint(self.policy, directory)

    def barrier(self) -> None:

        dist.barrier()

    def shutdown(self) -> None:

        destroy_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()
