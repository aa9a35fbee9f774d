#!/usr/bin/env python
"""Evaluate a model (HF directory or megatron-dapo torch_dist checkpoint) on a math data file.

    python tools/eval.py --model DIR --data FILE [--n-samples N] [--k K] [--temperature T]
        [--top-p P] [--max-new-tokens N] [--engine auto|hf|sglang] [--reward-mode dapo|math]
        [--prompt-style chat|raw|fewshot|fewshot-direct] [--out DIR] [--seed S] [--limit N]

Defaults follow DAPO's protocol (temperature 1.0, top_p 0.7, k 32, 20480 new tokens capped by
the context length). FILE: verl-schema parquet/jsonl (identical prompts are copies of one
problem), GSM8K jsonl (question / answer "#### N") or problem / answer jsonl. Writes
OUT/samples.jsonl and OUT/summary.json and prints the summary. A torch_dist checkpoint is
converted to a temporary HF directory first (tools/convert_megatron_to_hf.py; --tokenizer
names the tokenizer directory, --hf-config optionally the config).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time

import torch
import torch.distributed as dist

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from megatron_dapo.config import ConfigError  # noqa: E402 - after the sys.path line
from megatron_dapo.config.validate import load_tokenizer  # noqa: E402
from megatron_dapo.errors import OneLineArgumentParser, exit_on_user_error  # noqa: E402
from megatron_dapo.eval.runner import (  # noqa: E402
    DEFAULT_MAX_PROMPT_LENGTH,
    PROMPT_STYLES,
    dataset_name,
    evaluate,
    load_eval_problems,
)
from megatron_dapo.known_warnings import quiet_known_warnings  # noqa: E402
from megatron_dapo.models.hf_config import generation_eos_ids  # noqa: E402
from megatron_dapo.reward import BatchScorer  # noqa: E402
from megatron_dapo.reward.api import REWARD_MODES  # noqa: E402
from megatron_dapo.rollout.engines import (  # noqa: E402
    ENGINE_KINDS,
    STANDALONE_DTYPES,
    StandaloneOptions,
    engine_choices,
    engine_kind,
    resolve_engine_kind,
)

MEGATRON_METADATA = "megatron_dapo_checkpoint.json"  # megatron_dapo.checkpoint.dist_ckpt.METADATA_FILE
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def parse_args(argv=None):
    p = OneLineArgumentParser(prog="eval.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="HF model directory or megatron-dapo torch_dist checkpoint directory")
    p.add_argument("--data", required=True, help="parquet / jsonl evaluation file")
    p.add_argument(
        "--n-samples",
        type=int,
        default=None,
        help="samples per problem (default: the number of copies of each prompt, at least k)",
    )
    p.add_argument("--k", type=int, default=32, help="k of avg@k / pass@k / maj@k (default 32)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=0.7)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=20480,
        help="generation cap (default 20480), further capped by context length - prompt",
    )
    p.add_argument(
        "--max-prompt-length", type=int, default=DEFAULT_MAX_PROMPT_LENGTH, help="longer prompts are left-truncated"
    )
    p.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="model context (default: max_position_embeddings of config.json)",
    )
    kinds = [(name, spec) for name, spec in ENGINE_KINDS.items() if spec.standalone is not None]
    p.add_argument(
        "--engine",
        choices=engine_choices(),
        default="auto",
        help="; ".join(f"{name}: {spec.doc.split(' (')[0].split(';')[0].rstrip('.')}" for name, spec in kinds)
        + "; auto: the first of them made for this machine (GPU when CUDA is available)",
    )
    p.add_argument("--reward-mode", choices=REWARD_MODES.names(), default="dapo")
    p.add_argument("--prompt-style", choices=PROMPT_STYLES, default="chat")
    p.add_argument("--stop", action="append", default=None, help="extra stop string (repeatable)")
    p.add_argument("--out", default=None, help="output directory (default: runs/eval/<model>__<data>)")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seeds the engine (hf: reproducible for a fixed --batch-size; sglang: random_seed)",
    )
    p.add_argument(
        "--seed-per-problem",
        action="store_true",
        help="also seed each problem's own generate call (reproducible whatever the batching; "
        "one call per problem, slow on GPU)",
    )
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N problems")
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="samples per generate call (default: "
        + ", ".join(f"{spec.standalone.batch_size or 'all'} with {name}" for name, spec in kinds)
        + ")",
    )
    p.add_argument(
        "--dtype",
        choices=STANDALONE_DTYPES,
        default=None,
        help="engine dtype (default: " + ", ".join(f"{spec.standalone.dtype} for {name}" for name, spec in kinds) + ")",
    )
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the model directory)")
    p.add_argument("--hf-config", default=None, help="HF config for converting a torch_dist checkpoint")
    p.add_argument("--reward-workers", type=int, default=None, help="reward worker processes (default min(4, cpus))")
    p.add_argument("--reward-timeout", type=float, default=10.0, help="per-response scoring timeout, seconds")
    p.add_argument("--mem-fraction", type=float, default=0.85, help="sglang mem_fraction_static")
    p.add_argument("--tp", type=int, default=1, help="sglang tensor parallel size")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.k < 1:
        p.error("--k must be >= 1")
    if args.seed_per_problem and args.seed is None:
        p.error("--seed-per-problem needs --seed")
    if args.n_samples is not None and args.n_samples < args.k:
        p.error(f"--n-samples {args.n_samples} < --k {args.k}")
    return args


def model_kind(path: str) -> str:
    """``"megatron"`` (torch_dist checkpoint of this project) or ``"hf"``, from the files in ``path``."""
    if not os.path.isdir(path):
        raise SystemExit(f"--model {path}: not a directory")
    if os.path.exists(os.path.join(path, MEGATRON_METADATA)):
        return "megatron"
    if os.path.exists(os.path.join(path, "config.json")):
        if not any(os.path.exists(os.path.join(path, f)) for f in HF_WEIGHTS):
            raise SystemExit(
                f"--model {path}: config.json but no weights ({' / '.join(HF_WEIGHTS)}); give the HF "
                "checkpoint directory with its weights"
            )
        return "hf"
    raise SystemExit(
        f"--model {path}: neither an HF checkpoint (config.json) nor a megatron-dapo torch_dist "
        f"checkpoint ({MEGATRON_METADATA})"
    )


def _load_tool(name: str):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_tools_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def hf_model_dir(args):
    """Yield an HF directory for ``args.model`` (a temporary conversion for torch_dist)."""
    if model_kind(args.model) == "hf":
        yield args.model
        return
    if args.tokenizer is None:
        raise SystemExit(f"--model {args.model} is a torch_dist checkpoint: pass --tokenizer DIR")
    was_initialized = dist.is_available() and dist.is_initialized()
    tmp = tempfile.mkdtemp(prefix="eval_hf_")
    try:
        convert_megatron_to_hf = _load_tool("convert_megatron_to_hf")

        t0 = time.time()
        conv = ["--load", args.model, "--save", tmp, "--tokenizer", args.tokenizer]
        if args.hf_config:
            conv += ["--hf-config", args.hf_config]
        convert_megatron_to_hf.main(conv)
        if not was_initialized and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        print(f"converted {args.model} -> {tmp} in {time.time() - t0:.1f}s", file=sys.stderr)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _context_length(model_dir: str):
    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return None
    cfg = cfg.get("text_config", cfg)
    v = cfg.get("max_position_embeddings")
    return int(v) if isinstance(v, int) and v > 0 else None


def _generation_eos_ids(model_dir: str) -> list:
    return generation_eos_ids(model_dir)


def build_engine(args, model_dir: str, tokenizer):
    """``(kind, engine)``: the ``--engine`` kind (``auto`` resolved for this machine) serving
    ``model_dir``'s own weights, as its registered ``standalone`` builds it
    (megatron_dapo/rollout/engines.py: ENGINE_KINDS); the engine class is imported only here."""
    kind = resolve_engine_kind(args.engine, torch.cuda.is_available())
    spec = engine_kind(kind).standalone
    if spec is None:
        raise ConfigError(
            f"--engine {kind}: this engine kind cannot serve a checkpoint by itself; "
            f"choose one of {', '.join(n for n, s in ENGINE_KINDS.items() if s.standalone)}"
        )
    opts = StandaloneOptions(dtype=args.dtype or spec.dtype, seed=args.seed, tp=args.tp, mem_fraction=args.mem_fraction)
    return kind, spec.build(model_dir, tokenizer, opts)


def default_batch_size(kind: str):
    """Samples per generate call without ``--batch-size``: the kind's (None: all at once)."""
    return engine_kind(kind).standalone.batch_size


