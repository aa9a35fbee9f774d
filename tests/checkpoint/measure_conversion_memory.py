#!/usr/bin/env python
"""Peak memory of tools/convert_hf_to_megatron.py (and back) on a synthetic 1-2 GB model (docs/conversion.md).

    .venv/bin/python tests/checkpoint/measure_conversion_memory.py [--dtype fp32|bf16] [--workdir DIR]

Writes a random Qwen2-shaped HF checkpoint (safetensors shards written tensor by tensor), runs
the converter as its own process (a world of one, as a user would) and samples the process
tree every 50 ms: the converter's peak RSS (VmHWM), the peak of the tree's summed PSS (the
converter plus dist_checkpointing's writer processes, shared pages counted once), and the
converter's RSS after imports (the baseline that does not grow with the model).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.tiny import tiny_qwen2_config  # noqa: E402

# a ~1.8 GiB (fp32) Qwen2-shaped model
CONFIG = tiny_qwen2_config(
    vocab_size=32000,
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=4,
    max_position_embeddings=4096,
    rope_theta=1000000.0,
)


def hf_shapes(arch):
    """Every HF tensor of ``arch`` and the shape its config gives it (the converters' own check)."""
    from megatron_dapo.checkpoint.hf_check import expected_hf_shape
    from megatron_dapo.checkpoint.mapping import hf_names

    return {name: expected_hf_shape(arch, name) for name in hf_names(arch)}


def write_synthetic(path: str, dtype) -> int:
    import torch
    from safetensors.torch import save_file

    from megatron_dapo.models import parse_hf_config

    os.makedirs(path, exist_ok=True)
    cfg = dict(CONFIG, dtype="bfloat16" if dtype == torch.bfloat16 else "float32")
    json.dump(cfg, open(os.path.join(path, "config.json"), "w"))
    shapes = hf_shapes(parse_hf_config(cfg))
    g = torch.Generator().manual_seed(0)
    shard, shard_bytes, files, weight_map, total = {}, 0, [], {}, 0

    def flush():
        nonlocal shard, shard_bytes
        name = f"model-{len(files) + 1:05d}.safetensors"
        save_file(shard, os.path.join(path, name))
        files.append(name)
        weight_map.update({k: name for k in shard})
        shard, shard_bytes = {}, 0

    for name, shape in shapes.items():
        t = (torch.randn(shape, generator=g) * 0.02).to(dtype)
        shard[name] = t
        shard_bytes += t.numel() * t.element_size()
        total += t.numel() * t.element_size()
        if shard_bytes > 256 * 1024**2:
            flush()
    if shard:
        flush()
    json.dump(
        {"metadata": {"total_size": total}, "weight_map": weight_map},
        open(os.path.join(path, "model.safetensors.index.json"), "w"),
    )
    return total


def _tree(proc):
    import psutil

    try:
        return [proc] + proc.children(recursive=True)
    except psutil.Error:
        return [proc]


def measure(cmd: list) -> dict:
    import psutil

    env = dict(os.environ, OMP_NUM_THREADS="1")
    t0 = time.time()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    main = psutil.Process(p.pid)
    peak_pss = 0
    hwm = 0
    first_rss = []
    while p.poll() is None:
        total = 0
        for q in _tree(main):
            try:
                total += q.memory_full_info().pss
            except psutil.Error:
                pass
        peak_pss = max(peak_pss, total)
        try:
            with open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        hwm = max(hwm, int(line.split()[1]) * 1024)
                    if line.startswith("VmRSS:"):
                        first_rss.append(int(line.split()[1]) * 1024)
        except OSError:
            pass
        time.sleep(0.05)
    out = p.stdout.read()
    if p.returncode:
        raise RuntimeError(f"converter failed:\n{out}")
    return {
        "seconds": time.time() - t0,
        "peak_rss": hwm,
        "peak_tree_pss": peak_pss,
        "log": out.strip().splitlines()[-1:],
    }


def baseline_rss() -> int:
    """RSS of a process that has imported what the converter imports (torch, megatron-core)."""
    code = (
        "import sys; sys.path.insert(0, %r); import torch, megatron.core.models.gpt.gpt_model, "
        "megatron.core.dist_checkpointing, transformers; from megatron_dapo.checkpoint import hf_export; "
        "print(int(open('/proc/self/statm').read().split()[1]) * 4096)"
    ) % ROOT
    return int(subprocess.check_output([sys.executable, "-c", code], text=True, stderr=subprocess.DEVNULL).split()[-1])


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args(argv)
    work = args.workdir or tempfile.mkdtemp(prefix="convmem_")
    try:
        tdt = torch.float32 if args.dtype == "fp32" else torch.bfloat16
        model_bytes = write_synthetic(os.path.join(work, "hf"), tdt)
        base = baseline_rss()
        r = measure(
            [
                sys.executable,
                os.path.join(ROOT, "tools", "convert_hf_to_megatron.py"),
                "--hf-checkpoint",
                os.path.join(work, "hf"),
                "--save",
                os.path.join(work, "ckpt"),
                "--dtype",
                args.dtype,
            ]
        )
        back = measure(
            [
                sys.executable,
                os.path.join(ROOT, "tools", "convert_megatron_to_hf.py"),
                "--load",
                os.path.join(work, "ckpt"),
                "--save",
                os.path.join(work, "hf_out"),
                "--max-shard-size-gb",
                "0.5",
            ]
        )
        gib = 1024**3
        ck_bytes = sum(os.path.getsize(os.path.join(work, "ckpt", f)) for f in os.listdir(os.path.join(work, "ckpt")))
        res = {
            "dtype": args.dtype,
            "model_gib": round(model_bytes / gib, 3),
            "checkpoint_gib": round(ck_bytes / gib, 3),
            "baseline_rss_gib": round(base / gib, 3),
            "peak_rss_gib": round(r["peak_rss"] / gib, 3),
            "peak_tree_pss_gib": round(r["peak_tree_pss"] / gib, 3),
            "peak_rss_over_model": round(r["peak_rss"] / model_bytes, 3),
            "peak_rss_minus_baseline_over_model": round((r["peak_rss"] - base) / model_bytes, 3),
            "peak_tree_pss_over_model": round(r["peak_tree_pss"] / model_bytes, 3),
            "seconds": round(r["seconds"], 1),
            "converter": r["log"],
            "export_peak_rss_over_model": round(back["peak_rss"] / model_bytes, 3),
            "export_peak_tree_pss_over_model": round(back["peak_tree_pss"] / model_bytes, 3),
            "export_seconds": round(back["seconds"], 1),
        }
        print(json.dumps(res, indent=1))
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
