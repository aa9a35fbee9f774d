"""Greedy accuracy of an HF model on the demo's held-out problems, before and after training.

    python examples/demo/evaluate_demo.py --model DIR --data heldout.jsonl --n 128 \
        --out RUN_DIR/demo_eval.json --phase before|after

Each phase is merged into the JSON file as {"before": {"acc": a, "n": n}, "after": {...}};
"gain_over_2se" is written once both are there (the gain must exceed two standard errors
of the difference of two proportions for the demo to count as having learned).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time


def greedy_accuracy(model_dir: str, data: str, n: int, max_new_tokens: int = 8, batch: int = 32) -> dict:
    from transformers import AutoTokenizer

    from megatron_dapo.data import read_rows
    from megatron_dapo.reward import compute_score
    from megatron_dapo.rollout.base import SamplingParams
    from megatron_dapo.rollout.hf_engine import HFEngine

    tok = AutoTokenizer.from_pretrained(model_dir)
    engine = HFEngine(model_dir, tokenizer=tok)
    rows = read_rows(data)[:n]
    if len(rows) < n:
        raise SystemExit(f"{data}: only {len(rows)} rows, --n {n} requested")
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, stop=["\n"])
    correct = 0
    for i in range(0, n, batch):
        chunk = rows[i : i + batch]
        prompts = [tok(r["prompt"][-1]["content"], add_special_tokens=False)["input_ids"] for r in chunk]
        for r, outs in zip(chunk, engine.generate(prompts, params)):
            text = tok.decode(outs[0].output_ids, skip_special_tokens=True)
            correct += compute_score(text, r["reward_model"]["ground_truth"], mode="dapo").acc
    return {"acc": correct / n, "n": n}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--n", type=int, default=128)
    p.add_argument("--out", required=True)
    p.add_argument("--phase", choices=("before", "after"), required=True)
    args = p.parse_args(argv)
    t = time.time()
    res = greedy_accuracy(args.model, args.data, args.n)
    res["seconds"] = round(time.time() - t, 1)
    out = {}
    if os.path.exists(args.out):
        with open(args.out) as f:
            out = json.load(f)
    out[args.phase] = res
    if "before" in out and "after" in out:
        a, b, n1, n2 = out["before"]["acc"], out["after"]["acc"], out["before"]["n"], out["after"]["n"]
        se = math.sqrt(a * (1 - a) / n1 + b * (1 - b) / n2)
        out["gain"] = b - a
        out["two_standard_errors"] = 2 * se
        out["gain_over_2se"] = (b - a) > 2 * se
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"[demo-eval] {args.phase}: acc {res['acc']:.3f} on {res['n']} held-out problems ({res['seconds']}s)")


if __name__ == "__main__":
    main()
