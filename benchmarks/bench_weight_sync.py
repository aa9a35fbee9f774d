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

Prints bytes/s of each and ``sync/collectives ratio: X.XX`` (a's rate over b's). Weights are
left uninitialised (their values do not change the cost).

Then the scale-out path, through the driver's own Ray ``Cluster`` (a fresh local Ray): 4
trainer ranks (DP 4, fp32, a 50M-parameter Qwen2-shaped model, buckets of
``--ray-bucket-mb``), 4 HF engine actors of one "GPU" each, every rank feeding the engine on
its own bundle by shared-memory handles (docs/hybrid.md). Same run, interleaved repeats,
medians:

  (d) sync of all 4 engines;  (e) sync of engine 0 alone (as a restarted engine's re-sync: the
      other DP replicas sit it out): same bytes per engine;
  (f) a plain copy of one engine's bytes in one process (bucket-sized chunks);
  (g) bytes Ray's object store created during each sync (Ray's own counter, all nodes).

The CPU time of every trainer and engine process is read from /proc around each sync: with
fewer cores than processes the wall-clock weak scaling measures the cores, while the CPU
seconds per engine (4 engines over 1) say whether the protocol adds work per engine.

Prints, last: ``sync CPU-seconds per engine, 4 engines over 1: X.XX``,
``sync weak scaling 1->4 engines: X.XX`` (d over e), ``object store bytes per
sync: N`` (the largest over the syncs), ``sync/memcpy ratio: X.XX`` (e over f) and
``sync/collectives ratio: X.XX`` (from the first part).

    .venv/bin/python benchmarks/bench_weight_sync.py            # the documented run
    .venv/bin/python benchmarks/bench_weight_sync.py --small    # a quick smoke run
    .venv/bin/python benchmarks/bench_weight_sync.py --ray-only # the Ray part alone
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
        model_type="qwen2",
        vocab_size=v,
        hidden_size=h,
        intermediate_size=f,
        num_hidden_layers=args.layers,
        num_attention_heads=nh,
        num_key_value_heads=nkv,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
        hidden_act="silu",
        use_sliding_window=False,
        bos_token_id=1,
        eos_token_id=2,
        dtype="bfloat16",
    )


def build_model(hf_cfg: dict, dtype):
    """The local megatron stage/shard, parameters left uninitialised (fast to build)."""
    from megatron_dapo.models import ModelBuildOptions, build_gpt_model, provider

    orig = provider.transformer_config_from_arch

    def no_init(arch, opts):
        cfg = orig(arch, opts)
        cfg.perform_initialization = False
        return cfg

    provider.transformer_config_from_arch = no_init
    try:
        return build_gpt_model(
            hf_cfg, ModelBuildOptions(params_dtype=dtype, bf16=dtype is not None and str(dtype) == "torch.bfloat16")
        )
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
        print(
            f"built in {time.perf_counter() - t0:.1f} s; rank 0 holds {local_bytes / 1e9:.3f} GB of megatron params",
            flush=True,
        )
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
        print(
            f"warm-up sync: {warm:.2f} s, {st.buckets} buckets, {st.tensors} HF tensors, {total / 1e9:.3f} GB",
            flush=True,
        )
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
        print(
            f"runs (s): full {['%.2f' % x for x in ta]}, collectives {['%.2f' % x for x in tb_]}, copy {['%.3f' % x for x in tc]}"
        )
        print(
            f"bytes per sync: {total} ({total / 1e9:.3f} GB), bucket {args.bucket_mb} MiB, TP{args.tp} x PP{args.pp}, {args.dtype}"
        )
        print(f"(a) full sync           : {a:7.3f} s  {total / a / 1e9:7.3f} GB/s")
        print(f"(b) collectives only    : {b:7.3f} s  {total / b / 1e9:7.3f} GB/s")
        print(f"(c) in-memory copy      : {c:7.3f} s  {total / c / 1e9:7.3f} GB/s")
        print(f"sync/collectives ratio: {(total / a) / (total / b):.2f}", flush=True)
        with open(args.result_file, "w") as f:
            f.write(f"{(total / a) / (total / b):.2f}")
    dist.barrier()
    dist.destroy_process_group()


def ray_config(args) -> dict:
    h, f, v = (256, 512, 4096) if args.small else (768, 2048, 16384)
    return dict(
        model_type="qwen2",
        vocab_size=v,
        hidden_size=h,
        intermediate_size=f,
        num_hidden_layers=4,
        num_attention_heads=12 if not args.small else 4,
        num_key_value_heads=4 if not args.small else 2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
        hidden_act="silu",
        use_sliding_window=False,
        bos_token_id=1,
        eos_token_id=2,
        dtype="float32",
    )


