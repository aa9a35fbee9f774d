"""Hybrid-engine test bodies that run on every gloo rank (module-level so they pickle)."""

from __future__ import annotations

from dataclasses import replace

import torch

from megatron_dapo.rollout.base import KV_CACHE, WEIGHTS
from megatron_dapo.training.item import TrainItem


def hf_config_obj(hf_cfg: dict):
    from transformers import AutoConfig

    return AutoConfig.for_model(**{k: v for k, v in hf_cfg.items() if k != "architectures"})


def make_engine(hf_cfg: dict):
    """An HFEngine with random weights (different from the trainer's)."""
    from megatron_dapo.rollout.hf_engine import HFEngine

    torch.manual_seed(99)
    return HFEngine(hf_config_obj(hf_cfg))


def _batch(vocab: int, seed: int = 11):
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, vocab, (4, 10), generator=g)
    mask = torch.ones_like(data)
    mask[0, 7:] = 0
    mask[3, 4:] = 0
    return data, mask


def nll_step(policy, seed: int = 11):
    """One AdamW step on a fixed batch (whole batch on every DP rank)."""
    from megatron_dapo.training.setup import train_step
    from tests.foundation.bodies import _nll_loss_fn

    data, mask = _batch(policy.arch.vocab_size, seed)
    global_tokens = float(mask[:, 1:].sum())
    mbs = [{"tokens": data[r : r + 1], "loss_mask": mask[r : r + 1]} for r in range(4)]
    out = train_step(policy, mbs, _nll_loss_fn(policy.arch, global_tokens))
    assert out["update_successful"]
    return out


def build_trained_policy(hf_cfg: dict, tp: int, pp: int, distributed_optimizer: bool = False, steps: int = 1):
    """Policy loaded from the tiny random HF model, then ``steps`` optimizer steps."""
    from megatron_dapo.checkpoint.model_io import load_hf_weights
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.models import ModelBuildOptions
    from megatron_dapo.training.setup import OptimizerOptions, build_policy
    from tests.tiny import random_hf_model

    init_parallel(tp, pp, seed=1234)
    sd = random_hf_model(hf_cfg, seed=0).state_dict()
    opt = OptimizerOptions(lr=1e-2, weight_decay=0.1, clip_grad=1.0, use_distributed_optimizer=distributed_optimizer)
    policy = build_policy(hf_cfg, ModelBuildOptions(), opt)
    load_hf_weights(policy.model, policy.arch, lambda n: sd[n], policy.padded_vocab)
    policy.optimizer.reload_model_params()
    for i in range(steps):
        nll_step(policy, seed=11 + i)
    return policy


def reference_hf_weights(policy):
    """This PP stage's HF tensors via the independent path gather_full_weights + megatron_to_hf
    (on TP rank 0 of DP rank 0; None elsewhere)."""
    from megatron.core import parallel_state as ps

    from megatron_dapo.checkpoint.mapping import megatron_to_hf
    from megatron_dapo.checkpoint.model_io import gather_full_weights

    out = {}
    for g, full in gather_full_weights(policy.model, policy.arch):
        for n, t in megatron_to_hf(policy.arch, g, full):
            out[n] = t.clone()
    if ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0:
        return out
    return None


def sync_into_engine(hf_cfg: dict, tp: int, pp: int, feeders, bucket_sizes, threshold: float):
    """Trained policy -> HFEngine(s) on ``feeders`` for each bucket size; probe each time."""
    import torch.distributed as dist

    from megatron_dapo.hybrid.weight_sync import WeightSync
    from tests.hybrid.probe_helpers import check_weight_sync, default_probe_tokens

    policy = build_trained_policy(hf_cfg, tp, pp)
    rank = dist.get_rank()
    engine = make_engine(hf_cfg) if rank in feeders else None
    probe = default_probe_tokens(policy.arch.vocab_size, length=16, batch=2)
    res = {"rank": rank, "weights": {}, "diffs": {}, "stats": {}, "ref": reference_hf_weights(policy)}
    for bs in bucket_sizes:
        ws = WeightSync(policy.model, policy.arch, feeder_ranks=feeders, bucket_bytes=bs)
        st = ws.sync(engine)
        res["diffs"][bs] = check_weight_sync(policy.model, policy.arch, engine, probe, threshold)
        res["stats"][bs] = (st.buckets, st.tensors, st.bytes, st.max_bucket_bytes)
        if engine is not None:
            res["weights"][bs] = {n: engine.get_weight(n).clone() for n in engine.expected_weight_names()}
            res["hf_names"] = sorted(ws.hf_names())
    return res


