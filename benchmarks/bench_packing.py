"""Packing benchmark: padded vs packed (THD) micro-batches on a DAPO-like response-length mix.

Length model (an assumption, not a measurement): DAPO's 32B run caps responses at 20,480
tokens (16,384 expected + 4,096 soft-punishment buffer, paper section 4.1) and its training
curves show mean response lengths of a few thousand tokens, with a tail that reaches the
cap. We draw response lengths from a log-normal with median ``--median`` (3,000) and sigma
``--sigma`` (0.9): mean ~4,500 tokens, ~1.7% clipped to the cap (truncated responses);
prompts uniform in 100-400 tokens (DAPO-Math-17K problems in the prompt template).

Measured in the same run:

1. Token accounting of the 32B layout (``examples/run_qwen32b.sh``): mini-batches of 512
   responses over DP 16 (token-balanced shards), micro-batches up to 22,528 tokens.
   Padded: the right padding to the longest of earlier versions (at most --micro-batch-size
   32 rows; computed here, :func:`padded_microbatches`: the trainer no longer pads).
   Packed: ``packing.pack_microbatches``, each
   sequence padded to TP 8 (sequence parallel). Reports tokens computed / useful tokens and
   micro-batch counts, and the DP token imbalance (max / mean per rank) of the
   Karmarkar-Karp shards vs a count split.
2. Training tokens/s of the trainer's two groupings (both THD since #26.2: consecutive
   samples, at most --micro-batch-size 32, the default; token-budget packing, --use-packing)
   on a tiny Qwen2-shaped model (one process, CPU, fp32):
   the same lengths scaled down by ``--scale`` (64), one DAPO loss forward+backward over all
   micro-batches of a 64-response mini-batch, median of ``--repeats``; tokens/s counts useful
   tokens.
3. Peak memory of the logprob + entropy stage (forward and backward) over one micro-batch of
   bf16 logits ``[8192 tokens x 19,008]`` (Qwen2.5's vocabulary over TP 8): megatron's
   vocab-parallel cross entropy + entropy (the previous path) vs the chunked path
   (``training.logprobs``), each in its own process, as the rise of the peak RSS above the
   logits already allocated.

Last lines: ``padded/useful tokens: X.XX`` and ``packed/useful tokens: X.XX``.

    .venv/bin/python benchmarks/bench_packing.py            # the documented run
    .venv/bin/python benchmarks/bench_packing.py --small    # a quick smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
import warnings
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # torch is imported inside the functions that time it
    import torch

warnings.filterwarnings("ignore")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from megatron_dapo.training.item import TrainItem  # noqa: E402

CAP = 20480
BUDGET = 22528


def draw_samples(n: int, median: float, sigma: float, seed: int, scale: int = 1) -> list:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        resp = min(CAP, max(1, int(rng.lognormvariate(0.0, sigma) * median)))
        prompt = rng.randint(100, 400)
        p, r = max(2, prompt // scale), max(1, resp // scale)
        out.append(
            TrainItem(tokens=[5] * (p + r), prompt_len=p, advantage=rng.choice([-1.0, 1.0]), old_logprobs=[-1.0] * r)
        )
    return out


def accounting(args) -> dict:
    from megatron_dapo.driver.batch import dp_shards
    from megatron_dapo.training import packing as pk

    dp, gbs = 16, 512
    useful = padded = packed = 0
    n_pad = n_pack = 0
    imb_kk, imb_count = [], []
    mult = pk.pad_multiple(tp=8, cp=1, sequence_parallel=True)
    for k in range(args.minibatches):
        mb = draw_samples(gbs, args.median, args.sigma, seed=1000 + k)
        shards = dp_shards(mb, dp)
        imb_kk.append(pk.imbalance([sum(x.n_tokens for x in s) for s in shards]))
        imb_count.append(pk.imbalance([sum(x.n_tokens for x in mb[r::dp]) for r in range(dp)]))
        for s in shards:
            lens = [x.n_tokens for x in s]
            useful += sum(lens)
            pads = padded_microbatches(lens, 32, BUDGET)
            padded += sum(len(b) * max(lens[i] for i in b) for b in pads)
            n_pad += len(pads)
            parts = pk.pack_microbatches(lens, BUDGET, mult)
            packed += sum(pk.padded_len(lens[i], mult) for p in parts for i in p)
            n_pack += len(parts)
    return {
        "useful": useful,
        "padded": padded,
        "packed": packed,
        "mb_padded": n_pad,
        "mb_packed": n_pack,
        "imb_kk": max(imb_kk),
        "imb_count": max(imb_count),
    }


def padded_microbatches(lengths: list, rows: int, max_tokens: int) -> list:
    """The right-padded micro-batches of earlier versions (the accounting baseline): consecutive
    samples, at most ``rows`` each and at most ``max_tokens`` padded tokens (rows x longest)."""
    out, cur, longest = [], [], 0
    for i, n in enumerate(lengths):
        new_longest = max(longest, n)
        if cur and (len(cur) >= rows or new_longest * (len(cur) + 1) > max_tokens):
            out.append(cur)
            cur, new_longest = [], n
        cur.append(i)
        longest = new_longest
    if cur:
        out.append(cur)
    return out


def _tiny_model():
    import torch

    from megatron_dapo.distributed import free_port, init_distributed, init_parallel
    from megatron_dapo.models import ModelBuildOptions, build_gpt_model

    init_distributed(rank=0, world_size=1, master_port=free_port())
    init_parallel(1, 1, 1, seed=1)
    hf = {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "vocab_size": 4096,
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    model, arch, cfg = build_gpt_model(hf, ModelBuildOptions())
    cfg.calculate_per_token_loss = True
    torch.manual_seed(0)
    return model, arch


def throughput(args) -> dict:
    import torch

    from megatron_dapo.algo.config import AlgorithmConfig
    from megatron_dapo.training.dapo_step import dapo_loss_fn, make_microbatches
    from megatron_dapo.training.forward import forward_backward

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model, arch = _tiny_model()
    samples = draw_samples(64, args.median, args.sigma, seed=7, scale=args.scale)
    budget = BUDGET // args.scale
    useful = sum(x.n_tokens for x in samples)
    g_tok = float(sum(x.response_len for x in samples))
    loss_fn = dapo_loss_fn(AlgorithmConfig(), arch.vocab_size, g_tok, float(len(samples)))
    # both THD (the one batching path): consecutive samples, at most --micro-batch-size 32 (the
    # default grouping) vs token-budget packing (--use-packing)
    layouts = {
        "consecutive": lambda: make_microbatches(model, samples, 32, budget)[0],
        "packed": lambda: make_microbatches(model, samples, 32, budget, packing=True)[0],
    }
    times = {k: [] for k in layouts}
    for _ in range(args.repeats):
        for name, build in layouts.items():  # interleaved, so drift hits both alike
            t0 = time.perf_counter()
            mbs = build()
            model.zero_grad(set_to_none=True)
            forward_backward(model, mbs, loss_fn, forward_only=False)
            times[name].append(time.perf_counter() - t0)
    return {k: useful / statistics.median(v) for k, v in times.items()} | {"useful_small": useful}


def vocab_parallel_entropy(  # the trainer's entropy before chunked_logprobs_entropy (the baseline)
    logits: torch.Tensor, true_vocab: Optional[int] = None, chunk_size: int = 1024, temperature: float = 1.0
) -> torch.Tensor:
    """Entropy of the softmax over vocab-parallel logits, H = logsumexp(z) - sum_v p_v z_v,
    with z = logits / ``temperature`` (the sampling distribution).

    ``logits`` [..., V/tp]: this TP rank's shard. The max, the partition function and the
    expectation of z are all-reduced over the TP group, so the full vocabulary is never
    gathered; rows are processed in chunks of ``chunk_size`` so no second full-size float
    tensor is materialised. Differentiable.
    """
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    from megatron_dapo.training.forward import mask_vocab_padding, tempered

    if true_vocab is not None:
        logits = mask_vocab_padding(logits, true_vocab)
    lead = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    tp_group = ps.get_tensor_model_parallel_group()
    outs = []
    for i in range(0, flat.shape[0], chunk_size):
        z = tempered(flat[i : i + chunk_size].float(), temperature)
        zmax = z.detach().max(dim=-1, keepdim=True).values
        if dist.get_world_size(tp_group) > 1:
            dist.all_reduce(zmax, op=dist.ReduceOp.MAX, group=tp_group)
        ez = torch.exp(z - zmax)
        sum_ez = reduce_from_tensor_model_parallel_region(ez.sum(-1))
        zfin = torch.where(torch.isfinite(z), z, torch.zeros_like(z))
        sum_ez_z = reduce_from_tensor_model_parallel_region((ez * zfin).sum(-1))
        outs.append(torch.log(sum_ez) + zmax.squeeze(-1) - sum_ez_z / sum_ez)
    return torch.cat(outs).reshape(lead)


def logprob_memory(variant: str, tokens: int, vocab: int) -> int:
    """Peak RSS rise (bytes) of one logprob+entropy forward+backward over bf16 logits."""
    import resource

    import torch

    from megatron_dapo.distributed import free_port, init_distributed, init_parallel
    from megatron_dapo.training.forward import token_logprobs
    from megatron_dapo.training.logprobs import chunked_logprobs_entropy

    init_distributed(rank=0, world_size=1, master_port=free_port())
    init_parallel(1, 1, 1)

    def stage(n):
        logits = torch.randn(1, n, vocab, dtype=torch.bfloat16).requires_grad_(True)
        target = torch.randint(0, vocab, (1, n))
        w = torch.randn(1, n - 1)
        return logits, target, w

    def run(logits, target, w):
        if variant == "previous":
            lp = token_logprobs(logits, target, vocab)
            ent = vocab_parallel_entropy(logits[:, :-1], vocab)
        else:
            lp, ent = chunked_logprobs_entropy(logits[:, :-1], target[:, 1:], vocab)
        ((lp * w).sum() + (ent * w).sum()).backward()

    torch.manual_seed(0)
    run(*stage(16))  # warm-up: lazy imports and kernels load before the baseline
    inputs = stage(tokens)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    run(*inputs)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="quick smoke run")
    ap.add_argument("--median", type=float, default=3000.0)
    ap.add_argument("--sigma", type=float, default=0.9)
    ap.add_argument("--minibatches", type=int, default=4)
    ap.add_argument("--scale", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mem-tokens", type=int, default=8192)
    ap.add_argument("--mem-vocab", type=int, default=19008)
    ap.add_argument("--_logprob-mem", dest="logprob_mem", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.logprob_mem:
        print(json.dumps({"peak_bytes": logprob_memory(args.logprob_mem, args.mem_tokens, args.mem_vocab)}))
        return 0
    if args.small:
        args.minibatches, args.repeats, args.mem_tokens, args.mem_vocab = 1, 1, 1024, 4096

    acc = accounting(args)
    print(f"length model: log-normal median {args.median:.0f}, sigma {args.sigma}, cap {CAP}; prompts 100-400")
    print(f"32B layout, {args.minibatches} mini-batches of 512 over DP 16, micro-batch budget {BUDGET} tokens:")
    print(f"  micro-batches: padded {acc['mb_padded']}, packed {acc['mb_packed']}")
    print(f"  DP token imbalance (max/mean): Karmarkar-Karp {acc['imb_kk']:.3f}, count split {acc['imb_count']:.3f}")

    mem = {}
    for variant in ("previous", "chunked"):
        out = subprocess.run(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--_logprob-mem",
                variant,
                "--mem-tokens",
                str(args.mem_tokens),
                "--mem-vocab",
                str(args.mem_vocab),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        mem[variant] = json.loads(out.stdout.strip().splitlines()[-1])["peak_bytes"]
    fp32 = args.mem_tokens * args.mem_vocab * 4
    print(
        f"logprob+entropy fwd+bwd, bf16 logits [{args.mem_tokens} x {args.mem_vocab}] "
        f"(one fp32 copy = {fp32 / 2**20:.0f} MiB): peak RSS rise previous {mem['previous'] / 2**20:.0f} MiB, "
        f"chunked {mem['chunked'] / 2**20:.0f} MiB"
    )

    tput = throughput(args)
    print(
        f"tiny model, lengths / {args.scale}, {tput['useful_small']} useful tokens per mini-batch: "
        f"consecutive (THD, --micro-batch-size 32) {tput['consecutive']:.0f} tokens/s, packed {tput['packed']:.0f} "
        f"tokens/s, packed/consecutive {tput['packed'] / tput['consecutive']:.2f}x"
    )
    print(f"padded/useful tokens: {acc['padded'] / acc['useful']:.2f}")
    print(f"packed/useful tokens: {acc['packed'] / acc['useful']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
