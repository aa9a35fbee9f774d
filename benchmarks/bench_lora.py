"""LoRA (issue 41): what a sync sends and what the optimizer holds, full fine-tuning against LoRA
merged and LoRA adapter syncs.

Part 1, computed from the shapes (no run): Qwen2.5-32B (examples/qwen2.5-32b/config.json) at
the 32B recipe's layout (TP 8, 16 nodes of 8 GPUs, distributed optimizer; the plan's memory model,
launch/memory_estimate.py), LoRA rank 32 on all seven projections: bytes a sync sends (bf16 weights;
the adapters as the adapter sync sends them, float32), trainable parameters, optimizer state
(Adam m, v and fp32 main parameters) per GPU, and a checkpoint's size.

Part 2, measured on this machine: a tiny Qwen2-shaped model (hidden 256, FFN 704, 4 layers, vocab
4096, fp32; one gloo rank, in this process) into an HFEngine, repeated, medians, in the same run:
(a) the full sync of a fully fine-tuned policy; (b) the merged sync of a LoRA policy (every adapted
weight merged as its bucket fills); (c) the adapter sync: the adapters gathered in PEFT's names
and loaded by the engine (``load_lora_adapter_from_tensors``, the previous adapter unloaded).
Prints the seconds and bytes of each and, last, ``adapter sync time over full sync: X.XX``.

    .venv/bin/python benchmarks/bench_lora.py [--rank 8] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def computed_32b(rank: int) -> None:
    import dataclasses

    from megatron_dapo.config.cli import parse_args
    from megatron_dapo.launch.memory_estimate import estimate_memory
    from megatron_dapo.models.hf_config import LORA_TARGETS, lora_parameters, parse_hf_config

    hf = os.path.join(ROOT, "examples", "qwen2.5-32b")
    arch = parse_hf_config(hf)
    flags = ["--hf-checkpoint", hf, "--bf16", "--actor-num-nodes", "16", "--actor-num-gpus-per-node", "8"]
    flags += ["--tensor-model-parallel-size", "8", "--use-distributed-optimizer", "--sequence-parallel"]
    flags += ["--max-tokens-per-gpu", "22528", "--recompute-granularity", "full"]
    full_cfg = parse_args(flags)
    lora_cfg = dataclasses.replace(full_cfg, model=dataclasses.replace(full_cfg.model, lora_rank=rank))
    n, n_lora = arch.num_parameters, lora_parameters(arch, rank, LORA_TARGETS)
    full, lora = estimate_memory(full_cfg, arch, 80.0), estimate_memory(lora_cfg, arch, 80.0)
    print(f"== Qwen2.5-32B, TP 8 x 16 nodes x 8 GPUs, LoRA rank {rank} on all seven projections (computed) ==")
    print(f"trainable parameters: full {n / 1e9:.2f}B, LoRA {n_lora / 1e6:.1f}M ({100 * n_lora / n:.2f}%)")
    print(
        f"sync bytes per step: full {n * 2 / 1e9:.1f} GB (bf16), LoRA merged {n * 2 / 1e9:.1f} GB (every weight, merged),"
    )
    print(f"  LoRA adapter {n_lora * 4 / 1e9:.2f} GB (float32 adapters; the base once per engine start)")
    print(
        f"optimizer state per GPU (Adam m, v + fp32 main, distributed over DP 16): full {full.optimizer / 1e9:.2f} GB, "
        f"LoRA {lora.optimizer / 1e9:.3f} GB; gradients per GPU: full {full.grads / 1e9:.2f} GB, LoRA {lora.grads / 1e9:.2f} GB"
    )
    print(f"checkpoint: full {n * 14 / 1e9:.0f} GB, LoRA {n_lora * 14 / 1e9:.2f} GB (14 bytes per trained parameter)")


def measured(rank: int, repeats: int, port: int) -> None:
    import torch

    from megatron_dapo.checkpoint.model_io import load_hf_weights
    from megatron_dapo.distributed import init_distributed, init_parallel
    from megatron_dapo.hybrid.weight_sync import WeightSync
    from megatron_dapo.models import ModelBuildOptions
    from megatron_dapo.rollout.hf_engine import HFEngine
    from megatron_dapo.training.lora import LoRAOptions
    from megatron_dapo.training.lora_export import adapter_tensors, peft_config
    from megatron_dapo.training.setup import OptimizerOptions, build_policy
    from tests.hybrid.bodies import hf_config_obj
    from tests.tiny import random_hf_model, tiny_qwen2_config

    torch.set_num_threads(1)
    init_distributed(rank=0, world_size=1, master_port=port)
    init_parallel(1, 1, seed=1234)
    cfg = tiny_qwen2_config(hidden_size=256, intermediate_size=704, num_hidden_layers=4, vocab_size=4096)
    sd = random_hf_model(cfg, seed=0).state_dict()
    model_bytes = sum(t.numel() * t.element_size() for t in sd.values())

    def policy(lora):
        p = build_policy(cfg, ModelBuildOptions(), OptimizerOptions(), lora=lora)
        load_hf_weights(p.model, p.arch, lambda n: sd[n], p.padded_vocab)
        return p

    full = policy(None)
    opts = LoRAOptions(rank=rank, alpha=32.0, seed=5)
    lora = policy(opts)
    engine = HFEngine(hf_config_obj(cfg))
    syncs = {
        "full": WeightSync(full.model, full.arch, merge_lora=True),
        "merged": WeightSync(lora.model, lora.arch, merge_lora=True),
    }
    config = peft_config(opts, "base").to_dict()
    base_sync = WeightSync(lora.model, lora.arch, merge_lora=False)
    base_sync.sync(engine)
    version = [0]
    sent = {}

    def adapter():
        tensors = adapter_tensors(lora.model)
        version[0] += 1
        engine.load_lora_adapter_from_tensors(f"policy-{version[0]}", tensors, config)
        if version[0] > 1:
            engine.unload_lora_adapter(f"policy-{version[0] - 1}")
        sent["adapter"] = sum(t.numel() * t.element_size() for t in tensors.values())

    runs = {"full": lambda: syncs["full"].sync(engine), "merged": lambda: syncs["merged"].sync(engine)}
    runs["adapter"] = adapter
    times = {k: [] for k in runs}
    for fn in runs.values():  # warm-up (buffers, plans)
        fn()
    for _ in range(repeats):  # interleaved: the machine's drift hits all three alike
        for k, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    trainable = {
        "full": sum(p.numel() for p in full.model.parameters() if p.requires_grad),
        "merged": sum(p.numel() for p in lora.model.parameters() if p.requires_grad),
    }
    print(f"== measured: tiny Qwen2 (hidden 256, 4 layers, vocab 4096, fp32), LoRA rank {rank}, {repeats} repeats ==")
    print(f"trainable parameters: full {trainable['full']:,}, LoRA {trainable['merged']:,}")
    for k in runs:
        b = sent.get(k, model_bytes)
        print(f"{k:8s} sync: median {statistics.median(times[k]) * 1e3:8.2f} ms, {b:,} bytes")
    print(
        f"merged sync time over full sync: {statistics.median(times['merged']) / statistics.median(times['full']):.2f}"
    )
    print(
        f"adapter sync time over full sync: {statistics.median(times['adapter']) / statistics.median(times['full']):.2f}"
    )


def main(argv=None) -> int:
    from megatron_dapo.distributed import free_port

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank", type=int, default=32, help="LoRA rank (default 32)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    from megatron_dapo.known_warnings import quiet_known_warnings

    quiet_known_warnings()
    computed_32b(args.rank)
    measured(args.rank, args.repeats, free_port())
    return 0


if __name__ == "__main__":
    sys.exit(main())
