"""Build the trainable policy: megatron-core GPTModel + DDP wrapper + optimizer + LR schedule.

The caller has initialised the parallel state (``megatron_dapo.distributed.init_parallel``).
Losses are normalised over the whole optimizer step by the caller (see
``megatron_dapo.training.forward``), so the model config is set up with
``calculate_per_token_loss=True`` and DP gradients are summed, not averaged.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Optional

import torch

from ..config.schema import MoEConfig, OptimConfig, ParallelConfig
from ..config.validate import lora_targets
from ..distributed import dp_token_counts
from ..models.hf_config import padded_vocab_size
from ..models.provider import ModelBuildOptions, MoEOptions, build_gpt_model
from .forward import configure_for_step_normalised_loss, forward_backward
from .lora import LoRAOptions, apply_lora

_OPTIM, _PARALLEL = OptimConfig(), ParallelConfig()


@dataclasses.dataclass
class OptimizerOptions:
    """Optimizer and schedule of one rank; the defaults are the command line's
    (``config.schema.OptimConfig``), so each default lives once."""

    lr: float = _OPTIM.lr
    weight_decay: float = _OPTIM.weight_decay
    adam_beta1: float = _OPTIM.adam_beta1
    adam_beta2: float = _OPTIM.adam_beta2
    adam_eps: float = _OPTIM.adam_eps
    clip_grad: float = _OPTIM.clip_grad
    use_distributed_optimizer: bool = _PARALLEL.use_distributed_optimizer
    lr_warmup_iters: int = 0  # linear warm-up, then the constant --lr (DAPO's schedule; no decay)


@dataclasses.dataclass
class Policy:
    """The trainable model of one rank: its chunk, optimizer and scheduler."""

    model: torch.nn.Module  # DDP-wrapped local chunk
    optimizer: object
    scheduler: object
    arch: object
    config: object  # TransformerConfig
    padded_vocab: int
    lora: Optional[LoRAOptions] = None  # adapters on the base, which is frozen (training/lora.py)


def moe_options(moe: MoEConfig) -> MoEOptions:
    """The mixture-of-experts build options of the ``--moe-*`` flags (ignored by dense models)."""
    return MoEOptions(
        load_balancing_type=moe.moe_router_load_balancing_type,
        aux_loss_coeff=moe.moe_aux_loss_coeff,
        enable_expert_bias=moe.moe_router_enable_expert_bias,
        bias_update_rate=moe.moe_router_bias_update_rate,
        token_dispatcher_type=moe.moe_token_dispatcher_type,
    )


def lora_options(cfg) -> Optional[LoRAOptions]:
    """The adapters of the ``--lora-*`` flags (a DAPOConfig), or None with ``--lora-rank 0``."""
    m = cfg.model
    if not m.lora_rank:
        return None
    return LoRAOptions(
        rank=m.lora_rank, alpha=m.lora_alpha, dropout=m.lora_dropout, targets=lora_targets(cfg), seed=cfg.optim.seed
    )


def expert_parallel_sizes(parallel: ParallelConfig) -> dict:
    """``distributed.init_parallel``'s expert-parallel arguments of the flags."""
    return {
        "expert_model_parallel_size": parallel.expert_model_parallel_size,
        "expert_tensor_parallel_size": parallel.expert_tensor_parallel_size,
    }


#: the attribute of a MoE model's TransformerConfig holding the --moe-aux-loss-coeff of a step
_AUX_PER_STEP = "_megatron_dapo_aux_loss_coeff"


def set_moe_aux_loss_scale(config, step_microbatches: float) -> None:
    """Make the load-balancing loss the MEAN over the optimizer step's micro-batches (all DP
    ranks) times its coefficient. megatron adds each micro-batch's loss with the coefficient
    as it is (``calculate_per_token_loss``) and DP sums gradients, so the coefficient the
    router reads is set to ``coefficient / step_microbatches`` before the step's forwards.
    No-op for dense models."""
    base = getattr(config, _AUX_PER_STEP, None)
    if base is not None:
        config.moe_aux_loss_coeff = base / max(1.0, float(step_microbatches))


def wrap_ddp(model, config, use_distributed_optimizer: bool):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=False,
        use_distributed_optimizer=use_distributed_optimizer,
        average_in_collective=False,
        check_for_nan_in_grad=False,
        bucket_size=None,
    )
    kw = {}
    if use_distributed_optimizer and "full_param_layout" in inspect.signature(DistributedDataParallel).parameters:
        kw["full_param_layout"] = full_param_layout(model, config, ddp_config)
    return DistributedDataParallel(config=config, ddp_config=ddp_config, module=model, **kw)


