"""Prompt datasets in the verl schema (DAPO-Math-17K, aime-2024.parquet) and a resumable sampler.

A row: ``prompt`` (a list of chat messages ``{"role", "content"}`` or a string),
``reward_model.ground_truth`` (the label, str), ``data_source`` (str, optional),
``extra_info`` (a dict of metadata, optional). Parquet (pyarrow) or jsonl. Each row becomes
a `PromptRecord` that carries everything the reward sees besides the response (prompt
text, label, data source, metadata). Loading:

* renders the prompt with the tokenizer's chat template (``apply_chat_template``) or as raw
  text (message contents joined by newlines);
* removes duplicate prompts (the public DAPO-Math-17K repeats each prompt ~100 times);
* prompts over ``max_prompt_length`` tokens are skipped and counted (``skip``) or
  left-truncated (``truncate-left``, as the official recipe does);
* a row without a prompt, or without a label where its reward needs one
  (``needs_label(data_source)``; the built-in math checkers do), is an error naming the
  row and field, or is skipped and counted with ``skip_bad_rows``; a row whose reward
  needs no label gets ``ground_truth = ""``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from typing import Callable, Optional

import numpy as np

from ..errors import DataError


@dataclasses.dataclass
class PromptRecord:
    index: int  # position in the de-duplicated dataset
    prompt_ids: list
    prompt_text: str
    ground_truth: str  # the label; "" when the row has none and its reward needs none
    data_source: str = ""
    metadata: dict = dataclasses.field(default_factory=dict)  # the row's extra_info


@dataclasses.dataclass
class DatasetStats:
    rows: int = 0
    duplicates_removed: int = 0
    skipped_long: int = 0
    truncated: int = 0
    bad_rows: int = 0


#: The fix named by an unreadable data file's error.
_DATA_FIX = "re-download or re-export it (parquet or jsonl in the verl schema: prompt, reward_model.ground_truth)"


def _read_parquet(path: str) -> list:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as e:
        size = os.path.getsize(path) if os.path.isfile(path) else None
        if size == 0:
            why = "the file is empty (0 bytes)"
        elif "magic bytes" in str(e):
            why = f"not a parquet file, or truncated ({size:,} bytes; no parquet footer)"
        else:
            why = f"{type(e).__name__}: {' '.join(str(e).split())}"
        raise DataError(f"{path}: cannot be read as parquet: {why}; {_DATA_FIX}") from None


def _read_json(path: str) -> list:
    try:
        with open(path, encoding="utf-8") as f:
            if path.endswith(".json"):
                try:
                    data = json.load(f)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}: not valid JSON ({e}); {_DATA_FIX}") from None
                if not isinstance(data, list):
                    raise DataError(f"{path}: a .json data file must hold a list of rows, got {type(data).__name__}")
                return data
            rows = []
            for i, line in enumerate(f):
                line = line.strip()
                if not line:
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}: line {i + 1} is not valid JSON ({e}); {_DATA_FIX}") from None
            return rows
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not a UTF-8 text file ({e.reason} at byte {e.start}); {_DATA_FIX}") from None


def read_rows(path: str) -> list[dict]:
    """Rows of a parquet or jsonl (or .json list) file as dicts.

    Every way a file can be unusable is a :class:`DataError` naming the file and the fix: not
    found, a directory, unreadable, an empty or truncated parquet, a CSV renamed ``.parquet``,
    invalid JSON, a binary file renamed ``.jsonl``, an unsupported extension.
    """
    if not os.path.exists(path):
        raise DataError(f"{path}: file not found")
    if os.path.isdir(path):
        raise DataError(f"{path}: is a directory, not a data file (give the .parquet or .jsonl file)")
    if not os.access(path, os.R_OK):
        raise DataError(f"{path}: cannot be read (permission denied)")
    if path.endswith(".parquet"):
        return _read_parquet(path)
    if path.endswith(".jsonl") or path.endswith(".json"):
        return _read_json(path)
    raise DataError(f"{path}: unsupported data format (expected .parquet or .jsonl)")


def check_columns(rows: list, path: str) -> None:
    """The file-level schema: every row is an object and the rows have a ``prompt`` column
    (a file of another schema fails here, naming its columns, not at its first row)."""
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{path}: row {i} is not an object (got {type(row).__name__}); {_DATA_FIX}")
    if rows and not any("prompt" in row for row in rows):
        cols = sorted({k for row in rows[:100] for k in row})
        raise DataError(
            f"{path}: no 'prompt' column (columns: {', '.join(cols) or 'none'}); the training data needs the verl "
            "schema: prompt (chat messages or text), reward_model.ground_truth, data_source (optional)"
        )


class _BadRow(Exception):
    """A row that cannot be used (skipped with --skip-bad-rows); the message names the field."""


def _content(content, k: int) -> str:
    """A message's text: a string, or the text parts of a content-part list (the form most chat
    APIs write: ``[{"type": "text", "text": ...}, ...]``) joined by newlines."""
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind != "text" or not isinstance(part.get("text"), str):
                raise _BadRow(
                    f"message {k} has a content part of type {kind!r}: only text parts are supported (drop that part)"
                )
            texts.append(part["text"])
        content = "\n".join(texts)
    if not isinstance(content, str) or not content.strip():
        what = "null" if content is None else ("empty" if isinstance(content, str) else type(content).__name__)
        raise _BadRow(f"message {k} has no text content ({what})")
    return content


def _messages(prompt, path, i):
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) and "content" in m for m in prompt):
        return [{"role": m.get("role", "user"), "content": _content(m["content"], k)} for k, m in enumerate(prompt)]
    raise DataError(
        f"{path}: row {i} field 'prompt' must be a string or a list of chat messages, got {type(prompt).__name__}"
    )


def _label(gt) -> str:
    """The label as text: a string, or a number written as the dataset has it (42, 0.5). Booleans,
    lists, NaN and objects are refused: "Answer: True" must never score +1 by accident."""
    if isinstance(gt, str):
        return gt
    if isinstance(gt, bool) or not isinstance(gt, (int, float)) or (isinstance(gt, float) and not math.isfinite(gt)):
        raise _BadRow(
            f"field 'reward_model.ground_truth' must be a string or a finite number, got {type(gt).__name__} {gt!r:.40}"
        )
    return str(gt)


def render_prompt(messages: list, tokenizer, apply_chat_template: bool) -> str:
    if apply_chat_template and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n".join(m["content"] for m in messages)


class PromptDataset:
    def __init__(self, records: list[PromptRecord], stats: DatasetStats, fingerprint: str, path: str):
        self.records = records
        self.stats = stats
        self.fingerprint = fingerprint
        self.path = path

    def describe(self) -> str:
        """One line: how many prompts, from how many rows, and what loading dropped or changed."""
        st = self.stats
        return (
            f"{len(self.records)} prompts from {self.path} ({st.rows} rows, {st.duplicates_removed} duplicates "
            f"removed, {st.skipped_long} too long skipped, {st.truncated} left-truncated, {st.bad_rows} bad rows)"
        )

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> PromptRecord:
        return self.records[i]


def load_prompt_dataset(
    path: str,
    tokenizer,
    max_prompt_length: int,
    prompt_overflow: str = "skip",
    apply_chat_template: bool = True,
    skip_bad_rows: bool = False,
    needs_label: Optional[Callable[[str], bool]] = None,
) -> PromptDataset:
    """Load, render, de-duplicate and tokenize the prompts of `path` (see the module doc).

    ``needs_label(data_source)`` says whether rows of a data source must have a
    ``reward_model.ground_truth`` (default: all must; the trainer passes its reward
    router's answer, `megatron_dapo.reward.reward_needs_label`).
    """
    if prompt_overflow not in ("skip", "truncate-left"):
        raise DataError(f"--prompt-overflow must be skip or truncate-left, got {prompt_overflow!r}")
    rows = read_rows(path)
    if not rows:
        raise DataError(f"{path}: the file holds no rows; {_DATA_FIX}")
    check_columns(rows, path)
    stats = DatasetStats(rows=len(rows))
    seen = set()
    seen_raw = set()  # identical messages render identically: skip their rendering
    records = []
    h = hashlib.sha256()
    for i, row in enumerate(rows):
        prompt = row.get("prompt")
        rm = row.get("reward_model") or {}
        gt = rm.get("ground_truth") if isinstance(rm, dict) else None
        source = str(row.get("data_source") or "")
        problem = None
        if prompt is None or (isinstance(prompt, (str, list)) and len(prompt) == 0):
            problem = "prompt"
        elif isinstance(prompt, str) and not prompt.strip():
            problem = "prompt"  # only whitespace
        elif gt is None or (isinstance(gt, str) and not gt.strip()):
            if needs_label is None or needs_label(source):
                problem = "reward_model.ground_truth"
            gt = ""
        meta = row.get("extra_info")
        if meta is not None and not isinstance(meta, dict):
            raise DataError(f"{path}: row {i} field 'extra_info' must be an object, got {type(meta).__name__}")
        if problem:
            if skip_bad_rows:
                stats.bad_rows += 1
                continue
            why = f"; the reward of data source {source!r} needs a label" if problem != "prompt" else ""
            raise DataError(f"{path}: row {i} has no '{problem}'{why} (use --skip-bad-rows to skip such rows)")
        try:
            gt = _label(gt)
            msgs = _messages(prompt, path, i)
        except _BadRow as e:
            if skip_bad_rows:
                stats.bad_rows += 1
                continue
            raise DataError(f"{path}: row {i} {e} (fix the row, or --skip-bad-rows to skip such rows)") from None
        raw = json.dumps([msgs, str(gt)], sort_keys=True, ensure_ascii=False, default=str)
        if raw in seen_raw:
            stats.duplicates_removed += 1
            continue
        seen_raw.add(raw)
        text = render_prompt(msgs, tokenizer, apply_chat_template)
        key = (text, str(gt))
        if key in seen:
            stats.duplicates_removed += 1
            continue
        seen.add(key)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > max_prompt_length:
            if prompt_overflow == "skip":
                stats.skipped_long += 1
                continue
            ids = ids[-max_prompt_length:]
            stats.truncated += 1
        h.update(text.encode())
        h.update(b"\0")
        h.update(str(gt).encode())
        h.update(b"\1")
        records.append(PromptRecord(len(records), list(ids), text, str(gt), source, dict(meta or {})))
    if not records:
        fix = ""
        if stats.skipped_long:
            fix = (
                f"; {stats.skipped_long} prompt(s) are longer than --max-prompt-length {max_prompt_length} tokens: "
                "raise it or pass --prompt-overflow truncate-left"
            )
        elif stats.bad_rows:
            fix = "; every row lacks a prompt or a label (--skip-bad-rows skipped them all)"
        raise DataError(f"{path}: no usable prompts ({dataclasses.asdict(stats)}){fix}")
    return PromptDataset(records, stats, h.hexdigest()[:16], path)


class ResumableSampler:
    """Deterministic epoch-wise shuffled order; state is (epoch, position) so resume is exact."""

    def __init__(self, size: int, seed: int, shuffle: bool = True):
        if size < 1:
            raise DataError("sampler: dataset is empty")
        self.size, self.seed, self.shuffle = size, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._make_order(0)

    def _make_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.size)
        return np.random.default_rng([self.seed, epoch]).permutation(self.size)

    def next_indices(self, n: int) -> list[int]:
        out = []
        while len(out) < n:
            if self.position >= self.size:
                self.epoch += 1
                self.position = 0
                self._order = self._make_order(self.epoch)
            take = min(n - len(out), self.size - self.position)
            out.extend(int(i) for i in self._order[self.position : self.position + take])
            self.position += take
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "size": self.size, "seed": self.seed}

    def load_state_dict(self, s: dict) -> None:
        if s["size"] != self.size:
            raise DataError(f"sampler state is for a dataset of {s['size']} prompts, this one has {self.size}")
        self.epoch, self.position = int(s["epoch"]), int(s["position"])
        self._order = self._make_order(self.epoch)


def check_fingerprint(saved: Optional[str], current: str, allow_change: bool, path: str) -> None:
    if saved is not None and saved != current and not allow_change:
        raise DataError(
            f"{path}: the dataset changed since the checkpoint (fingerprint {saved} -> {current}); "
            "resuming would silently skip or repeat prompts. Pass --allow-data-change to resume anyway."
        )
