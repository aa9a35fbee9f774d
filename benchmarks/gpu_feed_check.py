"""Two trainer ranks feed ONE engine of TP 2: the product's per-engine feeding path, without Ray.

What runs is what ``PolicyActor.sync_to`` runs on every rank: each rank builds the policy
(megatron-core, TP 1 x DP 2: two full replicas), gets the engine's ``EngineProtocol``
(lag and codec: SGLang's serializer and CUDA reductions in EVERY feeder process), and
``WeightSync.sync(EngineFeeding.sink(...))`` hands each bucket over as a payload of handles
to its own bucket buffer (CUDA IPC on a GPU); rank 0 gathers both payloads and loads them
into the engine (in a process of its own, as an EngineActor is: megatron_dapo/rollout/engine_host.py),
whose TP rank j reads trainer rank j's payload. Two syncs: the initial
weights, then weights moved by a deterministic step (a stale engine tensor would show).
After each sync the engine's weights are checked against the trainer's (the weight-sync
check's exact per-tensor comparison where the engine offers it, else the HF tensors).

    python benchmarks/gpu_feed_check.py                  # GPU: HFEngine on cuda:0
    python benchmarks/gpu_feed_check.py --engine sglang  # SGLang TP 2 (needs sglang and 2 GPUs)
    python benchmarks/gpu_feed_check.py --small          # CPU smoke run (fp32, gloo), used by a test

Backends: NCCL with one GPU per rank where there are 2 GPUs; on one GPU both ranks share it
and the default group is gloo (gloo reduces CUDA tensors; a TP-1 x DP-2 sync runs no
collective over it but the final flag, and the feeders' own group is gloo anyway).
One line per sync (``[feed-tp2] sync N ...``); the last line is ``[feed-tp2] PASS`` or ``FAIL``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

TAG = "[feed-tp2]"


def _reference_hf(policy):
    """The trainer's weights in HF naming (TP 1: every rank holds them whole)."""
    from megatron_dapo.checkpoint.mapping import megatron_to_hf
    from megatron_dapo.checkpoint.model_io import gather_full_weights

    out = {}
    for g, full in gather_full_weights(policy.model, policy.arch):
        for n, t in megatron_to_hf(policy.arch, g, full):
            out[n] = t.detach().clone()
    return out


def _engine_mismatches(engine, ref: dict) -> list:
    """Names of the tensors where the engine does not hold exactly what the trainer has."""
    import torch

    get = getattr(engine, "get_weight", None)
    if get is None:
        raise RuntimeError(f"{type(engine).__name__} offers no per-tensor read-back for this check")
    bad = []
    for n, t in ref.items():
        try:
            w = get(n)
        except KeyError:
            bad.append(f"{n} (missing)")
            continue
        if w.dtype != t.dtype or tuple(w.shape) != tuple(t.shape) or not torch.equal(w.to(t.device), t):
            bad.append(n)
    return bad


def _engine_process(kind: str, hf_dir: str, dtype, device):
    """The engine under test in its own process (rollout/engine_host.py): HFEngine with random
    weights on ``device`` (the syncs fill them), or SGLang TP 2 (GPU, sglang installed)."""
    from megatron_dapo.rollout.engine_host import HF, SGLANG, EngineHost

    if kind == "hf":
        from transformers import AutoConfig

        return EngineHost(HF, AutoConfig.from_pretrained(hf_dir), dtype=dtype, device=str(device), seed=1)
    return EngineHost(
        SGLANG, hf_dir, tp_size=2, mem_fraction_static=0.3, enable_memory_saver=True, dtype="bfloat16", random_seed=1
    )


