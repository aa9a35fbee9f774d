"""Token logprobs (+ entropy) over the vocabulary: our chunked path vs megatron's fused cross entropy.

The training step turns ``[tokens x vocab]`` logits into token logprobs and the entropy, and
back-propagates through the logprobs (entropy too when ``--entropy-coef`` > 0);
the old-logprob pass needs the logprobs only. ``training/logprobs.py`` does this in chunks of
tokens. The baseline is megatron-core's ``vocab_parallel_cross_entropy`` (logprobs only, no
entropy), measured in the same process on the same logits, interleaved, medians:

    python benchmarks/bench_logprobs.py [--tokens 2048 --vocab 49152 --repeats 5]

Prints, last:
    train fwd+bwd (logprobs + entropy) / megatron CE: X.XX
    train fwd+bwd with entropy gradient / megatron CE: X.XX
    old-logprob forward / megatron CE forward: X.XX
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _init_single_rank():
    from megatron_dapo.distributed import free_port, init_distributed, init_parallel

    init_distributed(0, 1, master_port=free_port())
    init_parallel(1, 1)


def cases(x0: torch.Tensor, target: torch.Tensor) -> dict:
    """name -> a callable doing one measured unit of work on a fresh copy of the logits."""
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    from megatron_dapo.training.logprobs import chunked_logprobs_entropy

    def megatron_ce(grad: bool):
        x = x0.clone().requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            lp = -vocab_parallel_cross_entropy(x.float().transpose(0, 1).contiguous(), target.t().contiguous())
            if grad:
                lp.sum().backward()

    def chunked(grad: bool, ent_grad: bool = False):
        x = x0.clone().requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            lp, ent = chunked_logprobs_entropy(x, target, None, 1.0, with_entropy=grad)
            if grad:
                (lp.sum() + (ent.sum() if ent_grad else 0)).backward()

    return {
        "ce_train": lambda: megatron_ce(True),
        "ce_fwd": lambda: megatron_ce(False),
        "train": lambda: chunked(True),
        "train_ent": lambda: chunked(True, True),
        "old_fwd": lambda: chunked(False),
    }


def run(tokens: int, vocab: int, repeats: int, seed: int = 0) -> dict:
    from megatron_dapo.distributed import collective_device

    _init_single_rank()
    g = torch.Generator().manual_seed(seed)
    b = max(1, tokens // 256)
    dev = collective_device()  # the logits live where the TP group reduces them (a GPU under NCCL)
    x0 = (torch.randn(b, tokens // b, vocab, generator=g) * 2).to(dev)
    target = torch.randint(0, vocab, (b, tokens // b), generator=g).to(dev)
    fns = cases(x0, target)
    times = {k: [] for k in fns}
    for f in fns.values():  # warm-up
        f()
    for _ in range(repeats):  # interleaved
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "seconds": med,
        "train": med["train"] / med["ce_train"],
        "train_ent": med["train_ent"] / med["ce_train"],
        "old_fwd": med["old_fwd"] / med["ce_fwd"],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=49152, help="SmolLM2's vocabulary by default")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    r = run(a.tokens, a.vocab, a.repeats)
    print(f"{a.tokens} tokens x {a.vocab} vocab, float32, {torch.get_num_threads()} threads; medians of {a.repeats}:")
    for k, v in r["seconds"].items():
        print(f"  {k:10s} {v * 1000:8.1f} ms")
    print(f"train fwd+bwd (logprobs + entropy) / megatron CE: {r['train']:.2f}")
    print(f"train fwd+bwd with entropy gradient / megatron CE: {r['train_ent']:.2f}")
    print(f"old-logprob forward / megatron CE forward: {r['old_fwd']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