def main(argv=None) -> int:
    """A mistake (a path, a data file, a model or tokenizer that does not load) ends it with one
    line and exit code 2 (megatron_dapo/errors.py; MEGATRON_DAPO_DEBUG=1 shows the traceback)."""
    quiet_known_warnings()  # only the library warnings known to be harmless (megatron_dapo/known_warnings.py)
    args = parse_args(argv)
    with exit_on_user_error("eval.py"):
        return _main(args)


def _check_out_dir(out: str) -> None:
    """``--out`` can be created (or written) without creating anything: its nearest existing
    ancestor must be a writable directory. A ConfigError naming ``--out`` otherwise."""
    path = os.path.abspath(out)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"--out {out}: it is a file; choose another --out")
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise ConfigError(f"--out {out}: cannot create it ({probe} is a file); choose another --out")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: cannot create it ({probe} is not writable); choose another --out")


def _main(args) -> int:
    t0 = time.time()
    model_kind(args.model)  # before anything loads: the model directory, the data, the output directory
    load_eval_problems(args.data, limit=args.limit)
    out = args.out or os.path.join(
        "runs", "eval", f"{os.path.basename(os.path.abspath(args.model))}__{dataset_name(args.data)}"
    )
    _check_out_dir(out)  # an unwritable --out fails now, not after the generation; nothing created yet
    with hf_model_dir(args) as model_dir:
        tokenizer = load_tokenizer(args.tokenizer or model_dir, "--tokenizer" if args.tokenizer else "--model")
        os.makedirs(out, exist_ok=True)  # every check passed
        kind, engine = build_engine(args, model_dir, tokenizer)
        scorer = _make_scorer(args, tokenizer)
        try:
            summary = evaluate(
                engine,
                tokenizer,
                args.data,
                n_samples=args.n_samples,
                k=args.k,
                temperature=args.temperature,
                top_p=args.top_p,
                top_k=args.top_k,
                max_new_tokens=args.max_new_tokens,
                max_prompt_length=args.max_prompt_length,
                prompt_style=args.prompt_style,
                reward_mode=args.reward_mode,
                scorer=scorer,
                stop=args.stop,
                stop_token_ids=_generation_eos_ids(model_dir),
                seed=args.seed if args.seed_per_problem else None,
                out_dir=out,
                progress=not args.no_progress,
                limit=args.limit,
                batch_size=args.batch_size if args.batch_size is not None else default_batch_size(kind),
                context_length=args.context_length or _context_length(model_dir),
            )
        finally:
            scorer.close()
            engine.shutdown()
    summary["total_wall_s"] = time.time() - t0
    with open(os.path.join(out, "summary.json")) as f:
        full = json.load(f)
    full["total_wall_s"] = summary["total_wall_s"]
    full["config"].update(model=os.path.abspath(args.model), engine=kind)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(full, f, indent=2, ensure_ascii=False)
    print(json.dumps(summary, indent=2))
    print(f"wrote {os.path.join(out, 'samples.jsonl')} and {os.path.join(out, 'summary.json')}", file=sys.stderr)
    return 0


def _make_scorer(args, tokenizer):
    return BatchScorer(
        num_workers=args.reward_workers or min(4, os.cpu_count() or 1),
        timeout_s=args.reward_timeout,
        mode=args.reward_mode,
        eos_text=getattr(tokenizer, "eos_token", None),
    )


if __name__ == "__main__":
    sys.exit(main())