def _rank(rank: int, world: int, port: int, args, hf_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from megatron_dapo.distributed import init_distributed, init_parallel
    from megatron_dapo.hybrid.weight_sync import EngineCalls, EngineFeeding, EngineProtocol, WeightSync
    from megatron_dapo.models import ModelBuildOptions
    from megatron_dapo.training.setup import OptimizerOptions, build_policy

    on_gpu = torch.cuda.is_available() and not args.small
    ngpu = torch.cuda.device_count() if on_gpu else 0
    backend = "nccl" if ngpu >= world else "gloo"
    if on_gpu:
        os.environ["LOCAL_RANK"] = str(rank if ngpu >= world else 0)
    init_distributed(rank=rank, world_size=world, master_addr="127.0.0.1", master_port=port, backend=backend)
    init_parallel(1, 1, seed=1234)
    dtype = torch.bfloat16 if on_gpu else torch.float32
    from megatron_dapo.models.provider import te_importable  # the lent H200 has no TE: the local spec there

    policy = build_policy(
        hf_dir,
        ModelBuildOptions(params_dtype=dtype, bf16=on_gpu, use_te=None if te_importable() else False),
        OptimizerOptions(lr=1e-4),
    )
    with torch.no_grad():  # identical replicas: rank 0's initial weights everywhere
        for p in policy.model.parameters():
            dist.broadcast(p.data, src=0)
    device = next(policy.model.parameters()).device
    feeding = EngineFeeding(2)
    protocol = EngineProtocol.for_engine(args.engine)  # on every feeder, as PolicyActor.sync_to does
    engine = calls = None
    if rank == feeding.leader:
        # the engine in a process of its own, as in production (an EngineActor): a process never
        # opens a CUDA IPC handle it exported itself (the driver refuses it: "invalid device context")
        engine = _engine_process(args.engine, hf_dir, dtype, device)
        calls = EngineCalls(
            send=engine.update_weights_from_payloads, resolve=lambda _: None, finish=engine.finish_weight_update
        )
    ws = WeightSync(policy.model, policy.arch, feeder_ranks=feeding.feeder_ranks, bucket_bytes=args.bucket_kb << 10)
    failed = False
    try:
        for i in range(2):
            if i:
                g = torch.Generator().manual_seed(7)
                with torch.no_grad():  # the same "optimizer step" on both replicas
                    for p in policy.model.parameters():
                        p.add_((torch.randn(p.shape, generator=g) * 1e-2).to(p.device, p.dtype))
            t0 = time.perf_counter()
            st = ws.sync(feeding.sink(calls, protocol))
            if on_gpu:
                torch.cuda.synchronize()
            secs = time.perf_counter() - t0
            if engine is not None:
                bad = _engine_mismatches(engine, _reference_hf(policy)) if args.engine == "hf" else []
                failed = failed or bool(bad)
                print(
                    f"{TAG} sync {i} engine={args.engine} engine_pid={engine.pid} feeder_pid={os.getpid()} "
                    f"backend={backend} device={device} "
                    f"buckets={st.buckets} MiB={st.bytes / 2**20:.1f} s={secs:.3f} protocol={protocol.describe()} "
                    f"mismatched={bad[:5] if bad else 0}",
                    flush=True,
                )
            dist.barrier()
    finally:
        if engine is not None:
            engine.close()
    if failed:
        raise RuntimeError("the engine does not hold the trainer's weights after a sync")


def _spawned(rank, world, port, args, hf_dir):
    try:
        _rank(rank, world, port, args, hf_dir)
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", action="store_true", help="CPU smoke run (fp32, gloo)")
    p.add_argument("--engine", choices=("hf", "sglang"), default="hf")
    p.add_argument(
        "--bucket-kb",
        type=int,
        default=1024,
        help="bucket size in KiB (small enough for many buckets: the buffer ring wraps around)",
    )
    p.add_argument("--tokenizer", default=None, help="a tokenizer directory (SGLang needs one)")
    args = p.parse_args(argv)
    import warnings

    import torch
    import torch.multiprocessing as mp

    from benchmarks.gpu_dapo_step import tiny_hf_dir
    from megatron_dapo.distributed import free_port

    warnings.filterwarnings("ignore")
    if args.engine == "sglang" and (torch.cuda.device_count() < 2 or args.small):
        print(f"{TAG} SKIP sglang TP 2 needs 2 GPUs (found {torch.cuda.device_count()})")
        return 0
    small = args.small or not torch.cuda.is_available()
    with tempfile.TemporaryDirectory(prefix="feed_tp2_hf_") as tmp:  # the tiny model, removed afterwards
        hf = tiny_hf_dir(tmp, small=small, tokenizer=args.tokenizer)
        try:
            mp.start_processes(_spawned, args=(2, free_port(), args, hf), nprocs=2, join=True, start_method="spawn")
        except Exception as e:  # a rank's traceback is in the exception text
            print(e)
            print(f"{TAG} FAIL")
            return 1
    print(f"{TAG} PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
