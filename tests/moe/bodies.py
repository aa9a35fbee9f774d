"""Mixture-of-experts test bodies: run on every gloo rank (module-level so they pickle by name)."""

from __future__ import annotations

import torch


def build_from_hf(hf_cfg: dict, sd: dict, tp: int = 1, pp: int = 1, ep: int = 1, etp=None, opts=None, cp: int = 1):
    """Parallel state with EP/ETP and the megatron model with the HF tensors ``sd`` (the HF
    checkpoint's names, ``tests.tiny.checkpoint_state_dict``) loaded. Returns (model, arch)."""
    from megatron_dapo.checkpoint.model_io import load_hf_weights
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.models import ModelBuildOptions, build_gpt_model, padded_vocab_size

    init_parallel(tp, pp, cp, seed=1234, expert_model_parallel_size=ep, expert_tensor_parallel_size=etp)
    opts = opts or ModelBuildOptions(context_parallel_size=cp)
    model, arch, _ = build_gpt_model(hf_cfg, opts)
    load_hf_weights(
        model, arch, lambda n: sd[n], padded_vocab_size(arch.vocab_size, opts.make_vocab_size_divisible_by, tp)
    )
    return model, arch


def megatron_logits(model, arch, tokens):
    """Full-vocab logits of ``tokens`` on the last PP stage (None elsewhere)."""
    from megatron.core import parallel_state as ps

    from megatron_dapo.training.forward import forward_backward, gather_vocab

    got = []

    def loss_fn(batch, logits):
        got.append(gather_vocab(logits)[..., : arch.vocab_size].detach().float())
        return logits.sum() * 0, {}

    model.eval()
    with torch.no_grad():
        forward_backward(model, [{"tokens": tokens}], loss_fn, forward_only=True)
    return got[0] if ps.is_pipeline_last_stage() else None


def logits(hf_cfg: dict, sd: dict, tokens_by_dp: list, tp: int, pp: int, ep: int = 1, etp=None):
    """``(dp rank, logits)`` of ``tokens_by_dp[dp rank]`` on the last stage's TP rank 0 (None
    elsewhere). Each DP rank feeds other tokens, so the EP all-to-all moves tokens of
    different sequences between ranks."""
    from megatron.core import parallel_state as ps

    model, arch = build_from_hf(hf_cfg, sd, tp, pp, ep, etp)
    dp = ps.get_data_parallel_rank()
    got = megatron_logits(model, arch, tokens_by_dp[dp])
    if got is None or ps.get_tensor_model_parallel_rank() != 0:
        return None
    return dp, got


def checkpoint_logits(hf_cfg: dict, ckpt_dir: str, tokens, tp: int, pp: int, ep: int = 1, etp=None):
    """Load the torch_dist checkpoint at TP x PP x EP (x ETP) and return the logits of
    ``tokens`` on the last stage's TP rank 0 of DP rank 0 (None elsewhere)."""
    from megatron.core import parallel_state as ps

    from megatron_dapo.checkpoint.dist_ckpt import load_checkpoint
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.models import ModelBuildOptions, build_gpt_model

    # a seed unlike the HF model's: the weights must come from the checkpoint
    init_parallel(tp, pp, seed=4321, expert_model_parallel_size=ep, expert_tensor_parallel_size=etp)
    model, arch, _ = build_gpt_model(hf_cfg, ModelBuildOptions())
    load_checkpoint(model, ckpt_dir, arch)
    got = megatron_logits(model, arch, tokens)
    if got is None or ps.get_tensor_model_parallel_rank() != 0 or ps.get_data_parallel_rank() != 0:
        return None
    return got


def sync_into_hf_engine(hf_cfg: dict, sd: dict, tp: int, pp: int, ep: int, etp, mode: str, bucket_sizes):
    """The MoE model (weights from the HF tensors ``sd``) synced into an HFEngine whose own
    weights start random, once per bucket size. ``mode``: ``rank0`` (an in-process engine on
    rank 0 only: replicas without a feeder still join their expert group's all-gathers) or
    ``payloads`` (one engine in its own process fed by EVERY rank by memory handles, as the
    trainer feeds engines: ``EngineFeeding`` + ``PayloadSink``). Returns per rank: the
    engine's weights after each sync (where it lives; None elsewhere), the HF names the plan
    announces for the transformers naming, the sync stats."""
    import torch.distributed as dist

    from megatron_dapo.hybrid.weight_sync import EngineFeeding, EngineProtocol, WeightSync
    from tests.hybrid.bodies import make_engine

    model, arch = build_from_hf(hf_cfg, sd, tp, pp, ep, etp)
    rank = dist.get_rank()
    res = {"rank": rank, "weights": [], "stats": [], "names": None}
    if mode == "rank0":
        engine = make_engine(hf_cfg) if rank == 0 else None
        for bs in bucket_sizes:
            ws = WeightSync(model, arch, feeder_ranks=(0,), bucket_bytes=bs)
            st = ws.sync(engine)
            res["stats"].append((st.buckets, st.bytes, st.tensors))
            if engine is not None:
                res["weights"].append({n: engine.get_weight(n).clone() for n in engine.expected_weight_names()})
                res["names"] = ws.hf_names("transformers")
        return res
    from tests.hybrid.engine_proc import EngineProcess

    feeding = EngineFeeding(dist.get_world_size())
    proc = EngineProcess(hf_cfg) if rank == feeding.leader else None
    try:
        for bs in bucket_sizes:
            ws = WeightSync(model, arch, feeder_ranks=feeding.feeder_ranks, bucket_bytes=bs)
            st = ws.sync(feeding.sink(proc.calls() if proc else None, EngineProtocol.for_engine("hf")))
            res["stats"].append((st.buckets, st.bytes, st.tensors))
            if proc is not None:
                res["weights"].append(proc.weights())
    finally:
        if proc is not None:
            proc.close()
    return res