class SwapQKEngine:
    """Proxy that corrupts the bucket holding layer 0's q/k: swaps a q block with a k block."""

    def __init__(self, engine, head_dim: int):
        self.engine = engine
        self.head_dim = head_dim
        self.swapped = 0

    def update_weights(self, bucket):
        d = dict(bucket)
        q, k = d.get("model.layers.0.self_attn.q_proj.weight"), d.get("model.layers.0.self_attn.k_proj.weight")
        if q is not None and k is not None:
            hd = self.head_dim
            tmp = q[:hd].clone()
            q[:hd].copy_(k[:hd])
            k[:hd].copy_(tmp)
            self.swapped += 1
        self.engine.update_weights(bucket)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def corrupted_sync(hf_cfg: dict, tp: int, pp: int, bucket_bytes: int):
    import torch.distributed as dist

    from megatron_dapo.hybrid.weight_sync import WeightSyncError, sync_weights
    from tests.hybrid.probe_helpers import check_weight_sync, default_probe_tokens

    policy = build_trained_policy(hf_cfg, tp, pp)
    engine = SwapQKEngine(make_engine(hf_cfg), policy.arch.head_dim) if dist.get_rank() == 0 else None
    sync_weights(policy.model, policy.arch, engine, bucket_bytes=bucket_bytes)
    probe = default_probe_tokens(policy.arch.vocab_size, length=16, batch=2)
    try:
        d = check_weight_sync(policy.model, policy.arch, engine, probe, 1e-5)
        return {"raised": False, "diff": d}
    except WeightSyncError as e:
        return {"raised": True, "msg": str(e), "swapped": engine.swapped if engine else None}


# ------------------------------------------------------------------- offload ----


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().contiguous().view(-1).view(torch.uint8)


def _snapshot(policy):
    from megatron_dapo.hybrid.offload import trainer_tensors

    return {cat: [_bits(t) for t in ts] for cat, ts in trainer_tensors(policy.model, policy.optimizer).items()}


def offload_roundtrip(hf_cfg: dict, tp: int, pp: int, distributed_optimizer: bool, preserve_grads: bool = True):
    """Step, offload (storages released), onload (bitwise equal; gradients zero without
    ``preserve_grads``), step again == no-offload run."""
    from megatron_dapo.checkpoint.model_io import gather_full_weights
    from megatron_dapo.hybrid.offload import TrainerOffloader, trainer_tensors

    policy = build_trained_policy(hf_cfg, tp, pp, distributed_optimizer)
    before = _snapshot(policy)
    counts = {c: len(v) for c, v in before.items()}
    assert counts["optimizer"] > 0 and counts["grads"] > 0 and counts["params"] > 0, counts
    off = TrainerOffloader(policy.model, policy.optimizer, preserve_grads=preserve_grads)
    resident = off.resident_bytes()
    grad_bytes = sum(s.nbytes() for c, s in off.storages() if c == "grads")
    freed = off.offload()
    host_copy_bytes = off.last["host_copy_bytes"]
    released = all(
        t.untyped_storage().nbytes() == 0 for ts in trainer_tensors(policy.model, policy.optimizer).values() for t in ts
    )
    resident_off = off.resident_bytes()
    off.onload()
    after = _snapshot(policy)
    kept = [c for c in before if preserve_grads or c != "grads"]
    equal = all(
        len(before[c]) == len(after[c]) and all(torch.equal(a, b) for a, b in zip(before[c], after[c])) for c in kept
    )
    grads_zero = all(not t.any() for t in trainer_tensors(policy.model, policy.optimizer)["grads"])
    # a second offload reuses the host buffers
    off.offload()
    off.onload()
    nll_step(policy, seed=12)
    got = {g: t.clone() for g, t in gather_full_weights(policy.model, policy.arch)}
    # the same two steps without any offload
    ref_policy = build_trained_policy(hf_cfg, tp, pp, distributed_optimizer, steps=2)
    ref = {g: t.clone() for g, t in gather_full_weights(ref_policy.model, ref_policy.arch)}
    same_training = set(got) == set(ref) and all(torch.equal(got[k], ref[k]) for k in got)
    return {
        "counts": counts,
        "resident": resident,
        "freed": freed,
        "released": released,
        "resident_off": resident_off,
        "equal": equal,
        "same_training": same_training,
        "grad_bytes": grad_bytes,
        "host_copy_bytes": host_copy_bytes,
        "grads_zero": grads_zero,
    }


