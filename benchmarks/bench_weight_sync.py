"""Weight-sync benchmark: megatron TP2xPP2 (gloo, CPU) -> HFEngine, against the raw collectives.

A synthetic model with Qwen2.5-32B's layer widths (hidden 5120, FFN 27648, 40 heads, 8 KV
heads, QKV bias) but 2 layers and a 32k vocabulary, bf16 parameters, is built on 4 gloo
ranks (spawned here) at TP2 x PP2; rank 0 holds an HFEngine of the same shape. Measured in
the same run, after one warm-up sync:

  (a) full sync: TP all-gathers, conversion (QKV / gate-up splits, unshard of row-parallel
      weights, vocab padding dropped), PP broadcast, bucketing, load into the HFEngine;
  (b) the same bucketed TP all-gathers and PP broadcasts on the same bytes, no conversion,
      no engine (``WeightSync.iter_buckets(convert=False)``);
  (c) a plain in-memory copy of the same number of bytes (bucket-sized chunks) on rank 0.

Prints bytes/s of each and, as the last line, ``sync/collectives ratio: X.XX`` (a's rate
over b's). Weights are left uninitialised (their values do not change the cost).

    .venv/bin/python benchmarks/bench_weight_sync.py            # the documented run
    .venv/bin/python benchmarks/bench_weight_sync.py --small    # a quick smoke run
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

from megatron_dapo.distributed import free_port  # noqa: E402


def model_config(args) -> dict:
    if args.small:
        h, f, nh, nkv, v = 512, 2048, 8, 2, 4096
    else:
        h, f, nh, nkv, v = 5120, 27648, 40, 8, args.vocab
    return dict(
        model_type="qwen2", vocab_size=v, hidden_size=h, intermediate_size=f,
        num_hidden_layers=args.layers, num_attention_heads=nh, num_key_value_heads=nkv,
        max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=False, hidden_act="silu", use_sliding_window=False,
        bos_token_id=1, eos_token_id=2, dtype="bfloat16",
    )


def build_model(hf_cfg: dict, dtype):
    """The local megatron stage/shard, parameters left uninitialised (fast to build)."""
    from megatron_dapo.models import ModelBuildOptions, build_gpt_model
    from megatron_dapo.models import provider

    orig = provider.transformer_config_from_arch

    def no_init(arch, opts):
        cfg = orig(arch, opts)
        cfg.perform_initialization = False
        return cfg

    provider.transformer_config_from_arch = no_init
    try:
        return build_gpt_model(hf_cfg, ModelBuildOptions(params_dtype=dtype, bf16=dtype is not None and str(dtype) == "torch.bfloat16"))
    finally:
        provider.transformer_config_from_arch = orig


def _worker(rank: int, world: int, port: int, args) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    from megatron_dapo.distributed import init_distributed, init_parallel
    from megatron_dapo.hybrid.weight_sync import WeightSync

    init_distributed(rank=rank, world_size=world, master_port=port, timeout_s=1800)
    init_parallel(args.tp, args.pp)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    hf_cfg = model_config(args)
    hf_cfg["dtype"] = "bfloat16" if dtype == torch.bfloat16 else "float32"
    t0 = time.perf_counter()
    model, arch, _ = build_model(hf_cfg, dtype)
    local_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    engine = None
    if rank == 0:
        from transformers import AutoConfig
        from transformers.initialization import no_init_weights

        from megatron_dapo.rollout.hf_engine import HFEngine

        with no_init_weights():
            engine = HFEngine(AutoConfig.for_model(**hf_cfg), dtype=dtype)
    dist.barrier()
    if rank == 0:
        print(f"built in {time.perf_counter() - t0:.1f} s; rank 0 holds {local_bytes / 1e9:.3f} GB of megatron params", flush=True)
    ws = WeightSync(model, arch, bucket_bytes=args.bucket_mb * 2**20)

    def timed(fn):
        dist.barrier()
        t = time.perf_counter()
        out = fn()
        dist.barrier()
        return time.perf_counter() - t, out

    def full():
        return ws.sync(engine)

    def collectives():
        for _ in ws.iter_buckets(convert=False):
            pass

    warm, st = timed(full)  # builds the plan, touches every page
    total = st.bytes if rank == 0 else 0
    tb = torch.tensor([total], dtype=torch.int64)
    dist.broadcast(tb, src=0)
    total = int(tb.item())
    if rank == 0:
        print(f"warm-up sync: {warm:.2f} s, {st.buckets} buckets, {st.tensors} HF tensors, {total / 1e9:.3f} GB", flush=True)
    ta, tb_ = [], []
    for _ in range(args.repeats):  # interleaved so that machine load hits both alike
        ta.append(timed(full)[0])
        tb_.append(timed(collectives)[0])
    tc = []
    if rank == 0:
        chunk = min(args.bucket_mb * 2**20, total)
        src = torch.empty(chunk, dtype=torch.uint8).fill_(1)
        dst = torch.empty_like(src)
        for _ in range(args.repeats):
            t = time.perf_counter()
            left = total
            while left > 0:
                n = min(chunk, left)
                dst[:n].copy_(src[:n])
                left -= n
            tc.append(time.perf_counter() - t)
        a, b, c = statistics.median(ta), statistics.median(tb_), statistics.median(tc)
        print(f"runs (s): full {['%.2f' % x for x in ta]}, collectives {['%.2f' % x for x in tb_]}, copy {['%.3f' % x for x in tc]}")
        print(f"bytes per sync: {total} ({total / 1e9:.3f} GB), bucket {args.bucket_mb} MiB, TP{args.tp} x PP{args.pp}, {args.dtype}")
        print(f"(a) full sync           : {a:7.3f} s  {total / a / 1e9:7.3f} GB/s")
        print(f"(b) collectives only    : {b:7.3f} s  {total / b / 1e9:7.3f} GB/s")
        print(f"(c) in-memory copy      : {c:7.3f} s  {total / c / 1e9:7.3f} GB/s")
        print(f"sync/collectives ratio: {(total / a) / (total / b):.2f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--bucket-mb", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--small", action="store_true", help="hidden 512 / FFN 2048 / vocab 4096: a smoke run")
    args = p.parse_args(argv)
    import torch.multiprocessing as mp

    world = args.tp * args.pp
    mp.spawn(_worker, args=(world, free_port(), args), nprocs=world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
