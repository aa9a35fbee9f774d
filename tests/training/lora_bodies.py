"""Test bodies of tests/training/test_lora.py that run on every gloo rank (module level: they
pickle by name)."""

from __future__ import annotations

import torch

from megatron_dapo.training.lora import HF_PARENT, MODULES, TARGETS, LoRAOptions

R = 4


def full_b(layer: int, p: str, out_full: int) -> torch.Tensor:
    """A non-zero B for projection ``p`` of ``layer`` (the init's B is zero: nothing to see)."""
    g = torch.Generator().manual_seed(1000 * layer + TARGETS.index(p))
    return torch.randn(out_full, R, generator=g) * 0.2


def _out_full(arch, p: str) -> int:
    return {
        "q_proj": arch.num_attention_heads * arch.head_dim,
        "k_proj": arch.num_query_groups * arch.head_dim,
        "v_proj": arch.num_query_groups * arch.head_dim,
        "o_proj": arch.hidden_size,
        "gate_proj": arch.ffn_hidden_size,
        "up_proj": arch.ffn_hidden_size,
        "down_proj": arch.hidden_size,
    }[p]


def _in_full(arch, p: str) -> int:
    if p == "o_proj":
        return arch.num_attention_heads * arch.head_dim
    return arch.ffn_hidden_size if p == "down_proj" else arch.hidden_size


def set_b(model, arch, targets) -> None:
    """Put this rank's shard of every :func:`full_b` into the model's adapters."""
    from megatron.core import parallel_state as ps

    from megatron_dapo.checkpoint.model_io import layer_offset, unwrap
    from megatron_dapo.training.lora import adapted_modules

    inner = unwrap(model)
    tp, t = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    for name, mod in adapted_modules(inner):
        layer = int(name.split(".")[2]) + layer_offset(inner)
        suffix = name.split(".", 3)[3]
        kind = MODULES[suffix][1]
        for p in mod.lora.names:
            b = full_b(layer, p, _out_full(arch, p))
            if kind == "column":
                b = b.chunk(tp, 0)[t]
            with torch.no_grad():
                mod.lora.lora_B[p].copy_(b)
    del targets


def merged_hf_state(hf, arch, opts: LoRAOptions) -> dict:
    """The HF weights with every adapter folded in, computed in HF's own layout (q/k/v and
    gate/up separate): ``W_p + (alpha / r) B_p A_p`` with A from the init's seeded draw."""
    from megatron_dapo.training.lora import _uniform_a

    sd = {k: v.clone() for k, v in hf.state_dict().items()}
    megatron_of = {p: s for s, (fused, _) in MODULES.items() for p in fused}
    for layer in range(arch.num_layers):
        for p in opts.targets:
            name = f"decoder.layers.{layer}.{megatron_of[p]}.{p}"
            a = _uniform_a(name, R, _in_full(arch, p), opts.seed)
            b = full_b(layer, p, _out_full(arch, p))
            sd[f"model.layers.{layer}.{HF_PARENT[p]}.{p}.weight"] += opts.scaling * (b @ a)
    return sd


def lora_logits_vs_merged_hf(hf_cfg: dict, tp: int, pp: int, targets: tuple):
    """Max |megatron-with-adapters logits - HF-with-merged-weights logits| on the last PP stage."""
    from megatron.core import parallel_state as ps

    from megatron_dapo.training.lora import apply_lora
    from tests.checkpoint.bodies import _logits
    from tests.foundation.bodies import build_from_hf

    opts = LoRAOptions(rank=R, alpha=8.0, targets=targets, seed=5)
    hf, model, arch, _ = build_from_hf(hf_cfg, tp, pp)
    apply_lora(model, arch, opts, tp_group=ps.get_tensor_model_parallel_group())
    set_b(model, arch, targets)
    model.eval()
    tokens = torch.randint(0, arch.vocab_size, (2, 12), generator=torch.Generator().manual_seed(7))
    got = _logits(model, arch, tokens)  # the last stage's; None elsewhere
    with torch.no_grad():
        plain = hf(tokens).logits
        hf.load_state_dict(merged_hf_state(hf, arch, opts))
        ref = hf(tokens).logits
    if got is None:
        return None
    return {"diff": float((got - ref).abs().max()), "effect": float((plain - ref).abs().max())}