# -------------------------------------------------------------------- phases ----


def _strict_engine_cls():
    from megatron_dapo.rollout.hf_engine import HFEngine

    class StrictEngine(HFEngine):
        """HFEngine that also checks the trainer's residency at each call, and logs calls."""

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.calls = []
            self.trainer = None  # a TrainerOffloader, set after construction

        def _trainer_offloaded(self):
            return self.trainer is not None and self.trainer.is_offloaded

        def update_weights(self, bucket):
            self._check_not_released(WEIGHTS, "update_weights")
            if self.trainer is not None and self._trainer_offloaded():
                raise AssertionError("update_weights while the trainer is offloaded")
            super().update_weights(bucket)
            if not self.calls or self.calls[-1] != "update_weights":
                self.calls.append("update_weights")

        def finish_weight_update(self):
            super().finish_weight_update()
            self.calls.append("finish_weight_update")

        def resume_memory(self, tags=(WEIGHTS, KV_CACHE)):
            tags = [tags] if isinstance(tags, str) else list(tags)
            if KV_CACHE in tags and self.trainer is not None and not self._trainer_offloaded():
                raise AssertionError("KV cache resumed while the trainer is resident")
            super().resume_memory(tags)
            self.calls.append(f"resume:{','.join(tags)}")

        def release_memory(self, tags=(WEIGHTS, KV_CACHE)):
            tags = [tags] if isinstance(tags, str) else list(tags)
            super().release_memory(tags)
            self.calls.append(f"release:{','.join(tags)}")

        def generate(self, prompts, params):
            self._check_ready("generate")  # released -> EngineReleasedError first
            if self.trainer is not None and not self._trainer_offloaded():
                raise AssertionError("generate while the trainer is resident")
            out = super().generate(prompts, params)
            self.calls.append("generate")
            return out

    return StrictEngine


def _expect(exc_type, fn, *a):
    try:
        fn(*a)
    except exc_type:
        return True
    return False


def phase_order(hf_dir: str, steps: int = 2):
    """The in-process trainer path of the hybrid step (what benchmarks/gpu_check.py runs on a
    GPU): a real PolicyWorker (world of one), a strict HF engine, HybridStep with offload."""
    from transformers import AutoConfig

    from megatron_dapo.config import parse_args
    from megatron_dapo.hybrid.phases import HybridStep, InProcessTrainer, LocalEngines, PhaseError
    from megatron_dapo.rollout.base import EngineReleasedError, SamplingParams
    from megatron_dapo.training.worker import PolicyWorker

    cfg = parse_args(
        [
            "--hf-checkpoint",
            hf_dir,
            "--micro-batch-size",
            "2",
            "--global-batch-size",
            "2",
            "--rollout-batch-size",
            "1",
            "--n-samples-per-prompt",
            "2",
            "--lr",
            "1e-3",
            "--update-weight-buffer-size",
            str(32 * 1024),
        ]
    )
    worker = PolicyWorker(0, 1, "127.0.0.1", 0, cfg, hf_dir)
    worker.load_initial_weights()
    torch.manual_seed(99)
    engine = _strict_engine_cls()(AutoConfig.from_pretrained(hf_dir))

    class _Residency:  # what the strict engine asks: is the trainer offloaded right now?
        @property
        def is_offloaded(self):
            off = getattr(worker, "_offloader", None)
            return off is not None and off.is_offloaded

    engine.trainer = _Residency()
    engines = LocalEngines([engine])
    hybrid = HybridStep(InProcessTrainer(worker, offload=True), offload=True, check_weight_sync_every=1)
    res = {"tolerance": hybrid.tolerance, "probe": []}
    res["to_train_in_init"] = _expect(PhaseError, hybrid.to_train, engines)
    probe = [[5, 6, 7, 8, 9, 10]]
    res["probe"].append(hybrid.to_rollout(engines, probe=probe)["probe_max_abs"])
    res["to_rollout_in_rollout"] = _expect(PhaseError, hybrid.to_rollout, engines)
    sp = SamplingParams(temperature=0.0, max_new_tokens=3)
    for k in range(steps):
        out = engine.generate([[5, 6, 7]], sp)[0][0]
        hybrid.to_train(engines)
        res.setdefault("released_refusals", []).append(
            (
                _expect(EngineReleasedError, engine.generate, [[1, 2]], sp),
                _expect(EngineReleasedError, engine.update_weights, []),
                _expect(EngineReleasedError, engine.score, [[1, 2]], [1]),
            )
        )
        sample = TrainItem(tokens=[5, 6, 7] + list(out.output_ids), prompt_len=3)
        sample.old_logprobs = torch.tensor(worker.compute_logprobs([sample])[0])
        batch = [replace(sample, advantage=1.0), replace(sample, advantage=-0.5 - k)]
        res.setdefault("train", []).append(worker.train([batch])[0].update_successful)
        res["probe"].append(hybrid.to_rollout(engines, probe=[sample.tokens.tolist()])["probe_max_abs"])
    res["events"] = list(hybrid.events)
    res["calls"] = list(engine.calls)
    return res


