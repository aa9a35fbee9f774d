"""GPU check of the hybrid-engine pieces on ONE GPU (run by benchmarks/gpu_check.sh).

Sections (each reports PASS/FAIL; the exit code is the number of failed sections):

  env        torch / CUDA / NCCL / megatron-core versions, TE and torch_memory_saver presence
  nccl       NCCL world of 1: all_gather_into_tensor, broadcast, all_reduce, all_gather_object
             on CUDA tensors (the calls the weight sync and the probe make)
  build      a Qwen2.5-32B-width layer stack (bf16, local spec unless --te) with DDP and the
             distributed optimizer, through megatron_dapo.training.setup.build_policy
  train      one optimizer step (creates Adam state)
  sync       all weight-sync buckets into a null engine (no SGLang here): time to produce
             every bucket, bytes/s, peak extra memory vs the "one bucket + largest tensor"
             bound, every tensor checked against gather_full_weights + megatron_to_hf; once
             more with every collective forced (NCCL all-gathers and broadcast, world of 1)
  probe      megatron's half of the weight-sync probe (forward over the stack) on CUDA, and
             the comparison half against an echoing stand-in engine
  offload    TrainerOffloader: params + grads + optimizer state to pinned host memory and
             back; memory_allocated before / offloaded / onloaded, GB/s, checksums equal,
             a second cycle (host buffers reused), a train step afterwards
  lora       LoRA (issue 41): a tiny Qwen2 with adapters on all seven projections, built as
             a LoRA policy is (with --te: the TE spec with its input norms unfused), fp32: its
             logits against transformers' model with the adapters merged in HF's layout

SGLang is NOT exercised (its wheels are too large to carry to this machine); neither are
TP>1 / PP>1 over NCCL (one GPU: NCCL refuses two ranks on one device); those code paths are
the same collectives the CPU/gloo tests run at TP2 / PP2 / TP2xPP2.

    python benchmarks/gpu_check.py [--layers 3] [--vocab 152064] [--bucket-mb 512]
    python benchmarks/gpu_check.py --small     # CPU/gloo smoke run of this script
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

RESULTS = []


def section(name):
    def deco(fn):
        def run(*a, **k):
            print(f"\n===== [{name}] =====", flush=True)
            t0 = time.perf_counter()
            try:
                out = fn(*a, **k)
                RESULTS.append((name, "PASS", time.perf_counter() - t0))
                print(f"----- [{name}] PASS in {time.perf_counter() - t0:.2f} s", flush=True)
                return out
            except Exception:
                traceback.print_exc()
                sys.stdout.flush()
                RESULTS.append((name, "FAIL", time.perf_counter() - t0))
                print(f"----- [{name}] FAIL in {time.perf_counter() - t0:.2f} s", flush=True)
                return None

        return run

    return deco


def gb(n) -> str:
    return f"{n / 1e9:.3f} GB"


def sync_dev(torch):
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def mem(torch) -> int:
    return torch.cuda.memory_allocated() if torch.cuda.is_available() else 0


@section("env")
def check_env(args):
    import torch

    print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda)
    print("cuda available:", torch.cuda.is_available())
    if torch.cuda.is_available():
        print("device:", torch.cuda.get_device_name(0), "| capability", torch.cuda.get_device_capability(0))
        free, total = torch.cuda.mem_get_info()
        print("device memory free/total:", gb(free), "/", gb(total))
        try:
            print("nccl version:", torch.cuda.nccl.version())
        except Exception as e:  # pragma: no cover
            print("nccl version: unknown", e)
    import megatron.core

    print("megatron-core", getattr(megatron.core, "__version__", "?"), "from", os.path.dirname(megatron.core.__file__))
    for mod in ("transformer_engine", "apex", "torch_memory_saver", "sglang", "numpy", "packaging", "transformers"):
        try:
            m = __import__(mod)
            print(f"{mod}: present {getattr(m, '__version__', '')}")
        except Exception as e:
            print(f"{mod}: absent ({type(e).__name__})")
    if args.require_cuda and not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available (pass --small for a CPU smoke run)")


@section("nccl")
def check_collectives(args):
    import torch
    import torch.distributed as dist

    from megatron_dapo.distributed import init_distributed
    from megatron_dapo.platform import default_device

    init_distributed(rank=0, world_size=1, master_port=args.port)
    print("backend:", dist.get_backend())
    dev = default_device()
    x = torch.arange(1024, dtype=torch.bfloat16, device=dev)
    out = torch.empty(1024 * 2, dtype=torch.uint8, device=dev)
    dist.all_gather_into_tensor(out, x.view(torch.uint8))
    assert torch.equal(out.view(torch.bfloat16), x)
    w = dist.all_gather_into_tensor(out, x.view(torch.uint8), async_op=True)
    w.wait()
    dist.broadcast(out, src=0)
    y = torch.ones(8, device=dev)
    dist.all_reduce(y, op=dist.ReduceOp.MAX)
    objs = [None]
    dist.all_gather_object(objs, {"a": 1})
    assert objs == [{"a": 1}]
    print("all_gather_into_tensor / async / broadcast / all_reduce / all_gather_object: ok on", dev)


def _nll(arch, global_tokens):
    from megatron_dapo.training.forward import token_logprobs

    def loss_fn(batch, logits):
        lp = token_logprobs(logits, batch["tokens"], arch.vocab_size)
        return -lp.sum() / global_tokens, {}

    return loss_fn


@section("build")
def build(args):
    import torch

    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.models import ModelBuildOptions
    from megatron_dapo.training.setup import OptimizerOptions, build_policy

    init_parallel(1, 1)
    if args.small:
        h, f, nh, nkv = 512, 1536, 8, 2
    else:
        h, f, nh, nkv = 5120, 27648, 40, 8  # Qwen2.5-32B
    cfg = dict(
        model_type="qwen2",
        vocab_size=args.vocab,
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
    bf16 = torch.cuda.is_available()  # bf16 on GPU; fp32 for the CPU smoke run
    dtype = torch.bfloat16 if bf16 else torch.float32
    m0 = mem(torch)
    t0 = time.perf_counter()
    policy = build_policy(
        cfg,
        ModelBuildOptions(params_dtype=dtype, bf16=bf16, use_te=args.te),
        OptimizerOptions(lr=1e-5, use_distributed_optimizer=True),
    )
    sync_dev(torch)
    n = sum(p.numel() for p in policy.model.parameters())
    pb = sum(p.numel() * p.element_size() for p in policy.model.parameters())
    print(
        f"{args.layers} layers, hidden {h}, ffn {f}, heads {nh}/{nkv}, vocab {args.vocab}: {n / 1e9:.3f} B params, {gb(pb)} ({dtype})"
    )
    print(f"built in {time.perf_counter() - t0:.1f} s; memory_allocated {gb(mem(torch) - m0)}")
    return policy


@section("train")
def train(args, policy):
    import torch

    from megatron_dapo.training.setup import train_step

    dev = next(policy.model.parameters()).device
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, policy.arch.vocab_size, (1, args.seq), generator=g).to(dev)
    mbs = [{"tokens": tokens}]
    t0 = time.perf_counter()
    out = train_step(policy, mbs, _nll(policy.arch, float(args.seq - 1)))
    sync_dev(torch)
    print(
        f"train step {time.perf_counter() - t0:.2f} s, grad norm {out['grad_norm']:.4g}, ok {out['update_successful']}"
    )
    print(
        "memory_allocated after step:",
        gb(mem(torch)),
        "| peak",
        gb(torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0),
    )
    assert out["update_successful"]
    return mbs


class NullEngine:
    """Stands in for SGLang: checks each tensor against the reference, counts bytes."""

    def __init__(self, ref):
        self.ref = ref
        self.bytes = 0
        self.names = set()
        self.bad = []

    def update_weights(self, bucket):
        import torch

        for n, t in bucket:
            if self.ref is not None:
                r = self.ref.get(n)
                if r is None or r.shape != t.shape or not torch.equal(r, t):
                    self.bad.append(n)
            self.names.add(n)
            self.bytes += t.numel() * t.element_size()

    def finish_weight_update(self):
        pass


@section("sync")
def sync(args, policy):
    import torch

    from megatron_dapo.checkpoint.mapping import hf_names, megatron_to_hf
    from megatron_dapo.checkpoint.model_io import gather_full_weights
    from megatron_dapo.hybrid.weight_sync import WeightSync

    arch = policy.arch
    bucket = args.bucket_mb * 2**20
    ws = WeightSync(policy.model, arch, bucket_bytes=bucket)
    ref = {n: t for g, full in gather_full_weights(policy.model, arch) for n, t in megatron_to_hf(arch, g, full)}
    e = NullEngine(ref)
    st = ws.sync(e)  # warm-up + correctness
    assert not e.bad, f"{len(e.bad)} tensors differ from the reference: {e.bad[:5]}"
    assert e.names == set(hf_names(arch)), "names differ from mapping.hf_names"
    # The same sync with every collective forced (NCCL all_gather_into_tensor incl. the
    # gate/up and row-parallel paths, and the PP broadcast, on CUDA tensors, world of one).
    ws.force_collectives = True
    e2 = NullEngine(ref)
    ws.sync(e2)
    ws.force_collectives = False
    assert not e2.bad and e2.names == e.names, f"forced-collective sync differs: {e2.bad[:5]}"
    print("forced-collective sync (all_gather_into_tensor / broadcast on", ws.device, "): equal to the reference")
    largest = max(t.numel() * t.element_size() for t in ref.values())
    del ref
    print(
        f"{st.buckets} buckets of <= {args.bucket_mb} MiB, {st.tensors} HF tensors, {gb(st.bytes)}; largest tensor {gb(largest)}; all equal to the reference"
    )
    times = []
    base = mem(torch)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    for _ in range(args.repeats):
        e = NullEngine(None)
        sync_dev(torch)
        t0 = time.perf_counter()
        for b in ws.iter_buckets():
            e.update_weights(b)
        sync_dev(torch)
        times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() - base) if torch.cuda.is_available() else 0
    best = min(times)
    print(
        f"time to produce all buckets: {['%.3f' % x for x in times]} s -> best {best:.3f} s, {st.bytes / best / 1e9:.2f} GB/s"
    )
    print(
        f"peak extra memory during sync: {gb(peak)} (bound: bucket {gb(min(bucket, max(b.nbytes for b in ws.plan)))} + largest tensor {gb(largest)})"
    )
    if torch.cuda.is_available():
        assert peak <= max(b.nbytes for b in ws.plan) + largest + 64 * 2**20, (
            "extra memory above one bucket + largest tensor"
        )


@section("probe")
def probe(args, policy):
    import torch

    from megatron_dapo.hybrid.probe import check_probe_stats, probe_stats
    from megatron_dapo.training.dapo_step import compute_logprobs
    from megatron_dapo.training.item import TrainItem

    g = torch.Generator().manual_seed(1234)
    seqs = torch.randint(0, policy.arch.vocab_size, (2, 64), generator=g).tolist()
    t0 = time.perf_counter()
    # the weight-sync probe's megatron half, as PolicyWorker.probe_logprobs runs it
    lp = compute_logprobs(policy, [TrainItem(tokens=s, prompt_len=1) for s in seqs], policy.arch.vocab_size, 2, None)
    sync_dev(torch)
    assert lp is not None and len(lp) == 2 and all(len(x) == 63 for x in lp)
    assert all(torch.isfinite(torch.tensor(x)).all() for x in lp)
    stats = probe_stats(lp, [lp])  # an "engine" that scores exactly what megatron computed
    check_probe_stats(stats, 1e-6)
    assert stats["max_abs"] == 0.0
    noisy = probe_stats(lp, [[[v + 0.01 for v in x] for x in lp]])
    print(
        f"megatron probe logprobs 2 x 63 in {time.perf_counter() - t0:.2f} s, mean "
        f"{float(torch.tensor(lp).mean()):.3f}; probe stats of a +0.01 engine {noisy}"
    )


def _checksums(torch, off):
    out = []
    for cat, s in off.storages():
        v = torch.empty(0, dtype=torch.uint8, device=s.device).set_(s)
        if v.numel() % 8 == 0:
            c = int(v.view(torch.int64).sum())
        else:
            c = int(v.to(torch.int64).sum())
        out.append((cat, s.nbytes(), c))
    return out


@section("offload")
def offload(args, policy, mbs):
    import torch

    from megatron_dapo.hybrid.offload import TrainerOffloader
    from megatron_dapo.training.setup import train_step

    off = TrainerOffloader(policy.model, policy.optimizer, preserve_grads=True)
    by_cat = {}
    for cat, s in off.storages():
        by_cat[cat] = by_cat.get(cat, 0) + s.nbytes()
    print("storages to move:", {k: gb(v) for k, v in by_cat.items()})
    before = _checksums(torch, off)
    sync_dev(torch)
    m_before = mem(torch)
    for cycle in (1, 2):
        freed = off.offload()
        t_off = dict(off.last)
        m_off = mem(torch)
        res_off = off.resident_bytes()
        reserved = torch.cuda.memory_reserved() if torch.cuda.is_available() else 0
        moved = off.onload()
        m_on = mem(torch)
        o = {**t_off, **off.last}
        print(
            f"cycle {cycle}: offload {gb(freed)} -> memory_allocated {gb(m_before)} -> {gb(m_off)} "
            f"(reserved {gb(reserved)}, tracked resident {res_off}) -> onload {gb(moved)} -> {gb(m_on)}"
        )
        print(f"  timings: {o}")
        assert res_off == 0, "tracked storages still hold memory while offloaded"
        if torch.cuda.is_available():
            assert m_before - m_off >= 0.95 * freed, "memory_allocated did not drop by the offloaded bytes"
            assert abs(m_on - m_before) <= 64 * 2**20
    after = _checksums(torch, off)
    assert before == after, "checksums changed across offload/onload"
    print("checksums of every storage equal after two offload/onload cycles")
    # rates from a third, timed cycle
    sync_dev(torch)
    t0 = time.perf_counter()
    n = off.offload()
    t1 = time.perf_counter()
    off.onload()
    t2 = time.perf_counter()
    print(
        f"offload {gb(n)} in {t1 - t0:.3f} s ({n / (t1 - t0) / 1e9:.1f} GB/s), onload in {t2 - t1:.3f} s ({n / (t2 - t1) / 1e9:.1f} GB/s)"
    )
    off.drop_host_buffers()  # do not hold two sets of pinned host buffers
    del off
    g = TrainerOffloader(policy.model, policy.optimizer, preserve_grads=False)
    t0 = time.perf_counter()
    n2 = g.offload()
    t1 = time.perf_counter()
    g.onload()
    t2 = time.perf_counter()
    print(
        f"preserve_grads=False (first use, host buffers allocated): offload {gb(n2)} in {t1 - t0:.3f} s, onload {t2 - t1:.3f} s"
    )
    out = train_step(policy, mbs, _nll(policy.arch, float(mbs[0]["tokens"].shape[1] - 1)))
    assert out["update_successful"]
    print(f"train step after onload: ok, grad norm {out['grad_norm']:.4g}")


@section("lora")
def lora(args):
    import torch
    from megatron.core import parallel_state as ps

    from megatron_dapo.checkpoint.model_io import load_hf_weights
    from megatron_dapo.models import ModelBuildOptions, build_gpt_model, padded_vocab_size
    from megatron_dapo.training.lora import LoRAOptions, apply_lora
    from tests.checkpoint.bodies import _logits
    from tests.tiny import random_hf_model, tiny_qwen2_config
    from tests.training.lora_bodies import R, merged_hf_state, set_b

    cfg = tiny_qwen2_config()
    hf = random_hf_model(cfg, seed=0)
    sd = hf.state_dict()
    model, arch, _ = build_gpt_model(cfg, ModelBuildOptions(use_te=args.te, unfuse_norms=True))
    load_hf_weights(model, arch, lambda n: sd[n], padded_vocab_size(arch.vocab_size, 128, 1))
    opts = LoRAOptions(rank=R, alpha=8.0, seed=5)
    apply_lora(model, arch, opts, tp_group=ps.get_tensor_model_parallel_group())
    set_b(model, arch, opts.targets)
    model.eval()
    dev = next(model.parameters()).device
    tokens = torch.randint(0, arch.vocab_size, (2, 12), generator=torch.Generator().manual_seed(7)).to(dev)
    got = [_logits(model, arch, tokens)]
    with torch.no_grad():
        hf = hf.to(dev)
        plain = hf(tokens).logits.float()
        hf.load_state_dict(merged_hf_state(hf.cpu(), arch, opts))
        ref = hf.to(dev)(tokens).logits.float()
    diff, effect = float((got[0] - ref).abs().max()), float((plain - ref).abs().max())
    spec = "TE spec, norms unfused" if args.te else "local spec"
    print(f"{spec}: |LoRA logits - merged HF logits| max {diff:.2e}; the adapters' effect {effect:.2e}")
    if not diff < effect / 100:
        raise AssertionError(f"LoRA logits differ from the merged model's by {diff:.2e} (effect {effect:.2e})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--vocab", type=int, default=152064, help="Qwen2.5's 152064: the embedding is larger than a bucket")
    p.add_argument("--bucket-mb", type=int, default=512)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--port", type=int, default=29561)
    p.add_argument("--te", action="store_true", help="use transformer_engine's spec (default: local spec)")
    p.add_argument("--small", action="store_true", help="CPU/gloo smoke run with small widths")
    args = p.parse_args(argv)
    args.te = True if args.te else False
    args.require_cuda = not args.small
    if args.small:
        args.vocab = min(args.vocab, 4096)
    import warnings

    warnings.filterwarnings("ignore")
    check_env(args)
    check_collectives(args)
    policy = build(args) if not any(r[1] == "FAIL" for r in RESULTS) else None
    if policy is not None:
        mbs = train(args, policy)
        sync(args, policy)
        probe(args, policy)
        if mbs is not None:
            offload(args, policy, mbs)
    lora(args)
    print("\n===== summary =====")
    for name, status, secs in RESULTS:
        print(f"{status}  {name:8s} {secs:8.2f} s")
    print("SGLang is not exercised on this machine (wheels too large to carry); the engine is a null engine.")
    print("TP>1 / PP>1 over NCCL are not exercised (one GPU); the CPU gloo tests cover those layouts.")
    try:
        import torch.distributed as dist

        from megatron_dapo.distributed import destroy_parallel

        destroy_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception as e:  # teardown must not hide the results
        print("teardown:", e)
    failed = sum(1 for r in RESULTS if r[1] == "FAIL")
    expected = 8
    missing = expected - len(RESULTS)
    print(f"{len(RESULTS) - failed}/{expected} sections passed" + (f", {missing} not run" if missing else ""))
    return failed + missing


if __name__ == "__main__":
    sys.exit(main())
