"""Preflight checks: every path, file and model-vs-tokenizer fact a run depends on, before Ray.

``--dry-run`` runs all of them (:func:`dry_run`); the real run runs the cheap ones before any
process starts (:func:`check_before_launch`), so a mistake on 128 GPUs costs seconds. Each
check is a function of the config (and what earlier checks loaded) returning a
:class:`Check`: one line, ``[check] NAME TARGET: what was found``, or ``[check] FAIL ...`` /
``[check] WARN ...`` naming the flag, the file and the fix. Every check runs; then, if any
failed, :class:`PreflightError` (a ``ConfigError``: exit 2, one line, no traceback) lists them.

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
:data:`SHAPE_ONLY_FILE`; a dry run reports its missing weights and tokenizer as warnings (it
plans from the shape), a real run refuses it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections import Counter
from typing import Callable, List, Optional, Tuple

import torch

from ..checkpoint import dist_ckpt
from ..checkpoint.dist_ckpt import CheckpointError, check_metadata, read_metadata
from ..config import ConfigError
from ..config.validate import data_parallel_size, world_size
from ..data.dataset import DataError, check_columns, check_fingerprint, load_prompt_dataset, read_rows
from ..errors import one_line, user_error_types
from ..eval.runner import load_eval_problems
from ..models.hf_config import generation_eos_ids
from ..outputs import checkpoint_dirs as checkpoints
from ..outputs.run_dir import prepare_outputs
from ..reward.plugins import RewardRouter, parse_reward_sources, reward_needs_label, spec_kind
from ..training.train_checkpoint import run_layout
from .plan import dry_run_report

OK, WARN, FAIL = "ok", "warn", "fail"
#: A directory with this file holds a model's shape only (config.json): no weights, no tokenizer.
SHAPE_ONLY_FILE = "SHAPE_ONLY.md"
#: Any of these makes a directory a tokenizer directory for ``AutoTokenizer``.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
GB = 1e9


#: The flags whose mistakes a check reports (by check name; default ``--<name>``).
_FLAGS = {"reward": ("--reward-fn", "--reward-mode", "--reward-source"), "hf-checkpoint": ("--hf-checkpoint",),
          "tokenizer": ("--tokenizer", "--hf-checkpoint"), "outputs": ("--run-dir", "--save"), "disk": ("--save",)}


class PreflightError(ConfigError):
    """One or more preflight checks failed; the message lists each (one line)."""


@dataclasses.dataclass(frozen=True)
class Check:
    name: str  # prompt-data, eval-data, reward, tokenizer, hf-checkpoint, load, ..., disk, outputs, config
    status: str  # OK, WARN or FAIL
    target: str  # the path or flag value checked ("" when none)
    detail: str  # what was found; for WARN/FAIL what is wrong and the fix

    @property
    def line(self) -> str:
        tag = {OK: "", WARN: "WARN ", FAIL: "FAIL "}[self.status]
        target = f" {self.target}" if self.target else ""
        return f"[check] {tag}{self.name}{target}: {self.detail}"


class Checks(list):
    """The checks of one preflight, in order."""

    outputs_lines: List[str]

    def __init__(self, items=()):
        super().__init__(items)
        self.outputs_lines = []

    @property
    def failed(self) -> List[Check]:
        return [c for c in self if c.status == FAIL]

    @property
    def warned(self) -> List[Check]:
        return [c for c in self if c.status == WARN]

    def lines(self) -> List[str]:
        return [c.line for c in self]

    def title(self) -> str:
        return f"{len(self)} checks: {len(self) - len(self.failed) - len(self.warned)} ok, {len(self.warned)} warnings, {len(self.failed)} failed"

    def raise_if_failed(self, what: str) -> None:
        bad = self.failed
        if bad:
            parts = "; ".join(f"{c.name}{' ' + c.target if c.target else ''}: {c.detail}" for c in bad)
            raise PreflightError(f"{what}: {len(bad)} of {len(self)} checks failed ([check] FAIL lines above): {parts}")


def _fmt(path: str) -> str:
    return "parquet" if path.endswith(".parquet") else "jsonl" if path.endswith(".jsonl") else "json"


def _params(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def _bytes(n: float) -> str:
    return f"{n / GB:.1f} GB" if n >= GB else f"{n / 1e6:.1f} MB"


def _strip(msg: str, path: str) -> str:
    """``msg`` without a leading ``"<path>: "`` (the check's line names the path already)."""
    return msg[len(path) + 2:] if path and msg.startswith(path + ": ") else msg


def _nearest_existing(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


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
            return Check(name, WARN, path, f"a model shape only ({flag}), no tokenizer: prompt lengths "
                         "and token ids not checked (pass --tokenizer DIR)"), None
        return Check(name, FAIL, path, f"no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {flag}; pass "
                     "--tokenizer DIR with the model's tokenizer"), None
    try:
        from transformers import AutoTokenizer  # transformers: ~2.5 s, only when a tokenizer is checked

        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - any library error: one line naming the flag
        return Check(name, FAIL, path, f"{flag} does not load with AutoTokenizer ({type(e).__name__}: "
                     f"{one_line(e)[:300]}); give the model's tokenizer directory"), None

    vocab = arch.vocab_size
    n = len(tok)
    if n < 2:  # a tokenizer_config.json without its vocabulary: transformers builds an empty tokenizer
        return Check(name, FAIL, path, f"{flag} holds a tokenizer without a vocabulary ({n} token); give the "
                     "directory with the model's tokenizer.json"), None
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
                "index past the embedding; use the tokenizer of the model in --hf-checkpoint")
        else:
            warns.append(f"{len(plain)} plain added tokens have ids >= vocab_size {vocab:,} (e.g. "
                         f"{str(added[plain[0]])!r}); only their literal text produces them")
    eos_ids = generation_eos_ids(m.hf_checkpoint) if m.hf_checkpoint else []
    for i in eos_ids if not fails else []:  # (past the vocabulary: counted above already)
        if i >= vocab or i >= n:
            fails.append(f"the model's eos_token_id {i} ({src} / generation_config.json) is outside "
                         f"{'the model vocabulary' if i >= vocab else f'the {n:,} tokens of {flag} {path}'}: "
                         "generation could never stop; the tokenizer and the model do not belong together")
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
    desc = (f"{type(tok).__name__}, {n:,} tokens <= vocab_size {vocab:,} of the model" if n <= vocab else
            f"{type(tok).__name__}, {n:,} tokens, vocab_size {vocab:,}")
    eos_s = f"eos {tok.eos_token!r} {eos}" if eos is not None else "no eos"
    in_model = " (a stop token of the model)" if eos in eos_ids else (f" (the model stops at {eos_ids})" if eos_ids else "")
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
            return Check("prompt-data", WARN, path, f"{_fmt(path)}, {len(rows):,} rows, columns ok; prompt lengths "
                         "not checked (no tokenizer)"), None
        ds = load_prompt_dataset(path, tokenizer, d.max_prompt_length, d.prompt_overflow, d.apply_chat_template,
                                 d.skip_bad_rows, needs_label=needs_label)
    except DataError as e:
        return Check("prompt-data", FAIL, path, f"--prompt-data: {_strip(one_line(e), path)}"), None
    st = ds.stats
    longest = max(len(x.prompt_ids) for x in ds.records)
    within = (f"{len(ds):,} prompts within --max-prompt-length {d.max_prompt_length}" if d.prompt_overflow == "skip"
              else f"{len(ds):,} prompts, {st.truncated:,} left-truncated to --max-prompt-length {d.max_prompt_length}")
    detail = (f"{_fmt(path)}, {st.rows:,} rows, columns ok, {within} (longest {longest} tokens; "
              f"{st.duplicates_removed:,} duplicates removed, {st.skipped_long:,} too long skipped, {st.bad_rows:,} bad "
              f"rows skipped)")
    osb = r.over_sampling_batch_size or r.rollout_batch_size
    if len(ds) < osb:
        return Check("prompt-data", WARN, path, detail + f"; only {len(ds):,} prompts for {osb} per generation round "
                     "(--over-sampling-batch-size / --rollout-batch-size): prompts repeat within a round"), ds
    return Check("prompt-data", OK, path, detail), ds


def check_eval_data(cfg, path: str, needs_label: Optional[Callable[[str], bool]]) -> Tuple[Check, list]:
    """One ``--eval-data`` file, read as the evaluator reads it: ``(check, problems)``."""
    try:
        problems = load_eval_problems(path, needs_label=needs_label)
    except DataError as e:
        return Check("eval-data", FAIL, path, f"--eval-data: {_strip(one_line(e), path)}"), []
    rows = sum(p.copies for p in problems)
    copies = sorted({p.copies for p in problems})
    detail = (f"{_fmt(path)}, {rows:,} rows, {len(problems):,} problems"
              + (f" ({copies[0]} copies each)" if len(copies) == 1 and copies[0] > 1 else ""))
    if not cfg.logging.eval_interval:
        return Check("eval-data", WARN, path, detail + "; never evaluated during training: --eval-interval is 0"), problems
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
        return Check("reward", FAIL, "", "; ".join(bad) + " (an entry is DATA_SOURCE=SPEC; SPEC is dapo, math, "
                     "package.module:function or an http(s) URL)")
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
        return Check("reward", WARN, "", "; ".join(parts) + f"; --reward-source names data source(s) "
                     f"{', '.join(map(repr, unused))} that no row of the data has (a typo? the data's sources: "
                     f"{', '.join(map(repr, sorted(sources))) or 'none'})")
    return Check("reward", OK, "", "; ".join(parts))


# ----------------------------------------------------------------------------- checkpoints


def _hf_weight_files(hf: str) -> Tuple[List[str], List[str], Optional[str]]:
    """(present weight files, missing shard files, problem) of an HF directory."""
    index = os.path.join(hf, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            return [], [], f"{index} cannot be read ({type(e).__name__}: {one_line(e)})"
        present = [f for f in files if os.path.isfile(os.path.join(hf, f))]
        return present, [f for f in files if f not in present], None
    if os.path.isfile(os.path.join(hf, "model.safetensors")):
        return ["model.safetensors"], [], None
    return [], [], None


def check_hf_checkpoint(cfg, arch, dry_run: bool) -> Check:
    """``--hf-checkpoint``: the shape (already parsed into ``arch``) and, when they are the
    trainer's initial weights (no ``--load`` / ``--pretrained-checkpoint``), the weight files."""
    m, hf = cfg.model, cfg.model.hf_checkpoint
    shape = f"config.json: {arch.model_type} {_params(arch.num_parameters)} params, vocab_size {arch.vocab_size:,}"
    present, missing, problem = _hf_weight_files(hf)
    size = sum(os.path.getsize(os.path.join(hf, f)) for f in present)
    weights_from = "--load" if cfg.checkpoint.load else "--pretrained-checkpoint" if m.pretrained_checkpoint else None
    if weights_from:
        return Check("hf-checkpoint", OK, hf, f"{shape}; the initial weights come from {weights_from}")
    if problem or missing:
        why = problem or (f"model.safetensors.index.json names {len(missing)} missing shard file(s) "
                          f"({', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''})")
        return Check("hf-checkpoint", FAIL, hf, f"--hf-checkpoint: {why}; copy the complete checkpoint")
    if not present:
        if dry_run and os.path.exists(os.path.join(hf, SHAPE_ONLY_FILE)):
            return Check("hf-checkpoint", WARN, hf, f"{shape}; a model shape only ({SHAPE_ONLY_FILE}), no weights: a "
                         "real run needs --hf-checkpoint with the weights (or --pretrained-checkpoint / --load)")
        return Check("hf-checkpoint", FAIL, hf, "--hf-checkpoint: no model.safetensors or "
                     "model.safetensors.index.json, and the trainer's initial weights come from here (no --load or "
                     "--pretrained-checkpoint); give the HF checkpoint directory with its weights")
    return Check("hf-checkpoint", OK, hf, f"{shape}; initial weights: {len(present)} safetensors file(s), "
                 f"{_bytes(size)}")


def _torch_dist_meta(flag: str, path: str, arch) -> Tuple[Optional[dict], Optional[str]]:
    """(metadata, None) of a megatron-dapo torch_dist checkpoint matching ``arch``, or (None, why)."""
    if not os.path.exists(path):
        return None, f"{flag}: not found"
    if not os.path.isdir(path):
        return None, f"{flag}: not a directory (a torch_dist checkpoint is a directory)"
    try:
        meta = read_metadata(path)
        check_metadata(meta, arch, where="the checkpoint")
    except CheckpointError as e:
        msg = one_line(e)
        return None, f"{flag}: {_strip(msg, path)}"
    except (OSError, ValueError, KeyError, TypeError) as e:  # a truncated or foreign metadata file
        return None, f"{flag}: its checkpoint metadata cannot be read ({type(e).__name__}: {one_line(e)})"
    verify = getattr(dist_ckpt, "verify_checkpoint_files", None)  # .metadata, shard sizes (when available)
    if verify is not None:
        try:
            verify(path)
        except CheckpointError as e:
            return None, f"{flag}: {_strip(one_line(e), path)}"
    if not os.path.exists(os.path.join(path, "metadata.json")) or not any(
            n.endswith(".distcp") for n in os.listdir(path)):
        return None, (f"{flag}: metadata present but no torch_dist tensor files (metadata.json, *.distcp): "
                      "an incomplete copy")
    return meta, None


_LONG_KEYS = {"tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp",
              "context_parallel_size": "cp", "data_parallel_size": "dp"}


def saved_layout(meta: dict) -> dict:
    """A checkpoint's layout as ``{"tp", "pp", "cp", "dp", "world_size", ...}``: its ``layout``
    record, else the older ``saved_with`` (TP, PP, world size); ``{}`` when neither is there."""
    lay = meta.get("layout") or meta.get("saved_with") or {}
    return {_LONG_KEYS.get(k, k): v for k, v in lay.items() if v is not None}


def _layout_str(lay: dict) -> str:
    text = " x ".join(f"{k.upper()} {lay[k]}" for k in ("tp", "pp", "cp", "dp") if k in lay) or "an unrecorded layout"
    extra = [f"world {lay['world_size']}"] if "world_size" in lay else []
    if "nodes" in lay:
        extra.append(f"{lay['nodes']} node{'s' if lay['nodes'] != 1 else ''}")
    return text + (f" ({', '.join(extra)})" if extra else "")


def current_layout(cfg) -> dict:
    """This run's layout, in the keys of a checkpoint's ``layout`` record (checkpoint/dist_ckpt.py)."""
    p = cfg.parallel
    return {"tp": p.tensor_model_parallel_size, "pp": p.pipeline_model_parallel_size, "cp": p.context_parallel_size,
            "dp": data_parallel_size(cfg), "world_size": world_size(cfg), "nodes": p.nnodes,
            "distributed_optimizer": bool(p.use_distributed_optimizer)}


def check_torch_dist(cfg, arch, flag: str, path: str) -> Check:
    """``--pretrained-checkpoint`` or ``--ref-load``: a torch_dist checkpoint of this model."""
    name = flag.lstrip("-")
    meta, why = _torch_dist_meta(flag, path, arch)
    if why:
        return Check(name, FAIL, path, why + ("; convert an HF checkpoint with tools/convert_hf_to_megatron.py"
                                              if "not a megatron-dapo" not in why else ""))
    detail = (f"torch_dist, {meta.get('dtype', '?')}, saved at {_layout_str(saved_layout(meta))}, architecture matches "
              "the model")
    if flag == "--ref-load" and not cfg.algo.kl_coef > 0:
        return Check(name, WARN, path, detail + "; unused: --kl-coef is 0 (no reference model)")
    return Check(name, OK, path, detail)


def check_load(cfg, arch, dataset=None, dry_run: bool = True) -> Check:
    """``--load``: the resumed checkpoint (metadata against the model, its saved layout against
    this run's) and, with the prompt data loaded, the data fingerprint it recorded. The node
    count is compared in the dry run only (the real run compares the hosts its ranks got)."""
    load = cfg.checkpoint.load
    if not os.path.exists(load):
        return Check("load", FAIL, load, "--load: not found")
    resolved = checkpoints.resolve(load)
    if resolved is None:
        return Check("load", FAIL, load, f"--load: no checkpoint found (no '{checkpoints.LATEST}' pointer or "
                     f"{checkpoints.STATE_FILE}); give a run's --save directory or one step_* in it")
    meta, why = _torch_dist_meta("--load", resolved, arch)
    if why:
        return Check("load", FAIL, load, why)
    saved = saved_layout(meta)
    new = current_layout(cfg)
    status = OK
    note_fn = getattr(dist_ckpt, "resume_note", None)  # the checkpoint module's verdict on a layout change
    if note_fn is not None:
        record = dist_ckpt.checkpoint_layout(meta) if hasattr(dist_ckpt, "checkpoint_layout") else (saved or None)
        p = cfg.parallel
        new = run_layout(p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size,
                         world_size(cfg), p.nnodes if dry_run else None, p.use_distributed_optimizer)
        try:
            verdict = note_fn(record, new)
        except dist_ckpt.CheckpointError as e:
            verdict = (False, one_line(e))
        ok, note = verdict if isinstance(verdict, tuple) else (True, str(verdict))
        if not ok:
            return Check("load", FAIL, load, f"--load ({os.path.basename(resolved)}): saved at {_layout_str(saved)}, "
                         f"cannot resume at this layout: {note}")
        layout = f"saved at {_layout_str(saved)}; {note}"
    else:
        same = all(saved[k] == new[k] for k in ("tp", "pp", "cp", "dp", "world_size") if k in saved)
        if not saved:
            layout = "saved layout not recorded"
        elif same:
            layout = f"saved at {_layout_str(saved)}, resumed at the same layout"
        else:
            status = WARN
            layout = (f"saved at {_layout_str(saved)}, resumed at {_layout_str(new)}: resharding the model and "
                      "optimizer is left to dist_checkpointing (resuming at another layout is not tested here)")
    detail = f"{os.path.basename(resolved)}: torch_dist, architecture matches the model, {layout}"
    if dataset is not None:
        try:
            state = torch.load(os.path.join(resolved, checkpoints.STATE_FILE), weights_only=False)
            check_fingerprint(state.get("data_fingerprint"), dataset.fingerprint, cfg.data.allow_data_change,
                              cfg.data.prompt_data)
        except DataError as e:
            pd = cfg.data.prompt_data
            return Check("load", FAIL, load, f"--prompt-data {pd}: {_strip(one_line(e), pd)}")
        except Exception as e:  # noqa: BLE001 - a truncated state file (prepare_outputs names it too)
            return Check("load", FAIL, load, f"--load: {os.path.basename(resolved)}/{checkpoints.STATE_FILE} cannot be read "
                         f"({type(e).__name__}); give another checkpoint")
        detail += f"; step {state.get('step')}, the same prompt data"
    return Check("load", status, load, detail)


# ----------------------------------------------------------------------------- disk


def checkpoint_bytes(arch, bf16: bool) -> Tuple[float, str]:
    """Estimated size of one trainer checkpoint (model + optimizer state) and how it is made up:
    weights in the parameter dtype, Adam m and v in fp32, and fp32 main parameters with bf16."""
    per = (2 + 4 + 8) if bf16 else (4 + 8)
    how = ("bf16 weights 2 + fp32 main params 4 + Adam m, v 8" if bf16 else "fp32 weights 4 + Adam m, v 8")
    return arch.num_parameters * per, f"{_params(arch.num_parameters)} params x {per} B ({how})"


def check_disk(cfg, arch) -> List[Check]:
    """Free space for the checkpoints of ``--save`` (fail when one does not fit a filesystem that
    is known to be the run's: ``--save`` or its parent exists) and for HF exports (warn)."""
    out = []
    ck = cfg.checkpoint
    if ck.save:
        size, how = checkpoint_bytes(arch, cfg.model.bf16)
        where = _nearest_existing(ck.save)
        save = os.path.abspath(ck.save)
        if not os.path.isdir(where):
            return [Check("disk", WARN, ck.save, f"not checked: {where} is not a directory (the outputs check)")]
        known = where in (save, os.path.dirname(save))
        free = shutil.disk_usage(where).free
        have = len(checkpoints.steps(ck.save)) if os.path.isdir(ck.save) else 0
        peak = max(1, ck.keep_last + 1 - have)
        detail = (f"one checkpoint ~{_bytes(size)} ({how}); --keep-last {ck.keep_last} holds up to "
                  f"{ck.keep_last + 1} during a save; free {_bytes(free)} on {where}"
                  + ("" if known else " (--save and its parent do not exist yet)"))
        if free < size:
            fix = "free space there or choose another --save"
            if known:
                out.append(Check("disk", FAIL, ck.save, f"--save: {detail}: the first save cannot fit; {fix}"))
            else:
                out.append(Check("disk", WARN, ck.save, f"{detail}: a checkpoint would not fit there, if that is the "
                                 f"filesystem the run writes to; {fix}"))
        elif free < peak * size:
            out.append(Check("disk", WARN, ck.save, f"{detail}: {peak} more checkpoint(s) do not fit; lower "
                             "--keep-last or free space"))
        else:
            out.append(Check("disk", OK, ck.save, detail))
    n = (cfg.run.num_rollout_steps // ck.save_hf_interval if ck.save_hf_interval else 0) + (1 if ck.save_hf_final else 0)
    if n:
        export = arch.num_parameters * (2 if cfg.model.bf16 else 4)
        where = _nearest_existing(cfg.logging.run_dir)
        free = shutil.disk_usage(where).free
        detail = (f"{n} HF export(s) of ~{_bytes(export)} each (--save-hf-interval / --save-hf-final, kept, not "
                  f"rotated) = {_bytes(n * export)}; free {_bytes(free)} on {where}")
        if free < n * export:
            out.append(Check("disk", WARN, cfg.logging.run_dir, detail + ": they do not all fit (an export comes "
                             "after its step's checkpoint); free space or raise --save-hf-interval"))
        else:
            out.append(Check("disk", OK, cfg.logging.run_dir, detail))
    return out


# ----------------------------------------------------------------------------- all of them


def run_checks(cfg, arch, dry_run: bool = True) -> Checks:
    """Every check (``dry_run``) or the cheap ones a real run does before Ray (the trainer
    loads and checks ``--prompt-data`` and the output directories itself, before Ray)."""
    checks = Checks()
    add = checks.append
    tok_check, tok = load_tokenizer(cfg, arch, dry_run)
    add(tok_check)
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
            add(Check("outputs", OK, "", "--run-dir" + (" and --save" if cfg.checkpoint.save else "")
                      + " usable (the [outputs] lines)"))
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
        if not any((c.target and c.target in msg) or msg.startswith(_FLAGS.get(c.name, ("--" + c.name,)))
                   for c in checks.failed):
            checks.append(Check("config", FAIL, "", msg))
        text = "\n".join(["=== megatron-dapo dry run: configuration invalid (no plan), nothing started ===",
                          f"--- {checks.title()} ---", *checks.lines()])
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


__all__ = ["Check", "Checks", "PreflightError", "SHAPE_ONLY_FILE", "check_before_launch", "check_disk",
           "check_eval_data", "check_hf_checkpoint", "check_load", "check_prompt_data", "check_reward",
           "check_torch_dist", "checkpoint_bytes", "current_layout", "dry_run", "load_tokenizer", "run_checks"]
