"""Two-digit addition in the verl schema, for the CPU demo (generated; no download).

Few-shot completion prompts end with the question line, so the model writes the
``Answer: N`` line itself and the official ``Answer:`` checker sees it; generation stops at
the end of that line (``--rollout-stop '\\n'``). Train and held-out problems are disjoint.

    python examples/demo/make_addition_data.py --out DIR [--train 2000 --heldout 256 --seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import random

FEWSHOT = [(12, 35), (40, 9), (23, 58)]


def prompt_text(a: int, b: int) -> str:
    shots = "".join(f"Question: What is {x} + {y}?\nAnswer: {x + y}\n\n" for x, y in FEWSHOT)
    return shots + f"Question: What is {a} + {b}?\n"


def row(a: int, b: int) -> dict:
    return {
        "data_source": "addition-2digit",
        "prompt": [{"role": "user", "content": prompt_text(a, b)}],
        "ability": "arithmetic",
        "reward_model": {"ground_truth": str(a + b), "style": "rule"},
        "extra_info": {"a": a, "b": b},
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--train", type=int, default=2000)
    p.add_argument("--heldout", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100) if (a, b) not in FEWSHOT]
    rng.shuffle(pairs)
    held, train = pairs[: args.heldout], pairs[args.heldout : args.heldout + args.train]
    os.makedirs(args.out, exist_ok=True)
    for name, rows in (("train.jsonl", train), ("heldout.jsonl", held)):
        with open(os.path.join(args.out, name), "w") as f:
            for a, b in rows:
                f.write(json.dumps(row(a, b)) + "\n")
    print(f"wrote {len(train)} train and {len(held)} held-out problems to {args.out}")


if __name__ == "__main__":
    main()
