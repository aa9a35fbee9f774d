#!/usr/bin/env python
"""Convert a Hugging Face checkpoint (Qwen2/Qwen2.5, Llama) into a megatron-core torch_dist checkpoint.

    python tools/convert_hf_to_megatron.py --hf-checkpoint DIR --save DIR [--dtype bf16|fp16|fp32]

The stored weights keep the source checkpoint's dtype (read from its safetensors headers), so a
round trip is lossless, unless --dtype asks for another one.

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

import torch.distributed as dist
from safetensors import safe_open

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from megatron_dapo.checkpoint.hf_check import check_hf_checkpoint  # noqa: E402
from megatron_dapo.checkpoint.hf_export import hf_to_torch_dist  # noqa: E402 - after the sys.path line
from megatron_dapo.checkpoint.model_io import HFWeights  # noqa: E402
from megatron_dapo.checkpoint.output_dir import check_output_dir  # noqa: E402
from megatron_dapo.errors import CheckpointError, ConfigError, exit_on_user_error  # noqa: E402
from megatron_dapo.known_warnings import quiet_known_warnings  # noqa: E402
from megatron_dapo.models.hf_config import load_hf_config, parse_hf_config  # noqa: E402

#: safetensors dtype names -> our dtype names (megatron_dapo.checkpoint.dist_ckpt).
SAFETENSORS_DTYPES = {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}


def source_dtype(hf_dir: str) -> str:
    """The dtype of the floating-point tensors of the HF checkpoint in ``hf_dir``, from the
    safetensors headers (no tensor is read). A checkpoint that mixes dtypes gets the widest one
    present (fp32; bf16 and fp16 together also give fp32), so that nothing is rounded."""
    weights = HFWeights(hf_dir)
    found = {}
    for fname in sorted(set(weights.weight_map.values())):
        with safe_open(os.path.join(hf_dir, fname), "pt") as f:
            for name in f.keys():
                found.setdefault(f.get_slice(name).get_dtype(), name)
    floats = {d: n for d, n in found.items() if d.startswith(("F", "BF"))}
    unknown = sorted(d for d in floats if d not in SAFETENSORS_DTYPES)
    if unknown:
        raise SystemExit(
            f"--hf-checkpoint {hf_dir}: tensors of dtype {', '.join(unknown)} (e.g. {floats[unknown[0]]!r}) have no "
            f"lossless megatron dtype; pass --dtype {'|'.join(SAFETENSORS_DTYPES.values())} to choose one"
        )
    kinds = {SAFETENSORS_DTYPES[d] for d in floats}
    if not kinds:
        raise SystemExit(f"--hf-checkpoint {hf_dir}: no floating-point tensors; pass --dtype")
    return kinds.pop() if len(kinds) == 1 else "fp32"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hf-checkpoint", required=True, help="HF checkpoint directory (config.json + safetensors)")
    p.add_argument("--save", required=True, help="output directory of the torch_dist checkpoint")
    p.add_argument(
        "--dtype",
        choices=tuple(SAFETENSORS_DTYPES.values()),
        default=None,
        help="dtype of the saved weights (default: the source checkpoint's, so nothing is rounded)",
    )
    p.add_argument("--tensor-model-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    p.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a non-empty --save directory (files of the same names are replaced, nothing "
        "else is deleted); without it a non-empty --save is refused",
    )
    return p.parse_args(argv)


def check_launch(args) -> None:
    """TP x PP ranks need as many launched processes (torchrun); one process converts any size."""
    ranks = args.tensor_model_parallel_size * args.pipeline_model_parallel_size
    for flag, v in (
        ("--tensor-model-parallel-size", args.tensor_model_parallel_size),
        ("--pipeline-model-parallel-size", args.pipeline_model_parallel_size),
    ):
        if v < 1:
            raise ConfigError(f"{flag} must be an integer >= 1, got {v}")
    started = dist.is_initialized()  # called collectively by ranks already started (tests, a driver)
    world = dist.get_world_size() if started else int(os.environ.get("WORLD_SIZE", "1"))
    launcher = "" if started or "WORLD_SIZE" in os.environ else " (no launcher)"
    if ranks > 1 and world % ranks:
        raise ConfigError(
            f"--tensor-model-parallel-size {args.tensor_model_parallel_size} x --pipeline-model-parallel-size "
            f"{args.pipeline_model_parallel_size} needs a multiple of {ranks} processes, this is {world}{launcher}: "
            f"run it under `torchrun --nproc-per-node {ranks} {os.path.relpath(__file__)} ...`, or leave both at 1 "
            "(one process converts any model; the trainer reshards on load)"
        )


def main(argv=None) -> int:
    quiet_known_warnings()  # only the library warnings known to be harmless (megatron_dapo/known_warnings.py)
    args = parse_args(argv)

    with exit_on_user_error(os.path.basename(__file__)):
        return _convert(args)


def _convert(args) -> int:
    check_launch(args)
    check_output_dir(args.save, "--save", args.overwrite)
    if not os.path.isdir(args.hf_checkpoint):
        what = "not a directory" if os.path.exists(args.hf_checkpoint) else "directory not found"
        raise CheckpointError(f"--hf-checkpoint: {what}: {args.hf_checkpoint} (give an HF checkpoint directory)")
    arch = parse_hf_config(load_hf_config(args.hf_checkpoint))
    check_hf_checkpoint(args.hf_checkpoint, arch)  # headers only, before anything is built or written

    t0 = time.time()
    dtype = args.dtype or source_dtype(args.hf_checkpoint)
    meta = hf_to_torch_dist(
        args.hf_checkpoint,
        args.save,
        dtype=dtype,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        make_vocab_size_divisible_by=args.make_vocab_size_divisible_by,
    )
    if dist.get_rank() == 0:
        a = meta["arch"]
        print(
            f"converted {args.hf_checkpoint} ({a['model_type']}, {a['num_layers']} layers, hidden {a['hidden_size']}) "
            f"-> {args.save} [{dtype}{'' if args.dtype else ' (the source dtype)'}, torch_dist] in {time.time() - t0:.1f}s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
