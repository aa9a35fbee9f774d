"""The evaluation driver: sample k responses per problem with a rollout engine, score, summarise.

``evaluate(engine, tokenizer, dataset_path, ...)`` is what ``tools/eval.py`` and the trainer
(every ``--eval-interval`` steps, with its live engine) call. It

* reads the problems of a data file (:func:`load_eval_problems`): the verl schema
  (``prompt`` + ``reward_model.ground_truth``; identical prompts are *copies* of one problem,
  so aime-2024.parquet gives 30 problems of 32 copies), GSM8K (``question`` + ``answer`` ending
  in ``#### N``) or ``problem`` + ``answer`` rows (math500, amc23);
* draws ``n`` samples per problem: ``n_samples`` when given, else ``max(copies, k)`` (a file
  storing each problem 32 times gives 32 samples per problem, never 32 x 32; one row per
  problem gives k);
* renders the prompt in one of :data:`PROMPT_STYLES`; caps the new tokens of each prompt at
  the model's context length minus the prompt;
* scores every response with the reward (``BatchScorer`` by default), which sees the
  sample's whole record (prompt, response, label, data source, the row's ``extra_info``), and
  summarises with
  :func:`megatron_dapo.eval.metrics.summarize`: avg@k, unbiased pass@k, maj@k, mean response
  length, truncation ratio, no-answer rate;
* writes ``out_dir/samples.jsonl`` (one line per sample) and ``out_dir/summary.json``.

DAPO's protocol is the default: temperature 1.0, top_p 0.7, k = 32, at most 20480 new tokens.

Seeds: the engines derive per-sample seeds from one request seed (sample ``j`` of *every*
prompt of a call gets ``derive_seed(seed, j)``), so a seeded call over several problems would
give sample ``j`` of each problem the same random stream; with a weak model that visibly
repeats the same answer across problems. With ``seed`` set, each problem therefore gets its
own generate call seeded ``derive_seed(seed, problem_index + 1)``: reproducible whatever the
batching, at the price of batching only the ``n`` samples of one problem. With ``seed=None``
problems are batched (``batch_size``) and every row draws its own seed from the engine's RNG
(``HFEngine(seed=...)`` makes that reproducible for a fixed ``batch_size``; tools/eval.py's
``--seed`` does this).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

from tqdm.auto import tqdm

from megatron_dapo.data.dataset import DataError, read_rows, render_prompt
from megatron_dapo.eval.metrics import summarize
from megatron_dapo.models.hf_config import generation_eos_ids
from megatron_dapo.reward import BatchScorer
from megatron_dapo.reward.api import RewardInput
from megatron_dapo.rollout.base import SamplingParams, derive_seed

__all__ = [
    "DAPO_TEMPLATE",
    "DEFAULT_MAX_PROMPT_LENGTH",
    "EvalProblem",
    "PROMPT_STYLES",
    "build_prompt",
    "dataset_name",
    "evaluate",
    "eval_log_keys",
    "extract_problem",
    "load_eval_problems",
]

#: The DAPO-Math-17K / aime-2024.parquet user turn (``{problem}`` is the bare problem).
DAPO_TEMPLATE = (
    "Solve the following math problem step by step. The last line of your response should be of "
    "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
    "{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)
_DAPO_HEAD, _DAPO_TAIL = DAPO_TEMPLATE.split("{problem}")

#: Prompt styles:
#:
#: * ``chat``: the DAPO user turn through the tokenizer's chat template (the trainer's format);
#: * ``raw``: the same text without a chat template;
#: * ``fewshot``: a completion prompt of worked examples ``Question: ...\nSolution: ...\nAnswer:
#:   N`` ending in ``Question: {problem}\nSolution:``; generation stops at a blank line or a new
#:   ``Question:``; the model writes its own ``Answer:`` line (for small models, which cannot
#:   follow the DAPO instruction);
#: * ``fewshot-direct``: ``Question: ...\nAnswer: N`` examples ending in ``Answer:``, no
#:   reasoning; stops at the newline; the response is scored as ``"Answer:" + response``.
PROMPT_STYLES = ("chat", "raw", "fewshot", "fewshot-direct")

DEFAULT_MAX_PROMPT_LENGTH = 2048

# Worked examples for the few-shot styles (written for this project, GSM8K-like).
_FEWSHOT_EXAMPLES = (
    (
        "A baker makes 24 muffins in the morning and sells 15 of them. How many muffins are left?",
        "The baker has 24 - 15 = 9 muffins left.",
        "9",
    ),
    (
        "Tom buys 3 notebooks that cost $4 each and a pen that costs $2. How much does he spend in total?",
        "The notebooks cost 3 * 4 = 12 dollars. With the pen he spends 12 + 2 = 14 dollars.",
        "14",
    ),
    (
        "A farm has 5 rows of apple trees with 8 trees in each row. Half of the trees are picked today. "
        "How many trees are picked today?",
        "There are 5 * 8 = 40 trees. Half of them is 40 / 2 = 20 trees.",
        "20",
    ),
    (
        "Sara reads 12 pages a day. Her book has 90 pages and she has already read 30 pages. "
        "How many more days does she need to finish the book?",
        "She has 90 - 30 = 60 pages left. At 12 pages a day she needs 60 / 12 = 5 days.",
        "5",
    ),
)


@dataclasses.dataclass
class EvalProblem:
    """One problem of an evaluation file (its copies grouped)."""

    problem_id: str
    messages: list  # chat messages of the DAPO-style prompt
    problem: str  # the bare problem text (for the few-shot styles)
    ground_truth: str
    copies: int = 1  # rows of the file holding this very prompt
    data_source: str = ""
    row: int = 0  # first row of the file with this problem
    metadata: dict = dataclasses.field(default_factory=dict)  # the first row's extra_info


def extract_problem(text: str) -> str:
    """The bare problem inside a DAPO-template prompt (``text`` itself when it is not one)."""
    t = text.strip()
    head, tail = _DAPO_HEAD.strip(), _DAPO_TAIL.strip()
    if t.startswith(head):
        t = t[len(head) :]
        if t.endswith(tail):
            t = t[: -len(tail)]
        return t.strip()
    return text


def _gt_string(value: Any) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return str(int(value))
    return str(value)


def _row_problem(row: Mapping[str, Any], path: str, i: int) -> tuple[list, str, Optional[str], str]:
    """(messages, bare problem, ground truth, data_source) of one row, any supported schema."""
    source = str(row.get("data_source", "") or "")
    if "prompt" in row:  # verl schema
        prompt = row["prompt"]
        rm = row.get("reward_model") or {}
        gt = rm.get("ground_truth") if isinstance(rm, Mapping) else None
        if gt is None:
            gt = row.get("answer")
        if isinstance(prompt, str):
            msgs = [{"role": "user", "content": prompt}]
        elif (
            isinstance(prompt, (list, tuple))
            and prompt
            and all(isinstance(m, Mapping) and "content" in m for m in prompt)
        ):
            msgs = [{"role": m.get("role", "user"), "content": m["content"]} for m in prompt]
        else:
            raise DataError(f"{path}: row {i} field 'prompt' must be a string or a non-empty list of chat messages")
        user = [m["content"] for m in msgs if m["role"] == "user"] or [msgs[-1]["content"]]
        return msgs, extract_problem(user[-1]), _gt_string(gt), source
    answer = row.get("answer")
    if "question" in row and isinstance(answer, str) and "####" in answer:  # GSM8K
        gt = answer.rsplit("####", 1)[1].strip().replace(",", "")
        question = str(row["question"])
        return [{"role": "user", "content": DAPO_TEMPLATE.format(problem=question)}], question, gt, source or "gsm8k"
    text = row.get("problem", row.get("question"))
    if text is not None:  # math500 / amc23 / aime json
        return (
            [{"role": "user", "content": DAPO_TEMPLATE.format(problem=str(text))}],
            str(text),
            _gt_string(answer),
            source,
        )
    raise DataError(
        f"{path}: row {i} has none of the supported schemas (verl 'prompt' + 'reward_model.ground_truth'; "
        f"GSM8K 'question' + 'answer' with '#### N'; 'problem' + 'answer'); keys: {sorted(row)}"
    )


def load_eval_problems(
    path: str, limit: Optional[int] = None, needs_label: Optional[Callable[[str], bool]] = None
) -> list[EvalProblem]:
    """The problems of ``path`` in order of first appearance, identical prompts grouped as copies.

    Two rows are copies when their prompt messages and ground truth are identical.
    ``limit`` keeps the first ``limit`` problems. A row without a prompt is an error naming
    the row; so is a row without a ground truth, unless ``needs_label(data_source)`` says
    its reward needs none (then its label is ``""``).
    """
    rows = read_rows(path)
    problems: dict[str, EvalProblem] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise DataError(f"{path}: row {i} is not an object")
        msgs, bare, gt, source = _row_problem(row, path, i)
        if not any(str(m["content"]).strip() for m in msgs):
            raise DataError(f"{path}: row {i} has an empty prompt")
        if gt is None or not gt.strip():
            if needs_label is None or needs_label(source):
                raise DataError(f"{path}: row {i} has no ground truth")
            gt = ""
        meta = row.get("extra_info")
        key = json.dumps([msgs, gt], sort_keys=True, ensure_ascii=False, default=str)
        p = problems.get(key)
        if p is not None:
            p.copies += 1
            continue
        if limit is not None and len(problems) >= limit:
            continue  # still count copies of kept problems
        problems[key] = EvalProblem(
            str(len(problems)), msgs, bare, gt, 1, source, i, dict(meta) if isinstance(meta, Mapping) else {}
        )
    if not problems:
        raise DataError(f"{path}: no problems")
    return list(problems.values())


def build_prompt(problem: EvalProblem, tokenizer, style: str = "chat") -> tuple[str, list[str], str]:
    """``(prompt text, stop strings, response prefix)`` of ``problem`` in ``style``.

    The response prefix is prepended to the response before scoring (``"Answer:"`` for
    ``fewshot-direct``, whose prompt ends in it; ``""`` otherwise).
    """
    if style == "chat":
        return render_prompt(problem.messages, tokenizer, True), [], ""
    if style == "raw":
        return render_prompt(problem.messages, tokenizer, False), [], ""
    if style == "fewshot":
        shots = "".join(f"Question: {q}\nSolution: {s}\nAnswer: {a}\n\n" for q, s, a in _FEWSHOT_EXAMPLES)
        return shots + f"Question: {problem.problem}\nSolution:", ["\n\n", "\nQuestion:"], ""
    if style == "fewshot-direct":
        shots = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, _, a in _FEWSHOT_EXAMPLES)
        return shots + f"Question: {problem.problem}\nAnswer:", ["\n"], "Answer:"
    raise ValueError(f"prompt style must be one of {PROMPT_STYLES}, got {style!r}")


def dataset_name(path: str) -> str:
    """The name used in log keys (``eval/<name>/avg@k``): the file name without its extension."""
    base = os.path.basename(os.fspath(path).rstrip("/"))
    for ext in (".parquet", ".jsonl", ".json"):
        if base.endswith(ext):
            return base[: -len(ext)]
    return base


def eval_log_keys(summary: Mapping[str, Any], name: str) -> dict[str, float]:
    """``{"eval/<name>/<key>": value}`` for the numeric entries of an :func:`evaluate` summary."""
    return {
        f"eval/{name}/{k}": v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def _engine_context_length(engine) -> Optional[int]:
    for obj in (engine, getattr(engine, "config", None), getattr(getattr(engine, "model", None), "config", None)):
        if obj is None:
            continue
        for attr in ("context_length", "max_position_embeddings"):
            v = getattr(obj, attr, None)
            if isinstance(v, int) and v > 0:
                return v
    return None


def _special_texts(tokenizer) -> list[str]:
    texts = set()
    for attr in ("eos_token", "pad_token", "bos_token"):
        t = getattr(tokenizer, attr, None)
        if isinstance(t, str) and t:
            texts.add(t)
    texts.update(("<|im_end|>", "<|endoftext|>"))
    return sorted(texts, key=len, reverse=True)


def _response_text(out, tokenizer, specials: Sequence[str]) -> str:
    if out.text is None:
        return tokenizer.decode(out.output_ids, skip_special_tokens=True)
    text = out.text
    changed = True
    while changed:  # HFEngine decodes the stop token too: drop trailing special texts
        changed = False
        for s in specials:
            if text.endswith(s):
                text = text[: -len(s)]
                changed = True
    return text


class _InlineScorer:
    """Score in this process (a callable ``(response, ground_truth) -> RewardResult``)."""

    def __init__(self, fn: Callable[[str, str], Any]):
        self.fn = fn

    def score(self, items):
        return [self.fn(inp.response, inp.label) for inp in items]


def _batches(order: list[int], sizes: Sequence[int], batch_size: Optional[int]) -> list[list[int]]:
    if not batch_size:
        return [order] if order else []
    out, cur, cur_n = [], [], 0
    for i in order:
        if cur and cur_n + sizes[i] > batch_size:
            out.append(cur)
            cur, cur_n = [], 0
        cur.append(i)
        cur_n += sizes[i]
    if cur:
        out.append(cur)
    return out


def evaluate(
    engine,
    tokenizer,
    dataset_path: str,
    *,
    n_samples: Optional[int] = None,
    k: int = 32,
    temperature: float = 1.0,
    top_p: float = 0.7,
    top_k: int = -1,
    max_new_tokens: int = 20480,
    max_prompt_length: Optional[int] = DEFAULT_MAX_PROMPT_LENGTH,
    apply_chat_template: bool = True,
    prompt_style: Optional[str] = None,
    reward_mode: str = "dapo",
    scorer=None,
    stop: Optional[Sequence[str]] = None,
    stop_token_ids: Optional[Sequence[int]] = None,
    seed: Optional[int] = None,
    out_dir: Optional[str] = None,
    progress: bool = True,
    limit: Optional[int] = None,
    batch_size: Optional[int] = None,
    context_length: Optional[int] = None,
    name: Optional[str] = None,
) -> dict[str, Any]:
    """Evaluate ``engine`` on ``dataset_path``; returns a flat summary of numbers.

    Keys: ``avg@{k}``, ``pass@{k}``, ``maj@{k}``, ``pass@1``, ``response_length_mean`` (tokens),
    ``truncation_ratio`` (finish reason "length"), ``no_answer_rate``, ``timeout_rate``,
    ``n_problems``, ``n_samples_total``, ``samples_per_problem`` (the smallest), ``k``,
    ``prompts_truncated``, ``wall_s`` and ``gen_tokens_per_s``.

    ``engine``: a :class:`~megatron_dapo.rollout.RolloutEngine` (left running).
    ``n_samples``: samples per problem (default ``max(copies, k)``; must be >= ``k``).
    ``prompt_style``: one of :data:`PROMPT_STYLES`; ``None`` means ``"chat"`` when
    ``apply_chat_template`` else ``"raw"``.
    ``max_new_tokens`` is capped per prompt at ``context_length - len(prompt)``
    (``context_length`` default: the engine's ``max_position_embeddings`` when it has one).
    Prompts over ``max_prompt_length`` tokens are left-truncated (counted).
    ``stop``: extra stop strings (added to the style's own); ``stop_token_ids``: extra stop
    tokens (the tokenizer's EOS is always one).
    ``scorer``: an object with ``.score([RewardInput]) -> [RewardResult]`` (e.g. a
    :class:`~megatron_dapo.reward.BatchScorer`, left open; its ``needs_label`` decides which
    rows may lack a ground truth) or a callable ``(response, ground_truth) -> RewardResult``;
    ``None`` starts a ``BatchScorer(mode=reward_mode)`` for the call.
    ``seed``: one seeded generate call per problem (see the module doc); ``None`` batches.
    ``limit``: only the first ``limit`` problems. ``batch_size``: samples per generate call
    (whole problems; ``None``: all at once; unused with ``seed``). ``out_dir``: where ``samples.jsonl`` and
    ``summary.json`` go (nothing is written when ``None``). ``name``: the dataset name in
    ``summary.json`` (default :func:`dataset_name`).
    """
    t0 = time.monotonic()
    style = prompt_style or ("chat" if apply_chat_template else "raw")
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt_style must be one of {PROMPT_STYLES}, got {style!r}")
    k = int(k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if n_samples is not None and int(n_samples) < k:
        raise ValueError(f"n_samples={n_samples} is smaller than k={k}: pass@{k} needs at least {k} samples")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    name = name or dataset_name(dataset_path)
    problems = load_eval_problems(dataset_path, limit=limit, needs_label=getattr(scorer, "needs_label", None))
    if context_length is None:
        context_length = _engine_context_length(engine)

    # Prompts, their token ids and generation caps.
    prompts, prompt_texts, stops, prefixes, caps, sizes = [], [], [], [], [], []
    truncated = 0
    for p in problems:
        text, style_stops, prefix = build_prompt(p, tokenizer, style)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        if not ids:
            raise DataError(f"{dataset_path}: problem {p.problem_id} (row {p.row}) renders to an empty prompt")
        if max_prompt_length is not None and len(ids) > max_prompt_length:
            ids = ids[-int(max_prompt_length) :]
            truncated += 1
        cap = int(max_new_tokens)
        if context_length is not None:
            cap = min(cap, int(context_length) - len(ids))
            if cap < 1:
                raise ValueError(
                    f"{dataset_path}: problem {p.problem_id} (row {p.row}) has a {len(ids)}-token prompt, which "
                    f"leaves no room in the {context_length}-token context; lower max_prompt_length"
                )
        prompts.append(ids)
        prompt_texts.append(text)
        stops.append(tuple(style_stops) + tuple(stop or ()))
        prefixes.append(prefix)
        caps.append(cap)
        sizes.append(int(n_samples) if n_samples is not None else max(p.copies, k))

    eos_ids = set(int(t) for t in (stop_token_ids or ()))
    if getattr(tokenizer, "eos_token_id", None) is not None:
        eos_ids.add(int(tokenizer.eos_token_id))
    specials = _special_texts(tokenizer)
    eos_text = getattr(tokenizer, "eos_token", None)

    # Group problems that can share a generate call (same cap, n and stops), then batch.
    groups: dict[tuple, list[int]] = {}
    for i in range(len(problems)):
        groups.setdefault((caps[i], sizes[i], stops[i]), []).append(i)
    calls = []
    for key, idx in groups.items():
        if seed is not None:  # one call per problem, its own seed (see the module doc)
            calls.extend((key, [i]) for i in idx)
        else:
            calls.extend((key, b) for b in _batches(idx, sizes, batch_size))

    own_scorer = None
    if scorer is None:
        own_scorer = scorer = BatchScorer(
            num_workers=min(4, os.cpu_count() or 1), timeout_s=10.0, mode=reward_mode, eos_text=eos_text
        )
    elif not hasattr(scorer, "score"):
        scorer = _InlineScorer(scorer)

    samples_f = None
    if out_dir is not None:
        os.makedirs(out_dir, exist_ok=True)
        samples_f = open(os.path.join(out_dir, "samples.jsonl"), "w")
    bar = None
    if progress:
        bar = tqdm(total=sum(sizes), desc=f"eval {name}", unit="sample", dynamic_ncols=True)
    per_problem: list[list[dict]] = [[] for _ in problems]
    n_correct = n_done = gen_tokens = 0
    try:
        for (cap, n, stop_strs), idx in calls:
            params = SamplingParams(
                temperature=float(temperature),
                top_p=float(top_p),
                top_k=int(top_k),
                max_new_tokens=int(cap),
                n=int(n),
                stop_token_ids=sorted(eos_ids),
                stop=list(stop_strs),
                seed=None if seed is None else derive_seed(int(seed), idx[0] + 1),
            )
            outs = engine.generate([prompts[i] for i in idx], params)
            batch, where = [], []
            for i, group in zip(idx, outs):
                for j, out in enumerate(group):
                    text = _response_text(out, tokenizer, specials)
                    p = problems[i]
                    batch.append(
                        RewardInput(prefixes[i] + text, p.ground_truth, prompt_texts[i], p.data_source, p.metadata)
                    )
                    where.append((i, j, out, text))
            results = scorer.score(batch)
            for (i, j, out, text), res in zip(where, results):
                p = problems[i]
                s = {
                    "problem_id": p.problem_id,
                    "sample_index": j,
                    "row": p.row,
                    "data_source": p.data_source,
                    "ground_truth": p.ground_truth,
                    "response": text,
                    "response_length": len(out.output_ids),
                    "prompt_length": len(prompts[i]),
                    "finish_reason": out.finish_reason,
                    "score": float(res.score),
                    "acc": bool(res.acc),
                    "pred": res.pred,
                    "reason": res.reason,
                }
                per_problem[i].append(s)
                n_correct += int(s["acc"])
                gen_tokens += s["response_length"]
                if samples_f is not None:
                    samples_f.write(json.dumps(s, ensure_ascii=False) + "\n")
            n_done += len(batch)
            if samples_f is not None:
                samples_f.flush()
            if bar is not None:
                bar.update(len(batch))
                bar.set_postfix(acc=f"{n_correct / max(n_done, 1):.3f}")
    finally:
        if bar is not None:
            bar.close()
        if samples_f is not None:
            samples_f.close()
        if own_scorer is not None:
            own_scorer.close()

    samples = [s for group in per_problem for s in group]
    m = summarize(samples, k)
    wall = time.monotonic() - t0
    summary = {
        f"avg@{k}": m[f"avg@{k}"],
        f"pass@{k}": m[f"pass@{k}"],
        f"maj@{k}": m[f"maj@{k}"],
        "pass@1": m["pass@1"],
        "response_length_mean": m["response_length_mean"],
        "truncation_ratio": m["truncation_ratio"],
        "no_answer_rate": m["no_answer_rate"],
        "timeout_rate": m["timeout_rate"],
        "n_problems": m["num_problems"],
        "n_samples_total": m["num_samples"],
        "samples_per_problem": min(len(g) for g in per_problem),
        "k": k,
        "prompts_truncated": truncated,
        "wall_s": wall,
        "gen_tokens_per_s": gen_tokens / wall if wall > 0 else 0.0,
    }
    if out_dir is not None:
        config = {
            "dataset": os.path.abspath(dataset_path),
            "dataset_name": name,
            "prompt_style": style,
            "n_samples": n_samples,
            "k": k,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
            "max_new_tokens": max_new_tokens,
            "max_prompt_length": max_prompt_length,
            "context_length": context_length,
            "reward_mode": reward_mode,
            "stop": sorted(set(s for st in stops for s in st)),
            "stop_token_ids": sorted(eos_ids),
            "seed": seed,
            "limit": limit,
            "batch_size": batch_size,
            "example_prompt": tokenizer.decode(prompts[0]) if prompts else None,
        }
        with open(os.path.join(out_dir, "summary.json"), "w") as f:
            json.dump({**summary, "config": config}, f, indent=2, ensure_ascii=False)
    return summary


def evaluate_in_training(engine, tokenizer, cfg, hf_dir: str, arch, scorer, out_root: str) -> dict:
    """The held-out evaluation of a training run (--eval-data every --eval-interval steps) on
    ``engine`` with the run's flags (--eval-k, --eval-temperature, ...), as tools/eval.py
    evaluates; the metrics.jsonl keys of every data set (``eval_log_keys``). Each data set's
    responses go under ``out_root/<name>``."""
    out, lg = {}, cfg.logging
    for path in cfg.data.eval_data:
        res = evaluate(
            engine,
            tokenizer,
            path,
            progress=False,
            max_new_tokens=cfg.algo.max_response_length,
            scorer=scorer,
            k=lg.eval_k,
            temperature=lg.eval_temperature,
            top_p=lg.eval_top_p,
            prompt_style=lg.eval_prompt_style,
            stop_token_ids=generation_eos_ids(hf_dir),
            context_length=arch.max_position_embeddings,
            apply_chat_template=cfg.data.apply_chat_template,
            out_dir=os.path.join(out_root, dataset_name(path)),
        )
        out.update(eval_log_keys(res, dataset_name(path)))
    return out