def train_step_at(hf_cfg: dict, sd: dict, ep: int, distributed_optimizer: bool, balancing: str = "aux_loss"):
    """One AdamW step of the MoE policy (TP1, DDP over the world, ``ep`` expert ranks) on
    4 rows, one per DP rank and micro-batch (row r on DP rank r % DP). Returns every full
    weight after the step (TP/EP gathered, on DP rank 0), the grad norm, the load-balancing
    coefficient the router used, and the expert-data-parallel size."""
    from megatron.core import parallel_state as ps

    from megatron_dapo.checkpoint.model_io import gather_full_weights, load_hf_weights
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.models import ModelBuildOptions, MoEOptions
    from megatron_dapo.training.setup import OptimizerOptions, build_policy, train_step
    from tests.foundation.bodies import _nll_loss_fn
    from tests.tolerances import COMPARE_ADAM_EPS

    init_parallel(1, 1, seed=1234, expert_model_parallel_size=ep)
    # eps: tests/tolerances.py (weights are compared after the step)
    opt = OptimizerOptions(
        lr=1e-3,
        weight_decay=0.1,
        clip_grad=1.0,
        use_distributed_optimizer=distributed_optimizer,
        adam_eps=COMPARE_ADAM_EPS,
    )
    policy = build_policy(hf_cfg, ModelBuildOptions(moe=MoEOptions(load_balancing_type=balancing)), opt)
    load_hf_weights(policy.model, policy.arch, lambda n: sd[n], policy.padded_vocab)
    policy.optimizer.reload_model_params()
    data = torch.randint(0, policy.arch.vocab_size, (4, 10), generator=torch.Generator().manual_seed(11))
    mask = torch.ones_like(data)
    mask[0, 7:] = 0
    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    rows = [r for r in range(4) if r % dp == dp_rank]
    mbs = [{"tokens": data[r : r + 1], "loss_mask": mask[r : r + 1]} for r in rows]
    out = train_step(policy, mbs, _nll_loss_fn(policy.arch, float(mask[:, 1:].sum())))
    assert out["update_successful"]
    full = {n: t.clone() for n, t in gather_full_weights(policy.model, policy.arch)}
    return {
        "params": full if dp_rank == 0 else None,
        "grad_norm": out["grad_norm"],
        "aux_coeff": policy.config.moe_aux_loss_coeff,
        "edp": ps.get_expert_data_parallel_world_size(),
    }


def balancing_steps(hf_cfg: dict, sd: dict, types: list):
    """One EP2 step per load-balancing type (``--moe-router-load-balancing-type``): grad norm,
    the coefficient the router read, and this rank's router weights after the step."""
    out = {}
    for t in types:
        r = train_step_at(hf_cfg, sd, 2, True, balancing=t)
        out[t] = (
            r["grad_norm"],
            r["aux_coeff"],
            None if r["params"] is None else r["params"]["decoder.layers.0.mlp.router.weight"],
        )
    return out


def packed_logprobs(hf_cfg: dict, sd: dict, cp: int, ep: int):
    """The trainer's logprobs (``compute_logprobs``, packed THD micro-batches) of a few
    sequences of unequal lengths at CP ``cp`` x EP ``ep`` (rank 0's; every rank feeds them all)."""
    import torch.distributed as dist

    from megatron_dapo.training import dapo_step as ds
    from tests.training.packing_bodies import _samples

    model, arch = build_from_hf(hf_cfg, sd, ep=ep, cp=cp)
    model.eval()
    samples = _samples(arch.vocab_size)
    with torch.no_grad():
        lps = ds.compute_logprobs(model, samples, arch.vocab_size, 2, 48, packing=True)
    return lps if dist.get_rank() == 0 else None
