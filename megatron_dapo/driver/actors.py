"""Ray actors: trainer ranks and rollout engines, colocated on the same placement-group bundles.

``PolicyActor`` hosts one :class:`~megatron_dapo.training.worker.PolicyWorker` (one trainer
rank). ``EngineActor`` hosts one rollout engine (HFEngine on CPU, SGLangEngine on GPU) in its
own process, so that an engine that dies or hangs can be killed and restarted without
touching the trainer. Rank 0 streams weight buckets to the engine actor through
:class:`EngineHandleProxy` (one flat tensor per bucket and dtype, like SGLang's flattened
buckets).
"""

from __future__ import annotations

import os
from typing import Optional

import ray
import torch


def _threads(n: Optional[int]):
    if n:
        torch.set_num_threads(max(1, int(n)))


@ray.remote
class PolicyActor:
    def __init__(self, rank, world_size, master_addr, master_port, cfg, hf_config_path, num_threads=None):
        os.environ.setdefault("OMP_NUM_THREADS", str(num_threads or 1))
        _threads(num_threads)
        from ..training.worker import PolicyWorker

        self.w = PolicyWorker(rank, world_size, master_addr, master_port, cfg, hf_config_path)

    def call(self, method: str, *args, **kwargs):
        return getattr(self.w, method)(*args, **kwargs)

    def sync_to(self, engine_handles, bucket_bytes=None):
        """Weight sync into engine actors (handles on rank 0 only; other ranks pass None)."""
        proxy = EngineHandleProxy(engine_handles) if engine_handles else None
        return self.w.sync_weights(proxy, bucket_bytes)

    def pid(self):
        return os.getpid()


def flatten_bucket(bucket):
    """[(name, tensor)] -> ({dtype: flat tensor}, [(name, dtype, shape, offset)])."""
    by_dtype, meta, offsets = {}, [], {}
    for name, t in bucket:
        key = str(t.dtype)
        by_dtype.setdefault(key, []).append(t.reshape(-1))
        off = offsets.get(key, 0)
        meta.append((name, key, tuple(t.shape), off))
        offsets[key] = off + t.numel()
    flats = {k: torch.cat(v) if len(v) > 1 else v[0].clone() for k, v in by_dtype.items()}
    return flats, meta


def unflatten_bucket(flats, meta):
    out = []
    for name, key, shape, off in meta:
        n = 1
        for s in shape:
            n *= s
        out.append((name, flats[key][off : off + n].view(shape)))
    return out


class EngineHandleProxy:
    """The RolloutEngine weight-update methods, forwarded to one or more EngineActors."""

    def __init__(self, handles):
        self.handles = list(handles) if isinstance(handles, (list, tuple)) else [handles]

    def update_weights(self, bucket):
        flats, meta = flatten_bucket(bucket)
        ref = ray.put((flats, meta))
        ray.get([h.update_weights_flat.remote(ref) for h in self.handles])

    def finish_weight_update(self):
        ray.get([h.finish_weight_update.remote() for h in self.handles])


@ray.remote(concurrency_groups={"control": 2})
class EngineActor:
    """One rollout engine in its own process; threaded so ``abort`` can interrupt ``generate``."""

    def __init__(self, kind: str, model_dir: str, tokenizer_dir: Optional[str] = None, num_threads=None, **kwargs):
        os.environ.setdefault("OMP_NUM_THREADS", str(num_threads or 1))
        _threads(num_threads)
        if kind == "hf":
            from transformers import AutoConfig, AutoTokenizer

            from ..rollout.hf_engine import HFEngine

            tok = AutoTokenizer.from_pretrained(tokenizer_dir) if tokenizer_dir else None
            # Built from the config only: the trainer's weight sync fills in the weights.
            self.engine = HFEngine(AutoConfig.from_pretrained(model_dir), tokenizer=tok, **kwargs)
            self.tokenizer = tok
        elif kind == "sglang":
            from ..rollout.sglang_engine import SGLangEngine

            self.engine = SGLangEngine(model_dir, **kwargs)
        else:
            raise ValueError(f"--rollout-engine: unknown engine kind {kind!r}")

    def pid(self):
        return os.getpid()

    def generate(self, prompts, params):
        return self.engine.generate(prompts, params)

    def score(self, sequences, prompt_lens):
        return self.engine.score(sequences, prompt_lens)

    def update_weights_flat(self, payload):
        flats, meta = payload
        self.engine.update_weights(unflatten_bucket(flats, meta))

    def finish_weight_update(self):
        self.engine.finish_weight_update()

    def release_memory(self, tags=None):
        self.engine.release_memory(tags) if tags else self.engine.release_memory()

    def resume_memory(self, tags=None):
        self.engine.resume_memory(tags) if tags else self.engine.resume_memory()

    @ray.method(concurrency_group="control")
    def abort(self):
        self.engine.abort()

    @ray.method(concurrency_group="control")
    def health(self):
        return self.engine.health()

    def shutdown(self):
        self.engine.shutdown()

    def save_hf(self, directory: str):
        """Write the engine's current (synced) weights as an HF checkpoint (HFEngine only)."""
        os.makedirs(directory, exist_ok=True)
        self.engine.model.save_pretrained(directory, safe_serialization=True)
        if getattr(self, "tokenizer", None) is not None:
            self.tokenizer.save_pretrained(directory)
        return directory


class RemoteEngine:
    """A RolloutEngine-like client of an EngineActor (for evaluation from the driver)."""

    def __init__(self, handle):
        self.handle = handle

    def generate(self, prompts, params):
        return ray.get(self.handle.generate.remote(prompts, params))

    def score(self, sequences, prompt_lens):
        return ray.get(self.handle.score.remote(sequences, prompt_lens))
