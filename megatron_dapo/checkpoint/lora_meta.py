"""What a LoRA checkpoint records of its adapters and of the base model they adapt, and the
check on resume (issue 41; docs/lora.md).

A LoRA run's checkpoints hold the adapters and their optimizer state only (checkpoint/dist_ckpt.py);
the frozen base weights come from ``--hf-checkpoint`` at every start. So the checkpoint names
the base (its path) and fingerprints it: the SHA-256 over every ``*.safetensors`` file's name,
size and header (the names, dtypes, shapes and byte offsets of its tensors): reading the headers
costs milliseconds even for a 32B model. A resume on another base (other files, another layout or
size) or with other adapters (rank, alpha, targets) is refused in one line. (Re-written tensor
bytes of the same size and layout pass: the header does not hash the data.)
"""

from __future__ import annotations

import hashlib
import os
import struct
from typing import Optional

from ..errors import CheckpointError

#: the metadata key (under ``extra``) of a LoRA checkpoint's record
KEY = "lora"


def base_fingerprint(hf_dir: str) -> dict:
    """``{"files", "sha256"}`` of the safetensors files of ``hf_dir`` (names, sizes, headers)."""
    files = sorted(f for f in os.listdir(hf_dir) if f.endswith(".safetensors"))
    h = hashlib.sha256()
    for name in files:
        path = os.path.join(hf_dir, name)
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
            header = f.read(min(n, 100 << 20))
        h.update(f"{name}\0{size}\0".encode())
        h.update(header)
    return {"files": len(files), "sha256": h.hexdigest()}


def lora_record(rank: int, alpha: float, targets, hf_dir: str) -> dict:
    """The record a LoRA checkpoint keeps (``metadata["extra"]["lora"]``)."""
    return {
        "rank": int(rank),
        "alpha": float(alpha),
        "targets": list(targets),
        "base": {"hf_checkpoint": os.path.abspath(hf_dir), **base_fingerprint(hf_dir)},
    }


def check_lora_record(saved: Optional[dict], want: Optional[dict], where: str) -> None:
    """Refuse, in one line, a resume whose adapters or base differ from the checkpoint's."""
    if saved is None and want is None:
        return
    if saved is None:
        raise CheckpointError(
            f"{where} holds a full model, not LoRA adapters: to train adapters on it, convert it to an HF "
            "checkpoint (tools/convert_megatron_to_hf.py) and pass that as --hf-checkpoint without --load"
        )
    if want is None:
        raise CheckpointError(
            f"{where} holds LoRA adapters (rank {saved['rank']}): resume it with --lora-rank {saved['rank']} "
            f"--lora-alpha {saved['alpha']} --lora-target-modules {','.join(saved['targets'])}"
        )
    for k, flag in (("rank", "--lora-rank"), ("alpha", "--lora-alpha"), ("targets", "--lora-target-modules")):
        if saved[k] != want[k]:
            got = ",".join(want[k]) if k == "targets" else want[k]
            was = ",".join(saved[k]) if k == "targets" else saved[k]
            raise CheckpointError(f"{where}: its adapters were trained with {flag} {was}, this run has {got}")
    sb, wb = saved["base"], want["base"]
    if (sb["files"], sb["sha256"]) != (wb["files"], wb["sha256"]):
        raise CheckpointError(
            f"{where}: its adapters were trained on the base model {sb['hf_checkpoint']} ({sb['files']} safetensors "
            f"file(s), fingerprint {sb['sha256'][:12]}), but --hf-checkpoint {wb['hf_checkpoint']} is another "
            f"({wb['files']} file(s), {wb['sha256'][:12]}): pass the base the adapters were trained on"
        )
