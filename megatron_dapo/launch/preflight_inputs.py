"""Preflight checks of what a run reads: ``--tokenizer`` against the model, ``--prompt-data``,
``--eval-data`` and the reward (``--reward-mode`` / ``--reward-fn`` / ``--reward-source``).

Each returns a :class:`~.preflight_result.Check` (and what it loaded, for the later checks);
launch/preflight.py runs them.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Callable, Optional, Tuple

from ..data.dataset import DataError, check_columns, load_prompt_dataset, read_rows
from ..errors import one_line
from ..eval.runner import load_eval_problems
from ..models.hf_config import generation_eos_ids
from ..reward.plugins import RewardRouter, parse_reward_sources, spec_kind
from .preflight_result import FAIL, OK, SHAPE_ONLY_FILE, WARN, Check, _strip

#: Any of these makes a directory a tokenizer directory for ``AutoTokenizer``.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _fmt(path: str) -> str:
    return "parquet" if path.endswith(".parquet") else "jsonl" if path.endswith(".jsonl") else "json"


# ----------------------------------------------------------------------------- tokenizer


def load_tokenizer(cfg, arch, dry_run: bool) -> Tuple[Check, object]:
    """``--tokenizer`` (default ``--hf-checkpoint``) against the model: ``(check, tokenizer or None)``.

    A token id >= the model's ``vocab_size`` that text can produce (an ordinary BPE token or a
    special token) fails: the trainer's embedding lookup would index past the table. Plain
    added tokens there (``[PAD151680]``-style fillers, produced only by their literal text)
    are a warning. The model's EOS ids (config.json / generation_config.json) must be inside
    both vocabularies.
    """
    m = cfg.model
    flag = "--tokenizer" if m.tokenizer else "--hf-checkpoint"
    path = m.tokenizer or m.hf_checkpoint
    name = "tokenizer"
    if not path or not os.path.exists(path):
        return Check(name, FAIL, str(path), f"not found ({flag}); give the model's tokenizer directory"), None
    if not os.path.isdir(path):
        return Check(name, FAIL, path, f"not a directory ({flag}); give the directory holding tokenizer.json"), None
    if not any(os.path.exists(os.path.join(path, f)) for f in TOKENIZER_FILES):
        if dry_run and flag == "--hf-checkpoint" and os.path.exists(os.path.join(path, SHAPE_ONLY_FILE)):
            return Check(
                name,
                WARN,
                path,
                f"a model shape only ({flag}), no tokenizer: prompt lengths "
                "and token ids not checked (pass --tokenizer DIR)",
            ), None
        return Check(
            name,
            FAIL,
            path,
            f"no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {flag}; pass "
            "--tokenizer DIR with the model's tokenizer",
        ), None
    try:
        from transformers import AutoTokenizer  # transformers: ~2.5 s, only when a tokenizer is checked

        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - any library error: one line naming the flag
        return Check(
            name,
            FAIL,
            path,
            f"{flag} does not load with AutoTokenizer ({type(e).__name__}: "
            f"{one_line(e)[:300]}); give the model's tokenizer directory",
        ), None

    vocab = arch.vocab_size
    n = len(tok)
    if n < 2:  # a tokenizer_config.json without its vocabulary: transformers builds an empty tokenizer
        return Check(
            name,
            FAIL,
            path,
            f"{flag} holds a tokenizer without a vocabulary ({n} token); give the "
            "directory with the model's tokenizer.json",
        ), None
    added = dict(getattr(tok, "added_tokens_decoder", {}) or {})
    src = f"--hf-checkpoint {m.hf_checkpoint}/config.json"
    fails, warns = [], []
    if n > vocab:
        over = range(vocab, n)
        base = [i for i in over if i not in added]
        special = [i for i in over if i in added and getattr(added[i], "special", False)]
        plain = [i for i in over if i in added and not getattr(added[i], "special", False)]
        if base or special:
            show = [f"{i} {tok.convert_ids_to_tokens(i)!r}" for i in (special + base)[:3]]
            fails.append(
                f"{flag} has {n:,} tokens ({len(added)} added) but the model's vocab_size is {vocab:,} ({src}): "
                f"{len(base)} ordinary and {len(special)} special token ids >= {vocab:,} (e.g. {', '.join(show)}) would "
                "index past the embedding; use the tokenizer of the model in --hf-checkpoint"
            )
        else:
            warns.append(
                f"{len(plain)} plain added tokens have ids >= vocab_size {vocab:,} (e.g. "
                f"{str(added[plain[0]])!r}); only their literal text produces them"
            )
    eos_ids = generation_eos_ids(m.hf_checkpoint) if m.hf_checkpoint else []
    for i in eos_ids if not fails else []:  # (past the vocabulary: counted above already)
        if i >= vocab or i >= n:
            fails.append(
                f"the model's eos_token_id {i} ({src} / generation_config.json) is outside "
                f"{'the model vocabulary' if i >= vocab else f'the {n:,} tokens of {flag} {path}'}: "
                "generation could never stop; the tokenizer and the model do not belong together"
            )
    eos, pad = tok.eos_token_id, tok.pad_token_id
    for what, tid in (("eos", eos), ("pad", pad)) if not fails else ():
        if tid is not None and tid >= vocab:
            fails.append(f"the tokenizer's {what} token {tid} is >= the model's vocab_size {vocab:,}")
    if eos is None:
        warns.append("the tokenizer has no eos token (the end-of-sequence text is not stripped before scoring)")
    if not eos_ids:
        warns.append("the model declares no eos_token_id: generation stops only at --max-response-length")
    if cfg.data.apply_chat_template and not getattr(tok, "chat_template", None):
        warns.append("no chat template: chat prompts are rendered as plain text (--apply-chat-template has no effect)")
    if fails:
        return Check(name, FAIL, path, "; ".join(fails)), None
    desc = (
        f"{type(tok).__name__}, {n:,} tokens <= vocab_size {vocab:,} of the model"
        if n <= vocab
        else f"{type(tok).__name__}, {n:,} tokens, vocab_size {vocab:,}"
    )
    eos_s = f"eos {tok.eos_token!r} {eos}" if eos is not None else "no eos"
    in_model = (
        " (a stop token of the model)" if eos in eos_ids else (f" (the model stops at {eos_ids})" if eos_ids else "")
    )
    pad_s = f"pad {tok.pad_token!r} {pad}" if pad is not None else "no pad token (engines pad with eos)"
    chat = "chat template" if getattr(tok, "chat_template", None) else "no chat template"
    detail = f"{desc}; {eos_s}{in_model}, {pad_s}; {chat}"
    if warns:
        return Check(name, WARN, path, detail + "; " + "; ".join(warns)), tok
    return Check(name, OK, path, detail), tok


# ----------------------------------------------------------------------------- data


def check_prompt_data(cfg, tokenizer, needs_label: Optional[Callable[[str], bool]]) -> Tuple[Check, object]:
    """``--prompt-data``: ``(check, PromptDataset or None)``; without a tokenizer only the file
    and its schema are checked."""
    d, r = cfg.data, cfg.rollout
    path = d.prompt_data
    if not path:
        return Check("prompt-data", WARN, "", "--prompt-data not given: a real run needs it"), None
    try:
        if tokenizer is None:
            rows = read_rows(path)
            if not rows:
                raise DataError(f"{path}: the file holds no rows")
            check_columns(rows, path)
            return Check(
                "prompt-data",
                WARN,
                path,
                f"{_fmt(path)}, {len(rows):,} rows, columns ok; prompt lengths not checked (no tokenizer)",
            ), None
        ds = load_prompt_dataset(
            path,
            tokenizer,
            d.max_prompt_length,
            d.prompt_overflow,
            d.apply_chat_template,
            d.skip_bad_rows,
            needs_label=needs_label,
        )
    except DataError as e:
        return Check("prompt-data", FAIL, path, f"--prompt-data: {_strip(one_line(e), path)}"), None
    st = ds.stats
    longest = max(len(x.prompt_ids) for x in ds.records)
    within = (
        f"{len(ds):,} prompts within --max-prompt-length {d.max_prompt_length}"
        if d.prompt_overflow == "skip"
        else f"{len(ds):,} prompts, {st.truncated:,} left-truncated to --max-prompt-length {d.max_prompt_length}"
    )
    detail = (
        f"{_fmt(path)}, {st.rows:,} rows, columns ok, {within} (longest {longest} tokens; "
        f"{st.duplicates_removed:,} duplicates removed, {st.skipped_long:,} too long skipped, {st.bad_rows:,} bad "
        f"rows skipped)"
    )
    osb = r.over_sampling_batch_size or r.rollout_batch_size
    if len(ds) < osb:
        return Check(
            "prompt-data",
            WARN,
            path,
            detail + f"; only {len(ds):,} prompts for {osb} per generation round "
            "(--over-sampling-batch-size / --rollout-batch-size): prompts repeat within a round",
        ), ds
    return Check("prompt-data", OK, path, detail), ds


def check_eval_data(cfg, path: str, needs_label: Optional[Callable[[str], bool]]) -> Tuple[Check, list]:
    """One ``--eval-data`` file, read as the evaluator reads it: ``(check, problems)``."""
    try:
        problems = load_eval_problems(path, needs_label=needs_label)
    except DataError as e:
        return Check("eval-data", FAIL, path, f"--eval-data: {_strip(one_line(e), path)}"), []
    rows = sum(p.copies for p in problems)
    copies = sorted({p.copies for p in problems})
    detail = f"{_fmt(path)}, {rows:,} rows, {len(problems):,} problems" + (
        f" ({copies[0]} copies each)" if len(copies) == 1 and copies[0] > 1 else ""
    )
    if not cfg.logging.eval_interval:
        return Check(
            "eval-data", WARN, path, detail + "; never evaluated during training: --eval-interval is 0"
        ), problems
    return Check("eval-data", OK, path, detail + f"; evaluated every {cfg.logging.eval_interval} steps"), problems


def check_reward(cfg, sources: Optional[Counter] = None) -> Check:
    """``--reward-mode`` / ``--reward-fn`` / ``--reward-source``; with ``sources`` (data source ->
    rows, from the data files) which reward each source gets, and entries no row uses."""
    rc = cfg.reward
    bad = []
    for entry in rc.reward_source or []:
        try:
            parse_reward_sources([entry])
        except (ValueError, ImportError, AttributeError, TypeError) as e:
            bad.append(f"--reward-source {entry}: {one_line(e)}")
    try:
        RewardRouter(rc.mode, rc.reward_fn, None)
    except (ValueError, ImportError, AttributeError, TypeError) as e:
        bad.append(f"--reward-fn {rc.reward_fn}: {one_line(e)}")
    router = None
    if not bad:
        try:
            router = RewardRouter(rc.mode, rc.reward_fn, rc.reward_source)
        except (ValueError, ImportError, AttributeError, TypeError) as e:
            bad.append(one_line(e))
    if bad:
        return Check(
            "reward",
            FAIL,
            "",
            "; ".join(bad) + " (an entry is DATA_SOURCE=SPEC; SPEC is dapo, math, "
            "package.module:function or an http(s) URL)",
        )
    default_flag = "--reward-fn" if rc.reward_fn else "--reward-mode"
    kinds = {"builtin": "", "remote": " (remote, not contacted)", "function": " (function, imports)"}

    def spec_of(source):
        s = router.sources.get(source, router.default)
        how = "--reward-source" if source in router.sources else default_flag
        return f"{s}{kinds[spec_kind(s)]} ({how})"

    parts = [f"default {router.default}{kinds[spec_kind(router.default)]} ({default_flag})"]
    if sources is None:
        parts += [f"{s} -> {spec_of(s)}" for s in router.sources]
        return Check("reward", OK, "", "; ".join(parts))
    parts += [f"data source {s or '(none)'!r} ({n:,} prompts) -> {spec_of(s)}" for s, n in sorted(sources.items())]
    unused = [s for s in router.sources if s not in sources]
    if unused:
        return Check(
            "reward",
            WARN,
            "",
            "; ".join(parts) + f"; --reward-source names data source(s) "
            f"{', '.join(map(repr, unused))} that no row of the data has (a typo? the data's sources: "
            f"{', '.join(map(repr, sorted(sources))) or 'none'})",
        )
    return Check("reward", OK, "", "; ".join(parts))


__all__ = ["check_eval_data", "check_prompt_data", "check_reward", "load_tokenizer"]
