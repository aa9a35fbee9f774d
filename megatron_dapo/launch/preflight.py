"""Preflight checks: every path, file and model-vs-tokenizer fact a run depends on, before Ray.

``--dry-run`` runs all of them (:func:`dry_run`); the real run runs the cheap ones before any
process starts (:func:`check_before_launch`), so a mistake on 128 GPUs costs seconds. Each
check is a function of the config (and what earlier checks loaded) returning a
:class:`Check`: one line, ``[check] NAME TARGET: what was found``, or ``[check] FAIL ...`` /
``[check] WARN ...`` naming the flag, the file and the fix. Every check runs; then, if any
failed, :class:`PreflightError` (a ``ConfigError``: exit 2, one line, no traceback) lists them.

This module runs them and prints their lines (:func:`run_checks`, :func:`dry_run`,
:func:`check_before_launch`); the checks live in ``preflight_inputs.py`` (tokenizer, prompt and
eval data, reward) and ``preflight_checkpoints.py`` (hf-checkpoint, torch_dist checkpoints,
``--load``, disk), their result types (:class:`Check`, :class:`Checks`, :class:`PreflightError`)
in ``preflight_result.py``.

| check | what | fails when |
|---|---|---|
| prompt-data (dry run) | format, rows, schema, prompts left after de-duplication and the ``--max-prompt-length`` filter | missing, empty, truncated, not parquet/jsonl, no ``prompt`` column, a row without a label its reward needs, no usable prompt, a dataset changed since ``--load`` |
| eval-data | each ``--eval-data`` file, read as the evaluator reads it | the same; warns when ``--eval-interval`` is 0 |
| reward | ``--reward-mode`` / ``--reward-fn`` / ``--reward-source``; which reward each data source gets | a malformed entry, a function that does not import; warns for a source no row has |
| tokenizer | ``--tokenizer`` (or ``--hf-checkpoint``) loads; its ids against the model's ``vocab_size``; EOS/pad | not found, no tokenizer files, a token id >= ``vocab_size`` that text can produce (ordinary or special tokens), an EOS id outside the vocabulary |
| hf-checkpoint | ``config.json`` and, when they are the initial weights, the safetensors files | no weights (or shards named by the index missing) while neither ``--load`` nor ``--pretrained-checkpoint`` is given |
| load / pretrained-checkpoint / ref-load | a megatron-dapo torch_dist checkpoint whose metadata matches the model; ``--load``'s saved layout | not found, not such a checkpoint, another architecture |
| disk | one checkpoint (params x (weights + fp32 main params + Adam m, v)) against the free space of ``--save``'s filesystem | it does not fit and ``--save`` or its parent exists (otherwise the filesystem may not be the run's: a warning); fewer than ``--keep-last`` + 1 fit: a warning; HF exports: warnings only |
| outputs (dry run) | ``--run-dir`` / ``--save`` writable and free of another run's files (outputs/run_dir.py) | see docs/reliability.md |

A directory holding only a model's public ``config.json`` (``examples/qwen2.5-32b``) carries
:data:`SHAPE_ONLY_FILE` (``preflight_result.py``); a dry run reports its missing weights and
tokenizer as warnings (it plans from the shape), a real run refuses it.
"""

from __future__ import annotations

from collections import Counter
from typing import Optional

from ..config import ConfigError
from ..errors import one_line, user_error_types
from ..outputs.run_dir import prepare_outputs
from ..reward.plugins import reward_needs_label
from .plan import dry_run_report
from .preflight_checkpoints import check_disk, check_hf_checkpoint, check_load, check_torch_dist
from .preflight_inputs import check_eval_data, check_prompt_data, check_reward, load_tokenizer
from .preflight_result import FAIL, OK, Check, Checks

#: The flags whose mistakes a check reports (by check name; default ``--<name>``).
_FLAGS = {
    "reward": ("--reward-fn", "--reward-mode", "--reward-source"),
    "hf-checkpoint": ("--hf-checkpoint",),
    "tokenizer": ("--tokenizer", "--hf-checkpoint"),
    "outputs": ("--run-dir", "--save"),
    "disk": ("--save",),
}


