#!/usr/bin/env python
"""Convert a megatron-dapo torch_dist checkpoint into a Hugging Face checkpoint directory.

    python tools/convert_megatron_to_hf.py --load DIR --save DIR [--hf-config DIR] [--tokenizer DIR] [--base DIR]

Writes safetensors shards (+ model.safetensors.index.json), config.json (from --hf-config,
checked against the checkpoint, else the config stored in the checkpoint's metadata) and the
tokenizer files of --tokenizer; the result loads with
``transformers.AutoModelForCausalLM.from_pretrained(DIR)`` offline. Runs as one process. A LoRA
run's checkpoint (adapters only) is written merged, with the base it names (or ``--base``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch.distributed as dist

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from megatron_dapo.checkpoint.hf_export import torch_dist_to_hf  # noqa: E402 - after the sys.path line
from megatron_dapo.checkpoint.output_dir import check_output_dir  # noqa: E402
from megatron_dapo.errors import ConfigError, exit_on_user_error  # noqa: E402
from megatron_dapo.known_warnings import quiet_known_warnings  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--load", required=True, help="torch_dist checkpoint directory (written by this project)")
    p.add_argument("--save", required=True, help="output HF checkpoint directory")
    p.add_argument("--hf-config", default=None, help="directory (or config.json) whose config to write")
    p.add_argument("--tokenizer", default=None, help="directory whose tokenizer files to copy")
    p.add_argument(
        "--base",
        default=None,
        help="a LoRA checkpoint (adapters only): the HF checkpoint of its base model (default: the one it "
        "names; its fingerprint must match); the adapters are merged into the weights written",
    )
    p.add_argument("--max-shard-size-gb", type=float, default=5.0)
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a non-empty --save directory (files of the same names are replaced, nothing "
        "else is deleted); without it a non-empty --save is refused",
    )
    return p.parse_args(argv)


def main(argv=None) -> int:
    quiet_known_warnings()  # only the library warnings known to be harmless (megatron_dapo/known_warnings.py)
    args = parse_args(argv)

    with exit_on_user_error(os.path.basename(__file__)):
        return _convert(args)


def _convert(args) -> int:
    if not (math.isfinite(args.max_shard_size_gb) and args.max_shard_size_gb > 0):
        raise ConfigError(
            f"--max-shard-size-gb must be a finite number > 0, got {args.max_shard_size_gb} (the size of one "
            "safetensors file; 5 is the HF default)"
        )
    check_output_dir(args.save, "--save", args.overwrite)

    t0 = time.time()
    files = torch_dist_to_hf(
        args.load,
        args.save,
        hf_config_dir=args.hf_config,
        tokenizer_dir=args.tokenizer,
        max_shard_bytes=int(args.max_shard_size_gb * 1024**3),
        lora_setup=_lora_setup(args.load, args.base),
    )
    if dist.get_rank() == 0:
        print(f"wrote {args.save}: {', '.join(files)} in {time.time() - t0:.1f}s")
    return 0


def _lora_setup(load: str, base_override):
    """A LoRA checkpoint's model: its adapters (rank, alpha, targets from its record) on the built
    model, the base's weights from the HF checkpoint it names (or ``--base``), whose fingerprint
    must be the record's (checkpoint/lora_meta.py)."""

    def setup(model, arch, record: dict, padded_vocab: int) -> None:
        from megatron.core import parallel_state as ps

        from megatron_dapo.checkpoint.lora_meta import check_lora_record, lora_record
        from megatron_dapo.checkpoint.model_io import load_hf_weights
        from megatron_dapo.training.lora import LoRAOptions, apply_lora

        base = base_override or record["base"]["hf_checkpoint"]
        if not os.path.isdir(base):
            raise ConfigError(
                f"--base {base}: not found (the base model of the LoRA checkpoint {load}); pass --base DIR"
            )
        check_lora_record(
            record, lora_record(record["rank"], record["alpha"], record["targets"], base), f"--load {load}"
        )
        opts = LoRAOptions(rank=record["rank"], alpha=record["alpha"], targets=tuple(record["targets"]))
        apply_lora(model, arch, opts, tp_group=ps.get_tensor_model_parallel_group())
        load_hf_weights(model, arch, base, padded_vocab)

    return setup


if __name__ == "__main__":
    sys.exit(main())
