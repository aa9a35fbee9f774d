"""Qwen3-MoE on one CUDA device (a device check; on the CPU it runs the same steps with gloo).

    python tests/moe/gpu_moe_check.py

World of one (NCCL on a GPU): megatron-core's MoE layer with the local spec (SequentialMLP;
transformer_engine is not installed on the lent machine) and the all-to-all dispatcher on
CUDA, i.e. the GPU path with none of platform.py's patches: (1) logits = the HF model's
(fp32, TF32 off); (2) the weight sync into an HFEngine on the same device, every collective
forced through the backend (``force_collectives``: the experts' all-gather in place in the
slot), bit for bit; (3) one training step of the policy (DDP, distributed optimizer: a
chained dense + expert optimizer) with the load-balancing loss. One line per check; exit 1 on
a failure.
"""

from __future__ import annotations

import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def main() -> int:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    from megatron_dapo.checkpoint.model_io import load_hf_weights
    from megatron_dapo.distributed import free_port, init_distributed, init_parallel
    from megatron_dapo.hybrid.weight_sync import WeightSync
    from megatron_dapo.models import ModelBuildOptions, build_gpt_model, padded_vocab_size
    from megatron_dapo.rollout.hf_engine import HFEngine
    from megatron_dapo.training.setup import OptimizerOptions, build_policy, train_step
    from tests.foundation.bodies import _nll_loss_fn
    from tests.moe.bodies import megatron_logits
    from tests.tiny import checkpoint_state_dict, random_hf_model, tiny_qwen3_moe_config

    dev = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    print(f"device {dev} torch {torch.__version__}", flush=True)
    init_distributed(rank=0, world_size=1, master_port=free_port())
    init_parallel(1, 1, seed=1234)
    failed = []
    cfg = tiny_qwen3_moe_config(hidden_size=128, moe_intermediate_size=64, num_experts=16, num_experts_per_tok=4)
    hf = random_hf_model(cfg, seed=2)
    sd = checkpoint_state_dict(hf)
    params = {n: p.detach().clone() for n, p in hf.named_parameters()}
    hf = hf.to(dev)
    opts = ModelBuildOptions(use_te=False)
    model, arch, tcfg = build_gpt_model(cfg, opts)
    print(
        f"built: experts {type(model.decoder.layers[0].mlp.experts).__name__}, dispatcher "
        f"{tcfg.moe_token_dispatcher_type}, grouped_gemm {tcfg.moe_grouped_gemm}, params on "
        f"{next(model.parameters()).device}",
        flush=True,
    )
    load_hf_weights(model, arch, lambda n: sd[n], padded_vocab_size(arch.vocab_size, 128, 1))

    # (1) logits
    tokens = torch.randint(0, arch.vocab_size, (2, 24), generator=torch.Generator().manual_seed(7))
    t0 = time.time()
    got = megatron_logits(model, arch, tokens.to(dev))
    with torch.no_grad():
        ref = hf(tokens.to(dev)).logits.float()
    diff = float((got - ref).abs().max())
    ok = diff < 1e-4
    print(f"[{'ok' if ok else 'FAIL'}] logits vs HF: max |diff| {diff:.3g} ({time.time() - t0:.1f} s)", flush=True)
    failed += [] if ok else ["logits"]

    # (2) weight sync into an HFEngine on the device, every collective through the backend
    torch.manual_seed(99)
    from transformers import AutoConfig

    engine = HFEngine(AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"}), device=dev)
    for bs in (4096, 2**30):
        ws = WeightSync(model, arch, bucket_bytes=bs)
        ws.force_collectives = True
        st = ws.sync(engine)
        bad = [n for n, t in params.items() if not torch.equal(engine.get_weight(n).cpu(), t)]
        missing = sorted(set(params) - set(engine.expected_weight_names()))
        ok = not bad and not missing
        print(
            f"[{'ok' if ok else 'FAIL'}] sync into HFEngine ({bs} B buckets): {st.buckets} buckets, {st.tensors} "
            f"tensors, {st.bytes} bytes; differing {bad[:3]} missing {missing[:3]}",
            flush=True,
        )
        failed += [] if ok else [f"sync {bs}"]

    # (3) one training step: DDP, distributed optimizer, aux loss
    init_parallel(1, 1, seed=1234)
    policy = build_policy(cfg, opts, OptimizerOptions(lr=1e-3, use_distributed_optimizer=True))
    load_hf_weights(policy.model, policy.arch, lambda n: sd[n], policy.padded_vocab)
    policy.optimizer.reload_model_params()
    data = torch.randint(0, arch.vocab_size, (4, 16), generator=torch.Generator().manual_seed(11))
    mbs = [{"tokens": data[r : r + 1], "loss_mask": torch.ones_like(data[r : r + 1])} for r in range(4)]
    before = policy.model.module.decoder.layers[0].mlp.router.weight.detach().clone()
    out = train_step(policy, mbs, _nll_loss_fn(policy.arch, float(4 * 15)))
    moved = not torch.equal(before, policy.model.module.decoder.layers[0].mlp.router.weight.detach())
    ok = out["update_successful"] and out["grad_norm"] == out["grad_norm"] and moved
    print(
        f"[{'ok' if ok else 'FAIL'}] train step: update {out['update_successful']}, grad norm {out['grad_norm']:.4g}, "
        f"router moved {moved}, optimizer {type(policy.optimizer).__name__} x "
        f"{len(getattr(policy.optimizer, 'chained_optimizers', [policy.optimizer]))}, aux coeff "
        f"{policy.config.moe_aux_loss_coeff}",
        flush=True,
    )
    failed += [] if ok else ["train"]
    print("FAILED: " + ", ".join(failed) if failed else "ALL OK", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