def lora_train_steps(hf_cfg: dict, tp: int, pp: int, steps: int, distributed_optimizer: bool = False):
    """``steps`` AdamW steps of a LoRA policy on a fixed batch: which parameters the optimizer
    holds, whether any base weight moved (bitwise), and the adapters after the steps, whole
    (TP shards gathered), keyed ``layer.p.A|B``."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from megatron_dapo.checkpoint.model_io import layer_offset, unwrap
    from megatron_dapo.training.lora import adapted_modules, is_lora_param
    from megatron_dapo.training.setup import train_step
    from tests.foundation.bodies import _nll_loss_fn

    policy = _lora_policy(hf_cfg, tp, pp, weight_decay=0.0, distributed_optimizer=distributed_optimizer)
    inner = unwrap(policy.model)
    base_before = {n: p.detach().clone() for n, p in inner.named_parameters() if not is_lora_param(n)}
    trainable = sorted(n for n, p in inner.named_parameters() if p.requires_grad)
    in_optimizer = sum(p.numel() for g in policy.optimizer.param_groups for p in g["params"])

    data = torch.randint(0, policy.arch.vocab_size, (4, 10), generator=torch.Generator().manual_seed(11))
    mask = torch.ones_like(data)
    mask[0, 7:] = 0
    global_tokens = float(mask[:, 1:].sum())
    mbs = [{"tokens": data[r : r + 1], "loss_mask": mask[r : r + 1]} for r in range(4)]
    norms = []
    for _ in range(steps):
        out = train_step(policy, mbs, _nll_loss_fn(policy.arch, global_tokens))
        assert out["update_successful"]
        norms.append(out["grad_norm"])
    moved = [n for n, p in inner.named_parameters() if not is_lora_param(n) and not torch.equal(p, base_before[n])]

    tp_group = ps.get_tensor_model_parallel_group()
    tp_size = ps.get_tensor_model_parallel_world_size()
    adapters = {}
    for name, mod in adapted_modules(inner):
        layer = int(name.split(".")[2]) + layer_offset(inner)
        kind = MODULES[name.split(".", 3)[3]][1]
        for p in mod.lora.names:
            for which, t in (("A", mod.lora.lora_A[p]), ("B", mod.lora.lora_B[p])):
                t = t.detach().contiguous()
                split = (kind == "column" and which == "B") or (kind == "row" and which == "A")
                if split and tp_size > 1:
                    parts = [torch.empty_like(t) for _ in range(tp_size)]
                    dist.all_gather(parts, t, group=tp_group)
                    t = torch.cat(parts, dim=0 if which == "B" else 1)
                adapters[f"{layer}.{p}.{which}"] = t.clone()
    return {
        "trainable": trainable,
        "in_optimizer": in_optimizer,
        "adapter_numel": sum(p.numel() for n, p in inner.named_parameters() if is_lora_param(n)),
        "moved": moved,
        "adapters": adapters,
        "grad_norm": norms,
    }


def merged_sync(hf_cfg: dict, tp: int, pp: int, feeders):
    """A LoRA policy (non-zero B) synced into an HFEngine in buckets (the merged sync,
    hybrid/bucket_plan.MergedLocal): the engine's weights against :func:`merged_hf_state`, the
    gathered export (model_io.gather_full_weights) against the same, and the probe (the engine's
    logprobs against megatron's with its adapters)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from megatron_dapo.checkpoint.mapping import megatron_to_hf
    from megatron_dapo.checkpoint.model_io import gather_full_weights, load_hf_weights
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.hybrid.weight_sync import WeightSync
    from megatron_dapo.models import ModelBuildOptions
    from megatron_dapo.training.setup import OptimizerOptions, build_policy
    from tests.hybrid.bodies import make_engine
    from tests.hybrid.probe_helpers import check_weight_sync, default_probe_tokens
    from tests.tiny import random_hf_model

    init_parallel(tp, pp, seed=1234)
    hf = random_hf_model(hf_cfg, seed=0)
    sd = hf.state_dict()
    lora = LoRAOptions(rank=R, alpha=8.0, seed=5)
    policy = build_policy(hf_cfg, ModelBuildOptions(), OptimizerOptions(), lora=lora)
    load_hf_weights(policy.model, policy.arch, lambda n: sd[n], policy.padded_vocab)
    set_b(policy.model, policy.arch, lora.targets)
    want = merged_hf_state(hf, policy.arch, lora)
    exported = {}
    for g, full in gather_full_weights(policy.model, policy.arch):
        for n, t in megatron_to_hf(policy.arch, g, full):
            exported[n] = t
    export_diff = max(float((t - want[n]).abs().max()) for n, t in exported.items())
    rank = dist.get_rank()
    engine = make_engine(hf_cfg) if rank in feeders else None
    WeightSync(policy.model, policy.arch, feeder_ranks=feeders, bucket_bytes=1 << 16).sync(engine)
    probe = check_weight_sync(
        policy.model, policy.arch, engine, default_probe_tokens(policy.arch.vocab_size, length=16, batch=2), 1e-4
    )
    out = {"export_diff": export_diff, "probe": probe, "pp_rank": ps.get_pipeline_model_parallel_rank()}
    if engine is not None:
        got = {n: engine.get_weight(n) for n in engine.expected_weight_names()}
        out["engine_diff"] = max(float((t - want[n]).abs().max()) for n, t in got.items())
        out["engine_names"] = len(got)
    return out


def _lora_policy(hf_cfg: dict, tp: int, pp: int, weight_decay: float = 0.1, distributed_optimizer: bool = False):
    from megatron_dapo.checkpoint.model_io import load_hf_weights
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.models import ModelBuildOptions
    from megatron_dapo.training.setup import OptimizerOptions, build_policy
    from tests.tiny import random_hf_model
    from tests.tolerances import COMPARE_ADAM_EPS

    init_parallel(tp, pp, seed=1234)
    sd = random_hf_model(hf_cfg, seed=0).state_dict()
    opt = OptimizerOptions(
        lr=1e-2,
        weight_decay=weight_decay,
        clip_grad=1.0,
        adam_eps=COMPARE_ADAM_EPS,
        use_distributed_optimizer=distributed_optimizer,
    )
    policy = build_policy(hf_cfg, ModelBuildOptions(), opt, lora=LoRAOptions(rank=R, alpha=8.0, seed=5))
    load_hf_weights(policy.model, policy.arch, lambda n: sd[n], policy.padded_vocab)
    policy.optimizer.reload_model_params()
    return policy


def _adapter_state(policy) -> dict:
    from megatron_dapo.checkpoint.model_io import unwrap
    from megatron_dapo.training.lora import is_lora_param

    return {n: p.detach().clone() for n, p in unwrap(policy.model).named_parameters() if is_lora_param(n)}


def lora_checkpoint_resume(hf_cfg: dict, tp: int, pp: int, directory: str, save: bool):
    """``save``: one step, save (adapters and optimizer only), one more step: the adapters after
    it. Else: a fresh policy (base from the HF weights) loads the checkpoint, then one step: the
    adapters after the load and after the step, and the keys the checkpoint holds."""
    import os

    from megatron_dapo.checkpoint.dist_ckpt import checkpoint_metadata, checkpoint_tensor_shapes
    from megatron_dapo.training.train_checkpoint import load_train_checkpoint, save_train_checkpoint
    from tests.hybrid.bodies import nll_step

    policy = _lora_policy(hf_cfg, tp, pp)
    if save:
        from tests.checkpoint.bodies import allow_children

        allow_children()  # dist_checkpointing.save starts writer processes (megatron-core 0.16)
        nll_step(policy, seed=11)
        meta = checkpoint_metadata(hf_cfg, extra={"step": 1})
        save_train_checkpoint(policy, directory, meta)
        nll_step(policy, seed=12)
        return {"after": _adapter_state(policy)}
    base_before = {n: t for n, t in _base_state(policy).items()}
    load_train_checkpoint(policy, directory)
    loaded = _adapter_state(policy)
    base_after_load = _base_state(policy)
    nll_step(policy, seed=12)
    keys = sorted(checkpoint_tensor_shapes(directory)) if os.path.exists(directory) else []
    return {
        "loaded": loaded,
        "after": _adapter_state(policy),
        "keys": keys,
        "base_untouched": all(torch.equal(base_before[n], t) for n, t in base_after_load.items()),
    }


def _base_state(policy) -> dict:
    from megatron_dapo.checkpoint.model_io import unwrap
    from megatron_dapo.training.lora import is_lora_param

    return {n: p.detach().clone() for n, p in unwrap(policy.model).named_parameters() if not is_lora_param(n)}


def adapter_vs_merged_sync(hf_cfg: dict, tp: int, pp: int, feeders):
    """The two ways an engine gets a LoRA policy (non-zero B): engine 1 by the merged bucketed sync,
    engine 2 by the base's bucketed sync (``merge_lora=False``) and then the adapters alone
    (``load_lora_adapter_from_tensors`` with PEFT's names and config). Greedy outputs of both, the
    largest weight difference, and whether unloading the adapter gives the base back bitwise."""
    import torch.distributed as dist

    from megatron_dapo.checkpoint.model_io import load_hf_weights
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.hybrid.weight_sync import WeightSync
    from megatron_dapo.models import ModelBuildOptions
    from megatron_dapo.rollout.base import SamplingParams
    from megatron_dapo.training.lora_export import adapter_tensors, peft_config
    from megatron_dapo.training.setup import OptimizerOptions, build_policy
    from tests.hybrid.bodies import make_engine
    from tests.tiny import random_hf_model

    init_parallel(tp, pp, seed=1234)
    sd = random_hf_model(hf_cfg, seed=0).state_dict()
    lora = LoRAOptions(rank=R, alpha=8.0, seed=5)
    policy = build_policy(hf_cfg, ModelBuildOptions(), OptimizerOptions(), lora=lora)
    load_hf_weights(policy.model, policy.arch, lambda n: sd[n], policy.padded_vocab)
    set_b(policy.model, policy.arch, lora.targets)
    feeder = dist.get_rank() in feeders
    merged, adapted = (make_engine(hf_cfg), make_engine(hf_cfg)) if feeder else (None, None)
    WeightSync(policy.model, policy.arch, feeder_ranks=feeders).sync(merged)
    WeightSync(policy.model, policy.arch, feeder_ranks=feeders, merge_lora=False).sync(adapted)
    tensors = adapter_tensors(policy.model)  # collective: every rank
    if not feeder:
        return None
    base = {n: adapted.get_weight(n).clone() for n in adapted.expected_weight_names()}
    adapted.load_lora_adapter_from_tensors("policy-v1", tensors, peft_config(lora, "base").to_dict())
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True)
    prompts = [[1, 17, 33, 90], [1, 5, 9], [1, 200, 201, 202, 203, 7]]
    out_m = [o[0].output_ids for o in merged.generate(prompts, greedy)]
    out_a = [o[0].output_ids for o in adapted.generate(prompts, greedy)]
    diff = max(float((merged.get_weight(n) - adapted.get_weight(n)).abs().max()) for n in base)
    adapted.unload_lora_adapter("policy-v1")
    restored = all(torch.equal(adapted.get_weight(n), t) for n, t in base.items())
    return {
        "merged": out_m,
        "adapter": out_a,
        "weight_diff": diff,
        "restored": restored,
        "adapter_bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
        "model_bytes": sum(t.numel() * t.element_size() for t in base.values()),
    }