# ----------------------------------------------------------------------------- all of them


def run_checks(cfg, arch, dry_run: bool = True) -> Checks:
    """Every check (``dry_run``) or the cheap ones a real run does before Ray (the trainer
    loads and checks ``--prompt-data`` and the output directories itself, before Ray)."""
    checks = Checks()
    add = checks.append
    tok_check, tok = load_tokenizer(cfg, arch, dry_run)
    add(tok_check)
    if tok is not None and tok_check.status != FAIL:
        checks.tokenizer, checks.tokenizer_dir = tok, cfg.model.tokenizer or cfg.model.hf_checkpoint
    add(check_hf_checkpoint(cfg, arch, dry_run))
    reward = check_reward(cfg)
    try:
        needs_label = reward_needs_label(cfg.reward) if reward.status != FAIL else None
    except Exception:  # noqa: BLE001 - reported by the reward check
        needs_label = None
    sources: Optional[Counter] = Counter() if dry_run else None
    dataset = None
    if dry_run:
        c, dataset = check_prompt_data(cfg, tok, needs_label)
        add(c)
        if dataset is not None:
            sources.update(r.data_source for r in dataset.records)
        elif c.status == FAIL or cfg.data.prompt_data:
            sources = None  # the data's sources are unknown
    for path in cfg.data.eval_data or []:
        c, problems = check_eval_data(cfg, path, needs_label)
        add(c)
        if sources is not None:
            sources.update(p.data_source for p in problems)
    add(check_reward(cfg, sources) if reward.status != FAIL and sources is not None else reward)
    if cfg.checkpoint.load:
        add(check_load(cfg, arch, dataset, dry_run))
    if cfg.model.pretrained_checkpoint:
        add(check_torch_dist(cfg, arch, "--pretrained-checkpoint", cfg.model.pretrained_checkpoint))
    if cfg.model.ref_load:
        add(check_torch_dist(cfg, arch, "--ref-load", cfg.model.ref_load))
    checks.extend(check_disk(cfg, arch))
    if dry_run:
        try:
            checks.outputs_lines = prepare_outputs(cfg, dry_run=True).lines
            add(
                Check(
                    "outputs",
                    OK,
                    "",
                    "--run-dir" + (" and --save" if cfg.checkpoint.save else "") + " usable (the [outputs] lines)",
                )
            )
        except ConfigError as e:
            add(Check("outputs", FAIL, "", one_line(e)))
    return checks


def dry_run(cfg, arch, hf_config_source: str = "", on_gpu: Optional[bool] = None) -> Checks:
    """``--dry-run``: print the plan with one line per check, then the ``[outputs]`` lines;
    raise :class:`PreflightError` (one line) when a check failed. Starts nothing."""
    checks = run_checks(cfg, arch, dry_run=True)
    try:
        text = dry_run_report(cfg, arch, hf_config_source, on_gpu=on_gpu, checks=checks)
    except user_error_types() as e:  # validate(): config, reward, paths
        msg = one_line(e)
        # what validate() refuses may already be a failed check (a path, a reward spec): one line per mistake
        if not any(
            (c.target and c.target in msg) or msg.startswith(_FLAGS.get(c.name, ("--" + c.name,)))
            for c in checks.failed
        ):
            checks.append(Check("config", FAIL, "", msg))
        text = "\n".join(
            [
                "=== megatron-dapo dry run: configuration invalid (no plan), nothing started ===",
                f"--- {checks.title()} ---",
                *checks.lines(),
            ]
        )
    print(text, flush=True)
    for line in checks.outputs_lines:
        print(f"[outputs] {line}", flush=True)
    checks.raise_if_failed("dry run")
    return checks


def check_before_launch(cfg, arch) -> Checks:
    """The real run's cheap checks, before Ray starts; prints one line per check and raises
    :class:`PreflightError` when one failed."""
    checks = run_checks(cfg, arch, dry_run=False)
    for line in checks.lines():
        print(line, flush=True)
    checks.raise_if_failed("before launch")
    return checks


__all__ = ["check_before_launch", "dry_run", "run_checks"]
