"""SGLang smoke test through our adapter, for a GPU machine that has sglang installed
(pip install -e ".[gpu]"; not runnable here: no GPU, and the pinned wheel needs torch 2.14.1 + CUDA 13).

The same one-process DAPO step as benchmarks/gpu_dapo_step.py with ``SGLangEngine`` as the
engine: a tiny random Qwen2 (vocab of the given tokenizer) is launched with load_format
"dummy" (no weights on disk); then, one line per stage: generate (dummy weights), release
(weights, KV cache, CUDA graphs), trainer onload, old logprobs, one optimizer step, resume
weights, sync through the adapter (weight-update session, one payload per TP rank), probe
(megatron's logprobs vs the engine's ``score``), trainer offload, resume KV cache and CUDA
graphs, generate with the new weights, score.

    python benchmarks/sglang_smoke.py --tokenizer /path/to/Qwen2.5-0.5B    # any Qwen2 tokenizer dir
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", required=True, help="a tokenizer directory (e.g. any Qwen2/Qwen2.5 checkpoint)")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    from transformers import AutoTokenizer

    from benchmarks.gpu_dapo_step import report, run

    vocab = len(AutoTokenizer.from_pretrained(args.tokenizer))
    vocab = -(-vocab // 128) * 128
    return report(
        lambda: run(small=False, port=args.port, engine_kind="sglang", tokenizer=args.tokenizer, vocab=vocab),
        "sglang-smoke",
    )


if __name__ == "__main__":
    sys.exit(main())