def odd_qwen2_config() -> dict:
    """Sizes that are not multiples of the 256-byte slot alignment (norms and q bias 160 B, gate 11200 B, vocab 250)."""
    from tests.tiny import tiny_qwen2_config

    return tiny_qwen2_config(
        vocab_size=250,
        hidden_size=40,
        intermediate_size=70,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
    )


def bf16_sync(hf_cfg: dict, tp: int, pp: int, bucket_bytes: int):
    """bf16 parameters (no optimizer): engine weights == the reference path, bitwise; probe."""
    import torch.distributed as dist

    from megatron_dapo.checkpoint.model_io import load_hf_weights
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.hybrid.weight_sync import sync_weights
    from megatron_dapo.models import ModelBuildOptions, build_gpt_model, padded_vocab_size
    from megatron_dapo.rollout.hf_engine import HFEngine
    from tests.hybrid.probe_helpers import check_weight_sync, default_probe_tokens
    from tests.tiny import random_hf_model

    init_parallel(tp, pp, seed=1234)
    sd = random_hf_model(hf_cfg, seed=0).state_dict()
    opts = ModelBuildOptions(params_dtype=torch.bfloat16, bf16=True)
    model, arch, _ = build_gpt_model(hf_cfg, opts)
    load_hf_weights(
        model, arch, lambda n: sd[n], padded_vocab_size(arch.vocab_size, opts.make_vocab_size_divisible_by, tp)
    )
    engine = HFEngine(hf_config_obj(hf_cfg), dtype=torch.bfloat16) if dist.get_rank() == 0 else None

    class P:  # reference_hf_weights wants .model / .arch
        pass

    p = P()
    p.model, p.arch = model, arch
    ref = reference_hf_weights(p)
    st = sync_weights(model, arch, engine, bucket_bytes=bucket_bytes)
    diff = check_weight_sync(model, arch, engine, default_probe_tokens(arch.vocab_size, length=16), None)
    w = {n: engine.get_weight(n).clone() for n in engine.expected_weight_names()} if engine else None
    return {
        "ref": ref,
        "weights": w,
        "diff": diff,
        "dtypes": sorted({str(q.dtype) for q in model.parameters()}),
        "buckets": st.buckets,
    }


class FailingEngine:
    """Proxy whose second update_weights call raises (an engine-side error mid-sync)."""

    def __init__(self, engine):
        self.engine = engine
        self.calls = 0

    def update_weights(self, bucket):
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("engine refused bucket 2")
        self.engine.update_weights(bucket)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def failing_sync(hf_cfg: dict, tp: int, pp: int):
    """An engine error on the feeder raises WeightSyncError on every rank (no hang)."""
    import torch.distributed as dist

    from megatron_dapo.hybrid.weight_sync import WeightSyncError, sync_weights

    policy = build_trained_policy(hf_cfg, tp, pp)
    engine = FailingEngine(make_engine(hf_cfg)) if dist.get_rank() == 0 else None
    try:
        sync_weights(policy.model, policy.arch, engine, bucket_bytes=1024)
    except WeightSyncError as e:
        return str(e)
    return None