def full_param_layout(model, config, ddp_config):
    """The distributed optimizer's parameter layout, which megatron-core 0.19's DDP asks its caller
    for (it warns and computes the same itself otherwise): the trainable parameters in DDP's order,
    DDP's own data-parallel groups (with context parallel; the expert group for experts), and one
    bucket (``overlap_grad_reduce`` is off, so DDP's bucket size is None)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from megatron.core.process_groups_config import ProcessGroupCollection

    assert not ddp_config.overlap_grad_reduce, "the layout below assumes one bucket (no overlapped reduce)"
    groups = ProcessGroupCollection.setup_process_groups_for_ddp(None, config, ddp_config)
    params = [p for _, p in model.named_parameters() if p.requires_grad]
    return DistributedOptimizer.compute_full_param_layout(
        params,
        None,
        groups["intra_dp_cp_group"].size(),
        ddp_config,
        expert_data_parallel_world_size=groups["intra_expt_dp_group"].size(),
    )


def build_optimizer(model, opt: OptimizerOptions, bf16: bool = False):
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    oc = OptimizerConfig(
        optimizer="adam",
        lr=opt.lr,
        min_lr=opt.lr,
        weight_decay=opt.weight_decay,
        adam_beta1=opt.adam_beta1,
        adam_beta2=opt.adam_beta2,
        adam_eps=opt.adam_eps,
        clip_grad=opt.clip_grad,
        bf16=bf16,
        params_dtype=torch.bfloat16 if bf16 else torch.float32,
        use_distributed_optimizer=opt.use_distributed_optimizer,
    )
    optimizer = get_megatron_optimizer(oc, [model])
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=0.0 if opt.lr_warmup_iters > 0 else opt.lr,
        max_lr=opt.lr,
        min_lr=opt.lr,
        lr_warmup_steps=opt.lr_warmup_iters,
        lr_decay_steps=opt.lr_warmup_iters + 1,  # unused by the constant style; megatron wants > warm-up
        lr_decay_style="constant",
        start_wd=opt.weight_decay,
        end_wd=opt.weight_decay,
        wd_incr_steps=1,
        wd_incr_style="constant",
    )
    return optimizer, scheduler


def build_policy(
    hf_config,
    build: Optional[ModelBuildOptions] = None,
    opt: Optional[OptimizerOptions] = None,
    lora: Optional[LoRAOptions] = None,
) -> Policy:
    """Model (this rank's TP/PP part) wrapped in DDP, with its optimizer and LR schedule. With
    ``lora``, adapters on the targeted linears and the base frozen: DDP and the optimizer hold
    the adapters only (training/lora.py)."""
    build = build or ModelBuildOptions()
    opt = opt or OptimizerOptions()
    if lora is not None:  # the TE spec's norms unfused: the adapters see the normalised input
        build = dataclasses.replace(build, unfuse_norms=True)
    model, arch, config = build_gpt_model(hf_config, build)
    if lora is not None:
        from megatron.core import parallel_state as ps

        apply_lora(model, arch, lora, tp_group=ps.get_tensor_model_parallel_group())
    configure_for_step_normalised_loss(config)
    if getattr(config, "num_moe_experts", None):
        setattr(config, _AUX_PER_STEP, float(config.moe_aux_loss_coeff or 0.0))
    ddp = wrap_ddp(model, config, opt.use_distributed_optimizer)
    optimizer, scheduler = build_optimizer(ddp, opt, bf16=build.bf16)
    pv = padded_vocab_size(arch.vocab_size, build.make_vocab_size_divisible_by, config.tensor_model_parallel_size)
    return Policy(ddp, optimizer, scheduler, arch, config, pv, lora)


def train_step(policy: Policy, microbatches: list[dict], loss_fn) -> dict:
    """Zero grads, forward/backward over all micro-batches, one optimizer step.

    Returns ``{"update_successful", "grad_norm", "metrics"}``; a non-finite gradient norm
    skips the update (megatron's optimizer returns ``update_successful=False``).
    """
    if getattr(policy.config, _AUX_PER_STEP, None) is not None:
        set_moe_aux_loss_scale(policy.config, float(dp_token_counts([len(microbatches)])[0]))
    policy.model.zero_grad_buffer()
    policy.optimizer.zero_grad()
    metrics = forward_backward(policy.model, microbatches, loss_fn, forward_only=False)
    ok, grad_norm = optimizer_step(policy.optimizer, policy.optimizer.config.clip_grad)
    if ok:
        policy.scheduler.step(increment=1)
    return {"update_successful": ok, "grad_norm": grad_norm, "metrics": metrics}


@torch.no_grad()
def optimizer_step(optimizer, clip_grad: float) -> tuple[bool, float]:
    """megatron's optimizer step, skipped when the gradient norm is not finite.

    megatron's FP32 optimizer never reports an overflow, so a NaN loss would poison the
    weights; here a non-finite norm (computed across all model-parallel ranks, so every
    rank decides the same) returns ``(False, norm)`` without touching the parameters.
    """
    found_inf = optimizer.prepare_grads()
    if found_inf:
        return False, float("nan")
    norm = optimizer.get_grad_norm()
    norm = float(norm) if norm is not None else 0.0
    if not math.isfinite(norm):
        return False, norm
    if clip_grad > 0:
        subs = [
            o
            for o in getattr(optimizer, "chained_optimizers", [optimizer])
            if not getattr(o, "is_stub_optimizer", False)
        ]
        if len(subs) <= 1:
            optimizer.clip_grad_norm(clip_grad)
        else:  # dense + expert optimizers (MoE): each clipped by the norm over all of them
            from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

            for o in subs:
                params = o.get_parameters()
                if params:
                    clip_grad_by_total_norm_fp32(
                        params,
                        max_norm=clip_grad,
                        total_norm=norm,
                        use_decoupled_grad=bool(
                            getattr(o.config, "use_precision_aware_optimizer_no_fp8_or_ds_fp8", False)
                        ),
                    )
    ok = bool(optimizer.step_with_ready_grads())
    return ok, norm