def ray_part(args, work: str) -> dict:
    """(d)-(g) through the driver's Cluster on a fresh local Ray (see the module docstring)."""
    import ray
    import torch
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address
    from transformers import AutoConfig

    from megatron_dapo.config import parse_args
    from megatron_dapo.driver.cluster import Cluster
    from megatron_dapo.launch.placement import start_ray

    hf_dir = os.path.join(work, "hf")
    AutoConfig.for_model(**ray_config(args)).save_pretrained(hf_dir)
    os.environ.pop("RAY_ADDRESS", None)
    start_ray(address="local", num_cpus=args.engines)
    cluster = None
    try:
        cfg = parse_args(
            [
                "--hf-checkpoint",
                hf_dir,
                "--actor-num-gpus-per-node",
                str(args.engines),
                "--rollout-num-gpus-per-engine",
                "1",
                "--rollout-engine",
                "hf",
                "--micro-batch-size",
                "1",
                "--global-batch-size",
                str(args.engines),
                "--rollout-batch-size",
                "1",
                "--n-samples-per-prompt",
                str(args.engines),
                "--update-weight-buffer-size",
                str(args.ray_bucket_mb * 2**20),
            ]
        )
        t0 = time.perf_counter()
        cluster = Cluster(cfg, hf_dir, None)
        handles = [cluster.make_engine(i) for i in range(cluster.num_engines)]
        print(
            f"Ray cluster: {cluster.world} ranks, {len(handles)} engines up in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        state = get_state_from_address(ray.get_runtime_context().gcs_address)

        def created() -> int:
            return int(get_memory_info_reply(state).store_stats.cumulative_created_bytes)

        pids = [i["pid"] for i in cluster.infos] + ray.get([h.pid.remote() for h in handles])
        tick = os.sysconf("SC_CLK_TCK")

        def cpu_seconds() -> float:
            """User + system CPU time of every trainer rank and engine process so far."""
            total = 0
            for pid in pids:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
            return total / tick

        cpu = {len(handles): [], 1: []}

        def timed(targets):
            before, c0 = created(), cpu_seconds()
            t = time.perf_counter()
            out = cluster.sync(targets)
            dt = time.perf_counter() - t
            cpu[len(targets)].append(cpu_seconds() - c0)
            return dt, created() - before, out

        _, _, out = timed(handles)  # warm-up: plans, buffers, engine mappings
        nbytes = out["bytes"]
        timed(handles[:1])
        all_t, one_t, store = [], [], []
        for _ in range(args.repeats):  # interleaved
            t, b, _ = timed(handles)
            all_t.append(t)
            store.append(b)
            t, b, _ = timed(handles[:1])
            one_t.append(t)
            store.append(b)
        chunk = args.ray_bucket_mb * 2**20
        src = torch.empty(chunk, dtype=torch.uint8).fill_(1)
        dst = torch.empty_like(src)
        copy_t = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            left = nbytes
            while left > 0:
                n = min(chunk, left)
                dst[:n].copy_(src[:n])
                left -= n
            copy_t.append(time.perf_counter() - t)
        d, e, f = statistics.median(all_t), statistics.median(one_t), statistics.median(copy_t)
        print(
            f"runs (s): {len(handles)} engines {['%.3f' % x for x in all_t]}, 1 engine {['%.3f' % x for x in one_t]}, "
            f"copy {['%.3f' % x for x in copy_t]}; object store bytes per sync {store}"
        )
        print(
            f"bytes per engine and sync: {nbytes} ({nbytes / 1e6:.1f} MB), {out['buckets']} buckets of "
            f"{args.ray_bucket_mb} MiB, fp32, {cluster.world} trainer ranks (DP {cluster.world})"
        )
        print(f"(d) sync into {len(handles)} engines : {d:7.3f} s")
        print(f"(e) sync into 1 engine   : {e:7.3f} s  {nbytes / e / 1e9:7.3f} GB/s")
        print(f"(f) in-memory copy       : {f:7.3f} s  {nbytes / f / 1e9:7.3f} GB/s", flush=True)
        # CPU time is what 2 cores bound: 4 engines are 4x the copying. Its ratio per engine
        # says whether the protocol itself adds work per engine (1.00 = none).
        cd, ce = statistics.median(cpu[len(handles)]), statistics.median(cpu[1])
        print(
            f"CPU seconds per sync (all trainer and engine processes): {len(handles)} engines {cd:.2f}, "
            f"1 engine {ce:.2f}; cores {os.cpu_count()}",
            flush=True,
        )
        return {"weak": d / e, "store": max(store), "memcpy": e / f, "cpu_weak": cd / len(handles) / ce}
    finally:
        if cluster is not None:
            cluster.shutdown()
        ray.shutdown()


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
    p.add_argument("--engines", type=int, default=4, help="engines (and trainer ranks) of the Ray part")
    p.add_argument("--ray-bucket-mb", type=int, default=32, help="bucket size of the Ray part")
    p.add_argument("--ray-only", action="store_true", help="only the Ray part (d)-(g); no sync/collectives line")
    args = p.parse_args(argv)
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as work:
        args.result_file = os.path.join(work, "collectives_ratio")
        collectives = None
        if not args.ray_only:
            world = args.tp * args.pp
            mp.spawn(_worker, args=(world, free_port(), args), nprocs=world, join=True)
            with open(args.result_file) as f:
                collectives = f.read()
        r = ray_part(args, work)
    print(f"sync CPU-seconds per engine, {args.engines} engines over 1: {r['cpu_weak']:.2f}")
    print(f"sync weak scaling 1->{args.engines} engines: {r['weak']:.2f}")
    print(f"object store bytes per sync: {r['store']}")
    print(f"sync/memcpy ratio: {r['memcpy']:.2f}")
    if collectives is not None:
        print(f"sync/collectives ratio: {collectives}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
