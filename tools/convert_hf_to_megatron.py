#!/usr/bin/env python
"""Convert a Hugging Face checkpoint (Qwen2/Qwen2.5, Llama) into a megatron-core torch_dist checkpoint.

    python tools/convert_hf_to_megatron.py --hf-checkpoint DIR --save DIR [--dtype bf16|fp32]

Runs as one process (a gloo world of one, no torchrun). The trainer loads the result at any
TP/PP (dist_checkpointing reshards on load). Under torchrun, --tensor-model-parallel-size /
--pipeline-model-parallel-size split the work over the launched ranks instead. See
docs/conversion.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hf-checkpoint", required=True, help="HF checkpoint directory (config.json + safetensors)")
    p.add_argument("--save", required=True, help="output directory of the torch_dist checkpoint")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="dtype of the saved weights")
    p.add_argument("--tensor-model-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    p.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from megatron_dapo.checkpoint.hf_export import hf_to_torch_dist

    t0 = time.time()
    meta = hf_to_torch_dist(
        args.hf_checkpoint,
        args.save,
        dtype=args.dtype,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        make_vocab_size_divisible_by=args.make_vocab_size_divisible_by,
    )
    import torch.distributed as dist

    if dist.get_rank() == 0:
        a = meta["arch"]
        print(
            f"converted {args.hf_checkpoint} ({a['model_type']}, {a['num_layers']} layers, hidden {a['hidden_size']}) "
            f"-> {args.save} [{args.dtype}, torch_dist] in {time.time() - t0:.1f}s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
