"""Greedy accuracy of an HF model on the demo's held-out problems, before and after training.

    python examples/demo/evaluate_demo.py --model DIR --data heldout.jsonl --n 128 \
        --out RUN_DIR/demo_eval.json --phase before|after

The evaluation is tools/eval.py's (megatron_dapo.eval.runner.evaluate, greedy, one sample
per problem); each phase's samples go to demo_eval_<phase>/ beside the JSON file. Each
phase is merged into the JSON file as {"before": {"acc": a, "n": n}, "after": {...}};
"gain_over_2se" is written once both are there (the gain must exceed two standard errors
of the difference of two proportions for the demo to count as having learned).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time


def greedy_accuracy(
    model_dir: str, data: str, n: int, max_new_tokens: int = 8, batch: int = 32, out_dir: str | None = None
) -> dict:
    """Greedy accuracy on the first ``n`` problems of ``data``, with the evaluation code of
    tools/eval.py (megatron_dapo.eval.runner.evaluate): one sample per problem, the prompt
    as raw text, generation stopped at the end of the ``Answer:`` line, the dapo checker in
    the reward pool. ``out_dir`` receives samples.jsonl and summary.json."""
    from transformers import AutoTokenizer

    from megatron_dapo.eval.runner import evaluate
    from megatron_dapo.rollout.hf_engine import HFEngine

    tok = AutoTokenizer.from_pretrained(model_dir)
    engine = HFEngine(model_dir, tokenizer=tok)
    try:
        summary = evaluate(
            engine,
            tok,
            data,
            n_samples=1,
            k=1,
            temperature=0.0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            prompt_style="raw",
            stop=["\n"],
            reward_mode="dapo",
            limit=n,
            batch_size=batch,
            progress=False,
            out_dir=out_dir,
        )
    finally:
        engine.shutdown()
    if summary["n_problems"] < n:
        raise SystemExit(f"{data}: only {summary['n_problems']} problems, --n {n} requested")
    return {"acc": summary["avg@1"], "n": summary["n_samples_total"]}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--n", type=int, default=128)
    p.add_argument("--out", required=True)
    p.add_argument("--phase", choices=("before", "after"), required=True)
    args = p.parse_args(argv)
    t = time.time()
    samples_dir = os.path.join(os.path.dirname(os.path.abspath(args.out)), f"demo_eval_{args.phase}")
    res = greedy_accuracy(args.model, args.data, args.n, out_dir=samples_dir)
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
